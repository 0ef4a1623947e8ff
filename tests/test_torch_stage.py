"""The USD stage renderer through torch (warpraster.torch.stage): its parameters as
tensors sharing the renderer's memory, its picture with autograd.

Truth: the renderer's own gradients on a ``wp.Tape`` (tests/test_usd_grad.py checks
those against central differences): the torch backward runs the same adjoint on
the same values, so every parameter's gradient is equal, bit for bit on the cpu
device; and an optimiser stepping the tensors moves what the renderer reads.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pxr")

import warp as wp  # noqa: E402
from conftest import DEVICES  # noqa: E402
from test_usd_grad import H, W, _camera, _material_scene  # noqa: E402

import warpraster.usd as wu  # noqa: E402
from warpraster.torch.stage import render_stage, stage_parameters  # noqa: E402

pytestmark = pytest.mark.skipif(
    "cpu" not in DEVICES, reason="torch runs on the cpu; cpu is not a test device"
)


def _renderer():
    return wu.StageRenderer(_material_scene(), camera=_camera(), image_size=(H, W), spp=4,
                            requires_grad=True, device="cpu")  # fmt: skip


def test_torch_gradients_are_the_renderers_own():
    from warpraster.torch.stage import _named_arrays

    r = _renderer()
    params = stage_parameters(r)
    assert {"points", "diffuse", "texels", "specular", "camera_T", "light_param"} <= set(params)
    w = torch.tensor(np.random.default_rng(2).uniform(-1, 1, (H, W, 4)), dtype=torch.float32)
    image = render_stage(r, params)
    (image * w).sum().backward()
    first = {name: t.grad.clone() for name, t in params.items()}
    # the Warp side: the same loss on a tape
    warp_arrays = _named_arrays(r)
    for a in warp_arrays.values():
        a.grad.zero_()
    tape = wp.Tape()
    with tape:
        r.render_device()
    tape.backward(grads={r.color: wp.array(w.numpy(), dtype=wp.vec4, device="cpu")})
    np.testing.assert_array_equal(image.detach().numpy(), r.color.numpy().reshape(H, W, 4))
    for name, g in first.items():
        want = warp_arrays[name].grad.numpy().reshape(g.shape)
        np.testing.assert_array_equal(g.numpy(), want, err_msg=name)
    assert np.abs(first["diffuse"].numpy()).max() > 0
    # a second step adds, as torch does (the same values twice: exactly twice the first)
    (render_stage(r, params) * w).sum().backward()
    for name, t in params.items():
        np.testing.assert_array_equal(t.grad.numpy(), 2 * first[name].numpy(), err_msg=name)


def test_an_optimiser_on_the_tensors_moves_the_render():
    r = _renderer()
    params = stage_parameters(r)
    with torch.no_grad():
        target = render_stage(r, params).clone()
        true = params["diffuse"].clone()
        params["diffuse"].mul_(0.5)  # in place: the renderer's own memory
    opt = torch.optim.Adam([params["diffuse"]], lr=0.05)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((render_stage(r, params) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.05 * losses[0]
    # the colours move toward the truth (rows no face uses have no gradient)
    used = params["diffuse"].grad.abs().sum(1) > 0
    err0 = (0.5 * true - true)[used].abs().max()
    err = (params["diffuse"].detach() - true)[used].abs().max()
    assert err < 0.5 * err0


def test_a_renderer_without_gradients_is_refused():
    r = wu.StageRenderer(_material_scene(), camera=_camera(), image_size=(H, W), device="cpu")
    with pytest.raises(ValueError, match="requires_grad=True"):
        stage_parameters(r)


def test_a_parameter_changed_before_the_backward_or_a_second_render_raises():
    """The adjoint reads the renderer's buffers and the parameters' memory when it
    runs: a parameter changed in place between the render and its backward (it gave
    the gradient at the new point without a word) raises torch's in-place error, and
    a second render before the first one's backward says what to do."""
    r = _renderer()
    params = stage_parameters(r)
    w = torch.ones((H, W, 4))
    image = render_stage(r, params)
    with torch.no_grad():
        params["points"] += 0.01
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (image * w).sum().backward()
    a, b = render_stage(r, params), render_stage(r, params)
    with pytest.raises(ValueError, match="render_stage: the renderer rendered again"):
        ((a * w).sum() + (b * w).sum()).backward()
