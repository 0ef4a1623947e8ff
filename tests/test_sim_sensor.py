"""warpraster.sim.CameraSensor: channels against a float64 NumPy ray caster, gradients
against central differences, graph replay, allocation-free steps, bad input."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES
from host_counts import count_allocations_and_reads

import warpraster.sim as wsim

ROOT = Path(__file__).resolve().parents[1]


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- reference
def _quat_matrix(q):
    x, y, z, w = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip


def _apply(tf, p):
    tf = np.asarray(tf, np.float64)
    return p @ _quat_matrix(tf[3:]).T + tf[:3]


def _raycast(tris, shape_of, colors, cam_tf, fov, h, w, light_dir):
    """Float64 reference: Newton's pinhole rays, nearest hit (Moller-Trumbore), its
    channels with the sensor's shading; and each pixel's margin to the nearest
    edge of its face (in barycentric units) so edge-ambiguous pixels can be left out."""
    tf = np.asarray(cam_tf, np.float64)
    rot = _quat_matrix(tf[3:])
    ys, xs = np.mgrid[0:h, 0:w]
    t = np.tan(fov / 2)
    d_cam = np.stack([((xs + 0.5) / w - 0.5) * 2 * t * w / h, -((ys + 0.5) / h - 0.5) * 2 * t,
                      -np.ones_like(xs, float)], -1)  # fmt: skip
    d = d_cam @ rot.T
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    o = tf[:3]
    best = np.full((h, w), np.inf)
    face = np.full((h, w), -1)
    margin = np.full((h, w), np.inf)
    for f, (a, b, c) in enumerate(tris):
        e1, e2 = b - a, c - a
        p = np.cross(d, e2)
        det = p @ e1
        inv = 1.0 / np.where(np.abs(det) < 1e-12, np.nan, det)
        s = o - a
        u = (p @ s) * inv
        q = np.cross(s, e1)
        v = (d @ q) * inv
        tt = (q @ e2) * inv
        ok = (u >= 0) & (v >= 0) & (u + v <= 1) & (tt > 0) & (tt < best)
        best[ok] = tt[ok]
        face[ok] = f
        margin[ok] = np.minimum(np.minimum(u, v), 1 - u - v)[ok]
    nrm = np.zeros((h, w, 3))
    col = np.zeros((h, w, 3))
    hit = face >= 0
    for f in np.unique(face[hit]):
        a, b, c = tris[f]
        n = np.cross(b - a, c - a)
        n /= np.linalg.norm(n)
        m = face == f
        nrm[m] = n
        alb = colors[shape_of[f]]
        hemi = 0.5 * (n[2] + 1)
        amb = (np.array([0.4, 0.4, 0.45]) * hemi + np.array([0.1, 0.1, 0.12]) * (1 - hemi)) * 0.5
        ldir = -np.asarray(light_dir) / np.linalg.norm(light_dir)
        col[m] = alb * amb + alb * max(n @ ldir, 0.0)
    depth = np.where(hit, best, 0.0)
    fwd = np.where(hit, best * (d @ (-rot[:, 2])), 0.0)
    return face, depth, fwd, nrm, col, margin


def _box_scene(ground=True):
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    g.add_body_mesh(0, bv, bf, world=0, shape_index=7, color=(0.8, 0.3, 0.2))
    g.add_body_mesh(1, bv, bf, world=1, shape_index=7, color=(0.8, 0.3, 0.2))
    pv, pf = wsim.tessellate.plane_mesh(1.5, 1.5)
    if ground:
        g.add_static_mesh(pv, pf, world=-1, shape_index=2, color=(0.2, 0.5, 0.3))
    axes = [wp.normalize(wp.vec3(0.3, 0.2, 1.0)), wp.normalize(wp.vec3(1.0, 0.0, 0.2))]
    bodies = [
        (0.1, -0.2, 0.45, *wp.quat_from_axis_angle(axes[0], 0.7)),
        (-0.2, 0.1, 0.3, *wp.quat_from_axis_angle(axes[1], 0.4)),
    ]
    cams = [wsim.look_at_transform((2.0, -2.5, 1.8), (0, 0, 0.3)),
            wsim.look_at_transform((-1.5, -1.0, 3.0), (0, 0, 0))]  # fmt: skip
    return g, bodies, cams, (bv, bf, pv, pf)


def test_channels_match_a_float64_ray_caster_per_world_and_camera(device):
    """Two worlds (a posed box each) + a shared ground, two cameras, a non-square
    image: every (world, camera) image against a NumPy float64 ray caster."""
    h, w = 30, 40
    g, bodies, cams, (bv, bf, pv, pf) = _box_scene()
    light = (-0.577, 0.577, -0.577)
    sensor = wsim.CameraSensor(g, world_count=2, camera_count=2, image_size=(h, w), device=device,
                               light_direction=light)  # fmt: skip
    fovs = np.array([0.9, 0.7], np.float32)
    out = sensor.update(
        camera_transforms=wp.array([[c, c] for c in cams], dtype=wp.transform, device=device),
        camera_fovs=wp.array(fovs, dtype=wp.float32, device=device),
        body_q=wp.array(bodies, dtype=wp.transform, device=device),
    ).numpy()
    for a in out.values():
        assert a.shape[:4] == (2, 2, h, w)
    colors = g.shape_colors().astype(np.float64)
    for wi in range(2):
        box = _apply(bodies[wi], bv.astype(np.float64))
        tris = np.concatenate([box[bf], pv.astype(np.float64)[pf]])
        shape_of = np.array([wi] * len(bf) + [2] * len(pf))
        ids = np.array([7] * len(bf) + [2] * len(pf))
        for ci in range(2):
            face, depth, fwd, nrm, col, margin = _raycast(
                tris, shape_of, colors, np.array(cams[ci]), float(fovs[ci]), h, w, light
            )
            # pixels whose centre lies within 1e-3 (barycentric) of an edge may be
            # decided either way by float32 vs float64 arithmetic: left out
            sure = (face < 0) | (margin > 1e-3)
            sure &= ~_near_any_edge(tris, cams[ci], float(fovs[ci]), h, w)
            assert sure.mean() > 0.8
            got_id = out["shape_index"][wi, ci].astype(np.int64)
            want_id = np.where(face >= 0, ids[np.maximum(face, 0)], 0xFFFFFFFF)
            np.testing.assert_array_equal(got_id[sure], want_id[sure])
            hit = sure & (face >= 0)
            assert hit.sum() > 100
            # float32 projection and barycentrics: ~1e-6 relative; 1e-4 leaves room
            # for the perspective-correct division at grazing faces
            np.testing.assert_allclose(
                out["depth"][wi, ci][sure], depth[sure], rtol=1e-4, atol=1e-5
            )
            np.testing.assert_allclose(out["forward_depth"][wi, ci][sure], fwd[sure], rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
            # normals and colours: float32 cross products and normalisation (~1e-6)
            np.testing.assert_allclose(out["normal"][wi, ci][sure], nrm[sure], atol=1e-5)
            np.testing.assert_allclose(out["color"][wi, ci][sure], col[sure], atol=1e-5)
            np.testing.assert_array_equal(out["alpha"][wi, ci][sure], (face >= 0)[sure])


def _near_any_edge(tris, cam_tf, fov, h, w, px=0.02):
    """Pixels whose centre is within ``px`` pixels of a projected edge (either side)."""
    tf = np.asarray(cam_tf, np.float64)
    rot = _quat_matrix(tf[3:])
    pc = (tris.reshape(-1, 3) - tf[:3]) @ rot  # camera frame
    z = -pc[:, 2]
    t = np.tan(fov / 2)
    u = (pc[:, 0] / (z * 2 * t * w / h) + 0.5) * w - 0.5
    v = (0.5 - pc[:, 1] / (z * 2 * t)) * h - 0.5
    uv = np.stack([u, v], 1).reshape(-1, 3, 2)
    ys, xs = np.mgrid[0:h, 0:w]
    p = np.stack([xs, ys], -1).astype(float)
    near = np.zeros((h, w), bool)
    for tri in uv:
        for i in range(3):
            a, b = tri[i], tri[(i + 1) % 3]
            ab = b - a
            tt = np.clip(((p - a) @ ab) / max(ab @ ab, 1e-30), 0, 1)
            dist = np.linalg.norm(p - (a + tt[..., None] * ab), axis=-1)
            near |= dist < px
    return near


# ----------------------------------------------------------------------------- gradients
def test_wind_gradient_matches_central_differences(device):
    """d(image loss)/d(wind) through 12 substeps of cloth, two cameras, two frames,
    soft silhouette and smooth shading, against central differences."""
    ex = _load_example("sim_cloth_wind")
    sim = ex.ClothWind(n=4, steps=12, render_every=6, image_size=24, device=device)
    sim.make_targets([1.5, 3.0, 0.0])
    x0 = np.array([0.5, 1.0, 0.2])
    sim.set_wind(x0)
    sim.step()
    grad = sim.wind.grad.numpy()[0].astype(np.float64)
    # step 0.01 m/s: the loss is smooth in the wind (continuous coverage, smooth
    # normals), measured stable from 0.003 to 0.1 (agreeing within 0.2%); float32
    # rounding of a ~3e-6 loss is ~1e-12, i.e. ~1e-10 in the quotient
    h = 0.01
    fd = np.array([(sim.loss_at(x0 + e) - sim.loss_at(x0 - e)) / (2 * h) for e in np.eye(3) * h])
    assert np.abs(grad).max() > 1e-7
    # 2% of the largest component: first-order differences of a float32 loss
    np.testing.assert_allclose(grad, fd, rtol=0.02, atol=0.02 * np.abs(fd).max())


def _pose_setup(sigma, device, deterministic=True):
    g, bodies, cams, _ = _box_scene(ground=False)
    sensor = wsim.CameraSensor(g, world_count=2, camera_count=2, image_size=(24, 32),
                               silhouette_sigma=sigma, smooth_normals=False, device=device,
                               deterministic=deterministic,
                               light_direction=(-0.577, 0.577, -0.577), requires_grad=True,
                               material_grad=True)  # fmt: skip
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([[c, c] for c in cams], dtype=wp.transform, device=device, requires_grad=True)
    fovs = wp.array([0.9, 0.7], dtype=wp.float32, device=device, requires_grad=True)
    return sensor, body_q, cam_q, fovs


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_pose_fov_and_colour_gradients_match_central_differences(device, deterministic):
    """Depth + coverage + colour loss of posed boxes (two worlds, two cameras, soft
    silhouette): gradients w.r.t. body translations, a camera translation, a field
    of view and a shape colour against central differences, for both backwards
    (the sensor's deterministic one and Warp's generated adjoints)."""
    sensor, body_q, cam_q, fovs = _pose_setup(1e-4, device, deterministic)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    frame = sensor.frames[0]
    tgt_c = wp.full(frame.color.shape, wp.vec3(0.3, 0.2, 0.1), dtype=wp.vec3, device=device)
    tgt_d = wp.full(frame.depth.shape, 1.0, dtype=float, device=device)
    tgt_a = wp.full(frame.alpha.shape, 0.5, dtype=float, device=device)

    def forward(colour):
        loss.zero_()
        out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
        if colour:  # flat-shaded colour jumps where a box edge crosses a pixel
            wsim.image_loss(out.color, tgt_c, loss, weight=1e-3)
        else:
            wsim.image_loss(out.depth, tgt_d, loss, weight=1e-3)
            wsim.image_loss(out.alpha, tgt_a, loss, weight=1e-3)

    cases = [  # (array, index of the perturbed float32, step, colour loss)
        (body_q, (0, 0), 3e-4, False), (body_q, (1, 2), 3e-4, False),
        (body_q, (0, 4), 3e-4, False), (cam_q, (1, 0, 1), 3e-4, False),
        (fovs, (0,), 3e-4, False), (sensor.shape_colors, (0, 1), 1e-2, True),
    ]  # fmt: skip
    for arr, idx, h, colour in cases:
        tape = wp.Tape()
        with tape:
            forward(colour)
        tape.backward(loss)
        host = arr.numpy().copy()  # numpy() of a cpu array is a view: copy it
        flat = host.view(np.float32).reshape(*arr.shape, -1) if arr.dtype != wp.float32 else host
        grad = arr.grad.numpy()
        grad = grad.view(np.float32).reshape(*arr.shape, -1) if arr.dtype != wp.float32 else grad
        g = float(grad[idx])
        tape.reset()
        vals = []
        for sign in (1, -1):
            pert = flat.copy()
            pert[idx] += sign * h
            arr.assign(pert.view(host.dtype).reshape(host.shape))
            forward(colour)
            vals.append(float(loss.numpy()[0]))
        arr.assign(host)
        fd = (vals[0] - vals[1]) / (2 * h)
        assert abs(fd) > 1e-3
        # steps of 3e-4 (m, rad): outlines move by < 0.01 px, well inside the soft
        # band (sigma 1e-4: ~0.5 px at 24 px); measured agreement ~1% over steps
        # 3e-4 to 1e-3 (a larger step leaves the linear range of the steep
        # sigmoid); 3% for the float32 loss (~4, ulp 5e-7 / 6e-4 ~ 1e-3 in the
        # quotient) and the outline blend's curvature
        assert abs(g - fd) <= 0.03 * abs(fd), (idx, g, fd)


# ----------------------------------------------------------------------------- capture
@pytest.mark.skipif("cpu" not in DEVICES, reason="bit-exact replay and the allocator are cpu's")
def test_step_replays_bit_for_bit_from_a_graph_and_allocates_nothing(monkeypatch):
    """Simulate + render + loss + backward: eager equals graph replay bit for bit
    (also after new parameter values are written into the same array), and a step
    after the first allocates no memory and reads nothing back."""
    ex = _load_example("sim_cloth_wind")
    sim = ex.ClothWind(n=4, steps=12, render_every=6, image_size=24, device="cpu")
    sim.make_targets([1.5, 3.0, 0.0])

    def snapshot():
        arrays = (sim.loss, sim.wind.grad, sim.sensor.frames[-1].color, sim.q[-1].grad)
        return [a.numpy().copy() for a in arrays]

    sim.set_wind([0.4, 0.9, 0.1])
    sim.step()  # the first step: modules load, launch caches fill

    # a step after the first: no allocation, no host read
    with count_allocations_and_reads(monkeypatch) as calls:
        sim.step()
    assert calls == {"alloc": 0, "numpy": 0}
    eager = snapshot()

    sim.capture()
    sim.set_wind([0.4, 0.9, 0.1])
    wp.capture_launch(sim.graph)
    for a, b in zip(eager, snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)
    # new values written into the parameter array are seen by the replay
    sim.set_wind([1.0, 2.0, -0.3])
    sim.step()
    eager2 = snapshot()
    wp.capture_launch(sim.graph)
    for a, b in zip(eager2, snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(eager[1], eager2[1])


# ----------------------------------------------------------------------------- recovery
def test_cloth_example_recovers_the_wind(device):
    """Adam from zero wind: the wind within 0.15 m/s per component of the truth
    (1.5, 3.0, 0.0) m/s after 60 iterations on 32-pixel images."""
    ex = _load_example("sim_cloth_wind")
    truth = np.array([1.5, 3.0, 0.0])
    kw = dict(n=4, steps=24, render_every=8, image_size=32, device=device)
    wind, first, last = ex.recover(truth, np.zeros(3), iterations=60, lr=0.15, log=print, **kw)
    assert last < 0.05 * first
    np.testing.assert_allclose(wind, truth, atol=0.15)


def test_cloth_example_runs_in_test_mode(cli_device):
    cmd = [sys.executable, "examples/sim_cloth_wind.py", "--test", "--device", cli_device]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("recovered=") and " truth=" in last


# ----------------------------------------------------------------------------- bad input
@pytest.mark.skipif("cpu" not in DEVICES, reason="builds its arrays on the cpu device")
def test_bad_input_is_named_before_any_kernel_runs():
    g, bodies, cams, _ = _box_scene()
    with pytest.raises(TypeError, match="geometry"):
        wsim.CameraSensor("box")
    with pytest.raises(ValueError, match="world_count"):
        wsim.CameraSensor(g, world_count=0)
    with pytest.raises(ValueError, match="world 1"):
        wsim.CameraSensor(g, world_count=1)
    with pytest.raises(ValueError, match="silhouette_sigma"):
        wsim.CameraSensor(g, world_count=2, silhouette_sigma=-1.0)
    with pytest.raises(ValueError, match="faces"):
        wsim.SensorGeometry().add_static_mesh(np.zeros((3, 3)), [[0, 1, 3]])
    sensor = wsim.CameraSensor(g, world_count=2, camera_count=2, image_size=8, device="cpu")
    cam = wp.array([[c, c] for c in cams], dtype=wp.transform, device="cpu")
    fov = wp.array([0.9, 0.7], dtype=wp.float32, device="cpu")
    body = wp.array(bodies, dtype=wp.transform, device="cpu")
    with pytest.raises(ValueError, match="body_q is required"):
        sensor.update(camera_transforms=cam, camera_fovs=fov)
    with pytest.raises(ValueError, match="camera_transforms"):
        sensor.update(camera_transforms=cam[:, :1], camera_fovs=fov, body_q=body)
    with pytest.raises(TypeError, match="camera_fovs"):
        sensor.update(camera_transforms=cam, camera_fovs=wp.zeros(2, dtype=wp.float64),
                      body_q=body)  # fmt: skip
    with pytest.raises(ValueError, match="body_q"):
        sensor.update(camera_transforms=cam, camera_fovs=fov, body_q=body[:1])
    with pytest.raises(ValueError, match="frame"):
        sensor.update(camera_transforms=cam, camera_fovs=fov, body_q=body, frame=1)


def test_importing_warpraster_and_its_sim_package_imports_no_newton():
    code = ("import sys, warpraster, warpraster.sim; "
            "print(sorted(m for m in ('newton', 'torch', 'pxr') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
