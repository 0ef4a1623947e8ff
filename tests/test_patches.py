"""The pixel-patch launch mapping: every (image, row, column, item) exactly once,
for sizes that leave partial patches at the right and bottom edges."""

import numpy as np
import pytest
import warp as wp

from warpraster.patches import patch_launch_size, patch_pixel, patch_slot


@wp.kernel
def _count_hits(per_pixel: int, patch_w: int, hits: wp.array4d(dtype=wp.int32)):
    n, y, x, j, inside = patch_slot(
        wp.tid(), hits.shape[0], hits.shape[1], hits.shape[2], per_pixel, patch_w
    )
    if inside:
        wp.atomic_add(hits, n, y, x, j, 1)


@pytest.mark.parametrize("patch_w", [1, 4, 8, 32])
@pytest.mark.parametrize("shape", [(2, 7, 13, 3), (1, 4, 8, 1), (3, 33, 5, 2)])
def test_each_pixel_item_is_visited_once(shape, patch_w, device):
    n, h, w, per_pixel = shape
    hits = wp.zeros(shape, dtype=wp.int32, device=device)
    dim = patch_launch_size(n, h, w, patch_w, per_pixel)
    assert dim % (32 * per_pixel) == 0 and dim >= n * h * w * per_pixel
    wp.launch(_count_hits, dim=dim, inputs=[per_pixel, patch_w, hits], device=device)
    np.testing.assert_array_equal(hits.numpy(), np.ones(shape, np.int32))


@wp.kernel
def _first_warp(h: int, w: int, patch_w: int, xy: wp.array(dtype=wp.vec2i)):
    i = wp.tid()
    _n, y, x, _inside = patch_pixel(i, 1, h, w, patch_w)
    xy[i] = wp.vec2i(y, x)


def test_a_warp_takes_one_patch(device):
    # patch_w 8: the first 32 threads are rows 0..3, columns 0..7, row-major
    xy = wp.zeros(32, dtype=wp.vec2i, device=device)
    wp.launch(_first_warp, dim=32, inputs=[16, 16, 8, xy], device=device)
    expected = [(lane // 8, lane % 8) for lane in range(32)]
    assert [tuple(v) for v in xy.numpy()] == expected
