"""The torch renderer op's persistent context (warpraster/torch/render_context.py):
a repeated call allocates no Warp memory and reads nothing back; a training loop
gives the same outputs and gradients, bit for bit, as the fresh path that builds
every Warp object per call; forwards whose backwards have not run yet keep their
own buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402
from host_counts import count_allocations_and_reads  # noqa: E402
from test_torch_shading import torch_scene  # noqa: E402

from warpraster.torch import MeshRendererWithFragments, render_op  # noqa: E402
from warpraster.torch import renderer as renderer_module  # noqa: E402
from warpraster.torch.render_context import _Slot, default_render_context  # noqa: E402

# a Soft Phong K = 8 render and a textured (TexturesUV, bilinear) Hard Phong K = 1 one
CASES = ["r03_softphong_directional_k8", "r07_texuv_hardphong_bilinear"]


@pytest.fixture
def fresh_path():
    """Within: every call takes the fresh path (the context switched off)."""
    ctx = default_render_context()
    yield ctx
    ctx.enabled = True


class _Textured:
    """A renderer called with the scene's textures (as PyTorch3D's ``Meshes`` carry
    them): ``ren(*inputs)`` renders textured; every other attribute is the renderer's."""

    def __init__(self, ren, tex):
        self._ren, self._tex = ren, tex

    def __call__(self, *args, **kwargs):
        return self._ren(*args, textures=self._tex, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ren, name)


def _scene(name):
    """The torch scene (textured) with its camera's T trained too: (d, renderer,
    inputs, leaves)."""
    d, spec, ren, inputs, tex, leaves = torch_scene(name)
    cams = ren.rasterizer.cameras
    cams.T.requires_grad_(True)
    leaves["cam_T"] = cams.T
    return d, _Textured(ren, tex), inputs, leaves


def _count_torch_reads(monkeypatch, calls):
    """Counts torch's host reads (``item``, ``tolist``, ``int()``, ``float()``,
    ``bool()`` of a tensor) into ``calls["torch"]``, but those of the op's handle
    (a 0-dim int64 tensor the op makes on the host: reading it syncs no device)."""
    calls["torch"] = 0
    for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counting(self, *a, _real=real, **k):
            if not (self.ndim == 0 and self.dtype == torch.int64 and self.device.type == "cpu"):
                calls["torch"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)


@pytest.mark.parametrize("name", CASES)
def test_a_repeated_call_allocates_nothing_and_reads_nothing_back(name, monkeypatch):
    """After the first forward + backward (and the first call without gradients),
    the same calls again: no Warp allocation (the cpu device's allocator counted),
    no ``wp.array.numpy`` and no torch host read (each a device sync on CUDA)."""
    d, ren, inputs, leaves = _scene(name)
    target = torch.tensor(d["images"] * 0.9)

    def step():
        img = ren(*inputs)
        ((img - target) ** 2).mean().backward()
        with torch.no_grad():
            ren(*inputs)

    step()
    runs = []
    real_run = _Slot.run
    monkeypatch.setattr(_Slot, "run", lambda *a: (runs.append(1), real_run(*a))[1])
    with count_allocations_and_reads(monkeypatch) as calls:
        _count_torch_reads(monkeypatch, calls)
        step()
    assert calls == {"alloc": 0, "numpy": 0, "torch": 0}
    assert len(runs) == 2  # both calls took the persistent path


def _train(ren, inputs, leaves, target, steps):
    """``steps`` of render, MSE, backward and an in-place SGD step on every leaf;
    per step the image, the fragments and every leaf's gradient (cloned)."""
    opt = torch.optim.SGD(list(leaves.values()), lr=1e-2)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        img = ren(*inputs)
        ((img - target) ** 2).mean().backward()
        f = ren.fragments
        got = {"image": img, "pix_to_face": f.pix_to_face, "zbuf": f.zbuf,
               "bary": f.bary_coords, "dists": f.dists}  # fmt: skip
        got.update({f"grad_{k}": t.grad for k, t in leaves.items() if t.grad is not None})
        out.append({k: v.detach().clone() for k, v in got.items()})
        opt.step()
    return out


@pytest.mark.parametrize("name", CASES)
def test_a_training_loop_equals_the_fresh_path_bit_for_bit(name, fresh_path):
    """Verts, the camera's T, the light and (textured case) the texture maps trained
    with SGD over several steps (the values change every step): each step's image,
    fragments and gradients are the fresh path's, bit for bit (the same launches on
    the same values; the cpu device adds in order)."""
    results = []
    for enabled in (False, True):
        fresh_path.enabled = enabled
        d, ren, inputs, leaves = _scene(name)
        target = torch.tensor(d["images"] * 0.9)
        results.append(_train(ren, inputs, leaves, target, steps=4))
    fresh, persistent = results
    assert fresh[0].keys() == persistent[0].keys()
    assert {"grad_verts", "grad_cam_T"} <= fresh[0].keys()
    for step, (want, got) in enumerate(zip(fresh, persistent, strict=True)):
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)
    assert not torch.equal(fresh[0]["grad_cam_T"], fresh[-1]["grad_cam_T"])  # it trained


@pytest.mark.parametrize("order", ["one_loss", "in_order", "reversed"])
def test_two_forwards_then_two_backwards(order, fresh_path, monkeypatch):
    """Two renders of different vertices before either backward (a loss over two
    renders; or two losses backpropagated one after the other, in either order):
    each forward keeps its own slot, no backward renders again, and the gradients
    are the fresh path's, bit for bit."""
    name = CASES[0]
    fresh_runs = []
    real_run = render_op._run

    def spy(*a, **k):
        if k.get("slot") is None:
            fresh_runs.append(1)
        return real_run(*a, **k)

    monkeypatch.setattr(render_op, "_run", spy)
    results = []
    for enabled in (False, True):
        fresh_path.enabled = enabled
        d, ren, inputs, leaves = _scene(name)
        target = torch.tensor(d["images"] * 0.9)
        verts = leaves["verts"]
        ren(*inputs)  # a first call: the slot exists before the counted ones
        fresh_runs.clear()
        img_a = ren(verts, *inputs[1:])
        img_b = ren(verts * 1.01, *inputs[1:])
        loss_a = ((img_a - target) ** 2).mean()
        loss_b = ((img_b - 0.5 * target) ** 2).mean()
        if order == "one_loss":
            (loss_a + loss_b).backward()
        else:
            for loss in (loss_a, loss_b) if order == "in_order" else (loss_b, loss_a):
                loss.backward()
        if enabled:
            assert fresh_runs == []  # two slots, two recorded tapes: nothing rendered again
        grads = {k: t.grad.clone() for k, t in leaves.items() if t.grad is not None}
        results.append(grads | {
            "a": img_a.detach(), "b": img_b.detach()})  # fmt: skip
    assert not torch.equal(results[0]["a"], results[0]["b"])
    for k in results[0]:
        assert torch.equal(results[1][k], results[0][k]), k


def test_more_forwards_than_slots_give_the_same_gradients(fresh_path):
    """Three forwards of one configuration before their backwards (the pool keeps
    two): the oldest forward's slot is reused, and its backward renders again on a
    fresh tape; every gradient is still the fresh path's, bit for bit."""
    name = CASES[0]
    results = []
    for enabled in (False, True):
        fresh_path.enabled = enabled
        d, ren, inputs, leaves = _scene(name)
        target = torch.tensor(d["images"] * 0.9)
        verts = leaves["verts"]
        images = [ren(verts * s, *inputs[1:]) for s in (1.0, 1.01, 1.02)]
        assert default_render_context().pool_size < len(images)
        sum(((img - target) ** 2).mean() for img in images).backward()
        results.append({k: t.grad.clone() for k, t in leaves.items() if t.grad is not None})
    assert {"verts", "cam_T"} <= results[0].keys()
    for k in results[0]:
        assert torch.equal(results[1][k], results[0][k]), k


def test_new_camera_tensors_are_checked():
    """A camera whose tensors the op has not seen is validated (a host read), as the
    fresh path validates every call: a reflection for R is refused."""
    from warpraster.torch import FoVPerspectiveCameras

    d, ren, inputs, leaves = _scene(CASES[0])
    ren(*inputs)
    with pytest.raises(ValueError, match="R"):
        ren(*inputs, cameras=FoVPerspectiveCameras(R=-torch.eye(3)[None]))


def test_no_context_state_leaks_into_the_next_call_of_another_shape():
    """Two configurations through one context (a K = 8 and a K = 1 scene), interleaved:
    each call's image is the one a lone call gives."""
    scenes = [_scene(n) for n in CASES]
    with torch.no_grad():
        alone = [ren(*inputs) for _, ren, inputs, _ in scenes]
        for _ in range(2):
            for (_, ren, inputs, _), want in zip(scenes, alone, strict=True):
                assert torch.equal(ren(*inputs), want)
    assert wp.get_device("cpu").is_cpu


def test_tensors_made_under_inference_mode_render():
    """Tensors made under ``torch.inference_mode`` have no version counter: the op's
    checks and the context's keys read them again every call (never a stale hit)
    instead of failing; the image is the one ``no_grad`` gives."""
    _, ren, inputs, _ = _scene(CASES[0])
    with torch.no_grad():
        want = ren(*inputs)
    with torch.inference_mode():
        frozen = [t.clone() for t in inputs]
        for _ in range(2):
            assert torch.equal(ren(*frozen), want)


@pytest.mark.parametrize("name", CASES)
def test_the_eager_path_equals_the_custom_op(name, monkeypatch):
    """Outside torch.compile the renderer calls the op's bodies through a plain
    autograd Function (render_op.render -> _EagerRender); the custom op (what a compiled
    graph holds) runs the same bodies. A training loop through each: equal outputs and
    gradients, bit for bit (the same launches; the cpu device adds in order)."""
    results, through_op = [], []
    for path in ("eager", "custom_op"):
        if path == "custom_op":
            monkeypatch.setattr(
                "warpraster.torch.renderer.render",
                lambda *a: (through_op.append(1), render_op.render_op(*a))[1],
            )
        d, ren, inputs, leaves = _scene(name)
        target = torch.tensor(d["images"] * 0.9)
        results.append(_train(ren, inputs, leaves, target, steps=3))
    eager, custom = results
    assert len(through_op) == 3
    assert eager[0].keys() == custom[0].keys()
    for step, (want, got) in enumerate(zip(custom, eager, strict=True)):
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)
    assert {"grad_verts", "grad_cam_T"} <= eager[0].keys()


def test_outputs_without_gradient_alternating_with_fragment_losses(fresh_path):
    """(MeshRendererWithFragments: its fragments carry gradients.) The eager path
    passes no upstream gradient for an output the loss did not use
    (the slot's buffer for it holds the zeros its forward cleared it to, instead of
    zeros made and copied in). Steps alternating a loss on the image alone with one
    on the image, zbuf, bary and dists: the gradients equal the fresh path's (which
    makes every upstream gradient, zeros included), bit for bit."""
    results = []
    for enabled in (False, True):
        fresh_path.enabled = enabled
        d, ren, inputs, leaves = _scene("r03_softphong_directional_k8")
        ren = MeshRendererWithFragments(rasterizer=ren.rasterizer, shader=ren.shader)
        target = torch.tensor(d["images"] * 0.9)
        out = []
        for step in range(4):
            for t in leaves.values():
                t.grad = None
            img, f = ren(*inputs)
            loss = ((img - target) ** 2).mean()
            if step % 2 == 1:
                loss = loss + f.zbuf.clamp(min=0).mean() + f.bary_coords.square().mean()
                loss = loss + f.dists.clamp(-1, 1).mean()
            loss.backward()
            out.append({k: t.grad.clone() for k, t in leaves.items() if t.grad is not None})
        results.append(out)
    fresh, eager = results
    for step, (want, got) in enumerate(zip(fresh, eager, strict=True)):
        assert want.keys() == got.keys() and "verts" in want
        for k in want:
            assert torch.equal(got[k], want[k]), (step, k)
    # the fragment terms changed the vertex gradient (the zeros were not a no-op test),
    # and an image-only step after a fragment loss is the first step again
    assert not torch.equal(eager[0]["verts"], eager[1]["verts"])
    for k in eager[0]:
        assert torch.equal(eager[2][k], eager[0][k]), k


def test_mesh_renderer_fragments_are_read_on_demand():
    """MeshRenderer leaves the fragments in the op's buffers (LazyFragments) and copies
    them out when first read: the values MeshRendererWithFragments returns, bit for bit;
    read after a later call rendered into the same buffers, they raise instead of
    showing that call's values; read before it, they stay (copied) after it."""
    from warpraster.torch.renderer import LazyFragments

    d, ren, inputs, leaves = _scene("r03_softphong_directional_k8")
    with_frags = MeshRendererWithFragments(rasterizer=ren.rasterizer, shader=ren.shader)
    img_want, want = with_frags(*inputs, textures=ren._tex)
    img = ren(*inputs)
    assert isinstance(ren.fragments, LazyFragments)
    assert torch.equal(img, img_want)
    for k in ("pix_to_face", "zbuf", "bary_coords", "dists"):
        got = getattr(ren.fragments, k)
        assert got.dtype == getattr(want, k).dtype and not got.requires_grad
        assert torch.equal(got, getattr(want, k)), k
    kept = ren.fragments
    with torch.no_grad():  # calls without gradients: one slot, reused call after call
        ren(*inputs)
        stale = ren.fragments
        leaves["verts"].add_(0.05)  # the next render differs
        ren(*inputs)
    with pytest.raises(RuntimeError, match="overwritten by a later render"):
        stale.zbuf  # noqa: B018
    assert torch.equal(kept.zbuf, want.zbuf)  # read before: a copy of its own


@pytest.mark.parametrize("compiling", [False, True], ids=["eager", "custom_op"])
def test_the_renderer_has_no_second_derivative(compiling, monkeypatch):
    """A gradient penalty through the renderer raises (first derivatives only) on the
    eager path and through the custom op a compiled graph holds."""
    if compiling:  # the custom op, as a compiled graph calls it (outside a compile)
        monkeypatch.setattr(renderer_module, "render", render_op.render_op)
    d, ren, inputs, leaves = _scene(CASES[0])
    loss = (ren(*inputs) ** 2).mean()
    grads = torch.autograd.grad(loss, [leaves["verts"]], create_graph=True)
    with pytest.raises(RuntimeError, match="first derivatives only|no autograd formula"):
        ((grads[0] ** 2).sum() + leaves["verts"].sum()).backward()


@pytest.mark.parametrize("name", CASES)
def test_a_batch_without_faces_renders_the_background_with_zero_gradients(name):
    """No faces at all (the fresh path), vertices and textures requiring gradients,
    the camera's default near-plane clip on: the background, and zero gradients
    (before, the clip pass's backward refused its empty conversion matrices)."""
    d, ren, inputs, leaves = _scene(name)
    ren = ren._ren  # untextured: the scene's textures are for its faces
    verts, faces, first, count = inputs[:4]
    img = ren(verts, faces[:0], torch.zeros_like(first), torch.zeros_like(count), *inputs[4:])
    bg = torch.tensor([*ren.shader.blend_params.background_color, 0.0], dtype=img.dtype)
    assert torch.equal(img, bg.expand_as(img).contiguous())
    img.sum().backward()
    for key, leaf in leaves.items():
        assert leaf.grad is None or not leaf.grad.any(), key


@pytest.mark.parametrize("changed", ["verts", "materials"])
def test_an_input_changed_in_place_before_the_backward_raises(changed):
    """The eager path passes autograd only the tensors that require grad; the others'
    versions are kept and checked as saved tensors' are: a vertex (differentiated) or
    a material tensor (not) changed in place between the render and its backward
    raises torch's in-place error instead of giving a gradient at another point."""
    d, ren, inputs, leaves = _scene(CASES[0])
    img = ren(*inputs)
    with torch.no_grad():
        if changed == "verts":
            leaves["verts"].add_(0.01)
        else:
            ren.shader.materials.shininess.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        img.mean().backward()


def test_the_kept_configuration_follows_the_objects_it_reads():
    """The configuration string is kept per call (render_config.call_config): values
    changed in place on the settings, blend and camera objects between calls are
    seen (the image is a new renderer's), and values equal in Python but not in JSON
    (0.0 and -0.0, 1 and 1.0) are kept apart."""
    import dataclasses
    import json

    from warpraster.torch import render_config
    from warpraster.torch.renderer import RenderCall

    d, ren, inputs, leaves = _scene(CASES[0])
    with torch.no_grad():
        ren(*inputs)
        ren.shader.blend_params.background_color = (0.0, 0.5, 0.0)
        ren.rasterizer.raster_settings.faces_per_pixel = 3
        got = ren(*inputs)
        _, fresh, fresh_inputs, _ = _scene(CASES[0])
        fresh.shader.blend_params.background_color = (0.0, 0.5, 0.0)
        fresh.rasterizer.raster_settings.faces_per_pixel = 3
        assert torch.equal(got, fresh(*fresh_inputs))
    call = RenderCall.resolve(ren.rasterizer, ren.shader, {}, "test")
    verts = inputs[0]
    strings = []
    cams = call.cameras
    degrees = getattr(cams, "degrees", None)
    values = [((0.0, 0.5, 0.0), 0.0, False, degrees), ((-0.0, 0.5, 0.0), 0.0, False, degrees),
              ((0.0, 0.5, 0.0), 0, False, degrees), ((0.0, 0.5, 0.0), 0.0, 0, degrees)]  # fmt: skip
    if degrees is not None:  # a camera option: True and 1 apart too
        values.append(((0.0, 0.5, 0.0), 0.0, False, int(degrees)))
    for bg, blur, cull, deg in values:
        call.blend_params = dataclasses.replace(call.blend_params, background_color=bg)
        call.raster_settings = dataclasses.replace(call.raster_settings, blur_radius=blur,
                                                   cull_backfaces=cull)  # fmt: skip
        if deg is not None:
            cams.degrees = deg
        config, tensors = render_config.call_config(call, verts)
        want, want_tensors = render_config.config_and_tensors(call, verts.device)
        want.update(record=torch.is_grad_enabled() and verts.requires_grad,
                    needs_grad=[t.requires_grad for t in want_tensors])  # fmt: skip
        assert config == json.dumps(want)
        assert all(a is b for a, b in zip(tensors, want_tensors, strict=True))
        strings.append(config)
    assert len(set(strings)) == len(values)


def test_stream_scopes_nest_each_with_an_empty_tape_slot_of_its_own():
    """The op's stream scope (streams._TorchStream) gives the thread an empty Warp tape
    slot; nested, the inner scope's slot is empty too, and leaving it brings back the
    outer one's tape, then the shared slot (the user's tape) as it was."""
    from warpraster.torch.streams import _TorchStream

    runtime = wp._src.context.runtime
    cpu = torch.device("cpu")
    user = wp.Tape()
    with user:
        assert runtime.tape is user
        with _TorchStream(cpu):
            assert runtime.tape is None
            outer = wp.Tape()
            with outer:
                with _TorchStream(cpu):
                    assert runtime.tape is None
                assert runtime.tape is outer
            assert runtime.tape is None
        assert runtime.tape is user
    assert runtime.tape is None


def test_index_values_are_checked_again_for_a_changed_topology():
    """A call that finds its slot's entry skips the op's index value check (the entry's
    topology was checked when made); faces changed in place, a new faces tensor or
    fewer vertices than the faces name are a new entry, checked again before any int32
    cast: the op's ValueError (an index of 2**32 would wrap to a valid 0)."""
    d, ren, inputs, leaves = _scene(CASES[0])
    verts, faces, first, count = inputs[:4]
    rest = inputs[4:]
    assert faces.dtype == torch.int64
    nv = verts.shape[0]
    op_error = f"vertex indices in .* for {nv} vertices in verts"
    with torch.no_grad():
        for _ in range(2):
            ren(*inputs)
        faces[0, 0] = 2**32  # in place (a new version); int32 would make it 0
        with pytest.raises(ValueError, match="do not fit in int32"):
            ren(verts, faces, first, count, *rest)
        faces[0, 0] = nv
        with pytest.raises(ValueError, match=op_error):
            ren(verts, faces, first, count, *rest)
        faces[0, 0] = 0
        ren(verts, faces, first, count, *rest)
        bad = faces.clone()
        bad[-1, 2] = 2**32
        with pytest.raises(ValueError, match="do not fit in int32"):
            ren(verts, bad, first, count, *rest)
        ren(*inputs)
        # (the rasterizer alone: a shader's vertex textures would refuse the rows first)
        rast = ren.rasterizer
        for _ in range(2):
            rast(verts, faces, first, count)
        fewer = int(faces.max())
        with pytest.raises(ValueError, match=f"vertex indices in .* for {fewer} vertices in verts"):
            rast(verts[:fewer], faces, first, count)


@pytest.mark.parametrize("trained", [False, True])
def test_untrained_vertices_get_no_gradient_copy(trained, fresh_path, monkeypatch):
    """Vertices that do not require grad: the slot's backward returns no vertex
    gradient (no copy of its buffer; trained vertices get theirs), and every
    gradient is the fresh path's, bit for bit."""
    returned = []
    real_backward = _Slot.backward

    def spy(self, *a, **k):
        out = real_backward(self, *a, **k)
        returned.append(out[0])
        return out

    monkeypatch.setattr(_Slot, "backward", spy)
    results = []
    for enabled in (False, True):
        fresh_path.enabled = enabled
        d, ren, inputs, leaves = _scene(CASES[1])
        target = torch.tensor(d["images"] * 0.9)
        if not trained:
            leaves.pop("verts").requires_grad_(False)
        steps = []
        for _ in range(3):
            for t in leaves.values():
                t.grad = None
            ((ren(*inputs) - target) ** 2).mean().backward()
            steps.append({k: t.grad.clone() for k, t in leaves.items()})
        results.append(steps)
    assert ("verts" in results[0][0]) == trained and len(returned) == 3
    assert all((g is not None) == trained for g in returned)  # the slot's, each step
    for want, got in zip(*results, strict=True):
        assert want.keys() == got.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k
