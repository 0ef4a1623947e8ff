"""The sensor's deterministic gathers: pixels -> faces -> projected vertices -> sensor
vertices -> particles, each sum in an order fixed by the topology or the pixel grid.

Part of the deterministic backward (:mod:`warpraster.sim.adjoint`): every
kernel writes only its own elements; the lists (CSR) are built once at set-up.
An integer counter hands out the big-face list slots (integer atomics are exact;
the sums do not depend on the slot).
"""

from __future__ import annotations

import warp as wp

from ..geometry import pix_to_ndc
from .kernel_args import Csr
from .render import _MIN_DEPTH, SOFT_SLOTS

wp.set_module_options({"fuse_fp": False, "enable_backward": False})


@wp.func
def rotate_adj_x(q: wp.quat, g: wp.vec3) -> wp.vec3:
    """Gradient w.r.t. ``x`` of ``g . quat_rotate(q, x)`` (Warp's formula
    ``x (2w^2 - 1) + 2 q_v (q_v . x) + 2 w q_v x x``)."""
    qv = wp.vec3(q[0], q[1], q[2])
    w = q[3]
    return g * (2.0 * w * w - 1.0) + qv * (2.0 * wp.dot(qv, g)) + wp.cross(g, qv) * (2.0 * w)


@wp.func
def rotate_adj_q(q: wp.quat, x: wp.vec3, g: wp.vec3) -> wp.vec4:
    """Gradient w.r.t. ``q`` (x, y, z, w) of ``g . quat_rotate(q, x)``, the quaternion
    taken as 4 free numbers (as Warp's adjoint and finite differences see it)."""
    qv = wp.vec3(q[0], q[1], q[2])
    w = q[3]
    gv = g * (2.0 * wp.dot(qv, x)) + x * (2.0 * wp.dot(qv, g)) + wp.cross(x, g) * (2.0 * w)
    gw = 4.0 * w * wp.dot(x, g) + 2.0 * wp.dot(g, wp.cross(qv, x))
    return wp.vec4(gv[0], gv[1], gv[2], gw)


@wp.func
def _row(m: wp.mat33, i: int) -> wp.vec3:
    return wp.vec3(m[i, 0], m[i, 1], m[i, 2])


@wp.func
def _pixel_range(lo: float, hi: float, off: float, scale: float, size: int, margin: float):
    """Pixels (first, last) whose centre may lie in NDC [lo, hi] along an axis whose
    NDC decreases with the pixel index (``pixel = size - 1 - (ndc - off) / scale``),
    grown by ``margin`` pixels and clamped to the image."""
    a = float(size - 1) - (hi - off) / scale - margin
    b = float(size - 1) - (lo - off) / scale + margin
    a = wp.clamp(a, -1.0, float(size))
    b = wp.clamp(b, -1.0, float(size))
    return wp.max(int(wp.floor(a)), 0), wp.min(int(wp.ceil(b)), size - 1)


# ----------------------------------------------------------------------------- 2. per face
#: Faces whose pixel box holds more pixels than this are summed by ``BIG_STRIPS``
#: threads (rows strided) instead of one.
BIG_AREA = 1024
#: Threads (row strips) per big face.
BIG_STRIPS = 64
#: Big faces per backward handled by strips; more are walked by one thread each.
BIG_CAPACITY = 512


@wp.func
def _face_box(
    f: int,
    faces: wp.array2d(dtype=wp.int32),
    face_image: wp.array(dtype=wp.int32),
    height: int,
    width: int,
    margin_ndc: float,
    ndc: wp.array(dtype=wp.vec3),
):
    """(ok, x0, x1, y0, y1): the pixels whose centre may lie within ``margin_ndc`` of
    packed face f (its NDC box grown by the margin and by 0.01 pixel against
    rounding in the inverse pixel map), clamped to the image; ok is False for a
    face the rasterizer cannot draw (a vertex at z <= 0, non-finite, no image).
    A pixel shows a face only if its centre lies in the face (sharp pass) or
    within the blur radius of it (``margin_ndc`` = its square root, blurred pass)."""
    v0 = ndc[faces[f, 0]]
    v1 = ndc[faces[f, 1]]
    v2 = ndc[faces[f, 2]]
    xmin = wp.min(wp.min(v0[0], v1[0]), v2[0]) - margin_ndc
    xmax = wp.max(wp.max(v0[0], v1[0]), v2[0]) + margin_ndc
    ymin = wp.min(wp.min(v0[1], v1[1]), v2[1]) - margin_ndc
    ymax = wp.max(wp.max(v0[1], v1[1]), v2[1]) + margin_ndc
    zmin = wp.min(wp.min(v0[2], v1[2]), v2[2])
    ok = face_image[f] >= 0 and zmin > 0.0 and wp.isfinite(xmin + xmax + ymin + ymax)
    # pixel centre along x: pix_to_ndc(width - 1 - xi, width, height)
    offx = pix_to_ndc(0, width, height)
    sx = pix_to_ndc(1, width, height) - offx
    offy = pix_to_ndc(0, height, width)
    sy = pix_to_ndc(1, height, width) - offy
    x0, x1 = _pixel_range(xmin, xmax, offx, sx, width, 0.01)
    y0, y1 = _pixel_range(ymin, ymax, offy, sy, height, 0.01)
    return ok, x0, x1, y0, y1


@wp.func
def _walk(
    f: int,
    n: int,
    x0: int,
    x1: int,
    y_first: int,
    y_last: int,
    y_step: int,
    soft: int,
    smooth: int,
    pix_to_face: wp.array4d(dtype=wp.int32),
    soft_pix_to_face: wp.array4d(dtype=wp.int32),
    rec_face: wp.array3d(dtype=wp.int32),
    rec_ndc: wp.array3d(dtype=wp.mat33),
    rec_world: wp.array3d(dtype=wp.mat33),
    rec_vn: wp.array3d(dtype=wp.mat33),
    rec_soft: wp.array4d(dtype=wp.mat33),
):
    """Sums the records of face f over rows y_first, y_first + y_step, ... <= y_last,
    columns x0..x1, in that (row-major) order."""
    acc_ndc = wp.mat33(0.0)
    acc_world = wp.mat33(0.0)
    acc_vn = wp.mat33(0.0)
    yy = y_first
    while yy <= y_last:
        for xx in range(x0, x1 + 1):
            if rec_face[n, yy, xx] == f:
                acc_ndc = acc_ndc + rec_ndc[n, yy, xx]
                acc_world = acc_world + rec_world[n, yy, xx]
                if smooth != 0:
                    acc_vn = acc_vn + rec_vn[n, yy, xx]
            if soft != 0:
                if pix_to_face[n, yy, xx, 0] < 0:
                    for k in range(SOFT_SLOTS):
                        if soft_pix_to_face[n, yy, xx, k] == f:
                            acc_ndc = acc_ndc + rec_soft[n, yy, xx, k]
        yy += y_step
    return acc_ndc, acc_world, acc_vn


def _make_face_kernels(soft_on: bool, smooth_on: bool):
    """(face_gather, big_face_strips, big_face_sum) with the blurred slots
    (``soft_on``) and the normal records (``smooth_on``) compiled in or out: the
    walk's accumulators stay in registers only where they are used (the
    ``soft`` and ``smooth`` arguments are then ignored)."""

    @wp.kernel(module="unique")
    def face_gather_kernel(
        # Model:
        faces: wp.array2d(dtype=wp.int32),
        face_image: wp.array(dtype=wp.int32),
        height: int,
        width: int,
        margin_ndc: float,
        soft: int,
        smooth: int,
        big_area: int,
        big_capacity: int,
        # Data in:
        ndc: wp.array(dtype=wp.vec3),
        pix_to_face: wp.array4d(dtype=wp.int32),
        soft_pix_to_face: wp.array4d(dtype=wp.int32),
        rec_face: wp.array3d(dtype=wp.int32),
        rec_ndc: wp.array3d(dtype=wp.mat33),
        rec_world: wp.array3d(dtype=wp.mat33),
        rec_vn: wp.array3d(dtype=wp.mat33),
        rec_soft: wp.array4d(dtype=wp.mat33),
        # Data out, (F,) rows = corners; the big-face list (count zeroed before):
        face_ndc_out: wp.array(dtype=wp.mat33),
        face_world_out: wp.array(dtype=wp.mat33),
        face_vn_out: wp.array(dtype=wp.mat33),
        big_count_out: wp.array(dtype=wp.int32),
        big_list_out: wp.array(dtype=wp.int32),
    ):
        """Packed face f: the records of the pixels that show it, summed in row-major
        order over its pixel box. A box of more than ``big_area`` pixels is listed for
        :func:`big_face_strips_kernel` (an integer counter hands out list slots; the
        sums do not depend on the slot) unless the list is full."""
        f = wp.tid()
        acc_ndc = wp.mat33(0.0)
        acc_world = wp.mat33(0.0)
        acc_vn = wp.mat33(0.0)
        ok, x0, x1, y0, y1 = _face_box(f, faces, face_image, height, width, margin_ndc, ndc)
        if ok:
            big = False
            if (x1 - x0 + 1) * (y1 - y0 + 1) > big_area:
                slot = wp.atomic_add(big_count_out, 0, 1)
                if slot < big_capacity:
                    big_list_out[slot] = f
                    big = True
            if not big:
                acc_ndc, acc_world, acc_vn = _walk(
                    f, face_image[f], x0, x1, y0, y1, 1, wp.static(int(soft_on)),
                    wp.static(int(smooth_on)), pix_to_face, soft_pix_to_face, rec_face, rec_ndc,
                    rec_world, rec_vn, rec_soft,
                )  # fmt: skip
        face_ndc_out[f] = acc_ndc
        face_world_out[f] = acc_world
        if wp.static(smooth_on):
            face_vn_out[f] = acc_vn

    @wp.kernel(module="unique")
    def big_face_strips_kernel(
        # Model:
        faces: wp.array2d(dtype=wp.int32),
        face_image: wp.array(dtype=wp.int32),
        height: int,
        width: int,
        margin_ndc: float,
        soft: int,
        smooth: int,
        big_capacity: int,
        # Data in:
        big_count: wp.array(dtype=wp.int32),
        big_list: wp.array(dtype=wp.int32),
        ndc: wp.array(dtype=wp.vec3),
        pix_to_face: wp.array4d(dtype=wp.int32),
        soft_pix_to_face: wp.array4d(dtype=wp.int32),
        rec_face: wp.array3d(dtype=wp.int32),
        rec_ndc: wp.array3d(dtype=wp.mat33),
        rec_world: wp.array3d(dtype=wp.mat33),
        rec_vn: wp.array3d(dtype=wp.mat33),
        rec_soft: wp.array4d(dtype=wp.mat33),
        # Data out, (capacity, strips):
        strip_ndc_out: wp.array2d(dtype=wp.mat33),
        strip_world_out: wp.array2d(dtype=wp.mat33),
        strip_vn_out: wp.array2d(dtype=wp.mat33),
    ):
        """Big face in list slot ``slot``: strip t sums rows y0 + t, y0 + t + strips, ..."""
        slot, t = wp.tid()
        if slot >= wp.min(big_count[0], big_capacity):
            return
        f = big_list[slot]
        ok, x0, x1, y0, y1 = _face_box(f, faces, face_image, height, width, margin_ndc, ndc)
        acc_ndc, acc_world, acc_vn = _walk(
            f, face_image[f], x0, x1, y0 + t, y1, strip_ndc_out.shape[1], wp.static(int(soft_on)),
            wp.static(int(smooth_on)), pix_to_face, soft_pix_to_face, rec_face, rec_ndc, rec_world,
            rec_vn, rec_soft,
        )  # fmt: skip
        strip_ndc_out[slot, t] = acc_ndc
        strip_world_out[slot, t] = acc_world
        if wp.static(smooth_on):
            strip_vn_out[slot, t] = acc_vn

    @wp.kernel(module="unique")
    def big_face_sum_kernel(
        big_capacity: int,
        smooth: int,
        big_count: wp.array(dtype=wp.int32),
        big_list: wp.array(dtype=wp.int32),
        strip_ndc: wp.array2d(dtype=wp.mat33),
        strip_world: wp.array2d(dtype=wp.mat33),
        strip_vn: wp.array2d(dtype=wp.mat33),
        # Data out, (F,):
        face_ndc_out: wp.array(dtype=wp.mat33),
        face_world_out: wp.array(dtype=wp.mat33),
        face_vn_out: wp.array(dtype=wp.mat33),
    ):
        """Big face in list slot ``slot``: its strips' sums, in strip order."""
        slot = wp.tid()
        if slot >= wp.min(big_count[0], big_capacity):
            return
        f = big_list[slot]
        acc_ndc = wp.mat33(0.0)
        acc_world = wp.mat33(0.0)
        acc_vn = wp.mat33(0.0)
        for t in range(strip_ndc.shape[1]):
            acc_ndc = acc_ndc + strip_ndc[slot, t]
            acc_world = acc_world + strip_world[slot, t]
            if wp.static(smooth_on):
                acc_vn = acc_vn + strip_vn[slot, t]
        face_ndc_out[f] = acc_ndc
        face_world_out[f] = acc_world
        if wp.static(smooth_on):
            face_vn_out[f] = acc_vn

    return face_gather_kernel, big_face_strips_kernel, big_face_sum_kernel


#: (face_gather, big_face_strips, big_face_sum) by (soft silhouette, smooth normals).
FACE_KERNELS = {
    (soft, smooth): _make_face_kernels(soft, smooth)
    for soft in (False, True)
    for smooth in (False, True)
}


# ----------------------------------------------------------------------------- 3. per projection
@wp.kernel
def proj_gather_kernel(
    # Model:
    corner_start: wp.array(dtype=wp.int32),
    corners: wp.array(dtype=wp.int32),
    proj_vertex: wp.array(dtype=wp.int32),
    proj_image: wp.array(dtype=wp.int32),
    camera_count: int,
    aspect_min: float,
    smooth: int,
    camera_grad: int,
    # Data in:
    face_ndc: wp.array(dtype=wp.mat33),
    face_world: wp.array(dtype=wp.mat33),
    face_vn: wp.array(dtype=wp.mat33),
    points: wp.array(dtype=wp.vec3),
    camera_transforms: wp.array2d(dtype=wp.transform),
    camera_fovs: wp.array(dtype=float),
    # Data out, (P,):
    point_grad_out: wp.array(dtype=wp.vec3),
    vn_grad_out: wp.array(dtype=wp.vec3),
    cam_t_out: wp.array(dtype=wp.vec3),
    cam_q_out: wp.array(dtype=wp.vec4),
    fov_out: wp.array(dtype=float),
):
    """Projected vertex j: its face corners' gradients summed in CSR order, then the
    adjoint of ``render.project_kernel`` (``ndc = (-x_c, y_c) / s, z``,
    ``s = tan(fov / 2) aspect max(z, MIN_DEPTH)``)."""
    j = wp.tid()
    g_ndc = wp.vec3(0.0)
    g_w = wp.vec3(0.0)
    g_vn = wp.vec3(0.0)
    for e in range(corner_start[j], corner_start[j + 1]):
        corner = corners[e]
        f = corner // 3
        r = corner - 3 * f
        g_ndc = g_ndc + _row(face_ndc[f], r)
        g_w = g_w + _row(face_world[f], r)
        if smooth != 0:
            g_vn = g_vn + _row(face_vn[f], r)
    n = proj_image[j]
    w = n // camera_count
    c = n - w * camera_count
    tf = camera_transforms[c, w]
    p = points[proj_vertex[j]]
    pc = wp.transform_point(wp.transform_inverse(tf), p)
    z = -pc[2]
    half = 0.5 * camera_fovs[c]
    th = wp.tan(half)
    s = th * aspect_min * wp.max(z, _MIN_DEPTH)
    g_s = (g_ndc[0] * pc[0] - g_ndc[1] * pc[1]) / (s * s)
    g_z = g_ndc[2]
    if z > _MIN_DEPTH:
        g_z = g_z + g_s * th * aspect_min
    g_pc = wp.vec3(-g_ndc[0] / s, g_ndc[1] / s, -g_z)
    qi = wp.quat_inverse(wp.transform_get_rotation(tf))
    g_p = rotate_adj_x(qi, g_pc)
    point_grad_out[j] = g_p + g_w
    vn_grad_out[j] = g_vn
    if camera_grad != 0:
        # pc = rot(q^-1, p) - rot(q^-1, t), q^-1 = (-q_v, w)
        g_qi = rotate_adj_q(qi, p - wp.transform_get_translation(tf), g_pc)
        cam_t_out[j] = -g_p
        cam_q_out[j] = wp.vec4(-g_qi[0], -g_qi[1], -g_qi[2], g_qi[3])
        fov_out[j] = g_s * aspect_min * wp.max(z, _MIN_DEPTH) * (1.0 + th * th) * 0.5


# ----------------------------------------------------------------------------- 4. per vertex
@wp.kernel
def vertex_gather_kernel(
    # Model:
    proj_start: wp.array(dtype=wp.int32),
    projs: wp.array(dtype=wp.int32),
    smooth: int,
    # Data in:
    point_grad: wp.array(dtype=wp.vec3),
    vn_grad: wp.array(dtype=wp.vec3),
    # Data out, (V,):
    points_grad_out: wp.array(dtype=wp.vec3),
    vn_grad_out: wp.array(dtype=wp.vec3),
):
    """Sensor vertex v: the gradients of its projections, in CSR order."""
    v = wp.tid()
    g = wp.vec3(0.0)
    gn = wp.vec3(0.0)
    for e in range(proj_start[v], proj_start[v + 1]):
        j = projs[e]
        g = g + point_grad[j]
        if smooth != 0:
            gn = gn + vn_grad[j]
    points_grad_out[v] = g
    vn_grad_out[v] = gn


@wp.kernel
def normal_face_adjoint_kernel(
    # Model:
    faces: wp.array2d(dtype=wp.int32),
    # Data in:
    points: wp.array(dtype=wp.vec3),
    vn_grad: wp.array(dtype=wp.vec3),
    # Data out, (F_sensor,) rows = corners:
    face_grad_out: wp.array(dtype=wp.mat33),
):
    """Adjoint of one face's term ``cross(p1 - p0, p2 - p0)`` of its three vertex normals."""
    f = wp.tid()
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    p0 = points[i0]
    e1 = points[i1] - p0
    e2 = points[i2] - p0
    g = vn_grad[i0] + vn_grad[i1] + vn_grad[i2]
    g1 = wp.cross(e2, g)
    g2 = wp.cross(g, e1)
    face_grad_out[f] = wp.matrix_from_rows(-g1 - g2, g1, g2)


@wp.kernel
def normal_vertex_gather_kernel(
    # Model:
    vertex_corners: Csr,
    # Data in:
    face_grad: wp.array(dtype=wp.mat33),
    # Data out (added to), (V,):
    points_grad_out: wp.array(dtype=wp.vec3),
):
    """Sensor vertex v: adds its corners' normal gradients, in CSR order."""
    v = wp.tid()
    g = points_grad_out[v]
    for e in range(vertex_corners.start[v], vertex_corners.start[v + 1]):
        corner = vertex_corners.entries[e]
        f = corner // 3
        g = g + _row(face_grad[f], corner - 3 * f)
    points_grad_out[v] = g


@wp.kernel
def particle_gather_kernel(
    # Model:
    start: wp.array(dtype=wp.int32),
    verts: wp.array(dtype=wp.int32),
    particle: wp.array(dtype=wp.int32),
    # Data in:
    points_grad: wp.array(dtype=wp.vec3),
    # Data out (added to):
    particle_grad_out: wp.array(dtype=wp.vec3),
):
    """Used particle u: adds its sensor vertices' gradients (CSR order)."""
    u = wp.tid()
    g = wp.vec3(0.0)
    for e in range(start[u], start[u + 1]):
        g = g + points_grad[verts[e]]
    p = particle[u]
    particle_grad_out[p] = particle_grad_out[p] + g


__all__ = [
    "BIG_AREA",
    "BIG_CAPACITY",
    "BIG_STRIPS",
    "FACE_KERNELS",
    "normal_face_adjoint_kernel",
    "normal_vertex_gather_kernel",
    "particle_gather_kernel",
    "proj_gather_kernel",
    "rotate_adj_q",
    "rotate_adj_x",
    "vertex_gather_kernel",
]
