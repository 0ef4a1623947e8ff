"""Coarse pass: compacted per-(image, bin) lists of the faces whose bounding box
touches the bin.

Three launches, no host reads: count the (face, bin) pairs per bin, an
exclusive prefix sum of the counts gives each bin's start in one flat list,
then every face writes itself into the bins it touches. The kernels read the
face set-up and the bin grid from, and write the lists into, the raster
passes' argument struct (:class:`~warpraster.raster.coverage.PassArgs`). The list has a fixed
capacity; a bin whose entries do not fit (or exceed ``max_faces_per_bin``) is
"overflowed": the fine pass then tests all faces of the mesh for that bin's
pixels, so the output stays exact whatever the capacity. Faces within a list
are in no particular order; the fine pass's queue is a total order on
(depth, face index), so the order does not change the result.
"""

from __future__ import annotations

import math

import warp as wp

from ..geometry import pix_to_ndc
from .coverage import PassArgs

wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.func
def ndc_span_to_pixels(lo: float, hi: float, s1: int, s2: int) -> wp.vec2i:
    """Exact range [i0, i1] of pixel indices (counted from the +NDC end) whose
    centres ``pix_to_ndc(i)`` lie in [lo, hi] on an axis of ``s1`` pixels (the
    same float32 centres the fine pass tests); i0 > i1 when there are none.

    A float estimate is corrected by stepping while the neighbouring centre is
    still in (or not yet in) the span, so rounding cannot lose a pixel.
    """
    ratio = float(1.0)
    if s1 > s2:
        ratio = float(s1) / float(s2)
    rng = 2.0 * ratio
    offset = rng / 2.0
    scale = float(s1) / rng
    a = wp.clamp((lo + offset) * scale - 0.5, -1.0, float(s1))
    b = wp.clamp((hi + offset) * scale - 0.5, -1.0, float(s1))
    i0 = wp.clamp(int(wp.ceil(a)), 0, s1 - 1)
    i1 = wp.clamp(int(wp.floor(b)), 0, s1 - 1)
    while i0 > 0 and pix_to_ndc(i0 - 1, s1, s2) >= lo:
        i0 -= 1
    while i0 < s1 and pix_to_ndc(i0, s1, s2) < lo:
        i0 += 1
    while i1 < s1 - 1 and pix_to_ndc(i1 + 1, s1, s2) <= hi:
        i1 += 1
    while i1 >= 0 and pix_to_ndc(i1, s1, s2) > hi:
        i1 -= 1
    return wp.vec2i(i0, i1)


@wp.func
def pixel_box(bb: wp.vec4, height: int, width: int) -> wp.vec4i:
    """(y0, y1, x0, x1): inclusive rows and columns of the pixel centres inside a
    face bbox (xmin, ymin, xmax, ymax); y0 > y1 or x0 > x1 when there are none."""
    if not (bb[0] <= bb[2]):
        return wp.vec4i(1, 0, 1, 0)
    # pixel indices count from the +NDC end: column xi = W - 1 - i, row yi = H - 1 - j
    sx = ndc_span_to_pixels(bb[0], bb[2], width, height)
    sy = ndc_span_to_pixels(bb[1], bb[3], height, width)
    return wp.vec4i(height - 1 - sy[1], height - 1 - sy[0], width - 1 - sx[1], width - 1 - sx[0])


@wp.func
def box_pixels(box: wp.vec4i) -> int:
    """Number of pixels in a pixel box (0 when empty)."""
    if box[0] > box[1] or box[2] > box[3]:
        return 0
    return (box[1] - box[0] + 1) * (box[3] - box[2] + 1)


@wp.func
def face_bins(bb: wp.vec4, height: int, width: int, bin_h: int, bin_w: int, small: int) -> wp.vec4i:
    """(ty0, ty1, tx0, tx1) inclusive range of bins (``bin_h`` rows x ``bin_w``
    columns of pixels) of a face bbox; ty0 > ty1 if none (also when the face
    covers at most ``small`` pixels: another pass draws those)."""
    box = pixel_box(bb, height, width)
    npix = box_pixels(box)
    if npix == 0 or npix <= small:
        return wp.vec4i(1, 0, 1, 0)
    return wp.vec4i(box[0] // bin_h, box[1] // bin_h, box[2] // bin_w, box[3] // bin_w)


@wp.func
def _bin_span(ps: PassArgs, small: int, f: int):
    """(ty0, ty1, tx0, tx1) bins of face f (see :func:`face_bins`) and the index of
    the first bin of its image; an empty span for a face that is never drawn."""
    m = ps.face.mesh[f]
    if m < 0:
        return wp.vec4i(1, 0, 1, 0), 0
    # split faces in this call: the small-face pass draws nothing, all are binned
    small_now = wp.where(ps.split.small_off[0] != 0, 0, small)
    r = face_bins(ps.face.bbox[f], ps.height, ps.width, ps.bins.h, ps.bins.w, small_now)
    return r, m * ps.bins.rows * ps.bins.cols


@wp.kernel
def _count_bins(ps: PassArgs, small: int):
    """Counts the (face, bin) pairs per bin, and marks the bins that a face split
    by near-plane clipping touches (``ps.neighbor[f] >= 0``): only their pixels
    need faces offered in index order (PyTorch3D's rule for the two halves).

    In: ``ps``'s face set-up and bin grid, ``small``. Out (zeroed by the caller):
    ``ps.bins.count``, ``ps.split.marked``.
    """
    f = wp.tid()
    r, base = _bin_span(ps, small, f)
    split = ps.neighbor[f] >= 0
    for ty in range(r[0], r[1] + 1):
        for tx in range(r[2], r[3] + 1):
            t = base + ty * ps.bins.cols + tx
            wp.atomic_add(ps.bins.count, t, 1)
            if split:
                ps.split.marked[t] = 1
                ps.split.any[0] = 1  # every writer stores the same value


@wp.kernel
def _fill_bins(ps: PassArgs, small: int, bin_cursor_out: wp.array(dtype=wp.int32)):
    """Writes each face into the lists of the bins it touches (entries past the
    list's capacity are dropped: the fine pass treats that bin as overflowed).

    In: ``ps``'s face set-up, bin grid and ``bins.offset``, ``small``. Out:
    ``bin_cursor_out`` (zeroed by the caller: entries per bin so far),
    ``ps.bins.faces``.
    """
    f = wp.tid()
    r, base = _bin_span(ps, small, f)
    capacity = ps.bins.faces.shape[0]
    for ty in range(r[0], r[1] + 1):
        for tx in range(r[2], r[3] + 1):
            t = base + ty * ps.bins.cols + tx
            pos = ps.bins.offset[t] + wp.atomic_add(bin_cursor_out, t, 1)
            if pos < capacity:
                ps.bins.faces[pos] = f


@wp.kernel
def _sort_bins(ps: PassArgs):
    """Ascending face order within each bin's list (insertion sort, one thread per
    bin); lists longer than ``ps.split.max_sorted`` or beyond capacity are left alone
    (the fine pass treats them as overflowed).

    In: ``ps.bins.count``, ``bins.offset``, ``split.marked``, ``split.any``,
    ``split.max_sorted``. In/out: ``ps.bins.faces``.
    """
    if ps.split.any[0] == 0:
        return  # no bin marked
    t = wp.tid()
    count = ps.bins.count[t]
    start = ps.bins.offset[t]
    if (
        ps.split.marked[t] == 0
        or count > ps.split.max_sorted
        or start + count > ps.bins.faces.shape[0]
    ):
        return
    for i in range(start + 1, start + count):
        v = ps.bins.faces[i]
        j = i - 1
        while j >= start and ps.bins.faces[j] > v:
            ps.bins.faces[j + 1] = ps.bins.faces[j]
            j -= 1
        ps.bins.faces[j + 1] = v


def sort_bins(ps: PassArgs, key, launch) -> None:
    """Puts the list of each bin marked in ``ps.split.marked`` (at most
    ``ps.split.max_sorted`` faces) in ascending face order; longer lists are left as
    they are: the fine pass then tests every face of the mesh in order
    (``Tuning.max_sorted_bin``).

    ``launch(name, kernel, dim, inputs, key=...)`` runs a kernel (a
    :class:`warpraster.raster.LaunchCache`); ``key`` identifies ``ps``."""
    launch("sort_bins", _sort_bins, ps.bins.count.shape[0], [ps], key=key)


def bin_grid(height: int, width: int, bin_h: int, bin_w: int) -> tuple[int, int]:
    """Number of bins along (y, x)."""
    return (height + bin_h - 1) // bin_h, (width + bin_w - 1) // bin_w


def default_capacity(
    num_faces: int, num_bins: int, blur_px: float = 0.0, bin_h: int = 8, bin_w: int = 8
) -> int:
    """Entries of the flat list when no per-bin cap is given: room for every face
    touching ~8 bins, or, with blur, the bins of a small face whose box grew by
    ``blur_px`` pixels on each side. Scenes of larger faces overflow some bins,
    which then run the exact fallback over all faces of the mesh (correct, but
    slow: the K = 8 soft-Phong bench scene, blur ~8 px, overflowed 3,606 bins
    and took 14.6 ms instead of 3.6 ms on an H200 with 8 entries per face)."""
    span_y = math.ceil(2.0 * blur_px / bin_h) + 2
    span_x = math.ceil(2.0 * blur_px / bin_w) + 2
    per_face = max(8, span_y * span_x)
    return max(per_face * num_faces + 4 * num_bins, 1024)


def coarse_bin(ps: PassArgs, key, num_faces: int, bin_cursor: wp.array, launch, small: int = 0):
    """Fills the compacted per-bin face lists of ``ps``. Capturable: no host reads.

    Faces covering at most ``small`` pixels are left out (0: none left out).
    ``ps.split.marked`` gets 1 for the bins a split face (``ps.neighbor[f] >= 0``)
    touches. The caller has zeroed ``ps.bins.count``, ``bin_cursor`` and
    ``ps.split.marked``. ``launch`` and ``key`` as in :func:`sort_bins`.
    """
    launch("count_bins", _count_bins, num_faces, [ps, small], key=(key, small))
    wp.utils.array_scan(ps.bins.count, ps.bins.offset, inclusive=False)
    launch("fill_bins", _fill_bins, num_faces, [ps, small, bin_cursor], key=(key, small))
