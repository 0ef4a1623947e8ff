"""The binned pass's default list capacity leaves room for the blur radius.

A bin whose list does not fit falls back to every face of its mesh: exact, but
tens of times slower. With blur every face's box grows by the blur radius on
each side, so a small face touches many bins; the default capacity must follow
or a soft render silently takes the fallback (it did: 3,606 bins of the K = 8
soft-Phong bench scene, 4x slower). Truth: the naive pass (bin_size=0).
"""

from __future__ import annotations

import numpy as np
import warp as wp

import warpraster as wr
from warpraster.primitives import ico_sphere


def test_blurred_small_faces_fit_the_default_bins(device):
    v, f = ico_sphere(3)  # 1,280 faces of ~2 px at 64 x 64
    verts = (v * 0.8 + np.array([0.0, 0.0, 2.5])).astype(np.float32)
    faces = f.astype(np.int32)
    # blur radius 8 px: sqrt(blur) * 64 / 2 = 8  ->  each face's box spans ~4 x 3 bins of 4 x 8
    blur = (8.0 / 32.0) ** 2
    args = dict(image_size=64, faces_per_pixel=4, blur_radius=blur, perspective_correct=False)
    first = np.array([0], np.int32)
    count = np.array([len(faces)], np.int32)
    dev_verts = wp.array(verts, dtype=wp.vec3, device=device)
    binned = wr.rasterize_meshes(dev_verts, faces, first, count, **args)
    naive = wr.rasterize_meshes(dev_verts, faces, first, count, bin_size=0, **args)
    assert binned.overflowed_bins() == 0
    assert (naive.pix_to_face.numpy() >= 0).mean() > 0.3  # the blur really fills pixels
    for key in ("pix_to_face", "zbuf", "bary_coords", "dists"):
        np.testing.assert_array_equal(getattr(binned, key).numpy(), getattr(naive, key).numpy())
