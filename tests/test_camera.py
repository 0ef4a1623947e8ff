"""Cameras: PyTorch3D parity, a float64 oracle, gradients, OpenCV conversion, validation.

Oracles:

* PyTorch3D's numbers in ``shared/reference/pytorch3d`` (camera cases p10-p12):
  matrices, projected vertices, and the camera's share of ``grad_verts``;
* ``_project64`` below: the projection written out in float64 NumPy from the
  formulas in PyTorch3D's ``cameras.py`` (not from the kernel), itself checked
  against PyTorch3D's numbers; its central finite differences are the gradient
  oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import warp as wp
from p3d_cases import reference_dir

from warpraster.camera import (
    ROTATION_TOLERANCE,
    CameraData,
    CameraKind,
    FoVOrthographicCameras,
    FoVPerspectiveCameras,
    PerspectiveCameras,
    cameras_from_opencv_projection,
    look_at_view_transform,
    opencv_from_cameras_projection,
    vert_to_mesh_from_faces,
)
from warpraster.rasterizer import MeshRasterizer, RasterizationSettings

CAMERA_CASES = ["p10_cam_persp_ico2", "p11_cam_ortho_ico1_nonsquare", "p12_cam_persp_near_clip"]


# ----------------------------------------------------------------------------- helpers
def _reference_dir() -> Path:
    return reference_dir()


def _load(name: str) -> dict:
    path = _reference_dir() / f"{name}.npz"
    if not path.is_file():
        pytest.skip(f"PyTorch3D reference case {path} not found")
    with np.load(path, allow_pickle=False) as d:
        case = {k: d[k] for k in d.files}
    case["meta"] = json.loads(str(case["meta"]))
    case["image_size"] = tuple(int(s) for s in case["image_size"])
    return case


def _camera_from_case(c: dict, device):
    if str(c["camera_type"]) == "FoVPerspectiveCameras":
        return FoVPerspectiveCameras(
            znear=c["cam_znear"],
            zfar=c["cam_zfar"],
            aspect_ratio=c["cam_aspect_ratio"],
            fov=c["cam_fov"],
            degrees=bool(c["cam_degrees"]),
            R=c["cam_R"],
            T=c["cam_T"],
            device=device,
        )
    return FoVOrthographicCameras(
        znear=c["cam_znear"],
        zfar=c["cam_zfar"],
        max_y=c["cam_max_y"],
        min_y=c["cam_min_y"],
        max_x=c["cam_max_x"],
        min_x=c["cam_min_x"],
        scale_xyz=c["cam_scale_xyz"],
        R=c["cam_R"],
        T=c["cam_T"],
        device=device,
    )


def _random_rotations(rng, n: int) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        axis=1,
    )


def _project64(kind: str, p: dict, verts: np.ndarray, v2m: np.ndarray) -> np.ndarray:
    """(V, 3) float64 (x_ndc, y_ndc, z_view); per-camera params in ``p`` are (N, ...)."""

    def cam(name):
        return np.asarray(p[name], np.float64)[v2m]

    xv = np.einsum("vi,vij->vj", verts, cam("R")) + cam("T")
    x, y, z = xv.T
    if kind.startswith("fov_persp"):
        fov = cam("fov")
        t = np.tan((np.deg2rad(fov) if p["degrees"] else fov) / 2.0)
        xn = x / (t * cam("aspect_ratio") * z)
        yn = y / (t * z)
    elif kind == "fov_ortho":
        s = cam("scale_xyz")
        lo_x, hi_x, lo_y, hi_y = cam("min_x"), cam("max_x"), cam("min_y"), cam("max_y")
        xn = (2.0 * s[:, 0] * x - (hi_x + lo_x)) / (hi_x - lo_x)
        yn = (2.0 * s[:, 1] * y - (hi_y + lo_y)) / (hi_y - lo_y)
    else:
        f = cam("focal_length")
        pp = cam("principal_point")
        xn = f[:, 0] * x / z + pp[:, 0]
        yn = f[:, 1] * y / z + pp[:, 1]
        if kind == "persp_screen":
            h, w = p["image_size"]
            s = min(h, w) / 2.0
            xn = (f[:, 0] * x / z - pp[:, 0] + w / 2.0) / s
            yn = (f[:, 1] * y / z - pp[:, 1] + h / 2.0) / s
    return np.stack([xn, yn, z], axis=1)


KINDS = ["fov_persp", "fov_persp_radians", "fov_ortho", "persp_ndc", "persp_screen"]
# Differentiable parameters checked per kind (camera attribute names).
GRAD_PARAMS = {
    "fov_persp": ["R", "T", "fov", "aspect_ratio"],
    "fov_persp_radians": ["R", "T", "fov"],
    "fov_ortho": ["R", "T", "scale_xyz"],
    "persp_ndc": ["R", "T", "focal_length", "principal_point"],
    "persp_screen": ["R", "T", "focal_length", "principal_point"],
}


def _random_camera(kind: str, rng, n: int, device, requires_grad: bool = True):
    """A random camera batch of ``n`` looking at the unit cube, and its float64 params."""
    p = {
        "R": _random_rotations(rng, n),
        # Camera 4-6 units away: vertices in [-0.5, 0.5]^3 have view z in [3, 7].
        "T": np.concatenate([rng.uniform(-0.3, 0.3, (n, 2)), rng.uniform(4, 6, (n, 1))], 1),
    }
    pose = dict(R=p["R"], T=p["T"], device=device, requires_grad=requires_grad)
    if kind.startswith("fov_persp"):
        degrees = kind == "fov_persp"
        fov = rng.uniform(35.0, 80.0, n)
        p.update(
            fov=fov if degrees else np.deg2rad(fov),
            degrees=degrees,
            aspect_ratio=rng.uniform(0.8, 1.25, n),
            znear=rng.uniform(0.5, 1.5, n),
            zfar=np.full(n, 50.0),
        )
        cam = FoVPerspectiveCameras(
            znear=p["znear"],
            zfar=p["zfar"],
            aspect_ratio=p["aspect_ratio"],
            fov=p["fov"],
            degrees=degrees,
            **pose,
        )
    elif kind == "fov_ortho":
        p.update(
            znear=np.full(n, 0.1),
            zfar=np.full(n, 20.0),
            min_x=rng.uniform(-1.3, -0.8, n),
            max_x=rng.uniform(0.8, 1.3, n),
            min_y=rng.uniform(-1.3, -0.8, n),
            max_y=rng.uniform(0.8, 1.3, n),
            scale_xyz=rng.uniform(0.5, 1.5, (n, 3)),
        )
        cam = FoVOrthographicCameras(
            **{k: p[k] for k in ("znear", "zfar", "min_x", "max_x", "min_y", "max_y")},
            scale_xyz=p["scale_xyz"],
            **pose,
        )
    elif kind == "persp_ndc":
        p.update(
            focal_length=rng.uniform(1.5, 3.0, (n, 2)),
            principal_point=rng.uniform(-0.2, 0.2, (n, 2)),
        )
        cam = PerspectiveCameras(
            focal_length=p["focal_length"],
            principal_point=p["principal_point"],
            **pose,
        )
    else:
        p.update(
            focal_length=rng.uniform(60.0, 90.0, (n, 2)),
            principal_point=np.array([32.0, 24.0]) + rng.uniform(-5, 5, (n, 2)),
            image_size=(48, 64),
        )
        cam = PerspectiveCameras(
            focal_length=p["focal_length"],
            principal_point=p["principal_point"],
            in_ndc=False,
            image_size=p["image_size"],
            **pose,
        )
    return cam, p


def _one_fov_camera(p: dict, i: int, device) -> FoVPerspectiveCameras:
    """Camera ``i`` alone of a batch made by ``_random_camera("fov_persp", ...)``."""
    return FoVPerspectiveCameras(
        znear=p["znear"][i],
        zfar=p["zfar"][i],
        aspect_ratio=p["aspect_ratio"][i],
        fov=p["fov"][i],
        R=p["R"][i : i + 1],
        T=p["T"][i : i + 1],
        device=device,
    )


def _batch(rng, n: int, per_mesh: int = 6):
    verts = rng.uniform(-0.5, 0.5, (n * per_mesh, 3))
    v2m = np.repeat(np.arange(n, dtype=np.int32), per_mesh)
    return verts, v2m


# ----------------------------------------------------------------------------- PyTorch3D parity
def _conditioning(c: dict) -> np.ndarray:
    """(V,) ``max(1, S / |z_view|)``, S = the magnitude of the terms summed into a
    view coordinate (|X|_1 + |T|_1). View coordinates carry a few ulps of S of
    rounding that depends on the summation order (FMA on a GPU); every NDC value
    and derivative divides by z_view, which amplifies it by S / |z_view| (up to
    188 for the near-plane vertices of p12, ~2.6 elsewhere)."""
    s = np.abs(c["verts_packed"]).sum(1) + np.abs(c["cam_T"]).sum()
    return np.maximum(1.0, s / np.abs(c["verts_ndc_packed"][:, 2]))


def _assert_projection_matches(out: np.ndarray, c: dict) -> None:
    """Projected vertices vs PyTorch3D's ``verts_ndc_packed``.

    Measured bit-exact on CPU. Bound for another op order: z_view within 1e-6 S
    (~8 ulp of the terms); x, y = f x_view / z_view within 1e-6 (2 + |x_ndc|)
    times the conditioning S / |z_view| (f <= 2 here).
    """
    ref = c["verts_ndc_packed"]
    k = _conditioning(c)
    s = np.abs(c["verts_packed"]).sum(1) + np.abs(c["cam_T"]).sum()
    tol = 1e-6 * np.stack([(2 + np.abs(ref[:, 0])) * k, (2 + np.abs(ref[:, 1])) * k, s], 1)
    err = np.abs(out - ref)
    assert (err <= tol).all(), f"max err/tol {float((err / tol).max()):.3g}"


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_matrices_match_pytorch3d(name, device):
    c = _load(name)
    cam = _camera_from_case(c, device)
    # R, T are copied into the matrix: exact. The view -> NDC entries are float32
    # formulas (tan, divisions): measured bit-exact on CPU; 1e-6 (8 ulp) allows a
    # GPU tanf (4 ulp) and its propagation through two divisions.
    np.testing.assert_array_equal(cam.get_world_to_view_matrix(), c["cam_world_to_view_matrix"])
    np.testing.assert_allclose(
        cam.get_view_to_ndc_matrix(c["image_size"]), c["cam_view_to_ndc_matrix"], rtol=1e-6
    )


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_projection_matches_pytorch3d(name, device):
    c = _load(name)
    cam = _camera_from_case(c, device)
    out = cam.transform_points_ndc(c["verts_packed"], None, c["image_size"]).numpy()
    _assert_projection_matches(out, c)


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_camera_backward_matches_pytorch3d(name, device):
    """The camera's share of PyTorch3D's backward: grad_verts = J^T grad_verts_ndc."""
    c = _load(name)
    cam = _camera_from_case(c, device)
    verts = wp.array(c["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = cam.transform_points_ndc(verts)
    tape.backward(grads={out: wp.array(c["grad_verts_ndc"], dtype=wp.vec3, device=device)})
    # Both sides are float32 chain rules of the same graph. 1e-5 relative plus 1e-5
    # of the largest gradient, times the vertex's conditioning (see _conditioning),
    # covers another op order; measured <= 3.4e-8 of the largest gradient on CPU.
    ref = c["grad_verts"]
    err = np.abs(verts.grad.numpy() - ref)
    tol = _conditioning(c)[:, None] * (1e-5 * np.abs(ref) + 1e-5 * np.abs(ref).max())
    assert (err <= tol).all(), f"max err/tol {float((err / tol).max()):.3g}"


@pytest.mark.parametrize(
    "name, pose",
    [
        ("p10_cam_persp_ico2", (3.0, 20.0, 30.0)),
        ("p11_cam_ortho_ico1_nonsquare", (2.5, -10.0, 60.0)),
    ],
)
def test_look_at_matches_pytorch3d(name, pose):
    c = _load(name)
    assert c["meta"]["camera_spec"]["poses"][0] == ["look_at", *pose]
    R, T = look_at_view_transform(*pose)
    assert R.dtype == np.float32 and R.shape == (1, 3, 3) and T.shape == (1, 3)
    # Ours is computed in float64 and rounded; PyTorch3D's in float32: ~1 ulp of 3.0.
    np.testing.assert_allclose(R, c["cam_R"], atol=2e-7)
    np.testing.assert_allclose(T, c["cam_T"], atol=5e-7)


def test_look_at_conventions():
    # Camera on +z looking at the origin: PyTorch3D's view x is world -x, z is world -z.
    R, T = look_at_view_transform(dist=2.0, elev=0.0, azim=0.0)
    np.testing.assert_allclose(R[0], np.diag([-1.0, 1.0, -1.0]), atol=1e-7)
    np.testing.assert_allclose(T[0], [0.0, 0.0, 2.0], atol=1e-7)
    # eye / at / up broadcasting, radians, and the camera centre round trip.
    eye = np.array([[1.0, 2.0, 3.0], [-2.0, 0.5, 1.0]])
    R, T = look_at_view_transform(eye=eye, at=(0.1, 0.2, 0.3), up=((0, 1, 0),))
    cam = FoVPerspectiveCameras(R=R, T=T)
    np.testing.assert_allclose(cam.get_camera_center(), eye, atol=1e-6)
    R2, _ = look_at_view_transform(
        dist=[1, 2], elev=np.pi / 6, azim=[0.0, np.pi / 2], degrees=False
    )
    R3, _ = look_at_view_transform(dist=[1, 2], elev=30.0, azim=[0.0, 90.0])
    np.testing.assert_allclose(R2, R3, atol=1e-7)
    # Nearly (not exactly) parallel up is still a rotation, as in PyTorch3D.
    R4, _ = look_at_view_transform(eye=(0.0, 5.0, 1e-9))
    np.testing.assert_allclose(R4[0] @ R4[0].T, np.eye(3), atol=1e-6)


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_mesh_rasterizer_resolves_settings_as_pytorch3d(name):
    c = _load(name)
    given = dict(c["meta"]["raster_settings_given"])
    given["image_size"] = tuple(given["image_size"])
    r = MeshRasterizer(
        cameras=_camera_from_case(c, "cpu"), raster_settings=RasterizationSettings(**given)
    )
    s = r.resolved_settings()
    zc = float(c["z_clip_value"])
    assert s["z_clip_value"] == (None if np.isnan(zc) else pytest.approx(zc))
    for key in (
        "perspective_correct",
        "clip_barycentric_coords",
        "cull_backfaces",
        "cull_to_frustum",
    ):
        assert s[key] == bool(c[key]), key


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_mesh_rasterizer_projection_matches_pytorch3d(name, device):
    c = _load(name)
    r = MeshRasterizer(cameras=_camera_from_case(c, device))
    out = r.transform(
        c["verts_packed"], c["faces_packed"], c["mesh_to_face_first_idx"], c["num_faces_per_mesh"]
    ).numpy()
    _assert_projection_matches(out, c)


@pytest.mark.parametrize("name", CAMERA_CASES)
def test_mesh_rasterizer_end_to_end_matches_pytorch3d(name, device):
    """World vertices -> MeshRasterizer -> fragments and grad_verts, vs PyTorch3D."""
    c = _load(name)
    given = dict(c["meta"]["raster_settings_given"])
    given["image_size"] = tuple(given["image_size"])
    r = MeshRasterizer(
        cameras=_camera_from_case(c, device), raster_settings=RasterizationSettings(**given)
    )
    verts = wp.array(c["verts_packed"], dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        frags = r(verts, c["faces_packed"], c["mesh_to_face_first_idx"], c["num_faces_per_mesh"])
    out = frags.numpy()
    p2f = out["pix_to_face"]
    # Projection is bit-exact on CPU (above), so the discrete choice is too.
    np.testing.assert_array_equal(p2f, c["pix_to_face"])
    valid = p2f >= 0
    # Tolerances from the reference README (float32 recompute, summation order).
    np.testing.assert_allclose(out["zbuf"][valid], c["zbuf"][valid], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["bary_coords"][valid], c["bary_coords"][valid], atol=1e-5)
    np.testing.assert_allclose(out["dists"][valid], c["dists"][valid], atol=1e-5)
    m = valid.astype(np.float32)
    grads = {
        frags.zbuf: wp.array(c["grad_zbuf"] * m, dtype=wp.float32, device=device),
        frags.bary_coords: wp.array(c["grad_bary"] * m[..., None], dtype=wp.vec3, device=device),
        frags.dists: wp.array(c["grad_dists"] * m, dtype=wp.float32, device=device),
    }
    tape.backward(grads=grads)
    ref = c["grad_verts"]
    np.testing.assert_allclose(verts.grad.numpy(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


# ----------------------------------------------------------------------------- float64 oracle
def test_oracle_matches_pytorch3d():
    """The test's float64 projection reproduces PyTorch3D's numbers (so it is a fair oracle)."""
    for name in CAMERA_CASES:
        c = _load(name)
        ortho = str(c["camera_type"]) == "FoVOrthographicCameras"
        keys = (
            ["min_x", "max_x", "min_y", "max_y", "scale_xyz"] if ortho else ["fov", "aspect_ratio"]
        )
        p = {k: c[f"cam_{k}"].astype(np.float64) for k in ["R", "T", *keys]}
        p["degrees"] = True
        v = c["verts_packed"].astype(np.float64)
        out = _project64("fov_ortho" if ortho else "fov_persp", p, v, np.zeros(len(v), int))
        np.testing.assert_allclose(out, c["verts_ndc_packed"], rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_projection_matches_float64_oracle(kind, device):
    rng = np.random.default_rng(1)
    cam, p = _random_camera(kind, rng, 3, device)
    verts, v2m = _batch(rng, 3)
    out = cam.transform_points_ndc(verts, v2m).numpy()
    ref = _project64(kind, p, verts, v2m)
    # float32 parameters and arithmetic vs float64: a few ulp of values <= ~1.
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def _fd_grad(fn, x: np.ndarray) -> np.ndarray:
    """Central differences of scalar fn at x (float64); step 1e-6 relative."""
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gf = g.reshape(-1)
    for i in range(flat.size):
        h = 1e-6 * max(1.0, abs(flat[i]))
        old = flat[i]
        flat[i] = old + h
        fp = fn()
        flat[i] = old - h
        fm = fn()
        flat[i] = old
        gf[i] = (fp - fm) / (2 * h)
    return g


def _check_grad(got: np.ndarray, want: np.ndarray, what: str):
    # Kernel gradients are float32: each is a chain of ~10 roundings, summed over
    # up to 18 vertices (atomics). Measured error <= 3e-7 of the largest entry
    # (CPU); the tolerance, 2e-5 of the largest entry plus 1e-4 relative, is ~70x
    # that, while a wrong term or factor is off by O(1). The float64 central
    # differences (step 1e-6) are exact to ~1e-9 here.
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_finite_differences(kind, device):
    rng = np.random.default_rng(7)
    n = 3
    cam, p = _random_camera(kind, rng, n, device)
    verts_np, v2m = _batch(rng, n)
    upstream = rng.uniform(-1.0, 1.0, verts_np.shape)
    verts = wp.array(verts_np, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = cam.transform_points_ndc(verts, wp.array(v2m, dtype=wp.int32, device=device))
    tape.backward(grads={out: wp.array(upstream, dtype=wp.vec3, device=device)})

    state = {
        "verts": verts_np.copy(),
        **{k: np.array(v, dtype=np.float64) for k, v in p.items() if k in GRAD_PARAMS[kind]},
    }

    def loss():
        q = {**p, **{k: state[k] for k in GRAD_PARAMS[kind]}}
        return float((_project64(kind, q, state["verts"], v2m) * upstream).sum())

    _check_grad(verts.grad.numpy(), _fd_grad(loss, state["verts"]), "verts")
    for name in GRAD_PARAMS[kind]:
        got = getattr(cam, name).grad.numpy().reshape(state[name].shape)
        _check_grad(got, _fd_grad(loss, state[name]), name)


def test_gradients_reach_shared_warp_arrays(device):
    """A (1, 3, 3) float32 R and a (N,) fov given as Warp arrays: used zero-copy,
    R broadcast to all cameras in the kernel, gradients in the caller's arrays."""
    rng = np.random.default_rng(3)
    n = 3
    R_np = _random_rotations(rng, 1)
    T_np = np.concatenate([rng.uniform(-0.3, 0.3, (n, 2)), np.full((n, 1), 5.0)], 1)
    fov_np = np.array([40.0, 55.0, 70.0])
    R = wp.array(R_np.astype(np.float32), dtype=wp.float32, device=device, requires_grad=True)
    fov = wp.array(fov_np.astype(np.float32), dtype=wp.float32, device=device, requires_grad=True)
    cam = FoVPerspectiveCameras(R=R, T=T_np, fov=fov)
    assert len(cam) == n and cam.R.shape == (1,) and cam.device == wp.get_device(device)
    verts_np, v2m = _batch(rng, n)
    upstream = rng.uniform(-1.0, 1.0, verts_np.shape)
    tape = wp.Tape()
    with tape:
        out = cam.transform_points_ndc(verts_np, v2m)
    tape.backward(grads={out: wp.array(upstream, dtype=wp.vec3, device=device)})
    assert out.requires_grad
    state = {"R": R_np.copy(), "fov": fov_np.copy()}
    p = {"T": T_np, "aspect_ratio": np.ones(n), "degrees": True}

    def loss():
        q = {**p, "R": np.broadcast_to(state["R"], (n, 3, 3)), "fov": state["fov"]}
        return float((_project64("fov_persp", q, verts_np, v2m) * upstream).sum())

    _check_grad(R.grad.numpy(), _fd_grad(loss, state["R"]), "R")
    _check_grad(fov.grad.numpy(), _fd_grad(loss, state["fov"]), "fov")
    # A second backward without zeroing doubles (Warp semantics); tape.zero() clears ours.
    tape.zero()
    assert not R.grad.numpy().any() and not fov.grad.numpy().any()


def test_numpy_parameters_without_requires_grad_take_no_gradients(device):
    cam = FoVPerspectiveCameras(R=np.eye(3)[None], T=[[0.0, 0.0, 3.0]], device=device)
    assert not cam.requires_grad()
    verts = wp.array(np.zeros((1, 3)), dtype=wp.vec3, device=device)
    assert not cam.transform_points_ndc(verts).requires_grad
    cam = FoVPerspectiveCameras(T=[[0.0, 0.0, 3.0]], device=device, requires_grad=True)
    assert cam.R.requires_grad and cam.T.requires_grad and cam.fov.requires_grad
    assert not cam.znear.requires_grad and not cam.zfar.requires_grad


# ----------------------------------------------------------------------------- batches
def test_heterogeneous_batch_uses_each_meshs_camera(device):
    rng = np.random.default_rng(5)
    cam, p = _random_camera("fov_persp", rng, 3, device, requires_grad=False)
    counts = [4, 0, 7]  # an empty mesh in the middle
    verts = rng.uniform(-0.5, 0.5, (sum(counts), 3))
    v2m = np.repeat(np.arange(3), counts).astype(np.int32)
    out = cam.transform_points_ndc(verts, v2m).numpy()
    start = 0
    for i, cnt in enumerate(counts):
        one = _one_fov_camera(p, i, device)
        sl = slice(start, start + cnt)
        np.testing.assert_array_equal(out[sl], one.transform_points_ndc(verts[sl]).numpy())
        start += cnt


def test_vert_to_mesh_from_faces(device):
    # mesh 0: verts 0-3, mesh 1: empty, mesh 2: verts 4-6; vertex 7 is unused.
    faces = np.array([[0, 1, 2], [2, 3, 0], [4, 5, 6]], np.int32)
    first = np.array([0, 2, 2], np.int32)
    count = np.array([2, 0, 1], np.int32)
    got = vert_to_mesh_from_faces(faces, first, count, 8, device=device).numpy()
    np.testing.assert_array_equal(got, [0, 0, 0, 0, 2, 2, 2, 0])


def test_mesh_rasterizer_batch_matches_single_renders(device):
    """Two meshes, two cameras: each image equals that mesh rendered alone."""
    rng = np.random.default_rng(11)
    cam, p = _random_camera("fov_persp", rng, 2, device, requires_grad=False)
    quad = np.array([[-0.8, -0.8, 0.0], [0.8, -0.6, 0.2], [0.0, 1.0, -0.2], [0.6, 0.8, 0.4]])
    verts = np.concatenate([quad, quad * 0.8 + 0.05])
    faces = np.array([[0, 1, 2], [1, 3, 2], [4, 5, 6], [5, 7, 6]], np.int32)
    settings = RasterizationSettings(image_size=(16, 20), faces_per_pixel=2)
    both = MeshRasterizer(cameras=cam, raster_settings=settings)(
        verts, faces, np.array([0, 2], np.int32), np.array([2, 2], np.int32)
    ).numpy()
    for i in range(2):
        one = _one_fov_camera(p, i, device)
        alone = MeshRasterizer(cameras=one, raster_settings=settings)(
            verts[4 * i : 4 * i + 4], faces[:2], np.array([0], np.int32), np.array([2], np.int32)
        ).numpy()
        assert (alone["pix_to_face"] >= 0).any()
        got = both["pix_to_face"][i : i + 1]
        np.testing.assert_array_equal(np.where(got >= 0, got - 2 * i, -1), alone["pix_to_face"])
        np.testing.assert_array_equal(both["zbuf"][i : i + 1], alone["zbuf"])


def test_check_batch():
    cams = FoVPerspectiveCameras(T=[[0, 0, 3.0], [0, 0, 4.0]])
    assert len(cams) == 2
    cams.check_batch(2)
    FoVPerspectiveCameras().check_batch(5)  # one camera serves any number of meshes
    with pytest.raises(ValueError, match=r"Wrong number \(2\) of cameras for 3 meshes"):
        cams.check_batch(3)


def test_projection_is_graph_capturable(device):
    """With Warp inputs and ``out`` given the call allocates nothing and reads
    nothing back: a captured graph replays it and sees new values of R."""
    rng = np.random.default_rng(2)
    R = wp.array(_random_rotations(rng, 2).astype(np.float32), dtype=wp.float32, device=device)
    cam = FoVPerspectiveCameras(R=R, T=[[0.0, 0.0, 5.0]], fov=[50.0, 60.0], device=device)
    verts_np, v2m_np = _batch(rng, 2)
    verts = wp.array(verts_np, dtype=wp.vec3, device=device)
    v2m = wp.array(v2m_np, dtype=wp.int32, device=device)
    out = wp.empty(len(verts_np), dtype=wp.vec3, device=device)
    cam.transform_points_ndc(verts, v2m, out=out)  # load the module before capture
    with wp.ScopedCapture(device=device) as capture:
        cam.transform_points_ndc(verts, v2m, out=out)
    R_new = _random_rotations(rng, 2)
    R.assign(R_new.astype(np.float32))
    wp.capture_launch(capture.graph)
    p = {"R": R_new, "T": np.array([[0.0, 0.0, 5.0]] * 2), "fov": [50.0, 60.0]}
    p.update(aspect_ratio=np.ones(2), degrees=True)
    np.testing.assert_allclose(
        out.numpy(), _project64("fov_persp", p, verts_np, v2m_np), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_graph_capturable(kind, device):
    """Each camera kind, and a screen-space camera given a call's image_size: a
    captured call replays with new values written into the camera's own arrays."""
    rng = np.random.default_rng(12)
    cam, p = _random_camera(kind, rng, 2, device, requires_grad=False)
    verts_np, v2m_np = _batch(rng, 2)
    verts = wp.array(verts_np, dtype=wp.vec3, device=device)
    v2m = wp.array(v2m_np, dtype=wp.int32, device=device)
    out = wp.empty(len(verts_np), dtype=wp.vec3, device=device)
    size = p.get("image_size")
    cam.transform_points_ndc(verts, v2m, size, out)  # loads the module, makes the size's array
    with wp.ScopedCapture(device=device) as capture:
        cam.transform_points_ndc(verts, v2m, size, out)
    p["R"] = _random_rotations(rng, 2)
    cam.R.assign(p["R"].astype(np.float32))
    wp.capture_launch(capture.graph)
    # float32 vs float64, as test_projection_matches_float64_oracle.
    np.testing.assert_allclose(
        out.numpy(), _project64(kind, p, verts_np, v2m_np), rtol=1e-5, atol=1e-6
    )


EXPECTED_KIND = {
    "fov_persp": CameraKind.FOV_PERSPECTIVE,
    "fov_ortho": CameraKind.FOV_ORTHOGRAPHIC,
    "persp_ndc": CameraKind.PERSPECTIVE,
}


@pytest.mark.parametrize("kind", sorted(EXPECTED_KIND))
def test_parameters_live_in_one_struct(kind):
    """The kernels read one CameraData: its array fields are the camera's
    parameter arrays (so gradients reach them), the fields of other kinds are
    empty, and a parameter attribute cannot be rebound behind the struct's back."""
    cam, _ = _random_camera(kind, np.random.default_rng(0), 2, "cpu")
    data = cam.data
    assert data.kind == EXPECTED_KIND[kind] and cam.kind == EXPECTED_KIND[kind]
    assert data.num_cameras == 2
    fields = [n for n in CameraData.vars if n not in ("kind", "num_cameras", "degrees")]
    fields.remove("in_ndc")
    for name in fields:
        array = getattr(data, name)
        if name in GRAD_PARAMS[kind] or hasattr(type(cam), name):
            assert getattr(cam, name) is array, name
            assert array.shape[0] == 2, name
        else:
            assert array.shape[0] == 0, name
    with pytest.raises(AttributeError, match=r"R is fixed .*\(R\.assign"):
        cam.R = wp.zeros(2, dtype=wp.mat33)


# ----------------------------------------------------------------------------- OpenCV
def _opencv_setup(rng, sizes):
    n = len(sizes)
    hw = np.array(sizes, dtype=np.float64)
    R = _random_rotations(rng, n)
    tvec = np.concatenate([rng.uniform(-0.5, 0.5, (n, 2)), rng.uniform(4, 6, (n, 1))], 1)
    K = np.zeros((n, 3, 3))
    K[:, 0, 0] = rng.uniform(400, 600, n)
    K[:, 1, 1] = K[:, 0, 0] * rng.uniform(0.95, 1.05, n)
    K[:, 0, 2] = hw[:, 1] / 2 + rng.uniform(-20, 20, n)
    K[:, 1, 2] = hw[:, 0] / 2 + rng.uniform(-20, 20, n)
    K[:, 2, 2] = 1.0
    return R, tvec, K, hw


SIZES = [(480, 640), (640, 480), (300, 300)]  # wide, tall, square (H, W)


def test_opencv_round_trip_is_identity(device):
    rng = np.random.default_rng(4)
    R, tvec, K, hw = _opencv_setup(rng, SIZES)
    cams = cameras_from_opencv_projection(R, tvec, K, hw, device=device)
    assert isinstance(cams, PerspectiveCameras) and cams.in_ndc() and len(cams) == 3
    R2, t2, K2 = opencv_from_cameras_projection(cams, hw)
    # The camera stores float32: the round trip is exact to float32 rounding of
    # each value (6e-8 relative; measured <= 4.2e-8 relative, 1.8e-5 px on K).
    np.testing.assert_allclose(R2, R, rtol=0, atol=2e-7)
    np.testing.assert_allclose(t2, tvec, rtol=2e-7, atol=1e-7)
    np.testing.assert_allclose(K2, K, rtol=2e-7, atol=1e-7)


def _opencv_pixels(R, tvec, K, X):
    xc = np.einsum("nij,nvj->nvi", R, X) + tvec[:, None]
    uvw = np.einsum("nij,nvj->nvi", K, xc)
    return uvw[..., :2] / uvw[..., 2:]


def _ndc_to_opencv_pixels(ndc, hw):
    h, w = hw[:, 0:1], hw[:, 1:2]
    s = np.minimum(h, w) / 2.0
    return np.stack([w / 2.0 - s * ndc[..., 0], h / 2.0 - s * ndc[..., 1]], axis=-1)


def test_opencv_cameras_project_like_opencv(device):
    rng = np.random.default_rng(8)
    R, tvec, K, hw = _opencv_setup(rng, SIZES)
    X = rng.uniform(-0.5, 0.5, (3, 6, 3))
    want = _opencv_pixels(R, tvec, K, X)
    cams = cameras_from_opencv_projection(R, tvec, K, hw, device=device)
    v2m = np.repeat(np.arange(3), 6).astype(np.int32)
    ndc = cams.transform_points_ndc(X.reshape(-1, 3), v2m).numpy().reshape(3, 6, 3)
    # float32 NDC of size ~1 times s ~ 240 px: ~1e-5 px of rounding (measured 6.6e-6).
    np.testing.assert_allclose(_ndc_to_opencv_pixels(ndc, hw), want, atol=1e-4)
    # The same OpenCV camera written directly in screen space (pixels).
    Rp = R.transpose(0, 2, 1) * np.array([-1.0, -1.0, 1.0])
    Tp = tvec * np.array([-1.0, -1.0, 1.0])
    for i in range(3):
        screen = PerspectiveCameras(
            focal_length=[[K[i, 0, 0], K[i, 1, 1]]],
            principal_point=[[K[i, 0, 2], K[i, 1, 2]]],
            R=Rp[i : i + 1],
            T=Tp[i : i + 1],
            in_ndc=False,
            image_size=hw[i],
            device=device,
        )
        got = screen.transform_points_ndc(X[i]).numpy()
        np.testing.assert_allclose(
            _ndc_to_opencv_pixels(got[None], hw[i : i + 1])[0], want[i], atol=1e-4
        )
        R2, t2, K2 = opencv_from_cameras_projection(screen, hw[i])
        np.testing.assert_allclose(K2[0], K[i], rtol=2e-7, atol=1e-7)
        np.testing.assert_allclose(R2[0], R[i], atol=2e-7)


def test_opencv_from_fov_perspective(device):
    hw = (480, 640)
    R, T = look_at_view_transform(2.7, 15.0, 40.0)
    cam = FoVPerspectiveCameras(R=R, T=T, fov=50.0, device=device)
    Rcv, tcv, K = opencv_from_cameras_projection(cam, hw)
    f = 240.0 / np.tan(np.deg2rad(25.0))
    np.testing.assert_allclose(K[0], [[f, 0, 320.0], [0, f, 240.0], [0, 0, 1]], rtol=1e-6)
    X = np.random.default_rng(0).uniform(-0.5, 0.5, (5, 3))
    ndc = cam.transform_points_ndc(X).numpy()
    want = _opencv_pixels(
        Rcv.astype(np.float64), tcv.astype(np.float64), K.astype(np.float64), X[None]
    )
    np.testing.assert_allclose(
        _ndc_to_opencv_pixels(ndc[None], np.array([hw], float)), want, atol=1e-4
    )


def test_opencv_rejects_orthographic():
    with pytest.raises(TypeError, match="cameras"):
        opencv_from_cameras_projection(FoVOrthographicCameras(), (4, 4))


# ----------------------------------------------------------------------------- validation
def _tilt(eps: float) -> np.ndarray:
    r = np.eye(3)[None].copy()
    r[0, 0, 1] = eps  # |R R^T - I| = eps off the diagonal
    return r


BAD_INPUTS = [
    (lambda: FoVPerspectiveCameras(znear=0.0), ValueError, "znear"),
    (lambda: FoVPerspectiveCameras(znear=-1.0), ValueError, "znear"),
    (lambda: FoVPerspectiveCameras(znear=2.0, zfar=1.0), ValueError, "zfar"),
    (lambda: FoVOrthographicCameras(znear=5.0, zfar=5.0), ValueError, "zfar"),
    (lambda: FoVPerspectiveCameras(fov=180.0), ValueError, "fov"),
    (lambda: FoVPerspectiveCameras(fov=3.5, degrees=False), ValueError, "fov"),
    (lambda: FoVPerspectiveCameras(aspect_ratio=0.0), ValueError, "aspect_ratio"),
    (lambda: FoVPerspectiveCameras(R=2 * np.eye(3)[None]), ValueError, r"R\[0\] is not a rotation"),
    (lambda: FoVPerspectiveCameras(R=np.diag([1.0, 1.0, -1.0])[None]), ValueError, "det"),
    (lambda: FoVPerspectiveCameras(R=_tilt(2 * ROTATION_TOLERANCE)), ValueError, "tolerance"),
    (lambda: FoVPerspectiveCameras(R=np.eye(3)), ValueError, r"R must have shape \(N, 3, 3\)"),
    (lambda: FoVPerspectiveCameras(T=[0.0, 0.0, 1.0]), ValueError, r"T must have shape \(N, 3\)"),
    (lambda: FoVPerspectiveCameras(T=[[0.0, np.nan, 1.0]]), ValueError, "T must be finite"),
    (lambda: FoVPerspectiveCameras(fov=[[60.0]]), ValueError, "fov must have shape"),
    (
        lambda: FoVPerspectiveCameras(R=np.stack([np.eye(3)] * 2), T=np.zeros((3, 3))),
        ValueError,
        "R: 2, T: 3",
    ),
    (lambda: FoVOrthographicCameras(min_x=1.0, max_x=1.0), ValueError, "max_x"),
    (lambda: FoVOrthographicCameras(scale_xyz=(1.0, 1.0, 1.0)), ValueError, "scale_xyz"),
    (lambda: PerspectiveCameras(focal_length=0.0), ValueError, "focal_length"),
    (lambda: PerspectiveCameras(focal_length=np.ones((1, 3))), ValueError, "focal_length"),
    (lambda: PerspectiveCameras(in_ndc=False), ValueError, "image_size"),
    (lambda: PerspectiveCameras(image_size=(0, 4)), ValueError, "image_size"),
    (lambda: PerspectiveCameras(principal_point=(0.0, 0.0)), ValueError, "principal_point"),
    (
        lambda: FoVPerspectiveCameras(R=wp.array(np.eye(3)[None], dtype=wp.float64)),
        TypeError,
        "R must be a float32 wp.array",
    ),
    (lambda: FoVPerspectiveCameras(fov="wide"), TypeError, "fov must be numeric"),
    (lambda: look_at_view_transform(eye=(0.0, 3.0, 0.0)), ValueError, "up="),
    (lambda: look_at_view_transform(dist=[1.0, 2.0], azim=[0.0, 1.0, 2.0]), ValueError, "azim"),
    (lambda: look_at_view_transform(at=(0.0, 1.0)), ValueError, "at must have shape"),
    (
        lambda: cameras_from_opencv_projection(
            np.eye(3)[None],
            np.zeros((1, 3)),
            np.array([[[1.0, 0.1, 0], [0, 1, 0], [0, 0, 1]]]),
            (4, 4),
        ),
        ValueError,
        "skew",
    ),
    (
        lambda: cameras_from_opencv_projection(
            np.eye(3)[None], np.zeros(3), np.eye(3)[None], (4, 4)
        ),
        ValueError,
        "tvec",
    ),
    (lambda: RasterizationSettings(64), TypeError, "positional"),
    (
        lambda: MeshRasterizer(cameras=FoVPerspectiveCameras(), raster_settings={}),
        TypeError,
        "raster_settings",
    ),
]


@pytest.mark.parametrize(
    "make, exc, match", BAD_INPUTS, ids=[f"{i:02d}" for i in range(len(BAD_INPUTS))]
)
def test_bad_input_raises_naming_the_argument(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_rotation_tolerance_boundary():
    FoVPerspectiveCameras(R=_tilt(0.5 * ROTATION_TOLERANCE))  # accepted
    with pytest.raises(ValueError, match="tolerance"):
        FoVPerspectiveCameras(R=_tilt(1.5 * ROTATION_TOLERANCE))


def test_bad_projection_calls_raise(device):
    cams = FoVPerspectiveCameras(T=[[0, 0, 3.0], [0, 0, 4.0]], device=device)
    verts = np.zeros((4, 3))
    with pytest.raises(ValueError, match="vert_to_mesh is required"):
        cams.transform_points_ndc(verts)
    with pytest.raises(ValueError, match="vert_to_mesh holds values"):
        cams.transform_points_ndc(verts, np.array([0, 1, 2, 0]))
    with pytest.raises(ValueError, match="vert_to_mesh must have length 4"):
        cams.transform_points_ndc(verts, np.array([0, 1, 1], np.int32))
    with pytest.raises(ValueError, match=r"verts must have shape \(V, 3\)"):
        cams.transform_points_ndc(np.zeros((4, 2)), np.zeros(4, np.int32))
    grad_cam = FoVPerspectiveCameras(device=device, requires_grad=True)
    out = wp.empty(4, dtype=wp.vec3, device=device)
    with pytest.raises(ValueError, match="out must have requires_grad"):
        grad_cam.transform_points_ndc(verts, out=out)
    with pytest.raises(ValueError, match="out must be a wp.array of vec3 with shape"):
        grad_cam.transform_points_ndc(verts, out=wp.empty(3, dtype=wp.vec3, device=device))
    r = MeshRasterizer(cameras=cams)
    with pytest.raises(ValueError, match=r"Wrong number \(2\) of cameras for 3 meshes"):
        r(verts, np.zeros((0, 3), np.int32), np.zeros(3, np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="cameras must be given"):
        MeshRasterizer()(verts, np.zeros((0, 3), np.int32), [0], [0])


def test_perspective_cameras_defaults():
    cam = PerspectiveCameras(focal_length=[2.0, 3.0])  # (N,) -> (N, 2), as PyTorch3D
    assert len(cam) == 2 and cam.focal_length.shape == (2, 2)
    np.testing.assert_array_equal(cam.focal_length.numpy(), [[2, 2], [3, 3]])
    assert cam.get_znear() is None and cam.is_perspective() and cam.in_ndc()
    s = MeshRasterizer(cameras=cam).resolved_settings()
    assert s["perspective_correct"] and s["z_clip_value"] is None  # PyTorch3D: no znear
    ortho = FoVOrthographicCameras(znear=0.5)
    assert not ortho.is_perspective()
    assert MeshRasterizer(cameras=ortho).resolved_settings()["z_clip_value"] is None
    persp = FoVPerspectiveCameras(znear=[0.4, 2.0], T=[[0, 0, 1.0]])
    assert MeshRasterizer(cameras=persp).resolved_settings()["z_clip_value"] == pytest.approx(0.2)


def test_import_is_light():
    code = (
        "import sys, warpraster.camera, warpraster.rasterizer; "
        "bad = [m for m in ('torch', 'pxr') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    path = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr + res.stdout
