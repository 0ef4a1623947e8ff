"""Renderer.image_mse: the image MSE whose gradient the shading adjoint computes
itself. Its truth is the unfused route (shading.reductions.image_mse, whose
backward writes image.grad, tested against float64 and finite differences in
test_renderer.py): same loss, same gradients to every input."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from test_renderer import _renderer_for_case

from warpraster.shading import reductions


def _grads(*arrays):
    return [a.grad.numpy().copy() for a in arrays]


def _inputs_with_grad(verts, *objs):
    """verts and every array of the textures / lights that carries a gradient."""
    found = [verts]
    for obj in objs:
        for value in vars(obj).values() if obj is not None else ():
            if isinstance(value, wp.array) and value.grad is not None:
                found.append(value)
    return found


def _step(r, verts, target, loss, fused: bool, extra_target=None):
    """Zeroed loss, render, loss (fused or not; optional second term), backward."""
    loss.zero_()
    tape = wp.Tape()
    with tape:
        out = r.render(verts)
        for t in [target] if extra_target is None else [target, extra_target]:
            if fused:
                r.image_mse(t, out=loss)
            else:
                reductions.image_mse(out.image, t, out=loss)
    tape.backward(loss)
    return tape, out


def _unfused_after(tapes, r, verts, target, loss, extra_target=None):
    """Clears ``tapes`` and the vertex gradient, then runs the unfused step: its
    (loss, vertex gradient), the truth the fused variants are compared with."""
    for t in tapes:
        t.zero()
    verts.grad.zero_()
    _step(r, verts, target, loss, fused=False, extra_target=extra_target)
    return loss.numpy().copy(), verts.grad.numpy().copy()


def _assert_same(a, b, device, what):
    if wp.get_device(device).is_cpu:
        # the cpu runs every atomic sum in order: the fused adjoint computes the
        # unfused backward's float32 expression, so the results are bit for bit equal
        np.testing.assert_array_equal(a, b, err_msg=what)
    else:
        # CUDA float32 atomic sums (vertex normals, per-face and texel sums) add in
        # a varying order: 1e-5 of the largest entry covers what an H200 shows
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max(), err_msg=what)


@pytest.mark.parametrize(
    "name",
    [
        "r03_softphong_directional_k8",
        "r04_hardgouraud_batch2_nonsquare",
        "r07_texuv_hardphong_bilinear",
        "r09_softgouraud_ambient_bg",
    ],
)
def test_fused_mse_equals_the_unfused_loss_and_gradients(name, device):
    d, spec, r, verts, tex, lts = _renderer_for_case(name, device)
    target = wp.array(d["images"] * 0.9 + 0.02, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape, out = _step(r, verts, target, loss, fused=True)
    watched = _inputs_with_grad(verts, tex, lts)
    fused_loss, fused = loss.numpy().copy(), _grads(*watched)
    # the loss gradient was computed inside the adjoint: no image gradient written
    assert not np.any(out.image.grad.numpy())
    assert np.abs(fused[0]).max() > 0
    tape.zero()
    for a in watched:
        a.grad.zero_()
    _step(r, verts, target, loss, fused=False)
    _assert_same(fused_loss, loss.numpy(), device, "loss")  # same forward kernels
    for i, (f, u) in enumerate(zip(fused, _grads(*watched), strict=True)):
        _assert_same(f, u, device, f"input {i} of {name}")


def test_a_second_loss_on_one_render_takes_the_unfused_route(device):
    # Only the first loss per render is fused; the second writes image.grad, which
    # the adjoint adds to its own term: the sum equals two unfused losses.
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    t1 = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    t2 = wp.array(d["images"][::-1] * 0.5, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape, out = _step(r, verts, t1, loss, fused=True, extra_target=t2)
    assert np.any(out.image.grad.numpy())  # the second term's
    fused_loss, fused = loss.numpy().copy(), verts.grad.numpy().copy()
    want_loss, want = _unfused_after([tape], r, verts, t1, loss, t2)
    _assert_same(fused_loss, want_loss, device, "loss")
    _assert_same(fused, want, device, "verts")


def test_the_silhouette_shader_falls_back_to_the_unfused_backward(device):
    d, spec, r, verts, tex, lts = _renderer_for_case("r05_softsilhouette_k16", device)
    target = wp.array(d["images"] * 0.5, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape, out = _step(r, verts, target, loss, fused=True)
    assert np.any(out.image.grad.numpy())
    fused = verts.grad.numpy().copy()
    assert np.abs(fused).max() > 0
    _, want = _unfused_after([tape], r, verts, target, loss)
    _assert_same(fused, want, device, "verts")


def test_a_loss_on_another_tape_than_the_render_is_not_fused(device):
    # The render's adjoint waits on tape A; a loss recorded on tape B writes the
    # image gradient (unfused), which tape A's backward then carries to the
    # vertices: the same gradients as one tape with the unfused loss.
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape_a, tape_b = wp.Tape(), wp.Tape()
    with tape_a:
        out = r.render(verts)
    with tape_b:
        r.image_mse(target, out=loss)
    tape_b.backward(loss)
    assert np.any(out.image.grad.numpy())
    tape_a.backward()
    split = verts.grad.numpy().copy()
    _, want = _unfused_after([tape_a, tape_b], r, verts, target, loss)
    _assert_same(split, want, device, "verts")


def test_a_captured_fused_step_replays_the_eager_one(device):
    # render + fused loss + backward in one graph (Warp 1.19 captures on the cpu
    # device too); replayed after moving the vertices in place it equals an eager
    # step at the new vertices.
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape, _ = _step(r, verts, target, loss, fused=True)  # eager: loads every module
    tape.zero()
    verts.grad.zero_()
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        loss.zero_()
        tape = wp.Tape()
        with tape:
            r.render(verts)
            r.image_mse(target, out=loss)
        tape.zero()
        tape.backward(loss)
    verts.assign(d["verts_packed"] * 1.02)
    verts.grad.zero_()
    wp.capture_launch(cap.graph)
    replay_loss, replay = loss.numpy().copy(), verts.grad.numpy().copy()
    tape.zero()
    verts.grad.zero_()
    _step(r, verts, target, loss, fused=True)
    _assert_same(replay_loss, loss.numpy(), device, "loss")
    _assert_same(replay, verts.grad.numpy(), device, "verts")


def test_a_bad_target_or_out_is_refused_before_any_kernel(device):
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    n, h, w, _ = r.outputs[0].image.shape
    with pytest.raises(ValueError, match="target"):
        r.image_mse(wp.zeros((n, h, w, 3), dtype=wp.float32, device=device))
    with pytest.raises(TypeError, match="target"):
        r.image_mse(np.zeros((n, h, w, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="out"):
        r.image_mse(
            wp.zeros((n, h, w, 4), dtype=wp.float32, device=device),
            out=wp.zeros(2, dtype=wp.float32, device=device),
        )


def test_a_loss_before_any_render_of_its_step_is_refused():
    # image_mse reads the step's last rendered image: with none rendered yet it gave
    # the loss of the zero-filled buffer without a word (0 for a zero target)
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", "cpu",
                                                     steps=2)  # fmt: skip
    target = wp.zeros(r.outputs[0].image.shape, dtype=wp.float32, device="cpu")
    with pytest.raises(ValueError, match="step 0 was not rendered yet"):
        r.image_mse(target)
    with pytest.raises(ValueError, match="verts has"):
        r.render(verts.numpy()[:-1])  # a render that fails before launching marks nothing
    with pytest.raises(ValueError, match="step 0 was not rendered yet"):
        r.image_mse(target)
    r.render(verts, step=1)
    with pytest.raises(ValueError, match="step 0 was not rendered yet"):
        r.image_mse(target)
    r.render(verts)
    assert r.image_mse(target).numpy()[0] > 0
