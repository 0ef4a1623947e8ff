"""Pixel patches for per-pixel and per-slot kernels.

A flat launch over (n, h, w) pixels whose warps each take a block of ``patch_w``
x (32 / ``patch_w``) pixels of one image (``patch_w`` 32: a row segment, as a 3-d
launch), with ``per_pixel`` consecutive threads per pixel (its slots or
channels): threads that run together then read the same faces, corner rows and
texels.

Kernels that add atomically into rows shared by neighbouring pixels (faces'
corner rows, texels) keep row segments: on an H200 both adjoints got slower with
8 x 4 patches, and much slower with a warp's 32 pixels spread over the batch
(docs/PERF.md).
"""

import warp as wp

__all__ = ["patch_launch_size", "patch_pixel", "patch_slot"]


def patch_launch_size(n: int, h: int, w: int, patch_w: int, per_pixel: int = 1) -> int:
    """Threads of a :func:`patch_slot` / :func:`patch_pixel` launch over (n, h, w) pixels."""
    return n * -(-h // (32 // patch_w)) * -(-w // patch_w) * 32 * per_pixel


@wp.func
def patch_slot(i: int, n: int, h: int, w: int, per_pixel: int, patch_w: int):
    """(n, y, x, j, inside) of thread i of a launch of :func:`patch_launch_size`
    threads: thread group t of 32 * ``per_pixel`` covers patch t (patches row-major
    per image); its thread r takes pixel l = r / ``per_pixel`` of the patch, at
    (l / patch_w, l % patch_w), and its item j = r % ``per_pixel``; ``inside``: the
    pixel exists (patches at the right and bottom edges)."""
    group = 32 * per_pixel
    r = i % group
    lane = r // per_pixel
    t = i // group
    rows = 32 // patch_w
    tw = (w + patch_w - 1) // patch_w
    th = (h + rows - 1) // rows
    tx = t % tw
    t = t // tw
    y = (t % th) * rows + lane // patch_w
    x = tx * patch_w + lane % patch_w
    t = t // th
    return t, y, x, r - lane * per_pixel, t < n and y < h and x < w


@wp.func
def patch_pixel(i: int, n: int, h: int, w: int, patch_w: int):
    """(image, y, x, inside) of thread i: :func:`patch_slot` with one thread per pixel."""
    m, y, x, _j, inside = patch_slot(i, n, h, w, 1, patch_w)
    return m, y, x, inside
