"""The functional shading ops on torch tensors: interpolation, normals, UV sampling.

``from warpraster.torch.ops import interpolate_face_attributes, ...`` gives, on
tensors and with autograd, the Warp ops of :mod:`warpraster.shading` (the
interpolation ops live here, the others in :mod:`warpraster.torch.normals` and
:mod:`warpraster.torch.uv_sampling`):

* :func:`interpolate_face_attributes`: PyTorch3D's op, attributes per face corner;
* :func:`interpolate_vertex_attributes`: per-vertex attributes through packed faces,
  optionally with screen-space derivatives (nvdiffrast's ``interpolate``);
* :func:`face_normals`, :func:`vertex_normals`: PyTorch3D's
  ``Meshes.faces_normals_packed`` / ``verts_normals_packed``;
* :func:`sample_textures_uv`: PyTorch3D's ``TexturesUV.sample_textures``.

How it works (as the raster op in :mod:`warpraster.torch`):

* Each forward is a ``torch.library.custom_op`` (``warpraster::<name>``) with a
  fake implementation (output shapes from the input shapes), so
  ``torch.compile(fullgraph=True)`` treats it as one opaque node.
* Each backward is a second custom op (``warpraster::<name>_backward``): it runs
  the adjoint of the Warp op alone (``interpolate_face_attributes_adjoint`` and the
  like, Warp's generated adjoints of the same kernels, the launches a ``wp.Tape``'s
  replay would make: the same bits), into gradient buffers that are fresh torch
  tensors, from what the forward saved (its inputs; the vertex normals' sums), not
  running the forward again; a gradient autograd does not ask for is not computed
  where the op can skip it (the ``needs`` flags). Nothing Warp-side lives in the
  autograd graph; the upstream gradient is read, not modified.
* Warp runs on torch's current stream (:class:`~warpraster.torch.streams._TorchStream`);
  tensors cross with ``wp.from_torch`` / ``wp.to_torch``: float32 contiguous
  inputs and int32 index tensors are shared, not copied; other float dtypes are
  cast to float32 (the cast is differentiable, so gradients come back in the
  input's dtype) and other integer dtypes to int32. Outputs are float32.

Validation (shapes, dtypes, devices) happens in the Python wrappers, before any
kernel, with errors naming the argument. Index ranges (face indices, the faces
``pix_to_face`` names) need a host read: they are checked in eager mode and
skipped while ``torch.compile`` traces (out-of-range indices there are the
caller's bug, as in PyTorch3D's CUDA ops). The read is of an index tensor's
minimum and maximum, once per unchanged tensor
(:func:`~warpraster.torch.checks.index_bounds`): repeated calls with the same
``faces`` / ``faces_uvs`` / ``ndc_faces`` tensors read nothing back; a fresh
``pix_to_face`` is read once (two scalars), however many ops it feeds. The Warp
functions are called with ``validate=False`` (their own checks would read the
arrays back every call).
"""

from __future__ import annotations

import torch
import warp as wp

from ..shading import interpolate_face_attributes as _interp_face_wp
from ..shading import interpolate_vertex_attributes as _interp_vert_wp
from ..shading.interpolate import (
    interpolate_face_attributes_adjoint,
    interpolate_vertex_attributes_adjoint,
    vector_type,
)
from .checks import check_index_bounds as _check_indices
from .checks import float_tensor as _float
from .checks import int_tensor as _integer
from .checks import same_device
from .checks import to_int32 as _int32
from .eager import eager_path
from .normals import face_normals, vertex_normals
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
from .uv_sampling import sample_textures_uv

__all__ = [
    "face_normals",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "sample_textures_uv",
    "vertex_normals",
]


# ============================================================================= face attributes
def _interp_face_impl(
    pix_to_face: torch.Tensor, bary_coords: torch.Tensor, face_attributes: torch.Tensor
) -> torch.Tensor:
    """(N, H, W, K, D) float32 values; pix_to_face int32, the floats float32 contiguous."""
    d = face_attributes.shape[2]
    out = face_attributes.new_empty(_slots(pix_to_face, d))
    if out.numel() == 0 or face_attributes.shape[0] == 0:
        return out.zero_()  # nothing to launch (every slot is empty without faces)
    with _TorchStream(out.device):
        _interp_face_wp(
            _wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3),
            _wp(face_attributes, wp.float32), out=_wp(out, vector_type(d)),
            validate=False,  # pix_to_face checked by the wrapper (no read back here)
        )  # fmt: skip
    return out


_interp_face_op = torch.library.custom_op(
    "warpraster::interpolate_face_attributes", mutates_args=()
)(_interp_face_impl)


@_interp_face_op.register_fake
def _interp_face_fake(pix_to_face, bary_coords, face_attributes):
    return face_attributes.new_empty(_slots(pix_to_face, face_attributes.shape[2]))


@_backward_op(_interp_face_op, "Tensor grad_values, bool[] needs", "(Tensor, Tensor)")
def _interp_face_backward_op(
    grad_values: torch.Tensor, needs: list[bool], *inputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d bary_coords, d loss / d face_attributes) from d loss / d values: the
    adjoint alone (the op is linear: its inputs are all the adjoint reads); ``inputs``:
    the forward's (pix_to_face, bary_coords, face_attributes); ``needs``: which of the
    two to compute (one not computed is an empty (0,) tensor)."""
    pix_to_face, bary_coords, face_attributes = inputs
    grad_bary = _grad_buffer(needs[0], bary_coords)
    grad_attrs = _grad_buffer(needs[1], face_attributes)
    if grad_values.numel() == 0 or face_attributes.shape[0] == 0 or not any(needs):
        return grad_bary, grad_attrs
    vt = vector_type(face_attributes.shape[2])
    with _TorchStream(grad_values.device):
        bary, bary_grad = _wp_pair(bary_coords, wp.vec3, grad_bary)
        attrs, attrs_grad = _wp_pair(face_attributes, wp.float32, grad_attrs)
        interpolate_face_attributes_adjoint(
            _wp(pix_to_face, wp.int32), bary, attrs, _wp(grad_values.contiguous(), vt),
            bary_coords_grad=bary_grad, face_attributes_grad=attrs_grad,
        )  # fmt: skip
    return grad_bary, grad_attrs


@_interp_face_backward_op.register_fake
def _interp_face_backward_fake(grad_values, needs, pix_to_face, bary_coords, face_attributes):
    return _grad_fake(needs[0], bary_coords), _grad_fake(needs[1], face_attributes)


def _interp_face_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _interp_face_backward(ctx, grad_values):
    pix_to_face, bary, attrs = _detached(ctx.saved_tensors)
    needs = [bool(ctx.needs_input_grad[1]), bool(ctx.needs_input_grad[2])]
    g = _upstream(grad_values, attrs, _slots(pix_to_face, attrs.shape[2]))
    grad_bary, grad_attrs = _interp_face_backward_op(g, needs, pix_to_face, bary, attrs)
    return None, grad_bary if needs[0] else None, grad_attrs if needs[1] else None


_interp_face = eager_path(_interp_face_op, _interp_face_impl, _interp_face_setup,
                          _interp_face_backward)  # fmt: skip


def interpolate_face_attributes(
    pix_to_face: torch.Tensor, bary_coords: torch.Tensor, face_attributes: torch.Tensor
) -> torch.Tensor:
    """Interpolates per-face-corner attributes at each fragment slot, as PyTorch3D.

    ``out[n, y, x, k] = sum_i bary_coords[n, y, x, k, i] * face_attributes[f, i]``
    with ``f = pix_to_face[n, y, x, k]``; zeros where ``f < 0``.

    Args:
        pix_to_face: (N, H, W, K) integer tensor (int64 as PyTorch3D, or int32:
            shared), the face of each slot; negative = empty.
        bary_coords: (N, H, W, K, 3) floating-point barycentrics.
        face_attributes: (F, 3, D) floating-point attributes of each face corner.

    Returns:
        (N, H, W, K, D) float32 tensor, differentiable with respect to
        ``face_attributes`` and ``bary_coords``.

    Raises:
        TypeError, ValueError: bad input, naming the argument (before any kernel).
    """
    _float(face_attributes, "face_attributes", 3, (3, None))
    p2f, bary = _fragments(pix_to_face, bary_coords, face_attributes.shape[0], "face_attributes")
    same_device(pix_to_face.device, "pix_to_face", face_attributes=face_attributes)
    return _interp_face(p2f, bary, _f32(face_attributes))


# ============================================================================= vertex attributes
def _interp_vert_impl(
    pix_to_face: torch.Tensor,
    bary_coords: torch.Tensor,
    attributes: torch.Tensor,
    faces: torch.Tensor,
    verts_ndc: torch.Tensor | None,
    ndc_faces: torch.Tensor | None,
    perspective_correct: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, d/dx, d/dy), each (N, H, W, K, D) float32; the derivatives (0,) without
    ``verts_ndc``. Index tensors int32, floats float32, all contiguous."""
    shape = _slots(pix_to_face, attributes.shape[1])
    values = attributes.new_empty(shape)
    dshape = shape if verts_ndc is not None else (0,)
    ddx, ddy = attributes.new_empty(dshape), attributes.new_empty(dshape)
    if values.numel() == 0 or faces.shape[0] == 0:
        return values.zero_(), ddx.zero_(), ddy.zero_()
    vt = vector_type(attributes.shape[1])
    with _TorchStream(values.device):
        kwargs = {}
        if verts_ndc is not None:
            kwargs = dict(
                verts_ndc=_wp(verts_ndc, wp.vec3),
                ndc_faces=None if ndc_faces is None else _wp(ndc_faces, wp.int32),
                out_dx=_wp(ddx, vt), out_dy=_wp(ddy, vt),
            )  # fmt: skip
        _interp_vert_wp(
            _wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3), _wp(attributes, wp.float32),
            _wp(faces, wp.int32), perspective_correct=perspective_correct,
            out=_wp(values, vt), validate=False, **kwargs,
        )  # fmt: skip
    return values, ddx, ddy


_interp_vert_op = torch.library.custom_op(
    "warpraster::interpolate_vertex_attributes", mutates_args=()
)(_interp_vert_impl)


@_interp_vert_op.register_fake
def _interp_vert_fake(pix_to_face, bary_coords, attributes, faces, verts_ndc, ndc_faces,
                      perspective_correct):  # fmt: skip
    shape = _slots(pix_to_face, attributes.shape[1])
    dshape = shape if verts_ndc is not None else (0,)
    return attributes.new_empty(shape), attributes.new_empty(dshape), attributes.new_empty(dshape)


@_backward_op(_interp_vert_op, "Tensor grad_values, Tensor grad_dx, Tensor grad_dy, bool[] needs",
              "(Tensor, Tensor, Tensor)")  # fmt: skip
def _interp_vert_backward_op(
    grad_values: torch.Tensor, grad_dx: torch.Tensor, grad_dy: torch.Tensor, needs: list[bool],
    *inputs: torch.Tensor | bool | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(d bary_coords, d attributes, d verts_ndc) from the upstream gradients of the
    three outputs (``grad_dx``/``grad_dy`` unused without ``verts_ndc``): the adjoint
    alone, from the forward's ``inputs``; ``needs``: which of the three to compute
    (one not computed, or d verts_ndc without ``verts_ndc``, is an empty (0,) tensor)."""
    pix_to_face, bary_coords, attributes, faces, verts_ndc, ndc_faces, perspective_correct = inputs
    grad_bary = _grad_buffer(needs[0], bary_coords)
    grad_attrs = _grad_buffer(needs[1], attributes)
    with_ndc = verts_ndc is not None
    grad_ndc = _grad_buffer(needs[2], verts_ndc) if with_ndc else bary_coords.new_empty(0)
    if grad_values.numel() == 0 or faces.shape[0] == 0 or not any(needs):
        return grad_bary, grad_attrs, grad_ndc
    vt = vector_type(attributes.shape[1])
    with _TorchStream(grad_values.device):
        kwargs = {}
        if with_ndc:
            ndc, ndc_grad = _wp_pair(verts_ndc, wp.vec3, grad_ndc)
            kwargs = dict(
                verts_ndc=ndc, verts_ndc_grad=ndc_grad,
                ndc_faces=None if ndc_faces is None else _wp(ndc_faces, wp.int32),
                dx_grad=_wp(grad_dx.contiguous(), vt), dy_grad=_wp(grad_dy.contiguous(), vt),
            )  # fmt: skip
        bary, bary_grad = _wp_pair(bary_coords, wp.vec3, grad_bary)
        attrs, attrs_grad = _wp_pair(attributes, wp.float32, grad_attrs)
        interpolate_vertex_attributes_adjoint(
            _wp(pix_to_face, wp.int32), bary, attrs, _wp(faces, wp.int32),
            _wp(grad_values.contiguous(), vt), perspective_correct=perspective_correct,
            bary_coords_grad=bary_grad, attributes_grad=attrs_grad, **kwargs,
        )  # fmt: skip
    return grad_bary, grad_attrs, grad_ndc


@_interp_vert_backward_op.register_fake
def _interp_vert_backward_fake(grad_values, grad_dx, grad_dy, needs, pix_to_face, bary_coords,
                               attributes, faces, verts_ndc, ndc_faces,
                               perspective_correct):  # fmt: skip
    with_ndc = verts_ndc is not None
    grad_ndc = _grad_fake(needs[2], verts_ndc) if with_ndc else bary_coords.new_empty(0)
    return _grad_fake(needs[0], bary_coords), _grad_fake(needs[1], attributes), grad_ndc


def _interp_vert_setup(ctx, inputs, output):
    p2f, bary, attrs, faces, verts_ndc, ndc_faces, persp = inputs
    ctx.perspective_correct = persp
    ctx.has_ndc = verts_ndc is not None
    ctx.has_ndc_faces = ndc_faces is not None
    saved = [p2f, bary, attrs, faces]
    if ctx.has_ndc:
        saved.append(verts_ndc)
    if ctx.has_ndc_faces:
        saved.append(ndc_faces)
    ctx.save_for_backward(*saved)


def _interp_vert_backward(ctx, g_values, g_dx, g_dy):
    p2f, bary, attrs, faces, *rest = _detached(ctx.saved_tensors)
    verts_ndc = rest.pop(0) if ctx.has_ndc else None
    ndc_faces = rest.pop(0) if ctx.has_ndc_faces else None
    needs = [bool(ctx.needs_input_grad[i]) for i in (1, 2, 4)]
    shape = _slots(p2f, attrs.shape[1])
    dshape = shape if ctx.has_ndc else (0,)
    grad_bary, grad_attrs, grad_ndc = _interp_vert_backward_op(
        _upstream(g_values, attrs, shape), _upstream(g_dx, attrs, dshape),
        _upstream(g_dy, attrs, dshape), needs, p2f, bary, attrs, faces, verts_ndc, ndc_faces,
        ctx.perspective_correct,
    )  # fmt: skip
    grads = [g if need else None for g, need in zip((grad_bary, grad_attrs, grad_ndc), needs,
                                                    strict=True)]  # fmt: skip
    return None, grads[0], grads[1], None, grads[2], None, None


_interp_vert = eager_path(_interp_vert_op, _interp_vert_impl, _interp_vert_setup,
                          _interp_vert_backward)  # fmt: skip


def interpolate_vertex_attributes(
    pix_to_face: torch.Tensor,
    bary_coords: torch.Tensor,
    attributes: torch.Tensor,
    faces: torch.Tensor,
    *,
    verts_ndc: torch.Tensor | None = None,
    ndc_faces: torch.Tensor | None = None,
    perspective_correct: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`warpraster.shading.interpolate_vertex_attributes` on tensors, with autograd.

    The same values (nvdiffrast's ``interpolate``; zeros in empty slots) and, with
    ``verts_ndc``, the same analytic screen-space derivatives per pixel (``d/dx``
    along image columns to the right, ``d/dy`` along rows downwards: their exact
    definition is given there).

    Args:
        pix_to_face: (N, H, W, K) integer faces of the slots (negative = empty).
        bary_coords: (N, H, W, K, 3) floating-point barycentrics.
        attributes: (V, D) floating-point per-vertex attributes.
        faces: (F, 3) integer indices into ``attributes`` (e.g. ``faces_packed``,
            or ``faces_uvs`` for UVs with their own topology).
        verts_ndc: optional (V', 3) projected vertices the fragments were rasterized
            from (x, y NDC, z depth): enables the derivatives.
        ndc_faces: (F, 3) indices into ``verts_ndc`` (default: ``faces``).
        perspective_correct: the rasterizer's setting (derivatives only).

    Returns:
        ``values`` when ``verts_ndc`` is None, else ``(values, d_dx, d_dy)``; each
        (N, H, W, K, D) float32. Differentiable with respect to ``attributes``,
        ``bary_coords`` and ``verts_ndc``.

    Raises:
        TypeError, ValueError: bad input, naming the argument (before any kernel).
    """
    _float(attributes, "attributes", 2, (None,))
    _integer(faces, "faces", 2, 3)
    p2f, bary = _fragments(pix_to_face, bary_coords, faces.shape[0], "faces")
    device = pix_to_face.device
    same_device(device, "pix_to_face", attributes=attributes, faces=faces,
                verts_ndc=verts_ndc, ndc_faces=ndc_faces)  # fmt: skip
    _check_indices(faces, "faces", attributes.shape[0], "attribute rows")
    ndc = nf = None
    if verts_ndc is not None:
        ndc = _f32(_float(verts_ndc, "verts_ndc", 2, (3,)))
        if ndc_faces is not None:
            _integer(ndc_faces, "ndc_faces", 2, 3)
            if ndc_faces.shape[0] != faces.shape[0]:
                raise ValueError(
                    f"ndc_faces has {ndc_faces.shape[0]} faces, faces has {faces.shape[0]}"
                )
            nf = _int32(ndc_faces)
        _check_indices(faces if ndc_faces is None else ndc_faces,
                       "faces" if ndc_faces is None else "ndc_faces",
                       verts_ndc.shape[0], "vertices in verts_ndc")  # fmt: skip
    elif ndc_faces is not None:
        raise ValueError("ndc_faces is only used with verts_ndc")
    if not isinstance(perspective_correct, bool):
        raise TypeError(
            f"perspective_correct must be a bool, got {type(perspective_correct).__name__}"
        )
    values, ddx, ddy = _interp_vert(
        p2f, bary, _f32(attributes), _int32(faces), ndc, nf, perspective_correct
    )
    return values if verts_ndc is None else (values, ddx, ddy)
