"""Persistent Warp state for the torch renderer op: built once, refilled every call.

A :class:`RenderContext` keeps, per (device, stream, static configuration JSON,
resolved raster settings, input shapes and the topology tensors' identity), a
small pool of :class:`_Slot` s. A slot holds everything one render needs: owned
copies of the op's input tensors and their gradient buffers, the Warp cameras,
lights, materials, textures and shader built on them, the projected vertices,
the raster workspace, the shading buffers and the antialias pass. Its first
call builds it (and validates the topology and values on the host); every later
call copies the input tensors into it (device copies), runs the same launches as
the Warp ``MeshRenderer`` (so the same numbers, bit for bit) and copies the
outputs out into fresh tensors: no Warp allocation, no host read.

A forward that records for a backward *leases* its slot: the slot keeps its
inputs, buffers and tape until the backward has run (``render_meshes_backward``
runs that tape's adjoint: the forward is never replayed). Two forwards then two
backwards (a loss over two renders) lease two slots. When every slot of the pool
is leased, the oldest lease is given up (its backward renders again on a fresh
tape, as the op's fallback does) and its slot reused.

Where graphs are on (:attr:`RenderContext.call_graphs`, the rule of
:func:`~warpraster.raster.workspace.graphs_enabled`: on CUDA with the memory pool
by default, forced with True, e.g. on the cpu device in the tests), a slot's second
call captures its launches and later calls replay them: the forward as one graph
and, when it records, its backward as another
(:class:`~warpraster.tape_replay.RecordedCall`; the slot's arrays are the same every
call, only their contents change). The same launches on the same arrays: the same
numbers as the launches one by one, which run where graphs are off.

What takes the fresh path (``render_op._run`` building every Warp object per
call, as before): a batch with no vertices or no faces, and every call while
:attr:`RenderContext.enabled` is False.

Values are checked when the op first sees a tensor: a camera tensor that is a new
object is read back (its Warp camera validates R, znear, ...; znear/2 is also
the default clip plane, so znear is re-read when its version changes); the
textures' UVs and the index values when a slot is built (a new topology tensor,
or one changed in place, builds a new slot). Values written in place into the
same tensors (an optimizer's step) are not read back again, as with the lights
and materials (checked when their torch objects are made).
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable

import torch
import warp as wp

from .. import shading as _shading
from ..antialiasing import Antialias
from ..camera import vert_to_mesh_from_faces
from ..grad_buffers import clear_if_recording
from ..meshes import pack_meshes
from ..raster import ClipWorkspace, RasterWorkspace
from ..raster.workspace import CallGraph
from ..rasterize import rasterize_checked
from ..rasterizer import MeshRasterizer, RasterizationSettings
from ..renderer import _image_grad_key
from ..shading.corner_lists import CornerLists
from ..shading.params import check_mesh_inputs, values_checked
from ..shading.shading_buffers import ShadingBuffers
from ..tape_replay import RecordedCall
from .checks import _tensor_key, to_int32
from .eager import without_grad

__all__ = ["RenderContext", "default_render_context"]

# handles of leased slots and of the op's other recorded renders share one counter
_HANDLES = itertools.count(1)


def next_handle() -> int:
    """A new handle for a recorded render (never -1)."""
    return next(_HANDLES)


#: :meth:`RenderContext.lease`'s default: torch's current stream, read there
_CURRENT = object()


def _stream_key(device: torch.device):
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None


def _camera_tensors(cfg: dict, tensors: list) -> list[tuple[dict, list]]:
    """(camera config, its tensors) of the rasterizer's camera and the shader's own."""
    n = len(cfg["camera"]["names"])
    out = [(cfg["camera"], tensors[:n])]
    own = cfg.get("shader_camera") if cfg["shader"] != "none" else None
    if own is not None:
        out.append((own, tensors[n : n + len(own["names"])]))
    return out


def _asked(cfg: dict, tensors: list) -> list[bool]:
    """Which tensors the caller differentiates (``config["needs_grad"]``; all
    floating-point ones when absent)."""
    needs = cfg.get("needs_grad")
    return [t.is_floating_point() and (needs is None or bool(needs[i]))
            for i, t in enumerate(tensors)]  # fmt: skip


def _grouped_needs(cfg: dict, tensors: list) -> list[bool]:
    """:func:`_asked`, with a whole group when one member is asked for: the shading
    camera's R and T, the light tensors, the material tensors. The shading adjoint
    writes a whole group, into a scratch gradient made per recorded call for the
    members without one (shading/fused.py); the slot gives them buffers of its own
    instead (the same numbers land there; no allocation per call)."""
    needs = _asked(cfg, tensors)
    if cfg["shader"] == "none":
        return needs
    cams = _camera_tensors(cfg, tensors)
    start = 0 if len(cams) == 1 else len(cams[0][0]["names"])
    names = cams[-1][0]["names"]
    groups = [[start + names.index(n) for n in ("R", "T") if n in names]]
    start = sum(len(c["names"]) for c, _ in cams)
    for group_names in (cfg["lights"]["names"], cfg["materials"]):
        groups.append(list(range(start, start + len(group_names))))
        start += len(group_names)
    for group in groups:
        if any(needs[i] for i in group):
            for i in group:
                needs[i] = tensors[i].is_floating_point()
    return needs


def _foreach(multi, single, *lists) -> None:
    """``multi(*lists)`` (one torch call for the lists); ``single`` per element where
    torch has no multi-tensor kernel for them."""
    try:
        multi(*lists)
    except (RuntimeError, AttributeError):
        for args in zip(*lists, strict=True):
            single(*args)


class _SlotTape(wp.Tape):
    """The tape of a slot's recorded forward. Only the slot runs its backward, and it
    never calls ``zero()`` (the forward clears the slot's gradient buffers): a
    recorded function's arrays are not listed for it (Warp's check of each array,
    ~0.6 us of host time apiece, every replayed call), and
    :func:`~warpraster.backward.tape.record_func` does not filter them for it
    (``lists_arrays``)."""

    lists_arrays = False

    def record_func(self, backward, arrays):
        self.launches.append(backward)


def _copy_upstream(views: list, upstream: list) -> None:
    """Each upstream gradient into the torch view of its output's gradient buffer.
    No gradient (None): the buffer holds the zeros the forward cleared it to (every
    recorded render clears its outputs' own)."""
    for view, g in zip(views, upstream, strict=True):
        if view is not None and g is not None:
            view.copy_(g)


class _Lease:
    """A recorded forward's claim on its slot until its backward (see the module)."""

    __slots__ = ("context", "generation", "slot")

    def __init__(self, context, slot, generation):
        self.context, self.slot, self.generation = context, slot, generation

    def valid(self) -> bool:
        return self.slot.generation == self.generation

    def release(self) -> None:
        self.context._release(self)


class _Slot:
    """One render's Warp objects and buffers (see the module)."""

    def __init__(self, cfg, settings, verts, faces, first, count, tensors):
        from .render_op import _build, _grad_buffers, _textures

        self.generation = 0
        self.busy = False
        self.record = bool(cfg.get("record", False))
        self.shader_name = cfg["shader"]
        self.settings = settings
        self.antialias = bool(cfg.get("antialias", False))
        with torch.no_grad():
            self.verts = verts.detach().clone(memory_format=torch.contiguous_format)
            self.tensors = [
                t.detach().clone(memory_format=torch.contiguous_format) for t in tensors
            ]
        self.grad_verts = torch.zeros_like(self.verts) if self.record else None
        self.grads = None
        if self.record:
            needs = _grouped_needs(cfg, self.tensors)
            self.grads = _grad_buffers(self.tensors, {**cfg, "needs_grad": needs})
            # returned as zeros, as the fresh path returns them (nobody asked for them)
            asked = _asked(cfg, self.tensors)
            self.unasked = [n and not a for n, a in zip(needs, asked, strict=True)]
        # the topology: owned int32 copies (a new or changed tensor builds a new slot)
        self.faces, self.first, self.count = (to_int32(x).clone() for x in (faces, first, count))
        rg = self.record
        self.v = wp.from_torch(self.verts, dtype=wp.vec3, requires_grad=rg, grad=self.grad_verts)
        self.f = wp.from_torch(self.faces, dtype=wp.int32)
        self.fi = wp.from_torch(self.first, dtype=wp.int32)
        self.cn = wp.from_torch(self.count, dtype=wp.int32)
        self.device = self.v.device
        n, nv, nf = self.fi.shape[0], self.v.shape[0], self.f.shape[0]
        h, w = settings.image_size
        self.shape = (n, h, w, settings.faces_per_pixel)
        with values_checked():  # the torch classes checked their values once, when made
            self.objs = _build(cfg, self.tensors, self.grads)
        self.cameras = self.objs["cameras"]
        self.cameras.check_batch(n)
        settings.check_slots(n)
        self.textures = None if self.shader_name == "none" else _textures(
            cfg, self.tensors, self.grads
        )  # fmt: skip
        # checked once here: every later call runs on the same topology
        pack_meshes(self.v, self.f, self.fi, self.cn, validate=True)
        self.v2m = None
        if n > 1:
            self.v2m = vert_to_mesh_from_faces(self.f, self.fi, self.cn, nv, device=self.device)
        self.verts_ndc = wp.zeros(nv, dtype=wp.vec3, device=self.device, requires_grad=rg)
        self.meshes = pack_meshes(self.verts_ndc, self.f, self.fi, self.cn, validate=False)
        if settings.clipped:
            self.workspace = ClipWorkspace(num_verts=nv, num_faces=nf, num_meshes=n,
                                           settings=settings, device=self.device,
                                           requires_grad=rg)  # fmt: skip
        else:
            self.workspace = RasterWorkspace(num_meshes=n, num_faces=nf, settings=settings,
                                             device=self.device, requires_grad=rg)  # fmt: skip
        self.shader = None
        self.shading = None
        self.aa = None
        self.validate = True  # the shader's own checks, on the first run
        if self.shader_name != "none":
            objs = self.objs
            self.shader = getattr(_shading, self.shader_name)(
                cameras=self.cameras, lights=objs["lights"], materials=objs["materials"],
                blend_params=objs["blend_params"])  # fmt: skip
            check_mesh_inputs(nv, nf, n, textures=self.textures, lights=objs["lights"],
                              materials=objs["materials"])  # fmt: skip
            # each vertex's face corners, listed once (the slot's faces are static):
            # the vertex normals and the corner tables' backward gather per vertex
            # (the hand-written adjoints the Warp Renderer runs; Warp's generated
            # scatters cost ~0.17 ms more a step on the bench scenes, H200)
            corner_lists = CornerLists(self.f, nv)
            self.shading = ShadingBuffers(self.shape, nv, nf, self.device, requires_grad=rg,
                                          corner_lists=corner_lists)  # fmt: skip
            if self.antialias:
                self.aa = Antialias(self.f, nv, self.shading.image.shape, self.device,
                                    deterministic=settings.deterministic)  # fmt: skip
        self.tape: wp.Tape | None = None
        self.image = None
        self.frags = None
        #: the context's ``call_graphs`` (set at each lease): the launches replayed as
        #: captured graphs from the second call on (see :meth:`run`)
        self.graphs: bool | None = None
        self._recorded = RecordedCall(self.device) if self.record else None
        self._grad_views = None
        self._out_key = self._out_views = None
        # the floating-point inputs (copied in every call) and their own copies
        self._float_idx = [i for i, t in enumerate(self.tensors) if t.is_floating_point()]
        self._own_floats = [self.verts, *(self.tensors[i] for i in self._float_idx)]
        self._grad_list = [] if not self.record else [
            self.grad_verts, *(g for g in self.grads if g is not None)
        ]  # fmt: skip
        #: flat Warp views of the same: a captured forward clears them itself
        self._grad_arrays = [wp.from_torch(g.view(-1), dtype=wp.float32) for g in self._grad_list]
        self._call_graph = None if self.record else CallGraph(self.device)

    # -- forward
    def run(self, verts, tensors):
        """Copies the inputs in and renders (recorded on a new tape when the slot
        records); returns (image or None, fragments): the slot's own arrays."""
        # (graphs_enabled read once a call: nothing between here and the launches
        # changes the stream, the memory pool or a capture)
        graphs = self.record and self._recorded.enabled(self.graphs)
        without_grad(self._copy_in, verts, tensors, graphs)
        # The slot's arrays are the same every call (the inputs were copied into them)
        # and its launches' Python-side state is set by the first call: from the
        # second call on, where graphs are on (graphs_enabled), the render replays as
        # one captured graph and, recorded, its backward as another
        # (tape_replay.RecordedCall: the same launches on the same arrays); elsewhere
        # the launches run one by one, as a graph could not hold them.
        if not self.record:
            self.tape = None
            self._call_graph("slot", self._launch, self.graphs)
            return self.image, self.frags
        self.tape = _SlotTape()
        with self.tape:
            self._recorded(self.tape, "slot", self._launch, mode=self.graphs,
                           backward_key=self._backward_key, enabled=graphs)  # fmt: skip
        return self.image, self.frags

    def _copy_in(self, verts, tensors, graphs: bool) -> None:
        """The inputs copied into the slot's own tensors (grad mode off), and the
        inputs' gradients cleared unless the replayed forward clears them (``graphs``:
        the recorded call may replay, graphs_enabled)."""
        # one multi-tensor copy (and zero) each: a torch call per tensor costs
        # host time in every step
        src = [verts, *(tensors[i] for i in self._float_idx)]
        _foreach(torch._foreach_copy_, torch.Tensor.copy_, self._own_floats, src)
        # the inputs' gradients accumulate in Warp: cleared here, or, where the
        # forward replays its captured graph, by the graph (memsets captured in
        # _launch: no torch call, ~10 us of host time on CUDA)
        replays = graphs and self._recorded.captured_tape() is not None
        if self.record and not replays:
            _foreach(torch._foreach_zero_, torch.Tensor.zero_, self._grad_list)

    def _backward_key(self):
        """What the shading adjoint reads by value (no fused loss here: one state)."""
        return None if self.shading is None else _image_grad_key(self.shading.image_grad)

    def _launch(self):
        """The Warp ``MeshRenderer``'s launches, on this slot's buffers."""
        clear_if_recording(self.verts_ndc)  # the projection writes it; the rest clear their own
        if self.device.is_capturing:  # the replays' own clear of the inputs' gradients
            for g in self._grad_arrays:
                g.zero_()
        self.cameras.transform_points_ndc(self.v, self.v2m, None, self.verts_ndc)
        frags = rasterize_checked(self.meshes, self.settings, self.workspace)
        image = None
        if self.shader is not None:
            own = self.objs["shader_cameras"]
            image = self.shader(
                frags, self.v, self.f, textures=self.textures,
                cameras=self.cameras if own is None else own, vert_to_mesh=self.v2m,
                compact_slots=True, verts_ndc=self.verts_ndc,
                perspective_correct=self.settings.perspective_correct, buffers=self.shading,
                validate=self.validate, **self.objs["z_planes"],
            )  # fmt: skip
            self.validate = False
            if self.aa is not None:
                image = self.aa(image, frags.pix_to_face, self.verts_ndc, zbuf=frags.zbuf)
        self.image, self.frags = image, frags
        return image, frags

    def outputs(self, fragments: bool = True) -> list:
        """Copies of the last render's outputs as new tensors: [image or None,
        pix_to_face, zbuf, bary (N, H, W, K, 3), dists] (the image alone without
        ``fragments``), read through torch views of the slot's arrays made once
        (again only if an array moved)."""
        f = self.frags
        arrays = (self.image, f.pix_to_face, f.zbuf, f.bary_coords, f.dists)
        key = tuple(None if a is None else a.ptr for a in arrays)
        if key != self._out_key:
            self._out_key = key
            self._out_views = [None if a is None else wp.to_torch(a) for a in arrays]
        views = self._out_views if fragments else self._out_views[:1]
        return [None if v is None else v.clone() for v in views]

    # -- backward
    def _output_grad_views(self):
        """Torch views of the gradient buffers of the slot's outputs (image, zbuf, bary,
        dists; None for an absent output), made on first use: the slot's outputs are the
        same arrays every call. None when an output has no gradient buffer (then
        ``tape.backward(grads=...)`` sets the upstream tensor as its gradient)."""
        if self._grad_views is None:
            arrays = (self.image, self.frags.zbuf, self.frags.bary_coords, self.frags.dists)
            if any(a is not None and a.grad is None for a in arrays):
                self._grad_views = False
            else:
                self._grad_views = [
                    None if a is None or a.grad is None else wp.to_torch(a.grad) for a in arrays
                ]
        return self._grad_views or None

    def backward(
        self, upstream: list[torch.Tensor], asked=None, verts_asked: bool = True
    ) -> list[torch.Tensor]:
        """The recorded tape's adjoint from ``upstream`` ([d image, d zbuf, d bary,
        d dists], None where none came); [d verts, d tensors[0], ...] as new
        tensors (None for a tensor ``asked`` says autograd does not want; zeros for
        it without ``asked``; None for d verts when not ``verts_asked``: no copy of
        the vertex gradient buffer nobody reads)."""
        views = self._output_grad_views()
        if views is None:
            from .render_op import _output_grads, _upstream_filled

            cfg = {"image_size": self.shape[1:3], "raster": {"faces_per_pixel": self.shape[3]}}
            upstream = _upstream_filled(upstream, self.verts, self.first, cfg)
            self.tape.backward(grads=_output_grads(self.image, self.frags, upstream))
        else:  # the slot's output gradient buffers, written through torch views made once
            without_grad(_copy_upstream, views, upstream)
            self.tape.backward()
        self.tape = None
        return [self.grad_verts.clone() if verts_asked else None] + [
            None if asked is not None and not a
            else g.clone() if g is not None and not u
            else torch.zeros_like(t, dtype=torch.float32)
            for g, t, u, a in zip(self.grads, self.tensors, self.unasked, asked or self.grads,
                                  strict=True)
        ]  # fmt: skip


class _Entry:
    """The slots of one key, and the tensors the key's identity parts name."""

    __slots__ = ("key", "live", "refs", "slots")

    def __init__(self, key, refs):
        self.key, self.refs = key, refs
        self.live = True  # False once dropped (its quick keys then miss)
        self.slots: list[_Slot] = []


class RenderContext:
    """Persistent Warp objects and buffers of the torch renderer op (see the module).

    Args:
        max_entries: most configurations kept (least recently used dropped).
        pool_size: slots per configuration: recorded forwards whose backward has
            not run yet, each keeping its own (a loss over two renders needs 2).

    Attributes:
        enabled: False sends every call down the fresh path (a debugging switch;
            the tests compare the two).
        call_graphs: a slot's repeated calls replayed as captured graphs, forward
            and backward (None, the default: on CUDA with the memory pool; True: on
            every device, the cpu device's graphs being experimental in Warp 1.19;
            False: never): the rule of
            :func:`~warpraster.raster.workspace.graphs_enabled`. Checked bit for bit
            against the launches one by one on the cpu device (tests/test_torch_graphs.py)
            and on an H200 within the order of the atomic sums (5 training steps of the
            bench scenes). Warp captures in its thread-local mode, so other threads
            calling CUDA while torch's autograd thread captures a backward do not
            break the capture.
    """

    def __init__(self, max_entries: int = 8, pool_size: int = 2):
        if max_entries < 1 or pool_size < 1:
            raise ValueError(f"max_entries and pool_size must be >= 1, got {max_entries}, "
                             f"{pool_size}")  # fmt: skip
        self.max_entries, self.pool_size = int(max_entries), int(pool_size)
        self.enabled = True
        self.call_graphs: bool | None = None
        self._entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._cameras: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()
        self._layouts: dict[str, tuple] = {}
        # the call's inputs of both keys above in one (the camera tensors' memory and
        # device, znear's versions, the topology's keys, every tensor's shape and
        # dtype) -> (entry, settings, the camera and topology tensors' weak refs)
        self._quick: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()
        self._lock = threading.RLock()
        self._generations = itertools.count(1)

    def supports(self, verts, faces) -> bool:
        """Whether a call takes the persistent path (else the fresh one)."""
        return self.enabled and verts.shape[0] > 0 and faces.shape[0] > 0

    def lease(self, cfg: dict, config: str, verts, faces, first, count, tensors, *,
              check: Callable[[], None] | None = None, stream_key=_CURRENT) -> _Lease:  # fmt: skip
        """A slot for this call, leased to it (built on first use, see the module).
        Call from inside the op's stream scope (the device lock is held).

        ``check`` (the op's check of the index values) runs before an entry is made
        for a topology: a call that finds its entry (the very same topology tensors,
        their memory, shape, dtype, device and version unchanged, and as many
        vertices) had its values checked when the entry was made, and reads nothing
        back. ``stream_key``: torch's current stream handle (None on the cpu), as the
        op's stream scope read it (else read here)."""
        # (one pass; torch.Size hashes and compares as the tuple it is)
        topology = [faces, first, count]
        shapes = []
        for t in tensors:
            dtype = t.dtype
            shapes.append((t.shape, dtype))
            if not dtype.is_floating_point:
                topology.append(t)
        shapes = tuple(shapes)
        device = verts.device
        if stream_key is _CURRENT:
            stream_key = _stream_key(device)
        topology_keys = tuple([_tensor_key(t) for t in topology])
        # one look-up for both keys where the call's tensors are the entry's (the
        # settings' inputs, the entry's key less the settings it is made from)
        layout = self._layouts.get(config)
        quick = None
        if layout is not None:
            flat = tensors[: layout[0]]
            quick = (
                device, stream_key, config, verts.shape, shapes, topology_keys,
                tuple([(t.data_ptr(), t.device) for t in flat]),
                tuple([tensors[i]._version for i in layout[1]]),
            )  # fmt: skip
            with self._lock:
                hit = self._quick.get(quick)
                if (
                    hit is not None
                    and hit[0].live
                    and all(r() is t for r, t in zip(hit[2], [*flat, *topology], strict=True))
                ):
                    entry, settings = hit[0], hit[1]
                    self._entries.move_to_end(entry.key)
                    return self._lease_slot(entry, cfg, settings, verts, faces, first, count,
                                            tensors)  # fmt: skip
        settings = self._settings(cfg, tensors, config, shapes)
        key = (device, stream_key, config, settings, verts.shape, shapes, topology_keys)
        with self._lock:
            entry = self._entries.get(key)
            same = entry is not None and all(
                r() is t for r, t in zip(entry.refs, topology, strict=True)
            )
            if not same:  # (a new tensor at a freed one's address is not the same topology)
                entry = None
            if entry is None:
                if check is not None:
                    check()
                self._drop(key)
                entry = self._entries[key] = _Entry(key, [weakref.ref(t) for t in topology])
                while len(self._entries) > self.max_entries:
                    self._drop(next(iter(self._entries)))
            self._entries.move_to_end(key)
            if quick is not None:
                refs = [weakref.ref(t) for t in flat] + entry.refs
                self._quick[quick] = (entry, settings, refs)
                while len(self._quick) > 4 * self.max_entries:
                    self._quick.popitem(last=False)
            return self._lease_slot(entry, cfg, settings, verts, faces, first, count, tensors)

    def _lease_slot(self, entry, cfg, settings, verts, faces, first, count, tensors):
        with self._lock:
            free = [s for s in entry.slots if not s.busy]
            if free:
                slot = free[0]
            elif len(entry.slots) < self.pool_size:
                slot = _Slot(cfg, settings, verts, faces, first, count, tensors)
                entry.slots.append(slot)
            else:  # every slot leased: the oldest lease gives its slot up
                slot = min(entry.slots, key=lambda s: s.generation)
            slot.generation = next(self._generations)
            slot.busy = True
            slot.graphs = self.call_graphs
            return _Lease(self, slot, slot.generation)

    def _release(self, lease: _Lease) -> None:
        with self._lock:
            if lease.valid():
                lease.slot.busy = False
                lease.slot.tape = None

    def _drop(self, key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.live = False
            for s in entry.slots:
                s.generation = -1  # its leases are no longer valid

    def _settings(self, cfg: dict, tensors: list, config: str, shapes: tuple):
        """The call's raster settings (z_clip_value defaults to the camera's znear / 2):
        a host read of the camera tensors when they are new objects (their Warp
        cameras validate the values) or znear changed, else remembered (by the op's
        configuration string ``config``, which holds the cameras' and the raster's,
        and the camera tensors' memory, device, ``shapes`` (shape, dtype) and znear's
        version)."""
        layout = self._layouts.get(config)
        if layout is None:
            # (the camera tensors lead the list: their count and the znear tensors' places)
            names = [n for c, _ in _camera_tensors(cfg, tensors) for n in c["names"]]
            layout = (len(names), tuple(i for i, n in enumerate(names) if n == "znear"))
            with self._lock:
                self._layouts[config] = layout
                while len(self._layouts) > 4 * self.max_entries:
                    self._layouts.pop(next(iter(self._layouts)))
        flat = tensors[: layout[0]]
        key = (config, tuple([(t.data_ptr(), t.device) for t in flat]), shapes[: layout[0]],
               tuple([tensors[i]._version for i in layout[1]]))  # fmt: skip
        with self._lock:
            hit = self._cameras.get(key)
            if hit is not None and all(r() is t for r, t in zip(hit[0], flat, strict=True)):
                self._cameras.move_to_end(key)
                return hit[1]
        from .render_op import _build

        cams = _camera_tensors(cfg, tensors)
        warp_cams = [_build({"camera": c, "shader": "none"}, ts, None)["cameras"] for c, ts in cams]
        rasterizer = MeshRasterizer(
            cameras=warp_cams[0], raster_settings=RasterizationSettings(**cfg["raster"])
        )
        settings = rasterizer.settings_for(warp_cams[0])
        with self._lock:
            self._cameras[key] = ([weakref.ref(t) for t in flat], settings)
            while len(self._cameras) > 4 * self.max_entries:
                self._cameras.popitem(last=False)
        return settings

    def clear(self) -> None:
        """Drops every slot (leased ones' backwards render again)."""
        with self._lock:
            for key in list(self._entries):
                self._drop(key)
            self._cameras.clear()
            self._layouts.clear()
            self._quick.clear()


_DEFAULT = RenderContext()


def default_render_context() -> RenderContext:
    """The process-wide context of the torch renderer op."""
    return _DEFAULT
