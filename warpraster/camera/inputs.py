"""Host-side parsing and validation of camera inputs (before any kernel runs).

Everything here reads host values: NumPy and Python input directly, Warp arrays
through one copy back (``.numpy()``), once, when a camera is made or a
conversion is computed. Errors name the argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any

import numpy as np
import warp as wp

#: ``R`` is accepted as a rotation when ``max |R R^T - I| < ROTATION_TOLERANCE`` and
#: ``det R > 0``. 1e-4 is ~1000x float32 rounding of a rotation built in float32
#: (look-at, quaternion) and admits matrices typed with 5 decimals; a reflection
#: or a scaled matrix is off by O(1) or by the scale and is rejected.
ROTATION_TOLERANCE = 1e-4

#: NumPy arrays, Python numbers and sequences, or Warp arrays.
ArrayInput = Any


class ParamLayout(Enum):
    """The shape of one camera's value of a parameter, and the dtype it is stored in."""

    SCALAR = ((), wp.float32)
    VEC2 = ((2,), wp.vec2)
    VEC3 = ((3,), wp.vec3)
    MAT33 = ((3, 3), wp.mat33)
    #: (B,), (B, 1) or (B, 2) float32, stored 2-D.
    FOCAL = (None, wp.float32)

    @property
    def inner(self) -> tuple[int, ...] | None:
        return self.value[0]

    @property
    def dtype(self) -> type:
        return self.value[1]


def is_torch(x: object) -> bool:
    """True for torch tensors (recognised without importing torch)."""
    return type(x).__module__.startswith("torch")


def shape_text(inner: Iterable[int]) -> str:
    """``"(N, 3, 3)"`` for ``inner == (3, 3)``."""
    return "(N" + "".join(f", {d}" for d in inner) + ")"


def host_float64(x: ArrayInput, name: str) -> np.ndarray:
    """``x`` as a float64 NumPy array (a Warp array is read back).

    Raises:
        TypeError: ``x`` is a torch tensor or not numeric.
    """
    if is_torch(x):
        raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
    if isinstance(x, wp.array):
        x = x.numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be numeric, got {x!r}") from None


def check_finite(a: np.ndarray, name: str, *, show: bool = False) -> np.ndarray:
    """Returns ``a``; raises ValueError naming ``name`` if any value is NaN or inf."""
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite" + (f", got {a.tolist()}" if show else ""))
    return a


class ParsedParam:
    """One camera parameter: a Warp array to use as is, or host values to copy.

    Attributes:
        name: the argument name.
        layout: its :class:`ParamLayout`.
        array: the caller's Warp array, viewed in the stored dtype, or None.
        host: float64 (B, ...) values (read back from ``array`` when given).
        batch: B.
    """

    def __init__(self, name: str, layout: ParamLayout, value: ArrayInput):
        self.name = name
        self.layout = layout
        self.array: wp.array | None = self._view(value) if isinstance(value, wp.array) else None
        self.host = self._check_shape(host_float64(value, name))
        self.batch = self.host.shape[0]
        check_finite(self.host, name, show=True)

    def _view(self, a: wp.array) -> wp.array:
        name = self.name
        if self.layout is ParamLayout.FOCAL:
            if a.dtype == wp.vec2 and a.ndim == 1:
                return a.view(wp.float32)
            if a.dtype == wp.float32 and a.ndim == 1:
                return a.reshape((a.shape[0], 1))
            if a.dtype == wp.float32 and a.ndim == 2 and a.shape[1] in (1, 2):
                return a
            raise TypeError(
                f"{name} must be a float32 wp.array of shape (N,), (N, 1) or (N, 2) "
                f"(or vec2), got dtype {wp.types.type_repr(a.dtype)} shape {a.shape}"
            )
        inner, dtype = self.layout.inner, self.layout.dtype
        if a.dtype == dtype and a.ndim == 1:
            return a
        if a.dtype == wp.float32 and a.shape[1:] == inner:
            if not a.is_contiguous:
                raise ValueError(f"{name} must be a contiguous wp.array")
            return a if dtype == wp.float32 else a.view(dtype)
        raise TypeError(
            f"{name} must be a float32 wp.array of shape {shape_text(inner)}"
            f" (or of {wp.types.type_repr(dtype)}), got dtype {wp.types.type_repr(a.dtype)} "
            f"shape {a.shape}"
        )

    def _check_shape(self, h: np.ndarray) -> np.ndarray:
        name = self.name
        if self.layout is ParamLayout.FOCAL:
            if h.ndim == 0:
                h = h.reshape(1, 1)
            elif h.ndim == 1:
                h = h[:, None]
            if h.ndim != 2 or h.shape[1] not in (1, 2) or h.shape[0] < 1:
                raise ValueError(f"{name} must be a scalar or have shape (N,), (N, 1) or (N, 2)")
            return h
        inner = self.layout.inner
        scalar = self.layout is ParamLayout.SCALAR
        if scalar and h.ndim == 0:
            h = h.reshape(1)
        if self.array is not None and not scalar:
            h = h.reshape((-1, *inner))
        if h.ndim != 1 + len(inner) or h.shape[1:] != inner or h.shape[0] < 1:
            extra = " or a scalar" if scalar else ""
            raise ValueError(f"{name} must have shape {shape_text(inner)}{extra}, got {h.shape}")
        return h


def broadcast_batch(params: Sequence[ParsedParam]) -> int:
    """N, the batch all parameters broadcast to (each has 1 or N rows).

    Raises:
        ValueError: listing every parameter's batch size.
    """
    n = max(p.batch for p in params)
    if any(p.batch not in (1, n) for p in params):
        sizes = ", ".join(f"{p.name}: {p.batch}" for p in params)
        raise ValueError(
            f"camera parameters have batch sizes that do not broadcast ({sizes}); each "
            f"must be 1 or N = {n}"
        )
    return n


def resolve_device(device: wp.DeviceLike, params: Sequence[ParsedParam]) -> wp.Device:
    """The camera's device: ``device``, else that of the first Warp array, else the default.

    Raises:
        ValueError: a Warp array on another device.
    """
    arrays = [p for p in params if p.array is not None]
    if device is None:
        device = arrays[0].array.device if arrays else wp.get_device()
    device = wp.get_device(device)
    for p in arrays:
        if wp.get_device(p.array.device) != device:
            raise ValueError(
                f"{p.name} is on device {p.array.device}, but the camera is on {device}"
            )
    return device


def check_rotation(R: np.ndarray, name: str = "R") -> None:
    """Raises ValueError unless every ``R[i]`` is a proper rotation (see ROTATION_TOLERANCE)."""
    eye = np.eye(3)
    for i, r in enumerate(R):
        err = float(np.abs(r @ r.T - eye).max())
        det = float(np.linalg.det(r))
        if not err < ROTATION_TOLERANCE or det <= 0.0:
            raise ValueError(
                f"{name}[{i}] is not a rotation matrix: max |R R^T - I| = {err:.3g} "
                f"(tolerance {ROTATION_TOLERANCE:g}), det = {det:.6g} (must be > 0)"
            )


def image_size_rows(image_size: ArrayInput, name: str = "image_size") -> np.ndarray:
    """``(H, W)``, an int, or (B, 2) -> float64 (B, 2) rows of (H, W), each a whole number >= 1.

    Raises:
        TypeError: a torch tensor.
        ValueError: another shape, or values that are not whole numbers >= 1.
    """
    if is_torch(image_size):
        raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
    if isinstance(image_size, wp.array):
        image_size = image_size.numpy()
    a = np.asarray(image_size)
    if a.ndim == 0:
        a = np.array([a, a])
    if a.dtype.kind not in "iuf" or a.ndim not in (1, 2) or a.shape[-1] != 2:
        raise ValueError(f"{name} must be an int, (H, W) or (N, 2), got {image_size!r}")
    a = a.reshape(-1, 2).astype(np.float64)
    if not np.isfinite(a).all() or (a < 1).any() or (a != np.round(a)).any():
        raise ValueError(f"{name} must hold whole numbers >= 1, got {a.tolist()}")
    return a


def pixel_frame(hw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixels per NDC unit and the image centre of (B, 2) ``(H, W)`` rows.

    Returns:
        ``(scale, centre)``: (B, 1) ``min(H, W) / 2`` and (B, 2) ``(W / 2, H / 2)``.
    """
    return hw.min(axis=1, keepdims=True) / 2.0, hw[:, ::-1] / 2.0


def rows(x: ArrayInput, name: str, width: int | None) -> np.ndarray:
    """(B,) values (``width=None``; a scalar gives B = 1) or (B, width) rows ((width,) gives B = 1).

    Raises:
        TypeError: a torch tensor, non-numeric input.
        ValueError: another shape, no rows, non-finite values.
    """
    a = host_float64(x, name)
    if width is None:
        if a.ndim > 1:
            raise ValueError(f"{name} must be a scalar or have shape (N,), got {a.shape}")
        a = a.reshape(-1)
    else:
        if a.ndim == 1 and a.shape[0] == width:
            a = a[None]
        if a.ndim != 2 or a.shape[1] != width:
            raise ValueError(f"{name} must have shape (N, {width}) or ({width},), got {a.shape}")
    if a.shape[0] < 1:
        raise ValueError(f"{name} must not be empty")
    return check_finite(a, name)


def batched(x: ArrayInput, name: str, inner: tuple[int, ...]) -> np.ndarray:
    """(N, *inner) float64 values, exactly that shape.

    Raises:
        TypeError: a torch tensor, non-numeric input.
        ValueError: another shape, non-finite values.
    """
    a = host_float64(x, name)
    if a.ndim != 1 + len(inner) or a.shape[1:] != inner:
        raise ValueError(f"{name} must have shape {shape_text(inner)}, got {a.shape}")
    return check_finite(a, name)


def broadcast_rows(named: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The arrays of ``named`` broadcast to their largest number of rows N (each 1 or N).

    Raises:
        ValueError: an array with another number of rows, naming it.
    """
    n = max(a.shape[0] for a in named.values())
    for name, a in named.items():
        if a.shape[0] not in (1, n):
            sizes = ", ".join(f"{k}: {v.shape[0]}" for k, v in named.items())
            raise ValueError(f"{name} does not broadcast ({sizes}); each must have 1 or N rows")
    return [np.broadcast_to(a, (n, *a.shape[1:])) for a in named.values()]
