"""The sensor's ``channels``: which image channels an update writes.

Truth: the same sensor writing all seven channels. A sensor writing a subset must
give those channels, and the gradients of a loss on them, bit for bit (the channel
kernel variant only leaves the other stores out: the same arithmetic, and the
backward reads only the channels' gradients), over several training steps with a
fresh tape each; the channels it does not write are empty arrays, and misuse
raises before any launch, naming the argument.
"""

import numpy as np
import pytest
import warp as wp
from test_sim_frame_loss import box_and_sphere

import warpraster.sim as wsim

DEVICE = "cpu"


def _scene(channels, *, sigma=0.0, deterministic=True, antialias=False, grad_channels=None):
    return wsim.CameraSensor(
        box_and_sphere(), world_count=2, camera_count=2, image_size=(24, 32),
        silhouette_sigma=sigma,
        light_direction=(-0.577, 0.577, -0.577), device=DEVICE, requires_grad=True,
        deterministic=deterministic, antialias=antialias, channels=channels,
        grad_channels=("color", "depth") if grad_channels is None else grad_channels,
    )  # fmt: skip


def _train(sensor, steps=3):
    """Three gradient-descent steps on the body poses, a fresh tape each (no
    ``tape.zero()``); returns every step's colour, depth and gradients."""
    eyes = ((2.0, -2.5, 1.8), (-1.5, -1.0, 3.0))
    cams = [wsim.look_at_transform(e, (0.0, 0.0, 0.3)) for e in eyes]
    cam_q = wp.array([[c] * 2 for c in cams], dtype=wp.transform, device=DEVICE,
                     requires_grad=True)  # fmt: skip
    fovs = wp.array([0.8, 0.7], dtype=wp.float32, device=DEVICE, requires_grad=True)
    body_q = wp.array([(0.05, -0.1, 0.35, 0.0, 0.0, 0.2588, 0.9659),
                       (-0.1, 0.05, 0.3, 0.2, 0.0, 0.0, 0.9798)],
                      dtype=wp.transform, device=DEVICE, requires_grad=True)  # fmt: skip
    frame = sensor.frames[0]
    rng = np.random.default_rng(3)
    tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=DEVICE)  # fmt: skip
    td = wp.array(rng.uniform(1, 4, frame.depth.shape).astype(np.float32), device=DEVICE)
    out = []
    for _ in range(steps):
        # the loop users write: a fresh tape, the caller's own inputs' gradients
        # cleared (the sensor clears its buffers itself: no tape.zero())
        for a in (body_q, cam_q, fovs):
            a.grad.zero_()
        loss = wp.zeros(1, dtype=float, device=DEVICE, requires_grad=True)
        tape = wp.Tape()
        with tape:
            f = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
            wsim.image_loss(f.color, tc, loss, weight=1e-3)
            wsim.image_loss(f.depth, td, loss, weight=2e-3)
        tape.backward(loss)
        out.append([f.color.numpy().copy(), f.depth.numpy().copy(), loss.numpy().copy(),
                    body_q.grad.numpy().copy(), cam_q.grad.numpy().copy(),
                    fovs.grad.numpy().copy()])  # fmt: skip
        q = body_q.numpy()
        q[:, :3] -= 0.05 * body_q.grad.numpy()[:, :3]
        body_q.assign(q)
    return out


@pytest.mark.parametrize(("sigma", "deterministic"), [(0.0, True), (1e-4, False)],
                         ids=["hard-deterministic", "soft-generated"])  # fmt: skip
def test_colour_and_depth_alone_equal_all_channels(sigma, deterministic):
    full = _scene(None, sigma=sigma, deterministic=deterministic)
    part = _scene(("depth", "color"), sigma=sigma, deterministic=deterministic)
    assert part.channels == ("color", "depth")  # in SensorFrame.CHANNELS order
    a, b = _train(full), _train(part)
    for step_a, step_b in zip(a, b, strict=True):
        # the same float32 operations in the same order on the cpu device: bit for bit
        for x, y in zip(step_a, step_b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert np.abs(a[0][3]).max() > 0.0  # the poses got a gradient
    assert not np.array_equal(a[0][0], a[-1][0])  # and the steps moved the image
    frame = part.frames[0]
    for name in ("albedo", "normal", "forward_depth", "alpha", "shape_index"):
        assert getattr(frame, name).shape == (2, 2, 0, 0), name
    assert tuple(frame.numpy()) == ("color", "depth")
    with pytest.raises(AttributeError, match="channels"):  # its kernels are built for them
        part.channels = ("color",)
    assert set(full.frames[0].numpy()) == set(wsim.SensorFrame.CHANNELS)


def test_shape_index_alone():
    """An integer channel alone: the one channel written, equal to the full sensor's."""
    full, part = _scene(None), _scene(["shape_index"], grad_channels=())
    assert part.grad_channels == frozenset()
    cams = [wsim.look_at_transform((2.0, -2.5, 1.8), (0.0, 0.0, 0.3))] * 2
    cam_q = wp.array([[c] * 2 for c in cams], dtype=wp.transform, device=DEVICE)
    fovs = wp.array([0.8, 0.7], dtype=wp.float32, device=DEVICE)
    body_q = wp.array([(0.0, 0.0, 0.35, 0.0, 0.0, 0.0, 1.0)] * 2, dtype=wp.transform,
                      device=DEVICE)  # fmt: skip
    got = [s.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q).numpy()
           for s in (full, part)]  # fmt: skip
    assert tuple(got[1]) == ("shape_index",)
    np.testing.assert_array_equal(got[1]["shape_index"], got[0]["shape_index"])
    assert (got[0]["shape_index"] != 0xFFFFFFFF).any()  # some pixels covered


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"channels": "color"}, TypeError, "channels"),
        ({"channels": ["colour"]}, ValueError, "channels"),
        ({"channels": []}, ValueError, "channels"),
        ({"channels": ["color"], "grad_channels": ["depth"]}, ValueError, "grad_channels"),
        ({"channels": None, "grad_channels": ["shape_index"]}, ValueError, "grad_channels"),
        ({"channels": ["depth"], "antialias": True, "grad_channels": ()}, ValueError,
         "antialias"),
    ],
)  # fmt: skip
def test_bad_channels_raise(kwargs, error, match):
    channels = kwargs.pop("channels")
    with pytest.raises(error, match=match):
        _scene(channels, **kwargs)


def test_frame_loss_on_a_channel_not_written_raises():
    sensor = _scene(["color"], grad_channels=("color",))
    frame = sensor.frames[0]
    loss = wp.zeros(1, dtype=float, device=DEVICE)
    target = wp.zeros((2, 2, 24, 32), dtype=float, device=DEVICE)
    with pytest.raises(ValueError, match="depth_target"):
        wsim.frame_loss(sensor, 0, loss, depth_target=target)
    assert frame.depth.shape == (2, 2, 0, 0)
