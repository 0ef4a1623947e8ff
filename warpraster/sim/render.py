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
``ndc = (-x_c, y_c) / (z tan(fov/2) min(1, W/H))`` with ``z = -z_c`` the view depth.
"""

from __future__ import annotations

import warp as wp

from ..geometry import pixel_centre
from .geometry import VertexSource

# No FMA contraction: CPU and CUDA then round the projection alike.
wp.set_module_options({"fuse_fp": False})

_PARTICLE = wp.constant(int(VertexSource.PARTICLE))
_BODY = wp.constant(int(VertexSource.BODY))
_NO_SHAPE = wp.constant(wp.uint32(0xFFFFFFFF))
#: Smallest view depth divided by in the projection (faces nearer than the
#: rasterizer's epsilon are dropped anyway; this keeps the adjoint finite).
_MIN_DEPTH = wp.constant(1.0e-6)


@wp.kernel
def world_points_kernel(
    # Model:
    source: wp.array(dtype=wp.int32),
    index: wp.array(dtype=wp.int32),
    local: wp.array(dtype=wp.vec3),
    # Data in:
    particle_q: wp.array(dtype=wp.vec3),
    body_q: wp.array(dtype=wp.transform),
    # Data out:
    points_out: wp.array(dtype=wp.vec3),
):
    """World position of each sensor vertex from its source."""
    i = wp.tid()
    s = source[i]
    p = local[i]
    if s == _PARTICLE:
        p = particle_q[index[i]]
    elif s == _BODY:
        p = wp.transform_point(body_q[index[i]], local[i])
    points_out[i] = p


@wp.kernel
def project_kernel(
    # Model:
    proj_vertex: wp.array(dtype=wp.int32),
    proj_image: wp.array(dtype=wp.int32),
    camera_count: int,
    aspect_min: float,
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
    n = proj_image[j]
    w = n // camera_count
    c = n - w * camera_count
    to_camera = wp.transform_inverse(camera_transforms[c, w])
    pc = wp.transform_point(to_camera, points[proj_vertex[j]])
    z = -pc[2]
    s = wp.tan(0.5 * camera_fovs[c]) * aspect_min * wp.max(z, _MIN_DEPTH)
    ndc_out[j] = wp.vec3(-pc[0] / s, pc[1] / s, z)


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
    f = wp.tid()
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    p0 = points[i0]
    nrm = wp.cross(points[i1] - p0, points[i2] - p0)
    wp.atomic_add(normals_out, i0, nrm)
    wp.atomic_add(normals_out, i1, nrm)
    wp.atomic_add(normals_out, i2, nrm)


@wp.kernel
def vertex_normals_gather_kernel(
    # Model:
    corner_start: wp.array(dtype=wp.int32),
    corners: wp.array(dtype=wp.int32),
    faces: wp.array2d(dtype=wp.int32),
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
    for e in range(corner_start[v], corner_start[v + 1]):
        f = corners[e] // 3
        p0 = points[faces[f, 0]]
        acc = acc + wp.cross(points[faces[f, 1]] - p0, points[faces[f, 2]] - p0)
    normals_out[v] = acc


#: Faces per pixel of the blurred pass (the slots of the soft silhouette).
SOFT_SLOTS = 8


@wp.func
def _slot_alpha(
    p2f: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=float),
    n: int,
    y: int,
    x: int,
    k: int,
    sigma: float,
) -> float:
    """Coverage of blurred slot k: 2 sigmoid(-d / sigma) (1 on the face's outline,
    2e-4 at the blur radius), clamped to [0, 1]; 0 for an empty slot."""
    if p2f[n, y, x, k] < 0:
        return 0.0
    return wp.min(2.0 / (1.0 + wp.exp(dists[n, y, x, k] / sigma)), 1.0)


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
    depth_out[n, y, x] = 1.0 / (b[0] / v0[2] + b[1] / v1[2] + b[2] / v2[2])


@wp.func
def _nearer(
    p2f: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=float),
    n: int,
    y: int,
    x: int,
    k: int,
    best_k: int,
):
    """The slot nearer in distance of k and best_k (a discrete choice)."""
    if p2f[n, y, x, k] >= 0 and dists[n, y, x, k] < dists[n, y, x, best_k]:
        return k
    return best_k


def _make_channels_kernel(soft: bool):
    """The channel kernel; ``soft``: with the soft-silhouette branch (a separate
    variant so that the sharp one keeps its adjoint small)."""

    @wp.kernel(module="unique")
    def channels_kernel(
        # Fragments of the sharp pass (K = 1), (N, H, W, 1):
        pix_to_face: wp.array4d(dtype=wp.int32),
        bary: wp.array4d(dtype=wp.vec3),
        zbuf: wp.array4d(dtype=float),
        # Fragments of the blurred pass (K = SOFT_SLOTS; the sharp ones when sigma = 0):
        soft_pix_to_face: wp.array4d(dtype=wp.int32),
        soft_dists: wp.array4d(dtype=float),
        # Model:
        faces: wp.array2d(dtype=wp.int32),
        face_vertices: wp.array2d(dtype=wp.int32),
        face_shape: wp.array(dtype=wp.int32),
        shape_index: wp.array(dtype=wp.uint32),
        camera_count: int,
        ndc_height: int,
        ndc_width: int,
        sigma: float,
        ambient: int,
        up: wp.vec3,
        sky: wp.vec3,
        ground: wp.vec3,
        ambient_intensity: float,
        clear_color: wp.vec3,
        clear_depth: float,
        smooth: int,
        # Data in:
        shape_colors: wp.array(dtype=wp.vec3),
        light_direction: wp.array(dtype=wp.vec3),
        light_intensity: wp.array(dtype=float),
        points: wp.array(dtype=wp.vec3),
        ndc: wp.array(dtype=wp.vec3),
        vertex_normals: wp.array(dtype=wp.vec3),
        camera_transforms: wp.array2d(dtype=wp.transform),
        # Data out, (world, camera, H, W):
        color_out: wp.array4d(dtype=wp.vec3),
        albedo_out: wp.array4d(dtype=wp.vec3),
        normal_out: wp.array4d(dtype=wp.vec3),
        depth_out: wp.array4d(dtype=float),
        forward_depth_out: wp.array4d(dtype=float),
        alpha_out: wp.array4d(dtype=float),
        shape_index_out: wp.array4d(dtype=wp.uint32),
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
        w = n // camera_count
        c = n - w * camera_count
        f = pix_to_face[n, y, x, 0]
        b = wp.vec3(0.0)
        fwd = float(0.0)
        sharp = f >= 0
        if sharp:  # empty pixels (most of a sensor image) skip these 16 bytes
            b = bary[n, y, x, 0]
            fwd = zbuf[n, y, x, 0]
        a = float(1.0)
        if wp.static(soft):  # compiled only into the soft-silhouette variant
            if not sharp and sigma > 0.0:
                sp = soft_pix_to_face
                sd = soft_dists
                a = 1.0 - (
                    (1.0 - _slot_alpha(sp, sd, n, y, x, 0, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 1, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 2, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 3, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 4, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 5, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 6, sigma))
                    * (1.0 - _slot_alpha(sp, sd, n, y, x, 7, sigma))
                )
                # the slot nearest in distance (a discrete choice: no gradient through it)
                k = _nearer(sp, sd, n, y, x, 1, 0)
                k = _nearer(sp, sd, n, y, x, 2, k)
                k = _nearer(sp, sd, n, y, x, 3, k)
                k = _nearer(sp, sd, n, y, x, 4, k)
                k = _nearer(sp, sd, n, y, x, 5, k)
                k = _nearer(sp, sd, n, y, x, 6, k)
                k = _nearer(sp, sd, n, y, x, 7, k)
                f = soft_pix_to_face[n, y, x, k]
                if f >= 0:
                    v0 = ndc[faces[f, 0]]
                    v1 = ndc[faces[f, 1]]
                    v2 = ndc[faces[f, 2]]
                    b = outline_barycentrics(pixel_centre(y, x, ndc_height, ndc_width), v0, v1, v2)
                    fwd = 1.0 / (b[0] / v0[2] + b[1] / v1[2] + b[2] / v2[2])
        if f < 0:
            color_out[w, c, y, x] = clear_color
            albedo_out[w, c, y, x] = wp.vec3(0.0)
            normal_out[w, c, y, x] = wp.vec3(0.0)
            depth_out[w, c, y, x] = clear_depth
            forward_depth_out[w, c, y, x] = clear_depth
            alpha_out[w, c, y, x] = 0.0
            shape_index_out[w, c, y, x] = _NO_SHAPE
            return
        i0 = face_vertices[f, 0]
        i1 = face_vertices[f, 1]
        i2 = face_vertices[f, 2]
        p0 = points[i0]
        p1 = points[i1]
        p2 = points[i2]
        hit = b[0] * p0 + b[1] * p1 + b[2] * p2
        origin = wp.transform_get_translation(camera_transforms[c, w])
        depth = wp.length(hit - origin)
        nrm = wp.normalize(wp.cross(p1 - p0, p2 - p0))
        if smooth != 0:
            nrm = wp.normalize(
                b[0] * wp.normalize(vertex_normals[i0])
                + b[1] * wp.normalize(vertex_normals[i1])
                + b[2] * wp.normalize(vertex_normals[i2])
            )
        s = face_shape[f]
        albedo = shape_colors[s]
        shaded = wp.vec3(0.0)
        if ambient != 0:
            hemi = 0.5 * (wp.dot(nrm, up) + 1.0)
            shaded = wp.cw_mul(albedo, (sky * hemi + ground * (1.0 - hemi)) * ambient_intensity)
        to_light = -wp.normalize(light_direction[0])
        ndotl = wp.max(wp.dot(nrm, to_light), 0.0)
        shaded = shaded + albedo * (ndotl * light_intensity[0])
        color_out[w, c, y, x] = a * shaded + (1.0 - a) * clear_color
        albedo_out[w, c, y, x] = a * albedo
        normal_out[w, c, y, x] = a * nrm
        depth_out[w, c, y, x] = a * depth + (1.0 - a) * clear_depth
        forward_depth_out[w, c, y, x] = a * fwd + (1.0 - a) * clear_depth
        alpha_out[w, c, y, x] = a
        if sharp:
            shape_index_out[w, c, y, x] = shape_index[s]
        else:
            shape_index_out[w, c, y, x] = _NO_SHAPE

    return channels_kernel


#: The channel kernels by soft silhouette on/off.
CHANNEL_KERNELS = {False: _make_channels_kernel(False), True: _make_channels_kernel(True)}
