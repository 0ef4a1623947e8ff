"""CameraSensor near-plane clipping: a ground that reaches behind the camera against a
float64 NumPy ray caster, and gradients through the cut faces against central
differences (both backwards)."""

import numpy as np
import pytest
import warp as wp
from central_differences import central_difference, floats
from test_sim_sensor import _apply, _quat_matrix, _raycast

import warpraster.sim as wsim
from warpraster.sim.render import cut_face_point, cut_face_point_adjoint

H, W = 30, 40
FOV = 0.9
LIGHT = (-0.4, 0.3, -1.0)


def _camera():
    """Half a metre above the ground, looking ahead and down: the ground fills the
    image and its two triangles reach behind the camera (both cut by the near plane)."""
    return wsim.look_at_transform((0.2, -0.3, 0.5), (0.4, 0.5, 0.0))


def _scene(box=True):
    g = wsim.SensorGeometry()
    pv, pf = wsim.plane_mesh(10.0, 10.0)  # 2 triangles, 20 m a side, centred below the camera
    g.add_static_mesh(pv, pf, shape_index=2, color=(0.2, 0.5, 0.3))
    tris = [np.asarray(pv, np.float64)[pf]]
    if box:
        bv, bf = wsim.box_mesh(0.2, 0.15, 0.1)
        g.add_body_mesh(0, bv, bf, shape_index=7, color=(0.8, 0.3, 0.2))
        tris.append(_apply(_BOX_POSE, np.asarray(bv, np.float64))[bf])
    return g, np.concatenate(tris)


_BOX_POSE = (0.35, 1.2, 0.1, *wp.quat_from_axis_angle(wp.vec3(0.0, 0.0, 1.0), 0.5))


def _near_cut_edge(tris, cam_tf, near, px=0.02):
    """Pixels within ``px`` pixels of an edge of the part of a triangle in front of
    the near plane (float64 clipping in camera space, then projection)."""
    tf = np.asarray(cam_tf, np.float64)
    rot = _quat_matrix(tf[3:])
    t = np.tan(FOV / 2)
    ys, xs = np.mgrid[0:H, 0:W]
    p = np.stack([xs, ys], -1).astype(float)
    out = np.zeros((H, W), bool)
    for tri in tris:
        pc = (tri - tf[:3]) @ rot
        poly = []
        for i in range(3):
            a, b = pc[i], pc[(i + 1) % 3]
            za, zb = -a[2], -b[2]
            if za >= near:
                poly.append(a)
            if (za >= near) != (zb >= near):
                poly.append(a + (near - za) / (zb - za) * (b - a))
        if len(poly) < 3:
            continue
        q = np.array(poly)
        z = -q[:, 2]
        uv = np.stack([(q[:, 0] / (z * 2 * t * W / H) + 0.5) * W - 0.5,
                       (0.5 - q[:, 1] / (z * 2 * t)) * H - 0.5], 1)  # fmt: skip
        for i in range(len(uv)):
            a, b = uv[i], uv[(i + 1) % len(uv)]
            ab = b - a
            tt = np.clip(((p - a) @ ab) / max(ab @ ab, 1e-30), 0, 1)
            out |= np.linalg.norm(p - (a + tt[..., None] * ab), axis=-1) < px
    return out


def test_ground_behind_the_camera_matches_a_float64_ray_caster(device):
    g, tris = _scene()
    cam = _camera()
    args = dict(
        camera_transforms=wp.array([[cam]], dtype=wp.transform, device=device),
        camera_fovs=wp.array([FOV], dtype=wp.float32, device=device),
        body_q=wp.array([_BOX_POSE], dtype=wp.transform, device=device),
    )
    sensor = wsim.CameraSensor(g, image_size=(H, W), device=device, light_direction=LIGHT)
    assert sensor.near_clip > 0.0  # the default clips
    out = sensor.update(**args).numpy()
    shape_of = np.array([0, 0] + [1] * (len(tris) - 2))
    colors = g.shape_colors().astype(np.float64)
    face, depth, fwd, nrm, col, margin = _raycast(tris, shape_of, colors, np.array(cam), FOV, H,
                                                  W, LIGHT)  # fmt: skip
    # every hit of the ray caster is beyond the near plane (1 mm): the plane only
    # removes what lies behind the camera, as the ray caster's t > 0 does
    assert fwd[face >= 0].min() > 0.1
    sure = ((face < 0) | (margin > 1e-3)) & ~_near_cut_edge(tris, cam, sensor.near_clip)
    assert sure.mean() > 0.8
    ids = np.array([2, 2] + [7] * (len(tris) - 2))
    want_id = np.where(face >= 0, ids[np.maximum(face, 0)], 0xFFFFFFFF)
    np.testing.assert_array_equal(out["shape_index"][0, 0][sure], want_id[sure])
    ground = sure & (face >= 0) & (face < 2)
    assert ground.sum() > 0.5 * H * W  # the cut ground fills most of the image
    # float32 projection and barycentrics of the cut faces' parts: ~1e-6 relative;
    # 1e-4 as the unclipped ray-caster test allows (grazing ground far away)
    np.testing.assert_allclose(out["depth"][0, 0][sure], depth[sure], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["forward_depth"][0, 0][sure], fwd[sure], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["normal"][0, 0][sure], nrm[sure], atol=1e-5)
    np.testing.assert_allclose(out["color"][0, 0][sure], col[sure], atol=1e-5)

    # without the near plane the ground's triangles (a vertex behind the camera) are
    # dropped whole: the case the clipping is for
    unclipped = wsim.CameraSensor(g, image_size=(H, W), device=device, light_direction=LIGHT,
                                  near_clip=0.0).update(**args).numpy()  # fmt: skip
    assert (unclipped["shape_index"][0, 0][ground] == 2).sum() == 0


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_gradients_through_cut_faces_match_central_differences(device, deterministic):
    """Depth and colour losses of the cut ground alone (it fills the image: no outline
    in view): gradients of the camera's height and rotation and of the field of view
    against central differences."""
    g, _ = _scene(box=False)
    sensor = wsim.CameraSensor(g, image_size=(H, W), device=device, light_direction=LIGHT,
                               deterministic=deterministic, requires_grad=True)  # fmt: skip
    cam_q = wp.array([[_camera()]], dtype=wp.transform, device=device, requires_grad=True)
    fovs = wp.array([FOV], dtype=wp.float32, device=device, requires_grad=True)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    rng = np.random.default_rng(1)
    tgt_d = wp.array(rng.uniform(0.5, 3.0, (1, 1, H, W)), dtype=float, device=device)
    tgt_c = wp.array(rng.uniform(0, 1, (1, 1, H, W, 3)), dtype=wp.vec3, device=device)

    def forward():
        loss.zero_()
        out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs)
        wsim.image_loss(out.depth, tgt_d, loss, weight=1e-3)
        wsim.image_loss(out.forward_depth, tgt_d, loss, weight=1e-3)
        wsim.image_loss(out.color, tgt_c, loss, weight=1e-3)

    tape = wp.Tape()
    with tape:
        out = forward()
    out = sensor.frames[0]
    assert (out.alpha.numpy() == 1.0).all()  # the ground covers every pixel
    tape.backward(loss)
    grads = {id(cam_q): floats(cam_q.grad), id(fovs): floats(fovs.grad)}
    tape.reset()

    def loss_at():
        forward()
        return loss.numpy()[0]

    # (a uniform ground much larger than the view: moving the camera along it changes
    # nothing, so its x and y translation gradients are ~0; the height, the rotation
    # and the field of view are what the cut faces' pixels respond to)
    for arr, i in [(cam_q, (0, 2)), (cam_q, (0, 3)), (cam_q, (0, 4)), (cam_q, (0, 5)),
                   (fovs, (0, 0))]:  # fmt: skip
        fd = central_difference(arr, i, 1e-3, loss_at)
        g = float(grads[id(arr)][i])
        assert abs(fd) > 1e-3, (i, fd)
        # no outline in view: the losses are smooth in the camera; steps of 1e-3
        # (m, rad) leave the quadratic terms at ~1e-3 relative, the float32 loss
        # (~10, ulp 1e-6) adds ~1e-3 / 2e-3 ~ 5e-4 in the quotient: 1%
        assert abs(g - fd) <= 0.01 * abs(fd), (i, g, fd)


@wp.kernel
def _cut_point(p: wp.array(dtype=wp.vec2), verts: wp.array(dtype=wp.mat33),
               bary: wp.array(dtype=wp.vec3), depth: wp.array(dtype=float)):  # fmt: skip
    i = wp.tid()
    m = verts[i]
    b, z = cut_face_point(p[i], m[0], m[1], m[2])
    bary[i] = b
    depth[i] = z


@wp.kernel
def _cut_point_adjoint(p: wp.array(dtype=wp.vec2), verts: wp.array(dtype=wp.mat33),
                       g_bary: wp.array(dtype=wp.vec3), g_depth: wp.array(dtype=float),
                       out: wp.array(dtype=wp.mat33)):  # fmt: skip
    i = wp.tid()
    m = verts[i]
    out[i] = cut_face_point_adjoint(p[i], m[0], m[1], m[2], g_bary[i], g_depth[i])


def test_cut_face_point_adjoint_matches_warps_generated_adjoint():
    """The hand-written derivative of a cut face's point (the deterministic
    backward's) against Warp's generated adjoint of the same function, on random
    faces with one or two vertices behind the camera (negative depth)."""
    rng = np.random.default_rng(7)
    n = 200
    v = rng.uniform(-1.0, 1.0, (n, 3, 3))
    v[:, :, 2] = rng.uniform(0.5, 3.0, (n, 3))
    behind = rng.integers(1, 3, n)  # one or two corners behind the camera
    for i in range(n):
        v[i, : behind[i], 2] *= -1.0
    p = rng.uniform(-0.3, 0.3, (n, 2))
    gb = rng.normal(size=(n, 3))
    gz = rng.normal(size=n)
    dev = "cpu"
    verts = wp.array(v.astype(np.float32), dtype=wp.mat33, device=dev, requires_grad=True)
    pts = wp.array(p.astype(np.float32), dtype=wp.vec2, device=dev)
    bary = wp.zeros(n, dtype=wp.vec3, device=dev, requires_grad=True)
    depth = wp.zeros(n, dtype=float, device=dev, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(_cut_point, n, inputs=[pts, verts], outputs=[bary, depth], device=dev)
    g_bary = wp.array(gb.astype(np.float32), dtype=wp.vec3, device=dev)
    g_depth = wp.array(gz.astype(np.float32), dtype=float, device=dev)
    tape.backward(grads={bary: g_bary, depth: g_depth})
    out = wp.zeros(n, dtype=wp.mat33, device=dev)
    wp.launch(_cut_point_adjoint, n, inputs=[pts, verts, g_bary, g_depth], outputs=[out],
              device=dev)  # fmt: skip
    want = verts.grad.numpy().astype(np.float64)
    got = out.numpy().astype(np.float64)
    # the same derivative in two float32 orders of operations, relative to each
    # face's gradient scale; 1 / z and 1 / area amplify the rounding on thin or
    # grazing faces (measured: 2.8e-5 at most over these 200 faces)
    scale = np.abs(want).reshape(n, -1).max(1)[:, None, None]
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-4)


def test_updates_moving_between_cut_and_uncut_views_equal_a_fresh_sensor(device):
    """The sensor's clip workspace skips the clip pass when nothing is behind the
    near plane and the last pass kept every face (``static_faces``). Updates that
    alternate a view where the ground reaches behind the camera with one high above
    it (every face in front) equal a fresh sensor's first update, every channel bit
    for bit (the same kernels on the same inputs)."""
    g, _ = _scene()
    cut, high = _camera(), wsim.look_at_transform((0.3, 0.2, 30.0), (0.3, 1.0, 0.0))
    body_q = wp.array([_BOX_POSE], dtype=wp.transform, device=device)
    fovs = wp.array([FOV], dtype=wp.float32, device=device)
    cam = wp.array([[high]], dtype=wp.transform, device=device)
    sensor = wsim.CameraSensor(g, image_size=(H, W), device=device, light_direction=LIGHT)
    splits = []
    for view in (high, cut, high, high, high, cut, high):
        cam.assign(np.array([[view]], np.float32))
        got = sensor.update(camera_transforms=cam, camera_fovs=fovs, body_q=body_q).numpy()
        fresh = wsim.CameraSensor(g, image_size=(H, W), device=device, light_direction=LIGHT)
        want = fresh.update(camera_transforms=cam, camera_fovs=fovs, body_q=body_q).numpy()
        assert (want["shape_index"][0, 0] == 2).mean() > 0.3  # the ground is in view
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        splits.append(int(sensor.frames[0].workspace.clip.any_split.numpy()[0]))
    assert splits == [0, 1, 0, 0, 0, 1, 0]  # the near plane cut the ground where it should
