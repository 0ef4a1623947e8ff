"""``bench --suite renderer --torch --profile``'s host timeline, on a small torch scene
(the device-kernel table needs CUDA): every stage of the op is marked in the order a
training step meets it, the times only grow, and the wrappers are gone afterwards."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402
from test_torch_shading import torch_scene  # noqa: E402

import warpraster.torch.render_context as render_context  # noqa: E402
import warpraster.torch.render_op as render_op  # noqa: E402
from warpraster.bench.torch_profile import host_timeline, print_profile  # noqa: E402


def _step():
    d, _spec, ren, inputs, _tex, leaves = torch_scene("r03_softphong_directional_k8")
    target = torch.tensor(d["images"] * 0.9)

    def step():
        for leaf in leaves.values():
            leaf.grad = None
        ((ren(*inputs) - target) ** 2).mean().backward()

    return step


def test_the_host_timeline_marks_every_stage_in_order_and_restores_the_op(capsys):
    originals = (render_op._render_impl, render_context._foreach, wp.capture_launch,
                 render_context._Slot.backward, render_context.RenderContext.lease)  # fmt: skip
    step = _step()
    step()  # the context's slot
    timeline = host_timeline(step, lambda: None, steps=4)
    labels = [label for label, _ in timeline]
    want = ["call >", "op forward >", "lease >", "lease <", "inputs in / gradients zeroed >",
            "outputs out >", "op forward <", "call <", "op backward >", "slot backward >",
            "slot backward <", "op backward <", "step returned", "device done"]  # fmt: skip
    first = []  # each stage where the step first meets it (the inputs' copy and the
    for label in labels:  # gradients' zeroing are two calls)
        if label in want and label not in first:
            first.append(label)
    assert first == want
    times = [t for _, t in timeline]
    assert times == sorted(times) and times[0] >= 0.0
    after = (render_op._render_impl, render_context._foreach, wp.capture_launch,
             render_context._Slot.backward, render_context.RenderContext.lease)  # fmt: skip
    assert after == originals
    print_profile("small", step, step, "cpu")
    out = capsys.readouterr().out
    assert "host timeline" in out and "op backward >" in out
