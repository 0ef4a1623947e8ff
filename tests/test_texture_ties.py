"""TexturesUV follows PyTorch3D's texture arithmetic, not only its algebra.

PyTorch3D's ``TexturesUV.sample_textures`` maps the interpolated UVs to grid
coordinates with ``torch.lerp((-1, 1), (1, -1), uv)`` (v flipped, the map left as
it is) and calls ``torch.nn.functional.grid_sample``. Flipping the map and sampling
at ``2 v - 1`` instead is the same algebra but not the same arithmetic: at an exact
texel tie (v = 0.5 on a 12-texel map with ``align_corners=True`` lands on row 5.5)
grid_sample's nearest mode rounds half to even, which picks the other texel.

Truth: torch itself on the cpu device (``torch.lerp`` then ``grid_sample``, which
is PyTorch3D's arithmetic exactly). Each sample is its own face whose three UVs
are equal and whose barycentrics are (1, 0, 0), so the interpolated UV is the
given float32 UV exactly and the comparison is bit for bit (no tolerance: the
same float32 operations in the same order give the same bits).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import warp as wp

from warpraster.shading import TexturesUV

torch = pytest.importorskip("torch")

MODES = list(
    itertools.product(["zeros", "border", "reflection"], [True, False], ["nearest", "bilinear"])
)


def _tie_uvs() -> np.ndarray:
    """float32 UVs on and around texel ties of 12- and 7-texel maps, inside and
    outside [0, 1] (the padding modes), and random ones."""
    steps = [k / d for d in (11, 12, 22, 24, 44, 48, 6, 7, 14) for k in range(-30, 80)]
    vals = np.unique(np.array(steps + [0.5, 0.25, 0.75, -0.5, 1.5], np.float32))
    rng = np.random.default_rng(0)
    u = np.concatenate([rng.choice(vals, 400), rng.uniform(-1.5, 2.5, 200).astype(np.float32)])
    v = np.concatenate([rng.choice(vals, 400), rng.uniform(-1.5, 2.5, 200).astype(np.float32)])
    # every (u, v) pair of a few exact ties as well
    ties = np.array([0.5, 0.25, 1.0 / 22.0 * 11.0, 0.0, 1.0, -0.5, 1.5], np.float32)
    tu, tv = np.meshgrid(ties, ties)
    uv = np.stack([np.concatenate([u, tu.ravel()]), np.concatenate([v, tv.ravel()])], -1)
    return uv.astype(np.float32)


def _sample_both(maps: np.ndarray, uv: np.ndarray, pad: str, align: bool, mode: str, device):
    """(warpraster's TexturesUV, PyTorch3D's arithmetic in torch) at the float32 UVs
    ``uv`` (P, 2), as (P, C) each."""
    p = uv.shape[0]
    verts_uvs = np.repeat(uv, 3, axis=0)  # face i: three equal UVs
    faces_uvs = np.arange(3 * p, dtype=np.int32).reshape(p, 3)
    p2f = np.arange(p, dtype=np.int32).reshape(1, 1, p, 1)
    bary = np.zeros((1, 1, p, 1, 3), np.float32)
    bary[..., 0] = 1.0  # 1 * uv + 0 * uv + 0 * uv == uv exactly
    tex = TexturesUV(maps, faces_uvs, verts_uvs, pad, align, mode, device=device)
    frags = (
        wp.array(p2f, dtype=wp.int32, device=device),
        wp.array(bary, dtype=wp.vec3, device=device),
    )
    got = tex.sample_textures(frags).numpy().reshape(p, -1)

    grid = torch.lerp(
        torch.tensor([-1.0, 1.0]), torch.tensor([1.0, -1.0]), torch.tensor(uv)[None, None]
    )
    ref = torch.nn.functional.grid_sample(
        torch.tensor(maps).permute(0, 3, 1, 2), grid, mode=mode, align_corners=align,
        padding_mode=pad,
    )  # fmt: skip
    return got, ref[0, :, 0].T.numpy()


@pytest.mark.parametrize("pad,align,mode", MODES)
@pytest.mark.parametrize("size", [(12, 12), (7, 12)])
def test_uv_sampling_matches_pytorch3d_bit_for_bit_at_texel_ties(device, pad, align, mode, size):
    rng = np.random.default_rng(1)
    maps = rng.uniform(0.0, 1.0, (1, *size, 3)).astype(np.float32)
    got, ref = _sample_both(maps, _tie_uvs(), pad, align, mode, device)
    bad = np.flatnonzero((got.view(np.uint32) != ref.view(np.uint32)).any(axis=1))
    assert bad.size == 0, (bad[:5], _tie_uvs()[bad[:5]], got[bad[:5]], ref[bad[:5]])


def test_nearest_tie_picks_pytorch3ds_texel_not_the_flipped_maps(device):
    """v = 0.5 on a 12-row map (align_corners): grid y = 0 -> row 5.5 -> row 6 (half
    to even). Sampling the map flipped in v at 2 v - 1 would give row 11 - 6 = 5."""
    maps = np.zeros((1, 12, 12, 1), np.float32)
    maps[0, :, :, 0] = np.arange(12, dtype=np.float32)[:, None]  # texel value = its row
    uv = np.array([[0.5, 0.5]], np.float32)
    got, ref = _sample_both(maps, uv, "border", True, "nearest", device)
    assert ref[0, 0] == 6.0  # torch's own answer: row 6
    assert got[0, 0] == 6.0
