"""The antialias pass plugged into the renderers (hard shaders, K = 1).

Truths: the op itself (tests/test_antialias.py checks it against nvdiffrast's
numbers) applied to the renderer's own shaded image and fragments; central
differences of the antialiased image with respect to the mesh's position and the
camera pose; the natural training loop (step 3 equals step 1).
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer, Renderer


def _quad_scene(device, cam_grad=False):
    """A flat quad (two faces sharing their diagonal: not a silhouette edge) and a
    triangle in front of it (occlusion edges), seen at an angle."""
    v = np.array([[-0.6, -0.5, 0.0], [0.7, -0.4, 0.1], [0.6, 0.6, 0.0], [-0.5, 0.5, -0.1],
                  [-0.3, -0.2, 0.6], [0.35, -0.1, 0.5], [0.0, 0.45, 0.55]], np.float32)  # fmt: skip
    f = np.array([[0, 1, 2], [0, 2, 3], [4, 5, 6]], np.int32)
    R, T = wr.look_at_view_transform(dist=2.5, elev=10.0, azim=15.0)
    cams = wr.FoVPerspectiveCameras(R=R, T=T, fov=55.0, device=device, requires_grad=cam_grad)
    lights = shading.DirectionalLights(direction=[[0.3, -0.5, -1.0]], device=device)
    colors = shading.TexturesVertex(
        np.array([[0.9, 0.2, 0.1]] * 4 + [[0.1, 0.3, 0.9]] * 3, np.float32), device=device
    )
    return v, f, cams, lights, colors


def _renderer(device, *, antialias, cam_grad=False, size=(24, 32)):
    v, f, cams, lights, tex = _quad_scene(device, cam_grad)
    shader = shading.HardPhongShader(cameras=cams, lights=lights)
    settings = wr.RasterizationSettings(image_size=size, faces_per_pixel=1)
    r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=f,
                 mesh_to_face_first_idx=[0], num_faces_per_mesh=[len(f)], num_verts=len(v),
                 textures=tex, antialias=antialias)  # fmt: skip
    return r, v, f, cams, settings, shader, tex


def test_renderer_antialias_is_the_op_on_its_own_hard_render(device):
    r, v, f, cams, settings, shader, tex = _renderer(device, antialias=True)
    verts = wp.array(v, dtype=wp.vec3, device=device)
    out = r.render(verts)
    want = wr.antialias(out.shaded, out.fragments.pix_to_face, out.verts_ndc, f,
                        zbuf=out.fragments.zbuf)  # fmt: skip
    got = out.image.numpy()
    np.testing.assert_array_equal(got, want.numpy())
    assert (got != out.shaded.numpy()).any()  # edges were blended
    # MeshRenderer(antialias=True) gives the same image
    mr = MeshRenderer(rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
                      shader=shader, antialias=True)  # fmt: skip
    np.testing.assert_array_equal(mr(verts, f, [0], [len(f)], textures=tex).numpy(), got)


def _loss_and_grads(r, verts_np, weights, device, cams):
    verts = wp.array(verts_np, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = r.render(verts)
    tape.backward(grads={out.image: wp.array(weights, dtype=wp.float32, device=device)})
    loss = float((out.image.numpy().astype(np.float64) * weights).sum())
    g_T = cams.T.grad.numpy().copy() if cams.T.grad is not None else None
    return loss, verts.grad.numpy().copy(), g_T, out


def test_antialiased_image_gradients_match_central_differences(device):
    r, v, f, cams, *_ = _renderer(device, antialias=True, cam_grad=True)
    rng = np.random.default_rng(4)
    weights = rng.standard_normal((1, 24, 32, 4)).astype(np.float32)
    _, g_verts, g_T, out = _loss_and_grads(r, v, weights, device, cams)
    p2f = out.fragments.pix_to_face.numpy().copy()
    # Step: 1e-4 world units moves an edge ~1e-3 px (16 px per NDC unit at this
    # size): the pass blends by where an edge crosses between pixel centres, which
    # is smooth in the vertices while no pixel changes face, checked at +-h below.
    # float32 rounding of the image (~6e-8 on values ~0.5, x ~770 weighted pixels)
    # over 2h leaves ~2e-4 of noise on derivatives of order 1-10: 1e-2 relative.
    h = 1e-4
    directions = {"translate x": np.array([1.0, 0.0, 0.0]), "translate y": [0.0, 1.0, 0.0],
                  "front face x": None}  # fmt: skip
    checked = 0
    for name, d in directions.items():
        delta = np.zeros_like(v)
        if d is None:
            delta[4:, 0] = 1.0  # the front triangle alone: occlusion edges move
        else:
            delta[:] = np.asarray(d, np.float32)
        losses = []
        for s in (h, -h):
            vv = (v.astype(np.float64) + s * delta).astype(np.float32)
            loss, _, _, o = _loss_and_grads(r, vv, weights, device, cams)
            assert (o.fragments.pix_to_face.numpy() == p2f).all(), "a pixel changed face"
            losses.append(loss)
        fd = (losses[0] - losses[1]) / (2 * h)
        an = float((g_verts * delta).sum())
        assert abs(fd) > 1e-3  # the edges move the image
        assert abs(an - fd) <= 1e-2 * abs(fd) + 1e-3, (name, an, fd)
        checked += 1
    # the camera: T moves every vertex in view space; d/dT_x against differences
    T0 = cams.T.numpy().copy()
    losses = []
    for s in (h, -h):
        cams.T.assign(T0 + np.array([[s, 0.0, 0.0]], np.float32))
        loss, _, _, o = _loss_and_grads(r, v, weights, device, cams)
        assert (o.fragments.pix_to_face.numpy() == p2f).all(), "a pixel changed face"
        losses.append(loss)
    cams.T.assign(T0)
    fd = (losses[0] - losses[1]) / (2 * h)
    assert abs(fd) > 1e-3
    assert abs(g_T[0, 0] - fd) <= 1e-2 * abs(fd) + 1e-3, (g_T[0, 0], fd)
    assert checked == 3


def test_without_antialias_the_hard_image_has_no_edge_gradient(device):
    # the same flat-shaded silhouette: the hard render's vertex gradient through a
    # uniform translation is zero (only the shading moves, not the edges), the
    # antialiased one's is not
    v, f, cams, lights, tex = _quad_scene(device)
    shader = shading.HardFlatShader(cameras=cams, lights=shading.AmbientLights(device=device))
    settings = wr.RasterizationSettings(image_size=(24, 32), faces_per_pixel=1)
    alpha = np.zeros((1, 24, 32, 4), np.float32)
    alpha[..., 3] = 1.0  # a loss on coverage alone
    moved = {}
    for aa in (False, True):
        r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=f,
                     mesh_to_face_first_idx=[0], num_faces_per_mesh=[len(f)], num_verts=len(v),
                     textures=tex, antialias=aa)  # fmt: skip
        _, g, _, _ = _loss_and_grads(r, v, alpha, device, cams)
        moved[aa] = np.abs(g).max()
    assert moved[False] == 0.0
    assert moved[True] > 1e-2


def test_antialiased_renderer_gradients_do_not_grow(device):
    r, v, f, cams, *_ = _renderer(device, antialias=True, cam_grad=True)
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    target = wp.array(np.full((1, 24, 32, 4), 0.3, np.float32), device=device)
    loss = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    seen = []
    for _ in range(3):
        loss.zero_()
        verts.grad.zero_()
        cams.T.grad.zero_()
        tape = wp.Tape()
        with tape:
            r.render(verts)
            r.image_mse(target, out=loss)
        tape.backward(loss)
        seen.append((verts.grad.numpy().copy(), cams.T.grad.numpy().copy()))
    for a, b in zip(seen[0], seen[-1], strict=True):
        assert np.abs(a).max() > 0
        if wp.get_device(device).is_cpu:
            np.testing.assert_array_equal(b, a)  # serial cpu atomics: one order
        else:  # float32 atomics reorder on CUDA: a few ulps of the largest entry
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())


def test_antialias_needs_a_hard_k1_render(device):
    v, f, cams, lights, tex = _quad_scene(device)
    soft = shading.SoftPhongShader(cameras=cams, lights=lights)
    s1 = wr.RasterizationSettings(image_size=8, faces_per_pixel=1)
    s2 = wr.RasterizationSettings(image_size=8, faces_per_pixel=2)
    kw = dict(cameras=cams, faces=f, mesh_to_face_first_idx=[0], num_faces_per_mesh=[3],
              num_verts=len(v), antialias=True)  # fmt: skip
    with pytest.raises(ValueError, match="antialias"):
        Renderer(raster_settings=s1, shader=soft, **kw)
    hard = shading.HardPhongShader(cameras=cams, lights=lights)
    with pytest.raises(ValueError, match="antialias.*faces_per_pixel=2"):
        Renderer(raster_settings=s2, shader=hard, **kw)
    with pytest.raises(TypeError, match="antialias must be a bool"):
        MeshRenderer(rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=s1),
                     shader=hard, antialias="yes")  # fmt: skip


@pytest.mark.skipif("cpu" not in DEVICES, reason="torch runs on the cpu; cpu is not a test device")
def test_torch_mesh_renderer_antialias_is_the_warp_one():
    torch = pytest.importorskip("torch")
    from warpraster.torch import shading as T

    v, f, _, _, _ = _quad_scene("cpu")
    R, Tr = wr.look_at_view_transform(dist=2.5, elev=10.0, azim=15.0)
    settings = dict(image_size=(24, 32), faces_per_pixel=1)
    cols = np.array([[0.9, 0.2, 0.1]] * 4 + [[0.1, 0.3, 0.9]] * 3, np.float32)
    # torch
    tcams = T.FoVPerspectiveCameras(R=torch.tensor(R), T=torch.tensor(Tr), fov=55.0)
    tl = T.DirectionalLights(direction=[[0.3, -0.5, -1.0]])
    tr = T.MeshRenderer(T.MeshRasterizer(cameras=tcams,
                                         raster_settings=T.RasterizationSettings(**settings)),
                        T.HardPhongShader(cameras=tcams, lights=tl), antialias=True)  # fmt: skip
    tv = torch.tensor(v, requires_grad=True)
    img = tr(tv, torch.tensor(f), torch.tensor([0]), torch.tensor([3]),
             textures=T.TexturesVertex(torch.tensor(cols)))  # fmt: skip
    weights = np.random.default_rng(3).standard_normal(img.shape).astype(np.float32)
    (img * torch.tensor(weights)).sum().backward()
    # Warp
    cams = wr.FoVPerspectiveCameras(R=R, T=Tr, fov=55.0, device="cpu")
    lights = shading.DirectionalLights(direction=[[0.3, -0.5, -1.0]], device="cpu")
    mr = MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams,
                                     raster_settings=wr.RasterizationSettings(**settings)),
        shader=shading.HardPhongShader(cameras=cams, lights=lights), antialias=True)  # fmt: skip
    wv = wp.array(v, dtype=wp.vec3, device="cpu", requires_grad=True)
    tape = wp.Tape()
    with tape:
        wimg = mr(wv, f, [0], [3], textures=shading.TexturesVertex(cols, device="cpu"))
    tape.backward(grads={wimg: wp.array(weights, dtype=wp.float32, device="cpu")})
    # the torch op runs the Warp renderer on the same values: the same bits
    np.testing.assert_array_equal(img.detach().numpy(), wimg.numpy())
    np.testing.assert_array_equal(tv.grad.numpy(), wv.grad.numpy())
    assert np.abs(tv.grad.numpy()).max() > 0
    with pytest.raises(ValueError, match="antialias"):
        T.MeshRenderer(T.MeshRasterizer(cameras=tcams), T.SoftPhongShader(cameras=tcams),
                       antialias=True)  # fmt: skip
