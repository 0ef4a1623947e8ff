"""Which faces can have a silhouette edge: a conservative per-face flag the pair
analysis reads before it loads a face's six vertices.

A pair blends only across an edge of the examined face that is a silhouette
candidate (:func:`~warpraster.antialiasing.kernels._analyse_pair`): the edge's
opposite vertex folds back over the face on screen (its orientation with the edge
has the face's sign), or the edge has no other face. On a dense mesh almost every
pair of neighbouring pixels lies on two faces of one surface that do not fold, and
the analysis of such a pair loads six vertices to find nothing.

:func:`face_silhouette_mask` decides per face, once per call, whether any edge
*may* be a candidate: 0 only where, for every edge, the two orientations are
certainly of opposite signs. The analysis computes them in float32, relative to a
pixel centre, so the flag is computed in float64 and an orientation counts as
certain only when its magnitude exceeds a bound on the analysis's rounding error:
the coordinates there are within ``M = max|X|, |Y| + max(W, H) / 2`` pixels of the
centre and carry at most a few float32 ulps of ``M`` (a product of differences and
a difference of products adds a few more), so an error stays far below
``M^2 * 2^-14`` (8x the ~``M^2 * 2^-17`` the operations allow). A face with a
boundary edge, a degenerate or non-finite one, is always flagged. A pair whose
face has flag 0 is a pair the analysis would reject at its silhouette test: the
decisions, alphas and images are unchanged, only cheaper.
"""

from __future__ import annotations

import warp as wp

from .kernels import AAInputs

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

#: The rounding bound's factor (see the module): 2^-14.
_ERROR_FACTOR = wp.constant(wp.float64(1.0 / 16384.0))


@wp.func
def _pixel64(v: wp.vec3, scale: wp.vec2, half: wp.vec2) -> wp.vec2d:
    """``v``'s pixel-space position (origin at the image centre), in float64."""
    return wp.vec2d(
        -(wp.float64(v[0]) * wp.float64(scale[0])) * wp.float64(half[0]),
        -(wp.float64(v[1]) * wp.float64(scale[1])) * wp.float64(half[1]),
    )


@wp.func
def _orient(o: wp.vec2d, p: wp.vec2d, q: wp.vec2d) -> wp.float64:
    """Twice the signed area of (o, p, q), as the analysis forms it."""
    return (p[0] - o[0]) * (q[1] - o[1]) - (q[0] - o[0]) * (p[1] - o[1])


@wp.func
def _extent(p: wp.vec2d) -> wp.float64:
    return wp.max(wp.abs(p[0]), wp.abs(p[1]))


@wp.func
def _certainly_folds_not(a: wp.float64, bb: wp.float64, bound: wp.float64) -> bool:
    """The two orientations are beyond the rounding bound and of opposite signs
    (False for NaN: a comparison with NaN fails)."""
    return (
        wp.abs(a) > bound and wp.abs(bb) > bound and (a > wp.float64(0.0)) != (bb > wp.float64(0.0))
    )


@wp.kernel
def face_silhouette_mask(
    # Data in:
    a: AAInputs,
    # Data out:
    mask_out: wp.array(dtype=wp.int32),
):
    """Face f: 1 when an edge of it may be a silhouette candidate, else 0."""
    f = wp.tid()
    half = a.half
    p0 = _pixel64(a.verts[a.faces[f, 0]], a.scale, half)
    p1 = _pixel64(a.verts[a.faces[f, 1]], a.scale, half)
    p2 = _pixel64(a.verts[a.faces[f, 2]], a.scale, half)
    m = wp.max(wp.max(_extent(p0), _extent(p1)), _extent(p2))
    maybe = int(0)
    o = wp.vec3i(a.opposite[f, 0], a.opposite[f, 1], a.opposite[f, 2])
    if o[0] < 0 or o[1] < 0 or o[2] < 0:
        maybe = 1
    else:
        o0 = _pixel64(a.verts[o[0]], a.scale, half)
        o1 = _pixel64(a.verts[o[1]], a.scale, half)
        o2 = _pixel64(a.verts[o[2]], a.scale, half)
        m = wp.max(wp.max(m, _extent(o0)), wp.max(_extent(o1), _extent(o2)))
        m = m + wp.max(wp.float64(half[0]), wp.float64(half[1]))
        bound = m * m * _ERROR_FACTOR
        bb = _orient(p0, p1, p2)
        if not (
            _certainly_folds_not(_orient(o0, p1, p2), bb, bound)
            and _certainly_folds_not(_orient(o1, p2, p0), bb, bound)
            and _certainly_folds_not(_orient(o2, p0, p1), bb, bound)
        ):
            maybe = 1
    mask_out[f] = maybe
