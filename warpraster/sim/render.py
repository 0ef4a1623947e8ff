"""The sensor's forward kernels: sources -> world points -> NDC, fragments -> channels.

The three main kernels are loop-free, so Warp's generated adjoints are exact (see
the notes on loops in the project's Warp notes): with
``CameraSensor(deterministic=False)`` they are recorded on an enclosing
``wp.Tape``. By default they run unrecorded and the hand-written backward of
:mod:`warpraster.sim.adjoint` differentiates them (no float atomics); the vertex
normals are then summed per vertex (``vertex_normals_gather_kernel``) rather than
scattered with atomics, and ``outline_kernel`` serves that backward as the
generated adjoint of a soft pixel's outline point.

Camera convention (Newton's): a camera transform maps camera to world; the
camera looks down its local -Z axis with +Y up and +X right; the field of view
is vertical, in radians. Pixel (row y, column x) looks along
``((x + 0.5) / W - 0.5) * 2 tan(fov/2) * W/H`` to the right and
``(0.5 - (y + 0.5) / H) * 2 tan(fov/2)`` up, as Newton's pinhole rays.
warpraster's NDC has +X left and the shorter image side spanning [-1, 1], so
``ndc = (-x_c, y_c) / (z tan(fov/2) min(1, W/H))`` with ``z = -z_c`` the view depth
(negative behind the camera: ``render.signed_depth``).
"""

from __future__ import annotations

import functools

import warp as wp

from ..geometry import edge_function, finite_cross, finite_vec3, pixel_centre
from ..shading.lighting import lambert_light_sum
from ..shading.material_table import face_albedo
from ..shading.pixel_args import PixelFragments
from .geometry import VertexSource
from .kernel_args import (
    Channels,
    FrameScene,
    Look,
    SensorMesh,
    Surface,
    VertexSources,
    View,
)
from .options import FORWARD_OPTIONS

wp.set_module_options(FORWARD_OPTIONS)

_PARTICLE = wp.constant(int(VertexSource.PARTICLE))
_BODY = wp.constant(int(VertexSource.BODY))
_NO_SHAPE = wp.constant(wp.uint32(0xFFFFFFFF))
#: Smallest view depth divided by in the projection (faces nearer than the
#: rasterizer's epsilon are dropped anyway; this keeps the adjoint finite).
_MIN_DEPTH = wp.constant(1.0e-6)


@wp.kernel
def world_points_kernel(
    # Model:
    sources: VertexSources,
    # Data in:
    particle_q: wp.array(dtype=wp.vec3),
    body_q: wp.array(dtype=wp.transform),
    # Data out:
    points_out: wp.array(dtype=wp.vec3),
):
    """World position of each sensor vertex from its source."""
    i = wp.tid()
    s = sources.source[i]
    p = sources.local[i]
    if s == _PARTICLE:
        p = particle_q[sources.index[i]]
    elif s == _BODY:
        p = wp.transform_point(body_q[sources.index[i]], sources.local[i])
    points_out[i] = p


@wp.func
def signed_depth(z: float) -> float:
    """The view depth divided by in the projection: ``z`` kept at least ``MIN_DEPTH``
    from 0, its sign kept. A vertex behind the camera then projects as PyTorch3D's
    cameras project it (x / z with z < 0), which near-plane clipping needs to place
    where an edge crosses the plane (x z is the view-space x)."""
    if z >= 0.0:
        return wp.max(z, _MIN_DEPTH)
    return wp.min(z, -_MIN_DEPTH)


@wp.func
def light_row(look: Look, n: int, w: int) -> int:
    """The light list's row of image n of world w: w for lights per world, else n."""
    if look.light_per_world != 0:
        return w
    return n


@wp.func
def image_camera(view: View, n: int):
    """(world, camera) of packed image n = world * C + camera."""
    w = n // view.camera_count
    return w, n - w * view.camera_count


@wp.kernel
def project_kernel(
    # Model:
    view: View,
    # Data in:
    points: wp.array(dtype=wp.vec3),
    camera_transforms: wp.array2d(dtype=wp.transform),
    camera_fovs: wp.array(dtype=float),
    # Data out:
    ndc_out: wp.array(dtype=wp.vec3),
):
    """NDC x, y and view depth z of each (image, vertex) pair; image n = world * C + camera.

    ``camera_transforms`` is (C, W), camera to world (Newton's layout).
    """
    j = wp.tid()
    p = points[view.proj_vertex[j]]
    if not finite_vec3(p):
        # never drawn; a constant, so no gradient reaches the camera through it
        ndc_out[j] = wp.vec3(wp.nan, wp.nan, wp.nan)
        return
    w, c = image_camera(view, view.proj_image[j])
    to_camera = wp.transform_inverse(camera_transforms[c, w])
    pc = wp.transform_point(to_camera, p)
    z = -pc[2]
    s = wp.tan(0.5 * camera_fovs[c]) * view.aspect_min * signed_depth(z)
    ndc_out[j] = wp.vec3(-pc[0] / s, pc[1] / s, z)


@wp.func
def face_corners(faces: wp.array2d(dtype=wp.int32), f: int) -> wp.vec3i:
    """The three vertex indices of face f."""
    return wp.vec3i(faces[f, 0], faces[f, 1], faces[f, 2])


@wp.func
def corner_face(corner: int):
    """(face, corner within it) of corner index ``3 face + c`` (the CSR lists of face
    corners)."""
    f = corner // 3
    return f, corner - 3 * f


@wp.func
def area_normal(points: wp.array(dtype=wp.vec3), i: wp.vec3i) -> wp.vec3:
    """:func:`~warpraster.geometry.finite_cross` of the face with corners i: its
    normal, twice its area long (0 for a face with a non-finite corner)."""
    return finite_cross(points[i[0]], points[i[1]], points[i[2]])


@wp.kernel
def vertex_normals_kernel(
    # Model:
    faces: wp.array2d(dtype=wp.int32),
    # Data in:
    points: wp.array(dtype=wp.vec3),
    # Data out (zeroed before):
    normals_out: wp.array(dtype=wp.vec3),
):
    """Area-weighted sum of the face normals around each sensor vertex."""
    i = face_corners(faces, wp.tid())
    nrm = area_normal(points, i)
    wp.atomic_add(normals_out, i[0], nrm)
    wp.atomic_add(normals_out, i[1], nrm)
    wp.atomic_add(normals_out, i[2], nrm)


@wp.kernel
def vertex_normals_gather_kernel(
    # Model:
    mesh: SensorMesh,
    # Data in:
    points: wp.array(dtype=wp.vec3),
    # Data out:
    normals_out: wp.array(dtype=wp.vec3),
):
    """Area-weighted sum of the face normals around each sensor vertex, summed over
    its face corners in CSR order (``corner = 3 face + c``): deterministic, no
    atomics. Not differentiated by Warp (a loop): the sensor's deterministic
    backward holds its adjoint."""
    v = wp.tid()
    acc = wp.vec3(0.0)
    corners = mesh.corners
    for e in range(corners.start[v], corners.start[v + 1]):
        f, _c = corner_face(corners.entries[e])
        acc = acc + area_normal(points, face_corners(mesh.faces, f))
    normals_out[v] = acc


#: Faces per pixel of the blurred pass (the slots of the soft silhouette).
SOFT_SLOTS = 8


@wp.func
def _slot_alpha(blurred: PixelFragments, n: int, y: int, x: int, k: int, sigma: float) -> float:
    """Coverage of blurred slot k: 2 sigmoid(-d / sigma) (1 on the face's outline,
    2e-4 at the blur radius), clamped to [0, 1]; 0 for an empty slot."""
    if blurred.pix_to_face[n, y, x, k] < 0:
        return 0.0
    return wp.min(2.0 / (1.0 + wp.exp(blurred.dists[n, y, x, k] / sigma)), 1.0)


@wp.func
def _edge_point(p: wp.vec2, a: wp.vec3, b: wp.vec3):
    """(parameter t in [0, 1], squared distance) of the point of segment ab (xy)
    nearest to p."""
    ab = wp.vec2(b[0] - a[0], b[1] - a[1])
    ap = wp.vec2(p[0] - a[0], p[1] - a[1])
    t = wp.clamp(wp.dot(ap, ab) / wp.max(wp.dot(ab, ab), 1.0e-20), 0.0, 1.0)
    d = ap - t * ab
    return t, wp.dot(d, d)


@wp.func
def outline_barycentrics(p: wp.vec2, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3) -> wp.vec3:
    """Perspective-correct barycentrics of the point of the triangle's outline nearest
    (in NDC xy) to the pixel centre ``p`` outside it; ``v*`` are NDC x, y and view
    depth z. Two faces sharing the nearest edge give the same point, so surface
    values are continuous when the nearest slot changes between them."""
    t0, d0 = _edge_point(p, v1, v2)
    t1, d1 = _edge_point(p, v2, v0)
    t2, d2 = _edge_point(p, v0, v1)
    b = wp.vec3(0.0, 1.0 - t0, t0)
    if d1 < d0 and d1 <= d2:
        b = wp.vec3(t1, 0.0, 1.0 - t1)
    elif d2 < d0 and d2 < d1:
        b = wp.vec3(1.0 - t2, t2, 0.0)
    w = wp.vec3(b[0] / v0[2], b[1] / v1[2], b[2] / v2[2])
    return w / (w[0] + w[1] + w[2])


@wp.kernel
def outline_kernel(
    # Model:
    on: wp.array3d(dtype=wp.int32),
    ndc_height: int,
    ndc_width: int,
    # Data in, (N, H, W): rows = the NDC vertices of the pixel's nearest blurred face
    verts: wp.array3d(dtype=wp.mat33),
    # Data out, (N, H, W):
    bary_out: wp.array3d(dtype=wp.vec3),
    depth_out: wp.array3d(dtype=float),
):
    """The outline point of a soft pixel (``on`` != 0), as the channel kernel computes
    it, from per-pixel copies of its face's vertices: launched only as Warp's
    generated adjoint by the sensor's deterministic backward (each pixel owns its
    input element, so the adjoint adds without contention)."""
    n, y, x = wp.tid()
    if on[n, y, x] == 0:
        return
    m = verts[n, y, x]
    v0 = wp.vec3(m[0, 0], m[0, 1], m[0, 2])
    v1 = wp.vec3(m[1, 0], m[1, 1], m[1, 2])
    v2 = wp.vec3(m[2, 0], m[2, 1], m[2, 2])
    b = outline_barycentrics(pixel_centre(y, x, ndc_height, ndc_width), v0, v1, v2)
    bary_out[n, y, x] = b
    depth_out[n, y, x] = outline_depth(b, v0, v1, v2)


@wp.func
def cut_face_point(p: wp.vec2, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3):
    """(perspective-correct barycentrics, view depth) of the point of a face at pixel
    centre ``p``; ``v*`` are NDC x, y and view depth z, which may be negative for a
    vertex behind the camera (the face is then drawn clipped at the near plane).
    ``b_i = (s_i / z_i) / sum_j s_j / z_j`` with ``s`` the screen barycentrics: the
    3D barycentrics whatever the signs, as the projection of a vertex behind the
    camera divides by its negative depth too; depth ``sum_i b_i z_i``."""
    a = wp.vec2(v0[0], v0[1])
    b = wp.vec2(v1[0], v1[1])
    c = wp.vec2(v2[0], v2[1])
    area = edge_function(c, a, b)
    q = wp.vec3(
        edge_function(p, b, c) / (area * v0[2]),
        edge_function(p, c, a) / (area * v1[2]),
        edge_function(p, a, b) / (area * v2[2]),
    )
    bary = q / (q[0] + q[1] + q[2])
    return bary, bary[0] * v0[2] + bary[1] * v1[2] + bary[2] * v2[2]


@wp.func
def _edge_grads(p: wp.vec2, a: wp.vec2, b: wp.vec2):
    """Gradients of ``edge_function(p, a, b)`` with respect to a and b (p fixed)."""
    return wp.vec2(p[1] - b[1], b[0] - p[0]), wp.vec2(a[1] - p[1], p[0] - a[0])


@wp.func
def cut_face_point_adjoint(
    p: wp.vec2, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3, g_bary: wp.vec3, g_depth: float
) -> wp.mat33:
    """Gradient of ``g_bary . bary + g_depth * depth`` of :func:`cut_face_point` with
    respect to the vertices (rows: d/d(x, y, z) of v0, v1, v2)."""
    a = wp.vec2(v0[0], v0[1])
    b = wp.vec2(v1[0], v1[1])
    c = wp.vec2(v2[0], v2[1])
    z = wp.vec3(v0[2], v1[2], v2[2])
    area = edge_function(c, a, b)
    e = wp.vec3(edge_function(p, b, c), edge_function(p, c, a), edge_function(p, a, b))
    q = wp.vec3(e[0] / (area * z[0]), e[1] / (area * z[1]), e[2] / (area * z[2]))
    s = q[0] + q[1] + q[2]
    bary = q / s
    # depth = bary . z
    gb = g_bary + g_depth * z
    g_z = g_depth * bary
    # bary = q / s
    gq = (gb - wp.vec3(wp.dot(gb, bary))) / s
    # q_i = e_i / (area z_i)
    g_e = wp.vec3(gq[0] / (area * z[0]), gq[1] / (area * z[1]), gq[2] / (area * z[2]))
    g_area = -wp.dot(gq, q) / area
    g_z = g_z - wp.cw_mul(gq, wp.cw_div(q, z))
    # e0 = E(p, b, c), e1 = E(p, c, a), e2 = E(p, a, b), area = E(c, a, b)
    d0b, d0c = _edge_grads(p, b, c)
    d1c, d1a = _edge_grads(p, c, a)
    d2a, d2b = _edge_grads(p, a, b)
    dca, dcb = _edge_grads(c, a, b)
    dcc = wp.vec2(b[1] - a[1], a[0] - b[0])  # d area / d c
    ga = g_e[1] * d1a + g_e[2] * d2a + g_area * dca
    gbv = g_e[0] * d0b + g_e[2] * d2b + g_area * dcb
    gc = g_e[0] * d0c + g_e[1] * d1c + g_area * dcc
    return wp.matrix_from_rows(
        wp.vec3(ga[0], ga[1], g_z[0]),
        wp.vec3(gbv[0], gbv[1], g_z[1]),
        wp.vec3(gc[0], gc[1], g_z[2]),
    )


@wp.func
def _nearer(blurred: PixelFragments, n: int, y: int, x: int, k: int, best_k: int) -> int:
    """The blurred slot nearer in distance of k and best_k (a discrete choice)."""
    d = blurred.dists
    if blurred.pix_to_face[n, y, x, k] >= 0 and d[n, y, x, k] < d[n, y, x, best_k]:
        return k
    return best_k


@wp.func
def nearest_slot(blurred: PixelFragments, n: int, y: int, x: int) -> int:
    """The blurred slot nearest in distance (a discrete choice: no gradient through
    it), the slots written out one by one."""
    k = _nearer(blurred, n, y, x, 1, 0)
    k = _nearer(blurred, n, y, x, 2, k)
    k = _nearer(blurred, n, y, x, 3, k)
    k = _nearer(blurred, n, y, x, 4, k)
    k = _nearer(blurred, n, y, x, 5, k)
    k = _nearer(blurred, n, y, x, 6, k)
    return _nearer(blurred, n, y, x, 7, k)


@wp.func
def outline_depth(b: wp.vec3, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3) -> float:
    """View depth of the point with perspective-correct barycentrics b."""
    return 1.0 / (b[0] / v0[2] + b[1] / v1[2] + b[2] / v2[2])


@wp.func
def outline_point(
    view: View, faces: wp.array2d(dtype=wp.int32), ndc: wp.array(dtype=wp.vec3), f: int, y: int,
    x: int,
):  # fmt: skip
    """(v0, v1, v2, barycentrics, depth): face f's NDC vertices and the point of its
    outline nearest to pixel (y, x) (:func:`outline_barycentrics`)."""
    v0 = ndc[faces[f, 0]]
    v1 = ndc[faces[f, 1]]
    v2 = ndc[faces[f, 2]]
    b = outline_barycentrics(pixel_centre(y, x, view.height, view.width), v0, v1, v2)
    return v0, v1, v2, b, outline_depth(b, v0, v1, v2)


@wp.func
def ambient_light(look: Look, nrm: wp.vec3) -> wp.vec3:
    """Newton's hemispheric ambient light on a surface of normal ``nrm``: sky and
    ground colours blended by the normal's up component, times the intensity."""
    hemi = 0.5 * (wp.dot(nrm, look.up) + 1.0)
    return (look.sky * hemi + look.ground * (1.0 - hemi)) * look.ambient_intensity


@wp.func
def scene_parts(scene: FrameScene):
    """(sharp fragments, blurred fragments, view, surface, look, frame) of a frame scene."""
    return scene.sharp, scene.blurred, scene.view, scene.surface, scene.look, scene.frame


@wp.func
def pixel_fragment(view: View, sharp: PixelFragments, n: int, y: int, x: int):
    """(world, camera) of image n, and (face, barycentrics, depth) of the sharp pass at
    pixel (y, x); (-1, 0, 0) where it is empty (most of a sensor image: those skip
    reading the 16 bytes)."""
    w, c = image_camera(view, n)
    f = sharp.pix_to_face[n, y, x, 0]
    b = wp.vec3(0.0)
    fwd = float(0.0)
    if f >= 0:
        b = sharp.bary_coords[n, y, x, 0]
        fwd = sharp.zbuf[n, y, x, 0]
    return w, c, f, b, fwd


@wp.func
def sharp_fragment(scene: FrameScene, n: int, y: int, x: int):
    """:func:`pixel_fragment` of the sharp pass, with the barycentrics and depth of a
    face the near plane cuts taken from the face's own vertices
    (:func:`cut_face_point`): the clipped raster decides which face a pixel shows,
    and its barycentrics, interpolated over crossings at the near plane's tiny
    depth, lose digits there (7.7e-4 relative in depth, measured at 1e-3)."""
    view = scene.view
    w, c, f, b, fwd = pixel_fragment(view, scene.sharp, n, y, x)
    # no face is cut when the clip pass kept the input's list (``frame.uncut``):
    # then no face's vertices are read for the test
    if f >= 0 and view.near > 0.0 and scene.frame.uncut[0] == 0:
        faces = scene.surface.faces
        ndc = scene.frame.ndc
        v0 = ndc[faces[f, 0]]
        v1 = ndc[faces[f, 1]]
        v2 = ndc[faces[f, 2]]
        if wp.min(wp.min(v0[2], v1[2]), v2[2]) < view.near:
            b, fwd = cut_face_point(pixel_centre(y, x, view.height, view.width), v0, v1, v2)
    return w, c, f, b, fwd


@wp.func
def face_points(surface: Surface, points: wp.array(dtype=wp.vec3), f: int):
    """(sensor vertex indices, p0, p1, p2): packed face f's corners and world points."""
    i = face_corners(surface.face_vertices, f)
    return i, points[i[0]], points[i[1]], points[i[2]]


@wp.func
def surface_albedo(surface: Surface, look: Look, f: int, b: wp.vec3) -> wp.vec3:
    """Albedo of packed face f at barycentrics b (its material, texture or corner
    colours: :func:`~warpraster.shading.material_table.face_albedo`)."""
    fs = surface.face_source[f]
    m = surface.face_material[f]
    a = face_albedo(look.table, m, surface.corners, fs, b)
    return wp.vec3(a[0], a[1], a[2])


def _make_channels_kernel(soft: bool, varying: bool, lit: bool, written: int):
    """The channel kernel; ``soft``: with the soft-silhouette branch (a separate
    variant so that the sharp one keeps its adjoint small); ``varying``: albedos
    that vary over a face (textures, corner colours) read, else each face's
    material colour alone; ``lit``: the core's lights (``look.lights``) added;
    ``written``: the channels it writes (bit i: ``SensorFrame.CHANNELS[i]``; the
    others' stores are not compiled in)."""

    @wp.kernel(module="unique", module_options=FORWARD_OPTIONS)
    def channels_kernel(
        # Data in: fragments, model, materials and geometry of the frame slot
        scene: FrameScene,
        camera_transforms: wp.array2d(dtype=wp.transform),
        # Data out, (world, camera, H, W):
        channels_out: Channels,
    ):
        """Every output channel of one pixel from its nearest face (K = 1).

        Shading is Newton's: hemispheric ambient (``sky`` / ``ground`` blended by the
        normal's ``up`` component, times ``ambient_intensity``) plus one directional
        light, Lambertian with the face normal (``smooth``: the interpolated,
        normalised area-weighted vertex normals, continuous across edges), no shadows.

        Coverage: a pixel inside a face (sharp pass) has alpha 1. With ``sigma > 0``,
        a pixel outside every face takes the ``SOFT_SLOTS`` nearest faces (in depth)
        of the blurred pass within the blur radius, each with coverage
        ``a_k = 2 sigmoid(-d_k / sigma)`` (``d_k``: squared NDC distance to the face;
        1 on its outline, 2e-4 at the blur radius), and ``alpha = 1 - prod(1 - a_k)``
        (PyTorch3D's silhouette blend): continuous as an outline crosses a pixel
        centre and as a face enters or leaves the blur radius, so a soft silhouette
        outside the outlines that gives gradients there. The surface values (colour,
        depth, normal) are those of the slot nearest in distance at the point of its
        outline nearest to the pixel (:func:`outline_barycentrics`: faces sharing
        that edge agree), composited over the clear values with alpha. (One blurred
        K = 1 pass would let a face nearer in depth shadow the face that covers an
        interior pixel, or the face nearest an outside pixel.) The slots are written
        out one by one, not looped over: a loop over slots gets wrong gradients from
        Warp's generated adjoint.
        """
        n, y, x = wp.tid()
        sharp_frags, blurred, view, surface, look, frame = scene_parts(scene)
        w, c, f, b, fwd = sharp_fragment(scene, n, y, x)
        sharp = f >= 0
        a = float(1.0)
        sigma = look.sigma
        if wp.static(soft):  # compiled only into the soft-silhouette variant
            if not sharp and sigma > 0.0:
                a = 1.0 - (
                    (1.0 - _slot_alpha(blurred, n, y, x, 0, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 1, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 2, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 3, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 4, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 5, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 6, sigma))
                    * (1.0 - _slot_alpha(blurred, n, y, x, 7, sigma))
                )
                # the slot nearest in distance (a discrete choice: no gradient through it)
                f = blurred.pix_to_face[n, y, x, nearest_slot(blurred, n, y, x)]
                if f >= 0:
                    v0, v1, v2, b, fwd = outline_point(view, surface.faces, frame.ndc, f, y, x)
        out = channels_out
        if f < 0:
            if wp.static(written & 1):
                out.color[w, c, y, x] = look.clear_color
            if wp.static(written & 2):
                out.albedo[w, c, y, x] = wp.vec3(0.0)
            if wp.static(written & 4):
                out.normal[w, c, y, x] = wp.vec3(0.0)
            if wp.static(written & 8):
                out.depth[w, c, y, x] = look.clear_depth
            if wp.static(written & 16):
                out.forward_depth[w, c, y, x] = look.clear_depth
            if wp.static(written & 32):
                out.alpha[w, c, y, x] = 0.0
            if wp.static(written & 64):
                out.shape_index[w, c, y, x] = _NO_SHAPE
            return
        i, p0, p1, p2 = face_points(surface, frame.points, f)
        hit = b[0] * p0 + b[1] * p1 + b[2] * p2
        origin = wp.transform_get_translation(camera_transforms[c, w])
        depth = wp.length(hit - origin)
        nrm = wp.normalize(wp.cross(p1 - p0, p2 - p0))
        if look.smooth != 0:
            vn = frame.vertex_normals
            nrm = wp.normalize(
                b[0] * wp.normalize(vn[i[0]])
                + b[1] * wp.normalize(vn[i[1]])
                + b[2] * wp.normalize(vn[i[2]])
            )
        s = surface.face_shape[f]
        mat = look.materials
        albedo = look.table.diffuse[surface.face_material[f]]
        if wp.static(varying):  # a texture or corner colours: compiled in where used
            albedo = surface_albedo(surface, look, f, b)
        shaded = wp.vec3(0.0)
        if look.ambient != 0:
            shaded = wp.cw_mul(albedo, ambient_light(look, nrm))
        to_light = -wp.normalize(mat.light_direction[0])
        ndotl = wp.max(wp.dot(nrm, to_light), 0.0)
        shaded = shaded + albedo * (ndotl * mat.light_intensity[0])
        if wp.static(lit):  # the core's lights: compiled in where given
            lights = lambert_light_sum(look.lights, light_row(look, n, w), hit, nrm)
            shaded = shaded + wp.cw_mul(albedo, lights)
        clear_depth = look.clear_depth
        if wp.static(written & 1):
            out.color[w, c, y, x] = a * shaded + (1.0 - a) * look.clear_color
        if wp.static(written & 2):
            out.albedo[w, c, y, x] = a * albedo
        if wp.static(written & 4):
            out.normal[w, c, y, x] = a * nrm
        if wp.static(written & 8):
            out.depth[w, c, y, x] = a * depth + (1.0 - a) * clear_depth
        if wp.static(written & 16):
            out.forward_depth[w, c, y, x] = a * fwd + (1.0 - a) * clear_depth
        if wp.static(written & 32):
            out.alpha[w, c, y, x] = a
        if sharp:
            if wp.static(written & 64):
                out.shape_index[w, c, y, x] = surface.shape_index[s]
        else:
            if wp.static(written & 64):
                out.shape_index[w, c, y, x] = _NO_SHAPE

    return channels_kernel


#: Every channel written (the bits of :func:`channels_kernel`'s ``written``).
ALL_CHANNELS = 0x7F


@functools.cache
def channels_kernel(soft: bool, varying: bool, lit: bool, written: int = ALL_CHANNELS):
    """The channel kernel for (soft silhouette, varying albedo, core lights, the
    channels written), made on first use."""
    return _make_channels_kernel(bool(soft), bool(varying), bool(lit), int(written))
