"""Frustum culling: which faces ``cull_to_frustum`` removes (:class:`FrustumCullRule`)
and the per-face tests the clip pass runs."""

from __future__ import annotations

import enum

import warp as wp

__all__ = ["FrustumCullRule"]


class FrustumCullRule(enum.IntEnum):
    """Which faces ``cull_to_frustum`` removes (the frustum is x, y in [-1, 1]).

    Culling only saves work when it is right; both rules keep the z clipping as is.
    """

    PYTORCH3D = 1
    """PyTorch3D 0.7.9 (issue #1936): ``face_verts[:, axis]`` picks a *vertex*, not a
    coordinate, so a face is dropped when vertex 0 has x, y and z all < -1 or all > 1,
    or vertex 1 has x, y and z all < -1 or all > 1. It can drop visible faces and keep
    faces wholly outside. The default, for parity."""

    PLANES = 2
    """The intended rule: drop a face when all three vertices have x < -1, or all x > 1,
    or all y < -1, or all y > 1. Note that on the long side of a non-square image the
    NDC range exceeds [-1, 1], so this too can drop visible faces there."""


@wp.func
def _all_beyond(v: wp.vec3, lo: float, hi: float) -> bool:
    """PyTorch3D 0.7.9's test of one vertex: all of x, y, z < lo, or all > hi."""
    below = v[0] < lo and v[1] < lo and v[2] < lo
    above = v[0] > hi and v[1] > hi and v[2] > hi
    return below or above


@wp.func
def _outside_planes(v0: wp.vec3, v1: wp.vec3, v2: wp.vec3) -> bool:
    """All three vertices beyond the same side of the square x, y in [-1, 1]."""
    left = v0[0] < -1.0 and v1[0] < -1.0 and v2[0] < -1.0
    right = v0[0] > 1.0 and v1[0] > 1.0 and v2[0] > 1.0
    top = v0[1] < -1.0 and v1[1] < -1.0 and v2[1] < -1.0
    bottom = v0[1] > 1.0 and v1[1] > 1.0 and v2[1] > 1.0
    return left or right or top or bottom
