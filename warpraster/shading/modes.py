"""The closed sets of the shading kernels (compared inside kernels as ints)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["BlendMode", "ShadingMode", "TexelSource"]


class ShadingMode(IntEnum):
    """Where the lighting is evaluated."""

    PHONG = 0  # per slot, interpolated position and vertex normal
    FLAT = 1  # per slot, face centroid and face normal
    GOURAUD = 2  # per vertex, then interpolated


class TexelSource(IntEnum):
    """Where a slot's texel colour comes from."""

    WHITE = 0
    VERTEX = 1  # vertex colours interpolated with the barycentrics
    PIXEL = 2  # a (N, H, W, K) texel array (UV textures)


class BlendMode(IntEnum):
    HARD = 0
    SOFTMAX = 1
    SIGMOID = 2
