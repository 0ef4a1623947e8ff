"""The raster pass: per-pixel top-K queue of faces sorted by depth (no gradients).

Two paths give identical output:

* naive (``bin_size=0``): one thread per pixel tests every face of its mesh;
* binned (``bin_size > 0``): :mod:`warpraster.binning` builds compacted per-tile
  face lists, then one thread per pixel tests its tile's list (or, if the list
  overflowed, every face of the mesh). With K = 1, faces covering at most
  ``SMALL_FACE_PIXELS`` pixels are drawn face by face instead (two atomic-min
  passes) and only the larger ones are binned.

The queue is ordered by (depth, face index), a total order, so the order in
which faces are offered does not change the result. It lives in registers for
K <= 16 (kernels generated per size bucket) and in the output arrays for larger
K, so K is bounded by memory only. A last pass writes zbuf / bary / dists of
each slot; :mod:`warpraster.backward` registers the gradient on the tape.
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

from . import binning, variants
from .backward import FaceGradBuffers, record_backward
from .fragments import Fragments, allocate_fragments, fragment_values
from .geometry import (
    EPS,
    barycentric,
    clip_barycentric,
    edge_function,
    face_area,
    is_inside,
    perspective_correct,
    pixel_centre,
    point_triangle_dist2,
)
from .meshes import PackedMeshes, pack_meshes

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (on CUDA, FMA
# swapped two faces one ulp apart in depth on reference case p12).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})

_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- kernels
_FAR_VALUE = 3.0e38
_NO_FACE_VALUE = 2147483647
_FAR = wp.constant(_FAR_VALUE)  # empty queue slot depth (above any real depth)
_NO_FACE = wp.constant(_NO_FACE_VALUE)  # empty queue slot face (sorts after every face)
#: Largest K served by a register queue; larger K use the queue in the output arrays.
REGISTER_QUEUE_MAX_K = 16
_REGISTER_BUCKETS = (1, 2, 4, 8, 16)


@wp.func
def _finite3(v: wp.vec3) -> bool:
    return wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2])


@wp.func
def _drawn_face(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    mesh_first: wp.array(dtype=wp.int32),
    mesh_count: wp.array(dtype=wp.int32),
    num_meshes: int,
    cull_backfaces: int,
    f: int,
):
    """(owning mesh, or -1 if face f is never drawn; its three vertices)."""
    v0 = wp.vec3(0.0)
    v1 = wp.vec3(0.0)
    v2 = wp.vec3(0.0)
    # Owning mesh: the last non-empty mesh whose range starts at or before f.
    lo = int(0)
    hi = num_meshes - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mesh_first[mid] <= f:
            lo = mid
        else:
            hi = mid - 1
    m = lo
    while m > 0 and mesh_count[m] == 0:
        m -= 1
    if f < mesh_first[m] or f >= mesh_first[m] + mesh_count[m]:
        return -1, v0, v1, v2
    nv = verts.shape[0]
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    if i0 < 0 or i1 < 0 or i2 < 0 or i0 >= nv or i1 >= nv or i2 >= nv:
        return -1, v0, v1, v2
    v0 = verts[i0]
    v1 = verts[i1]
    v2 = verts[i2]
    if not (_finite3(v0) and _finite3(v1) and _finite3(v2)):
        return -1, v0, v1, v2
    area = face_area(wp.vec2(v0[0], v0[1]), wp.vec2(v1[0], v1[1]), wp.vec2(v2[0], v2[1]))
    if area <= EPS and area >= -EPS:
        return -1, v0, v1, v2
    if cull_backfaces != 0 and area < 0.0:
        return -1, v0, v1, v2
    if wp.min(wp.min(v0[2], v1[2]), v2[2]) < EPS:
        return -1, v0, v1, v2
    return m, v0, v1, v2


@wp.kernel
def _setup_faces(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    mesh_first: wp.array(dtype=wp.int32),
    mesh_count: wp.array(dtype=wp.int32),
    num_meshes: int,
    blur_radius: float,
    cull_backfaces: int,
    face_mesh: wp.array(dtype=wp.int32),
    face_bbox: wp.array(dtype=wp.vec4),
    face_verts: wp.array(dtype=wp.mat33),
):
    """Triangle setup, once per face: owning mesh (-1 if never drawn), blur-grown
    bbox (empty for faces never drawn) and a copy of the three vertices. Each
    output written once, the bbox in one 16-byte store (face_bbox is 16-byte
    aligned: a fresh allocation)."""
    f = wp.tid()
    m, v0, v1, v2 = _drawn_face(verts, faces, mesh_first, mesh_count, num_meshes, cull_backfaces, f)
    face_mesh[f] = m
    if m < 0:
        _store4(face_bbox, f, wp.vec4(_FAR, _FAR, -_FAR, -_FAR))
        return
    r = wp.sqrt(blur_radius)
    bb = wp.vec4(
        wp.min(wp.min(v0[0], v1[0]), v2[0]) - r,
        wp.min(wp.min(v0[1], v1[1]), v2[1]) - r,
        wp.max(wp.max(v0[0], v1[0]), v2[0]) + r,
        wp.max(wp.max(v0[1], v1[1]), v2[1]) + r,
    )
    _store4(face_bbox, f, bb)
    face_verts[f] = wp.matrix_from_rows(v0, v1, v2)  # rows: the vertices


@wp.struct
class _Pass:
    """Everything a raster pass reads (one struct keeps the kernel signatures short)."""

    face_mesh: wp.array(dtype=wp.int32)
    face_bbox: wp.array(dtype=wp.vec4)
    face_verts: wp.array(dtype=wp.mat33)
    neighbor: wp.array(dtype=wp.int32)
    mesh_first: wp.array(dtype=wp.int32)
    mesh_count: wp.array(dtype=wp.int32)
    height: int
    width: int
    faces_per_pixel: int
    blur_radius: float
    perspective: int
    clip_bary: int
    # bins ("tiles"): compacted per-tile face lists, see binning.py
    naive: int
    tile_h: int
    tile_w: int
    tiles_y: int
    tiles_x: int
    tile_count: wp.array(dtype=wp.int32)
    tile_offset: wp.array(dtype=wp.int32)
    tile_faces: wp.array(dtype=wp.int32)
    max_per_tile: int
    overflow: wp.array(dtype=wp.int32)
    # K = 1: the queue starts from the (depth, face) keys the small-face pass left
    seeded: int
    keys: wp.array(dtype=wp.uint64)
    # outputs, viewed as (N * H * W, K); zq is zbuf, also the depth queue of _offer
    pix_to_face: wp.array2d(dtype=wp.int32)
    zq: wp.array2d(dtype=wp.float32)
    bary: wp.array2d(dtype=wp.vec3)
    dists: wp.array2d(dtype=wp.float32)
    # the same outputs as flat arrays of 16-byte vectors (when ``wide``), written
    # through _store4: the output pass 0.27 -> 0.19 ms on an H200 at K = 8
    # (benchmarks/output_pass_probe.py, docs/PERF.md v15)
    wide: int
    pix_to_face4: wp.array(dtype=wp.vec4i)
    zq4: wp.array(dtype=wp.vec4)
    bary4: wp.array(dtype=wp.vec4)
    dists4: wp.array(dtype=wp.vec4)


@wp.func
def _test_face(ps: _Pass, f: int, p: wp.vec2):
    """(hit, z, squared distance or -1 if not computed) of face f at pixel centre p.

    Same decisions as PyTorch3D's kernel, in an order that stops early: bbox;
    then, without blur, the signs of the three edge functions (a pixel is inside
    only if each barycentric numerator has the sign of the area, so a sign
    mismatch rejects it without the divisions; a pass is re-decided exactly);
    depth; the edge distance only when the pixel is outside and blur could
    still keep it.
    """
    hit = False
    z = float(0.0)
    dist = float(-1.0)
    bb = ps.face_bbox[f]
    if not (p[0] > bb[2] or p[0] < bb[0] or p[1] > bb[3] or p[1] < bb[1]):
        m = ps.face_verts[f]
        a = wp.vec2(m[0, 0], m[0, 1])
        b = wp.vec2(m[1, 0], m[1, 1])
        c = wp.vec2(m[2, 0], m[2, 1])
        maybe = True
        if ps.blur_radius <= 0.0:
            area = edge_function(c, a, b) + EPS
            e0 = edge_function(p, b, c)
            e1 = edge_function(p, c, a)
            e2 = edge_function(p, a, b)
            if area > 0.0:
                maybe = e0 > 0.0 and e1 > 0.0 and e2 > 0.0
            else:
                maybe = e0 < 0.0 and e1 < 0.0 and e2 < 0.0
        if maybe:
            bary = barycentric(p, a, b, c)
            if ps.perspective != 0:
                bary = perspective_correct(bary, m[0, 2], m[1, 2], m[2, 2])
            inside = is_inside(bary)
            if inside or ps.blur_radius > 0.0:
                if ps.clip_bary != 0:
                    bary = clip_barycentric(bary)
                z = bary[0] * m[0, 2] + bary[1] * m[1, 2] + bary[2] * m[2, 2]
                if z >= 0.0:
                    if inside:
                        hit = True
                    else:
                        dist = point_triangle_dist2(p, a, b, c)
                        hit = dist < ps.blur_radius
    return hit, z, dist


@wp.func
def _test_face_sharp(ps: _Pass, f: int, p: wp.vec2):
    """_test_face without blur: the bbox and edge-sign tests computed for every
    face (no branch between them, so the lanes of a warp stay together), then the
    exact decision where both pass. Used by the queue kernels compiled for
    blur = 0: measured on an H200, queue pass 0.285 -> 0.271 ms at K = 8 (no
    change at K = 1 and 4)."""
    hit = False
    z = float(0.0)
    bb = ps.face_bbox[f]
    m = ps.face_verts[f]
    a = wp.vec2(m[0, 0], m[0, 1])
    b = wp.vec2(m[1, 0], m[1, 1])
    c = wp.vec2(m[2, 0], m[2, 1])
    in_box = p[0] <= bb[2] and p[0] >= bb[0] and p[1] <= bb[3] and p[1] >= bb[1]
    area = edge_function(c, a, b) + EPS
    e0 = edge_function(p, b, c)
    e1 = edge_function(p, c, a)
    e2 = edge_function(p, a, b)
    pos = area > 0.0 and e0 > 0.0 and e1 > 0.0 and e2 > 0.0
    neg = area <= 0.0 and e0 < 0.0 and e1 < 0.0 and e2 < 0.0
    if in_box and (pos or neg):
        bary = barycentric(p, a, b, c)
        if ps.perspective != 0:
            bary = perspective_correct(bary, m[0, 2], m[1, 2], m[2, 2])
        if is_inside(bary):
            if ps.clip_bary != 0:
                bary = clip_barycentric(bary)
            z = bary[0] * m[0, 2] + bary[1] * m[1, 2] + bary[2] * m[2, 2]
            hit = z >= 0.0
    return hit, z, float(-1.0)


@wp.func
def _face_dist(ps: _Pass, f: int, p: wp.vec2) -> float:
    m = ps.face_verts[f]
    return point_triangle_dist2(
        p, wp.vec2(m[0, 0], m[0, 1]), wp.vec2(m[1, 0], m[1, 1]), wp.vec2(m[2, 0], m[2, 1])
    )


@wp.func
def _before(za: float, fa: int, zb: float, fb: int) -> bool:
    """The queue's order: ascending depth, exact ties by ascending face index."""
    return za < zb or (za == zb and fa < fb)


@wp.func
def _locate_tile_pixel(ps: _Pass, tid: int) -> wp.vec4i:
    """Thread -> (image, tile, row, column): consecutive threads sweep one tile,
    so a thread block reads the same face list (cache broadcast)."""
    tt = ps.tile_h * ps.tile_w
    local = tid % tt
    tile = tid // tt
    per_image = ps.tiles_y * ps.tiles_x
    n = tile // per_image
    tile_in_image = tile - n * per_image
    yi = (tile_in_image // ps.tiles_x) * ps.tile_h + local // ps.tile_w
    xi = (tile_in_image % ps.tiles_x) * ps.tile_w + local % ps.tile_w
    return wp.vec4i(n, tile, yi, xi)


@wp.func
def _face_range(ps: _Pass, n: int, tile: int, first_pixel: bool) -> wp.vec3i:
    """(begin, end, indirect) of the faces to test for a tile: its list, or all
    faces of the mesh when the pass is naive or the list overflowed."""
    if ps.naive == 0:
        count = ps.tile_count[tile]
        start = ps.tile_offset[tile]
        if count <= ps.max_per_tile and start + count <= ps.tile_faces.shape[0]:
            return wp.vec3i(start, start + count, 1)
        if first_pixel:
            wp.atomic_add(ps.overflow, 0, 1)
    first = ps.mesh_first[n]
    return wp.vec3i(first, first + ps.mesh_count[n], 0)


@wp.func
def _write_slot(ps: _Pass, q: int, s: int, p: wp.vec2):
    """Writes the fragment values of slot s of output row q (pixel centre p):
    its face's, or the -1 fill (its pix_to_face, -1 where empty, stays)."""
    z, bary, d = _face_values(ps, ps.pix_to_face[q, s], p)
    ps.zq[q, s] = z
    ps.bary[q, s] = bary
    ps.dists[q, s] = d


@wp.func
def _face_values(ps: _Pass, f: int, p: wp.vec2):
    """(zbuf, bary, dist) of face f at pixel centre p, or the -1 fill if f < 0."""
    z = float(-1.0)
    bary = wp.vec3(-1.0, -1.0, -1.0)
    d = float(-1.0)
    if f >= 0:
        m = ps.face_verts[f]
        z, bary, d = fragment_values(
            p,
            wp.vec3(m[0, 0], m[0, 1], m[0, 2]),
            wp.vec3(m[1, 0], m[1, 1], m[1, 2]),
            wp.vec3(m[2, 0], m[2, 1], m[2, 2]),
            ps.perspective,
            ps.clip_bary,
        )
    return z, bary, d


# 16-byte accesses: Warp's vectors are 4-byte aligned, so ``a[i] = v`` on a vec4
# array compiles to four 4-byte stores (lanes 16 bytes apart, partial sectors per
# instruction); these cast to CUDA's 16-byte-aligned float4 / int4 (the views
# are 16-byte aligned, see _wide_views) for one coalesced 16-byte access per lane.
@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
reinterpret_cast<float4*>(a.data)[i] = make_float4(v[0], v[1], v[2], v[3]);
#else
a.data[i] = v;
#endif
"""
)
def _store4(a: wp.array(dtype=wp.vec4), i: int, v: wp.vec4): ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
reinterpret_cast<int4*>(a.data)[i] = make_int4(v[0], v[1], v[2], v[3]);
#else
a.data[i] = v;
#endif
"""
)
def _store4i(a: wp.array(dtype=wp.vec4i), i: int, v: wp.vec4i): ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
int4 t = reinterpret_cast<const int4*>(a.data)[i];
return wp::vec4i(t.x, t.y, t.z, t.w);
#else
return a.data[i];
#endif
"""
)
def _load4i(a: wp.array(dtype=wp.vec4i), i: int) -> wp.vec4i: ...


@wp.func
def _write_group(ps: _Pass, e0: int, f: wp.vec4i):
    """Slots e0 .. e0 + 3 of the flat outputs (e0 % 4 == 0, K % 4 == 0: one
    pixel), holding faces f: their values in 16-byte stores (one for zbuf, one
    for dists, three for bary). The pixel centre is computed once (its integer
    and float divisions were most of the pass's instructions when computed per
    slot)."""
    g = e0 // 4
    p = _flat_pixel(ps, e0)
    z0, b0, d0 = _face_values(ps, f[0], p)
    z1, b1, d1 = _face_values(ps, f[1], p)
    z2, b2, d2 = _face_values(ps, f[2], p)
    z3, b3, d3 = _face_values(ps, f[3], p)
    _store4(ps.zq4, g, wp.vec4(z0, z1, z2, z3))
    _store4(ps.dists4, g, wp.vec4(d0, d1, d2, d3))
    _store4(ps.bary4, 3 * g, wp.vec4(b0[0], b0[1], b0[2], b1[0]))
    _store4(ps.bary4, 3 * g + 1, wp.vec4(b1[1], b1[2], b2[0], b2[1]))
    _store4(ps.bary4, 3 * g + 2, wp.vec4(b2[2], b3[0], b3[1], b3[2]))


@wp.func
def _flat_pixel(ps: _Pass, e: int) -> wp.vec2:
    """Centre of the pixel holding flat output slot e."""
    r = (e // ps.faces_per_pixel) % (ps.height * ps.width)
    return pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)


# (depth, face) packed into one 64-bit key: depth bits high, face index low. For
# depths >= 0 the IEEE bits order as the floats do, so one unsigned atomic_min
# keeps the queue's (depth, face index) minimum. -0.0 is folded into +0.0 (equal
# depths must tie on the index).
@wp.func_native("union { float f; uint32_t u; } c; c.f = (x == 0.0f) ? 0.0f : x; return c.u;")
def _depth_bits(x: float) -> wp.uint32: ...


@wp.func_native("union { float f; uint32_t u; } c; c.u = x; return c.f;")
def _bits_depth(x: wp.uint32) -> float: ...


#: Key of a pixel no small face covers (decodes to no face).
_EMPTY_KEY_VALUE = 2**64 - 1
_EMPTY_KEY = wp.constant(wp.uint64(_EMPTY_KEY_VALUE))


@wp.func
def _depth_key(z: float, f: int) -> wp.uint64:
    return (wp.uint64(_depth_bits(z)) << wp.uint64(32)) | wp.uint64(f)


@wp.kernel
def _small_faces_k1(ps: _Pass, small: int, lanes: int):
    """K = 1, faces covering at most ``small`` pixels: ``lanes`` threads per face
    share its pixel box, and each covered pixel takes the atomic minimum of the
    face's (depth, index) key: the queue's order, in one pass whose work follows
    the covered pixels rather than the faces per tile."""
    t = wp.tid()
    f = t // lanes
    lane = t - f * lanes
    m = ps.face_mesh[f]
    if m < 0:
        return
    box = binning.pixel_box(ps.face_bbox[f], ps.height, ps.width)
    npix = binning.box_pixels(box)
    if npix == 0 or npix > small:
        return
    bw = box[3] - box[2] + 1
    for i in range(lane, npix, lanes):
        yi = box[0] + i // bw
        xi = box[2] + i % bw
        p = pixel_centre(yi, xi, ps.height, ps.width)
        hit, z, dist = _test_face(ps, f, p)
        # the register queue accepts (z, f) only before its empty slot (_FAR, _NO_FACE)
        if hit and _before(z, f, _FAR, _NO_FACE):
            q = (m * ps.height + yi) * ps.width + xi
            wp.atomic_min(ps.keys, q, _depth_key(z, f))


#: K = 1 faces covering at most this many pixels are drawn face by face.
SMALL_FACE_PIXELS = 64
#: Threads per face in the small-face pass (None: chosen by small_face_lanes).
SMALL_FACE_LANES: int | None = None


def small_face_lanes(num_faces: int, num_pixels: int) -> int:
    """Threads sharing one small face's pixel box: more when faces are large
    relative to pixels (fewer faces to keep the GPU busy, longer walks)."""
    if SMALL_FACE_LANES is not None:
        lanes = int(SMALL_FACE_LANES)
    else:
        per_face = num_pixels / max(num_faces, 1)
        lanes = 1
        while lanes < 8 and 2 * lanes <= per_face / 2:
            lanes *= 2
    while lanes > 1 and num_faces * lanes > _INT32_MAX:
        lanes //= 2
    return lanes


def _make_write_outputs(wide: bool, max_regs: int | None, flags: tuple[int, ...] | None):
    """zbuf, bary_coords, dists of every slot from pix_to_face, one thread per slot
    or, ``wide``, per four slots written in 16-byte stores (``flags`` =
    (perspective, clip_bary[, K when wide]) compiled in, or None: read at run time).

    A separate pass: measured on an H200, computing them inside the queue
    kernels (more registers) or one thread per pixel (strided stores) was 2-3x
    slower than this.
    """

    def write_outputs(ps_in: _Pass):
        ps = ps_in
        if wp.static(flags is not None):
            ps.perspective = wp.static(flags[0])
            ps.clip_bary = wp.static(flags[1])
            if wp.static(wide):
                # K compiled in too: the slot -> pixel division becomes a shift
                ps.faces_per_pixel = wp.static(flags[2])
        i = wp.tid()
        if wp.static(wide):
            _write_group(ps, 4 * i, _load4i(ps.pix_to_face4, i))
        else:
            k = ps.faces_per_pixel
            q = i // k
            s = i - q * k
            r = q % (ps.height * ps.width)
            p = pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)
            _write_slot(ps, q, s, p)

    base = "write_outputs4" if wide else "write_outputs"
    write_outputs.__name__ = write_outputs.__qualname__ = variants.variant_name(base, flags)
    return wp.kernel(
        write_outputs,
        enable_backward=False,
        module="unique",
        module_options={"fuse_fp": False},
        cuda_max_registers=max_regs,
    )


def _write_outputs_kernel(
    device, perspective: bool, clip_bary: bool, wide: bool, k: int
) -> wp.Kernel:
    flags = (perspective, clip_bary, k) if wide else (perspective, clip_bary)
    regs = MAX_REGISTERS.get("outputs4" if wide else "outputs")
    return variants.kernel_for("outputs", _make_write_outputs, device, flags, wide, regs)


#: CUDA: register cap per thread of a kernel (None: the compiler's choice), by
#: "queue<bucket>", "outputs", "outputs4". None everywhere, measured on an H200:
#: outputs4 capped at 64 helped (0.222 -> 0.192 ms at K = 8) while each slot
#: computed its pixel centre; with it computed once per group the uncapped pass
#: (80 registers) is faster: graph forward 0.419 -> 0.401 ms (ico5 x8 K = 8).
MAX_REGISTERS: dict[str, int | None] = {}
#: Outputs written four slots per 16-byte store where K is a multiple of 4.
WIDE_OUTPUTS = True


def _make_register_kernel(kc: int, max_regs: int | None, flags: tuple[int, int, int] | None):
    """Fine/naive pass whose queue of ``kc`` slots lives in registers (kc <= 16).

    Serves every K <= kc: the first K slots of a top-kc queue are the top-K.
    ``flags`` = (perspective, clip_bary, blur > 0) compiles those in as
    constants; None reads them from the pass at run time.

    Measured on an H200: two pixels per thread, each face record loaded once
    for both, was 1.1x slower at K = 8 and 4 and no faster at K = 1; loading
    the next face's records while testing the current one was no faster.
    """
    qf_t = wp.types.vector(length=kc, dtype=wp.float32)
    qi_t = wp.types.vector(length=kc, dtype=wp.int32)

    def insert(qz, qf, z: float, f: int, size: int):
        """Sorted insertion, unrolled: entries after (z, f) shift up by one. Slots
        from ``size`` on are empty: the steps above it are skipped (they would
        only move empty slots), so a short queue costs a few steps, not kc."""
        for s in range(kc - 1, 0, -1):
            if s <= size:
                if _before(z, f, qz[s - 1], qf[s - 1]):
                    qz[s] = qz[s - 1]
                    qf[s] = qf[s - 1]
                elif _before(z, f, qz[s], qf[s]):
                    qz[s] = z
                    qf[s] = f
        if _before(z, f, qz[0], qf[0]):
            qz[0] = z
            qf[0] = f
        return qz, qf

    def seed(ps: _Pass, q: int, qz, qf):
        """The queue's start (K = 1: the small-face pass's key) and its size."""
        size = int(0)
        if ps.seeded != 0:
            key = ps.keys[q]
            if key != _EMPTY_KEY:
                qz[0] = _bits_depth(wp.uint32(key >> wp.uint64(32)))
                qf[0] = int(wp.uint32(key & wp.uint64(0xFFFFFFFF)))
                size = 1
        return qz, qf, size

    def store(ps: _Pass, q: int, qf):
        """Writes the pix_to_face row (qf: empty slots already -1)."""
        if wp.static(kc % 4 == 0):
            if ps.wide != 0 and ps.faces_per_pixel == kc:
                for g in range(kc // 4):
                    v = wp.vec4i(qf[4 * g], qf[4 * g + 1], qf[4 * g + 2], qf[4 * g + 3])
                    _store4i(ps.pix_to_face4, q * wp.static(kc // 4) + g, v)
                return
        for s in range(kc):
            if s < ps.faces_per_pixel:
                ps.pix_to_face[q, s] = qf[s]

    # annotations set here: the queue types are local to this call
    # (``from __future__ import annotations`` would leave them unresolvable strings)
    insert.__annotations__ = {"qz": qf_t, "qf": qi_t, "z": float, "f": int, "size": int}
    seed.__annotations__ = {"ps": _Pass, "q": int, "qz": qf_t, "qf": qi_t}
    store.__annotations__ = {"ps": _Pass, "q": int, "qf": qi_t}
    insert = wp.func(insert, module="unique")
    seed = wp.func(seed, module="unique")
    store = wp.func(store, module="unique")

    def raster_register_queue(ps_in: _Pass):
        ps = ps_in
        if wp.static(flags is not None):
            # compile-time flags: dead paths drop out (fewer registers, more warps)
            ps.perspective = wp.static(flags[0])
            ps.clip_bary = wp.static(flags[1])
            if wp.static(flags[2] == 0):
                ps.blur_radius = 0.0
        tid = wp.tid()
        loc = _locate_tile_pixel(ps, tid)
        n = loc[0]
        yi = loc[2]
        xi = loc[3]
        if yi < ps.height and xi < ps.width:
            p = pixel_centre(yi, xi, ps.height, ps.width)
            rng = _face_range(ps, n, loc[1], yi % ps.tile_h == 0 and xi % ps.tile_w == 0)
            q = (n * ps.height + yi) * ps.width + xi
            qz, qf, size = seed(ps, q, qf_t(_FAR), qi_t(_NO_FACE))
            for j in range(rng[0], rng[1]):
                f = j
                if rng[2] != 0:
                    f = ps.tile_faces[j]
                hit = False
                z = float(0.0)
                if wp.static(flags is not None and flags[2] == 0):
                    hit, z, dist = _test_face_sharp(ps, f, p)
                else:
                    hit, z, dist = _test_face(ps, f, p)
                if hit and _before(z, f, qz[kc - 1], qf[kc - 1]):
                    qz, qf = insert(qz, qf, z, f, size)
                    size = wp.min(size + 1, kc)
            for s in range(kc):
                if qf[s] == _NO_FACE:
                    qf[s] = -1
            store(ps, q, qf)

    # A distinct name per variant: readable profiles, and kernels generated from one
    # function stay apart wherever Warp keys them by name (CPU graph capture does).
    name = variants.variant_name(f"raster_queue_{kc}", flags)
    raster_register_queue.__name__ = raster_register_queue.__qualname__ = name
    return wp.kernel(
        raster_register_queue,
        enable_backward=False,
        module="unique",
        module_options={"fuse_fp": False},
        cuda_max_registers=max_regs,
    )


def _register_kernel(k: int, device, flags: tuple[int, int, int]) -> wp.Kernel:
    kc = next(b for b in _REGISTER_BUCKETS if b >= k)
    regs = MAX_REGISTERS.get(f"queue{kc}")
    return variants.kernel_for("queue", _make_register_kernel, device, flags, kc, regs)


@wp.func
def _insert(ps: _Pass, q: int, f: int, z: float, size: int) -> int:
    """Sorted insertion of (z, f) into the queue in row q; drops the last entry
    when the queue is full. Returns the new size."""
    k = ps.faces_per_pixel
    if size == k:
        if not _before(z, f, ps.zq[q, k - 1], ps.pix_to_face[q, k - 1]):
            return size
    pos = size
    if size == k:
        pos = k - 1
    else:
        size += 1
    while pos > 0:
        zp = ps.zq[q, pos - 1]
        fp = ps.pix_to_face[q, pos - 1]
        if _before(z, f, zp, fp):
            ps.zq[q, pos] = zp
            ps.pix_to_face[q, pos] = fp
            pos -= 1
        else:
            break
    ps.zq[q, pos] = z
    ps.pix_to_face[q, pos] = f
    return size


@wp.func
def _offer(ps: _Pass, q: int, f: int, p: wp.vec2, size: int) -> int:
    """Offers face f to the queue held in row q of the output arrays (any K).

    PyTorch3D's rule for the two halves of a face split by near-plane clipping,
    which depends on the order faces are offered in (ascending index, ensured
    by the caller): if f's neighbour is in the queue now, f takes its slot when
    f is strictly nearer in xy, else f is dropped; otherwise f is offered as
    usual.
    """
    hit, z, dist = _test_face(ps, f, p)
    if not hit:
        return size
    g = ps.neighbor[f]
    if g >= 0:
        slot = int(-1)
        for s in range(size):
            if ps.pix_to_face[q, s] == g:
                slot = s
        if slot >= 0:
            d_f = dist
            if d_f < 0.0:
                d_f = _face_dist(ps, f, p)
            if d_f < _face_dist(ps, g, p):
                # remove g, then insert f (the queue cannot overflow)
                for s in range(slot, size - 1):
                    ps.zq[q, s] = ps.zq[q, s + 1]
                    ps.pix_to_face[q, s] = ps.pix_to_face[q, s + 1]
                size = _insert(ps, q, f, z, size - 1)
            return size
    return _insert(ps, q, f, z, size)


@wp.kernel
def _raster_output_queue(ps: _Pass):
    """Fine/naive pass for any K: the sorted queue lives in the output rows."""
    loc = _locate_tile_pixel(ps, wp.tid())
    n = loc[0]
    yi = loc[2]
    xi = loc[3]
    if yi >= ps.height or xi >= ps.width:
        return
    p = pixel_centre(yi, xi, ps.height, ps.width)
    rng = _face_range(ps, n, loc[1], yi % ps.tile_h == 0 and xi % ps.tile_w == 0)
    q = (n * ps.height + yi) * ps.width + xi
    size = int(0)
    for j in range(rng[0], rng[1]):
        f = j
        if rng[2] != 0:
            f = ps.tile_faces[j]
        size = _offer(ps, q, f, p, size)
    for s in range(size, ps.faces_per_pixel):
        ps.pix_to_face[q, s] = -1


@wp.kernel
def _raster_naive_at(ps: _Pass, pixels: wp.array(dtype=wp.vec3i)):
    """Naive pass for a list of (image, row, column) pixels; row i of the outputs."""
    i = wp.tid()
    px = pixels[i]
    n = px[0]
    p = pixel_centre(px[1], px[2], ps.height, ps.width)
    first = ps.mesh_first[n]
    size = int(0)
    for f in range(first, first + ps.mesh_count[n]):
        size = _offer(ps, i, f, p, size)
    for s in range(size, ps.faces_per_pixel):
        ps.pix_to_face[i, s] = -1


# ----------------------------------------------------------------------------- settings
def parse_image_size(image_size) -> tuple[int, int]:
    """``int`` or ``(H, W)`` -> (H, W), each >= 1."""
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        h = w = int(image_size)
    else:
        try:
            h, w = (int(s) for s in image_size)
        except (TypeError, ValueError):
            raise TypeError(f"image_size must be an int or (H, W), got {image_size!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be >= 1 on both sides, got {(h, w)}")
    return h, w


def tile_shape(bin_size: int | None, faces_per_pixel: int) -> tuple[int, int]:
    """(rows, columns) of pixels of a tile.

    ``bin_size=b``: b x b. The naive pass (0) runs the same kernels over 16 x 16
    tiles without face lists (one thread block reads the same face at a time).
    ``None``: 8 x 8 for K = 1, 4 x 8 (one 32-thread warp) for K > 1. Measured on
    an H200 with the benchmark scenes (icospheres of 5k to 1.3M faces, 128 to
    1024 pixels): square 8 px tiles beat 16 and 32 px on every scene, by 1.2x to
    2.5x (short lists; the coarse pass's extra (face, tile) pairs cost less than
    the fine pass saves); 4 x 8 beat 8 x 8 by 2-4% at K = 4 and 8 (31% fewer
    (warp, face) iterations) and lost 3-7% at K = 1, whose tile pass serves only
    the faces larger than 64 pixels (docs/PERF.md, v14).
    """
    if bin_size is None:
        return (8, 8) if faces_per_pixel == 1 else (4, 8)
    b = int(bin_size)
    return (b, b) if b > 0 else (16, 16)


def default_max_faces_per_bin(num_faces: int) -> int:
    """PyTorch3D's default capacity, capped at the face count (a list never needs more)."""
    return max(1, min(num_faces, max(10000, num_faces // 5)))


# ----------------------------------------------------------------------------- workspace
def array_key(a: wp.array) -> tuple:
    """What a kernel sees of an array: its address, shape, strides and type."""
    return (a.ptr, a.shape, a.strides, a.dtype)


def _optional_key(a: wp.array | None) -> tuple | None:
    return None if a is None else array_key(a)


class LaunchCache:
    """Recorded launches (``wp.Launch``) of one workspace, replayed while their
    arguments are unchanged.

    Saves host time only (the device work is the same): packing a launch's
    arguments costs tens of microseconds, which an eager render would pay for
    each of its kernels on every call. Arrays are compared by address, shape,
    strides and type; a struct argument needs an explicit ``key``.
    """

    def __init__(self, device):
        self.device = device
        self._cmds: dict[str, tuple] = {}

    def __call__(self, name, kernel, dim, inputs, outputs=(), *, key=None, block_dim=None):
        if key is None:
            key = tuple(array_key(a) if isinstance(a, wp.array) else a for a in (*inputs, *outputs))
        key = (kernel, dim, block_dim, key)
        hit = self._cmds.get(name)
        if hit is None or hit[0] != key:
            kw = {} if block_dim is None else {"block_dim": block_dim}
            cmd = wp.launch(
                kernel, dim=dim, inputs=list(inputs), outputs=list(outputs), device=self.device,
                record_tape=False, record_cmd=True, **kw,
            )  # fmt: skip
            hit = self._cmds[name] = (key, cmd)
        hit[1].launch()


#: Replay repeated render calls as one graph: None = on CUDA (where it saves the
#: host time of ~10 launches per call), True = on every device (the cpu device's
#: graphs are experimental in Warp 1.19: tests), False = never.
CALL_GRAPHS: bool | None = None


class CallGraph:
    """A workspace's render launches captured once and replayed as one graph.

    A call whose key (its arrays by address, shape, strides and type; its flags;
    the module settings) equals the previous call's is captured, then replayed
    while the key stays the same: one graph launch instead of ~10 kernel
    launches and memsets from Python. A first call, or one whose key changed,
    launches as usual (so inputs that change every call never pay a capture).
    A graph keeps the pointers it saw: what it reads is whatever the arrays
    hold at replay, as for any launch.
    """

    def __init__(self, device):
        self.device = device
        self._seen = None
        self._key = None
        self._graph = None

    def enabled(self) -> bool:
        on = self.device.is_cuda if CALL_GRAPHS is None else bool(CALL_GRAPHS)
        if not on or self.device.is_capturing:
            return False
        # stream-ordered allocations inside the capture (the prefix sum's scratch)
        return self.device.is_cpu or wp.is_mempool_enabled(self.device)

    def __call__(self, key, launch_all) -> None:
        if not self.enabled():
            launch_all()
            return
        if self._graph is not None and key == self._key:
            wp.capture_launch(self._graph)
            return
        if key == self._seen:
            # the first call with this key loaded every module it launches
            with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
                launch_all()
            self._graph, self._key = cap.graph, key
            wp.capture_launch(self._graph)
            return
        self._graph = self._key = None
        self._seen = key
        launch_all()


class RasterWorkspace:
    """Buffers of one rasterization configuration, allocated once and reused.

    A render call that is given a workspace allocates nothing and reads nothing
    back to the host, so it can be captured in a CUDA graph. The fragments it
    returns are this workspace's output arrays: keep one workspace per frame
    recorded on a tape (a later call overwrites them). With ``deterministic``
    the backward to the vertices is atomic-free and bit-identical run after run
    (face-centric sums, a vertex gather instead of atomics; see warpraster.backward).
    """

    def __init__(
        self,
        *,
        num_meshes: int,
        num_faces: int,
        image_size,
        faces_per_pixel: int,
        bin_size: int | None = None,
        max_faces_per_bin: int | None = None,
        device=None,
        requires_grad: bool = False,
        deterministic: bool = False,
    ):
        h, w = parse_image_size(image_size)
        self.device = wp.get_device(device)
        self.num_meshes = int(num_meshes)
        self.num_faces = int(num_faces)
        self.image_size = (h, w)
        self.faces_per_pixel = int(faces_per_pixel)
        self.bin_size = None if bin_size is None else int(bin_size)
        self.binned = self.bin_size != 0
        self.requires_grad = bool(requires_grad)
        f_alloc = max(self.num_faces, 1)
        self.face_mesh = wp.empty(f_alloc, dtype=wp.int32, device=self.device)
        self.face_bbox = wp.empty(f_alloc, dtype=wp.vec4, device=self.device)
        self.face_verts = wp.empty(f_alloc, dtype=wp.mat33, device=self.device)
        # the split-partner index of meshes without split faces (-1 for all)
        self.no_neighbors = wp.full(f_alloc, -1, dtype=wp.int32, device=self.device)
        self.tile_h, self.tile_w = tile_shape(self.bin_size, self.faces_per_pixel)
        self.tiles_y, self.tiles_x = binning.tile_grid(h, w, self.tile_h, self.tile_w)
        num_tiles = self.num_meshes * self.tiles_y * self.tiles_x
        if self.binned:
            if max_faces_per_bin is None:
                self.max_faces_per_bin = max(self.num_faces, 1)
                capacity = binning.default_capacity(self.num_faces, num_tiles)
            else:
                self.max_faces_per_bin = int(max_faces_per_bin)
                capacity = min(
                    num_tiles * self.max_faces_per_bin,
                    binning.default_capacity(self.num_faces, num_tiles),
                )
            # the counters zeroed before each call, in one buffer (one memset):
            # tile counts, tile cursors, the overflow count
            self._counters = wp.zeros(2 * num_tiles + 1, dtype=wp.int32, device=self.device)
            self.tile_count = self._counters[:num_tiles]
            self.tile_cursor = self._counters[num_tiles : 2 * num_tiles]
            self.overflow = self._counters[2 * num_tiles :]
            self.tile_offset = wp.zeros(num_tiles, dtype=wp.int32, device=self.device)
            self.tile_faces = wp.zeros(capacity, dtype=wp.int32, device=self.device)
        else:
            self.max_faces_per_bin = 0
            self.overflow = self._counters = wp.zeros(1, dtype=wp.int32, device=self.device)
            self.tile_count = self.tile_offset = self.tile_cursor = self.tile_faces = wp.zeros(
                1, dtype=wp.int32, device=self.device
            )
        self.fragments = allocate_fragments(
            self.num_meshes, h, w, self.faces_per_pixel, self.device, self.requires_grad
        )
        self.fragments._overflow = self.overflow if self.binned else None
        # K = 1 binned: one (depth, face) key per pixel for the small-face pass
        key_count = self.num_meshes * h * w if self.faces_per_pixel == 1 and self.binned else 1
        self.depth_keys = wp.empty(key_count, dtype=wp.uint64, device=self.device)
        self.launches = LaunchCache(self.device)
        self.call_graph = CallGraph(self.device)
        self._pass = None
        self.deterministic = bool(deterministic)
        self.face_grads = FaceGradBuffers(
            self.num_faces, self.device, self.deterministic, self.fragments.shape
        )

    def pass_for(self, meshes, blur_radius, perspective, clip_bary, *, seeded, sorted_tiles):
        """The raster passes' argument struct for these meshes and flags, and its
        key; rebuilt only when one of them changed (it packs ~30 fields)."""
        key = (
            _optional_key(meshes.clipped_faces_neighbor_idx),
            array_key(meshes.mesh_to_face_first_idx),
            array_key(meshes.num_faces_per_mesh),
            float(blur_radius), bool(perspective), bool(clip_bary), bool(seeded),
            bool(sorted_tiles),
        )  # fmt: skip
        if self._pass is None or self._pass[1] != key:
            out = self.fragments
            ps = _make_pass(
                meshes, self, blur_radius, perspective, clip_bary, out.pix_to_face, out.zbuf,
                out.bary_coords, out.dists,
            )  # fmt: skip
            ps.seeded = int(seeded)
            if sorted_tiles:
                ps.max_per_tile = min(ps.max_per_tile, binning.MAX_SORTED_TILE)
            self._pass = (ps, key)
        return self._pass

    def matches(self, *, num_meshes, num_faces, image_size, faces_per_pixel, bin_size, device):
        return (
            self.num_meshes == num_meshes
            and self.num_faces == num_faces
            and self.image_size == tuple(image_size)
            and self.faces_per_pixel == faces_per_pixel
            and self.bin_size == (None if bin_size is None else int(bin_size))
            and self.device == wp.get_device(device)
        )


# ----------------------------------------------------------------------------- entry
def _check_settings(faces_per_pixel, blur_radius, bin_size, max_faces_per_bin):
    if isinstance(faces_per_pixel, bool) or not isinstance(faces_per_pixel, (int, np.integer)):
        raise TypeError(f"faces_per_pixel must be an int, got {faces_per_pixel!r}")
    if faces_per_pixel < 1:
        raise ValueError(f"faces_per_pixel must be >= 1, got {faces_per_pixel}")
    blur = float(blur_radius)
    if not math.isfinite(blur) or blur < 0.0:
        raise ValueError(f"blur_radius must be finite and >= 0, got {blur_radius}")
    if bin_size is not None:
        if isinstance(bin_size, bool) or not isinstance(bin_size, (int, np.integer)):
            raise TypeError(f"bin_size must be None or an int, got {bin_size!r}")
        if bin_size < 0:
            raise ValueError(f"bin_size must be None, 0 (naive) or > 0, got {bin_size}")
    if max_faces_per_bin is not None:
        if isinstance(max_faces_per_bin, bool) or not isinstance(
            max_faces_per_bin, (int, np.integer)
        ):
            raise TypeError(f"max_faces_per_bin must be None or an int, got {max_faces_per_bin!r}")
        if max_faces_per_bin < 1:
            raise ValueError(f"max_faces_per_bin must be >= 1, got {max_faces_per_bin}")


def rasterize_meshes(
    verts,
    faces,
    mesh_to_face_first_idx,
    num_faces_per_mesh,
    *,
    image_size=256,
    blur_radius: float = 0.0,
    faces_per_pixel: int = 8,
    bin_size: int | None = None,
    max_faces_per_bin: int | None = None,
    perspective_correct: bool = False,
    clip_barycentric_coords: bool = False,
    cull_backfaces: bool = False,
    clipped_faces_neighbor_idx=None,
    z_clip_value: float | None = None,
    cull_to_frustum: bool = False,
    workspace: RasterWorkspace | None = None,
    validate: bool = True,
    deterministic: bool = False,
) -> Fragments:
    """Rasterizes a packed batch of triangle meshes, as PyTorch3D's ``rasterize_meshes``.

    Each mesh n of the batch is drawn into its own H x W image; every pixel keeps
    the K nearest faces that cover it (or come within ``blur_radius`` of it).

    Args:
        verts: (V, 3) vertices in NDC (x left, y up) with z = depth: a
            ``wp.array`` of ``vec3`` (its ``.grad`` receives gradients when the
            call is recorded on a ``wp.Tape``), a (V, 3) float32 ``wp.array``
            (reinterpreted in place), or a NumPy array (copied to Warp's default
            device).
        faces: (F, 3) int vertex indices into ``verts`` (packed, global).
        mesh_to_face_first_idx: (N,) first face of each mesh.
        num_faces_per_mesh: (N,) face count of each mesh (0 allowed).
        image_size: ``int`` or ``(H, W)``; non-square images keep square pixels.
        blur_radius: squared NDC distance within which a face outside a pixel
            still covers it (the bounding box grows by its square root).
        faces_per_pixel: K >= 1. Bounded only by memory (N*H*W*K < 2**31): up
            to 16 the queue is held in registers, beyond that in the outputs.
        bin_size: None = bins measured fastest (8 x 8 pixels for K = 1, 4 rows
            x 8 columns for K > 1), 0 = naive, > 0 = coarse-to-fine with square
            bins of that many pixels. The output is identical.
        max_faces_per_bin: most faces a bin's list may hold (None = no per-bin
            cap; the shared list still has a fixed capacity, see
            :func:`warpraster.binning.default_capacity`). An overflowing bin
            still renders exactly: its pixels fall back to all faces of the
            mesh; ``Fragments.overflowed_bins()`` says how many bins did.
        perspective_correct: perspective-correct barycentrics (z = view depth).
        clip_barycentric_coords: clamp negative barycentrics to 0, renormalise.
        cull_backfaces: skip faces that are clockwise in NDC xy (PyTorch3D's rule).
        clipped_faces_neighbor_idx: (F,) index of the other half of a face split
            by near-plane clipping, -1 for none (the default).
        z_clip_value: split faces crossing the plane z = z_clip_value and drop
            the parts in front of it (None = no clipping).
        cull_to_frustum: drop faces wholly outside the NDC view frustum.
        workspace: reusable buffers (:class:`RasterWorkspace`; with clipping or
            frustum culling a :class:`~warpraster.clip.ClipWorkspace`). With
            one, the call allocates nothing; without, one is made for this call.
        validate: check face indices and offsets on the host (a device read).
            Pass False in a captured loop once the topology has been checked.
        deterministic: atomic-free backward, bit-identical gradients run after
            run (slower, more memory). A given workspace must have been made
            with ``deterministic=True``.

    Returns:
        :class:`Fragments` (``pix_to_face``, ``zbuf``, ``bary_coords``, ``dists``).

    Non-finite vertices: a face with any NaN or inf vertex coordinate is never
    drawn (it covers no pixel and gets no gradient); other faces are unaffected.

    Raises:
        TypeError, ValueError: bad input, named by argument, before any kernel runs.
    """
    h, w = parse_image_size(image_size)
    _check_settings(faces_per_pixel, blur_radius, bin_size, max_faces_per_bin)
    meshes = pack_meshes(
        verts,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        clipped_faces_neighbor_idx,
        validate=validate,
    )
    n = meshes.num_meshes
    k = int(faces_per_pixel)
    if n * h * w * k > _INT32_MAX:
        raise ValueError(
            f"faces_per_pixel={k} with {n} images of {h}x{w} needs more than 2**31 slots"
        )
    if z_clip_value is not None or cull_to_frustum:
        from .clip import rasterize_clipped  # noqa: PLC0415 - optional path

        return rasterize_clipped(
            meshes,
            image_size=(h, w),
            blur_radius=float(blur_radius),
            faces_per_pixel=k,
            bin_size=bin_size,
            max_faces_per_bin=max_faces_per_bin,
            perspective_correct=bool(perspective_correct),
            clip_barycentric_coords=bool(clip_barycentric_coords),
            cull_backfaces=bool(cull_backfaces),
            z_clip_value=z_clip_value,
            cull_to_frustum=bool(cull_to_frustum),
            workspace=workspace,
            deterministic=deterministic,
        )
    if workspace is None:
        workspace = RasterWorkspace(
            num_meshes=n,
            num_faces=meshes.num_faces,
            image_size=(h, w),
            faces_per_pixel=k,
            bin_size=bin_size,
            max_faces_per_bin=max_faces_per_bin,
            device=meshes.device,
            requires_grad=meshes.verts.requires_grad,
            deterministic=deterministic,
        )
    elif not workspace.matches(
        num_meshes=n,
        num_faces=meshes.num_faces,
        image_size=(h, w),
        faces_per_pixel=k,
        bin_size=bin_size,
        device=meshes.device,
    ):
        raise ValueError(
            "workspace was made for another configuration (meshes, faces, image size, "
            "faces_per_pixel, bin_size or device differ)"
        )
    elif deterministic and not workspace.deterministic:
        raise ValueError("deterministic=True needs a workspace made with deterministic=True")
    return rasterize_packed(
        meshes,
        workspace,
        blur_radius=float(blur_radius),
        perspective_correct=bool(perspective_correct),
        clip_barycentric_coords=bool(clip_barycentric_coords),
        cull_backfaces=bool(cull_backfaces),
    )


def rasterize_packed(
    meshes: PackedMeshes,
    workspace: RasterWorkspace,
    *,
    blur_radius: float,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    cull_backfaces: bool,
) -> Fragments:
    """The render call proper: no validation, no allocation, no host reads.

    ``meshes`` may be a capacity buffer (e.g. clipped faces) whose per-mesh
    ranges live only on the device; faces outside every range are ignored.

    On CUDA, a call repeating the previous call's arguments (the same arrays,
    flags and settings) replays the workspace's launches as one CUDA graph
    (:class:`CallGraph`); inside a user's capture the launches are issued as
    usual.
    """
    flags = (float(blur_radius), bool(perspective_correct), bool(clip_barycentric_coords),
             bool(cull_backfaces))  # fmt: skip
    key = (
        *(array_key(a) for a in (meshes.verts, meshes.faces, meshes.mesh_to_face_first_idx,
                                 meshes.num_faces_per_mesh)),
        _optional_key(meshes.clipped_faces_neighbor_idx),
        meshes.has_neighbors, *flags, _settings_key(),
    )  # fmt: skip
    workspace.call_graph(key, lambda: _launch_passes(meshes, workspace, *flags))
    record_backward(
        meshes,
        workspace,
        perspective_correct=perspective_correct,
        clip_barycentric_coords=clip_barycentric_coords,
    )
    return workspace.fragments


def _settings_key() -> tuple:
    """The module-level settings that change which kernels a call launches."""
    return (
        SMALL_FACE_PIXELS, SMALL_FACE_LANES, WIDE_OUTPUTS, REGISTER_QUEUE_MAX_K,
        tuple(sorted(MAX_REGISTERS.items())), variants.SPECIALIZE,
    )  # fmt: skip


def _launch_passes(
    meshes: PackedMeshes,
    ws: RasterWorkspace,
    blur_radius: float,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    cull_backfaces: bool,
) -> None:
    """Issues the render's kernels (setup, binning, queue, outputs)."""
    h, w = ws.image_size
    n = ws.num_meshes
    nf = meshes.num_faces
    k = ws.faces_per_pixel
    launch = ws.launches
    if nf > 0:
        launch(
            "setup",
            _setup_faces,
            nf,
            [meshes.verts, meshes.faces, meshes.mesh_to_face_first_idx,
             meshes.num_faces_per_mesh, n, blur_radius, int(cull_backfaces)],
            [ws.face_mesh, ws.face_bbox, ws.face_verts],
        )  # fmt: skip
    # Split faces (near-plane clipping): PyTorch3D's rule for them depends on the
    # order faces are offered in, so every pixel sees its faces in ascending index
    # order, in a queue of exactly K slots (the output-array queue).
    ordered = meshes.has_neighbors
    small = SMALL_FACE_PIXELS if (k == 1 and ws.binned and not ordered) else 0
    ps, ps_key = ws.pass_for(
        meshes, blur_radius, perspective_correct, clip_barycentric_coords,
        seeded=small > 0, sorted_tiles=ordered and ws.binned,
    )  # fmt: skip
    if small > 0:
        ws.depth_keys.fill_(_EMPTY_KEY_VALUE)
        if nf > 0:
            lanes = small_face_lanes(nf, n * h * w)
            launch("small", _small_faces_k1, nf * lanes, [ps, small, lanes], key=(ps_key, lanes))
    if ws.binned:
        ws._counters.zero_()  # tile counts and cursors, overflow
        if nf > 0:
            binning.coarse_bin(
                ws.face_mesh,
                ws.face_bbox,
                h,
                w,
                ws.tile_h,
                ws.tile_w,
                ws.tile_count,
                ws.tile_offset,
                ws.tile_cursor,
                ws.tile_faces,
                small,
                launch=launch,
                zeroed=True,
            )
            if ordered:
                binning.sort_tiles(ws.tile_count, ws.tile_offset, ws.tile_faces, launch=launch)
        else:
            ws.tile_offset.zero_()
    if k <= REGISTER_QUEUE_MAX_K and not ordered:
        flags = (int(perspective_correct), int(clip_barycentric_coords), int(blur_radius > 0.0))
        kernel = _register_kernel(k, ws.device, flags)
    else:
        kernel = _raster_output_queue
    per_tile = ws.tile_h * ws.tile_w
    threads = n * ws.tiles_y * ws.tiles_x * per_tile
    launch("queue", kernel, threads, [ps], key=ps_key, block_dim=min(per_tile, 256))
    slots = n * h * w * k
    wide = ps.wide != 0
    write = _write_outputs_kernel(ws.device, perspective_correct, clip_barycentric_coords, wide, k)
    launch("outputs", write, slots // 4 if wide else slots, [ps], key=ps_key)


def _make_pass(
    meshes, ws, blur_radius, perspective_correct, clip_bary, pix_to_face, zq, bary=None, dists=None
) -> _Pass:
    n, h, w, k = ws.fragments.shape
    ps = _Pass()
    ps.face_mesh = ws.face_mesh
    ps.face_bbox = ws.face_bbox
    ps.face_verts = ws.face_verts
    ps.neighbor = meshes.clipped_faces_neighbor_idx
    if ps.neighbor is None:
        ps.neighbor = ws.no_neighbors
    ps.mesh_first = meshes.mesh_to_face_first_idx
    ps.mesh_count = meshes.num_faces_per_mesh
    ps.height = h
    ps.width = w
    ps.faces_per_pixel = k
    ps.blur_radius = blur_radius
    ps.perspective = int(perspective_correct)
    ps.clip_bary = int(clip_bary)
    ps.naive = int(not ws.binned)
    ps.tile_h = ws.tile_h
    ps.tile_w = ws.tile_w
    ps.tiles_y = ws.tiles_y
    ps.tiles_x = ws.tiles_x
    ps.tile_count = ws.tile_count
    ps.tile_offset = ws.tile_offset
    ps.tile_faces = ws.tile_faces
    ps.max_per_tile = max(ws.max_faces_per_bin, 1)
    ps.overflow = ws.overflow
    ps.seeded = 0
    ps.keys = ws.depth_keys
    ps.pix_to_face = pix_to_face.reshape((-1, k))
    ps.zq = zq.reshape((-1, k))
    ps.wide = 0
    if bary is not None:
        ps.bary = bary.reshape((-1, k))
        ps.dists = dists.reshape((-1, k))
        views = _wide_views(pix_to_face, zq, bary, dists)
        if views is not None:
            ps.wide = 1
            ps.pix_to_face4, ps.zq4, ps.bary4, ps.dists4 = views
    return ps


def _wide_views(pix_to_face, zbuf, bary, dists):
    """The outputs as flat arrays of 16-byte vectors (same memory), or None: K
    not a multiple of 4, non-contiguous or unaligned memory, or not WIDE_OUTPUTS.

    For other K a group of four slots would span pixels (four pixel centres,
    four face rows per thread): measured on an H200 at K = 1, 3-6% slower than
    one thread per slot, so those keep the one-slot pass (and _write_group
    relies on one pixel per group)."""
    if not WIDE_OUTPUTS or pix_to_face.shape[-1] % 4 != 0:
        return None
    arrays = (pix_to_face, zbuf, bary, dists)
    if any(not a.is_contiguous or a.ptr is None or a.ptr % 16 != 0 for a in arrays):
        return None
    m = pix_to_face.size // 4
    shapes = ((wp.vec4i, m), (wp.vec4, m), (wp.vec4, 3 * m), (wp.vec4, m))
    return tuple(
        wp.array(ptr=a.ptr, dtype=t, shape=(c,), device=a.device)
        for a, (t, c) in zip(arrays, shapes, strict=True)
    )


def rasterize_naive_at(
    meshes: PackedMeshes,
    workspace: RasterWorkspace,
    pixels: wp.array,
    *,
    blur_radius: float,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
) -> wp.array:
    """``pix_to_face`` rows (M, K) of the naive pass at M (image, row, column) pixels.

    A check for fast paths: reuses the face setup that the last
    :func:`rasterize_packed` call on ``workspace`` left (same meshes and flags).
    """
    k = workspace.faces_per_pixel
    m = pixels.shape[0]
    p2f = wp.empty((m, k), dtype=wp.int32, device=workspace.device)
    zq = wp.empty((m, k), dtype=wp.float32, device=workspace.device)
    ps = _make_pass(
        meshes, workspace, blur_radius, perspective_correct, clip_barycentric_coords, p2f, zq
    )
    wp.launch(_raster_naive_at, dim=m, inputs=[ps, pixels], device=workspace.device,
              record_tape=False)  # fmt: skip
    return p2f
