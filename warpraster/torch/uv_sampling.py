"""UV texture sampling on torch tensors: ``warpraster.torch.sample_textures_uv``
(PyTorch3D's ``TexturesUV.sample_textures``), the Warp op of
:class:`warpraster.shading.TexturesUV`.

Custom ops as those of :mod:`warpraster.torch.ops` (``warpraster::sample_textures_uv``
and ``sample_textures_uv_backward``, with the eager path of
:mod:`warpraster.torch.eager`). The backward runs the sampler's adjoint alone
(:meth:`~warpraster.shading.TexturesUV.sample_textures_adjoint`) from the
forward's inputs, not the forward again, and computes only the gradients autograd
asks for (the maps' scatter is most of its work).
"""

from __future__ import annotations

import torch
import warp as wp

from ..shading import TexturesUV as _WarpTexturesUV
from ..shading.interpolate import vector_type
from ..shading.textures import PaddingMode, SamplingMode, parse_enum
from .checks import check_index_bounds as _check_indices
from .checks import float_tensor as _float
from .checks import int_tensor as _integer
from .checks import same_device
from .checks import to_int32 as _int32
from .eager import eager_path
from .op_helpers import (
    _backward_op,
    _detached,
    _f32,
    _fragments,
    _grad_buffer,
    _grad_fake,
    _slots,
    _upstream,
    _wp,
    _wp_pair,
)
from .streams import _TorchStream

__all__ = ["sample_textures_uv"]


def _texture(maps, faces_uvs, verts_uvs, padding, align, sampling) -> _WarpTexturesUV:
    """The Warp ``TexturesUV`` over the tensors (zero-copy views; ``maps`` and
    ``verts_uvs`` may be Warp views already, e.g. carrying gradient buffers)."""
    if isinstance(maps, torch.Tensor):
        maps, verts_uvs = _wp(maps, wp.float32), _wp(verts_uvs, wp.float32)
    return _WarpTexturesUV(
        maps, _wp(faces_uvs, wp.int32), verts_uvs, padding_mode=PaddingMode(padding),
        align_corners=align, sampling_mode=SamplingMode(sampling),
        validate=False,  # checked by the eager wrapper
    )  # fmt: skip


def _sample_uv_impl(
    pix_to_face: torch.Tensor,
    bary_coords: torch.Tensor,
    maps: torch.Tensor,
    faces_uvs: torch.Tensor,
    verts_uvs: torch.Tensor,
    padding_mode: int,
    align_corners: bool,
    sampling_mode: int,
) -> torch.Tensor:
    """(N, H, W, K, C) float32 texels; maps (N or 1, Ht, Wt, C) float32, UVs (T, 2)."""
    c = maps.shape[3]
    out = maps.new_empty(_slots(pix_to_face, c))
    if out.numel() == 0 or faces_uvs.shape[0] == 0:
        return out.zero_()
    with _TorchStream(out.device):
        tex = _texture(maps, faces_uvs, verts_uvs, padding_mode, align_corners, sampling_mode)
        # validate=False: pix_to_face checked by the wrapper (its default reads it back)
        tex.sample_textures((_wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3)),
                            out=_wp(out, vector_type(c)), validate=False)  # fmt: skip
    return out


_sample_uv_op = torch.library.custom_op("warpraster::sample_textures_uv", mutates_args=())(
    _sample_uv_impl
)


@_sample_uv_op.register_fake
def _sample_uv_fake(pix_to_face, bary_coords, maps, *rest):
    return maps.new_empty(_slots(pix_to_face, maps.shape[3]))


@_backward_op(_sample_uv_op, "Tensor grad_texels, bool[] needs", "(Tensor, Tensor, Tensor)")
def _sample_uv_backward_op(
    grad_texels: torch.Tensor, needs: list[bool], *inputs: torch.Tensor | int | bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d bary_coords, d maps, d verts_uvs) from d loss / d texels: the adjoint alone,
    from the forward's ``inputs``; ``needs``: which of the three to compute (one not
    computed is an empty (0,) tensor)."""
    pix_to_face, bary_coords, maps, faces_uvs, verts_uvs, *options = inputs
    grad_bary = _grad_buffer(needs[0], bary_coords)
    grad_maps = _grad_buffer(needs[1], maps)
    grad_uvs = _grad_buffer(needs[2], verts_uvs)
    if grad_texels.numel() == 0 or faces_uvs.shape[0] == 0 or not any(needs):
        return grad_bary, grad_maps, grad_uvs
    with _TorchStream(grad_texels.device):
        bary, bary_grad = _wp_pair(bary_coords, wp.vec3, grad_bary)
        maps_wp, maps_grad = _wp_pair(maps, wp.float32, grad_maps)
        uvs, uvs_grad = _wp_pair(verts_uvs, wp.float32, grad_uvs)
        tex = _texture(maps_wp, faces_uvs, uvs, *options)
        tex.sample_textures_adjoint(
            (_wp(pix_to_face, wp.int32), bary),
            _wp(grad_texels.contiguous(), vector_type(maps.shape[3])),
            bary_coords_grad=bary_grad,
            maps_grad=maps_grad,
            verts_uvs_grad=uvs_grad,
        )
    return grad_bary, grad_maps, grad_uvs


@_sample_uv_backward_op.register_fake
def _sample_uv_backward_fake(grad_texels, needs, pix_to_face, bary_coords, maps, faces_uvs,
                             verts_uvs, *rest):  # fmt: skip
    return (_grad_fake(needs[0], bary_coords), _grad_fake(needs[1], maps),
            _grad_fake(needs[2], verts_uvs))  # fmt: skip


def _sample_uv_setup(ctx, inputs, output):
    p2f, bary, maps, faces_uvs, verts_uvs, *options = inputs
    ctx.options = tuple(options)
    ctx.save_for_backward(p2f, bary, maps, faces_uvs, verts_uvs)


def _sample_uv_backward(ctx, grad):
    p2f, bary, maps, faces_uvs, verts_uvs = _detached(ctx.saved_tensors)
    needs = [bool(ctx.needs_input_grad[i]) for i in (1, 2, 4)]
    g = _upstream(grad, maps, _slots(p2f, maps.shape[3]))
    grad_bary, grad_maps, grad_uvs = _sample_uv_backward_op(
        g, needs, p2f, bary, maps, faces_uvs, verts_uvs, *ctx.options
    )
    keep = [t if need else None for t, need in zip((grad_bary, grad_maps, grad_uvs), needs,
                                                   strict=True)]  # fmt: skip
    return None, keep[0], keep[1], None, keep[2], None, None, None


_sample_uv = eager_path(_sample_uv_op, _sample_uv_impl, _sample_uv_setup, _sample_uv_backward)


def sample_textures_uv(
    pix_to_face: torch.Tensor,
    bary_coords: torch.Tensor,
    maps: torch.Tensor,
    faces_uvs: torch.Tensor,
    verts_uvs: torch.Tensor,
    *,
    padding_mode: str | PaddingMode = "border",
    align_corners: bool = True,
    sampling_mode: str | SamplingMode = "bilinear",
) -> torch.Tensor:
    """Samples UV-mapped textures per fragment slot, as PyTorch3D's ``TexturesUV.sample_textures``.

    The slot's UV is the barycentric interpolation of its face's three UVs;
    image n samples map n (or the one map) with ``grid_sample``'s semantics on the
    map flipped in v (row 0 of a map is at v = 1), as
    :class:`warpraster.shading.TexturesUV`. Empty slots (negative
    ``pix_to_face``) hold zeros (PyTorch3D samples uv = (0, 0) there, a value
    every blend discards).

    Args:
        pix_to_face: (N, H, W, K) integer faces of the slots (rows of ``faces_uvs``).
        bary_coords: (N, H, W, K, 3) floating-point barycentrics.
        maps: (N, Ht, Wt, C) or (1, Ht, Wt, C) floating-point maps, PyTorch3D's row order.
        faces_uvs: (F, 3) integer indices into ``verts_uvs``, one row per packed face.
        verts_uvs: (T, 2) floating-point UVs.
        padding_mode: ``"zeros"``, ``"border"`` or ``"reflection"`` (or :class:`PaddingMode`).
        align_corners: ``grid_sample``'s (True: u = 0, 1 at the edge texels' centres).
        sampling_mode: ``"bilinear"`` or ``"nearest"`` (or :class:`SamplingMode`).

    Returns:
        (N, H, W, K, C) float32 texels, differentiable with respect to ``maps``,
        ``verts_uvs`` and ``bary_coords``.

    Raises:
        TypeError, ValueError: bad input, naming the argument (before any kernel).
    """
    padding = parse_enum(padding_mode, PaddingMode, "padding_mode")
    sampling = parse_enum(sampling_mode, SamplingMode, "sampling_mode")
    if not isinstance(align_corners, bool):
        raise TypeError(f"align_corners must be a bool, got {type(align_corners).__name__}")
    _float(maps, "maps", 4, (None, None, None))
    _float(verts_uvs, "verts_uvs", 2, (2,))
    _integer(faces_uvs, "faces_uvs", 2, 3)
    p2f, bary = _fragments(pix_to_face, bary_coords, faces_uvs.shape[0], "faces_uvs")
    n = pix_to_face.shape[0]
    if maps.shape[0] not in (1, n):
        raise ValueError(f"maps has {maps.shape[0]} maps for {n} images (need 1 or {n})")
    same_device(pix_to_face.device, "pix_to_face", maps=maps, faces_uvs=faces_uvs,
                verts_uvs=verts_uvs)  # fmt: skip
    _check_indices(faces_uvs, "faces_uvs", verts_uvs.shape[0], "UVs")
    return _sample_uv(
        p2f, bary, _f32(maps), _int32(faces_uvs), _f32(verts_uvs),
        int(padding), align_corners, int(sampling),
    )  # fmt: skip
