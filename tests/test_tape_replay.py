"""Eager training steps replayed as graphs: Renderer.render on a tape, repeated with
the same arrays, replays its forward as one captured graph and its backward as
another (warpraster.tape_replay). Truth: the same steps launched one by one
(``call_graphs=False``): equal images and gradients, bit for bit on the cpu
device (the same launches on the same arrays; its atomics run in one order).
"""

from __future__ import annotations

import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp
from test_nonfinite_vertices import _cameras  # made with requires_grad=True

from warpraster import shading
from warpraster.renderer import Renderer


def _renderer(name, device, call_graphs, **kw):
    d, spec = cases.load(name)
    cams = _cameras(d, spec, device)
    lts = cases.lights(d, spec, device)
    shader = getattr(shading, spec["shader"])(
        cameras=cams, lights=lts, materials=cases.materials(spec, device),
        blend_params=cases.blend_params(spec))  # fmt: skip
    tex = cases.textures(d, spec, device)
    r = Renderer(cameras=cams, raster_settings=cases.raster_settings(spec), shader=shader,
                 faces=d["faces_packed"].astype(np.int32),
                 mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
                 num_faces_per_mesh=d["num_faces_per_mesh"],
                 num_verts=len(d["verts_packed"]), textures=tex, **kw)  # fmt: skip
    r.call_graphs = call_graphs
    verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    params = [verts, cams.R, cams.T]
    params += [a for a in vars(tex).values() if isinstance(a, wp.array) and a.grad is not None
               and a.dtype != wp.int32]  # fmt: skip
    target = wp.array(d["images"] * 0.9 + 0.02, dtype=wp.float32, device=device)
    return r, verts, params, target


def _steps(r, verts, params, target, device, losses):
    """One training step per entry of ``losses`` ("fused" or "unfused"), each on a
    fresh tape with the caller's arrays zeroed, the vertices moved in place between
    steps; (image, gradients) after each."""
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    seen = []
    base = verts.numpy().copy()
    for i, kind in enumerate(losses):
        verts.assign(base * (1.0 + 0.01 * i))  # new values in the same array
        if kind == "plain":  # a render outside any tape (replayed as its own graph)
            seen.append([r.render(verts).image.numpy().copy()])
            continue
        loss.zero_()
        for p in params:
            p.grad.zero_()
        tape = wp.Tape()
        with tape:
            out = r.render(verts)
            if kind == "fused":
                r.image_mse(target, out=loss)
            else:
                shading.image_mse(out.image, target, out=loss)
        tape.backward(loss)
        seen.append([out.image.numpy().copy(), loss.numpy().copy()]
                    + [p.grad.numpy().copy() for p in params])  # fmt: skip
    return seen


@pytest.mark.parametrize(
    "name,kw",
    [("r03_softphong_directional_k8", {}), ("r07_texuv_hardphong_bilinear", {}),
     ("r07_texuv_hardphong_bilinear", {"antialias": True})],
    ids=["soft-phong", "uv-hard", "uv-hard-antialias"],
)  # fmt: skip
def test_replayed_steps_equal_launched_steps(name, kw):
    device = "cpu"  # graphs are captured on the cpu device too (experimental in Warp)
    losses = ["fused", "fused", "fused", "unfused", "fused", "unfused"]
    ref = _steps(*_renderer(name, device, False, **kw), device, losses)
    r, verts, params, target = _renderer(name, device, True, **kw)
    got = _steps(r, verts, params, target, device, losses)
    assert r._recorded[0].captured_tape() is not None  # steps 2+ were replays
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            np.testing.assert_array_equal(y, x, err_msg=f"step {i}, array {j}")
    assert np.abs(got[-1][2]).max() > 0  # the vertices got gradients


def test_replayed_steps_between_renders_outside_a_tape():
    # renders outside a tape (their own graph) between recorded steps, as a
    # benchmark or a viewer does: the replayed backward still differentiates the
    # render just replayed
    device = "cpu"
    losses = ["plain", "plain", "plain", "fused", "fused", "plain", "fused", "fused", "plain",
              "unfused", "unfused", "fused"]  # fmt: skip
    ref = _steps(*_renderer("r03_softphong_directional_k8", device, False), device, losses)
    got = _steps(*_renderer("r03_softphong_directional_k8", device, True), device, losses)
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        for j, (x, y) in enumerate(zip(a, b, strict=True)):
            np.testing.assert_array_equal(y, x, err_msg=f"step {i}, array {j}")


def test_a_replayed_step_records_once_per_tape():
    r, verts, params, target = _renderer("r03_softphong_directional_k8", "cpu", True)
    for _ in range(3):  # launched, captured, replayed
        tape = wp.Tape()
        with tape:
            r.render(verts)
    with pytest.raises(ValueError, match="already recorded on the active tape"):
        with tape:
            r.render(verts)
    # a render after a recorded one (another tape) makes its backward refuse
    tape = wp.Tape()
    with tape:
        out = r.render(verts)
    r.render(verts)  # outside the tape: overwrites the step's buffers
    out.image.grad.fill_(1.0)
    with pytest.raises(ValueError, match="rendered again"):
        tape.backward()


def _replace(what, r):
    """Replaces one object the render reads (as a user would between steps)."""
    sh = r.shader
    if what == "lights":
        sh.lights = shading.PointLights(location=((-2.0, 1.0, -3.0),), device=r.device)
    elif what == "materials":
        sh.materials = shading.Materials(diffuse_color=((0.2, 0.9, 0.1),), device=r.device)
    elif what == "blend_params":
        sh.blend_params = shading.BlendParams(sigma=1e-3, gamma=1e-2,
                                              background_color=(0.3, 0.2, 0.1))  # fmt: skip
    elif what == "cameras":  # the case's cameras, moved
        d, spec = cases.load("r03_softphong_directional_k8")
        r.cameras = sh.cameras = _cameras({**d, "cam_T": d["cam_T"] * 1.1}, spec, r.device)


@pytest.mark.parametrize("what", ["lights", "materials", "blend_params", "cameras"])
def test_an_object_replaced_after_the_capture_is_drawn(what):
    """A graph bakes in what the shader's objects held at its capture: replacing one
    (``shader.lights = ...``) after the render was captured draws with the new one,
    outside a tape and in a recorded step, as the launches one by one do (before,
    the replay kept drawing the old one: silently stale on CUDA, where graphs are
    the default)."""
    name = "r03_softphong_directional_k8"
    seen = []
    for graphs in (False, True):
        r, verts, params, target = _renderer(name, "cpu", graphs)
        for _ in range(3):  # launched, captured, replayed
            r.render(verts)
        _replace(what, r)
        plain = r.render(verts).image.numpy().copy()
        steps = _steps(r, verts, params[:1], target, "cpu", ["fused"] * 3)
        seen.append([plain] + [a for step in steps for a in step])
    launched, replayed = seen
    for i, (want, got) in enumerate(zip(launched, replayed, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"array {i}")
