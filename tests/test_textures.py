"""Vertex and UV textures, PyTorch3D's grid-sample semantics and nvdiffrast-style mipmaps.

Truths used:
* ``torch.nn.functional.grid_sample`` itself (what PyTorch3D's
  ``TexturesUV.sample_textures`` calls), on the fragments and UVs of the reference
  cases r07 (align_corners, border) and r08 (UVs outside [0, 1], no corners,
  reflection), every padding/align/sampling combination: values and gradients to
  the maps and the UVs;
* a float64 NumPy transcription of those grid-sample rules on random UVs;
* a float64 NumPy transcription of nvdiffrast's mip pyramid and filtering (level
  from the footprint ellipse, wrap/clamp/zero, the four filter modes);
* central finite differences of the float64 transcriptions for every gradient
  (texels, UVs, UV derivatives through the mip level), away from texel and level
  boundaries;
* identities between paths (bilinear clamp on the base level == grid_sample with
  align_corners=False and border padding; the fused texture object == interpolate
  then ``texture``, values and gradients); graph capture on every device (cpu
  included) equal to eager.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import warp as wp

from warpraster.shading import (
    MipPyramid,
    TexturesUV,
    TexturesUVMipmap,
    TexturesVertex,
    interpolate_vertex_attributes,
    texture,
)
from warpraster.shading.mipmap import mip_level_sizes

DATA = Path(__file__).resolve().parent / "data" / "pytorch3d-render"
UV_CASES = ["r07_texuv_hardphong_bilinear.npz", "r08_texuv_softphong_nocorners_reflect.npz"]
GRID_MODES = list(
    itertools.product(["zeros", "border", "reflection"], [True, False], ["bilinear", "nearest"])
)


def _frags(d, device, requires_grad=False):
    p2f = wp.array(d["pix_to_face"].astype(np.int32), dtype=wp.int32, device=device)
    bary = wp.array(d["bary_coords"], dtype=wp.vec3, device=device, requires_grad=requires_grad)
    return p2f, bary


def _fd(fn, x, h):
    """Central differences of scalar fn at every entry of float64 array x."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (fn(xp) - fn(xm)) / (2 * h)
    return g


# ----------------------------------------------------------------------------- float64 oracles
def np_slot_uvs(p2f, bary, faces_uvs, verts_uvs):
    f = np.where(p2f < 0, 0, p2f)
    return np.einsum("...i,...ij->...j", bary.astype(np.float64), verts_uvs[faces_uvs[f]])


def np_grid_sample(maps, m, u, v, pad, align, mode):
    """PyTorch3D's TexturesUV sample (grid_sample on the map flipped in v), per sample."""
    maps = np.asarray(maps, np.float64)[:, ::-1]
    _, h, w, c = maps.shape

    def unnorm(g, size):
        x = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        if pad == "border":
            x = np.clip(x, 0, size - 1)
        elif pad == "reflection":
            lo, hi = (0.0, 2.0 * (size - 1)) if align else (-1.0, 2.0 * size - 1)
            if lo == hi:
                x = 0.0
            else:
                mn, span = lo / 2, (hi - lo) / 2
                a = abs(x - mn)
                extra, flips = np.fmod(a, span), np.floor(a / span)
                x = extra + mn if flips % 2 == 0 else span - extra + mn
            x = np.clip(x, 0, size - 1)
        return x

    def tex(mi, y, x):
        if 0 <= x < w and 0 <= y < h:
            return maps[mi, y, x]
        return np.zeros(c)

    out = np.zeros((len(u), c))
    for s in range(len(u)):
        ix, iy = unnorm(2 * u[s] - 1, w), unnorm(2 * v[s] - 1, h)
        if mode == "nearest":
            out[s] = tex(m[s], int(np.rint(iy)), int(np.rint(ix)))
            continue
        x0, y0 = int(np.floor(ix)), int(np.floor(iy))
        fx, fy = ix - x0, iy - y0
        out[s] = (
            tex(m[s], y0, x0) * (1 - fx) * (1 - fy)
            + tex(m[s], y0, x0 + 1) * fx * (1 - fy)
            + tex(m[s], y0 + 1, x0) * (1 - fx) * fy
            + tex(m[s], y0 + 1, x0 + 1) * fx * fy
        )
    return out


def np_pyramid(maps, max_mip_level=None):
    levels = [np.asarray(maps, np.float64)]
    for lh, lw in mip_level_sizes(maps.shape[1], maps.shape[2], max_mip_level)[1:]:
        p = levels[-1]
        if p.shape[1] == 1:
            q = 0.5 * (p[:, :, 0::2] + p[:, :, 1::2])
        elif p.shape[2] == 1:
            q = 0.5 * (p[:, 0::2] + p[:, 1::2])
        else:
            q = 0.25 * (p[:, 0::2, 0::2] + p[:, 0::2, 1::2] + p[:, 1::2, 0::2] + p[:, 1::2, 1::2])
        assert q.shape[1:3] == (lh, lw)
        levels.append(q)
    return levels


def np_mip_level(d, h, w, max_level):
    """nvdiffrast's level from (du/dx, dv/dx, du/dy, dv/dy) (float64)."""
    sx, tx, sy, ty = d[0] * w, d[1] * h, d[2] * w, d[3] * h
    a, b, cc = sx * sx + tx * tx, sy * sy + ty * ty, sx * sy + tx * ty
    major = 0.5 * (a + b) + np.sqrt(0.25 * (a - b) ** 2 + cc * cc)
    lam = 0.5 * np.log2(major) if major > 0 else 0.0
    return min(max(lam, 0.0), float(max_level))


def np_bilinear(level, m, u, v, boundary):
    _, h, w, c = level.shape
    if boundary == "wrap":
        u, v = u - np.floor(u), v - np.floor(v)
    x, y = u * w - 0.5, v * h - 0.5
    dx = dy = 1
    if boundary == "clamp":
        x, y = min(max(x, 0.0), w - 1.0), min(max(y, 0.0), h - 1.0)
        dx = 0 if x in (0.0, w - 1.0) else 1
        dy = 0 if y in (0.0, h - 1.0) else 1
    x0, y0 = int(np.floor(x)), int(np.floor(y))
    fx, fy = x - x0, y - y0

    def tex(yy, xx):
        if boundary == "wrap":
            yy, xx = yy % h, xx % w
        if 0 <= xx < w and 0 <= yy < h:
            return level[m, yy, xx]
        return np.zeros(c)

    top = tex(y0, x0) + fx * (tex(y0, x0 + dx) - tex(y0, x0))
    bottom = tex(y0 + dy, x0) + fx * (tex(y0 + dy, x0 + dx) - tex(y0 + dy, x0))
    return top + fy * (bottom - top)


def np_texture(levels, m, uv, duv, filt, boundary, flip=False):
    """nvdiffrast's texture() per sample: uv (S, 2), duv (S, 4) = (dudx, dvdx, dudy, dvdy)."""
    base = levels[0]
    _, h, w, c = base.shape
    out = np.zeros((len(uv), c))
    for s in range(len(uv)):
        u, v = uv[s]
        d = np.array(duv[s], np.float64)
        if flip:
            v, d[1], d[3] = 1.0 - v, -d[1], -d[3]
        if filt == "nearest":
            uu, vv = (u - np.floor(u), v - np.floor(v)) if boundary == "wrap" else (u, v)
            ix, iy = int(np.floor(uu * w)), int(np.floor(vv * h))
            if boundary == "zero" and not (0 <= ix < w and 0 <= iy < h):
                continue
            out[s] = base[m[s], min(max(iy, 0), h - 1), min(max(ix, 0), w - 1)]
            continue
        big_l = len(levels) - 1
        if filt == "linear" or big_l == 0:
            out[s] = np_bilinear(base, m[s], u, v, boundary)
            continue
        lam = np_mip_level(d, h, w, big_l)
        l0 = int(np.floor(lam))
        a = np_bilinear(levels[l0], m[s], u, v, boundary)
        if filt == "linear-mipmap-linear" and lam > 0:
            b = np_bilinear(levels[min(l0 + 1, big_l)], m[s], u, v, boundary)
            a = a + (lam - l0) * (b - a)
        out[s] = a
    return out


# ----------------------------------------------------------------------------- PyTorch3D / torch
@pytest.mark.parametrize("case", UV_CASES)
def test_uv_sampling_matches_torch_grid_sample(device, case):
    """Every padding/align/mode on the r07/r08 fragments vs torch's grid_sample (values, grads)."""
    torch = pytest.importorskip("torch")
    d = np.load(DATA / case)
    p2f_np = d["pix_to_face"]
    n, h, w, k = p2f_np.shape
    mask = p2f_np < 0
    rng = np.random.default_rng(0)
    g = rng.normal(size=(n, h, w, k, d["texture_maps"].shape[-1])).astype(np.float32)
    g[mask] = 0.0
    for pad, align, mode in GRID_MODES:
        maps_t = torch.tensor(d["texture_maps"], requires_grad=True)
        uvs_t = torch.tensor(d["verts_uvs"], requires_grad=True)
        # PyTorch3D's sample_textures, transcribed: interpolate, lerp to [-1, 1]
        # flipping v (the map is not flipped), sample.
        f = torch.tensor(np.where(mask, 0, p2f_np))
        uv = torch.tensor(d["bary_coords"])[..., None] * uvs_t[torch.tensor(d["faces_uvs"])][f]
        uv = uv.sum(-2)
        grid = torch.lerp(
            torch.tensor([-1.0, 1.0]),
            torch.tensor([1.0, -1.0]),
            uv.permute(0, 3, 1, 2, 4).reshape(n * k, h, w, 2),
        )
        tm = maps_t.permute(0, 3, 1, 2)[:, None].expand(-1, k, -1, -1, -1)
        tm = tm.reshape(n * k, *tm.shape[2:])
        ref = torch.nn.functional.grid_sample(
            tm, grid, mode=mode, align_corners=align, padding_mode=pad
        )
        ref = ref.reshape(n, k, -1, h, w).permute(0, 3, 4, 1, 2)
        (ref * torch.tensor(g)).sum().backward()

        maps = wp.array(d["texture_maps"], dtype=wp.float32, device=device, requires_grad=True)
        uvs = wp.array(d["verts_uvs"], dtype=wp.float32, device=device, requires_grad=True)
        tex = TexturesUV(maps, d["faces_uvs"], uvs, pad, align, mode)
        tape = wp.Tape()
        with tape:
            out = tex.sample_textures(_frags(d, device))
        o = out.numpy()
        assert (o[mask] == 0).all()
        # Same float32 operation sequence as torch's CPU sampler up to summation
        # order of the interpolated UV: a few ulp of texel values in [0, 1].
        np.testing.assert_allclose(o[~mask], ref.detach().numpy()[~mask], rtol=0, atol=1e-6)
        out.grad.assign(g)
        tape.backward()
        # Gradients: float32 atomic sums in another order than torch's; 1e-5 of
        # the largest entry (measured ~4e-7).
        gm, gu = maps_t.grad.numpy(), uvs_t.grad.numpy()
        assert np.abs(maps.grad.numpy() - gm).max() <= 1e-5 * max(np.abs(gm).max(), 1e-6)
        assert np.abs(uvs.grad.numpy() - gu).max() <= 1e-5 * max(np.abs(gu).max(), 1e-6)


# ----------------------------------------------------------------------------- grid-sample oracle
def _random_uv_slots(rng, n=2, h=6, w=5, k=2, nt=10, nf=8, lo=-0.6, hi=1.6):
    p2f = rng.integers(-1, nf, (n, h, w, k)).astype(np.int32)
    bary = rng.dirichlet([1, 1, 1], (n, h, w, k)).astype(np.float32)
    verts_uvs = rng.uniform(lo, hi, (nt, 2)).astype(np.float32)
    faces_uvs = np.array([rng.choice(nt, 3, replace=False) for _ in range(nf)], np.int32)
    return p2f, bary, faces_uvs, verts_uvs


@pytest.mark.parametrize("pad,align,mode", GRID_MODES)
def test_uv_sampling_matches_float64_grid_sample_oracle(device, pad, align, mode):
    rng = np.random.default_rng(1)
    p2f, bary, faces_uvs, verts_uvs = _random_uv_slots(rng)
    maps = rng.uniform(0, 1, (2, 5, 7, 3)).astype(np.float32)
    tex = TexturesUV(maps, faces_uvs, verts_uvs, pad, align, mode, device=device)
    out = tex.sample_textures((p2f, bary)).numpy()
    valid = p2f >= 0
    uv = np_slot_uvs(p2f, bary, faces_uvs, verts_uvs.astype(np.float64))[valid]
    m = np.nonzero(valid)[0]
    ref = np_grid_sample(maps, m, uv[:, 0], uv[:, 1], pad, align, mode)
    # float32 coordinates: bilinear values move by ~|texel step| * 1e-6; nearest
    # picks the same texel unless a coordinate lies within 1e-6 of a half-texel
    # (not drawn by this seed).
    np.testing.assert_allclose(out[valid], ref, atol=2e-6)
    assert (out[~valid] == 0).all()


@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [True, False])
def test_uv_sampling_gradients_match_finite_differences(device, pad, align):
    """d <g, texels> / d (maps, verts_uvs, bary) vs central differences of the float64 oracle."""
    rng = np.random.default_rng(2)
    p2f, bary, faces_uvs, verts_uvs = _random_uv_slots(rng, n=1, h=3, w=4, k=2, nt=6, nf=4)
    maps = rng.uniform(0, 1, (1, 4, 3, 2)).astype(np.float32)
    wm = wp.array(maps, dtype=wp.float32, device=device, requires_grad=True)
    wu = wp.array(verts_uvs, dtype=wp.vec2, device=device, requires_grad=True)  # vector form
    wb = wp.array(bary, dtype=wp.vec3, device=device, requires_grad=True)
    tex = TexturesUV(wm, faces_uvs, wu, pad, align, "bilinear")
    tape = wp.Tape()
    with tape:
        out = tex.sample_textures((wp.array(p2f, dtype=wp.int32, device=device), wb))
    g = rng.normal(size=out.numpy().shape)
    out.grad.assign(g.astype(np.float32))
    tape.backward()
    valid = p2f >= 0
    m = np.nonzero(valid)[0]

    def loss(maps64, uvs64, bary64):
        uv = np_slot_uvs(p2f, bary64, faces_uvs, uvs64)[valid]
        return (
            np_grid_sample(maps64, m, uv[:, 0], uv[:, 1], pad, align, "bilinear") * g[valid]
        ).sum()

    m64, u64, b64 = maps.astype(np.float64), verts_uvs.astype(np.float64), bary.astype(np.float64)
    num_m = _fd(lambda x: loss(x, u64, b64), m64, 1e-3)  # linear in texels: exact
    num_u = _fd(lambda x: loss(m64, x, b64), u64, 1e-7)
    num_b = _fd(lambda x: loss(m64, u64, x), b64, 1e-7)
    num_b[~valid] = 0.0
    # float32 adjoint (atomic sums of ~30 terms) vs float64 FD (h = 1e-7 on a
    # piecewise-bilinear function: exact unless a UV sits within 1e-7 of a texel
    # line, not drawn here): 1e-4 of the largest entry.
    for got, num in ((wm.grad.numpy(), num_m), (wu.grad.numpy(), num_u), (wb.grad.numpy(), num_b)):
        assert np.abs(got - num).max() <= 1e-4 * np.abs(num).max()


# ----------------------------------------------------------------------------- vertex textures
def test_textures_vertex_matches_oracle_and_sends_gradients(device):
    rng = np.random.default_rng(3)
    p2f, bary, faces, _ = _random_uv_slots(rng, nt=10)
    feats = rng.normal(size=(10, 4)).astype(np.float32)
    wf = wp.array(feats, dtype=wp.vec4, device=device, requires_grad=True)
    tex = TexturesVertex(wf)
    tape = wp.Tape()
    with tape:
        out = tex.sample_textures(
            (
                wp.array(p2f, dtype=wp.int32, device=device),
                wp.array(bary, dtype=wp.vec3, device=device),
            ),
            faces,
        )
    ref = np_slot_uvs(p2f, bary, faces, feats.astype(np.float64))
    ref[p2f < 0] = 0
    np.testing.assert_allclose(out.numpy(), ref, atol=2e-6)  # 3-term float32 sums
    g = rng.normal(size=ref.shape)
    out.grad.assign(g.astype(np.float32))
    tape.backward()
    want = np.zeros((10, 4))
    valid = p2f >= 0
    for i in range(3):
        np.add.at(want, faces[p2f[valid], i], bary[valid][:, i : i + 1] * g[valid])
    np.testing.assert_allclose(wf.grad.numpy(), want, atol=1e-5)


# ----------------------------------------------------------------------------- mip pyramid
@pytest.mark.parametrize("shape,max_level", [((16, 4), None), ((8, 8), 2), ((2, 32), None)])
def test_mip_pyramid_is_a_box_filter_chain(device, shape, max_level):
    rng = np.random.default_rng(4)
    maps = rng.uniform(size=(2, *shape, 3)).astype(np.float32)
    pyr = MipPyramid(maps, max_mip_level=max_level, device=device)
    want = np_pyramid(maps, max_level)
    assert len(pyr.sizes) == len(want)
    flat = pyr.levels.numpy()
    offs = pyr.offsets.numpy()
    for lev in range(1, len(want)):
        got = flat[offs[lev] : offs[lev] + want[lev].size].reshape(want[lev].shape)
        # Sums of 2 or 4 float32 values per level, compounded over <= 5 levels.
        np.testing.assert_allclose(got, want[lev], rtol=1e-6, atol=1e-7)


def test_mip_pyramid_rejects_odd_sizes():
    with pytest.raises(ValueError, match="max_mip_level"):
        MipPyramid(np.zeros((1, 6, 8, 3), np.float32))
    assert MipPyramid(np.zeros((1, 6, 8, 3), np.float32), max_mip_level=1).max_level == 1


# ----------------------------------------------------------------------------- mip sampling
FILTERS = ["nearest", "linear", "linear-mipmap-nearest", "linear-mipmap-linear"]
BOUNDARIES = ["wrap", "clamp", "zero"]


def _mip_inputs(rng, s=48, lo=-0.4, hi=1.4):
    uv = rng.uniform(lo, hi, (2, s, 1, 1, 2))
    # Footprints from 1/4 texel to 64 texels per pixel on a 16 x 32 map: every level
    # and both clamps; random anisotropy and orientation.
    mag = np.exp2(rng.uniform(-2, 6, (2, s, 1, 1, 1))) / 32.0
    duv = rng.normal(size=(2, s, 1, 1, 4)) * mag
    return uv.astype(np.float32), duv.astype(np.float32)


@pytest.mark.parametrize("filt,boundary", list(itertools.product(FILTERS, BOUNDARIES)))
def test_mip_sampling_matches_float64_nvdiffrast_oracle(device, filt, boundary):
    rng = np.random.default_rng(5)
    maps = rng.uniform(size=(2, 16, 32, 3)).astype(np.float32)
    uv, duv = _mip_inputs(rng)
    pyr = MipPyramid(maps, device=device)
    out = texture(
        pyr, uv, duv[..., [0, 1]], duv[..., [2, 3]], filter_mode=filt, boundary_mode=boundary
    ).numpy()
    levels = np_pyramid(maps)
    m = np.repeat([0, 1], uv.shape[1])
    ref = np_texture(levels, m, uv.reshape(-1, 2), duv.reshape(-1, 4), filt, boundary)
    # float32 coordinates and level: continuous filters move by ~1e-6 of the texel
    # range; nearest texel / nearest level agree unless within 1e-6 of a switch.
    np.testing.assert_allclose(out.reshape(-1, 3), ref, atol=1e-5)


def test_mip_sampling_flip_v_is_one_minus_v(device):
    rng = np.random.default_rng(6)
    maps = rng.uniform(size=(1, 8, 8, 2)).astype(np.float32)
    uv, duv = _mip_inputs(rng, s=16)
    uv, duv = uv[:1], duv[:1]
    a = texture(maps, uv, duv[..., [0, 1]], duv[..., [2, 3]], flip_v=True).numpy()
    uv2, duv2 = uv.copy(), duv.copy()
    uv2[..., 1] = 1.0 - uv2[..., 1]
    duv2[..., [1, 3]] *= -1
    b = texture(maps, uv2, duv2[..., [0, 1]], duv2[..., [2, 3]]).numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)  # 1 - v rounds once in float32


@pytest.mark.parametrize("filt", ["linear-mipmap-linear", "linear-mipmap-nearest"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_mip_gradients_match_finite_differences(device, boundary, filt):
    """Texels (through the pyramid), UVs and UV derivatives, away from texel/level edges.

    With linear-mipmap-nearest the level is discrete: both sides give exactly zero
    gradient to the UV derivatives."""
    rng = np.random.default_rng(7)
    maps = rng.uniform(size=(1, 8, 16, 2)).astype(np.float32)
    s = 12
    uv = rng.uniform(0.05, 0.95, (1, s, 1, 1, 2))
    # Levels with fractional parts in [0.25, 0.75] (no level switch under the FD step).
    lam = rng.integers(0, 3, s) + rng.uniform(0.25, 0.75, s)
    ang = rng.uniform(0, np.pi, s)
    aniso = rng.uniform(0.3, 0.8, s)
    size = np.exp2(lam) / np.array([16.0, 8.0])[:, None]  # per texel unit in u, v
    duv = np.zeros((1, s, 1, 1, 4))
    duv[0, :, 0, 0, 0] = size[0] * np.cos(ang)
    duv[0, :, 0, 0, 1] = size[1] * np.sin(ang)
    duv[0, :, 0, 0, 2] = -size[0] * np.sin(ang) * aniso
    duv[0, :, 0, 0, 3] = size[1] * np.cos(ang) * aniso
    uv, duv = uv.astype(np.float32), duv.astype(np.float32)

    wm = wp.array(maps, dtype=wp.float32, device=device, requires_grad=True)
    wuv = wp.array(uv, dtype=wp.vec2, device=device, requires_grad=True)
    wdx = wp.array(
        np.ascontiguousarray(duv[..., [0, 1]]), dtype=wp.vec2, device=device, requires_grad=True
    )
    wdy = wp.array(
        np.ascontiguousarray(duv[..., [2, 3]]), dtype=wp.vec2, device=device, requires_grad=True
    )
    tape = wp.Tape()
    with tape:
        pyr = MipPyramid(wm)
        out = texture(pyr, wuv, wdx, wdy, filter_mode=filt, boundary_mode=boundary)
    g = rng.normal(size=out.numpy().shape)
    out.grad.assign(g.astype(np.float32))
    tape.backward()

    m = np.zeros(s, int)

    def loss(maps64, uv64, duv64):
        return (
            np_texture(
                np_pyramid(maps64),
                m,
                uv64.reshape(-1, 2),
                duv64.reshape(-1, 4),
                filt,
                boundary,
            )
            * g.reshape(s, -1)
        ).sum()

    m64, uv64, duv64 = maps.astype(np.float64), uv.astype(np.float64), duv.astype(np.float64)
    num_m = _fd(lambda x: loss(x, uv64, duv64), m64, 1e-3)  # linear in texels
    num_uv = _fd(lambda x: loss(m64, x, duv64), uv64, 1e-6)
    num_d = _fd(lambda x: loss(m64, uv64, x), duv64, 1e-7)
    got_d = np.concatenate([wdx.grad.numpy(), wdy.grad.numpy()], -1)
    # float32 adjoint vs float64 FD: 1e-3 of the largest entry (the level's log2
    # and square root amplify float32 rounding of the derivatives by ~1/|d|).
    for got, num in ((wm.grad.numpy(), num_m), (wuv.grad.numpy(), num_uv), (got_d, num_d)):
        assert np.abs(got - num).max() <= 1e-3 * np.abs(num).max()


# ----------------------------------------------------------------------------- texture objects
def test_mipmap_texture_base_level_equals_grid_sample_without_corners(device):
    """linear + clamp with flip_v is grid_sample(align_corners=False, border): same texels."""
    d = np.load(DATA / UV_CASES[1])
    frags = _frags(d, device)
    a = (
        TexturesUV(
            d["texture_maps"], d["faces_uvs"], d["verts_uvs"], "border", False, device=device
        )
        .sample_textures(frags)
        .numpy()
    )
    b = (
        TexturesUVMipmap(
            d["texture_maps"],
            d["faces_uvs"],
            d["verts_uvs"],
            filter_mode="linear",
            boundary_mode="clamp",
            device=device,
        )
        .sample_textures(frags)
        .numpy()
    )
    # Two float32 weight formulas (x_e - x vs 1 - fraction): a few ulp.
    np.testing.assert_allclose(a, b, atol=1e-6)


def _r07_scene(device):
    d = np.load(DATA / UV_CASES[0])
    import warpraster as wr

    cam = d["cam_R"], d["cam_T"]
    cameras = wr.FoVPerspectiveCameras(
        R=cam[0],
        T=cam[1],
        znear=d["cam_znear"],
        zfar=d["cam_zfar"],
        fov=d["cam_fov"],
        aspect_ratio=d["cam_aspect_ratio"],
        device=device,
    )
    raster = wr.MeshRasterizer(
        cameras=cameras,
        raster_settings=wr.RasterizationSettings(image_size=32, faces_per_pixel=1, bin_size=0),
    )
    ndc = raster.transform(d["verts_packed"], d["faces_packed"], [0], [len(d["faces_packed"])])
    frags = raster(d["verts_packed"], d["faces_packed"], [0], [len(d["faces_packed"])])
    return d, ndc, frags


def test_fused_mipmap_texture_equals_interpolate_then_texture(device):
    """TexturesUVMipmap == interpolate_vertex_attributes (UVs + derivatives) -> texture()."""
    d, ndc, frags = _r07_scene(device)
    maps = np.random.default_rng(8).uniform(size=(1, 64, 64, 3)).astype(np.float32)
    faces = d["faces_packed"]
    for filt in ["linear-mipmap-nearest", "linear-mipmap-linear"]:
        tex = TexturesUVMipmap(
            maps, d["faces_uvs"], d["verts_uvs"], filter_mode=filt, device=device
        )
        fused = tex.sample_textures(frags, faces, verts_ndc=ndc).numpy()
        uv, dx, dy = interpolate_vertex_attributes(
            frags.pix_to_face,
            frags.bary_coords,
            d["verts_uvs"],
            d["faces_uvs"],
            verts_ndc=ndc,
            ndc_faces=faces,
        )
        two = texture(
            tex.pyramid, uv, dx, dy, pix_to_face=frags.pix_to_face, filter_mode=filt, flip_v=True
        ).numpy()
        # Same float32 operations in both paths.
        np.testing.assert_allclose(fused, two, atol=1e-6)
        # The object really minifies here: a 64^2 map on a ~20-pixel sphere.
        assert not np.allclose(
            fused,
            TexturesUVMipmap(
                maps, d["faces_uvs"], d["verts_uvs"], filter_mode="linear", device=device
            )
            .sample_textures(frags)
            .numpy(),
            atol=1e-3,
        )


def test_texture_objects_capture(device):
    """Preallocated outputs: captured once, replayed with new texels/UVs equal to eager."""
    d, ndc, frags = _r07_scene(device)
    rng = np.random.default_rng(9)
    maps = wp.array(
        rng.uniform(size=(1, 16, 16, 3)).astype(np.float32), dtype=wp.float32, device=device
    )
    uvs = wp.array(d["verts_uvs"], dtype=wp.float32, device=device)
    faces = wp.array(d["faces_packed"].astype(np.int32), dtype=wp.int32, device=device)
    uv_tex = TexturesUV(maps, d["faces_uvs"], uvs)
    mip_tex = TexturesUVMipmap(maps, d["faces_uvs"], uvs)
    outs = [wp.zeros(frags.pix_to_face.shape, dtype=wp.vec3, device=device) for _ in range(2)]

    def run():
        uv_tex.sample_textures(frags, out=outs[0], validate=False)
        mip_tex.sample_textures(frags, faces, verts_ndc=ndc, out=outs[1], validate=False)

    run()
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        run()
    maps.assign(rng.uniform(size=(1, 16, 16, 3)).astype(np.float32))
    uvs.assign(d["verts_uvs"][::-1].copy())
    for o in outs:
        o.zero_()
    wp.capture_launch(cap.graph)
    np.testing.assert_array_equal(outs[0].numpy(), uv_tex.sample_textures(frags).numpy())
    np.testing.assert_array_equal(
        outs[1].numpy(), mip_tex.sample_textures(frags, faces, verts_ndc=ndc).numpy()
    )


def test_bad_input_names_the_argument():
    maps = np.zeros((1, 4, 4, 3), np.float32)
    fu = np.array([[0, 1, 2]])
    uv = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="padding_mode"):
        TexturesUV(maps, fu, uv, padding_mode="mirror")
    with pytest.raises(ValueError, match="sampling_mode"):
        TexturesUV(maps, fu, uv, sampling_mode="cubic")
    with pytest.raises(ValueError, match="verts_uvs"):
        TexturesUV(maps, fu, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="faces_uvs"):
        TexturesUV(maps, [[0, 1, 3]], uv)
    with pytest.raises(ValueError, match="maps"):
        TexturesUV(np.zeros((4, 4, 3)), fu, uv)
    with pytest.raises(ValueError, match="filter_mode"):
        TexturesUVMipmap(maps, fu, uv, filter_mode="anisotropic")
    with pytest.raises(ValueError, match="boundary_mode"):
        TexturesUVMipmap(maps, fu, uv, boundary_mode="mirror")
    with pytest.raises(ValueError, match="verts_ndc"):
        TexturesUVMipmap(maps, fu, uv).sample_textures(
            (np.zeros((1, 2, 2, 1), np.int32), np.zeros((1, 2, 2, 1, 3)))
        )
    with pytest.raises(ValueError, match="faces must be given"):
        TexturesVertex(np.zeros((3, 3))).sample_textures(
            (np.zeros((1, 2, 2, 1), np.int32), np.zeros((1, 2, 2, 1, 3)))
        )
    with pytest.raises(ValueError, match="uv_dx"):
        texture(maps, np.zeros((1, 2, 2, 1, 2)), filter_mode="linear-mipmap-linear")


def test_fused_mipmap_gradients_equal_the_two_stage_path(device):
    """Gradients to maps (a vec3 array), verts_uvs and verts_ndc: fused kernel == interpolate
    (finite-difference-checked in test_interpolate) -> texture (checked above)."""
    d, ndc, frags = _r07_scene(device)
    rng = np.random.default_rng(10)
    maps_np = rng.uniform(size=(1, 64, 64, 3)).astype(np.float32)
    faces = d["faces_packed"]
    g = rng.normal(size=tuple(frags.pix_to_face.shape) + (3,)).astype(np.float32)
    grads = []
    for fused in (True, False):
        maps = wp.array(maps_np, dtype=wp.vec3, device=device, requires_grad=True)
        uvs = wp.array(d["verts_uvs"], dtype=wp.float32, device=device, requires_grad=True)
        vn = wp.array(ndc.numpy(), dtype=wp.vec3, device=device, requires_grad=True)
        tex = TexturesUVMipmap(maps, d["faces_uvs"], uvs)
        tape = wp.Tape()
        with tape:
            if fused:
                out = tex.sample_textures(frags, faces, verts_ndc=vn)
            else:
                tex.pyramid.build()
                uv, dx, dy = interpolate_vertex_attributes(
                    frags.pix_to_face,
                    frags.bary_coords,
                    uvs,
                    d["faces_uvs"],
                    verts_ndc=vn,
                    ndc_faces=faces,
                )
                out = texture(tex.pyramid, uv, dx, dy, pix_to_face=frags.pix_to_face, flip_v=True)
        out.grad.assign(g)
        tape.backward()
        grads.append([maps.grad.numpy(), uvs.grad.numpy(), vn.grad.numpy()])
    for a, b in zip(*grads, strict=True):
        # Same per-slot float32 terms, summed by atomics in another order.
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_forward_and_backward_capture_together(device):
    """Sampling, its tape and ``tape.backward`` in one graph; replay == eager gradients."""
    d = np.load(DATA / UV_CASES[1])
    p2f, bary = _frags(d, device, requires_grad=True)
    rng = np.random.default_rng(11)
    maps = wp.array(d["texture_maps"], dtype=wp.float32, device=device, requires_grad=True)
    uvs = wp.array(d["verts_uvs"], dtype=wp.float32, device=device, requires_grad=True)
    tex = TexturesUV(maps, d["faces_uvs"], uvs, "reflection", False)
    out = wp.zeros(p2f.shape, dtype=wp.vec3, device=device, requires_grad=True)
    g = wp.array(rng.normal(size=tuple(p2f.shape) + (3,)), dtype=wp.vec3, device=device)
    tape = wp.Tape()

    def step():
        tape.reset()
        with tape:
            tex.sample_textures((p2f, bary), out=out, validate=False)
        wp.copy(out.grad, g)
        tape.backward()

    step()  # loads the modules, eager reference
    eager = [maps.grad.numpy().copy(), uvs.grad.numpy().copy(), bary.grad.numpy().copy()]
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for a in (maps.grad, uvs.grad, bary.grad):
        a.zero_()
    wp.capture_launch(cap.graph)
    for a, b in zip((maps.grad, uvs.grad, bary.grad), eager, strict=True):
        # Bit-equal on the cpu (serial atomics); CUDA may sum atomics in another order.
        np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=1e-6 * np.abs(b).max())
