"""What a loaded scene holds, free of pxr: meshes, materials, cameras, lights.

These containers are plain NumPy on the host; :class:`warpraster.usd.StageRenderer`
uploads them once. The OBJ loader of the command line fills the same containers
without USD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

__all__ = [
    "AspectConform",
    "CameraParams",
    "LightSet",
    "Material",
    "Projection",
    "RenderSettings",
    "Scene",
    "SceneMeshes",
    "TextureImage",
    "WrapMode",
    "headlight",
    "scene_from_arrays",
]

#: Strength of the headlight a scene without lights gets, and its ambient light.
HEADLIGHT_STRENGTH = 0.85
HEADLIGHT_AMBIENT = 0.15


class Projection(IntEnum):
    """Camera projection (``UsdGeom.Camera.projection``)."""

    PERSPECTIVE = 0
    ORTHOGRAPHIC = 1


class AspectConform(IntEnum):
    """How an image aspect ratio different from the aperture's is resolved.

    The names are UsdRender's ``aspectRatioConformPolicy`` tokens.
    ``ADJUST_PIXEL_ASPECT_RATIO`` (the default here) keeps both apertures: the
    horizontal aperture spans the full image width and the vertical aperture the
    full height, whatever the image shape (non-square pixels if the aspects
    differ). ``EXPAND_APERTURE`` (UsdRender's fallback) grows one aperture so the
    image shows more; ``CROP_APERTURE`` shrinks one; ``ADJUST_APERTURE_WIDTH`` /
    ``ADJUST_APERTURE_HEIGHT`` change that one to the image aspect.
    """

    ADJUST_PIXEL_ASPECT_RATIO = 0
    EXPAND_APERTURE = 1
    CROP_APERTURE = 2
    ADJUST_APERTURE_WIDTH = 3
    ADJUST_APERTURE_HEIGHT = 4


class WrapMode(IntEnum):
    """Texture wrap (``UsdUVTexture`` ``wrapS``/``wrapT``)."""

    REPEAT = 0
    CLAMP = 1
    MIRROR = 2
    BLACK = 3


@dataclass
class TextureImage:
    """A decoded texture: (H, W, 4) float32 linear RGBA, row 0 at the top (v = 1)."""

    path: str
    texels: np.ndarray
    wrap_s: WrapMode = WrapMode.REPEAT
    wrap_t: WrapMode = WrapMode.REPEAT
    scale: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    bias: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)


@dataclass
class Material:
    """A Phong material from ``UsdPreviewSurface`` (see :mod:`warpraster.usd.materials`).

    Attributes:
        name: the material prim's path (or a made-up name).
        diffuse: (3,) linear RGB diffuse colour (multiplied by the texture, if any).
        specular: (3,) linear RGB specular colour.
        shininess: Phong exponent.
        opacity: 0..1.
        texture: the diffuse texture, or None.
        uv_primvar: the primvar the texture reads (``st`` unless the network says).
    """

    name: str
    diffuse: np.ndarray = field(default_factory=lambda: np.full(3, 0.18, np.float32))
    specular: np.ndarray = field(default_factory=lambda: np.full(3, 0.04, np.float32))
    shininess: float = 10.0
    opacity: float = 1.0
    texture: TextureImage | None = None
    uv_primvar: str = "st"


@dataclass
class CameraParams:
    """A USD-style camera: the parameters of ``UsdGeom.Camera`` at one time.

    Apertures, offsets and focal length in the camera's units (tenths of a scene
    unit; only their ratios matter for a perspective camera); ``cam_to_world`` is
    the 4x4 row-vector local-to-world matrix (the camera looks down its -Z with
    +Y up, USD's convention).
    """

    name: str
    cam_to_world: np.ndarray
    projection: Projection = Projection.PERSPECTIVE
    focal_length: float = 50.0
    horizontal_aperture: float = 20.955
    vertical_aperture: float = 15.2908
    horizontal_aperture_offset: float = 0.0
    vertical_aperture_offset: float = 0.0
    near: float = 1.0
    far: float = 1e6

    @property
    def aspect(self) -> float:
        """Aperture width / height."""
        return self.horizontal_aperture / self.vertical_aperture

    @property
    def position(self) -> np.ndarray:
        """(3,) float64 camera centre in world space."""
        return np.asarray(self.cam_to_world, np.float64)[3, :3].copy()


@dataclass
class LightSet:
    """Lights in the renderer's terms (colours already scaled by intensity).

    Attributes:
        directional: (D, 2, 3) float32 rows of (direction the light travels, colour).
        point: (P, 2, 3) float32 rows of (world position, colour).
        ambient: (3,) float32 ambient colour.
        names: light prim paths (``"headlight"`` for the one added when there is none).
        headlight: the light is a directional light travelling along the view
            direction, placed at render time.
    """

    directional: np.ndarray
    point: np.ndarray
    ambient: np.ndarray
    names: list[str]
    headlight: bool = False


@dataclass
class SceneMeshes:
    """Every mesh of a scene in world space, packed as one triangle list.

    Attributes:
        names: (M) mesh prim paths.
        verts: (V, 3) float32 world positions.
        faces: (F, 3) int32 triangles (global vertex indices, counter-clockwise
            from the front).
        vert_first, vert_count, face_first, face_count: (M,) int64 ranges of each mesh.
        face_mesh: (F,) int32 mesh of each triangle.
        normals: (F, 3, 3) float32 world normal of each triangle corner.
        colors: (F, 3, 4) float32 ``displayColor`` and ``displayOpacity`` per corner.
        uvs: (F, 3, 2) float32 texture coordinates per corner (0 where a mesh has none).
        face_material: (F,) int32 index into the scene's materials, -1 for none
            (then ``colors`` is the diffuse colour).
        subsets: GeomSubset path -> (n,) int64 triangle indices.
        double_sided: (M,) bool, the meshes' ``doubleSided`` (None: every mesh is
            double-sided, as for meshes not read from USD). A renderer culls the
            back faces of the others, as Storm does.
        nonfinite: (M,) bool, the meshes with a NaN or infinite point at this time
            (None: look at ``verts``).
    """

    names: list[str]
    verts: np.ndarray
    faces: np.ndarray
    vert_first: np.ndarray
    vert_count: np.ndarray
    face_first: np.ndarray
    face_count: np.ndarray
    face_mesh: np.ndarray
    normals: np.ndarray
    colors: np.ndarray
    uvs: np.ndarray
    face_material: np.ndarray
    subsets: dict[str, np.ndarray] = field(default_factory=dict)
    double_sided: np.ndarray | None = None
    nonfinite: np.ndarray | None = None

    @property
    def num_faces(self) -> int:
        return int(self.faces.shape[0])

    @property
    def num_verts(self) -> int:
        return int(self.verts.shape[0])

    def packed(self, *, per_mesh: bool = False, device=None):
        """The world-space triangles as :class:`warpraster.PackedMeshes` (Warp arrays).

        Args:
            per_mesh: one batch entry (one image) per mesh, as PyTorch3D's
                ``Meshes``; by default the whole scene is one entry (one image).
            device: Warp device.
        """
        import warp as wp

        import warpraster as wr

        verts = wp.array(np.ascontiguousarray(self.verts, np.float32), dtype=wp.vec3, device=device)
        if per_mesh:
            first, count = self.face_first, self.face_count
        else:
            first, count = np.zeros(1, np.int64), np.array([self.num_faces], np.int64)
        return wr.pack_meshes(
            verts, self.faces.astype(np.int32), first.astype(np.int32), count.astype(np.int32)
        )

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(3,), (3,) float64 world bounding box (finite vertices only)."""
        v = np.asarray(self.verts, np.float64)
        v = v[np.isfinite(v).all(axis=1)]
        if v.size == 0:
            return np.zeros(3), np.zeros(3)
        return v.min(0), v.max(0)

    def nonfinite_meshes(self) -> list[str]:
        """Names of the meshes with a NaN or infinite point (their faces through such a
        point are never drawn; a mesh whose points are all non-finite draws nothing)."""
        if self.nonfinite is not None:
            return [n for n, bad in zip(self.names, self.nonfinite, strict=True) if bad]
        bad = ~np.isfinite(np.asarray(self.verts)).all(axis=1)
        if not bad.any():
            return []
        first = np.asarray(self.vert_first, np.int64)
        sums = np.concatenate([[0], np.cumsum(bad)])
        hit = sums[first + np.asarray(self.vert_count, np.int64)] - sums[first]
        return [n for n, h in zip(self.names, hit, strict=True) if h > 0]


@dataclass
class RenderSettings:
    """What a ``UsdRender.Settings`` prim asks for (None where it says nothing).

    Attributes:
        path: the settings prim.
        camera: the camera prim path of its ``camera`` relationship.
        resolution: ``(W, H)`` in pixels.
        conform: its ``aspectRatioConformPolicy``.
    """

    path: str
    camera: str | None = None
    resolution: tuple[int, int] | None = None
    conform: AspectConform | None = None


@dataclass
class Scene:
    """A scene at one time: meshes, materials, cameras, lights and its frame range.

    Attributes:
        source: the file (or the in-memory layer's identifier).
        meshes: :class:`SceneMeshes`.
        materials: list of :class:`Material` (``SceneMeshes.face_material`` indexes it).
        cameras: camera prim path -> :class:`CameraParams`.
        lights: :class:`LightSet` (a headlight when the scene has none).
        frame_range: ``(start, end)`` time codes, None for a static scene.
        time: the time code the scene was read at (None = default values).
        up_axis: ``"Y"`` or ``"Z"``.
        render_settings: the stage's :class:`RenderSettings` (its
            ``renderSettingsPrimPath``, else its first ``RenderSettings`` prim), or None.
        warnings: the reader's own warnings, one line each (a texture that cannot be
            read and is drawn in its fallback colour); also issued as
            :class:`~warpraster.usd.errors.SceneWarning`.
        diagnostics: USD's warnings while the stage was read, one line each
            (collected, not printed: :mod:`warpraster.usd.diagnostics`).
        unresolved: what the stage could not compose (unresolved references,
            payloads or sublayers), one line each.
    """

    source: str
    meshes: SceneMeshes
    materials: list[Material]
    cameras: dict[str, CameraParams]
    lights: LightSet
    frame_range: tuple[float, float] | None = None
    time: float | None = None
    up_axis: str = "Y"
    render_settings: RenderSettings | None = None
    warnings: list[str] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


def headlight() -> LightSet:
    """The light of a scene that has none: a directional light of strength 0.85
    travelling along the view direction (set per view at render time), plus 0.15 ambient."""
    return LightSet(
        directional=np.array([[[0.0, 0.0, -1.0], [HEADLIGHT_STRENGTH] * 3]], np.float32),
        point=np.zeros((0, 2, 3), np.float32),
        ambient=np.full(3, HEADLIGHT_AMBIENT, np.float32),
        names=["headlight"],
        headlight=True,
    )


def scene_from_arrays(
    verts,
    faces,
    *,
    name: str = "mesh",
    color=(0.8, 0.55, 0.3),
    smooth: bool = False,
    source: str = "arrays",
) -> Scene:
    """A one-mesh :class:`Scene` from world-space arrays, lit by a headlight, no camera.

    Args:
        verts: (V, 3) float positions.
        faces: (F, 3) int vertex indices (counter-clockwise from the front).
        name: the mesh's name.
        color: linear RGB display colour.
        smooth: area-weighted vertex normals (else flat face normals).
        source: what the scene says it was read from.

    Raises:
        ValueError: bad shapes, or face indices out of range (naming ``source``).
    """
    v = np.asarray(verts, np.float32)
    f = np.asarray(faces)
    if v.ndim != 2 or v.shape[1] != 3:
        raise ValueError(f"{source}: verts must be (V, 3), got shape {v.shape}")
    if f.size == 0:
        f = np.zeros((0, 3), np.int64)
    if f.ndim != 2 or f.shape[1] != 3 or not np.issubdtype(f.dtype, np.integer):
        raise ValueError(f"{source}: faces must be (F, 3) integers, got shape {f.shape} {f.dtype}")
    if f.size and (f.min() < 0 or f.max() >= v.shape[0]):
        bad = int(f.max()) if f.max() >= v.shape[0] else int(f.min())
        raise ValueError(
            f"{source}: a face refers to vertex {bad} but there are {v.shape[0]} vertices"
        )
    f = f.astype(np.int32)
    p = v.astype(np.float64)[f]
    fn = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    if smooth:
        acc = np.stack(
            [np.bincount(f.ravel(), np.repeat(fn[:, k], 3), minlength=len(v)) for k in range(3)], 1
        )
        corner = acc[f]
    else:
        corner = np.repeat(fn[:, None], 3, axis=1)
    norm = np.linalg.norm(corner, axis=-1, keepdims=True)
    normals = (corner / np.where(norm > 0, norm, 1.0)).astype(np.float32)
    nf = f.shape[0]
    colors = np.empty((nf, 3, 4), np.float32)
    colors[..., :3] = np.asarray(color, np.float32)
    colors[..., 3] = 1.0
    meshes = SceneMeshes(
        names=[name],
        verts=v,
        faces=f,
        vert_first=np.zeros(1, np.int64),
        vert_count=np.array([v.shape[0]], np.int64),
        face_first=np.zeros(1, np.int64),
        face_count=np.array([nf], np.int64),
        face_mesh=np.zeros(nf, np.int32),
        normals=normals,
        colors=colors,
        uvs=np.zeros((nf, 3, 2), np.float32),
        face_material=np.full(nf, -1, np.int32),
    )
    return Scene(source=source, meshes=meshes, materials=[], cameras={}, lights=headlight())
