"""The projection's hand-written adjoint (camera/projection.py) against Warp's generated
adjoint of the same forward kernel, for every camera kind: per-camera rows, rows shared
by all cameras, enough vertices for several stripes per camera, non-finite vertices.
Finite differences against a float64 oracle are in test_camera.py
(``test_gradients_match_finite_differences``)."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from test_camera import GRAD_PARAMS, KINDS, _random_camera

from warpraster.aggregated import stripes_for
from warpraster.camera import FoVPerspectiveCameras
from warpraster.camera.projection import _project_kernel


def _grads(cam, names, verts_np, v2m_np, upstream, device, generated: bool) -> dict:
    """Gradients of ``sum(upstream * project(verts))`` w.r.t. the vertices and the
    camera arrays ``names``: by the hand-written adjoint (the camera's
    ``transform_points_ndc``) or by Warp's generated one (the forward kernel
    launched on the tape)."""
    verts = wp.array(verts_np, dtype=wp.vec3, device=device, requires_grad=True)
    v2m = wp.array(v2m_np, dtype=wp.int32, device=device)
    out = wp.zeros(len(verts_np), dtype=wp.vec3, device=device, requires_grad=True)
    for name in names:
        getattr(cam, name).grad.zero_()
    tape = wp.Tape()
    with tape:
        if generated:
            wp.launch(_project_kernel, dim=len(verts_np), inputs=[verts, v2m, True, cam._data],
                      outputs=[out], device=device)  # fmt: skip
        else:
            cam.transform_points_ndc(verts, v2m, None, out)
    out.grad.assign(upstream.astype(np.float32))
    tape.backward()
    got = {name: getattr(cam, name).grad.numpy().copy() for name in names}
    got["verts"] = verts.grad.numpy().copy()
    got["consumed"] = out.grad.numpy().copy()
    return got


def _assert_close(got: dict, want: dict, per_camera: int):
    for name, w in want.items():
        # Both are float32; they differ in the order of the sums of a camera row's
        # `per_camera` terms (per warp, per stripe, then per row, against the
        # generated adjoint's atomics). Float rounding of such a sum walks like
        # sqrt(m) eps times the terms' size. Measured (CPU): <= 9e-7 of the
        # largest entry for 32-40 terms per row, 1e-5 for 40,000; the bound,
        # 1e-5 + 1e-6 sqrt(m) of the largest entry, is 10-30x those, while a
        # wrong term or a lost stripe is off by O(1).
        scale = max(float(np.abs(w).max()), 1e-30)
        atol = (1e-5 + 1e-6 * np.sqrt(per_camera)) * scale
        np.testing.assert_allclose(got[name], w, rtol=0.0, atol=atol, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_hand_adjoint_matches_generated(kind, device):
    rng = np.random.default_rng(11)
    n, per_mesh = 3, 40
    cam, _ = _random_camera(kind, rng, n, device)
    verts = rng.uniform(-0.5, 0.5, (n * per_mesh, 3))
    v2m = np.repeat(np.arange(n, dtype=np.int32), per_mesh)
    upstream = rng.uniform(-1.0, 1.0, verts.shape)
    names = GRAD_PARAMS[kind]
    want = _grads(cam, names, verts, v2m, upstream, device, generated=True)
    got = _grads(cam, names, verts, v2m, upstream, device, generated=False)
    assert all(np.abs(want[k]).max() > 0 for k in names)  # every parameter is reached
    _assert_close(got, want, per_mesh)


def test_hand_adjoint_with_shared_rows_and_many_stripes(device):
    """R and T shared by two cameras (batch 1), fov per camera, and enough
    vertices per camera for several stripes (so the stripes' sum is exercised)."""
    rng = np.random.default_rng(5)
    n, per_mesh = 2, 40_000
    assert stripes_for(n * per_mesh, n) > 32
    R = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    R *= np.sign(np.linalg.det(R))
    # Warp arrays are used as given (NumPy ones would be copied to N rows)
    shared_R = wp.array(R[None].astype(np.float32), dtype=wp.float32, device=device,
                        requires_grad=True)  # fmt: skip
    shared_T = wp.array([[0.1, -0.2, 5.0]], dtype=wp.float32, device=device, requires_grad=True)
    cam = FoVPerspectiveCameras(R=shared_R, T=shared_T, fov=[45.0, 60.0],
                                aspect_ratio=[1.0, 1.1], device=device,
                                requires_grad=True)  # fmt: skip
    assert cam.R.shape == (1,) and cam.fov.shape == (2,)
    verts = rng.uniform(-0.5, 0.5, (n * per_mesh, 3))
    v2m = np.repeat(np.arange(n, dtype=np.int32), per_mesh)
    upstream = rng.uniform(-1.0, 1.0, verts.shape)
    names = ["R", "T", "fov", "aspect_ratio"]
    want = _grads(cam, names, verts, v2m, upstream, device, generated=True)
    got = _grads(cam, names, verts, v2m, upstream, device, generated=False)
    _assert_close(got, want, n * per_mesh)


def test_hand_adjoint_skips_non_finite_vertices(device):
    rng = np.random.default_rng(2)
    cam, _ = _random_camera("fov_persp", rng, 2, device)
    verts = rng.uniform(-0.5, 0.5, (64, 3))
    verts[[3, 40]] = [np.nan, 0.0, np.inf]
    v2m = np.repeat(np.arange(2, dtype=np.int32), 32)
    upstream = rng.uniform(-1.0, 1.0, verts.shape)
    names = GRAD_PARAMS["fov_persp"]
    got = _grads(cam, names, verts, v2m, upstream, device, generated=False)
    want = _grads(cam, names, verts, v2m, upstream, device, generated=True)
    assert all(np.isfinite(got[k]).all() for k in got)
    assert not got["verts"][[3, 40]].any()
    _assert_close(got, want, 32)


def test_hand_adjoint_consumes_the_output_gradient(device):
    """As Warp's adjoint of a store: the output's gradient is zeroed once read,
    kept with ``retain_grad``; ``tape.zero()`` clears the camera's gradients."""
    rng = np.random.default_rng(4)
    cam, _ = _random_camera("persp_screen", rng, 1, device)
    verts = wp.array(rng.uniform(-0.5, 0.5, (10, 3)), dtype=wp.vec3, device=device,
                     requires_grad=True)  # fmt: skip
    for retain in (False, True):
        out = wp.zeros(10, dtype=wp.vec3, device=device, requires_grad=True)
        out.retain_grad = retain
        tape = wp.Tape()
        with tape:
            cam.transform_points_ndc(verts, None, None, out)
        out.grad.fill_(1.0)
        tape.backward()
        np.testing.assert_array_equal(out.grad.numpy(), 1.0 if retain else 0.0)
        assert np.abs(cam.R.grad.numpy()).max() > 0 and np.abs(verts.grad.numpy()).max() > 0
        tape.zero()
        assert not cam.R.grad.numpy().any() and not cam.focal_length.grad.numpy().any()
        assert not verts.grad.numpy().any()
