"""Meshes generated in code: icospheres (as PyTorch3D's ``ico_sphere``) and a torus.

Used by the examples, the benchmark and the tests, so no scene has to be
downloaded. All functions return NumPy ``(verts float32 (V, 3), faces int32 (F, 3))``.
"""

from __future__ import annotations

import numpy as np


def _icosahedron() -> tuple[np.ndarray, np.ndarray]:
    t = (1.0 + 5.0**0.5) / 2.0
    v = np.array(
        [
            [-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0],
            [0, -1, t], [0, 1, t], [0, -1, -t], [0, 1, -t],
            [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1],
        ],
        dtype=np.float64,
    )  # fmt: skip
    f = np.array(
        [
            [0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
            [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
            [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
            [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1],
        ],
        dtype=np.int64,
    )  # fmt: skip
    return v / np.linalg.norm(v, axis=1, keepdims=True), f


def _subdivide(v: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Splits every triangle in four; midpoints shared between neighbours."""
    edges = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    edges = np.sort(edges, axis=1)
    uniq, inv = np.unique(edges, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    mid = (v[uniq[:, 0]] + v[uniq[:, 1]]) / 2.0
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    nf = f.shape[0]
    m01 = inv[:nf] + v.shape[0]
    m12 = inv[nf : 2 * nf] + v.shape[0]
    m20 = inv[2 * nf :] + v.shape[0]
    a, b, c = f[:, 0], f[:, 1], f[:, 2]
    faces = np.concatenate(
        [
            np.stack([a, m01, m20], 1),
            np.stack([b, m12, m01], 1),
            np.stack([c, m20, m12], 1),
            np.stack([m01, m12, m20], 1),
        ]
    )
    return np.concatenate([v, mid]), faces


def ico_sphere(level: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit icosphere with ``20 * 4**level`` faces (level 8: 1.3M faces)."""
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    v, f = _icosahedron()
    for _ in range(level):
        v, f = _subdivide(v, f)
    return v.astype(np.float32), f.astype(np.int32)


def torus(
    major_radius: float = 1.0, minor_radius: float = 0.35, rings: int = 48, sides: int = 24
) -> tuple[np.ndarray, np.ndarray]:
    """Torus around the y axis, ``2 * rings * sides`` faces, outward-facing winding."""
    if rings < 3 or sides < 3:
        raise ValueError("rings and sides must be >= 3")
    u = np.arange(rings) * (2 * np.pi / rings)
    w = np.arange(sides) * (2 * np.pi / sides)
    uu, ww = np.meshgrid(u, w, indexing="ij")
    r = major_radius + minor_radius * np.cos(ww)
    verts = np.stack([r * np.cos(uu), minor_radius * np.sin(ww), r * np.sin(uu)], -1)
    i = np.arange(rings)[:, None]
    j = np.arange(sides)[None, :]
    a = i * sides + j
    b = ((i + 1) % rings) * sides + j
    c = ((i + 1) % rings) * sides + (j + 1) % sides
    d = i * sides + (j + 1) % sides
    faces = np.concatenate([np.stack([a, d, b], -1), np.stack([b, d, c], -1)]).reshape(-1, 3)
    return verts.reshape(-1, 3).astype(np.float32), faces.astype(np.int32)


def load_obj(path) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and fan-triangulated faces of a Wavefront OBJ file (v / f lines only)."""
    verts, faces = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "v":
                verts.append([float(x) for x in parts[1:4]])
            elif parts[0] == "f":
                idx = [int(p.split("/")[0]) for p in parts[1:]]
                idx = [i - 1 if i > 0 else len(verts) + i for i in idx]
                for k in range(1, len(idx) - 1):
                    faces.append([idx[0], idx[k], idx[k + 1]])
    return np.asarray(verts, np.float32).reshape(-1, 3), np.asarray(faces, np.int32).reshape(-1, 3)


def save_obj(path, verts: np.ndarray, faces: np.ndarray, header: str = "") -> None:
    """Writes triangles as a Wavefront OBJ file."""
    with open(path, "w", encoding="utf-8") as fh:
        if header:
            fh.write("".join(f"# {line}\n" for line in header.splitlines()))
        for v in verts:
            fh.write(f"v {v[0]:.6f} {v[1]:.6f} {v[2]:.6f}\n")
        for f in faces:
            fh.write(f"f {f[0] + 1} {f[1] + 1} {f[2] + 1}\n")
