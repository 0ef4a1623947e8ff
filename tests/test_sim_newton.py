"""warpraster.sim.newton: the same images as Newton's own camera sensor on a shared
scene, gradients through Newton's solver, the Newton example. Skipped without newton."""

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import warp as wp

newton = pytest.importorskip(
    "newton", reason="newton is not installed (pip install --no-deps newton==1.8.0)"
)

import warpraster.sim as wsim  # noqa: E402
from warpraster.sim.newton import (  # noqa: E402
    TRIANGLE_MESH_SHAPE_ID,
    NewtonCameraSensor,
    geometry_from_model,
)

ROOT = Path(__file__).resolve().parents[1]


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _two_world_model(device):
    """Two worlds, each a posed box on a body and a 4 x 4 cloth."""

    def world(k):
        b = newton.ModelBuilder()
        q = wp.quat_from_axis_angle(wp.normalize(wp.vec3(0.2, 0.3, 1.0)), 0.5 + 0.3 * k)
        body = b.add_body(xform=wp.transform((0.1 * k, 0.0, 0.5), q))
        b.add_shape_box(body, hx=0.3, hy=0.2, hz=0.1)
        b.add_cloth_grid(pos=wp.vec3(-0.5, -0.5, 1.0), rot=wp.quat_identity(), vel=wp.vec3(0.0),
                         dim_x=4, dim_y=4, cell_x=0.25, cell_y=0.25, mass=0.1,
                         particle_radius=0.01)  # fmt: skip
        return b

    main = newton.ModelBuilder()
    for k in range(2):
        main.add_world(world(k))
    return main.finalize(device=device)


def test_colour_depth_normal_and_shape_index_match_newtons_sensor(device):
    """Newton's ray-traced SensorTiledCamera (cpu device, backface culling off, its
    default directional light without shadows) and the warpraster sensor on a
    two-world scene of boxes and cloth, two cameras, a non-square image."""
    from newton.sensors import SensorTiledCamera

    model = _two_world_model(device)
    state = model.state()
    h, w = 24, 32
    fovs = np.array([0.8, 0.6], np.float32)
    cams = [wsim.look_at_transform((2.5, -2.0, 2.2), (0, 0, 0.6)),
            wsim.look_at_transform((0.3, 0.4, 4.0), (0, 0, 0.5), up=(0, 1, 0))]  # fmt: skip
    cam = wp.array([[c, c] for c in cams], dtype=wp.transformf, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SensorTiledCamera is deprecated in Newton 1.7+
        ref = SensorTiledCamera(model, default_render_config=SensorTiledCamera.RenderConfig(
            enable_backface_culling=False))  # fmt: skip
    ref.utils.create_default_light(enable_shadows=False)
    rays = ref.utils.compute_camera_rays_pinhole(w, h, camera_fovs=fovs)
    depth = ref.utils.create_depth_image_output(w, h, 2)
    shape_index = ref.utils.create_shape_index_image_output(w, h, 2)
    hdr = wp.zeros((2, 2, h, w), dtype=wp.vec3f, device=device)
    normal = wp.zeros((2, 2, h, w), dtype=wp.vec3f, device=device)
    ref.update(state, cam, rays, depth_image=depth, hdr_color_image=hdr,
               shape_index_image=shape_index, normal_image=normal)  # fmt: skip

    ours = NewtonCameraSensor(model, camera_count=2, image_size=(h, w),
                              light_direction=(-0.57735026, 0.57735026, -0.57735026))  # fmt: skip
    out = ours.update(state, cam, wp.array(fovs, dtype=wp.float32, device=device)).numpy()

    ids = shape_index.numpy()
    assert set(np.unique(ids)) == {0, 1, TRIANGLE_MESH_SHAPE_ID, 0xFFFFFFFF}
    # the same pixel centres and exact triangles: a pixel can only differ where its
    # centre is within float32 rounding of an edge; 1 in 500 leaves room for that
    same = out["shape_index"] == ids
    assert (~same).sum() <= ids.size // 500, (~same).sum()
    hit = same & (ids != 0xFFFFFFFF)
    assert hit.sum() > 300
    # float32 ray-triangle (Newton) vs float32 projection + perspective-correct
    # barycentrics (ours): measured 7e-7 relative; 1e-5
    np.testing.assert_allclose(out["depth"][hit], depth.numpy()[hit], rtol=1e-5)
    np.testing.assert_allclose(out["depth"][~hit & same], 0.0)
    # the same shading formula on float32 normals: measured 1e-7; 1e-5
    np.testing.assert_allclose(out["color"][hit], hdr.numpy()[hit], atol=1e-5)
    np.testing.assert_allclose(out["normal"][hit], normal.numpy()[hit], atol=1e-5)


def test_model_geometry_tessellates_visible_primitives():
    b = newton.ModelBuilder()
    body = b.add_body()
    b.add_shape_sphere(body, radius=0.3)
    b.add_shape_capsule(body, radius=0.1, half_height=0.2)
    b.add_shape_box(body, hx=0.1, hy=0.1, hz=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = b.finalize(device="cpu")  # host-side geometry only: no kernel runs
    geo = geometry_from_model(model, segments=16)
    assert [s.shape_index for s in geo.shapes] == [0, 1, 2]
    src, idx, local = geo.packed_vertices()
    sphere = local[: geo.shapes[0].vertex_count]
    # every sphere vertex on the sphere (float32 rounding)
    np.testing.assert_allclose(np.linalg.norm(sphere, axis=1), 0.3, rtol=1e-6)
    assert (idx == 0).all() and (src == int(wsim.VertexSource.BODY)).all()
    with pytest.raises(TypeError, match="model"):
        geometry_from_model("model")


def test_velocity_gradient_through_newtons_solver_matches_central_differences(device):
    """d(depth loss)/d(initial velocity) through 12 SolverSemiImplicit steps of a
    pinned cloth, two frames of two cameras, against central differences."""
    ex = _load_example("sim_newton_cloth")
    sim = ex.NewtonClothThrow(n=3, steps=12, render_every=6, image_size=24, device=device)
    sim.make_targets([0.0, 1.5, 2.0])
    x0 = np.array([0.3, 1.0, 1.5])
    sim.set_velocity(x0)
    sim.step()
    grad = sim.velocity.grad.numpy()[0].astype(np.float64)
    # step 0.01 m/s: measured stable from 0.003 to 0.03 (within 0.5% on the large
    # components); 2% of the largest component for float32 rounding of the
    # loss over the rollout
    h = 0.01
    fd = np.array([(sim.loss_at(x0 + e) - sim.loss_at(x0 - e)) / (2 * h) for e in np.eye(3) * h])
    assert np.abs(fd).max() > 1e-3
    np.testing.assert_allclose(grad, fd, atol=0.02 * np.abs(fd).max())


def test_newton_example_runs_in_test_mode(cli_device):
    cmd = [sys.executable, "examples/sim_newton_cloth.py", "--test", "--device", cli_device]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("recovered=") and " truth=" in last
