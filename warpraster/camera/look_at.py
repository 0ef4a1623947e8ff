"""Look-at poses: world -> view (R, T) of cameras looking at a point, as PyTorch3D's.

Computed on the host in float64 from NumPy (or Warp arrays, read back), returned
as float32 NumPy arrays ready for any camera's ``R`` and ``T``.
"""

from __future__ import annotations

import numpy as np

from .inputs import ROTATION_TOLERANCE, ArrayInput, broadcast_rows, rows

__all__ = ["look_at_rotation", "look_at_view_transform"]


def _normalize(v: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    # torch.nn.functional.normalize: v / max(|v|, eps)
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), eps)


def look_at_rotation(
    camera_position: ArrayInput,
    at: ArrayInput = ((0, 0, 0),),
    up: ArrayInput = ((0, 1, 0),),
) -> np.ndarray:
    """World -> view rotations of cameras at ``camera_position`` looking at ``at``.

    PyTorch3D's ``look_at_rotation``: the view z axis points from the camera to
    ``at``; x = up x z; y = z x x; R holds them as columns.

    Args:
        camera_position: (N, 3), (1, 3) or (3,) camera centres.
        at: (N, 3), (1, 3) or (3,) look-at points.
        up: (N, 3), (1, 3) or (3,) world up directions.

    Returns:
        (N, 3, 3) float32 rotations.

    Raises:
        ValueError: bad shapes, or a camera whose ``up`` is (nearly) parallel to
            its viewing direction or that sits at ``at`` (no rotation is defined;
            PyTorch3D returns a degenerate matrix there).
    """
    c, a, u = broadcast_rows(
        {
            "camera_position": rows(camera_position, "camera_position", 3),
            "at": rows(at, "at", 3),
            "up": rows(up, "up", 3),
        }
    )
    z = _normalize(a - c)
    x = _normalize(np.cross(u, z))
    y = _normalize(np.cross(z, x))
    is_close = np.all(np.abs(x) <= 5e-3, axis=1, keepdims=True)
    if is_close.any():
        x = np.where(is_close, _normalize(np.cross(y, z)), x)
    R = np.stack([x, y, z], axis=2)
    bad = np.abs(np.einsum("nij,nkj->nik", R, R) - np.eye(3)).max(axis=(1, 2)) >= ROTATION_TOLERANCE
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"no look-at rotation for camera {i}: up={u[i].tolist()} is parallel to the viewing "
            f"direction {(a[i] - c[i]).tolist()} (or the camera is at `at`)"
        )
    return R.astype(np.float32)


def look_at_view_transform(
    dist: ArrayInput = 1.0,
    elev: ArrayInput = 0.0,
    azim: ArrayInput = 0.0,
    degrees: bool = True,
    eye: ArrayInput | None = None,
    at: ArrayInput = ((0, 0, 0),),
    up: ArrayInput = ((0, 1, 0),),
) -> tuple[np.ndarray, np.ndarray]:
    """World -> view (R, T) of cameras looking at ``at``, as PyTorch3D's.

    The camera sits at ``eye`` if given, else at spherical coordinates around
    ``at``: ``dist * (cos(elev) sin(azim), sin(elev), cos(elev) cos(azim))``
    (elev from the xz-plane, azim from +z towards +x).

    Args:
        dist: distances from ``at``, scalar or (N,).
        elev: elevations, scalar or (N,); degrees unless ``degrees=False``.
        azim: azimuths, scalar or (N,); degrees unless ``degrees=False``.
        degrees: unit of ``elev`` and ``azim``.
        eye: (N, 3) or (3,) camera positions; overrides dist/elev/azim.
        at: (N, 3) or (3,) look-at points.
        up: (N, 3) or (3,) world up directions.

    Returns:
        ``(R, T)``: float32 NumPy arrays (N, 3, 3) and (N, 3), computed in float64.

    Raises:
        ValueError: shapes that do not broadcast, non-finite values, or a degenerate
            view (see :func:`look_at_rotation`).
    """
    if eye is not None:
        c, a, u = broadcast_rows(
            {"eye": rows(eye, "eye", 3), "at": rows(at, "at", 3), "up": rows(up, "up", 3)}
        )
    else:
        d, e, z, a, u = broadcast_rows(
            {
                "dist": rows(dist, "dist", None),
                "elev": rows(elev, "elev", None),
                "azim": rows(azim, "azim", None),
                "at": rows(at, "at", 3),
                "up": rows(up, "up", 3),
            }
        )
        if degrees:
            e = np.deg2rad(e)
            z = np.deg2rad(z)
        c = np.stack([d * np.cos(e) * np.sin(z), d * np.sin(e), d * np.cos(e) * np.cos(z)], 1) + a
    R = look_at_rotation(c, a, u).astype(np.float64)
    # T = -R^T C (column form), i.e. the camera centre maps to the view origin.
    T = -np.einsum("nji,nj->ni", R, c)
    return R.astype(np.float32), T.astype(np.float32)
