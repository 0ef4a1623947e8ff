"""MeshRasterizer: project world-space meshes with a camera, then rasterize them.

The Warp counterpart of PyTorch3D's ``MeshRasterizer`` + ``RasterizationSettings``:
settings left ``None`` are resolved from the camera exactly as PyTorch3D does,
the vertices are projected by the camera kernel (x, y in NDC, z = view depth)
and handed to :func:`warpraster.raster.rasterize_meshes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import warp as wp

from .camera import CamerasBase, vert_to_mesh_from_faces
from .fragments import Fragments
from .meshes import as_index_array, as_vec3_array
from .rasterize import rasterize_meshes
from .settings import RasterSettings

__all__ = ["MeshRasterizer", "RasterizationSettings"]

_PYTORCH3D_OPTIONS = (
    "image_size", "blur_radius", "faces_per_pixel", "bin_size", "max_faces_per_bin",
    "perspective_correct", "clip_barycentric_coords", "cull_backfaces", "z_clip_value",
    "cull_to_frustum",
)  # fmt: skip


@dataclass(kw_only=True)
class RasterizationSettings:
    """Settings of :class:`MeshRasterizer`; PyTorch3D's names and defaults.

    Attributes:
        image_size: ``int`` or ``(H, W)``.
        blur_radius: squared NDC distance within which a face still covers a pixel.
        faces_per_pixel: K, faces kept per pixel.
        bin_size: None = heuristic, 0 = naive, > 0 = binned (same output).
        max_faces_per_bin: bin list capacity (None = no per-bin cap on the
            unclipped path, PyTorch3D's default on the clipped path; an
            overflowing bin still renders exactly).
        perspective_correct: None = the camera's ``is_perspective()``.
        clip_barycentric_coords: None = ``blur_radius > 0``.
        cull_backfaces: skip faces that are clockwise in NDC xy.
        z_clip_value: None = ``min(znear) / 2`` when perspective-correct and the
            camera has a znear, else no clipping.
        cull_to_frustum: drop faces wholly outside the view frustum.
        exact_perspective_grad: ours, not PyTorch3D's: True (default) gives the
            true derivative where the perspective denominator is clamped (blurred
            slots outside a face, with a perspective camera); False gives
            PyTorch3D's numbers there (see
            :class:`~warpraster.settings.RasterSettings`, docs/BACKWARD.md).
    """

    image_size: int | tuple[int, int] = 256
    blur_radius: float = 0.0
    faces_per_pixel: int = 1
    bin_size: int | None = None
    max_faces_per_bin: int | None = None
    perspective_correct: bool | None = None
    clip_barycentric_coords: bool | None = None
    cull_backfaces: bool = False
    z_clip_value: float | None = None
    cull_to_frustum: bool = False
    exact_perspective_grad: bool = True


class MeshRasterizer:
    """Rasterizes a packed batch of world-space meshes seen by a batch of cameras.

    Mesh n is seen by camera n (or all meshes by the single camera of a batch of
    one), as PyTorch3D's ``MeshRasterizer``.

    Args:
        cameras: a camera batch (:class:`~warpraster.camera.FoVPerspectiveCameras`,
            :class:`~warpraster.camera.FoVOrthographicCameras`,
            :class:`~warpraster.camera.PerspectiveCameras`).
        raster_settings: :class:`RasterizationSettings` (default: all defaults).
    """

    def __init__(
        self,
        cameras: CamerasBase | None = None,
        raster_settings: RasterizationSettings | None = None,
    ):
        if raster_settings is None:
            raster_settings = RasterizationSettings()
        if not isinstance(raster_settings, RasterizationSettings):
            raise TypeError(
                "raster_settings must be a RasterizationSettings, got "
                f"{type(raster_settings).__name__}"
            )
        if cameras is not None and not isinstance(cameras, CamerasBase):
            raise TypeError(f"cameras must be a warpraster camera, got {type(cameras).__name__}")
        self.cameras = cameras
        self.raster_settings = raster_settings

    def _cameras(self, cameras) -> CamerasBase:
        cameras = self.cameras if cameras is None else cameras
        if cameras is None:
            raise ValueError("cameras must be given, either to MeshRasterizer(...) or to the call")
        if not isinstance(cameras, CamerasBase):
            raise TypeError(f"cameras must be a warpraster camera, got {type(cameras).__name__}")
        return cameras

    def settings_for(self, cameras: CamerasBase | None = None) -> RasterSettings:
        """The :class:`~warpraster.settings.RasterSettings` of a call, ``None`` resolved.

        As PyTorch3D: ``clip_barycentric_coords = blur_radius > 0``;
        ``perspective_correct = cameras.is_perspective()``; ``z_clip_value =
        min(znear) / 2`` if perspective-correct and the camera has a znear
        (FoV cameras; :class:`PerspectiveCameras` has none), else None. znear is
        the value seen when the camera was made (no device read here).
        """
        cameras = self._cameras(cameras)
        s = self.raster_settings
        clip_barycentric_coords = s.clip_barycentric_coords
        if clip_barycentric_coords is None:
            clip_barycentric_coords = s.blur_radius > 0.0
        persp = s.perspective_correct
        if persp is None:
            persp = cameras.is_perspective()
        z_clip = s.z_clip_value
        if z_clip is None:
            znear = cameras.get_znear()
            z_clip = None if not persp or znear is None else float(znear.min()) / 2.0
        return RasterSettings(
            image_size=s.image_size,
            blur_radius=s.blur_radius,
            faces_per_pixel=s.faces_per_pixel,
            bin_size=s.bin_size,
            max_faces_per_bin=s.max_faces_per_bin,
            perspective_correct=bool(persp),
            clip_barycentric_coords=bool(clip_barycentric_coords),
            cull_backfaces=bool(s.cull_backfaces),
            z_clip_value=z_clip,
            cull_to_frustum=bool(s.cull_to_frustum),
            exact_perspective_grad=s.exact_perspective_grad,
        )

    def resolved_settings(self, cameras: CamerasBase | None = None) -> dict[str, Any]:
        """:meth:`settings_for` as the keyword arguments of ``rasterize_meshes``
        (PyTorch3D's ten options and ``exact_perspective_grad``; ``image_size``
        as given)."""
        r = self.settings_for(cameras)
        out = {name: getattr(r, name) for name in (*_PYTORCH3D_OPTIONS, "exact_perspective_grad")}
        out["image_size"] = self.raster_settings.image_size
        return out

    def transform(
        self,
        verts_world,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        *,
        cameras: CamerasBase | None = None,
        vert_to_mesh=None,
        out: wp.array | None = None,
    ) -> wp.array:
        """Projects the vertices as PyTorch3D's ``MeshRasterizer.transform``.

        Returns:
            ``wp.array(dtype=wp.vec3)`` (V,): x, y in NDC, z = view-space depth,
            differentiable w.r.t. ``verts_world`` and the camera parameters.

        ``vert_to_mesh`` ((V,) int32 mesh of each vertex) is derived from the faces
        on the device when there is more than one camera and it is not given; pass
        it (and ``out``) to keep a captured render loop free of allocations.
        """
        cameras = self._cameras(cameras)
        device = cameras.device
        first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", device)
        cameras.check_batch(first.shape[0])
        verts = as_vec3_array(verts_world, "verts_world", device)
        if len(cameras) > 1 and vert_to_mesh is None:
            vert_to_mesh = vert_to_mesh_from_faces(
                faces, first, num_faces_per_mesh, verts.shape[0], device=device
            )
        return cameras.transform_points_ndc(verts, vert_to_mesh, None, out)

    def __call__(
        self,
        verts_world,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        *,
        workspace=None,
        cameras: CamerasBase | None = None,
        vert_to_mesh=None,
        verts_ndc: wp.array | None = None,
        validate: bool = True,
    ) -> Fragments:
        """Projects and rasterizes a packed batch of world-space meshes.

        Args:
            verts_world: (V, 3) world-space vertices (``wp.array`` of ``vec3`` or
                (V, 3) float32 for gradients, or NumPy).
            faces: (F, 3) int32 packed faces (global vertex indices).
            mesh_to_face_first_idx, num_faces_per_mesh: (N,) per-mesh face ranges.
            workspace: reusable raster buffers (see ``warpraster.RasterWorkspace``).
            cameras: overrides the rasterizer's cameras for this call.
            vert_to_mesh: optional (V,) int32 mesh of each vertex (see :meth:`transform`).
            verts_ndc: optional (V,) ``vec3`` buffer for the projected vertices.
            validate: check the topology on the host (see ``rasterize_meshes``).

        Returns:
            :class:`~warpraster.Fragments`, as ``rasterize_meshes``; on a ``wp.Tape``
            gradients flow to ``verts_world`` and the camera parameters.
        """
        cameras = self._cameras(cameras)
        settings = self.settings_for(cameras)
        projected = self.transform(
            verts_world,
            faces,
            mesh_to_face_first_idx,
            num_faces_per_mesh,
            cameras=cameras,
            vert_to_mesh=vert_to_mesh,
            out=verts_ndc,
        )
        return rasterize_meshes(
            projected,
            faces,
            mesh_to_face_first_idx,
            num_faces_per_mesh,
            settings=settings,
            workspace=workspace,
            validate=validate,
        )
