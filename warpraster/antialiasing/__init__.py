"""Analytic silhouette antialiasing of a hard (K = 1) render, with gradients.

nvdiffrast's ``antialias`` on the project's conventions: where two neighbouring
pixels show different faces (or a face and the background) and a silhouette or
occlusion edge of the front face crosses between their centres, the two colours
are blended by where the edge crosses. The blend is a function of the vertex
positions, so the hard image gains gradients with respect to where its edges
are (kernels and the rule in :mod:`warpraster.antialiasing.kernels`; the edge
topology in :mod:`warpraster.antialiasing.topology`).

* :func:`antialias`: the one-call form (builds the topology and buffers per call).
* :class:`Antialias`: the reusable form for static faces and a fixed image shape:
  topology and every buffer built once, nothing allocated and nothing read back
  per call, so a render + antialias + loss + backward can be captured in a graph.

Two forwards, the same numbers: by default the sparse one
(:mod:`warpraster.antialiasing.sparse`: the colour copied, then one pass over the
pixel pairs adding each blending pair to the pixel it changes with float
atomics; a pixel changed by two or more pairs sums them in the order the atomics
land); with ``deterministic=True`` the gather (pair records, then each pixel
gathers its up to four pairs in a fixed order: bit-identical run to run).

Gradients reach ``color`` and ``verts_ndc`` on a ``wp.Tape`` through a
hand-written adjoint (``tape.record_func``). Vertex gradients are x and y only
(the op does not depend on depth except to order two faces). With
``deterministic=True`` they are summed in a fixed order (bit-identical run to
run); otherwise with float atomics. Unlike nvdiffrast 0.4.0, whose gradient
kernel can merge two images' atomics in a batch, each image's gradient lands on
its own vertices.

(The package is ``antialiasing``, not ``antialias``: a submodule named like the
function would replace ``warpraster.antialias`` by the module once imported.)
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..backward.sorted import SegmentEntries, SortedSegmentSum
from ..backward.tape import active_tape, record_func, replaying
from ..grad_buffers import clear_owned_grads
from ..meshes import as_faces_array
from ..raster.workspace import CallGraph
from ..structs import StructCache
from ..tape_replay import RecordedCall
from .kernels import (
    AAGrads,
    AAInputs,
    PairRecords,
    adjoint,
    adjoint_stored,
    analyse_pairs,
    blend,
)
from .sparse import copy_color, sparse_blend
from .topology import AntialiasTopology, edge_opposites

__all__ = ["Antialias", "AntialiasTopology", "antialias", "edge_opposites"]


def _array(x, name: str, dtype, ndim: int) -> wp.array:
    if not isinstance(x, wp.array):
        kind = type(x).__name__
        if type(x).__module__.startswith("torch"):
            kind = "a torch tensor: use warpraster.torch for torch inputs"
        raise TypeError(f"{name} must be a wp.array, got {kind}")
    if x.dtype != dtype or x.ndim != ndim:
        raise TypeError(
            f"{name} must be a {ndim}-D wp.array of {wp.types.type_repr(dtype)}, got dtype "
            f"{wp.types.type_repr(x.dtype)} shape {tuple(x.shape)}"
        )
    return x


def _same_device(device, name: str, x: wp.array) -> None:
    if wp.get_device(x.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {x.device}, but color is on {device}")


def _without_grad(x: wp.array) -> wp.array:
    """An alias of ``x``'s memory with no ``.grad`` (``wp.copy`` into it copies no
    gradient and records nothing on a tape)."""
    return wp.array(ptr=x.ptr, dtype=x.dtype, shape=x.shape, strides=x.strides,
                    capacity=x.capacity, device=x.device)  # fmt: skip


def _scales(height: int, width: int) -> tuple[float, float]:
    """(sx, sy) of the NDC -> clip map, in float32 (the shorter side spans [-1, 1])."""
    m = min(height, width)
    return float(np.float32(m / width)), float(np.float32(m / height))


class Antialias:
    """The antialias op for static faces and one image shape: every buffer built once.

    Args:
        faces: (F, 3) int32 packed faces (``wp.array`` int32 or ``vec3i``, or NumPy),
            or an :class:`AntialiasTopology` already built for them.
        num_verts: V, the length of the ``verts_ndc`` arrays the calls pass.
        shape: (N, H, W, C) of the colour images.
        device: Warp device (default: the faces' own, or the default device).
        deterministic: the forward's blend and the vertex gradients summed in a
            fixed order (bit-identical run to run; about 40 bytes more per pixel),
            instead of with float atomics.
        sparse: the forward: True the sparse pass (colour copy, then atomics on
            the pixels a pair changes), False the gather (every pixel gathers
            its pairs); None (default): sparse unless ``deterministic``. The two
            give the same image up to the order in which a pixel changed by two
            or more pairs sums them (none on the CPU), and the same gradients.
        store_pairs: write the pair records (``pair_alpha``, ``pair_code``: each
            pair's alpha and edge decision) on every call. The gather always
            writes them; the sparse forward by default only for a call recorded
            on a tape (its adjoint reads them), as most pixels have no pair.
            Also the attribute ``store_pairs`` (read per call, e.g. by tests that
            look at the decisions).

    Calling it (:meth:`__call__`) writes ``self.out`` (or ``out=``) and, when a
    ``wp.Tape`` records and ``color`` or ``verts_ndc`` carry gradients, registers
    the adjoint. It checks types, shapes and devices only (no host read:
    capturable); a ``pix_to_face`` id outside ``[-1, F)`` is drawn as background
    (:func:`antialias` refuses it). One object serves one recorded call per tape (its pair buffers
    hold that call's analysis until the backward has run).

    A repeated call with the same arrays replays its launches as a captured graph
    (and, recorded, its adjoint as another), as :class:`~warpraster.renderer.Renderer`
    does: the attribute ``call_graphs`` (None: on CUDA; True: on every device;
    False: never; inside a capture of the caller's, it launches as usual).
    """

    owns_grad_buffers = True

    def __init__(
        self,
        faces,
        num_verts: int,
        shape,
        device=None,
        *,
        deterministic: bool = False,
        sparse: bool | None = None,
        store_pairs: bool = False,
    ):
        if isinstance(faces, AntialiasTopology):
            if device is not None and wp.get_device(device) != faces.device:
                raise ValueError(f"the topology is on {faces.device}, but device is {device}")
            if faces.num_verts != num_verts:
                raise ValueError(
                    f"the topology was built for {faces.num_verts} vertices, num_verts is "
                    f"{num_verts}"
                )
            self.topology = faces
        else:
            if device is None and isinstance(faces, wp.array):
                device = faces.device
            self.topology = AntialiasTopology(as_faces_array(faces, "faces", device), num_verts,
                                              device)  # fmt: skip
        self.device = self.topology.device
        shape = tuple(shape)
        if len(shape) != 4 or any(
            isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in shape
        ):
            raise ValueError(f"shape must be (N, H, W, C) of ints >= 0, got {shape}")
        if shape[3] < 1:
            raise ValueError(f"shape must have C >= 1 channels, got {shape}")
        self.shape = tuple(int(s) for s in shape)
        self.deterministic = bool(deterministic)
        if sparse is None:
            sparse = not self.deterministic
        elif not isinstance(sparse, bool):
            raise TypeError(f"sparse must be a bool or None, got {sparse!r}")
        if sparse and self.deterministic:
            raise ValueError(
                "sparse=True sums a pixel's pairs with float atomics, in no fixed order: "
                "not with deterministic=True"
            )
        self.sparse = sparse
        self.store_pairs = bool(store_pairs)
        n, h, w, _ = self.shape
        dev = self.device
        self.out = wp.zeros(self.shape, dtype=wp.float32, device=dev, requires_grad=True)
        # the sparse forward's copy target: (ptr, strides) of ``out`` and its grad-free alias
        self._copy_dest = ((self.out.ptr, self.out.strides), _without_grad(self.out))
        self.pair_alpha = wp.zeros((n, h, w, 2), dtype=wp.float32, device=dev)
        self.pair_code = wp.full((n, h, w, 2), -1, dtype=wp.int32, device=dev)
        self.pairs = PairRecords()  # the two as one kernel argument
        self.pairs.alpha = self.pair_alpha
        self.pairs.code = self.pair_code
        self.scale = _scales(h, w) if h and w else (1.0, 1.0)
        self._no_zbuf = wp.zeros((1, 1, 1, 1), dtype=wp.float32, device=dev)
        self._no_color_grad = wp.zeros((1, 1, 1, 1), dtype=wp.float32, device=dev)
        self._no_verts_grad = wp.zeros(1, dtype=wp.vec3, device=dev)
        self._entries = SegmentEntries()  # read only when the vertex gradients are stored
        self._entries.values = self._no_verts_grad
        self._entries.keys = self._entries.order = wp.zeros(1, dtype=wp.int32, device=dev)
        self._sum = None
        if self.deterministic and n * h * w:
            self._sum = SortedSegmentSum(4 * n * h * w, wp.vec3, dev)
            self._entries = self._sum.entries(wp.zeros(4 * n * h * w, dtype=wp.vec3, device=dev))
        self._calls = 0
        self._structs = StructCache()  # the AAInputs of the last call's arrays
        self._last = None  # the last call's arrays and what was prepared of them
        #: repeated calls replayed as captured graphs (see the class)
        self.call_graphs: bool | None = None
        self._graph = CallGraph(self.device)  # calls not recorded on a tape
        self._recorded = RecordedCall(self.device)  # calls recorded on one

    @property
    def faces(self) -> wp.array:
        return self.topology.faces

    # ------------------------------------------------------------------ checks
    def check(self, color, pix_to_face, verts_ndc, zbuf=None, out=None) -> None:
        """Type, shape and device checks (metadata only: no host read)."""
        _array(color, "color", wp.float32, 4)
        if tuple(color.shape) != self.shape:
            raise ValueError(f"color must have shape {self.shape}, got {tuple(color.shape)}")
        dev = color.device
        if wp.get_device(dev) != self.device:
            raise ValueError(f"color is on device {dev}, but the faces are on {self.device}")
        _array(pix_to_face, "pix_to_face", wp.int32, 4)
        want = (*self.shape[:3], 1)
        if tuple(pix_to_face.shape) != want:
            raise ValueError(
                f"pix_to_face must have shape {want} (K = 1), got {tuple(pix_to_face.shape)}"
            )
        _same_device(dev, "pix_to_face", pix_to_face)
        _array(verts_ndc, "verts_ndc", wp.vec3, 1)
        if verts_ndc.shape[0] != self.topology.num_verts:
            raise ValueError(
                f"verts_ndc has {verts_ndc.shape[0]} vertices, the faces index "
                f"{self.topology.num_verts}"
            )
        _same_device(dev, "verts_ndc", verts_ndc)
        if zbuf is not None:
            _array(zbuf, "zbuf", wp.float32, 4)
            if tuple(zbuf.shape) != want:
                raise ValueError(f"zbuf must have shape {want}, got {tuple(zbuf.shape)}")
            _same_device(dev, "zbuf", zbuf)
        if out is not None:
            _array(out, "out", wp.float32, 4)
            if tuple(out.shape) != self.shape:
                raise ValueError(f"out must have shape {self.shape}, got {tuple(out.shape)}")
            _same_device(dev, "out", out)
            if out.ptr is not None and out.ptr == color.ptr:
                raise ValueError("out must not be color (the op reads color around each pixel)")

    # ------------------------------------------------------------------ call
    def _inputs(self, color, pix_to_face, verts_ndc, zbuf) -> AAInputs:
        a = AAInputs()
        a.pix_to_face = pix_to_face
        a.zbuf = self._no_zbuf if zbuf is None else zbuf
        a.has_zbuf = 0 if zbuf is None else 1
        a.verts = verts_ndc
        a.faces = self.topology.faces
        a.opposite = self.topology.opposite
        a.color = color
        a.scale = wp.vec2(*self.scale)
        a.half = wp.vec2(0.5 * self.shape[2], 0.5 * self.shape[1])
        return a

    def __call__(
        self,
        color: wp.array,
        pix_to_face: wp.array,
        verts_ndc: wp.array,
        *,
        zbuf: wp.array | None = None,
        out: wp.array | None = None,
    ) -> wp.array:
        """The antialiased image of ``color`` (see :func:`antialias` for the arguments).

        Returns ``out`` if given, else ``self.out`` (overwritten by the next call).
        """
        # the very same array objects (and gradients, flags) as the last call: checked
        # then, and its struct and graph key hold (the host time of a repeated call)
        same = (color, pix_to_face, verts_ndc, zbuf, out, color.grad, verts_ndc.grad,
                color.requires_grad, verts_ndc.requires_grad, self.store_pairs)  # fmt: skip
        last = self._last
        # (tuple comparison: identity first, and Warp arrays compare by identity)
        if last is None or same != last[0]:
            self.check(color, pix_to_face, verts_ndc, zbuf, out)
            last = self._last = (same, *self._prepare(color, pix_to_face, verts_ndc, zbuf, out))
        _, a, out, own, key, want_color, want_pos = last
        self._calls += 1
        if a is None:  # an empty image
            return out
        tape = active_tape()
        record = tape is not None and out.grad is not None and (want_color or want_pos)
        if not record:
            self._recorded.guard.note_render()  # overwrites what a recorded call reads
            self._graph(key, lambda: self._forward(a, out, self.store_pairs), self.call_graphs)
            return out
        try:
            self._recorded.guard.check_record(tape)
        except ValueError:
            raise ValueError(_RECORDED_TWICE) from None
        grads = (color.grad if want_color else None, verts_ndc.grad if want_pos else None)
        self._recorded(tape, key, lambda: self._record(a, out, own, grads),
                       mode=self.call_graphs)  # fmt: skip
        return out

    def _prepare(self, color, pix_to_face, verts_ndc, zbuf, out) -> tuple:
        """(struct or None for an empty image, out, whether it is ours, graph key,
        want colour gradients, want vertex gradients) of checked arrays."""
        own = out is None
        out = self.out if own else out
        want_color = color.requires_grad and color.grad is not None
        want_pos = verts_ndc.requires_grad and verts_ndc.grad is not None
        # what a captured graph holds by value: the arrays (and gradients) and the flags
        key = (*(_array_key(x) for x in (color, pix_to_face, verts_ndc, zbuf, out)),
               want_color, want_pos, self.store_pairs)  # fmt: skip
        n, h, w, _ = self.shape
        a = None
        if n * h * w:
            # the same arrays call after call: the struct made again only when one changes
            k = (color, pix_to_face, verts_ndc, zbuf, self.topology.faces, self.topology.opposite)
            a = self._structs.get("inputs", k, lambda: self._inputs(color, pix_to_face,
                                                                    verts_ndc, zbuf))  # fmt: skip
        return a, out, own, key, want_color, want_pos

    def _forward(self, a: AAInputs, out: wp.array, store: bool, pairs=None) -> None:
        if self.sparse:
            self._sparse_forward(a, out, store, pairs)
        else:
            self._gather_forward(a, out, pairs)

    # ------------------------------------------------------------------ records
    # A caller keeping each call's pair records itself (the torch op: the forward's
    # records saved for its backward, so the backward runs the adjoint alone). The
    # arrays are checked by the caller (:meth:`check`; ``alpha`` / ``code``
    # (N, H, W, 2) float32 / int32).
    def forward_records(self, color, pix_to_face, verts_ndc, zbuf, out, alpha, code) -> None:
        """The forward into ``out``, writing every pixel pair's record into ``alpha``
        and ``code`` (not the object's own)."""
        a, out = self._prepare(color, pix_to_face, verts_ndc, zbuf, out)[:2]
        self._calls += 1
        if a is not None:
            self._forward(a, out, True, _records(alpha, code))

    def adjoint_records(self, color, pix_to_face, verts_ndc, zbuf, alpha, code, out_grad,
                        color_grad, verts_grad) -> None:  # fmt: skip
        """The adjoint of a :meth:`forward_records` call from its records: adds into
        ``color_grad`` and ``verts_grad`` (either None: skipped) from ``out_grad``."""
        a = self._prepare(color, pix_to_face, verts_ndc, zbuf, None)[0]
        if a is not None:
            self._backward(a, out_grad, color_grad, verts_grad, _records(alpha, code))

    def _record(self, a: AAInputs, out: wp.array, own: bool, grads: tuple) -> None:
        """The forward of a recorded call, and its adjoint registered on the active tape
        (the caller's, or the private one of a capture)."""
        self._forward(a, out, True)
        if own:
            clear_owned_grads(self.out)  # ours: written by this call's consumers only
        call = self._calls

        def backward():
            if self._calls != call and not replaying():
                raise ValueError(_RECORDED_TWICE)
            self._backward(a, out.grad, *grads)

        with_grad = [x for x in (a.color, a.verts, out) if x.grad is not None]
        record_func(active_tape(), backward, arrays=with_grad)

    def _gather_forward(self, a: AAInputs, out: wp.array, pairs=None) -> None:
        """Pair records for every pixel, then every pixel gathers its pairs."""
        n, h, w, _ = self.shape
        pairs = self.pairs if pairs is None else pairs
        # two passes: a one-pass variant in which each pixel re-analysed its left and
        # upper neighbours' pairs was slower on an H200 (0.173 against 0.118 ms graph
        # forward, ico5 x8 512²: the four inlined analyses diverge), docs/PERF.md
        wp.launch(analyse_pairs, dim=(n, h, w), inputs=[a], outputs=[pairs],
                  device=self.device, record_tape=False)  # fmt: skip
        wp.launch(blend, dim=(n, h, w), inputs=[a.color, pairs], outputs=[out],
                  device=self.device, record_tape=False)  # fmt: skip

    def _sparse_forward(self, a: AAInputs, out: wp.array, store: bool, pairs=None) -> None:
        """``out`` = the colour, then the blending pairs added to it (records
        written for the adjoint when ``store``)."""
        n, h, w, _ = self.shape
        if (out.ptr, out.strides) != self._copy_dest[0]:  # another out=: alias it once
            self._copy_dest = ((out.ptr, out.strides), _without_grad(out))
        dest = self._copy_dest[1]
        if a.color.is_contiguous and dest.is_contiguous:
            wp.copy(dest, a.color)  # a memcpy (no gradient copied, nothing recorded)
        else:
            wp.launch(copy_color, dim=(n, h, w), inputs=[a.color], outputs=[dest],
                      device=self.device, record_tape=False)  # fmt: skip
        pairs = self.pairs if pairs is None else pairs
        wp.launch(sparse_blend, dim=(n, h, w), inputs=[a, int(store)], outputs=[pairs, out],
                  device=self.device, record_tape=False)  # fmt: skip

    def _backward(self, a: AAInputs, out_grad, color_grad, verts_grad, pairs=None) -> None:
        """Adds d loss / d color into ``color_grad`` and d loss / d verts_ndc into
        ``verts_grad`` (either None: skipped) from ``out_grad``."""
        n, h, w, _ = self.shape
        g = AAGrads()
        g.pairs = self.pairs if pairs is None else pairs
        g.out_grad = out_grad
        g.want_color = int(color_grad is not None)
        g.color_grad = self._no_color_grad if color_grad is None else color_grad
        g.want_pos = int(verts_grad is not None)
        store = self._sum is not None and verts_grad is not None
        g.store = int(store)
        g.num_verts = self.topology.num_verts
        g.verts_grad = self._no_verts_grad if verts_grad is None else verts_grad
        g.entries = self._entries
        wp.launch(adjoint_stored if store else adjoint, dim=(n, h, w), inputs=[a, g],
                  device=self.device, record_tape=False)  # fmt: skip
        if store:
            self._sum.run(self._entries.values, self.topology.num_verts, verts_grad,
                          accumulate=True)  # fmt: skip


_RECORDED_TWICE = (
    "Antialias: the object ran again after a call of it was recorded on the tape, so its "
    "pair buffers no longer belong to the call being differentiated (use one Antialias "
    "object per call recorded on a tape, or call tape.reset() before recording it again)"
)


def _records(alpha: wp.array, code: wp.array) -> PairRecords:
    """Pair records on the caller's arrays."""
    r = PairRecords()
    r.alpha = alpha
    r.code = code
    return r


def _array_key(x: wp.array | None):
    """What a graph captures of an array: where it is, its layout, its gradient's place."""
    if x is None:
        return None
    return (x.ptr, x.shape, x.strides, None if x.grad is None else x.grad.ptr)


def _check_values(pix_to_face: wp.array, num_faces: int) -> None:
    """pix_to_face names -1 or a face in [0, F) (a host read)."""
    if pix_to_face.size == 0:
        return
    p = pix_to_face.numpy()
    lo, hi = int(p.min()), int(p.max())
    if lo < -1 or hi >= num_faces:
        raise ValueError(
            f"pix_to_face has values in [{lo}, {hi}], outside [-1, {num_faces - 1}] for "
            f"{num_faces} faces"
        )


def antialias(
    color: wp.array,
    pix_to_face: wp.array,
    verts_ndc: wp.array,
    faces,
    *,
    topology: AntialiasTopology | None = None,
    zbuf: wp.array | None = None,
    out: wp.array | None = None,
    deterministic: bool = False,
) -> wp.array:
    """nvdiffrast's analytic antialiasing of a hard image, differentiable on a ``wp.Tape``.

    Args:
        color: (N, H, W, C) float32 ``wp.array``, the hard image (e.g. shaded from K = 1
            fragments). Gradients arrive in ``color.grad`` (accumulated).
        pix_to_face: (N, H, W, 1) int32 ``wp.array``, the K = 1
            ``Fragments.pix_to_face`` (packed face ids, -1 empty).
        verts_ndc: (V,) ``vec3`` ``wp.array``, the projected vertices in the project's
            NDC (+x left, +y up, z depth; the shorter image side spans [-1, 1]).
            Gradients (x, y; z gets 0) arrive in ``verts_ndc.grad`` (accumulated).
        faces: (F, 3) int32 packed faces (``wp.array`` int32 or ``vec3i``, or NumPy).
        topology: the :class:`AntialiasTopology` of ``faces`` built once (else built
            here, a host pass over the faces).
        zbuf: optional (N, H, W, 1) float32 depths of the fragments
            (``Fragments.zbuf``) to order the two faces of a pair; by default
            recomputed from ``verts_ndc`` at the pixel centres.
        out: optional (N, H, W, C) float32 result array (not ``color``).
        deterministic: the blend (each pixel gathers its pairs) and the vertex
            gradients summed in a fixed order (bit-identical run to run) instead of
            with float atomics (the sparse forward, :mod:`~warpraster.antialiasing.sparse`).

    Returns:
        (N, H, W, C) float32 ``wp.array``, the antialiased image: ``color`` where no
        silhouette or occlusion edge crosses between a pixel and a neighbour.

    Raises:
        TypeError, ValueError: bad input (types, shapes, devices, face indices out of
            range, ``pix_to_face`` naming no face), naming the argument, before any
            kernel runs.

    For repeated calls with the same faces and shape, :class:`Antialias` allocates
    and checks once (and can be captured in a graph).
    """
    c = _array(color, "color", wp.float32, 4)
    if topology is None:
        f = as_faces_array(faces, "faces", c.device)
        v = _array(verts_ndc, "verts_ndc", wp.vec3, 1)
        topology = AntialiasTopology(f, v.shape[0], c.device)
    elif not isinstance(topology, AntialiasTopology):
        raise TypeError(f"topology must be an AntialiasTopology, got {type(topology).__name__}")
    elif faces is not None and faces is not topology.faces:
        f = as_faces_array(faces, "faces", c.device)
        if f.shape != topology.faces.shape or f.ptr != topology.faces.ptr:
            raise ValueError("topology was built for other faces than the faces passed")
    op = Antialias(topology, topology.num_verts, tuple(c.shape), c.device,
                   deterministic=deterministic)  # fmt: skip
    op.check(color, pix_to_face, verts_ndc, zbuf, out)
    _check_values(pix_to_face, topology.num_faces)
    return op(color, pix_to_face, verts_ndc, zbuf=zbuf, out=out)
