"""Packed heterogeneous mesh batches: conversion and validation of rasterizer inputs.

Everything here runs on the host before any kernel is launched, but for what
kernels read and write of a batch: :class:`MeshArrays` and
:func:`store_face_or_point`. Checks that need to read device data (face index
range, offsets that add up) only run when ``validate=True``; a graph-captured
render loop validates its static topology once at set-up and then calls with
``validate=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp


@wp.struct
class MeshArrays:
    """A packed batch as a kernel reads it: ``verts`` (V,) vec3, ``faces`` (F, 3)
    int32 global vertex indices, and the mesh ranges ``mesh_first`` /
    ``mesh_count`` (N,) int32 (mesh n owns faces ``[first[n], first[n] + count[n])``)."""

    verts: wp.array(dtype=wp.vec3)
    faces: wp.array2d(dtype=wp.int32)
    mesh_first: wp.array(dtype=wp.int32)
    mesh_count: wp.array(dtype=wp.int32)


def mesh_arrays(verts: wp.array | None, faces: wp.array, mesh_first: wp.array | None = None,
                mesh_count: wp.array | None = None) -> MeshArrays:  # fmt: skip
    """A :class:`MeshArrays` of these arrays. The vertices or mesh ranges of a kernel
    that reads none may be left out (None): they are then zero-length arrays (no
    allocation), so that a tape can still take the struct's adjoint."""
    d = faces.device
    arrays = MeshArrays()
    arrays.verts = wp.empty(0, dtype=wp.vec3, device=d) if verts is None else verts
    arrays.faces = faces
    arrays.mesh_first = wp.empty(0, dtype=wp.int32, device=d) if mesh_first is None else mesh_first
    arrays.mesh_count = wp.empty(0, dtype=wp.int32, device=d) if mesh_count is None else mesh_count
    return arrays


@wp.func
def store_face_or_point(faces_out: wp.array2d(dtype=wp.int32), f: int, a: int, b: int, c: int,
                        keep: bool):  # fmt: skip
    """Writes face ``f`` as (a, b, c), or, unless ``keep``, collapsed to its first
    corner (a, a, a): a point, which the rasterizer never draws (kernels that take
    faces out of a draw without changing the face count)."""
    if keep:
        faces_out[f, 0] = a
        faces_out[f, 1] = b
        faces_out[f, 2] = c
    else:
        faces_out[f, 0] = a
        faces_out[f, 1] = a
        faces_out[f, 2] = a


@dataclass(frozen=True)
class PackedMeshes:
    """A batch of N triangle meshes packed into one vertex and one face array.

    Attributes:
        verts: ``wp.array(dtype=wp.vec3)`` (V,): x, y in NDC, z = depth.
        faces: ``wp.array2d(dtype=wp.int32)`` (F, 3): global vertex indices.
        mesh_to_face_first_idx: ``wp.array(dtype=wp.int32)`` (N,): first face of each mesh.
        num_faces_per_mesh: ``wp.array(dtype=wp.int32)`` (N,): face count of each mesh.
        clipped_faces_neighbor_idx: ``wp.array(dtype=wp.int32)`` (F,): split partner, -1
            none; None when no face has one (the raster workspace then supplies its
            own -1 array: nothing is allocated per call).
        has_neighbors: whether split partners may be present (then faces are offered
            to each pixel's queue in ascending index order, as PyTorch3D's rule for
            split faces depends on that order).
        split_flag: ``wp.array(dtype=wp.int32)`` (1,) on the device, nonzero when
            some face has a split partner (the clipper's ``any_split``), or None.
            With it, K = 1 binned rasterization keeps its small-face pass on the
            device when the flag is 0 (without split halves the offer order does
            not matter); without it, meshes with neighbours never use that pass.
    """

    verts: wp.array
    faces: wp.array
    mesh_to_face_first_idx: wp.array
    num_faces_per_mesh: wp.array
    clipped_faces_neighbor_idx: wp.array | None
    has_neighbors: bool = False
    split_flag: wp.array | None = None

    @property
    def num_meshes(self) -> int:
        return self.mesh_to_face_first_idx.shape[0]

    @property
    def num_faces(self) -> int:
        return self.faces.shape[0]

    @property
    def num_verts(self) -> int:
        return self.verts.shape[0]

    @property
    def device(self):
        return self.verts.device


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _check_device(arr: wp.array, device, name: str):
    if device is not None and wp.get_device(arr.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {arr.device}, but the vertices are on {device}")


def as_vec3_array(x, name: str, device=None) -> wp.array:
    """(V, 3) float32 vertices as a ``wp.vec3`` array, zero-copy where possible.

    A Warp ``vec3`` array is returned as is (its ``.grad`` stays the user's). A Warp
    (V, 3) float32 array is reinterpreted in place, sharing data and gradient.
    NumPy input is copied to ``device``.
    """
    if _is_torch(x):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if isinstance(x, wp.array):
        _check_device(x, device, name)
        if x.dtype == wp.vec3:
            if x.ndim != 1:
                raise ValueError(f"{name} must be 1-D of vec3, got shape {x.shape}")
            return x
        if x.dtype == wp.float32 and x.ndim == 2 and x.shape[1] == 3:
            if not x.is_contiguous:
                raise ValueError(f"{name} must be contiguous")
            grad = None
            if x.requires_grad and x.grad is not None:
                grad = wp.array(ptr=x.grad.ptr, dtype=wp.vec3, shape=(x.shape[0],), device=x.device)
            out = wp.array(ptr=x.ptr, dtype=wp.vec3, shape=(x.shape[0],), device=x.device)
            out._ref = x  # keep the owner alive
            if grad is not None:
                out.grad = grad
                out.requires_grad = True
            return out
        raise TypeError(
            f"{name} must be a wp.array of vec3 or (V, 3) float32, got dtype {x.dtype} "
            f"shape {x.shape}"
        )
    a = np.asarray(x)
    if a.dtype.kind not in "f":
        raise TypeError(f"{name} must hold floating-point values, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"{name} must have shape (V, 3), got {a.shape}")
    return wp.array(np.ascontiguousarray(a, dtype=np.float32), dtype=wp.vec3, device=device)


def as_faces_array(x, name: str, device=None) -> wp.array:
    """(F, 3) int32 faces as a ``wp.array2d(dtype=int32)``, zero-copy where possible."""
    if _is_torch(x):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if isinstance(x, wp.array):
        _check_device(x, device, name)
        if x.dtype == wp.vec3i and x.ndim == 1:
            out = wp.array(ptr=x.ptr, dtype=wp.int32, shape=(x.shape[0], 3), device=x.device)
            out._ref = x
            return out
        if x.dtype == wp.int32 and x.ndim == 2 and x.shape[1] == 3:
            return x
        raise TypeError(
            f"{name} must be a wp.array of vec3i or (F, 3) int32, got dtype {x.dtype} "
            f"shape {x.shape}"
        )
    a = np.asarray(x)
    if a.size == 0 and a.ndim <= 2:
        a = a.reshape(0, 3)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"{name} must have shape (F, 3), got {a.shape}")
    if a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        raise ValueError(f"{name} has indices that do not fit in int32")
    return wp.array(np.ascontiguousarray(a, dtype=np.int32), dtype=wp.int32, device=device)


def as_index_array(x, name: str, device=None, length: int | None = None) -> wp.array:
    """A 1-D int32 array (per-mesh offsets, counts, neighbour indices)."""
    if _is_torch(x):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if isinstance(x, wp.array):
        _check_device(x, device, name)
        if x.dtype != wp.int32 or x.ndim != 1:
            raise TypeError(f"{name} must be a 1-D int32 wp.array, got {x.dtype} {x.shape}")
        out = x
    else:
        a = np.asarray(x)
        if a.size == 0 and a.ndim == 1:
            a = a.astype(np.int32)  # an empty list is float64 to NumPy
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
        if a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
            raise ValueError(f"{name} has values that do not fit in int32")
        out = wp.array(a.astype(np.int32), dtype=wp.int32, device=device)
    if length is not None and out.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {out.shape[0]}")
    return out


def pack_meshes(
    verts,
    faces,
    mesh_to_face_first_idx,
    num_faces_per_mesh,
    clipped_faces_neighbor_idx=None,
    *,
    validate: bool = True,
) -> PackedMeshes:
    """Converts and validates the packed inputs of :func:`warpraster.rasterize_meshes`.

    Raises:
        TypeError: an input has the wrong type or dtype.
        ValueError: wrong shapes, mismatched devices, face indices out of range,
            offsets/counts that do not add up to the face count.
    """
    if not isinstance(mesh_to_face_first_idx, wp.array) and np.size(mesh_to_face_first_idx) == 0:
        raise ValueError(
            "mesh_to_face_first_idx is empty: a batch needs at least one mesh (an image per "
            "mesh); a mesh with no faces is fine"
        )
    device = verts.device if isinstance(verts, wp.array) else None
    v = as_vec3_array(verts, "verts", device)
    device = v.device
    f = as_faces_array(faces, "faces", device)
    first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", device)
    n_mesh = first.shape[0]
    if n_mesh < 1:
        raise ValueError("mesh_to_face_first_idx must name at least one mesh")
    count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", device, length=n_mesh)
    n_faces = f.shape[0]
    nb = None
    if clipped_faces_neighbor_idx is not None:
        nb = as_index_array(
            clipped_faces_neighbor_idx, "clipped_faces_neighbor_idx", device, length=n_faces
        )
    if validate:
        _validate_topology(v.shape[0], f, first, count, nb)
    return PackedMeshes(v, f, first, count, nb, clipped_faces_neighbor_idx is not None)


def _validate_topology(n_verts: int, faces, first, count, nb):
    """Host-side checks of the static topology (reads device arrays back)."""
    fa = faces.numpy()
    if fa.size:
        lo, hi = int(fa.min()), int(fa.max())
        if lo < 0 or hi >= n_verts:
            raise ValueError(
                f"faces has vertex indices in [{lo}, {hi}], outside [0, {n_verts - 1}] "
                f"for {n_verts} vertices"
            )
    fi = first.numpy().astype(np.int64)
    ci = count.numpy().astype(np.int64)
    if (ci < 0).any():
        raise ValueError(f"num_faces_per_mesh must be >= 0, got {ci.tolist()}")
    expected = np.concatenate([[0], np.cumsum(ci)[:-1]])
    if not np.array_equal(fi, expected):
        raise ValueError(
            "mesh_to_face_first_idx must be the running sum of num_faces_per_mesh "
            f"(expected {expected.tolist()}, got {fi.tolist()})"
        )
    if int(ci.sum()) != faces.shape[0]:
        raise ValueError(
            f"num_faces_per_mesh adds up to {int(ci.sum())} faces, but faces has {faces.shape[0]}"
        )
    na = np.zeros(0, np.int32) if nb is None else nb.numpy()
    if na.size and (na.min() < -1 or na.max() >= faces.shape[0]):
        raise ValueError("clipped_faces_neighbor_idx must hold -1 or a valid face index")
