"""The sparse antialias forward (the default) against the gather (``sparse=False``).

Truth: the gather path, which tests/test_antialias.py checks against nvdiffrast's
own numbers. Both analyse each pair with the same function, so their decisions
and alphas are the same bits; what differs is how a pixel's pairs are summed: the
gather adds them in a fixed order (upper, left, right, lower), the sparse pass
with float atomics in the order they land. On the CPU kernels run serially and
the atomics land in the gather's order, so there everything is compared bit for
bit; on a GPU a pixel changed by two or more pairs may differ in the last bits
(compared within rounding, the reason at each tolerance), a pixel changed by at
most one pair is compared bit for bit. Gradients come from the same adjoint on
the same pair records.

Scenes: random batches of overlapping icospheres (shared edges: occlusion edges
and silhouettes where a sphere folds away) and triangle soups (every edge a
silhouette candidate), rasterized by warpraster at K = 1, in square and
non-square images, with 1, 3 and 4 channels, with and without ``zbuf``.
"""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from host_counts import count_allocations_and_reads

import warpraster as wr
from warpraster.primitives import ico_sphere

#: (batch, height, width, channels, pass zbuf)
SCENES = [(1, 32, 32, 3, True), (3, 24, 40, 4, False), (2, 48, 20, 1, True)]


def _scene(seed: int, n: int, h: int, w: int, c: int, device):
    """Packed NDC vertices and faces of ``n`` images (two icospheres and a soup of
    six triangles each), the K = 1 fragments, and a random colour image."""
    rng = np.random.default_rng(seed)
    sv, sf = ico_sphere(1)
    verts, faces, first, count = [], [], [], []
    nv = 0
    for _ in range(n):
        start = sum(len(f) for f in faces)
        for _ in range(2):  # overlapping spheres: occlusion edges and silhouettes
            r = rng.uniform(0.3, 0.6)
            centre = [*rng.uniform(-0.4, 0.4, 2), rng.uniform(2.0, 3.0)]
            verts.append(sv * [r, r, 0.2] + centre)
            faces.append(sf + nv)
            nv += len(sv)
        soup = np.concatenate([rng.uniform(-1, 1, (18, 2)), rng.uniform(1.5, 3.5, (18, 1))], 1)
        verts.append(soup)
        faces.append(np.arange(18).reshape(6, 3) + nv)
        nv += 18
        first.append(start)
        count.append(sum(len(f) for f in faces) - start)
    verts = np.concatenate(verts).astype(np.float32)
    faces = np.concatenate(faces).astype(np.int32)
    v = wp.array(verts, dtype=wp.vec3, device=device)
    fw = wp.array(faces, dtype=wp.int32, device=device)
    frags = wr.rasterize_meshes(v, fw, first, count, image_size=(h, w), faces_per_pixel=1)
    color = rng.uniform(0.0, 1.0, (n, h, w, c)).astype(np.float32)
    return verts, faces, frags, color


def _run(op, verts, frags, color, g_out, zbuf, device):
    """(image, colour gradient, vertex gradient) of one call recorded on a fresh tape
    with upstream gradient ``g_out``."""
    c = wp.array(color, dtype=wp.float32, device=device, requires_grad=True)
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        out = op(c, frags.pix_to_face, v, zbuf=frags.zbuf if zbuf else None)
    out.grad.assign(g_out)
    tape.backward()
    return out.numpy().copy(), c.grad.numpy().copy(), v.grad.numpy().copy()


def _pairs_per_pixel(code: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """(N, H, W) how many pairs change each pixel: pair (p, slot) changes p when
    alpha > 0, else its right (slot 0) / lower (slot 1) neighbour."""
    live = code >= 0
    own = live & (alpha > 0)
    other = live & ~(alpha > 0)
    count = own.sum(-1)
    count[:, :, 1:] += other[:, :, :-1, 0]
    count[:, 1:, :] += other[:, :-1, :, 1]
    return count


@pytest.mark.parametrize("scene", SCENES, ids=lambda s: "x".join(map(str, s[:4])))
@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_forward_and_gradients_equal_the_gather(device, scene, seed):
    n, h, w, c, zbuf = scene
    verts, faces, frags, color = _scene(seed, n, h, w, c, device)
    g_out = np.random.default_rng(seed + 10).uniform(-1, 1, color.shape).astype(np.float32)
    shape = color.shape
    sparse = wr.Antialias(faces, len(verts), shape, device)
    gather = wr.Antialias(faces, len(verts), shape, device, sparse=False)
    assert sparse.sparse and not gather.sparse
    got = _run(sparse, verts, frags, color, g_out, zbuf, device)
    want = _run(gather, verts, frags, color, g_out, zbuf, device)
    # the same decisions, stored for the adjoint when a tape records
    np.testing.assert_array_equal(sparse.pair_code.numpy(), gather.pair_code.numpy())
    np.testing.assert_array_equal(sparse.pair_alpha.numpy(), gather.pair_alpha.numpy())
    per_pixel = _pairs_per_pixel(gather.pair_code.numpy(), gather.pair_alpha.numpy())
    assert (per_pixel == 1).sum() > 20  # edges blend
    assert (per_pixel >= 2).any()  # and some pixels sum two or more pairs
    changed = (got[0] != color).any(-1)
    assert changed.any() and not changed[per_pixel == 0].any()  # no pair: the colour
    one = per_pixel <= 1
    np.testing.assert_array_equal(got[0][one], want[0][one])
    if wp.get_device(device).is_cpu:
        # serial atomics: a pixel's pairs land in the gather's order
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        return
    # GPU: a pixel changed by 2-4 pairs (|alpha| <= 0.5 times colour differences
    # in [-1, 1]) sums values <= 3 in another order: a few ulps of 2.4e-7.
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)
    # the colour gradient is gathered from the same records: the same bits
    np.testing.assert_array_equal(got[1], want[1])
    # vertex gradients: float atomics in both (hundreds of terms of size <= ~100
    # at these sizes, in any order: 1e-3 of values up to ~1e3)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-3)


def test_records_only_when_recorded_or_asked(device):
    """The sparse pass writes the pair records for a recorded call (the adjoint
    reads them) or with ``store_pairs``; else it leaves them as they were."""
    verts, faces, frags, color = _scene(3, 2, 24, 32, 3, device)
    c = wp.array(color, dtype=wp.float32, device=device)
    v = wp.array(verts, dtype=wp.vec3, device=device)
    gather = wr.Antialias(faces, len(verts), color.shape, device, sparse=False)
    want = gather(c, frags.pix_to_face, v).numpy()
    codes = gather.pair_code.numpy().copy()
    op = wr.Antialias(faces, len(verts), color.shape, device)
    op.pair_code.fill_(-7)
    np.testing.assert_array_equal(op(c, frags.pix_to_face, v).numpy(), want)
    assert (op.pair_code.numpy() == -7).all()  # not recorded, not asked: untouched
    op.store_pairs = True
    np.testing.assert_array_equal(op(c, frags.pix_to_face, v).numpy(), want)
    np.testing.assert_array_equal(op.pair_code.numpy(), codes)
    np.testing.assert_array_equal(op.pair_alpha.numpy(), gather.pair_alpha.numpy())


def test_strided_color_and_out(device):
    """A colour view with strides (every image's first 3 of 4 channels) and an
    ``out=`` array take the copy kernel instead of the memcpy: the same image."""
    verts, faces, frags, rgba = _scene(4, 2, 20, 28, 4, device)
    base = wp.array(rgba, dtype=wp.float32, device=device)
    rgb = base[:, :, :, :3]
    assert not rgb.is_contiguous
    gather = wr.Antialias(faces, len(verts), rgb.shape, device, sparse=False)
    v = wp.array(verts, dtype=wp.vec3, device=device)
    want = gather(wp.array(rgba[..., :3], dtype=wp.float32, device=device),
                  frags.pix_to_face, v).numpy()  # fmt: skip
    op = wr.Antialias(faces, len(verts), rgb.shape, device)
    tol = {} if wp.get_device(device).is_cpu else {"atol": 1e-6}  # see the test above
    np.testing.assert_allclose(op(rgb, frags.pix_to_face, v).numpy(), want, rtol=0, **tol)
    for _ in range(2):  # a new out= array, then the same one again
        out = wp.empty(rgb.shape, dtype=wp.float32, device=device)
        got = op(rgb, frags.pix_to_face, v, out=out)
        assert got is out
        np.testing.assert_allclose(out.numpy(), want, rtol=0, **tol)
    wide = wp.zeros((2, 20, 28, 6), dtype=wp.float32, device=device)
    op(rgb, frags.pix_to_face, v, out=wide[:, :, :, 1:4])
    np.testing.assert_allclose(wide.numpy()[..., 1:4], want, rtol=0, **tol)
    assert not wide.numpy()[..., [0, 4, 5]].any()  # nothing written beside the view


def test_sparse_needs_atomics():
    faces = np.array([[0, 1, 2]], np.int32)
    with pytest.raises(ValueError, match="deterministic"):
        wr.Antialias(faces, 3, (1, 4, 4, 3), "cpu", deterministic=True, sparse=True)
    with pytest.raises(TypeError, match="sparse"):
        wr.Antialias(faces, 3, (1, 4, 4, 3), "cpu", sparse=1)
    assert not wr.Antialias(faces, 3, (1, 4, 4, 3), "cpu", deterministic=True).sparse


def test_fresh_tape_training_loop_and_graph_replay(monkeypatch):
    """Steps on fresh tapes with no ``tape.zero()`` (the user zeroes only their own
    arrays): step 3 equals step 1 bit for bit (the op clears its own output's
    gradient when it records); a step after the first allocates nothing and reads
    nothing back; a captured step replays to the eager numbers (cpu: serial
    atomics, one order)."""
    device = "cpu"
    verts, faces, frags, color = _scene(5, 2, 24, 30, 3, device)
    op = wr.Antialias(faces, len(verts), color.shape, device)
    c = wp.array(color, dtype=wp.float32, device=device, requires_grad=True)
    v = wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)
    weights = np.random.default_rng(6).uniform(-1, 1, color.shape).astype(np.float32)
    target = wp.array(weights, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    @wp.kernel
    def weighted_sum(x: wp.array4d(dtype=float), wt: wp.array4d(dtype=float),
                     out: wp.array(dtype=float)):  # fmt: skip
        i, j, k, m = wp.tid()
        wp.atomic_add(out, 0, x[i, j, k, m] * wt[i, j, k, m])

    def step():
        for x in (c.grad, v.grad, loss):
            x.zero_()
        tape = wp.Tape()
        with tape:
            out = op(c, frags.pix_to_face, v)
            wp.launch(weighted_sum, dim=out.shape, inputs=[out, target], outputs=[loss],
                      device=device)  # fmt: skip
        tape.backward(loss)

    def snapshot():
        return [x.numpy().copy() for x in (op.out, loss, c.grad, v.grad)]

    steps = []
    for i in range(3):
        if i == 2:
            with count_allocations_and_reads(monkeypatch) as calls:
                step()
            assert calls == {"alloc": 0, "numpy": 0}
        else:
            step()
        steps.append(snapshot())
    for a, b in zip(steps[0], steps[2], strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.abs(steps[0][3]).max() > 0  # edges moved the loss
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        step()
    for x in (op.out, loss, c.grad, v.grad):
        x.zero_()
    wp.capture_launch(cap.graph)
    for a, b in zip(steps[0], snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)
