"""Rendering a loaded scene: device buffers allocated once, one render per frame.

:class:`StageRenderer` uploads a :class:`~warpraster.usd.scene.Scene` once
(:class:`StageBuffers`), then each :meth:`StageRenderer.render` rasterizes the
packed meshes through the camera (one image, K = 1, perspective-correct
barycentrics, near-plane clipping at the camera's near distance), then one
kernel (:mod:`warpraster.usd.shade`) shades the ``spp`` samples of each pixel
(a grid of samples per pixel) and box-filters them. New positions, normals
and cameras of a later frame are written into the same device arrays
(``wp.array.assign``): nothing is reallocated per frame.

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

from .cameras import conformed_apertures, default_camera, raster_camera
from .scene import (
    AspectConform,
    CameraParams,
    LightSet,
    Material,
    Projection,
    Scene,
    SceneMeshes,
)
from .shade import Corner, Lighting, MaterialRow, Surface, launch_shade

__all__ = ["RenderOutput", "StageBuffers", "StageRenderer", "linear_to_srgb", "parse_spp"]

wp.set_module_options({"enable_backward": False})  # integer outputs only


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


def _vec_array(a: np.ndarray, dtype, device) -> wp.array:
    return wp.array(np.ascontiguousarray(a, np.float32), dtype=dtype, device=device)


class StageBuffers:
    """Every device array of a scene: triangles, corners, materials, textures, lights.

    Attributes:
        verts: (max(V, 1),) ``vec3`` world positions, rewritten in place by
            :meth:`update_meshes` (as are ``faces`` and ``corners``).
        faces: (max(F, 1), 3) int32 vertex indices.
        corners: (3 max(F, 1),) :class:`~warpraster.usd.shade.Corner`: normal,
            colour and UV of each triangle corner.
        face_material, face_mesh: (max(F, 1),) int32 material row (-1: none) and mesh.
        surface: those arrays as the kernels' :class:`~warpraster.usd.shade.Surface`.
        materials: (max(M, 1),) :class:`~warpraster.usd.shade.MaterialRow`.
        texels: ``vec4`` linear RGBA of every texture, one after the other (row 0
            is a black texel).
        lighting: the lights and the view, :class:`~warpraster.usd.shade.Lighting`.
    """

    def __init__(self, scene: Scene, device):
        m = scene.meshes
        self.device = wp.get_device(device)
        d = self.device
        nf = max(m.num_faces, 1)
        self.verts = _vec_array(m.verts.reshape(-1, 3), wp.vec3, d)
        faces = m.faces if m.num_faces else np.zeros((1, 3), np.int32)
        self.faces = wp.array(np.ascontiguousarray(faces, np.int32), dtype=wp.int32, device=d)
        self.corners = wp.array(_corner_rows(m), dtype=Corner, device=d)
        fm = m.face_material if m.num_faces else np.full(nf, -1, np.int32)
        self.face_material = wp.array(fm.astype(np.int32), dtype=wp.int32, device=d)
        mesh = m.face_mesh if m.num_faces else np.zeros(nf, np.int32)
        self.face_mesh = wp.array(mesh.astype(np.int32), dtype=wp.int32, device=d)
        self.surface = Surface()
        for name in Surface.vars:
            setattr(self.surface, name, getattr(self, name))
        self.materials, self.texels = _material_rows(scene.materials, d)
        self.lights = scene.lights
        self.lighting = Lighting()
        self.lighting.directional = self._light_rows(scene.lights.directional)
        self.lighting.point = self._light_rows(scene.lights.point)
        self.lighting.ambient = _vec_array(scene.lights.ambient.reshape(1, 3), wp.vec3, d)
        self.lighting.view = wp.zeros(3, dtype=wp.vec3, device=d)

    @property
    def view(self) -> wp.array:
        """(3,) ``vec3``: camera position, forward, (far, 0, 0)."""
        return self.lighting.view

    def _light_rows(self, rows: np.ndarray) -> wp.array:
        rows = np.asarray(rows, np.float32).reshape(-1, 2, 3)
        return wp.array(rows, dtype=wp.vec3, device=self.device)

    def _assign_light_rows(self, name: str, rows: np.ndarray) -> None:
        """Writes light rows in place (a new array when the number of lights changed)."""
        current = getattr(self.lighting, name)
        if rows.shape == tuple(current.shape) + (3,):
            current.assign(rows)
        else:
            setattr(self.lighting, name, self._light_rows(rows))

    def update_meshes(self, meshes: SceneMeshes) -> None:
        """Writes a later frame's positions, faces (winding), normals, colours and UVs in place."""
        self.verts.assign(np.ascontiguousarray(meshes.verts.reshape(-1, 3), np.float32))
        if meshes.num_faces:
            self.faces.assign(np.ascontiguousarray(meshes.faces, np.int32))
        self.corners.assign(_corner_rows(meshes))

    def update_lights(self, lights: LightSet, camera: CameraParams) -> None:
        """Writes the lights (the headlight follows the camera) and the view into place."""
        rot = np.asarray(camera.cam_to_world, np.float64)
        forward = -rot[2, :3] / max(np.linalg.norm(rot[2, :3]), 1e-12)
        self.view.assign(np.array([camera.position, forward, [camera.far, 0.0, 0.0]], np.float32))
        d = np.asarray(lights.directional, np.float32).reshape(-1, 2, 3).copy()
        if lights.headlight and len(d):
            d[0, 0] = forward
        self._assign_light_rows("directional", d)
        self._assign_light_rows("point", np.asarray(lights.point, np.float32).reshape(-1, 2, 3))
        self.lighting.ambient.assign(np.asarray(lights.ambient, np.float32).reshape(1, 3))


def _corner_rows(meshes: SceneMeshes) -> np.ndarray:
    """The meshes' per-corner normals, colours and UVs as one :class:`Corner` record
    each (a NumPy structured array, 3 max(F, 1) rows)."""
    rows = np.zeros(max(3 * meshes.num_faces, 3), Corner.numpy_dtype())
    n = 3 * meshes.num_faces
    rows["normal"][:n] = meshes.normals.reshape(-1, 3)
    rows["color"][:n] = meshes.colors.reshape(-1, 4)
    rows["uv"][:n] = meshes.uvs.reshape(-1, 2)
    return rows


def _material_rows(materials: list[Material], device) -> tuple[wp.array, wp.array]:
    """The scene's materials as :class:`MaterialRow` s (one default row when there is
    none) and the texel atlas they index (texel 0 is black; textures follow it)."""
    rows = []
    chunks, offset = [np.zeros((1, 4), np.float32)], 1
    for mat in materials or [None]:
        row = MaterialRow()
        row.shininess, row.opacity = 1.0, 1.0
        row.tex_scale = wp.vec4(1.0)
        if mat is not None:
            row.diffuse, row.specular = wp.vec3(*mat.diffuse), wp.vec3(*mat.specular)
            row.shininess = mat.shininess / 4.0  # Blinn-Phong exponent -> Phong (r . v) exponent
            row.opacity = mat.opacity
            tex = mat.texture
            if tex is not None:
                h, w = tex.texels.shape[:2]
                row.texture = wp.vec4i(offset, w, h, int(tex.wrap_s) * 4 + int(tex.wrap_t))
                row.tex_scale, row.tex_bias = wp.vec4(*tex.scale), wp.vec4(*tex.bias)
                chunks.append(tex.texels.reshape(-1, 4))
                offset += h * w
        rows.append(row)
    texels = _vec_array(np.concatenate(chunks), wp.vec4, device)
    return wp.array(rows, dtype=MaterialRow, device=device), texels


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
    if keep:
        faces_out[f, 0] = a
        faces_out[f, 1] = b
        faces_out[f, 2] = c
    else:
        faces_out[f, 0] = a
        faces_out[f, 1] = a
        faces_out[f, 2] = a


class StageRenderer:
    """Renders a :class:`~warpraster.usd.scene.Scene` through one of its cameras.

    Everything is allocated here; :meth:`render_device` then allocates nothing
    and reads nothing back, so it can be captured in a graph (``wp.ScopedCapture``)
    and replayed after :meth:`set_frame` has written a new frame into the same
    arrays. :meth:`render` is :meth:`render_device` plus a copy to the host.

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
        device: Warp device.

    Attributes (device outputs of the last render, (H, W)):
        color: ``vec4`` linear RGB (straight) and alpha = coverage x opacity.
        depth: float32 view depth of the centre sample, ``inf`` where empty.
        face_id, mesh_id: int32 triangle / mesh of the centre sample, -1 empty.

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
        device=None,
    ):
        h, w = (int(x) for x in image_size)
        if h < 1 or w < 1:
            raise ValueError(f"image_size must be >= 1 in both dimensions, got {h}x{w}")
        self.grid = parse_spp(spp)
        self.scene = scene
        self.image_size = (h, w)
        self.sample_size = (h * self.grid[0], w * self.grid[1])
        self.conform = AspectConform(conform)
        self.device = wp.get_device(device)
        d = self.device
        self.camera = self.resolve_camera(scene, camera, aspect=w / h)
        self.buffers = StageBuffers(scene, d)
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
        self.color = wp.zeros((h, w), dtype=wp.vec4, device=d)
        self.depth = wp.zeros((h, w), dtype=float, device=d)
        self.face_id = wp.zeros((h, w), dtype=wp.int32, device=d)
        self.mesh_id = wp.zeros((h, w), dtype=wp.int32, device=d)
        self.verts_ndc = wp.zeros(max(scene.meshes.num_verts, 1), dtype=wp.vec3, device=d)
        self._workspaces = {}
        self._first = wp.array([0], dtype=wp.int32, device=d)
        self._count = wp.array([nf], dtype=wp.int32, device=d)
        self._cameras = None
        self._key = None
        self._apply_camera(self.camera)
        self.buffers.update_lights(scene.lights, self.camera)

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
            self._cameras = raster_camera(grid_cam, self.sample_size, device=self.device)
            settings = wr.RasterizationSettings(
                image_size=self.sample_size,
                faces_per_pixel=1,
                perspective_correct=persp,
                z_clip_value=max(cam.near, 1e-6) if persp else None,
            )
            self._rasterizer = wr.MeshRasterizer(cameras=self._cameras, raster_settings=settings)
            self._key = key
        else:
            for name in type(values)._SPEC:
                getattr(self._cameras, name).assign(getattr(values, name).numpy())
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
        if camera is not None:
            self._apply_camera(camera)
        self.buffers.update_lights(lights if lights is not None else self.scene.lights, self.camera)

    def workspace(self, *, clipped: bool):
        """The raster buffers (made on first use): a ClipWorkspace when near-clipping."""
        import warpraster as wr

        if clipped not in self._workspaces:
            nf = max(self.scene.meshes.num_faces, 1)
            kw = dict(
                num_faces=nf,
                num_meshes=1,
                image_size=self.sample_size,
                faces_per_pixel=1,
                device=self.device,
            )
            if clipped:
                ws = wr.ClipWorkspace(num_verts=max(self.scene.meshes.num_verts, 1), **kw)
            else:
                ws = wr.RasterWorkspace(**kw)
            self._workspaces[clipped] = ws
        return self._workspaces[clipped]

    def fragments(self):
        """Rasterizes the current frame at the sample resolution (K = 1)."""
        persp = self.camera.projection == Projection.PERSPECTIVE
        if self._mesh_double_sided is not None:
            b = self.buffers
            wp.launch(
                _cull_back_faces,
                dim=b.faces.shape[0],
                inputs=[
                    b.faces,
                    b.face_mesh,
                    self._mesh_double_sided,
                    b.verts,
                    b.view,
                    int(not persp),
                ],
                outputs=[self._draw_faces],
                device=self.device,
            )
        return self._rasterizer(
            self.buffers.verts,
            self._draw_faces,
            self._first,
            self._count,
            workspace=self.workspace(clipped=persp),
            verts_ndc=self.verts_ndc,
            validate=False,
        )

    def render_device(self) -> None:
        """Renders the current frame into :attr:`color`, :attr:`depth`, :attr:`face_id`,
        :attr:`mesh_id` (no allocation, no host read: capturable)."""
        frags = self.fragments()
        cam = self.camera
        ortho = cam.projection == Projection.ORTHOGRAPHIC
        launch_shade(
            frags,
            self.buffers,
            grid=self.grid,
            orthographic=ortho,
            color=self.color,
            depth=self.depth,
            face_id=self.face_id,
            mesh_id=self.mesh_id,
        )

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
