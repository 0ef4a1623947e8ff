"""PyTorch3D's ``rasterize_meshes`` backward, transcribed to NumPy float32.

Written from the conventions of PyTorch3D 0.7.9's CPU backward kernel
(``RasterizeMeshesBackwardCpu`` and the ``geometry_utils.h`` functions it calls),
one vectorised function per PyTorch3D function, with its order of operations:
every float32 operation here rounds as the C++ ``float`` operation it stands for
(NumPy float32 arrays: no FMA, no wider intermediates). Where the C++ mixes in a
``double`` (``kEpsilon = 1e-8`` is a ``const auto`` double; ``1e-5`` literals are
doubles) the arithmetic or comparison is done in float64 as the C++ does.

This is the independent truth the tests hold warpraster's backward to, slot by
slot and summed per vertex. It shares no code with warpraster.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
K_EPSILON = 1e-8  # PyTorch3D's kEpsilon: a double
F0 = F32(0.0)
F1 = F32(1.0)
F2 = F32(2.0)

__all__ = ["p3d_grad_verts", "p3d_slot_grads", "pixel_centres"]


def _pix_to_ndc(i, s1: int, s2: int) -> np.ndarray:
    """PixToNonSquareNdc (float): ``-offset + (range * i + offset) / S1``."""
    rng = F32(2.0)
    if s1 > s2:
        rng = F32(F32(s1) * rng) / F32(s2)
    offset = rng / F2
    return -offset + (rng * np.asarray(i, F32) + offset) / F32(s1)


def pixel_centres(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) float32 (H, W) of the output pixels (row 0 = top), as PyTorch3D."""
    yi = np.arange(h)
    xi = np.arange(w)
    y = _pix_to_ndc(h - 1 - yi, h, w)
    x = _pix_to_ndc(w - 1 - xi, w, h)
    return np.broadcast_to(x[None, :], (h, w)), np.broadcast_to(y[:, None], (h, w))


def _edge(px, py, ax, ay, bx, by):
    """EdgeFunctionForward: (p.x - v0.x) * (v1.y - v0.y) - (p.y - v0.y) * (v1.x - v0.x)."""
    return (px - ax) * (by - ay) - (py - ay) * (bx - ax)


def _edge_backward(px, py, ax, ay, bx, by, g):
    """EdgeFunctionBackward: (d/dp, d/dv0, d/dv1), each g * a 2-vector."""
    dp = (g * (by - ay), g * (ax - bx))
    da = (g * (py - by), g * (bx - px))
    db = (g * (ay - py), g * (px - ax))
    return dp, da, db


def _add(u, v):
    return (u[0] + v[0], u[1] + v[1])


def _line_dist_forward(px, py, ax, ay, bx, by):
    """PointLineDistanceForward (CPU): squared distance to the segment (v0, v1)."""
    dx = bx - ax
    dy = by - ay
    l2 = dx * dx + dy * dy
    degenerate = l2.astype(np.float64) <= K_EPSILON
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (dx * (px - ax) + dy * (py - ay)) / l2
    tt = np.minimum(np.maximum(t, F0), F1)
    qx = px - (ax + tt * dx)
    qy = py - (ay + tt * dy)
    d = qx * qx + qy * qy
    ex = px - bx
    ey = py - by
    return np.where(degenerate, ex * ex + ey * ey, d)


def _line_dist_backward(px, py, ax, ay, bx, by, g):
    """PointLineDistanceBackward: t clamped and held constant; (grad_v0, grad_v1).

    ``t_bot == 0`` (a zero-length segment) is 0/0 in PyTorch3D's CPU kernel (NaN);
    its CUDA kernel's ``__saturatef`` makes that t = 0, which is taken here.
    """
    dx = bx - ax
    dy = by - ay
    t_bot = dx * dx + dy * dy
    t_top = dx * (px - ax) + dy * (py - ay)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(t_bot > 0, t_top / np.where(t_bot > 0, t_bot, F1), F0)
    tt = np.minimum(np.maximum(t, F0), F1)
    s = F1 - tt
    projx = s * ax + tt * bx
    projy = s * ay + tt * by
    ddx = projx - px
    ddy = projy - py
    c0 = g * s * F2
    c1 = g * tt * F2
    return (c0 * ddx, c0 * ddy), (c1 * ddx, c1 * ddy)


def p3d_slot_grads(
    px, py, v0, v1, v2, g_zbuf, g_bary, g_dists, *, perspective_correct, clip_barycentric_coords,
    exact_perspective_grad=False,
):  # fmt: skip
    """Per-slot gradients (M, 3, 3) float32 (rows: vertices 0, 1, 2; columns: x, y, z).

    Args:
        px, py: (M,) float32 pixel centres.
        v0, v1, v2: (M, 3) float32 vertices of each slot's face.
        g_zbuf, g_dists: (M,) float32 upstream gradients; g_bary: (M, 3).
        exact_perspective_grad: warpraster's option (not PyTorch3D's): no
            gradient through the perspective denominator where it is clamped.
    """
    x0, y0, z0 = (v0[:, i].astype(F32) for i in range(3))
    x1, y1, z1 = (v1[:, i].astype(F32) for i in range(3))
    x2, y2, z2 = (v2[:, i].astype(F32) for i in range(3))
    px = np.asarray(px, F32)
    py = np.asarray(py, F32)
    gz = np.asarray(g_zbuf, F32)
    gd_up = np.asarray(g_dists, F32)
    gb = np.asarray(g_bary, F32)

    # BarycentricCoordinatesForward: area = E(v2, v0, v1) + kEpsilon (a double add)
    area = (_edge(x2, y2, x0, y0, x1, y1).astype(np.float64) + K_EPSILON).astype(F32)
    e0 = _edge(px, py, x1, y1, x2, y2)
    e1 = _edge(px, py, x2, y2, x0, y0)
    e2 = _edge(px, py, x0, y0, x1, y1)
    b0 = (e0 / area, e1 / area, e2 / area)  # bary0 (screen space)
    bary = b0
    if perspective_correct:  # BarycentricPerspectiveCorrectionForward
        t = (b0[0] * z1 * z2, b0[1] * z0 * z2, b0[2] * z0 * z1)
        denom_raw = t[0] + t[1] + t[2]
        denom = np.maximum(denom_raw, F32(K_EPSILON))
        bary = (t[0] / denom, t[1] / denom, t[2] / denom)
    bary_clip = bary
    if clip_barycentric_coords:  # BarycentricClipForward
        w = tuple(np.maximum(c, F0) for c in bary)
        ws = np.maximum(w[0] + w[1] + w[2], F32(1e-5))
        bary_clip = (w[0] / ws, w[1] / ws, w[2] / ws)
    inside = (bary[0] > 0) & (bary[1] > 0) & (bary[2] > 0)
    sign = np.where(inside, F32(-1.0), F32(1.0))

    # PointTriangleDistanceBackward
    gdist = sign * gd_up
    d01 = _line_dist_forward(px, py, x0, y0, x1, y1)
    d02 = _line_dist_forward(px, py, x0, y0, x2, y2)
    d12 = _line_dist_forward(px, py, x1, y1, x2, y2)
    pick01 = (d01 <= d02) & (d01 <= d12)
    pick02 = ~pick01 & (d02 <= d01) & (d02 <= d12)
    pick12 = ~pick01 & ~pick02 & (d12 <= d01) & (d12 <= d02)
    zero = np.zeros_like(px)
    dd = {k: [zero, zero] for k in (0, 1, 2)}
    for pick, (i, j), (ax, ay, bx, by) in (
        (pick01, (0, 1), (x0, y0, x1, y1)),
        (pick02, (0, 2), (x0, y0, x2, y2)),
        (pick12, (1, 2), (x1, y1, x2, y2)),
    ):
        gi, gj = _line_dist_backward(px, py, ax, ay, bx, by, gdist)
        dd[i] = [np.where(pick, gi[c], dd[i][c]) for c in range(2)]
        dd[j] = [np.where(pick, gj[c], dd[j][c]) for c in range(2)]

    # upstream of the final barycentrics: grad_bary + grad_zbuf * (z0, z1, z2)
    g = (gb[:, 0] + gz * z0, gb[:, 1] + gz * z1, gb[:, 2] + gz * z2)

    if clip_barycentric_coords:  # BarycentricClipBackward(bary, g)
        w = tuple(np.maximum(c, F0) for c in bary)
        w_sum = w[0] + w[1] + w[2]
        small = w_sum.astype(np.float64) < 1e-5  # float compared with a double
        grad_sum_clip = np.where(small, F0, F1)
        w_sum = np.where(small, F32(1e-5), w_sum)
        clip = tuple(np.where(c < 0, F0, F1) for c in bary)
        w2 = w_sum * w_sum  # pow(w_sum, 2.0f)
        gs = tuple(-wi / w2 * grad_sum_clip for wi in w)
        inv = F1 / w_sum
        g = (
            clip[0] * (g[0] * (inv + gs[0]) + g[1] * gs[1] + g[2] * gs[2]),
            clip[1] * (g[1] * (inv + gs[1]) + g[0] * gs[0] + g[2] * gs[2]),
            clip[2] * (g[2] * (inv + gs[2]) + g[0] * gs[0] + g[1] * gs[1]),
        )

    dz_persp = (zero, zero, zero)
    if perspective_correct:  # BarycentricPerspectiveCorrectionBackward(bary0, z, g)
        t = (b0[0] * z1 * z2, b0[1] * z0 * z2, b0[2] * z0 * z1)
        denom = np.maximum(t[0] + t[1] + t[2], F32(K_EPSILON))
        grad_denom_top = -t[0] * g[0] - t[1] * g[1] - t[2] * g[2]
        grad_denom = grad_denom_top / (denom * denom)
        if exact_perspective_grad:
            grad_denom = np.where(denom_raw < F32(K_EPSILON), F0, grad_denom)
        gt = (grad_denom + g[0] / denom, grad_denom + g[1] / denom, grad_denom + g[2] / denom)
        g = (gt[0] * z1 * z2, gt[1] * z0 * z2, gt[2] * z0 * z1)
        dz_persp = (
            gt[1] * b0[1] * z2 + gt[2] * b0[2] * z1,
            gt[0] * b0[0] * z2 + gt[2] * b0[2] * z0,
            gt[0] * b0[0] * z1 + gt[1] * b0[1] * z0,
        )

    # BarycentricCoordsBackward(p, v0, v1, v2, g)
    area2 = area * area  # pow(area, 2.0f)
    area_inv = F1 / area
    dw_darea = (-e0 / area2, -e1 / area2, -e2 / area2)
    d_area = tuple(g[i] * dw_darea[i] for i in range(3))
    d_e = tuple(g[i] * area_inv for i in range(3))
    area_args = (x2, y2, x0, y0, x1, y1)  # area = E(v2, v0, v1)
    _, de0_v1, de0_v2 = _edge_backward(px, py, x1, y1, x2, y2, d_e[0])
    a0_v2, a0_v0, a0_v1 = _edge_backward(*area_args, d_area[0])
    _, de1_v2, de1_v0 = _edge_backward(px, py, x2, y2, x0, y0, d_e[1])
    a1_v2, a1_v0, a1_v1 = _edge_backward(*area_args, d_area[1])
    _, de2_v0, de2_v1 = _edge_backward(px, py, x0, y0, x1, y1, d_e[2])
    a2_v2, a2_v0, a2_v1 = _edge_backward(*area_args, d_area[2])
    dw0 = (a0_v0, _add(de0_v1, a0_v1), _add(de0_v2, a0_v2))
    dw1 = (_add(de1_v0, a1_v0), a1_v1, _add(de1_v2, a1_v2))
    dw2 = (_add(de2_v0, a2_v0), _add(de2_v1, a2_v1), a2_v2)
    dbary = [_add(_add(dw0[v], dw1[v]), dw2[v]) for v in range(3)]

    out = np.empty((len(px), 3, 3), F32)
    for v in range(3):
        out[:, v, 0] = dbary[v][0] + dd[v][0]
        out[:, v, 1] = dbary[v][1] + dd[v][1]
        out[:, v, 2] = gz * bary_clip[v] + dz_persp[v]  # CUDA's form of the z row
    return out


def p3d_grad_verts(
    verts, faces, pix_to_face, grad_zbuf, grad_bary, grad_dists, *, perspective_correct,
    clip_barycentric_coords, exact_perspective_grad=False,
):  # fmt: skip
    """d loss / d verts for fragments ``pix_to_face`` (N, H, W, K) and upstream grads.

    Returns:
        dict: ``grad`` (V, 3) float64 sums of the float32 per-slot terms;
        ``abs_sum`` (V, 3) float64 sums of their magnitudes and ``count`` (V,)
        terms per vertex (to bound the rounding of a float32 sum in any order);
        ``slots`` (M, 3, 3) float32 per-slot terms and ``where`` (M,) their flat
        slot indices into (N*H*W*K).
    """
    verts = np.asarray(verts, F32)
    faces = np.asarray(faces, np.int64)
    p2f = np.asarray(pix_to_face)
    n, h, w, k = p2f.shape
    px, py = pixel_centres(h, w)
    px = np.broadcast_to(px[None, :, :, None], p2f.shape).reshape(-1)
    py = np.broadcast_to(py[None, :, :, None], p2f.shape).reshape(-1)
    flat = p2f.reshape(-1)
    where = np.nonzero(flat >= 0)[0]
    f = flat[where]
    tri = verts[faces[f]]  # (M, 3, 3)
    slots = p3d_slot_grads(
        px[where], py[where], tri[:, 0], tri[:, 1], tri[:, 2],
        np.asarray(grad_zbuf, F32).reshape(-1)[where],
        np.asarray(grad_bary, F32).reshape(-1, 3)[where],
        np.asarray(grad_dists, F32).reshape(-1)[where],
        perspective_correct=perspective_correct, clip_barycentric_coords=clip_barycentric_coords,
        exact_perspective_grad=exact_perspective_grad,
    )  # fmt: skip
    grad = np.zeros((len(verts), 3))
    abs_sum = np.zeros((len(verts), 3))
    count = np.zeros(len(verts), np.int64)
    for c in range(3):
        idx = faces[f, c]
        np.add.at(grad, idx, slots[:, c].astype(np.float64))
        np.add.at(abs_sum, idx, np.abs(slots[:, c].astype(np.float64)))
        np.add.at(count, idx, 1)
    return {"grad": grad, "abs_sum": abs_sum, "count": count, "slots": slots, "where": where}
