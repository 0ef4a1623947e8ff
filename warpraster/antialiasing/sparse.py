"""The sparse antialias forward: the colour copied, then one pass over the pixel pairs.

nvdiffrast's shape of the forward. ``out`` starts as a copy of ``color`` (a device
memcpy); then one thread per pixel analyses the pixel's two pairs (right and
lower, :func:`~warpraster.antialiasing.kernels._analyse_pair`, the same decisions
and the same alpha as the gather path) and, for each pair that blends, adds
``alpha (color[right/lower] - color[left/upper])`` to the pixel the pair changes
(the left/upper one when alpha > 0, else the right/lower one) with float atomics.
Most pixels have no such pair, so the pass reads ``pix_to_face`` and writes
almost nothing, where the gather path writes every pixel's pair records and
then reads them back around every pixel.

A pixel changed by one pair gets ``color + alpha (..)``, the gather's bits; one
changed by two or more pairs (a corner of a silhouette) adds them in the order
the atomics land, so its value can differ from the gather's in the last bit
(and run to run on a GPU): ``deterministic=True`` keeps the gather.

The pair records the adjoint reads (:class:`~warpraster.antialiasing.kernels.PairRecords`,
every pixel's two slots: the colour gradient is gathered from them around every
pixel) are written only when ``store`` is set, i.e. when the call is recorded on
a tape for a backward.
"""

from __future__ import annotations

import warp as wp

from .kernels import NO_PAIR, AAInputs, PairRecords, _analyse_pair

wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.func
def _add_pair(a: AAInputs, out: wp.array4d(dtype=wp.float32), n: int, r: int, c: int,
              down: int, alpha: float):  # fmt: skip
    """Adds the blend of pair (n, r, c) -> right (``down`` 0) or lower neighbour to
    the pixel it changes (the gather's ``alpha (second - first)``, per channel)."""
    r1 = r + down
    c1 = c + 1 - down
    tr = r1
    tc = c1
    if alpha > 0.0:
        tr = r
        tc = c
    for ch in range(a.color.shape[3]):
        d = alpha * (a.color[n, r1, c1, ch] - a.color[n, r, c, ch])
        wp.atomic_add(out, n, tr, tc, ch, d)


@wp.func
def _blend_pair(a: AAInputs, store: int, pairs_out: PairRecords, out: wp.array4d(dtype=wp.float32),
                n: int, r: int, c: int, down: int):  # fmt: skip
    """Pair slot ``down`` of pixel (n, r, c): analysed, its record written when
    ``store`` is nonzero, and added to ``out`` when it blends."""
    al, co = _analyse_pair(a, n, r, c, down)
    if store != 0:
        pairs_out.alpha[n, r, c, down] = al
        pairs_out.code[n, r, c, down] = co
    if co != NO_PAIR:
        _add_pair(a, out, n, r, c, down, al)


# At most 32 registers (the compiler took 60): more warps in flight to cover the
# chain of dependent loads (face ids, faces, vertices, opposite vertices) of a
# pixel pair. H200, ico5 x8 512², graph forward 0.067 -> 0.055 ms (caps 48, 40
# 0.060, 0.059; 28, 24 0.055, 0.056), the same bits.
@wp.kernel(cuda_max_registers=32)
def sparse_blend(
    # Data in:
    a: AAInputs,
    store: int,
    # Data out (``out`` holds a copy of ``a.color`` on entry):
    pairs_out: PairRecords,
    out: wp.array4d(dtype=wp.float32),
):
    """Pixel (n, r, c)'s two pairs (slot 0 right, slot 1 down): each that blends is
    added to ``out``; their records written when ``store`` is nonzero."""
    n, r, c = wp.tid()
    _blend_pair(a, store, pairs_out, out, n, r, c, 0)
    _blend_pair(a, store, pairs_out, out, n, r, c, 1)


@wp.kernel
def copy_color(
    # Data in:
    color: wp.array4d(dtype=wp.float32),
    # Data out:
    out: wp.array4d(dtype=wp.float32),
):
    """``out = color`` for strided arrays (contiguous ones take a memcpy instead:
    Warp's own strided copy cannot be captured in a graph on the CPU)."""
    n, r, c = wp.tid()
    for ch in range(color.shape[3]):
        out[n, r, c, ch] = color[n, r, c, ch]
