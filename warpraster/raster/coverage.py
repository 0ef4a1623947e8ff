"""Does face f cover pixel p, and in which order: the tests every raster pass shares.

:class:`PassArgs` carries everything a raster pass reads (one struct keeps the
kernel signatures short); the functions here decide coverage exactly as
PyTorch3D's kernel does, and order the queue by (depth, face index).
"""

import warp as wp

from ..fragments import FragmentRows
from ..geometry import EPS, edge_function, face_barycentric, face_depth, point_triangle_dist2
from ..stores import FillState, WideRows

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (docs/PERF.md).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})

NO_FACE_VALUE = 2147483647
#: Empty queue slot face (sorts after every face).
NO_FACE = wp.constant(NO_FACE_VALUE)


@wp.struct
class FaceSetup:
    """The triangle set-up, one entry per face (written by the set-up pass,
    :mod:`warpraster.raster.faces`): owning ``mesh`` (-1: never drawn), blur-grown
    ``bbox`` (x min, y min, x max, y max) and ``verts``, rows = the vertices."""

    mesh: wp.array(dtype=wp.int32)
    bbox: wp.array(dtype=wp.vec4)
    verts: wp.array(dtype=wp.mat33)


@wp.struct
class BinLists:
    """The compacted per-bin face lists (written by :mod:`warpraster.raster.binning`):
    bins of ``h`` x ``w`` pixels, ``rows`` x ``cols`` per image; bin t's faces are
    ``faces[offset[t] : offset[t] + count[t]]``, a list being used when it holds at
    most ``max_per_bin`` faces and fits in ``faces``; ``overflow`` counts the bins
    that fell back to all faces of their mesh."""

    h: int
    w: int
    rows: int
    cols: int
    count: wp.array(dtype=wp.int32)
    offset: wp.array(dtype=wp.int32)
    faces: wp.array(dtype=wp.int32)
    max_per_bin: int
    overflow: wp.array(dtype=wp.int32)


@wp.struct
class SplitBins:
    """Near-plane clipping: the bins a split face touches (``marked``, valid when
    ``on``) are served by the output-array queue with sorted lists of at most
    ``max_sorted`` faces; the register queue skips them (``only``: the output-array
    queue serves only those; ``any``: (1,) 1 when a bin is marked, so that the
    output-array queue pass ends at once without). ``small_off``: (1,) nonzero
    when some face of the call is split (the clipper's flag; a zero array
    otherwise): the K = 1 small-face pass then draws nothing and every face is
    binned, so that split bins see every face in index order."""

    small_off: wp.array(dtype=wp.int32)
    on: int
    only: int
    max_sorted: int
    marked: wp.array(dtype=wp.int32)
    any: wp.array(dtype=wp.int32)


@wp.struct
class PassArgs:
    """Everything a raster pass reads and writes (one struct keeps the kernel
    signatures short). Inputs first; the outputs (``out``, ``out4``, and ``keys``,
    ``bins.overflow``, which the passes update atomically) last."""

    # In: face set-up, per-mesh ranges, settings
    face: FaceSetup
    neighbor: wp.array(dtype=wp.int32)
    mesh_first: wp.array(dtype=wp.int32)
    mesh_count: wp.array(dtype=wp.int32)
    height: int
    width: int
    faces_per_pixel: int
    blur_radius: float
    perspective_correct: int
    clip_barycentric_coords: int
    # bins (none when ``naive``: every pixel tests all faces of its mesh)
    naive: int
    bins: BinLists
    split: SplitBins
    # K = 1: the queue starts from the (depth, face) keys the small-face pass left
    seeded: int
    keys: wp.array(dtype=wp.uint64)
    # Out: the outputs, viewed as (N * H * W, K) rows; zbuf is also the depth queue
    # of offer. ``out4``: the same outputs, 16 bytes at a time (when ``wide``);
    # ``write_dists`` 0: the output pass leaves ``dists`` out
    out: FragmentRows
    write_dists: int
    wide: int
    out4: WideRows
    # which empty groups of four slots the wide output pass must still fill
    fill: FillState


@wp.func
def test_face_sharp(ps: PassArgs, f: int, p: wp.vec2):
    """(hit, z, -1) of face f at pixel centre p without blur: the bbox and the
    signs of the three edge functions (a pixel is inside only if each
    barycentric numerator has the sign of the area, so a sign mismatch rejects
    it without the divisions; a pass is re-decided exactly) computed for every
    face (no branch between them, so the lanes of a warp stay together), then the
    exact decision where both pass. Used by the queue kernels compiled for
    blur = 0 (faster at K = 8: docs/PERF.md, "Design measurements") and by
    :func:`test_face` without blur."""
    hit = False
    z = float(0.0)
    bb = ps.face.bbox[f]
    m = ps.face.verts[f]
    a = wp.vec2(m[0, 0], m[0, 1])
    b = wp.vec2(m[1, 0], m[1, 1])
    c = wp.vec2(m[2, 0], m[2, 1])
    in_box = p[0] <= bb[2] and p[0] >= bb[0] and p[1] <= bb[3] and p[1] >= bb[1]
    # The edge-sign test written out here: as a function of its own (geometry's
    # edges_admit, or as min / max and a select), the K=8 raster bench scenes ran
    # 4% slower on an H200 (ico5 x8 graph forward 0.410-0.412 -> 0.425-0.428 ms,
    # ico4 x32 0.425-0.428 -> 0.442-0.449; sm_90: 63 registers instead of 64)
    area = edge_function(c, a, b) + EPS
    e0 = edge_function(p, b, c)
    e1 = edge_function(p, c, a)
    e2 = edge_function(p, a, b)
    pos = area > 0.0 and e0 > 0.0 and e1 > 0.0 and e2 > 0.0
    neg = area <= 0.0 and e0 < 0.0 and e1 < 0.0 and e2 < 0.0
    if in_box and (pos or neg):
        bary, inside = face_barycentric(p, m, ps.perspective_correct)
        if inside:
            _clipped, z = face_depth(bary, m, ps.clip_barycentric_coords)
            hit = z >= 0.0
    return hit, z, float(-1.0)


@wp.func
def test_face(ps: PassArgs, f: int, p: wp.vec2):
    """(hit, z, squared distance or -1 if not computed) of face f at pixel centre p.

    Same decisions as PyTorch3D's kernel. Without blur, :func:`test_face_sharp`.
    With blur, in an order that stops early: bbox; depth; the edge distance only
    when the pixel is outside the face.
    """
    if ps.blur_radius <= 0.0:
        return test_face_sharp(ps, f, p)
    hit = False
    z = float(0.0)
    dist = float(-1.0)
    bb = ps.face.bbox[f]
    if not (p[0] > bb[2] or p[0] < bb[0] or p[1] > bb[3] or p[1] < bb[1]):
        m = ps.face.verts[f]
        bary, inside = face_barycentric(p, m, ps.perspective_correct)
        _clipped, z = face_depth(bary, m, ps.clip_barycentric_coords)
        if z >= 0.0:
            if inside:
                hit = True
            else:
                dist = face_dist(ps, f, p)
                hit = dist < ps.blur_radius
    return hit, z, dist


@wp.func
def face_dist(ps: PassArgs, f: int, p: wp.vec2) -> float:
    m = ps.face.verts[f]
    return point_triangle_dist2(
        p, wp.vec2(m[0, 0], m[0, 1]), wp.vec2(m[1, 0], m[1, 1]), wp.vec2(m[2, 0], m[2, 1])
    )


@wp.func
def before(za: float, fa: int, zb: float, fb: int) -> bool:
    """The queue's order: ascending depth, exact ties by ascending face index."""
    return za < zb or (za == zb and fa < fb)


@wp.func
def locate_bin_pixel(ps: PassArgs, tid: int) -> wp.vec4i:
    """Thread -> (image, bin, row, column): consecutive threads sweep one bin,
    so a thread block reads the same face list (cache broadcast)."""
    tt = ps.bins.h * ps.bins.w
    local = tid % tt
    bin = tid // tt
    per_image = ps.bins.rows * ps.bins.cols
    n = bin // per_image
    bin_in_image = bin - n * per_image
    yi = (bin_in_image // ps.bins.cols) * ps.bins.h + local // ps.bins.w
    xi = (bin_in_image % ps.bins.cols) * ps.bins.w + local % ps.bins.w
    return wp.vec4i(n, bin, yi, xi)


@wp.func
def served_by_register_queue(ps: PassArgs, bin: int) -> bool:
    """Whether the register queue renders this bin's pixels (not a split-face bin)."""
    if ps.split.on != 0:
        return ps.split.marked[bin] == 0
    return True


@wp.func
def served_by_output_queue(ps: PassArgs, bin: int) -> bool:
    """Whether the output-array queue renders this bin's pixels."""
    if ps.split.only != 0:
        return ps.split.marked[bin] != 0
    return True


@wp.func
def face_range(ps: PassArgs, n: int, bin: int, first_pixel: bool) -> wp.vec3i:
    """(begin, end, indirect) of the faces to test for a bin: its list, or all
    faces of the mesh (in index order) when the pass is naive or the list
    overflowed (or, in a bin with split faces, is too long to have been sorted)."""
    if ps.naive == 0:
        count = ps.bins.count[bin]
        start = ps.bins.offset[bin]
        cap = ps.bins.max_per_bin
        if ps.split.on != 0:
            if ps.split.marked[bin] != 0:
                cap = wp.min(cap, ps.split.max_sorted)  # longer lists are not sorted
        if count <= cap and start + count <= ps.bins.faces.shape[0]:
            return wp.vec3i(start, start + count, 1)
        if first_pixel:
            wp.atomic_add(ps.bins.overflow, 0, 1)
    first = ps.mesh_first[n]
    return wp.vec3i(first, first + ps.mesh_count[n], 0)
