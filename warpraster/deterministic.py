"""Deterministic sums by key: a stable device sort and a fixed-shape segmented reduction.

Floating-point atomics make a scatter-add depend on thread timing, so gradients
accumulated with ``wp.atomic_add`` differ in the last bits from run to run on a
GPU. :class:`SortedSegmentSum` replaces such a scatter-add with:

1. a stable radix sort of ``(key, entry index)`` pairs (``wp.utils.radix_sort_pairs``):
   entries end up ordered by (key, entry index), whatever the thread timing;
2. a segmented reduction over fixed chunks of the sorted list, repeated on the
   per-chunk partial sums until one chunk is left. Each chunk is summed by one
   thread in list order; every key's total is written by exactly one thread.

The order of every floating-point addition is fixed by the sorted list and the
chunk size alone, so the result is bit-identical run after run (and between
devices where the per-entry values agree). Nothing is read back to the host and
every buffer is allocated up front, so the whole reduction can be captured in a
graph (CPU or CUDA).

Keys are ``int32`` in ``[0, num_keys]``; ``num_keys`` marks an entry to drop.
"""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})

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
    arrays hold ``2 * count`` for the sort), then call :meth:`run`.

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
