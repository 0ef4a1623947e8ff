"""A repeated eager :meth:`CameraSensor.update` replayed as captured graphs
(:mod:`warpraster.sim.replay`), forced on the cpu device (``call_graphs=True``).

Truth: the same sensor with ``call_graphs=False`` (every launch eager). The replay
runs the same kernels on the same arrays, so outputs and gradients must be equal bit
for bit (no tolerance anywhere here). Also: the graphs are really used (captured on
the second call with a key, replayed after), a new input array object falls back to
an eager call (then a fresh capture) and stays right, and a step after the first few
allocates nothing and reads nothing back.
"""

import numpy as np
import pytest
import warp as wp
from host_counts import count_allocations_and_reads

import warpraster.sim as wsim

DEVICE = "cpu"


@wp.kernel
def _sgd_bodies(q: wp.array(dtype=wp.transform), g: wp.array(dtype=wp.transform), lr: float):
    i = wp.tid()
    p = wp.transform_get_translation(q[i]) - lr * wp.transform_get_translation(g[i])
    q[i] = wp.transform(p, wp.transform_get_rotation(q[i]))


@wp.kernel
def _sgd_floats(x: wp.array(dtype=float), g: wp.array(dtype=float), lr: float):
    i = wp.tid()
    x[i] = x[i] - lr * g[i]


@wp.kernel
def _sgd_vec3(x: wp.array(dtype=wp.vec3), g: wp.array(dtype=wp.vec3), lr: float):
    i = wp.tid()
    x[i] = x[i] - lr * g[i]


def _scene(call_graphs, *, deterministic=True, sigma=0.0, antialias=False, grad_channels=None):
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    sv, sf = wsim.sphere_mesh(0.12, segments=12, rings=8)
    for w in range(2):
        g.add_body_mesh(w, bv, bf, world=w, color=(0.8, 0.3, 0.2))
    g.add_particle_mesh(np.arange(sv.shape[0]), sf, world=0, color=(0.2, 0.4, 0.9))
    cams = [
        wsim.look_at_transform(e, (0.0, 0.0, 0.3)) for e in ((2.0, -2.5, 1.8), (-1.5, -1.0, 3.0))
    ]
    sensor = wsim.CameraSensor(
        g, world_count=2, camera_count=2, image_size=24, silhouette_sigma=sigma,
        antialias=antialias, smooth_normals=True, light_direction=(-0.577, 0.577, -0.577),
        device=DEVICE, requires_grad=True, material_grad=True, deterministic=deterministic,
        grad_channels=grad_channels,
    )  # fmt: skip
    sensor.call_graphs = call_graphs
    bodies = [
        (0.05, -0.1, 0.35, 0.0, 0.0, 0.2588, 0.9659),
        (-0.1, 0.05, 0.3, 0.2, 0.0, 0.0, 0.9798),
    ]
    arrays = dict(
        body_q=wp.array(bodies, dtype=wp.transform, device=DEVICE, requires_grad=True),
        particle_q=wp.array(sv + np.array([0.0, 0.0, 0.2], np.float32), dtype=wp.vec3,
                            device=DEVICE, requires_grad=True),
        camera_transforms=wp.array([[c] * 2 for c in cams], dtype=wp.transform, device=DEVICE,
                                   requires_grad=True),
        camera_fovs=wp.array([0.8, 0.7], dtype=wp.float32, device=DEVICE, requires_grad=True),
    )  # fmt: skip
    frame = sensor.frames[0]
    rng = np.random.default_rng(5)
    tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=DEVICE)  # fmt: skip
    td = wp.array(rng.uniform(1, 4, frame.depth.shape).astype(np.float32), device=DEVICE)
    loss = wp.zeros(1, dtype=float, device=DEVICE, requires_grad=True)
    return sensor, arrays, tc, td, loss


def _snapshot(sensor, arrays, loss) -> list[np.ndarray]:
    frame = sensor.frames[0]
    out = [np.array(getattr(frame, name).numpy()) for name in frame.CHANNELS]
    out += [np.array(loss.numpy())]
    out += [np.array(a.grad.numpy()) for a in arrays.values()]
    out += [np.array(a.grad.numpy()) for a in (sensor.shape_colors, sensor.light_direction,
                                                sensor.light_intensity)]  # fmt: skip
    return out


def _train(call_graphs, loss_kind, *, steps=4, counts=None, monkeypatch=None, **kw):
    """``steps`` of a fresh-tape loop (update, loss, backward, SGD, zero); a snapshot
    per step. ``counts``: a dict filled with the last step's allocations and reads."""
    sensor, arrays, tc, td, loss = _scene(call_graphs, **kw)
    shots = []

    def step():
        tape = wp.Tape()
        with tape:
            frame = sensor.update(**arrays)
            if loss_kind == "frame_loss":
                wsim.frame_loss(sensor, 0, loss, color_target=tc, depth_target=td,
                                color_weight=1e-3, depth_weight=2e-3)  # fmt: skip
            else:
                wsim.image_loss(frame.color, tc, loss, weight=1e-3)
                wsim.image_loss(frame.depth, td, loss, weight=2e-3)
        tape.backward(loss)
        return tape

    for i in range(steps):
        if counts is not None and i == steps - 1:
            with count_allocations_and_reads(monkeypatch) as calls:
                tape = step()
            counts.update(calls)
        else:
            tape = step()
        shots.append(_snapshot(sensor, arrays, loss))
        lr = 0.05
        wp.launch(_sgd_bodies, dim=2, inputs=[arrays["body_q"], arrays["body_q"].grad, lr],
                  device=DEVICE)  # fmt: skip
        pq = arrays["particle_q"]
        wp.launch(_sgd_vec3, dim=pq.shape[0], inputs=[pq, pq.grad, lr], device=DEVICE)
        wp.launch(_sgd_floats, dim=2, inputs=[arrays["camera_fovs"], arrays["camera_fovs"].grad,
                  0.01], device=DEVICE)  # fmt: skip
        tape.zero()
        loss.zero_()
    return sensor, shots


CASES = {
    "det-frame_loss-soft": dict(loss_kind="frame_loss", sigma=1e-4),
    "det-image_loss-hard": dict(loss_kind="image_loss"),
    "det-image_loss-antialias": dict(loss_kind="image_loss", antialias=True),
    "det-frame_loss-antialias": dict(loss_kind="frame_loss", antialias=True),
    "generated-image_loss": dict(loss_kind="image_loss", deterministic=False),
    "generated-antialias": dict(loss_kind="image_loss", deterministic=False, antialias=True),
}


def _assert_equal(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        np.testing.assert_array_equal(x, y, err_msg=f"array {i}")


@pytest.mark.parametrize("case", list(CASES))
def test_training_loop_replayed_equals_eager(case):
    kw = dict(CASES[case])
    loss_kind = kw.pop("loss_kind")
    sensor, replayed = _train(True, loss_kind, **kw)
    _, eager = _train(False, loss_kind, **kw)
    for r, e in zip(replayed, eager, strict=True):
        _assert_equal(r, e)
    # the gradients are not trivially zero, and the loop changed the inputs
    assert any(np.any(g != 0) for g in replayed[-1][-7:])
    assert not np.array_equal(replayed[0][0], replayed[-1][0])
    rep = sensor._replay
    if kw.get("deterministic", True):
        assert rep._forward[0][1]._graph is not None  # the recorded forward is replayed
        assert rep._backward[0]._graph is not None  # and the hand-written backward
    else:
        assert rep.recorded[0].captured_tape() is not None


def test_unrecorded_updates_replayed_and_new_array_falls_back():
    sensor, arrays, *_ = _scene(True)
    ref, ref_arrays, *_ = _scene(False)

    def both(new=None):
        """An update of both sensors (``new``: their particle arrays instead)."""
        outs = []
        for j, (s, a) in enumerate(((sensor, arrays), (ref, ref_arrays))):
            s.update(**{**a, **({} if new is None else {"particle_q": new[j]})})
            outs.append([np.array(getattr(s.frames[0], n).numpy()) for n in s.frames[0].CHANNELS])
        _assert_equal(*outs)
        return outs[0]

    first = both()
    for i in range(4):  # new values in the same arrays: seen by the replay
        for a in (arrays, ref_arrays):
            a["camera_fovs"].assign([0.8 + 0.02 * i, 0.7])
        both()
    graph = sensor._replay._forward[0][0]._graph
    assert graph is not None
    # a new array object (another address) with other values: launched eagerly, right
    moved = arrays["particle_q"].numpy() + np.array([0.05, 0.0, 0.0], np.float32)
    new_q = wp.array(moved, dtype=wp.vec3, device=DEVICE)
    new_ref = wp.array(moved, dtype=wp.vec3, device=DEVICE)
    changed = both((new_q, new_ref))
    assert sensor._replay._forward[0][0]._graph is None
    assert not np.array_equal(changed[0], first[0])
    both((new_q, new_ref))  # captured
    assert sensor._replay._forward[0][0]._graph is not None
    both()  # back to the first array
    both()


def test_new_gradient_target_array_falls_back():
    """A fused loss with a new target array each step: the backward's key changes, so
    it launches eagerly; results stay the eager ones."""
    results = []
    for mode in (True, False):
        sensor, arrays, tc, td, loss = _scene(mode)
        shots = []
        for i in range(3):
            target = wp.array(td.numpy() + 0.1 * i, dtype=float, device=DEVICE)
            tape = wp.Tape()
            with tape:
                sensor.update(**arrays)
                wsim.frame_loss(sensor, 0, loss, depth_target=target)
            tape.backward(loss)
            shots.append(_snapshot(sensor, arrays, loss))
            tape.zero()
            loss.zero_()
        results.append(shots)
    for r, e in zip(*results, strict=True):
        _assert_equal(r, e)


@pytest.mark.parametrize("case", ["det-frame_loss-soft", "det-image_loss-antialias",
                                  "generated-image_loss"])  # fmt: skip
def test_no_allocation_after_the_first_steps(case, monkeypatch):
    kw = dict(CASES[case])
    loss_kind = kw.pop("loss_kind")
    counts = {}
    _train(True, loss_kind, steps=4, counts=counts, monkeypatch=monkeypatch, **kw)
    assert counts == {"alloc": 0, "numpy": 0}


def test_user_capture_launches_as_usual():
    """Inside a graph the caller captures, the update launches as it always did (no
    nested capture): the caller's graph replays it right."""
    sensor, arrays, *_ = _scene(True)
    ref, ref_arrays, *_ = _scene(False)
    for _ in range(3):
        sensor.update(**arrays)
    with wp.ScopedCapture(device=DEVICE, force_module_load=False) as cap:
        sensor.update(**arrays)
    for a in (arrays, ref_arrays):
        a["camera_fovs"].assign([0.9, 0.6])
    wp.capture_launch(cap.graph)
    ref.update(**ref_arrays)
    for n in sensor.frames[0].CHANNELS:
        np.testing.assert_array_equal(getattr(sensor.frames[0], n).numpy(),
                                      getattr(ref.frames[0], n).numpy())  # fmt: skip


_REBOUND = [
    ("near_clip", 0.5),
    ("silhouette_sigma", 1e-3),
    ("deterministic", False),
    ("bin_size", 8),
    ("light_direction", None),
    ("shape_colors", None),
]


@pytest.mark.parametrize("name,value", _REBOUND)
def test_options_cannot_be_rebound_after_construction(name, value):
    """What the sensor is built for (buffers, kernels, structs, captured graphs) is
    fixed: rebinding an option raised nothing before, and a replayed update kept the
    old value while an eager one read the new (``near_clip``), or neither saw it
    (a rebound array). It raises now, naming it; values assigned into the arrays
    are seen by replayed updates as by eager ones."""
    sensor, arrays, *_ = _scene(True)
    ref, ref_arrays, *_ = _scene(False)
    with pytest.raises(AttributeError, match=f"CameraSensor.{name} is fixed at construction"):
        setattr(sensor, name, value)
    sensor.call_graphs = True  # the replay switch stays settable
    for i in range(4):  # launched, captured, replayed, replayed
        for s, a in ((sensor, arrays), (ref, ref_arrays)):
            s.light_direction.assign([(-0.5 + 0.1 * i, 0.6, -0.6)])
            s.update(**a)
        _assert_equal(*[[np.array(getattr(s.frames[0], n).numpy()) for n in s.frames[0].CHANNELS]
                        for s in (sensor, ref)])  # fmt: skip
    assert sensor._replay._forward[0][0]._graph is not None
