"""Determinism of the simulation sensor's step (simulate, render, loss, backward).

* On CUDA (``cuda:0``; skipped without one): two eager steps and two replays of a
  captured graph give the same loss and the same bits in every gradient array
  (float atomics would make the last bits vary with thread timing).
* On every device: the deterministic backward (hand-written, fixed-order sums)
  gives the gradients of the generated-adjoint path (Warp's adjoints, the
  rasterizer's atomic backward) to float rounding.

The CUDA tests need only warp-lang and this package (no usd-core); the Newton
one also needs ``newton`` and skips without it.

    python -m pytest -q tests/test_sim_determinism.py     # on a machine with a GPU
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

import warpraster.sim as wsim
from warpraster.sim.adjoint import SensorBackward

ROOT = Path(__file__).resolve().parents[1]
#: The device of the bit-equality tests: cuda:0 (WARPRASTER_DETERMINISM_DEVICE=cpu runs
#: their mechanics on the cpu, where they pass trivially: cpu kernels run serially).
CUDA = os.environ.get("WARPRASTER_DETERMINISM_DEVICE", "cuda:0")
needs_cuda = pytest.mark.skipif(
    CUDA.startswith("cuda") and not wp.is_cuda_available(),
    reason="GPU nondeterminism needs a CUDA device (cpu kernels run serially, so the cpu "
    "cannot show it)",
)


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bits(arrays) -> list[bytes]:
    """Raw bytes of each array (NaN-safe, bit-exact comparison)."""
    return [a.numpy().tobytes() for a in arrays]


def _assert_same_bits(name_arrays, reference, label):
    for (name, _), want, got in zip(name_arrays, reference, _bits(a for _, a in name_arrays),
                                    strict=True):  # fmt: skip
        assert want == got, f"{label}: {name} differs in its bits"


def _run_eager_and_replayed(step, arrays, device):
    """Two eager steps and two graph replays; every array's bits must agree."""
    step()  # first step: modules load, scratch is allocated
    step()
    wp.synchronize_device(device)
    reference = _bits(a for _, a in arrays)
    step()
    wp.synchronize_device(device)
    _assert_same_bits(arrays, reference, "second eager step")
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for i in range(2):
        wp.capture_launch(cap.graph)
        wp.synchronize_device(device)
        _assert_same_bits(arrays, reference, f"graph replay {i}")
    return reference


# ----------------------------------------------------------------------------- scenes
def _body_scene(device, *, worlds=4, cameras=2, size=48, sigma=1e-4, smooth=True,
                deterministic=True, big=None):  # fmt: skip
    """Posed boxes (one per world) over a shared ground, gradients to bodies, cameras,
    fields of view and materials."""
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    sv, sf = wsim.sphere_mesh(0.12, segments=12, rings=8)
    for w in range(worlds):
        g.add_body_mesh(w, bv, bf, world=w, color=(0.8, 0.3, 0.2))
        g.add_body_mesh(w, sv + np.array([0.0, 0.0, 0.2], np.float32), sf, world=w,
                        color=(0.2, 0.4, 0.9))  # fmt: skip
    pv, pf = wsim.plane_mesh(1.5, 1.5)
    g.add_static_mesh(pv, pf, world=-1, color=(0.2, 0.5, 0.3))
    rng = np.random.default_rng(3)
    bodies = []
    for _ in range(worlds):
        axis = wp.normalize(wp.vec3(*rng.normal(size=3)))
        q = wp.quat_from_axis_angle(axis, float(rng.uniform(0.0, 1.0)))
        bodies.append((*rng.uniform(-0.2, 0.2, 2), 0.35, *q))
    eyes = [(2.0, -2.5, 1.8), (-1.5, -1.0, 3.0), (1.0, 2.0, 2.0)]
    cams = [wsim.look_at_transform(eyes[c % 3], (0.0, 0.0, 0.3)) for c in range(cameras)]
    sensor = wsim.CameraSensor(
        g, world_count=worlds, camera_count=cameras, image_size=size, silhouette_sigma=sigma,
        smooth_normals=smooth, light_direction=(-0.577, 0.577, -0.577), device=device,
        requires_grad=True, material_grad=True, deterministic=deterministic,
    )  # fmt: skip
    if big is not None:  # (big_area, big_capacity) of the face walk
        sensor.backward = SensorBackward(sensor, big_area=big[0], big_capacity=big[1])
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([[c] * worlds for c in cams], dtype=wp.transform, device=device,
                     requires_grad=True)  # fmt: skip
    fovs = wp.array([0.8] * cameras, dtype=wp.float32, device=device, requires_grad=True)
    frame = sensor.frames[0]
    targets = {
        "color": wp.full(frame.color.shape, wp.vec3(0.3, 0.2, 0.1), dtype=wp.vec3, device=device),
        "normal": wp.full(
            frame.normal.shape, wp.vec3(0.0, 0.0, 1.0), dtype=wp.vec3, device=device
        ),  # fmt: skip
        "albedo": wp.full(frame.albedo.shape, wp.vec3(0.5), dtype=wp.vec3, device=device),
        "depth": wp.full(frame.depth.shape, 2.0, dtype=float, device=device),
        "forward_depth": wp.full(frame.depth.shape, 2.0, dtype=float, device=device),
        "alpha": wp.full(frame.alpha.shape, 0.5, dtype=float, device=device),
    }
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()

    def step():
        tape.reset()
        loss.zero_()
        with tape:
            out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
            for name, target in targets.items():
                wsim.image_loss(getattr(out, name), target, loss, weight=1e-3)
        tape.backward(loss)

    step.sensor = sensor
    step.update = lambda: sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
    grads = [
        ("loss", loss), ("body_q.grad", body_q.grad), ("camera.grad", cam_q.grad),
        ("fov.grad", fovs.grad), ("shape_colors.grad", sensor.shape_colors.grad),
        ("light_direction.grad", sensor.light_direction.grad),
        ("light_intensity.grad", sensor.light_intensity.grad),
    ]  # fmt: skip
    outputs = [(name, getattr(frame, name)) for name in targets]
    outputs += [(name + ".grad", getattr(frame, name).grad) for name in targets]
    return step, grads, outputs


# ----------------------------------------------------------------------------- CUDA
@needs_cuda
def test_cloth_wind_step_is_bit_identical_eager_and_replayed_on_cuda():
    """The pure-Warp example's whole step (12 substeps of mass-spring cloth, two
    frames from two cameras with soft silhouettes and smooth normals, image loss,
    backward): the loss, the wind gradient, every state's and force's gradient and
    the rendered frames agree bit for bit over eager steps and graph replays."""
    ex = _load_example("sim_cloth_wind")
    sim = ex.ClothWind(n=6, steps=12, render_every=6, image_size=48, device=CUDA)
    sim.make_targets([1.5, 3.0, 0.0])
    sim.set_wind([0.4, 0.9, 0.1])
    arrays = [("loss", sim.loss), ("wind.grad", sim.wind.grad)]
    for t in range(sim.steps + 1):
        arrays += [(f"q[{t}].grad", sim.q[t].grad), (f"qd[{t}].grad", sim.qd[t].grad)]
    for t in range(sim.steps):
        arrays += [(f"f[{t}].grad", sim.f[t].grad), (f"q[{t + 1}]", sim.q[t + 1])]
    for k, frame in enumerate(sim.sensor.frames):
        arrays += [(f"frame{k}.color", frame.color), (f"frame{k}.color.grad", frame.color.grad),
                   (f"frame{k}.points.grad", frame.points.grad)]  # fmt: skip
    ref = _run_eager_and_replayed(sim.step, arrays, CUDA)
    assert np.abs(np.frombuffer(ref[1], np.float32)).max() > 0.0  # a real gradient


@needs_cuda
def test_sensor_step_is_bit_identical_eager_and_replayed_on_cuda():
    """Bodies, cameras, fields of view and materials, every float channel in the loss,
    soft silhouette and smooth normals, 4 worlds x 2 cameras: every gradient and
    every channel bit for bit over eager steps and graph replays."""
    step, grads, outputs = _body_scene(CUDA)
    ref = _run_eager_and_replayed(step, grads + outputs, CUDA)
    for name, bits in zip([n for n, _ in grads], ref, strict=False):
        assert np.abs(np.frombuffer(bits, np.float32)).max() > 0.0, name


@needs_cuda
def test_newton_cloth_render_backward_is_bit_identical_on_cuda():
    """Newton's cloth state rendered by NewtonCameraSensor, depth loss, backward to the
    state's particles: bit for bit over eager steps and replays. (Newton's solver
    kernels add forces with atomics: the rollout itself is Newton's business and is
    not part of this check.)"""
    pytest.importorskip("newton")
    ex = _load_example("sim_newton_cloth")
    sim = ex.NewtonClothThrow(n=4, steps=12, render_every=6, image_size=48, device=CUDA)
    sim.make_targets([0.0, 1.5, 2.0])
    state = sim.states[-1]
    frame_k = sim.frames - 1
    tape = wp.Tape()
    target = wp.zeros_like(sim.camera.frames[frame_k].depth, requires_grad=False)
    loss = wp.zeros(1, dtype=float, device=CUDA, requires_grad=True)

    def step():
        tape.reset()
        loss.zero_()
        with tape:
            frame = sim.camera.update(state, sim.cameras, sim.fovs, frame=frame_k)
            wsim.image_loss(frame.depth, target, loss, weight=1e-3)
        tape.backward(loss)

    arrays = [("loss", loss), ("particle_q.grad", state.particle_q.grad),
              ("depth.grad", sim.camera.frames[frame_k].depth.grad)]  # fmt: skip
    ref = _run_eager_and_replayed(step, arrays, CUDA)
    assert np.abs(np.frombuffer(ref[1], np.float32)).max() > 0.0


# ----------------------------------------------------------------------------- every device
@pytest.mark.parametrize(
    "sigma, smooth, big",
    [(0.0, False, None), (1e-4, True, None), (1e-4, True, (8, 5))],
    ids=["sharp", "soft-smooth", "soft-smooth-strips"],
)
def test_deterministic_backward_matches_the_generated_adjoints(device, sigma, smooth, big):
    """Same scene, same loss (every float channel): the deterministic backward and the
    generated-adjoint path give the same gradients of bodies, cameras, fields of
    view, colours and light, to float rounding; the same images (non-square, so the
    face walk's and the projection's aspect handling is covered). ``big``: faces
    of more than 8 pixels go to the strided walk, at most 5 of them (the rest
    overflow to the one-thread walk), so all three face paths are exercised."""
    results = []
    for det in (True, False):
        step, grads, outputs = _body_scene(device, worlds=2, size=(28, 40), sigma=sigma,
                                           smooth=smooth, deterministic=det,
                                           big=big if det else None)  # fmt: skip
        step()
        results.append({name: a.numpy().astype(np.float64) for name, a in grads + outputs})
    det, gen = results
    for name in det:
        if name.endswith(".grad") and not name.startswith(("body", "camera", "fov", "shape",
                                                           "light")):  # fmt: skip
            continue  # upstream (loss) gradients: the same kernel in both
        a, b = det[name], gen[name]
        scale = np.abs(b).max()
        assert scale > 0.0, name
        # Both sum the same per-pixel terms (float32) in different orders (and the
        # generated path recomputes some products in another order): measured
        # differences <= 3e-7 of each array's largest entry on the cpu, 1.1e-5 on
        # an H200 (where the generated path's float atomics add ~1,000 terms per
        # body or camera in a varying order). 1e-4 leaves room for that yet is far
        # below one pixel's share (a pixel lost or counted twice moves a gradient
        # by ~1e-3 of its size in these 32-pixel images).
        np.testing.assert_allclose(a, b, rtol=0.0, atol=1e-4 * scale, err_msg=name)


@pytest.mark.skipif("cpu" not in DEVICES, reason="builds its arrays on the cpu device")
def test_a_frame_slot_recorded_twice_or_rendered_again_raises():
    """The deterministic backward reads the slot's buffers when the tape runs: a
    second update into a slot still on the tape, or a backward after the slot
    rendered again, raises instead of differentiating the wrong frame."""
    step, grads, outputs = _body_scene("cpu", worlds=1, size=16, sigma=0.0, smooth=False)
    sensor, update = step.sensor, step.update
    tape = wp.Tape()
    with tape:
        update()
        with pytest.raises(ValueError, match="already recorded"):
            update()
    update()  # no tape: renders the slot again
    with pytest.raises(ValueError, match="rendered again"):
        tape.backward(grads=sensor_grads(sensor))
    tape.reset()
    with tape:
        update()  # after reset: the slot may be recorded again
    tape.backward(grads=sensor_grads(sensor))


def sensor_grads(sensor):
    frame = sensor.frames[0]
    frame.depth.grad.fill_(1.0)
    return {frame.depth: frame.depth.grad}
