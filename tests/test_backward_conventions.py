"""The backward follows PyTorch3D's conventions at ties and clamps, and is tape-safe.

Scenes whose coordinates are dyadic (pixel centres of a 16 x 16 image are odd
multiples of 1/16; triangle legs are 1 or 1/2 long), so the edge functions and
distances are computed exactly and the ties are exact: vertices on pixel
centres (distance ties between two edges), edges through pixel centres
(barycentrics exactly 0, which the clip passes), pixels on the bisector of a
right angle (equal distances to two edges), and, with perspective correction,
blurred pixels far outside a face whose perspective denominator is clamped to
1e-8. The gradients are compared with ``p3d_backward_ref``, a float32 NumPy
transcription of PyTorch3D's backward with its order of operations: per slot to
the bit (the sorted strategy keeps the per-slot terms), and summed per vertex
within the rounding of float32 sums, on the naive and binned paths, both
strategies, the tape and the torch adapter. The transcription itself is held to
PyTorch3D's reference gradients first.

Then tape safety: one workspace recorded twice on one tape raises; two
workspaces on one tape give the gradients of finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from np_reference import fragments_from_pix_to_face
from p3d_backward_ref import p3d_grad_verts, pixel_centres
from p3d_cases import case_params, load_case, raster_args, raw_case_names

import warpraster as wr
from warpraster.backward import recompute_fragments
from warpraster.fragments import allocate_fragments

#: Unit roundoff of float32.
U32 = 2.0**-24

SIZE = 16


def _tie_scene(z_far: float = 1.5):
    """Two right triangles with dyadic vertices on pixel centres (legs 1 and 1/2),
    one of each winding, overlapping in part."""
    x0 = y0 = -9 / 16  # a pixel centre
    x1 = y1 = 5 / 16
    verts = np.array(
        [
            [x0, y0, 1.0], [x0 + 1.0, y0, 2.0], [x0, y0 + 1.0, z_far],
            [x1, y1, 1.25], [x1, y1 - 0.5, 2.5], [x1 - 0.5, y1, 1.75],
        ],
        np.float32,
    )  # fmt: skip
    faces = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    return verts, faces


#: Render flags of the tie scenes: ties and exact zeros (blur small), and the
#: clamped perspective denominator (blur large: pixels far outside a face).
SCENES = {
    "dist_ties": dict(blur_radius=0.02, faces_per_pixel=3),
    "clip_zeros": dict(blur_radius=0.02, faces_per_pixel=3, clip_barycentric_coords=True),
    "persp_clamp": dict(blur_radius=0.3, faces_per_pixel=2, perspective_correct=True),
    "persp_clamp_clip": dict(
        blur_radius=0.3, faces_per_pixel=2, perspective_correct=True, clip_barycentric_coords=True
    ),
}


def _z_far(name):
    # z = (1, 2, 8): the denominator 16 w0 + 8 w1 + 2 w2 falls below 0 beyond v2's side
    return 8.0 if name.startswith("persp") else 1.5


def _upstream(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.uniform(-1, 1, shape).astype(np.float32),
        rng.uniform(-1, 1, shape + (3,)).astype(np.float32),
        rng.uniform(-10, 10, shape).astype(np.float32),
    )


def _flags(kw):
    return dict(
        perspective_correct=kw.get("perspective_correct", False),
        clip_barycentric_coords=kw.get("clip_barycentric_coords", False),
    )


def _tape_grads(verts, faces, kw, device, *, bin_size, deterministic, exact=False):
    """(pix_to_face, verts.grad, per-slot terms of the sorted strategy or None)."""
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.array(faces, dtype=wp.int32, device=device)
    ws = wr.RasterWorkspace(
        num_meshes=1, num_faces=len(faces), image_size=SIZE, faces_per_pixel=kw["faces_per_pixel"],
        bin_size=bin_size, device=device, requires_grad=True, deterministic=deterministic,
    )  # fmt: skip
    tape = wp.Tape()
    with tape:
        fr = wr.rasterize_meshes(
            v, f, [0], [len(faces)], image_size=SIZE, bin_size=bin_size, workspace=ws,
            deterministic=deterministic, exact_perspective_grad=exact, **kw,
        )  # fmt: skip
    gz, gb, gd = _upstream(fr.shape)
    fr.zbuf.grad.assign(gz)
    fr.bary_coords.grad.assign(gb)
    fr.dists.grad.assign(gd)
    tape.backward()
    slots = ws.face_grads.sorted.slot_grad.numpy() if deterministic else None
    return fr.pix_to_face.numpy(), v.grad.numpy(), slots, (gz, gb, gd)


def _check_sum(ours, ref, what):
    """Same float32 per-slot terms, summed in another order: a float32 sum of n terms
    in any order is within (n - 1) * U * sum|terms| of the exact sum; ours sums twice
    (per face, then per vertex), so 2 * n * U * sum|terms| bounds it."""
    bound = 2.0 * ref["count"][:, None] * U32 * ref["abs_sum"] + 1e-30
    err = np.abs(ours.astype(np.float64) - ref["grad"])
    assert np.all(err <= bound), f"{what}: max excess {np.max(err - bound)}"


def _reference(verts, faces, p2f, upstream, kw, exact=False):
    gz, gb, gd = upstream
    return p3d_grad_verts(verts, faces, p2f, gz, gb, gd, exact_perspective_grad=exact,
                          **_flags(kw))  # fmt: skip


def _assert_scene_has_its_ties(name, verts, faces, p2f, kw):
    """The scene exercises what it is named after (else the test would be vacuous)."""
    persp = kw.get("perspective_correct", False)
    fr = fragments_from_pix_to_face(
        verts, faces, p2f, (SIZE, SIZE), dtype=np.float32, perspective_correct=persp
    )
    valid = p2f >= 0
    bary = fr.bary_coords[valid]
    if name == "dist_ties":
        assert (fr.dists[valid] == 0).sum() >= 10  # pixel centres on edges and vertices
    if name == "clip_zeros":
        assert (bary == 0).any(axis=-1).sum() >= 10  # exact zeros that pass the gradient
        assert (bary < 0).any(axis=-1).sum() >= 10  # negatives that do not
    if name.startswith("persp"):
        x, y = pixel_centres(SIZE, SIZE)
        _, yi, xi, _ = np.nonzero(valid)
        t = []
        tri = verts[faces[p2f[valid]]].astype(np.float64)
        for i in range(3):
            j, k = [m for m in range(3) if m != i]
            a, b = tri[:, j], tri[:, k]
            e = (x[yi, xi] - a[:, 0]) * (b[:, 1] - a[:, 1]) - (y[yi, xi] - a[:, 1]) * (
                b[:, 0] - a[:, 0]
            )
            t.append(e * tri[:, j, 2] * tri[:, k, 2])
        # the denominator clamps at slots where it is <= 0 (area > 0 or < 0 alike)
        e1, e2 = tri[:, 1, :2] - tri[:, 0, :2], tri[:, 2, :2] - tri[:, 0, :2]
        area = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
        assert ((t[0] + t[1] + t[2]) * np.sign(area) <= 0).sum() >= 5


# ----------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("name", case_params(raw_case_names()))
def test_transcription_matches_pytorch3d(name):
    """p3d_backward_ref on PyTorch3D's own faces and upstream gradients gives its
    grad_verts (the transcription is checked before it checks anything)."""
    case = load_case(name)
    args = raster_args(case)
    ref = p3d_grad_verts(
        case["verts_packed"], case["faces_packed"], case["pix_to_face"], case["grad_zbuf"],
        case["grad_bary"], case["grad_dists"], perspective_correct=args["perspective_correct"],
        clip_barycentric_coords=args["clip_barycentric_coords"],
    )  # fmt: skip
    # PyTorch3D sums the same float32 terms per face then per vertex, in pixel order.
    _check_sum(case["grad_verts"], ref, name)


# ----------------------------------------------------------------------------- ties and clamps
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "sorted"])
@pytest.mark.parametrize("bin_size", [0, 4], ids=["naive", "binned"])
@pytest.mark.parametrize("name", list(SCENES))
def test_ties_and_clamps_match_pytorch3d_on_the_tape(name, bin_size, deterministic, device):
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    p2f, grad, slots, upstream = _tape_grads(
        verts, faces, kw, device, bin_size=bin_size, deterministic=deterministic
    )
    _assert_scene_has_its_ties(name, verts, faces, p2f, kw)
    ref = _reference(verts, faces, p2f, upstream, kw)
    if slots is not None:
        # Per slot, to the bit: the same float32 operations in the same order.
        np.testing.assert_array_equal(slots[ref["where"]], ref["slots"])
    _check_sum(grad, ref, name)


@pytest.mark.parametrize("bin_size", [0, 4], ids=["naive", "binned"])
@pytest.mark.parametrize("name", list(SCENES))
def test_ties_and_clamps_match_pytorch3d_through_torch(name, bin_size, device):
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt  # noqa: PLC0415 - optional dependency

    if device != "cpu" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    tdev = torch.device("cpu" if device == "cpu" else "cuda")
    v = torch.tensor(verts, device=tdev, requires_grad=True)
    f = torch.tensor(faces, device=tdev)
    # PyTorch3D's numbers at the clamped denominators, not the default derivative
    p2f, zbuf, bary, dists = wrt.rasterize_meshes(v, f, [0], [2], image_size=SIZE,
                                                  bin_size=bin_size, exact_perspective_grad=False,
                                                  **kw)  # fmt: skip
    gz, gb, gd = _upstream(tuple(p2f.shape))
    loss = (
        (zbuf * torch.tensor(gz, device=tdev)).sum()
        + (bary * torch.tensor(gb, device=tdev)).sum()
        + (dists * torch.tensor(gd, device=tdev)).sum()
    )
    (grad,) = torch.autograd.grad(loss, v)
    p2f = p2f.cpu().numpy()
    ref = _reference(verts, faces, p2f, (gz, gb, gd), kw)
    _check_sum(grad.cpu().numpy(), ref, name)


@pytest.mark.parametrize("name", ["persp_clamp", "persp_clamp_clip"])
def test_pytorch3d_gradient_at_a_clamped_denominator_is_not_the_derivative(name, device):
    """Documented behaviour: PyTorch3D passes the gradient through max(s, 1e-8) and
    divides by 1e-16: without clipping that gives gradients no optimiser wants;
    with clipping the renormalisation cancels most of it, not all.
    exact_perspective_grad gives the true derivative (finite differences below)."""
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    _, default, _, _ = _tape_grads(verts, faces, kw, device, bin_size=0, deterministic=False)
    _, exact, _, _ = _tape_grads(verts, faces, kw, device, bin_size=0, deterministic=False,
                                 exact=True)  # fmt: skip
    # measured on cpu: max |grad| 1e18-scale vs 1e2 without clipping, ~20x with it
    ratio = 1e6 if name == "persp_clamp" else 2.0
    assert np.abs(default).max() > ratio * np.abs(exact).max()


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "sorted"])
@pytest.mark.parametrize("name", ["persp_clamp", "persp_clamp_clip"])
def test_exact_perspective_grad_matches_transcription(name, deterministic, device):
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    p2f, grad, slots, upstream = _tape_grads(
        verts, faces, kw, device, bin_size=0, deterministic=deterministic, exact=True
    )
    ref = _reference(verts, faces, p2f, upstream, kw, exact=True)
    if slots is not None:
        np.testing.assert_array_equal(slots[ref["where"]], ref["slots"])
    _check_sum(grad, ref, name)


@pytest.mark.parametrize("name", ["persp_clamp", "persp_clamp_clip"])
def test_exact_perspective_grad_matches_finite_differences(name, device):
    """The true derivative where the denominator is clamped. The scene is shifted off
    the ties (edges, vertices and zeros are kinks that central differences straddle);
    the clamp stays (the denominator is far below 1e-8 at those slots)."""
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    verts = verts + np.array([0.013, -0.021, 0.0], np.float32)
    p2f, grad, _, upstream = _tape_grads(verts, faces, kw, device, bin_size=0,
                                         deterministic=False, exact=True)  # fmt: skip
    _assert_scene_has_its_ties("persp", verts, faces, p2f, kw)
    fd = _central_differences(verts, faces, p2f, kw, upstream, 1e-6)
    fd_wide = _central_differences(verts, faces, p2f, kw, upstream, 1e-4)
    scale = np.abs(fd).max()
    # No kink within reach of the larger step: the two agree to ~step^2 * f'''.
    np.testing.assert_allclose(fd_wide, fd, rtol=0, atol=1e-5 * scale)
    # float32 per-slot terms (a few ulps each, amplified by 1/1e-8 at clamped
    # slots exactly as in the float64 loss) summed over ~100 slots per vertex.
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5 * scale)


def _loss64(verts, faces, p2f, kw, upstream):
    fr = fragments_from_pix_to_face(verts, faces, p2f, (SIZE, SIZE), **_flags(kw))
    valid = p2f >= 0
    gz, gb, gd = upstream
    return (
        np.sum(gz[valid] * fr.zbuf[valid])
        + np.sum(gb[valid] * fr.bary_coords[valid])
        + np.sum(gd[valid] * fr.dists[valid])
    )


def _central_differences(verts, faces, p2f, kw, upstream, step):
    v64 = verts.astype(np.float64)
    fd = np.zeros_like(v64)
    for i in range(v64.shape[0]):
        for j in range(3):
            vp, vm = v64.copy(), v64.copy()
            vp[i, j] += step
            vm[i, j] -= step
            fd[i, j] = (_loss64(vp, faces, p2f, kw, upstream)
                        - _loss64(vm, faces, p2f, kw, upstream)) / (2 * step)  # fmt: skip
    return fd


# ----------------------------------------------------------------------------- tape safety
def _workspace(device, faces, **kw):
    return wr.RasterWorkspace(num_meshes=1, num_faces=len(faces), image_size=SIZE,
                              faces_per_pixel=2, bin_size=0, device=device,
                              requires_grad=True, **kw)  # fmt: skip


def _render(v, faces, ws, **kw):
    return wr.rasterize_meshes(v, faces, [0], [len(faces)], image_size=SIZE, faces_per_pixel=2,
                               bin_size=0, blur_radius=0.01, workspace=ws, validate=False,
                               **kw)  # fmt: skip


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "sorted"])
def test_one_workspace_twice_on_one_tape_raises(deterministic, device):
    verts, faces = _tie_scene()
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.array(faces, dtype=wp.int32, device=device)
    ws = _workspace(device, faces, deterministic=deterministic)
    tape = wp.Tape()
    with tape:
        _render(v, f, ws, deterministic=deterministic)
        with pytest.raises(ValueError, match="workspace"):
            _render(v, f, ws, deterministic=deterministic)
    # tape.zero() zeroes gradients but keeps the recording: still refused
    tape.zero()
    with tape, pytest.raises(ValueError, match="workspace"):
        _render(v, f, ws, deterministic=deterministic)
    # tape.reset() forgets it: recording again is fine, and correct
    tape.reset()
    with tape:
        fr = _render(v, f, ws, deterministic=deterministic)
    fr.zbuf.grad.fill_(1.0)
    tape.backward()
    assert np.abs(v.grad.numpy()).max() > 0


def test_render_after_recording_raises_at_backward(device):
    """A later render with the workspace (here without a tape) overwrites the fragments
    the recorded backward reads: the backward refuses to run on them."""
    verts, faces = _tie_scene()
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.array(faces, dtype=wp.int32, device=device)
    ws = _workspace(device, faces)
    tape = wp.Tape()
    with tape:
        fr = _render(v, f, ws)
    _render(v, f, ws)
    fr.zbuf.grad.fill_(1.0)
    with pytest.raises(ValueError, match="workspace"):
        tape.backward()


@wp.kernel
def _shift(rest: wp.array(dtype=wp.vec3), offset: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = rest[i] + offset


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "sorted"])
def test_two_workspaces_on_one_tape_match_finite_differences(deterministic, device):
    """Two frames (the mesh shifted per frame) rendered on one tape, each with its own
    workspace: d(loss of both frames)/d(rest vertices) against finite differences."""
    verts, faces = _tie_scene()
    verts = verts + np.array([0.013, -0.021, 0.0], np.float32)  # off the ties: smooth loss
    offsets = [np.array([0.0, 0.0, 0.0], np.float32), np.array([0.11, 0.07, 0.4], np.float32)]
    rest = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.array(faces, dtype=wp.int32, device=device)
    frames = [wp.zeros(len(verts), dtype=wp.vec3, device=device, requires_grad=True)
              for _ in offsets]  # fmt: skip
    workspaces = [_workspace(device, faces, deterministic=deterministic) for _ in offsets]
    kw = dict(perspective_correct=True, deterministic=deterministic)
    tape = wp.Tape()
    outs = []
    with tape:
        for off, vf, ws in zip(offsets, frames, workspaces, strict=True):
            wp.launch(_shift, dim=len(verts), inputs=[rest, wp.vec3(*off)], outputs=[vf],
                      device=device)  # fmt: skip
            outs.append(_render(vf, f, ws, **kw))
    ups = [_upstream(outs[0].shape, seed) for seed in (1, 2)]
    for fr, (gz, gb, gd) in zip(outs, ups, strict=True):
        fr.zbuf.grad.assign(gz)
        fr.bary_coords.grad.assign(gb)
        fr.dists.grad.assign(gd)
    p2fs = [fr.pix_to_face.numpy() for fr in outs]
    assert not np.array_equal(p2fs[0], p2fs[1])  # the frames differ
    tape.backward()
    grad = rest.grad.numpy()

    flags = dict(faces_per_pixel=2, perspective_correct=True)
    step = 1e-6
    v64 = verts.astype(np.float64)
    fd = np.zeros_like(v64)
    for i in range(v64.shape[0]):
        for j in range(3):
            total = 0.0
            for sgn in (1.0, -1.0):
                vp = v64.copy()
                vp[i, j] += sgn * step
                for off, p2f, up in zip(offsets, p2fs, ups, strict=True):
                    total += sgn * _loss64(vp + off, faces, p2f, flags, up)
            fd[i, j] = total / (2 * step)
    scale = np.abs(fd).max()
    # float32 gradients of ~100 slots per vertex vs float64 differences (truncation
    # ~step^2 * f''' far below 1e-5 of the largest component; the scene is shifted
    # off every tie, so the loss is smooth within the step).
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5 * scale)
    # The shared-workspace mistake would have been refused:
    with tape, pytest.raises(ValueError, match="workspace"):
        _render(frames[0], f, workspaces[0], **kw)


@pytest.mark.parametrize("name", ["dist_ties", "clip_zeros", "persp_clamp"])
def test_warp_generated_adjoint_is_the_other_convention_at_ties(name, device):
    """Warp's generated adjoint of the recompute (the check used away from ties in
    test_backward.py) follows Warp's min/max/clamp adjoints: on these scenes it is
    not PyTorch3D's gradient, so the scenes do discriminate between conventions."""
    kw = SCENES[name]
    verts, faces = _tie_scene(_z_far(name))
    p2f, _, _, up = _tape_grads(verts, faces, kw, device, bin_size=0, deterministic=False)
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    out = allocate_fragments(*p2f.shape, device, True)
    out.pix_to_face.assign(p2f)
    tape = wp.Tape()
    with tape:
        recompute_fragments(v, wp.array(faces, dtype=wp.int32, device=device), out,
                            **_flags(kw))  # fmt: skip
    out.zbuf.grad.assign(up[0])
    out.bary_coords.grad.assign(up[1])
    out.dists.grad.assign(up[2])
    tape.backward()
    ref = _reference(verts, faces, p2f, up, kw)
    rel = np.abs(v.grad.numpy() - ref["grad"]).max() / np.abs(ref["grad"]).max()
    # measured on cpu: 19% (distance ties), 60% (clip zeros), 100% (clamp)
    assert rel > 0.05


@pytest.mark.parametrize("name", case_params(raw_case_names()))
def test_per_slot_terms_equal_the_transcription_on_pytorch3d_cases(name, device):
    """On every raw reference case (PyTorch3D's faces and upstream gradients), each
    slot's nine numbers equal the transcription's to the bit (sorted strategy, which
    keeps them), and the sums match PyTorch3D's gradients (test_gradients.py)."""
    case = load_case(name)
    args = raster_args(case)
    verts, faces = args.pop("verts"), args.pop("faces")
    first, count = args.pop("mesh_to_face_first_idx"), args.pop("num_faces_per_mesh")
    v = wp.array(np.asarray(verts, np.float32), dtype=wp.vec3, device=device, requires_grad=True)
    f = wp.array(np.asarray(faces, np.int32), dtype=wp.int32, device=device)
    ws = wr.RasterWorkspace(
        num_meshes=len(first),
        num_faces=len(faces),
        image_size=args["image_size"],
        faces_per_pixel=args["faces_per_pixel"],
        bin_size=0,
        device=device,
        requires_grad=True,
        deterministic=True,
    )
    tape = wp.Tape()
    with tape:
        fr = wr.rasterize_meshes(v, f, first, count, workspace=ws, deterministic=True,
                                 exact_perspective_grad=False,
                                 **{**args, "bin_size": 0})  # fmt: skip
    np.testing.assert_array_equal(fr.pix_to_face.numpy(), case["pix_to_face"])
    fr.zbuf.grad.assign(case["grad_zbuf"])
    fr.bary_coords.grad.assign(case["grad_bary"].reshape(fr.shape + (3,)))
    fr.dists.grad.assign(case["grad_dists"])
    tape.backward()
    ref = p3d_grad_verts(
        verts, faces, case["pix_to_face"], case["grad_zbuf"], case["grad_bary"],
        case["grad_dists"], perspective_correct=args["perspective_correct"],
        clip_barycentric_coords=args["clip_barycentric_coords"],
    )  # fmt: skip
    slots = ws.face_grads.sorted.slot_grad.numpy()[ref["where"]]
    np.testing.assert_array_equal(slots, ref["slots"])
    _check_sum(v.grad.numpy(), ref, name)
