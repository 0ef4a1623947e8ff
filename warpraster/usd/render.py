"""Rendering a loaded scene: device buffers allocated once, one render per frame,
through the one shading core, differentiable.

:class:`StageRenderer` uploads a :class:`~warpraster.usd.scene.Scene` once
(:class:`StageBuffers`: points, per-mesh transforms, corner tables, a material
table with its texture atlas, a light list, the camera), then each
:meth:`StageRenderer.render_device` runs the pipeline every front end runs:

* points placed by their mesh's transform, the per-face corner tables gathered
  (:mod:`warpraster.shading.corner_tables`);
* the rasterizer through the camera at the sample resolution (one image, K = 1,
  perspective-correct barycentrics clipped to the triangle and renormalised,
  near-plane clipping at the camera's near distance);
* each sample's albedo and opacity from the material table and atlas
  (:mod:`warpraster.shading.atlas`);
* the pixel kernel (:mod:`warpraster.shading.fused`): PyTorch3D's Phong model
  summed over the stage's lights, two-sided, hard blend with the far cut,
  premultiplied by the opacity;
* with ``antialias=True``, nvdiffrast's analytic antialias of the shaded sample
  image (:mod:`warpraster.usd.antialias`): silhouette and occlusion edges then
  have gradients with respect to the points, transforms and camera;
* the box filter of each pixel's ``spp`` samples and its centre sample's depth,
  face and mesh (:mod:`warpraster.shading.resolve`).

New positions, normals, cameras and lights of a later frame are written into the
same device arrays (``wp.array.assign``): nothing is reallocated per frame. Made
with ``requires_grad=True``, a render recorded on a ``wp.Tape`` sends gradients
to the material parameters and texels, the points and mesh transforms, the
camera and the lights (:class:`StageBuffers` lists them).

Back faces: as Storm (usdview) draws them, a mesh whose ``doubleSided`` is
false shows only its front faces, those whose corners run counter-clockwise
seen from the camera (USD's ``rightHanded`` orientation; ``leftHanded`` meshes
are rewound when read). One kernel, before the rasterizer, decides it per
triangle in world space (the camera on the front side of the triangle's plane,
which is the same test as a positive screen-space area for a triangle in front
of the camera) and turns a culled triangle into a point, which the rasterizer
never draws; ``double_sided=True`` draws every back face.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import warp as wp

from ..backward.tape import active_tape
from ..grad_buffers import clear_if_recording
from ..meshes import store_face_or_point
from ..raster.workspace import CallGraph
from ..shading.atlas import Atlas, TextureWrap, sample_atlas
from ..shading.corner_tables import gather_corner_tables, place_points
from ..shading.fused import launch_shade_blend, new_inputs
from ..shading.lighting import LightKind, LightList
from ..shading.material_table import CornerAlbedo
from ..shading.materials import Materials
from ..shading.modes import BlendMode, ShadingMode, TexelSource
from ..shading.pixel_args import pixel_fragments
from ..shading.resolve import resolve_samples
from ..shading.shaders import FaceTables
from ..structs import StructCache, new_struct, placeholder
from .antialias import StageAntialias
from .cameras import conformed_apertures, default_camera, raster_camera
from .scene import (
    AspectConform,
    CameraParams,
    LightSet,
    Projection,
    Scene,
    SceneMeshes,
)

__all__ = ["RenderOutput", "StageBuffers", "StageRenderer", "linear_to_srgb", "parse_spp"]

wp.set_module_options({"enable_backward": False})  # the cull kernel: integer outputs only


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values to sRGB-encoded values, both in [0, 1] (IEC 61966-2-1)."""
    c = np.clip(np.asarray(c, np.float32), 0.0, 1.0)
    return np.where(c <= 0.0031308, 12.92 * c, 1.055 * np.power(c, 1 / 2.4) - 0.055)


def parse_spp(spp) -> tuple[int, int]:
    """The sample grid (rows, columns) of ``spp`` samples per pixel.

    As square as ``spp`` allows: rows is the largest divisor of ``spp`` not above
    its square root (4 -> 2 x 2, 8 -> 2 x 4, 2 -> 1 x 2, 5 -> 1 x 5).
    """
    if isinstance(spp, bool) or not isinstance(spp, (int, np.integer)):
        raise TypeError(f"spp must be an int, got {type(spp).__name__}")
    if spp < 1:
        raise ValueError(f"spp must be >= 1 samples per pixel, got {spp}")
    rows = max(d for d in range(1, math.isqrt(int(spp)) + 1) if spp % d == 0)
    return rows, int(spp) // rows


@dataclass
class RenderOutput:
    """One rendered frame, host arrays of (H, W).

    Attributes:
        color: (H, W, 4) float32 linear RGB (not premultiplied) and alpha =
            coverage x opacity, resolved over the samples of each pixel.
        depth: (H, W) float32 view depth of the centre sample, ``inf`` where empty.
        face_id: (H, W) int32 packed triangle index of the centre sample, -1 empty.
        mesh_id: (H, W) int32 mesh index (into ``scene.meshes.names``), -1 empty.
    """

    color: np.ndarray
    depth: np.ndarray
    face_id: np.ndarray
    mesh_id: np.ndarray

    @property
    def coverage(self) -> float:
        """Fraction of pixels whose centre sample hit a face."""
        return float((self.face_id >= 0).mean())


def _vec_array(a: np.ndarray, dtype, device, requires_grad: bool = False) -> wp.array:
    return wp.array(
        np.ascontiguousarray(a, np.float32), dtype=dtype, device=device, requires_grad=requires_grad
    )


def _light_list(lights: LightSet, forward: np.ndarray, device, requires_grad: bool) -> LightList:
    """The stage's lights as one :class:`~warpraster.shading.lighting.LightList`:
    the ambient light, then the directional lights (the headlight, first of them,
    travels along the camera's ``forward``), then the point lights. A light's one
    colour is its diffuse and its specular colour (one array)."""
    d = np.asarray(lights.directional, np.float32).reshape(-1, 2, 3).copy()
    p = np.asarray(lights.point, np.float32).reshape(-1, 2, 3)
    if lights.headlight and len(d):
        d[0, 0] = forward
    kinds = [LightKind.AMBIENT] + [LightKind.DIRECTIONAL] * len(d) + [LightKind.POINT] * len(p)
    zero = np.zeros((1, 3), np.float32)
    # directional rows hold the direction toward the light: minus the travel direction
    param = np.concatenate([zero, -d[:, 0], p[:, 0]])
    ambient = np.zeros((len(kinds), 3), np.float32)
    ambient[0] = np.asarray(lights.ambient, np.float32).reshape(3)
    colour = _vec_array(np.concatenate([zero, d[:, 1], p[:, 1]]), wp.vec3, device, requires_grad)
    return LightList(kinds=kinds, param=param, ambient=ambient, diffuse=colour, specular=colour,
                     device=device, requires_grad=requires_grad)  # fmt: skip


class StageBuffers:
    """The stage's scene on the device: what a render reads, and what it can optimise.

    Parameters (``requires_grad`` when the renderer was made with it; a
    ``wp.Tape`` around :meth:`StageRenderer.render_device` sends gradients here;
    the caller zeroes them, as any array of theirs):

    Attributes:
        verts: (max(V, 1),) ``vec3`` world points, rewritten in place by
            :meth:`update_meshes` (as are ``faces`` and the corner arrays).
        mesh_xform: (max(M, 1),) ``mat44`` row-vector transform applied to each
            mesh's points and normals on the device (identity: USD's own xforms
            are already in ``verts``), for optimising a mesh's placement.
        atlas: the material table's diffuse colours, opacities and texels
            (:class:`~warpraster.shading.atlas.Atlas`; row M, after the scene's M
            materials, is unused: faces without a material take ``displayColor``).
        materials: :class:`~warpraster.shading.materials.Materials` of M + 1 rows:
            specular colour and Phong shininess (``UsdPreviewSurface``'s Blinn-Phong
            exponent / 4), ambient and diffuse reflectivity 1 (the albedo is the
            atlas'); row M (no material): no specular, shininess 10.
        lights: the :class:`~warpraster.shading.lighting.LightList` (ambient,
            directional, point; ``param``, ``ambient_color``, ``diffuse_color``
            which is also ``specular_color``).

    Scene data (no gradients):
        faces: (max(F, 1), 3) int32 vertex indices.
        corner_normal, corner_color, corner_uv: (max(F, 1), 3) ``vec3`` / ``vec4`` /
            ``vec2`` per triangle corner (``corners`` is ``corner_normal``;
            ``corner_albedo`` the UVs and colours as the atlas kernel reads them).
        face_material: (max(F, 1),) int32 atlas row, -1 for ``displayColor``;
            ``material_ids``: the same with M for -1 (the table's row).
        face_mesh, vert_mesh: (max(F, 1),) / (max(V, 1),) int32 mesh of each.
        view: (3,) ``vec3``: camera position, forward, (far, 0, 0).
        zfar: (1,) float32 far distance.
    """

    def __init__(self, scene: Scene, device, requires_grad: bool = False):
        m = scene.meshes
        self.device = wp.get_device(device)
        d, rg = self.device, bool(requires_grad)
        self.requires_grad = rg
        nf = max(m.num_faces, 1)
        self.verts = _vec_array(m.verts.reshape(-1, 3), wp.vec3, d, rg)
        if self.verts.shape[0] == 0:
            self.verts = wp.zeros(1, dtype=wp.vec3, device=d, requires_grad=rg)
        faces = m.faces if m.num_faces else np.zeros((1, 3), np.int32)
        self.faces = wp.array(np.ascontiguousarray(faces, np.int32), dtype=wp.int32, device=d)
        self.corner_normal = wp.zeros((nf, 3), dtype=wp.vec3, device=d)
        self.corner_color = wp.zeros((nf, 3), dtype=wp.vec4, device=d)
        self.corner_uv = wp.zeros((nf, 3), dtype=wp.vec2, device=d)
        self.corner_albedo = new_struct(CornerAlbedo, d, uv=self.corner_uv, color=self.corner_color)
        self._assign_corners(m)
        fm = m.face_material.astype(np.int32) if m.num_faces else np.full(nf, -1, np.int32)
        self.face_material = wp.array(fm, dtype=wp.int32, device=d)
        nm = len(scene.materials)
        self.material_ids = wp.array(np.where(fm < 0, nm, fm).astype(np.int32), dtype=wp.int32,
                                     device=d)  # fmt: skip
        mesh = m.face_mesh.astype(np.int32) if m.num_faces else np.zeros(nf, np.int32)
        self.face_mesh = wp.array(mesh, dtype=wp.int32, device=d)
        vert_mesh = np.zeros(self.verts.shape[0], np.int32)
        for i, (first, count) in enumerate(zip(m.vert_first, m.vert_count, strict=True)):
            vert_mesh[int(first) : int(first) + int(count)] = i
        self.vert_mesh = wp.array(vert_mesh, dtype=wp.int32, device=d)
        eye = np.tile(np.eye(4, dtype=np.float32), (max(len(m.names), 1), 1, 1))
        self.mesh_xform = wp.array(eye, dtype=wp.mat44, device=d, requires_grad=rg)
        mats = scene.materials
        self.atlas = Atlas(
            diffuse=[mat.diffuse for mat in mats] + [np.ones(3)],
            opacity=[mat.opacity for mat in mats] + [1.0],
            textures=[_texture(mat.texture) for mat in mats] + [None],
            device=d,
            requires_grad=rg,
        )
        ones = np.ones((nm + 1, 3), np.float32)
        specular = np.array([mat.specular for mat in mats] + [np.zeros(3)], np.float32)
        # UsdPreviewSurface's Blinn-Phong exponent -> the Phong (r . v) exponent
        shininess = np.array([np.float32(mat.shininess / 4.0) for mat in mats] + [10.0], np.float32)
        self.materials = Materials(ambient_color=ones, diffuse_color=ones, specular_color=specular,
                                   shininess=shininess, device=d, requires_grad=rg)  # fmt: skip
        self.view = wp.zeros(3, dtype=wp.vec3, device=d)
        self.zfar = wp.zeros(1, dtype=wp.float32, device=d)
        self.lights = None

    @property
    def corners(self) -> wp.array:
        """The corner normals (``corner_normal``), the first corner array."""
        return self.corner_normal

    def _assign_corners(self, meshes: SceneMeshes) -> None:
        n = meshes.num_faces
        if n:
            self.corner_normal.assign(
                np.ascontiguousarray(meshes.normals.reshape(n, 3, 3), np.float32)
            )
            self.corner_color.assign(
                np.ascontiguousarray(meshes.colors.reshape(n, 3, 4), np.float32)
            )
            self.corner_uv.assign(np.ascontiguousarray(meshes.uvs.reshape(n, 3, 2), np.float32))

    def update_meshes(self, meshes: SceneMeshes) -> None:
        """Writes a later frame's positions, faces (winding), normals, colours and UVs in place."""
        if meshes.num_verts:
            self.verts.assign(np.ascontiguousarray(meshes.verts.reshape(-1, 3), np.float32))
        if meshes.num_faces:
            self.faces.assign(np.ascontiguousarray(meshes.faces, np.int32))
        self._assign_corners(meshes)

    def update_lights(self, lights: LightSet, camera: CameraParams) -> bool:
        """Writes the lights (the headlight follows the camera) and the view into place;
        True when the light list was remade (another number of lights)."""
        rot = np.asarray(camera.cam_to_world, np.float64)
        forward = -rot[2, :3] / max(np.linalg.norm(rot[2, :3]), 1e-12)
        self.view.assign(np.array([camera.position, forward, [camera.far, 0.0, 0.0]], np.float32))
        self.zfar.assign(np.array([camera.far], np.float32))
        new = _light_list(lights, np.float32(forward), "cpu", False)
        if self.lights is not None and self.lights.num_lights == new.num_lights:
            for name, arr in new.parameters().items():
                getattr(self.lights, name).assign(arr.numpy())
            self.lights.kinds.assign(new.kinds.numpy())
            return False
        self.lights = _light_list(lights, np.float32(forward), self.device, self.requires_grad)
        return True


def _texture(tex):
    """An :class:`~warpraster.shading.atlas.Atlas` texture entry of a scene texture."""
    if tex is None:
        return None
    return (
        tex.texels,
        TextureWrap(int(tex.wrap_s)),
        TextureWrap(int(tex.wrap_t)),
        tex.scale,
        tex.bias,
    )


class _Work:
    """The render's own intermediate buffers: their gradients are cleared by each
    recorded render (:mod:`warpraster.grad_buffers`)."""

    owns_grad_buffers = True

    def __init__(self, num_verts: int, num_faces: int, samples: tuple[int, int],
                 image_size: tuple[int, int], device, requires_grad: bool):  # fmt: skip
        d, rg = device, requires_grad
        hs, ws = samples
        h, w = image_size
        self.world = wp.zeros(num_verts, dtype=wp.vec3, device=d, requires_grad=rg)
        self.verts_ndc = wp.zeros(num_verts, dtype=wp.vec3, device=d, requires_grad=rg)
        self.tables = FaceTables(num_faces, d, rg)
        self.albedo = wp.zeros((1, hs, ws, 1), dtype=wp.vec3, device=d, requires_grad=rg)
        self.opacity = wp.zeros((1, hs, ws, 1), dtype=wp.float32, device=d, requires_grad=rg)
        self.samples = wp.zeros((1, hs, ws, 4), dtype=wp.float32, device=d, requires_grad=rg)
        self.color = wp.zeros((h, w), dtype=wp.vec4, device=d, requires_grad=rg)
        self.workspaces = {}


@wp.kernel
def _cull_back_faces(
    # Model:
    faces: wp.array2d(dtype=wp.int32),
    face_mesh: wp.array(dtype=wp.int32),
    mesh_double_sided: wp.array(dtype=wp.int32),
    # Data in:
    verts: wp.array(dtype=wp.vec3),
    view: wp.array(dtype=wp.vec3),
    orthographic: int,
    # Data out:
    faces_out: wp.array2d(dtype=wp.int32),
):
    """Copies each triangle, or its first corner three times (a point: never drawn)
    when its mesh is single-sided and the camera sees its back.

    ``view[0]`` is the camera position, ``view[1]`` its forward direction.
    """
    f = wp.tid()
    a = faces[f, 0]
    b = faces[f, 1]
    c = faces[f, 2]
    keep = mesh_double_sided[face_mesh[f]] != 0
    if not keep:
        p0 = verts[a]
        normal = wp.cross(verts[b] - p0, verts[c] - p0)  # counter-clockwise = front
        toward_camera = view[0] - p0
        if orthographic != 0:
            toward_camera = -view[1]
        keep = wp.dot(normal, toward_camera) >= 0.0  # edge-on: no area on screen either way
    store_face_or_point(faces_out, f, a, b, c, keep)


class StageRenderer:
    """Renders a :class:`~warpraster.usd.scene.Scene` through one of its cameras.

    Everything is allocated here; :meth:`render_device` then allocates nothing
    and reads nothing back, so it can be captured in a graph (``wp.ScopedCapture``)
    and replayed after :meth:`set_frame` has written a new frame into the same
    arrays. It does so itself (:attr:`call_graphs`): outside a ``wp.Tape``, a call
    repeating the last call's objects replays the launches as one captured graph.
    :meth:`render` is :meth:`render_device` plus a copy to the host.

    Args:
        scene: the scene (from :func:`warpraster.usd.load_stage` or built by hand).
        camera: a camera prim path of the scene, a :class:`CameraParams`, or None
            for the render settings' camera, else the scene's first camera (by
            path) or, if it has none, :func:`default_camera` framing the meshes.
        image_size: (H, W) of the pictures.
        spp: samples per pixel, on a grid as square as it allows (:func:`parse_spp`).
        conform: how an image aspect unlike the aperture's is resolved (default:
            UsdRender's fallback, ``EXPAND_APERTURE``: square pixels, the image
            shows more than the aperture along its longer side).
        double_sided: draw the back faces of every mesh; by default only those of
            the meshes whose ``doubleSided`` is true (``scene.meshes.double_sided``),
            as Storm (usdview) does.
        antialias: run nvdiffrast's analytic antialias on the shaded sample image
            before the box filter, so that edges (silhouettes, occlusions) move the
            picture continuously and send gradients to the points, transforms and
            camera; faces touching the near plane keep hard edges
            (:mod:`warpraster.usd.antialias`).
        requires_grad: make the scene's parameters (:class:`StageBuffers`) and the
            camera's ``R``, ``T``, ``focal_length`` / ``principal_point`` (or
            ``scale_xyz``) trainable: a render recorded on a ``wp.Tape`` then sends
            gradients to them from a loss on :attr:`color`.
        device: Warp device.

    Attributes (device outputs of the last render, (H, W)):
        color: ``vec4`` linear RGB (straight) and alpha = coverage x opacity.
        depth: float32 view depth of the centre sample, ``inf`` where empty.
        face_id, mesh_id: int32 triangle / mesh of the centre sample, -1 empty.
        cameras: the rasterizer's camera (its arrays take the camera's gradients).
        call_graphs: :meth:`render_device` replays its launches as one captured
            graph from the second call with the same objects on (a new rasterizer
            when the projection or the near distance changes, new shading inputs
            when the number of lights does), never while a ``wp.Tape`` records: None
            (default) on CUDA, True on every device (the cpu device's graphs are
            experimental in Warp 1.19), False never
            (:func:`~warpraster.raster.workspace.graphs_enabled`).

    Raises:
        ValueError: a camera path the scene does not have (naming it), bad sizes.
    """

    def __init__(
        self,
        scene: Scene,
        *,
        camera: str | CameraParams | None = None,
        image_size=(384, 512),
        spp: int = 1,
        conform: AspectConform = AspectConform.EXPAND_APERTURE,
        double_sided: bool = False,
        antialias: bool = False,
        requires_grad: bool = False,
        device=None,
    ):
        if not isinstance(antialias, bool):
            raise TypeError(f"antialias must be a bool, got {antialias!r}")
        h, w = (int(x) for x in image_size)
        if h < 1 or w < 1:
            raise ValueError(f"image_size must be >= 1 in both dimensions, got {h}x{w}")
        self.grid = parse_spp(spp)
        self.scene = scene
        self.image_size = (h, w)
        self.sample_size = (h * self.grid[0], w * self.grid[1])
        self.conform = AspectConform(conform)
        self.device = wp.get_device(device)
        self.requires_grad = bool(requires_grad)
        d = self.device
        self.camera = self.resolve_camera(scene, camera, aspect=w / h)
        self.buffers = StageBuffers(scene, d, self.requires_grad)
        nf = scene.meshes.num_faces
        sided = scene.meshes.double_sided
        # the triangles the rasterizer sees: a copy with culled back faces made
        # points, or the scene's own when every mesh is drawn from both sides
        self._mesh_double_sided = None
        self._draw_faces = self.buffers.faces
        if not double_sided and sided is not None and nf and not np.all(sided):
            self._mesh_double_sided = wp.array(
                np.asarray(sided, np.int32), dtype=wp.int32, device=d
            )
            self._draw_faces = wp.empty_like(self.buffers.faces)
        self._work = _Work(self.buffers.verts.shape[0], self.buffers.faces.shape[0],
                           self.sample_size, self.image_size, d, self.requires_grad)  # fmt: skip
        self.color = self._work.color
        self._antialias = None
        if antialias:
            self._antialias = StageAntialias(self.buffers.faces, self.buffers.verts.shape[0],
                                             self.sample_size, d)  # fmt: skip
        self.depth = wp.zeros((h, w), dtype=float, device=d)
        self.face_id = wp.zeros((h, w), dtype=wp.int32, device=d)
        self.mesh_id = wp.zeros((h, w), dtype=wp.int32, device=d)
        self._first = wp.array([0], dtype=wp.int32, device=d)
        self._count = wp.array([nf], dtype=wp.int32, device=d)
        self._structs = StructCache()
        self.call_graphs: bool | None = None
        self._call_graph = CallGraph(d)
        self.cameras = None
        self._key = None
        self._inputs = None
        self._apply_camera(self.camera)
        self.buffers.update_lights(scene.lights, self.camera)

    @property
    def _cameras(self):
        return self.cameras

    @property
    def verts_ndc(self) -> wp.array:
        """(max(V, 1),) ``vec3`` projected points of the last render."""
        return self._work.verts_ndc

    @property
    def samples(self) -> wp.array:
        """(1, Hs, Ws, 4) float32 shaded samples (premultiplied RGBA) of the last
        render, before the antialias pass and the box filter."""
        return self._work.samples

    @property
    def antialias(self) -> bool:
        """Whether renders run the antialias pass."""
        return self._antialias is not None

    @staticmethod
    def resolve_camera(scene: Scene, camera, *, aspect: float = 4.0 / 3.0) -> CameraParams:
        """The :class:`CameraParams` meant by ``camera`` (see the class arguments)."""
        if isinstance(camera, CameraParams):
            return camera
        if camera is None:
            rs = scene.render_settings
            if rs is not None and rs.camera in scene.cameras:
                return scene.cameras[rs.camera]
            if len(scene.cameras) >= 1:
                return scene.cameras[sorted(scene.cameras)[0]]
            lo, hi = scene.meshes.bounds()
            return default_camera(lo, hi, up_axis=scene.up_axis, aspect=aspect)
        if not isinstance(camera, str):
            raise TypeError(
                f"camera must be a prim path, CameraParams or None, got {type(camera).__name__}"
            )
        if camera not in scene.cameras:
            have = ", ".join(sorted(scene.cameras)) or "none"
            raise ValueError(f"{camera}: not a camera of {scene.source} (cameras: {have})")
        return scene.cameras[camera]

    def _apply_camera(self, cam: CameraParams) -> None:
        """Writes ``cam`` into the camera's arrays (a new rasterizer only when the
        projection or the near distance changes)."""
        import warpraster as wr

        persp = cam.projection == Projection.PERSPECTIVE
        key = (int(cam.projection), float(cam.near))
        # conform to the picture's aspect, then map the window onto the sample grid
        # (whose aspect differs when the grid is not square)
        ha, va = conformed_apertures(cam, self.image_size, self.conform)
        grid_cam = replace(cam, horizontal_aperture=ha, vertical_aperture=va)
        values = raster_camera(grid_cam, self.sample_size, device="cpu")
        if key != self._key:
            self.cameras = raster_camera(grid_cam, self.sample_size, device=self.device,
                                         requires_grad=self.requires_grad)  # fmt: skip
            settings = wr.RasterizationSettings(
                image_size=self.sample_size,
                faces_per_pixel=1,
                perspective_correct=persp,
                # the shading reads barycentrics clamped to the triangle and renormalised
                clip_barycentric_coords=True,
                z_clip_value=max(cam.near, 1e-6) if persp else None,
            )
            self._rasterizer = wr.MeshRasterizer(cameras=self.cameras, raster_settings=settings)
            self._key = key
            self._inputs = None
        else:
            for name in type(values)._SPEC:
                getattr(self.cameras, name).assign(getattr(values, name).numpy())
        self.camera = cam

    def set_frame(
        self,
        meshes: SceneMeshes | None = None,
        camera: CameraParams | None = None,
        lights: LightSet | None = None,
    ) -> None:
        """Writes a later frame's meshes / camera / lights into the same device arrays."""
        if meshes is not None:
            self.buffers.update_meshes(meshes)
            if self._antialias is not None and meshes.num_faces:
                self._antialias.update_faces(meshes.faces)
        if camera is not None:
            self._apply_camera(camera)
        lights = lights if lights is not None else self.scene.lights
        if self.buffers.update_lights(lights, self.camera):
            self._inputs = None

    def workspace(self, *, clipped: bool):
        """The raster buffers (made on first use): a ClipWorkspace when near-clipping."""
        import warpraster as wr

        work = self._work.workspaces
        if clipped not in work:
            kw = dict(
                num_faces=self.buffers.faces.shape[0],
                num_meshes=1,
                image_size=self.sample_size,
                faces_per_pixel=1,
                device=self.device,
                requires_grad=self.requires_grad,
            )
            if clipped:
                # (not static_faces: a frame rewrites the faces' winding, and the
                # back-face cull rewrites the faces the rasterizer sees every call)
                ws = wr.ClipWorkspace(num_verts=self.buffers.verts.shape[0], **kw)
            else:
                ws = wr.RasterWorkspace(**kw)
            work[clipped] = ws
        return work[clipped]

    def fragments(self):
        """Places the points and rasterizes the current frame at the sample
        resolution (K = 1; on the tape)."""
        b, work = self.buffers, self._work
        place_points(b.verts, b.vert_mesh, b.mesh_xform, out=work.world)
        persp = self.camera.projection == Projection.PERSPECTIVE
        if self._mesh_double_sided is not None:
            wp.launch(
                _cull_back_faces,
                dim=b.faces.shape[0],
                inputs=[
                    b.faces,
                    b.face_mesh,
                    self._mesh_double_sided,
                    work.world,
                    b.view,
                    int(not persp),
                ],  # fmt: skip
                outputs=[self._draw_faces],
                device=self.device,
                record_tape=False,
            )
        return self._rasterizer(
            work.world,
            self._draw_faces,
            self._first,
            self._count,
            workspace=self.workspace(clipped=persp),
            verts_ndc=work.verts_ndc,
            validate=False,
        )

    def _shade_inputs(self):
        """The pixel kernel's :class:`~warpraster.shading.fused.ShadeInputs` (made
        once, again only when the camera model or the number of lights changes)."""
        if self._inputs is not None:
            return self._inputs
        b, work, d = self.buffers, self._work, self.device
        a = new_inputs(d)
        a.lit = 1
        a.mode = int(ShadingMode.PHONG)
        a.texel_source = int(TexelSource.PIXEL)
        a.faces = work.tables.corners
        a.texels = work.albedo
        a.cam.R, a.cam.T = self.cameras.R, self.cameras.T
        b.lights.fill(a.light)
        mat = a.mat
        mat.ambient, mat.diffuse, mat.specular, mat.shininess = b.materials.kernel_args()
        a.face_material = b.material_ids
        a.material_per_face = 1
        a.blend = int(BlendMode.HARD)
        a.background = placeholder(wp.vec3, 1, d)  # zeros: transparent black
        a.zfar = b.zfar
        a.two_sided = 1
        a.orthographic = int(self.camera.projection == Projection.ORTHOGRAPHIC)
        a.far_cut = 1
        a.slot_alpha = 1
        a.premultiply = 1
        a.alpha = work.opacity
        a.precise_eye = 1  # the camera position the stage gave, not an ulp off it
        self._inputs = a
        return a

    def render_device(self) -> None:
        """Renders the current frame into :attr:`color`, :attr:`depth`, :attr:`face_id`,
        :attr:`mesh_id` (no allocation, no host read: capturable). Recorded on a
        ``wp.Tape`` (``requires_grad=True``), its backward sends the gradient of
        :attr:`color` to the scene's parameters. Outside a tape a repeated call
        replays the launches as one graph (:attr:`call_graphs`)."""
        if active_tape() is not None:
            self._launch()
            return
        # the objects whose identity fixes the launches; everything a frame changes
        # is written into the same arrays (set_frame)
        key = (self._rasterizer, self._shade_inputs(), self._draw_faces)
        self._call_graph(key, self._launch, self.call_graphs)

    def _launch(self) -> None:
        """:meth:`render_device`'s launches."""
        b, work = self.buffers, self._work
        clear_if_recording(work)
        frags = self.fragments()
        gather_corner_tables(b.faces, b.face_mesh, work.world, b.corner_normal, b.mesh_xform,
                             pos_out=work.tables.pos, nrm_out=work.tables.nrm)  # fmt: skip
        sample_atlas(frags, b.face_material, b.corner_albedo, b.atlas, albedo_out=work.albedo,
                     opacity_out=work.opacity)  # fmt: skip
        key = (frags.pix_to_face, frags.bary_coords, frags.zbuf, frags.dists)
        frag = self._structs.get("fragments", key, lambda: pixel_fragments(frags))
        launch_shade_blend(frag, self._shade_inputs(), work.samples)
        samples = work.samples
        if self._antialias is not None:
            z_clip = self._rasterizer.raster_settings.z_clip_value
            samples = self._antialias(samples, frags, work.verts_ndc, z_clip)
        resolve_samples(samples, frags, grid=self.grid, far=b.zfar, face_mesh=b.face_mesh,
                        color=self.color, depth=self.depth, face_id=self.face_id,
                        mesh_id=self.mesh_id)  # fmt: skip

    def output(self) -> RenderOutput:
        """The last render's device outputs copied to the host."""
        # copies: on the cpu device .numpy() is a view, which the next render overwrites
        return RenderOutput(
            color=self.color.numpy().reshape(*self.image_size, 4).copy(),
            depth=self.depth.numpy().copy(),
            face_id=self.face_id.numpy().copy(),
            mesh_id=self.mesh_id.numpy().copy(),
        )

    def render(self) -> RenderOutput:
        """Renders the current frame: colour, depth and ids on the host."""
        self.render_device()
        return self.output()
