"""The sensor's deterministic backward: hand-written adjoints, every float sum in a fixed order.

Warp's generated adjoint of a kernel that reads one array element from many
threads adds into that element's gradient with float atomics; on a GPU the order
of those adds follows thread timing, so gradients differ in the last bits run to
run, and contended atomics (every pixel of an image into one camera, every
vertex of a body into one transform) are slow. Here the whole sensor backward,
from the channel gradients to the simulation's arrays, is one function
registered on the tape (:meth:`SensorBackward.run`), built from kernels in
which every element is written by exactly one thread and every sum is taken in
an order fixed by the topology (static, built once at set-up) or by the
fragments:

1. ``channels_adjoint`` (one thread per pixel): recomputes the pixel's shading
   and writes, for the face it shows, the gradients with respect to that face's
   NDC vertices (through barycentrics and depth, :func:`warpraster.backward.slot_grads`,
   PyTorch3D's per-slot derivatives), its world vertices (hit point, face
   normal) and vertex normals; with a soft silhouette, also each blurred slot's
   distance gradient. The outline point of a soft pixel goes through Warp's
   generated adjoint of :func:`~warpraster.sim.render.outline_kernel` on per-pixel
   copies of its inputs (each pixel owns its element: no contention).
2. ``face_gather`` (one thread per packed face): walks the face's pixel
   bounding box (grown by the blur radius) in row order and sums the records of
   the pixels that show it; a face with a box of more than ``BIG_AREA`` pixels
   (a ground plane, a wall) is summed by ``BIG_STRIPS`` threads, one per set of
   rows, whose sums are then added in strip order.
3. ``proj_gather`` (one thread per projected vertex): sums its face corners
   (CSR of the packed faces, ascending), then the projection's adjoint: the
   gradient of the world point, of the camera transform and of the field of view.
4. ``vertex_gather`` (one thread per sensor vertex): sums its projections
   (CSR, ascending); with smooth normals, then the vertex normals' adjoint
   (per face, then per vertex over its corners).
5. Sources: one thread per particle sums its sensor vertices; one block per body
   sums the transform gradients of its vertices (strided per thread, then a tile
   reduction: fixed by the block size); one block per image sums the camera
   gradients of its projections and pixels; one thread per camera sums its
   worlds; one block per shape (and one for the light) sums the material
   gradients of the pixels.

Cost: the per-pixel and per-face passes read each covered pixel's records once
(72 bytes, 108 with smooth normals); the face walk reads one int per pixel of
each face's box.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..backward import slot_grads
from ..geometry import pix_to_ndc, pixel_centre
from .render import _MIN_DEPTH, SOFT_SLOTS, _nearer, _slot_alpha, outline_barycentrics

wp.set_module_options({"fuse_fp": False, "enable_backward": False})

#: Threads per block of the tile reductions.
BLOCK = 256

_vec8 = wp.types.vector(length=SOFT_SLOTS, dtype=float)


# ----------------------------------------------------------------------------- helpers
@wp.func
def _normalize_adj(v: wp.vec3, g: wp.vec3) -> wp.vec3:
    """Gradient w.r.t. ``v`` of ``g . normalize(v)`` (0 where ``v`` is 0, as Warp's)."""
    n = wp.length(v)
    if n > 0.0:
        u = v / n
        return (g - u * wp.dot(u, g)) / n
    return wp.vec3(0.0)


@wp.func
def _rotate_adj_x(q: wp.quat, g: wp.vec3) -> wp.vec3:
    """Gradient w.r.t. ``x`` of ``g . quat_rotate(q, x)`` (Warp's formula
    ``x (2w^2 - 1) + 2 q_v (q_v . x) + 2 w q_v x x``)."""
    qv = wp.vec3(q[0], q[1], q[2])
    w = q[3]
    return g * (2.0 * w * w - 1.0) + qv * (2.0 * wp.dot(qv, g)) + wp.cross(g, qv) * (2.0 * w)


@wp.func
def _rotate_adj_q(q: wp.quat, x: wp.vec3, g: wp.vec3) -> wp.vec4:
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


# ----------------------------------------------------------------------------- 1. per pixel
def _make_channels_adjoint(soft: bool):
    """The adjoint of ``render.CHANNEL_KERNELS[soft]`` (the same inputs), per pixel."""

    @wp.kernel(module="unique")
    def channels_adjoint(
        # Fragments of the sharp pass (K = 1) and of the blurred pass:
        pix_to_face: wp.array4d(dtype=wp.int32),
        bary: wp.array4d(dtype=wp.vec3),
        zbuf: wp.array4d(dtype=float),
        soft_pix_to_face: wp.array4d(dtype=wp.int32),
        soft_dists: wp.array4d(dtype=float),
        # Model:
        faces: wp.array2d(dtype=wp.int32),
        face_vertices: wp.array2d(dtype=wp.int32),
        face_shape: wp.array(dtype=wp.int32),
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
        # Data in (the frame's forward values):
        shape_colors: wp.array(dtype=wp.vec3),
        light_direction: wp.array(dtype=wp.vec3),
        light_intensity: wp.array(dtype=float),
        points: wp.array(dtype=wp.vec3),
        ndc: wp.array(dtype=wp.vec3),
        vertex_normals: wp.array(dtype=wp.vec3),
        camera_transforms: wp.array2d(dtype=wp.transform),
        # Upstream gradients, (world, camera, H, W); bit i of grad_mask: channel i has one
        grad_mask: int,
        g_color: wp.array4d(dtype=wp.vec3),
        g_albedo: wp.array4d(dtype=wp.vec3),
        g_normal: wp.array4d(dtype=wp.vec3),
        g_depth: wp.array4d(dtype=float),
        g_forward_depth: wp.array4d(dtype=float),
        g_alpha: wp.array4d(dtype=float),
        camera_grad: int,
        material_grad: int,
        # Data out, (N, H, W) (image n = world * C + camera) unless noted:
        rec_face_out: wp.array3d(dtype=wp.int32),
        rec_ndc_out: wp.array3d(dtype=wp.mat33),
        rec_world_out: wp.array3d(dtype=wp.mat33),
        rec_vn_out: wp.array3d(dtype=wp.mat33),
        rec_soft_out: wp.array4d(dtype=wp.mat33),
        outline_on_out: wp.array3d(dtype=wp.int32),
        outline_verts_out: wp.array3d(dtype=wp.mat33),
        outline_g_bary_out: wp.array3d(dtype=wp.vec3),
        outline_g_depth_out: wp.array3d(dtype=float),
        pix_origin_out: wp.array3d(dtype=wp.vec3),
        pix_albedo_out: wp.array3d(dtype=wp.vec3),
        pix_light_out: wp.array3d(dtype=wp.vec4),
    ):
        """Per pixel: the gradients of the shown face's NDC vertices (``rec_ndc``),
        world vertices (``rec_world``) and raw vertex normals (``rec_vn``), rows =
        the face's corners; ``rec_face`` the face (-1: none). Soft pixels: each
        blurred slot's distance gradient as NDC vertex gradients (``rec_soft``,
        (N, H, W, SOFT_SLOTS)), and the inputs and output gradients of the outline
        point (``outline_*``) for its generated adjoint. With ``camera_grad``: the
        camera-origin gradient of the depth; with ``material_grad``: the albedo
        and light (direction, intensity) gradients."""
        n, y, x = wp.tid()
        w = n // camera_count
        c = n - w * camera_count
        f = pix_to_face[n, y, x, 0]
        b = wp.vec3(0.0)
        fwd = float(0.0)
        sharp = f >= 0
        if sharp:
            b = bary[n, y, x, 0]
            fwd = zbuf[n, y, x, 0]
        a = float(1.0)
        pc = pixel_centre(y, x, ndc_height, ndc_width)
        om = _vec8()
        if wp.static(soft):
            outline_on_out[n, y, x] = 0
            if not sharp and sigma > 0.0:
                prod = float(1.0)
                for k in range(SOFT_SLOTS):
                    om[k] = 1.0 - _slot_alpha(soft_pix_to_face, soft_dists, n, y, x, k, sigma)
                    prod = prod * om[k]
                a = 1.0 - prod
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 1, 0)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 2, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 3, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 4, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 5, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 6, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 7, k)
                f = soft_pix_to_face[n, y, x, k]
                if f >= 0:
                    v0 = ndc[faces[f, 0]]
                    v1 = ndc[faces[f, 1]]
                    v2 = ndc[faces[f, 2]]
                    b = outline_barycentrics(pc, v0, v1, v2)
                    fwd = 1.0 / (b[0] / v0[2] + b[1] / v1[2] + b[2] / v2[2])
                    outline_on_out[n, y, x] = 1
                    outline_verts_out[n, y, x] = wp.matrix_from_rows(v0, v1, v2)
        rec_face_out[n, y, x] = f
        if f < 0:
            return
        # ---- upstream gradients
        gc = wp.vec3(0.0)
        galb = wp.vec3(0.0)
        gn = wp.vec3(0.0)
        gd = float(0.0)
        gfd = float(0.0)
        ga = float(0.0)
        if (grad_mask & 1) != 0:
            gc = g_color[w, c, y, x]
        if (grad_mask & 2) != 0:
            galb = g_albedo[w, c, y, x]
        if (grad_mask & 4) != 0:
            gn = g_normal[w, c, y, x]
        if (grad_mask & 8) != 0:
            gd = g_depth[w, c, y, x]
        if (grad_mask & 16) != 0:
            gfd = g_forward_depth[w, c, y, x]
        if (grad_mask & 32) != 0:
            ga = g_alpha[w, c, y, x]
        # ---- forward (as the channel kernel)
        i0 = face_vertices[f, 0]
        i1 = face_vertices[f, 1]
        i2 = face_vertices[f, 2]
        p0 = points[i0]
        p1 = points[i1]
        p2 = points[i2]
        hit = b[0] * p0 + b[1] * p1 + b[2] * p2
        origin = wp.transform_get_translation(camera_transforms[c, w])
        ray = hit - origin
        depth = wp.length(ray)
        e1 = p1 - p0
        e2 = p2 - p0
        c_raw = wp.cross(e1, e2)
        nrm = wp.normalize(c_raw)
        m0 = wp.vec3(0.0)
        m1 = wp.vec3(0.0)
        m2 = wp.vec3(0.0)
        s_raw = wp.vec3(0.0)
        if smooth != 0:
            m0 = wp.normalize(vertex_normals[i0])
            m1 = wp.normalize(vertex_normals[i1])
            m2 = wp.normalize(vertex_normals[i2])
            s_raw = b[0] * m0 + b[1] * m1 + b[2] * m2
            nrm = wp.normalize(s_raw)
        shape = face_shape[f]
        albedo = shape_colors[shape]
        amb = wp.vec3(0.0)
        if ambient != 0:
            hemi = 0.5 * (wp.dot(nrm, up) + 1.0)
            amb = (sky * hemi + ground * (1.0 - hemi)) * ambient_intensity
        l_raw = light_direction[0]
        to_light = -wp.normalize(l_raw)
        ndl = wp.dot(nrm, to_light)
        ndotl = wp.max(ndl, 0.0)
        intensity = light_intensity[0]
        shaded = wp.cw_mul(albedo, amb) + albedo * (ndotl * intensity)
        # ---- adjoint
        g_a = (
            wp.dot(gc, shaded - clear_color)
            + wp.dot(galb, albedo)
            + wp.dot(gn, nrm)
            + gd * (depth - clear_depth)
            + gfd * (fwd - clear_depth)
            + ga
        )
        g_sh = a * gc
        g_alb = a * galb + wp.cw_mul(g_sh, amb) + g_sh * (ndotl * intensity)
        g_nrm = a * gn
        g_sh_alb = wp.dot(g_sh, albedo)
        if ambient != 0:
            g_hemi = wp.dot(wp.cw_mul(g_sh, albedo), (sky - ground) * ambient_intensity)
            g_nrm = g_nrm + (0.5 * g_hemi) * up
        g_tl = wp.vec3(0.0)
        if ndl > 0.0:
            g_ndotl = intensity * g_sh_alb
            g_nrm = g_nrm + g_ndotl * to_light
            g_tl = g_ndotl * nrm
        g_b = wp.vec3(0.0)
        g_hit = wp.vec3(0.0)
        if depth > 0.0:
            g_hit = (a * gd / depth) * ray
        g_b = wp.vec3(wp.dot(g_hit, p0), wp.dot(g_hit, p1), wp.dot(g_hit, p2))
        g_p0 = b[0] * g_hit
        g_p1 = b[1] * g_hit
        g_p2 = b[2] * g_hit
        g_vn = wp.mat33(0.0)
        if smooth != 0:
            g_s = _normalize_adj(s_raw, g_nrm)
            g_b = g_b + wp.vec3(wp.dot(g_s, m0), wp.dot(g_s, m1), wp.dot(g_s, m2))
            g_vn = wp.matrix_from_rows(
                _normalize_adj(vertex_normals[i0], b[0] * g_s),
                _normalize_adj(vertex_normals[i1], b[1] * g_s),
                _normalize_adj(vertex_normals[i2], b[2] * g_s),
            )
        else:
            g_c = _normalize_adj(c_raw, g_nrm)
            g_e1 = wp.cross(e2, g_c)
            g_e2 = wp.cross(g_c, e1)
            g_p0 = g_p0 - g_e1 - g_e2
            g_p1 = g_p1 + g_e1
            g_p2 = g_p2 + g_e2
        g_fwd = a * gfd
        rec_world_out[n, y, x] = wp.matrix_from_rows(g_p0, g_p1, g_p2)
        if smooth != 0:
            rec_vn_out[n, y, x] = g_vn
        if sharp:
            rec_ndc_out[n, y, x] = slot_grads(
                pc, ndc[faces[f, 0]], ndc[faces[f, 1]], ndc[faces[f, 2]], 1, 0, 0,
                g_fwd, g_b, 0.0,
            )  # fmt: skip
        if wp.static(soft):
            if not sharp:
                # the outline point's part is added by the generated adjoint of
                # render.outline_kernel; here its inputs' gradients
                rec_ndc_out[n, y, x] = wp.mat33(0.0)
                outline_g_bary_out[n, y, x] = g_b
                outline_g_depth_out[n, y, x] = g_fwd
                # coverage: a = 1 - prod_k (1 - a_k), a_k = min(2 / (1 + exp(d_k / sigma)), 1)
                for k in range(SOFT_SLOTS):
                    fk = soft_pix_to_face[n, y, x, k]
                    g_slot = wp.mat33(0.0)
                    if fk >= 0:
                        others = float(1.0)
                        for j in range(SOFT_SLOTS):
                            if j != k:
                                others = others * om[j]
                        e = wp.exp(soft_dists[n, y, x, k] / sigma)
                        t = 2.0 / (1.0 + e)
                        if t < 1.0:
                            g_d = (g_a * others) * (-2.0 * e / (sigma * (1.0 + e) * (1.0 + e)))
                            g_slot = slot_grads(
                                pc, ndc[faces[fk, 0]], ndc[faces[fk, 1]], ndc[faces[fk, 2]],
                                0, 0, 0, 0.0, wp.vec3(0.0), g_d,
                            )  # fmt: skip
                    rec_soft_out[n, y, x, k] = g_slot
        if camera_grad != 0:
            pix_origin_out[n, y, x] = -g_hit
        if material_grad != 0:
            g_l = -_normalize_adj(l_raw, g_tl)
            pix_albedo_out[n, y, x] = g_alb
            pix_light_out[n, y, x] = wp.vec4(g_l[0], g_l[1], g_l[2], ndotl * g_sh_alb)

    return channels_adjoint


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


@wp.kernel
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
                f, face_image[f], x0, x1, y0, y1, 1, soft, smooth, pix_to_face,
                soft_pix_to_face, rec_face, rec_ndc, rec_world, rec_vn, rec_soft,
            )  # fmt: skip
    face_ndc_out[f] = acc_ndc
    face_world_out[f] = acc_world
    if smooth != 0:
        face_vn_out[f] = acc_vn


@wp.kernel
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
        f, face_image[f], x0, x1, y0 + t, y1, strip_ndc_out.shape[1], soft, smooth,
        pix_to_face, soft_pix_to_face, rec_face, rec_ndc, rec_world, rec_vn, rec_soft,
    )  # fmt: skip
    strip_ndc_out[slot, t] = acc_ndc
    strip_world_out[slot, t] = acc_world
    strip_vn_out[slot, t] = acc_vn


@wp.kernel
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
        acc_vn = acc_vn + strip_vn[slot, t]
    face_ndc_out[f] = acc_ndc
    face_world_out[f] = acc_world
    if smooth != 0:
        face_vn_out[f] = acc_vn


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
    g_p = _rotate_adj_x(qi, g_pc)
    point_grad_out[j] = g_p + g_w
    vn_grad_out[j] = g_vn
    if camera_grad != 0:
        # pc = rot(q^-1, p) - rot(q^-1, t), q^-1 = (-q_v, w)
        g_qi = _rotate_adj_q(qi, p - wp.transform_get_translation(tf), g_pc)
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
    corner_start: wp.array(dtype=wp.int32),
    corners: wp.array(dtype=wp.int32),
    # Data in:
    face_grad: wp.array(dtype=wp.mat33),
    # Data out (added to), (V,):
    points_grad_out: wp.array(dtype=wp.vec3),
):
    """Sensor vertex v: adds its corners' normal gradients, in CSR order."""
    v = wp.tid()
    g = points_grad_out[v]
    for e in range(corner_start[v], corner_start[v + 1]):
        corner = corners[e]
        f = corner // 3
        g = g + _row(face_grad[f], corner - 3 * f)
    points_grad_out[v] = g


# ----------------------------------------------------------------------------- 5. sources
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


@wp.kernel
def body_reduce_kernel(
    # Model:
    start: wp.array(dtype=wp.int32),
    verts: wp.array(dtype=wp.int32),
    body: wp.array(dtype=wp.int32),
    local: wp.array(dtype=wp.vec3),
    # Data in:
    body_q: wp.array(dtype=wp.transform),
    points_grad: wp.array(dtype=wp.vec3),
    # Data out (added to):
    body_grad_out: wp.array(dtype=wp.transform),
):
    """One block per used body: the transform gradient of ``transform_point(q, local)``
    summed over its vertices (strided per thread, then tile sums: a fixed order)."""
    u, lane = wp.tid()
    b = body[u]
    q = wp.transform_get_rotation(body_q[b])
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    e = start[u] + lane
    while e < start[u + 1]:
        v = verts[e]
        g = points_grad[v]
        gt = gt + g
        gq = gq + _rotate_adj_q(q, local[v], g)
        e += wp.block_dim()
    t0 = wp.tile_extract(wp.tile_sum(wp.tile(gt[0])), 0)
    t1 = wp.tile_extract(wp.tile_sum(wp.tile(gt[1])), 0)
    t2 = wp.tile_extract(wp.tile_sum(wp.tile(gt[2])), 0)
    q0 = wp.tile_extract(wp.tile_sum(wp.tile(gq[0])), 0)
    q1 = wp.tile_extract(wp.tile_sum(wp.tile(gq[1])), 0)
    q2 = wp.tile_extract(wp.tile_sum(wp.tile(gq[2])), 0)
    q3 = wp.tile_extract(wp.tile_sum(wp.tile(gq[3])), 0)
    if lane == 0:
        body_grad_out[b] = body_grad_out[b] + wp.transform(
            wp.vec3(t0, t1, t2), wp.quat(q0, q1, q2, q3)
        )


@wp.kernel
def image_camera_reduce_kernel(
    # Model:
    proj_start: wp.array(dtype=wp.int32),
    pixels: int,
    # Data in:
    cam_t: wp.array(dtype=wp.vec3),
    cam_q: wp.array(dtype=wp.vec4),
    fov: wp.array(dtype=float),
    rec_face: wp.array(dtype=wp.int32),
    pix_origin: wp.array(dtype=wp.vec3),
    # Data out, (N,):
    image_t_out: wp.array(dtype=wp.vec3),
    image_q_out: wp.array(dtype=wp.vec4),
    image_fov_out: wp.array(dtype=float),
):
    """One block per image n: the camera gradients of its projections (the
    contiguous range ``proj_start[n:n+2]``) and of its covered pixels' depth."""
    n, lane = wp.tid()
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    gf = float(0.0)
    j = proj_start[n] + lane
    while j < proj_start[n + 1]:
        gt = gt + cam_t[j]
        gq = gq + cam_q[j]
        gf = gf + fov[j]
        j += wp.block_dim()
    i = n * pixels + lane
    while i < (n + 1) * pixels:
        if rec_face[i] >= 0:
            gt = gt + pix_origin[i]
        i += wp.block_dim()
    t0 = wp.tile_extract(wp.tile_sum(wp.tile(gt[0])), 0)
    t1 = wp.tile_extract(wp.tile_sum(wp.tile(gt[1])), 0)
    t2 = wp.tile_extract(wp.tile_sum(wp.tile(gt[2])), 0)
    q0 = wp.tile_extract(wp.tile_sum(wp.tile(gq[0])), 0)
    q1 = wp.tile_extract(wp.tile_sum(wp.tile(gq[1])), 0)
    q2 = wp.tile_extract(wp.tile_sum(wp.tile(gq[2])), 0)
    q3 = wp.tile_extract(wp.tile_sum(wp.tile(gq[3])), 0)
    f0 = wp.tile_extract(wp.tile_sum(wp.tile(gf)), 0)
    if lane == 0:
        image_t_out[n] = wp.vec3(t0, t1, t2)
        image_q_out[n] = wp.vec4(q0, q1, q2, q3)
        image_fov_out[n] = f0


@wp.kernel
def camera_add_kernel(
    world_count: int,
    camera_count: int,
    fov_grad_on: int,
    image_t: wp.array(dtype=wp.vec3),
    image_q: wp.array(dtype=wp.vec4),
    image_fov: wp.array(dtype=float),
    # Data out (added to):
    camera_grad_out: wp.array2d(dtype=wp.transform),
    fov_grad_out: wp.array(dtype=float),
):
    """Camera c: adds each world's image sums to its transform gradient (C, W) and
    their sum over worlds, in world order, to its field-of-view gradient."""
    c = wp.tid()
    gf = float(0.0)
    for w in range(world_count):
        n = w * camera_count + c
        q = image_q[n]
        camera_grad_out[c, w] = camera_grad_out[c, w] + wp.transform(
            image_t[n], wp.quat(q[0], q[1], q[2], q[3])
        )
        gf = gf + image_fov[n]
    if fov_grad_on != 0:
        fov_grad_out[c] = fov_grad_out[c] + gf


@wp.kernel
def material_reduce_kernel(
    # Model:
    face_shape: wp.array(dtype=wp.int32),
    count: int,
    # Data in:
    rec_face: wp.array(dtype=wp.int32),
    pix_albedo: wp.array(dtype=wp.vec3),
    pix_light: wp.array(dtype=wp.vec4),
    # Data out (added to):
    shape_colors_grad_out: wp.array(dtype=wp.vec3),
    light_direction_grad_out: wp.array(dtype=wp.vec3),
    light_intensity_grad_out: wp.array(dtype=float),
):
    """Block s < S: the albedo gradient of the pixels showing shape s; block S: the
    light gradients of every covered pixel (strided, then tile sums)."""
    s, lane = wp.tid()
    num_shapes = shape_colors_grad_out.shape[0]
    acc = wp.vec4(0.0)
    i = lane
    while i < count:
        f = rec_face[i]
        if f >= 0:
            if s < num_shapes:
                if face_shape[f] == s:
                    g = pix_albedo[i]
                    acc = acc + wp.vec4(g[0], g[1], g[2], 0.0)
            else:
                acc = acc + pix_light[i]
        i += wp.block_dim()
    a0 = wp.tile_extract(wp.tile_sum(wp.tile(acc[0])), 0)
    a1 = wp.tile_extract(wp.tile_sum(wp.tile(acc[1])), 0)
    a2 = wp.tile_extract(wp.tile_sum(wp.tile(acc[2])), 0)
    a3 = wp.tile_extract(wp.tile_sum(wp.tile(acc[3])), 0)
    if lane == 0:
        if s < num_shapes:
            shape_colors_grad_out[s] = shape_colors_grad_out[s] + wp.vec3(a0, a1, a2)
        else:
            light_direction_grad_out[0] = light_direction_grad_out[0] + wp.vec3(a0, a1, a2)
            light_intensity_grad_out[0] = light_intensity_grad_out[0] + a3


#: The per-pixel adjoints by soft silhouette on/off.
CHANNELS_ADJOINT = {False: _make_channels_adjoint(False), True: _make_channels_adjoint(True)}


# ----------------------------------------------------------------------------- set-up
def csr(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(start (count + 1,), entries) listing, for each key in ``[0, count)``, the
    positions i with ``keys[i] == key`` in ascending order (negative keys dropped)."""
    keys = np.asarray(keys, np.int64).reshape(-1)
    keep = np.nonzero(keys >= 0)[0]
    order = keep[np.argsort(keys[keep], kind="stable")]
    start = np.zeros(count + 1, np.int64)
    np.add.at(start, keys[keep] + 1, 1)
    return np.cumsum(start).astype(np.int32), order.astype(np.int32)


def _dummy(shape, dtype, device) -> wp.array:
    return wp.zeros(shape, dtype=dtype, device=device)


class SensorBackward:
    """The static topology (CSR lists, built once) and the scratch of the deterministic
    backward of one :class:`~warpraster.sim.CameraSensor`.

    The scratch is shared by the sensor's frame slots: the tape runs their
    backwards one after another, and each uses it only while it runs. Per-pixel
    records (N, H, W): 76 bytes (112 with smooth normals; a soft silhouette adds
    ``SOFT_SLOTS`` x 36 + 60); per packed face 108; per projected vertex 48.
    Camera scratch is allocated by the first backward that needs camera gradients.

    Args:
        sensor: the sensor (its packed topology and options are read here).
        big_area: faces whose pixel box holds more pixels are summed by
            ``big_strips`` threads each.
        big_capacity: at most this many such faces per backward (more are
            walked by one thread each).
        big_strips: threads (row strips) per big face.
    """

    def __init__(self, sensor, *, big_area: int = BIG_AREA, big_capacity: int = BIG_CAPACITY,
                 big_strips: int = BIG_STRIPS):  # fmt: skip
        dev = sensor.device
        self.device = dev
        self.sensor = sensor
        n = sensor.num_images
        h, w = sensor.image_size
        soft = sensor.silhouette_sigma > 0.0
        smooth = sensor.smooth_normals
        self.soft = soft
        self.smooth = smooth
        faces = sensor.faces.numpy()
        num_faces = faces.shape[0]
        num_proj = sensor.proj_vertex.shape[0]
        num_verts = sensor.vertex_source.shape[0]
        first = sensor.mesh_first.numpy()
        count = sensor.mesh_count.numpy()
        face_image = np.full(num_faces, -1, np.int32)
        for i in range(n):
            face_image[first[i] : first[i] + count[i]] = i
        proj_image = sensor.proj_image.numpy()
        if np.any(np.diff(proj_image) < 0):
            raise ValueError("projected vertices must be grouped by image")  # packing invariant
        self.face_image = wp.array(face_image, dtype=wp.int32, device=dev)
        start, entries = csr(faces.reshape(-1), num_proj)
        self.proj_corner_start = wp.array(start, dtype=wp.int32, device=dev)
        self.proj_corners = wp.array(entries, dtype=wp.int32, device=dev)
        start, _ = csr(proj_image, n)
        self.image_proj_start = wp.array(start, dtype=wp.int32, device=dev)
        start, entries = csr(sensor.proj_vertex.numpy(), num_verts)
        self.vertex_proj_start = wp.array(start, dtype=wp.int32, device=dev)
        self.vertex_projs = wp.array(entries, dtype=wp.int32, device=dev)
        start, entries = csr(sensor.sensor_faces.numpy().reshape(-1), num_verts)
        self.vertex_corner_start = wp.array(start, dtype=wp.int32, device=dev)
        self.vertex_corners = wp.array(entries, dtype=wp.int32, device=dev)
        src = sensor.vertex_source.numpy()
        idx = sensor.vertex_index.numpy()
        from .geometry import VertexSource  # noqa: PLC0415

        self.particles = self._source_lists(src, idx, VertexSource.PARTICLE)
        self.bodies = self._source_lists(src, idx, VertexSource.BODY)
        self.local = sensor.vertex_local

        rg = sensor.requires_grad
        img = (n, h, w) if rg else (1, 1, 1)
        self.rec_face = wp.full(img, -1, dtype=wp.int32, device=dev)
        self.rec_ndc = wp.zeros(img, dtype=wp.mat33, device=dev)
        self.rec_world = wp.zeros(img, dtype=wp.mat33, device=dev)
        self.rec_vn = wp.zeros(img if smooth else (1, 1, 1), dtype=wp.mat33, device=dev)
        simg = img if soft else (1, 1, 1)
        self.rec_soft = wp.zeros((*simg, SOFT_SLOTS) if soft else (1, 1, 1, 1), dtype=wp.mat33,
                                 device=dev)  # fmt: skip
        self.outline_on = wp.zeros(simg, dtype=wp.int32, device=dev)
        self.outline_verts = wp.zeros(simg, dtype=wp.mat33, device=dev)
        self.outline_g_bary = wp.zeros(simg, dtype=wp.vec3, device=dev)
        self.outline_g_depth = wp.zeros(simg, dtype=float, device=dev)
        self.outline_bary = wp.zeros(simg, dtype=wp.vec3, device=dev)
        self.outline_depth = wp.zeros(simg, dtype=float, device=dev)
        mimg = img if sensor.material_grad else (1, 1, 1)
        self.pix_albedo = wp.zeros(mimg, dtype=wp.vec3, device=dev)
        self.pix_light = wp.zeros(mimg, dtype=wp.vec4, device=dev)
        fa = max(num_faces, 1) if rg else 1
        self.face_ndc = wp.zeros(fa, dtype=wp.mat33, device=dev)
        self.face_world = wp.zeros(fa, dtype=wp.mat33, device=dev)
        self.face_vn = wp.zeros(fa, dtype=wp.mat33, device=dev)
        self.big_area = int(big_area)
        cap = max(min(int(big_capacity), fa), 1) if rg else 1
        self.big_count = wp.zeros(1, dtype=wp.int32, device=dev)
        self.big_list = wp.zeros(cap, dtype=wp.int32, device=dev)
        strips = (cap, max(int(big_strips), 1)) if rg else (1, 1)
        self.strip_ndc = wp.zeros(strips, dtype=wp.mat33, device=dev)
        self.strip_world = wp.zeros(strips, dtype=wp.mat33, device=dev)
        self.strip_vn = wp.zeros(strips, dtype=wp.mat33, device=dev)
        pa = max(num_proj, 1) if rg else 1
        self.proj_point_grad = wp.zeros(pa, dtype=wp.vec3, device=dev)
        self.proj_vn_grad = wp.zeros(pa, dtype=wp.vec3, device=dev)
        va = max(num_verts, 1) if rg else 1
        self.vn_grad = wp.zeros(va, dtype=wp.vec3, device=dev)
        sf = sensor.sensor_faces.shape[0] if (rg and smooth) else 1
        self.normal_face_grad = wp.zeros(max(sf, 1), dtype=wp.mat33, device=dev)
        self._camera = None  # camera scratch (allocated on first need)
        self._dummy4 = {t: _dummy((1, 1, 1, 1), t, dev) for t in (wp.vec3, wp.float32)}
        self._dummy3 = _dummy((1, 1, 1), wp.vec3, dev)
        self._dummy_fov = _dummy(1, wp.float32, dev)
        self._dummy_vec3 = _dummy(1, wp.vec3, dev)
        self._dummy_vec4 = _dummy(1, wp.vec4, dev)
        self._dummy_cam = _dummy((1, 1), wp.transform, dev)

    def _source_lists(self, src, idx, kind):
        sel = np.nonzero(src == int(kind))[0]
        ids = np.unique(idx[sel]) if sel.size else np.zeros(0, np.int64)
        if ids.size == 0:
            return None
        pos = np.searchsorted(ids, idx[sel])
        keys = np.full(src.shape[0], -1, np.int64)
        keys[sel] = pos
        start, entries = csr(keys, ids.size)
        dev = self.device
        return (
            wp.array(start, dtype=wp.int32, device=dev),
            wp.array(entries, dtype=wp.int32, device=dev),
            wp.array(ids.astype(np.int32), dtype=wp.int32, device=dev),
        )

    def _camera_scratch(self):
        if self._camera is None:
            s = self.sensor
            dev = self.device
            h, w = s.image_size
            p = max(s.proj_vertex.shape[0], 1)
            n = s.num_images
            self._camera = dict(
                pix_origin=wp.zeros((n, h, w), dtype=wp.vec3, device=dev),
                cam_t=wp.zeros(p, dtype=wp.vec3, device=dev),
                cam_q=wp.zeros(p, dtype=wp.vec4, device=dev),
                fov=wp.zeros(p, dtype=float, device=dev),
                image_t=wp.zeros(n, dtype=wp.vec3, device=dev),
                image_q=wp.zeros(n, dtype=wp.vec4, device=dev),
                image_fov=wp.zeros(n, dtype=float, device=dev),
            )
        return self._camera

    def prepare(self, camera_transforms, camera_fovs) -> None:
        """Allocates what a backward with these inputs will need (call at record time)."""
        if camera_transforms.grad is not None or camera_fovs.grad is not None:
            self._camera_scratch()
        if camera_transforms.grad is None and camera_fovs.grad is not None:
            if self._dummy_cam.shape != tuple(camera_transforms.shape):
                self._dummy_cam = wp.zeros(camera_transforms.shape, dtype=wp.transform,
                                           device=self.device)  # fmt: skip

    def run(self, frame, frags, soft_frags, *, camera_transforms, camera_fovs, particle_q,
            body_q) -> None:  # fmt: skip
        """Adds d(loss)/d(inputs) of frame ``frame`` (from its channels' ``.grad``) to the
        ``.grad`` of ``particle_q``, ``body_q``, ``camera_transforms``, ``camera_fovs``
        and the sensor's material arrays (those that have one); overwrites
        ``frame.points.grad`` with the sensor vertices' gradient."""
        s = self.sensor
        dev = self.device
        n = s.num_images
        h, w = s.image_size
        soft = self.soft
        smooth = int(self.smooth)
        cam_on = camera_transforms.grad is not None or camera_fovs.grad is not None
        cam = self._camera_scratch() if cam_on else None
        mat_on = s.shape_colors.grad is not None
        grads, mask = [], 0
        names = ("color", "albedo", "normal", "depth", "forward_depth", "alpha")
        for bit, name in enumerate(names):
            g = getattr(frame, name).grad
            if g is None:
                g = self._dummy4[wp.vec3 if name in ("color", "albedo", "normal") else wp.float32]
            else:
                mask |= 1 << bit
            grads.append(g)
        wp.launch(
            CHANNELS_ADJOINT[soft],
            dim=(n, h, w),
            inputs=[
                frags.pix_to_face, frags.bary_coords, frags.zbuf,
                soft_frags.pix_to_face, soft_frags.dists,
                s.faces, s.face_vertices, s.face_shape,
                s.camera_count, h, w,
                s.silhouette_sigma, int(s.ambient), s.up,
                *s.ambient_terms,
                s.clear_color, s.clear_depth, smooth,
                s.shape_colors, s.light_direction, s.light_intensity, frame.points,
                frame.ndc, frame.vertex_normals, camera_transforms,
                mask, *grads, int(cam_on), int(mat_on),
            ],
            outputs=[
                self.rec_face, self.rec_ndc, self.rec_world, self.rec_vn, self.rec_soft,
                self.outline_on, self.outline_verts, self.outline_g_bary, self.outline_g_depth,
                cam["pix_origin"] if cam_on else self._dummy3, self.pix_albedo, self.pix_light,
            ],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        if soft:
            from .render import outline_kernel  # noqa: PLC0415

            wp.launch(
                outline_kernel,
                dim=(n, h, w),
                inputs=[self.outline_on, h, w, self.outline_verts],
                outputs=[self.outline_bary, self.outline_depth],
                adj_inputs=[None, 0, 0, self.rec_ndc],
                adj_outputs=[self.outline_g_bary, self.outline_g_depth],
                adjoint=True,
                device=dev,
                record_tape=False,
            )
        num_faces = s.faces.shape[0]
        # a face's pixels lie within its bounding box grown by the blur radius
        margin = float(np.sqrt(s.blur_radius)) if soft else 0.0
        if num_faces:
            box = [s.faces, self.face_image, h, w, margin, int(soft), smooth]
            recs = [frame.ndc, frags.pix_to_face, soft_frags.pix_to_face, self.rec_face,
                    self.rec_ndc, self.rec_world, self.rec_vn, self.rec_soft]  # fmt: skip
            face_out = [self.face_ndc, self.face_world, self.face_vn]
            cap = self.big_list.shape[0]
            self.big_count.zero_()
            wp.launch(face_gather_kernel, dim=num_faces, inputs=[*box, self.big_area, cap, *recs],
                      outputs=[*face_out, self.big_count, self.big_list], device=dev,
                      record_tape=False)  # fmt: skip
            strips = [self.strip_ndc, self.strip_world, self.strip_vn]
            wp.launch(big_face_strips_kernel, dim=self.strip_ndc.shape,
                      inputs=[*box, cap, self.big_count, self.big_list, *recs], outputs=strips,
                      device=dev, record_tape=False)  # fmt: skip
            wp.launch(big_face_sum_kernel, dim=cap,
                      inputs=[cap, smooth, self.big_count, self.big_list, *strips],
                      outputs=face_out, device=dev, record_tape=False)  # fmt: skip
        wp.launch(
            proj_gather_kernel,
            dim=s.proj_vertex.shape[0],
            inputs=[
                self.proj_corner_start, self.proj_corners, s.proj_vertex, s.proj_image,
                s.camera_count, min(1.0, w / h), smooth, int(cam_on),
                self.face_ndc, self.face_world, self.face_vn, frame.points,
                camera_transforms, camera_fovs,
            ],
            outputs=[
                self.proj_point_grad, self.proj_vn_grad,
                cam["cam_t"] if cam_on else self._dummy_vec3,
                cam["cam_q"] if cam_on else self._dummy_vec4,
                cam["fov"] if cam_on else self._dummy_fov,
            ],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        points_grad = frame.points.grad
        wp.launch(
            vertex_gather_kernel,
            dim=points_grad.shape[0],
            inputs=[self.vertex_proj_start, self.vertex_projs, smooth, self.proj_point_grad,
                    self.proj_vn_grad],
            outputs=[points_grad, self.vn_grad],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        if smooth:
            wp.launch(normal_face_adjoint_kernel, dim=s.sensor_faces.shape[0],
                      inputs=[s.sensor_faces, frame.points, self.vn_grad],
                      outputs=[self.normal_face_grad], device=dev, record_tape=False)  # fmt: skip
            wp.launch(normal_vertex_gather_kernel, dim=points_grad.shape[0],
                      inputs=[self.vertex_corner_start, self.vertex_corners,
                              self.normal_face_grad],
                      outputs=[points_grad], device=dev, record_tape=False)  # fmt: skip
        if self.particles is not None and particle_q.grad is not None:
            start, verts, ids = self.particles
            wp.launch(particle_gather_kernel, dim=ids.shape[0],
                      inputs=[start, verts, ids, points_grad], outputs=[particle_q.grad],
                      device=dev, record_tape=False)  # fmt: skip
        if self.bodies is not None and body_q.grad is not None:
            start, verts, ids = self.bodies
            wp.launch_tiled(body_reduce_kernel, dim=[ids.shape[0]],
                            inputs=[start, verts, ids, self.local, body_q, points_grad],
                            outputs=[body_q.grad], block_dim=BLOCK, device=dev,
                            record_tape=False)  # fmt: skip
        if cam_on:
            wp.launch_tiled(
                image_camera_reduce_kernel,
                dim=[n],
                inputs=[self.image_proj_start, h * w, cam["cam_t"], cam["cam_q"], cam["fov"],
                        self.rec_face.flatten(), cam["pix_origin"].flatten()],
                outputs=[cam["image_t"], cam["image_q"], cam["image_fov"]],
                block_dim=BLOCK,
                device=dev,
                record_tape=False,
            )  # fmt: skip
            cam_grad = camera_transforms.grad
            if cam_grad is None:
                cam_grad = self._dummy_cam  # sized by prepare()
            fov_grad = camera_fovs.grad
            wp.launch(
                camera_add_kernel,
                dim=s.camera_count,
                inputs=[s.world_count, s.camera_count, int(fov_grad is not None),
                        cam["image_t"], cam["image_q"], cam["image_fov"]],
                outputs=[cam_grad, self._dummy_fov if fov_grad is None else fov_grad],
                device=dev,
                record_tape=False,
            )  # fmt: skip
        if mat_on:
            wp.launch_tiled(
                material_reduce_kernel,
                dim=[s.shape_colors.shape[0] + 1],
                inputs=[s.face_shape, n * h * w, self.rec_face.flatten(),
                        self.pix_albedo.flatten(), self.pix_light.flatten()],
                outputs=[s.shape_colors.grad, s.light_direction.grad, s.light_intensity.grad],
                block_dim=BLOCK,
                device=dev,
                record_tape=False,
            )  # fmt: skip
