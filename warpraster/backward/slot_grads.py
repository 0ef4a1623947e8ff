"""Per-slot derivatives of ``zbuf``, ``bary_coords`` and ``dists``, PyTorch3D's way.

One slot is one (pixel, face) pair of the fragments. :func:`slot_grads` returns
the gradient of ``g_z * zbuf + g_bary . bary + g_dist * dist`` with respect to
the three vertices of that face, computed as PyTorch3D's ``rasterize_meshes``
backward kernel computes it (CPU kernel and ``geometry_utils.h``; PyTorch3D
0.7.9): the same formulas, the same conventions at ties and clamps, and the
same order of floating-point operations, so that the per-slot numbers agree
with PyTorch3D's to the bit where no FMA is contracted (``fuse_fp`` off).

The conventions, each a place where "the derivative" is not unique or where
the order of operations decides the numbers, are written down in
``docs/BACKWARD.md``. In short:

* closest edge for ``dists``: the first of e01, e02, e12 whose distance is
  ``<=`` the other two;
* point-to-segment distance: the clamped projection parameter ``t`` is a
  constant (no gradient through ``t``);
* barycentric clipping: a coordinate's gradient is zeroed only where it is
  ``< 0`` (an exact 0 passes); the sum term is dropped only where the clipped
  sum is below PyTorch3D's ``1e-5`` (a double: ``<= float32(1e-5)``); each
  coordinate as ``g_i * (1/s + gs_i) + sum_{j != i} g_j * gs_j``;
* perspective correction: the gradient flows through the clamped denominator
  ``max(sum, 1e-8)`` as if it were not clamped (``exact_perspective_grad`` = 0), or not
  at all where it is clamped (``exact_perspective_grad`` = 1: the true derivative);
* the clip backward sees the perspective-corrected barycentrics (PyTorch3D's
  CPU kernel; its CUDA kernel passes the uncorrected ones).

Warp's generated adjoint of the forward (``warpraster.backward.recompute``)
gives the same derivatives away from those ties and clamps, up to rounding.
"""

from __future__ import annotations

import warp as wp

from ..geometry import BARY_CLIP_EPS, EPS, edge_function, point_segment_dist2

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

__all__ = ["slot_grads"]


@wp.func
def _segment_dist2_grads(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, g: float):
    """g * (d/dv0, d/dv1) of the squared distance from p to segment (v0, v1), ``t`` held
    constant (PyTorch3D's PointLineDistanceBackward). A zero-length segment, which
    PyTorch3D turns into NaN (0/0), takes t = 0 as its CUDA kernel does."""
    v1v0 = v1 - v0
    pv0 = p - v0
    t_bot = wp.dot(v1v0, v1v0)
    t_top = wp.dot(v1v0, pv0)
    tt = float(0.0)
    if t_bot > 0.0:
        tt = wp.min(wp.max(t_top / t_bot, 0.0), 1.0)
    s = 1.0 - tt
    d = wp.vec2(s * v0[0] + tt * v1[0], s * v0[1] + tt * v1[1]) - p
    return (g * s * 2.0) * d, (g * tt * 2.0) * d


@wp.func
def _edge_grad_v0(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, g: float) -> wp.vec2:
    """g * d/dv0 of E(p, v0, v1) (PyTorch3D's EdgeFunctionBackward)."""
    return g * wp.vec2(p[1] - v1[1], v1[0] - p[0])


@wp.func
def _edge_grad_v1(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, g: float) -> wp.vec2:
    """g * d/dv1 of E(p, v0, v1)."""
    return g * wp.vec2(v0[1] - p[1], p[0] - v0[0])


@wp.func
def _edge_grad_p(p: wp.vec2, v0: wp.vec2, v1: wp.vec2, g: float) -> wp.vec2:
    """g * d/dp of E(p, v0, v1)."""
    return g * wp.vec2(v1[1] - v0[1], v0[0] - v1[0])


@wp.func
def slot_grads(
    p: wp.vec2,
    v0: wp.vec3,
    v1: wp.vec3,
    v2: wp.vec3,
    perspective_correct: int,
    clip_barycentric_coords: int,
    exact_perspective_grad: int,
    g_z: float,
    g_bary: wp.vec3,
    g_dist: float,
) -> wp.mat33:
    """Gradient of ``g_z * zbuf + g_bary . bary + g_dist * dist`` w.r.t. the face's
    vertices (rows 0, 1, 2: d/d(x, y, z) of v0, v1, v2) at pixel centre ``p``.

    ``perspective_correct``, ``clip_barycentric_coords``: the render's flags;
    ``exact_perspective_grad``: the true derivative at a clamped perspective
    denominator instead of PyTorch3D's.
    """
    a = wp.vec2(v0[0], v0[1])
    b = wp.vec2(v1[0], v1[1])
    c = wp.vec2(v2[0], v2[1])
    z0 = v0[2]
    z1 = v1[2]
    z2 = v2[2]
    # ---- forward: screen barycentrics b_w, perspective-corrected b_pp, final bf
    area = edge_function(c, a, b) + EPS
    e0 = edge_function(p, b, c)
    e1 = edge_function(p, c, a)
    e2 = edge_function(p, a, b)
    w = wp.vec3(e0 / area, e1 / area, e2 / area)
    bpp = w
    t = wp.vec3(0.0, 0.0, 0.0)
    den = float(1.0)
    clamped = False
    if perspective_correct != 0:
        t = wp.vec3(w[0] * z1 * z2, w[1] * z0 * z2, w[2] * z0 * z1)
        s = t[0] + t[1] + t[2]
        clamped = s < EPS
        den = wp.max(s, EPS)
        bpp = wp.vec3(t[0] / den, t[1] / den, t[2] / den)
    inside = bpp[0] > 0.0 and bpp[1] > 0.0 and bpp[2] > 0.0
    bf = bpp
    # ---- zbuf = bf . z: upstream of the final barycentrics
    g = wp.vec3(g_bary[0] + g_z * z0, g_bary[1] + g_z * z1, g_bary[2] + g_z * z2)
    if clip_barycentric_coords != 0:
        # PyTorch3D's BarycentricClipBackward on b_pp, in its order of operations
        cl = wp.vec3(wp.max(bpp[0], 0.0), wp.max(bpp[1], 0.0), wp.max(bpp[2], 0.0))
        raw = cl[0] + cl[1] + cl[2]
        keep = float(1.0)
        if raw <= BARY_CLIP_EPS:  # PyTorch3D: the float sum < 1e-5 compared as a double
            keep = 0.0
        cs = wp.max(raw, BARY_CLIP_EPS)  # the forward's denominator, and the backward's
        bf = wp.vec3(cl[0] / cs, cl[1] / cs, cl[2] / cs)
        c2 = cs * cs
        gs = wp.vec3(-cl[0] / c2 * keep, -cl[1] / c2 * keep, -cl[2] / c2 * keep)
        inv = 1.0 / cs
        g = wp.vec3(
            wp.where(bpp[0] < 0.0, 0.0, 1.0) * (g[0] * (inv + gs[0]) + g[1] * gs[1] + g[2] * gs[2]),
            wp.where(bpp[1] < 0.0, 0.0, 1.0) * (g[1] * (inv + gs[1]) + g[0] * gs[0] + g[2] * gs[2]),
            wp.where(bpp[2] < 0.0, 0.0, 1.0) * (g[2] * (inv + gs[2]) + g[0] * gs[0] + g[1] * gs[1]),
        )
    g_zv = wp.vec3(g_z * bf[0], g_z * bf[1], g_z * bf[2])
    if perspective_correct != 0:
        # PyTorch3D's BarycentricPerspectiveCorrectionBackward
        gd = (-t[0] * g[0] - t[1] * g[1] - t[2] * g[2]) / (den * den)
        if exact_perspective_grad != 0 and clamped:
            gd = 0.0  # the clamp's true derivative: the denominator is a constant
        gt = wp.vec3(gd + g[0] / den, gd + g[1] / den, gd + g[2] / den)
        g = wp.vec3(gt[0] * z1 * z2, gt[1] * z0 * z2, gt[2] * z0 * z1)
        g_zv = wp.vec3(
            g_zv[0] + (gt[1] * w[1] * z2 + gt[2] * w[2] * z1),
            g_zv[1] + (gt[0] * w[0] * z2 + gt[2] * w[2] * z0),
            g_zv[2] + (gt[0] * w[0] * z1 + gt[1] * w[1] * z0),
        )
    # ---- PyTorch3D's BarycentricCoordsBackward: per coordinate, an edge term and
    # an area term; summed per vertex in its order
    area2 = area * area
    area_inv = 1.0 / area
    ga0 = g[0] * (-e0 / area2)
    ga1 = g[1] * (-e1 / area2)
    ga2 = g[2] * (-e2 / area2)
    ge0 = g[0] * area_inv
    ge1 = g[1] * area_inv
    ge2 = g[2] * area_inv
    # area = E(c, a, b): d/dc = _edge_grad_p, d/da = _edge_grad_v0, d/db = _edge_grad_v1
    d_a = (
        _edge_grad_v0(c, a, b, ga0)
        + (_edge_grad_v1(p, c, a, ge1) + _edge_grad_v0(c, a, b, ga1))
        + (_edge_grad_v0(p, a, b, ge2) + _edge_grad_v0(c, a, b, ga2))
    )
    d_b = (
        (_edge_grad_v0(p, b, c, ge0) + _edge_grad_v1(c, a, b, ga0))
        + _edge_grad_v1(c, a, b, ga1)
        + (_edge_grad_v1(p, a, b, ge2) + _edge_grad_v1(c, a, b, ga2))
    )
    d_c = (
        (_edge_grad_v1(p, b, c, ge0) + _edge_grad_p(c, a, b, ga0))
        + (_edge_grad_v0(p, c, a, ge1) + _edge_grad_p(c, a, b, ga1))
        + _edge_grad_p(c, a, b, ga2)
    )
    # ---- signed distance: PyTorch3D's PointTriangleDistanceBackward
    g_d = g_dist
    if inside:
        g_d = -g_dist
    d01 = point_segment_dist2(p, a, b)
    d02 = point_segment_dist2(p, a, c)
    d12 = point_segment_dist2(p, b, c)
    if d01 <= d02 and d01 <= d12:
        s_a, s_b = _segment_dist2_grads(p, a, b, g_d)
        d_a = d_a + s_a
        d_b = d_b + s_b
    elif d02 <= d01 and d02 <= d12:
        s_a, s_c = _segment_dist2_grads(p, a, c, g_d)
        d_a = d_a + s_a
        d_c = d_c + s_c
    elif d12 <= d01 and d12 <= d02:
        s_b, s_c = _segment_dist2_grads(p, b, c, g_d)
        d_b = d_b + s_b
        d_c = d_c + s_c
    return wp.mat33(d_a[0], d_a[1], g_zv[0], d_b[0], d_b[1], g_zv[1], d_c[0], d_c[1], g_zv[2])
