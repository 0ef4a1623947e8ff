"""Pixel tiles for per-pixel and per-slot kernels.

A flat launch over (n, h, w) pixels whose warps each take a block of ``tile_w``
x (32 / ``tile_w``) pixels of one image (``tile_w`` 32: a row segment, as a 3-d
launch), with ``per_pixel`` consecutive threads per pixel (its slots or
channels): threads that run together then read the same faces, corner rows and
texels.

Kernels that add atomically into rows shared by neighbouring pixels (faces'
corner rows, texels) keep row segments: on an H200 both adjoints got slower with
8 x 4 tiles, and much slower with a warp's 32 pixels spread over the batch
(docs/PERF.md).
"""

import warp as wp

__all__ = ["pixel_launch_size", "tiled_pixel", "tiled_slot"]


def pixel_launch_size(n: int, h: int, w: int, tile_w: int, per_pixel: int = 1) -> int:
    """Threads of a :func:`tiled_slot` / :func:`tiled_pixel` launch over (n, h, w) pixels."""
    return n * -(-h // (32 // tile_w)) * -(-w // tile_w) * 32 * per_pixel


@wp.func
def tiled_slot(i: int, n: int, h: int, w: int, per_pixel: int, tile_w: int):
    """(n, y, x, j, inside) of thread i of a launch of :func:`pixel_launch_size`
    threads: thread group t of 32 * ``per_pixel`` covers tile t (tiles row-major
    per image); its thread r takes pixel l = r / ``per_pixel`` of the tile, at
    (l / tile_w, l % tile_w), and its item j = r % ``per_pixel``; ``inside``: the
    pixel exists (tiles at the right and bottom edges)."""
    group = 32 * per_pixel
    r = i % group
    lane = r // per_pixel
    t = i // group
    rows = 32 // tile_w
    tw = (w + tile_w - 1) // tile_w
    th = (h + rows - 1) // rows
    tx = t % tw
    t = t // tw
    y = (t % th) * rows + lane // tile_w
    x = tx * tile_w + lane % tile_w
    t = t // th
    return t, y, x, r - lane * per_pixel, t < n and y < h and x < w


@wp.func
def tiled_pixel(i: int, n: int, h: int, w: int, tile_w: int):
    """(image, y, x, inside) of thread i: :func:`tiled_slot` with one thread per pixel."""
    m, y, x, _j, inside = tiled_slot(i, n, h, w, 1, tile_w)
    return m, y, x, inside
