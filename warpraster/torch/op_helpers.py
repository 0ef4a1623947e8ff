"""What the functional torch ops share: tensors as Warp views, upstream gradients,
gradient buffers, fragment checks and the backward custom op's schema.

Used by :mod:`warpraster.torch.ops` (interpolation), :mod:`warpraster.torch.normals`,
:mod:`warpraster.torch.uv_sampling` and :mod:`warpraster.torch.antialias`.
"""

from __future__ import annotations

import torch
import warp as wp

from .checks import eager as _eager
from .checks import float_tensor as _float
from .checks import index_bounds, same_device
from .checks import int_tensor as _integer
from .checks import to_int32 as _int32

_INT32_MAX = 2**31 - 1


def _wp(t: torch.Tensor, dtype, grad: torch.Tensor | None = None) -> wp.array:
    """Zero-copy Warp view of a contiguous tensor (``grad`` attached as its ``.grad``)."""
    if grad is None:
        return wp.from_torch(t, dtype=dtype, requires_grad=False)
    return wp.from_torch(t, dtype=dtype, requires_grad=True, grad=grad)


def _wp_pair(t: torch.Tensor, dtype, grad: torch.Tensor) -> tuple[wp.array, wp.array | None]:
    """(view of ``t``, view of ``grad``) for an adjoint entry: the first carries the
    second as its ``.grad`` (what the struct kernels' adjoints add to, so no other
    view is made); for a gradient not computed (an empty ``grad``, see
    :func:`_grad_buffer`), ``t``'s plain view and None."""
    if not grad.numel():
        return _wp(t, dtype), None
    view = _wp(t, dtype, grad)
    return view, view.grad


def _grad_buffer(needed: bool, like: torch.Tensor) -> torch.Tensor:
    """The zeroed gradient buffer of ``like`` when ``needed``, else an empty (0,)
    tensor: what a backward op returns for a gradient it did not compute."""
    return torch.zeros_like(like) if needed else like.new_empty(0)


def _grad_fake(needed: bool, like: torch.Tensor) -> torch.Tensor:
    """:func:`_grad_buffer`'s shape, for fake kernels."""
    return torch.empty_like(like) if needed else like.new_empty(0)


def _upstream(g: torch.Tensor | None, like: torch.Tensor, shape=None) -> torch.Tensor:
    """An upstream gradient as a contiguous float32 tensor (zeros, shaped as ``like``
    or as ``shape`` on its device, when autograd gives None)."""
    if g is None:
        return torch.zeros_like(like) if shape is None else like.new_zeros(shape)
    return g.to(torch.float32).contiguous()


def _detached(saved) -> list[torch.Tensor]:
    """Saved inputs for a backward op: detached (the backward ops have no autograd
    formula of their own, so no double backward; a graph through them would only
    be recorded to raise later)."""
    return [t.detach() for t in saved]


def _f32(x: torch.Tensor) -> torch.Tensor:
    """float32 contiguous: the tensor itself when it already is (zero-copy); differentiable."""
    return x.to(torch.float32).contiguous()


def _fragments(pix_to_face, bary_coords, num_faces: int, faces_name: str):
    """Checked fragments: (pix_to_face int32, bary float32), both contiguous.

    Any negative ``pix_to_face`` is an empty slot (PyTorch3D); eager mode also
    checks that no slot names a face >= ``num_faces``: from the tensor's maximum,
    read back once per unchanged tensor (:func:`~warpraster.torch.checks.index_bounds`).

    Why a read at all: ``pix_to_face`` is usually a fresh tensor every call (a
    rasterizer's output), so the first op it feeds reads one scalar pair (one
    synchronisation on CUDA); the other ops fed the same tensor object
    (``interpolate_*``, ``sample_textures_uv``, ``antialias`` on one rasterization's
    fragments) read nothing. The Warp kernels index the faces with it unchecked, so
    a face id past the op's faces would read out of bounds: it is not trusted for
    coming from warpraster's rasterizer (which rasterized faces the op may not
    have: a smaller ``face_attributes`` is the very bug this check reports), and a
    check on the device could only raise later, after the kernel.
    """
    _integer(pix_to_face, "pix_to_face", 4)
    _float(bary_coords, "bary_coords", 5, (3,))
    if tuple(bary_coords.shape[:4]) != tuple(pix_to_face.shape):
        raise ValueError(
            f"bary_coords has shape {tuple(bary_coords.shape)}, expected "
            f"{(*pix_to_face.shape, 3)} from pix_to_face"
        )
    same_device(pix_to_face.device, "pix_to_face", bary_coords=bary_coords)
    if _eager() and pix_to_face.numel():

        def ok(lo: int, hi: int) -> bool:
            return hi < num_faces and hi <= _INT32_MAX

        hi = index_bounds(pix_to_face, ok)[1]
        if not ok(0, hi):
            raise ValueError(f"pix_to_face holds face {hi}, but {faces_name} has {num_faces} faces")
    if pix_to_face.dtype != torch.int32:
        # Every negative is an empty slot: -1 keeps it negative through the int32 cast.
        pix_to_face = pix_to_face.clamp(min=-1)
    return _int32(pix_to_face), _f32(bary_coords)


def _slots(pix_to_face: torch.Tensor, d: int) -> tuple[int, ...]:
    return (*pix_to_face.shape, d)


def _backward_op(forward, grads: str, returns: str):
    """Decorator: the function as the custom op ``<forward's name>_backward``, whose
    schema is the upstream gradients ``grads`` (schema text), then the forward op's
    own arguments, returning ``returns``."""
    text = str(forward._opoverload._schema)
    schema = f"({grads}, {text[text.index('(') + 1 : text.rindex(') -> ')]}) -> {returns}"
    return torch.library.custom_op(f"{forward._qualname}_backward", mutates_args=(), schema=schema)
