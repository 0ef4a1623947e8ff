"""The sensor's deterministic gathers: pixels -> faces -> projected vertices -> sensor
vertices -> particles, each sum in an order fixed by the topology or the pixel grid.

Part of the deterministic backward (:mod:`warpraster.sim.adjoint`): every
kernel writes only its own elements; the lists (CSR) are built once at set-up.
An integer counter hands out the big-face list slots (integer atomics are exact;
the sums do not depend on the slot).
"""

from __future__ import annotations

import warp as wp

from ..backward.slot_pass import row
from ..geometry import finite_face, finite_vec3, pix_to_ndc
from .kernel_args import (
    BigFaces,
    CameraGrads,
    Csr,
    FaceSums,
    FaceWalk,
    FrameScene,
    PixelRecords,
    SensorMesh,
    SourceGroups,
    VertexGrads,
    View,
)
from .options import NO_ADJOINT_OPTIONS
from .render import (
    _MIN_DEPTH,
    SOFT_SLOTS,
    corner_face,
    face_corners,
    image_camera,
    signed_depth,
)

wp.set_module_options(NO_ADJOINT_OPTIONS)


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
def _cut_point(a: wp.vec3, b: wp.vec3, near: float) -> wp.vec2:
    """NDC xy where edge ab (NDC x, y, view depth z; a in front of the near plane,
    b behind it) crosses it: the view-space point (x z is the view-space x, up to
    the camera's scale) interpolated in z and projected again."""
    t = (near - a[2]) / (b[2] - a[2])
    return wp.vec2(
        (a[0] * a[2] * (1.0 - t) + b[0] * b[2] * t) / near,
        (a[1] * a[2] * (1.0 - t) + b[1] * b[2] * t) / near,
    )


@wp.func
def _grow(lo: wp.vec2, hi: wp.vec2, v: wp.vec3, w: wp.vec3, near: float):
    """The box (lo, hi) grown by vertex v if it is in front of the near plane, and by
    the point where edge vw crosses the plane, if it does."""
    if v[2] >= near:
        p = wp.vec2(v[0], v[1])
        lo = wp.vec2(wp.min(lo[0], p[0]), wp.min(lo[1], p[1]))
        hi = wp.vec2(wp.max(hi[0], p[0]), wp.max(hi[1], p[1]))
    if (v[2] >= near) != (w[2] >= near):
        c = wp.vec2(0.0)
        if v[2] >= near:
            c = _cut_point(v, w, near)
        else:
            c = _cut_point(w, v, near)
        lo = wp.vec2(wp.min(lo[0], c[0]), wp.min(lo[1], c[1]))
        hi = wp.vec2(wp.max(hi[0], c[0]), wp.max(hi[1], c[1]))
    return lo, hi


@wp.func
def _cut_box(v0: wp.vec3, v1: wp.vec3, v2: wp.vec3, near: float):
    """NDC box (lo, hi) of the part of a face in front of the near plane."""
    lo = wp.vec2(1.0e30, 1.0e30)
    hi = wp.vec2(-1.0e30, -1.0e30)
    lo, hi = _grow(lo, hi, v0, v1, near)
    lo, hi = _grow(lo, hi, v1, v2, near)
    lo, hi = _grow(lo, hi, v2, v0, near)
    return lo, hi


@wp.func
def _face_box(walk: FaceWalk, scene: FrameScene, f: int):
    """(ok, x0, x1, y0, y1): the pixels whose centre may lie within ``margin_ndc`` of
    packed face f (its NDC box grown by the margin and by 0.01 pixel against
    rounding in the inverse pixel map), clamped to the image; ok is False for a
    face the rasterizer cannot draw (a vertex at z <= 0, non-finite, no image).
    A pixel shows a face only if its centre lies in the face (sharp pass) or
    within the blur radius of it (``margin_ndc`` = its square root, blurred pass)."""
    faces = scene.surface.faces
    ndc = scene.frame.ndc
    margin_ndc = walk.margin_ndc
    height = scene.view.height
    width = scene.view.width
    v0 = ndc[faces[f, 0]]
    v1 = ndc[faces[f, 1]]
    v2 = ndc[faces[f, 2]]
    xmin = wp.min(wp.min(v0[0], v1[0]), v2[0]) - margin_ndc
    xmax = wp.max(wp.max(v0[0], v1[0]), v2[0]) + margin_ndc
    ymin = wp.min(wp.min(v0[1], v1[1]), v2[1]) - margin_ndc
    ymax = wp.max(wp.max(v0[1], v1[1]), v2[1]) + margin_ndc
    zmin = wp.min(wp.min(v0[2], v1[2]), v2[2])
    near = scene.view.near
    drawn = zmin > 0.0
    if near > 0.0 and zmin < near:
        # cut by the near plane: the box of the part in front of it
        drawn = wp.max(wp.max(v0[2], v1[2]), v2[2]) > near
        lo, hi = _cut_box(v0, v1, v2, near)
        xmin = lo[0] - margin_ndc
        ymin = lo[1] - margin_ndc
        xmax = hi[0] + margin_ndc
        ymax = hi[1] + margin_ndc
    ok = walk.face_image[f] >= 0 and drawn and wp.isfinite(xmin + xmax + ymin + ymax)
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
    f: int, n: int, x0: int, x1: int, y_first: int, y_last: int, y_step: int, soft: int,
    smooth: int, scene: FrameScene, records: PixelRecords,
):  # fmt: skip
    """Sums the records of face f over rows y_first, y_first + y_step, ... <= y_last,
    columns x0..x1, in that (row-major) order."""
    pix_to_face = scene.sharp.pix_to_face
    soft_pix_to_face = scene.blurred.pix_to_face
    acc_ndc = wp.mat33(0.0)
    acc_world = wp.mat33(0.0)
    acc_vn = wp.mat33(0.0)
    yy = y_first
    while yy <= y_last:
        for xx in range(x0, x1 + 1):
            if records.face[n, yy, xx] == f:
                acc_ndc = acc_ndc + records.ndc[n, yy, xx]
                acc_world = acc_world + records.world[n, yy, xx]
                if smooth != 0:
                    acc_vn = acc_vn + records.vn[n, yy, xx]
            if soft != 0:
                if pix_to_face[n, yy, xx, 0] < 0:
                    for k in range(SOFT_SLOTS):
                        if soft_pix_to_face[n, yy, xx, k] == f:
                            acc_ndc = acc_ndc + records.soft[n, yy, xx, k]
        yy += y_step
    return acc_ndc, acc_world, acc_vn


@wp.func
def _store(
    sums_out: FaceSums, i: int, t: int, ndc: wp.mat33, world: wp.mat33, vn: wp.mat33, smooth: int
):
    """The sums of face (or list slot) i, strip t (the normal records only with smooth
    normals)."""
    sums_out.ndc[i, t] = ndc
    sums_out.world[i, t] = world
    if smooth != 0:
        sums_out.vn[i, t] = vn


@wp.func
def _listed(big: BigFaces, slot: int) -> int:
    """The big face in list slot ``slot``, -1 past the listed ones."""
    if slot >= wp.min(big.count[0], big.faces.shape[0]):
        return -1
    return big.faces[slot]


def _make_face_kernels(soft_on: bool, smooth_on: bool):
    """(face_gather, big_face_strips, big_face_sum) with the blurred slots
    (``soft_on``) and the normal records (``smooth_on``) compiled in or out: the
    walk's accumulators stay in registers only where they are used (the
    ``soft`` and ``smooth`` arguments are then ignored)."""

    @wp.kernel(module="unique", module_options=NO_ADJOINT_OPTIONS)
    def face_gather_kernel(
        # Model:
        walk: FaceWalk,
        # Data in:
        scene: FrameScene,
        records: PixelRecords,
        # Data out, (F, 1) rows = corners; the big-face list (count zeroed before):
        sums_out: FaceSums,
        big_out: BigFaces,
    ):
        """Packed face f: the records of the pixels that show it, summed in row-major
        order over its pixel box. A box of more than ``big_out.area`` pixels is listed
        for :func:`big_face_strips_kernel` (an integer counter hands out list slots;
        the sums do not depend on the slot) unless the list is full."""
        f = wp.tid()
        acc_ndc = wp.mat33(0.0)
        acc_world = wp.mat33(0.0)
        acc_vn = wp.mat33(0.0)
        ok, x0, x1, y0, y1 = _face_box(walk, scene, f)
        if ok:
            big = False
            if (x1 - x0 + 1) * (y1 - y0 + 1) > big_out.area:
                slot = wp.atomic_add(big_out.count, 0, 1)
                if slot < big_out.faces.shape[0]:
                    big_out.faces[slot] = f
                    big = True
            if not big:
                acc_ndc, acc_world, acc_vn = _walk(
                    f, walk.face_image[f], x0, x1, y0, y1, 1, wp.static(int(soft_on)),
                    wp.static(int(smooth_on)), scene, records,
                )  # fmt: skip
        _store(sums_out, f, 0, acc_ndc, acc_world, acc_vn, wp.static(int(smooth_on)))

    @wp.kernel(module="unique", module_options=NO_ADJOINT_OPTIONS)
    def big_face_strips_kernel(
        # Model:
        walk: FaceWalk,
        # Data in:
        scene: FrameScene,
        records: PixelRecords,
        big: BigFaces,
        # Data out, (capacity, strips):
        strips_out: FaceSums,
    ):
        """Big face in list slot ``slot``: strip t sums rows y0 + t, y0 + t + strips, ..."""
        slot, t = wp.tid()
        f = _listed(big, slot)
        if f < 0:
            return
        ok, x0, x1, y0, y1 = _face_box(walk, scene, f)
        acc_ndc, acc_world, acc_vn = _walk(
            f, walk.face_image[f], x0, x1, y0 + t, y1, strips_out.ndc.shape[1],
            wp.static(int(soft_on)), wp.static(int(smooth_on)), scene, records,
        )  # fmt: skip
        _store(strips_out, slot, t, acc_ndc, acc_world, acc_vn, wp.static(int(smooth_on)))

    @wp.kernel(module="unique", module_options=NO_ADJOINT_OPTIONS)
    def big_face_sum_kernel(
        # Data in:
        big: BigFaces,
        strips: FaceSums,
        # Data out, (F, 1):
        sums_out: FaceSums,
    ):
        """Big face in list slot ``slot``: its strips' sums, in strip order."""
        slot = wp.tid()
        f = _listed(big, slot)
        if f < 0:
            return
        acc_ndc = wp.mat33(0.0)
        acc_world = wp.mat33(0.0)
        acc_vn = wp.mat33(0.0)
        for t in range(strips.ndc.shape[1]):
            acc_ndc = acc_ndc + strips.ndc[slot, t]
            acc_world = acc_world + strips.world[slot, t]
            if wp.static(smooth_on):
                acc_vn = acc_vn + strips.vn[slot, t]
        _store(sums_out, f, 0, acc_ndc, acc_world, acc_vn, wp.static(int(smooth_on)))

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
    proj_corners: Csr,
    view: View,
    smooth: int,
    camera_grad: int,
    ndc_grad_on: int,
    # Data in:
    sums: FaceSums,
    points: wp.array(dtype=wp.vec3),
    camera_transforms: wp.array2d(dtype=wp.transform),
    camera_fovs: wp.array(dtype=float),
    ndc_grad: wp.array(dtype=wp.vec3),
    # Data out, (P,):
    proj_out: VertexGrads,
    camera_out: CameraGrads,
):
    """Projected vertex j: its face corners' gradients summed in CSR order, plus
    ``ndc_grad[j]`` when ``ndc_grad_on`` (the antialias pass's), then the adjoint of
    ``render.project_kernel`` (``ndc = (-x_c, y_c) / s, z``, ``s = tan(fov / 2) aspect
    signed_depth(z)``)."""
    j = wp.tid()
    g_ndc = wp.vec3(0.0)
    g_w = wp.vec3(0.0)
    g_vn = wp.vec3(0.0)
    for e in range(proj_corners.start[j], proj_corners.start[j + 1]):
        f, r = corner_face(proj_corners.entries[e])
        g_ndc = g_ndc + row(sums.ndc[f, 0], r)
        g_w = g_w + row(sums.world[f, 0], r)
        if smooth != 0:
            g_vn = g_vn + row(sums.vn[f, 0], r)
    if ndc_grad_on != 0:
        g_ndc = g_ndc + ndc_grad[j]
    w, c = image_camera(view, view.proj_image[j])
    aspect_min = view.aspect_min
    tf = camera_transforms[c, w]
    p = points[view.proj_vertex[j]]
    if not finite_vec3(p):
        # a non-finite vertex: its faces are never drawn, it takes no gradient and
        # gives none to the camera (0 * inf would be NaN)
        proj_out.point[j] = wp.vec3(0.0)
        proj_out.vn[j] = wp.vec3(0.0)
        if camera_grad != 0:
            camera_out.t[j] = wp.vec3(0.0)
            camera_out.q[j] = wp.vec4(0.0)
            camera_out.fov[j] = 0.0
        return
    pc = wp.transform_point(wp.transform_inverse(tf), p)
    z = -pc[2]
    half = 0.5 * camera_fovs[c]
    th = wp.tan(half)
    zs = signed_depth(z)
    s = th * aspect_min * zs
    g_s = (g_ndc[0] * pc[0] - g_ndc[1] * pc[1]) / (s * s)
    g_z = g_ndc[2]
    if wp.abs(z) > _MIN_DEPTH:
        g_z = g_z + g_s * th * aspect_min
    g_pc = wp.vec3(-g_ndc[0] / s, g_ndc[1] / s, -g_z)
    qi = wp.quat_inverse(wp.transform_get_rotation(tf))
    g_p = rotate_adj_x(qi, g_pc)
    proj_out.point[j] = g_p + g_w
    proj_out.vn[j] = g_vn
    if camera_grad != 0:
        # pc = rot(q^-1, p) - rot(q^-1, t), q^-1 = (-q_v, w)
        g_qi = rotate_adj_q(qi, p - wp.transform_get_translation(tf), g_pc)
        camera_out.t[j] = -g_p
        camera_out.q[j] = wp.vec4(-g_qi[0], -g_qi[1], -g_qi[2], g_qi[3])
        camera_out.fov[j] = g_s * aspect_min * zs * (1.0 + th * th) * 0.5


# ----------------------------------------------------------------------------- 4. per vertex
@wp.kernel
def vertex_gather_kernel(
    # Model:
    vertex_projs: Csr,
    smooth: int,
    # Data in, (P,):
    proj: VertexGrads,
    # Data out, (V,):
    vertex_out: VertexGrads,
):
    """Sensor vertex v: the gradients of its projections, in CSR order."""
    v = wp.tid()
    g = wp.vec3(0.0)
    gn = wp.vec3(0.0)
    for e in range(vertex_projs.start[v], vertex_projs.start[v + 1]):
        j = vertex_projs.entries[e]
        g = g + proj.point[j]
        if smooth != 0:
            gn = gn + proj.vn[j]
    vertex_out.point[v] = g
    vertex_out.vn[v] = gn


@wp.kernel
def normal_face_adjoint_kernel(
    # Model:
    mesh: SensorMesh,
    # Data in: the sensor vertices' points and (``vertex.vn``) raw normal gradients
    points: wp.array(dtype=wp.vec3),
    vertex: VertexGrads,
    # Data out, (F_sensor,) rows = corners:
    face_grad_out: wp.array(dtype=wp.mat33),
):
    """Adjoint of one face's term ``cross(p1 - p0, p2 - p0)`` of its three vertex normals
    (``render.vertex_normals_gather_kernel``)."""
    f = wp.tid()
    i = face_corners(mesh.faces, f)
    p0 = points[i[0]]
    if not finite_face(p0, points[i[1]], points[i[2]]):
        face_grad_out[f] = wp.mat33(0.0)  # the face added no normal (render.area_normal)
        return
    e1 = points[i[1]] - p0
    e2 = points[i[2]] - p0
    vn_grad = vertex.vn
    g = vn_grad[i[0]] + vn_grad[i[1]] + vn_grad[i[2]]
    g1 = wp.cross(e2, g)
    g2 = wp.cross(g, e1)
    face_grad_out[f] = wp.matrix_from_rows(-g1 - g2, g1, g2)


@wp.kernel
def normal_vertex_gather_kernel(
    # Model:
    mesh: SensorMesh,
    # Data in:
    face_grad: wp.array(dtype=wp.mat33),
    # Data out, (V,): added to ``vertex_out.point``
    vertex_out: VertexGrads,
):
    """Sensor vertex v: adds its corners' normal gradients, in CSR order."""
    v = wp.tid()
    corners = mesh.corners
    g = vertex_out.point[v]
    for e in range(corners.start[v], corners.start[v + 1]):
        f, r = corner_face(corners.entries[e])
        g = g + row(face_grad[f], r)
    vertex_out.point[v] = g


@wp.kernel
def particle_gather_kernel(
    # Model:
    particles: SourceGroups,
    # Data in, (V,):
    vertex: VertexGrads,
    # Data out (added to):
    particle_grad_out: wp.array(dtype=wp.vec3),
):
    """Used particle u: adds its sensor vertices' point gradients (CSR order)."""
    u = wp.tid()
    g = wp.vec3(0.0)
    verts = particles.verts
    for e in range(verts.start[u], verts.start[u + 1]):
        g = g + vertex.point[verts.entries[e]]
    p = particles.ids[u]
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
