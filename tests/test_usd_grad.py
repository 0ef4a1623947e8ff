"""Gradients of ``usd.StageRenderer`` (``requires_grad=True``) on a ``wp.Tape``.

Truth: central finite differences of a float64 loss ``L = sum(w * color)`` (fixed
random weights ``w``) of the float32 render. Step ``h``: the float32 colours carry
rounding of ~6e-8 relative, so ``L`` (768 terms of order 0.1-1) is known to
~1e-6; the rounding part of the difference quotient is ~1e-6 / h and its
truncation part h^2 / 6 * L''' (L''' of order 1-10 here), so h = 1e-3 (values of
order 1) keeps both near 1e-3 of the gradients, which are of order 0.1-10;
shininess (values 2-10) takes h = 1e-2.
Geometry (points, transform, camera) is checked on a scene with no silhouette
in view and attributes continuous across its edges, so moving it changes the
colours continuously (a hard rasterizer's coverage steps are not differentiated);
but only piecewise smoothly: a sample crossing an inner edge or a texel
boundary of the bilinear texture meets a kink, which adds an error proportional
to h (measured: 1 % at h = 1e-3, 0.1-0.4 % at 3e-4, the difference quotients
converging on the gradient as h shrinks), so geometry takes h = 3e-4 (rounding
part ~3e-3, against gradients of order 1-25) and the focal length (~20) 3e-3.

Also: the loop users write (a fresh tape per step, step 3 == step 1) and a
captured graph on cpu (== eager).
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

import warpraster.usd as wu

H, W = 12, 16
#: relative tolerance of a finite-difference check (see the module docs: ~1e-3
#: from the step, plus the derivative kinks where a sample crosses an inner edge)
RTOL = 2e-2


def _grid(n: int, size: float, bump: float, rng) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = np.meshgrid(np.linspace(-size, size, n), np.linspace(-size, size, n))
    verts = np.stack([xs.ravel(), ys.ravel(), bump * rng.standard_normal(n * n)], 1)
    faces = []
    for i in range(n - 1):
        for j in range(n - 1):
            a = i * n + j
            faces += [[a, a + 1, a + n + 1], [a, a + n + 1, a + n]]
    return verts, np.array(faces)


def _lights() -> wu.LightSet:
    return wu.LightSet(
        directional=np.array([[[0.2, -0.3, -1.0], [0.7, 0.6, 0.5]]], np.float32),
        point=np.array([[[0.5, 0.5, 3.0], [2.0, 1.5, 1.0]]], np.float32),
        ambient=np.array([0.05, 0.1, 0.07], np.float32),
        names=["d0", "p0"],
    )


def _camera(z: float = 6.0) -> wu.CameraParams:
    cam = wu.CameraParams(name="c", cam_to_world=np.eye(4), far=100.0)
    cam.cam_to_world[3, :3] = (0.1, -0.2, z)
    return cam


def _material_scene():
    """Textured materials (two wrap modes), a plain material, faces without one
    (corner colours and opacities), opacities below 1, two lights and ambient."""
    rng = np.random.default_rng(3)
    verts, faces = _grid(4, 2.0, 0.3, rng)
    scene = wu.scene_from_arrays(verts, faces, smooth=True)
    m = scene.meshes
    m.uvs[:] = rng.uniform(-0.5, 1.5, m.uvs.shape)
    m.colors[..., :3] = rng.uniform(0.2, 1, (m.num_faces, 3, 3))
    m.colors[..., 3] = rng.uniform(0.4, 0.9, (m.num_faces, 3))
    W_ = wu.WrapMode
    for k, (ws, wt) in enumerate([(W_.REPEAT, W_.CLAMP), (W_.MIRROR, W_.REPEAT)]):
        texels = rng.uniform(0.2, 1, (3, 4, 4)).astype(np.float32)
        tex = wu.TextureImage(f"t{k}", texels, ws, wt, (1.0, 0.5, 2.0, 1.0), (0.0, 0.1, -0.2, 0.0))
        scene.materials.append(
            wu.Material(f"m{k}", rng.uniform(0.2, 1, 3), rng.uniform(0.2, 1, 3), 16.0 + 8 * k,
                        0.6 + 0.2 * k, tex)
        )  # fmt: skip
    scene.materials.append(wu.Material("plain", shininess=12.0, opacity=0.8))
    m.face_material[:] = np.arange(m.num_faces) % (len(scene.materials) + 1) - 1
    scene.lights = _lights()
    return scene


def _geometry_scene():
    """A bumpy grid filling the whole view, one textured material whose UVs follow
    the points (attributes continuous across edges): no coverage step in view."""
    rng = np.random.default_rng(5)
    verts, faces = _grid(5, 3.0, 0.15, rng)
    scene = wu.scene_from_arrays(verts, faces, smooth=True)
    m = scene.meshes
    m.uvs[:] = (verts[faces][..., :2] + 3.0) / 6.0
    texels = rng.uniform(0.2, 1, (4, 4, 4)).astype(np.float32)
    tex = wu.TextureImage("t", texels, wu.WrapMode.CLAMP, wu.WrapMode.CLAMP)
    scene.materials.append(wu.Material("m", np.array([0.9, 0.8, 0.7]), np.full(3, 0.5), 12.0,
                                       0.7, tex))  # fmt: skip
    m.face_material[:] = 0
    scene.lights = _lights()
    return scene


class _Check:
    """A renderer, its loss weights, and the gradient / finite-difference pair."""

    def __init__(self, scene, device, cam=None, spp=4):
        self.r = wu.StageRenderer(scene, camera=cam or _camera(), image_size=(H, W), spp=spp,
                                  requires_grad=True, device=device)  # fmt: skip
        rng = np.random.default_rng(11)
        self.w = rng.uniform(-1, 1, (H, W, 4))
        self.w_dev = wp.array(self.w.astype(np.float32), dtype=wp.vec4, device=device)

    def loss(self) -> float:
        self.r.render_device()
        return float(np.sum(self.w * self.r.color.numpy().astype(np.float64)))

    def gradient(self, arr: wp.array) -> np.ndarray:
        arr.grad.zero_()
        tape = wp.Tape()
        with tape:
            self.r.render_device()
        tape.backward(grads={self.r.color: self.w_dev})
        return arr.grad.numpy().copy().reshape(arr.shape[0], -1)

    def finite_difference(self, arr: wp.array, index, h: float) -> float:
        base = arr.numpy().copy()
        flat = base.reshape(arr.shape[0], -1)
        out = []
        for sign in (1.0, -1.0):
            moved = flat.copy()
            moved[index] += sign * h
            arr.assign(moved.reshape(base.shape))
            out.append(self.loss())
        arr.assign(base)
        return (out[0] - out[1]) / (2.0 * h)

    def compare(self, arr, h: float, count: int = 4, indices=None):
        g = self.gradient(arr)
        assert np.abs(g).max() > 0, "no gradient reaches the parameter"
        if indices is None:  # the largest entries: the ones a wrong adjoint shows
            order = np.argsort(-np.abs(g).ravel())[:count]
            indices = [np.unravel_index(i, g.shape) for i in order]
        for index in indices:
            fd = self.finite_difference(arr, index, h)
            scale = max(abs(fd), 1e-2 * np.abs(g).max())
            assert abs(g[index] - fd) <= RTOL * scale, (index, g[index], fd)


@pytest.mark.parametrize("device", DEVICES)
def test_material_parameter_gradients_match_finite_differences(device):
    c = _Check(_material_scene(), device)
    b = c.r.buffers
    c.compare(b.atlas.diffuse, 1e-3)
    c.compare(b.atlas.opacity, 1e-3)
    c.compare(b.materials.specular_color, 1e-3)
    c.compare(b.materials.shininess, 1e-2)
    c.compare(b.atlas.texels, 1e-3, count=6)


@pytest.mark.parametrize("device", DEVICES)
def test_light_gradients_match_finite_differences(device):
    c = _Check(_material_scene(), device)
    lights = c.r.buffers.lights
    c.compare(lights.param, 1e-3)  # directional direction and point position
    c.compare(lights.diffuse_color, 1e-3)  # one colour: diffuse and specular
    c.compare(lights.ambient_color, 1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_geometry_gradients_match_finite_differences(device):
    c = _Check(_geometry_scene(), device)
    c.compare(c.r.buffers.verts, 3e-4)
    c.compare(c.r.buffers.mesh_xform, 3e-4, count=6)
    cams = c.r.cameras
    c.compare(cams.T, 3e-4, count=3)
    c.compare(cams.R, 3e-4, count=4)
    c.compare(cams.focal_length, 3e-3, count=2)
    c.compare(cams.principal_point, 3e-4, count=2)


@pytest.mark.parametrize("device", DEVICES)
def test_two_sided_back_view_gradients_match_finite_differences(device):
    """Seen from behind (normals away from the camera, turned toward it) on a
    double-sided mesh: the normal's gradient flips with it."""
    scene = _geometry_scene()
    scene.meshes.double_sided = np.array([True])
    cam = _camera(-6.0)
    cam.cam_to_world[:3, :3] = np.diag([-1.0, 1.0, -1.0])  # looking along +z
    scene.lights.point[0, 0] = (0.5, 0.5, -3.0)
    scene.lights.directional[0, 0] = (0.2, -0.3, 1.0)
    c = _Check(scene, device, cam=cam)
    c.compare(c.r.buffers.verts, 3e-4)
    c.compare(c.r.buffers.mesh_xform, 3e-4, count=6)


@pytest.mark.parametrize("device", DEVICES)
def test_training_loop_steps_repeat(device):
    """A fresh tape per step, only the parameters' gradients zeroed: step 3 == step 1."""
    c = _Check(_material_scene(), device)
    b = c.r.buffers
    params = [b.atlas.diffuse, b.atlas.texels, b.materials.shininess, b.verts, c.r.cameras.T,
              b.lights.param]  # fmt: skip
    seen = []
    for _ in range(3):
        for p in params:
            p.grad.zero_()
        tape = wp.Tape()
        with tape:
            c.r.render_device()
        tape.backward(grads={c.r.color: c.w_dev})
        seen.append([p.grad.numpy().copy() for p in params])
    for a, b_ in zip(seen[0], seen[-1], strict=True):
        assert np.abs(a).max() > 0
        if wp.get_device(device).is_cpu:
            np.testing.assert_array_equal(b_, a)
        else:  # float32 atomics in a varying order: a few ulps of the largest entry
            np.testing.assert_allclose(b_, a, rtol=0, atol=1e-5 * np.abs(a).max())


def test_graph_capture_equals_eager_on_cpu():
    """Forward + backward captured in one graph (cpu), replayed after new values are
    written into a parameter: the same colours and gradients as eager runs."""
    device = "cpu"
    c = _Check(_material_scene(), device)
    b = c.r.buffers
    params = [b.atlas.diffuse, b.atlas.texels, b.verts, c.r.cameras.T]

    def step():
        for p in params:
            p.grad.zero_()
        tape = wp.Tape()
        with tape:
            c.r.render_device()
        tape.backward(grads={c.r.color: c.w_dev})

    values = [b.atlas.diffuse.numpy().copy(), b.atlas.diffuse.numpy() * 0.5]
    eager = []
    for v in values:
        b.atlas.diffuse.assign(v)
        step()
        eager.append([c.r.color.numpy().copy()] + [p.grad.numpy().copy() for p in params])
    step()  # every module loaded before the capture
    with wp.ScopedCapture(device=device, force_module_load=False) as capture:
        step()
    for v, want in zip(values, eager, strict=True):
        b.atlas.diffuse.assign(v)
        wp.capture_launch(capture.graph)
        got = [c.r.color.numpy().copy()] + [p.grad.numpy().copy() for p in params]
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
