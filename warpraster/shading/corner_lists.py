"""Each vertex's face corners, listed once from static faces (a CSR list).

Two per-vertex sums are scattered from the faces with float atomics when
Warp generates their adjoints: the area-weighted vertex normals
(:func:`~warpraster.shading.normals.vertex_normals`) and the backward of the
per-face corner tables (:func:`~warpraster.shading.shaders.gather_faces`).
Given a :class:`CornerLists` of the faces, both become gathers instead: one
thread per vertex walks its corners in ascending ``3 f + c`` order and writes
that vertex's row alone. No atomics, so the sums are the same bits run to run
(on the cpu device they are also the bits of the atomic path, whose serial
order is the same ascending one).

The list is built on the host from faces that do not change afterwards (a
:class:`~warpraster.Renderer`'s topology): once at set-up, never per call.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..meshes import as_faces_array
from ..structs import new_struct

__all__ = ["CornerLists", "VertexCorners", "corner_of"]


@wp.struct
class VertexCorners:
    """The corners around each vertex: ``entries[start[v]:start[v + 1]]`` are the
    corners ``3 f + c`` (face f, corner c in 0..2) with ``faces[f, c] == v``, in
    ascending order. ``start`` (V + 1,) int32, ``entries`` (3F,) int32,
    ``faces`` (F, 3) int32 the faces listed."""

    faces: wp.array2d(dtype=wp.int32)
    start: wp.array(dtype=wp.int32)
    entries: wp.array(dtype=wp.int32)


@wp.func
def corner_of(corners: VertexCorners, e: int) -> wp.vec2i:
    """(face, corner 0..2) of list entry ``e``."""
    fc = corners.entries[e]
    f = fc // 3
    return wp.vec2i(f, fc - 3 * f)


class CornerLists:
    """The :class:`VertexCorners` of static faces, built once (host work at set-up).

    Args:
        faces: (F, 3) int vertex indices (``wp.array`` int32 or ``vec3i``, or
            NumPy); the lists belong to this array: pass the same one to the
            functions that take ``corner_lists=``, and do not rewrite it later.
        num_verts: V, the length of the vertex arrays.
        device: Warp device (default: the faces' own, or the default device).

    Attributes:
        faces: the (F, 3) int32 ``wp.array`` listed.
        num_verts: V.
        start, entries: the (V + 1,) and (3F,) int32 device arrays.
        args: the :class:`VertexCorners` struct the kernels take.

    Raises:
        ValueError: a face index outside ``[0, num_verts)``, or ``num_verts < 0``.
    """

    def __init__(self, faces, num_verts: int, *, device=None):
        if int(num_verts) < 0:
            raise ValueError(f"num_verts must be >= 0, got {num_verts}")
        if device is None and isinstance(faces, wp.array):
            device = faces.device
        f = as_faces_array(faces, "faces", device)
        nv = int(num_verts)
        keys = f.numpy().reshape(-1).astype(np.int64)  # set-up: one host read
        if keys.size and (keys.min() < 0 or keys.max() >= nv):
            raise ValueError(
                f"faces has vertex indices in [{int(keys.min())}, {int(keys.max())}], outside "
                f"[0, {nv - 1}] for num_verts={nv}"
            )
        # a stable sort keeps each vertex's corners in ascending 3 f + c order
        entries = np.argsort(keys, kind="stable").astype(np.int32)
        start = np.zeros(nv + 1, np.int64)
        start[1:] = np.cumsum(np.bincount(keys, minlength=nv))
        dev = f.device
        self.faces = f
        self.num_verts = nv
        self.start = wp.array(start.astype(np.int32), dtype=wp.int32, device=dev)
        self.entries = wp.array(entries, dtype=wp.int32, device=dev)
        self.args = new_struct(VertexCorners, dev, faces=f, start=self.start, entries=self.entries)

    def check(self, faces: wp.array, num_verts: int, name: str = "corner_lists") -> None:
        """ValueError unless ``faces`` is the array listed (same memory and shape)
        and ``num_verts`` its vertex count (host attributes only: no device read)."""
        same = (
            faces.ptr == self.faces.ptr
            and tuple(faces.shape) == tuple(self.faces.shape)
            and wp.get_device(faces.device) == wp.get_device(self.faces.device)
        )
        if not same or int(num_verts) != self.num_verts:
            raise ValueError(
                f"{name} were built for another faces array or vertex count "
                f"({self.faces.shape[0]} faces, {self.num_verts} vertices); pass the faces "
                "array they were built from"
            )
