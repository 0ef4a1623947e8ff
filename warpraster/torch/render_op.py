"""The render as one torch custom op: project, rasterize and shade with the Warp kernels.

``warpraster::render_meshes`` runs the Warp ``MeshRenderer``'s launches (or only
its rasterizer's) and returns the RGBA image and the fragments. Its Warp objects
and buffers live in a persistent :class:`~.render_context.RenderContext` slot,
built on the first call and refilled from the tensors on later ones (no Warp
allocation, no host read); :func:`_run` without a slot is the fresh path that
builds them per call on tensors shared with Warp (``wp.from_torch``), taken
where the context does not apply (see :mod:`.render_context`). A forward whose
inputs require gradients records its launches on a tape kept by handle (an int64
output); its backward, ``warpraster::render_meshes_backward``, runs that tape
from the upstream gradients (rendering again on a fresh tape only when the record
is no longer kept), returning the gradients of the vertices and of every camera,
light, material, background, z-plane and texture tensor. Both ops have fake
implementations (output shapes from the configuration), so ``torch.compile``
treats the render as one opaque node; nothing Warp-side lives in the autograd graph.

The op takes the packed meshes, a list of float32 / int32 tensors and a JSON
configuration that says what each tensor is (:func:`~.render_config.config_and_tensors`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import threading

import torch
import warp as wp

from .. import camera as _camera
from .. import shading as _shading
from ..rasterizer import MeshRasterizer as _WarpMeshRasterizer
from ..rasterizer import RasterizationSettings
from ..renderer import MeshRenderer as _WarpMeshRenderer
from ..shading.corner_lists import CornerLists
from ..shading.params import values_checked
from ..shading.shading_buffers import ShadingBuffers
from .checks import check_packed_values, to_int32
from .eager import first_order_only
from .render_context import _Lease, default_render_context, next_handle
from .streams import _TorchStream


def _wp(t: torch.Tensor, dtype, grad: torch.Tensor | None = None) -> wp.array:
    if grad is None:
        return wp.from_torch(t, dtype=dtype, requires_grad=False)
    return wp.from_torch(t, dtype=dtype, requires_grad=True, grad=grad)


_VEC_DTYPES = {3: wp.vec3, 2: wp.vec2}


def _as_warp(t, grad=None):
    """Warp view of a parameter tensor: (B,) scalars, (B, 2|3) vectors, (B, 3, 3) mat33."""
    if t.ndim == 3 and t.shape[1:] == (3, 3):
        return _wp(t, wp.mat33, grad)
    if t.ndim == 2 and t.shape[1] in _VEC_DTYPES:
        return _wp(t, _VEC_DTYPES[t.shape[1]], grad)
    return _wp(t, wp.float32, grad)


class _OwnCamera:
    """A Warp shader that shades with its own camera (PyTorch3D's shader camera, when
    it is not the rasterizer's): every call gets ``cameras`` replaced."""

    def __init__(self, shader, cameras):
        self._shader, self._cameras = shader, cameras

    def __getattr__(self, name):
        return getattr(self._shader, name)

    def __call__(self, *args, cameras=None, **kwargs):
        return self._shader(*args, cameras=self._cameras, **kwargs)


def _build(config: dict, tensors: list[torch.Tensor], grads: list | None):
    """Warp cameras, lights, materials, textures, blend params and z planes from the op inputs."""
    it = iter(range(len(tensors)))

    def take(kind="param"):
        i = next(it)
        g = None if grads is None else grads[i]
        return _wp(tensors[i], wp.float32, g) if kind == "raw" else _as_warp(tensors[i], g)

    def camera(cfg):
        args = {name: take("raw" if name == "focal_length" else "param") for name in cfg["names"]}
        return getattr(_camera, cfg["type"])(**args, **cfg["kwargs"])

    out = {"cameras": camera(config["camera"])}
    if config["shader"] == "none":
        return out
    out["shader_cameras"] = (
        None if config["shader_camera"] is None else camera(config["shader_camera"])
    )
    light_cfg = config["lights"]
    out["lights"] = getattr(_shading, light_cfg["type"])(**{n: take() for n in light_cfg["names"]})
    out["materials"] = _shading.Materials(**{n: take() for n in config["materials"]})
    bg = take() if config["blend"]["background_tensor"] else tuple(config["blend"]["background"])
    out["blend_params"] = _shading.BlendParams(
        sigma=config["blend"]["sigma"], gamma=config["blend"]["gamma"], background_color=bg
    )
    out["z_planes"] = {name: take("raw") for name in config["z_planes"]}
    return out


def _textures(config: dict, tensors: list[torch.Tensor], grads: list | None):
    """The Warp textures from the op's last tensors (None without textures).

    Built outside any tape: a ``TexturesUVMipmap`` builds its pyramid when made and
    again when sampled; recorded twice, the pyramid's adjoint would reach the base
    texels twice.
    """
    tex_cfg = config.get("textures")
    if tex_cfg is None:
        return None

    def take(i):
        return _wp(tensors[i], wp.float32, None if grads is None else grads[i])

    if tex_cfg["type"] == "TexturesVertex":
        return _shading.TexturesVertex(take(len(tensors) - 1))
    n = len(tensors)
    faces_uvs = wp.from_torch(tensors[n - 1], dtype=wp.int32)
    cls = getattr(_shading, tex_cfg["type"])
    return cls(take(n - 3), faces_uvs, take(n - 2), **tex_cfg["static"])


def _run(
    verts, faces, first, count, tensors, config, grads=None, grad_verts=None, tape=None, slot=None
):
    """Runs the Warp MeshRenderer (or rasterizer) on tensor views; returns (image, fragments).

    With ``tape``, everything but the textures' construction is recorded on it. With
    ``slot`` (a leased :class:`~.render_context._Slot`), the slot's persistent objects
    render copies of the inputs instead (recorded on the slot's tape when it records).
    """
    if slot is not None:
        return slot.run(verts, tensors)
    textures = None if config["shader"] == "none" else _textures(config, tensors, grads)
    with tape if tape is not None else contextlib.nullcontext():
        return _render(verts, faces, first, count, tensors, config, grads, grad_verts, textures)


def _render(verts, faces, first, count, tensors, config, grads, grad_verts, textures):
    v = _wp(verts, wp.vec3, grad_verts)
    f = wp.from_torch(to_int32(faces), dtype=wp.int32)
    fi = wp.from_torch(to_int32(first), dtype=wp.int32)
    cn = wp.from_torch(to_int32(count), dtype=wp.int32)
    with values_checked():  # the torch classes checked their values once, when made
        objs = _build(config, tensors, grads)
    settings = RasterizationSettings(**config["raster"])
    rasterizer = _WarpMeshRasterizer(cameras=objs["cameras"], raster_settings=settings)
    if config["shader"] == "none":
        return None, rasterizer(v, f, fi, cn, validate=grads is None)
    shader = getattr(_shading, config["shader"])(
        cameras=objs["cameras"],
        lights=objs["lights"],
        materials=objs["materials"],
        blend_params=objs["blend_params"],
    )
    renderer = _WarpMeshRenderer(
        rasterizer=rasterizer, shader=shader, antialias=bool(config.get("antialias", False))
    )
    if objs["shader_cameras"] is not None:
        renderer.shader = _OwnCamera(shader, objs["shader_cameras"])
    extra = {}
    if v.shape[0] and f.shape[0]:
        # the slot path's shading buffers: each vertex's face corners listed, so the
        # vertex normals and the corner tables' backward gather per vertex (the same
        # sums in the same order as a context slot's)
        extra["buffers"] = ShadingBuffers(
            _shape(fi, config), v.shape[0], f.shape[0], v.device, requires_grad=grads is not None,
            corner_lists=CornerLists(f, v.shape[0]),
        )  # fmt: skip
    # the index values were checked by the op (check_packed_values): no host read here
    image, frags = renderer(v, f, fi, cn, textures=textures, return_fragments=True,
                            validate=False, **extra, **objs["z_planes"])  # fmt: skip
    return image, frags


def _shape(first: torch.Tensor, config: dict):
    h, w = config["image_size"]
    return (first.shape[0], h, w, config["raster"]["faces_per_pixel"])


def _grad_buffers(tensors: list[torch.Tensor], config: dict) -> list:
    """A zeroed gradient buffer for each tensor the caller differentiates
    (``config["needs_grad"]``, made where autograd can see which tensors require
    gradients; all floating-point ones when absent), None for the others: the
    adjoints then compute only the gradients asked for (a camera that is not
    trained costs its per-pixel sums nothing)."""
    needs = config.get("needs_grad")
    return [
        torch.zeros_like(t) if t.is_floating_point() and (needs is None or needs[i]) else None
        for i, t in enumerate(tensors)
    ]


class _Recorded:
    """Forward renders recorded on their own ``wp.Tape`` for the backward, by handle.

    A forward whose inputs require gradients records its launches (and the Warp
    objects they use stay alive here); its backward runs that tape instead of
    rendering again. At most :attr:`capacity` are kept (each holds a render's
    buffers): an older one's backward, or a second backward of one, renders again
    on a tape (the same numbers).
    """

    capacity = 4

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[int, object] = collections.OrderedDict()

    def put(self, entry) -> int:
        """Keeps ``entry`` (a fresh render's tuple, or a context slot's lease, released
        when dropped) under a new handle."""
        with self._lock:
            handle = next_handle()
            self._entries[handle] = entry
            dropped = []
            while len(self._entries) > self.capacity:
                dropped.append(self._entries.popitem(last=False)[1])
        for old in dropped:
            if isinstance(old, _Lease):
                old.release()
        return handle

    def take(self, handle: int):
        with self._lock:
            return self._entries.pop(handle, None)


_RECORDED = _Recorded()

#: per thread: (slot, generation) of the last call that left its fragments in its slot
#: (``config["fragments"]`` False), for :func:`fragments_later`
_LATER = threading.local()


def fragments_later():
    """(slot, generation) the calling thread's last render left its fragments in, or
    None (see :class:`~warpraster.torch.renderer.LazyFragments`)."""
    return getattr(_LATER, "fragments", None)


def _render_impl(
    verts: torch.Tensor,
    faces: torch.Tensor,
    mesh_to_face_first_idx: torch.Tensor,
    num_faces_per_mesh: torch.Tensor,
    tensors: list[torch.Tensor],
    config: str,
) -> tuple[torch.Tensor, tuple | None, int]:
    """(image (N, H, W, 4), fragments, handle): the op's forward body.

    ``fragments`` is (pix_to_face int32, zbuf, bary (N, H, W, K, 3), dists), or None
    where the call left them in its slot for later (``config["fragments"]`` False:
    :func:`fragments_later`); ``handle`` names the recorded render its backward runs
    (``config["record"]``; -1: not recorded)."""
    cfg = _parsed(config)

    def check():
        # The index values, before any int32 cast could wrap them (a host read; the
        # op body runs eagerly also inside a compiled graph). A lease runs it only
        # for a topology it has no entry for: an entry's was checked when made.
        check_packed_values(verts.shape[0], faces, mesh_to_face_first_idx, num_faces_per_mesh)

    handle = -1
    context = default_render_context()
    with _TorchStream(verts.device) as scope:
        lease = None
        if context.supports(verts, faces):
            lease = context.lease(cfg, config, verts, faces, mesh_to_face_first_idx,
                                  num_faces_per_mesh, tensors, check=check,
                                  stream_key=scope.stream_key)  # fmt: skip
        else:
            check()
        if lease is not None:
            try:
                image, frags = _run(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                                    tensors, cfg, slot=lease.slot)  # fmt: skip
            except BaseException:
                lease.release()
                raise
        elif cfg.get("record", False):
            grad_verts = torch.zeros_like(verts)
            grads = _grad_buffers(tensors, cfg)
            tape = wp.Tape()
            image, frags = _run(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                                tensors, cfg, grads=grads, grad_verts=grad_verts,
                                tape=tape)  # fmt: skip
            handle = _RECORDED.put((tape, image, frags, grad_verts, grads))
        else:
            image, frags = _run(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                                tensors, cfg)  # fmt: skip
        n, h, w, k = frags.pix_to_face.shape
        _LATER.fragments = None
        if lease is not None and not cfg.get("fragments", True):
            # the caller reads the fragments later if at all (MeshRenderer): none out
            # now, the slot's own buffers until its next lease
            img = lease.slot.outputs(fragments=False)[0]
            outs = None
            _LATER.fragments = (lease.slot, lease.slot.generation)
        elif lease is not None:
            img, *outs = lease.slot.outputs()
            outs = tuple(outs)
        else:
            img = None if image is None else wp.to_torch(image).clone()
            outs = (
                wp.to_torch(frags.pix_to_face).clone(),
                wp.to_torch(frags.zbuf).clone(),
                wp.to_torch(frags.bary_coords).reshape(n, h, w, k, 3).clone(),
                wp.to_torch(frags.dists).clone(),
            )
        if img is None:
            img = verts.new_zeros((n, h, w, 4))
        if lease is not None:
            if lease.slot.record:
                handle = _RECORDED.put(lease)  # the slot stays leased until the backward
            else:
                lease.release()
    return img, outs, handle


def _render_op_impl(
    verts: torch.Tensor,
    faces: torch.Tensor,
    mesh_to_face_first_idx: torch.Tensor,
    num_faces_per_mesh: torch.Tensor,
    tensors: list[torch.Tensor],
    config: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image (N, H, W, 4), pix_to_face int32, zbuf, bary (N, H, W, K, 3), dists, handle):
    :func:`_render_impl` as the custom op returns it (fragments left for later as empty
    tensors; ``handle`` an int64 scalar)."""
    img, outs, handle = _render_impl(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh,
                                     tensors, config)  # fmt: skip
    if outs is None:
        outs = tuple(verts.new_empty(0) for _ in range(4))
    return (img, *outs, torch.tensor(handle, dtype=torch.int64))


render_op = torch.library.custom_op("warpraster::render_meshes", mutates_args=())(_render_op_impl)


@render_op.register_fake
def _render_fake(verts, faces, first, count, tensors, config):
    shape = _shape(first, json.loads(config))
    return (
        verts.new_empty((*shape[:3], 4)),
        verts.new_empty(shape, dtype=torch.int32),
        verts.new_empty(shape),
        verts.new_empty((*shape, 3)),
        verts.new_empty(shape),
        torch.empty((), dtype=torch.int64),
    )


def _render_backward_impl(
    upstream: list[torch.Tensor],
    saved: list[torch.Tensor],
    config: str,
    handle: torch.Tensor,
    asked: list[bool] | None = None,
    verts_asked: bool = True,
) -> list[torch.Tensor]:
    """[d verts, d tensors[0], ...]: the forward's recorded tape run backward (or, when
    it is no longer kept, the render again on a wp.Tape, then backward).

    ``upstream`` = [d image, d zbuf, d bary, d dists] (zeros where none came);
    ``saved`` = the forward's inputs [verts, faces, mesh_to_face_first_idx,
    num_faces_per_mesh, *tensors], as :func:`_setup_context` saved them.
    ``asked`` (the eager path): which of ``tensors`` autograd wants a gradient for;
    None where it does not (the custom op returns a tensor for each: zeros).
    ``verts_asked`` False: autograd wants no vertex gradient (a leased slot then
    returns None for it instead of a copy of its buffer).
    """
    verts = saved[0]
    recorded = _RECORDED.take(int(handle))
    with _TorchStream(verts.device):  # (a lease is checked and run under the device lock)
        if isinstance(recorded, _Lease):
            lease, recorded = recorded, None
            if lease.valid():
                try:
                    return lease.slot.backward(upstream, asked, verts_asked)
                finally:
                    lease.release()
        cfg = _parsed(config)
        verts, faces, first, count, *tensors = saved
        upstream = _upstream_filled(upstream, verts, first, cfg)
        if recorded is not None:
            tape, image, frags, grad_verts, grads = recorded
        else:
            grad_verts = torch.zeros_like(verts)
            grads = _grad_buffers(tensors, cfg)
            tape = wp.Tape()
            image, frags = _run(verts, faces, first, count, tensors, cfg, grads=grads,
                                grad_verts=grad_verts, tape=tape)  # fmt: skip
        tape.backward(grads=_output_grads(image, frags, upstream))
    return [grad_verts] + [
        None if asked is not None and not a
        else g if g is not None else torch.zeros_like(t, dtype=torch.float32)
        for g, t, a in zip(grads, tensors, asked or grads, strict=True)
    ]  # fmt: skip


@torch.library.custom_op("warpraster::render_meshes_backward", mutates_args=())
def _render_backward_op(
    upstream: list[torch.Tensor], saved: list[torch.Tensor], config: str, handle: torch.Tensor
) -> list[torch.Tensor]:
    """:func:`_render_backward_impl` as a custom op (what torch.compile sees)."""
    return _render_backward_impl(upstream, saved, config, handle)


def _upstream_filled(upstream: list, verts, first, cfg: dict) -> list[torch.Tensor]:
    """``upstream`` with zeros made for its None entries (the fresh path's tape reads
    every output gradient)."""
    if all(g is not None for g in upstream):
        return upstream
    shape = _shape(first, cfg)
    shapes = ((*shape[:3], 4), shape, (*shape, 3), shape)
    return [verts.new_zeros(s) if g is None else g for g, s in zip(upstream, shapes, strict=True)]


def _output_grads(image, frags, upstream: list[torch.Tensor]) -> dict:
    """The tape's output gradients: Warp views of ``upstream`` ([d image, d zbuf,
    d bary, d dists]) by the arrays they belong to (copied into their ``.grad``)."""
    grad_image, grad_zbuf, grad_bary, grad_dists = upstream
    n, h, w, k = frags.pix_to_face.shape
    output_grads = {
        frags.zbuf: wp.from_torch(grad_zbuf.contiguous(), dtype=wp.float32),
        frags.bary_coords: wp.from_torch(
            grad_bary.reshape(n, h, w, k, 3).contiguous(), dtype=wp.vec3
        ),
        frags.dists: wp.from_torch(grad_dists.contiguous(), dtype=wp.float32),
    }
    if image is not None:
        output_grads[image] = wp.from_torch(grad_image.contiguous(), dtype=wp.float32)
    return output_grads


@_render_backward_op.register_fake
def _render_backward_fake(upstream, saved, config, handle):
    verts, tensors = saved[0], saved[4:]
    return [torch.empty_like(verts)] + [torch.empty_like(t, dtype=torch.float32) for t in tensors]


def _setup_context(ctx, inputs, output):
    verts, faces, first, count, tensors, config = inputs
    ctx.config = config
    ctx.save_for_backward(verts, faces, first, count, output[5], *tensors)


def _upstream_and_saved(ctx, g_image, g_zbuf, g_bary, g_dists):
    """(upstream, saved, handle, tensors) of the custom op's backward: the output
    gradients, zeros where none came (the adjoint reads every one)."""
    verts, faces, first, count, handle, *tensors = ctx.saved_tensors
    shape = _shape(first, _parsed(ctx.config))

    def z(g, s):
        g = _given(g)  # (none came, or an output left empty)
        return verts.new_zeros(s) if g is None else g

    upstream = [z(g_image, (*shape[:3], 4)), z(g_zbuf, shape), z(g_bary, (*shape, 3)),
                z(g_dists, shape)]  # fmt: skip
    return upstream, [verts, faces, first, count, *tensors], handle, tensors


def _backward_impl(ctx, g_image, g_p2f, g_zbuf, g_bary, g_dists, g_handle):
    upstream, saved, handle, tensors = _upstream_and_saved(ctx, g_image, g_zbuf, g_bary, g_dists)
    grads = _render_backward_op(upstream, saved, ctx.config, handle)
    tensor_grads = [
        g if t.is_floating_point() else None for g, t in zip(grads[1:], tensors, strict=True)
    ]
    return (grads[0], None, None, None, tensor_grads, None)


render_op.register_autograd(first_order_only(_backward_impl), setup_context=_setup_context)


class _EagerRender(torch.autograd.Function):
    """The op's eager path: the same forward and backward bodies as :func:`render_op`
    without the dispatcher's layers (the custom op's autograd wrapper, redispatch,
    argument flattening: about a third of an eager call's host time), and no gradient
    made for a tensor autograd does not want.

    Only the tensors that require gradients are the Function's tensor arguments
    (``diff``, at ``where`` in ``[verts, *tensors]``): autograd's per-input work
    (edges, saved variables) grows with their count, and a render has ~20 inputs of
    which a training step differentiates a few. The others travel in ``inputs``
    (``(verts, faces, first, count)``) and ``tensors``; their versions are kept and
    checked in the backward, as saved tensors' are (an input changed in place
    between the forward and the backward raises). No handle tensor is made: the
    handle stays on ``ctx``; fragments left for later are no outputs at all."""

    @staticmethod
    def forward(ctx, config, inputs, tensors, where, *diff):
        img, outs, handle = _render_impl(*inputs, tensors, config)
        ctx.config, ctx.handle, ctx.where = config, handle, where
        ctx.inputs, ctx.tensors = inputs, tensors
        ctx.versions = _versions(inputs, tensors)
        ctx.save_for_backward(*diff)
        ctx.set_materialize_grads(False)  # None for an output no gradient came to
        if outs is None:
            return img
        ctx.mark_non_differentiable(outs[0])
        return (img, *outs)

    @staticmethod
    @first_order_only
    def backward(ctx, g_image, *g_frags):
        # None for an output no gradient came to: a slot's gradient buffer for it
        # holds the zeros its forward cleared it to (a K = 8 render's fragments are
        # ~0.3 GB of zeros to make and copy otherwise)
        ctx.saved_tensors  # noqa: B018 - torch's check of the differentiated inputs' versions
        inputs, tensors = ctx.inputs, ctx.tensors
        if _versions(inputs, tensors) != ctx.versions:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by "
                "an inplace operation: an input of warpraster's render (a camera, light, "
                "material, texture or mesh tensor) changed between the render and its backward"
            )
        g_zbuf, g_bary, g_dists = g_frags[1:] if g_frags else (None, None, None)
        upstream = [_given(g) for g in (g_image, g_zbuf, g_bary, g_dists)]
        asked = [False] * len(tensors)
        verts_asked = False
        for j, i in enumerate(ctx.where):
            if i > 0:
                asked[i - 1] = ctx.needs_input_grad[4 + j]
            else:
                verts_asked = ctx.needs_input_grad[4 + j]
        saved = [*inputs, *tensors]
        grads = _render_backward_impl(upstream, saved, ctx.config, ctx.handle, asked,
                                      verts_asked)  # fmt: skip
        return (None, None, None, None, *(grads[i] for i in ctx.where))


def _given(g):
    """An upstream gradient as the backward takes it: None where none came or the
    output was left empty, else contiguous."""
    return None if g is None or g.numel() == 0 else g.contiguous()


def _versions(inputs, tensors) -> tuple:
    """The torch version counters of the render's inputs (what ``save_for_backward``
    checks)."""
    try:
        return tuple([t._version for t in (*inputs, *tensors)])
    except RuntimeError:  # an inference tensor, which autograd cannot save either
        raise RuntimeError(
            "Inference tensors cannot be saved for backward. Please do not use Tensors "
            "created in inference mode in computation tracked by autograd."
        ) from None


def render(verts, faces, first, count, tensors: list[torch.Tensor], config: str):
    """The render: :func:`render_op` while ``torch.compile`` traces, else its eager path
    (:class:`_EagerRender`, the same numbers; without an input that requires grad under
    grad mode, :func:`_render_impl` alone). Returns (image, pix_to_face int32, zbuf,
    bary, dists, handle); the eager path's handle is None, and so are its fragments
    when they were left for later (:func:`fragments_later`)."""
    if torch.compiler.is_compiling():
        return render_op(verts, faces, first, count, tensors, config)
    where, diff = [], []
    if torch.is_grad_enabled():
        if verts.requires_grad:
            where.append(0)
            diff.append(verts)
        for i, t in enumerate(tensors, 1):
            if t.requires_grad:
                where.append(i)
                diff.append(t)
    if not diff:
        img, outs, _ = _render_impl(verts, faces, first, count, tensors, config)
    else:
        out = _EagerRender.apply(config, (verts, faces, first, count), tensors, where, *diff)
        img, outs = (out, None) if isinstance(out, torch.Tensor) else (out[0], out[1:])
    return (img, *(outs or (None,) * 4), None)


@functools.lru_cache(maxsize=64)
def _parsed_cached(config: str) -> dict:
    return json.loads(config)


def _parsed(config: str) -> dict:
    """The op's configuration parsed (kept per JSON string; read only)."""
    return _parsed_cached(config)
