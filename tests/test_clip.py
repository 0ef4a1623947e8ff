"""Near-plane clipping and frustum culling (warpraster.clip) against a float64 NumPy
clipper written here from PyTorch3D's semantics, against PyTorch3D's own numbers
(case p12), against finite differences, and under graph capture."""

from __future__ import annotations

import np_reference
import numpy as np
import pytest
import warp as wp
from p3d_cases import load_case, raster_args

import warpraster as wr
from warpraster import rasterize_meshes
from warpraster.clip import (
    ClipBuffers,
    FrustumCullRule,
    clip_faces,
    unclip_fragments,
)

P12 = "p12_cam_persp_near_clip"

# float32 vs float64: every clipped quantity is a handful of float32 operations on
# values of size <= ~20 (x*z/c with |x| <= 3, |z| <= 3, c = 0.5), so a few ulps
# of 20 (~2e-6) is the expected error; 2e-5 leaves margin for the one division by
# (p1.z - q.z), whose relative error grows as the edge gets parallel to the plane.
POS_ATOL = 2e-5
POS_RTOL = 2e-5


# ----------------------------------------------------------------------------- NumPy oracle
def np_clip(
    verts,
    faces,
    first,
    count,
    *,
    z_clip,
    cull,
    perspective_correct,
    rule=FrustumCullRule.PYTORCH3D,
    w3=None,
    dtype=np.float64,
):
    """PyTorch3D's clip_faces in float64, face by face.

    ``dtype=np.float32`` evaluates every operation in float32 in PyTorch3D's order
    (NumPy rounds each one, no fused multiply-add): the bits PyTorch3D computes.

    ``w3`` (per input face) replaces the p1->p3 crossing weight: finite differences
    with it held fixed give the gradient PyTorch3D computes (it detaches that weight).

    Returns a dict: face_verts (Fc, 3, 3), conversion (Fc, 3, 3) with
    ``b_original = conversion @ b_clipped``, face_map (Fc,), neighbor (Fc,),
    first (N,), count (N,), case (F,) (0 drop, 1 keep, 3 triangle, 4 quad), w3 (F,).
    """
    verts = np.asarray(verts).astype(dtype)
    # The kernel compares and interpolates with the float32 value of the plane.
    c = None if z_clip is None else dtype(np.float32(z_clip))
    one = dtype(1)
    eye = np.eye(3, dtype=dtype)
    face_verts, conversion, face_map, neighbor = [], [], [], []
    cases = np.zeros(len(faces), dtype=np.int64)
    w3_used = np.zeros(len(faces), dtype=dtype)
    out_first = np.zeros(len(first), dtype=np.int64)
    out_count = np.zeros(len(first), dtype=np.int64)
    start_of_face = {}

    def crossing(p, q, w):
        x = p * (one - w) + q * w
        if perspective_correct:
            x[:2] = (p[:2] * p[2] * (one - w) + q[:2] * q[2] * w) / c
        return x

    for f, tri in enumerate(faces):
        start_of_face[f] = len(face_verts)
        P = verts[tri]
        culled = False
        if cull and rule == FrustumCullRule.PYTORCH3D:
            # PyTorch3D 0.7.9 tests vertex 0 (left/right) and vertex 1 (top/bottom),
            # all three of its coordinates against the plane value.
            culled = any(np.all(P[j] < -1) or np.all(P[j] > 1) for j in (0, 1))
        elif cull:
            culled = any(np.all(P[:, a] < -1) or np.all(P[:, a] > 1) for a in (0, 1))
        behind = P[:, 2] < c if c is not None else np.zeros(3, dtype=bool)
        nb = int(behind.sum())
        if culled or nb == 3:
            continue
        if nb == 0:
            cases[f] = 1
            face_verts.append(P.copy())
            conversion.append(eye.copy())
            face_map.append(f)
            neighbor.append(-1)
            continue
        # p1: the vertex alone on its side of the plane; p2, p3 follow it.
        i1 = int(np.flatnonzero(behind == (nb == 1))[0])
        i2, i3 = (i1 + 1) % 3, (i1 + 2) % 3
        p1, p2, p3 = P[i1], P[i2], P[i3]
        wa = (p1[2] - c) / (p1[2] - p2[2])
        wb = (p1[2] - c) / (p1[2] - p3[2]) if w3 is None else dtype(w3[f])
        w3_used[f] = wb
        p4, p5 = crossing(p1, p2, wa), crossing(p1, p3, wb)
        b4 = (one - wa) * eye[i1] + wa * eye[i2]
        b5 = (one - wb) * eye[i1] + wb * eye[i3]
        if nb == 2:
            cases[f] = 3
            face_verts.append(np.stack([p4, p5, p1]))
            conversion.append(np.stack([b4, b5, eye[i1]], axis=1))
            face_map.append(f)
            neighbor.append(-1)
        else:
            cases[f] = 4
            k = len(face_verts)
            face_verts += [np.stack([p4, p2, p5]), np.stack([p5, p2, p3])]
            conversion += [
                np.stack([b4, eye[i2], b5], axis=1),
                np.stack([b5, eye[i2], eye[i3]], axis=1),
            ]
            face_map += [f, f]
            neighbor += [k + 1, k]
    start_of_face[len(faces)] = len(face_verts)
    for n, (a, m) in enumerate(zip(first, count, strict=True)):
        out_first[n] = start_of_face[int(a)]
        out_count[n] = start_of_face[int(a) + int(m)] - out_first[n]
    return {
        "face_verts": np.array(face_verts).reshape(-1, 3, 3),
        "conversion": np.array(conversion).reshape(-1, 3, 3),
        "face_map": np.array(face_map, dtype=np.int64),
        "neighbor": np.array(neighbor, dtype=np.int64),
        "first": out_first,
        "count": out_count,
        "case": cases,
        "w3": w3_used,
    }


# ----------------------------------------------------------------------------- helpers
def random_batch(rng, faces_per_mesh, *, z_range=(-2.0, 3.0), avoid=None):
    """Packed random soup: per mesh its own vertices; x, y in [-3, 3] so that
    frustum culling triggers, z over ``z_range`` so that many faces straddle the plane.
    ``avoid=(c, gap)`` keeps every z at least ``gap`` away from c."""
    verts, faces, first, count = [], [], [], []
    nv_total = nf_total = 0
    for nf in faces_per_mesh:
        nv = nf + 2 if nf else 2  # a mesh with no faces may still have vertices
        v = rng.uniform(-3.0, 3.0, size=(nv, 3))
        v[:, 2] = rng.uniform(*z_range, size=nv)
        if avoid is not None:
            c, gap = avoid
            near = np.abs(v[:, 2] - c) < gap
            v[near, 2] += 3 * gap * np.sign(v[near, 2] - c + 1e-12)
        tri = np.array([rng.choice(nv, 3, replace=False) for _ in range(nf)]).reshape(-1, 3)
        verts.append(v)
        faces.append(tri + nv_total)
        first.append(nf_total)
        count.append(nf)
        nv_total += nv
        nf_total += nf
    return (
        np.concatenate(verts).astype(np.float32),
        np.concatenate(faces).astype(np.int32),
        np.array(first, dtype=np.int32),
        np.array(count, dtype=np.int32),
    )


def to_device(verts, faces, first, count, device, requires_grad=False):
    return (
        wp.array(verts, dtype=wp.vec3, device=device, requires_grad=requires_grad),
        wp.array(faces, dtype=wp.int32, device=device),
        wp.array(first, dtype=wp.int32, device=device),
        wp.array(count, dtype=wp.int32, device=device),
    )


def clipped_numpy(buf):
    """The clipped list read back: face_verts (Fc,3,3) and the per-face arrays."""
    total = int(buf.num_clipped_faces.numpy()[0])
    verts = buf.verts.numpy()
    faces = buf.faces.numpy()
    return {
        "total": total,
        "faces": faces,
        "face_verts": verts[faces[:total]],
        "conversion": buf.barycentric_conversion.numpy()[:total],
        "face_map": buf.faces_clipped_to_unclipped_idx.numpy(),
        "neighbor": buf.clipped_faces_neighbor_idx.numpy(),
        "first": buf.mesh_to_face_first_idx.numpy(),
        "count": buf.num_faces_per_mesh.numpy(),
    }


# Heterogeneous batch: empty meshes at the start, in the middle and at the end.
BATCH = [0, 23, 1, 0, 40, 9, 0]

SETTINGS = [
    pytest.param(0.5, False, FrustumCullRule.PYTORCH3D, id="zclip"),
    pytest.param(0.5, True, FrustumCullRule.PYTORCH3D, id="zclip+cull_pt3d"),
    pytest.param(0.5, True, FrustumCullRule.PLANES, id="zclip+cull_planes"),
    pytest.param(None, True, FrustumCullRule.PYTORCH3D, id="cull_pt3d"),
    pytest.param(None, True, FrustumCullRule.PLANES, id="cull_planes"),
]


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("perspective_correct", [False, True])
@pytest.mark.parametrize(("z_clip", "cull", "rule"), SETTINGS)
def test_clip_matches_numpy_reference(device, z_clip, cull, rule, perspective_correct):
    rng = np.random.default_rng(1)  # >= 8 culls per rule, >= 15 triangle and quad clips
    verts, faces, first, count = random_batch(rng, BATCH)
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    # Run twice on different scenes: the second call must not see the first's data.
    for trial in range(2):
        if trial:
            verts, faces, first, count = random_batch(rng, BATCH)
        clip_faces(
            *to_device(verts, faces, first, count, device),
            z_clip_value=z_clip,
            cull_to_frustum=cull,
            perspective_correct=perspective_correct,
            buffers=buf,
            frustum_cull_rule=rule,
        )
        ref = np_clip(
            verts,
            faces,
            first,
            count,
            z_clip=z_clip,
            cull=cull,
            perspective_correct=perspective_correct,
            rule=rule,
        )
        # The scene exercises what the setting can do.
        cases = np.bincount(ref["case"], minlength=5)
        if cull:
            assert cases[0] >= 3, cases
        if z_clip is not None:
            assert cases[3] >= 5 and cases[4] >= 5, cases

        got = clipped_numpy(buf)
        total = len(ref["face_map"])
        assert got["total"] == total
        # the map back's adjoint runs only where a face was split (cases 3, 4)
        assert buf.any_split.numpy()[0] == int(bool(cases[3] + cases[4]))
        np.testing.assert_array_equal(got["first"], ref["first"])
        np.testing.assert_array_equal(got["count"], ref["count"])
        np.testing.assert_array_equal(got["face_map"][:total], ref["face_map"])
        np.testing.assert_array_equal(got["neighbor"][:total], ref["neighbor"])
        np.testing.assert_allclose(
            got["face_verts"], ref["face_verts"], rtol=POS_RTOL, atol=POS_ATOL
        )
        np.testing.assert_allclose(
            got["conversion"], ref["conversion"], rtol=POS_RTOL, atol=POS_ATOL
        )
        # Bit for bit what PyTorch3D's float32 operations give (the clip module is
        # compiled without FMA contraction, so on CUDA too).
        f32 = np_clip(
            verts,
            faces,
            first,
            count,
            z_clip=z_clip,
            cull=cull,
            perspective_correct=perspective_correct,
            rule=rule,
            dtype=np.float32,
        )
        np.testing.assert_array_equal(got["face_verts"], f32["face_verts"])
        np.testing.assert_array_equal(got["conversion"], f32["conversion"])
        # Unchanged faces reference the input vertices themselves (bitwise equal).
        keep = ref["case"][ref["face_map"]] == 1
        np.testing.assert_array_equal(got["faces"][:total][keep], faces[ref["face_map"][keep]])
        # Unused capacity: the degenerate face (0, 0, 0), no source, no neighbour.
        assert (got["faces"][total:] == 0).all()
        assert (got["face_map"][total:] == -1).all()
        assert (got["neighbor"][total:] == -1).all()
    # the same buffers on a scene in front of the plane: the flag is cleared
    far = verts + np.array([0.0, 0.0, 100.0], np.float32)
    clip_faces(*to_device(far, faces, first, count, device), z_clip_value=z_clip,
               cull_to_frustum=False, perspective_correct=perspective_correct,
               buffers=buf)  # fmt: skip
    assert buf.any_split.numpy()[0] == 0


def test_pytorch3d_cull_rule_is_per_vertex(device):
    """PyTorch3D 0.7.9 culls on vertex 0/1's three coordinates, not on an axis (#1936)."""
    verts = np.array(
        [
            [1.5, 1.2, 1.1],  # all of x, y, z > 1
            [0.0, 0.0, 2.0],
            [0.2, 0.1, 2.0],
            [-3.0, 0.0, 2.0],  # x < -1 on every vertex of face 2 ...
            [-3.0, 0.5, 2.0],
            [-3.5, 0.2, 2.0],
        ],
        dtype=np.float32,
    )
    # face 0: vertex 0 beyond -> culled by PyTorch3D although it reaches the centre;
    # face 1: same vertex, but as vertex 2 -> kept; face 2: wholly left -> only PLANES culls.
    faces = np.array([[0, 1, 2], [1, 2, 0], [3, 4, 5]], dtype=np.int32)
    first, count = np.array([0], np.int32), np.array([3], np.int32)
    expect = {FrustumCullRule.PYTORCH3D: [1, 2], FrustumCullRule.PLANES: [0, 1]}
    for rule, kept in expect.items():
        buf = ClipBuffers(6, 3, 1, device)
        clip_faces(
            *to_device(verts, faces, first, count, device),
            z_clip_value=None,
            cull_to_frustum=True,
            perspective_correct=False,
            buffers=buf,
            frustum_cull_rule=rule,
        )
        got = clipped_numpy(buf)
        assert got["face_map"][: got["total"]].tolist() == kept, rule


def test_everything_dropped_and_empty_input(device):
    verts = np.array([[0, 0, 0.1], [1, 0, 0.2], [0, 1, 0.3]], dtype=np.float32)
    faces = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.int32)
    buf = ClipBuffers(3, 2, 2, device)
    clip_faces(
        *to_device(verts, faces, np.array([0, 1], np.int32), np.array([1, 1], np.int32), device),
        z_clip_value=0.5,
        cull_to_frustum=False,
        perspective_correct=True,
        buffers=buf,
    )
    got = clipped_numpy(buf)
    assert got["total"] == 0
    assert got["first"].tolist() == [0, 0] and got["count"].tolist() == [0, 0]

    buf = ClipBuffers(0, 0, 1, device)
    empty = to_device(
        np.zeros((0, 3), np.float32),
        np.zeros((0, 3), np.int32),
        np.zeros(1, np.int32),
        np.zeros(1, np.int32),
        device,
    )
    clip_faces(
        *empty, z_clip_value=0.5, cull_to_frustum=True, perspective_correct=False, buffers=buf
    )
    assert int(buf.num_clipped_faces.numpy()[0]) == 0
    assert buf.num_faces_per_mesh.numpy().tolist() == [0]


def test_bad_arguments_are_named(device):
    verts, faces, first, count = random_batch(np.random.default_rng(0), [4, 3])
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    args = list(to_device(verts, faces, first, count, device))
    kw = dict(z_clip_value=0.5, cull_to_frustum=False, perspective_correct=True, buffers=buf)
    bad_faces = wp.array(faces.astype(np.int64), dtype=wp.int64, device=device)
    with pytest.raises(TypeError, match="faces"):
        clip_faces(args[0], bad_faces, *args[2:], **kw)
    with pytest.raises(ValueError, match="verts"):
        clip_faces(args[0][:-1], *args[1:], **kw)
    with pytest.raises(ValueError, match="z_clip_value"):
        clip_faces(*args, **{**kw, "z_clip_value": float("nan")})
    with pytest.raises(ValueError, match="num_verts"):
        ClipBuffers(-1, 2, 1, device)
    no_grad = ClipBuffers(len(verts), len(faces), len(first), device, requires_grad=False)
    grad_verts = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="requires_grad"):
        clip_faces(grad_verts, *args[1:], **{**kw, "buffers": no_grad})


@pytest.mark.parametrize("perspective_correct", [False, True])
def test_unclip_matches_numpy(device, perspective_correct):
    rng = np.random.default_rng(3)
    verts, faces, first, count = random_batch(rng, [30, 0, 25])
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    clip_faces(
        *to_device(verts, faces, first, count, device),
        z_clip_value=0.5,
        cull_to_frustum=True,
        perspective_correct=perspective_correct,
        buffers=buf,
    )
    ref = np_clip(
        verts, faces, first, count, z_clip=0.5, cull=True, perspective_correct=perspective_correct
    )
    total = len(ref["face_map"])
    shape = (3, 5, 4, 2)
    p2f = rng.integers(-1, total, size=shape).astype(np.int32)
    bary = rng.uniform(-0.5, 1.5, size=shape + (3,)).astype(np.float32)
    out_p = wp.empty(shape, dtype=wp.int32, device=device)
    out_b = wp.empty(shape, dtype=wp.vec3, device=device)
    unclip_fragments(
        wp.array(p2f, dtype=wp.int32, device=device),
        wp.array(bary, dtype=wp.vec3, device=device),
        buf,
        out_p,
        out_b,
    )
    valid = p2f >= 0
    expect_p = np.where(valid, ref["face_map"][np.maximum(p2f, 0)], -1)
    expect_b = np.einsum("...ij,...j->...i", ref["conversion"][np.maximum(p2f, 0)], bary)
    expect_b = np.where(valid[..., None], expect_b, bary)
    np.testing.assert_array_equal(out_p.numpy(), expect_p)
    # |b| <= 1.5 and the conversion entries are in [0, 1]: a few float32 ulps.
    np.testing.assert_allclose(out_b.numpy().reshape(expect_b.shape), expect_b, atol=1e-6)


@pytest.mark.parametrize("perspective_correct", [False, True])
def test_gradients_match_finite_differences(device, perspective_correct):
    """d/dverts of sum(G * clipped face verts) + sum(Gb * unclip(b)), with the
    p1->p3 weight held fixed as PyTorch3D does (it detaches it)."""
    rng = np.random.default_rng(11)
    verts, faces, first, count = random_batch(rng, [6, 5], z_range=(-0.8, 1.8), avoid=(0.5, 0.05))
    # Gentle x, y keep the perspective crossings (x*z/c) O(1).
    verts[:, :2] *= 0.4
    V, F = len(verts), len(faces)
    persp = perspective_correct
    ref0 = np_clip(verts, faces, first, count, z_clip=0.5, cull=False, perspective_correct=persp)
    total = len(ref0["face_map"])
    assert (ref0["case"] == 3).sum() >= 2 and (ref0["case"] == 4).sum() >= 2
    gfv = rng.integers(-8, 9, size=(total, 3, 3)) / 8
    bq = rng.uniform(0, 1, size=(total, 3))
    gb = rng.integers(-8, 9, size=(total, 3)) / 8

    buf = ClipBuffers(V, F, len(first), device)
    wv, wf, wfirst, wcount = to_device(verts, faces, first, count, device, requires_grad=True)
    p2f = wp.array(np.arange(total, dtype=np.int32).reshape(1, 1, total, 1), device=device)
    b_in = wp.array(
        bq.astype(np.float32).reshape(1, 1, total, 1, 3),
        dtype=wp.vec3,
        device=device,
        requires_grad=True,
    )
    out_p = wp.empty((1, 1, total, 1), dtype=wp.int32, device=device)
    out_b = wp.zeros((1, 1, total, 1), dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        clip_faces(
            wv,
            wf,
            wfirst,
            wcount,
            z_clip_value=0.5,
            cull_to_frustum=False,
            perspective_correct=persp,
            buffers=buf,
        )
        unclip_fragments(p2f, b_in, buf, out_p, out_b)
    # Seed d loss / d clipped vertex: each clipped face corner adds its G.
    cfaces = buf.faces.numpy()[:total]
    seed_v = np.zeros((V + 2 * F, 3))
    np.add.at(seed_v, cfaces.reshape(-1), gfv.reshape(-1, 3))
    seed_b = gb.astype(np.float32).reshape(1, 1, total, 1, 3)
    tape.backward(
        grads={
            buf.verts: wp.array(seed_v.astype(np.float32), dtype=wp.vec3, device=device),
            out_b: wp.array(seed_b, dtype=wp.vec3, device=device),
        }
    )
    grad = wv.grad.numpy()
    grad_b = b_in.grad.numpy().reshape(total, 3)

    def loss(v64, w3):
        ref = np_clip(
            v64, faces, first, count, z_clip=0.5, cull=False, perspective_correct=persp, w3=w3
        )
        unclipped = np.einsum("cij,cj->ci", ref["conversion"], bq)
        return (gfv * ref["face_verts"]).sum() + (gb * unclipped).sum()

    def fd(w3, h=1e-6):
        out = np.zeros((V, 3))
        for i, a in np.ndindex(V, 3):
            step = np.zeros((V, 3))
            step[i, a] = h
            v64 = verts.astype(np.float64)
            out[i, a] = (loss(v64 + step, w3) - loss(v64 - step, w3)) / (2 * h)
        return out

    expect = fd(ref0["w3"])
    # Gradients are O(1-10); float32 kernels carry ~1e-6 relative error and the
    # float64 central difference ~1e-8: 1e-4 of the largest entry is ample.
    tol = 1e-4 * np.abs(expect).max()
    np.testing.assert_allclose(grad, expect, atol=tol, rtol=0)
    # The test can see the detach: the full derivative (w3 not held) is far off.
    assert np.abs(fd(None) - expect).max() > 100 * tol
    # d loss / d b_clipped = M^T Gb.
    np.testing.assert_allclose(grad_b, np.einsum("cij,ci->cj", ref0["conversion"], gb), atol=1e-5)


def test_graph_capture_replays_clip_unclip_and_backward(device):
    """Clip + unclip + tape.backward captured once, replayed on new vertex values,
    gives bitwise what an eager run on those values gives (gradients too: with
    ``deterministic=True`` the split faces' gradients are summed in a fixed order
    on a GPU, see warpraster/clip.py)."""
    rng = np.random.default_rng(5)
    verts_a, faces, first, count = random_batch(rng, [20, 0, 15])
    verts_b = verts_a + rng.normal(scale=0.3, size=verts_a.shape).astype(np.float32)
    V, F, N = len(verts_a), len(faces), len(first)
    settings = dict(z_clip=0.4, cull=True, perspective_correct=True)
    total_b = len(np_clip(verts_b, faces, first, count, **settings)["face_map"])
    shape = (N, 6, 5, 3)
    p2f_np = rng.integers(-1, total_b, size=shape).astype(np.int32)
    bary_np = rng.uniform(0, 1, size=shape + (3,)).astype(np.float32)
    gb_np = rng.normal(size=shape + (3,)).astype(np.float32)
    gv_np = rng.normal(size=(V + 2 * F, 3)).astype(np.float32)

    def make():
        s = {}
        s["buf"] = ClipBuffers(V, F, N, device)
        s["verts"], s["faces"], s["first"], s["count"] = to_device(
            verts_a, faces, first, count, device, requires_grad=True
        )
        s["p2f"] = wp.array(p2f_np, dtype=wp.int32, device=device)
        s["bary"] = wp.array(bary_np, dtype=wp.vec3, device=device, requires_grad=True)
        s["out_p"] = wp.empty(shape, dtype=wp.int32, device=device)
        s["out_b"] = wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=True)
        s["gb"] = wp.array(gb_np, dtype=wp.vec3, device=device)
        s["gv"] = wp.array(gv_np, dtype=wp.vec3, device=device)
        return s

    def step(s):
        buf = s["buf"]
        for arr in (s["verts"], s["bary"], buf.verts, buf.barycentric_conversion, s["out_b"]):
            arr.grad.zero_()
        tape = wp.Tape()
        with tape:
            clip_faces(
                s["verts"],
                s["faces"],
                s["first"],
                s["count"],
                z_clip_value=settings["z_clip"],
                cull_to_frustum=settings["cull"],
                perspective_correct=settings["perspective_correct"],
                buffers=buf,
                deterministic=True,
            )
            unclip_fragments(s["p2f"], s["bary"], buf, s["out_p"], s["out_b"], deterministic=True)
        tape.backward(grads={buf.verts: s["gv"], s["out_b"]: s["gb"]})

    def outputs(s):
        # Everything a consumer may read (slots past the clipped total of vertices and
        # conversions are scratch: the capture's earlier runs on verts_a left values there).
        got = clipped_numpy(s["buf"])
        return [
            got["face_verts"],
            got["faces"],
            got["first"],
            got["count"],
            got["neighbor"],
            got["face_map"],
            got["conversion"],
            s["out_p"].numpy(),
            s["out_b"].numpy(),
            s["verts"].grad.numpy(),
            s["bary"].grad.numpy(),
        ]

    captured = make()
    step(captured)  # loads the modules: nothing may compile inside the capture
    with wp.ScopedCapture(device=device) as capture:
        step(captured)
    captured["verts"].assign(verts_b)  # new values, same array: seen by the replay
    wp.capture_launch(capture.graph)
    wp.synchronize_device(device)

    eager = make()
    eager["verts"].assign(verts_b)
    step(eager)
    assert clipped_numpy(captured["buf"])["total"] == total_b
    for got, want in zip(outputs(captured), outputs(eager), strict=True):
        np.testing.assert_array_equal(got, want)
    # The replay really ran on the new values.
    assert not np.array_equal(captured["buf"].verts.numpy()[:V], verts_a)


# ----------------------------------------------------------------------------- PyTorch3D p12
def test_p12_clip_then_numpy_rasterizer_matches_pytorch3d(device):
    """p12: clip (Warp), rasterize the clipped list with the NumPy oracle, map back
    (Warp): PyTorch3D's stored fragments."""
    c = load_case(P12)
    assert not c["cull_to_frustum"]
    args = raster_args(c)
    verts = args["verts"]
    faces = args["faces"].astype(np.int32)
    first = args["mesh_to_face_first_idx"].astype(np.int32)
    count = args["num_faces_per_mesh"].astype(np.int32)
    persp = c["perspective_correct"]
    z_clip = c["z_clip_value"]
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    clip_faces(
        *to_device(verts, faces, first, count, device),
        z_clip_value=z_clip,
        cull_to_frustum=False,
        perspective_correct=persp,
        buffers=buf,
    )
    got = clipped_numpy(buf)
    total = got["total"]
    stats = c["meta"]["clipping"]
    assert total == stats["n_faces_after"]
    assert (got["neighbor"][:total] >= 0).sum() == stats["n_split_faces(case4 halves)"]
    # The clipped list itself agrees with the float64 oracle's.
    ref = np_clip(verts, faces, first, count, z_clip=z_clip, cull=False, perspective_correct=persp)
    np.testing.assert_array_equal(got["face_map"][:total], ref["face_map"])
    np.testing.assert_allclose(got["face_verts"], ref["face_verts"], rtol=POS_RTOL, atol=POS_ATOL)

    def rasterize_and_unclip(dtype):
        clipped_args = {
            **args,
            "verts": buf.verts.numpy(),
            "faces": got["faces"][:total],
            "mesh_to_face_first_idx": got["first"],
            "num_faces_per_mesh": got["count"],
        }
        frag = np_reference.rasterize_reference(
            **clipped_args, clipped_faces_neighbor_idx=got["neighbor"][:total], dtype=dtype
        )
        out_p = wp.empty(frag.pix_to_face.shape, dtype=wp.int32, device=device)
        out_b = wp.empty(frag.pix_to_face.shape, dtype=wp.vec3, device=device)
        unclip_fragments(
            wp.array(frag.pix_to_face.astype(np.int32), dtype=wp.int32, device=device),
            wp.array(frag.bary_coords.astype(np.float32), dtype=wp.vec3, device=device),
            buf,
            out_p,
            out_b,
        )
        bary = out_b.numpy().reshape(c["bary_coords"].shape)
        return frag, out_p.numpy(), bary

    valid = c["pix_to_face"] >= 0

    # The oracle's float32 emulation of PyTorch3D's kernel on our clipped list gives
    # PyTorch3D's numbers (measured: bitwise equal; 1e-6 allows the last bit of a
    # fused multiply-add in the conversion product on a GPU).
    frag, p2f, bary = rasterize_and_unclip(np.float32)
    np.testing.assert_array_equal(p2f, c["pix_to_face"])
    np.testing.assert_allclose(frag.zbuf[valid], c["zbuf"][valid], rtol=1e-6)
    np.testing.assert_allclose(bary[valid], c["bary_coords"][valid], atol=1e-6)
    np.testing.assert_allclose(frag.dists[valid], c["dists"][valid], atol=1e-6)

    # The float64 oracle agrees everywhere except where the two halves of a split
    # quad tie exactly: a pixel at distance d from their shared diagonal is inside
    # one half and outside the other by the same |d|; PyTorch3D keeps the first half
    # unless the other's |d| is strictly smaller, which rounding decides.
    frag, p2f, bary = rasterize_and_unclip(np.float64)
    np.testing.assert_array_equal(p2f, c["pix_to_face"])
    off = valid & (
        ~np.isclose(frag.zbuf, c["zbuf"], rtol=1e-5, atol=0)
        | (np.abs(bary - c["bary_coords"]) > 1e-5).any(-1)
        | (np.abs(frag.dists - c["dists"]) > 1e-5)
    )
    assert off.sum() <= 16, off.sum()  # measured: 12 of 1015 valid slots
    assert (got["neighbor"][frag.pix_to_face[off]] >= 0).all()
    np.testing.assert_allclose(np.abs(frag.dists[off]), np.abs(c["dists"][off]), atol=1e-6)


def _oracle_unclipped(buf, got, size, k, device, **flags):
    """The oracle of a clipped render: the clipped list in ``buf`` (``got``: its host
    copy) through the float32 NumPy rasterizer, mapped back by unclip_fragments.
    Returns (oracle fragments, input-face slots, barycentrics) on ``device``."""
    total = got["total"]
    frag = np_reference.rasterize_reference(
        buf.verts.numpy(), got["faces"][:total], got["first"], got["count"], size,
        faces_per_pixel=k, clipped_faces_neighbor_idx=got["neighbor"][:total],
        dtype=np.float32, **flags,
    )  # fmt: skip
    ref_p = wp.empty(frag.pix_to_face.shape, dtype=wp.int32, device=device)
    ref_b = wp.empty(frag.pix_to_face.shape, dtype=wp.vec3, device=device)
    unclip_fragments(
        wp.array(frag.pix_to_face.astype(np.int32), dtype=wp.int32, device=device),
        wp.array(frag.bary_coords.astype(np.float32), dtype=wp.vec3, device=device),
        buf, ref_p, ref_b,
    )  # fmt: skip
    return frag, ref_p, ref_b


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("bin_size", [0, 8])
def test_p12_rasterize_meshes_forward_and_gradient_match_pytorch3d(device, bin_size, deterministic):
    """The whole clipped render path (rasterize_meshes with z_clip_value) on p12:
    fragments and d loss / d verts_ndc as PyTorch3D computed them."""
    c = load_case(P12)
    args = raster_args(c)
    verts = wp.array(args.pop("verts"), dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        frag = rasterize_meshes(
            verts,
            **args,
            bin_size=bin_size,
            z_clip_value=c["z_clip_value"],
            cull_to_frustum=c["cull_to_frustum"],
            deterministic=deterministic,
            exact_perspective_grad=False,  # PyTorch3D's numbers (docs/BACKWARD.md)
        )
    out = frag.numpy()
    np.testing.assert_array_equal(out["pix_to_face"], c["pix_to_face"])
    valid = c["pix_to_face"] >= 0
    # Measured on cpu: zbuf within 2.4e-7, bary 1.2e-7, dists bitwise.
    np.testing.assert_allclose(out["zbuf"][valid], c["zbuf"][valid], rtol=1e-5)
    np.testing.assert_allclose(out["bary_coords"][valid], c["bary_coords"][valid], atol=1e-5)
    np.testing.assert_allclose(out["dists"][valid], c["dists"][valid], atol=1e-5)
    tape.backward(
        grads={
            frag.zbuf: wp.array(c["grad_zbuf"], dtype=wp.float32, device=device),
            frag.bary_coords: wp.array(c["grad_bary"], dtype=wp.vec3, device=device),
            frag.dists: wp.array(c["grad_dists"], dtype=wp.float32, device=device),
        }
    )
    # README: grad_verts to about rtol 1e-4, atol 1e-5 (summation order differs);
    # measured on cpu: 1.3e-5 at most, of entries up to 34. Without PyTorch3D's
    # detached p1->p3 weight the worst entry is off by 7.8.
    np.testing.assert_allclose(verts.grad.numpy(), c["grad_verts_ndc"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bin_size", [0, 8])
@pytest.mark.parametrize(
    "flags",
    [
        {"perspective_correct": False, "blur_radius": 0.0},
        {"perspective_correct": True, "blur_radius": 2e-3, "clip_barycentric_coords": True},
    ],
    ids=["plain", "persp-blur-clipbary"],
)
# (20, 28) x K=4: whole groups of four slots (16-byte map back); (9, 13) x K=3 = 1053
# slots: a partial group at the end, read and written slot by slot
@pytest.mark.parametrize(("size", "k"), [((20, 28), 4), ((9, 13), 3)], ids=["wide", "tail"])
def test_clipped_rasterization_matches_the_oracle_on_random_scenes(device, bin_size, flags,
                                                                   size, k):  # fmt: skip
    """rasterize_meshes(z_clip_value=...) on random soups where many faces straddle
    the plane, both raster paths, against clip -> the NumPy oracle (float32
    emulation, step by step as PyTorch3D's kernel) -> unclip: identical face choice,
    values equal to float32 rounding. The oracle's clipped list itself is checked
    against the float64 NumPy clipper in test_clip_matches_numpy_reference."""
    rng = np.random.default_rng(77 + bin_size)
    verts, faces, first, count = random_batch(rng, [30, 0, 45], z_range=(-0.5, 3.0))
    verts[:, :2] *= 0.4  # keep most faces on screen
    z_clip = 0.6
    out = rasterize_meshes(
        *to_device(verts, faces, first, count, device),
        image_size=size, faces_per_pixel=k, bin_size=bin_size, z_clip_value=z_clip, **flags,
    ).numpy()  # fmt: skip
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    clip_faces(
        *to_device(verts, faces, first, count, device),
        z_clip_value=z_clip, cull_to_frustum=False,
        perspective_correct=flags["perspective_correct"], buffers=buf,
    )  # fmt: skip
    got = clipped_numpy(buf)
    total = got["total"]
    assert (got["neighbor"][:total] >= 0).sum() >= 4  # some quads really were split
    frag, ref_p, ref_b = _oracle_unclipped(buf, got, size, k, device, **flags)
    valid = ref_p.numpy() >= 0
    assert valid.sum() > 30
    np.testing.assert_array_equal(out["pix_to_face"], ref_p.numpy())
    # Both sides are float32 arithmetic in the same order (no FMA on ours); 1e-5
    # allows for the barycentric conversion product being summed differently.
    np.testing.assert_allclose(out["zbuf"][valid], frag.zbuf[valid], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["dists"][valid], frag.dists[valid], rtol=1e-5, atol=1e-6)
    bary = ref_b.numpy().reshape(out["bary_coords"].shape)
    np.testing.assert_allclose(out["bary_coords"][valid], bary[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 4])
def test_split_face_bins_take_the_ordered_queue_and_the_rest_the_register_queue(device, k):
    """Only the bins a split face touches need faces offered in index order: their
    pixels go to the output-array queue over sorted lists, every other bin keeps
    the register queue. A scene with split quads on the left and whole faces on the
    right, binned, must mark some bins and not others and still equal the oracle
    (clip -> float32 NumPy rasterizer -> unclip) on every slot."""
    rng = np.random.default_rng(5)
    verts, faces, first, count = random_batch(rng, [40], z_range=(0.8, 3.0))
    verts[:, :2] *= 0.35
    verts[:, 0] += 0.45  # whole faces on the right half (x is +left in NDC: image left)
    cut = np.array([[-0.6, -0.3, 0.2], [-0.2, -0.3, 1.5], [-0.4, 0.3, 1.4]], np.float32)
    verts = np.concatenate([verts, cut]).astype(np.float32)
    faces = np.concatenate([faces, [[len(verts) - 3, len(verts) - 2, len(verts) - 1]]])
    faces = faces.astype(np.int32)
    count = np.array([len(faces)], np.int32)
    size, z_clip = (24, 32), 0.6
    ws = wr.ClipWorkspace(num_verts=len(verts), num_faces=len(faces), num_meshes=1,
                          image_size=size, faces_per_pixel=k, bin_size=8,
                          device=device)  # fmt: skip
    out = rasterize_meshes(
        *to_device(verts, faces, first, count, device), image_size=size, faces_per_pixel=k,
        bin_size=8, z_clip_value=z_clip, workspace=ws,
    ).numpy()  # fmt: skip
    marks = ws.raster.bin_split.numpy()
    assert marks.any() and not marks.all()  # both queues really ran
    buf = ClipBuffers(len(verts), len(faces), 1, device)
    clip_faces(*to_device(verts, faces, first, count, device), z_clip_value=z_clip,
               cull_to_frustum=False, perspective_correct=False, buffers=buf)  # fmt: skip
    got = clipped_numpy(buf)
    total = got["total"]
    assert (got["neighbor"][:total] >= 0).sum() >= 2  # the quad really was split
    frag, ref_p, ref_b = _oracle_unclipped(buf, got, size, k, device)
    np.testing.assert_array_equal(out["pix_to_face"], ref_p.numpy())


@pytest.mark.parametrize("blur", [0.0, 0.02], ids=["sharp", "blur"])
def test_k1_small_face_pass_runs_only_in_calls_without_split_faces(device, blur):
    """K = 1 binned draws faces of at most ``Tuning.small_face_pixels`` pixels in
    an order-free atomic pass. With clipping on, PyTorch3D's rule for split
    halves depends on the offer order, so that pass runs only when the clipper's
    device flag says no face is split in this call. One workspace through calls
    without, with, and again without a split face (the flag changes on the
    device only): the small-face keys are drawn exactly in the calls without,
    and every call equals the oracle (clip -> float32 NumPy rasterizer -> unclip)."""
    rng = np.random.default_rng(31)
    verts, faces, first, count = random_batch(rng, [60, 40], z_range=(0.8, 3.0))
    verts[:, :2] *= 0.5
    # a large face that the middle call pushes across the plane z = 0.6
    big = np.array([[-0.7, -0.6, 1.2], [0.6, -0.5, 1.3], [0.0, 0.7, 1.25]], np.float32)
    verts = np.concatenate([verts, big]).astype(np.float32)
    faces = np.concatenate([faces, [[len(verts) - 3, len(verts) - 2, len(verts) - 1]]])
    faces = faces.astype(np.int32)
    count = count.copy()
    count[-1] += 1  # the large face belongs to the last mesh
    size, z_clip = (24, 32), 0.6
    sizing = dict(image_size=size, faces_per_pixel=1, bin_size=8)
    ws = wr.ClipWorkspace(num_verts=len(verts), num_faces=len(faces), num_meshes=len(first),
                          device=device, **sizing)  # fmt: skip
    flags = dict(blur_radius=blur, clip_barycentric_coords=blur > 0)
    settings = dict(sizing, **flags)
    for step, z_first in enumerate((1.2, 0.3, 1.2)):
        v = verts.copy()
        v[-3, 2] = z_first
        dev = to_device(v, faces, first, count, device)
        out = rasterize_meshes(*dev, z_clip_value=z_clip, workspace=ws, **settings).numpy()
        split = step == 1
        assert ws.clip.any_split.numpy()[0] == int(split)
        keys = ws.raster.depth_keys.numpy()
        # the pass drew many pixels (most faces here cover a few pixels), or none
        drawn = (keys != np.uint64(2**64 - 1)).sum()
        assert (drawn == 0) if split else (drawn > 50), (step, drawn)
        buf = ClipBuffers(len(v), len(faces), len(first), device)
        clip_faces(*dev, z_clip_value=z_clip, cull_to_frustum=False,
                   perspective_correct=False, buffers=buf)  # fmt: skip
        got = clipped_numpy(buf)
        frag, ref_p, _ = _oracle_unclipped(buf, got, size, 1, device, **flags)
        np.testing.assert_array_equal(out["pix_to_face"], ref_p.numpy(), err_msg=f"step {step}")
        valid = ref_p.numpy() >= 0
        assert valid.mean() > 0.3
        # as test_clipped_rasterization_matches_the_oracle_on_random_scenes
        np.testing.assert_allclose(out["zbuf"][valid], frag.zbuf[valid], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("size", "k"), [((20, 28), 4), ((9, 13), 3)], ids=["wide", "tail"])
def test_in_place_map_back_gradient_equals_the_copying_one(device, size, k):
    """rasterize_meshes(z_clip_value=...) maps its fragments back in place (16 bytes
    of slots a thread, slot by slot for a partial group) and converts the shared
    barycentric gradient in place. Truth: the explicit chain clip_faces ->
    rasterize the clipped list -> unclip_fragments (a copy; its adjoint is checked
    against finite differences above), seeded with the same upstream gradients
    of barycentrics, depths and distances: the same fragments, and the same
    vertex gradient up to the order of float additions."""
    rng = np.random.default_rng(31)
    verts, faces, first, count = random_batch(rng, [30, 24], z_range=(-0.5, 3.0))
    verts[:, :2] *= 0.4
    z_clip = 0.6
    flags = dict(image_size=size, faces_per_pixel=k, perspective_correct=True, blur_radius=1e-3)
    dev = to_device(verts, faces, first, count, device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = rasterize_meshes(*dev, z_clip_value=z_clip, **flags)
    shape = out.pix_to_face.shape
    gb = wp.array(rng.uniform(-1, 1, (*shape, 3)).astype(np.float32), dtype=wp.vec3,
                  device=device)  # fmt: skip
    gz = wp.array(rng.uniform(-1, 1, shape).astype(np.float32), device=device)
    gd = wp.array(rng.uniform(-1, 1, shape).astype(np.float32), device=device)
    fragments_in_place = {n: getattr(out, n).numpy() for n in ("pix_to_face", "bary_coords")}
    tape.backward(grads={out.bary_coords: gb, out.zbuf: gz, out.dists: gd})
    got = dev[0].grad.numpy()

    ref = to_device(verts, faces, first, count, device, requires_grad=True)
    buf = ClipBuffers(len(verts), len(faces), len(first), device)
    tape2 = wp.Tape()
    with tape2:
        clip_faces(*ref, z_clip_value=z_clip, cull_to_frustum=False, perspective_correct=True,
                   buffers=buf)  # fmt: skip
        total = int(buf.num_clipped_faces.numpy()[0])  # the clipped list's length
        inner = rasterize_meshes(
            buf.verts, buf.faces[:total], buf.mesh_to_face_first_idx, buf.num_faces_per_mesh,
            clipped_faces_neighbor_idx=buf.clipped_faces_neighbor_idx[:total], **flags,
        )  # fmt: skip
        p = wp.empty(shape, dtype=wp.int32, device=device)
        b = wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=True)
        unclip_fragments(inner.pix_to_face, inner.bary_coords, buf, p, b)
    assert (buf.clipped_faces_neighbor_idx.numpy() >= 0).sum() >= 4  # quads were split
    np.testing.assert_array_equal(fragments_in_place["pix_to_face"], p.numpy())
    # same float32 operations (the conversion product) on both sides
    np.testing.assert_array_equal(fragments_in_place["bary_coords"], b.numpy())
    tape2.backward(grads={b: gb, inner.zbuf: gz, inner.dists: gd})
    want = ref[0].grad.numpy()
    assert np.abs(want).max() > 0.1
    # float atomics add per-slot terms in another order: ~1e-6 relative; 1e-5 of the
    # largest entry leaves margin
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_in_place_map_back_follows_a_new_gradient_array(device):
    """The in-place map back keeps its argument structs between calls (in its
    ClipBuffers) and must rebuild them when an array changes: a render through one
    ClipWorkspace whose barycentric gradient array is replaced by a new one between
    calls converts the new array, so the vertex gradient equals the first call's.
    A stale struct would convert the old array and leave the new one's split slots
    unconverted."""
    rng = np.random.default_rng(5)
    verts, faces, first, count = random_batch(rng, [30, 24], z_range=(-0.5, 3.0))
    verts[:, :2] *= 0.4
    dev = to_device(verts, faces, first, count, device, requires_grad=True)
    size = dict(image_size=(12, 16), faces_per_pixel=4)
    ws = wr.ClipWorkspace(num_verts=len(verts), num_faces=len(faces), num_meshes=len(first),
                          device=device, requires_grad=True, **size)  # fmt: skip
    grads = []
    for call in range(2):
        if call == 1:  # a new gradient array, before the call records its adjoints
            ws.fragments.bary_coords.grad = wp.zeros_like(ws.fragments.bary_coords)
        tape = wp.Tape()
        with tape:
            out = rasterize_meshes(*dev, workspace=ws, perspective_correct=True,
                                   z_clip_value=0.6, **size)  # fmt: skip
        gb = wp.array(np.random.default_rng(9).uniform(-1, 1, (*out.shape, 3)).astype(np.float32),
                      dtype=wp.vec3, device=device)  # fmt: skip
        tape.backward(grads={out.bary_coords: gb})
        grads.append(dev[0].grad.numpy().copy())
        tape.zero()
        dev[0].grad.zero_()
    assert (out.pix_to_face.numpy() >= 0).sum() > 20
    assert np.abs(grads[0]).max() > 0.1
    # the same float operations in the same order on the cpu device; a GPU adds
    # the per-slot terms with float atomics in another order (~1e-6 relative)
    if wp.get_device(device).is_cpu:
        np.testing.assert_array_equal(grads[1], grads[0])
    else:
        np.testing.assert_allclose(grads[1], grads[0], rtol=0, atol=1e-5 * np.abs(grads[0]).max())


@pytest.mark.parametrize("k", [1, 4])
def test_reused_clip_workspace_rewrites_what_the_call_before_left(device, k):
    """A ClipWorkspace's map back and output pass skip an empty group of four slots
    that the call before left filled with -1 (``Tuning.fill_empty_once``; with K = 1
    a group spans four pixels). Through calls whose covered slots shrink, grow
    (with the marks off) and shrink, with split faces, every fragment equals a
    fresh workspace's."""
    rng = np.random.default_rng(21)
    verts, faces, first, count = random_batch(rng, [30, 24], z_range=(-0.5, 3.0))
    size = dict(image_size=(12, 16), faces_per_pixel=k, bin_size=8, z_clip_value=0.6)
    ws = wr.ClipWorkspace(num_verts=len(verts), num_faces=len(faces), num_meshes=len(first),
                          image_size=size["image_size"], faces_per_pixel=k, bin_size=8,
                          device=device)  # fmt: skip
    covered = []
    for step, scale in enumerate((0.4, 0.1, 0.7, 0.4)):
        # the largest render with the marks off: the next must not trust them
        ws.tuning = ws.tuning.replace(fill_empty_once=step != 2)
        v = verts.copy()
        v[:, :2] *= scale
        dev = to_device(v, faces, first, count, device)
        got = rasterize_meshes(*dev, workspace=ws, **size).numpy()
        fresh = rasterize_meshes(*dev, **size).numpy()
        covered.append((fresh["pix_to_face"] >= 0).sum())
        for key in ("pix_to_face", "zbuf", "bary_coords", "dists"):
            np.testing.assert_array_equal(got[key], fresh[key], err_msg=f"scale {scale} {key}")
    assert covered[1] < covered[0] < covered[2]
    assert ws.clip.any_split.numpy()[0] == 1  # faces crossed the near plane


@pytest.mark.parametrize("k", [1, 4])
def test_grid_stride_launches_cover_every_pixel_and_slot(device, k, monkeypatch):
    """The map back (forward and adjoint) and the output-array queue pass, which
    serves only the bins of split faces, run grid-stride loops whose thread counts
    are capped (``clip.MAP_BACK_THREADS``, ``raster.launch.ORDERED_ONLY_THREADS``);
    the bench-sized caps exceed any test image. With caps of a few threads, so
    that each thread loops many times over pixels and groups (and a stride that
    is not a multiple of four groups), a render with split faces and its vertex
    gradient equal those with the default caps."""
    from warpraster.clip import map_back as clip
    from warpraster.raster import launch

    rng = np.random.default_rng(5)
    verts, faces, first, count = random_batch(rng, [30, 24], z_range=(-0.5, 3.0))
    verts[:, :2] *= 0.4
    size = dict(image_size=(12, 16), faces_per_pixel=k, bin_size=8, z_clip_value=0.6)
    results = []
    for caps in ((None, None), (7, 3)):
        if caps[0] is not None:
            monkeypatch.setattr(launch, "ORDERED_ONLY_THREADS", caps[0])
            monkeypatch.setattr(clip, "MAP_BACK_THREADS", caps[1])
        dev = to_device(verts, faces, first, count, device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            out = rasterize_meshes(*dev, **size)
        got = out.numpy()
        upstream = np.random.default_rng(9).uniform(-1, 1, (*out.shape, 3)).astype(np.float32)
        tape.backward(grads={out.bary_coords: wp.array(upstream, dtype=wp.vec3, device=device)})
        results.append((got, dev[0].grad.numpy()))
    assert (results[0][0]["pix_to_face"] >= 0).sum() > 20
    for key in ("pix_to_face", "zbuf", "bary_coords", "dists"):
        np.testing.assert_array_equal(results[1][0][key], results[0][0][key], err_msg=key)
    scale = np.abs(results[0][1]).max()
    assert scale > 0.01
    # the split faces' conversion-matrix gradients are float sums whose order
    # follows the threads' order (here changed; on a GPU, atomics): float32
    # rounding of a few hundred terms, ~1e-7 of the gradient's scale (3e-8 seen)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_static_faces_skip_only_a_pass_that_would_rewrite_the_same_list(device, mode):
    """``static_faces``: a call with no vertex behind the plane, after a pass that
    kept every face, skips the clip pass (its scratch is left as it was: poisoned
    here before each call); every other call runs it. Through vertices in front,
    partly behind, back in front, and faces changed in place (``faces_changed``),
    eager and as one captured graph replayed (a conditional node), every fragment
    equals a fresh workspace's bit for bit (eager calls alternate with calls on a
    tape, for vertices that need no gradient), and a recorded call's gradient
    equals a fresh one's."""
    rng = np.random.default_rng(33)
    verts, faces, first, count = random_batch(rng, [30, 0, 24], z_range=(1.0, 3.0))
    verts[:, :2] *= 0.4
    size = dict(image_size=(12, 16), faces_per_pixel=2, bin_size=8, z_clip_value=0.6)
    vv, ff, fi, co = to_device(verts, faces, first, count, device)
    ws = wr.ClipWorkspace(num_verts=len(verts), num_faces=len(faces), num_meshes=len(first),
                          static_faces=True, requires_grad=True, device=device,
                          image_size=size["image_size"],
                          faces_per_pixel=2, bin_size=8)  # fmt: skip

    def call():  # (validated once below: a capture may not read back)
        rasterize_meshes(vv, ff, fi, co, workspace=ws, validate=False, **size)

    rasterize_meshes(vv, ff, fi, co, workspace=ws, **size)  # loads the modules too
    held = True  # every face of that call was kept
    if mode == "graph":
        with wp.ScopedCapture(device=device) as capture:
            call()
    behind = verts.copy()
    behind[: len(verts) // 2, 2] -= 1.5  # some faces split or dropped
    poison = 7
    # on CUDA only a captured call may skip (an eager one would read the flag back)
    may_skip = mode == "graph" or wp.get_device(device).is_cpu
    steps = [("front", verts), ("behind", behind), ("front", verts), ("front", verts),
             ("faces", verts), ("front", verts)]  # fmt: skip
    skipped = []
    for name, v in steps:
        if name == "faces":  # the same faces, listed in another order, in place
            faces = faces[::-1].copy()
            ff.assign(faces)
            ws.clip.faces_changed()
            held = False
        vv.assign(v)
        ws.clip.face_case.fill_(poison)
        if mode == "graph":
            wp.capture_launch(capture.graph)
        elif len(skipped) % 2:
            with wp.Tape():  # recorded, but the vertices need no gradient: may skip
                call()
        else:
            call()
        fresh = rasterize_meshes(*to_device(v, faces, first, count, device), **size).numpy()
        got = ws.fragments.numpy()
        for key in ("pix_to_face", "zbuf", "bary_coords", "dists"):
            np.testing.assert_array_equal(got[key], fresh[key], err_msg=f"{name} {key}")
        in_front = bool((v[:, 2] >= size["z_clip_value"]).all())
        ran = not bool((ws.clip.face_case.numpy() == poison).all())
        assert ran != (may_skip and in_front and held), name
        skipped.append(not ran)
        held = in_front
    assert skipped == [may_skip, False, False, may_skip, False, may_skip]
    assert (got["pix_to_face"] >= 0).sum() > 20
    # a recorded call runs the whole pass (its backward replays it): the same
    # gradient as a fresh workspace's
    grads = []
    for w in (ws, None):
        vg = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            out = rasterize_meshes(vg, ff, fi, co, workspace=w, **size)
        tape.backward(grads={out.zbuf: wp.ones(out.zbuf.shape, dtype=wp.float32, device=device)})
        grads.append(vg.grad.numpy())
    scale = np.abs(grads[1]).max()
    assert scale > 0
    if wp.get_device(device).is_cpu:
        np.testing.assert_array_equal(grads[0], grads[1])
    else:  # float atomics add a vertex's terms in another order (~1 ulp seen)
        np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-6 * scale)
