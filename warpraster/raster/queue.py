"""The fine (or naive) pass: one thread per pixel keeps a top-K queue of faces.

The queue is ordered by (depth, face index), a total order, so the order in
which faces are offered does not change the result. It lives in registers for
K <= 32 (kernels generated per size bucket by :func:`register_queue_kernel`;
``Tuning.register_queue_max_k`` / ``register_queue_max_k_blur``) or in the output arrays
for any K (:data:`output_queue_kernel`), which also serves PyTorch3D's rule for
the two halves of a clipped face.

No ``from __future__ import annotations`` here: the register-queue functions
are annotated with vector types made inside the factory.
"""

import warp as wp

from .. import variants
from ..geometry import pixel_centre
from ..stores import store4i
from .coverage import (
    NO_FACE,
    PassArgs,
    before,
    face_dist,
    face_range,
    locate_bin_pixel,
    served_by_output_queue,
    served_by_register_queue,
    test_face,
    test_face_sharp,
)
from .faces import FAR
from .small_faces import EMPTY_KEY, bits_depth

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (docs/PERF.md).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})

#: Queue sizes with a register kernel; K is served by the smallest bucket >= K.
REGISTER_BUCKETS = (1, 2, 4, 8, 16, 32)


@variants.kernel_family
def register_queue_kernel(kc: int, max_regs: int | None, flags: tuple[int, int, int] | None):
    """Fine/naive pass whose queue of ``kc`` slots lives in registers (kc <= 32).

    Serves every K <= kc: the first K slots of a top-kc queue are the top-K.
    ``flags`` = (perspective_correct, clip_barycentric_coords, blur > 0) compiles those in as
    constants; None reads them from the pass at run time. One pixel per
    thread (alternatives measured slower: docs/PERF.md, "Design measurements").
    """
    qf_t = wp.types.vector(length=kc, dtype=wp.float32)
    qi_t = wp.types.vector(length=kc, dtype=wp.int32)

    def insert(qz: qf_t, qf: qi_t, z: float, f: int, size: int):
        """Sorted insertion, unrolled: entries after (z, f) shift up by one. Slots
        from ``size`` on are empty: the steps above it are skipped (they would
        only move empty slots), so a short queue costs a few steps, not kc."""
        for s in range(wp.static(kc - 1), 0, -1):
            if s <= size:
                if before(z, f, qz[s - 1], qf[s - 1]):
                    qz[s] = qz[s - 1]
                    qf[s] = qf[s - 1]
                elif before(z, f, qz[s], qf[s]):
                    qz[s] = z
                    qf[s] = f
        if before(z, f, qz[0], qf[0]):
            qz[0] = z
            qf[0] = f
        return qz, qf

    def seed(ps: PassArgs, q: int, qz: qf_t, qf: qi_t):
        """The queue's start (K = 1: the small-face pass's key) and its size."""
        size = int(0)
        if ps.seeded != 0:
            key = ps.keys[q]
            if key != EMPTY_KEY:
                qz[0] = bits_depth(wp.uint32(key >> wp.uint64(32)))
                qf[0] = int(wp.uint32(key & wp.uint64(0xFFFFFFFF)))
                size = 1
        return qz, qf, size

    def store(ps: PassArgs, q: int, qf: qi_t):
        """Writes the pix_to_face row (qf: empty slots already -1)."""
        if wp.static(kc % 4 == 0):
            if ps.wide != 0 and ps.faces_per_pixel == kc:
                for g in range(wp.static(kc // 4)):
                    v = wp.vec4i(qf[4 * g], qf[4 * g + 1], qf[4 * g + 2], qf[4 * g + 3])
                    store4i(ps.out4.pix_to_face, q * wp.static(kc // 4) + g, v)
                return
        for s in range(wp.static(kc)):
            if s < ps.faces_per_pixel:
                ps.out.pix_to_face[q, s] = qf[s]

    insert = wp.func(insert, module="unique")
    seed = wp.func(seed, module="unique")
    store = wp.func(store, module="unique")

    def raster_register_queue(ps_in: PassArgs):
        ps = ps_in
        if wp.static(flags is not None):
            # compile-time flags: dead paths drop out (fewer registers, more warps)
            ps.perspective_correct = wp.static(flags[0])
            ps.clip_barycentric_coords = wp.static(flags[1])
            if wp.static(flags[2] == 0):
                ps.blur_radius = 0.0
        tid = wp.tid()
        loc = locate_bin_pixel(ps, tid)
        n = loc[0]
        yi = loc[2]
        xi = loc[3]
        if yi < ps.height and xi < ps.width and served_by_register_queue(ps, loc[1]):
            p = pixel_centre(yi, xi, ps.height, ps.width)
            rng = face_range(ps, n, loc[1], yi % ps.bins.h == 0 and xi % ps.bins.w == 0)
            q = (n * ps.height + yi) * ps.width + xi
            qz, qf, size = seed(ps, q, qf_t(FAR), qi_t(NO_FACE))
            for j in range(rng[0], rng[1]):
                f = j
                if rng[2] != 0:
                    f = ps.bins.faces[j]
                hit = False
                z = float(0.0)
                if wp.static(flags is not None and flags[2] == 0):
                    hit, z, dist = test_face_sharp(ps, f, p)
                else:
                    hit, z, dist = test_face(ps, f, p)
                if hit and before(z, f, qz[kc - 1], qf[kc - 1]):
                    qz, qf = insert(qz, qf, z, f, size)
                    size = wp.min(size + 1, kc)
            for s in range(wp.static(kc)):
                if qf[s] == NO_FACE:
                    qf[s] = -1
            store(ps, q, qf)

    # A distinct name per variant: readable profiles, and kernels generated from one
    # function stay apart wherever Warp keys them by name (CPU graph capture does).
    # max_unroll kc: every per-slot loop unrolled (Warp's default of 16 left the 32-slot
    # queue's loops to run time, its slots indexed at run time)
    return variants.variant_kernel(
        raster_register_queue, f"raster_queue_{kc}", flags, max_regs, max_unroll=max(kc, 16)
    )


def register_kernel(k: int, device, flags: tuple[int, int, int], tuning) -> wp.Kernel:
    """The register-queue kernel serving K (the smallest bucket >= K) for these flags."""
    kc = next(b for b in REGISTER_BUCKETS if b >= k)
    flags = variants.device_flags(device, flags, tuning.specialize)
    return register_queue_kernel(kc, tuning.registers(f"queue{kc}"), flags)


@wp.func
def _insert(ps: PassArgs, q: int, f: int, z: float, size: int) -> int:
    """Sorted insertion of (z, f) into the queue in row q; drops the last entry
    when the queue is full. Returns the new size."""
    k = ps.faces_per_pixel
    if size == k:
        if not before(z, f, ps.out.zbuf[q, k - 1], ps.out.pix_to_face[q, k - 1]):
            return size
    pos = size
    if size == k:
        pos = k - 1
    else:
        size += 1
    while pos > 0:
        zp = ps.out.zbuf[q, pos - 1]
        fp = ps.out.pix_to_face[q, pos - 1]
        if before(z, f, zp, fp):
            ps.out.zbuf[q, pos] = zp
            ps.out.pix_to_face[q, pos] = fp
            pos -= 1
        else:
            break
    ps.out.zbuf[q, pos] = z
    ps.out.pix_to_face[q, pos] = f
    return size


@wp.func
def _offer(ps: PassArgs, q: int, f: int, p: wp.vec2, size: int) -> int:
    """Offers face f to the queue held in row q of the output arrays (any K).

    PyTorch3D's rule for the two halves of a face split by near-plane clipping,
    which depends on the order faces are offered in (ascending index, ensured
    by the caller): if f's neighbour is in the queue now, f takes its slot when
    f is strictly nearer in xy, else f is dropped; otherwise f is offered as
    usual.
    """
    hit, z, dist = test_face(ps, f, p)
    if not hit:
        return size
    g = ps.neighbor[f]
    if g >= 0:
        slot = int(-1)
        for s in range(size):
            if ps.out.pix_to_face[q, s] == g:
                slot = s
        if slot >= 0:
            d_f = dist
            if d_f < 0.0:
                d_f = face_dist(ps, f, p)
            if d_f < face_dist(ps, g, p):
                # remove g, then insert f (the queue cannot overflow)
                for s in range(slot, size - 1):
                    ps.out.zbuf[q, s] = ps.out.zbuf[q, s + 1]
                    ps.out.pix_to_face[q, s] = ps.out.pix_to_face[q, s + 1]
                size = _insert(ps, q, f, z, size - 1)
            return size
    return _insert(ps, q, f, z, size)


@wp.func
def _output_queue_pixel(ps: PassArgs, tid: int):
    """The output-array queue of the pixel of thread index ``tid`` (as the
    register queue's threads: consecutive ones sweep one bin)."""
    loc = locate_bin_pixel(ps, tid)
    n = loc[0]
    yi = loc[2]
    xi = loc[3]
    if yi >= ps.height or xi >= ps.width or not served_by_output_queue(ps, loc[1]):
        return
    p = pixel_centre(yi, xi, ps.height, ps.width)
    rng = face_range(ps, n, loc[1], yi % ps.bins.h == 0 and xi % ps.bins.w == 0)
    q = (n * ps.height + yi) * ps.width + xi
    size = int(0)
    for j in range(rng[0], rng[1]):
        f = j
        if rng[2] != 0:
            f = ps.bins.faces[j]
        size = _offer(ps, q, f, p, size)
    for s in range(size, ps.faces_per_pixel):
        ps.out.pix_to_face[q, s] = -1


@wp.kernel
def raster_output_queue(ps: PassArgs, total: int, stride: int):
    """Fine/naive pass for any K: the sorted queue lives in the output rows. A
    grid-stride loop over the ``total`` pixel threads (``stride``: the launch's
    thread count, a multiple of the bin's pixel count so that a warp still
    sweeps one bin)."""
    if ps.split.only != 0 and ps.split.any[0] == 0:
        return  # it serves only the bins of split faces, and there are none
    for t in range(wp.tid(), total, stride):
        _output_queue_pixel(ps, t)


@wp.kernel
def raster_naive_at(ps: PassArgs, pixels: wp.array(dtype=wp.vec3i)):
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
        ps.out.pix_to_face[i, s] = -1
