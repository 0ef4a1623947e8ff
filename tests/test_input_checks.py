"""Bad input is refused at set-up, naming the argument, before any kernel runs.

Covers the per-face / per-vertex / per-mesh inputs of the textures, lights,
materials, interpolation and the sim sensor (rows that do not match the meshes,
index values out of range, non-finite or out-of-range values), the Renderer's
``step``, BlendParams' copy of its background, host copies from ``numpy()`` and
the ``requires_grad`` mistakes of the Renderer and the CameraSensor.

"Before any kernel runs" is checked by counting ``wp.launch`` calls.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

import warpraster as wr
import warpraster.sim as wsim
from warpraster import shading
from warpraster.renderer import MeshRenderer, Renderer

pytestmark = pytest.mark.skipif("cpu" not in DEVICES, reason="builds its scenes on the cpu")
DEV = "cpu"


@contextlib.contextmanager
def no_launch(monkeypatch):
    """Fails the test if a Warp kernel is launched inside the block."""
    launches = []
    real = wp.launch
    monkeypatch.setattr(wp, "launch", lambda *a, **k: launches.append(a[0]) or real(*a, **k))
    try:
        yield
    finally:
        monkeypatch.setattr(wp, "launch", real)
    assert launches == [], f"kernels ran before the error: {launches}"


# ----------------------------------------------------------------------------- a small scene
def _scene():
    """Two meshes (two quads of two faces each) in front of the camera."""
    quad = np.array([[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]], np.float32)
    verts = np.concatenate([quad * 0.8 + [0, 0, 3], quad * 0.5 + [0.2, 0, 4]]).astype(np.float32)
    faces = np.array([[0, 1, 2], [0, 2, 3], [4, 5, 6], [4, 6, 7]], np.int32)
    first, count = np.array([0, 2], np.int32), np.array([2, 2], np.int32)
    return verts, faces, first, count


def _cams():
    return wr.FoVPerspectiveCameras(device=DEV)


def _uv_textures(num_faces=4, maps_batch=2, **kw):
    rng = np.random.default_rng(0)
    maps = rng.uniform(0, 1, (maps_batch, 6, 6, 3)).astype(np.float32)
    verts_uvs = rng.uniform(0, 1, (8, 2)).astype(np.float32)
    faces_uvs = np.array([[0, 1, 2], [0, 2, 3], [4, 5, 6], [4, 6, 7]], np.int32)[:num_faces]
    return shading.TexturesUV(maps, faces_uvs, verts_uvs, device=DEV, **kw)


def _mesh_renderer(shader=None):
    cams = _cams()
    settings = wr.RasterizationSettings(image_size=8, faces_per_pixel=1)
    return MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
        shader=shader or shading.HardPhongShader(cameras=cams, device=DEV),
    )


def _renderer(textures=None, shader=None, **kw):
    verts, faces, first, count = _scene()
    cams = _cams()
    return Renderer(
        cameras=cams,
        raster_settings=wr.RasterizationSettings(image_size=8, faces_per_pixel=1),
        shader=shader or shading.HardPhongShader(cameras=cams, device=DEV),
        faces=faces,
        mesh_to_face_first_idx=first,
        num_faces_per_mesh=count,
        num_verts=len(verts),
        textures=textures,
        **kw,
    )


# ----------------------------------------------------------------------------- 1. mesh rows
@pytest.mark.parametrize("short", [1, 3])
def test_uv_faces_shorter_than_the_mesh_are_refused_by_every_renderer(monkeypatch, short):
    """faces_uvs one row short (read garbage) or many short (read past the end):
    MeshRenderer at the call, Renderer at construction, sample_textures with the
    faces; all before any kernel."""
    verts, faces, first, count = _scene()
    tex = _uv_textures(num_faces=4 - short)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="faces_uvs has"):
        _mesh_renderer()(verts, faces, first, count, textures=tex)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="faces_uvs has"):
        _renderer(textures=tex)
    p2f = wp.zeros((2, 4, 4, 1), dtype=wp.int32, device=DEV)
    bary = wp.zeros((2, 4, 4, 1), dtype=wp.vec3, device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="faces_uvs has"):
        tex.sample_textures((p2f, bary), faces)
    # without faces: validate reads pix_to_face and finds a face past faces_uvs
    p2f.fill_(3)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="pix_to_face holds face 3"):
        tex.sample_textures((p2f, bary))


def test_mipmap_texture_checks_faces_rows_in_every_filter_mode(monkeypatch):
    rng = np.random.default_rng(0)
    tex = shading.TexturesUVMipmap(
        rng.uniform(0, 1, (1, 8, 8, 3)).astype(np.float32),
        np.array([[0, 1, 2]], np.int32),
        rng.uniform(0, 1, (3, 2)).astype(np.float32),
        filter_mode="linear",
        device=DEV,
    )
    p2f = wp.zeros((1, 4, 4, 1), dtype=wp.int32, device=DEV)
    bary = wp.zeros((1, 4, 4, 1), dtype=wp.vec3, device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="faces_uvs has 1 rows for 2"):
        tex.sample_textures((p2f, bary), np.zeros((2, 3), np.int32))


def test_per_vertex_and_per_mesh_rows_are_refused_before_any_kernel(monkeypatch):
    verts, faces, first, count = _scene()
    colours = shading.TexturesVertex(np.ones((len(verts) - 1, 3), np.float32), device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="verts_features has 7 rows"):
        _mesh_renderer()(verts, faces, first, count, textures=colours)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="verts_features has 7 rows"):
        _renderer(textures=colours)
    three_maps = _uv_textures(maps_batch=3)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="maps has 3 maps for 2"):
        _mesh_renderer()(verts, faces, first, count, textures=three_maps)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="maps has 3 maps for 2"):
        _renderer(textures=three_maps)
    lights = shading.PointLights(location=np.zeros((3, 3)) + [0, 1, 0], device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="lights has a batch of 3"):
        _mesh_renderer()(verts, faces, first, count, lights=lights)
    three_cams = wr.FoVPerspectiveCameras(fov=np.array([60.0, 50.0, 40.0]), device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match=r"\(3\) of cameras"):
        _mesh_renderer()(verts, faces, first, count, cameras=three_cams)
    cams = _cams()
    shader = shading.HardPhongShader(cameras=cams, lights=lights, device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="lights has a batch of 3"):
        _renderer(shader=shader)
    mats = shading.Materials(shininess=np.array([1.0, 2.0, 3.0]), device=DEV)
    shader = shading.HardPhongShader(cameras=cams, materials=mats, device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="materials has a batch of 3"):
        _renderer(shader=shader)


def test_index_values_and_non_finite_texture_values_are_refused_at_construction():
    maps = np.ones((1, 4, 4, 3), np.float32)
    uvs = np.full((3, 2), 0.5, np.float32)
    with pytest.raises(ValueError, match="faces_uvs has indices in"):
        shading.TexturesUV(maps, np.array([[0, 1, 3]], np.int32), uvs, device=DEV)
    with pytest.raises(ValueError, match="faces_uvs has indices in"):
        shading.TexturesUVMipmap(maps, np.array([[0, 1, -1]], np.int32), uvs, device=DEV)
    nan_uvs = uvs.copy()
    nan_uvs[1, 0] = np.nan  # used to be sampled as zeros: a finite, wrong image
    with pytest.raises(ValueError, match="verts_uvs must be finite"):
        shading.TexturesUV(maps, np.array([[0, 1, 2]], np.int32), nan_uvs, device=DEV)
    with pytest.raises(ValueError, match="verts_uvs must be finite"):
        shading.TexturesUVMipmap(
            maps, np.array([[0, 1, 2]], np.int32), wp.array(nan_uvs, device=DEV), device=DEV
        )
    with pytest.raises(ValueError, match="verts_features must be finite"):
        shading.TexturesVertex(np.array([[0.0, np.inf, 0.0]], np.float32), device=DEV)


def test_interpolation_checks_warp_pix_to_face_against_the_attribute_rows(monkeypatch):
    p2f = wp.full((1, 2, 2, 1), 2, dtype=wp.int32, device=DEV)  # face 2 of 2
    bary = wp.zeros((1, 2, 2, 1), dtype=wp.vec3, device=DEV)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="face_attributes has 2 faces"):
        shading.interpolate_face_attributes(p2f, bary, np.zeros((2, 3, 4), np.float32))
    faces = np.array([[0, 1, 2], [1, 2, 3]], np.int32)
    with no_launch(monkeypatch), pytest.raises(ValueError, match="faces has 2 faces"):
        shading.interpolate_vertex_attributes(p2f, bary, np.zeros((4, 2), np.float32), faces)


# ----------------------------------------------------------------------------- 2. values
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: shading.PointLights(location=[np.nan, 1.0, 0.0], device=DEV), "location"),
        (lambda: shading.PointLights(
            location=wp.array([[0.0, np.nan, 0.0]], dtype=wp.vec3, device=DEV)), "location"),
        (lambda: shading.DirectionalLights(direction=(0.0, 0.0, 0.0), device=DEV), "direction"),
        (lambda: shading.DirectionalLights(
            direction=wp.zeros(1, dtype=wp.vec3, device=DEV)), "direction"),
        (lambda: shading.PointLights(diffuse_color=(-0.1, 0.3, 0.3), device=DEV), "diffuse_color"),
        (lambda: shading.AmbientLights(
            ambient_color=wp.array([[np.nan, 1, 1]], dtype=wp.vec3, device=DEV)), "ambient_color"),
        (lambda: shading.Materials(shininess=-2.0, device=DEV), "shininess"),
        (lambda: shading.Materials(
            shininess=wp.array([-1.0], dtype=wp.float32, device=DEV)), "shininess"),
        (lambda: shading.Materials(specular_color=(1.0, np.nan, 1.0), device=DEV),
         "specular_color"),
        (lambda: shading.BlendParams(
            background_color=wp.array([[np.nan, 0, 0]], dtype=wp.vec3, device=DEV)),
         "background_color"),
    ],
)  # fmt: skip
def test_lights_and_materials_refuse_values_they_would_misrender(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _box_sensor(**kw):
    g = wsim.SensorGeometry()
    bv, bf = wsim.box_mesh(0.4, 0.25, 0.15)
    g.add_body_mesh(0, bv, bf, world=0, shape_index=1, color=kw.pop("color", (0.8, 0.3, 0.2)))
    return wsim.CameraSensor(g, device=DEV, **kw)


def _sensor_inputs(fov=0.9, q=(0.0, 0.0, 0.0, 1.0)):
    cam = wsim.look_at_transform((2.0, -2.5, 1.8), (0.0, 0.0, 0.0))
    return dict(
        camera_transforms=wp.array([[cam]], dtype=wp.transform, device=DEV),
        camera_fovs=wp.array([fov], dtype=wp.float32, device=DEV),
        body_q=wp.array([(0.0, 0.0, 0.3, *q)], dtype=wp.transform, device=DEV),
    )


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(image_size="32"), TypeError, "image_size"),  # used to become 3 x 2
        (dict(image_size=(8.5, 8)), TypeError, "image_size"),
        (dict(light_direction=(0, 0, -1), light_intensity=math.nan), ValueError,
         "light_intensity"),
        (dict(light_direction=(0, 0, -1), light_intensity=-1.0), ValueError, "light_intensity"),
        (dict(light_intensity=math.nan), ValueError, "light_intensity"),  # no light: still NaN
        (dict(light_direction=(0, 0, 0)), ValueError, "light_direction"),
        (dict(up=(0, 0, 0)), ValueError, "up"),
        (dict(clear_depth=math.nan), ValueError, "clear_depth"),
        (dict(clear_color=(math.nan, 0, 0)), ValueError, "clear_color"),
        (dict(clear_color=(1.5, 0, 0)), ValueError, "clear_color"),
        (dict(color=(0.5, -0.1, 0.5)), ValueError, "color"),
        (dict(color=(0.5, math.nan, 0.5)), ValueError, "color"),
    ],
)  # fmt: skip
def test_sensor_refuses_bad_settings_at_construction(kw, error, match):
    with pytest.raises(error, match=match):
        _box_sensor(**kw)


@pytest.mark.parametrize(
    "inputs, match",
    [
        (dict(fov=0.0), "camera_fovs"),
        (dict(fov=-0.5), "camera_fovs"),
        (dict(fov=math.pi), "camera_fovs"),
        (dict(fov=math.nan), "camera_fovs"),
        (dict(q=(0.0, 0.0, 0.0, 3.0)), "body_q"),  # would draw the box 9 times larger
        (dict(q=(0.0, 0.0, 0.0, 0.0)), "body_q"),
    ],
)
def test_sensor_first_update_refuses_bad_device_inputs(monkeypatch, inputs, match):
    sensor = _box_sensor(image_size=8)
    with no_launch(monkeypatch), pytest.raises(ValueError, match=match):
        sensor.update(**_sensor_inputs(**inputs))
    with pytest.raises(ValueError, match=match):
        sensor.check_inputs(**_sensor_inputs(**inputs))
    sensor.update(**_sensor_inputs())  # good values pass


def test_look_at_transform_refuses_degenerate_input():
    with pytest.raises(ValueError, match="up"):
        wsim.look_at_transform((1, 0, 0), (0, 0, 0), up=(0, 0, 0))
    with pytest.raises(ValueError, match="target"):
        wsim.look_at_transform((1, 0, 0), (1, 0, 0))
    with pytest.raises(ValueError, match="eye"):
        wsim.look_at_transform((math.nan, 0, 0), (0, 0, 0))


# ----------------------------------------------------------------------------- 3. step
def test_renderer_step_out_of_range_names_step(monkeypatch):
    verts = wp.array(_scene()[0], dtype=wp.vec3, device=DEV)
    r = _renderer(requires_grad=False)
    for step in (-1, 1):  # -1 used to render into the last step, 1 a bare IndexError
        with no_launch(monkeypatch), pytest.raises(ValueError, match=r"step must be in \[0, 1\)"):
            r.render(verts, step=step)
        with pytest.raises(ValueError, match=r"step must be in \[0, 1\)"):
            r.image_mse(wp.zeros((2, 8, 8, 4), dtype=wp.float32, device=DEV), step=step)
    with pytest.raises(TypeError, match="step must be an int"):
        r.render(verts, step=0.0)


# ----------------------------------------------------------------------------- 4. background
def test_blend_params_copies_a_numpy_background():
    """A NumPy background changed in place after construction used to be ignored by
    one render and seen by the next (a cached copy); now it is copied at once."""
    bg = np.array([0.2, 0.4, 0.6])
    bp = shading.BlendParams(background_color=bg)
    bg[:] = 0.9
    assert bp.background_color == (0.2, 0.4, 0.6)
    assert isinstance(bp.background_color, tuple)
    np.testing.assert_array_equal(
        bp.background_array(DEV).numpy(), np.array([[0.2, 0.4, 0.6]], np.float32)
    )
    rows = shading.BlendParams(background_color=np.array([[0, 0, 0], [1, 1, 1]]))
    assert rows.background_color == ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    hash(rows)  # immutable, hashable


# ----------------------------------------------------------------------------- 5. numpy copies
def test_fragments_numpy_is_a_copy_on_the_cpu_device():
    verts, faces, first, count = _scene()
    ws = wr.RasterWorkspace(num_meshes=2, num_faces=4, image_size=8, faces_per_pixel=1,
                            device=DEV)  # fmt: skip
    ndc = verts * np.float32(0.2)
    ndc[:, 2] = verts[:, 2]
    kept = []
    for shift in (0.0, 0.5):
        v = wp.array(ndc + [shift, 0, 0], dtype=wp.vec3, device=DEV)
        frags = wr.rasterize_meshes(v, faces, first, count, image_size=8, faces_per_pixel=1,
                                    workspace=ws)  # fmt: skip
        kept.append(frags.numpy())
    assert not np.array_equal(kept[0]["pix_to_face"], kept[1]["pix_to_face"])
    np.testing.assert_array_equal(kept[1]["pix_to_face"], frags.pix_to_face.numpy())


def test_sensor_frame_numpy_is_a_copy_on_the_cpu_device():
    sensor = _box_sensor(image_size=8)
    a = sensor.update(**_sensor_inputs(fov=0.9)).numpy()
    b = sensor.update(**_sensor_inputs(fov=0.3)).numpy()
    assert not np.array_equal(a["alpha"], b["alpha"])


# ----------------------------------------------------------------------------- 6. requires_grad
def test_sensor_without_requires_grad_refuses_a_recording_tape(monkeypatch):
    sensor = _box_sensor(image_size=8)
    inputs = _sensor_inputs()
    sensor.update(**inputs)  # outside a tape: fine
    inputs["camera_fovs"].requires_grad = True
    with no_launch(monkeypatch), pytest.raises(ValueError, match=r"requires_grad=True"):
        with wp.Tape():
            sensor.update(**inputs)


def test_renderer_without_requires_grad_names_its_own_argument(monkeypatch):
    verts = wp.array(_scene()[0], dtype=wp.vec3, device=DEV, requires_grad=True)
    r = _renderer(requires_grad=False)
    with (
        no_launch(monkeypatch),
        pytest.raises(ValueError, match=r"Renderer\(\.\.\., requires_grad=True\)") as err,
    ):
        with wp.Tape():
            r.render(verts)
    assert "out" not in str(err.value).split()
