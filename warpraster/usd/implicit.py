"""Implicit gprims (Cube, Sphere, Cylinder, Cone, Capsule, Plane) tessellated into
polygons, at the sizes and axis authored at the load time."""

from __future__ import annotations

import numpy as np
from pxr import Usd, UsdGeom

__all__ = ["implicit_kind", "implicit_topology"]


IMPLICIT_SEGMENTS = 32


def implicit_kind(prim: Usd.Prim) -> str | None:
    """``"Cube"``, ``"Sphere"``, ``"Cylinder"``, ``"Cone"``, ``"Capsule"``, ``"Plane"`` or None."""
    for name in ("Cube", "Sphere", "Cylinder", "Cone", "Capsule", "Plane"):
        if prim.IsA(getattr(UsdGeom, name)):
            return name
    return None


def _along_axis(p: np.ndarray, axis: str) -> np.ndarray:
    """Points built along +Z turned to ``axis`` (a cyclic permutation: a rotation)."""
    if axis == "X":
        return p[:, [2, 0, 1]]
    if axis == "Y":
        return p[:, [1, 2, 0]]
    return p


def _rings(radii: np.ndarray, heights: np.ndarray, n: int):
    """Quads between consecutive circles (radius, z) of n segments; each circle its own points."""
    ang = 2 * np.pi * np.arange(n) / n
    pts = np.concatenate(
        [
            np.stack([r * np.cos(ang), r * np.sin(ang), np.full(n, z)], 1)
            for r, z in zip(radii, heights, strict=True)
        ]
    )
    k = np.arange(n)
    quads = [
        np.stack([i * n + k, i * n + (k + 1) % n, (i + 1) * n + (k + 1) % n, (i + 1) * n + k], 1)
        for i in range(len(radii) - 1)
    ]
    return pts, np.concatenate(quads)


def _cap(radius: float, z: float, n: int, up: bool, first: int):
    ang = 2 * np.pi * np.arange(n) / n
    pts = np.stack([radius * np.cos(ang), radius * np.sin(ang), np.full(n, z)], 1)
    idx = np.arange(n) if up else np.arange(n)[::-1]
    return pts, (idx + first)[None]


def implicit_topology(prim: Usd.Prim, time: Usd.TimeCode):
    """Polygons of an implicit gprim at ``time``: counts, indices, points (float32).

    Curved surfaces use 32 segments; creases have their own points (so smooth
    vertex normals are flat across caps and cube faces).
    """
    kind = implicit_kind(prim)
    n = IMPLICIT_SEGMENTS
    get = lambda name, d: prim.GetAttribute(name).Get(time) if prim.HasAttribute(name) else d  # noqa: E731
    axis = str(get("axis", "Z") or "Z")
    if kind == "Cube":
        s = float(get("size", 2.0)) / 2
        c = np.array([[x, y, z] for x in (-s, s) for y in (-s, s) for z in (-s, s)])
        quads = np.array(
            [[0, 1, 3, 2], [4, 6, 7, 5], [0, 4, 5, 1], [2, 3, 7, 6], [0, 2, 6, 4], [1, 5, 7, 3]]
        )
        pts = c[quads.ravel()]
        polys = np.arange(24).reshape(6, 4)
    elif kind == "Sphere":
        from ..primitives import ico_sphere

        v, f = ico_sphere(3)
        pts, polys = v * float(get("radius", 1.0)), f
    elif kind in ("Cylinder", "Cone", "Capsule"):
        r = float(get("radius", 0.5 if kind == "Capsule" else 1.0))
        h = float(get("height", 1.0 if kind == "Capsule" else 2.0)) / 2
        if kind == "Cylinder":
            radii, heights = np.array([r, r]), np.array([-h, h])
        elif kind == "Cone":
            radii, heights = np.array([r, 0.0]), np.array([-h, h])
        else:
            t = np.linspace(0, np.pi / 2, 9)
            radii = np.concatenate([r * np.sin(t), r * np.sin(t)[::-1]])
            heights = np.concatenate([-h - r * np.cos(t), h + r * np.cos(t)[::-1]])
        pts, polys = _rings(radii, heights, n)
        polys = [polys]
        if kind != "Capsule":
            bottom, bi = _cap(r, -h, n, False, len(pts))
            pts = np.concatenate([pts, bottom])
            polys.append(bi)
            if kind == "Cylinder":
                top, ti = _cap(r, h, n, True, len(pts))
                pts = np.concatenate([pts, top])
                polys.append(ti)
        counts = np.concatenate([np.full(len(p), p.shape[1]) for p in polys])
        indices = np.concatenate([p.ravel() for p in polys])
        return (
            counts.astype(np.int64),
            indices.astype(np.int64),
            _along_axis(pts, axis).astype(np.float32),
        )
    else:  # Plane
        w, ln = float(get("width", 2.0)) / 2, float(get("length", 2.0)) / 2
        pts = np.array([[-w, -ln, 0], [w, -ln, 0], [w, ln, 0], [-w, ln, 0]], np.float64)
        polys = np.array([[0, 1, 2, 3]])
    counts = np.full(len(polys), np.asarray(polys).shape[1])
    return (
        counts.astype(np.int64),
        np.asarray(polys).ravel().astype(np.int64),
        _along_axis(pts, axis).astype(np.float32),
    )
