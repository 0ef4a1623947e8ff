"""Interpolation of face-corner and per-vertex attributes over fragments.

Truths used:
* PyTorch3D's ``interpolate_face_attributes`` (reference case r01: values and the
  gradients to the attributes and barycentrics, from real PyTorch3D);
* a float64 NumPy oracle on randomised inputs (values, both gradient formulas);
* the screen-space derivatives: a float64 analytic transcription checked against
  central differences of float64 interpolation at shifted pixel centres, and a
  planar quad whose attribute is linear in view space (closed-form derivative);
* finite differences of the float64 oracle for the gradients to ``verts_ndc``;
* an end-to-end tape (rasterizer + interpolation) against finite differences;
* graph capture (cpu device included: Warp 1.19 captures there too) equal to eager.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster.shading import interpolate_face_attributes, interpolate_vertex_attributes

DATA = Path(__file__).resolve().parent / "data" / "pytorch3d-render"

# float32 unit roundoff.
U32 = 2.0**-24


def _vec(d: int):
    return wp.types.vector(d, wp.float32)


# ----------------------------------------------------------------------------- float64 oracles
def np_interp_rows(p2f, bary, rows):
    """sum_i bary_i * rows[f, i] (rows: (F, 3, D)); zeros where f < 0."""
    f = np.where(p2f < 0, 0, p2f)
    out = np.einsum("nhwki,nhwkid->nhwkd", bary.astype(np.float64), rows.astype(np.float64)[f])
    out[p2f < 0] = 0.0
    return out


def pixel_centres(h: int, w: int):
    """NDC (x, y) of every pixel centre, (H, W, 2) float64 (PyTorch3D's convention)."""
    s = min(h, w)
    xi = np.arange(w, dtype=np.float64)
    yi = np.arange(h, dtype=np.float64)
    # pix_to_ndc(W - 1 - xi): the range of the longer side grows with its aspect.
    x = -(w / s) + (2.0 * (w / s) * (w - 1 - xi) + (w / s)) / w
    y = -(h / s) + (2.0 * (h / s) * (h - 1 - yi) + (h / s)) / h
    return np.stack(np.meshgrid(x, y), axis=-1)


def np_bary(p, v, perspective: bool):
    """float64 barycentrics (area offset 1e-8, perspective-correct as the rasterizer)."""
    v0, v1, v2 = v[..., 0, :], v[..., 1, :], v[..., 2, :]

    def edge(p, a, b):
        return (p[..., 0] - a[..., 0]) * (b[..., 1] - a[..., 1]) - (p[..., 1] - a[..., 1]) * (
            b[..., 0] - a[..., 0]
        )

    area = edge(v2, v0, v1) + 1e-8
    s = np.stack([edge(p, v1, v2), edge(p, v2, v0), edge(p, v0, v1)], -1) / area[..., None]
    if not perspective:
        return s
    z = v[..., :, 2]
    w = s * np.stack([z[..., 1] * z[..., 2], z[..., 0] * z[..., 2], z[..., 0] * z[..., 1]], -1)
    return w / np.maximum(w.sum(-1, keepdims=True), 1e-8)


def np_derivatives(p2f, verts_ndc, ndc_faces, attrs, faces, perspective: bool):
    """Analytic d value / d (column, row) per slot, float64: (N, H, W, K, D) each."""
    n, h, w, k = p2f.shape
    f = np.where(p2f < 0, 0, p2f)
    p = np.broadcast_to(pixel_centres(h, w)[None, :, :, None, :], (n, h, w, k, 2))
    v = verts_ndc.astype(np.float64)[ndc_faces[f]]  # (N, H, W, K, 3, 3)
    a = attrs.astype(np.float64)[faces[f]]  # (N, H, W, K, 3, D)
    v0, v1, v2 = v[..., 0, :], v[..., 1, :], v[..., 2, :]
    area = (
        (v2[..., 0] - v0[..., 0]) * (v1[..., 1] - v0[..., 1])
        - (v2[..., 1] - v0[..., 1]) * (v1[..., 0] - v0[..., 0])
        + 1e-8
    )
    dsx = np.stack([v2[..., 1] - v1[..., 1], v0[..., 1] - v2[..., 1], v1[..., 1] - v0[..., 1]], -1)
    dsy = np.stack([v1[..., 0] - v2[..., 0], v2[..., 0] - v0[..., 0], v0[..., 0] - v1[..., 0]], -1)
    dsx = dsx / area[..., None]
    dsy = dsy / area[..., None]
    if perspective:
        s = np_bary(p, v, False)
        z = v[..., :, 2]
        zz = np.stack([z[..., 1] * z[..., 2], z[..., 0] * z[..., 2], z[..., 0] * z[..., 1]], -1)
        wsum = (s * zz).sum(-1, keepdims=True)
        b = s * zz / wsum
        dsx = (dsx * zz - b * (dsx * zz).sum(-1, keepdims=True)) / wsum
        dsy = (dsy * zz - b * (dsy * zz).sum(-1, keepdims=True)) / wsum
    step = -2.0 / min(h, w)
    ddx = step * np.einsum("...i,...id->...d", dsx, a)
    ddy = step * np.einsum("...i,...id->...d", dsy, a)
    ddx[p2f < 0] = 0.0
    ddy[p2f < 0] = 0.0
    return ddx, ddy


def drop_ill_conditioned(p2f, verts, faces):
    """Marks empty the slots whose perspective denominator sum_i s_i z_j z_k is < 0.2 of
    its scale: far outside the face, where it nears 0 and the derivatives blow up."""
    n, h, w, k = p2f.shape
    f = np.where(p2f < 0, 0, p2f)
    p = np.broadcast_to(pixel_centres(h, w)[None, :, :, None, :], (n, h, w, k, 2))
    v = verts.astype(np.float64)[faces[f]]
    s = np_bary(p, v, False)
    z = v[..., :, 2]
    zz = np.stack([z[..., 1] * z[..., 2], z[..., 0] * z[..., 2], z[..., 0] * z[..., 1]], -1)
    bad = (s * zz).sum(-1) < 0.2 * zz.max(-1)
    return np.where(bad, -1, p2f).astype(np.int32)


def random_scene(rng, n=2, h=5, w=7, k=2, nv=9, nf=6, d=3):
    """Random NDC triangles (area >= 0.2, depth in [1.5, 3]), slots and attributes."""
    verts = np.zeros((nv, 3))
    faces = np.array([rng.choice(nv, 3, replace=False) for _ in range(nf)], np.int32)
    verts[:, :2] = rng.uniform(-1.2, 1.2, (nv, 2))
    verts[:, 2] = rng.uniform(1.5, 3.0, nv)
    # Redraw until every face is well shaped (bounded condition number).
    for fi in range(nf):
        for _ in range(100):
            v = verts[faces[fi]]
            a = (v[2, 0] - v[0, 0]) * (v[1, 1] - v[0, 1]) - (v[2, 1] - v[0, 1]) * (
                v[1, 0] - v[0, 0]
            )
            if abs(a) > 0.2:
                break
            faces[fi] = rng.choice(nv, 3, replace=False)
    p2f = rng.integers(-1, nf, (n, h, w, k)).astype(np.int32)
    p2f = drop_ill_conditioned(p2f, verts, faces)
    bary = rng.uniform(-0.2, 1.0, (n, h, w, k, 3)).astype(np.float32)
    attrs = rng.normal(size=(nv, d)).astype(np.float32)
    return verts.astype(np.float32), faces, p2f, bary, attrs


# ----------------------------------------------------------------------------- PyTorch3D parity
def test_r01_values_and_gradients_match_pytorch3d(device):
    d = np.load(DATA / "r01_interpolate_ico1_k4_d5.npz")
    fa = wp.array(d["face_attributes"], dtype=wp.float32, device=device, requires_grad=True)
    p2f = wp.array(d["pix_to_face"].astype(np.int32), dtype=wp.int32, device=device)
    bary = wp.array(d["bary_coords"], dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = interpolate_face_attributes(p2f, bary, fa)
    assert out.shape == d["pix_to_face"].shape and wp.types.types_equal(out.dtype, _vec(5))
    # Same three float32 products summed in the same order as PyTorch3D: bit-equal
    # here; 1 ulp of slack in case a compiler reorders the sum.
    np.testing.assert_allclose(out.numpy(), d["pixel_attributes"], rtol=0, atol=4 * U32 * 8)
    out.grad.assign(d["grad_pixel_attributes"])
    tape.backward()
    # grad_face_attributes: each element sums <= H*W*K float32 products in another
    # order than PyTorch3D (atomics): bound (n-1)*U*sum|terms|, here << 1e-5
    # relative to the largest entry; grad_bary: a D = 5 term dot product.
    g_fa, g_b = d["grad_face_attributes"], d["grad_bary_coords"]
    assert np.abs(fa.grad.numpy() - g_fa).max() <= 1e-5 * np.abs(g_fa).max()
    assert np.abs(bary.grad.numpy().reshape(g_b.shape) - g_b).max() <= 1e-5 * np.abs(g_b).max()


def test_numpy_inputs_and_empty_slots_give_zeros():
    d = np.load(DATA / "r01_interpolate_ico1_k4_d5.npz")
    out = interpolate_face_attributes(d["pix_to_face"], d["bary_coords"], d["face_attributes"])
    o = out.numpy()
    assert o.shape == d["pixel_attributes"].shape
    assert (o[d["pix_to_face"] < 0] == 0).all()
    np.testing.assert_allclose(o, d["pixel_attributes"], rtol=0, atol=4 * U32 * 8)


def test_vector_typed_attributes_receive_gradients(device):
    """A (F, 3) vector(D) array with requires_grad gets its gradient in place."""
    rng = np.random.default_rng(1)
    _, _, p2f, bary, _ = random_scene(rng, nf=6)
    fa_np = rng.normal(size=(6, 3, 5)).astype(np.float32)
    fa = wp.array(fa_np, dtype=_vec(5), device=device, requires_grad=True)
    wbary = wp.array(bary, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = interpolate_face_attributes(wp.array(p2f, dtype=wp.int32, device=device), wbary, fa)
    g = rng.normal(size=out.numpy().shape).astype(np.float32)
    out.grad.assign(g)
    tape.backward()
    np.testing.assert_allclose(out.numpy(), np_interp_rows(p2f, bary, fa_np), atol=1e-5)
    # d/d rows[f, i, :] = sum over slots with face f of bary_i * g (float64 oracle).
    want = np.zeros((6, 3, 5))
    valid = p2f >= 0
    np.add.at(want, p2f[valid], bary[valid][:, :, None] * g[valid][:, None, :])
    np.testing.assert_allclose(fa.grad.numpy(), want, rtol=1e-5, atol=1e-5)
    gb = np.einsum(
        "skd,sd->sk", fa_np[np.where(p2f < 0, 0, p2f)].reshape(-1, 3, 5), g.reshape(-1, 5)
    )
    gb[p2f.reshape(-1) < 0] = 0
    np.testing.assert_allclose(wbary.grad.numpy().reshape(-1, 3), gb, rtol=1e-5, atol=1e-5)
    tape.zero()


# ----------------------------------------------------------------------------- vertex form
@pytest.mark.parametrize("persp", [True, False])
def test_vertex_form_matches_float64_oracle(device, persp):
    rng = np.random.default_rng(2)
    verts, faces, p2f, bary, attrs = random_scene(rng, d=4)
    wa = wp.array(attrs, dtype=wp.float32, device=device, requires_grad=True)
    wb = wp.array(bary, dtype=wp.vec3, device=device, requires_grad=True)
    wv = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    wpf = wp.array(p2f, dtype=wp.int32, device=device)
    tape = wp.Tape()
    with tape:
        val, ddx, ddy = interpolate_vertex_attributes(
            wpf, wb, wa, faces, verts_ndc=wv, perspective_correct=persp
        )
    # Values: a 3-term float32 dot product with |terms| <= ~4: abs error < 1e-6.
    np.testing.assert_allclose(val.numpy(), np_interp_rows(p2f, bary, attrs[faces]), atol=1e-5)
    ox, oy = np_derivatives(p2f, verts, faces, attrs, faces, persp)
    # Derivatives: ~30 float32 operations on coordinates of size ~1 with face areas
    # >= 0.2 (bounded conditioning): relative error ~1e-6; 1e-4 of the scale is safe.
    scale = max(np.abs(ox).max(), np.abs(oy).max())
    np.testing.assert_allclose(ddx.numpy(), ox, atol=1e-4 * scale)
    np.testing.assert_allclose(ddy.numpy(), oy, atol=1e-4 * scale)

    # Gradients: loss = <gv, val> + <gx, ddx> + <gy, ddy>; finite differences of
    # the float64 oracle (central, h = 1e-6: truncation ~1e-10, cancellation ~1e-9).
    gv, gx, gy = (rng.normal(size=val.numpy().shape) for _ in range(3))
    val.grad.assign(gv.astype(np.float32))
    ddx.grad.assign(gx.astype(np.float32))
    ddy.grad.assign(gy.astype(np.float32))
    tape.backward()

    def loss(v64, a64, b64):
        ox, oy = np_derivatives(p2f, v64, faces, a64, faces, persp)
        return (gv * np_interp_rows(p2f, b64, a64[faces])).sum() + (gx * ox).sum() + (gy * oy).sum()

    def fd(x, fn, idx, h=1e-6):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        return (fn(xp) - fn(xm)) / (2 * h)

    v64, a64, b64 = verts.astype(np.float64), attrs.astype(np.float64), bary.astype(np.float64)
    gvn = np.array(
        [
            [fd(v64, lambda v: loss(v, a64, b64), (i, j)) for j in range(3)]
            for i in range(len(verts))
        ]
    )
    gan = np.array(
        [
            [fd(a64, lambda a: loss(v64, a, b64), (i, j)) for j in range(attrs.shape[1])]
            for i in range(len(attrs))
        ]
    )
    # float32 adjoint vs float64 FD: per-element sums of a few hundred terms whose
    # magnitudes reach ~1e2 (1/area factors): 1e-3 of the largest entry.
    assert np.abs(wv.grad.numpy() - gvn).max() <= 1e-3 * np.abs(gvn).max()
    assert np.abs(wa.grad.numpy() - gan).max() <= 1e-3 * np.abs(gan).max()
    gb = np.einsum(
        "...id,...d->...i", attrs.astype(np.float64)[faces[np.where(p2f < 0, 0, p2f)]], gv
    )
    gb[p2f < 0] = 0.0
    np.testing.assert_allclose(wb.grad.numpy(), gb, atol=1e-4 * np.abs(gb).max())


def test_derivative_oracle_matches_central_differences():
    """The analytic float64 transcription equals numeric d/dx of float64 interpolation."""
    rng = np.random.default_rng(3)
    verts, faces, p2f, _, attrs = random_scene(rng, n=1, h=4, w=6, k=2)
    p2f = np.where(p2f < 0, 0, p2f)
    p2f = drop_ill_conditioned(p2f, verts, faces)
    assert (p2f >= 0).sum() > 10
    for persp in (False, True):
        ox, oy = np_derivatives(p2f, verts, faces, attrs, faces, persp)
        n, h, w, k = p2f.shape
        p = np.broadcast_to(pixel_centres(h, w)[None, :, :, None, :], (n, h, w, k, 2)).copy()
        f = np.where(p2f < 0, 0, p2f)
        v = verts.astype(np.float64)[faces[f]]
        a = attrs.astype(np.float64)[faces[f]]
        px = 2.0 / min(h, w)  # one pixel in NDC
        e = 1e-4
        vals = []
        for dx, dy in ((e, 0), (-e, 0), (0, e), (0, -e)):
            q = p + np.array([-dx * px, -dy * px])  # column right = -X, row down = -Y
            vals.append(np.einsum("...i,...id->...d", np_bary(q, v, persp), a))
        m = p2f >= 0
        # Central differences, step 1e-4 pixel: truncation error ~1e-8 relative.
        np.testing.assert_allclose(ox[m], ((vals[0] - vals[1]) / (2 * e))[m], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(oy[m], ((vals[2] - vals[3]) / (2 * e))[m], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("size", [(16, 16), (12, 20)])
def test_planar_quad_derivatives_are_analytic(device, size):
    """A tilted quad seen by a pinhole; attribute = view-space X, a linear field.

    Perspective-correct barycentrics interpolate it exactly, so at NDC (x, y) the
    value is X = x Z / f with Z = d / (n . (x / f, y / f, 1)) on the plane n . P = d,
    and d/dx_ndc X has a closed form; per pixel column: times -2 / min(H, W).
    """
    h, w = size
    f = 1.5
    nrm = np.array([0.3, -0.2, 1.0])
    dpl = 3.0
    corners = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    view = np.column_stack([corners[:, 0], corners[:, 1], np.ones(4)])
    view = view * (dpl / (view @ nrm))[:, None]  # points of the plane along those rays
    ndc = np.column_stack([f * view[:, 0] / view[:, 2], f * view[:, 1] / view[:, 2], view[:, 2]])
    ndc = ndc.astype(np.float32)
    faces = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    attrs = view[:, :1].astype(np.float32)  # X
    frags = wr.rasterize_meshes(
        ndc, faces, [0], [2], image_size=size, faces_per_pixel=1, perspective_correct=True
    )
    val, ddx, ddy = interpolate_vertex_attributes(
        frags.pix_to_face, frags.bary_coords, attrs, faces, verts_ndc=ndc
    )
    p2f = frags.pix_to_face.numpy()
    assert (p2f >= 0).sum() > 0.5 * h * w
    p = pixel_centres(h, w)
    x, y = p[..., 0] / f, p[..., 1] / f
    den = nrm[0] * x + nrm[1] * y + nrm[2]
    zz = dpl / den
    xx = x * zz
    d_dxn = zz / f + x * (-dpl * (nrm[0] / f) / den**2)  # d X / d x_ndc
    d_dyn = x * (-dpl * (nrm[1] / f) / den**2)
    step = -2.0 / min(h, w)
    m = p2f[0, :, :, 0] >= 0
    # float32 rasterizer barycentrics and float32 derivative arithmetic on values
    # of size ~1: 1e-5 relative is ~100 ulp of margin.
    np.testing.assert_allclose(val.numpy()[0, :, :, 0, 0][m], xx[m], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ddx.numpy()[0, :, :, 0, 0][m], step * d_dxn[m], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ddy.numpy()[0, :, :, 0, 0][m], step * d_dyn[m], rtol=1e-4, atol=1e-6)


def test_orthographic_linear_attribute_has_constant_derivatives(device):
    """Without perspective an attribute affine in NDC has d/dx = -p * 2/min(H, W) everywhere."""
    h, w = 10, 14
    ndc = np.array(
        [[-1.5, -1.1, 2.0], [1.6, -1.2, 2.5], [1.5, 1.2, 3.0], [-1.4, 1.1, 2.2]], np.float32
    )
    faces = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    pq = np.array([[0.7, -1.3], [2.0, 0.5]])
    attrs = (ndc[:, :2].astype(np.float64) @ pq.T + np.array([0.25, -1.0])).astype(np.float32)
    frags = wr.rasterize_meshes(ndc, faces, [0], [2], image_size=(h, w), faces_per_pixel=1)
    _, ddx, ddy = interpolate_vertex_attributes(
        frags.pix_to_face,
        frags.bary_coords,
        attrs,
        faces,
        verts_ndc=ndc,
        perspective_correct=False,
    )
    m = frags.pix_to_face.numpy()[0, :, :, 0] >= 0
    step = -2.0 / min(h, w)
    for c in range(2):
        # Constant per face up to float32 rounding of the edge terms (~1e-6 relative).
        np.testing.assert_allclose(ddx.numpy()[0, :, :, 0, c][m], step * pq[c, 0], rtol=1e-5)
        np.testing.assert_allclose(ddy.numpy()[0, :, :, 0, c][m], step * pq[c, 1], rtol=1e-5)


def test_gradients_reach_vertices_through_the_rasterizer(device):
    """Tape: rasterize -> interpolate; d loss / d verts vs central differences (pix_to_face fixed).

    One large triangle: no pixel centre is within the step of an edge, so the
    coverage does not change under the perturbation.
    """
    verts = np.array([[-0.9, -0.8, 2.0], [0.85, -0.7, 2.6], [0.1, 0.9, 3.1]], np.float32)
    faces = np.array([[0, 1, 2]], np.int32)
    attrs = np.array([[0.2, 1.0], [0.9, -0.5], [-0.4, 0.3]], np.float32)
    rng = np.random.default_rng(4)
    size = (8, 8)

    def run(v, record):
        wv = wp.array(v, dtype=wp.vec3, device=device, requires_grad=record)
        tape = wp.Tape()
        with tape:
            frags = wr.rasterize_meshes(
                wv, faces, [0], [1], image_size=size, faces_per_pixel=1, perspective_correct=True
            )
            val = interpolate_vertex_attributes(frags.pix_to_face, frags.bary_coords, attrs, faces)
        return wv, tape, val, frags

    wv, tape, val, frags = run(verts, True)
    g = rng.normal(size=val.numpy().shape).astype(np.float32)
    val.grad.assign(g)
    tape.backward()
    base_cover = frags.pix_to_face.numpy()
    # float64 recompute of the same fragments (pix_to_face fixed) for the FD.
    p = pixel_centres(*size)[None, :, :, None, :]
    a = attrs.astype(np.float64)[faces[0]]

    def loss(v64):
        b = np_bary(p, np.broadcast_to(v64[faces[0]], p.shape[:-1] + (3, 3)), True)
        vals = np.einsum("...i,...id->...d", b, a)
        vals[base_cover < 0] = 0.0
        return (vals * g).sum()

    v64 = verts.astype(np.float64)
    num = np.zeros_like(v64)
    for i in range(3):
        for j in range(3):
            hp, hm = v64.copy(), v64.copy()
            hp[i, j] += 1e-6
            hm[i, j] -= 1e-6
            num[i, j] = (loss(hp) - loss(hm)) / 2e-6
    # float32 rasterizer + interpolation adjoint vs float64 FD: 1e-3 relative.
    assert np.abs(wv.grad.numpy() - num).max() <= 1e-3 * np.abs(num).max()


# ----------------------------------------------------------------------------- capture
def test_preallocated_outputs_capture(device):
    """The out= path allocates nothing: captured once, replayed with new attributes."""
    rng = np.random.default_rng(5)
    verts, faces, p2f, bary, attrs = random_scene(rng, d=3)
    wa = wp.array(attrs, dtype=wp.float32, device=device)
    wpf = wp.array(p2f, dtype=wp.int32, device=device)
    wb = wp.array(bary, dtype=wp.vec3, device=device)
    wv = wp.array(verts, dtype=wp.vec3, device=device)
    wf = wp.array(faces, dtype=wp.int32, device=device)
    outs = [wp.zeros(p2f.shape, dtype=wp.vec3, device=device) for _ in range(3)]
    kw = dict(verts_ndc=wv, out=outs[0], out_dx=outs[1], out_dy=outs[2], validate=False)
    interpolate_vertex_attributes(wpf, wb, wa, wf, **kw)  # loads the module
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        interpolate_vertex_attributes(wpf, wb, wa, wf, **kw)
    attrs2 = rng.normal(size=attrs.shape).astype(np.float32)
    wa.assign(attrs2)
    for o in outs:
        o.zero_()
    wp.capture_launch(cap.graph)
    got = [o.numpy().copy() for o in outs]
    eager = interpolate_vertex_attributes(wpf, wb, attrs2, faces, verts_ndc=verts)
    for a, b in zip(got, eager, strict=True):
        np.testing.assert_array_equal(a, b.numpy())


# ----------------------------------------------------------------------------- bad input
def test_bad_input_names_the_argument():
    d = np.load(DATA / "r01_interpolate_ico1_k4_d5.npz")
    p2f, bary, fa = d["pix_to_face"], d["bary_coords"], d["face_attributes"]
    with pytest.raises(ValueError, match="face_attributes"):
        interpolate_face_attributes(p2f, bary, fa[:, :2])
    with pytest.raises(ValueError, match="bary_coords"):
        interpolate_face_attributes(p2f, bary[..., :2], fa)
    with pytest.raises(TypeError, match="pix_to_face"):
        interpolate_face_attributes(p2f.astype(np.float32), bary, fa)
    with pytest.raises(ValueError, match="pix_to_face"):
        interpolate_face_attributes(p2f - 5, bary, fa)
    with pytest.raises(ValueError, match="pix_to_face holds face"):
        interpolate_face_attributes(p2f, bary, fa[:10])
    with pytest.raises(ValueError, match="out"):
        interpolate_face_attributes(p2f, bary, fa, out=wp.zeros(p2f.shape, dtype=wp.vec3))
    with pytest.raises(ValueError, match="faces"):
        interpolate_vertex_attributes(p2f, bary, np.zeros((5, 2)), np.array([[0, 1, 9]]))
    with pytest.raises(TypeError, match="attributes"):
        interpolate_vertex_attributes(p2f, bary, wp.zeros((5, 2), dtype=wp.int32), [[0, 1, 2]])
