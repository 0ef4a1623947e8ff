"""The sorted (deterministic) strategy: per-slot derivatives summed in a fixed order.

Floating-point atomics make a scatter-add depend on thread timing, so gradients
accumulated with atomics differ in the last bits from run to run on a GPU. Here
every addition happens in an order fixed by ``pix_to_face`` and the topology:

1. one thread per pixel stores each slot's derivatives (:func:`slot_grads`, the
   same per-slot numbers as the atomic strategy) in ``slot_grad[slot]`` with a
   sort key (its face; empty slots get a key that is dropped);
2. a stable sort of the slots by face and a fixed-order segmented sum into
   ``face_grad[face]`` (:class:`SortedSegmentSum`);
3. a stable sort of the face corners by vertex and a fixed-order segmented sum
   of the ``face_grad`` rows, added into ``verts_grad``.

So ``verts_grad`` is bit-identical run after run. Nothing is read back to the
host and every buffer is allocated up front: the whole backward can be captured
in a graph (CPU or CUDA).

:class:`SortedSegmentSum` replaces a scatter-add ``out[key[i]] += value[i]``
with a stable radix sort of ``(key, entry index)`` pairs
(``wp.utils.radix_sort_pairs``), then a segmented reduction over fixed chunks
of the sorted list, repeated on the per-chunk partial sums until one chunk is
left. Each chunk is summed by one thread in list order; every key's total is
written by exactly one thread. Keys are ``int32`` in ``[0, num_keys]``;
``num_keys`` marks an entry to drop.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..meshes import MeshArrays, mesh_arrays
from .slot_pass import SlotGradArgs, launch_slot_pass, slot_grad_args, slot_kernel_flags

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

__all__ = [
    "DEFAULT_CHUNK",
    "SegmentEntries",
    "SortedBackward",
    "SortedSegmentSum",
    "gather_face_verts",
    "set_entry",
]

#: Entries summed sequentially by one thread per level. Each level shrinks the
#: list by chunk / 2 (a chunk passes at most two partial sums on).
DEFAULT_CHUNK = 64


def _make_segment_level(value_type):
    """The level kernel for one value type.

    One concrete kernel per type, each with its own key, rather than one generic
    kernel with overloads (or closures sharing a name): Warp 1.19's cpu graph
    capture finds a replayed kernel by (module, key), so two variants with one
    key captured in the same graph replay as the same variant.
    """

    def _segment_level(
        keys: wp.array(dtype=wp.int32),
        vals: wp.array(dtype=value_type),
        order: wp.array(dtype=wp.int32),
        indirect: int,
        length: int,
        chunk: int,
        num_keys: int,
        final: int,
        accumulate: int,
        out: wp.array(dtype=value_type),
        next_keys: wp.array(dtype=wp.int32),
        next_vals: wp.array(dtype=value_type),
    ):
        """One level of the segmented sum; thread j reduces entries [j*chunk, (j+1)*chunk).

        Keys wholly inside the chunk are complete and written to ``out``. The
        first and last key of the chunk may continue in a neighbouring chunk:
        their partial sums go to the next level (slots 2j and 2j+1), which is
        again sorted by key. With ``final`` set there is one chunk and every key
        is written to ``out``. Entry i's value is ``vals[order[i]]`` if
        ``indirect`` else ``vals[i]``.
        """
        j = wp.tid()
        start = j * chunk
        end = wp.min(start + chunk, length)
        zero = value_type()
        if final == 0:
            next_keys[2 * j] = num_keys
            next_vals[2 * j] = zero
            next_keys[2 * j + 1] = num_keys
            next_vals[2 * j + 1] = zero
        i = start
        seg = int(0)
        while i < end:
            key = keys[i]
            if key >= num_keys:
                break  # sorted: the rest of the chunk is dropped entries
            src = i
            if indirect != 0:
                src = order[i]
            acc = vals[src]
            i += 1
            while i < end:
                if keys[i] != key:
                    break
                src = i
                if indirect != 0:
                    src = order[i]
                acc = acc + vals[src]
                i += 1
            first = seg == 0
            last = i == end
            if final != 0 or not (first or last):
                if accumulate != 0:
                    out[key] = out[key] + acc
                else:
                    out[key] = acc
            elif first:
                next_keys[2 * j] = key
                next_vals[2 * j] = acc
                if last:
                    # One key fills the whole chunk: the last slot carries it
                    # with 0 so the next level stays sorted and counts it once.
                    next_keys[2 * j + 1] = key
            else:
                next_keys[2 * j + 1] = key
                next_vals[2 * j + 1] = acc
            seg += 1

    _segment_level.__qualname__ = f"_segment_level_{value_type.__name__}"
    return wp.kernel(_segment_level)


_SEGMENT_LEVEL = {t: _make_segment_level(t) for t in (wp.vec3, wp.mat33)}


@wp.struct
class SegmentEntries:
    """The entries of a ``vec3`` :class:`SortedSegmentSum` as a kernel writes them
    (:meth:`SortedSegmentSum.entries`): entry e adds ``values[e]`` to key ``keys[e]``
    (the sum's ``num_keys``: dropped), with ``order[e] = e`` (:func:`set_entry`)."""

    values: wp.array(dtype=wp.vec3)
    keys: wp.array(dtype=wp.int32)
    order: wp.array(dtype=wp.int32)


@wp.func
def set_entry(s: SegmentEntries, entry: int, key: int, value: wp.vec3):
    """Writes entry ``entry`` of ``s``: ``value`` for ``key``."""
    s.values[entry] = value
    s.keys[entry] = key
    s.order[entry] = entry


def _levels(length: int, chunk: int) -> list[int]:
    """Entry counts of the successive levels (the last one fits in one chunk)."""
    sizes = [length]
    while sizes[-1] > chunk:
        sizes.append(2 * ((sizes[-1] + chunk - 1) // chunk))
    return sizes


class SortedSegmentSum:
    """Buffers for a deterministic ``out[key[i]] (+)= sum of value[i]`` over a fixed count.

    Usage, every call with the same ``count``: fill ``keys[:count]`` with the
    keys and ``order[:count]`` with ``0 .. count-1`` (the entry indices; the
    arrays hold ``2 * count`` for the sort; a kernel filling ``vec3`` entries:
    :meth:`entries` and :func:`set_entry`), then call :meth:`run`.

    Args:
        count: number of entries per call (>= 1).
        dtype: value type, ``wp.vec3`` or ``wp.mat33``.
        device: Warp device.
        chunk: entries one thread sums sequentially per level (>= 4).
    """

    def __init__(self, count: int, dtype, device=None, chunk: int = DEFAULT_CHUNK):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if dtype not in _SEGMENT_LEVEL:
            raise TypeError(f"dtype must be wp.vec3 or wp.mat33, got {dtype}")
        if chunk < 4:
            raise ValueError(f"chunk must be >= 4, got {chunk}")
        self.count = int(count)
        self.dtype = dtype
        self.chunk = int(chunk)
        self.device = wp.get_device(device)
        self.keys = wp.empty(2 * self.count, dtype=wp.int32, device=self.device)
        self.order = wp.empty(2 * self.count, dtype=wp.int32, device=self.device)
        self.sizes = _levels(self.count, self.chunk)
        nxt = max(self.sizes[1:], default=1)
        self._ping = (
            wp.empty(nxt, dtype=wp.int32, device=self.device),
            wp.empty(nxt, dtype=dtype, device=self.device),
        )
        self._pong = (
            wp.empty(nxt, dtype=wp.int32, device=self.device),
            wp.empty(nxt, dtype=dtype, device=self.device),
        )

    def entries(self, values: wp.array) -> SegmentEntries:
        """``values`` (count,) ``vec3`` with this sum's ``keys`` and ``order``, as the
        :class:`SegmentEntries` a kernel fills (then :meth:`run` on ``values``)."""
        e = SegmentEntries()
        e.values = values
        e.keys = self.keys
        e.order = self.order
        return e

    def run(self, values: wp.array, num_keys: int, out: wp.array, *, accumulate: bool) -> None:
        """Sorts the entries by key and writes each key's total into ``out``.

        Args:
            values: (count,) entry values (``self.dtype``), indexed by entry.
            num_keys: keys are in ``[0, num_keys]``; ``num_keys`` entries are dropped.
            out: (>= num_keys,) results. Keys with no entry are left untouched.
            accumulate: add into ``out`` (True) or overwrite (False).
        """
        end_bit = max(1, int(num_keys).bit_length())
        wp.utils.radix_sort_pairs(self.keys, self.order, self.count, 0, end_bit)
        keys, vals, order, indirect = self.keys, values, self.order, 1
        bufs = (self._ping, self._pong)
        for level, length in enumerate(self.sizes):
            final = level == len(self.sizes) - 1
            nk, nv = bufs[level % 2]
            wp.launch(
                _SEGMENT_LEVEL[self.dtype],
                dim=(length + self.chunk - 1) // self.chunk,
                inputs=[
                    keys,
                    vals,
                    order,
                    indirect,
                    length,
                    self.chunk,
                    int(num_keys),
                    int(final),
                    int(accumulate),
                    out,
                    nk,
                    nv,
                ],
                device=self.device,
                record_tape=False,
            )
            keys, vals, indirect = nk, nv, 0


@wp.kernel
def _gather_face_verts(
    # Inputs: mesh.verts, mesh.faces
    mesh: MeshArrays,
    # Outputs:
    face_verts_out: wp.array(dtype=wp.mat33),
):
    """Rows of face f: its three vertices."""
    f = wp.tid()
    face_verts_out[f] = wp.matrix_from_rows(
        mesh.verts[mesh.faces[f, 0]], mesh.verts[mesh.faces[f, 1]], mesh.verts[mesh.faces[f, 2]]
    )


def gather_face_verts(verts: wp.array, faces: wp.array, face_verts_out: wp.array) -> None:
    """``face_verts_out[f]`` = the vertices of face f as rows (mat33), not recorded."""
    wp.launch(_gather_face_verts, dim=faces.shape[0], inputs=[mesh_arrays(verts, faces)],
              outputs=[face_verts_out], device=verts.device, record_tape=False)  # fmt: skip


@wp.kernel
def _corner_keys(
    # Inputs:
    faces: wp.array2d(dtype=wp.int32),
    num_verts: int,
    # Outputs:
    keys_out: wp.array(dtype=wp.int32),
    order_out: wp.array(dtype=wp.int32),
):
    """Sort entries for the per-vertex sum: key = vertex of face corner (f, c)."""
    f, c = wp.tid()
    e = 3 * f + c
    v = faces[f, c]
    key = num_verts
    if v >= 0 and v < num_verts:
        key = v
    keys_out[e] = key
    order_out[e] = e


class SortedBackward:
    """Buffers of the sorted (deterministic) strategy for one fragments shape.

    Memory, on top of the fragments: about 55 bytes per slot (N*H*W*K: the
    slot's 3x3 gradient, sort keys and indices twice over, reduction levels) and
    90 per face.

    Args:
        shape: (N, H, W, K) of the fragments.
        num_faces: F, the length of the packed face array rendered.
        device: Warp device.
        chunk: entries one thread sums per reduction level.
    """

    def __init__(self, shape, num_faces: int, device=None, chunk: int = DEFAULT_CHUNK):
        self.shape = tuple(int(s) for s in shape)
        self.num_faces = int(num_faces)
        self.device = wp.get_device(device)
        slots = max(int(np.prod(self.shape)), 1)
        f_alloc = max(self.num_faces, 1)
        self.slot_grad = wp.empty(slots, dtype=wp.mat33, device=self.device)
        self.face_grad = wp.zeros(f_alloc, dtype=wp.mat33, device=self.device)
        # The same memory as 3F vec3 rows: entry 3f + c is corner c of face f.
        self.corner_grad = wp.array(
            ptr=self.face_grad.ptr, dtype=wp.vec3, shape=(3 * f_alloc,), device=self.device
        )
        self.corner_grad._ref = self.face_grad  # keeps the owner alive
        self.slot_sum = SortedSegmentSum(slots, wp.mat33, self.device, chunk)
        self.corner_sum = SortedSegmentSum(3 * f_alloc, wp.vec3, self.device, chunk)
        #: (F,) mat33 face-vertex scratch for callers that hold none (allocated on
        #: first use by :meth:`backward`, i.e. at set-up).
        self.face_verts = None

    def gather_scratch(self) -> wp.array:
        """The face-vertex scratch (allocated once)."""
        if self.face_verts is None:
            f_alloc = max(self.num_faces, 1)
            self.face_verts = wp.empty(f_alloc, dtype=wp.mat33, device=self.device)
        return self.face_verts

    def matches(self, shape, num_faces: int, device) -> bool:
        return (
            self.shape == tuple(shape)
            and self.num_faces == int(num_faces)
            and self.device == wp.get_device(device)
        )

    def run(
        self, faces: wp.array, args: SlotGradArgs, verts_grad: wp.array, *,
        specialize: bool | None,
    ) -> None:  # fmt: skip
        """Adds d loss / d verts into ``verts_grad``, bit-reproducibly.

        Args:
            faces: (F, 3) int32 vertex indices.
            args: the per-slot pass's inputs (:func:`~warpraster.backward.slot_pass.slot_grad_args`)
                for fragments of this object's shape.
            verts_grad: (V,) vec3, accumulated into.
            specialize: compile the flags into kernel variants (None: on CUDA).
        """
        n, h, w, k = self.shape
        if self.num_faces == 0 or n * h * w * k == 0:
            return
        dev = self.device
        if args.num_faces != self.num_faces:
            args.num_faces = self.num_faces
        outputs = [self.slot_grad, self.slot_sum.keys, self.slot_sum.order]
        launch_slot_pass(args, outputs, stored=True, device=dev, specialize=specialize)
        self.face_grad.zero_()
        self.slot_sum.run(self.slot_grad, self.num_faces, self.face_grad, accumulate=False)
        wp.launch(
            _corner_keys,
            dim=(self.num_faces, 3),
            inputs=[faces, verts_grad.shape[0]],
            outputs=[self.corner_sum.keys, self.corner_sum.order],
            device=dev,
            record_tape=False,
        )
        self.corner_sum.run(self.corner_grad, verts_grad.shape[0], verts_grad, accumulate=True)

    def backward(
        self,
        verts: wp.array,
        faces: wp.array,
        out,
        *,
        perspective_correct: bool,
        clip_barycentric_coords: bool,
        exact_perspective_grad: bool = True,
    ) -> None:
        """Adds d loss / d verts (from the :class:`~warpraster.Fragments` ``out``'s
        ``.grad``) into ``verts.grad``, gathering the face vertices from ``verts``."""
        fv = self.gather_scratch()
        gather_face_verts(verts, faces, fv)
        flags = slot_kernel_flags(perspective_correct, clip_barycentric_coords,
                                  exact_perspective_grad)  # fmt: skip
        args = slot_grad_args(fv, out.pix_to_face, out.zbuf.grad, out.bary_coords.grad,
                              out.dists.grad, flags)  # fmt: skip
        self.run(faces, args, verts.grad, specialize=None)
