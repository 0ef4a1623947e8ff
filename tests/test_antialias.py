"""warpraster.antialias against nvdiffrast 0.4.0's own numbers, finite differences,
batches, empty images, determinism, graph capture and input checks.

The reference cases (tests/data/nvdiffrast-antialias, README there) hold
nvdiffrast's rasterization of a scene given in the project's NDC, the hard image,
nvdiffrast's antialiased image, an upstream gradient and the gradients it gave.
``WARPRASTER_NVDR_AA`` names another directory of cases with the same format
(hidden cases): every ``*.npz`` there runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster.antialiasing import edge_opposites

DATA = Path(
    os.environ.get(
        "WARPRASTER_NVDR_AA", Path(__file__).resolve().parent / "data" / "nvdiffrast-antialias"
    )
)
CASES = sorted(p.stem for p in DATA.glob("*.npz"))


def load(name: str) -> dict:
    with np.load(DATA / f"{name}.npz", allow_pickle=False) as d:
        case = {k: d[k] for k in d.files}
    case["meta"] = json.loads(str(case["meta"]))
    return case


def packed_ids(case, local: np.ndarray) -> np.ndarray:
    """Local face ids (N, H, W) (-1 empty) -> packed (N, H, W, 1) int32."""
    n = local.shape[0]
    nf = case["faces"].shape[0]
    off = (np.arange(n) * nf)[:, None, None]
    return np.where(local >= 0, local + off, -1).astype(np.int32)[..., None]


def nvdr_ids(case) -> np.ndarray:
    return packed_ids(case, case["rast"][..., 3].astype(np.int32) - 1)


def run(device, color, p2f, verts, faces, grad_out, *, zbuf=None, deterministic=False):
    """(aa, grad_color, grad_verts) of one recorded call with upstream gradient ``grad_out``."""
    c = wp.array(color, dtype=wp.float32, device=device, requires_grad=True)
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    z = None if zbuf is None else wp.array(zbuf, dtype=wp.float32, device=device)
    p = wp.array(p2f, dtype=wp.int32, device=device)
    tape = wp.Tape()
    with tape:
        out = wr.antialias(c, p, v, faces, zbuf=z, deterministic=deterministic)
    out.grad.assign(grad_out)
    tape.backward()
    return out.numpy().copy(), c.grad.numpy().copy(), v.grad.numpy().copy()


def test_reference_cases_present():
    assert len(CASES) >= 5, f"no nvdiffrast antialias cases in {DATA}"


@pytest.mark.parametrize("name", CASES)
def test_mapping_puts_nvdiffrast_clip_on_the_project_grid(name):
    """The op's NDC -> clip map (clip = (-x sx, -y sy)) is the one the cases were fed."""
    case = load(name)
    h, w = (int(s) for s in case["resolution"])
    m = min(h, w)
    sx, sy = np.float32(m / w), np.float32(m / h)
    v = case["verts_ndc"].reshape(case["clip_pos"].shape[0], -1, 3)
    np.testing.assert_array_equal(-v[..., 0] * sx, case["clip_pos"][..., 0])
    np.testing.assert_array_equal(-v[..., 1] * sy, case["clip_pos"][..., 1])


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("depth", ["zbuf", "recomputed"])
def test_matches_nvdiffrast_given_its_rasterization(device, name, depth):
    """Forward and both gradients equal nvdiffrast's, fed its own face ids.

    Tolerances (float32 rounding only; any different edge decision would change a
    pixel by up to half a colour step and a vertex gradient by O(1-100)):
    * aa, grad_color: values of size <= ~3 (colours in [0, 1), standard-normal
      upstream gradients); nvdiffrast adds the up-to-4 blends of a pixel with
      atomics in any order and its CUDA build contracts a*b - c into FMA: a few
      ulp of 4 -> 1e-5 (measured <= 1.4e-6).
    * grad_verts_ndc: sums of up to a few hundred per-pair terms, values up to
      ~150 (2^-23 * 150 = 1.8e-5 per rounding), each term ~10 float32 operations
      with FMA contraction there and not here, summed in another order: 2e-4
      (measured <= 1.6e-5).
    ``zbuf``: nvdiffrast's z/w orders the faces of a pair, as there; ``recomputed``:
    the op recomputes depth from the vertices (the same decisions on every case).
    """
    case = load(name)
    zbuf = case["rast"][..., 2:3].copy() if depth == "zbuf" else None
    aa, gc, gv = run(device, case["color"], nvdr_ids(case), case["verts_ndc"],
                     case["faces_packed"], case["grad_aa"], zbuf=zbuf)  # fmt: skip
    np.testing.assert_allclose(aa, case["aa"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(gc, case["grad_color"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(gv, case["grad_verts_ndc"], rtol=0, atol=2e-4)
    assert (aa != case["color"]).any() or not (case["aa"] != case["color"]).any()


def _masked(case, ours: np.ndarray) -> np.ndarray:
    """Pixels where the two rasterizations differ, and their 4 neighbours."""
    diff = ours[..., 0] != nvdr_ids(case)[..., 0]
    m = diff.copy()
    m[:, 1:] |= diff[:, :-1]
    m[:, :-1] |= diff[:, 1:]
    m[:, :, 1:] |= diff[:, :, :-1]
    m[:, :, :-1] |= diff[:, :, 1:]
    return m


@pytest.mark.parametrize("name", CASES)
def test_matches_nvdiffrast_through_own_rasterization(device, name):
    """warpraster's K = 1 raster + vertex-colour interpolation + antialias against
    nvdiffrast's whole chain, wherever the two rasterizations agree.

    Masked: pixels whose face differs (centres within 0.03 px of an edge, where the
    two rasterizers' fill rules differ) and their 4 neighbours (a pair involves a
    pixel and its right / lower neighbour and writes to either). Tolerances:
    * aa 5e-5: our interpolated colours differ from nvdiffrast's by up to ~4e-5
      (barycentric rounding on small faces, README), blended with weights <= 1;
    * grad_color 1e-5: it depends on the faces, not on the colours (as above);
    * vertex gradients only of vertices whose faces touch no masked pixel: one
      differing pixel adds or removes a whole edge crossing there. Their terms
      carry the colour differences (4e-5 relative to colours ~1) times values up
      to ~150: 5e-3.
    """
    case = load(name)
    n = case["color"].shape[0]
    h, w = (int(s) for s in case["resolution"])
    nf = case["faces"].shape[0]
    v = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device)
    faces = wp.array(case["faces_packed"], dtype=wp.int32, device=device)
    frags = wr.rasterize_meshes(v, faces, [i * nf for i in range(n)], [nf] * n,
                                image_size=(h, w), faces_per_pixel=1)  # fmt: skip
    p2f = frags.pix_to_face.numpy()
    np.testing.assert_array_equal(p2f, packed_ids(case, case["ref_pix_to_face"]))
    colors = np.tile(case["vert_colors"], (n, 1))
    vals = wr.interpolate_vertex_attributes(frags.pix_to_face, frags.bary_coords, colors, faces,
                                            perspective_correct=False)  # fmt: skip
    color = vals.numpy().reshape(n, h, w, 3)
    aa, gc, gv = run(device, color, p2f, case["verts_ndc"], faces, case["grad_aa"])
    keep = ~_masked(case, p2f)
    assert keep.mean() > 0.9
    np.testing.assert_allclose(aa[keep], case["aa"][keep], rtol=0, atol=5e-5)
    np.testing.assert_allclose(gc[keep], case["grad_color"][keep], rtol=0, atol=1e-5)
    touched = np.zeros(len(case["verts_ndc"]), bool)
    for ids in (p2f[..., 0], nvdr_ids(case)[..., 0]):
        f = ids[~keep]
        touched[case["faces_packed"][f[f >= 0]].ravel()] = True
    if keep.all():  # no pixel differs (aa_p01): every vertex compares
        assert not touched.any()
    np.testing.assert_allclose(gv[~touched], case["grad_verts_ndc"][~touched], rtol=0, atol=5e-3)


def test_batch_images_are_independent(device):
    """Each image of a batch gets what it gets alone: no gradient lands on another
    image's vertices (nvdiffrast 0.4.0 can misplace them, README "Batches").

    Forward and colour gradient bit for bit (per-pixel gathers). Vertex gradients
    to float32 rounding: the fixed-order sum groups each vertex's terms in chunks
    of the whole batch's entry list, so alone the grouping can differ; values
    <= ~20, a few roundings of 2.4e-6 each: 1e-5. A misplaced edge term would be
    O(1-10)."""
    case = load("aa_p05_batch3_two_icos_24x40")
    p2f = nvdr_ids(case)
    batched = run(device, case["color"], p2f, case["verts_ndc"], case["faces_packed"],
                  case["grad_aa"], deterministic=True)  # fmt: skip
    nv = case["verts_ndc"].shape[0] // 3
    nf = case["faces"].shape[0]
    for i in range(3):
        local = np.where(p2f[i : i + 1] >= 0, p2f[i : i + 1] - i * nf, -1)
        alone = run(device, case["color"][i : i + 1], local,
                    case["verts_ndc"][i * nv : (i + 1) * nv], case["faces"],
                    case["grad_aa"][i : i + 1], deterministic=True)  # fmt: skip
        np.testing.assert_array_equal(batched[0][i], alone[0][0])
        np.testing.assert_array_equal(batched[1][i], alone[1][0])
        np.testing.assert_allclose(batched[2][i * nv : (i + 1) * nv], alone[2], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["aa_p03_ico2_48", "aa_p04_soup40_64"])
def test_deterministic_is_bit_identical(device, name):
    """deterministic=True: the same bits on every run (fixed-order sums); the atomic
    path agrees with it to float32 rounding (sums of <= a few hundred terms of
    size <= ~150 in another order: 2e-4). Its image (the sparse forward) is the
    gather's bit for bit on the CPU, whose serial atomics land in the gather's
    order; on a GPU a pixel changed by two or more pairs (<= 4 terms of size <= 1
    on colours in [0, 1]) sums them in another order: a few float32 ulps, 1e-6."""
    case = load(name)
    args = (case["color"], nvdr_ids(case), case["verts_ndc"], case["faces_packed"], case["grad_aa"])
    first = run(device, *args, deterministic=True)
    for _ in range(3):
        again = run(device, *args, deterministic=True)
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(a, b)
    atomic = run(device, *args)
    if wp.get_device(device).is_cpu:
        np.testing.assert_array_equal(atomic[0], first[0])
    np.testing.assert_allclose(atomic[0], first[0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(atomic[1], first[1])
    np.testing.assert_allclose(atomic[2], first[2], rtol=0, atol=2e-4)


def test_empty_images_and_no_faces_pass_color_through(device):
    """No face anywhere (or no faces at all): the image and its gradient pass through."""
    rng = np.random.default_rng(0)
    color = rng.uniform(size=(2, 5, 7, 4)).astype(np.float32)
    g = rng.normal(size=color.shape).astype(np.float32)
    verts = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
    empty = np.full((2, 5, 7, 1), -1, np.int32)
    for faces in (np.array([[0, 1, 2]], np.int32), np.zeros((0, 3), np.int32)):
        aa, gc, gv = run(device, color, empty, verts, faces, g, deterministic=True)
        np.testing.assert_array_equal(aa, color)
        np.testing.assert_array_equal(gc, g)
        np.testing.assert_array_equal(gv, 0.0)


def _op_loss(device, case, p2f, verts, weights) -> tuple[float, np.ndarray]:
    """float64 loss sum(aa * weights) and the pair codes (the discrete decisions)."""
    op = wr.Antialias(case["faces_packed"], len(verts), case["color"].shape, device,
                      store_pairs=True)  # fmt: skip
    c = wp.array(case["color"], dtype=wp.float32, device=device)
    v = wp.array(verts.astype(np.float32), dtype=wp.vec3, device=device)
    out = op(c, wp.array(p2f, dtype=wp.int32, device=device), v)
    return float((out.numpy().astype(np.float64) * weights).sum()), op.pair_code.numpy().copy()


@pytest.mark.parametrize("name", ["aa_p01_tri_16", "aa_p03_ico2_48", "aa_p04_soup40_64"])
def test_vertex_gradient_matches_central_differences(device, name):
    """d sum(aa * g) / d verts_ndc (x, y) against central differences, face ids fixed.

    The antialiased image is a smooth function of the vertices between discrete
    events (which edge a pair takes, whether its crossing is inside the window or
    clamped); the hard image is flat there. Step 5e-5 NDC (1/640 px at 16 px,
    1/600 px at 64 px): no event within it on these cases (checked: the pair
    decisions are the same at both ends), and small enough for the curvature of
    nearly parallel edge pairs in the soup (at 2e-4 one y-derivative of -1.34 read
    +2.48 by differences, at 5e-5 -1.33). float32 rounding of the changed image
    values (6e-8 each, up to ~200 of them, random signs: ~1e-6 in the loss) over
    2 h = 1e-4 gives ~1e-2: atol 2e-2. The op's derivative uses 1 / (dy + 1e-3 px)
    for 1 / dy (nvdiffrast's guard), a relative error 1e-3 / |dy|, <= 1e-3 for
    the edges here (|dy| >= 1 px): rtol 2e-3. (Not aa_p02: a vertex there sits
    exactly on a pixel centre, an event.) The 8 vertices with the largest
    gradients are checked (values up to ~140).
    """
    case = load(name)
    p2f = nvdr_ids(case)
    verts = case["verts_ndc"].astype(np.float64)
    weights = case["grad_aa"].astype(np.float64)
    _, _, gv = run(device, case["color"], p2f, case["verts_ndc"], case["faces_packed"],
                   case["grad_aa"])  # fmt: skip
    _, codes = _op_loss(device, case, p2f, verts, weights)
    h = 5e-5
    fd = np.zeros_like(gv)
    chosen = np.argsort(-np.abs(gv).max(1))[:8]
    for i in chosen:
        for k in range(2):
            vp, vm = verts.copy(), verts.copy()
            vp[i, k] += h
            vm[i, k] -= h
            lp, cp = _op_loss(device, case, p2f, vp, weights)
            lm, cm = _op_loss(device, case, p2f, vm, weights)
            np.testing.assert_array_equal(cp, codes)
            np.testing.assert_array_equal(cm, codes)
            fd[i, k] = (lp - lm) / (2 * h)
    assert np.abs(fd).max() > 1.0
    np.testing.assert_allclose(gv[chosen, :2], fd[chosen, :2], rtol=2e-3, atol=2e-2)


def test_pose_gradient_through_rasterization_matches_central_differences(device):
    """A silhouette through the whole chain (rasterize, coverage 1/0, antialias):
    d loss / d (rotation, translation) of the mesh in the image plane, by the chain
    rule from the vertex gradient, against central differences that re-rasterize.

    One triangle (aa_p01; a mesh's interior edges add events where a pixel changes
    faces along the silhouette). Step 1e-4 (NDC, radians): a vertex moves
    <= 1e-4 NDC = 8e-4 px, no pixel centre changes sides (checked: same face ids
    at both ends), so the loss is smooth over the step. Quotient noise: float32
    image rounding (~1e-6 in the loss) over 2e-4: 5e-3 absolute; the
    1/(dy + 1e-3 px) guard: 1e-3 relative: rtol 5e-3, atol 1e-2.
    """
    case = load("aa_p01_tri_16")
    h_img, w_img = (int(s) for s in case["resolution"])
    base = case["verts_ndc"].astype(np.float64)
    faces = case["faces_packed"]
    weights = np.random.default_rng(3).normal(size=(1, h_img, w_img, 1))
    centre = base[:, :2].mean(0)

    def posed(p):
        th, tx, ty = p
        rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
        out = base.copy()
        out[:, :2] = (base[:, :2] - centre) @ rot.T + centre + [tx, ty]
        return out

    def loss_and_grad(p, grad: bool):
        v = posed(p)
        vw = wp.array(v.astype(np.float32), dtype=wp.vec3, device=device, requires_grad=grad)
        fw = wp.array(faces, dtype=wp.int32, device=device)
        frags = wr.rasterize_meshes(vw, fw, [0], [len(faces)], image_size=(h_img, w_img),
                                    faces_per_pixel=1)  # fmt: skip
        p2f = frags.pix_to_face.numpy()
        sil = (p2f >= 0).astype(np.float32)
        c = wp.array(sil, dtype=wp.float32, device=device)
        tape = wp.Tape()
        with tape:
            out = wr.antialias(c, frags.pix_to_face, vw, faces)
        loss = float((out.numpy().astype(np.float64) * weights).sum())
        if not grad:
            return loss, p2f, None
        out.grad.assign(np.broadcast_to(weights, out.shape).astype(np.float32))
        tape.backward()
        gv = vw.grad.numpy().astype(np.float64)[:, :2]
        th = p[0]
        drot = np.array([[-np.sin(th), -np.cos(th)], [np.cos(th), -np.sin(th)]])
        g_th = float((gv * ((base[:, :2] - centre) @ drot.T)).sum())
        return loss, p2f, np.array([g_th, gv[:, 0].sum(), gv[:, 1].sum()])

    p0 = np.array([0.05, 0.013, -0.021])
    _, ids, grad = loss_and_grad(p0, True)
    step = 1e-4
    fd = np.zeros(3)
    for k in range(3):
        dp = np.zeros(3)
        dp[k] = step
        lp, ip, _ = loss_and_grad(p0 + dp, False)
        lm, im, _ = loss_and_grad(p0 - dp, False)
        np.testing.assert_array_equal(ip, ids)
        np.testing.assert_array_equal(im, ids)
        fd[k] = (lp - lm) / (2 * step)
    assert np.abs(fd).max() > 1.0
    np.testing.assert_allclose(grad, fd, rtol=5e-3, atol=1e-2)


def test_object_reuse_capture_and_fresh_tapes(device):
    """The Antialias object: repeated recorded steps with fresh tapes give the same
    gradients without tape.zero() (the user zeroes only their own arrays), and a
    captured forward + backward replays to the eager numbers bit for bit."""
    case = load("aa_p02_two_tris_occlusion_32")
    op = wr.Antialias(case["faces_packed"], len(case["verts_ndc"]), case["color"].shape, device,
                      deterministic=True)  # fmt: skip
    c = wp.array(case["color"], dtype=wp.float32, device=device, requires_grad=True)
    v = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device, requires_grad=True)
    p = wp.array(nvdr_ids(case), dtype=wp.int32, device=device)
    g = wp.array(case["grad_aa"], dtype=wp.float32, device=device)

    def step():
        c.grad.zero_()
        v.grad.zero_()
        tape = wp.Tape()
        with tape:
            out = op(c, p, v)
        wp.copy(out.grad, g)
        tape.backward()
        return out

    results = []
    for _ in range(2):
        out = step()
        results.append((out.numpy().copy(), c.grad.numpy().copy(), v.grad.numpy().copy()))
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(results[0][2], case["grad_verts_ndc"], rtol=0, atol=2e-4)
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for x in (op.out, c.grad, v.grad):
        x.zero_()
    wp.capture_launch(cap.graph)
    for a, x in zip(results[0], (op.out, c.grad, v.grad), strict=True):
        np.testing.assert_array_equal(a, x.numpy())


def test_recording_one_object_twice_raises(device):
    case = load("aa_p01_tri_16")
    op = wr.Antialias(case["faces_packed"], 3, case["color"].shape, device)
    c = wp.array(case["color"], dtype=wp.float32, device=device, requires_grad=True)
    v = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device, requires_grad=True)
    p = wp.array(nvdr_ids(case), dtype=wp.int32, device=device)
    tape = wp.Tape()
    with tape:
        op(c, p, v)
        op(c, p, v)
    with pytest.raises(ValueError, match="ran again"):
        tape.backward()


def test_topology_finds_shared_edges():
    """Edge e of a face is opposite corner e; a shared edge names the other face's
    third vertex, a boundary edge -1; degenerate faces and soups have none."""
    faces = np.array([[0, 1, 2], [2, 1, 3], [4, 4, 5]])
    opp = edge_opposites(faces, 6)
    np.testing.assert_array_equal(opp, [[3, -1, -1], [-1, -1, 0], [-1, -1, -1]])
    ico = load("aa_p03_ico2_48")
    opp = edge_opposites(ico["faces"], len(ico["verts_ndc"]))
    assert (opp >= 0).all()  # a closed mesh: every edge shared
    soup = load("aa_p04_soup40_64")
    assert (edge_opposites(soup["faces"], len(soup["verts_ndc"])) == -1).all()


def test_bad_input_names_the_argument(device):
    case = load("aa_p01_tri_16")
    color = wp.array(case["color"], dtype=wp.float32, device=device)
    p2f = wp.array(nvdr_ids(case), dtype=wp.int32, device=device)
    verts = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device)
    faces = case["faces_packed"]
    with pytest.raises(TypeError, match="color"):
        wr.antialias(case["color"], p2f, verts, faces)
    with pytest.raises(TypeError, match="pix_to_face"):
        wr.antialias(color, wp.array(nvdr_ids(case).astype(np.float32), device=device), verts,
                     faces)  # fmt: skip
    with pytest.raises(ValueError, match="pix_to_face"):
        wr.antialias(color, wp.zeros((1, 16, 16, 2), dtype=wp.int32, device=device), verts, faces)
    with pytest.raises(ValueError, match="pix_to_face"):
        wr.antialias(color, wp.full((1, 16, 16, 1), 1, dtype=wp.int32, device=device), verts,
                     faces)  # fmt: skip
    with pytest.raises(TypeError, match="verts_ndc"):
        wr.antialias(color, p2f, wp.array(case["verts_ndc"], device=device), faces)
    with pytest.raises(ValueError, match="faces"):
        wr.antialias(color, p2f, verts, faces + 1)
    with pytest.raises(ValueError, match="zbuf"):
        wr.antialias(color, p2f, verts, faces, zbuf=wp.zeros((1, 16, 15, 1), device=device))
    with pytest.raises(ValueError, match="out"):
        wr.antialias(color, p2f, verts, faces, out=color)
    op = wr.Antialias(faces, 3, (1, 16, 16, 3), device)
    with pytest.raises(ValueError, match="verts_ndc"):
        op(color, p2f, wp.zeros(4, dtype=wp.vec3, device=device))
    with pytest.raises(ValueError, match="color"):
        op(wp.zeros((1, 16, 16, 4), dtype=wp.float32, device=device), p2f, verts)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "sparse"])
def test_repeated_calls_replayed_as_graphs_equal_the_launches(device, deterministic, monkeypatch):
    """An Antialias object called again with the same arrays replays its launches as a
    captured graph, and its recorded adjoint as another (``call_graphs``; forced on the
    cpu device, where Warp 1.19 captures too). Truth: the same object with
    ``call_graphs=False``. A loop of 5 steps with fresh tapes, the vertices and colours
    moved each step; and calls without a tape in between. Equal bit for bit (the same
    launches on the same arrays), but for the sparse forward on CUDA, whose float
    atomics add a pixel's pairs and a vertex's gradient terms in no fixed order: each
    sum differs by a few ulp of its largest term, so the arrays are compared to 1e-5
    of their largest value (float32 ulp 6e-8, a vertex sums ~10-100 terms)."""
    case = load("aa_p02_two_tris_occlusion_32")
    replays = []
    real = wp.capture_launch
    monkeypatch.setattr(wp, "capture_launch", lambda *a, **k: (replays.append(1), real(*a, **k)))
    results = {}
    for mode in (False, True):
        op = wr.Antialias(case["faces_packed"], len(case["verts_ndc"]), case["color"].shape,
                          device, deterministic=deterministic)  # fmt: skip
        op.call_graphs = mode
        c = wp.array(case["color"], dtype=wp.float32, device=device, requires_grad=True)
        v = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device, requires_grad=True)
        p = wp.array(nvdr_ids(case), dtype=wp.int32, device=device)
        g = wp.array(case["grad_aa"], dtype=wp.float32, device=device)
        replays.clear()
        out = []
        for i in range(5):
            # a call without gradients between recorded ones, its own graph after 2
            plain = op(c, p, v).numpy().copy()
            c.grad.zero_()
            v.grad.zero_()
            tape = wp.Tape()
            with tape:
                img = op(c, p, v)
            wp.copy(img.grad, g)
            tape.backward()
            out.append((plain, img.numpy().copy(), c.grad.numpy().copy(), v.grad.numpy().copy()))
            v.assign(v.numpy() * (1.0 + 0.01 * (i + 1)))
            c.assign(c.numpy() * 0.97)
        # the graphs: none launched one by one; else from the second call of each kind
        # on (captured, then launched): 4 forward and 4 backward graphs of the recorded
        # steps, 4 of the plain calls
        results[mode] = out
        assert len(replays) == (0 if not mode else 4 * 2 + 4), mode
    exact = deterministic or not wp.get_device(device).is_cuda
    for step, (want, got) in enumerate(zip(results[False], results[True], strict=True)):
        for k, (a, b) in enumerate(zip(want, got, strict=True)):
            if exact:
                np.testing.assert_array_equal(b, a, err_msg=f"step {step} array {k}")
            else:
                scale = float(np.abs(a).max())
                np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * scale, err_msg=f"{step} {k}")
    assert np.abs(results[True][-1][3]).max() > 0  # vertex gradients flowed
    assert not np.array_equal(results[True][0][3], results[True][-1][3])  # the inputs moved


def test_the_object_draws_face_ids_past_the_faces_as_background(device):
    """``Antialias.__call__`` reads no values back (capturable): an id past the faces
    is drawn as background instead of read outside ``faces`` (the function form
    refuses it): the image and gradients are those of the ids set to -1."""
    case = load("aa_p03_ico2_48")
    p2f = nvdr_ids(case)
    nf = len(case["faces_packed"])
    bad = p2f.copy()
    bad[:, ::3, ::2] = nf + 7  # a column pattern of ids past the faces
    fixed = np.where(bad >= nf, -1, bad).astype(np.int32)
    results = []
    for ids in (bad, fixed):
        op = wr.Antialias(case["faces_packed"], len(case["verts_ndc"]), case["color"].shape, device)
        c = wp.array(case["color"], dtype=wp.float32, device=device, requires_grad=True)
        v = wp.array(case["verts_ndc"], dtype=wp.vec3, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            out = op(c, wp.array(ids, dtype=wp.int32, device=device), v)
        out.grad.fill_(1.0)
        tape.backward()
        results.append((out.numpy(), c.grad.numpy(), v.grad.numpy()))
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # GPU atomics' order
    with pytest.raises(ValueError, match="pix_to_face has values"):
        wr.antialias(wp.array(case["color"], dtype=wp.float32, device=device),
                     wp.array(bad, dtype=wp.int32, device=device),
                     wp.array(case["verts_ndc"], dtype=wp.vec3, device=device),
                     case["faces_packed"])  # fmt: skip
