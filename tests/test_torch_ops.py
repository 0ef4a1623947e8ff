"""The functional shading ops on tensors (``warpraster.torch.ops``): parity with PyTorch3D,
float64 plain-torch references with ``torch.autograd.grad``, opcheck, torch.compile, errors.

Everything runs on the cpu device with tiny shapes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from warpraster.torch import normals, ops, uv_sampling

DATA = Path(os.environ.get("WARPRASTER_P3D_RENDER_DIR", Path(__file__).parent / "data" /
                           "pytorch3d-render"))  # fmt: skip
RENDER_CASES = sorted(p.name for p in DATA.glob("r0[2-9]_*.npz"))
EPS = 1e-8  # the rasterizer's barycentric EPS (warpraster.geometry.EPS)


def _t(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x))


def _fragments(n=2, h=4, w=6, k=2, num_faces=5, seed=0, empty=0.3):
    """Random fragments: faces in [0, num_faces) with a share of empty (-1) slots."""
    gen = torch.Generator().manual_seed(seed)
    p2f = torch.randint(0, num_faces, (n, h, w, k), generator=gen)
    p2f[torch.rand((n, h, w, k), generator=gen) < empty] = -1
    bary = torch.rand((n, h, w, k, 3), generator=gen, dtype=torch.float64)
    bary = bary / bary.sum(-1, keepdim=True)
    return p2f, bary


def _grads(out, inputs, upstream):
    return torch.autograd.grad((out * upstream).sum(), inputs, allow_unused=True)


def _close(got, want, rel, what):
    """|got - want| <= rel * max|want| (elementwise, in float64)."""
    got = got.detach().double()
    want = want.detach().double()
    scale = max(float(want.abs().max()), 1e-30) if want.numel() else 1.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel:g} * {scale:.3g}"


# ============================================================================= PyTorch3D files
def test_interpolate_face_attributes_matches_pytorch3d_values_and_gradients():
    d = np.load(DATA / "r01_interpolate_ico1_k4_d5.npz", allow_pickle=False)
    p2f = _t(d["pix_to_face"])  # int64, as PyTorch3D hands it out
    bary = _t(d["bary_coords"]).requires_grad_(True)
    attrs = _t(d["face_attributes"]).requires_grad_(True)
    out = ops.interpolate_face_attributes(p2f, bary, attrs)
    # Same float32 products b_i * a_i summed in the same order: at most a rounding
    # of each of the three terms apart (values are O(1): 1e-6 absolute).
    torch.testing.assert_close(out, _t(d["pixel_attributes"]), rtol=0, atol=1e-6)
    g_bary, g_attrs = _grads(out, (bary, attrs), _t(d["grad_pixel_attributes"]))
    # d/d attrs: per-corner sums of up to ~H*W*K/F products, accumulated in another
    # order than PyTorch3D's; float32 sums of O(1) terms: 1e-5 of the largest.
    _close(g_attrs, _t(d["grad_face_attributes"]), 1e-5, "grad_face_attributes")
    # d/d bary: a D=5 dot product per slot, summed in another order: 1e-6 of the largest
    # (a few float32 roundings of O(1) terms).
    _close(g_bary, _t(d["grad_bary_coords"]), 1e-6, "grad_bary_coords")


@pytest.mark.parametrize("case", RENDER_CASES)
def test_normals_match_pytorch3d_meshes(case):
    d = np.load(DATA / case, allow_pickle=False)
    verts, faces = _t(d["verts_packed"]), _t(d["faces_packed"])
    # Unit vectors from float32 cross products (the vertex sums atomically added in
    # another order than PyTorch3D's index_add): a few float32 ulps of 1 -> 2e-6.
    torch.testing.assert_close(ops.face_normals(verts, faces), _t(d["faces_normals_packed"]),
                               rtol=0, atol=2e-6)  # fmt: skip
    torch.testing.assert_close(ops.vertex_normals(verts, faces), _t(d["verts_normals_packed"]),
                               rtol=0, atol=2e-6)  # fmt: skip


# ============================================================================= float64 references
def _ref_face_interp(p2f, bary, attrs):
    """PyTorch3D's formula in plain torch: sum_i bary_i * attrs[f, i], zeros where f < 0."""
    valid = p2f >= 0
    corner = attrs[p2f.clamp(min=0)]  # (N, H, W, K, 3, D)
    vals = (bary[..., None] * corner).sum(-2)
    return torch.where(valid[..., None], vals, torch.zeros((), dtype=vals.dtype))


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_interpolate_face_attributes_matches_float64_reference(index_dtype):
    p2f, bary64 = _fragments()
    p2f[0, 0, 0, 0] = -7  # any negative is empty, as in PyTorch3D
    gen = torch.Generator().manual_seed(1)
    attrs64 = torch.randn((5, 3, 3), generator=gen, dtype=torch.float64)
    up = torch.randn((*p2f.shape, 3), generator=gen, dtype=torch.float64)
    bary64.requires_grad_(True)
    attrs64.requires_grad_(True)
    ref = _ref_face_interp(p2f, bary64, attrs64)
    r_bary, r_attrs = _grads(ref, (bary64, attrs64), up)

    bary = bary64.detach().float().requires_grad_(True)
    attrs = attrs64.detach().float().requires_grad_(True)
    out = ops.interpolate_face_attributes(p2f.to(index_dtype), bary, attrs)
    assert out.dtype == torch.float32 and out.shape == (*p2f.shape, 3)
    assert torch.all(out[p2f < 0] == 0)
    g_bary, g_attrs = _grads(out, (bary, attrs), up.float())
    # float32 inputs rounded (2^-24 relative) and three-term float32 sums: 1e-6 of the
    # largest; gradients are sums of up to ~20 such products: 2e-6.
    _close(out, ref, 1e-6, "values")
    _close(g_bary, r_bary, 2e-6, "grad bary")
    _close(g_attrs, r_attrs, 2e-6, "grad attributes")

    # float64 inputs: cast inside (differentiable), gradients come back as float64.
    out64 = ops.interpolate_face_attributes(p2f, bary64, attrs64)
    g64 = _grads(out64, (bary64, attrs64), up)
    assert g64[0].dtype == torch.float64 and g64[1].dtype == torch.float64
    _close(g64[1], r_attrs, 2e-6, "grad attributes (float64 inputs)")


def _pixel_ndc(h, w):
    """NDC (X, Y) of every pixel centre, (H, W, 2) float64 (PyTorch3D: +X left, +Y up,
    the shorter side spans [-1, 1])."""

    def axis(s1, s2):
        ratio = s1 / s2 if s1 > s2 else 1.0
        i = torch.arange(s1 - 1, -1, -1, dtype=torch.float64)  # counted from the +NDC end
        return -ratio + (2.0 * ratio * i + ratio) / s1

    ys, xs = axis(h, w), axis(w, h)
    return torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1)  # (H, W, 2)


def _ref_bary_at(p, tri, perspective):
    """Barycentrics of NDC points p (..., 2) in triangles tri (..., 3, 3): the
    rasterizer's definition (area offset by EPS; perspective-corrected with z)."""

    def edge(q, a, b):
        return (q[..., 0] - a[..., 0]) * (b[..., 1] - a[..., 1]) - (q[..., 1] - a[..., 1]) * (
            b[..., 0] - a[..., 0]
        )

    v0, v1, v2 = tri[..., 0, :], tri[..., 1, :], tri[..., 2, :]
    area = edge(v2, v0, v1) + EPS
    s = torch.stack([edge(p, v1, v2), edge(p, v2, v0), edge(p, v0, v1)], -1) / area[..., None]
    if not perspective:
        return s
    z = tri[..., 2]
    zz = torch.stack([z[..., 1] * z[..., 2], z[..., 0] * z[..., 2], z[..., 0] * z[..., 1]], -1)
    wgt = s * zz
    return wgt / wgt.sum(-1, keepdim=True).clamp(min=EPS)


def _ref_vertex_interp(p2f, bary, attrs, faces, verts_ndc, ndc_faces, perspective):
    """Values and screen derivatives in float64 plain torch; the derivatives by autograd
    of the slot's value as a function of its pixel position (an independent route to
    the kernel's analytic formula)."""
    n, h, w, k = p2f.shape
    valid = (p2f >= 0)[..., None]
    f = p2f.clamp(min=0)
    corner = attrs[faces[f]]  # (N, H, W, K, 3, D)
    vals = torch.where(valid, (bary[..., None] * corner).sum(-2), 0.0)
    pix = _pixel_ndc(h, w)[None, :, :, None, :].expand(n, h, w, k, 2).clone().requires_grad_(True)
    tri = verts_ndc[ndc_faces[f]]  # (N, H, W, K, 3, 3)
    b = _ref_bary_at(pix, tri, perspective)
    val_p = (b[..., None] * corner).sum(-2)  # the value the slot's face has at p
    d = attrs.shape[1]
    dx, dy = [], []
    for c in range(d):  # d value_c / d (X, Y): each slot's value depends on its own p only
        (gp,) = torch.autograd.grad(val_p[..., c].sum(), pix, create_graph=True)
        dx.append(gp[..., 0])
        dy.append(gp[..., 1])
    step = -2.0 / min(h, w)  # one pixel right / down = -2/min(H, W) NDC in X / Y
    ddx = torch.where(valid, step * torch.stack(dx, -1), 0.0)
    ddy = torch.where(valid, step * torch.stack(dy, -1), 0.0)
    return vals, ddx, ddy


def _big_triangles(num_faces, gen):
    """verts_ndc of faces that each contain the whole (non-square) screen, z in [1, 2]:
    every pixel centre is inside, so the perspective sum is well away from its clamp."""
    base = torch.tensor([[-4.0, -4.0], [8.0, -4.0], [-4.0, 8.0]], dtype=torch.float64)
    xy = base + 0.5 * torch.rand((num_faces, 3, 2), generator=gen, dtype=torch.float64)
    xy[1::2] = xy[1::2].flip(1)  # both windings
    z = 1.0 + torch.rand((num_faces, 3, 1), generator=gen, dtype=torch.float64)
    return torch.cat([xy, z], -1).reshape(-1, 3)


@pytest.mark.parametrize("perspective", [True, False])
def test_interpolate_vertex_attributes_with_derivatives_matches_float64_reference(perspective):
    num_faces, num_attr_rows, d = 5, 6, 3
    p2f, bary64 = _fragments(num_faces=num_faces, seed=2)
    gen = torch.Generator().manual_seed(3)
    attrs64 = torch.randn((num_attr_rows, d), generator=gen, dtype=torch.float64)
    faces = torch.randint(0, num_attr_rows, (num_faces, 3), generator=gen)
    ndc64 = _big_triangles(num_faces, gen)
    ndc_faces = torch.arange(3 * num_faces).reshape(num_faces, 3).flip(0).contiguous()
    ups = [torch.randn((*p2f.shape, d), generator=gen, dtype=torch.float64) for _ in range(3)]
    leaves64 = [bary64, attrs64, ndc64]
    for t in leaves64:
        t.requires_grad_(True)
    ref = _ref_vertex_interp(p2f, bary64, attrs64, faces, ndc64, ndc_faces, perspective)
    loss = sum((r * u).sum() for r, u in zip(ref, ups, strict=True))
    r_grads = torch.autograd.grad(loss, leaves64)

    leaves = [t.detach().float().requires_grad_(True) for t in leaves64]
    out = ops.interpolate_vertex_attributes(
        p2f, leaves[0], leaves[1], faces.to(torch.int32), verts_ndc=leaves[2],
        ndc_faces=ndc_faces, perspective_correct=perspective,
    )  # fmt: skip
    loss = sum((o * u.float()).sum() for o, u in zip(out, ups, strict=True))
    grads = torch.autograd.grad(loss, leaves)
    # Values: as the face interpolation (1e-6 of the largest). Derivatives: ratios of
    # float32 differences of O(1..10) coordinates over an area ~70 (cancellation in
    # the edge functions costs a few ulps of 10): 1e-5 of the largest. Gradients: sums
    # of up to ~50 such terms: 2e-5 of the largest.
    for name, o, r in zip(("values", "d/dx", "d/dy"), out, ref, strict=True):
        _close(o, r, 1e-5 if name != "values" else 1e-6, name)
    for name, g, r in zip(("bary", "attributes", "verts_ndc"), grads, r_grads, strict=True):
        _close(g, r, 2e-5, f"grad {name}")
    assert float(grads[2].abs().max()) > 0  # the derivative outputs reach verts_ndc

    # Without verts_ndc: values only, the same as with.
    values = ops.interpolate_vertex_attributes(p2f, leaves[0], leaves[1], faces)
    torch.testing.assert_close(values, out[0], rtol=0, atol=0)


def _ref_face_normals(verts, faces):
    v0, v1, v2 = verts[faces[:, 0]], verts[faces[:, 1]], verts[faces[:, 2]]
    n = torch.linalg.cross(v1 - v0, v2 - v0)
    return n / n.norm(dim=1, keepdim=True).clamp(min=1e-6)


def _ref_vertex_normals(verts, faces):
    sums = torch.zeros_like(verts)
    for c in range(3):  # corner c: vertex i followed by j, k in the face's order
        i, j, kk = faces[:, c], faces[:, (c + 1) % 3], faces[:, (c + 2) % 3]
        sums = sums.index_add(0, i, torch.linalg.cross(verts[j] - verts[i], verts[kk] - verts[i]))
    return sums / sums.norm(dim=1, keepdim=True).clamp(min=1e-6)


def test_normals_match_float64_reference_with_gradients():
    gen = torch.Generator().manual_seed(4)
    verts64 = torch.randn((8, 3), generator=gen, dtype=torch.float64)
    # vertex 7 is in no face (normal 0, gradient 0).
    faces = torch.tensor([[0, 1, 2], [0, 2, 3], [3, 4, 5], [4, 3, 6], [1, 5, 6], [2, 6, 0]])
    for name, op, ref_fn, rows in (
        ("face", ops.face_normals, _ref_face_normals, faces.shape[0]),
        ("vertex", ops.vertex_normals, _ref_vertex_normals, verts64.shape[0]),
    ):
        up = torch.randn((rows, 3), generator=gen, dtype=torch.float64)
        v64 = verts64.clone().requires_grad_(True)
        ref = ref_fn(v64, faces)
        (r_grad,) = _grads(ref, (v64,), up)
        v = verts64.float().requires_grad_(True)
        out = op(v, faces)
        (g,) = _grads(out, (v,), up.float())
        # Unit vectors from float32 crosses of O(1) edges: 1e-6; gradients (1/|n| times
        # O(1) terms, |n| >= ~0.1 here, summed over <= 4 faces per vertex): 1e-5.
        _close(out, ref, 1e-6, f"{name} normals")
        _close(g, r_grad, 1e-5, f"{name} normals gradient")
    assert torch.all(ops.vertex_normals(verts64, faces)[7] == 0)
    # A degenerate face (a repeated vertex): normal 0 (the clamped norm), gradient finite.
    # (Its exact gradient cancels; in float32 the cancelling terms are 1e6-scaled, so
    # only finiteness is a fair check there, as for any float32 implementation.)
    v = verts64.float().requires_grad_(True)
    degenerate = torch.tensor([[4, 4, 6]])
    n = ops.face_normals(v, degenerate)
    assert torch.all(n == 0)
    n.sum().backward()
    assert torch.isfinite(v.grad).all()


def _ref_sample_uv(p2f, bary, maps, faces_uvs, verts_uvs, padding, align, mode):
    """PyTorch3D's TexturesUV.sample_textures in plain torch (grid_sample on the map
    flipped in v), with empty slots set to zero."""
    n, h, w, k = p2f.shape
    uv = _ref_face_interp(p2f, bary, verts_uvs[faces_uvs])  # (N, H, W, K, 2)
    grid = uv.permute(0, 3, 1, 2, 4).reshape(n * k, h, w, 2) * 2.0 - 1.0
    m = maps.expand(n, -1, -1, -1).permute(0, 3, 1, 2).flip(2)  # (N, C, Ht, Wt), v up
    m = m[:, None].expand(-1, k, -1, -1, -1).reshape(n * k, *m.shape[1:])
    tex = F.grid_sample(m, grid, mode=mode, padding_mode=padding, align_corners=align)
    tex = tex.reshape(n, k, -1, h, w).permute(0, 3, 4, 1, 2)
    return torch.where((p2f >= 0)[..., None], tex, 0.0)


UV_CASES = [
    ("border", True, "bilinear", 2),  # PyTorch3D's defaults, one map per image
    ("reflection", False, "bilinear", 1),  # one map shared by both images
    ("zeros", False, "bilinear", 2),
    ("border", False, "nearest", 2),
]


@pytest.mark.parametrize("padding,align,mode,num_maps", UV_CASES)
def test_sample_textures_uv_matches_float64_grid_sample(padding, align, mode, num_maps):
    num_faces, num_uvs = 5, 7
    p2f, bary64 = _fragments(num_faces=num_faces, seed=5)
    gen = torch.Generator().manual_seed(6)
    maps64 = torch.rand((num_maps, 5, 8, 3), generator=gen, dtype=torch.float64)
    # UVs partly outside [0, 1] so the padding mode matters.
    uvs64 = torch.rand((num_uvs, 2), generator=gen, dtype=torch.float64) * 1.6 - 0.3
    faces_uvs = torch.randint(0, num_uvs, (num_faces, 3), generator=gen)
    up = torch.randn((*p2f.shape, 3), generator=gen, dtype=torch.float64)
    leaves64 = [bary64, maps64, uvs64]
    for t in leaves64:
        t.requires_grad_(True)
    ref = _ref_sample_uv(p2f, bary64, maps64, faces_uvs, uvs64, padding, align, mode)
    r_grads = _grads(ref, leaves64, up)

    leaves = [t.detach().float().requires_grad_(True) for t in leaves64]
    out = ops.sample_textures_uv(p2f, leaves[0], leaves[1], faces_uvs, leaves[2],
                                 padding_mode=padding, align_corners=align,
                                 sampling_mode=mode)  # fmt: skip
    grads = _grads(out, leaves, up.float())
    # Bilinear weights from float32 UVs (2^-24 relative, times <= 8 texels per unit)
    # of O(1) texels: 1e-6 of the largest value. Gradients to the UVs are texel
    # differences times the map size, summed over up to ~20 slots per UV: 1e-5;
    # random UVs keep every tap away from texel boundaries (where the float32 and
    # float64 floors could differ) by far more than that rounding.
    _close(out, ref, 1e-6, "texels")
    for name, g, r in zip(("bary", "maps", "verts_uvs"), grads, r_grads, strict=True):
        if r is None:
            r = torch.zeros_like(g)
        _close(g, r, 1e-5, f"grad {name}")


# ============================================================================= opcheck
def _op_cases():
    p2f, bary64 = _fragments(n=1, h=3, w=4, k=2, num_faces=4, seed=7)
    p2f = p2f.to(torch.int32)
    bary = bary64.float()
    gen = torch.Generator().manual_seed(8)
    attrs = torch.randn((4, 3, 2), generator=gen)
    vattrs = torch.randn((5, 2), generator=gen)
    faces = torch.randint(0, 5, (4, 3), generator=gen, dtype=torch.int32)
    ndc = _big_triangles(4, gen).float()
    ndc_faces = torch.arange(12, dtype=torch.int32).reshape(4, 3)
    verts = torch.randn((5, 3), generator=gen)
    maps = torch.rand((1, 4, 4, 3), generator=gen)
    uvs = torch.rand((5, 2), generator=gen)
    slots = (*p2f.shape,)

    def g(*shape):
        return torch.randn(shape, generator=gen)

    return [
        (ops._interp_face_op, (p2f, bary, attrs)),
        (ops._interp_face_backward_op, (g(*slots, 2), [True, True], p2f, bary, attrs)),
        (ops._interp_face_backward_op, (g(*slots, 2), [False, True], p2f, bary, attrs)),
        (ops._interp_vert_op, (p2f, bary, vattrs, faces, None, None, True)),
        (ops._interp_vert_op, (p2f, bary, vattrs, faces, ndc, ndc_faces, True)),
        (ops._interp_vert_backward_op,
         (g(*slots, 2), g(*slots, 2), g(*slots, 2), [True, True, True], p2f, bary, vattrs, faces,
          ndc, ndc_faces, True)),
        (ops._interp_vert_backward_op,
         (g(*slots, 2), g(0), g(0), [True, False, False], p2f, bary, vattrs, faces, None, None,
          False)),
        (normals._face_normals_op, (verts, faces)),
        (normals._face_normals_backward_op, (g(4, 3), verts, faces)),
        (normals._vertex_normals_op, (verts, faces)),
        (normals._vertex_normals_backward_op,
         (g(5, 3), normals._vertex_normals_op(verts, faces)[1], verts, faces)),
        (uv_sampling._sample_uv_op, (p2f, bary, maps, faces, uvs, 2, False, 0)),
        (uv_sampling._sample_uv_backward_op,
         (g(*slots, 3), [True, True, True], p2f, bary, maps, faces, uvs, 2, False, 0)),
        (uv_sampling._sample_uv_backward_op,
         (g(*slots, 3), [False, True, False], p2f, bary, maps, faces, uvs, 1, True, 1)),
    ]  # fmt: skip


def test_custom_ops_pass_opcheck_and_leave_their_inputs_alone():
    """Schema, autograd registration, fake kernels and AOT dispatch of every op."""
    backward_ops = {ops._interp_face_backward_op, ops._interp_vert_backward_op,
                    normals._face_normals_backward_op, normals._vertex_normals_backward_op,
                    uv_sampling._sample_uv_backward_op}  # fmt: skip
    for op, args in _op_cases():
        args = tuple(
            # forward ops with their float inputs requiring grad (autograd checks);
            # the backward ops have no autograd formula (no double backward)
            a.detach().clone().requires_grad_(a.is_floating_point() and op not in backward_ops)
            if isinstance(a, torch.Tensor) else a
            for a in args
        )  # fmt: skip
        kept = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        torch.library.opcheck(op, args)
        first = op(*args)
        again = op(*args)
        first = first if isinstance(first, tuple) else (first,)
        again = again if isinstance(again, tuple) else (again,)
        for x, y in zip(first, again, strict=True):
            assert torch.equal(x, y), op  # deterministic on cpu
        for a, k in zip(args, kept, strict=True):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, k), op  # inputs (incl. upstream gradients) untouched


# ============================================================================= torch.compile
def test_torch_compile_fullgraph_matches_eager():
    """fullgraph=True fails on any graph break; each op is one opaque node."""
    p2f, bary64 = _fragments(n=1, h=4, w=4, k=2, num_faces=4, seed=9)
    gen = torch.Generator().manual_seed(10)
    verts = torch.randn((6, 3), generator=gen)
    faces = torch.randint(0, 6, (4, 3), generator=gen)
    colour = torch.randn((4, 3, 3), generator=gen)

    ndc = _big_triangles(4, gen).float()
    maps = torch.rand((1, 4, 4, 3), generator=gen)
    uvs = torch.rand((6, 2), generator=gen)
    ndc_faces = torch.arange(12).reshape(4, 3)  # each face its own screen-covering triangle

    def loss_fn(offset, bary):
        normals = ops.face_normals(verts + offset, faces)  # (F, 3)
        attrs = colour + normals[:, None, :]
        pixels = ops.interpolate_face_attributes(p2f, bary, attrs)
        shade = ops.interpolate_vertex_attributes(
            p2f, bary, ops.vertex_normals(verts + offset, faces), faces,
            verts_ndc=ndc + 0.01 * offset.repeat(2, 1), ndc_faces=ndc_faces,
        )  # fmt: skip
        texels = ops.sample_textures_uv(p2f, bary, maps, faces, uvs + offset[:, :2])
        return (pixels**2).sum() + sum((s**2).sum() for s in shade) + (texels**2).sum()

    def run(fn):
        offset = torch.zeros((6, 3), requires_grad=True)
        bary = bary64.float().requires_grad_(True)
        loss = fn(offset, bary)
        loss.backward()
        return loss.detach(), offset.grad, bary.grad

    eager = run(loss_fn)
    compiled = run(torch.compile(loss_fn, fullgraph=True))
    # Same kernels on the same inputs; only the graph's own elementwise ops may
    # be fused differently by inductor (a float32 rounding or two): 1e-6 relative.
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)


# ============================================================================= errors
def _good():
    p2f, bary = _fragments(n=1, h=2, w=2, k=1, num_faces=2, seed=11)
    return p2f, bary.float(), torch.zeros((2, 3, 2))


@pytest.mark.parametrize(
    "change,exc,match",
    [
        (lambda a: (a[0].float(), a[1], a[2]), TypeError, "pix_to_face"),
        (lambda a: (a[0][..., None], a[1], a[2]), ValueError, "pix_to_face"),
        (lambda a: (a[0], a[1][..., :2], a[2]), ValueError, "bary_coords"),
        (lambda a: (a[0], a[1].int(), a[2]), TypeError, "bary_coords"),
        (lambda a: (a[0], a[1], a[2][:, :2]), ValueError, "face_attributes"),
        (lambda a: (a[0], a[1], a[2][:1]), ValueError, "pix_to_face holds face"),
        (lambda a: (a[0], a[1], a[2].numpy()), TypeError, "face_attributes"),
    ],
)
def test_interpolate_face_attributes_errors_name_the_argument(change, exc, match):
    p2f, bary, attrs = change(_good())
    if match == "pix_to_face holds face":
        p2f = torch.ones_like(p2f)
    with pytest.raises(exc, match=match):
        ops.interpolate_face_attributes(p2f, bary, attrs)


def test_other_ops_errors_name_the_argument():
    p2f, bary, _ = _good()
    verts = torch.zeros((3, 3))
    faces = torch.tensor([[0, 1, 2], [0, 2, 1]])
    with pytest.raises(ValueError, match="faces has indices"):
        ops.face_normals(verts, faces + 1)
    with pytest.raises(TypeError, match="verts"):
        ops.vertex_normals(verts.int(), faces)
    with pytest.raises(TypeError, match="faces must be an integer tensor"):
        ops.face_normals(verts, faces.double())
    attrs = torch.zeros((3, 2))
    with pytest.raises(ValueError, match="attributes"):
        ops.interpolate_vertex_attributes(p2f, bary, attrs[:, :0], faces)
    with pytest.raises(ValueError, match="ndc_faces is only used"):
        ops.interpolate_vertex_attributes(p2f, bary, attrs, faces, ndc_faces=faces)
    with pytest.raises(ValueError, match="verts_ndc"):
        ops.interpolate_vertex_attributes(p2f, bary, attrs, faces, verts_ndc=verts[:, :2])
    with pytest.raises(ValueError, match="faces has indices"):
        ops.interpolate_vertex_attributes(p2f, bary, attrs[:2], faces)
    maps, uvs = torch.zeros((1, 2, 2, 3)), torch.zeros((3, 2))
    with pytest.raises(ValueError, match="padding_mode"):
        ops.sample_textures_uv(p2f, bary, maps, faces, uvs, padding_mode="wrap")
    with pytest.raises(ValueError, match="maps has 3 maps"):
        ops.sample_textures_uv(p2f, bary, maps.expand(3, -1, -1, -1), faces, uvs)
    with pytest.raises(ValueError, match="verts_uvs"):
        ops.sample_textures_uv(p2f, bary, maps, faces, uvs[:, :1])
    with pytest.raises(ValueError, match="faces_uvs has indices"):
        ops.sample_textures_uv(p2f, bary, maps, faces, uvs[:2])


def test_empty_inputs_give_empty_or_zero_outputs():
    p2f = -torch.ones((1, 2, 2, 1), dtype=torch.int64)
    bary = torch.zeros((1, 2, 2, 1, 3), requires_grad=True)
    attrs = torch.zeros((0, 3, 2), requires_grad=True)
    out = ops.interpolate_face_attributes(p2f, bary, attrs)
    assert out.shape == (1, 2, 2, 1, 2) and not out.any()
    out.sum().backward()
    assert attrs.grad.shape == (0, 3, 2) and not bary.grad.any()
    verts = torch.zeros((2, 3))
    no_faces = torch.zeros((0, 3), dtype=torch.int64)
    assert ops.face_normals(verts, no_faces).shape == (0, 3)
    assert not ops.vertex_normals(verts, no_faces).any()


def test_interpolation_after_the_raster_op_sends_gradients_to_the_vertices():
    """rasterize -> interpolate: the vertex gradient equals the one through a plain-torch
    interpolation of the same fragments (the raster op's backward is shared)."""
    import warpraster.torch as wrt

    gen = torch.Generator().manual_seed(12)
    verts0 = torch.tensor([[-0.8, -0.7, 1.0], [0.7, -0.6, 1.5], [0.0, 0.8, 2.0], [0.5, 0.5, 1.2]])
    faces = torch.tensor([[0, 1, 2], [1, 3, 2]])
    colours = torch.randn((2, 3, 3), generator=gen)
    up = torch.randn((1, 8, 8, 2, 3), generator=gen)
    grads = []
    for interp in (ops.interpolate_face_attributes, _ref_face_interp):
        verts = verts0.clone().requires_grad_(True)
        p2f, _, bary, _ = wrt.rasterize_meshes(
            verts, faces, [0], [2], image_size=8, faces_per_pixel=2, blur_radius=0.01
        )
        (g,) = _grads(interp(p2f, bary, colours), (verts,), up)
        grads.append(g)
    assert float(grads[1].abs().max()) > 0
    # Same fragments and the same raster backward; only the d/d bary sums (D = 3
    # float32 products per slot) round differently: 1e-6 of the largest.
    _close(grads[0], grads[1], 1e-6, "vertex gradient")


def test_non_contiguous_inputs_are_accepted():
    p2f, bary64 = _fragments(seed=13)
    attrs = torch.randn((3, 3, 5), dtype=torch.float64).permute(2, 1, 0)  # (5, 3, 3) view
    bary = bary64.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not attrs.is_contiguous() and not bary.is_contiguous()
    out = ops.interpolate_face_attributes(p2f, bary, attrs)
    # float32 inputs and sums against the float64 formula: 1e-6 of the largest.
    _close(out, _ref_face_interp(p2f, bary64, attrs), 1e-6, "values")
