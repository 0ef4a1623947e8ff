"""Face and vertex normals of packed meshes, on the device and differentiable.

Both follow PyTorch3D's ``Meshes`` exactly:

* ``faces_normals_packed``: ``n = cross(v1 - v0, v2 - v0)``, then
  ``n / max(|n|, 1e-6)``;
* ``verts_normals_packed``: at every face corner c (vertex i, followed by j and k
  in the face's order) the un-normalised ``cross(v_j - v_i, v_k - v_i)`` is added
  to vertex i (twice the face area times the unit normal: area weighting), then
  each sum is divided by ``max(|sum|, 1e-6)``. A vertex in no face gets (0, 0, 0).

The kernels are loop-free (the scatter is one ``atomic_add`` per face corner), so
Warp's generated adjoint gives exact gradients to the vertices on a ``wp.Tape``.
"""

from __future__ import annotations

import warp as wp

from ..meshes import as_faces_array, as_vec3_array

wp.set_module_options({"fuse_fp": False})

__all__ = ["NORMAL_EPS", "face_normals", "vertex_normals"]

#: Clamp of the norm in the normalisation (PyTorch3D's ``F.normalize(eps=1e-6)``).
NORMAL_EPS = wp.constant(1e-6)


@wp.func
def normalize_clamped(n: wp.vec3) -> wp.vec3:
    """``n / max(|n|, 1e-6)``; the branch keeps the adjoint finite at n = 0."""
    l2 = wp.dot(n, n)
    if l2 > NORMAL_EPS * NORMAL_EPS:
        return n / wp.sqrt(l2)
    return n / NORMAL_EPS


@wp.kernel
def _face_normals(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    # Data out:
    normals_out: wp.array(dtype=wp.vec3),
):
    f = wp.tid()
    v0 = verts[faces[f, 0]]
    normals_out[f] = normalize_clamped(wp.cross(verts[faces[f, 1]] - v0, verts[faces[f, 2]] - v0))


@wp.kernel
def _scatter_corner_normals(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    # Data out (zeroed by the caller):
    sums_out: wp.array(dtype=wp.vec3),
):
    f, c = wp.tid()
    i = faces[f, c]
    vi = verts[i]
    vj = verts[faces[f, (c + 1) % 3]]
    vk = verts[faces[f, (c + 2) % 3]]
    wp.atomic_add(sums_out, i, wp.cross(vj - vi, vk - vi))


@wp.kernel
def _normalize_rows(
    # Data in:
    sums: wp.array(dtype=wp.vec3),
    # Data out:
    normals_out: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    normals_out[i] = normalize_clamped(sums[i])


def _inputs(verts, faces, validate: bool):
    device = verts.device if isinstance(verts, wp.array) else None
    v = as_vec3_array(verts, "verts", device)
    f = as_faces_array(faces, "faces", v.device)
    if validate and f.shape[0]:
        fa = f.numpy()
        if fa.min() < 0 or fa.max() >= v.shape[0]:
            raise ValueError(
                f"faces has vertex indices in [{int(fa.min())}, {int(fa.max())}], outside "
                f"[0, {v.shape[0] - 1}] for {v.shape[0]} vertices"
            )
    return v, f


def _vec3_buffer(buf, name: str, length: int, device, requires_grad: bool) -> wp.array:
    if buf is None:
        return wp.zeros(length, dtype=wp.vec3, device=device, requires_grad=requires_grad)
    if not isinstance(buf, wp.array) or buf.dtype != wp.vec3 or tuple(buf.shape) != (length,):
        raise ValueError(f"{name} must be a wp.array of vec3 with shape ({length},)")
    if wp.get_device(buf.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {buf.device}, expected {device}")
    return buf


def face_normals(verts, faces, *, out: wp.array | None = None, validate: bool = True) -> wp.array:
    """Unit face normals, as PyTorch3D's ``Meshes.faces_normals_packed``.

    Args:
        verts: (V, 3) vertices: ``wp.array`` of ``vec3``, (V, 3) float32 ``wp.array``
            (gradients arrive in it) or NumPy.
        faces: (F, 3) int vertex indices (packed).
        out: optional preallocated (F,) ``vec3`` result (no allocation: capturable).
        validate: check face indices on the host (a device read).

    Returns:
        ``wp.array`` (F,) of ``vec3``; ``cross(v1 - v0, v2 - v0) / max(|.|, 1e-6)``.
    """
    v, f = _inputs(verts, faces, validate)
    out = _vec3_buffer(out, "out", f.shape[0], v.device, v.requires_grad)
    if f.shape[0]:
        wp.launch(_face_normals, dim=f.shape[0], inputs=[v, f], outputs=[out], device=v.device)
    return out


def vertex_normals(
    verts,
    faces,
    *,
    out: wp.array | None = None,
    sums_out: wp.array | None = None,
    validate: bool = True,
) -> wp.array:
    """Area-weighted unit vertex normals, as PyTorch3D's ``Meshes.verts_normals_packed``.

    Args:
        verts: (V, 3) vertices (see :func:`face_normals`).
        faces: (F, 3) int vertex indices (packed).
        out: optional preallocated (V,) ``vec3`` result.
        sums_out: optional preallocated (V,) ``vec3`` scratch for the un-normalised
            sums (zeroed here). With ``out`` and ``validate=False`` the call
            allocates nothing (capturable). Give each call recorded on one tape
            its own buffers.
        validate: check face indices on the host (a device read).

    Returns:
        ``wp.array`` (V,) of ``vec3``. On a ``wp.Tape`` gradients flow to ``verts``.
    """
    v, f = _inputs(verts, faces, validate)
    nv = v.shape[0]
    out = _vec3_buffer(out, "out", nv, v.device, v.requires_grad)
    sums = _vec3_buffer(sums_out, "sums_out", nv, v.device, v.requires_grad)
    sums.zero_()
    if f.shape[0]:
        wp.launch(
            _scatter_corner_normals,
            dim=(f.shape[0], 3),
            inputs=[v, f],
            outputs=[sums],
            device=v.device,
        )
    if nv:
        wp.launch(_normalize_rows, dim=nv, inputs=[sums], outputs=[out], device=v.device)
    return out
