"""Per-pixel triangle math shared by the raster pass and the differentiable recompute.

Every formula follows PyTorch3D's rasterizer (same operations, same epsilons), so
that the discrete choice made by the raster pass and the values recomputed by the
differentiable kernels in :mod:`warpraster.fragments` agree to the bit.

Conventions (PyTorch3D NDC): +X left, +Y up, +Z into the screen; the shorter image
side spans [-1, 1]; pixel (yi, xi) is sampled at its centre; row 0 is the top.
"""

import warp as wp

#: Zero-area threshold, barycentric-area offset and perspective-denominator clamp.
EPS = wp.constant(1e-8)
#: Clamp of the barycentric sum after clipping negatives to 0.
BARY_CLIP_EPS = wp.constant(1e-5)


@wp.func
def finite_vec3(v: wp.vec3) -> bool:
    """All three coordinates finite (no NaN, no inf)."""
    return wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2])


@wp.func
def finite_face(v0: wp.vec3, v1: wp.vec3, v2: wp.vec3) -> bool:
    """A face whose three vertices are finite: the only faces drawn, and the only
    ones whose vertices a stage's adjoint differentiates (a face with a NaN or
    inf vertex contributes nothing, forward or backward, so it poisons no other
    vertex's normal or gradient)."""
    return finite_vec3(v0) and finite_vec3(v1) and finite_vec3(v2)


@wp.func
def finite_cross(p0: wp.vec3, p1: wp.vec3, p2: wp.vec3) -> wp.vec3:
    """``cross(p1 - p0, p2 - p0)``: the normal of face (p0, p1, p2), twice its area
    long; 0 for a face with a non-finite corner (never drawn, so it adds nothing to
    its neighbours' normals and takes no gradient)."""
    if not finite_face(p0, p1, p2):
        return wp.vec3(0.0)
    return wp.cross(p1 - p0, p2 - p0)


@wp.func
def pix_to_ndc(i: int, s1: int, s2: int) -> float:
    """NDC coordinate of the centre of pixel ``i`` along an axis of ``s1`` pixels.

    ``s2`` is the other image side: the shorter side spans [-1, 1], the longer
    one proportionally more (square pixels). ``i`` counts from the +NDC end, i.e.
    callers pass ``H - 1 - yi`` and ``W - 1 - xi``.
    """
    ratio = float(1.0)
    if s1 > s2:
        ratio = float(s1) / float(s2)
    rng = 2.0 * ratio
    offset = rng / 2.0
    return -offset + (rng * float(i) + offset) / float(s1)


@wp.func
def pixel_centre(yi: int, xi: int, height: int, width: int) -> wp.vec2:
    """NDC (x, y) of the centre of output pixel (yi, xi)."""
    return wp.vec2(
        pix_to_ndc(width - 1 - xi, width, height), pix_to_ndc(height - 1 - yi, height, width)
    )


@wp.func
def edge_function(p: wp.vec2, a: wp.vec2, b: wp.vec2) -> float:
    """Twice the signed area of (p, a, b)."""
    return (p[0] - a[0]) * (b[1] - a[1]) - (p[1] - a[1]) * (b[0] - a[0])


@wp.func
def face_area(v0: wp.vec2, v1: wp.vec2, v2: wp.vec2) -> float:
    """Signed edge-function area used for zero-area and back-face tests."""
    return edge_function(v0, v1, v2)


@wp.func
def barycentric(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, v2: wp.vec2) -> wp.vec3:
    """Screen-space barycentrics of ``p`` (area offset by EPS, as PyTorch3D)."""
    area = edge_function(v2, v0, v1) + EPS
    w0 = edge_function(p, v1, v2) / area
    w1 = edge_function(p, v2, v0) / area
    w2 = edge_function(p, v0, v1) / area
    return wp.vec3(w0, w1, w2)


@wp.func
def perspective_corrected(b: wp.vec3, z0: float, z1: float, z2: float) -> wp.vec3:
    """Perspective-correct barycentrics (denominator clamped to EPS).

    Products in PyTorch3D's order, (b_i * z_j) * z_k: float multiplication is not
    associative, and depth ties between faces are decided on these bits.
    """
    w0 = b[0] * z1 * z2
    w1 = b[1] * z0 * z2
    w2 = b[2] * z0 * z1
    denom = wp.max(w0 + w1 + w2, EPS)
    return wp.vec3(w0 / denom, w1 / denom, w2 / denom)


@wp.func
def clip_barycentric(b: wp.vec3) -> wp.vec3:
    """Negative barycentrics clamped to 0 and renormalised (sum clamped to 1e-5)."""
    w0 = wp.max(b[0], 0.0)
    w1 = wp.max(b[1], 0.0)
    w2 = wp.max(b[2], 0.0)
    s = wp.max(w0 + w1 + w2, BARY_CLIP_EPS)
    return wp.vec3(w0 / s, w1 / s, w2 / s)


@wp.func
def point_segment_dist2(p: wp.vec2, a: wp.vec2, b: wp.vec2) -> float:
    """Squared distance from ``p`` to segment (a, b); to ``b`` if the segment is degenerate."""
    ab = b - a
    l2 = wp.dot(ab, ab)
    d = float(0.0)
    if l2 <= EPS:
        pb = p - b
        d = wp.dot(pb, pb)
    else:
        t = wp.dot(ab, p - a) / l2
        tt = wp.clamp(t, 0.0, 1.0)
        q = p - (a + tt * ab)
        d = wp.dot(q, q)
    return d


@wp.func
def point_triangle_dist2(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, v2: wp.vec2) -> float:
    """Squared distance from ``p`` to the nearest edge of the triangle."""
    e01 = point_segment_dist2(p, v0, v1)
    e02 = point_segment_dist2(p, v0, v2)
    e12 = point_segment_dist2(p, v1, v2)
    return wp.min(wp.min(e01, e02), e12)


@wp.func
def is_inside(b: wp.vec3) -> bool:
    """Strict inside test on (perspective-corrected, unclipped) barycentrics."""
    return b[0] > 0.0 and b[1] > 0.0 and b[2] > 0.0


@wp.func
def face_barycentric(p: wp.vec2, face: wp.mat33, perspective_correct: int):
    """(barycentrics, inside) of pixel centre ``p`` in ``face`` (rows: its vertices'
    screen x, y and depth): perspective-corrected when ``perspective_correct`` !=
    0, unclipped; ``inside`` the strict test on them."""
    a = wp.vec2(face[0, 0], face[0, 1])
    b = wp.vec2(face[1, 0], face[1, 1])
    c = wp.vec2(face[2, 0], face[2, 1])
    bary = barycentric(p, a, b, c)
    if perspective_correct != 0:
        bary = perspective_corrected(bary, face[0, 2], face[1, 2], face[2, 2])
    return bary, is_inside(bary)


@wp.func
def face_depth(bary: wp.vec3, face: wp.mat33, clip_barycentric_coords: int):
    """(barycentrics, z) in ``face`` (rows as :func:`face_barycentric`): ``bary``
    clipped when ``clip_barycentric_coords`` != 0, and the depth they interpolate."""
    out = bary
    if clip_barycentric_coords != 0:
        out = clip_barycentric(bary)
    return out, out[0] * face[0, 2] + out[1] * face[1, 2] + out[2] * face[2, 2]
