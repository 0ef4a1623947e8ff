"""Face and vertex normals on torch tensors: ``warpraster.torch.face_normals`` /
``vertex_normals`` (PyTorch3D's ``Meshes.faces_normals_packed`` /
``verts_normals_packed``), the Warp ops of :mod:`warpraster.shading.normals`.

Custom ops as those of :mod:`warpraster.torch.ops` (``warpraster::<name>`` and
``<name>_backward``, with the eager path of :mod:`warpraster.torch.eager`). The
backward runs the adjoint alone (:func:`~warpraster.shading.normals.face_normals_adjoint`,
:func:`~warpraster.shading.normals.vertex_normals_adjoint`), not the forward again:
face normals need only the vertices; the vertex normals' forward also returns its
un-normalised sums (the scratch it writes anyway), which the normalisation's
adjoint reads.
"""

from __future__ import annotations

import torch
import warp as wp

from ..shading import face_normals as _face_normals_wp
from ..shading import vertex_normals as _vertex_normals_wp
from ..shading.normals import face_normals_adjoint, vertex_normals_adjoint
from .checks import check_index_bounds as _check_indices
from .checks import float_tensor as _float
from .checks import int_tensor as _integer
from .checks import same_device
from .checks import to_int32 as _int32
from .eager import eager_path
from .op_helpers import _detached, _f32, _upstream, _wp
from .streams import _TorchStream

__all__ = ["face_normals", "vertex_normals"]


# ============================================================================= face normals
def _face_normals_impl(verts: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """(F, 3) float32 unit normals; ``verts`` (V, 3) float32, ``faces`` (F, 3) int32,
    both contiguous."""
    out = verts.new_empty((faces.shape[0], 3))
    if out.shape[0]:
        with _TorchStream(verts.device):
            _face_normals_wp(_wp(verts, wp.vec3), _wp(faces, wp.int32), out=_wp(out, wp.vec3),
                             validate=False)  # fmt: skip
    return out


_face_normals_op = torch.library.custom_op("warpraster::face_normals", mutates_args=())(
    _face_normals_impl
)


@_face_normals_op.register_fake
def _face_normals_fake(verts, faces):
    return verts.new_empty((faces.shape[0], 3))


@torch.library.custom_op("warpraster::face_normals_backward", mutates_args=())
def _face_normals_backward_op(
    grad_normals: torch.Tensor, verts: torch.Tensor, faces: torch.Tensor
) -> torch.Tensor:
    """d loss / d verts from d loss / d normals: the adjoint alone."""
    grad_verts = torch.zeros_like(verts)
    if faces.shape[0]:
        with _TorchStream(verts.device):
            face_normals_adjoint(_wp(verts, wp.vec3), _wp(faces, wp.int32),
                                 _wp(grad_normals.contiguous(), wp.vec3),
                                 _wp(grad_verts, wp.vec3))  # fmt: skip
    return grad_verts


@_face_normals_backward_op.register_fake
def _face_normals_backward_fake(grad_normals, verts, faces):
    return torch.empty_like(verts)


def _face_normals_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _face_normals_backward(ctx, grad):
    verts, faces = _detached(ctx.saved_tensors)
    g = _upstream(grad, verts, (faces.shape[0], 3))
    return _face_normals_backward_op(g, verts, faces), None


_face_normals = eager_path(_face_normals_op, _face_normals_impl, _face_normals_setup,
                           _face_normals_backward)  # fmt: skip


# ============================================================================= vertex normals
def _vertex_normals_impl(
    verts: torch.Tensor, faces: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """((V, 3) float32 unit normals, (V, 3) their un-normalised sums, which the
    backward reads); inputs as :func:`_face_normals_impl`'s."""
    out = torch.empty_like(verts)
    sums = torch.empty_like(verts)
    if out.shape[0]:
        with _TorchStream(verts.device):
            _vertex_normals_wp(_wp(verts, wp.vec3), _wp(faces, wp.int32), out=_wp(out, wp.vec3),
                               sums_out=_wp(sums, wp.vec3), validate=False)  # fmt: skip
    return out, sums


_vertex_normals_op = torch.library.custom_op("warpraster::vertex_normals", mutates_args=())(
    _vertex_normals_impl
)


@_vertex_normals_op.register_fake
def _vertex_normals_fake(verts, faces):
    return torch.empty_like(verts), torch.empty_like(verts)


@torch.library.custom_op("warpraster::vertex_normals_backward", mutates_args=())
def _vertex_normals_backward_op(
    grad_normals: torch.Tensor, sums: torch.Tensor, verts: torch.Tensor, faces: torch.Tensor
) -> torch.Tensor:
    """d loss / d verts from d loss / d normals: the adjoint alone, from the forward's
    un-normalised ``sums``."""
    grad_verts = torch.zeros_like(verts)
    if verts.shape[0] and faces.shape[0]:
        with _TorchStream(verts.device):
            vertex_normals_adjoint(
                _wp(verts, wp.vec3), _wp(faces, wp.int32), _wp(sums, wp.vec3),
                _wp(grad_normals.contiguous(), wp.vec3), _wp(grad_verts, wp.vec3),
                sums_grad=_wp(torch.empty_like(verts), wp.vec3),
            )  # fmt: skip
    return grad_verts


@_vertex_normals_backward_op.register_fake
def _vertex_normals_backward_fake(grad_normals, sums, verts, faces):
    return torch.empty_like(verts)


def _vertex_normals_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])


def _vertex_normals_backward(ctx, grad, _grad_sums=None):
    verts, faces, sums = _detached(ctx.saved_tensors)
    g = _upstream(grad, verts)
    return _vertex_normals_backward_op(g, sums, verts, faces), None


_vertex_normals = eager_path(_vertex_normals_op, _vertex_normals_impl, _vertex_normals_setup,
                             _vertex_normals_backward, non_differentiable=(1,))  # fmt: skip


# ============================================================================= public
def _mesh(verts, faces) -> tuple[torch.Tensor, torch.Tensor]:
    _float(verts, "verts", 2, (3,))
    _integer(faces, "faces", 2, 3)
    same_device(verts.device, "verts", faces=faces)
    _check_indices(faces, "faces", verts.shape[0], "vertices")
    return _f32(verts), _int32(faces)


def face_normals(verts: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """Unit face normals, as PyTorch3D's ``Meshes.faces_normals_packed``.

    ``n = cross(v1 - v0, v2 - v0) / max(|.|, 1e-6)`` per face.

    Args:
        verts: (V, 3) floating-point vertices (packed).
        faces: (F, 3) integer vertex indices (packed, global).

    Returns:
        (F, 3) float32 tensor, differentiable with respect to ``verts``.

    Raises:
        TypeError, ValueError: bad input, naming the argument (before any kernel).
    """
    return _face_normals(*_mesh(verts, faces))


def vertex_normals(verts: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """Area-weighted unit vertex normals, as PyTorch3D's ``Meshes.verts_normals_packed``.

    At each face corner (vertex i followed by j, k in the face's order)
    ``cross(v_j - v_i, v_k - v_i)`` is added to vertex i; each sum is divided by
    ``max(|sum|, 1e-6)``. A vertex in no face gets (0, 0, 0).

    Args:
        verts, faces: as for :func:`face_normals`.

    Returns:
        (V, 3) float32 tensor, differentiable with respect to ``verts``.

    Raises:
        TypeError, ValueError: as :func:`face_normals` raises them.
    """
    return _vertex_normals(*_mesh(verts, faces))[0]
