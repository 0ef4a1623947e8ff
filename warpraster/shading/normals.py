"""Face and vertex normals of packed meshes, on the device and differentiable.

Both follow PyTorch3D's ``Meshes`` exactly:

* ``faces_normals_packed``: ``n = cross(v1 - v0, v2 - v0)``, then
  ``n / max(|n|, 1e-6)``;
* ``verts_normals_packed``: at every face corner c (vertex i, followed by j and k
  in the face's order) the un-normalised ``cross(v_j - v_i, v_k - v_i)`` is added
  to vertex i (twice the face area times the unit normal: area weighting), then
  each sum is divided by ``max(|sum|, 1e-6)``. A vertex in no face gets (0, 0, 0).

Without corner lists the kernels are loop-free (the scatter is one ``atomic_add``
per face corner), so Warp's generated adjoint gives exact gradients to the
vertices on a ``wp.Tape``. With the :class:`~warpraster.shading.corner_lists.CornerLists`
of static faces the sums are gathered instead (one thread per vertex over its
corners, ascending), forward and backward: no atomics, the same bits run to run,
and a hand-written adjoint on the tape.

:func:`face_normals_adjoint` and :func:`vertex_normals_adjoint` run a call's
adjoint alone, without a tape and without running the forward again (what the
torch ops' backwards use).
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape, record_func
from ..geometry import finite_cross, finite_face
from ..meshes import as_faces_array, as_vec3_array
from .corner_lists import CornerLists, VertexCorners, corner_of

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "NORMAL_EPS",
    "face_normals",
    "face_normals_adjoint",
    "vertex_normals",
    "vertex_normals_adjoint",
]

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
    v1 = verts[faces[f, 1]]
    v2 = verts[faces[f, 2]]
    n = wp.vec3(0.0)  # a face with a non-finite vertex is never drawn: no normal, no gradient
    if finite_face(v0, v1, v2):
        n = normalize_clamped(wp.cross(v1 - v0, v2 - v0))
    normals_out[f] = n


@wp.func
def corner_cross(verts: wp.array(dtype=wp.vec3), faces: wp.array2d(dtype=wp.int32), f: int, c: int):
    """``cross(v_j - v_i, v_k - v_i)`` at corner c of face f (i, j, k the face's
    vertices from corner c on, in the face's order); 0 for a face with a
    non-finite vertex (never drawn: it adds nothing to its neighbours' normals)."""
    vi = verts[faces[f, c]]
    vj = verts[faces[f, (c + 1) % 3]]
    vk = verts[faces[f, (c + 2) % 3]]
    return finite_cross(vi, vj, vk)


@wp.kernel
def _scatter_corner_normals(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    # Data out (zeroed by the caller):
    sums_out: wp.array(dtype=wp.vec3),
):
    f, c = wp.tid()
    wp.atomic_add(sums_out, faces[f, c], corner_cross(verts, faces, f, c))


@wp.kernel(enable_backward=False)
def _gather_corner_normals(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    corners: VertexCorners,
    # Data out:
    sums_out: wp.array(dtype=wp.vec3),
):
    """Vertex i: the sum of its corners' cross products, in list order (a loop, so
    not differentiated by Warp: :func:`_corner_normals_adjoint` is its adjoint)."""
    i = wp.tid()
    s = wp.vec3(0.0)
    for e in range(corners.start[i], corners.start[i + 1]):
        fc = corner_of(corners, e)
        s = s + corner_cross(verts, corners.faces, fc[0], fc[1])
    sums_out[i] = s


@wp.func
def _corner_grad(
    verts: wp.array(dtype=wp.vec3),
    corners: VertexCorners,
    sums_grad: wp.array(dtype=wp.vec3),
    e: int,
):
    """List entry e (vertex p, corner c of face f): the gradient at v_p of the
    face's three corner terms ``sums_grad[i] . cross(v_j - v_i, v_k - v_i)``.

    They are one cross product, ``cross(v_b - v_a, v_c - v_a)`` for the face
    (a, b, c), so the face adds ``G . cross(v_b - v_a, v_c - v_a)`` with
    ``G = sums_grad[a] + sums_grad[b] + sums_grad[c]``, whose gradient at v_a is
    ``cross(G, v_c - v_b)`` (cyclically at b and c)."""
    fc = corner_of(corners, e)
    faces = corners.faces
    f = fc[0]
    if not finite_face(verts[faces[f, 0]], verts[faces[f, 1]], verts[faces[f, 2]]):
        return wp.vec3(0.0)  # the face added nothing (corner_cross)
    g = sums_grad[faces[f, 0]] + sums_grad[faces[f, 1]] + sums_grad[faces[f, 2]]
    return wp.cross(g, verts[faces[f, (fc[1] + 2) % 3]] - verts[faces[f, (fc[1] + 1) % 3]])


@wp.kernel(enable_backward=False)
def _corner_normals_adjoint(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    corners: VertexCorners,
    # Gradient in:
    sums_grad: wp.array(dtype=wp.vec3),
    # Gradient out (added to):
    verts_grad_out: wp.array(dtype=wp.vec3),
):
    """Vertex p: the gradient of ``sum_corners sums_grad[i] . cross(v_j - v_i, v_k - v_i)``
    with respect to v_p, over the faces around p, in list order (:func:`_corner_grad`)."""
    p = wp.tid()
    g = wp.vec3(0.0)
    for e in range(corners.start[p], corners.start[p + 1]):
        g = g + _corner_grad(verts, corners, sums_grad, e)
    verts_grad_out[p] = verts_grad_out[p] + g


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


def _gather_normal_sums(v: wp.array, corners: VertexCorners, sums: wp.array) -> None:
    """Launches the per-vertex gather of the corner sums outside the tape and records
    its adjoint on the active tape (when ``v`` and ``sums`` carry gradients)."""
    nv = v.shape[0]
    wp.launch(_gather_corner_normals, dim=nv, inputs=[v, corners], outputs=[sums],
              device=v.device, record_tape=False)  # fmt: skip
    tape = active_tape()
    if tape is None or v.grad is None or sums.grad is None:
        return
    v_grad, sums_grad = v.grad, sums.grad

    def backward():
        wp.launch(_corner_normals_adjoint, dim=nv, inputs=[v, corners, sums_grad],
                  outputs=[v_grad], device=v.device)  # fmt: skip

    record_func(tape, backward, arrays=[v, sums])


def vertex_normals(
    verts,
    faces,
    *,
    out: wp.array | None = None,
    sums_out: wp.array | None = None,
    validate: bool = True,
    corner_lists: CornerLists | None = None,
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
        corner_lists: the :class:`~warpraster.shading.corner_lists.CornerLists` of
            ``faces`` (built once for static faces; ``faces`` must be the very array
            they list): the sums are then gathered per vertex, forward and backward,
            with no atomics (the same bits run to run). None: scattered with atomics,
            differentiated by Warp (faces may change from call to call).

    Returns:
        ``wp.array`` (V,) of ``vec3``. On a ``wp.Tape`` gradients flow to ``verts``.
    """
    v, f = _inputs(verts, faces, validate)
    nv = v.shape[0]
    if corner_lists is not None:
        corner_lists.check(f, nv)
    out = _vec3_buffer(out, "out", nv, v.device, v.requires_grad)
    sums = _vec3_buffer(sums_out, "sums_out", nv, v.device, v.requires_grad)
    if corner_lists is not None:
        if nv:
            _gather_normal_sums(v, corner_lists.args, sums)
    else:
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


# ----------------------------------------------------------------------------- adjoints
def face_normals_adjoint(
    verts: wp.array, faces: wp.array, normals_grad: wp.array, verts_grad: wp.array
) -> None:
    """The adjoint of :func:`face_normals` alone: adds to ``verts_grad`` ((V,) ``vec3``)
    the gradient for ``normals_grad`` ((F,) ``vec3``), from the forward's ``verts``
    ((V,) ``vec3``) and ``faces`` ((F, 3) int32); the forward is not run.

    The launch a ``wp.Tape``'s replay makes (the same bits), with the gradient
    buffers as arguments (not the arrays' ``.grad``): nothing is checked or
    allocated, ``normals_grad`` is only read (an adjoint launch writes no forward
    output: it stands in for the normals).
    """
    if faces.shape[0]:
        wp.launch(_face_normals, dim=faces.shape[0], inputs=[verts, faces],
                  outputs=[normals_grad], adj_inputs=[verts_grad, None],
                  adj_outputs=[normals_grad], adjoint=True, device=verts.device)  # fmt: skip


def vertex_normals_adjoint(
    verts: wp.array,
    faces: wp.array,
    sums: wp.array,
    normals_grad: wp.array,
    verts_grad: wp.array,
    *,
    sums_grad: wp.array | None = None,
    corner_lists: CornerLists | None = None,
) -> None:
    """The adjoint of :func:`vertex_normals` alone: adds to ``verts_grad`` the
    gradient for ``normals_grad``; the forward is not run.

    The normalisation's adjoint reads the un-normalised sums: ``sums`` is the
    forward's ``sums_out`` as the call left it (keep it between the two). The
    launches a ``wp.Tape``'s replay makes (the same bits), with the gradient buffers
    as arguments (not the arrays' ``.grad``); ``normals_grad`` is only read.

    Args:
        verts: (V,) ``vec3``, the forward's.
        faces: (F, 3) int32, the forward's.
        sums: (V,) ``vec3``, the forward's un-normalised sums.
        normals_grad: (V,) ``vec3`` gradient of the normals.
        verts_grad: (V,) ``vec3`` added to.
        sums_grad: optional (V,) ``vec3`` scratch (zeroed here; allocated when None).
        corner_lists: the forward's (gathered sums: their hand-written adjoint).
    """
    nv = verts.shape[0]
    if not nv:
        return
    device = verts.device
    sums_grad = _vec3_buffer(sums_grad, "sums_grad", nv, device, False)
    sums_grad.zero_()
    wp.launch(_normalize_rows, dim=nv, inputs=[sums], outputs=[normals_grad],
              adj_inputs=[sums_grad], adj_outputs=[normals_grad], adjoint=True,
              device=device)  # fmt: skip
    if corner_lists is not None:
        wp.launch(_corner_normals_adjoint, dim=nv, inputs=[verts, corner_lists.args, sums_grad],
                  outputs=[verts_grad], device=device)  # fmt: skip
    elif faces.shape[0]:
        wp.launch(_scatter_corner_normals, dim=(faces.shape[0], 3), inputs=[verts, faces],
                  outputs=[sums], adj_inputs=[verts_grad, None], adj_outputs=[sums_grad],
                  adjoint=True, device=device)  # fmt: skip
