"""The sensor's fused image loss (:func:`warpraster.sim.frame_loss`).

Truth: the unfused path, :func:`~warpraster.sim.image_loss` on the colour and the
depth channel, whose per-pixel backward is the analytic ``2 w (image - target)``
(checked in test_sim_sensor.py against finite differences). The fused loss must
give the same loss value and the same gradients in every simulation array, bit
for bit: it sums in the same order and adds ``(2 w dL) (image - target)`` to the
same upstream value the channel adjoint would have read. Also: graph replay
equals eager on the cpu device, and misuse raises before any launch.
"""

import numpy as np
import pytest
import warp as wp

import warpraster.sim as wsim

DEVICE = "cpu"


def box_and_sphere() -> wsim.SensorGeometry:
    """Two worlds, each a box and a sphere on body w (also test_sim_channels.py's)."""
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    sv, sf = wsim.sphere_mesh(0.12, segments=12, rings=8)
    for w in range(2):
        g.add_body_mesh(w, bv, bf, world=w, color=(0.8, 0.3, 0.2))
        g.add_body_mesh(w, sv + np.array([0.0, 0.0, 0.2], np.float32), sf, world=w,
                        color=(0.2, 0.4, 0.9))  # fmt: skip
    return g


def _scene(*, sigma: float, grad_channels, deterministic: bool = True, device=DEVICE):
    g = box_and_sphere()
    cams = [
        wsim.look_at_transform(e, (0.0, 0.0, 0.3)) for e in ((2.0, -2.5, 1.8), (-1.5, -1.0, 3.0))
    ]
    sensor = wsim.CameraSensor(
        g, world_count=2, camera_count=2, image_size=32, silhouette_sigma=sigma,
        smooth_normals=True, light_direction=(-0.577, 0.577, -0.577), device=device,
        requires_grad=True, material_grad=True, deterministic=deterministic,
        grad_channels=grad_channels,
    )  # fmt: skip
    bodies = [
        (0.05, -0.1, 0.35, 0.0, 0.0, 0.2588, 0.9659),
        (-0.1, 0.05, 0.3, 0.2, 0.0, 0.0, 0.9798),
    ]
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([[c] * 2 for c in cams], dtype=wp.transform, device=device,
                     requires_grad=True)  # fmt: skip
    fovs = wp.array([0.8, 0.7], dtype=wp.float32, device=device, requires_grad=True)
    frame = sensor.frames[0]
    rng = np.random.default_rng(5)
    tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=device)  # fmt: skip
    td = wp.array(rng.uniform(1, 4, frame.depth.shape).astype(np.float32), device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    grads = [loss, body_q.grad, cam_q.grad, fovs.grad, sensor.shape_colors.grad,
             sensor.light_direction.grad, sensor.light_intensity.grad]  # fmt: skip
    update = lambda: sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)  # noqa: E731
    return sensor, update, tc, td, loss, grads


def _step(fused: bool, *, sigma=1e-4, deterministic=True, device=DEVICE):
    sensor, update, tc, td, loss, grads = _scene(
        sigma=sigma, grad_channels=() if fused else ("color", "depth"),
        deterministic=deterministic, device=device)  # fmt: skip
    tape = wp.Tape()

    def step():
        tape.reset()
        loss.zero_()
        with tape:
            frame = update()
            if fused:
                wsim.frame_loss(sensor, 0, loss, color_target=tc, depth_target=td,
                                color_weight=1e-3, depth_weight=2e-3)  # fmt: skip
            else:
                wsim.image_loss(frame.color, tc, loss, weight=1e-3)
                wsim.image_loss(frame.depth, td, loss, weight=2e-3)
        tape.backward(loss)

    return step, grads


@pytest.mark.parametrize("sigma", [0.0, 1e-4], ids=["hard", "soft"])
def test_fused_loss_equals_image_loss_bit_for_bit(sigma):
    """Loss and every gradient (bodies, cameras, fields of view, materials) equal the
    two image_loss calls' bit for bit, hard and soft silhouette."""
    step_ref, ref = _step(False, sigma=sigma)
    step_ref()
    step_f, got = _step(True, sigma=sigma)
    step_f()
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert a.numpy().tobytes() == b.numpy().tobytes(), f"array {i} differs"
    assert np.abs(ref[1].numpy()).max() > 0.0  # a real body gradient


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_fused_loss_graph_replay_equals_eager(device):
    """Eager steps and replays of a captured step give the same bits (on CUDA too,
    where float atomics anywhere in the step would make the last bits vary)."""
    if device.startswith("cuda") and not wp.is_cuda_available():
        pytest.skip("needs a CUDA device")
    step, grads = _step(True, sigma=1e-4, device=device)
    step()
    step()
    want = [a.numpy().tobytes() for a in grads]
    step()
    assert [a.numpy().tobytes() for a in grads] == want, "second eager step"
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for _ in range(2):
        wp.capture_launch(cap.graph)
        assert [a.numpy().tobytes() for a in grads] == want, "graph replay"


def test_fused_loss_with_generated_backward_falls_back_to_image_loss():
    """deterministic=False: frame_loss is image_loss per term (same loss value)."""
    step_ref, ref = _step(False, sigma=0.0, deterministic=False)
    step_ref()
    sensor, update, tc, td, loss, _ = _scene(sigma=0.0, grad_channels=("color", "depth"),
                                            deterministic=False)  # fmt: skip
    update()
    wsim.frame_loss(sensor, 0, loss, color_target=tc, depth_target=td, color_weight=1e-3,
                    depth_weight=2e-3)  # fmt: skip
    assert loss.numpy().tobytes() == ref[0].numpy().tobytes()


def test_fused_loss_misuse_raises():
    sensor, update, tc, td, loss, _ = _scene(sigma=0.0, grad_channels=())
    with pytest.raises(ValueError, match="color_target"):
        wsim.frame_loss(sensor, 0, loss, color_target=td)
    with pytest.raises(ValueError, match="give color_target"):
        wsim.frame_loss(sensor, 0, loss)
    with pytest.raises(ValueError, match="frame"):
        wsim.frame_loss(sensor, 3, loss, depth_target=td)
    with pytest.raises(TypeError, match="sensor"):
        wsim.frame_loss(object(), 0, loss, depth_target=td)
    update()  # rendered outside the tape
    with wp.Tape(), pytest.raises(ValueError, match="not recorded on the active tape"):
        wsim.frame_loss(sensor, 0, loss, depth_target=td)
    with wp.Tape():
        update()
        wsim.frame_loss(sensor, 0, loss, depth_target=td)
        with pytest.raises(ValueError, match="already recorded"):
            wsim.frame_loss(sensor, 0, loss, color_target=tc)
