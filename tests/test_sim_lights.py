"""CameraSensor with the shading core's lights (a LightList or one light per image):
colours against a float64 NumPy ray caster, gradients through the light terms
against central differences (both backwards; the light arrays' own with Warp's
generated adjoints), bad input named."""

import numpy as np
import pytest
import warp as wp
from central_differences import central_difference, floats
from test_sim_sensor import _apply, _box_scene, _raycast

import warpraster.sim as wsim
from warpraster.shading import DirectionalLights, PointLights
from warpraster.shading.lighting import LightKind, LightList

LIGHT = (-0.577, 0.577, -0.577)


def _light_list(device, requires_grad=False, per_image=False):
    """Ambient, directional and point lights; per image: world 1 has only the first two."""
    kinds = [LightKind.AMBIENT, LightKind.DIRECTIONAL, LightKind.POINT]
    param = [(0.0, 0.0, 0.0), (0.3, -0.5, 0.8), (0.4, 0.1, 0.7)]
    ambient = [(0.05, 0.04, 0.03), (0.02, 0.02, 0.02), (0.0, 0.01, 0.0)]
    diffuse = [(0.0, 0.0, 0.0), (0.4, 0.35, 0.3), (0.8, 0.7, 0.9)]
    if per_image:  # images (world 0, world 1): lights 0..2 and 0..1 (rows repeated)
        kinds, param, ambient, diffuse = (x + x[:2] for x in (kinds, param, ambient, diffuse))
        first = [0, 3, 5]
    else:
        first = None
    return LightList(kinds=kinds, param=param, ambient=ambient, diffuse=diffuse,
                     specular=diffuse, first=first, device=device,
                     requires_grad=requires_grad)  # fmt: skip


def _extra_light64(kinds, param, ambient, diffuse, hit, nrm, albedo):
    """The lights' term in float64: albedo * sum_j (ambient_j + diffuse_j relu(n . l))."""
    total = np.zeros(hit.shape)
    for k, p, la, dc in zip(kinds, param, ambient, diffuse, strict=True):
        total += la
        if k == LightKind.AMBIENT:
            continue
        d = np.asarray(p, float) - hit if k == LightKind.POINT else np.broadcast_to(p, hit.shape)
        d = d / np.linalg.norm(d, axis=-1, keepdims=True)
        total += np.asarray(dc) * np.maximum((nrm * d).sum(-1, keepdims=True), 0.0)
    return albedo * total


def test_light_list_colours_match_a_float64_ray_caster(device):
    """Two worlds (a posed box each) + a ground, per-image light lists (world 1 without
    the point light): every image's colour against the ray caster plus the lights."""
    h, w = 30, 40
    g, bodies, cams, (bv, bf, pv, pf) = _box_scene()
    lights = _light_list(device, per_image=True)
    sensor = wsim.CameraSensor(g, world_count=2, camera_count=1, image_size=(h, w),
                               device=device, light_direction=LIGHT, lights=lights)  # fmt: skip
    fov = 0.9
    out = sensor.update(
        camera_transforms=wp.array([[cams[0], cams[0]]], dtype=wp.transform, device=device),
        camera_fovs=wp.array([fov], dtype=wp.float32, device=device),
        body_q=wp.array(bodies, dtype=wp.transform, device=device),
    ).numpy()
    colors = g.shape_colors().astype(np.float64)
    tf = np.asarray(cams[0], np.float64)
    for wi in range(2):
        box = _apply(bodies[wi], bv.astype(np.float64))
        tris = np.concatenate([box[bf], pv.astype(np.float64)[pf]])
        shape_of = np.array([wi] * len(bf) + [2] * len(pf))
        face, depth, fwd, nrm, col, margin = _raycast(tris, shape_of, colors, tf, fov, h, w,
                                                      LIGHT)  # fmt: skip
        sure = (face >= 0) & (margin > 1e-3)
        assert sure.sum() > 100
        # the hit points from the ray caster's depth along its rays
        got = out["depth"][wi, 0]
        np.testing.assert_allclose(got[sure], depth[sure], rtol=1e-4, atol=1e-5)
        rays = _rays(tf, fov, h, w)
        hit = tf[:3] + depth[..., None] * rays
        albedo = colors[shape_of[np.maximum(face, 0)]]
        rows = [0, 1, 2] if wi == 0 else [3, 4]  # the image's lights (first = 0, 3, 5)
        kinds = [int(k) for k in lights.kinds.numpy()[rows]]
        param, amb, dif = (getattr(lights, a).numpy()[rows].astype(np.float64)
                           for a in ("param", "ambient_color", "diffuse_color"))  # fmt: skip
        extra = _extra_light64(kinds, param, amb, dif, hit, nrm, albedo)
        # float32 shading of ~1-valued terms (~1e-6): as the sensor's colour test
        np.testing.assert_allclose(out["color"][wi, 0][sure], (col + extra)[sure], atol=1e-5)


def _rays(tf, fov, h, w):
    from test_sim_sensor import _quat_matrix

    rot = _quat_matrix(tf[3:])
    ys, xs = np.mgrid[0:h, 0:w]
    t = np.tan(fov / 2)
    d = np.stack([((xs + 0.5) / w - 0.5) * 2 * t * w / h, -((ys + 0.5) / h - 0.5) * 2 * t,
                  -np.ones_like(xs, float)], -1) @ rot.T  # fmt: skip
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def _plane_setup(device, deterministic, lights):
    """A tilted 4 m square on a body filling the whole view (no outline in view), lit
    only by the core's lights: the colour is smooth in the pose, the camera and the
    lights (the point light's term varies over the plane)."""
    g = wsim.SensorGeometry()
    quad = np.array([[-2.0, -2.0, 0.0], [2.0, -2.0, 0.0], [2.0, 2.0, 0.0], [-2.0, 2.0, 0.0]])
    g.add_body_mesh(0, quad, [[0, 1, 2], [0, 2, 3]], color=(0.8, 0.6, 0.4))
    sensor = wsim.CameraSensor(g, image_size=(24, 28), device=device,
                               deterministic=deterministic, light_direction=None,
                               ambient=False, lights=lights, requires_grad=True)  # fmt: skip
    tilt = wp.quat_from_axis_angle(wp.normalize(wp.vec3(1.0, 0.4, 0.0)), 0.2)
    body_q = wp.array([(0.05, -0.03, 0.1, *tilt)], dtype=wp.transform, device=device,
                      requires_grad=True)  # fmt: skip
    cam_q = wp.array([[wsim.look_at_transform((0.2, -0.1, 1.0), (0.1, 0.2, 0.0))]],
                     dtype=wp.transform, device=device, requires_grad=True)  # fmt: skip
    fovs = wp.array([0.8], dtype=wp.float32, device=device, requires_grad=True)
    return sensor, body_q, cam_q, fovs


def _check(arrays, forward, loss, cases):
    tape = wp.Tape()
    with tape:
        forward()
    tape.backward(loss)
    grads = {id(a): floats(a.grad) for a in arrays}
    tape.reset()

    def loss_at():
        forward()
        return loss.numpy()[0]

    for arr, idx, h in cases:
        fd = central_difference(arr, idx, h, loss_at)
        g = float(grads[id(arr)][idx])
        # the float32 loss (~0.5, ulp 6e-8) over a step of 1e-3 leaves ~1e-4 of rounding
        # in the quotient: the cases are ones whose gradient is >= 0.03
        assert abs(fd) > 0.03, (idx, fd)
        # No outline in view (a soft outline's nearest-slot choices make central
        # differences of a sphere scatter by 20%, with or without these lights): the
        # loss is smooth. Measured over steps 1e-4 to 1e-3: the translations, camera
        # and lights agree within 0.5%; the rotation's components (a quaternion of 4
        # free numbers also scales the plane) bend, their central differences moving
        # by up to 2% with the step: 3%.
        assert abs(g - fd) <= 0.03 * abs(fd) + 1e-6, (idx, g, fd)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_light_list_gradients_match_central_differences(device, deterministic):
    """Colour loss of a plane filling the view, lit only by the core's lights (a point
    light among them): gradients of the body pose, the camera and the field of view,
    and with the generated adjoints also of the point light's location and the
    lights' colours, against central differences."""
    lights = _light_list(device, requires_grad=not deterministic)
    sensor, body_q, cam_q, fovs = _plane_setup(device, deterministic, lights)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    # a target near the image (a small loss whose float32 rounding does not swamp the
    # differences), off by a random +-0.05 a channel
    first = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
    jitter = np.random.default_rng(3).uniform(-0.05, 0.05, (1, 1, 24, 28, 3))
    target = wp.array(first.color.numpy() + jitter, dtype=wp.vec3, device=device)

    def forward():
        loss.zero_()
        out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
        wsim.image_loss(out.color, target, loss)

    arrays = [body_q, cam_q, fovs]
    cases = [(body_q, (0, 2), 1e-3), (body_q, (0, 3), 3e-4), (body_q, (0, 6), 3e-4),
             (cam_q, (0, 1), 1e-3), (fovs, (0, 0), 1e-3)]  # fmt: skip
    if not deterministic:
        arrays += [lights.param, lights.diffuse_color, lights.ambient_color]
        cases += [(lights.param, (2, 2), 1e-3), (lights.param, (1, 1), 1e-3),
                  (lights.diffuse_color, (2, 1), 1e-2),
                  (lights.ambient_color, (0, 0), 1e-2)]  # fmt: skip
    _check(arrays, forward, loss, cases)


def test_one_light_per_image_and_bad_lights():
    g, _, _, _ = _box_scene(ground=False)
    # a PyTorch3D-style light, one row for every image, is accepted
    wsim.CameraSensor(g, world_count=2, device="cpu",
                      lights=PointLights(location=((0.0, 0.0, 2.0),), device="cpu"))  # fmt: skip
    with pytest.raises(TypeError, match="lights must be"):
        wsim.CameraSensor(g, world_count=2, device="cpu", lights=[(0.0, 0.0, 1.0)])
    with pytest.raises(ValueError, match="one per image"):
        three = DirectionalLights(direction=[(0, 0, 1)] * 3, device="cpu")
        wsim.CameraSensor(g, world_count=2, device="cpu", lights=three)
    many = LightList(kinds=[LightKind.AMBIENT] * 9, param=[(0, 0, 0)] * 9,
                     ambient=[(0.1, 0.1, 0.1)] * 9, diffuse=[(0, 0, 0)] * 9,
                     specular=[(0, 0, 0)] * 9, device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match="at most 8"):
        wsim.CameraSensor(g, world_count=2, device="cpu", lights=many)
    with pytest.raises(ValueError, match="deterministic=False"):
        wsim.CameraSensor(g, world_count=2, device="cpu",
                          lights=_light_list("cpu", requires_grad=True))  # fmt: skip


def test_lights_per_world_equal_the_same_lights_per_image(device):
    """A light list per world (2 worlds x 2 cameras) renders what the same lists
    given per image (each world's repeated for its cameras) render, bit for bit."""
    g, bodies, cams, _ = _box_scene()
    kinds = [LightKind.AMBIENT, LightKind.POINT, LightKind.DIRECTIONAL]
    param = [(0.0, 0.0, 0.0), (0.4, 0.1, 0.7), (0.3, -0.5, 0.8)]
    ambient = [(0.05, 0.04, 0.03), (0.0, 0.01, 0.0), (0.02, 0.02, 0.02)]
    diffuse = [(0.0, 0.0, 0.0), (0.8, 0.7, 0.9), (0.4, 0.35, 0.3)]

    def rows(order):
        return {name: [v[i] for i in order] for name, v in
                (("kinds", kinds), ("param", param), ("ambient", ambient),
                 ("diffuse", diffuse))}  # fmt: skip

    # world 0: lights 0, 1; world 1: lights 0, 2
    per_world = LightList(**rows([0, 1, 0, 2]), specular=[(0, 0, 0)] * 4, first=[0, 2, 4],
                          device=device)  # fmt: skip
    per_image = LightList(**rows([0, 1, 0, 1, 0, 2, 0, 2]), specular=[(0, 0, 0)] * 8,
                          first=[0, 2, 4, 6, 8], device=device)  # fmt: skip
    args = dict(
        camera_transforms=wp.array([[c, c] for c in cams], dtype=wp.transform, device=device),
        camera_fovs=wp.array([0.9, 0.7], dtype=wp.float32, device=device),
        body_q=wp.array(bodies, dtype=wp.transform, device=device),
    )
    shared = LightList(**rows([0, 1]), specular=[(0, 0, 0)] * 2, device=device)
    images = []
    for lights in (per_world, per_image, shared):
        sensor = wsim.CameraSensor(g, world_count=2, camera_count=2, image_size=(20, 24),
                                   device=device, lights=lights)  # fmt: skip
        assert sensor.light_per_world == (lights is per_world)
        images.append(sensor.update(**args).color.numpy().copy())
    np.testing.assert_array_equal(images[0], images[1])
    # the lights of world 0 are the shared ones, world 1's are not
    np.testing.assert_array_equal(images[0][0], images[2][0])
    assert np.abs(images[0][1] - images[2][1]).max() > 1e-3
