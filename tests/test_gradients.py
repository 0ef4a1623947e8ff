"""Gradients of ``rasterize_meshes`` to the vertices (tape-recorded backward).

Three backward modes: what ``rasterize_meshes`` records (``atomic``, and
``deterministic=True``), and ``sorted``: :class:`warpraster.backward.SortedBackward`
recorded by ``recompute_fragments`` on the faces the raster pass chose.

* PyTorch3D parity: ``grad_verts`` of every raw reference case, both raster
  paths, every backward mode.
* The deterministic modes: bit-identical run after run, equal to the atomic
  path up to float32 summation order; the sorted segmented sum on its own.
* Finite differences of a float64 recompute (``pix_to_face`` held fixed) on
  random scenes: perspective correction, clipped negative barycentrics, blur
  (outside pixels, positive dists), both dist signs, a heterogeneous batch.
* ``warp.autograd.gradcheck`` / ``gradcheck_tape`` where they apply.
* Gradient descent recovers a triangle from a target depth + distance image.
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from np_reference import fragments_from_pix_to_face
from p3d_cases import case_params, load_case, raster_args, raw_case_names
from warp.autograd import gradcheck, gradcheck_tape

import warpraster as wr
from warpraster.backward import DeterministicBackward, SortedSegmentSum, recompute_fragments
from warpraster.fragments import allocate_fragments

# grad_verts vs PyTorch3D: both sum the same float32 per-slot terms, in another
# order (PyTorch3D: pixel order, one vertex at a time); the README suggests
# rtol 1e-4 / atol 1e-5 for that, and it holds with ~2x margin on every case.
P3D_RTOL = 1e-4
P3D_ATOL = 1e-5

# Unit roundoff of float32 (2**-24): a sum of n terms carries at most
# (n - 1) * U * sum(|terms|) of rounding error in any order.
U32 = 2.0**-24


@wp.kernel
def _weighted_sum(
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=wp.float32),
    bary: wp.array4d(dtype=wp.vec3),
    dists: wp.array4d(dtype=wp.float32),
    wz: wp.array4d(dtype=wp.float32),
    wb: wp.array4d(dtype=wp.vec3),
    wd: wp.array4d(dtype=wp.float32),
    loss: wp.array(dtype=wp.float32),
):
    """loss += sum over valid slots of wz*zbuf + wb.bary + wd*dists."""
    n, y, x, k = wp.tid()
    if pix_to_face[n, y, x, k] >= 0:
        v = wz[n, y, x, k] * zbuf[n, y, x, k] + wp.dot(wb[n, y, x, k], bary[n, y, x, k])
        wp.atomic_add(loss, 0, v + wd[n, y, x, k] * dists[n, y, x, k])


@wp.kernel
def _image_loss(
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=wp.float32),
    dists: wp.array4d(dtype=wp.float32),
    target_z: wp.array4d(dtype=wp.float32),
    target_d: wp.array4d(dtype=wp.float32),
    loss: wp.array(dtype=wp.float32),
):
    """loss += sum over valid slots of (zbuf - z*)^2 + (dists - d*)^2."""
    n, y, x, k = wp.tid()
    if pix_to_face[n, y, x, k] >= 0:
        a = zbuf[n, y, x, k] - target_z[n, y, x, k]
        b = dists[n, y, x, k] - target_d[n, y, x, k]
        wp.atomic_add(loss, 0, a * a + b * b)


# ----------------------------------------------------------------------------- helpers
def _warp_inputs(verts, faces, first, count, device):
    return (
        wp.array(np.asarray(verts, np.float32), dtype=wp.vec3, device=device, requires_grad=True),
        wp.array(np.asarray(faces, np.int32), dtype=wp.int32, device=device),
        wp.array(np.asarray(first, np.int32), dtype=wp.int32, device=device),
        wp.array(np.asarray(count, np.int32), dtype=wp.int32, device=device),
    )


#: Backward modes: what rasterize_meshes records (atomics / deterministic=True),
#: and backward.SortedBackward (sorted per-slot sums) on its fragments.
BACKWARDS = ["atomic", "deterministic", "sorted"]


def _grad_verts(verts, faces, first, count, upstream, device, backward="atomic", **kw):
    """(fragments as NumPy, verts.grad) for upstream grads (zbuf, bary (...,3), dists)."""
    v, f, m0, mc = _warp_inputs(verts, faces, first, count, device)
    tape = wp.Tape()
    if backward == "sorted":
        # The raster pass chooses the faces (not recorded); the recompute with
        # the sorted deterministic backward is what the tape records.
        chosen = wr.rasterize_meshes(v, f, m0, mc, **kw)
        fr = allocate_fragments(*chosen.shape, device, requires_grad=True)
        wp.copy(fr.pix_to_face, chosen.pix_to_face)
        with tape:
            recompute_fragments(
                v,
                f,
                fr,
                perspective_correct=kw.get("perspective_correct", False),
                clip_barycentric_coords=kw.get("clip_barycentric_coords", False),
                deterministic=DeterministicBackward(fr.shape, f.shape[0], device),
                exact_perspective_grad=kw.get("exact_perspective_grad", True),
            )
    else:
        with tape:
            fr = wr.rasterize_meshes(v, f, m0, mc, deterministic=backward == "deterministic", **kw)
    gz, gb, gd = upstream
    fr.zbuf.grad.assign(np.asarray(gz, np.float32))
    fr.bary_coords.grad.assign(np.asarray(gb, np.float32).reshape(fr.shape + (3,)))
    fr.dists.grad.assign(np.asarray(gd, np.float32))
    tape.backward()
    return fr.numpy(), v.grad.numpy()


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# ----------------------------------------------------------------------------- PyTorch3D
def _p3d_grad(case, device, bin_size, backward):
    args = raster_args(case)
    verts, faces = args.pop("verts"), args.pop("faces")
    first, count = args.pop("mesh_to_face_first_idx"), args.pop("num_faces_per_mesh")
    # The stored upstream gradients are random in the unused slots too: they
    # must be ignored, so they are fed as they are.
    upstream = (case["grad_zbuf"], case["grad_bary"], case["grad_dists"])
    return _grad_verts(
        verts,
        faces,
        first,
        count,
        upstream,
        device,
        backward,
        bin_size=bin_size,
        exact_perspective_grad=False,  # PyTorch3D's numbers (docs/BACKWARD.md)
        **args,
    )


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("bin_size", [0, 8], ids=["naive", "binned"])
@pytest.mark.parametrize("name", case_params(raw_case_names()))
def test_grad_verts_match_pytorch3d(name, bin_size, backward, device):
    case = load_case(name)
    out, grad = _p3d_grad(case, device, bin_size, backward)
    # Precondition: same faces chosen, else the gradients are of different sums.
    np.testing.assert_array_equal(out["pix_to_face"], case["pix_to_face"])
    np.testing.assert_allclose(grad, case["grad_verts"], rtol=P3D_RTOL, atol=P3D_ATOL)


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("backward", ["deterministic", "sorted"])
@pytest.mark.parametrize("name", ["p03_ico1_blur1e-4_k8_clipbary", "p06_batch_hetero_with_empty"])
def test_deterministic_grads_bit_identical_and_equal_to_atomic(name, backward, device):
    case = load_case(name)
    args = raster_args(case)
    verts, faces = args.pop("verts"), args.pop("faces")
    first, count = args.pop("mesh_to_face_first_idx"), args.pop("num_faces_per_mesh")
    v, f, m0, mc = _warp_inputs(verts, faces, first, count, device)
    ws = wr.RasterWorkspace(
        num_meshes=len(first),
        num_faces=len(faces),
        image_size=args["image_size"],
        faces_per_pixel=args["faces_per_pixel"],
        bin_size=8,
        device=device,
        requires_grad=True,
        deterministic=backward == "deterministic",
    )
    frags = allocate_fragments(*ws.fragments.shape, device, requires_grad=True)
    det = DeterministicBackward(frags.shape, len(faces), device)
    kw = dict(bin_size=8, workspace=ws, validate=False, **args)
    runs = []
    for _ in range(3):  # whole render + backward again, same buffers
        tape = wp.Tape()
        if backward == "deterministic":
            with tape:
                fr = wr.rasterize_meshes(v, f, m0, mc, deterministic=True, **kw)
        else:
            wp.copy(frags.pix_to_face, wr.rasterize_meshes(v, f, m0, mc, **kw).pix_to_face)
            fr = frags
            with tape:
                recompute_fragments(
                    v,
                    f,
                    fr,
                    perspective_correct=args["perspective_correct"],
                    clip_barycentric_coords=args["clip_barycentric_coords"],
                    deterministic=det,
                )
        for _ in range(2):  # the same tape backward again
            # Seed every time: like Warp's generated adjoints, the backward
            # consumes (zeroes) the fragments' .grad it reads.
            v.grad.zero_()
            fr.zbuf.grad.assign(case["grad_zbuf"])
            fr.bary_coords.grad.assign(case["grad_bary"].reshape(fr.shape + (3,)))
            fr.dists.grad.assign(case["grad_dists"])
            tape.backward()
            runs.append(v.grad.numpy().copy())
        tape.zero()
    assert all(_bits(r) == _bits(runs[0]) for r in runs)

    _, atomic = _p3d_grad(case, device, 8, "atomic")
    # Same float32 terms summed in another order (per face, then per vertex):
    # each result carries <= (n - 1) * U * sum|terms| of rounding, n up to a
    # few hundred slots per vertex. Measured on cpu: <= 6e-6 relative per
    # component and <= 3.1e-7 of the largest component.
    scale = np.abs(atomic).max()
    np.testing.assert_allclose(runs[0], atomic, rtol=1e-5, atol=1e-5 * scale)


def test_deterministic_workspace_required(device):
    ws = wr.RasterWorkspace(
        num_meshes=1, num_faces=1, image_size=4, faces_per_pixel=1, bin_size=0, device=device
    )
    with pytest.raises(ValueError, match="deterministic"):
        wr.rasterize_meshes(
            np.array([[0, 0, 1], [1, 0, 1], [0, 1, 1]], np.float32),
            np.array([[0, 1, 2]]),
            [0],
            [1],
            image_size=4,
            faces_per_pixel=1,
            bin_size=0,
            workspace=ws,
            deterministic=True,
        )


@pytest.mark.parametrize("chunk", [4, 7, 64])
@pytest.mark.parametrize("dtype", [wp.vec3, wp.mat33], ids=["vec3", "mat33"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "add"])
def test_sorted_segment_sum(chunk, dtype, accumulate, device):
    rng = np.random.default_rng(chunk)
    count, num_keys = 3000, 40
    width = 3 if dtype == wp.vec3 else 9
    # Short random runs, one key spanning many chunks, dropped entries (= num_keys)
    # and keys with no entry at all (num_keys - 1, num_keys - 2 never drawn).
    keys = np.concatenate(
        [rng.integers(0, num_keys - 2, 1500), np.full(1000, 5), np.full(500, num_keys)]
    )
    rng.shuffle(keys)
    vals = rng.standard_normal((count, width)).astype(np.float32)
    s = SortedSegmentSum(count, dtype, device, chunk)
    init = np.full((num_keys, width), 0.5, np.float32)
    results = []
    for _ in range(2):
        s.keys.assign(np.concatenate([keys, np.zeros(count, int)]).astype(np.int32))
        s.order.assign(np.concatenate([np.arange(count), np.zeros(count, int)]).astype(np.int32))
        out = wp.array(init.reshape((num_keys,) + dtype._shape_), dtype=dtype, device=device)
        s.run(wp.array(vals.reshape((count,) + dtype._shape_), dtype=dtype, device=device),
              num_keys, out, accumulate=accumulate)  # fmt: skip
        results.append(out.numpy().reshape(num_keys, width))
    assert _bits(results[0]) == _bits(results[1])
    ref = init.astype(np.float64) if accumulate else np.zeros((num_keys, width))
    if not accumulate:
        ref[num_keys - 2 :] = 0.5  # untouched: no entries
    absum = np.zeros((num_keys, width))
    live = keys < num_keys
    np.add.at(ref, keys[live], vals[live].astype(np.float64))
    np.add.at(absum, keys[live], np.abs(vals[live]).astype(np.float64))
    n = np.bincount(keys[live], minlength=num_keys)[:num_keys, None] + 1
    # Rigorous bound of float32 summation in any order: (n - 1) * U * sum|terms|.
    assert np.all(np.abs(results[0] - ref) <= n * U32 * (absum + 0.5) + 1e-30)


# ----------------------------------------------------------------------------- finite differences
def _random_triangles(rng, n, z_range, xy=0.8, size=0.9):
    """n well-shaped random triangles (area >= 0.05 in NDC), CCW or CW at random."""
    tris = [np.zeros((0, 3))]
    while len(tris) < n + 1:
        c = rng.uniform(-xy, xy, 2)
        p = c + rng.uniform(-size, size, (3, 2))
        e1, e2 = p[1] - p[0], p[2] - p[0]
        if abs(e1[0] * e2[1] - e1[1] * e2[0]) / 2 < 0.05:
            continue
        z = rng.uniform(*z_range, 3)
        tris.append(np.concatenate([p, z[:, None]], 1))
    return np.concatenate(tris)


def _scene(kind: str):
    """(verts, faces, first, count, raster kwargs) of one random test scene."""
    rng = np.random.default_rng({"perspective": 1, "clip_blur": 2, "blur": 3, "batch": 4}[kind])
    if kind == "batch":
        parts = [_random_triangles(rng, 3, (1.5, 3.0)), _random_triangles(rng, 0, (1, 2)),
                 _random_triangles(rng, 4, (1.5, 3.0))]  # fmt: skip
        verts = np.concatenate([p for p in parts if len(p)])
        count = [len(p) // 3 for p in parts]
        kw = dict(image_size=(12, 16), faces_per_pixel=2, blur_radius=0.01,
                  perspective_correct=True, clip_barycentric_coords=False)  # fmt: skip
    else:
        verts = _random_triangles(rng, 5, (1.5, 4.0))
        count = [5]
        kw = dict(image_size=(16, 12), faces_per_pixel=3, blur_radius=0.0,
                  perspective_correct=kind == "perspective",
                  clip_barycentric_coords=False)  # fmt: skip
        if kind != "perspective":
            kw["blur_radius"] = 0.02
            kw["clip_barycentric_coords"] = kind == "clip_blur"
    faces = np.arange(len(verts)).reshape(-1, 3)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    return verts.astype(np.float32), faces, first, np.array(count), kw


def _loss64(verts, faces, p2f, kw, w):
    fr = fragments_from_pix_to_face(
        verts,
        faces,
        p2f,
        kw["image_size"],
        perspective_correct=kw["perspective_correct"],
        clip_barycentric_coords=kw["clip_barycentric_coords"],
    )
    valid = p2f >= 0
    wz, wb, wd = w
    return (
        np.sum(wz[valid] * fr.zbuf[valid])
        + np.sum(wb[valid] * fr.bary_coords[valid])
        + np.sum(wd[valid] * fr.dists[valid])
    )


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("bin_size", [0, 8], ids=["naive", "binned"])
@pytest.mark.parametrize("kind", ["perspective", "clip_blur", "blur", "batch"])
def test_grad_matches_float64_finite_differences(kind, bin_size, backward, device):
    verts, faces, first, count, kw = _scene(kind)
    n = len(count)
    h, w = kw["image_size"]
    shape = (n, h, w, kw["faces_per_pixel"])
    rng = np.random.default_rng(7)
    weights = (
        rng.uniform(-1, 1, shape),
        rng.uniform(-1, 1, shape + (3,)),
        rng.uniform(-1, 1, shape) * 10.0,  # dists are ~0.01: comparable terms
    )
    out, grad = _grad_verts(
        verts, faces, first, count, weights, device,
        backward, bin_size=bin_size, **kw,
    )  # fmt: skip
    p2f = out["pix_to_face"]
    valid = p2f >= 0
    # The scene covers what it is meant to.
    assert valid.sum() > 50
    if kw["blur_radius"] > 0:
        assert (out["dists"][valid] > 0).any() and (out["dists"][valid] < 0).any()
    if kind == "blur" or kind == "batch":
        assert (out["bary_coords"][valid] < 0).any()  # extrapolated, kept negative
    if kind == "clip_blur":
        raw = fragments_from_pix_to_face(verts, faces, p2f, kw["image_size"])
        assert (raw.bary_coords[valid] < 0).any()  # negatives clamped by the clip
        assert (out["bary_coords"][valid] == 0).any()
    if kind == "batch":
        assert (p2f[1] == -1).all() and valid[0].any() and valid[2].any()

    # Central differences of the float64 loss, pix_to_face fixed, with two steps:
    # a kink (edge line, segment end, medial axis of the distance, clamp) within
    # reach of the larger step would make them disagree; where the loss is
    # smooth they agree to ~h^2 * f''' (measured: 1.5e-7 of the largest
    # component; 1e-5 asserted). Rounding of the small step: ~1e-16 / 1e-6.
    fd = _central_differences(verts, faces, p2f, kw, weights, 1e-6)
    fd_wide = _central_differences(verts, faces, p2f, kw, weights, 1e-4)
    scale = np.abs(fd).max()
    np.testing.assert_allclose(fd_wide, fd, rtol=0, atol=1e-5 * scale)
    # The Warp gradient is float32: per-slot terms carry a few ulps of relative
    # error, amplified by 1/area of the screen triangles and by extrapolated
    # barycentrics at blurred pixels (measured: <= 6e-7 of the largest
    # component); rtol 1e-4 + atol 1e-5 of the largest leaves > 15x margin.
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5 * scale)


def _central_differences(verts, faces, p2f, kw, weights, step):
    """d loss64 / d verts by central differences (float64, pix_to_face fixed)."""
    v64 = verts.astype(np.float64)
    fd = np.zeros_like(v64)
    for i in range(v64.shape[0]):
        for j in range(3):
            vp, vm = v64.copy(), v64.copy()
            vp[i, j] += step
            vm[i, j] -= step
            lp = _loss64(vp, faces, p2f, kw, weights)
            lm = _loss64(vm, faces, p2f, kw, weights)
            fd[i, j] = (lp - lm) / (2 * step)
    return fd


# ----------------------------------------------------------------------------- gradcheck
def _tiny_scene(device):
    verts = np.array(
        [[0.6, -0.5, 2.0], [-0.4, -0.6, 2.5], [0.1, 0.7, 3.0], [-0.7, 0.5, 2.2]], np.float32
    )
    faces = np.array([[0, 1, 2], [1, 3, 2]], np.int32)
    v, f, m0, mc = _warp_inputs(verts, faces, [0], [2], device)
    kw = dict(image_size=6, faces_per_pixel=2, blur_radius=0.05, perspective_correct=True)
    return v, f, m0, mc, kw


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_gradcheck_recompute(deterministic, device):
    """warp.autograd.gradcheck on verts -> fragments -> weighted sum, pix_to_face fixed."""
    v, f, m0, mc, kw = _tiny_scene(device)
    p2f = wr.rasterize_meshes(v, f, m0, mc, bin_size=0, **kw).pix_to_face
    shape = p2f.shape
    frags = allocate_fragments(*shape, device, requires_grad=True)
    wp.copy(frags.pix_to_face, p2f)
    det = DeterministicBackward(shape, 2, device) if deterministic else None
    rng = np.random.default_rng(3)
    wz = wp.array(rng.uniform(-1, 1, shape).astype(np.float32), device=device)
    wb = wp.array(rng.uniform(-1, 1, shape + (3,)).astype(np.float32), dtype=wp.vec3, device=device)
    wd = wp.array(rng.uniform(-10, 10, shape).astype(np.float32), device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    def fn(verts):
        recompute_fragments(
            verts,
            f,
            frags,
            perspective_correct=True,
            clip_barycentric_coords=False,
            deterministic=det,
        )
        loss.zero_()
        wp.launch(
            _weighted_sum,
            dim=shape,
            inputs=[frags.pix_to_face, frags.zbuf, frags.bary_coords, frags.dists, wz, wb, wd],
            outputs=[loss],
            device=device,
        )
        return loss

    # Warp's finite differences run in float32: with eps 1e-3 the rounding of a
    # loss of magnitude ~10 contributes ~10 * 6e-8 / 1e-3 = 6e-4 and the
    # truncation ~eps^2 * |f'''| ~ 1e-4; atol 5e-3 + rtol 1e-2 leaves margin.
    assert gradcheck(
        fn, inputs=[v], eps=1e-3, atol=5e-3, rtol=1e-2, raise_exception=False, show_summary=False
    )


def test_gradcheck_tape_recompute_kernel(device):
    """gradcheck_tape on the recorded recompute kernel (atomic path): full Jacobian.

    gradcheck_tape checks kernel launches only, not tape.record_func entries
    (what rasterize_meshes records now), so the recompute is recorded directly.
    """
    v, f, m0, mc, kw = _tiny_scene(device)
    chosen = wr.rasterize_meshes(v, f, m0, mc, bin_size=0, **kw)
    frags = allocate_fragments(*chosen.shape, device, requires_grad=True)
    wp.copy(frags.pix_to_face, chosen.pix_to_face)
    tape = wp.Tape()
    with tape:
        recompute_fragments(v, f, frags, perspective_correct=True, clip_barycentric_coords=False)
    kernels = [x for x in tape.launches if isinstance(x, (tuple, list))]
    assert len(kernels) == 1  # the check below is not vacuous
    # Per-output Jacobian entries: barycentrics and depths of magnitude ~1-3 at
    # float32 finite differences with eps 1e-3 (rounding ~3 * 6e-8 / 1e-3 =
    # 2e-4, truncation ~1e-4); same tolerance reasoning as above.
    assert gradcheck_tape(
        tape, eps=1e-3, atol=5e-3, rtol=1e-2, raise_exception=False, show_summary=False
    )


# ----------------------------------------------------------------------------- optimisation
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_gradient_descent_recovers_triangle(deterministic, device):
    """Adam on the vertices of one triangle against a target depth + distance image.

    blur_radius 9 makes every pixel of the 16x16 image a (blurred) hit of the
    triangle, so the loss sees the whole image: depths extrapolate the plane
    and dists measure the signed squared distance to the edges.
    """
    target = np.array([[0.5, -0.4, 2.0], [-0.5, -0.5, 2.5], [0.0, 0.6, 3.0]], np.float32)
    kw = dict(image_size=16, faces_per_pixel=1, blur_radius=9.0, bin_size=0)
    faces, first, count = [[0, 1, 2]], [0], [1]
    tv, f, m0, mc = _warp_inputs(target, faces, first, count, device)
    goal = wr.rasterize_meshes(tv, f, m0, mc, **kw)
    assert (goal.pix_to_face.numpy() >= 0).all()
    target_z = wp.clone(goal.zbuf)
    target_d = wp.clone(goal.dists)

    start = target + np.array([[0.15, 0.1, 0.3], [-0.1, 0.15, -0.2], [0.1, -0.1, 0.2]], np.float32)
    v = wp.array(start, dtype=wp.vec3, device=device, requires_grad=True)
    ws = wr.RasterWorkspace(num_meshes=1, num_faces=1, image_size=16, faces_per_pixel=1,
                            bin_size=0, device=device, requires_grad=True,
                            deterministic=deterministic)  # fmt: skip
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    m = np.zeros_like(start)
    s = np.zeros_like(start)
    losses = []
    for it in range(1, 151):
        loss.zero_()
        tape = wp.Tape()
        with tape:
            fr = wr.rasterize_meshes(
                v, f, m0, mc, workspace=ws, validate=False, deterministic=deterministic, **kw
            )
            wp.launch(
                _image_loss,
                dim=fr.shape,
                inputs=[fr.pix_to_face, fr.zbuf, fr.dists, target_z, target_d],
                outputs=[loss],
                device=device,
            )
        tape.backward(loss)
        losses.append(float(loss.numpy()[0]))
        g = v.grad.numpy()
        m = 0.9 * m + 0.1 * g
        s = 0.999 * s + 0.001 * g * g
        step = 0.01 * (m / (1 - 0.9**it)) / (np.sqrt(s / (1 - 0.999**it)) + 1e-8)
        v.assign(v.numpy() - step)
        tape.zero()
    # Measured on cpu: 39.4 -> 0.0070 (5600x) in 150 steps; 100x is the claim.
    assert losses[-1] < losses[0] / 100
    # Vertices within 0.05 NDC/depth units of the truth (measured: 0.02).
    assert np.abs(v.numpy() - target).max() < 0.05
