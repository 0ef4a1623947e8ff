"""The sensor's kernel arguments, grouped by what travels together.

Arrays that every sensor kernel passes as one unit are Warp structs, built once
(at set-up, per frame slot, or on the backward's first need) and cached on the
sensor, its frames and its backward, so a step packs nothing on the host. The
struct fields are the arrays the kernels took one by one before; the
arithmetic is unchanged. Gradients: Warp's tape mirrors a struct's array fields
with their ``.grad`` arrays, so the generated-adjoint path
(``deterministic=False``) differentiates through them as through plain arrays.

Static (set-up): :class:`VertexSources`, :class:`View`, :class:`Surface`,
:class:`Look` (with its :class:`MaterialArrays`), :class:`Csr`, :class:`SensorMesh`,
:class:`SourceGroups`, :class:`FaceWalk`.
Per frame slot: :class:`FrameArrays`, :class:`Channels` and :class:`FrameScene` (all
a pixel reads: with the fragments as the shading kernels' ``PixelFragments``).
Backward scratch: :class:`PixelRecords` (and their :func:`pixel_row` view), :class:`Outline`,
:class:`FaceSums`, :class:`BigFaces`, :class:`VertexGrads`, :class:`CameraGrads`,
:class:`MaterialArrays` (the material gradients).
"""

from __future__ import annotations

import warp as wp

from ..backward.sorted import SegmentEntries
from ..shading.lighting import LightRows
from ..shading.material_table import CornerAlbedo, MaterialTable
from ..shading.pixel_args import PixelFragments, pixel_fragments


# ----------------------------------------------------------------------------- static
@wp.struct
class VertexSources:
    """Where each sensor vertex (V,) comes from: ``source`` (a ``VertexSource``),
    ``index`` (its particle or body), ``local`` (body-frame or world point)."""

    source: wp.array(dtype=wp.int32)
    index: wp.array(dtype=wp.int32)
    local: wp.array(dtype=wp.vec3)


@wp.struct
class View:
    """The packed images: projected vertex j (P,) is sensor vertex
    ``proj_vertex[j]`` seen in image ``proj_image[j]`` (image n = world * C +
    camera); ``camera_count`` C; image ``height`` x ``width`` pixels;
    ``aspect_min`` = min(1, width / height) (the NDC scale of the shorter side);
    ``near`` the near plane's view depth (0: no clipping)."""

    proj_vertex: wp.array(dtype=wp.int32)
    proj_image: wp.array(dtype=wp.int32)
    camera_count: int
    height: int
    width: int
    aspect_min: float
    near: float


@wp.struct
class Surface:
    """The packed faces (F,): ``faces`` index projected vertices,
    ``face_vertices`` the same corners as sensor vertices; ``face_shape`` the
    shape of each face, ``shape_index`` (S,) each shape's output index;
    ``face_material`` its row of the material table (-1: its corner colours),
    ``face_source`` its row among the sensor's own triangles (F_s,), the rows of
    ``corners`` (F_s, 3), the corners' texture coordinates and colours."""

    faces: wp.array2d(dtype=wp.int32)
    face_vertices: wp.array2d(dtype=wp.int32)
    face_shape: wp.array(dtype=wp.int32)
    shape_index: wp.array(dtype=wp.uint32)
    face_source: wp.array(dtype=wp.int32)
    face_material: wp.array(dtype=wp.int32)
    corners: CornerAlbedo


@wp.struct
class MaterialArrays:
    """The material arrays (which may require gradients), or their gradients: the
    material table's diffuse colours (a row per shape, then the geometry's
    materials), light direction and intensity (1,)."""

    colors: wp.array(dtype=wp.vec3)
    light_direction: wp.array(dtype=wp.vec3)
    light_intensity: wp.array(dtype=float)


@wp.struct
class Look:
    """Shading and coverage options (see ``render.channels_kernel``), the
    :class:`MaterialArrays`, the material table (its ``diffuse`` is
    ``materials.colors``) and the light list (``lights``: the shading core's
    lights, read only by the channel variants compiled with them; their rows per
    world when ``light_per_world``, else per image)."""

    sigma: float
    ambient: int
    up: wp.vec3
    sky: wp.vec3
    ground: wp.vec3
    ambient_intensity: float
    clear_color: wp.vec3
    clear_depth: float
    smooth: int
    materials: MaterialArrays
    table: MaterialTable
    lights: LightRows
    light_per_world: int


@wp.struct
class Csr:
    """A static list per key: entries ``entries[start[k]:start[k + 1]]`` of key k,
    in ascending order (``adjoint.csr``)."""

    start: wp.array(dtype=wp.int32)
    entries: wp.array(dtype=wp.int32)


@wp.struct
class SensorMesh:
    """The sensor's own triangles, (F_s, 3) sensor vertex indices (each shape's
    faces once, not per image), and each sensor vertex's corners (``3 face + c``,
    ascending): what the area-weighted vertex normals and their adjoint read."""

    faces: wp.array2d(dtype=wp.int32)
    corners: Csr


@wp.struct
class SourceGroups:
    """The sensor vertices of each used particle or body u: the list ``verts`` of key u
    (a :class:`Csr`, ascending); ``ids[u]`` its particle or body index."""

    verts: Csr
    ids: wp.array(dtype=wp.int32)


@wp.struct
class FaceWalk:
    """What the face walk needs besides the frame's scene (its faces, NDC vertices,
    image size, fragments): the image of each packed face (-1: none) and the
    margin (NDC) a pixel centre may lie outside a face and still show it."""

    face_image: wp.array(dtype=wp.int32)
    margin_ndc: float


# ----------------------------------------------------------------------------- per frame slot
@wp.struct
class FrameArrays:
    """A frame slot's geometry: world points (V,), projected vertices (P,), vertex
    normals (V,, or (1,) without smooth normals); ``uncut`` (1,) 1 when no face of
    the frame reaches behind the near plane (the clip pass kept its list as the
    input's: :class:`~warpraster.clip.buffers.FaceCases` ``identity``), else 0."""

    points: wp.array(dtype=wp.vec3)
    ndc: wp.array(dtype=wp.vec3)
    vertex_normals: wp.array(dtype=wp.vec3)
    uncut: wp.array(dtype=wp.int32)


@wp.struct
class Channels:
    """A frame slot's image channels, (world, camera, H, W), or their gradients."""

    color: wp.array4d(dtype=wp.vec3)
    albedo: wp.array4d(dtype=wp.vec3)
    normal: wp.array4d(dtype=wp.vec3)
    depth: wp.array4d(dtype=float)
    forward_depth: wp.array4d(dtype=float)
    alpha: wp.array4d(dtype=float)
    shape_index: wp.array4d(dtype=wp.uint32)


@wp.struct
class FrameScene:
    """Everything a pixel of a frame slot reads: its fragments, (N, H, W, K), of the
    sharp pass (K = 1) and of the blurred pass (K = ``SOFT_SLOTS``; the sharp pass's
    without a soft silhouette), the packed images, faces, look and materials, and
    the slot's geometry."""

    sharp: PixelFragments
    blurred: PixelFragments
    view: View
    surface: Surface
    look: Look
    frame: FrameArrays


# ----------------------------------------------------------------------------- backward scratch
@wp.struct
class PixelRecords:
    """Per pixel (N, H, W): the face it shows (-1: none) and the gradients of that
    face's NDC vertices, world vertices and raw vertex normals (rows = corners);
    each blurred slot's NDC vertex gradients (N, H, W, SOFT_SLOTS); the camera
    origin's gradient; the albedo and light (direction, intensity) gradients."""

    face: wp.array3d(dtype=wp.int32)
    ndc: wp.array3d(dtype=wp.mat33)
    world: wp.array3d(dtype=wp.mat33)
    vn: wp.array3d(dtype=wp.mat33)
    soft: wp.array4d(dtype=wp.mat33)
    origin: wp.array3d(dtype=wp.vec3)
    albedo: wp.array3d(dtype=wp.vec3)
    light: wp.array3d(dtype=wp.vec4)


@wp.struct
class TexelTaps:
    """The texel gradients of the pixels as the ``entries`` of a deterministic sorted
    sum (4 per pixel of (N, H, W), pixel-major): key the tapped texel
    (``num_texels``: none), value the tap's weight times the pixel's scaled texel
    gradient (rgb)."""

    entries: SegmentEntries
    num_texels: int


@wp.struct
class Outline:
    """Per soft pixel (N, H, W): whether its outline point is used, its face's NDC
    vertices (rows), and the gradients of its barycentrics and depth."""

    on: wp.array3d(dtype=wp.int32)
    verts: wp.array3d(dtype=wp.mat33)
    g_bary: wp.array3d(dtype=wp.vec3)
    g_depth: wp.array3d(dtype=float)


@wp.struct
class FaceSums:
    """Per row strip of a packed face's pixel box, (faces, strips), rows = corners: the
    summed gradients of the face's NDC vertices, world vertices and raw vertex
    normals. The per-face sums are (F, 1) (a face's whole box as one strip); the big
    faces' strips are (capacity, strips), summed into the per-face ones."""

    ndc: wp.array2d(dtype=wp.mat33)
    world: wp.array2d(dtype=wp.mat33)
    vn: wp.array2d(dtype=wp.mat33)


@wp.struct
class BigFaces:
    """The faces whose pixel box holds more than ``area`` pixels: ``count`` (1,)
    listed so far, ``faces`` (capacity,) the list (its length is the capacity)."""

    count: wp.array(dtype=wp.int32)
    faces: wp.array(dtype=wp.int32)
    area: int


@wp.struct
class VertexGrads:
    """Per projected vertex (P,) or sensor vertex (V,): the gradients of its world
    point and of its raw vertex normal."""

    point: wp.array(dtype=wp.vec3)
    vn: wp.array(dtype=wp.vec3)


@wp.struct
class CameraGrads:
    """Camera gradients per projected vertex (P,) or per image (N,): translation,
    rotation (quaternion as 4 free numbers) and field of view."""

    t: wp.array(dtype=wp.vec3)
    q: wp.array(dtype=wp.vec4)
    fov: wp.array(dtype=float)


def make(cls, **fields):
    """A ``cls`` struct instance with ``fields`` set (built once, then cached)."""
    s = cls()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def pixel_row(records: PixelRecords) -> PixelRecords:
    """The same records viewed as one row of pixels, (1, 1, N H W) (``soft``: (1, 1,
    N H W, SOFT_SLOTS)), no copy: the block reductions read pixel i as ``[0, 0, i]``."""
    views = {}
    for name in PixelRecords.vars:
        a = getattr(records, name)
        views[name] = a.reshape((1, 1, a.shape[0] * a.shape[1] * a.shape[2], *a.shape[3:]))
    return make(PixelRecords, **views)


def sensor_structs(sensor) -> tuple[VertexSources, View, Surface, Look]:
    """The static structs of a ``CameraSensor`` (its packed arrays, options and
    material arrays), built once at set-up."""
    h, w = sensor.image_size
    sources = make(VertexSources, source=sensor.vertex_source, index=sensor.vertex_index,
                   local=sensor.vertex_local)  # fmt: skip
    view = make(View, proj_vertex=sensor.proj_vertex, proj_image=sensor.proj_image,
                camera_count=sensor.camera_count, height=h, width=w,
                aspect_min=min(1.0, w / h), near=sensor.near_clip)  # fmt: skip
    surface = make(Surface, faces=sensor.faces, face_vertices=sensor.face_vertices,
                   face_shape=sensor.face_shape, shape_index=sensor.shape_index,
                   face_source=sensor.face_source, face_material=sensor.face_material,
                   corners=make(CornerAlbedo, uv=sensor.corner_uv,
                                color=sensor.corner_color))  # fmt: skip
    sky, ground, ambient_intensity = sensor.ambient_terms
    materials = make(MaterialArrays, colors=sensor.shape_colors,
                     light_direction=sensor.light_direction,
                     light_intensity=sensor.light_intensity)  # fmt: skip
    look = make(
        Look, sigma=sensor.silhouette_sigma, ambient=int(sensor.ambient), up=sensor.up, sky=sky,
        ground=ground, ambient_intensity=ambient_intensity, clear_color=sensor.clear_color,
        clear_depth=sensor.clear_depth, smooth=int(sensor.smooth_normals), materials=materials,
        table=sensor.atlas.table,
        lights=sensor.light_rows, light_per_world=int(sensor.light_per_world),
    )  # fmt: skip
    return sources, view, surface, look


def frame_structs(sensor, frame) -> tuple[FrameScene, Channels]:
    """A frame slot's :class:`FrameScene` (with the sensor's static structs) and its
    :class:`Channels`, built once with the slot."""
    sharp = pixel_fragments(frame.workspace.fragments)
    blurred = sharp
    if frame.soft_workspace is not None:
        blurred = pixel_fragments(frame.soft_workspace.fragments)
    clip = getattr(frame.workspace, "clip", None)  # a ClipWorkspace's (near_clip > 0)
    uncut = wp.zeros(1, dtype=wp.int32, device=frame.points.device)
    if clip is not None:
        uncut = clip.identity
    arrays = make(FrameArrays, points=frame.points, ndc=frame.ndc,
                  vertex_normals=frame.vertex_normals, uncut=uncut)  # fmt: skip
    scene = make(FrameScene, sharp=sharp, blurred=blurred, view=sensor.view, surface=sensor.surface,
                 look=sensor.look, frame=arrays)  # fmt: skip
    # the arrays the channel kernel writes (with antialias its colour is the hard one)
    channels = make(Channels, **{name: frame.written(name) for name in frame.CHANNELS})
    return scene, channels


__all__ = [
    "BigFaces",
    "CameraGrads",
    "Channels",
    "Csr",
    "FaceSums",
    "FaceWalk",
    "FrameArrays",
    "FrameScene",
    "Look",
    "MaterialArrays",
    "Outline",
    "PixelRecords",
    "SensorMesh",
    "SourceGroups",
    "Surface",
    "TexelTaps",
    "VertexSources",
    "VertexGrads",
    "View",
    "frame_structs",
    "make",
    "pixel_row",
    "sensor_structs",
]
