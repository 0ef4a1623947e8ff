"""Lights and materials: parameter forms, batching, gradients into the arrays passed.

The lighting formulas themselves are checked against the float64 oracle and
finite differences in test_shaders.py (per slot and per vertex) and against
real PyTorch3D in the reference cases.
"""

from __future__ import annotations

import np_shading as ref
import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer


def test_parameters_accept_numpy_vec3_and_float32_arrays(device):
    loc = np.array([[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]], np.float32)
    a = shading.PointLights(location=loc, device=device)
    b = shading.PointLights(location=wp.array(loc, dtype=wp.vec3, device=device))
    c = shading.PointLights(location=wp.array(loc, dtype=wp.float32, device=device))
    d = shading.PointLights(location=(0.1, 0.2, 0.3), device=device)
    for lights in (a, b, c):
        assert lights.location.dtype == wp.vec3 and len(lights) == 2
        np.testing.assert_array_equal(lights.location.numpy(), loc)
    assert len(d) == 1
    m = shading.Materials(shininess=wp.array([3.0, 4.0], dtype=wp.float32, device=device))
    assert len(m) == 2
    with pytest.raises(ValueError, match="direction"):
        shading.DirectionalLights(direction=np.zeros(4), device=device)
    with pytest.raises(ValueError, match="finite"):
        shading.DirectionalLights(direction=(np.nan, 0, 1), device=device)
    with pytest.raises(TypeError, match="location"):
        shading.PointLights(location=wp.zeros(3, dtype=wp.int32, device=device))
    with pytest.raises(ValueError, match="batch"):
        shading.Materials(ambient_color=np.ones((2, 3)), shininess=np.ones(3), device=device)


def _two_image_scene(device, lights, **extra):
    R, T = wr.look_at_view_transform(dist=3.0, elev=0.0, azim=0.0)
    cams = wr.FoVPerspectiveCameras(R=R, T=T, device=device)
    ren = MeshRenderer(
        rasterizer=wr.MeshRasterizer(
            cameras=cams, raster_settings=wr.RasterizationSettings(image_size=16)
        ),
        shader=shading.HardPhongShader(cameras=cams, lights=lights, device=device, **extra),
    )
    verts = np.array([[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]], np.float32)
    verts = np.concatenate([verts, verts])
    faces = np.array([[0, 1, 2], [0, 2, 3], [4, 5, 6], [4, 6, 7]], np.int32)
    return ren, verts, faces


def test_lights_are_batched_per_image(device):
    # Two identical quads, one light row per image: image n is lit by row n only.
    amb = np.array([[0.1, 0.1, 0.1], [0.4, 0.2, 0.0]])
    lights = shading.DirectionalLights(
        direction=((0, 0, 1), (0, 1, 1)), ambient_color=amb, specular_color=(0, 0, 0), device=device
    )
    ren, verts, faces = _two_image_scene(device, lights)
    img = ren(verts, faces, [0, 2], [2, 2]).numpy()
    centre = img[:, 8, 8, :3]
    # normal +z: cos = 1 for row 0, 1/sqrt(2) for row 1; diffuse colour 0.3 (default)
    expected = amb + 0.3 * np.array([1.0, 1.0 / np.sqrt(2.0)])[:, None]
    np.testing.assert_allclose(centre, expected, atol=1e-6)  # float32 rounding


def test_light_gradients_arrive_in_the_float32_array_passed(device):
    loc = wp.array(
        np.array([[0.5, 0.5, 2.0]], np.float32), dtype=wp.float32, device=device, requires_grad=True
    )
    lights = shading.PointLights(location=loc)
    ren, verts, faces = _two_image_scene(device, lights)
    tape = wp.Tape()
    with tape:
        img = ren(verts, faces, [0, 2], [2, 2])
    tape.backward(grads={img: wp.ones(img.shape, dtype=wp.float32, device=device)})
    g = loc.grad.numpy()
    assert g.shape == (1, 3) and np.abs(g).sum() > 0
    # central differences of the float32 render (smooth in the light position):
    # h = 1e-3 with ~1e-5 of rounding in the summed image gives ~1e-2 relative noise
    fd = np.zeros(3)
    for c in range(3):
        total = []
        for sign in (1, -1):
            p = np.array([[0.5, 0.5, 2.0]], np.float32)
            p[0, c] += sign * 1e-3
            ren.shader.lights = shading.PointLights(location=p, device=device)
            total.append(float(ren(verts, faces, [0, 2], [2, 2]).numpy().astype(np.float64).sum()))
        fd[c] = (total[0] - total[1]) / 2e-3
    np.testing.assert_allclose(g[0], fd, rtol=2e-2, atol=2e-2)


def test_lighting_oracle_helpers_are_pytorch3d_formulas():
    # The oracle itself on a hand-computed point: normal +z, light from 60 deg,
    # eye straight above: diffuse cos 60 = 0.5; reflection at -60 deg from the
    # eye direction... r = (-sin60, 0, cos60), v = (0, 0, 1): alpha = 0.5, ^2 = 0.25.
    n = np.array([0.0, 0.0, 2.0])
    d = np.array([np.sin(np.pi / 3), 0.0, np.cos(np.pi / 3)])
    np.testing.assert_allclose(ref.diffuse(n, np.ones(3), d), 0.5)
    spec = ref.specular(np.zeros(3), n, d, np.ones(3), np.array([0.0, 0.0, 5.0]), np.array(2.0))
    np.testing.assert_allclose(spec, 0.25)
