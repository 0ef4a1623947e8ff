"""The edge topology the antialias op reads: each face edge's opposite vertex.

An edge of face f is named by the corner opposite it: edge e of f runs from
``faces[f, (e + 1) % 3]`` to ``faces[f, (e + 2) % 3]``. Its *opposite vertex*
is the third vertex of the other face that uses the same two vertex indices,
or -1 when no other face does (a mesh boundary, every edge of a triangle soup).
The antialias op treats an edge with no opposite vertex as a possible silhouette
always, and an edge with one as a silhouette only where its two faces fold over
each other on screen.

This is nvdiffrast's ``antialias_construct_topology_hash`` in another form: there
a device hash table keyed by the vertex pair holds up to two opposite vertices,
and every lookup probes it; here the lookup is done once, on the host, for faces
that do not change, and the op reads a plain (F, 3) table. Where an edge is used
by more than two faces, nvdiffrast keeps the first two distinct opposite vertices
its atomics happened to insert; here, those of the two lowest-numbered faces
(deterministic). Faces with an index outside [0, V) or a repeated vertex are
left out, as there.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..meshes import as_faces_array

__all__ = ["AntialiasTopology", "edge_opposites"]


def edge_opposites(faces: np.ndarray, num_verts: int) -> np.ndarray:
    """(F, 3) int32: ``out[f, e]`` the opposite vertex of edge e of face f, or -1.

    Args:
        faces: (F, 3) integer vertex indices.
        num_verts: V; faces with an index outside [0, V) or a repeated vertex
            take no part (their entries are -1).
    """
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    nf = f.shape[0]
    out = np.full((nf, 3), -1, dtype=np.int32)
    if nf == 0:
        return out
    valid = np.all((f >= 0) & (f < num_verts), axis=1)
    valid &= (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 2] != f[:, 0])
    a, b, o = f[:, [1, 2, 0]], f[:, [2, 0, 1]], f  # edge e: (a, b), opposite o
    keys = (np.minimum(a, b) * max(num_verts, 1) + np.maximum(a, b)).ravel()
    entry = np.flatnonzero(np.repeat(valid, 3))  # 3 f + e of the valid faces' edges
    if entry.size == 0:
        return out
    # Stable: within one edge, entries stay in face order (the insertion order).
    order = entry[np.argsort(keys[entry], kind="stable")]
    sk, so = keys[order], o.ravel()[order]
    n = order.size
    start = np.r_[True, sk[1:] != sk[:-1]]
    gid = np.cumsum(start) - 1
    gstart = np.flatnonzero(start)
    s0 = so[gstart]  # the first opposite vertex stored for the edge
    cand = np.where(so != s0[gid], np.arange(n), n)
    first_other = np.minimum.reduceat(cand, gstart)
    s1 = np.where(first_other < n, so[np.minimum(first_other, n - 1)], -1)  # the second
    g0, g1 = s0[gid], s1[gid]
    res = np.where(g0 == so, g1, np.where(g1 == so, g0, -1))
    out.ravel()[order] = res
    return out


class AntialiasTopology:
    """The opposite-vertex table of static faces, built once (host work at set-up).

    Args:
        faces: (F, 3) int vertex indices (``wp.array`` int32 or ``vec3i``, or
            NumPy), packed: a batch of meshes is one face array. Two faces share
            an edge only if they use the same two vertex indices.
        num_verts: V, the length of the vertex array the faces index.
        device: Warp device (default: the faces' own, or the default device).

    Attributes:
        faces: the (F, 3) int32 ``wp.array`` the table belongs to (pass this
            object only with these faces, and do not rewrite them).
        num_verts: V.
        opposite: (F, 3) int32 ``wp.array``, :func:`edge_opposites` of the faces.
    """

    def __init__(self, faces, num_verts: int, device=None):
        if isinstance(num_verts, bool) or not isinstance(num_verts, (int, np.integer)):
            raise TypeError(f"num_verts must be an int, got {type(num_verts).__name__}")
        if num_verts < 0:
            raise ValueError(f"num_verts must be >= 0, got {num_verts}")
        if device is None and isinstance(faces, wp.array):
            device = faces.device
        self.faces = as_faces_array(faces, "faces", device)
        self.device = self.faces.device
        self.num_verts = int(num_verts)
        host = self.faces.numpy() if self.faces.shape[0] else np.zeros((0, 3), np.int32)
        if host.size and (host.min() < 0 or host.max() >= self.num_verts):
            raise ValueError(
                f"faces has vertex indices in [{int(host.min())}, {int(host.max())}], outside "
                f"[0, {self.num_verts - 1}] for {self.num_verts} vertices"
            )
        table = edge_opposites(host, self.num_verts)
        self.opposite = wp.array(table.reshape(-1, 3), dtype=wp.int32, device=self.device)

    @property
    def num_faces(self) -> int:
        return self.faces.shape[0]
