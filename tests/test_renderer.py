"""The Warp-native Renderer: same images and gradients as MeshRenderer, extra
channels, graph capture (render + loss + backward) equal to eager, and the
loss-ready reductions against the float64 oracle and finite differences."""

from __future__ import annotations

import np_shading as ref
import numpy as np
import p3d_render_cases as cases
import pytest
import warp as wp
from host_counts import count_allocations_and_reads
from p3d_render_cases import rel_l2

import warpraster as wr
from warpraster import shading
from warpraster.renderer import MeshRenderer, Renderer
from warpraster.shading import reductions


def _renderer_for_case(name, device, steps=1):
    d, spec = cases.load(name)
    cams = cases.cameras(d, spec, device)
    lts = cases.lights(d, spec, device)
    shader = getattr(shading, spec["shader"])(
        cameras=cams,
        lights=lts,
        materials=cases.materials(spec, device),
        blend_params=cases.blend_params(spec),
    )
    tex = cases.textures(d, spec, device)
    r = Renderer(
        cameras=cams,
        raster_settings=cases.raster_settings(spec),
        shader=shader,
        faces=d["faces_packed"].astype(np.int32),
        mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
        num_faces_per_mesh=d["num_faces_per_mesh"],
        num_verts=len(d["verts_packed"]),
        textures=tex,
        steps=steps,
    )
    verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    return d, spec, r, verts, tex, lts


@pytest.mark.parametrize(
    "name",
    [
        "r03_softphong_directional_k8",
        "r04_hardgouraud_batch2_nonsquare",
        "r07_texuv_hardphong_bilinear",
    ],
)
def test_renderer_matches_reference_and_mesh_renderer(name, device):
    d, spec, r, verts, tex, lts = _renderer_for_case(name, device)
    tape = wp.Tape()
    with tape:
        out = r.render(verts)
    # same kernels as MeshRenderer: the tolerances of test_shaders.py
    err = np.abs(out.image.numpy() - d["images"])
    assert err.max() <= 2e-3 and (err <= 1e-4).mean() >= 0.999
    tape.backward(grads={out.image: wp.array(d["grad_images"], dtype=wp.float32, device=device)})
    assert rel_l2(verts.grad.numpy(), d["grad_verts"]) <= 1e-3
    for key, (ours, theirs) in cases.texture_grads(d, tex).items():
        assert rel_l2(ours, theirs) <= 1e-3, key
    # channels: the nearest slot's depth / face, the image index as mesh id
    p2f = d["pix_to_face"][..., 0]
    np.testing.assert_array_equal(out.face_ids.numpy(), p2f)
    np.testing.assert_allclose(
        out.depth.numpy(), np.where(p2f >= 0, d["zbuf"][..., 0], -1.0), atol=1e-6
    )  # same float32 recompute as the fragments
    mesh = np.where(p2f >= 0, np.arange(p2f.shape[0])[:, None, None], -1)
    np.testing.assert_array_equal(out.mesh_ids.numpy(), mesh)
    nrm = np.linalg.norm(out.normals.numpy(), axis=-1)
    np.testing.assert_allclose(nrm[p2f >= 0], 1.0, atol=1e-5)
    assert (nrm[p2f < 0] == 0).all()


@pytest.mark.parametrize("channels", [(), ("depth", "mesh_ids"), ("normals",)])
def test_a_subset_of_channels_writes_only_those_and_the_same_values(channels, device):
    """Channels not asked for are None and cost no launch (none asked for); the
    image and the channels asked for equal those of a renderer writing all four
    (the same kernels: bit for bit); a flat shader still gets its normals channel."""
    d, spec, full, verts, tex, lts = _renderer_for_case("r02_hardphong_point_vertexcolor", device)
    want = full.render(verts)
    kwargs = dict(
        cameras=full.cameras,
        raster_settings=cases.raster_settings(spec),
        faces=d["faces_packed"].astype(np.int32),
        mesh_to_face_first_idx=d["mesh_to_face_first_idx"],
        num_faces_per_mesh=d["num_faces_per_mesh"],
        num_verts=len(d["verts_packed"]),
        textures=tex,
    )
    r = Renderer(shader=full.shader, channels=channels, **kwargs)
    got = r.render(verts)
    np.testing.assert_array_equal(got.image.numpy(), want.image.numpy())
    for name in ("depth", "normals", "face_ids", "mesh_ids"):
        if name in channels:
            np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name).numpy())
        else:
            assert getattr(got, name) is None
    if channels == ("normals",):
        flat = shading.HardFlatShader(cameras=full.cameras, lights=lts,
                                      materials=cases.materials(spec, device))  # fmt: skip
        got = Renderer(shader=flat, channels=channels, **kwargs).render(verts)
        np.testing.assert_array_equal(got.normals.numpy(), want.normals.numpy())
    with pytest.raises(ValueError, match="channels"):
        Renderer(shader=full.shader, channels=("depth", "colour"), **kwargs)
    for bad in ("depth", None):
        with pytest.raises(TypeError, match="channels"):
            Renderer(shader=full.shader, channels=bad, **kwargs)


def test_render_loss_backward_capture_equals_eager(device):
    # One graph: zero the loss, render, MSE to a target, backward. Replayed after
    # the vertices are moved in place it must equal an eager step at the new
    # vertices (Warp 1.19 captures on the cpu device too).
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            out = r.render(verts)
            reductions.image_mse(out.image, target, out=loss)
        tape.backward(loss)
        return tape

    tape = step()  # eager: loads every module
    eager_loss = loss.numpy().copy()
    eager_grad = verts.grad.numpy().copy()
    tape.zero()
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        tape = step()
    wp.capture_launch(cap.graph)
    # The loss is summed in a fixed order, but the image under it is not bitwise
    # stable on CUDA: the vertex normals are float32 atomic sums whose order varies
    # between runs (3e-6 relative of the loss seen on an H200); the cpu runs in order.
    loss_rtol = 2e-5
    np.testing.assert_allclose(loss.numpy(), eager_loss, rtol=loss_rtol)
    np.testing.assert_allclose(
        # float32 atomics (vertex and face sums) add in another order on CUDA:
        # 4e-6 of the largest entry seen on an H200; the cpu adds in order
        verts.grad.numpy(),
        eager_grad,
        rtol=0,
        atol=2e-5 * np.abs(eager_grad).max(),
    )
    # move the vertices in place, replay, compare with a fresh eager renderer
    moved = d["verts_packed"] * 1.02
    verts.assign(moved)
    tape.zero()
    wp.capture_launch(cap.graph)
    replay_loss, replay_grad = loss.numpy().copy(), verts.grad.numpy().copy()
    d2, _, r2, verts2, _, _ = _renderer_for_case("r03_softphong_directional_k8", device)
    verts2.assign(moved)
    loss2 = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape2 = wp.Tape()
    with tape2:
        reductions.image_mse(r2.render(verts2).image, target, out=loss2)
    tape2.backward(loss2)
    assert replay_loss[0] != eager_loss[0]
    np.testing.assert_allclose(replay_loss, loss2.numpy(), rtol=loss_rtol)
    # atomics add in another order between two renderers on CUDA: 1e-5 relative
    np.testing.assert_allclose(
        replay_grad, verts2.grad.numpy(), rtol=0, atol=1e-5 * np.abs(replay_grad).max()
    )


def test_steps_keep_separate_buffers_for_one_tape(device):
    d, spec, r, verts, tex, lts = _renderer_for_case(
        "r02_hardphong_point_vertexcolor", device, steps=2
    )
    verts_b = wp.array(d["verts_packed"] * 0.95, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        a = r.render(verts, step=0)
        b = r.render(verts_b, step=1)
    assert a.image is not b.image
    g = wp.array(d["grad_images"], dtype=wp.float32, device=device)
    tape.backward(grads={a.image: g, b.image: g})
    # step 0 still equals the single-frame reference gradient
    assert rel_l2(verts.grad.numpy(), d["grad_verts"]) <= 1e-3
    assert np.abs(verts_b.grad.numpy()).sum() > 0


# ----------------------------------------------------------------------------- reductions
def _frag(rng, device, n=1, h=3, w=3, k=3):
    p2f = rng.integers(0, 5, size=(n, h, w, k)).astype(np.int32)
    p2f[0, 0, 0, 1:] = -1
    p2f[0, 1, 1, :] = -1
    dists = rng.uniform(-0.02, 0.02, size=p2f.shape)
    zbuf = np.sort(rng.uniform(2.0, 4.0, size=p2f.shape), -1)
    frag = wr.Fragments(
        wp.array(p2f, dtype=wp.int32, device=device),
        wp.array(zbuf.astype(np.float32), device=device, requires_grad=True),
        wp.zeros(p2f.shape, dtype=wp.vec3, device=device, requires_grad=True),
        wp.array(dists.astype(np.float32), device=device, requires_grad=True),
    )
    return p2f, dists, zbuf, frag


def _fd(fn, x, g, h=1e-7):
    return ref.central_difference(fn, x, g, h)


def test_soft_depth_and_silhouette_match_oracle_and_finite_differences(device):
    rng = np.random.default_rng(5)
    p2f, dists, zbuf, frag = _frag(rng, device)
    bp = shading.BlendParams(sigma=0.01, gamma=0.05, background_color=(10.0, 0.0, 0.0))
    tape = wp.Tape()
    with tape:
        depth = reductions.soft_depth(frag, bp, 1.0, 20.0)
        sil = reductions.soft_silhouette(frag, 0.01)

    def d_oracle(d=dists, z=zbuf):
        return ref.softmax_blend(
            p2f, d, z, np.repeat(z[..., None], 3, -1), np.array([10.0, 0, 0]), 0.01, 0.05, 1.0, 20.0
        )[..., 0]

    def s_oracle(d=dists):
        return ref.sigmoid_blend(p2f, d, np.ones(p2f.shape + (3,)), 0.01)[..., 3]

    # float32 sums of K O(1) terms: 1e-5
    np.testing.assert_allclose(depth.numpy(), d_oracle(), rtol=1e-5)
    np.testing.assert_allclose(sil.numpy(), s_oracle(), atol=1e-6)
    gd = rng.normal(size=depth.shape)
    gs = rng.normal(size=sil.shape)
    tape.backward(
        grads={
            depth: wp.array(gd.astype(np.float32), device=device),
            sil: wp.array(gs.astype(np.float32), device=device),
        }
    )
    fd_z = _fd(lambda z: d_oracle(z=z), zbuf, gd)
    fd_d = _fd(lambda d: d_oracle(d=d), dists, gd) + _fd(s_oracle, dists, gs)
    # float32 adjoints: 1e-4 rel L2 (as test_blending.py)
    assert rel_l2(frag.zbuf.grad.numpy(), fd_z) <= 1e-4
    assert rel_l2(frag.dists.grad.numpy(), fd_d) <= 1e-4


def test_hard_depth_and_mse(device):
    rng = np.random.default_rng(6)
    p2f, dists, zbuf, frag = _frag(rng, device)
    tape = wp.Tape()
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    target = wp.array(np.full(p2f.shape[:3], 3.0, np.float32), device=device)
    with tape:
        depth = reductions.hard_depth(frag, background=0.0)
        reductions.image_mse(depth, target, out=loss)
    expected = np.where(p2f[..., 0] >= 0, zbuf[..., 0], 0.0)
    np.testing.assert_allclose(depth.numpy(), expected, rtol=1e-7)
    np.testing.assert_allclose(loss.numpy()[0], ((expected - 3.0) ** 2).mean(), rtol=1e-5)
    tape.backward(loss)
    g = np.zeros_like(zbuf)
    g[..., 0] = np.where(p2f[..., 0] >= 0, 2.0 * (zbuf[..., 0] - 3.0) / expected.size, 0.0)
    np.testing.assert_allclose(frag.zbuf.grad.numpy(), g, rtol=1e-5, atol=1e-7)


def test_renderer_with_a_mipmapped_texture_equals_mesh_renderer(device):
    # The mip-mapped sampler needs the projected vertices (UV derivatives): the
    # Renderer hands its own verts_ndc buffer to the texture, MeshRenderer a fresh
    # one; same kernels, so the images and texel gradients agree to rounding.
    d, spec = cases.load("r07_texuv_hardphong_bilinear")
    cams = cases.cameras(d, spec, device)
    shader = shading.HardPhongShader(
        cameras=cams, lights=cases.lights(d, spec, device, False), device=device
    )
    faces = d["faces_packed"].astype(np.int32)
    images, grads = [], []
    for which in ("renderer", "mesh_renderer"):
        tex = shading.TexturesUVMipmap(
            d["texture_maps"],
            d["faces_uvs"].astype(np.int32),
            d["verts_uvs"],
            device=device,
            requires_grad=True,
        )
        verts = wp.array(d["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            if which == "renderer":
                r = Renderer(
                    cameras=cams,
                    raster_settings=cases.raster_settings(spec),
                    shader=shader,
                    faces=faces,
                    mesh_to_face_first_idx=[0],
                    num_faces_per_mesh=[len(faces)],
                    num_verts=len(verts),
                    textures=tex,
                )
                img = r.render(verts).image
            else:
                ren = MeshRenderer(
                    rasterizer=wr.MeshRasterizer(
                        cameras=cams, raster_settings=cases.raster_settings(spec)
                    ),
                    shader=shader,
                )
                img = ren(verts, faces, [0], [len(faces)], textures=tex)
        tape.backward(grads={img: wp.array(d["grad_images"], dtype=wp.float32, device=device)})
        images.append(img.numpy())
        grads.append(tex.maps.grad.numpy())
    assert (images[0][..., 3] > 0).sum() > 100
    np.testing.assert_allclose(images[0], images[1], atol=1e-6)
    # texel gradients are atomic sums: equal up to summation order
    np.testing.assert_allclose(grads[0], grads[1], atol=1e-5 * np.abs(grads[1]).max())


def test_eager_calls_replay_one_graph_and_read_the_current_vertices(device):
    """Outside a tape a repeated render replays its captured graph (forced on here;
    the default is CUDA only): the result follows the vertex array's contents and
    equals a renderer that launches every kernel (same kernels: depth and face ids
    bit for bit; the image up to the float atomics of the vertex normals, whose
    order varies on CUDA: 1.2e-7 seen on an H200)."""
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    _, _, plain, _, _, _ = _renderer_for_case("r03_softphong_directional_k8", device)
    r.call_graphs = True
    plain.call_graphs = False
    rng = np.random.default_rng(3)
    base = d["verts_packed"].astype(np.float32)
    for i in range(4):  # calls 1-2 launch (the 2nd captures), 3-4 replay
        moved = base + (0.02 * i) * rng.normal(size=base.shape).astype(np.float32)
        verts.assign(moved)
        got = r.render(verts)
        want = plain.render(wp.array(moved, dtype=wp.vec3, device=device))
        for name in ("depth", "face_ids"):
            np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name).numpy())
        np.testing.assert_allclose(got.image.numpy(), want.image.numpy(), rtol=0, atol=1e-5)
    assert r._call_graphs[0]._graph is not None  # it did replay a graph


@pytest.mark.parametrize("shape", [(2, 17, 13, 4), (3, 40, 50, 3), (2, 33, 31)])
def test_image_mse_matches_float64_and_its_gradient(shape, device):
    """The block-reduced MSE against a float64 mean, and its hand-written gradient
    against the analytic 2 (image - target) / size; shapes below and above one
    block's chunk (2,048 values), with and without a channel axis."""
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, shape).astype(np.float32)
    b = rng.uniform(-1, 1, shape).astype(np.float32)
    image = wp.array(a, dtype=wp.float32, device=device, requires_grad=True)
    target = wp.array(b, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        reductions.image_mse(image, target, out=loss)
    tape.backward(loss)
    want = np.mean((a.astype(np.float64) - b) ** 2)
    # float32 partial sums of <= 2,048 values, then of the partials: ~1e-6 relative
    np.testing.assert_allclose(loss.numpy()[0], want, rtol=1e-5)
    # one float32 expression per value: a few ulps
    g = 2.0 * (a.astype(np.float64) - b) / a.size
    np.testing.assert_allclose(image.grad.numpy(), g, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["r03_softphong_directional_k8", "r04_hardgouraud_batch2_nonsquare",
             "r07_texuv_hardphong_bilinear"],
)  # fmt: skip
def test_a_step_after_the_first_allocates_nothing_and_reads_nothing_back(name, monkeypatch):
    """Render + MSE + backward, a second time: no memory allocated, no host read
    (the contract that lets the step be captured and replayed). The cpu device's
    allocator is counted; the same code runs on CUDA."""

    d, spec, r, verts, tex, lts = _renderer_for_case(name, "cpu")
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device="cpu")
    loss = wp.zeros(1, dtype=wp.float32, device="cpu", requires_grad=True)

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            out = r.render(verts)
            reductions.image_mse(out.image, target, out=loss)
        tape.backward(loss)
        tape.zero()

    step()
    with count_allocations_and_reads(monkeypatch) as calls:
        step()
        r.render(verts)  # and an eager render outside a tape
    assert calls == {"alloc": 0, "numpy": 0}


def test_a_replayed_step_that_zeroes_its_tape_gives_the_same_gradients(device):
    """The documented training step (render + loss recorded, ``tape.zero()``, then
    the backward, captured once) replayed twice gives the same gradients as the
    first eager step: every gradient the render added to, the renderer's own
    buffers included, is cleared by the step itself. Truth: the eager step."""
    d, spec, r, verts, tex, lts = _renderer_for_case("r03_softphong_directional_k8", device)
    target = wp.array(d["images"] * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape = wp.Tape()

    def step():
        tape.reset()
        loss.zero_()
        with tape:
            out = r.render(verts)
            reductions.image_mse(out.image, target, out=loss)
        tape.zero()
        tape.backward(loss)

    step()
    want = verts.grad.numpy().copy()
    assert np.abs(want).max() > 0
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for _ in range(2):
        wp.capture_launch(cap.graph)
        # the cpu device adds in order: the same bits; CUDA's float atomics (shading
        # adjoint, raster backward) add in another order: 2e-5 of the largest entry
        np.testing.assert_allclose(verts.grad.numpy(), want, rtol=0,
                                   atol=2e-5 * np.abs(want).max())  # fmt: skip


def test_frames_moving_through_the_near_plane_equal_a_fresh_renderer(device):
    """The Renderer's clip workspace is made with ``static_faces`` (its faces are
    fixed), so a render with nothing behind the near plane after one that kept
    every face skips the clip pass. Frames that move the mesh through the plane
    and back, each drawn eagerly and from a replayed graph, equal a fresh
    renderer's: depth and face ids bit for bit, the image up to the vertex
    normals' float atomics, whose order varies on CUDA (1.2e-7 seen, see above)."""
    name = "r02_hardphong_point_vertexcolor"
    d, spec, r, verts, tex, lts = _renderer_for_case(name, device)
    assert r.settings.clipped and r.settings.z_clip_value == 0.5
    base = d["verts_packed"].astype(np.float32)
    rot = np.asarray(d["cam_R"], np.float64)[0]
    depth = (base @ rot + np.asarray(d["cam_T"])[0])[:, 2]
    assert depth.min() > 1.5  # in front of the plane at z = 0.5 by more than a unit
    cut = []
    for graphs in (False, True):
        r.call_graphs = graphs
        for dz in (0.0, 1.6, 0.0, 0.0, 0.5, 1.6, 0.0):
            # toward the camera along its view axis by dz (view depth - dz)
            moved = (base - dz * rot[:, 2]).astype(np.float32)
            verts.assign(moved)
            got = r.render(verts)
            _, _, fresh, _, _, _ = _renderer_for_case(name, device)
            want = fresh.render(wp.array(moved, dtype=wp.vec3, device=device))
            for channel in ("depth", "face_ids"):
                np.testing.assert_array_equal(getattr(got, channel).numpy(),
                                              getattr(want, channel).numpy(),
                                              err_msg=f"dz {dz} graphs {graphs}")  # fmt: skip
            np.testing.assert_allclose(got.image.numpy(), want.image.numpy(), rtol=0, atol=1e-5)
            cut.append(int(r.outputs[0].workspace.clip.any_split.numpy()[0]))
    assert cut[:7] == [0, 1, 0, 0, 0, 1, 0]  # the plane did cut the mesh where it should
