"""Correct gradients by default at a clamped perspective denominator (issue 26).

With a perspective camera and a blur, a face's blurred slots can lie beyond the
line where its plane meets the horizon; there PyTorch3D's perspective
denominator ``max(s, 1e-8)`` is clamped and its backward divides a rounding
residue by 1e-16 (docs/BACKWARD.md, "Blur-only slots"). Every entry point
defaults to ``exact_perspective_grad=True`` (the true derivative);
``exact_perspective_grad=False`` gives PyTorch3D's numbers, and the parity tests
set it.

Truth: central finite differences of a float64 loss of the float32 render, on a
ground plane seen from above it whose far edge lies within the blur of the
horizon: the slots just above the horizon are clamped (checked in float64 below).
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES
from p3d_backward_ref import pixel_centres
from p3d_render_cases import rel_l2

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer, Renderer

SIZE = 32
K = 4
# sigma 2e-3: the blur reaches ~0.14 NDC beyond a face, past the horizon (y = 0),
# which is 0.087 above the plane's far edge (z = 20, 1 below the camera, fov 60).
# gamma 1e-2: the softmax weights vary by O(1) per unit of z_inv / gamma over a step
# (PyTorch3D's default 1e-4 would make the central differences' truncation error,
# h^2 f''' / 6, about 100x larger; the clamp does not depend on gamma).
SIGMA, GAMMA = 2e-3, 1e-2
BLUR = float(np.log(1.0 / 1e-4 - 1.0) * SIGMA)  # PyTorch3D's tutorial rule
# Step of the central differences, in world units (vertices at depth 2-20): large
# enough that the float32 render's rounding (~1e-7 of each of the 4096 weighted
# values, ~1e-6 on the loss in quadrature, / 2h ~ 1e-3) stays far below the
# gradients (O(1)-O(10)); small enough that no slot changes face (checked: 3e-3
# already moves a pixel's faces) and that the truncation error is negligible:
# the differences at h = 1e-3 and 3e-4 agree with the analytic gradient to the
# same 3e-4 (relative L2), so neither truncation (x11 between them) nor rounding
# noise (x3.3) is what is left.
STEP = 1e-3
# Relative L2 of the analytic gradient against the differences: measured 2.5e-4
# (Phong) and 2.9e-4 (silhouette) on cpu, the float32 rounding of the render and
# of the gradient sums; 2e-3 leaves 7x. PyTorch3D's numbers (exact_perspective_grad
# False) miss by 3.2 times the gradient's norm here (its largest component 126
# where the derivative is 26): asserting a miss of more than half the norm leaves
# 6x, and is 250 times the tolerance of the default.
FD_TOL = 2e-3
PYTORCH3D_MISS = 0.5

_rng = np.random.default_rng(0)
# a ground plane (y = -1) from z = 2 to z = 20, corners jittered off exact ties
VERTS = (
    np.array([[-2.0, -1.0, 2.0], [2.0, -1.0, 2.0], [2.0, -1.0, 20.0], [-2.0, -1.0, 20.0]])
    + _rng.uniform(-0.05, 0.05, (4, 3))
).astype(np.float32)
FACES = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
COLORS = _rng.uniform(0.2, 0.9, (4, 3)).astype(np.float32)
WEIGHTS = _rng.uniform(-1.0, 1.0, (1, SIZE, SIZE, 4))  # the loss: sum(WEIGHTS * image)
LIGHT = [[0.0, 2.0, 0.0]]


def _settings(**kw):
    return wr.RasterizationSettings(image_size=SIZE, faces_per_pixel=K, blur_radius=BLUR, **kw)


def _clamped_slots(p2f: np.ndarray, device) -> int:
    """Slots whose perspective denominator s = sum_i w_i z_j z_k is <= 0 (float64),
    so that max(s, 1e-8) clamps it (edge functions in PyTorch3D's order)."""
    cams = wr.FoVPerspectiveCameras(device=device)
    ndc = cams.transform_points_ndc(wp.array(VERTS, dtype=wp.vec3, device=device)).numpy()
    ndc = ndc.astype(np.float64)
    x, y = pixel_centres(SIZE, SIZE)
    _, yi, xi, k = np.nonzero(p2f >= 0)
    tri = ndc[FACES[p2f[0, yi, xi, k]]]
    p = np.stack([x[yi, xi], y[yi, xi]], -1)

    def edge(q, a, b):
        return (q[:, 0] - a[:, 0]) * (b[:, 1] - a[:, 1]) - (q[:, 1] - a[:, 1]) * (b[:, 0] - a[:, 0])

    v0, v1, v2 = tri[:, 0], tri[:, 1], tri[:, 2]
    area = edge(v2, v0, v1)
    s = (edge(p, v1, v2) * v1[:, 2] * v2[:, 2] + edge(p, v2, v0) * v0[:, 2] * v2[:, 2]
         + edge(p, v0, v1) * v0[:, 2] * v1[:, 2]) / area  # fmt: skip
    return int((s <= 0).sum())


# ----------------------------------------------------------------------------- Warp MeshRenderer
def _warp_shader(silhouette: bool, cams, device):
    bp = shading.BlendParams(sigma=SIGMA, gamma=GAMMA)
    if silhouette:
        return shading.SoftSilhouetteShader(blend_params=bp)
    lights = shading.PointLights(location=LIGHT, device=device)
    return shading.SoftPhongShader(cameras=cams, lights=lights, blend_params=bp, device=device)


def _warp_render(v, device, *, silhouette=False, grad=False, **settings):
    """(image float64, pix_to_face, verts.grad or None) of the Warp MeshRenderer."""
    cams = wr.FoVPerspectiveCameras(device=device)
    ren = MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=_settings(**settings)),
        shader=_warp_shader(silhouette, cams, device),
    )
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=grad)
    tex = None if silhouette else shading.TexturesVertex(COLORS, device=device)
    tape = wp.Tape()
    with tape:
        img = ren(verts, FACES, [0], [2], textures=tex)
    out = img.numpy().astype(np.float64)
    p2f = ren.fragments.pix_to_face.numpy()
    if not grad:
        return out, p2f, None
    tape.backward(grads={img: wp.array(WEIGHTS.astype(np.float32), dtype=wp.float32,
                                       device=device)})  # fmt: skip
    return out, p2f, verts.grad.numpy().astype(np.float64)


def _central_differences(render, p2f):
    """d sum(WEIGHTS * image) / d VERTS by central differences (float64 loss of the
    float32 render); every step keeps each pixel's faces."""
    fd = np.zeros(VERTS.shape)
    for i in range(VERTS.shape[0]):
        for c in range(3):
            loss = []
            for sign in (1.0, -1.0):
                v = VERTS.copy()
                v[i, c] += sign * STEP
                img, p2f_step = render(v)
                np.testing.assert_array_equal(p2f_step, p2f)  # no discrete change
                loss.append(float((img * WEIGHTS).sum()))
            fd[i, c] = (loss[0] - loss[1]) / (2.0 * STEP)
    return fd


def test_warp_soft_phong_default_gradient_is_the_derivative(device):
    _, p2f, grad = _warp_render(VERTS, device, grad=True)
    assert _clamped_slots(p2f, device) >= 5  # the scene exercises the clamp
    fd = _central_differences(lambda v: _warp_render(v, device)[:2], p2f)
    assert rel_l2(grad, fd) <= FD_TOL, rel_l2(grad, fd)
    # PyTorch3D's numbers at those slots are not the derivative
    _, _, p3d = _warp_render(VERTS, device, grad=True, exact_perspective_grad=False)
    assert rel_l2(p3d, fd) > PYTORCH3D_MISS, rel_l2(p3d, fd)


def test_warp_soft_silhouette_default_gradient_is_the_derivative(device):
    _, p2f, grad = _warp_render(VERTS, device, silhouette=True, grad=True)
    fd = _central_differences(lambda v: _warp_render(v, device, silhouette=True)[:2], p2f)
    assert rel_l2(grad, fd) <= FD_TOL, rel_l2(grad, fd)
    # the silhouette reads only dists, whose gradient does not pass through the
    # perspective denominator: PyTorch3D's numbers are the same (to the bit on the
    # cpu; CUDA's atomics add in a varying order)
    _, _, p3d = _warp_render(VERTS, device, silhouette=True, grad=True,
                             exact_perspective_grad=False)  # fmt: skip
    _same(p3d, grad, device)


# ----------------------------------------------------------------------------- torch MeshRenderer
def _torch_renderer(silhouette: bool, **settings):
    from warpraster.torch import shading as T  # noqa: PLC0415 - optional dependency

    cams = T.FoVPerspectiveCameras()
    bp = T.BlendParams(sigma=SIGMA, gamma=GAMMA)
    if silhouette:
        shader = T.SoftSilhouetteShader(blend_params=bp)
    else:
        shader = T.SoftPhongShader(cameras=cams, lights=T.PointLights(location=LIGHT),
                                   blend_params=bp)  # fmt: skip
    rasterizer = T.MeshRasterizer(cameras=cams, raster_settings=_settings(**settings))
    return T, T.MeshRenderer(rasterizer=rasterizer, shader=shader)


def _torch_render(v, *, silhouette=False, grad=False, **settings):
    torch = pytest.importorskip("torch")
    T, ren = _torch_renderer(silhouette, **settings)
    verts = torch.tensor(v, requires_grad=grad)
    tex = None if silhouette else T.TexturesVertex(torch.tensor(COLORS))
    args = (verts, torch.tensor(FACES), [0], [2])
    with torch.set_grad_enabled(grad):
        img = ren(*args, textures=tex)
    p2f = ren.fragments.pix_to_face.numpy()
    if not grad:
        return img.numpy().astype(np.float64), p2f, None
    (img.double() * torch.tensor(WEIGHTS)).sum().backward()
    return img.detach().numpy().astype(np.float64), p2f, verts.grad.numpy().astype(np.float64)


@pytest.mark.parametrize("silhouette", [False, True], ids=["soft_phong", "soft_silhouette"])
@pytest.mark.skipif("cpu" not in DEVICES, reason="torch runs on the cpu; cpu is not a test device")
def test_torch_soft_shader_default_gradient_is_the_derivative(silhouette):
    pytest.importorskip("torch")
    _, p2f, grad = _torch_render(VERTS, silhouette=silhouette, grad=True)
    fd = _central_differences(lambda v: _torch_render(v, silhouette=silhouette)[:2], p2f)
    assert rel_l2(grad, fd) <= FD_TOL, rel_l2(grad, fd)
    _, _, p3d = _torch_render(VERTS, silhouette=silhouette, grad=True,
                              exact_perspective_grad=False)  # fmt: skip
    if silhouette:
        np.testing.assert_array_equal(p3d, grad)  # dists only (see the Warp test)
    else:
        assert _clamped_slots(p2f, "cpu") >= 5
        assert rel_l2(p3d, fd) > PYTORCH3D_MISS, rel_l2(p3d, fd)


@pytest.mark.skipif("cpu" not in DEVICES, reason="torch runs on the cpu; cpu is not a test device")
def test_torch_raster_settings_reach_the_warp_renderer():
    """The torch MeshRenderer runs the Warp one: each flag gives the Warp entry's
    gradient, to the bit (the same kernels on the same float32 upstream gradient,
    summed in the same order on cpu)."""
    pytest.importorskip("torch")
    for kw in ({}, {"exact_perspective_grad": False}):
        _, _, theirs = _warp_render(VERTS, "cpu", grad=True, **kw)
        _, _, ours = _torch_render(VERTS, grad=True, **kw)
        np.testing.assert_array_equal(ours, theirs)


# ----------------------------------------------------------------------------- plumbing
def _upstream(shape):
    rng = np.random.default_rng(1)
    return (rng.uniform(-1, 1, shape).astype(np.float32),
            rng.uniform(-1, 1, shape + (3,)).astype(np.float32))  # fmt: skip


def _fragment_grad(device, call):
    """World-vertex gradient of a random linear loss of (zbuf, bary_coords) of
    ``call(verts)``'s fragments."""
    verts = wp.array(VERTS, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        fr = call(verts)
    gz, gb = _upstream(fr.shape)
    fr.zbuf.grad.assign(gz)
    fr.bary_coords.grad.assign(gb)
    tape.backward()
    return verts.grad.numpy().copy()


def test_mesh_rasterizer_passes_exact_perspective_grad_to_the_raster_call(device):
    """RasterizationSettings(exact_perspective_grad=...) gives, through MeshRasterizer,
    the gradient of the explicit call: the camera's projection, then
    rasterize_meshes(settings=RasterSettings(...)) with PyTorch3D's resolved options
    written out (perspective-correct, clipped barycentrics, z_clip_value =
    znear / 2) and the flag; the two flags differ at the clamped slots."""
    cams = wr.FoVPerspectiveCameras(device=device)
    grads = {}
    for exact in (True, False):
        explicit = wr.RasterSettings(
            image_size=SIZE, faces_per_pixel=K, blur_radius=BLUR, perspective_correct=True,
            clip_barycentric_coords=True, z_clip_value=0.5, exact_perspective_grad=exact,
        )  # fmt: skip
        rasterizer = wr.MeshRasterizer(
            cameras=cams, raster_settings=_settings(exact_perspective_grad=exact)
        )
        assert rasterizer.settings_for() == explicit
        ours = _fragment_grad(device, lambda v, r=rasterizer: r(v, FACES, [0], [2]))
        theirs = _fragment_grad(
            device,
            lambda v, s=explicit: wr.rasterize_meshes(
                cams.transform_points_ndc(v), FACES, [0], [2], settings=s
            ),
        )
        _same(ours, theirs, device)  # the same kernels
        grads[exact] = ours
    assert not np.array_equal(grads[True], grads[False])
    # the default is the exact one
    default = _fragment_grad(device, lambda v: wr.MeshRasterizer(
        cameras=cams, raster_settings=_settings())(v, FACES, [0], [2]))  # fmt: skip
    _same(default, grads[True], device)


def _same(a, b, device):
    if wp.get_device(device).is_cpu:
        np.testing.assert_array_equal(a, b)  # the cpu adds its atomics in one order
    else:  # CUDA float32 atomics reorder: a few ulps of the largest entry
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_renderer_takes_exact_perspective_grad_from_its_settings(device):
    """Renderer(raster_settings=RasterizationSettings(exact_perspective_grad=...)):
    each flag gives the MeshRenderer's gradient of that flag (equal on cpu; 1e-5
    of the largest component leaves room for the order of float32 atomic sums on
    a GPU, where the two flags' gradients differ by several times the gradient)."""
    for kw in ({}, {"exact_perspective_grad": False}):
        cams = wr.FoVPerspectiveCameras(device=device)
        r = Renderer(
            cameras=cams, raster_settings=_settings(**kw),
            shader=_warp_shader(False, cams, device), faces=FACES, mesh_to_face_first_idx=[0],
            num_faces_per_mesh=[2], num_verts=len(VERTS),
            textures=shading.TexturesVertex(COLORS, device=device), channels=(),
        )  # fmt: skip
        assert r.settings.exact_perspective_grad is ("exact_perspective_grad" not in kw)
        verts = wp.array(VERTS, dtype=wp.vec3, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            out = r.render(verts)
        tape.backward(grads={out.image: wp.array(WEIGHTS.astype(np.float32), dtype=wp.float32,
                                                 device=device)})  # fmt: skip
        _, _, theirs = _warp_render(VERTS, device, grad=True, **kw)
        np.testing.assert_allclose(verts.grad.numpy(), theirs, rtol=0,
                                   atol=1e-5 * np.abs(theirs).max())  # fmt: skip


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "generated"])
def test_camera_sensor_passes_exact_perspective_grad_to_both_backwards(monkeypatch, deterministic):
    """CameraSensor(exact_perspective_grad=...) reaches the raster calls (whose
    backward the generated route runs) and the deterministic adjoint's kernel.
    A spy, not a gradient: the sensor's sharp pass rasterizes without blur (its
    slots lie inside their faces, where s >= min z_j z_k > 0) and its blurred pass
    without perspective correction, so no slot of an ordinary scene is clamped."""
    import warpraster.sim as wsim  # noqa: PLC0415
    from warpraster.sim import adjoint as sim_adjoint  # noqa: PLC0415
    from warpraster.sim import sensor as sim_sensor  # noqa: PLC0415

    raster_flags, kernel_flags = [], []
    real_raster, real_launch = sim_sensor.rasterize_meshes, wp.launch

    def raster_spy(*args, **kw):
        raster_flags.append(kw["exact_perspective_grad"])
        return real_raster(*args, **kw)

    def launch_spy(kernel, *args, **kw):
        if kernel in sim_adjoint.CHANNELS_ADJOINT.values():
            kernel_flags.append(kw["inputs"][-1])
        return real_launch(kernel, *args, **kw)

    monkeypatch.setattr(sim_sensor, "rasterize_meshes", raster_spy)
    monkeypatch.setattr(wp, "launch", launch_spy)
    g = wsim.SensorGeometry()
    pv, pf = wsim.tessellate.plane_mesh(1.5, 1.5)
    g.add_static_mesh(pv, pf, world=-1, shape_index=0, color=(0.2, 0.5, 0.3))
    cam = wp.array([[wsim.look_at_transform((2.0, -2.5, 1.8), (0, 0, 0))]], dtype=wp.transform)
    fov = wp.array([0.9], dtype=wp.float32, requires_grad=True)
    for flag in (None, False):
        raster_flags.clear()
        kernel_flags.clear()
        kw = {} if flag is None else {"exact_perspective_grad": flag}
        sensor = wsim.CameraSensor(g, image_size=8, silhouette_sigma=1e-3, requires_grad=True,
                                   deterministic=deterministic, device="cpu", **kw)  # fmt: skip
        tape = wp.Tape()
        with tape:
            out = sensor.update(camera_transforms=cam, camera_fovs=fov)
        out.depth.grad.fill_(1.0)
        tape.backward()
        want = flag is None  # the default is the true derivative
        assert raster_flags == [want, want]  # the sharp and the blurred pass
        assert kernel_flags == ([int(want)] if deterministic else [])
