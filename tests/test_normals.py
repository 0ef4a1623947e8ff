"""Face and vertex normals on the device.

Truths: PyTorch3D's ``Meshes.faces_normals_packed`` / ``verts_normals_packed`` of
every reference render case; a float64 NumPy transcription of the same formulas on
random meshes (with an isolated vertex and a degenerate face); central finite
differences of that float64 oracle for the gradients; capture (every device, cpu
included) equal to eager.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import warp as wp
from np_shading import central_difference

from warpraster.shading import face_normals, vertex_normals

DATA = Path(__file__).resolve().parent / "data" / "pytorch3d-render"
CASES = sorted(p.name for p in DATA.glob("r*.npz") if not p.name.startswith("r01"))


def np_normalize(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def np_face_normals(v, f):
    v = v.astype(np.float64)
    return np_normalize(np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]]))


def np_vertex_normals(v, f):
    v = v.astype(np.float64)
    s = np.zeros_like(v)
    for c in range(3):
        i, j, k = f[:, c], f[:, (c + 1) % 3], f[:, (c + 2) % 3]
        np.add.at(s, i, np.cross(v[j] - v[i], v[k] - v[i]))
    return np_normalize(s)


def random_mesh(rng, nv=12, nf=16, degenerate=True):
    v = rng.normal(size=(nv, 3)).astype(np.float32)
    f = np.array([rng.choice(nv - 1, 3, replace=False) for _ in range(nf)], np.int32)
    if degenerate:
        f[-1] = [f[0, 0], f[0, 1], f[0, 0]]  # zero area, zero normal
    return v, f  # vertex nv - 1 is in no face


@pytest.mark.parametrize("case", CASES)
def test_normals_match_pytorch3d(device, case):
    d = np.load(DATA / case)
    v = wp.array(d["verts_packed"], dtype=wp.vec3, device=device)
    fn = face_normals(v, d["faces_packed"]).numpy()
    vn = vertex_normals(v, d["faces_packed"]).numpy()
    # Face normals: the same float32 operations as PyTorch3D (bit-equal on cpu);
    # 2 ulp of a unit vector's components leaves room for another compiler.
    np.testing.assert_allclose(fn, d["faces_normals_packed"], rtol=0, atol=2.5e-7)
    # Vertex normals: float32 sums of up to ~6 corner terms in another order
    # (atomics vs index_add), then normalised: a few ulp of a unit component.
    np.testing.assert_allclose(vn, d["verts_normals_packed"], rtol=0, atol=5e-7)


def test_normals_match_float64_oracle_with_isolated_and_degenerate(device):
    rng = np.random.default_rng(0)
    v, f = random_mesh(rng)
    fn = face_normals(v, f).numpy()
    vn = vertex_normals(v, f).numpy()
    # float32 cross products of O(1) coordinates: ~1e-7 absolute on unit vectors;
    # 1e-5 covers badly shaped random faces (norms down to ~1e-2).
    np.testing.assert_allclose(fn, np_face_normals(v, f), atol=1e-5)
    np.testing.assert_allclose(vn, np_vertex_normals(v, f), atol=1e-5)
    assert (vn[-1] == 0).all() and (fn[-1] == 0).all()


@pytest.mark.parametrize("kind", ["face", "vertex"])
def test_normal_gradients_match_finite_differences(device, kind):
    """Tape gradient of <g, normals> w.r.t. a (V, 3) float32 array vs float64 FD."""
    rng = np.random.default_rng(1)
    # No degenerate face here: its normal is cross / 1e-6, whose float32 adjoint
    # cancels terms of size 1e6 (rounding ~0.1), in PyTorch3D as here.
    v, f = random_mesh(rng, degenerate=False)
    verts = wp.array(v, dtype=wp.float32, device=device, requires_grad=True)  # plain (V, 3)
    fn, oracle = (
        (face_normals, np_face_normals)
        if kind == "face"
        else (
            vertex_normals,
            np_vertex_normals,
        )
    )
    tape = wp.Tape()
    with tape:
        out = fn(verts, f)
    g = rng.normal(size=(out.shape[0], 3))
    out.grad.assign(g.astype(np.float32))
    tape.backward()
    got = verts.grad.numpy()
    assert got.shape == v.shape  # the gradient arrived in the array passed

    num = central_difference(lambda x: oracle(x, f), v.astype(np.float64), g, 1e-6)
    # float32 adjoint of O(1)-conditioned normalisations vs float64 FD: 1e-3 of
    # the largest entry.
    assert np.abs(got - num).max() <= 1e-3 * np.abs(num).max()


def test_preallocated_normals_capture(device):
    rng = np.random.default_rng(2)
    v, f = random_mesh(rng)
    verts = wp.array(v, dtype=wp.vec3, device=device)
    faces = wp.array(f, dtype=wp.int32, device=device)
    fn_out = wp.zeros(f.shape[0], dtype=wp.vec3, device=device)
    vn_out = wp.zeros(v.shape[0], dtype=wp.vec3, device=device)
    sums = wp.zeros(v.shape[0], dtype=wp.vec3, device=device)

    def run():
        face_normals(verts, faces, out=fn_out, validate=False)
        vertex_normals(verts, faces, out=vn_out, sums_out=sums, validate=False)

    run()
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        run()
    v2 = rng.normal(size=v.shape).astype(np.float32)
    verts.assign(v2)
    fn_out.zero_()
    vn_out.zero_()
    wp.capture_launch(cap.graph)
    np.testing.assert_array_equal(
        fn_out.numpy(), face_normals(wp.array(v2, dtype=wp.vec3, device=device), f).numpy()
    )
    # Bit-equal on the cpu; CUDA's atomic corner sums may round in another order.
    np.testing.assert_allclose(
        vn_out.numpy(),
        vertex_normals(wp.array(v2, dtype=wp.vec3, device=device), f).numpy(),
        rtol=0,
        atol=5e-7,
    )


def test_bad_input_names_the_argument():
    v = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="faces"):
        vertex_normals(v, [[0, 1, 4]])
    with pytest.raises(ValueError, match="verts"):
        face_normals(np.zeros((4, 2)), [[0, 1, 2]])
    with pytest.raises(TypeError, match="faces"):
        face_normals(v, np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="out"):
        face_normals(v, [[0, 1, 2]], out=wp.zeros(2, dtype=wp.vec3))
