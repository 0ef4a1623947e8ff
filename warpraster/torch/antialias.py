"""The antialias op on torch tensors: ``warpraster.torch.antialias``.

A ``torch.library.custom_op`` pair like the other ops (:mod:`warpraster.torch.ops`):
the forward runs the :class:`~warpraster.antialiasing.Antialias` op on zero-copy
Warp views of the tensors and, when a backward will follow, returns every pixel
pair's record (alpha and edge code) beside the image; the backward op runs the
adjoint alone from those records (the forward is not run again) and returns the
gradients of ``color`` and ``verts_ndc``. Both run on torch's current stream inside a private
tape slot (:class:`~warpraster.torch.streams._TorchStream`), so a ``wp.Tape``
the user has open sees none of it; ``torch.compile(fullgraph=True)`` sees one
opaque node (fake implementations give the shapes). The edge topology of a faces
tensor is built once (a host pass) and kept while the same faces are passed
unchanged (:data:`_FACES`): nvdiffrast's precomputed topology, found by itself.
"""

from __future__ import annotations

import collections
import threading

import torch
import warp as wp

from ..antialiasing import Antialias, AntialiasTopology
from .checks import _tensor_key, check_index_bounds, float_tensor, int_tensor, same_device, to_int32
from .eager import eager_path
from .ops import _backward_op, _detached, _f32, _upstream, _wp
from .streams import _TorchStream

__all__ = ["antialias"]


#: Per faces tensor seen (by its memory, layout and torch's version counter, which
#: its views and ``detach()`` share; the entry holds the tensor, so no other tensor
#: can take that memory while it is kept): its int32 copy and edge topology, built
#: once on the host as nvdiffrast's topology hash is for static faces. 8 kept.
_FACES: collections.OrderedDict = collections.OrderedDict()
_FACES_LOCK = threading.Lock()


def _faces_key(faces: torch.Tensor, *extra) -> tuple:
    return (*_tensor_key(faces), tuple(faces.stride()), *extra)


def _kept(key, make):
    """The value kept under ``key``, made (outside the lock) on a miss."""
    with _FACES_LOCK:
        hit = _FACES.get(key)
        if hit is not None:
            _FACES.move_to_end(key)
            return hit
    value = make()
    with _FACES_LOCK:
        _FACES[key] = value
        while len(_FACES) > 8:
            _FACES.popitem(last=False)
    return value


def _topology(faces: torch.Tensor, f: wp.array, num_verts: int) -> AntialiasTopology:
    """The topology of ``faces`` (int32) for ``num_verts`` vertices (a host pass
    over the faces the first time, see :data:`_FACES`)."""
    key = _faces_key(faces, "topology", int(num_verts))
    return _kept(key, lambda: (faces, AntialiasTopology(f, num_verts, f.device)))[1]


def _faces_int32(faces: torch.Tensor) -> torch.Tensor:
    """``faces`` as int32 contiguous: the tensor itself when it is, else a copy kept
    (see :data:`_FACES`), so that its topology is found again."""
    if faces.dtype == torch.int32 and faces.is_contiguous():
        return faces
    return _kept(_faces_key(faces, "int32"), lambda: (faces, to_int32(faces)))[1]


#: Antialias objects (their pair buffers made once) by (topology, image shape,
#: deterministic, device, torch stream). One call at a time uses an object's
#: buffers: the ops run inside their device's lock (``_TorchStream``). 8 kept.
_OPS: collections.OrderedDict = collections.OrderedDict()


def _op(topology: AntialiasTopology, num_verts: int, shape: tuple, tdevice: torch.device,
        deterministic: bool):  # fmt: skip
    """The kept Antialias object for these (see :data:`_OPS`)."""
    device = topology.device
    stream = torch.cuda.current_stream(tdevice).cuda_stream if tdevice.type == "cuda" else None
    key = (id(topology), shape, bool(deterministic), str(device), stream)
    with _FACES_LOCK:
        hit = _OPS.get(key)
        if hit is not None and hit.topology is topology:
            _OPS.move_to_end(key)
            return hit
        made = Antialias(topology, num_verts, shape, device, deterministic=deterministic)
        _OPS[key] = made
        while len(_OPS) > 8:
            _OPS.popitem(last=False)
        return made


def _views(color, pix_to_face, verts_ndc, faces, zbuf, deterministic, grads=None):
    """(op, color, pix_to_face, verts, zbuf) as Warp views and the kept Antialias
    object (call inside the ops' stream scope). ``grads``: (grad_color, grad_verts)
    become the views' gradients."""
    c = _wp(color, wp.float32, None if grads is None else grads[0])
    v = _wp(verts_ndc, wp.vec3, None if grads is None else grads[1])
    f = wp.from_torch(faces, dtype=wp.int32)
    if faces.shape[0] == 0:
        f = wp.empty((0, 3), dtype=wp.int32, device=c.device)
    z = None if zbuf is None else _wp(zbuf, wp.float32)
    p = _wp(pix_to_face, wp.int32)
    op = _op(_topology(faces, f, v.shape[0]), v.shape[0], tuple(c.shape), color.device,
             deterministic)  # fmt: skip
    return op, c, p, v, z


def _antialias_impl(
    color: torch.Tensor,
    pix_to_face: torch.Tensor,
    verts_ndc: torch.Tensor,
    faces: torch.Tensor,
    zbuf: torch.Tensor | None,
    deterministic: bool,
    record: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (N, H, W, C) float32, pair alpha, pair code): with ``record`` the pair
    records of every pixel ((N, H, W, 2) float32 / int32, for the backward's adjoint),
    else empty. Floats float32, indices int32, all contiguous. The index values were
    checked by :func:`antialias` (a host read there; none here)."""
    out = torch.empty_like(color)
    n, h, w, _ = color.shape
    rec = (n, h, w, 2) if record else (0,)
    alpha = color.new_empty(rec)
    code = torch.empty(rec, dtype=torch.int32, device=color.device)
    if out.numel() == 0:
        return out, alpha, code
    with _TorchStream(color.device):
        op, c, p, v, z = _views(color, pix_to_face, verts_ndc, faces, zbuf, deterministic)
        o = _wp(out, wp.float32)
        op.check(c, p, v, z, o)
        if record:
            op.forward_records(c, p, v, z, o, _wp(alpha, wp.float32), _wp(code, wp.int32))
        else:
            op(c, p, v, zbuf=z, out=o)
    return out, alpha, code


_antialias_op = torch.library.custom_op("warpraster::antialias", mutates_args=())(_antialias_impl)


@_antialias_op.register_fake
def _antialias_fake(color, pix_to_face, verts_ndc, faces, zbuf, deterministic, record):
    n, h, w, _ = color.shape
    rec = (n, h, w, 2) if record else (0,)
    return (torch.empty_like(color), color.new_empty(rec),
            torch.empty(rec, dtype=torch.int32, device=color.device))  # fmt: skip


@_backward_op(_antialias_op, "Tensor grad_out, Tensor alpha, Tensor code", "(Tensor, Tensor)")
def _antialias_backward_op(
    grad_out: torch.Tensor, alpha: torch.Tensor, code: torch.Tensor,
    *inputs: torch.Tensor | bool | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(d loss / d color, d loss / d verts_ndc) from d loss / d out: the adjoint alone,
    from the forward's pair records (the forward is not run again)."""
    color, pix_to_face, verts_ndc, faces, zbuf, deterministic, record = inputs
    grad_color = torch.zeros_like(color)
    grad_verts = torch.zeros_like(verts_ndc)
    if color.numel() == 0:
        return grad_color, grad_verts
    if not record:
        raise RuntimeError("antialias: backward of a call made without its pair records")
    with _TorchStream(color.device):
        op, c, p, v, z = _views(color, pix_to_face, verts_ndc, faces, zbuf, deterministic)
        op.adjoint_records(c, p, v, z, _wp(alpha, wp.float32), _wp(code, wp.int32),
                           _wp(grad_out.contiguous(), wp.float32), _wp(grad_color, wp.float32),
                           _wp(grad_verts, wp.vec3))  # fmt: skip
    return grad_color, grad_verts


@_antialias_backward_op.register_fake
def _antialias_backward_fake(grad_out, alpha, code, color, *rest):
    return torch.empty_like(color), torch.empty_like(rest[1])


def _setup(ctx, inputs, output):
    color, p2f, verts, faces, zbuf, deterministic, record = inputs
    ctx.options = (deterministic, record)
    ctx.has_zbuf = zbuf is not None
    ctx.save_for_backward(color, p2f, verts, faces, output[1], output[2],
                          *([zbuf] if ctx.has_zbuf else []))  # fmt: skip


def _backward(ctx, grad_out, _grad_alpha=None, _grad_code=None):
    saved = _detached(ctx.saved_tensors)
    color, p2f, verts, faces, alpha, code = saved[:6]
    zbuf = saved[6] if ctx.has_zbuf else None
    g = _upstream(grad_out, color)
    gc, gv = _antialias_backward_op(g, alpha, code, color, p2f, verts, faces, zbuf, *ctx.options)
    return gc, None, gv, None, None, None, None


_antialias = eager_path(_antialias_op, _antialias_impl, _setup, _backward,
                        non_differentiable=(1, 2))  # fmt: skip


def antialias(
    color: torch.Tensor,
    pix_to_face: torch.Tensor,
    verts_ndc: torch.Tensor,
    faces: torch.Tensor,
    *,
    zbuf: torch.Tensor | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """nvdiffrast's analytic silhouette antialiasing (:func:`warpraster.antialias`) on tensors.

    Args:
        color: (N, H, W, C) floating-point hard image.
        pix_to_face: (N, H, W, 1) integer K = 1 face ids (packed; -1 empty).
        verts_ndc: (V, 3) floating-point projected vertices (the project's NDC).
        faces: (F, 3) integer packed faces.
        zbuf: optional (N, H, W, 1) depths ordering the two faces of a pixel pair
            (default: recomputed from ``verts_ndc``).
        deterministic: vertex gradients summed in a fixed order (bit-identical).

    Returns:
        (N, H, W, C) float32 antialiased image, differentiable with respect to
        ``color`` and ``verts_ndc`` (x, y; z gets 0). Non-float32 inputs are cast
        (differentiably).

    Raises:
        TypeError, ValueError: bad input, naming the argument, before any kernel
            (index ranges are checked in eager mode; skipped while compiling).
    """
    float_tensor(color, "color", 4, (None,), "(N, H, W, C)")
    int_tensor(pix_to_face, "pix_to_face", 4)
    if tuple(pix_to_face.shape) != (*color.shape[:3], 1):
        raise ValueError(
            f"pix_to_face must have shape {(*color.shape[:3], 1)} (K = 1), got "
            f"{tuple(pix_to_face.shape)}"
        )
    float_tensor(verts_ndc, "verts_ndc", 2, (3,), "(V, 3)")
    int_tensor(faces, "faces", 2, 3)
    if zbuf is not None:
        float_tensor(zbuf, "zbuf", 4, (1,), "(N, H, W, 1)")
        if tuple(zbuf.shape) != tuple(pix_to_face.shape):
            raise ValueError(
                f"zbuf must have shape {tuple(pix_to_face.shape)}, got {tuple(zbuf.shape)}"
            )
    same_device(color.device, "color", pix_to_face=pix_to_face, verts_ndc=verts_ndc, faces=faces,
                zbuf=zbuf)  # fmt: skip
    # Index ranges from each tensor's (min, max), read back once per unchanged tensor
    # (the faces: not again while they are passed unchanged; a fresh pix_to_face:
    # once, shared with the other ops fed the same tensor; see checks.index_bounds).
    check_index_bounds(faces, "faces", verts_ndc.shape[0], "vertices in verts_ndc",
                       kind="vertex indices")  # fmt: skip
    check_index_bounds(pix_to_face, "pix_to_face", faces.shape[0], "faces", allow=-1,
                       kind="face ids")  # fmt: skip
    z = None if zbuf is None else _f32(zbuf).detach()
    faces32 = faces.detach() if torch.compiler.is_compiling() else _faces_int32(faces.detach())
    record = torch.is_grad_enabled() and (color.requires_grad or verts_ndc.requires_grad)
    return _antialias(_f32(color), to_int32(pix_to_face), _f32(verts_ndc), to_int32(faces32), z,
                      bool(deterministic), bool(record))[0]  # fmt: skip
