"""CameraSensor(antialias=True): the sensor's hard colour antialiased (warpraster.Antialias).

Truth: the op itself on the sensor's own hard colour, fragments and projected
vertices (forward); central differences (gradients); the hard image (which has no
coverage gradient); repeated steps (determinism, the training loop); graph replay.
"""

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES
from host_counts import count_allocations_and_reads
from test_sim_sensor import _box_scene

import warpraster as wr
import warpraster.sim as wsim
from warpraster.antialiasing import edge_opposites

H, W = 24, 32
LIGHT = (-0.577, 0.577, -0.577)


def _setup(device, *, deterministic=True, antialias=True, ground=True, light=LIGHT, **kw):
    g, bodies, cams, _ = _box_scene(ground=ground)
    sensor = wsim.CameraSensor(g, world_count=2, camera_count=2, image_size=(H, W),
                               antialias=antialias, light_direction=light, device=device,
                               deterministic=deterministic, requires_grad=True,
                               **kw)  # fmt: skip
    for f in sensor.frames if antialias else ():
        f.antialias.op.store_pairs = True  # _decisions reads every call's pair codes
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([[c, c] for c in cams], dtype=wp.transform, device=device, requires_grad=True)
    fovs = wp.array([0.9, 0.7], dtype=wp.float32, device=device, requires_grad=True)
    return sensor, body_q, cam_q, fovs


def _flat(a: wp.array) -> wp.array:
    """A vec3 (world, camera, H, W) image copied as float32 (world camera, H, W, 3)."""
    host = a.numpy().reshape(-1, *a.shape[2:], 3)
    return wp.array(host, dtype=wp.float32, device=a.device)


def _decisions(sensor, frame=0) -> np.ndarray:
    """Every pixel's face and the antialias pass's discrete choices (each pair's edge,
    or none) of the last update, concatenated."""
    f = sensor.frames[frame]
    codes = f.antialias.op.pair_code.numpy()  # the op's own buffer (test access)
    return np.concatenate([f.workspace.fragments.pix_to_face.numpy().ravel(), codes.ravel()])


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_color_is_the_op_on_the_sensors_own_hard_colour(device, deterministic):
    sensor, body_q, cam_q, fovs = _setup(device, deterministic=deterministic)
    out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
    frags = out.workspace.fragments
    want = wr.antialias(_flat(out.hard_color), frags.pix_to_face, out.ndc, sensor.faces,
                        zbuf=frags.zbuf, deterministic=deterministic)  # fmt: skip
    got = out.color.numpy().reshape(want.shape)
    # bit for bit: the same kernels on the same inputs (the gather; the sparse
    # forward's atomics land in one order on the CPU)
    np.testing.assert_array_equal(got, want.numpy())
    # the hard colour is the plain sensor's colour, and the other channels are hard
    plain, *_ = _setup(device, deterministic=deterministic, antialias=False)
    ref = plain.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
    np.testing.assert_array_equal(out.hard_color.numpy(), ref.color.numpy())
    for name in ("albedo", "normal", "depth", "alpha", "shape_index"):
        np.testing.assert_array_equal(getattr(out, name).numpy(), getattr(ref, name).numpy())
    changed = np.any(got != out.hard_color.numpy().reshape(got.shape), axis=-1)
    assert changed.sum() > 20  # box silhouettes against the ground and the background
    # only where a pixel's face differs from a neighbour's
    faces = frags.pix_to_face.numpy()[..., 0]
    edge = np.zeros(faces.shape, bool)
    dx = faces[:, :, :-1] != faces[:, :, 1:]
    dy = faces[:, :-1] != faces[:, 1:]
    edge[:, :, :-1] |= dx
    edge[:, :, 1:] |= dx
    edge[:, :-1] |= dy
    edge[:, 1:] |= dy
    assert not (changed & ~edge).any()


# ----------------------------------------------------------------------------- gradients
class _Loss:
    """``L = weight * sum |color - target|^2`` of frame 0 (:func:`image_loss`), its tape
    gradient and its float64 value on the host."""

    WEIGHT = 1.0

    def __init__(self, sensor, body_q, cam_q, fovs, seed=3):
        self.sensor, self.body_q, self.cam_q, self.fovs = sensor, body_q, cam_q, fovs
        dev = sensor.device
        shape = sensor.frames[0].color.shape
        rng = np.random.default_rng(seed)
        self.target_host = rng.uniform(0, 1, (*shape, 3)).astype(np.float32)
        self.target = wp.array(self.target_host, dtype=wp.vec3, device=dev)
        self.loss = wp.zeros(1, dtype=float, device=dev, requires_grad=True)

    def render(self):
        return self.sensor.update(camera_transforms=self.cam_q, camera_fovs=self.fovs,
                                  body_q=self.body_q)  # fmt: skip

    def value(self) -> float:
        c = self.render().color.numpy().astype(np.float64)
        return self.WEIGHT * float(np.sum((c - self.target_host) ** 2))

    def gradients(self, arrays):
        for a in arrays:
            a.grad.zero_()
        self.loss.zero_()
        tape = wp.Tape()
        with tape:
            out = self.render()
            wsim.image_loss(out.color, self.target, self.loss, weight=self.WEIGHT)
        tape.backward(self.loss)
        return [a.grad.numpy().copy() for a in arrays]


def _central_difference(loss, arr, index, decisions0) -> float:
    """d L / d arr[index] by central differences at the first step h of 1e-4, 5e-5,
    2.5e-5, 1.25e-5 at which no pixel changes face and no pair its edge decision."""
    sensor = loss.sensor
    base = arr.numpy().copy()
    flat = base.view(np.float32).reshape(*arr.shape, -1)
    for h in (1e-4, 5e-5, 2.5e-5, 1.25e-5):
        values, steps, same = [], [], True
        for sign in (1.0, -1.0):
            moved = flat.copy()
            moved[index] = np.float32(flat[index] + sign * h)
            steps.append(float(moved[index]) - float(flat[index]))  # float32's own step
            arr.assign(moved.view(base.dtype).reshape(base.shape))
            values.append(loss.value())
            same &= bool((_decisions(sensor) == decisions0).all())
        arr.assign(base)
        if same:
            return (values[0] - values[1]) / (steps[0] - steps[1])
    raise AssertionError(f"{index}: a pixel or pair changes at every step tried")


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_body_position_gradients_match_central_differences(device, deterministic):
    sensor, body_q, cam_q, fovs = _setup(device, deterministic=deterministic)
    loss = _Loss(sensor, body_q, cam_q, fovs)
    (g_body,) = loss.gradients([body_q])
    g_body = g_body.view(np.float32).reshape(*body_q.shape, -1)
    decisions0 = _decisions(sensor)
    # Step: flat shading (a face's colour does not change as a box translates), so L
    # changes only through the blend, a smooth function of the vertices while no
    # pixel changes face and no pair its edge decision (checked at +-h): the central
    # difference's truncation error is O(h^2), negligible. h = 1e-4 m moves an edge
    # by ~1e-3 px (~10 px per metre at these depths); with a few hundred edge pixels
    # in view one may lie that close to a pixel centre, so h is halved (at most 3
    # times) until nothing changes. Rounding: the vertices and colours are float32,
    # so each blended pixel's colour carries ~1e-7 of noise; the few hundred of them
    # (the other pixels are bit-identical at +-h) leave ~1e-6 in L (measured: the
    # quotients scatter by ~0.02 at h = 2.5e-5), <= 0.04 after dividing by 2h >=
    # 2.5e-5. The derivatives are ~5-25: within 0.5% plus 0.1 (2.5x the rounding).
    for body in range(2):
        for axis in range(3):
            fd = _central_difference(loss, body_q, (body, axis), decisions0)
            analytic = float(g_body[body, axis])
            assert abs(fd) > 1.0, (body, axis, fd)  # the edges move the image
            assert abs(analytic - fd) <= 5e-3 * abs(fd) + 0.1, (body, axis, analytic, fd)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_only_the_antialiased_colour_has_coverage_gradients(device, deterministic):
    # ambient light only and flat normals: each face's colour is constant as the box
    # translates, so the hard image changes only where a pixel changes face, which
    # its fragments do not differentiate; the antialiased one blends across edges
    moved = {}
    for aa in (False, True):
        sensor, body_q, cam_q, fovs = _setup(device, deterministic=deterministic, antialias=aa,
                                             light=None)  # fmt: skip
        (g,) = _Loss(sensor, body_q, cam_q, fovs).gradients([body_q])
        moved[aa] = np.abs(g.view(np.float32).reshape(2, 7)[:, :3]).max()
    # zero but for rounding: the colour's derivative with respect to where a pixel
    # hits its face is exactly 0 here; float32 leaves ~7e-7 (measured) of the sum
    # over the covered pixels: 1e-4 is 100x that and 1e4 below the antialiased one
    assert moved[False] <= 1e-4
    # the box silhouettes move the colour: tens of edge pixels x ~10 px per metre x
    # colour steps ~0.3 x the loss's 2 (c - t): of order 10
    assert moved[True] > 1.0


def test_deterministic_gradients_are_bit_identical_over_steps(device):
    sensor, body_q, cam_q, fovs = _setup(device)
    loss = _Loss(sensor, body_q, cam_q, fovs)
    params = [body_q, cam_q, fovs]
    first = loss.gradients(params)
    assert np.abs(first[0]).max() > 0
    for _ in range(2):
        for a, b in zip(first, loss.gradients(params), strict=True):
            np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
@pytest.mark.parametrize("fused", [True, False], ids=["frame_loss", "image_loss"])
def test_training_loop_step_3_equals_step_1(device, deterministic, fused):
    """Fresh tape per step, only the parameters' gradients zeroed: step 3 equals step
    1 (the slot's gradient buffers, hard colour and NDC included, start from zero);
    frame_loss (its colour term unfused with antialias) gives image_loss's numbers."""
    sensor, body_q, cam_q, fovs = _setup(device, deterministic=deterministic,
                                         material_grad=True)  # fmt: skip
    params = [body_q, cam_q, fovs, sensor.shape_colors]
    frame = sensor.frames[0]
    rng = np.random.default_rng(5)
    tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=device)  # fmt: skip
    td = wp.array(rng.uniform(1, 4, frame.depth.shape).astype(np.float32), device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)

    def step(fused):
        for a in params:
            a.grad.zero_()
        loss.zero_()
        tape = wp.Tape()
        with tape:
            out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
            if fused:
                wsim.frame_loss(sensor, 0, loss, color_target=tc, depth_target=td,
                                color_weight=1e-3, depth_weight=2e-3)  # fmt: skip
            else:
                wsim.image_loss(out.color, tc, loss, weight=1e-3)
                wsim.image_loss(out.depth, td, loss, weight=2e-3)
        tape.backward(loss)
        return [loss.numpy().copy()] + [a.grad.numpy().copy() for a in params]

    seen = [step(fused) for _ in range(3)]
    for a, b in zip(seen[0], seen[2], strict=True):
        assert np.abs(a).max() > 0
        if wp.get_device(device).is_cpu or deterministic:
            np.testing.assert_array_equal(b, a)
        else:  # CUDA float atomics add in a varying order: a few ulps of the largest
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())
    if fused and (wp.get_device(device).is_cpu or deterministic):
        # the same sums in the same order as the two image_loss calls
        for a, b in zip(seen[0], step(False), strict=True):
            np.testing.assert_array_equal(b, a)


# ----------------------------------------------------------------------------- capture
@pytest.mark.skipif("cpu" not in DEVICES, reason="bit-exact replay and the allocator are cpu's")
def test_step_replays_from_a_graph_and_allocates_nothing(monkeypatch):
    device = "cpu"
    sensor, body_q, cam_q, fovs = _setup(device)
    loss = _Loss(sensor, body_q, cam_q, fovs)
    params = [body_q, cam_q, fovs]

    def step():
        for a in params:
            a.grad.zero_()
        loss.loss.zero_()
        tape = wp.Tape()
        with tape:
            out = loss.render()
            wsim.image_loss(out.color, loss.target, loss.loss, weight=loss.WEIGHT)
        tape.backward(loss.loss)

    def snapshot():
        return [sensor.frames[0].color.numpy().copy()] + [a.grad.numpy().copy() for a in params]

    b0 = body_q.numpy().copy()
    b1 = b0.copy()
    b1[0, :2] += (0.03, -0.02)
    eager = []
    for b in (b0, b1):
        body_q.assign(b)
        step()
        eager.append(snapshot())
    with count_allocations_and_reads(monkeypatch) as calls:
        step()
    assert calls == {"alloc": 0, "numpy": 0}
    with wp.ScopedCapture(device=device, force_module_load=False) as capture:
        step()
    for b, want in zip((b0, b1), eager, strict=True):
        body_q.assign(b)
        wp.capture_launch(capture.graph)
        for got, w in zip(snapshot(), want, strict=True):
            np.testing.assert_array_equal(got, w)


# ----------------------------------------------------------------------------- errors
def test_antialias_and_soft_outlines_are_refused_together():
    g, *_ = _box_scene()
    with pytest.raises(ValueError, match="silhouette_sigma"):
        wsim.CameraSensor(g, antialias=True, silhouette_sigma=1e-4, device=DEVICES[0])
    with pytest.raises(TypeError, match="antialias must be a bool"):
        wsim.CameraSensor(g, antialias=1, device=DEVICES[0])


def test_frame_loss_needs_the_colour_gradient_buffer_with_antialias():
    device = DEVICES[0]
    sensor, body_q, cam_q, fovs = _setup(device, grad_channels=("depth",))
    frame = sensor.frames[0]
    tc = wp.zeros(frame.color.shape, dtype=wp.vec3, device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    with wp.Tape():
        sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
        with pytest.raises(ValueError, match="grad_channels"):
            wsim.frame_loss(sensor, 0, loss, color_target=tc)


def test_faces_touching_vertices_behind_the_camera_stay_hard(device):
    """A ground grid that runs behind the camera: the faces the op reads are the
    sensor's, except that a face with a corner or an opposite vertex behind the camera
    (no meaningful projection) is degenerate; the colour is the op on those faces."""
    g = wsim.SensorGeometry()
    pv, pf = wsim.tessellate.grid_mesh(8, 8, 1.0, 1.0)
    g.add_static_mesh(pv, pf, world=-1, color=(0.2, 0.5, 0.3))
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    g.add_body_mesh(0, bv, bf, world=0, color=(0.8, 0.3, 0.2))
    sensor = wsim.CameraSensor(g, image_size=(H, W), antialias=True, light_direction=LIGHT,
                               device=device)  # fmt: skip
    cam = wsim.look_at_transform((4.0, 1.5, 0.6), (4.0, 6.0, 0.0))
    out = sensor.update(
        camera_transforms=wp.array([[cam]], dtype=wp.transform, device=device),
        camera_fovs=wp.array([1.2], dtype=wp.float32, device=device),
        body_q=wp.array([(4.0, 4.0, 0.3, 0.0, 0.0, 0.0, 1.0)], dtype=wp.transform,
                        device=device),
    )  # fmt: skip
    faces = sensor.faces.numpy()
    behind = out.ndc.numpy()[:, 2] < 1e-8  # the rasterizer's rule (geometry.EPS)
    opposite = edge_opposites(faces, out.ndc.shape[0])
    near = behind[faces].any(1) | (behind[np.maximum(opposite, 0)] & (opposite >= 0)).any(1)
    assert near.any() and near.sum() < len(faces)  # the grid runs behind the camera
    want = np.where(near[:, None], faces[:, :1], faces)
    np.testing.assert_array_equal(out.antialias.faces.numpy(), want)
    frags = out.workspace.fragments
    # deterministic: the sensor's default (the gather, bit for bit on every device)
    ref = wr.antialias(_flat(out.hard_color), frags.pix_to_face, out.ndc,
                       wp.array(want, dtype=wp.int32, device=device), zbuf=frags.zbuf,
                       deterministic=True)  # fmt: skip
    np.testing.assert_array_equal(out.color.numpy().reshape(ref.shape), ref.numpy())
    assert np.isfinite(ref.numpy()).all()
