"""Polygons to triangles, vectorised over whole meshes (NumPy, no per-face Python loop).

Convex polygons (and all triangles and quads that are convex) are fanned from
their first corner. A polygon that is not convex (a corner turning against the
polygon's Newell normal) is ear-clipped instead, one Python loop per such
polygon: they are rare in production meshes, and a fan would draw triangles
outside a concave polygon. Polygons with fewer than 3 corners give no triangle
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
        num_concave: polygons that were ear-clipped because they are not convex.
    """

    def __init__(self, vertex, corner, face, num_polygons: int, num_concave: int):
        self.vertex = vertex
        self.corner = corner
        self.face = face
        self.num_polygons = int(num_polygons)
        self.num_concave = int(num_concave)

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


def _concave_polygons(
    counts: np.ndarray, starts: np.ndarray, indices: np.ndarray, points: np.ndarray
) -> np.ndarray:
    """Polygon ids (with >= 4 corners) that are not convex, vectorised."""
    big = np.nonzero(counts >= 4)[0]
    if big.size == 0:
        return big
    c = counts[big]
    poly = np.repeat(np.arange(big.size), c)
    first = np.cumsum(c) - c
    local = np.arange(poly.size) - first[poly]
    row = starts[big][poly] + local
    nxt = starts[big][poly] + (local + 1) % c[poly]
    prv = starts[big][poly] + (local - 1) % c[poly]
    p = points[indices[row]]
    pn = points[indices[nxt]]
    pp = points[indices[prv]]
    # Newell normal of each polygon
    cross = np.cross(p, pn)
    normal = np.zeros((big.size, 3))
    np.add.at(normal, poly, cross)
    turn = np.cross(p - pp, pn - p)
    sign = np.einsum("ij,ij->i", turn, normal[poly])
    scale = np.linalg.norm(normal, axis=1)[poly] * 1e-9
    bad = np.zeros(big.size, bool)
    np.logical_or.at(bad, poly, sign < -scale)
    return big[bad]


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


def triangulate(
    counts, indices, points=None, *, left_handed: bool = False
) -> Triangulation:
    """Triangulates ``faceVertexCounts`` / ``faceVertexIndices`` (already validated).

    Args:
        counts: (P,) corners per polygon.
        indices: (sum(counts),) point index of each corner.
        points: (N, 3) positions used to find concave polygons; None fans everything.
        left_handed: reverse the winding (USD ``orientation = "leftHanded"``), so
            the triangles are counter-clockwise seen from their front.

    Returns:
        :class:`Triangulation`.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    starts = np.cumsum(counts) - counts
    corner, face = _fan(counts, starts)
    num_concave = 0
    if points is not None and counts.size and counts.max() >= 4:
        pts = np.asarray(points, dtype=np.float64)
        concave = _concave_polygons(counts, starts, indices, pts)
        num_concave = int(concave.size)
        if num_concave:
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
            corner = np.concatenate([corner[keep], np.asarray(extra_corner, np.int64).reshape(-1, 3)])
            face = np.concatenate([face[keep], np.asarray(extra_face, np.int64)])
            order = np.argsort(face, kind="stable")
            corner, face = corner[order], face[order]
    if left_handed:
        corner = corner[:, [0, 2, 1]]
    vertex = indices[corner].astype(np.int32) if corner.size else np.zeros((0, 3), np.int32)
    return Triangulation(vertex, corner, face, counts.shape[0], num_concave)
