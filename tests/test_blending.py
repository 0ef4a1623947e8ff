"""Blending: hard, sigmoid-alpha and softmax, values and hand-written adjoints.

Truths: the float64 NumPy transcription of PyTorch3D's blend functions
(tests/np_shading.py) on randomised fragments, and central finite differences of
it for the gradients to colours, dists, zbuf and the background colour. (The
reference cases r03/r05/r08/r09 check the blends against real PyTorch3D through
the shaders in test_shaders.py.)
"""

from __future__ import annotations

import np_shading as ref
import numpy as np
import pytest
import warp as wp
from np_shading import central_difference
from p3d_render_cases import rel_l2

import warpraster as wr
from warpraster import shading

N, H, W, K = 2, 3, 4, 4
SIGMA, GAMMA = 0.01, 0.05
ZNEAR, ZFAR = np.array([1.0, 0.5]), np.array([10.0, 20.0])


def _fragments(rng):
    p2f = rng.integers(0, 9, size=(N, H, W, K)).astype(np.int32)
    filled = rng.integers(0, K + 1, size=(N, H, W))  # 0..K filled slots, the rest -1
    filled[0, 0, 0] = 0  # an empty pixel
    filled[1, 2, 3] = K  # a full one
    p2f[np.arange(K) >= filled[..., None]] = -1
    dists = rng.uniform(-0.03, 0.03, size=(N, H, W, K))
    zbuf = np.sort(rng.uniform(2.0, 5.0, size=(N, H, W, K)), axis=-1)
    dists[p2f < 0] = -1.0
    zbuf[p2f < 0] = -1.0
    colors = rng.uniform(0.0, 1.0, size=(N, H, W, K, 3))
    return p2f, dists, zbuf, colors


def _warp(p2f, dists, zbuf, colors, bg, device):
    frag = wr.Fragments(
        wp.array(p2f, dtype=wp.int32, device=device),
        wp.array(zbuf.astype(np.float32), device=device, requires_grad=True),
        wp.zeros(p2f.shape, dtype=wp.vec3, device=device, requires_grad=True),
        wp.array(dists.astype(np.float32), device=device, requires_grad=True),
    )
    col = wp.array(colors.astype(np.float32), dtype=wp.vec3, device=device, requires_grad=True)
    bgw = wp.array(
        np.asarray(bg, np.float32).reshape(1, 3), dtype=wp.vec3, device=device, requires_grad=True
    )
    return frag, col, bgw


def _fd(fn, x, g, h=1e-7):
    """Central differences of sum(fn(x) * g) (float64; truncation ~h^2, rounding ~1e-9)."""
    return central_difference(fn, x, g, h)


# Values: float32 evaluation of sums of K O(1) terms and exp of O(10)
# arguments: ~1e-6 relative. Gradients: float32 adjoints of the same: 1e-4 rel L2.
VALUE_TOL = 1e-5
GRAD_TOL = 1e-4


def test_softmax_blend_matches_oracle_and_finite_differences(device):
    rng = np.random.default_rng(0)
    p2f, dists, zbuf, colors = _fragments(rng)
    bg = np.array([0.2, 0.3, 0.4])
    frag, col, bgw = _warp(p2f, dists, zbuf, colors, bg, device)
    params = shading.BlendParams(sigma=SIGMA, gamma=GAMMA, background_color=bgw)
    tape = wp.Tape()
    with tape:
        img = shading.softmax_rgb_blend(
            col, frag, params, ZNEAR.astype(np.float32), ZFAR.astype(np.float32)
        )

    def oracle(p=p2f, d=dists, z=zbuf, c=colors, b=bg):
        return ref.softmax_blend(p, d, z, c, b, SIGMA, GAMMA, ZNEAR, ZFAR)

    np.testing.assert_allclose(img.numpy(), oracle(), atol=VALUE_TOL)
    g = rng.normal(size=(N, H, W, 4))
    tape.backward(grads={img: wp.array(g.astype(np.float32), device=device)})
    checks = {
        "colors": (col.grad.numpy(), _fd(lambda x: oracle(c=x), colors, g)),
        "dists": (frag.dists.grad.numpy(), _fd(lambda x: oracle(d=x), dists, g)),
        "zbuf": (frag.zbuf.grad.numpy(), _fd(lambda x: oracle(z=x), zbuf, g)),
        "background": (bgw.grad.numpy()[0], _fd(lambda x: oracle(b=x), bg, g)),
    }
    for name, (ours, fd) in checks.items():
        assert rel_l2(ours, fd) <= GRAD_TOL, (name, rel_l2(ours, fd))
    # empty slots get nothing
    assert (frag.dists.grad.numpy()[p2f < 0] == 0).all()


def test_softmax_blend_far_faces_use_the_delta_clamp(device):
    # All faces beyond zfar: z_inv < 0, the max clamps to eps, and the colour is
    # the background-weighted mix; the gradient through the clamp is zero.
    p2f = np.zeros((1, 1, 1, 2), np.int32)
    dists = np.full((1, 1, 1, 2), -0.01)
    zbuf = np.array([[[[120.0, 130.0]]]])
    colors = np.ones((1, 1, 1, 2, 3)) * 0.5
    frag, col, bgw = _warp(p2f, dists, zbuf, colors, (0.0, 0.0, 0.0), device)
    img = shading.softmax_rgb_blend(
        col, frag, shading.BlendParams(sigma=SIGMA, gamma=GAMMA, background_color=bgw)
    )
    expected = ref.softmax_blend(p2f, dists, zbuf, colors, np.zeros(3), SIGMA, GAMMA, 1.0, 100.0)
    np.testing.assert_allclose(img.numpy(), expected, atol=VALUE_TOL)


def test_sigmoid_alpha_blend_matches_oracle_and_finite_differences(device):
    rng = np.random.default_rng(1)
    p2f, dists, zbuf, colors = _fragments(rng)
    frag, col, _ = _warp(p2f, dists, zbuf, colors, (1, 1, 1), device)
    tape = wp.Tape()
    with tape:
        img = shading.sigmoid_alpha_blend(col, frag, shading.BlendParams(sigma=SIGMA))

    def oracle(d=dists, c=colors):
        return ref.sigmoid_blend(p2f, d, c, SIGMA)

    np.testing.assert_allclose(img.numpy(), oracle(), atol=VALUE_TOL)
    g = rng.normal(size=(N, H, W, 4))
    tape.backward(grads={img: wp.array(g.astype(np.float32), device=device)})
    assert rel_l2(frag.dists.grad.numpy(), _fd(lambda x: oracle(d=x), dists, g)) <= GRAD_TOL
    assert rel_l2(col.grad.numpy(), _fd(lambda x: oracle(c=x), colors, g)) <= GRAD_TOL


def test_hard_blend_matches_oracle_and_finite_differences(device):
    rng = np.random.default_rng(2)
    p2f, dists, zbuf, colors = _fragments(rng)
    bg = np.array([0.1, 0.5, 0.9])
    frag, col, bgw = _warp(p2f, dists, zbuf, colors, bg, device)
    tape = wp.Tape()
    with tape:
        img = shading.hard_rgb_blend(col, frag, shading.BlendParams(background_color=bgw))

    def oracle(c=colors, b=bg):
        return ref.hard_blend(p2f, c, b)

    np.testing.assert_array_equal(img.numpy(), oracle().astype(np.float32))  # copies only
    g = rng.normal(size=(N, H, W, 4))
    tape.backward(grads={img: wp.array(g.astype(np.float32), device=device)})
    assert rel_l2(col.grad.numpy(), _fd(lambda x: oracle(c=x), colors, g)) <= GRAD_TOL
    assert rel_l2(bgw.grad.numpy()[0], _fd(lambda x: oracle(b=x), bg, g)) <= GRAD_TOL


def test_blend_inputs_are_checked(device):
    rng = np.random.default_rng(3)
    p2f, dists, zbuf, colors = _fragments(rng)
    frag, col, _ = _warp(p2f, dists, zbuf, colors, (1, 1, 1), device)
    with pytest.raises(ValueError, match="colors"):
        shading.hard_rgb_blend(colors[..., :2], frag)
    with pytest.raises(ValueError, match="znear"):
        shading.softmax_rgb_blend(col, frag, None, znear=np.ones(3), zfar=100.0)
    with pytest.raises(ValueError, match="background_color"):
        shading.BlendParams(background_color=(1.0, 2.0))
    with pytest.raises(TypeError, match="fragments"):
        shading.hard_rgb_blend(col, object())
    # NumPy (N, H, W, K, 3) colours are accepted (copied)
    img = shading.hard_rgb_blend(colors, frag)
    np.testing.assert_array_equal(
        img.numpy(), ref.hard_blend(p2f, colors, np.ones(3)).astype(np.float32)
    )
