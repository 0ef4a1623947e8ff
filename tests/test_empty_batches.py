"""Batches with no faces (and no vertices) through a recorded forward and its backward.

A mesh batch can be empty (every mesh culled upstream, a scene with nothing in it
yet). The forward already gave empty fragments and the background; recorded on a
``wp.Tape``, the hand-written backwards registered arrays whose gradients were
empty, which ``wp.Tape.record_func`` refuses ("missing a gradient array"): the
render raised on a tape and through torch whenever gradients were wanted. Truth:
the background / empty fragments, and all-zero gradients (nothing covers a pixel).
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import warpraster as wr
import warpraster.shading as ws


def _empty(nv, device, z=2.0):
    verts = np.random.default_rng(0).random((nv, 3)).astype(np.float32) + [0.0, 0.0, z]
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.zeros((0, 3), dtype=wp.int32, device=device)
    fi = wp.zeros(2, dtype=wp.int32, device=device)
    return v, f, fi, wp.zeros(2, dtype=wp.int32, device=device)


@pytest.mark.parametrize("z_clip", [None, 0.1], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("nv", [0, 3])
def test_rasterize_without_faces_on_a_tape(nv, z_clip, device):
    v, f, fi, cn = _empty(nv, device)
    tape = wp.Tape()
    with tape:
        frags = wr.rasterize_meshes(v, f, fi, cn, image_size=(6, 5), faces_per_pixel=2,
                                    z_clip_value=z_clip)  # fmt: skip
    assert (frags.pix_to_face.numpy() == -1).all()
    for a in (frags.zbuf, frags.dists, frags.bary_coords):
        a.grad.fill_(1.0)
    tape.backward()
    assert not v.grad.numpy().any()
    tape.zero()


@pytest.mark.parametrize("nv", [0, 3])
def test_mesh_renderer_without_faces_on_a_tape(nv, device):
    v, f, fi, cn = _empty(nv, device, z=0.0)
    R, T = wr.look_at_view_transform(dist=2.7)
    cams = wr.FoVPerspectiveCameras(R=R, T=T, device=device)
    settings = wr.RasterizationSettings(image_size=(6, 5), faces_per_pixel=2)
    renderer = wr.MeshRenderer(
        rasterizer=wr.MeshRasterizer(cameras=cams, raster_settings=settings),
        shader=ws.SoftPhongShader(cameras=cams, lights=ws.PointLights(device=device)),
    )
    colors = wp.array(np.ones((nv, 3), np.float32), dtype=wp.vec3, device=device,
                      requires_grad=True)  # fmt: skip
    tape = wp.Tape()
    with tape:
        image = renderer(v, f, fi, cn, textures=ws.TexturesVertex(colors))
    background = np.broadcast_to([1.0, 1.0, 1.0, 0.0], (2, 6, 5, 4))
    np.testing.assert_array_equal(image.numpy(), background)
    image.grad.fill_(1.0)
    tape.backward()
    assert not v.grad.numpy().any() and not colors.grad.numpy().any()


def test_torch_rasterize_without_vertices_or_faces():
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt

    v = torch.zeros((0, 3), requires_grad=True)
    out = wrt.rasterize_meshes(v, torch.zeros((0, 3), dtype=torch.int64), torch.tensor([0, 0]),
                               torch.tensor([0, 0]), image_size=8, faces_per_pixel=2,
                               z_clip_value=0.1)  # fmt: skip
    assert (out[0] == -1).all()
    (out[1].sum() + out[2].sum() + out[3].sum()).backward()
    assert v.grad is not None and v.grad.shape == (0, 3)
