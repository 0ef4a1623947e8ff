"""CameraSensor of a USD stage (warpraster.sim.add_scene / stage_camera): the bundled
stage's meshes, materials and camera seen as the stage renderer sees them, its
albedo computed by the same formula bit for bit, and gradients of a textured,
multi-material stage scene on a body against central differences."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import warp as wp
from central_differences import central_difference, floats

pytest.importorskip("pxr")

import warpraster.sim as wsim  # noqa: E402
import warpraster.usd as wu  # noqa: E402
from warpraster.shading.atlas import sample_atlas  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "warpraster" / "assets" / "default_scene.usda"


def test_bundled_stage_shows_the_stage_renderers_faces_and_albedo(device):
    """The sensor over the bundled stage (every mesh, the checker texture and four
    plain materials, the stage's camera) covers the pixels the stage renderer covers
    with the same faces, and its albedo is the stage renderer's own albedo kernel
    evaluated at the sensor's fragments, bit for bit (one formula, one table)."""
    scene = wu.load_stage(str(STAGE))
    assert any(m.texture is not None for m in scene.materials)
    g = wsim.SensorGeometry()
    wsim.add_scene(g, scene)
    cam = scene.cameras["/World/Camera"]
    tf, fov = wsim.stage_camera(cam)
    h = 60
    w = int(round(h * cam.aspect))  # the apertures' aspect: the same view
    sensor = wsim.CameraSensor(g, image_size=(h, w), device=device)
    out = sensor.update(camera_transforms=wp.array([[tf]], dtype=wp.transform, device=device),
                        camera_fovs=wp.array([fov], dtype=wp.float32, device=device))  # fmt: skip
    frags = out.workspace.fragments
    p2f = frags.pix_to_face.numpy()
    # the sensor's faces are the scene's faces in order: face_source is the scene face
    scene_face = np.where(p2f >= 0, sensor.face_source.numpy()[np.maximum(p2f, 0)], -1)

    r = wu.StageRenderer(scene, camera=cam.name, image_size=(h, w), spp=1, device=device)
    ref = r.render()
    covered = (scene_face[0, ..., 0] >= 0) | (ref.face_id >= 0)
    same = scene_face[0, ..., 0] == ref.face_id
    assert covered.sum() > 1000
    # two cameras' float32 projections: a pixel centre within rounding of an edge may
    # fall on either side (none did at this size; 1% leaves room for other platforms)
    assert same[covered].mean() >= 0.99

    b = r.buffers
    albedo = wp.zeros((1, h, w, 1), dtype=wp.vec3, device=device)
    opacity = wp.zeros((1, h, w, 1), dtype=wp.float32, device=device)
    at_sensor = SimpleNamespace(
        pix_to_face=wp.array(scene_face.astype(np.int32), dtype=wp.int32, device=device),
        bary_coords=frags.bary_coords,
    )
    sample_atlas(at_sensor, b.face_material, b.corner_albedo, b.atlas, albedo_out=albedo,
                 opacity_out=opacity)  # fmt: skip
    hit = scene_face[0, ..., 0] >= 0
    np.testing.assert_array_equal(out.albedo.numpy()[0, 0][hit], albedo.numpy()[0, ..., 0, :][hit])


def _ramp_scene():
    """One mesh of three separate quads: a ramp texture (scaled and biased), a plain
    colour, and no material (per-vertex corner colours). Separate, so every colour
    step between them is a silhouette (the soft outlines' gradients), none is an
    edge inside a surface (a hard step there has no gradient to check)."""
    quad = 0.25 * np.array([[-1.0, -1.0, 0.0], [1.0, -1.0, 0.0], [1.0, 1.0, 0.0], [-1.0, 1.0, 0.0]])
    verts = np.concatenate([quad + [x, 0.0, 0.0] for x in (-0.6, 0.0, 0.6)])
    faces = np.array([f for q in range(3) for f in ((4 * q, 4 * q + 1, 4 * q + 2),
                                                    (4 * q, 4 * q + 2, 4 * q + 3))])  # fmt: skip
    scene = wu.scene_from_arrays(verts, faces, name="/World/Quads")
    m = scene.meshes
    uv = 0.15 + 0.7 * (quad[:, :2] + 0.25) * 2.0  # inside the texel centres' span
    m.uvs[:] = np.concatenate([uv, uv, uv])[faces]
    j, i = np.meshgrid(np.arange(6), np.arange(4))
    ramp = (0.2 + 0.1 * j + 0.05 * i)[..., None] * np.array([1.0, 0.8, 0.6, 0.0]) + [0, 0, 0, 1]
    tex = wu.TextureImage("ramp", ramp.astype(np.float32), wu.WrapMode.CLAMP, wu.WrapMode.CLAMP,
                          (1.0, 0.9, 1.1, 1.0), (0.0, 0.05, -0.02, 0.0))  # fmt: skip
    scene.materials.append(wu.Material("/Looks/Ramp", np.array([0.9, 0.8, 0.7]), texture=tex))
    scene.materials.append(wu.Material("/Looks/Plain", np.array([0.3, 0.6, 0.9])))
    vertex_colors = np.random.default_rng(2).uniform(0.2, 0.9, (12, 3))
    m.colors[..., :3] = vertex_colors[faces]
    m.face_material[:] = [0, 0, 1, 1, -1, -1]  # -1: the corner colours
    return scene


def test_stage_scene_on_a_body_gradients_match_central_differences(device):
    """A stage mesh moved by a body, textured / plain / corner-coloured quads, soft
    outlines, a colour loss: gradients of the body pose, the camera, the textured
    material's colour and a texel against central differences (deterministic
    backward), and the generated backward's gradients equal to them."""
    scene = _ramp_scene()
    g = wsim.SensorGeometry()
    (shape,) = wsim.add_scene(g, scene, bodies={"/World/Quads": 0})
    assert g.shapes[shape].face_materials is not None
    cam = [[wsim.look_at_transform((0.2, -0.4, 1.9), (0.0, 0.0, 0.0))]]
    pose = [(0.05, -0.02, 0.1, *wp.quat_from_axis_angle(wp.normalize(wp.vec3(1.0, 0.5, 0.2)), 0.3))]
    target_rgb = np.random.default_rng(4).uniform(0, 1, (1, 1, 24, 30, 3))
    grads = {}
    for det in (True, False):
        sensor = wsim.CameraSensor(g, image_size=(24, 30), silhouette_sigma=1e-4, device=device,
                                   deterministic=det, light_direction=(-0.3, 0.4, -1.0),
                                   requires_grad=True, material_grad=True)  # fmt: skip
        body_q = wp.array(pose, dtype=wp.transform, device=device, requires_grad=True)
        cam_q = wp.array(cam, dtype=wp.transform, device=device, requires_grad=True)
        fovs = wp.array([0.9], dtype=wp.float32, device=device, requires_grad=True)
        loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
        target = wp.array(target_rgb, dtype=wp.vec3, device=device)

        def forward(sensor=sensor, body_q=body_q, cam_q=cam_q, fovs=fovs, loss=loss,
                    target=target):  # fmt: skip
            loss.zero_()
            out = sensor.update(camera_transforms=cam_q, camera_fovs=fovs, body_q=body_q)
            wsim.image_loss(out.color, target, loss, weight=1e-2)

        tape = wp.Tape()
        with tape:
            forward()
        tape.backward(loss)
        arrays = {"body": body_q, "cam": cam_q, "colour": sensor.shape_colors,
                  "texels": sensor.atlas.texels}  # fmt: skip
        grads[det] = {k: floats(a.grad) for k, a in arrays.items()}
        tape.reset()
        if not det:
            continue
        ramp_row = len(g.shapes)  # the first material added: the ramp (the plain one next)
        texel = 1 + 1 * 6 + 2
        cases = [("body", (0, 0), 1e-3), ("body", (0, 4), 1e-3), ("cam", (0, 1), 1e-3),
                 ("colour", (ramp_row, 2), 1e-2), ("texels", (texel, 0), 1e-2)]  # fmt: skip

        def loss_at(forward=forward, loss=loss):
            forward()
            return loss.numpy()[0]

        for name, idx, step in cases:
            fd = central_difference(arrays[name], idx, step, loss_at)
            gv = float(grads[det][name][idx])
            assert abs(fd) > 1e-4, (name, idx, fd)
            # as tests/test_sim_materials.py: pose steps of 1e-3 stay inside the soft
            # band and the ramp texture's linear span; colour and texel terms are linear
            assert abs(gv - fd) <= 0.03 * abs(fd) + 1e-6, (name, idx, gv, fd)
    for name in grads[True]:
        # the same derivative summed in two orders (fixed sums / float atomics): float32
        # rounding of sums of ~700 pixel terms
        scale = np.abs(grads[True][name]).max()
        np.testing.assert_allclose(grads[False][name], grads[True][name], atol=1e-5 * scale)
