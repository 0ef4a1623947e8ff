"""The test oracle itself: the NumPy reference against PyTorch3D's golden cases.

Measured on the public corpus (p01-p11): the float64 oracle's ``pix_to_face``
is identical to PyTorch3D's on every slot, and the float32 emulation
reproduces all four outputs bit for bit. These tests keep it that way, and
check the mismatch explainer and the finite-difference helper the fast paths'
tests rely on.
"""

from __future__ import annotations

import numpy as np
import p3d_cases
import pytest
from np_reference import (
    fragments_from_pix_to_face,
    ndc,
    pixel_centers,
    rasterize_reference,
    reference_grad_verts_fd,
)
from p3d_compare import compare_fragments, compare_with_case, explain_mismatch

FRAGMENT_KEYS = ("pix_to_face", "zbuf", "bary_coords", "dists")


def _clipping_is_noop(case: dict) -> bool:
    """True when PyTorch3D's z clipping / frustum culling changed nothing."""
    if case["cull_to_frustum"]:
        return False
    zc = case["z_clip_value"]
    if zc is None:
        return True
    verts = case["verts_ndc_packed"] if case["case_kind"] == "camera" else case["verts_packed"]
    used = np.unique(case["faces_packed"])
    return bool(np.all(verts[used, 2] >= zc))


def _oracle_cases() -> list[str]:
    """Raw cases plus the camera cases the oracle can run (no clipping effect)."""
    names = p3d_cases.raw_case_names()
    names += [n for n in p3d_cases.camera_case_names() if _clipping_is_noop(p3d_cases.load_case(n))]
    return names


ORACLE_CASES = p3d_cases.case_params(_oracle_cases() if p3d_cases.case_paths() else [])
ALL_CASES = p3d_cases.case_params(p3d_cases.case_names())


# --------------------------------------------------------------------------
# Loader
# --------------------------------------------------------------------------


def test_corpus_has_raw_and_camera_cases():
    p3d_cases.require_reference()
    raw, cam = p3d_cases.raw_case_names(), p3d_cases.camera_case_names()
    assert raw and cam
    assert set(raw).isdisjoint(cam)
    assert sorted(raw + cam) == p3d_cases.case_names()


def test_reference_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(p3d_cases.REFERENCE_ENV, str(tmp_path))
    assert p3d_cases.reference_dir() == tmp_path
    assert p3d_cases.case_paths() == []
    with pytest.raises(pytest.skip.Exception, match=p3d_cases.REFERENCE_ENV):
        p3d_cases.require_reference()


@pytest.mark.parametrize("name", ALL_CASES)
def test_case_loads_with_consistent_shapes(name):
    c = p3d_cases.load_case(name)
    N, (H, W), K = len(c["num_faces_per_mesh"]), c["image_size"], c["faces_per_pixel"]
    V, F = len(c["verts_packed"]), len(c["faces_packed"])
    assert isinstance(c["image_size"], tuple) and (H, W) == tuple(c["pix_to_face"].shape[1:3])
    assert c["bin_size"] is None or isinstance(c["bin_size"], int)
    assert c["max_faces_per_bin"] is None or isinstance(c["max_faces_per_bin"], int)
    assert c["z_clip_value"] is None or np.isfinite(c["z_clip_value"])
    assert c["verts_packed"].shape == (V, 3) and c["faces_packed"].shape == (F, 3)
    assert c["faces_packed"].min() >= 0 and c["faces_packed"].max() < V
    assert c["num_faces_per_mesh"].sum() == F and c["num_verts_per_mesh"].sum() == V
    first = np.concatenate([[0], np.cumsum(c["num_faces_per_mesh"])[:-1]])
    np.testing.assert_array_equal(c["mesh_to_face_first_idx"], first)
    for key, shape in (
        ("pix_to_face", (N, H, W, K)),
        ("zbuf", (N, H, W, K)),
        ("bary_coords", (N, H, W, K, 3)),
        ("dists", (N, H, W, K)),
        ("grad_zbuf", (N, H, W, K)),
        ("grad_bary", (N, H, W, K, 3)),
        ("grad_dists", (N, H, W, K)),
        ("grad_verts", (V, 3)),
    ):
        assert c[key].shape == shape, key
    p2f = c["pix_to_face"]
    assert p2f.min() >= -1 and p2f.max() < F
    valid = p2f >= 0
    assert not np.any(~valid[..., :-1] & valid[..., 1:]), "used slots come first"
    assert np.all(c["zbuf"][~valid] == -1) and np.all(c["bary_coords"][~valid] == -1)
    assert np.all(c["dists"][~valid] == -1)
    # Each face only in its own mesh's images.
    n_idx = np.nonzero(valid)[0]
    lo, hi = first[n_idx], first[n_idx] + c["num_faces_per_mesh"][n_idx]
    assert np.all((p2f[valid] >= lo) & (p2f[valid] < hi))
    if c["case_kind"] == "camera":
        assert c["verts_ndc_packed"].shape == (V, 3)
        assert c["grad_verts_ndc"].shape == (V, 3)
        assert c["cam_world_to_view_matrix"].shape == (N, 4, 4)
    else:
        assert c["z_clip_value"] is None and not c["cull_to_frustum"]


# --------------------------------------------------------------------------
# The oracle against PyTorch3D
# --------------------------------------------------------------------------


def test_pixel_centers_definition():
    # Square: the centres of 4 pixels are -0.75 .. 0.75; row 0 is the top (+Y),
    # column 0 the left (+X).
    ys, xs = pixel_centers((4, 4))
    np.testing.assert_array_equal(ys, np.float32([0.75, 0.25, -0.25, -0.75]))
    np.testing.assert_array_equal(xs, ys)
    # Non-square: the short side spans [-1, 1], pixels stay square.
    ys, xs = pixel_centers((2, 4))
    np.testing.assert_array_equal(ys, np.float32([0.5, -0.5]))
    np.testing.assert_array_equal(xs, np.float32([1.5, 0.5, -0.5, -1.5]))
    assert ndc(0, 3, 3).dtype == np.float32


@pytest.mark.parametrize("name", ORACLE_CASES)
def test_oracle_matches_pytorch3d(name):
    c = p3d_cases.load_case(name)
    assert _clipping_is_noop(c)
    ours = rasterize_reference(**p3d_cases.raster_args(c))
    # compare_fragments asserts >= 99.9 % identical slots, every differing
    # pixel explained by rounding, and values within its tolerances.
    stats = compare_with_case(ours, c)
    assert stats["valid_ref"] > 0
    print(
        f"{name}: {stats['slot_mismatches']} differing slots of {stats['slots']} "
        f"({stats['valid_ref']} used); max err zbuf {stats['max_err_zbuf']:.2g} "
        f"bary {stats['max_err_bary']:.2g} dists {stats['max_err_dists']:.2g}; "
        f"{stats['explained']}"
    )


@pytest.mark.parametrize("name", ORACLE_CASES)
def test_float32_emulation_is_bitwise_pytorch3d(name):
    # Evaluating every step in float32, in the kernel's order, reproduces the
    # CPU kernel exactly: evidence that the oracle implements the same
    # definition, not merely a nearby one.
    c = p3d_cases.load_case(name)
    ours = rasterize_reference(**p3d_cases.raster_args(c), dtype=np.float32)
    for key in FRAGMENT_KEYS:
        np.testing.assert_array_equal(getattr(ours, key), c[key], err_msg=key)


@pytest.mark.parametrize("name", ORACLE_CASES)
def test_fragments_from_pix_to_face_reproduce_rasterizer(name):
    c = p3d_cases.load_case(name)
    args = p3d_cases.raster_args(c)
    ours = rasterize_reference(**args)
    re = fragments_from_pix_to_face(
        args["verts"],
        args["faces"],
        c["pix_to_face"],
        args["image_size"],
        args["blur_radius"],
        args["perspective_correct"],
        args["clip_barycentric_coords"],
    )
    # Same float64 arithmetic on the same pix_to_face: identical values.
    for key in FRAGMENT_KEYS:
        np.testing.assert_array_equal(getattr(re, key), getattr(ours, key), err_msg=key)


@pytest.mark.parametrize("name", ORACLE_CASES)
def test_finite_difference_gradients_match_pytorch3d(name):
    # Central differences through fragments_from_pix_to_face, pix_to_face held
    # fixed, give PyTorch3D's analytic gradient. Tolerance: PyTorch3D sums
    # float32 contributions sequentially, measured <= 2e-5 absolute on small
    # gradients (p09) and <= 3e-6 relative on large ones (p06, |g| ~ 1e3);
    # 1e-4 * (1 + |g|) leaves a factor >= 5.
    c = p3d_cases.load_case(name)
    args = p3d_cases.raster_args(c)
    g = reference_grad_verts_fd(
        args["verts"],
        args["faces"],
        c["pix_to_face"],
        args["image_size"],
        c["grad_zbuf"],
        c["grad_bary"],
        c["grad_dists"],
        perspective_correct=args["perspective_correct"],
        clip_barycentric_coords=args["clip_barycentric_coords"],
    )
    ref = c["grad_verts_ndc"] if c["case_kind"] == "camera" else c["grad_verts"]
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4)


def test_clipped_case_is_not_run_by_the_oracle():
    # p12 needs PyTorch3D's clipping (not part of the oracle); the load test
    # above checks its arrays. Make sure it is excluded for the right reason.
    p3d_cases.require_reference()
    clipped = [n for n in p3d_cases.case_names() if not _clipping_is_noop(p3d_cases.load_case(n))]
    for name in clipped:
        c = p3d_cases.load_case(name)
        assert c["case_kind"] == "camera" and c["z_clip_value"] is not None
        assert "clipping" in c["meta"]


# --------------------------------------------------------------------------
# Hand-made cases: conventions the corpus exercises only lightly
# --------------------------------------------------------------------------

# A 1x1 image samples one pixel centre, at the NDC origin.
ORIGIN = {"image_size": (1, 1)}


def _tri(cx, cy, z, r=1.0):
    """A CCW (in NDC numbers) triangle around (cx, cy) at depth z."""
    return [[cx - r, cy - r, z], [cx + r, cy - r, z], [cx, cy + r, z]]


def _raster(tris, **kw):
    verts = np.asarray(tris, dtype=np.float32).reshape(-1, 3)
    faces = np.arange(len(verts)).reshape(-1, 3)
    kw.setdefault("faces_per_pixel", 4)
    return rasterize_reference(verts, faces, [0], [len(faces)], **{**ORIGIN, **kw})


def _right_triangle(z, sx, *, r=0.5, gap=0.0):
    """Half of the square [-r, r]^2 split along x = y; sx = +1 or -1 picks the half."""
    a, b = [-r, -r, z], [r, r, z]
    c = [r, -r, z] if sx > 0 else [-r, r, z]
    # Shift the half away from the diagonal by `gap` along its normal.
    n = np.array([1.0, -1.0]) / np.sqrt(2) * sx * gap
    return [[p[0] + n[0], p[1] + n[1], p[2]] for p in (a, c, b)]


def test_exact_z_tie_broken_by_face_index():
    out = _raster([_tri(0, 0, 2.0), _tri(0, 0, 1.0), _tri(0.1, 0, 2.0)])
    np.testing.assert_array_equal(out.pix_to_face[0, 0, 0], [1, 0, 2, -1])
    # (not exactly 1.0 / 2.0: the +1e-8 on the area makes the barycentrics sum
    # to 1 + 2.5e-9 here)
    np.testing.assert_allclose(out.zbuf[0, 0, 0], [1.0, 2.0, 2.0, -1.0], rtol=1e-8)
    assert out.zbuf[0, 0, 0, 1] == out.zbuf[0, 0, 0, 2]  # an exact tie
    assert np.all(out.bary_coords[0, 0, 0, 3] == -1) and out.dists[0, 0, 0, 3] == -1


def test_pixel_centre_on_shared_edge():
    # Two halves of a square sharing the diagonal through the origin.
    tris = [_right_triangle(1.0, +1), _right_triangle(2.0, -1)]
    out = _raster(tris)
    np.testing.assert_array_equal(out.pix_to_face[0, 0, 0], [-1] * 4)  # strict test
    out = _raster(tris, blur_radius=1e-4)
    np.testing.assert_array_equal(out.pix_to_face[0, 0, 0], [0, 1, -1, -1])
    np.testing.assert_array_equal(out.dists[0, 0, 0, :2], [0.0, 0.0])
    assert not np.signbit(out.dists[0, 0, 0, :2]).any()  # +0: outside


def test_skips_degenerate_behind_and_negative_z():
    tris = [
        [[-1, -1, 1], [1, -1, 1], [0, -1, 1]],  # zero area
        [[-1, -1, 1], [1, -1, 1], [0, 1, -0.5]],  # a vertex behind the camera
        [[-1, -1, 1], [1, -1, 1], [0, 1, 5e-9]],  # min z < 1e-8
        _tri(0, 0, 3.0),
    ]
    out = _raster(tris)
    np.testing.assert_array_equal(out.pix_to_face[0, 0, 0], [3, -1, -1, -1])


def test_cull_backfaces_culls_negative_area():
    # _tri is counter-clockwise in NDC numbers: area (x0-x1)*(y2-y1) - ... < 0,
    # a back face (+X points left, so it is clockwise in the displayed image).
    ccw = _tri(0, 0, 1.0)
    cw = [p[:2] + [2.0] for p in (ccw[0], ccw[2], ccw[1])]
    assert _raster([ccw, cw]).pix_to_face[0, 0, 0, :2].tolist() == [0, 1]
    assert _raster([ccw, cw], cull_backfaces=True).pix_to_face[0, 0, 0, :2].tolist() == [1, -1]


def test_blur_compares_squared_distance():
    # Triangle edge at x = -0.05 (squared distance 0.0025 from the origin).
    tri = [[-0.05, -1, 1], [-1, -1, 1], [-0.05, 1, 1]]
    assert _raster([tri], blur_radius=0.0026).pix_to_face[0, 0, 0, 0] == 0
    assert _raster([tri], blur_radius=0.0024).pix_to_face[0, 0, 0, 0] == -1
    d = _raster([tri], blur_radius=0.0026).dists[0, 0, 0, 0]
    assert d == pytest.approx(0.0025, rel=1e-6)


def _neighbour_case(d_first, d_second, *, z_first=2.0, z_second=4.0, extra=None, K=4):
    """Faces 0, 1 are split halves (neighbours); the origin is outside both.

    Face i's nearest edge is at unsigned squared distance d_i from the origin.
    ``extra``: optional (index, z) of an unrelated face covering the origin.
    """

    def outside(d, z):
        e = np.sqrt(d)  # the edge x = -e, triangle to the left (x < -e)
        return [[-e, -1, z], [-e - 1, -1, z], [-e, 1, z]]

    tris = [outside(d_first, z_first), outside(d_second, z_second)]
    neighbours = [1, 0]
    if extra is not None:
        idx, z = extra
        tris.insert(idx, _tri(0, 0, z))
        neighbours = [n + (n >= idx) for n in neighbours]
        neighbours.insert(idx, -1)
    return _raster(tris, blur_radius=0.01, faces_per_pixel=K, clipped_faces_neighbor_idx=neighbours)


def test_clipped_neighbour_rule():
    # Without neighbour info both halves are kept.
    no_rule = _raster(
        [
            [[-np.sqrt(d), -1, z], [-np.sqrt(d) - 1, -1, z], [-np.sqrt(d), 1, z]]
            for d, z in ((0.002, 2.0), (0.001, 4.0))
        ],
        blur_radius=0.01,
    )
    assert no_rule.pix_to_face[0, 0, 0].tolist() == [0, 1, -1, -1]
    # Second half strictly nearer: it replaces the first, with its own values.
    p = _neighbour_case(0.002, 0.001)
    assert p.pix_to_face[0, 0, 0].tolist() == [1, -1, -1, -1]
    assert p.zbuf[0, 0, 0, 0] == pytest.approx(4.0)
    assert p.dists[0, 0, 0, 0] == pytest.approx(0.001, rel=1e-6)
    # Second half farther, or equally far (strict comparison): dropped.
    assert _neighbour_case(0.001, 0.002).pix_to_face[0, 0, 0].tolist() == [0, -1, -1, -1]
    assert _neighbour_case(0.001, 0.001).pix_to_face[0, 0, 0].tolist() == [0, -1, -1, -1]
    # The replacement takes the queue's order from its own z: faces
    # [half A (z 2), other (z 3), half B (z 4, nearer edge)] -> [other, B].
    out = _neighbour_case(0.002, 0.001, extra=(1, 3.0))
    assert out.pix_to_face[0, 0, 0].tolist() == [1, 2, -1, -1]
    np.testing.assert_allclose(out.zbuf[0, 0, 0, :2], [3.0, 4.0])
    # A neighbour already truncated out of the queue does not block: K = 1,
    # faces [other (z 1), half A (z 2), half B (z 0.5, farther edge)]:
    # A is cut by K, so B is inserted normally and wins on z.
    out = _neighbour_case(0.001, 0.002, z_second=0.5, extra=(0, 1.0), K=1)
    assert out.pix_to_face[0, 0, 0].tolist() == [2]
    # ... but with room for A, A is in the queue and B (farther) is dropped.
    out = _neighbour_case(0.001, 0.002, z_second=0.5, extra=(0, 1.0), K=2)
    assert out.pix_to_face[0, 0, 0].tolist() == [0, 1]


def test_perspective_correct_and_clip_barycentrics():
    # Perspective correction: b_i * z_j * z_k renormalised.
    verts = np.float32([[-1, -1, 1.0], [1, -1, 2.0], [0, 1, 4.0]])
    faces = np.array([[0, 1, 2]])
    lin = rasterize_reference(verts, faces, [0], [1], (1, 1), faces_per_pixel=1)
    per = rasterize_reference(
        verts, faces, [0], [1], (1, 1), faces_per_pixel=1, perspective_correct=True
    )
    b = lin.bary_coords[0, 0, 0, 0]
    z = verts[:, 2].astype(np.float64)
    w = b * np.array([z[1] * z[2], z[0] * z[2], z[0] * z[1]])
    np.testing.assert_allclose(per.bary_coords[0, 0, 0, 0], w / w.sum(), rtol=1e-12)
    np.testing.assert_allclose(per.zbuf[0, 0, 0, 0], (w / w.sum()) @ z, rtol=1e-12)
    # Clipping: outside the triangle (blur keeps it) negatives become 0.
    tri = [[-0.05, -1, 1], [-1, -1, 2], [-0.05, 1, 3]]
    raw = _raster([tri], blur_radius=0.01, faces_per_pixel=1)
    clip = _raster([tri], blur_radius=0.01, faces_per_pixel=1, clip_barycentric_coords=True)
    assert raw.bary_coords[0, 0, 0, 0].min() < 0
    bc = np.maximum(raw.bary_coords[0, 0, 0, 0], 0)
    np.testing.assert_allclose(clip.bary_coords[0, 0, 0, 0], bc / bc.sum(), rtol=1e-12)
    np.testing.assert_allclose(clip.zbuf[0, 0, 0, 0], bc / bc.sum() @ [1, 2, 3], rtol=1e-12)
    assert raw.dists[0, 0, 0, 0] == clip.dists[0, 0, 0, 0] > 0


def test_degenerate_edge_distance_uses_second_endpoint():
    # v0 == v1 (within 1e-8 squared): edge (v0, v1) measures to v1. A face
    # with such an edge has zero area, so check the helper directly.
    from np_reference import point_line_distance

    # p = a: a proper segment would give 0, the rule gives |p - b|^2.
    assert point_line_distance(1.0, 0.0, 1.0, 0.0, 1.0, 9e-5, 1e-8) == pytest.approx(8.1e-9)
    assert point_line_distance(1.0, 0.0, 1.0, 9e-5, 1.0, 0.0, 1e-8) == 0.0
    # Not degenerate (squared length 1.21e-8 > 1e-8): the segment is used.
    assert point_line_distance(1.0, 0.0, 1.0, 0.0, 1.0, 1.1e-4, 1e-8) == 0.0


# --------------------------------------------------------------------------
# The mismatch explainer
# --------------------------------------------------------------------------


def _grid_mesh(H, W, step, layers=1):
    """A triangulated grid whose vertices sit on pixel centres (edges through centres)."""
    ys, xs = pixel_centers((H, W))
    Y, X = np.meshgrid(ys[::step], xs[::step], indexing="ij")
    Z = 1.0 + 0.3 * X.astype(np.float64) + 0.2 * Y
    verts = np.stack([X, Y, Z], -1).reshape(-1, 3).astype(np.float32)
    ny, nx = Y.shape
    faces = []
    for i in range(ny - 1):
        for j in range(nx - 1):
            a, b, c, d = i * nx + j, i * nx + j + 1, (i + 1) * nx + j, (i + 1) * nx + j + 1
            faces += [[a, b, d], [a, d, c]] if (i + j) % 2 else [[a, b, c], [b, d, c]]
    faces = np.array(faces)
    verts = np.concatenate([verts] * layers)
    faces = np.concatenate([faces + k * (len(verts) // layers) for k in range(layers)])
    return verts, faces


@pytest.mark.parametrize(
    "H, W, step, blur, K, layers, kind",
    [
        (24, 36, 5, 0.0, 3, 1, "edge"),  # centres on edges: inside test at rounding level
        (20, 28, 3, 1e-3, 4, 2, "z tie"),  # two identical layers: z ties, truncation
    ],
)
def test_float32_vs_float64_differences_are_all_explained(H, W, step, blur, K, layers, kind):
    verts, faces = _grid_mesh(H, W, step, layers)
    args = dict(
        verts=verts,
        faces=faces,
        mesh_to_face_first_idx=[0],
        num_faces_per_mesh=[len(faces)],
        image_size=(H, W),
        blur_radius=blur,
        faces_per_pixel=K,
    )
    a = rasterize_reference(**args, dtype=np.float32)
    b = rasterize_reference(**args)
    stats = compare_fragments(
        a.pix_to_face,
        a.zbuf,
        a.bary_coords,
        a.dists,
        b.pix_to_face,
        b.zbuf,
        b.bary_coords,
        b.dists,
        verts=verts,
        faces=faces,
        image_size=(H, W),
        blur_radius=blur,
        perspective_correct=False,
        min_match_fraction=0.0,  # ties are everywhere by construction
    )
    assert stats["pixel_mismatches"] > 0, "the construction should produce rounding flips"
    assert all(kind in why for _, why in stats["explained"])


def _explain_at_origin(ours, ref, tris, blur=0.0):
    verts = np.asarray(tris, dtype=np.float32).reshape(-1, 3)
    faces = np.arange(len(verts)).reshape(-1, 3)
    return explain_mismatch(
        ours,
        ref,
        px=0.0,
        py=0.0,
        verts=verts,
        faces=faces,
        blur_radius=blur,
        perspective_correct=False,
    )


def test_explain_mismatch_rules():
    same_z = [_tri(0, 0, 2.0), _tri(0.1, 0, 2.0), _tri(0, 0, 3.0)]
    ok, why = _explain_at_origin([1, 0, 2], [0, 1, 2], same_z)
    assert ok and "z tie" in why
    # Truncation at a tie: K = 1.
    assert _explain_at_origin([1], [0], same_z)[0]
    # Not a tie: face 2 is farther than face 0.
    ok, why = _explain_at_origin([2, 0, 1], [0, 1, 2], same_z)
    assert not ok and "order" in why
    # A covering face missing from a list that is not full.
    ok, why = _explain_at_origin([0, 1, -1], [0, 1, 2], same_z)
    assert not ok and "not full" in why
    # ... or nearer than the last face of a full list.
    ok, why = _explain_at_origin([1, 2], [0, 1], same_z)
    assert not ok
    # A face listed although it cannot cover the pixel.
    far = same_z + [_tri(5, 5, 1.0)]
    ok, why = _explain_at_origin([3, 0, 1], [0, 1, 2], far)
    assert not ok and "does not cover" in why
    # Pixel centre on the shared edge: either answer is rounding.
    halves = [_right_triangle(1.0, +1), _right_triangle(2.0, -1)]
    ok, why = _explain_at_origin([0, -1], [-1, -1], halves)
    assert ok and "edge" in why
    # 1e-5 away from the edge is not rounding.
    moved = [_right_triangle(1.0, +1, gap=-1e-5), _right_triangle(2.0, -1, gap=1e-5)]
    assert not _explain_at_origin([1, -1], [0, -1], moved)[0]
    # On the blur boundary.
    tri = [[-0.05, -1, 1], [-1, -1, 1], [-0.05, 1, 1]]
    ok, why = _explain_at_origin([0], [-1], [tri], blur=float(np.float32(0.05) ** 2))
    assert ok and "blur" in why


def test_compare_fragments_rejects_real_differences():
    p3d_cases.require_reference()
    c = p3d_cases.load_case(p3d_cases.raw_case_names()[1])
    ref = {k: c[k] for k in FRAGMENT_KEYS}

    def compare(ours):
        return compare_with_case(ours, c)

    assert compare(ref)["slot_mismatches"] == 0
    # A face dropped from a pixel it deeply covers.
    bad = {k: v.copy() for k, v in ref.items()}
    deepest = np.where(ref["pix_to_face"][..., 0] >= 0, ref["dists"][..., 0], np.inf)
    n, y, x = np.unravel_index(np.argmin(deepest), deepest.shape)
    for key in FRAGMENT_KEYS:  # drop slot 0, shift the rest up, -1 fill
        bad[key][n, y, x] = np.roll(bad[key][n, y, x], -1, axis=0)
        bad[key][n, y, x, -1] = -1
    with pytest.raises(AssertionError, match="pixel"):
        compare(bad)
    # Values beyond tolerance.
    bad = {k: v.copy() for k, v in ref.items()}
    bad["zbuf"][ref["pix_to_face"] >= 0] += 1e-3
    with pytest.raises(AssertionError, match="zbuf"):
        compare(bad)
    # Fill other than -1.
    bad = {k: v.copy() for k, v in ref.items()}
    bad["dists"][ref["pix_to_face"] < 0] = 0.0
    with pytest.raises(AssertionError, match="-1"):
        compare(bad)
