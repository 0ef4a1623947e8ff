"""The torch render context's lease look-up (warpraster/torch/render_context.py): a
call whose tensors are its entry's finds entry and settings in one look-up; any
change either key would see (a camera or topology tensor changed in place or made
anew, a shape, dtype, device, stream, a dropped entry) goes the long way again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_torch_context import CASES, _scene  # noqa: E402

from warpraster.torch.render_context import RenderContext, default_render_context  # noqa: E402


class _Miss(Exception):
    pass


def _lease_args(monkeypatch):
    """(cfg, config, verts, faces, first, count, tensors) of a render's lease."""
    d, ren, inputs, leaves = _scene(CASES[0])
    ctx = default_render_context()
    seen = []
    real = ctx.lease

    def spy(*a, **k):
        seen.append(a)
        return real(*a, **k)

    monkeypatch.setattr(ctx, "lease", spy)
    with torch.no_grad():
        ren(*inputs)
    monkeypatch.undo()
    cfg, config, verts, faces, first, count, tensors = seen[-1]
    return [cfg, config, verts, faces, first, count, list(tensors)]


@pytest.fixture
def lease(monkeypatch):
    args = _lease_args(monkeypatch)
    ctx = RenderContext(max_entries=2)
    real = ctx._settings
    state = {"miss": False}

    def settings(*a, **k):  # the long way: the settings' look-up first
        if state["miss"]:
            raise _Miss
        return real(*a, **k)

    ctx._settings = settings

    def call(*, stream_key=None, check=None, **over):
        a = list(args)
        names = ["cfg", "config", "verts", "faces", "first", "count", "tensors"]
        for k, v in over.items():
            a[names.index(k)] = v
        held = ctx.lease(*a, stream_key=stream_key, check=check)
        held.release()
        return held.slot

    def hits(**over):
        state["miss"] = True
        try:
            call(**over)
        except _Miss:
            return False
        finally:
            state["miss"] = False
        return True

    call()
    call()  # the quick key made (the camera layout known from the first)
    return ctx, args, call, hits


def test_lease_hits_with_the_same_tensors(lease):
    ctx, args, call, hits = lease
    first = call()
    assert hits()
    assert call() is first


def test_lease_misses_on_a_changed_camera_tensor(lease):
    ctx, args, call, hits = lease
    cfg, config, verts, faces, first, count, tensors = args
    n, znear = ctx._layouts[config]
    assert znear
    tensors[znear[0]].add_(0.0)  # in place: a new version
    assert not hits()
    call()
    assert hits()
    new = list(tensors)
    new[0] = tensors[0].clone()  # a new object (other memory)
    assert not hits(tensors=new)
    same_place = list(tensors)
    same_place[0] = tensors[0].view_as(tensors[0])  # same memory, another object
    assert not hits(tensors=same_place)
    moved = list(tensors)
    moved[0] = tensors[0].to("meta")
    assert not hits(tensors=moved)
    other_dtype = list(tensors)
    other_dtype[-1] = tensors[-1].double()
    assert not hits(tensors=other_dtype)
    other_shape = list(tensors)
    other_shape[-1] = tensors[-1].reshape(-1) if tensors[-1].ndim > 1 else tensors[-1][None]
    assert not hits(tensors=other_shape)
    assert hits()


def test_lease_misses_on_a_changed_topology_or_call(lease):
    ctx, args, call, hits = lease
    cfg, config, verts, faces, first, count, tensors = args
    faces.add_(0)  # in place: a new version
    assert not hits()
    call()
    assert hits()
    assert not hits(faces=faces.view_as(faces))
    assert not hits(faces=faces.clone())
    assert not hits(count=count.clone())
    assert not hits(verts=verts[:-1])
    assert not hits(stream_key=1234)
    assert hits()


def test_lease_misses_once_its_entry_is_dropped(lease):
    ctx, args, call, hits = lease
    cfg, config, verts, faces, first, count, tensors = args
    slot = call()
    ctx.clear()
    assert not hits()
    assert call() is not slot
    call()
    assert hits()
    for k in range(1, 3):  # two other entries push it out (max_entries=2)
        call(stream_key=k)
    assert not hits()
    call()
    assert hits()
