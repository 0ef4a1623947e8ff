"""The camera's gradient through the shading core, summed per warp then per camera
row (shading/fused.py, aggregated.py: striped sums), against central differences:
one camera row per image and one row shared by all images, soft and hard."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.primitives import ico_sphere
from warpraster.renderer import Renderer


def _render(device, R, T, shader_cls, k, weights):
    # sigma 3e-2, gamma 1e-1: a smooth blend (PyTorch3D's 1e-4 makes the image steep
    # at the edges, where central differences of any usable step are off by 10%)
    v, f = ico_sphere(2)
    # side by side, not overlapping on screen: a pixel sees the front and back of one
    verts = np.concatenate([v * 0.5 + [0.6, 0.0, 0.0], v * 0.45 - [0.6, 0.1, 0.0]])
    faces = np.concatenate([f, f + len(v)]).astype(np.int32)
    cams = wr.FoVPerspectiveCameras(R=R, T=T, fov=50.0, device=device, requires_grad=True)
    shader = shader_cls(cameras=cams, lights=shading.PointLights(location=[[2.0, 2.0, 3.0]],
                                                                 device=device),
                        blend_params=shading.BlendParams(sigma=3e-2, gamma=1e-1))  # fmt: skip
    # blur 0 (PyTorch3D's default): with blur, faces within the blur radius enter and
    # leave the K slots under the smallest camera move, which the test must not see
    settings = wr.RasterizationSettings(image_size=(20, 24), faces_per_pixel=k)
    r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=faces,
                 mesh_to_face_first_idx=[0, len(f)], num_faces_per_mesh=[len(f), len(f)],
                 num_verts=len(verts), channels=())  # fmt: skip
    tape = wp.Tape()
    with tape:
        out = r.render(wp.array(verts.astype(np.float32), dtype=wp.vec3, device=device))
    tape.backward(grads={out.image: wp.array(weights, dtype=wp.float32, device=device)})
    loss = float((out.image.numpy().astype(np.float64) * weights).sum())
    p2f = out.fragments.pix_to_face.numpy().copy()
    return loss, cams.R.grad.numpy().copy(), cams.T.grad.numpy().copy(), p2f


@pytest.mark.parametrize("rows", [1, 2], ids=["shared-camera", "camera-per-image"])
@pytest.mark.parametrize("shader_cls,k", [(shading.SoftPhongShader, 4),
                                          (shading.HardPhongShader, 1)])  # fmt: skip
def test_camera_gradient_matches_central_differences(shader_cls, k, rows, device):
    R0, T0 = wr.look_at_view_transform(dist=3.0, elev=[15.0, -10.0][:rows],
                                       azim=[20.0, 60.0][:rows])  # fmt: skip
    R0, T0 = R0.astype(np.float64), T0.astype(np.float64)
    w = np.random.default_rng(5).standard_normal((2, 20, 24, 4)).astype(np.float32)
    _, gR, gT, p2f = _render(device, R0, T0, shader_cls, k, w)
    # Step 1e-4: the shading is smooth in the eye position (the only way the camera
    # enters the lighting) and the projection moves the faces by ~1e-3 px. A pixel
    # whose faces change within the step (an edge crossing its centre) is left out
    # of that direction's loss, and the analytic gradient is recomputed with the
    # same weights. Float32 rounding of the weighted sum (~6e-8 on each of 3,840
    # O(1) values, ~4e-6 in all) over 2h = 2e-4 leaves ~0.02 of noise.
    h = 1e-4
    checks = [("T", i, c) for i in range(rows) for c in range(3)]
    checks += [("R", 0, (0, 2)), ("R", rows - 1, (1, 0))]
    for name, i, c in checks:
        renders = []
        for s in (h, -h):
            R, T = R0.copy(), T0.copy()
            (T if name == "T" else R)[(i, *np.atleast_1d(c))] += s
            renders.append((R, T))
        p_plus = _render(device, *renders[0], shader_cls, k, w)[3]
        p_minus = _render(device, *renders[1], shader_cls, k, w)[3]
        same = ((p_plus == p2f) & (p_minus == p2f)).all(-1)[..., None]
        wm = np.where(same, w, 0.0).astype(np.float32)
        assert same.mean() > 0.97  # only pixels on an edge are left out
        _, gRm, gTm, _ = _render(device, R0, T0, shader_cls, k, wm)
        fd = (_render(device, *renders[0], shader_cls, k, wm)[0]
              - _render(device, *renders[1], shader_cls, k, wm)[0]) / (2 * h)  # fmt: skip
        an = float((gTm if name == "T" else gRm)[(i, *np.atleast_1d(c))])
        assert abs(an - fd) <= 2e-2 * abs(fd) + 3e-2, (name, i, c, an, fd)
    assert np.abs(gT).max() > 1e-2
