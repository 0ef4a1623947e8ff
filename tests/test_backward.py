"""The hand-written backward (warpraster.backward) against Warp's generated adjoint
of the straight-line recompute (warpraster.backward.recompute), an independent
derivation of the same derivatives, on random scenes and every flag that changes them.

The two follow different conventions at ties and clamps (the hand-written one
PyTorch3D's, the generated adjoint Warp's ``wp.min``/``wp.max``/``wp.clamp``
adjoints; docs/BACKWARD.md), so they are compared on random scenes, where no
pixel centre lies exactly on an edge, a vertex, a medial axis of the distance
or a clamp, and with ``exact_perspective_grad=True`` (the default, written out
here): the perspective scenes clamp the denominator at blurred pixels outside
the face, where PyTorch3D's gradient (``exact_perspective_grad=False``) is not
the derivative (Warp's adjoint of ``wp.max`` is).
tests/test_backward_conventions.py checks the ties and clamps.
"""

import numpy as np
import pytest
import warp as wp

import warpraster as wr
from warpraster.backward import recompute_fragments

FLAGS = [
    {},
    {"blur_radius": 0.02},
    {"blur_radius": 0.02, "clip_barycentric_coords": True},
    {"perspective_correct": True, "blur_radius": 0.01},
    {"perspective_correct": True, "clip_barycentric_coords": True, "blur_radius": 0.01},
]


def _scene(seed, big=False):
    rng = np.random.default_rng(seed)
    if big:  # two faces covering most of a 96 x 96 image: thousands of slots per face
        v = np.array(
            [[-0.9, -0.9, 1.0], [0.9, -0.8, 1.5], [0.0, 0.95, 2.0], [0.8, 0.9, 1.2]], np.float32
        )
        f = np.array([[0, 1, 2], [1, 3, 2]], np.int32)
        return v, f, np.array([0], np.int32), np.array([2], np.int32), 96
    nf = 40
    xy = rng.uniform(-1.0, 1.0, (nf, 1, 2)) + rng.uniform(-0.35, 0.35, (nf, 3, 2))
    z = rng.uniform(0.5, 3.0, (nf, 3, 1))
    v = np.concatenate([xy, z], -1).reshape(-1, 3).astype(np.float32)
    f = np.arange(3 * nf, dtype=np.int32).reshape(-1, 3)
    return v, f, np.array([0, 15], np.int32), np.array([15, 25], np.int32), 24


def _seeded_grads(shape, seed):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal(shape).astype(np.float32),
        rng.standard_normal(shape + (3,)).astype(np.float32),
        rng.standard_normal(shape).astype(np.float32),
    )


def _grads(v, f, first, count, size, device, deterministic, flags, k=3, specialize=None):
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        fr = wr.rasterize_meshes(
            verts, f, first, count, image_size=size, faces_per_pixel=k, bin_size=8,
            deterministic=deterministic, tuning=wr.Tuning(specialize=specialize),
            exact_perspective_grad=True, **flags,
        )  # fmt: skip
    gz, gb, gd = _seeded_grads(fr.shape, 0)
    fr.zbuf.grad.assign(gz)
    fr.bary_coords.grad.assign(gb)
    fr.dists.grad.assign(gd)
    tape.backward()
    ours = verts.grad.numpy().copy()

    # Warp's generated adjoint of the recompute kernel, from the same pix_to_face.
    verts2 = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    faces = wp.array(f, dtype=wp.int32, device=device)
    out = wr.fragments.allocate_fragments(*fr.shape, device, True)
    out.pix_to_face.assign(fr.pix_to_face)
    tape2 = wp.Tape()
    with tape2:
        recompute_fragments(
            verts2, faces, out,
            perspective_correct=flags.get("perspective_correct", False),
            clip_barycentric_coords=flags.get("clip_barycentric_coords", False),
        )  # fmt: skip
    # the recompute must reproduce the fused forward's values
    np.testing.assert_array_equal(out.zbuf.numpy(), fr.zbuf.numpy())
    np.testing.assert_array_equal(out.dists.numpy(), fr.dists.numpy())
    out.zbuf.grad.assign(gz)
    out.bary_coords.grad.assign(gb)
    out.dists.grad.assign(gd)
    tape2.backward()
    return ours, verts2.grad.numpy(), fr


@pytest.mark.parametrize(
    "deterministic, specialize",
    [(False, None), (True, None), (False, True)],
    ids=["atomic", "deterministic", "atomic-flag-kernels"],
)
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "-".join(f) or "plain")
def test_hand_written_backward_equals_warp_autodiff(flags, deterministic, specialize, device):
    """Also with the flags compiled into the kernels (CUDA's default), forced here
    on the CPU too."""
    v, f, first, count, size = _scene(5)
    ours, auto, fr = _grads(
        v, f, first, count, size, device, deterministic, flags, specialize=specialize
    )
    assert (fr.pix_to_face.numpy() >= 0).sum() > 200  # the scene covers many slots
    assert np.abs(auto).max() > 1.0
    # Same derivatives in float32, summed in a different order (per face, then
    # per vertex, vs per slot): differences are rounding of sums of ~100 terms of
    # magnitude up to ~max|g|, i.e. ~1e-6 relative to the largest entry.
    scale = np.abs(auto).max()
    np.testing.assert_allclose(ours, auto, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_large_faces(deterministic, device):
    v, f, first, count, size = _scene(0, big=True)
    flags = {"blur_radius": 1e-3}
    ours, auto, fr = _grads(v, f, first, count, size, device, deterministic, flags, k=1)
    assert int((fr.pix_to_face.numpy() >= 0).sum()) > 4000
    scale = np.abs(auto).max()
    # thousands of terms per face: float32 summation-order error ~1e-5 relative
    np.testing.assert_allclose(ours, auto, rtol=1e-3, atol=1e-4 * scale)


def test_deterministic_backward_is_bit_identical_across_runs(device):
    v, f, first, count, size = _scene(9)
    flags = {"blur_radius": 0.02, "perspective_correct": True}
    a, _, _ = _grads(v, f, first, count, size, device, True, flags)
    b, _, _ = _grads(v, f, first, count, size, device, True, flags)
    np.testing.assert_array_equal(a, b)
