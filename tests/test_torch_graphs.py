"""The torch renderer op's slots replayed as captured graphs (warpraster/torch/
render_context.py, ``RenderContext.call_graphs``): from a slot's second call on, its
forward replays as one graph and, recorded, its backward as another
(warpraster.tape_replay.RecordedCall). Forced on the cpu device (Warp 1.19 captures
there too; off there by default). Truth: the same steps launched one by one
(``call_graphs=False``): equal images, fragments and gradients, bit for bit (the
same launches on the same arrays; the cpu device adds in order), so no tolerance."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402
from host_counts import count_allocations_and_reads  # noqa: E402
from p3d_render_cases import case_names  # noqa: E402
from test_torch_context import CASES, _count_torch_reads, _scene, _train  # noqa: E402

from warpraster.torch import MeshRenderer  # noqa: E402
from warpraster.torch.render_context import _Slot, default_render_context  # noqa: E402

# every shader, camera and texture kind of the reference scenes (a batch of 2 among
# them), and a hard K = 1 one antialiased
TRAINED = [*case_names(), "r02_hardphong_point_vertexcolor+antialias"]


@pytest.fixture
def context():
    """The default context, its ``call_graphs`` and ``enabled`` restored after."""
    ctx = default_render_context()
    before = ctx.call_graphs, ctx.enabled
    yield ctx
    ctx.call_graphs, ctx.enabled = before


def _count_replays(monkeypatch) -> list:
    """Counts ``wp.capture_launch`` calls (graph replays) into the returned list."""
    replays = []
    real = wp.capture_launch
    monkeypatch.setattr(wp, "capture_launch", lambda *a, **k: (replays.append(1), real(*a, **k)))
    return replays


@pytest.mark.parametrize("name", TRAINED)
def test_a_training_loop_replayed_as_graphs_equals_the_eager_one(name, context, monkeypatch):
    """Verts, the camera's T, the light and the vertex colours or texture maps trained
    with SGD for 5 steps, the values changing every step: with graphs forced on the
    cpu device, each step's image, fragments and gradients are the eager slot's, bit
    for bit; steps 2.. replay (a forward and a backward graph each)."""
    results = []
    replays = _count_replays(monkeypatch)
    scene, _, aa = name.partition("+")
    for mode in (False, True):
        context.call_graphs = mode
        d, ren, inputs, leaves = _scene(scene)
        if aa:
            ren = MeshRenderer(rasterizer=ren.rasterizer, shader=ren.shader, antialias=True)
        target = torch.tensor(d["images"] * 0.9)
        replays.clear()
        results.append(_train(ren, inputs, leaves, target, steps=5))
        # eager: none; graphs: steps 2-5, each a forward and a backward graph
        assert len(replays) == (8 if mode else 0), mode
    eager, graphs = results
    assert eager[0].keys() == graphs[0].keys()
    assert {"grad_verts", "grad_cam_T"} <= eager[0].keys()
    for step, (want, got) in enumerate(zip(eager, graphs, strict=True)):
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)
    assert not torch.equal(eager[0]["grad_verts"], eager[-1]["grad_verts"])  # it trained
    assert not torch.equal(eager[0]["grad_cam_T"], eager[-1]["grad_cam_T"])


@pytest.mark.parametrize("name", CASES)
def test_a_replayed_step_allocates_nothing_and_reads_nothing_back(name, context, monkeypatch):
    """After two steps (forward + backward, and a call without gradients: the first
    launches, the second captures), the same step again replays three graphs and
    makes no Warp allocation, no ``wp.array.numpy`` and no torch host read."""
    context.call_graphs = True
    d, ren, inputs, leaves = _scene(name)
    target = torch.tensor(d["images"] * 0.9)
    outs = []

    def step():
        img = ren(*inputs)
        ((img - target) ** 2).mean().backward()
        with torch.no_grad():
            plain = ren(*inputs)
        outs.append((img.detach().clone(), plain, leaves["verts"].grad.clone()))
        for t in leaves.values():
            t.grad = None

    step()
    step()
    runs = []
    real_run = _Slot.run
    with count_allocations_and_reads(monkeypatch) as calls:
        monkeypatch.setattr(_Slot, "run", lambda *a: (runs.append(1), real_run(*a))[1])
        replays = _count_replays(monkeypatch)
        _count_torch_reads(monkeypatch, calls)
        step()
        n_replays = len(replays)
    assert calls == {"alloc": 0, "numpy": 0, "torch": 0}
    assert len(runs) == 2  # both calls took the persistent path
    assert n_replays == 3  # the recorded forward, its backward, the plain forward
    # the same inputs every step: the same image (with and without gradients) and gradient
    for got in outs[1:]:
        for a, b in zip(got, outs[0], strict=True):
            assert torch.equal(a, b)
    assert torch.equal(outs[0][0], outs[0][1])


def test_two_forwards_then_two_backwards_replayed(context):
    """Two renders before either backward (each keeps its own slot, so each slot's
    graphs serve its own render), repeated: the gradients are the eager ones."""
    name = CASES[0]
    results = []
    for mode in (False, True):
        context.call_graphs = mode
        d, ren, inputs, leaves = _scene(name)
        target = torch.tensor(d["images"] * 0.9)
        verts = leaves["verts"]
        seen = []
        for _ in range(3):
            for t in leaves.values():
                t.grad = None
            img_a = ren(verts, *inputs[1:])
            img_b = ren(verts * 1.01, *inputs[1:])
            loss_b = ((img_b - 0.5 * target) ** 2).mean()
            (((img_a - target) ** 2).mean() + loss_b).backward()
            seen.append({k: t.grad.clone() for k, t in leaves.items() if t.grad is not None}
                        | {"a": img_a.detach(), "b": img_b.detach()})  # fmt: skip
        results.append(seen)
    for step, (want, got) in enumerate(zip(*results, strict=True)):
        assert not torch.equal(want["a"], want["b"])
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)
