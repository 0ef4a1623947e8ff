"""The mip pyramid's build and its hand-written backward (two levels per launch)
against a float64 NumPy box-filter chain and its transpose, and against the
one-level-per-launch build and Warp's generated adjoint of the one-level kernel."""

import numpy as np
import pytest
import warp as wp
from test_textures import np_pyramid

from warpraster.shading import mip_pyramid as mm
from warpraster.structs import new_struct

# (maps shape, max_mip_level): square, non-square down to a 1-wide column and a
# 1-high row, extents already 1, an odd level count (the top group is one
# level), a capped pyramid ending at an odd extent
SHAPES = [
    ((2, 16, 4, 3), None),
    ((1, 1, 8, 2), None),
    ((3, 8, 1, 1), None),
    ((1, 32, 32, 3), None),
    ((2, 12, 12, 3), 2),
]


def np_pyramid_adjoint(level_grads, maps_grad):
    """float64 transpose of :func:`np_pyramid`: the gradients of levels 1..L (plus
    what the levels above add) sent down to the base, added to ``maps_grad``."""
    grads = [np.asarray(maps_grad, np.float64)] + [
        np.asarray(g, np.float64).copy() for g in level_grads
    ]
    for lev in range(len(grads) - 1, 0, -1):
        g, below = grads[lev], grads[lev - 1]
        if below.shape[1] == 1:
            below[:, :, 0::2] += 0.5 * g
            below[:, :, 1::2] += 0.5 * g
        elif below.shape[2] == 1:
            below[:, 0::2] += 0.5 * g
            below[:, 1::2] += 0.5 * g
        else:
            for dy in (0, 1):
                for dx in (0, 1):
                    below[:, dy::2, dx::2] += 0.25 * g
    return grads[0]


def _levels(pyr, flat):
    offs = pyr.offsets.numpy()
    n, _, _, c = pyr.maps.shape
    out = []
    for lev, (lh, lw) in enumerate(pyr.sizes[1:], start=1):
        out.append(flat[offs[lev] : offs[lev] + n * lh * lw * c].reshape(n, lh, lw, c))
    return out


@pytest.mark.parametrize("shape,max_level", SHAPES)
def test_pyramid_backward_is_the_transpose_of_the_box_filter_chain(shape, max_level, device):
    rng = np.random.default_rng(7)
    maps = rng.uniform(size=shape).astype(np.float32)
    base_grad = rng.normal(size=shape).astype(np.float32)
    m = wp.array(maps, dtype=wp.float32, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        pyr = mm.MipPyramid(m, max_mip_level=max_level)
    for got, want in zip(
        _levels(pyr, pyr.levels.numpy()), np_pyramid(maps, max_level)[1:], strict=True
    ):
        # sums of 2 or 4 float32 values per level, compounded over <= 5 levels
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    up = rng.normal(size=pyr.levels.shape).astype(np.float32)
    pyr.levels.grad.assign(up)
    m.grad.assign(base_grad)
    tape.backward()
    want = np_pyramid_adjoint(_levels(pyr, up), base_grad)
    # each base gradient is the pre-filled value plus a chain of <= 5 float32
    # scaled adds of O(1) values: 1e-6 relative to the largest
    np.testing.assert_allclose(m.grad.numpy(), want, rtol=0, atol=1e-6 * np.abs(want).max())


def _generated_backward(pyr):
    """Warp's generated adjoint of the one-level build kernel, level by level."""
    adj = new_struct(mm.MipLevels, pyr.device, maps=pyr.maps.grad, levels=pyr.levels.grad,
                     offsets=pyr.offsets)  # fmt: skip
    n, _, _, c = pyr.maps.shape
    for lev in range(len(pyr.sizes) - 1, 0, -1):
        lh, lw = pyr.sizes[lev]
        wp.launch(mm._build_level, dim=n * lh * lw * c, inputs=[pyr.arrays, lev],
                  outputs=[pyr.levels], adj_inputs=[adj, 0], adj_outputs=[pyr.levels.grad],
                  adjoint=True, device=pyr.device)  # fmt: skip


@pytest.mark.parametrize("shape,max_level", SHAPES[:3] + SHAPES[4:])
def test_two_levels_per_launch_equal_one_bit_for_bit(shape, max_level, device, monkeypatch):
    """Forward levels of 1 and 2 levels per launch, and the hand-written backward
    of both against Warp's generated one: the same float32 operations, so the
    same bits (each texel has one writer: no atomic order)."""
    rng = np.random.default_rng(8)
    maps = rng.uniform(size=shape).astype(np.float32)
    got = {}
    base = rng.normal(size=shape).astype(np.float32)
    up = None
    for per_launch in (1, 2):
        monkeypatch.setattr(mm.MipPyramid, "levels_per_launch", per_launch)
        m = wp.array(maps, dtype=wp.float32, device=device, requires_grad=True)
        pyr = mm.MipPyramid(m, max_mip_level=max_level)
        if up is None:
            up = rng.normal(size=pyr.levels.shape).astype(np.float32)
        for hand in (True, False):
            pyr.levels.grad.assign(up)
            m.grad.assign(base)
            pyr._build_backward() if hand else _generated_backward(pyr)
            got[per_launch, hand] = m.grad.numpy().copy()
        got[per_launch, "levels"] = pyr.levels.numpy().copy()
    np.testing.assert_array_equal(got[1, "levels"], got[2, "levels"])
    for key in ((1, True), (2, True), (2, False)):
        np.testing.assert_array_equal(got[key], got[1, False])
