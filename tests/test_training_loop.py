"""Gradients in the loop users write: a fresh ``wp.Tape()`` per step, the user
zeroing only the ``.grad`` of their own arrays, the same inputs each step.

Truth: step 1 of the same loop. The library's own gradient buffers (fragments,
projected vertices, per-face tables, images, a sensor's channels) must start
from zero in every recorded step, so step 3 equals step 1: bit for bit on the
``cpu`` device (its kernels run serially, every float atomic in one order) and
on the deterministic paths; within float32 atomic-order rounding on CUDA.
No ``tape.zero()`` anywhere: it must not be needed for correctness.
"""

from __future__ import annotations

import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp
from conftest import DEVICES

import warpraster as wr
import warpraster.sim as wsim
from warpraster import shading
from warpraster.primitives import ico_sphere
from warpraster.renderer import Renderer
from warpraster.shading import reductions

STEPS = 3


def _same(first, last, device, deterministic=False):
    for a, b in zip(first, last, strict=True):
        assert np.abs(a).max() > 0, "the step gives no gradient: nothing is checked"
        if wp.get_device(device).is_cpu or deterministic:
            np.testing.assert_array_equal(b, a)
        else:
            # CUDA float32 atomics add in a varying order: a few ulps of the
            # largest entry, far below the 2x a leaked step would add
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())


def _loop(step, arrays):
    """Runs ``step`` STEPS times, zeroing only ``arrays``' gradients before each;
    the gradients after the first and the last step."""
    seen = []
    for _ in range(STEPS):
        for a in arrays:
            a.grad.zero_()
        step()
        seen.append([a.grad.numpy().copy() for a in arrays])
    return seen[0], seen[-1]


@wp.kernel
def _weighted_sum(values: wp.array4d(dtype=float), loss: wp.array(dtype=float)):
    n, y, x = wp.tid()
    wp.atomic_add(loss, 0, values[n, y, x, 0] * float(y + 1) * 0.01)


@wp.kernel
def _weighted_sum3(values: wp.array3d(dtype=float), loss: wp.array(dtype=float)):
    n, y, x = wp.tid()
    wp.atomic_add(loss, 0, values[n, y, x] * float(x + 1) * 0.01)


def _sphere(device):
    v, f = ico_sphere(2)
    v = (v * 0.8 + np.array([0.05, -0.1, 2.0])).astype(np.float32)
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    return verts, wp.array(f.astype(np.int32), dtype=wp.int32, device=device)


@pytest.mark.parametrize("workspace", [False, True], ids=["fresh", "workspace"])
@pytest.mark.parametrize("loss_kind", ["zbuf", "silhouette"])
def test_rasterize_meshes_gradients_do_not_grow(workspace, loss_kind, device):
    verts, faces = _sphere(device)
    s = wr.RasterSettings(image_size=(24, 20), faces_per_pixel=2, blur_radius=2e-3)
    nf = faces.shape[0]
    ws = (wr.RasterWorkspace(num_meshes=1, num_faces=nf, settings=s, device=device,
                             requires_grad=True) if workspace else None)  # fmt: skip
    scratch = reductions.make_scratch((1, *s.image_size, 2), device) if workspace else None
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            fr = wr.rasterize_meshes(verts, faces, [0], [nf], settings=s, workspace=ws)
            if loss_kind == "zbuf":
                wp.launch(_weighted_sum, dim=(1, *s.image_size), inputs=[fr.zbuf, loss],
                          device=device)  # fmt: skip
            else:
                sil = shading.soft_silhouette(fr, 1e-3, scratch=scratch)
                wp.launch(_weighted_sum3, dim=(1, *s.image_size), inputs=[sil, loss],
                          device=device)  # fmt: skip
        tape.backward(loss)

    _same(*_loop(step, [verts]), device)


def test_clipped_workspace_gradients_do_not_grow(device):
    # a perspective camera close enough that z_clip_value splits faces
    verts, faces = _sphere(device)
    cams = wr.FoVPerspectiveCameras(znear=0.5, zfar=10.0, fov=60.0, device=device)
    v = verts.numpy().copy()
    v[:, 2] -= 1.3  # the front of the sphere crosses z = znear / 2
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    raster = wr.MeshRasterizer(cameras=cams, raster_settings=wr.RasterizationSettings(
        image_size=20, faces_per_pixel=2, blur_radius=1e-3))  # fmt: skip
    s = raster.settings_for(cams)
    assert s.clipped
    nf = faces.shape[0]
    ws = wr.ClipWorkspace(num_verts=v.shape[0], num_faces=nf, num_meshes=1, settings=s,
                          device=device, requires_grad=True)  # fmt: skip
    ndc = wp.zeros(v.shape[0], dtype=wp.vec3, device=device, requires_grad=True)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)

    def step():
        loss.zero_()
        ndc.grad.zero_()  # the user's own intermediate array, zeroed by the user
        tape = wp.Tape()
        with tape:
            cams.transform_points_ndc(verts, None, None, ndc)
            fr = wr.rasterize_meshes(ndc, faces, [0], [nf], settings=s, workspace=ws)
            wp.launch(_weighted_sum, dim=(1, 20, 20), inputs=[fr.zbuf, loss], device=device)
        tape.backward(loss)

    _same(*_loop(step, [verts]), device)


def _renderer(name, device, textures="case", camera_grad=False):
    d, spec = cases.load(name)
    cams = cases.cameras(d, spec, device)
    if camera_grad:
        cams.R.requires_grad = True
        cams.T.requires_grad = True
    lts = cases.lights(d, spec, device)
    shader = getattr(shading, spec["shader"])(
        cameras=cams, lights=lts, materials=cases.materials(spec, device),
        blend_params=cases.blend_params(spec))  # fmt: skip
    if textures == "mipmap":
        tex = shading.TexturesUVMipmap(
            d["texture_maps"], d["faces_uvs"].astype(np.int32), d["verts_uvs"], device=device,
            requires_grad=True)  # fmt: skip
    else:
        tex = cases.textures(d, spec, device)
    r = Renderer(cameras=cams, raster_settings=cases.raster_settings(spec), shader=shader,
                 faces=d["faces_packed"].astype(np.int32),
                 mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
                 num_faces_per_mesh=d["num_faces_per_mesh"],
                 num_verts=len(d["verts_packed"]), textures=tex)  # fmt: skip
    verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    target = wp.array(d["images"] * 0.9 + 0.02, dtype=wp.float32, device=device)
    params = [verts]
    for obj in (tex, lts) + ((cams,) if camera_grad else ()):
        for value in vars(obj).values():
            if isinstance(value, wp.array) and value.grad is not None and value.dtype != wp.int32:
                params.append(value)
    return r, verts, target, params


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(
    "name,textures",
    [("r03_softphong_directional_k8", "case"), ("r07_texuv_hardphong_bilinear", "case"),
     ("r07_texuv_hardphong_bilinear", "mipmap")],
    ids=["soft-phong", "uv-bilinear", "uv-mipmap"],
)  # fmt: skip
def test_renderer_gradients_do_not_grow(name, textures, fused, device):
    r, verts, target, params = _renderer(name, device, textures, camera_grad=True)
    assert len(params) >= 4  # verts, texture, light and camera arrays are all checked
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            out = r.render(verts)
            if fused:
                r.image_mse(target, out=loss)
            else:
                shading.image_mse(out.image, target, out=loss)
        tape.backward(loss)

    _same(*_loop(step, params), device)


def test_captured_renderer_step_without_tape_zero_does_not_grow(device):
    r, verts, target, params = _renderer("r03_softphong_directional_k8", device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()
    r.render(verts)  # loads the modules before the capture
    with wp.ScopedCapture(device=device) as cap:
        loss.zero_()
        for p in params:
            p.grad.zero_()
        with tape:
            r.render(verts)
            r.image_mse(target, out=loss)
        tape.backward(loss)  # no tape.zero(): the renderer's own buffers clear themselves
    seen = []
    for _ in range(STEPS):
        wp.capture_launch(cap.graph)
        seen.append([p.grad.numpy().copy() for p in params])
    _same(seen[0], seen[-1], device)
    # and the replayed gradients are the eager ones
    eager = _loop(lambda: _eager_step(r, verts, target, loss), params)[1]
    _same(eager, seen[-1], device)


def _eager_step(r, verts, target, loss):
    loss.zero_()
    tape = wp.Tape()
    with tape:
        r.render(verts)
        r.image_mse(target, out=loss)
    tape.backward(loss)


def test_mesh_renderer_gradients_do_not_grow(device):
    d, spec, renderer, verts, tex, lts = cases.warp_scene("r03_softphong_directional_k8", device)
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    faces = d["faces_packed"].astype(np.int32)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            image = renderer(verts, faces, d["mesh_to_face_first_idx"], d["num_faces_per_mesh"],
                             textures=tex)  # fmt: skip
            shading.image_mse(image, target, out=loss)
        tape.backward(loss)

    _same(*_loop(step, [verts, tex.verts_features]), device)


def _sensor(device, deterministic):
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    g.add_body_mesh(0, bv, bf, world=0, color=(0.8, 0.3, 0.2))
    pv, pf = wsim.tessellate.plane_mesh(1.5, 1.5)
    g.add_static_mesh(pv, pf, world=-1, color=(0.2, 0.5, 0.3))
    sensor = wsim.CameraSensor(
        g, world_count=1, camera_count=1, image_size=24, silhouette_sigma=1e-4,
        light_direction=(-0.577, 0.577, -0.577), device=device, requires_grad=True,
        material_grad=True, deterministic=deterministic, grad_channels=("color", "depth"),
    )  # fmt: skip
    cam = wsim.look_at_transform((2.0, -2.5, 1.8), (0.0, 0.0, 0.3))
    body_q = wp.array([(0.05, -0.1, 0.35, 0.0, 0.0, 0.2588, 0.9659)], dtype=wp.transform,
                      device=device, requires_grad=True)  # fmt: skip
    cam_q = wp.array([[cam]], dtype=wp.transform, device=device, requires_grad=True)
    fovs = wp.array([0.8], dtype=wp.float32, device=device, requires_grad=True)
    rng = np.random.default_rng(3)
    frame = sensor.frames[0]
    tc = wp.array(rng.uniform(0, 1, (*frame.color.shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=device)  # fmt: skip
    td = wp.array(rng.uniform(1, 4, frame.depth.shape).astype(np.float32), device=device)
    params = [body_q, cam_q, fovs, sensor.shape_colors, sensor.light_direction]
    return sensor, body_q, cam_q, fovs, tc, td, params


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("fused", [True, False], ids=["frame_loss", "image_loss"])
def test_camera_sensor_gradients_do_not_grow(fused, deterministic, device):
    sensor, body_q, cam_q, fovs, tc, td, params = _sensor(device, deterministic)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            frame = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
            if fused:
                wsim.frame_loss(sensor, 0, loss, color_target=tc, depth_target=td,
                                color_weight=1e-3, depth_weight=2e-3)  # fmt: skip
            else:
                wsim.image_loss(frame.color, tc, loss, weight=1e-3)
                wsim.image_loss(frame.depth, td, loss, weight=2e-3)
        tape.backward(loss)

    _same(*_loop(step, params), device, deterministic=deterministic)


@pytest.mark.skipif(
    "cpu" not in DEVICES, reason="torch_scene builds cpu tensors; cpu is not a test device"
)
def test_torch_mesh_renderer_gradients_do_not_grow():
    torch = pytest.importorskip("torch")
    from test_torch_shading import torch_scene

    d, spec, ren, inputs, tex, leaves = torch_scene("r03_softphong_directional_k8")
    target = torch.tensor(d["images"] * 0.9)
    seen = []
    for _ in range(STEPS):
        for t in leaves.values():
            t.grad = None
        img = ren(*inputs)
        ((img - target) ** 2).mean().backward()
        # the leaves this scene differentiates (the vertices among them)
        seen.append([t.grad.numpy().copy() for t in leaves.values() if t.grad is not None])
    assert len(seen[0]) >= 2 and leaves["verts"].grad is not None
    _same(seen[0], seen[-1], "cpu")


@pytest.mark.parametrize("when", ["after", "before"], ids=["zero-after", "zero-before"])
@pytest.mark.parametrize("name", ["r07_texuv_hardphong_bilinear", "r03_softphong_directional_k8"])
def test_tape_zero_reaches_every_array_the_render_differentiates(name, when, device):
    # The other common loop: no manual zeroing, tape.zero() on a fresh tape each
    # step, after reading the gradients or right before backward() (as in a
    # captured step). It must reach the arrays the render holds inside struct
    # arguments (texture maps, UVs, lights, camera), which Warp's tape otherwise
    # learns of only during backward().
    r, verts, target, params = _renderer(name, device, camera_grad=True)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    seen = []
    for _ in range(STEPS):
        loss.zero_()
        tape = wp.Tape()
        with tape:
            r.render(verts)
            r.image_mse(target, out=loss)
        if when == "before":
            tape.zero()
            loss.grad.fill_(1.0)  # tape.zero() cleared the seed too
            tape.backward()
        else:
            tape.backward(loss)
        seen.append([p.grad.numpy().copy() for p in params])
        if when == "after":
            tape.zero()
    _same(seen[0], seen[-1], device)


def test_a_mip_texture_made_under_the_tape_differentiates_once(device):
    # A TexturesUVMipmap built while a tape records (as a user building the scene
    # inside the step does) builds its levels unrecorded; the render rebuilds and
    # records them: the texels' gradient equals the one of a texture made before
    # the tape (it was ~6% too large when the construction's build was recorded too)
    d, spec = cases.load("r07_texuv_hardphong_bilinear")
    grads = []
    for inside in (False, True):
        tape = wp.Tape()
        if not inside:
            tex = shading.TexturesUVMipmap(d["texture_maps"], d["faces_uvs"].astype(np.int32),
                                           d["verts_uvs"], device=device,
                                           requires_grad=True)  # fmt: skip
        with tape:
            if inside:
                tex = shading.TexturesUVMipmap(d["texture_maps"],
                                               d["faces_uvs"].astype(np.int32), d["verts_uvs"],
                                               device=device, requires_grad=True)  # fmt: skip
            r = _renderer_with(d, spec, device, tex)
            out = r.render(wp.array(d["verts_packed"], dtype=wp.vec3, device=device))
        weights = np.random.default_rng(0).standard_normal(out.image.shape).astype(np.float32)
        tape.backward(grads={out.image: wp.array(weights, dtype=wp.float32, device=device)})
        grads.append(tex.maps.grad.numpy().copy())
    assert np.abs(grads[0]).max() > 0
    _same([grads[0]], [grads[1]], device)


def _renderer_with(d, spec, device, tex):
    cams = cases.cameras(d, spec, device)
    shader = getattr(shading, spec["shader"])(
        cameras=cams, lights=cases.lights(d, spec, device),
        materials=cases.materials(spec, device), blend_params=cases.blend_params(spec))  # fmt: skip
    return Renderer(cameras=cams, raster_settings=cases.raster_settings(spec), shader=shader,
                    faces=d["faces_packed"].astype(np.int32),
                    mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
                    num_faces_per_mesh=d["num_faces_per_mesh"],
                    num_verts=len(d["verts_packed"]), textures=tex, channels=())  # fmt: skip
