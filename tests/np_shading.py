"""float64 NumPy oracles of PyTorch3D's lighting, shading and blending formulas.

Written from PyTorch3D's definitions (``lighting.diffuse``/``specular``,
``mesh/shading.py``, ``blending.py``), vectorised over leading dimensions; used
as the truth on randomised inputs and for finite differences.
"""

from __future__ import annotations

import numpy as np


def normalize(v):
    """``F.normalize(v, eps=1e-6)``."""
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-6)


def diffuse(normals, color, direction):
    n, d = normalize(normals), normalize(direction)
    return color * np.maximum((n * d).sum(-1), 0.0)[..., None]


def specular(points, normals, direction, color, camera, shininess):
    n, d = normalize(normals), normalize(direction)
    cos = (n * d).sum(-1)
    view = normalize(camera - points)
    refl = -d + 2.0 * cos[..., None] * n
    alpha = np.maximum((view * refl).sum(-1), 0.0) * (cos > 0)
    return color * (alpha ** shininess[...])[..., None]


def lit(
    kind, param, l_amb, l_dif, l_spec, m_amb, m_dif, m_spec, shin, points, normals, texel, camera
):
    """``(m_a l_a + m_d diffuse) * texel + m_s specular``; every argument broadcast per point.

    ``kind``: "ambient", "directional" (param = direction) or "point" (param = location).
    """
    if kind == "ambient":
        dif = spec = np.zeros_like(points)
    else:
        direction = param - points if kind == "point" else np.broadcast_to(param, points.shape)
        dif = diffuse(normals, l_dif, direction)
        spec = specular(points, normals, direction, l_spec, camera, shin)
    return (m_amb * l_amb + m_dif * dif) * texel + m_spec * spec


def camera_centre(R, T):
    """World camera centres (N, 3) from row-vector R (N, 3, 3), T (N, 3)."""
    return -np.einsum("nij,nj->ni", R, T)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def hard_blend(p2f, colors, background):
    bg = p2f[..., 0] < 0
    rgb = np.where(bg[..., None], background, colors[..., 0, :])
    return np.concatenate([rgb, (~bg)[..., None].astype(np.float64)], -1)


def sigmoid_blend(p2f, dists, colors, sigma):
    prob = sigmoid(-dists / sigma) * (p2f >= 0)
    alpha = 1.0 - np.prod(1.0 - prob, axis=-1)
    return np.concatenate([colors[..., 0, :], alpha[..., None]], -1)


def softmax_blend(p2f, dists, zbuf, colors, background, sigma, gamma, znear, zfar):
    """PyTorch3D's ``softmax_rgb_blend``; znear/zfar scalars or (N,)."""
    eps = 1e-10
    mask = p2f >= 0
    prob = sigmoid(-dists / sigma) * mask
    alpha = np.prod(1.0 - prob, axis=-1)
    zn = np.asarray(znear, np.float64).reshape(-1, 1, 1, 1)
    zf = np.asarray(zfar, np.float64).reshape(-1, 1, 1, 1)
    z_inv = (zf - zbuf) / (zf - zn) * mask
    z_inv_max = np.maximum(z_inv.max(-1, keepdims=True), eps)
    w = prob * np.exp((z_inv - z_inv_max) / gamma)
    delta = np.maximum(np.exp((eps - z_inv_max) / gamma), eps)
    denom = w.sum(-1, keepdims=True) + delta
    rgb = ((w[..., None] * colors).sum(-2) + delta * background) / denom
    return np.concatenate([rgb, (1.0 - alpha)[..., None]], -1)


def central_difference(fn, x, g, h):
    """d sum(fn(x) * g) / dx by float64 central differences of step ``h``, entry by
    entry of ``x``."""
    out = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        out[idx] = ((fn(xp) - fn(xm)) * g).sum() / (2 * h)
    return out
