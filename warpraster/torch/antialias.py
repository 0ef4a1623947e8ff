"""The antialias op on torch tensors: ``warpraster.torch.antialias``.

A ``torch.library.custom_op`` pair like the other ops (:mod:`warpraster.torch.ops`):
the forward runs :func:`warpraster.antialias` on zero-copy Warp views of the
tensors; the backward op replays it on a private ``wp.Tape`` whose output
gradient is a copy of the upstream gradient, and returns the gradients of
``color`` and ``verts_ndc``. Both run on torch's current stream inside a private
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
from .checks import _tensor_key, check_index_range, float_tensor, int_tensor, same_device, to_int32
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


def _run(color, pix_to_face, verts_ndc, faces, zbuf, deterministic, *, out, grads=None):
    """The Warp call on views of the tensors (``grads``: (grad_out, grad_color,
    grad_verts) to run the adjoint on a private tape). The index values were checked
    by :func:`antialias` (a host read there; none here)."""
    with _TorchStream(color.device):
        c = _wp(color, wp.float32, None if grads is None else grads[1])
        v = _wp(verts_ndc, wp.vec3, None if grads is None else grads[2])
        o = _wp(out, wp.float32, None if grads is None else grads[0])
        f = wp.from_torch(faces, dtype=wp.int32)
        if faces.shape[0] == 0:
            f = wp.empty((0, 3), dtype=wp.int32, device=c.device)
        z = None if zbuf is None else _wp(zbuf, wp.float32)
        p = _wp(pix_to_face, wp.int32)
        topology = _topology(faces, f, v.shape[0])
        op = _op(topology, v.shape[0], tuple(c.shape), color.device, deterministic)
        op.check(c, p, v, z, o)
        if grads is None:
            op(c, p, v, zbuf=z, out=o)
            return
        tape = wp.Tape()
        with tape:
            op(c, p, v, zbuf=z, out=o)
        tape.backward()


def _antialias_impl(
    color: torch.Tensor,
    pix_to_face: torch.Tensor,
    verts_ndc: torch.Tensor,
    faces: torch.Tensor,
    zbuf: torch.Tensor | None,
    deterministic: bool,
) -> torch.Tensor:
    """(N, H, W, C) float32; floats float32, indices int32, all contiguous."""
    out = torch.empty_like(color)
    if out.numel() == 0:
        return out
    _run(color, pix_to_face, verts_ndc, faces, zbuf, deterministic, out=out)
    return out


_antialias_op = torch.library.custom_op("warpraster::antialias", mutates_args=())(_antialias_impl)


@_antialias_op.register_fake
def _antialias_fake(color, pix_to_face, verts_ndc, faces, zbuf, deterministic):
    return torch.empty_like(color)


@_backward_op(_antialias_op, "Tensor grad_out", "(Tensor, Tensor)")
def _antialias_backward_op(
    grad_out: torch.Tensor, *inputs: torch.Tensor | bool | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d loss / d color, d loss / d verts_ndc) from d loss / d out."""
    color, pix_to_face, verts_ndc, faces, zbuf, deterministic = inputs
    grad_color = torch.zeros_like(color)
    grad_verts = torch.zeros_like(verts_ndc)
    if color.numel() == 0:
        return grad_color, grad_verts
    seeded = grad_out.clone(memory_format=torch.contiguous_format)
    _run(color, pix_to_face, verts_ndc, faces, zbuf, deterministic, out=torch.empty_like(color),
         grads=(seeded, grad_color, grad_verts))  # fmt: skip
    return grad_color, grad_verts


@_antialias_backward_op.register_fake
def _antialias_backward_fake(grad_out, color, pix_to_face, verts_ndc, faces, zbuf, deterministic):
    return torch.empty_like(color), torch.empty_like(verts_ndc)


def _setup(ctx, inputs, output):
    color, p2f, verts, faces, zbuf, deterministic = inputs
    ctx.deterministic = deterministic
    ctx.has_zbuf = zbuf is not None
    ctx.save_for_backward(color, p2f, verts, faces, *([zbuf] if ctx.has_zbuf else []))


def _backward(ctx, grad_out):
    saved = _detached(ctx.saved_tensors)
    color, p2f, verts, faces = saved[:4]
    zbuf = saved[4] if ctx.has_zbuf else None
    g = _upstream(grad_out, color)
    gc, gv = _antialias_backward_op(g, color, p2f, verts, faces, zbuf, ctx.deterministic)
    return gc, None, gv, None, None, None


_antialias = eager_path(_antialias_op, _antialias_impl, _setup, _backward)


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
    check_index_range(faces, "faces", verts_ndc.shape[0], "vertices in verts_ndc",
                      kind="vertex indices")  # fmt: skip
    check_index_range(pix_to_face, "pix_to_face", faces.shape[0], "faces", allow=-1,
                      kind="face ids")  # fmt: skip
    z = None if zbuf is None else _f32(zbuf).detach()
    faces32 = faces.detach() if torch.compiler.is_compiling() else _faces_int32(faces.detach())
    return _antialias(_f32(color), to_int32(pix_to_face), _f32(verts_ndc), to_int32(faces32), z,
                         bool(deterministic))  # fmt: skip
