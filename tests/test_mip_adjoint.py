"""The hand-written adjoint of the mip-mapped texture object's sampling kernel.

``TexturesUVMipmap`` samples with ``mipmap._sample_uv_mipmap_slots`` (one thread
per slot) and registers ``mip_adjoint._sample_uv_mipmap_adjoint`` (one thread per
slot) on the tape. Truths used:

* Warp's generated adjoint of the forward with one thread per slot and channel,
  ``mipmap._sample_uv_mipmap`` (the object's internal ``_generated_adjoint``
  switch launches and records it instead; its output is bit-equal), itself checked against
  float64 finite differences in test_textures.py: gradients to the base texels
  (through the pyramid rebuild), ``verts_uvs``, the projected vertices and the
  barycentrics, for every filter x boundary mode, with and without ``flip_v``
  and perspective correction, K = 2, one shared map and one map per image; and
  through the Renderer to the world vertices;
* central finite differences of the float32 forward: the texels (the output is
  linear in them), ``verts_uvs`` and the projected vertices, on the slots whose
  discrete state (level, texel cell of every level read, clamp / zero / wrap
  taps) does not change under the step;
* the render contract: a step after the first allocates nothing and reads
  nothing back; render + backward captured in a graph replays to the eager
  gradients.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import warp as wp
from host_counts import count_allocations_and_reads

import warpraster as wr
from warpraster.camera import look_at_view_transform
from warpraster.primitives import ico_sphere
from warpraster.renderer import Renderer
from warpraster.shading import (
    HardPhongShader,
    PointLights,
    TexturesUVMipmap,
    interpolate_vertex_attributes,
)
from warpraster.shading.corner_lists import CornerLists
from warpraster.shading.mip_pyramid import mip_level_sizes
from warpraster.shading.mip_slots import _gather_corners, _sample_uv_mipmap
from warpraster.shading.reductions import image_mse

FILTERS = ["nearest", "linear", "linear-mipmap-nearest", "linear-mipmap-linear"]
BOUNDARIES = ["wrap", "clamp", "zero"]
MAP_H, MAP_W = 64, 32  # non-square: 1-wide levels at the top of the pyramid (L = 6)
EPS32 = float(np.finfo(np.float32).eps)


def _spheres(copies: int, level: int, seed: int):
    """``copies`` icospheres (packed), one mesh per image, with spherical UVs: the
    first sphere's squeezed into [0.3, 0.7] (magnified texels), the others'
    stretched past [0, 1] (wrap, clamp and zero differ)."""
    rng = np.random.default_rng(seed)
    v, f = ico_sphere(level)
    verts = np.concatenate([v * 0.7 + rng.uniform(-0.2, 0.2, 3) for _ in range(copies)])
    faces = np.concatenate([f + i * len(v) for i in range(copies)]).astype(np.int32)
    uv = np.stack([0.5 + np.arctan2(v[:, 2], v[:, 0]) / (2 * np.pi),
                   0.5 + np.arcsin(np.clip(v[:, 1], -1, 1)) / np.pi], 1)  # fmt: skip
    uvs = np.concatenate([uv * 0.4 + 0.3] + [uv * 6.0 - 2.5] * (copies - 1)).astype(np.float32)
    first = np.arange(copies, dtype=np.int32) * len(f)
    count = np.full(copies, len(f), np.int32)
    return verts.astype(np.float32), faces, uvs, first, count


_SCENES: dict = {}


def _scene(device):
    """Fragments (N = 2 images of 24 x 24, K = 2) of two spheres, one near, one far
    (magnified and minified texels), their projected vertices, faces and UVs."""
    key = str(device)
    if key not in _SCENES:
        verts, faces, uvs, first, count = _spheres(2, 2, seed=3)
        R, T = look_at_view_transform(dist=[2.0, 6.0], elev=[15.0, -10.0], azim=[30.0, 200.0])
        cams = wr.FoVPerspectiveCameras(R=R, T=T, device=device)
        raster = wr.MeshRasterizer(
            cameras=cams,
            raster_settings=wr.RasterizationSettings(image_size=24, faces_per_pixel=2, bin_size=0),
        )
        ndc = raster.transform(verts, faces, first, count)
        frags = raster(verts, faces, first, count)
        p2f = frags.pix_to_face.numpy()
        assert (p2f[..., 1] >= 0).sum() > 50  # second layers exist (K = 2)
        _SCENES[key] = (frags, ndc.numpy(), faces, uvs)
    return _SCENES[key]


def _sample_grads(device, filt, boundary, *, flip_v, perspective, n_maps, generated, seed,
                  max_mip_level=None, lists=False, specialize=None):  # fmt: skip
    """Samples the scene under a tape and back-propagates random output gradients:
    the gradients of the base maps, verts_uvs, verts_ndc and the barycentrics (and
    what is left of the output's). ``lists``: pass the faces' CornerLists (the
    corner tables' adjoint then gathers per vertex on the hand path; without them
    the projected-vertex side keeps Warp's generated adjoint)."""
    frags, ndc, faces, uvs = _scene(device)
    rng = np.random.default_rng(seed)
    maps = wp.array(rng.uniform(size=(n_maps, MAP_H, MAP_W, 3)).astype(np.float32),
                    dtype=wp.float32, device=device, requires_grad=True)  # fmt: skip
    verts_uvs = wp.array(uvs, dtype=wp.float32, device=device, requires_grad=True)
    verts_ndc = wp.array(ndc, dtype=wp.vec3, device=device, requires_grad=True)
    bary = wp.array(frags.bary_coords.numpy(), dtype=wp.vec3, device=device, requires_grad=True)
    tex = TexturesUVMipmap(maps, faces, verts_uvs, filter_mode=filt, boundary_mode=boundary,
                           flip_v=flip_v, max_mip_level=max_mip_level)  # fmt: skip
    tex._generated_adjoint = generated
    tex.specialize = specialize
    tape = wp.Tape()
    with tape:
        faces_w = wp.array(np.asarray(faces, np.int32), dtype=wp.int32, device=device)
        out = tex.sample_textures(
            (frags.pix_to_face, bary), faces_w, verts_ndc=verts_ndc,
            perspective_correct=perspective,
            corner_lists=CornerLists(faces_w, len(ndc)) if lists else None,
        )  # fmt: skip
    sampled = out.numpy()
    out.grad.assign(rng.normal(size=tuple(out.shape) + (3,)).astype(np.float32))
    kernels = [launch[0] for launch in tape.launches if isinstance(launch, (list, tuple))]
    assert (_sample_uv_mipmap in kernels) == generated  # the hand path records no launch
    # Warp's adjoint of the corner gather: generated, or mip-mapped (the projected
    # vertices carry a gradient) without corner lists
    assert (_gather_corners in kernels) == bool(generated or (tex.uses_mipmaps and not lists))
    tape.backward()
    return {
        "sampled": sampled,
        "maps": maps.grad.numpy(),
        "verts_uvs": verts_uvs.grad.numpy(),
        "verts_ndc": verts_ndc.grad.numpy(),
        "bary": bary.grad.numpy(),
        # consumed, as Warp's adjoint of the forward's store does (zeroed once read)
        "texels": out.grad.numpy(),
    }


# ----------------------------------------------------------------------------- the scene
def _np_level(duv_dx, duv_dy, h, w):
    """nvdiffrast's unclamped level, float64, from (S, 2) derivatives (-inf: zero footprint)."""
    sx, tx = duv_dx[:, 0] * w, duv_dx[:, 1] * h
    sy, ty = duv_dy[:, 0] * w, duv_dy[:, 1] * h
    a, b, c = sx * sx + tx * tx, sy * sy + ty * ty, sx * sy + tx * ty
    major = 0.5 * (a + b) + np.sqrt(np.maximum(0.25 * (a - b) ** 2 + c * c, 0.0))
    with np.errstate(divide="ignore"):
        return 0.5 * np.log2(major)


def _slot_uvs(device, ndc, faces, uvs, perspective=True):
    """(p2f mask, uv, duv_dx, duv_dy) of the filled slots, float64, from
    interpolate_vertex_attributes (an independent kernel)."""
    frags = _scene(device)[0]
    uv, dx, dy = interpolate_vertex_attributes(
        frags.pix_to_face, frags.bary_coords, uvs, faces, verts_ndc=ndc,
        perspective_correct=perspective,
    )  # fmt: skip
    filled = frags.pix_to_face.numpy() >= 0
    return filled, *(a.numpy()[filled].astype(np.float64) for a in (uv, dx, dy))


def test_scene_reads_clamped_and_blended_levels(device):
    """The comparisons below see every level regime: magnified (level clamped to 0),
    minified past the coarsest level (clamped to L) and blended in between."""
    frags, ndc, faces, uvs = _scene(device)
    _, _, dx, dy = _slot_uvs(device, ndc, faces, uvs)
    lam = _np_level(dx, dy, MAP_H, MAP_W)
    top = len(mip_level_sizes(MAP_H, MAP_W)) - 1
    assert (lam <= 0).sum() > 20
    assert (lam >= top).sum() > 5
    assert ((lam > 0.5) & (lam < top - 0.5)).sum() > 100


# ----------------------------------------------------------------------------- vs generated
def _hand_equals_generated(device, filt, boundary, **options) -> dict:
    """Asserts that every gradient of the hand-written adjoint equals the generated
    adjoint's (``_sample_grads`` options); returns the generated ones."""
    got, want = (_sample_grads(device, filt, boundary, generated=g, **options) for g in (0, 1))
    # The forwards differ too (one thread per slot for all channels on the hand path,
    # one per slot and channel with the generated adjoint), with the same float32
    # operations per channel: bit-equal.
    np.testing.assert_array_equal(got.pop("sampled"), want.pop("sampled"))
    for name in want:
        # The same float32 per-slot terms, in another order: the hand adjoint sums a
        # slot's channels (and levels) before the chain, writes the level's and the
        # barycentric derivatives' adjoints out by hand (a few ulps each), and the
        # atomics add in another order. An entry sums at most a few hundred such
        # terms, each within ~1e-7 relative of the largest entry: 1e-5 of it.
        b = want[name]
        np.testing.assert_allclose(got[name], b, rtol=0, atol=1e-5 * np.abs(b).max(),
                                   err_msg=f"{name} ({filt}, {boundary}, {options})")  # fmt: skip
    return want


@pytest.mark.parametrize("filt,boundary", list(itertools.product(FILTERS, BOUNDARIES)))
def test_hand_adjoint_equals_generated(device, filt, boundary):
    """Every gradient equals Warp's generated adjoint's, in two variants: flip_v,
    perspective correction and one shared map; no flip, no perspective and one map
    per image."""
    for seed, (flip_v, perspective, n_maps) in enumerate([(True, True, 1), (False, False, 2)]):
        # the first variant with the faces' corner lists (per-vertex gathers of the
        # corner tables' gradients), the second with Warp's adjoint of that gather
        options = dict(flip_v=flip_v, perspective=perspective, n_maps=n_maps, seed=seed,
                       lists=seed == 0)  # fmt: skip
        want = _hand_equals_generated(device, filt, boundary, **options)
        assert np.abs(want["maps"]).max() > 0
        assert not want["texels"].any()
        smooth = filt != "nearest"  # nearest: piecewise constant in the UVs
        assert (np.abs(want["verts_uvs"]).max() > 0) == smooth
        assert (np.abs(want["bary"]).max() > 0) == smooth
        # the projected vertices reach the output only through the level fraction
        assert (np.abs(want["verts_ndc"]).max() > 0) == (filt == "linear-mipmap-linear")


@pytest.mark.parametrize(
    "filt,boundary,flip_v,perspective",
    [("linear-mipmap-linear", "clamp", True, True), ("nearest", "zero", False, False)],
)
def test_adjoint_variant_equals_the_generic_kernel(device, filt, boundary, flip_v, perspective):
    """The hand-written adjoint as a kernel variant (its gradient bits and the
    sampler's and corner tables' flags compiled in; CUDA's default) gives the generic
    kernel's samples and gradients bit for bit on the CPU (it only drops branches
    the launch never takes; on a GPU the atomics' order varies from run to run).
    One smooth and one piecewise-constant filter (a variant is a compile of its own
    on the CPU); the CUDA run takes variants in every test above."""
    options = dict(flip_v=flip_v, perspective=perspective, n_maps=2, seed=3, generated=0)
    generic = _sample_grads(device, filt, boundary, specialize=False, **options)
    variant = _sample_grads(device, filt, boundary, specialize=True, **options)
    assert np.abs(generic["maps"]).max() > 0
    exact = wp.get_device(device).is_cpu
    for name in generic:
        if exact or name in ("sampled", "texels"):
            np.testing.assert_array_equal(variant[name], generic[name], err_msg=name)
        else:
            # GPU atomics (texels, corner rows) add in a run-dependent order: as
            # _hand_equals_generated's tolerance, 1e-5 of the largest entry
            b = generic[name]
            np.testing.assert_allclose(variant[name], b, rtol=0, atol=1e-5 * np.abs(b).max(),
                                       err_msg=name)  # fmt: skip


@pytest.mark.parametrize("max_mip_level", [0, 2])
def test_hand_adjoint_equals_generated_with_few_levels(device, max_mip_level):
    """A pyramid of the base only (the mip-mapped modes then filter bilinearly) or
    of two levels above it (many slots clamped to the coarsest)."""
    for filt in ("linear-mipmap-linear", "linear-mipmap-nearest"):
        want = _hand_equals_generated(device, filt, "wrap", flip_v=True, perspective=True,
                                      n_maps=2, seed=29, max_mip_level=max_mip_level)  # fmt: skip
        blended = filt == "linear-mipmap-linear" and max_mip_level > 0
        assert (np.abs(want["verts_ndc"]).max() > 0) == blended


def _bench_like_renderer(device, filt):
    """A small version of the bench scene hardphong_mip1024_ico5x8_512_k1: K = 1 hard
    Phong, a mip-mapped texture per image, world vertices with a gradient."""
    verts, faces, uvs, first, count = _spheres(2, 2, seed=5)
    R, T = look_at_view_transform(dist=[2.2, 5.0], elev=10.0, azim=[20.0, 140.0])
    cams = wr.FoVPerspectiveCameras(R=R, T=T, device=device)
    maps = np.random.default_rng(6).uniform(size=(2, MAP_H, MAP_W, 3)).astype(np.float32)
    tex = TexturesUVMipmap(maps, faces, uvs, filter_mode=filt, device=device, requires_grad=True)
    shader = HardPhongShader(cameras=cams, lights=PointLights(location=((1.0, 2.0, 3.0),),
                             device=device))  # fmt: skip
    r = Renderer(cameras=cams, raster_settings=wr.RasterizationSettings(image_size=32),
                 shader=shader, faces=faces, mesh_to_face_first_idx=first,
                 num_faces_per_mesh=count, num_verts=len(verts), textures=tex,
                 device=device)  # fmt: skip
    return r, tex, wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)


@pytest.mark.parametrize("filt", ["linear-mipmap-linear", "linear-mipmap-nearest"])
def test_renderer_gradients_equal_generated(device, filt):
    """Through the Renderer (render + MSE + backward): world vertices, texels, UVs."""
    grads = []
    for generated in (False, True):
        r, tex, verts = _bench_like_renderer(device, filt)
        tex._generated_adjoint = generated
        target = wp.zeros((2, 32, 32, 4), dtype=wp.float32, device=device)
        target.fill_(0.3)
        loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
        tape = wp.Tape()
        with tape:
            image_mse(r.render(verts).image, target, out=loss)
        tape.backward(loss)
        grads.append([verts.grad.numpy(), tex.maps.grad.numpy(), tex.verts_uvs.grad.numpy()])
    for a, b in zip(*grads, strict=True):
        assert np.abs(b).max() > 0
        # as test_hand_adjoint_equals_generated (the vertex gradient adds the shading
        # and raster adjoints' terms, identical in both runs, to the same order)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


# ----------------------------------------------------------------------------- finite differences
def _forward(device, tex, frags, ndc, faces) -> np.ndarray:
    return tex.sample_textures(frags, faces, verts_ndc=ndc).numpy().astype(np.float64)


def test_texel_gradients_match_finite_differences(device):
    """The output is linear in the base texels (the pyramid is a box-filter chain):
    central differences are exact up to float32 rounding, for texels read at level 0
    and only through coarser levels."""
    frags, ndc_np, faces, uvs = _scene(device)
    rng = np.random.default_rng(21)
    maps_np = rng.uniform(size=(2, MAP_H, MAP_W, 3)).astype(np.float32)
    ndc = wp.array(ndc_np, dtype=wp.vec3, device=device)
    for filt, boundary in [("linear-mipmap-linear", "wrap"), ("linear-mipmap-nearest", "zero"),
                           ("linear", "clamp"), ("nearest", "wrap")]:  # fmt: skip
        maps = wp.array(maps_np, dtype=wp.float32, device=device, requires_grad=True)
        tex = TexturesUVMipmap(maps, faces, uvs, filter_mode=filt, boundary_mode=boundary)
        g = rng.normal(size=tuple(frags.pix_to_face.shape) + (3,))
        tape = wp.Tape()
        with tape:
            out = tex.sample_textures(frags, faces, verts_ndc=ndc)
        out.grad.assign(g.astype(np.float32))
        tape.backward()
        grad = maps.grad.numpy()
        # the 6 texels with the largest gradients, 6 random read ones and 2 random ones
        read = np.flatnonzero(grad)
        flat = np.argsort(np.abs(grad).ravel())[-6:].tolist() + rng.choice(read, 6).tolist()
        flat += rng.choice(grad.size, 2).tolist()
        h = 0.25
        for idx in (np.unravel_index(i, grad.shape) for i in flat):
            sides = []
            for sign in (1, -1):
                moved = maps_np.copy()
                moved[idx] += sign * h
                maps.assign(moved)
                sides.append(_forward(device, tex, frags, ndc, faces))
            maps.assign(maps_np)
            fd = ((sides[0] - sides[1]) * g).sum() / (2 * h)
            moved = sides[0] != sides[1]  # the other outputs are bit-equal: no error
            # float32 outputs that moved: each within ~2 ulps on both sides
            noise = 4 * EPS32 * (np.abs(sides[0]) * np.abs(g) * moved).sum() / (2 * h)
            assert abs(fd - grad[idx]) <= noise + 1e-6 * np.abs(grad).max(), (filt, idx)


def _np_state(uv, dx, dy, filt, boundary, flip_v):
    """Per slot, the discrete choices of the sampler (float64): the level read (and
    whether it is clamped), and per level read the texel cell, clamp pinning and the
    far-outside test; wrap adds the period."""
    sizes = mip_level_sizes(MAP_H, MAP_W)
    top = len(sizes) - 1
    u, v = uv[:, 0], uv[:, 1]
    dx, dy = dx.copy(), dy.copy()
    if flip_v:
        v = 1.0 - v
        dx[:, 1] *= -1
        dy[:, 1] *= -1
    cols = [np.floor(u), np.floor(v)]  # the wrap period
    if boundary == "wrap":
        u, v = u - np.floor(u), v - np.floor(v)
    if filt == "nearest":
        return np.stack(cols + [np.floor(u * MAP_W), np.floor(v * MAP_H)], 1)
    levels = [np.zeros_like(u, dtype=int)]
    if filt != "linear":
        lam = _np_level(dx, dy, MAP_H, MAP_W)
        cols += [lam <= 0, lam >= top]
        l0 = np.floor(np.clip(lam, 0, top)).astype(int)
        levels = [l0] if filt == "linear-mipmap-nearest" else [l0, np.minimum(l0 + 1, top)]
        cols.append(l0)
    for lev in levels:
        lh, lw = np.array(sizes)[lev].T
        x, y = u * lw - 0.5, v * lh - 0.5
        if boundary == "clamp":
            cols += [x <= 0, x >= lw - 1, y <= 0, y >= lh - 1]
            x, y = np.clip(x, 0, lw - 1), np.clip(y, 0, lh - 1)
        cols += [np.floor(x), np.floor(y), (x > -2) & (x < lw + 1) & (y > -2) & (y < lh + 1)]
    return np.stack([np.asarray(c, np.float64) for c in cols], 1)


@pytest.mark.parametrize("filt,boundary,flip_v", [
    ("linear-mipmap-linear", "wrap", True), ("linear-mipmap-linear", "clamp", False),
    ("linear-mipmap-nearest", "zero", True), ("linear", "clamp", True),
    ("nearest", "wrap", False),
])  # fmt: skip
def test_uv_and_vertex_gradients_match_finite_differences(device, filt, boundary, flip_v):
    """verts_uvs and the projected vertices (through the UV derivatives and the level
    fraction), on the slots that keep their discrete state under every step."""
    frags, ndc_np, faces, uvs_np = _scene(device)
    rng = np.random.default_rng(23)
    maps = rng.uniform(size=(1, MAP_H, MAP_W, 3)).astype(np.float32)
    p2f = frags.pix_to_face.numpy()
    filled = p2f >= 0
    slot_faces = faces[p2f[filled]]
    _, _, sx, sy = _slot_uvs(device, wp.array(ndc_np, dtype=wp.vec3, device=device), faces,
                             uvs_np)  # fmt: skip
    lam = _np_level(sx, sy, MAP_H, MAP_W)
    blended = (lam > 0.3) & (lam < len(mip_level_sizes(MAP_H, MAP_W)) - 1.3)
    used = np.bincount(slot_faces.ravel(), minlength=len(uvs_np))
    used_blended = np.bincount(slot_faces[blended].ravel(), minlength=len(uvs_np))
    # the most-read vertices, magnified and minified (level fraction: the projected
    # vertices reach the output there)
    verts = np.concatenate([np.argsort(used)[-2:], np.argsort(used_blended)[-2:]])
    # (array name, index, component, step): UVs in uv units, NDC in NDC units
    coords = [("uv", i, c, 1e-3) for i in verts for c in range(2)]
    coords += [("ndc", i, c, 1e-3) for i in verts[2:] for c in range(3)]

    def inputs(which=None, i=0, c=0, delta=0.0):
        uv, nd = uvs_np.copy(), ndc_np.copy()
        if which == "uv":
            uv[i, c] += delta
        elif which == "ndc":
            nd[i, c] += delta
        return uv, nd

    def state(uv, nd):
        a = wp.array(nd, dtype=wp.vec3, device=device)
        _, su, sx, sy = _slot_uvs(device, a, faces, uv)
        return _np_state(su, sx, sy, filt, boundary, flip_v)

    base = state(*inputs())
    keep = np.ones(len(base), bool)
    for which, i, c, h in coords:
        for sign in (1, -1):
            keep &= (state(*inputs(which, i, c, sign * h)) == base).all(1)
    assert keep.mean() > 0.8  # most slots are away from every boundary
    g = rng.normal(size=tuple(p2f.shape) + (3,))
    weight = np.zeros(p2f.shape)
    weight[filled] = keep
    g *= weight[..., None]  # the slots that change state get no weight

    verts_uvs = wp.array(uvs_np, dtype=wp.float32, device=device, requires_grad=True)
    verts_ndc = wp.array(ndc_np, dtype=wp.vec3, device=device, requires_grad=True)
    tex = TexturesUVMipmap(maps, faces, verts_uvs, filter_mode=filt, boundary_mode=boundary,
                           flip_v=flip_v, device=device)  # fmt: skip
    tape = wp.Tape()
    with tape:
        out = tex.sample_textures(frags, faces, verts_ndc=verts_ndc)
    out.grad.assign(g.astype(np.float32))
    tape.backward()
    grads = {"uv": verts_uvs.grad.numpy(), "ndc": verts_ndc.grad.numpy()}
    scale = {k: max(np.abs(v[verts]).max(), 1e-30) for k, v in grads.items()}
    for which, i, c, h in coords:
        sides = []
        for sign in (1, -1):
            uv, nd = inputs(which, i, c, sign * h)
            verts_uvs.assign(uv)
            verts_ndc.assign(nd)
            sides.append(_forward(device, tex, frags, verts_ndc, faces))
        verts_uvs.assign(uvs_np)
        verts_ndc.assign(ndc_np)
        fd = ((sides[0] - sides[1]) * g).sum() / (2 * h)
        moved = sides[0] != sides[1]  # the other outputs are bit-equal: no error
        # float32 outputs (2 ulps each side) of the slots that moved, over 2 h; between
        # the boundaries the output is bilinear in the UVs (central differences exact)
        # and smooth in the level: the O(h^2) truncation stays below 1e-3 of the
        # largest gradient of the array
        noise = 4 * EPS32 * (np.abs(sides[0]) * np.abs(g) * moved).sum() / (2 * h)
        got = grads[which][i, c]
        assert abs(fd - got) <= noise + 1e-3 * scale[which], (which, i, c, fd, got, noise)
    if filt == "nearest":
        assert np.abs(grads["uv"]).max() == 0
    else:
        assert np.abs(grads["uv"][verts]).max() > 0
    # the projected vertices reach the output only through the level fraction
    assert (np.abs(grads["ndc"][verts[2:]]).max() > 0) == (filt == "linear-mipmap-linear")


# ----------------------------------------------------------------------------- render contract
def test_a_mip_textured_step_allocates_nothing_and_captures(monkeypatch):
    """Render + MSE + backward with the hand-written adjoint: a second step allocates
    nothing and reads nothing back (cpu allocator counted; the same code runs on
    CUDA), and the step captured in a graph replays to the eager gradients."""

    device = "cpu"
    r, tex, verts = _bench_like_renderer(device, "linear-mipmap-linear")
    target = wp.zeros((2, 32, 32, 4), dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    tape = wp.Tape()

    def step():
        tape.reset()  # zeroes every gradient of the previous step (leaves and buffers)
        loss.zero_()
        with tape:
            image_mse(r.render(verts).image, target, out=loss)
        tape.backward(loss)

    step()
    with count_allocations_and_reads(monkeypatch) as calls:
        step()
    assert calls == {"alloc": 0, "numpy": 0}
    eager = [a.numpy().copy() for a in (verts.grad, tex.maps.grad, tex.verts_uvs.grad)]
    assert all(np.abs(e).max() > 0 for e in eager)
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for a in (verts.grad, tex.maps.grad, tex.verts_uvs.grad):
        a.fill_(1.0)  # the replay's reset zeroes them
    wp.capture_launch(cap.graph)
    for a, b in zip((verts.grad, tex.maps.grad, tex.verts_uvs.grad), eager, strict=True):
        # the same launches in the same order on the cpu (serial atomics): bit for bit
        np.testing.assert_array_equal(a.numpy(), b)
