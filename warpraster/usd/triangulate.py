"""Polygons to triangles, vectorised over whole meshes (NumPy, no per-face Python loop).

Polygons are fanned from their first corner. A fan covers a polygon exactly
when that corner sees all the others (always for convex polygons); where it
does not (a concave polygon whose fan has a triangle turning against the
polygon, found in one vectorised pass), the polygon is ear-clipped instead,
one Python loop per such polygon: they are rare in production meshes, and a fan
would draw triangles outside them. Self-intersecting polygons are ear-clipped as
far as possible and the rest fanned. Polygons with fewer than 3 corners give no triangle
(USD calls them degenerate and renderers skip them).
"""

from __future__ import annotations

import numpy as np

__all__ = ["Triangulation", "triangulate"]


class Triangulation:
    """Triangles of one polygon mesh.

    Attributes:
        vertex: (T, 3) int32 point index of each triangle corner.
        corner: (T, 3) int64 index into ``faceVertexIndices`` of each corner (the
            row of a ``faceVarying`` value).
        face: (T,) int64 polygon of each triangle (the row of a ``uniform`` value).
        num_polygons: number of polygons (``len(faceVertexCounts)``).
        concave: (n,) int64 polygons that were ear-clipped (a fan would not cover them).
    """

    def __init__(self, vertex, corner, face, num_polygons: int, concave=None):
        self.vertex = vertex
        self.corner = corner
        self.face = face
        self.num_polygons = int(num_polygons)
        self.concave = np.zeros(0, np.int64) if concave is None else np.asarray(concave, np.int64)

    @property
    def num_concave(self) -> int:
        return int(self.concave.size)

    def __len__(self) -> int:
        return int(self.vertex.shape[0])


def _fan(counts: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Corner rows (T, 3) and polygon of each triangle for fans from corner 0."""
    ntri = np.maximum(counts - 2, 0)
    face = np.repeat(np.arange(counts.shape[0], dtype=np.int64), ntri)
    first_tri = np.cumsum(ntri) - ntri
    k = np.arange(face.shape[0], dtype=np.int64) - first_tri[face]
    s = starts[face]
    return np.stack([s, s + k + 1, s + k + 2], axis=1), face


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cross products along the last axis (np.cross without its per-call overhead)."""
    ax, ay, az = a[..., 0], a[..., 1], a[..., 2]
    bx, by, bz = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx], axis=-1)


def _unfannable_polygons(
    counts: np.ndarray,
    corner: np.ndarray,
    face: np.ndarray,
    indices: np.ndarray,
    points: np.ndarray,
) -> np.ndarray:
    """Polygons (>= 4 corners) whose fan from corner 0 is not a triangulation of them.

    A fan from corner 0 covers a simple polygon exactly iff corner 0 sees every
    other corner, i.e. iff every fan triangle turns the same way as the
    polygon. The fan triangles' cross products sum to the polygon's Newell
    normal (twice its area vector), so one pass over the triangles finds the
    polygons with a triangle turning against it (by more than float32 rounding,
    1e-5 of the product of their lengths): those are ear-clipped. Convex
    polygons always pass; so do concave ones whose reflex corners corner 0 sees.
    """
    sel = np.nonzero(counts[face] >= 4)[0]
    if sel.size == 0:
        return np.zeros(0, np.int64)
    p = points[indices[corner[sel]]].astype(np.float32, copy=False)  # (n, 3, 3)
    fn = _cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    f = face[sel]
    n = counts.shape[0]
    normal = np.stack([np.bincount(f, weights=fn[:, k], minlength=n) for k in range(3)], axis=1)
    nf = normal.astype(np.float32)[f]
    dot = (fn * nf).sum(-1)
    tol = 1e-5 * np.sqrt((fn * fn).sum(-1) * (nf * nf).sum(-1))
    return np.unique(f[dot < -tol])


def _ear_clip(ring: np.ndarray) -> list[tuple[int, int, int]]:
    """Ear clipping of one simple polygon given as (n, 2) planar points.

    Returns corner triples (local corner numbers) with the polygon's winding.
    """
    n = ring.shape[0]
    area = 0.5 * np.sum(ring[:, 0] * np.roll(ring[:, 1], -1) - np.roll(ring[:, 0], -1) * ring[:, 1])
    orient = 1.0 if area >= 0 else -1.0
    left = list(range(n))
    tris = []
    guard = 0
    while len(left) > 3 and guard < n * n:
        guard += 1
        m = len(left)
        for i in range(m):
            a, b, c = left[(i - 1) % m], left[i], left[(i + 1) % m]
            pa, pb, pc = ring[a], ring[b], ring[c]
            cr = (pb[0] - pa[0]) * (pc[1] - pa[1]) - (pb[1] - pa[1]) * (pc[0] - pa[0])
            if cr * orient <= 0:
                continue  # reflex (or flat) corner: not an ear
            inside = False
            for j in left:
                if j in (a, b, c):
                    continue
                q = ring[j]
                d1 = (pb[0] - pa[0]) * (q[1] - pa[1]) - (pb[1] - pa[1]) * (q[0] - pa[0])
                d2 = (pc[0] - pb[0]) * (q[1] - pb[1]) - (pc[1] - pb[1]) * (q[0] - pb[0])
                d3 = (pa[0] - pc[0]) * (q[1] - pc[1]) - (pa[1] - pc[1]) * (q[0] - pc[0])
                if d1 * orient >= 0 and d2 * orient >= 0 and d3 * orient >= 0:
                    inside = True
                    break
            if not inside:
                tris.append((a, b, c))
                del left[i]
                break
        else:
            break  # no ear found (self-intersecting polygon): fan the rest
    for i in range(1, len(left) - 1):
        tris.append((left[0], left[i], left[i + 1]))
    return tris


def triangulate(counts, indices, points=None, *, left_handed: bool = False) -> Triangulation:
    """Triangulates ``faceVertexCounts`` / ``faceVertexIndices`` (already validated).

    Args:
        counts: (P,) corners per polygon.
        indices: (sum(counts),) point index of each corner.
        points: (N, 3) positions used to find polygons a fan does not cover; None fans everything.
        left_handed: reverse the winding (USD ``orientation = "leftHanded"``), so
            the triangles are counter-clockwise seen from their front.

    Returns:
        :class:`Triangulation`.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    starts = np.cumsum(counts) - counts
    corner, face = _fan(counts, starts)
    concave = np.zeros(0, np.int64)
    if points is not None and counts.size and counts.max() >= 4:
        pts = np.asarray(points)
        concave = _unfannable_polygons(counts, corner, face, indices, pts)
        if concave.size:
            keep = ~np.isin(face, concave)
            extra_corner, extra_face = [], []
            for poly in concave.tolist():
                rows = starts[poly] + np.arange(counts[poly])
                p = pts[indices[rows]]
                normal = np.cross(p, np.roll(p, -1, axis=0)).sum(0)
                axis = int(np.argmax(np.abs(normal)))
                plane = np.delete(p, axis, axis=1)
                if normal[axis] < 0:
                    plane = plane[:, ::-1]  # keep the polygon's own winding in the plane
                for a, b, c in _ear_clip(plane):
                    extra_corner.append(rows[[a, b, c]])
                    extra_face.append(poly)
            corner = np.concatenate(
                [corner[keep], np.asarray(extra_corner, np.int64).reshape(-1, 3)]
            )
            face = np.concatenate([face[keep], np.asarray(extra_face, np.int64)])
            order = np.argsort(face, kind="stable")
            corner, face = corner[order], face[order]
    if left_handed:
        corner = corner[:, [0, 2, 1]]
    vertex = indices[corner].astype(np.int32) if corner.size else np.zeros((0, 3), np.int32)
    return Triangulation(vertex, corner, face, counts.shape[0], concave)
