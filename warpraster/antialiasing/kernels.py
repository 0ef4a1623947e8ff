"""The antialias kernels: pair analysis, the blend, and the hand-written adjoint.

Work items are pairs of neighbouring pixels, a pixel and the one to its right
(column + 1, smaller NDC x) or below it (row + 1, smaller NDC y), whose face ids
differ (either may be empty). Pixel (n, r, c) owns the two pairs that start at
it: slot 0 the right pair, slot 1 the lower one. Nothing pairs across an image
border or across images.

Geometry is done in nvdiffrast's pixel space, on the grid that the project's NDC
maps to (``X = (-x sx) W/2 + W/2``, ``Y = (-y sy) H/2 + H/2`` with
``sx = min(H, W) / W``, ``sy = min(H, W) / H``: pixel (r, c) has its centre at
``(c + 0.5, r + 0.5)``), with the same float32 operations in the same order, so
that the discrete decisions (which edge, accepted or not) are nvdiffrast's.

Per pair (:func:`_analyse_pair`): the face examined is the one covering the pair
if only one does, else the nearer. Its edges are silhouette candidates where
the face on the other side (the edge's opposite vertex) folds back over it on
screen, or where there is none. Among the edges crossing the line through the
two pixel centres the one crossing farthest toward the other pixel is taken;
if it is a candidate, steep enough across that line and crosses within 1/16
pixel of the segment between the centres, the pair blends: the crossing
parameter t (0 at the examined face's pixel centre, 1 at the other) gives
``alpha = s (0.5 - t)`` (s = +1 when the examined face is the left/upper
pixel's), and the left/upper pixel (alpha > 0) or the right/lower one takes
``alpha (color[right/lower] - color[left/upper])``.

The gather forward (``deterministic=True``) has no float atomics: the blend kernel
gathers each pixel's (at most four) pairs in a fixed order. The default forward,
:mod:`warpraster.antialiasing.sparse`, adds each blending pair with atomics
instead. The adjoint gathers the colour gradient the same way as the blend;
vertex gradients are either added with atomics or stored per pair and summed in
a fixed order (deterministic).
"""

from __future__ import annotations

import warp as wp

from ..backward.sorted import SegmentEntries, set_entry
from ..geometry import barycentric, pixel_centre

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

#: float32 max: the "no crossing" score of an edge.
F32_MAX = wp.constant(3.402823466e38)
#: How far outside the segment between the two pixel centres a crossing may lie.
CROSS_EPS = wp.constant(0.0625)
#: Pair code of a pixel pair that does nothing.
NO_PAIR = wp.constant(-1)


@wp.func
def _signbit(x: float) -> bool:
    """The float sign bit (-0.0 is negative)."""
    return wp.copysign(1.0, x) < 0.0


@wp.func
def _same_sign(a: float, b: float) -> bool:
    return _signbit(a) == _signbit(b)


@wp.func
def _ratio_gt(n0: float, n1: float, d0: float, d1: float) -> bool:
    """n0 / d0 > n1 / d1 without dividing."""
    return (n0 * d1 > n1 * d0) == _same_sign(d0, d1)


@wp.func
def _farthest(n0: float, n1: float, n2: float, d0: float, d1: float, d2: float) -> int:
    """Index of the largest of the three ratios n_i / d_i (ties to the lower index)."""
    g10 = _ratio_gt(n1, n0, d1, d0)
    g20 = _ratio_gt(n2, n0, d2, d0)
    g21 = _ratio_gt(n2, n1, d2, d1)
    best = int(0)
    if g20 and g21:
        best = 2
    elif g10:
        best = 1
    return best


@wp.func
def _pixel_xy(v: wp.vec3, scale: wp.vec2, half: wp.vec2, centre: wp.vec2) -> wp.vec2:
    """``v``'s pixel-space position relative to a pixel centre: clip = -(ndc * scale),
    then ``clip * half - (centre - half)`` (``centre - half`` passed as ``centre``)."""
    return wp.vec2(
        -(v[0] * scale[0]) * half[0] - centre[0], -(v[1] * scale[1]) * half[1] - centre[1]
    )


@wp.func
def _face_depth(verts: wp.array(dtype=wp.vec3), faces: wp.array2d(dtype=wp.int32), f: int,
                r: int, c: int, height: int, width: int) -> float:  # fmt: skip
    """Depth of face f at pixel (r, c)'s centre (screen-space barycentrics, as a
    K = 1 raster without perspective correction)."""
    v0 = verts[faces[f, 0]]
    v1 = verts[faces[f, 1]]
    v2 = verts[faces[f, 2]]
    p = pixel_centre(r, c, height, width)
    b = barycentric(p, wp.vec2(v0[0], v0[1]), wp.vec2(v1[0], v1[1]), wp.vec2(v2[0], v2[1]))
    return b[0] * v0[2] + b[1] * v1[2] + b[2] * v2[2]


@wp.struct
class AAInputs:
    """What every antialias kernel reads.

    ``pix_to_face`` (N, H, W, 1) int32 packed face ids (negative = empty);
    ``zbuf`` (N, H, W, 1) float32 depths used to order two faces of a pair
    (``has_zbuf`` 0: recomputed from ``verts``); ``verts`` (V,) NDC; ``faces``
    (F, 3) and ``opposite`` (F, 3) the topology; ``color`` (N, H, W, C);
    ``scale`` (sx, sy) and ``half`` (W/2, H/2) of the NDC -> pixel map.
    """

    pix_to_face: wp.array4d(dtype=wp.int32)
    zbuf: wp.array4d(dtype=wp.float32)
    has_zbuf: int
    verts: wp.array(dtype=wp.vec3)
    faces: wp.array2d(dtype=wp.int32)
    opposite: wp.array2d(dtype=wp.int32)
    color: wp.array4d(dtype=wp.float32)
    scale: wp.vec2
    half: wp.vec2


@wp.func
def _face_id(a: AAInputs, n: int, r: int, c: int) -> int:
    """Pixel (n, r, c)'s face, -1 for none: also for an id past the faces (the
    object's calls read no values back, so this keeps a bad one from reading
    outside ``faces``)."""
    f = a.pix_to_face[n, r, c, 0]
    if f < 0 or f >= a.faces.shape[0]:
        f = -1
    return f


@wp.func
def _edge_xy(a: AAInputs, tri: int, corner: int, centre: wp.vec2) -> wp.vec2:
    return _pixel_xy(a.verts[a.faces[tri, corner]], a.scale, a.half, centre)


@wp.func
def _wing_xy(a: AAInputs, tri: int, e: int, own: wp.vec2, centre: wp.vec2) -> wp.vec2:
    """Pixel position of edge e's opposite vertex (``own``, the face's corner e, if none)."""
    o = a.opposite[tri, e]
    out = own
    if o >= 0:
        out = _pixel_xy(a.verts[o], a.scale, a.half, centre)
    return out


@wp.func
def _corner_coords(p0: wp.vec2, p1: wp.vec2, p2: wp.vec2, swap: int):
    """(x0, y0, x1, y1, x2, y2) of the three points, each point's x and y swapped
    when ``swap`` is nonzero."""
    if swap != 0:
        return p0[1], p0[0], p1[1], p1[0], p2[1], p2[0]
    return p0[0], p0[1], p1[0], p1[1], p2[0], p2[1]


@wp.func
def _analyse_pair(a: AAInputs, n: int, r: int, c: int, down: int):
    """(alpha, code) of the pair (n, r, c) -> right (``down`` 0) or lower neighbour;
    code: ``NO_PAIR``, or ``edge + 4 * use1`` (edge 0..2 of the examined face, use1
    when that face is the neighbour's)."""
    height = a.pix_to_face.shape[1]
    width = a.pix_to_face.shape[2]
    r1 = r + down
    c1 = c + 1 - down
    alpha = float(0.0)
    code = int(NO_PAIR)
    if r1 >= height or c1 >= width:
        return alpha, code
    t0 = _face_id(a, n, r, c)
    t1 = _face_id(a, n, r1, c1)
    if t0 == t1:
        return alpha, code
    tri = t0
    if t0 < 0:
        tri = t1
    if t0 >= 0 and t1 >= 0:
        num_faces = a.faces.shape[0]
        if t0 >= num_faces or t1 >= num_faces:
            return alpha, code
        z0 = float(0.0)
        z1 = float(0.0)
        if a.has_zbuf != 0:
            z0 = a.zbuf[n, r, c, 0]
            z1 = a.zbuf[n, r1, c1, 0]
        else:
            z0 = _face_depth(a.verts, a.faces, t0, r, c, height, width)
            z1 = _face_depth(a.verts, a.faces, t1, r1, c1, height, width)
        if not (z0 < z1):
            tri = t1
    use1 = int(0)
    pr = r
    pc = c
    if tri == t1:
        use1 = 1
        pr = r1
        pc = c1
    if tri >= a.faces.shape[0]:
        return alpha, code
    centre = wp.vec2(float(pc) + 0.5 - a.half[0], float(pr) + 0.5 - a.half[1])
    p0 = _edge_xy(a, tri, 0, centre)
    p1 = _edge_xy(a, tri, 1, centre)
    p2 = _edge_xy(a, tri, 2, centre)
    o0 = _wing_xy(a, tri, 0, p0, centre)
    o1 = _wing_xy(a, tri, 1, p1, centre)
    o2 = _wing_xy(a, tri, 2, p2, centre)
    x0, y0, x1, y1, x2, y2 = _corner_coords(p0, p1, p2, 0)
    # Orientation of the face, and of each edge with its opposite vertex.
    bb = (x1 - x0) * (y2 - y0) - (x2 - x0) * (y1 - y0)
    a0 = (x1 - o0[0]) * (y2 - o0[1]) - (x2 - o0[0]) * (y1 - o0[1])
    a1 = (x2 - o1[0]) * (y0 - o1[1]) - (x0 - o1[0]) * (y2 - o1[1])
    a2 = (x0 - o2[0]) * (y1 - o2[1]) - (x1 - o2[0]) * (y0 - o2[1])
    sil0 = _same_sign(a0, bb)
    sil1 = _same_sign(a1, bb)
    sil2 = _same_sign(a2, bb)
    if not (sil0 or sil1 or sil2):
        return alpha, code
    if down != 0:  # across the line becomes x, along it y
        x0, y0, x1, y1, x2, y2 = _corner_coords(p0, p1, p2, 1)
    dx0 = x2 - x1
    dx1 = x0 - x2
    dx2 = x1 - x0
    dy0 = y2 - y1
    dy1 = y0 - y2
    dy2 = y1 - y0
    ds = float(1.0)
    if use1 != 0:
        ds = -1.0
    d0 = ds * (x1 * dy0 - y1 * dx0)
    d1 = ds * (x2 * dy1 - y2 * dx1)
    d2 = ds * (x0 * dy2 - y0 * dx2)
    if _same_sign(y1, y2):
        d0 = -F32_MAX
        dy0 = 1.0
    if _same_sign(y2, y0):
        d1 = -F32_MAX
        dy1 = 1.0
    if _same_sign(y0, y1):
        d2 = -F32_MAX
        dy2 = 1.0
    di = _farthest(d0, d1, d2, dy0, dy1, dy2)
    dc = -F32_MAX
    if di == 0 and sil0 and wp.abs(dy0) >= wp.abs(dx0):
        dc = d0 / dy0
    if di == 1 and sil1 and wp.abs(dy1) >= wp.abs(dx1):
        dc = d1 / dy1
    if di == 2 and sil2 and wp.abs(dy2) >= wp.abs(dx2):
        dc = d2 / dy2
    if dc > -CROSS_EPS and dc < 1.0 + CROSS_EPS:
        dc = wp.min(wp.max(dc, 0.0), 1.0)
        alpha = ds * (0.5 - dc)
        code = di + 4 * use1
    return alpha, code


@wp.struct
class PairRecords:
    """Each pixel's two pairs, (N, H, W, 2) (slot 0 its right pair, slot 1 its lower
    one): ``alpha`` and ``code`` (``NO_PAIR`` or ``edge + 4 * use1``) as
    :func:`_analyse_pair` gives them. Written by :func:`analyse_pairs`, read by
    :func:`blend` and, through :class:`AAGrads`, the :func:`adjoint`."""

    alpha: wp.array4d(dtype=wp.float32)
    code: wp.array4d(dtype=wp.int32)


@wp.func
def _pixel_pairs(p: PairRecords, n: int, r: int, c: int):
    """The four pairs that write to pixel (n, r, c), in the order right, lower, left,
    upper: their codes (``NO_PAIR`` across the image border) and alphas (0 there)."""
    code = wp.vec4i(p.code[n, r, c, 0], p.code[n, r, c, 1], NO_PAIR, NO_PAIR)
    alpha = wp.vec4(p.alpha[n, r, c, 0], p.alpha[n, r, c, 1], 0.0, 0.0)
    if c > 0:
        code[2] = p.code[n, r, c - 1, 0]
        alpha[2] = p.alpha[n, r, c - 1, 0]
    if r > 0:
        code[3] = p.code[n, r - 1, c, 1]
        alpha[3] = p.alpha[n, r - 1, c, 1]
    return code, alpha


@wp.kernel
def analyse_pairs(
    # Data in:
    a: AAInputs,
    # Data out:
    pairs_out: PairRecords,
):
    """Both pairs of pixel (n, r, c): slot 0 right, slot 1 down."""
    n, r, c = wp.tid()
    al, co = _analyse_pair(a, n, r, c, 0)
    pairs_out.alpha[n, r, c, 0] = al
    pairs_out.code[n, r, c, 0] = co
    al, co = _analyse_pair(a, n, r, c, 1)
    pairs_out.alpha[n, r, c, 1] = al
    pairs_out.code[n, r, c, 1] = co


@wp.kernel
def blend(
    # Data in:
    color: wp.array4d(dtype=wp.float32),
    pairs: PairRecords,
    # Data out:
    out: wp.array4d(dtype=wp.float32),
):
    """out = color + the pairs that write to this pixel, in the order a serial pass
    over the pairs meets them (raster order of a pair's first pixel, the right pair
    before the lower): upper, left, right, lower. The sparse forward's atomics land
    in that order where kernels run serially (the CPU), so the two agree bit for bit
    there."""
    n, r, c = wp.tid()
    code, alpha = _pixel_pairs(pairs, n, r, c)
    right = code[0] != NO_PAIR and alpha[0] > 0.0
    lower = code[1] != NO_PAIR and alpha[1] > 0.0
    left = code[2] != NO_PAIR and not (alpha[2] > 0.0)
    upper = code[3] != NO_PAIR and not (alpha[3] > 0.0)
    for ch in range(color.shape[3]):
        own = color[n, r, c, ch]
        v = own
        if upper:
            v += alpha[3] * (own - color[n, r - 1, c, ch])
        if left:
            v += alpha[2] * (own - color[n, r, c - 1, ch])
        if right:
            v += alpha[0] * (color[n, r, c + 1, ch] - own)
        if lower:
            v += alpha[1] * (color[n, r + 1, c, ch] - own)
        out[n, r, c, ch] = v


@wp.struct
class AAGrads:
    """The adjoint's inputs and outputs beyond :class:`AAInputs`: the pair
    records ``pairs``, the output's gradient, and where the gradients go (``color_grad``
    accumulated when ``want_color``; vertex gradients added to ``verts_grad``
    with atomics, or, when ``store`` is set, written per pair slot as ``entries``
    of a fixed-order sum keyed by vertex (``num_verts`` = none))."""

    pairs: PairRecords
    out_grad: wp.array4d(dtype=wp.float32)
    want_color: int
    color_grad: wp.array4d(dtype=wp.float32)
    want_pos: int
    store: int
    num_verts: int
    verts_grad: wp.array(dtype=wp.vec3)
    entries: SegmentEntries


@wp.func
def _upstream(g: AAGrads, n: int, r: int, c: int, r1: int, c1: int, alpha: float, ch: int) -> float:
    """The output gradient at the pixel the pair wrote to."""
    out = g.out_grad[n, r1, c1, ch]
    if alpha > 0.0:
        out = g.out_grad[n, r, c, ch]
    return out


@wp.func
def _emit(g: AAGrads, entry: int, v: int, val: wp.vec3):
    if g.store != 0:
        set_entry(g.entries, entry, v, val)
    elif v < g.num_verts:
        wp.atomic_add(g.verts_grad, v, val)


@wp.func
def _pair_position_grad(a: AAInputs, g: AAGrads, n: int, r: int, c: int, down: int, entry: int):
    """Vertex gradients of pair (n, r, c, ``down``): d loss / d (the examined
    edge's two vertices), through the crossing point; entries ``entry`` and
    ``entry + 1``."""
    v1 = g.num_verts
    v2 = g.num_verts
    g1 = wp.vec3(0.0)
    g2 = wp.vec3(0.0)
    code = g.pairs.code[n, r, c, down]
    alpha = g.pairs.alpha[n, r, c, down]
    use1 = int(0)
    if code >= 4:
        use1 = 1
    # A pair with alpha +0 wrote nothing and has no gradient (nvdiffrast's rule;
    # -0 keeps one), nor has a clamped crossing (|alpha| = 0.5).
    live = code != NO_PAIR and not (alpha == 0.0 and use1 == 0) and wp.abs(alpha) < 0.5
    r1 = r + down
    c1 = c + 1 - down
    dd = float(0.0)
    if live:
        for ch in range(a.color.shape[3]):
            gu = _upstream(g, n, r, c, r1, c1, alpha, ch)
            dd += gu * (a.color[n, r1, c1, ch] - a.color[n, r, c, ch])
    pr = r
    pc = c
    if use1 != 0:
        pr = r1
        pc = c1
    tri = _face_id(a, n, pr, pc)
    if live and dd != 0.0 and tri >= 0 and tri < a.faces.shape[0]:
        di = code - 4 * use1
        i1 = (di + 1) % 3
        i2 = (di + 2) % 3
        v1 = a.faces[tri, i1]
        v2 = a.faces[tri, i2]
        centre = wp.vec2(float(pc) + 0.5 - a.half[0], float(pr) + 0.5 - a.half[1])
        q1 = _pixel_xy(a.verts[v1], a.scale, a.half, centre)
        q2 = _pixel_xy(a.verts[v2], a.scale, a.half, centre)
        hx = a.half[0]
        hy = a.half[1]
        x1 = q1[0]
        y1 = q1[1]
        x2 = q2[0]
        y2 = q2[1]
        if down != 0:
            x1 = q1[1]
            y1 = q1[0]
            x2 = q2[1]
            y2 = q2[0]
            hx = a.half[1]
            hy = a.half[0]
        dx = x2 - x1
        dy = y2 - y1
        db = x1 * dy - y1 * dx
        iy = 1.0 / (dy + wp.copysign(1.0e-3, dy))  # ~1/1000 pixel keeps it finite
        dby = db * iy
        iw1 = -iy * dd
        iw2 = iy * dd
        gx1 = iw1 * hx * y2
        gx2 = iw2 * hx * y1
        gy1 = iw1 * hy * (dby - x2)
        gy2 = iw2 * hy * (dby - x1)
        # Clip-space gradients to NDC (clip = -(ndc * scale)), x/y swapped back.
        sx = -a.scale[0]
        sy = -a.scale[1]
        if down != 0:
            g1 = wp.vec3(sx * gy1, sy * gx1, 0.0)
            g2 = wp.vec3(sx * gy2, sy * gx2, 0.0)
        else:
            g1 = wp.vec3(sx * gx1, sy * gy1, 0.0)
            g2 = wp.vec3(sx * gx2, sy * gy2, 0.0)
    else:
        v1 = g.num_verts
        v2 = g.num_verts
    _emit(g, entry, v1, g1)
    _emit(g, entry + 1, v2, g2)


# At most 40 registers (the compiler took 72), as sparse_blend: H200, ico5 x8 512²,
# the sparse forward + this adjoint 0.186 -> 0.171 ms graph (caps 64, 48 0.173,
# 0.174; 32 0.189), the same bits.
@wp.kernel(cuda_max_registers=40)
def adjoint(
    # Data in:
    a: AAInputs,
    # Gradients in and out:
    g: AAGrads,
):
    """Pixel (n, r, c): its colour gradient (gathered from its four pairs) and the
    vertex gradients of the two pairs it owns (entries 4 p .. 4 p + 3)."""
    n, r, c = wp.tid()
    height = a.color.shape[1]
    width = a.color.shape[2]
    if g.want_color != 0:
        code, alpha = _pixel_pairs(g.pairs, n, r, c)
        for ch in range(a.color.shape[3]):
            s = g.out_grad[n, r, c, ch]
            if code[0] != NO_PAIR:
                s -= alpha[0] * _upstream(g, n, r, c, r, c + 1, alpha[0], ch)
            if code[1] != NO_PAIR:
                s -= alpha[1] * _upstream(g, n, r, c, r + 1, c, alpha[1], ch)
            if code[2] != NO_PAIR:
                s += alpha[2] * _upstream(g, n, r, c - 1, r, c, alpha[2], ch)
            if code[3] != NO_PAIR:
                s += alpha[3] * _upstream(g, n, r - 1, c, r, c, alpha[3], ch)
            g.color_grad[n, r, c, ch] = g.color_grad[n, r, c, ch] + s
    if g.want_pos != 0:
        entry = 4 * ((n * height + r) * width + c)
        _pair_position_grad(a, g, n, r, c, 0, entry)
        _pair_position_grad(a, g, n, r, c, 1, entry + 2)


#: :func:`adjoint` without its register cap, for the calls that store each pair's
#: vertex gradients for the fixed-order sum (``deterministic``): there the cap cost
#: 2-3% (H200, ico5 x8 512², deterministic forward + backward 0.760-0.763 ms
#: uncapped, 0.777-0.782 capped). The same function: the same bits.
adjoint_stored = wp.kernel(
    adjoint.func,
    name="adjoint_stored",
    module="unique",
    enable_backward=False,
    module_options={"fuse_fp": False},
)
