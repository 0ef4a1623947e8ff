"""An exclusive prefix sum of int32 that allocates nothing when it runs.

``wp.utils.array_scan`` allocates its scratch on each call (CUB's temporary
storage), which a CUDA graph may hold but the body of a conditional node
(``wp.capture_if``) may not. :class:`ExclusiveScan` keeps its scratch from set-up:
each block of :data:`SCAN_TILE` values is scanned as a tile, the blocks' sums are
scanned the same way (recursively, a level per factor of :data:`SCAN_TILE`), and
each block's offset is added back. Integer sums: the same values as
``array_scan`` in any order.
"""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})

__all__ = ["SCAN_TILE", "ExclusiveScan"]

#: Values a block scans as one tile (its threads: SCAN_THREADS, four values each).
SCAN_TILE = 1024
SCAN_THREADS = 256


@wp.kernel
def _scan_tiles(
    # In:
    values: wp.array(dtype=wp.int32),
    # Out: each tile's exclusive scan, and each tile's sum
    scanned_out: wp.array(dtype=wp.int32),
    sums_out: wp.array(dtype=wp.int32),
):
    b = wp.tid()
    t = wp.tile_load(values, shape=SCAN_TILE, offset=b * SCAN_TILE)  # zeros past the end
    wp.tile_store(scanned_out, wp.tile_scan_exclusive(t), offset=b * SCAN_TILE)
    wp.tile_store(sums_out, wp.tile_sum(t), offset=b)


@wp.kernel
def _add_tile_offsets(
    # In: the scanned tile sums (each tile's offset)
    offsets: wp.array(dtype=wp.int32),
    # In/Out: the tiles' scans, offset in place
    scanned: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    scanned[i] = scanned[i] + offsets[i // SCAN_TILE]


class ExclusiveScan:
    """``out[i] = values[0] + ... + values[i - 1]`` for int32 arrays of ``size``
    values on ``device``, with scratch made once (no allocation per call; a call
    may run inside a conditional graph node). Sums must fit in int32."""

    def __init__(self, size: int, device):
        self.size = int(size)
        self.device = wp.get_device(device)
        tiles = (self.size + SCAN_TILE - 1) // SCAN_TILE
        # the tiles' sums, scanned by the next level (none when one tile holds all)
        self._sums = wp.zeros(max(tiles, 1), dtype=wp.int32, device=self.device)
        self._inner = None
        self._sums_scanned = None
        if tiles > 1:
            self._sums_scanned = wp.zeros(tiles, dtype=wp.int32, device=self.device)
            self._inner = ExclusiveScan(tiles, self.device)

    def __call__(self, values: wp.array, out: wp.array) -> None:
        """Writes the exclusive scan of ``values`` into ``out`` (both int32 of
        ``size`` values, contiguous; not the same array)."""
        if values.shape != (self.size,) or out.shape != (self.size,):
            raise ValueError(f"values and out must have shape ({self.size},)")
        if self.size == 0:
            return
        tiles = self._sums.shape[0]
        wp.launch_tiled(_scan_tiles, dim=[tiles], inputs=[values], outputs=[out, self._sums],
                        block_dim=SCAN_THREADS, device=self.device, record_tape=False)  # fmt: skip
        if self._inner is not None:
            self._inner(self._sums, self._sums_scanned)
            wp.launch(_add_tile_offsets, dim=self.size, inputs=[self._sums_scanned],
                      outputs=[out], device=self.device, record_tape=False)  # fmt: skip
