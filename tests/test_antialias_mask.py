"""The antialias pair analysis's per-face silhouette flags
(warpraster/antialiasing/silhouette_mask.py): a face flagged 0 is skipped before its
vertices are loaded, which must change nothing. Truth: the same op with the flags
off (``silhouette_mask = False``, every pair analysed in full): equal pair records,
images and gradients, bit for bit (the same decisions and arithmetic; the forward's
float atomics aside, compared as test_antialias_sparse.py does), on scenes made to
stress the flags: dense closed spheres (most pairs interior, a few silhouette
faces), open meshes (boundary edges), faces seen nearly edge-on and vertices far off
screen. Also that the flags do their job: most faces of a closed sphere are 0."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from test_antialias_sparse import _run, _scene

import warpraster as wr
from warpraster.primitives import ico_sphere


def _dense_scene(kind: str, device, h=48, w=40):
    """Two images of a level-3 icosphere (1280 faces): closed, open (its lower half
    removed), squashed nearly edge-on, or one vertex pushed far off screen."""
    rng = np.random.default_rng(7)
    v, f = ico_sphere(3)
    if kind == "open":
        f = f[v[f].mean(1)[:, 1] > -0.2]
    v = v * [0.6, 0.6, 0.3] + [0.0, 0.0, 2.5]
    if kind == "edge_on":
        v[:, 1] *= 0.25  # squashed: many faces seen nearly edge-on (small orientations)
    if kind == "far":
        v[5] = [4.0e4, -3.0e4, 2.5]
    v = v + rng.normal(0.0, 2e-3, v.shape)
    verts = np.concatenate([v, v * [1.1, 0.9, 1.0] + [0.2, -0.1, 0.1]]).astype(np.float32)
    faces = np.concatenate([f, f + len(v)]).astype(np.int32)
    vw = wp.array(verts, dtype=wp.vec3, device=device)
    fw = wp.array(faces, dtype=wp.int32, device=device)
    first, count = [0, len(f)], [len(f), len(f)]
    frags = wr.rasterize_meshes(vw, fw, first, count, image_size=(h, w), faces_per_pixel=1)
    color = rng.uniform(0.0, 1.0, (2, h, w, 3)).astype(np.float32)
    return verts, faces, frags, color


def _compare(device, verts, faces, frags, color, zbuf=True, sparse=True):
    g_out = np.random.default_rng(3).uniform(-1, 1, color.shape).astype(np.float32)
    ops, results = [], []
    for mask in (False, True):
        op = wr.Antialias(faces, len(verts), color.shape, device, sparse=sparse)
        op.silhouette_mask = mask
        results.append(_run(op, verts, frags, color, g_out, zbuf, device))
        ops.append(op)
    full, masked = ops
    np.testing.assert_array_equal(masked.pair_code.numpy(), full.pair_code.numpy())
    np.testing.assert_array_equal(masked.pair_alpha.numpy(), full.pair_alpha.numpy())
    exact = wp.get_device(device).is_cpu or not sparse
    for k, (want, got) in enumerate(zip(*results, strict=True)):
        if exact or k == 1:  # the colour gradient is gathered from equal records
            np.testing.assert_array_equal(got, want, err_msg=f"output {k}")
        else:  # float atomics in another order, as test_antialias_sparse.py argues
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3 if k == 2 else 1e-6)
    return masked._face_mask.numpy(), int((full.pair_code.numpy() >= 0).sum())


@pytest.mark.parametrize("kind", ["closed", "open", "edge_on", "far"])
def test_flags_change_nothing(device, kind):
    mask, pairs = _compare(device, *_dense_scene(kind, device))
    assert pairs > 0  # edges blend
    if kind in ("closed", "far"):
        # closed spheres: their silhouette faces only (a ring), about 10% here
        assert 0 < mask.mean() < 0.3


@pytest.mark.parametrize("seed", [0, 1])
def test_flags_change_nothing_on_soups_and_the_gather(device, seed):
    """The sparse suite's scenes (spheres and triangle soups, zbuf recomputed) and the
    gather forward (deterministic path) with the flags."""
    verts, faces, frags, color = _scene(seed, 2, 24, 40, 3, device)
    for zbuf, sparse in ((False, True), (True, False)):
        assert _compare(device, verts, faces, frags, color, zbuf=zbuf, sparse=sparse)[1] > 20
