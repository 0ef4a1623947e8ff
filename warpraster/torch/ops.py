"""The functional shading ops on torch tensors: interpolation, normals, UV sampling.

``from warpraster.torch.ops import interpolate_face_attributes, ...`` gives, on
tensors and with autograd, the Warp ops of :mod:`warpraster.shading`:

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
* Each backward is a second custom op (``warpraster::<name>_backward``): it
  replays the Warp forward on a ``wp.Tape`` with gradient buffers that are fresh
  torch tensors, seeds the output's gradient with a copy of the upstream
  gradient and runs ``tape.backward``: the adjoint of the same Warp kernels.
  Nothing Warp-side lives in the autograd graph; the upstream gradient is read,
  not modified.
* Warp runs on torch's current stream (:class:`~warpraster.torch.streams._TorchStream`);
  tensors cross with ``wp.from_torch`` / ``wp.to_torch``: float32 contiguous
  inputs and int32 index tensors are shared, not copied; other float dtypes are
  cast to float32 (the cast is differentiable, so gradients come back in the
  input's dtype) and other integer dtypes to int32. Outputs are float32.

Validation (shapes, dtypes, devices) happens in the Python wrappers, before any
kernel, with errors naming the argument. Index ranges (face indices, the faces
``pix_to_face`` names) need a host read: they are checked in eager mode and
skipped while ``torch.compile`` traces (out-of-range indices there are the
caller's bug, as in PyTorch3D's CUDA ops).
"""

from __future__ import annotations

import torch
import warp as wp

from ..shading import TexturesUV as _WarpTexturesUV
from ..shading import face_normals as _face_normals_wp
from ..shading import interpolate_face_attributes as _interp_face_wp
from ..shading import interpolate_vertex_attributes as _interp_vert_wp
from ..shading import vertex_normals as _vertex_normals_wp
from ..shading.interpolate import vector_type
from ..shading.textures import PaddingMode, SamplingMode, parse_enum
from .checks import check_index_range as _check_indices
from .checks import eager as _eager
from .checks import float_tensor as _float
from .checks import int_tensor as _integer
from .checks import same_device
from .checks import to_int32 as _int32
from .eager import eager_path
from .streams import _TorchStream

__all__ = [
    "face_normals",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "sample_textures_uv",
    "vertex_normals",
]

_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- helpers
def _wp(t: torch.Tensor, dtype, grad: torch.Tensor | None = None) -> wp.array:
    """Zero-copy Warp view of a contiguous tensor (``grad`` attached as its ``.grad``)."""
    if grad is None:
        return wp.from_torch(t, dtype=dtype, requires_grad=False)
    return wp.from_torch(t, dtype=dtype, requires_grad=True, grad=grad)


def _seeded(out: torch.Tensor, dtype, grad_out: torch.Tensor) -> wp.array:
    """Warp view of a replayed output whose gradient buffer is a copy of ``grad_out``."""
    return _wp(out, dtype, grad_out.clone(memory_format=torch.contiguous_format))


def _upstream(g: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An upstream gradient as a contiguous float32 tensor (zeros when autograd gives None)."""
    if g is None:
        return torch.zeros_like(like)
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
    checks that no slot names a face >= ``num_faces``.
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
        hi = int(pix_to_face.max())
        if hi >= num_faces or hi > _INT32_MAX:
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
        )  # fmt: skip
    return out


_interp_face_op = torch.library.custom_op(
    "warpraster::interpolate_face_attributes", mutates_args=()
)(_interp_face_impl)


@_interp_face_op.register_fake
def _interp_face_fake(pix_to_face, bary_coords, face_attributes):
    return face_attributes.new_empty(_slots(pix_to_face, face_attributes.shape[2]))


@_backward_op(_interp_face_op, "Tensor grad_values", "(Tensor, Tensor)")
def _interp_face_backward_op(
    grad_values: torch.Tensor, *inputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d bary_coords, d loss / d face_attributes) from d loss / d values;
    ``inputs``: the forward's (pix_to_face, bary_coords, face_attributes)."""
    pix_to_face, bary_coords, face_attributes = inputs
    grad_bary = torch.zeros_like(bary_coords)
    grad_attrs = torch.zeros_like(face_attributes)
    if grad_values.numel() == 0 or face_attributes.shape[0] == 0:
        return grad_bary, grad_attrs
    vt = vector_type(face_attributes.shape[2])
    with _TorchStream(grad_values.device):
        out = _seeded(torch.empty_like(grad_values), vt, grad_values)
        tape = wp.Tape()
        with tape:
            _interp_face_wp(
                _wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3, grad_bary),
                _wp(face_attributes, wp.float32, grad_attrs), out=out,
            )  # fmt: skip
        tape.backward()
    return grad_bary, grad_attrs


@_interp_face_backward_op.register_fake
def _interp_face_backward_fake(grad_values, pix_to_face, bary_coords, face_attributes):
    return torch.empty_like(bary_coords), torch.empty_like(face_attributes)


def _interp_face_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _interp_face_backward(ctx, grad_values):
    pix_to_face, bary, attrs = _detached(ctx.saved_tensors)
    g = _upstream(grad_values, attrs.new_empty(_slots(pix_to_face, attrs.shape[2])))
    grad_bary, grad_attrs = _interp_face_backward_op(g, pix_to_face, bary, attrs)
    return None, grad_bary, grad_attrs


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


@_backward_op(_interp_vert_op, "Tensor grad_values, Tensor grad_dx, Tensor grad_dy",
              "(Tensor, Tensor, Tensor)")  # fmt: skip
def _interp_vert_backward_op(
    grad_values: torch.Tensor, grad_dx: torch.Tensor, grad_dy: torch.Tensor,
    *inputs: torch.Tensor | bool | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(d bary_coords, d attributes, d verts_ndc) from the upstream gradients of the
    three outputs (``grad_dx``/``grad_dy`` and the last result (0, 3) without ``verts_ndc``);
    ``inputs``: the forward's."""
    pix_to_face, bary_coords, attributes, faces, verts_ndc, ndc_faces, perspective_correct = inputs
    grad_bary = torch.zeros_like(bary_coords)
    grad_attrs = torch.zeros_like(attributes)
    grad_ndc = torch.zeros_like(verts_ndc) if verts_ndc is not None else bary_coords.new_zeros(0, 3)
    if grad_values.numel() == 0 or faces.shape[0] == 0:
        return grad_bary, grad_attrs, grad_ndc
    vt = vector_type(attributes.shape[1])
    with _TorchStream(grad_values.device):
        kwargs = {}
        if verts_ndc is not None:
            kwargs = dict(
                verts_ndc=_wp(verts_ndc, wp.vec3, grad_ndc),
                ndc_faces=None if ndc_faces is None else _wp(ndc_faces, wp.int32),
                out_dx=_seeded(torch.empty_like(grad_dx), vt, grad_dx),
                out_dy=_seeded(torch.empty_like(grad_dy), vt, grad_dy),
            )  # fmt: skip
        tape = wp.Tape()
        with tape:
            _interp_vert_wp(
                _wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3, grad_bary),
                _wp(attributes, wp.float32, grad_attrs), _wp(faces, wp.int32),
                perspective_correct=perspective_correct,
                out=_seeded(torch.empty_like(grad_values), vt, grad_values), validate=False,
                **kwargs,
            )  # fmt: skip
        tape.backward()
    return grad_bary, grad_attrs, grad_ndc


@_interp_vert_backward_op.register_fake
def _interp_vert_backward_fake(grad_values, grad_dx, grad_dy, pix_to_face, bary_coords,
                               attributes, faces, verts_ndc, ndc_faces,
                               perspective_correct):  # fmt: skip
    grad_ndc = torch.empty_like(verts_ndc) if verts_ndc is not None else bary_coords.new_empty(0, 3)
    return torch.empty_like(bary_coords), torch.empty_like(attributes), grad_ndc


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
    shape = _slots(p2f, attrs.shape[1])
    dlike = attrs.new_empty(shape if ctx.has_ndc else (0,))
    grad_bary, grad_attrs, grad_ndc = _interp_vert_backward_op(
        _upstream(g_values, attrs.new_empty(shape)), _upstream(g_dx, dlike),
        _upstream(g_dy, dlike), p2f, bary, attrs, faces, verts_ndc, ndc_faces,
        ctx.perspective_correct,
    )  # fmt: skip
    return None, grad_bary, grad_attrs, None, grad_ndc if ctx.has_ndc else None, None, None


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
    """Interpolates per-vertex attributes at each fragment slot (nvdiffrast's ``interpolate``).

    Value: ``sum_i bary[i] * attributes[faces[f, i]]`` with ``f = pix_to_face``;
    zeros in empty slots. With ``verts_ndc``, also the analytic screen-space
    derivatives per pixel, exactly as
    :func:`warpraster.shading.interpolate_vertex_attributes`: ``d/dx`` along image
    columns to the right, ``d/dy`` along rows downwards, i.e.
    ``-(2 / min(H, W))`` times the derivative with respect to PyTorch3D's NDC X
    resp. Y (which point left and up); those of the face's unclipped
    barycentrics, perspective-correct when ``perspective_correct``.

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


# ============================================================================= normals
def _normals_ops(name: str, warp_fn, per_vertex: bool):
    """The forward and backward custom ops (``warpraster::<name>`` and
    ``<name>_backward``) of one Warp normals function, and the forward with its
    autograd and eager path (:func:`~warpraster.torch.eager.eager_path`).

    ``warp_fn(verts, faces, out=, validate=)`` writes (F, 3) face normals, or with
    ``per_vertex`` (V, 3) vertex normals (then it also takes a ``sums_out`` scratch).
    The forward takes float32 (V, 3) ``verts`` and int32 (F, 3) ``faces``,
    contiguous; the backward replays it on a tape.
    """

    def rows(verts: torch.Tensor, faces: torch.Tensor) -> int:
        return verts.shape[0] if per_vertex else faces.shape[0]

    def launch(verts: torch.Tensor, faces: torch.Tensor, out: wp.array, grad_verts=None) -> None:
        """``warp_fn`` on the tensors (with ``grad_verts``: recorded for a backward)."""
        kw = {}
        if per_vertex:  # the un-normalised sums (with a gradient buffer in the backward)
            sums_grad = None if grad_verts is None else torch.zeros_like(verts)
            kw["sums_out"] = _wp(torch.empty_like(verts), wp.vec3, sums_grad)
        warp_fn(_wp(verts, wp.vec3, grad_verts), _wp(faces, wp.int32), out=out, validate=False,
                **kw)  # fmt: skip

    def impl(verts: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
        out = verts.new_empty((rows(verts, faces), 3))
        if out.shape[0]:
            with _TorchStream(verts.device):
                launch(verts, faces, _wp(out, wp.vec3))
        return out

    impl.__name__ = name
    forward = torch.library.custom_op(f"warpraster::{name}", mutates_args=())(impl)

    @forward.register_fake
    def _(verts, faces):
        return verts.new_empty((rows(verts, faces), 3))

    @torch.library.custom_op(f"warpraster::{name}_backward", mutates_args=())
    def backward(grad_normals: torch.Tensor, verts: torch.Tensor, faces: torch.Tensor
                 ) -> torch.Tensor:  # fmt: skip
        grad_verts = torch.zeros_like(verts)
        if rows(verts, faces) and faces.shape[0]:
            with _TorchStream(verts.device):
                out = _seeded(torch.empty_like(grad_normals), wp.vec3, grad_normals)
                tape = wp.Tape()
                with tape:
                    launch(verts, faces, out, grad_verts)
                tape.backward()
        return grad_verts

    @backward.register_fake
    def _(grad_normals, verts, faces):
        return torch.empty_like(verts)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def autograd_backward(ctx, grad):
        verts, faces = _detached(ctx.saved_tensors)
        g = _upstream(grad, verts.new_empty((rows(verts, faces), 3)))
        return backward(g, verts, faces), None

    return forward, backward, eager_path(forward, impl, setup, autograd_backward)


_face_normals_op, _face_normals_backward_op, _face_normals = _normals_ops(
    "face_normals", _face_normals_wp, per_vertex=False
)
_vertex_normals_op, _vertex_normals_backward_op, _vertex_normals = _normals_ops(
    "vertex_normals", _vertex_normals_wp, per_vertex=True
)


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
    return _vertex_normals(*_mesh(verts, faces))


# ============================================================================= UV textures
def _texture(maps, faces_uvs, verts_uvs, padding, align, sampling, grads=None):
    """The Warp ``TexturesUV`` over the tensors (gradient buffers (maps, uvs) if given)."""
    gm, gu = (None, None) if grads is None else grads
    return _WarpTexturesUV(
        _wp(maps, wp.float32, gm), _wp(faces_uvs, wp.int32), _wp(verts_uvs, wp.float32, gu),
        padding_mode=PaddingMode(padding), align_corners=align,
        sampling_mode=SamplingMode(sampling), validate=False,  # checked by the eager wrapper
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
        tex.sample_textures((_wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3)),
                            out=_wp(out, vector_type(c)))  # fmt: skip
    return out


_sample_uv_op = torch.library.custom_op("warpraster::sample_textures_uv", mutates_args=())(
    _sample_uv_impl
)


@_sample_uv_op.register_fake
def _sample_uv_fake(pix_to_face, bary_coords, maps, *rest):
    return maps.new_empty(_slots(pix_to_face, maps.shape[3]))


@_backward_op(_sample_uv_op, "Tensor grad_texels", "(Tensor, Tensor, Tensor)")
def _sample_uv_backward_op(
    grad_texels: torch.Tensor, *inputs: torch.Tensor | int | bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d bary_coords, d maps, d verts_uvs) from d loss / d texels; ``inputs``: the
    forward's."""
    pix_to_face, bary_coords, maps, faces_uvs, verts_uvs, *options = inputs
    padding_mode, align_corners, sampling_mode = options
    grad_bary = torch.zeros_like(bary_coords)
    grad_maps = torch.zeros_like(maps)
    grad_uvs = torch.zeros_like(verts_uvs)
    if grad_texels.numel() == 0 or faces_uvs.shape[0] == 0:
        return grad_bary, grad_maps, grad_uvs
    with _TorchStream(grad_texels.device):
        tex = _texture(maps, faces_uvs, verts_uvs, padding_mode, align_corners, sampling_mode,
                       grads=(grad_maps, grad_uvs))  # fmt: skip
        out = _seeded(torch.empty_like(grad_texels), vector_type(maps.shape[3]), grad_texels)
        tape = wp.Tape()
        with tape:
            tex.sample_textures(
                (_wp(pix_to_face, wp.int32), _wp(bary_coords, wp.vec3, grad_bary)), out=out
            )
        tape.backward()
    return grad_bary, grad_maps, grad_uvs


@_sample_uv_backward_op.register_fake
def _sample_uv_backward_fake(grad_texels, pix_to_face, bary_coords, maps, faces_uvs, verts_uvs,
                             *rest):  # fmt: skip
    return torch.empty_like(bary_coords), torch.empty_like(maps), torch.empty_like(verts_uvs)


def _sample_uv_setup(ctx, inputs, output):
    p2f, bary, maps, faces_uvs, verts_uvs, *options = inputs
    ctx.options = tuple(options)
    ctx.save_for_backward(p2f, bary, maps, faces_uvs, verts_uvs)


def _sample_uv_backward(ctx, grad):
    p2f, bary, maps, faces_uvs, verts_uvs = _detached(ctx.saved_tensors)
    g = _upstream(grad, maps.new_empty(_slots(p2f, maps.shape[3])))
    grad_bary, grad_maps, grad_uvs = _sample_uv_backward_op(
        g, p2f, bary, maps, faces_uvs, verts_uvs, *ctx.options
    )
    return None, grad_bary, grad_maps, None, grad_uvs, None, None, None


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
