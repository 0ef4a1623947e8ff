"""Triangle meshes of primitive shapes in their local frames (Newton's conventions).

Every function returns NumPy ``(vertices float32 (V, 3), faces int32 (F, 3))``
with faces counter-clockwise seen from outside. Capsules and cylinders run
along local Z; a plane lies in local XY with normal +Z. Curved shapes are
polygonal, so their outlines differ from an exact ray-traced surface by at most
the sagitta ``r (1 - cos(pi / segments))``.
"""

from __future__ import annotations

import numpy as np


def box_mesh(hx: float, hy: float, hz: float) -> tuple[np.ndarray, np.ndarray]:
    """Box of half extents (hx, hy, hz): 8 vertices, 12 faces."""
    s = np.array([[x, y, z] for z in (-1, 1) for y in (-1, 1) for x in (-1, 1)], np.float64)
    v = s * np.array([hx, hy, hz])
    # vertex i has bits (x, y, z) = (i & 1, i >> 1 & 1, i >> 2 & 1)
    quads = [
        (0, 2, 3, 1),  # -z
        (4, 5, 7, 6),  # +z
        (0, 1, 5, 4),  # -y
        (2, 6, 7, 3),  # +y
        (0, 4, 6, 2),  # -x
        (1, 3, 7, 5),  # +x
    ]
    f = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    return v.astype(np.float32), np.asarray(f, np.int32)


def grid_mesh(nx: int, ny: int, sx: float, sy: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid of (nx + 1) x (ny + 1) vertices spanning [0, nx sx] x [0, ny sy] in the XY
    plane (vertex ``j * (nx + 1) + i`` at (i sx, j sy, 0)), normal +Z: Newton's
    ``add_cloth_grid`` vertex order."""
    i, j = np.meshgrid(np.arange(nx + 1), np.arange(ny + 1))
    v = np.stack([i.ravel() * sx, j.ravel() * sy, np.zeros(i.size)], axis=1)
    f = []
    for y in range(ny):
        for x in range(nx):
            a = y * (nx + 1) + x
            b, c, d = a + 1, a + nx + 2, a + nx + 1
            f += [(a, b, c), (a, c, d)]
    return v.astype(np.float32), np.asarray(f, np.int32).reshape(-1, 3)


def _revolve(profile: np.ndarray, segments: int) -> tuple[np.ndarray, np.ndarray]:
    """Surface of revolution about Z of a (radius, z) profile from bottom pole to top pole."""
    ang = 2.0 * np.pi * np.arange(segments) / segments
    rings = profile[1:-1]
    verts = [[0.0, 0.0, profile[0, 1]]]
    for r, z in rings:
        verts += [[r * np.cos(a), r * np.sin(a), z] for a in ang]
    verts.append([0.0, 0.0, profile[-1, 1]])
    top = len(verts) - 1
    f = []
    for k in range(segments):
        f.append((0, 1 + (k + 1) % segments, 1 + k))
    for ring in range(len(rings) - 1):
        b0 = 1 + ring * segments
        b1 = b0 + segments
        for k in range(segments):
            k1 = (k + 1) % segments
            f += [(b0 + k, b0 + k1, b1 + k1), (b0 + k, b1 + k1, b1 + k)]
    last = 1 + (len(rings) - 1) * segments
    for k in range(segments):
        f.append((last + k, last + (k + 1) % segments, top))
    return np.asarray(verts, np.float32), np.asarray(f, np.int32)


def sphere_mesh(radius: float, *, segments: int = 24, rings: int = 12):
    """UV sphere of ``radius`` centred at the origin."""
    t = np.pi * np.arange(rings + 1) / rings  # 0 = bottom pole
    profile = np.stack([radius * np.sin(t), -radius * np.cos(t)], axis=1)
    return _revolve(profile, segments)


def capsule_mesh(radius: float, half_height: float, *, segments: int = 24, rings: int = 6):
    """Capsule along Z: a cylinder of half length ``half_height`` with hemispherical caps."""
    t = 0.5 * np.pi * np.arange(rings + 1) / rings
    bottom = np.stack([radius * np.sin(t), -half_height - radius * np.cos(t)], axis=1)
    top = np.stack([radius * np.cos(t), half_height + radius * np.sin(t)], axis=1)
    return _revolve(np.concatenate([bottom, top]), segments)


def cylinder_mesh(radius: float, half_height: float, *, segments: int = 24):
    """Closed cylinder along Z of half length ``half_height``."""
    profile = np.array(
        [[0.0, -half_height], [radius, -half_height], [radius, half_height], [0.0, half_height]]
    )
    return _revolve(profile, segments)


def plane_mesh(width: float, length: float) -> tuple[np.ndarray, np.ndarray]:
    """Rectangle [-width, width] x [-length, length] in the XY plane, normal +Z
    (Newton's plane shape scale is half extents)."""
    v = np.array([[-width, -length, 0], [width, -length, 0], [width, length, 0],
                  [-width, length, 0]], np.float32)  # fmt: skip
    return v, np.array([[0, 1, 2], [0, 2, 3]], np.int32)


__all__ = ["box_mesh", "capsule_mesh", "cylinder_mesh", "grid_mesh", "plane_mesh", "sphere_mesh"]
