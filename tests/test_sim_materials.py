"""CameraSensor with per-face materials and UV textures (the USD stage renderer's
material table and texture formula): the albedo against a float64 NumPy bilinear
lookup, gradients (pose, camera, field of view, material colour, texels) against
central differences through both backwards, bad input named."""

import numpy as np
import pytest
import warp as wp
from central_differences import central_difference, floats

import warpraster.sim as wsim
from warpraster.shading.atlas import Atlas, TextureWrap
from warpraster.shading.material_table import (
    CornerAlbedo,
    MaterialTable,
    face_albedo,
    face_albedo_adjoint,
    material_table,
)

_QUAD_V = np.array([[-0.5, -0.5, 0.0], [0.5, -0.5, 0.0], [0.5, 0.5, 0.0], [-0.5, 0.5, 0.0]])
_QUAD_F = np.array([[0, 1, 2], [0, 2, 3]])
_QUAD_UV = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
_TEX_H, _TEX_W = 4, 6


def _texture():
    rng = np.random.default_rng(5)
    return rng.uniform(0.2, 1.0, (_TEX_H, _TEX_W, 3))


def _ramp():
    """Texels linear in the texel index: bilinear lookups inside the texel centres'
    span are then exactly linear in the UV (no slope jumps at texel centre lines)."""
    j, i = np.meshgrid(np.arange(_TEX_W), np.arange(_TEX_H))
    v = 0.2 + 0.1 * j + 0.05 * i
    return v[..., None] * np.array([1.0, 0.8, 0.6])


#: UVs of the random texture's quad (repeat in s across u = 1, clamp in t), and of the
#: ramp's (inside the texel centres' span: x in [0.1, 4.9], y in [0.1, 2.9] texels).
_RANDOM_UV = _QUAD_UV * 1.3 - 0.1
_RAMP_UV = np.array([0.1, 0.15]) + np.array([0.8, 0.7]) * _QUAD_UV


def _scene(texture=_texture, uvs=_RANDOM_UV):
    """Three shapes: a textured quad (material 0, body 0), a quad of a plain shared
    material (material 1, body 1, per-face ids), a small quad of its own colour."""
    g = wsim.SensorGeometry()
    tex = g.add_material((0.9, 0.8, 0.7), texture(), wrap=("repeat", "clamp"))
    plain = g.add_material((0.3, 0.6, 0.9))
    g.add_body_mesh(0, _QUAD_V * 0.9, _QUAD_F, material=tex, uvs=uvs)
    g.add_body_mesh(1, _QUAD_V * 0.5, _QUAD_F, face_materials=[plain, plain])
    g.add_static_mesh(_QUAD_V * 0.3 + [0.9, 0.7, -0.2], _QUAD_F, color=(0.7, 0.2, 0.2))
    turn = wp.quat_from_axis_angle(wp.vec3(0.0, 0.0, 1.0), 0.3)
    bodies = [(-0.25, 0.1, 0.0, 0.0, 0.0, 0.0, 1.0), (0.75, -0.55, 0.1, *turn)]
    cams = [wsim.look_at_transform((0.3, -0.5, 2.6), (0.1, 0.0, 0.0))]
    return g, bodies, cams


def _sensor(device, sigma=0.0, deterministic=True, size=(28, 36), **scene):
    g, bodies, cams = _scene(**scene)
    sensor = wsim.CameraSensor(
        g, image_size=size, silhouette_sigma=sigma, device=device, deterministic=deterministic,
        light_direction=(-0.3, 0.4, -1.0), requires_grad=True, material_grad=True,
    )  # fmt: skip
    body_q = wp.array(bodies, dtype=wp.transform, device=device, requires_grad=True)
    cam_q = wp.array([cams], dtype=wp.transform, device=device, requires_grad=True)
    fovs = wp.array([0.8], dtype=wp.float32, device=device, requires_grad=True)
    return sensor, body_q, cam_q, fovs


def _wrap(i, n, mode):
    if mode == "repeat":
        return i % n
    return np.clip(i, 0, n - 1)  # clamp


def _bilinear64(tex, uv, wrap):
    """Float64 bilinear lookup, v = 0 the bottom row (USD's st), texel centres at half
    integers: the texture formula written out independently."""
    h, w = tex.shape[:2]
    x = uv[..., 0] * w - 0.5
    y = (1.0 - uv[..., 1]) * h - 0.5
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    x0, y0 = x0.astype(int), y0.astype(int)
    xs = (_wrap(x0, w, wrap[0]), _wrap(x0 + 1, w, wrap[0]))
    ys = (_wrap(y0, h, wrap[1]), _wrap(y0 + 1, h, wrap[1]))
    top = tex[ys[0], xs[0]] * (1 - fx) + tex[ys[0], xs[1]] * fx
    bottom = tex[ys[1], xs[0]] * (1 - fx) + tex[ys[1], xs[1]] * fx
    return top * (1 - fy) + bottom * fy


def test_albedo_is_the_material_colour_times_its_texture_at_the_uv(device):
    sensor, body_q, cam_q, fovs = _sensor(device)
    out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
    albedo = out.albedo.numpy()[0, 0]
    frags = out.workspace.fragments
    p2f = frags.pix_to_face.numpy()[0, :, :, 0]
    bary = frags.bary_coords.numpy()[0, :, :, 0].astype(np.float64)
    packed = sensor.geometry.images(1, 1)
    shape = packed["face_shape"]
    uv = sensor.geometry.face_tables()["corner_uv"][packed["face_source"]].astype(np.float64)
    tex_px = p2f >= 0
    tex_px &= shape[np.maximum(p2f, 0)] == 0
    assert tex_px.sum() > 100  # the textured quad covers a good part of the image
    f = p2f[tex_px]
    st = np.einsum("pc,pcj->pj", bary[tex_px], uv[f])
    want = np.array([0.9, 0.8, 0.7]) * _bilinear64(_texture(), st, ("repeat", "clamp"))
    # float32 barycentrics and UVs: the UV's rounding (~1e-7) times the texture's
    # slope (<= 6 texels a unit x 0.8 a texel) and float32 products: < 1e-5
    np.testing.assert_allclose(albedo[tex_px], want, atol=1e-5)
    for s, colour in ((1, (0.3, 0.6, 0.9)), (2, (0.7, 0.2, 0.2))):
        m = (p2f >= 0) & (shape[np.maximum(p2f, 0)] == s)
        assert m.sum() > 5
        np.testing.assert_array_equal(albedo[m], np.tile(np.float32(colour), (m.sum(), 1)))


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_textured_multi_material_gradients_match_central_differences(device, deterministic):
    """Colour loss (random target) of the textured scene with soft outlines: gradients
    of body translations and rotation, a camera translation, the field of view, the
    textured material's colour and a texel against central differences, through the
    deterministic backward and Warp's generated adjoints."""
    # the ramp texture: a bilinear lookup's slope jumps where a UV crosses a texel
    # centre line, so central differences of a random texture average two slopes for
    # the pixels that cross one within the step (measured: 12% off for a body
    # translation); the slope itself is checked below, away from those lines
    sensor, body_q, cam_q, fovs = _sensor(device, 1e-4, deterministic, texture=_ramp,
                                          uvs=_RAMP_UV)  # fmt: skip
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    rng = np.random.default_rng(0)
    target = wp.array(rng.uniform(0, 1, sensor.frames[0].color.shape + (3,)), dtype=wp.vec3,
                      device=device)  # fmt: skip
    texels = sensor.atlas.texels
    row = 3  # the textured material: rows 0..2 are the shapes', then materials 0, 1
    texel = 1 + 1 * _TEX_W + 3  # atlas texel 0 is a black one no texture uses

    def forward():
        loss.zero_()
        out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
        wsim.image_loss(out.color, target, loss, weight=1e-2)

    cases = [  # (array, index of the perturbed float32, step)
        (body_q, (0, 0), 1e-3), (body_q, (0, 1), 1e-3), (body_q, (1, 5), 1e-3),
        (cam_q, (0, 2), 1e-3), (fovs, (0, 0), 1e-3),
        (sensor.shape_colors, (row, 0), 1e-2), (texels, (texel, 1), 1e-2),
    ]  # fmt: skip

    def loss_at():
        forward()
        return loss.numpy()[0]

    for arr, idx, h in cases:
        tape = wp.Tape()
        with tape:
            forward()
        tape.backward(loss)
        g = float(floats(arr.grad)[idx])
        tape.reset()
        fd = central_difference(arr, idx, h, loss_at)
        assert abs(fd) > 1e-4, (idx, fd)
        # Pose steps of 1e-3 (m, rad) move outlines by ~0.02 px, inside the soft band
        # (sigma 1e-4: ~0.5 px here); with the ramp texture the colour is smooth
        # inside each face. Measured for the camera's z translation, with this texture
        # and with a flat one alike: central differences scatter by +-5% over steps
        # 1e-4 to 3e-3 (the soft band's nearest-slot choice switches between faces
        # for a few outside pixels, and the float32 loss's rounding weighs more at
        # small steps), and agree with the analytic value within 0.5% at 1e-3; the
        # body cases agree within 1% over that range. The colour and texel terms are
        # linear. 3%: that agreement, with margin.
        assert abs(g - fd) <= 0.03 * abs(fd) + 1e-6, (idx, g, fd)


@wp.kernel
def _albedo_and_adjoint(table: MaterialTable, corners: CornerAlbedo, b: wp.array(dtype=wp.vec3),
                        g: wp.vec3, albedo: wp.array(dtype=wp.vec3),
                        g_kd: wp.array(dtype=wp.vec3), g_b: wp.array(dtype=wp.vec3)):  # fmt: skip
    i = wp.tid()
    a = face_albedo(table, 0, corners, 0, b[i])
    albedo[i] = wp.vec3(a[0], a[1], a[2])
    gk, gb, _gt = face_albedo_adjoint(table, 0, corners, 0, b[i], g)
    g_kd[i] = gk
    g_b[i] = gb


def test_face_albedo_adjoint_matches_central_differences_of_the_random_texture():
    """The hand-written slope of the bilinear lookup (the deterministic backward's),
    at random points of a face, against central differences in float64 of the
    float32 lookup, for points whose UV is at least 0.02 texel from a texel centre
    line (where the slope jumps) and from the repeat seam."""
    rng = np.random.default_rng(3)
    atlas = Atlas(diffuse=[[0.9, 0.8, 0.7]], opacity=[1.0],
                  textures=[(np.concatenate([_texture(), np.ones((_TEX_H, _TEX_W, 1))], 2),
                             TextureWrap.REPEAT, TextureWrap.CLAMP, (1.0,) * 4, (0.0,) * 4)],
                  device="cpu")  # fmt: skip
    uv = np.array([[[-0.1, -0.1], [1.2, -0.1], [1.2, 1.2]]], np.float32)
    corners = CornerAlbedo()
    corners.uv = wp.array(uv, dtype=wp.vec2, device="cpu")
    corners.color = wp.zeros((1, 3), dtype=wp.vec4, device="cpu")  # unused: a material
    b = rng.dirichlet((2.0, 2.0, 2.0), 64)
    st = b @ uv[0].astype(np.float64)
    x, y = st[:, 0] * _TEX_W - 0.5, (1 - st[:, 1]) * _TEX_H - 0.5
    away = (np.abs(x - np.round(x)) > 0.02) & (np.abs(y - np.round(y)) > 0.02)
    b = b[away]
    g = np.array([0.3, -0.5, 0.7])

    def run(bary):
        n = bary.shape[0]
        outs = [wp.zeros(n, dtype=wp.vec3, device="cpu") for _ in range(3)]
        wp.launch(_albedo_and_adjoint, n, inputs=[material_table(atlas), corners,
                  wp.array(bary, dtype=wp.vec3, device="cpu"), wp.vec3(*g), *outs],
                  device="cpu")  # fmt: skip
        return [o.numpy().astype(np.float64) for o in outs]

    albedo, g_kd, g_b = run(b)
    h = 1e-3  # moves the UV by <= 1.3e-3 (< 0.01 texel: no centre line crossed)
    fd = np.stack([(run(b + h * e)[0] - run(b - h * e)[0]) @ g / (2 * h) for e in np.eye(3)], 1)
    # float32 lookups differenced over 2e-3: rounding ~1e-7 / 2e-3 ~ 1e-4 relative
    np.testing.assert_allclose(g_b, fd, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(g_kd, g * albedo / np.array([0.9, 0.8, 0.7]), rtol=1e-5)


def test_bad_materials_are_named():
    g = wsim.SensorGeometry()
    tex = g.add_material((1.0, 1.0, 1.0), _texture())
    with pytest.raises(ValueError, match="uvs"):
        g.add_static_mesh(_QUAD_V, _QUAD_F, material=tex)
    with pytest.raises(ValueError, match="face_materials / material"):
        g.add_static_mesh(_QUAD_V, _QUAD_F, material=5)
    with pytest.raises(ValueError, match="face_materials must"):
        g.add_static_mesh(_QUAD_V, _QUAD_F, face_materials=[0])
    with pytest.raises(ValueError, match="uvs must"):
        g.add_static_mesh(_QUAD_V, _QUAD_F, material=tex, uvs=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="texture must"):
        g.add_material((1.0, 1.0, 1.0), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="texels must"):
        g.add_material((1.0, 1.0, 1.0), np.full((2, 2, 3), -1.0))
    with pytest.raises(ValueError, match="unknown wrap mode"):
        g.add_material((1.0, 1.0, 1.0), _texture(), wrap=("repeat", "bounce"))
    with pytest.raises(ValueError, match="color must"):
        g.add_material((1.0, np.nan, 1.0))


def test_textured_steps_replayed_as_graphs_equal_the_eager_ones():
    """The texel gradients' sorted sums inside the sensor's replayed backward graph
    (``call_graphs=True``, forced on the cpu device): four fresh-tape steps give the
    eager steps' images and gradients bit for bit (the same kernels on the same
    arrays)."""

    def steps(call_graphs):
        sensor, body_q, cam_q, fovs = _sensor("cpu", 1e-4, True, texture=_ramp, uvs=_RAMP_UV)
        sensor.call_graphs = call_graphs
        loss = wp.zeros(1, dtype=float, device="cpu", requires_grad=True)
        rgb = np.random.default_rng(0).uniform(0, 1, (*sensor.frames[0].color.shape, 3))
        target = wp.array(rgb, dtype=wp.vec3, device="cpu")
        trained = (body_q, sensor.shape_colors, sensor.atlas.texels)
        out = []
        for _ in range(4):
            for a in trained:
                a.grad.zero_()
            loss.zero_()
            tape = wp.Tape()
            with tape:
                frame = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
                wsim.image_loss(frame.color, target, loss, weight=1e-2)
            tape.backward(loss)
            out.append([frame.color.numpy().copy()] + [a.grad.numpy().copy() for a in trained])
        return out

    eager, replayed = steps(False), steps(True)
    assert np.abs(eager[0][3]).max() > 0  # the texels do get gradients
    for a, b in zip(eager, replayed, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
