"""The output pass: zbuf, bary_coords and dists of every slot from pix_to_face.

``dists`` are left out (neither computed nor stored) for a workspace made with
``write_dists=False`` (the sensor's sharp pass, which never reads them).

A separate pass (the alternatives measured slower: docs/PERF.md). One
thread per four slots writes them in 16-byte stores where K is a multiple of 4
(``Tuning.wide_outputs``), else one thread per slot. The four-slot pass skips
an empty group that an earlier call left filled with -1 (``Tuning.fill_empty_once``,
the workspace's own outputs only: :class:`~warpraster.stores.FillState`).
"""

import warp as wp

from .. import variants
from ..fragments import fragment_values
from ..geometry import pixel_centre
from ..stores import group_needs_write, load4i, store4
from .coverage import PassArgs

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (docs/PERF.md).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.func
def _write_slot(ps: PassArgs, q: int, s: int, p: wp.vec2):
    """Writes the fragment values of slot s of output row q (pixel centre p):
    its face's, or the -1 fill (its pix_to_face, -1 where empty, stays)."""
    z, bary, d = face_values(ps, ps.out.pix_to_face[q, s], p)
    ps.out.zbuf[q, s] = z
    ps.out.bary[q, s] = bary
    if ps.write_dists != 0:
        ps.out.dists[q, s] = d


@wp.func
def face_values(ps: PassArgs, f: int, p: wp.vec2):
    """(zbuf, bary, dist) of face f at pixel centre p, or the -1 fill if f < 0."""
    z = float(-1.0)
    bary = wp.vec3(-1.0, -1.0, -1.0)
    d = float(-1.0)
    if f >= 0:
        m = ps.face.verts[f]
        z, bary, d = fragment_values(p, m, ps.perspective_correct, ps.clip_barycentric_coords)
    return z, bary, d


@wp.func
def write_group(ps: PassArgs, e0: int, f: wp.vec4i):
    """Slots e0 .. e0 + 3 of the flat outputs (e0 % 4 == 0, K % 4 == 0: one
    pixel), holding faces f: their values in 16-byte stores (one for zbuf, one
    for dists, three for bary). The pixel centre is computed once (its integer
    and float divisions were most of the pass's instructions when computed per
    slot)."""
    g = e0 // 4
    p = _flat_pixel(ps, e0)
    z0, b0, d0 = face_values(ps, f[0], p)
    z1, b1, d1 = face_values(ps, f[1], p)
    z2, b2, d2 = face_values(ps, f[2], p)
    z3, b3, d3 = face_values(ps, f[3], p)
    store4(ps.out4.zbuf, g, wp.vec4(z0, z1, z2, z3))
    if ps.write_dists != 0:
        store4(ps.out4.dists, g, wp.vec4(d0, d1, d2, d3))
    store4(ps.out4.bary, 3 * g, wp.vec4(b0[0], b0[1], b0[2], b1[0]))
    store4(ps.out4.bary, 3 * g + 1, wp.vec4(b1[1], b1[2], b2[0], b2[1]))
    store4(ps.out4.bary, 3 * g + 2, wp.vec4(b2[2], b3[0], b3[1], b3[2]))


@wp.func
def _flat_pixel(ps: PassArgs, e: int) -> wp.vec2:
    """Centre of the pixel holding flat output slot e."""
    r = (e // ps.faces_per_pixel) % (ps.height * ps.width)
    return pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)


@variants.kernel_family
def _write_outputs_family(wide: bool, max_regs: int | None, flags: tuple[int, ...] | None):
    """zbuf, bary_coords, dists of every slot from pix_to_face, one thread per slot
    or, ``wide``, per four slots written in 16-byte stores (``flags`` =
    (perspective_correct, clip_barycentric_coords, write_dists, K)
    compiled in, or None: read at run time; compiled in, a variant without
    ``dists`` leaves their computation out too).
    """

    def write_outputs(ps_in: PassArgs):
        ps = ps_in
        if wp.static(flags is not None):
            ps.perspective_correct = wp.static(flags[0])
            ps.clip_barycentric_coords = wp.static(flags[1])
            ps.write_dists = wp.static(flags[2])
            # K compiled in too: the slot -> pixel division becomes a shift (none at K = 1)
            ps.faces_per_pixel = wp.static(flags[3])
        i = wp.tid()
        if wp.static(wide):
            f = load4i(ps.out4.pix_to_face, i)
            # a row is compact (its faces first), so slot 0 empty = the group empty
            if group_needs_write(ps.fill, i, f[0] < 0):
                write_group(ps, 4 * i, f)
        else:
            k = ps.faces_per_pixel
            q = i // k
            s = i - q * k
            r = q % (ps.height * ps.width)
            p = pixel_centre(r // ps.width, r % ps.width, ps.height, ps.width)
            _write_slot(ps, q, s, p)

    base = "write_outputs4" if wide else "write_outputs"
    return variants.variant_kernel(write_outputs, base, flags, max_regs)


def write_outputs_kernel(
    device,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    write_dists: bool,
    wide: bool,
    k: int,
    tuning,
) -> wp.Kernel:
    """The output-pass kernel for these flags (and K, when variants are on)."""
    flags = (perspective_correct, clip_barycentric_coords, write_dists, k)
    flags = variants.device_flags(device, flags, tuning.specialize)
    return _write_outputs_family(wide, tuning.registers("outputs4" if wide else "outputs"), flags)


def wide_views(pix_to_face, zbuf, bary, dists):
    """The outputs as flat arrays of 16-byte vectors (same memory), or None: K
    not a multiple of 4, or non-contiguous or unaligned memory.

    For other K a group of four slots would span pixels (measured slower:
    docs/PERF.md), so those keep the one-slot pass, and write_group relies on
    one pixel per group."""
    if pix_to_face.shape[-1] % 4 != 0:
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
