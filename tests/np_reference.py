"""A slow, obviously-correct NumPy reference rasterizer: the test oracle.

Written from the definitions in ``shared/reference/pytorch3d/README.md`` (the
semantics of PyTorch3D's naive ``rasterize_meshes``), not from any fast path of
this project. Faces are visited one at a time in Python, in ascending packed
index; the pixel grid of the face's bounding box is handled with NumPy.

Arithmetic is float64 by default. Pass ``dtype=np.float32`` to evaluate every
step in float32, in the order PyTorch3D's C++ kernel uses (each NumPy float32
operation rounds like a C++ ``float`` operation without FMA contraction); that
mode is handy to explain near-ties, the float64 mode is the oracle.

Conventions (see the README for the full list):

* pixel ``(yi, xi)`` is sampled at ``yf = ndc(H-1-yi, H, W)``,
  ``xf = ndc(W-1-xi, W, H)``, computed in float32 (the definition);
* the kernel receives ``blur_radius`` as a float32, so it is rounded to float32
  first; the bounding box grows by ``sqrt(blur_radius)`` while the blur test
  compares the *squared* distance with ``blur_radius``;
* outputs are sorted by ascending ``(zbuf, face index)``; unused slots hold
  ``pix_to_face = -1`` and ``zbuf = bary = dists = -1``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "EPS",
    "BARY_SUM_EPS",
    "ReferenceFragments",
    "edge_function",
    "face_area",
    "fragments_from_pix_to_face",
    "ndc",
    "pixel_centers",
    "pixel_math",
    "point_line_distance",
    "point_triangle_distance",
    "rasterize_reference",
    "reference_grad_verts_fd",
]

EPS = 1e-8
"""PyTorch3D's ``kEpsilon``: area threshold, min-z threshold, bary/persp clamps."""

BARY_SUM_EPS = 1e-5
"""Lower clamp of the barycentric sum when ``clip_barycentric_coords`` is on."""


class ReferenceFragments(NamedTuple):
    """Rasterizer outputs, NumPy arrays.

    Attributes:
        pix_to_face: ``(N, H, W, K)`` int64, packed face index, -1 where empty.
        zbuf: ``(N, H, W, K)`` depth, -1 fill.
        bary_coords: ``(N, H, W, K, 3)`` final (perspective-corrected, clipped)
            barycentrics, -1 fill.
        dists: ``(N, H, W, K)`` signed squared xy distance, negative inside,
            -1 fill.
    """

    pix_to_face: np.ndarray
    zbuf: np.ndarray
    bary_coords: np.ndarray
    dists: np.ndarray


# --------------------------------------------------------------------------
# Pixel centres
# --------------------------------------------------------------------------


def ndc(i, s1: int, s2: int) -> np.ndarray:
    """NDC coordinate of pixel index ``i`` along an axis of ``s1`` pixels.

    ``ndc(i, S1, S2) = -r/2 + (r*i + r/2) / S1`` with ``r = 2`` if ``S1 <= S2``
    else ``2*S1/S2``, every operation in float32 (as defined by PyTorch3D).

    Args:
        i: pixel index (int or int array) along this axis, *before* the flip.
        s1: number of pixels along this axis.
        s2: number of pixels along the other axis.

    Returns:
        float32 scalar or array.
    """
    f32 = np.float32
    r = f32(2.0)
    if s1 > s2:
        r = f32(s1) * r / f32(s2)
    offset = r / f32(2.0)
    i = np.asarray(i).astype(np.float32)
    return -offset + (r * i + offset) / f32(s1)


def pixel_centers(image_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre NDC coordinates of the output grid.

    Args:
        image_size: ``(H, W)``.

    Returns:
        ``(ys, xs)``: float32 arrays of shape ``(H,)`` and ``(W,)``; output row
        ``yi`` is sampled at ``y = ys[yi]`` and column ``xi`` at ``x = xs[xi]``
        (row 0 is the top, +Y up; column 0 is the left, +X left).
    """
    H, W = (int(s) for s in image_size)
    ys = ndc(H - 1 - np.arange(H), H, W)
    xs = ndc(W - 1 - np.arange(W), W, H)
    return ys, xs


# --------------------------------------------------------------------------
# Per-pixel geometry (broadcasting; every operand must already be `dtype`)
# --------------------------------------------------------------------------


def edge_function(px, py, ax, ay, bx, by):
    """``(p.x - a.x) * (b.y - a.y) - (p.y - a.y) * (b.x - a.x)``."""
    return (px - ax) * (by - ay) - (py - ay) * (bx - ax)


def face_area(x0, y0, x1, y1, x2, y2):
    """Signed edge-function area ``(x0-x1)*(y2-y1) - (y0-y1)*(x2-x1)``.

    Negative for back faces (culled by ``cull_backfaces``); ``|area| <= 1e-8``
    means degenerate.
    """
    return edge_function(x0, y0, x1, y1, x2, y2)


def point_line_distance(px, py, ax, ay, bx, by, eps):
    """Squared distance from ``p`` to the segment ``a -> b``.

    The projection parameter is clamped to ``[0, 1]``. A segment of squared
    length ``<= eps`` gives the squared distance to ``b`` (its *second* end).
    """
    dx = bx - ax
    dy = by - ay
    qx = px - ax
    qy = py - ay
    l2 = dx * dx + dy * dy
    t_top = qx * dx + qy * dy
    degenerate = l2 <= eps
    with np.errstate(divide="ignore", invalid="ignore"):
        t = t_top / np.where(degenerate, np.ones_like(l2), l2)
    t = np.minimum(np.maximum(t, 0), 1)
    projx = ax + t * dx
    projy = ay + t * dy
    ex = px - projx
    ey = py - projy
    d_seg = ex * ex + ey * ey
    bx_ = px - bx
    by_ = py - by
    d_end = bx_ * bx_ + by_ * by_
    return np.where(degenerate, d_end, d_seg)


def point_triangle_distance(px, py, x0, y0, x1, y1, x2, y2, eps):
    """Squared distance from ``p`` to the nearest edge segment of the triangle.

    Edges are taken as ``(v0, v1)``, ``(v0, v2)``, ``(v1, v2)``; the order
    matters only for degenerate edges (distance to the second end).
    """
    d01 = point_line_distance(px, py, x0, y0, x1, y1, eps)
    d02 = point_line_distance(px, py, x0, y0, x2, y2, eps)
    d12 = point_line_distance(px, py, x1, y1, x2, y2, eps)
    return np.minimum(np.minimum(d01, d02), d12)


def pixel_math(px, py, tri, *, perspective_correct, clip_barycentric_coords, dtype):
    """Everything the rasterizer computes for one (pixel, face) pair.

    Args:
        px, py: pixel-centre coordinates, arrays of ``dtype`` (any shape that
            broadcasts with the triangle components).
        tri: ``(x0, y0, z0, x1, y1, z1, x2, y2, z2)``, each of ``dtype``.
        perspective_correct: apply perspective correction to the barycentrics.
        clip_barycentric_coords: clamp negative barycentrics and renormalise.
        dtype: the float type of the arithmetic.

    Returns:
        dict with ``bary_unclipped`` (tuple of 3, perspective-corrected if on),
        ``bary`` (tuple of 3, final), ``z`` (depth from the final barycentrics),
        ``dist`` (unsigned squared distance), ``inside`` (bool), ``signed_dist``.
    """
    x0, y0, z0, x1, y1, z1, x2, y2, z2 = tri
    eps = dtype(EPS)
    # Barycentrics from the 2D edge functions; the area gets +eps.
    area = edge_function(x2, y2, x0, y0, x1, y1) + eps
    w0 = edge_function(px, py, x1, y1, x2, y2) / area
    w1 = edge_function(px, py, x2, y2, x0, y0) / area
    w2 = edge_function(px, py, x0, y0, x1, y1) / area
    if perspective_correct:
        t0 = w0 * z1 * z2
        t1 = w1 * z0 * z2
        t2 = w2 * z0 * z1
        denom = np.maximum(t0 + t1 + t2, eps)
        w0, w1, w2 = t0 / denom, t1 / denom, t2 / denom
    if clip_barycentric_coords:
        zero = dtype(0.0)
        c0 = np.maximum(w0, zero)
        c1 = np.maximum(w1, zero)
        c2 = np.maximum(w2, zero)
        s = np.maximum(c0 + c1 + c2, dtype(BARY_SUM_EPS))
        b0, b1, b2 = c0 / s, c1 / s, c2 / s
    else:
        b0, b1, b2 = w0, w1, w2
    z = b0 * z0 + b1 * z1 + b2 * z2
    dist = point_triangle_distance(px, py, x0, y0, x1, y1, x2, y2, eps)
    inside = (w0 > 0) & (w1 > 0) & (w2 > 0)
    return {
        "bary_unclipped": (w0, w1, w2),
        "bary": (b0, b1, b2),
        "z": z,
        "dist": dist,
        "inside": inside,
        "signed_dist": np.where(inside, -dist, dist),
    }


# --------------------------------------------------------------------------
# The rasterizer
# --------------------------------------------------------------------------

_NO_FACE = np.iinfo(np.int64).max  # sorts after every real face index


def _check_inputs(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh, image_size, K):
    verts = np.asarray(verts)
    faces = np.asarray(faces)
    if verts.ndim != 2 or verts.shape[1] != 3:
        raise ValueError(f"verts must have shape (V, 3), got {verts.shape}")
    if faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(f"faces must have shape (F, 3), got {faces.shape}")
    if faces.size and (faces.min() < 0 or faces.max() >= len(verts)):
        raise ValueError("faces index outside verts")
    first = np.asarray(mesh_to_face_first_idx, dtype=np.int64).reshape(-1)
    count = np.asarray(num_faces_per_mesh, dtype=np.int64).reshape(-1)
    if first.shape != count.shape:
        raise ValueError("mesh_to_face_first_idx and num_faces_per_mesh differ in length")
    if np.any(count < 0) or np.any(first < 0) or np.any(first + count > len(faces)):
        raise ValueError("per-mesh face ranges fall outside faces")
    H, W = (int(s) for s in image_size)
    if H < 1 or W < 1 or int(K) < 1:
        raise ValueError("image_size and faces_per_pixel must be >= 1")
    return verts, faces.astype(np.int64), first, count, (H, W)


def rasterize_reference(
    verts,
    faces,
    mesh_to_face_first_idx,
    num_faces_per_mesh,
    image_size,
    blur_radius: float = 0.0,
    faces_per_pixel: int = 8,
    perspective_correct: bool = False,
    clip_barycentric_coords: bool = False,
    cull_backfaces: bool = False,
    clipped_faces_neighbor_idx=None,
    dtype=np.float64,
) -> ReferenceFragments:
    """Rasterize packed meshes exactly as defined for PyTorch3D's naive kernel.

    Args:
        verts: ``(V, 3)`` packed vertices; x, y in NDC, z = depth.
        faces: ``(F, 3)`` packed, global vertex indices.
        mesh_to_face_first_idx: ``(N,)`` first packed face of each mesh.
        num_faces_per_mesh: ``(N,)`` face count of each mesh (may be 0).
        image_size: ``(H, W)``.
        blur_radius: compared with the *squared* distance (rounded to float32
            first, as the kernel receives a C++ float).
        faces_per_pixel: K.
        perspective_correct: perspective-correct barycentrics.
        clip_barycentric_coords: clamp barycentrics to the triangle.
        cull_backfaces: skip faces with negative area.
        clipped_faces_neighbor_idx: optional ``(F,)`` int, -1 or the index of
            the other half of a split quad. When a face's neighbour is already
            in the pixel's queue, the face replaces it only if its unsigned
            distance is strictly smaller, otherwise it is dropped.
        dtype: ``np.float64`` (the oracle) or ``np.float32`` (step-by-step
            float32 emulation).

    Returns:
        ReferenceFragments with float arrays of ``dtype``.
    """
    K = int(faces_per_pixel)
    verts, faces, first, count, (H, W) = _check_inputs(
        verts, faces, mesh_to_face_first_idx, num_faces_per_mesh, image_size, K
    )
    dtype = np.dtype(dtype).type
    N = len(first)
    if clipped_faces_neighbor_idx is None:
        neighbor = np.full(len(faces), -1, dtype=np.int64)
    else:
        neighbor = np.asarray(clipped_faces_neighbor_idx, dtype=np.int64).reshape(-1)
        if neighbor.shape != (len(faces),):
            raise ValueError("clipped_faces_neighbor_idx must have shape (F,)")

    v = np.asarray(verts, dtype=np.float32).astype(dtype)
    eps = dtype(EPS)
    blur = dtype(np.float32(blur_radius))
    grow = np.sqrt(blur)
    ys32, xs32 = pixel_centers((H, W))
    ys, xs = ys32.astype(dtype), xs32.astype(dtype)

    p2f = np.full((N, H, W, K), -1, dtype=np.int64)
    zbuf = np.full((N, H, W, K), -1, dtype=dtype)
    bary = np.full((N, H, W, K, 3), -1, dtype=dtype)
    dists = np.full((N, H, W, K), -1, dtype=dtype)

    for n in range(N):
        # Queue per pixel: K + 1 slots; the last one receives the candidate.
        qz = np.full((H, W, K + 1), np.inf, dtype=dtype)
        qf = np.full((H, W, K + 1), _NO_FACE, dtype=np.int64)
        qd = np.zeros((H, W, K + 1), dtype=dtype)
        qb = np.zeros((H, W, K + 1, 3), dtype=dtype)
        for f in range(int(first[n]), int(first[n] + count[n])):
            tri = tuple(v[faces[f]].reshape(-1))
            x0, y0, z0, x1, y1, z1, x2, y2, z2 = tri
            area = face_area(x0, y0, x1, y1, x2, y2)
            if cull_backfaces and area < 0:
                continue
            if -eps <= area <= eps:
                continue
            if min(z0, z1, z2) < eps:
                continue
            xmin, xmax = min(x0, x1, x2) - grow, max(x0, x1, x2) + grow
            ymin, ymax = min(y0, y1, y2) - grow, max(y0, y1, y2) + grow
            rows = np.nonzero((ys >= ymin) & (ys <= ymax))[0]
            cols = np.nonzero((xs >= xmin) & (xs <= xmax))[0]
            if rows.size == 0 or cols.size == 0:
                continue
            py = ys[rows][:, None]
            px = xs[cols][None, :]
            m = pixel_math(
                px,
                py,
                tri,
                perspective_correct=perspective_correct,
                clip_barycentric_coords=clip_barycentric_coords,
                dtype=dtype,
            )
            z = np.broadcast_to(m["z"], (rows.size, cols.size))
            keep = (z >= 0) & (m["inside"] | (m["dist"] < blur))
            rr, cc = np.nonzero(keep)
            if rr.size == 0:
                continue
            yi, xi = rows[rr], cols[cc]
            cz = z[rr, cc]
            cd = np.broadcast_to(m["signed_dist"], keep.shape)[rr, cc]
            cb = np.stack([np.broadcast_to(b, keep.shape)[rr, cc] for b in m["bary"]], -1)

            # Where to write: the neighbour's slot (replace) or the spare slot.
            slot = np.full(rr.size, K, dtype=np.int64)
            write = np.ones(rr.size, dtype=bool)
            if neighbor[f] != -1:
                hit = qf[yi, xi] == neighbor[f]  # (P, K + 1)
                has = hit.any(axis=1)
                nslot = np.argmax(hit, axis=1)
                slot = np.where(has, nslot, slot)
                old = np.abs(qd[yi, xi, nslot])
                write = ~has | (np.abs(cd) < old)
            yi, xi, slot = yi[write], xi[write], slot[write]
            qz[yi, xi, slot] = cz[write]
            qf[yi, xi, slot] = f
            qd[yi, xi, slot] = cd[write]
            qb[yi, xi, slot] = cb[write]

            # Re-sort the touched pixels by (z, face) and drop the (K+1)-th.
            order = np.lexsort((qf[yi, xi], qz[yi, xi]), axis=-1)
            for q in (qz, qf, qd):
                q[yi, xi] = np.take_along_axis(q[yi, xi], order, axis=-1)
            qb[yi, xi] = np.take_along_axis(qb[yi, xi], order[..., None], axis=1)
            qz[yi, xi, K] = np.inf
            qf[yi, xi, K] = _NO_FACE

        valid = qf[..., :K] != _NO_FACE
        p2f[n] = np.where(valid, qf[..., :K], -1)
        zbuf[n] = np.where(valid, qz[..., :K], -1)
        dists[n] = np.where(valid, qd[..., :K], -1)
        bary[n] = np.where(valid[..., None], qb[:, :, :K], -1)

    return ReferenceFragments(p2f, zbuf, bary, dists)


def fragments_from_pix_to_face(
    verts,
    faces,
    pix_to_face,
    image_size,
    blur_radius: float = 0.0,
    perspective_correct: bool = False,
    clip_barycentric_coords: bool = False,
    dtype=np.float64,
) -> ReferenceFragments:
    """Recompute ``zbuf``, ``bary_coords`` and ``dists`` for a given ``pix_to_face``.

    This is the differentiable half of the rasterizer with the discrete choice
    held fixed: perturb ``verts`` (float64 is kept, not rounded to float32),
    call this again and take central differences to get reference gradients.

    Args:
        verts: ``(V, 3)`` vertices (float64 recommended for finite differences).
        faces: ``(F, 3)`` packed faces.
        pix_to_face: ``(N, H, W, K)`` int, -1 for empty slots.
        image_size: ``(H, W)``; must match ``pix_to_face``.
        blur_radius: unused by the values (they do not depend on it); accepted
            so the call mirrors ``rasterize_reference``.
        perspective_correct: perspective-correct barycentrics.
        clip_barycentric_coords: clamp barycentrics to the triangle.
        dtype: float type of the arithmetic.

    Returns:
        ReferenceFragments (``pix_to_face`` is a copy of the input, int64).
    """
    del blur_radius  # the fragments do not depend on it
    dtype = np.dtype(dtype).type
    p2f = np.asarray(pix_to_face, dtype=np.int64)
    H, W = (int(s) for s in image_size)
    if p2f.ndim != 4 or p2f.shape[1:3] != (H, W):
        raise ValueError(f"pix_to_face must have shape (N, {H}, {W}, K), got {p2f.shape}")
    v = np.asarray(verts).astype(dtype)
    faces = np.asarray(faces, dtype=np.int64)
    ys32, xs32 = pixel_centers((H, W))
    ys, xs = ys32.astype(dtype), xs32.astype(dtype)

    zbuf = np.full(p2f.shape, -1, dtype=dtype)
    bary = np.full(p2f.shape + (3,), -1, dtype=dtype)
    dists = np.full(p2f.shape, -1, dtype=dtype)
    valid = p2f >= 0
    if valid.any():
        _, yi, xi, _ = np.nonzero(valid)
        tv = v[faces[p2f[valid]]]  # (M, 3, 3)
        tri = tuple(tv[:, i, j] for i in range(3) for j in range(3))
        m = pixel_math(
            xs[xi],
            ys[yi],
            tri,
            perspective_correct=perspective_correct,
            clip_barycentric_coords=clip_barycentric_coords,
            dtype=dtype,
        )
        zbuf[valid] = m["z"]
        bary[valid] = np.stack(m["bary"], -1)
        dists[valid] = m["signed_dist"]
    return ReferenceFragments(p2f.copy(), zbuf, bary, dists)


def reference_grad_verts_fd(
    verts,
    faces,
    pix_to_face,
    image_size,
    grad_zbuf,
    grad_bary,
    grad_dists,
    perspective_correct: bool = False,
    clip_barycentric_coords: bool = False,
    h: float = 1e-6,
) -> np.ndarray:
    """Central-difference gradient of the README's loss w.r.t. the vertices.

    ``loss = sum(zbuf * grad_zbuf) + sum(bary * grad_bary) + sum(dists * grad_dists)``
    over the used slots (``pix_to_face >= 0``; the unused slots are constants),
    with ``pix_to_face`` held fixed and the fragments recomputed in float64 by
    :func:`fragments_from_pix_to_face`. Only the slots whose face uses the
    perturbed vertex are recomputed.

    Args:
        verts: ``(V, 3)`` vertices (NDC x, y and depth z).
        faces: ``(F, 3)`` packed faces.
        pix_to_face: ``(N, H, W, K)``, -1 for empty slots.
        image_size: ``(H, W)``.
        grad_zbuf, grad_bary, grad_dists: upstream gradients, shaped like the
            fragments (``grad_bary``: ``(N, H, W, K, 3)``).
        perspective_correct, clip_barycentric_coords: the settings.
        h: step in NDC / depth units. 1e-6 keeps the truncation error
            (~h^2 * third derivative) and the float64 cancellation error
            (~1e-16 * |terms| / h) both far below 1e-6 relative, and small
            enough not to cross a kink (distance min / clamps) except at
            pixels within ~h of one.

    Returns:
        ``(V, 3)`` float64 gradient.
    """
    v0 = np.asarray(verts, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    p2f = np.asarray(pix_to_face, dtype=np.int64)
    valid = p2f >= 0
    _, yi, xi, _ = np.nonzero(valid)
    fid = p2f[valid]
    gz = np.asarray(grad_zbuf, dtype=np.float64)[valid]
    gb = np.asarray(grad_bary, dtype=np.float64)[valid]
    gd = np.asarray(grad_dists, dtype=np.float64)[valid]
    ys32, xs32 = pixel_centers(image_size)
    px_all, py_all = xs32.astype(np.float64)[xi], ys32.astype(np.float64)[yi]

    def loss(v, sel):
        tv = v[faces[fid[sel]]]
        m = pixel_math(
            px_all[sel],
            py_all[sel],
            tuple(tv[:, i, j] for i in range(3) for j in range(3)),
            perspective_correct=perspective_correct,
            clip_barycentric_coords=clip_barycentric_coords,
            dtype=np.float64,
        )
        return (
            np.sum(m["z"] * gz[sel])
            + np.sum(np.stack(m["bary"], -1) * gb[sel])
            + np.sum(m["signed_dist"] * gd[sel])
        )

    grad = np.zeros_like(v0)
    for i in range(len(v0)):
        sel = np.any(faces[fid] == i, axis=1)
        if not sel.any():
            continue
        for j in range(3):
            vp = v0.copy()
            vm = v0.copy()
            vp[i, j] += h
            vm[i, j] -= h
            grad[i, j] = (loss(vp, sel) - loss(vm, sel)) / (2 * h)
    return grad
