"""The sensor's input checks (named errors before any kernel) and its look-at pose.

Metadata checks (``check_array``, ``check_source``, ``check_frame``) run on every
update; value checks that read device arrays back (``_check_transforms``) run
at set-up only.
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

__all__ = [
    "sensor_light_rows",
    "UNIT_QUAT_TOL",
    "check_array",
    "check_frame",
    "check_int",
    "check_nonnegative",
    "check_source",
    "look_at_transform",
]


def _vec3(value, name: str, *, nonzero: bool = False, unit_range: bool = False) -> wp.vec3:
    """3 finite numbers as a ``wp.vec3`` (ValueError naming ``name``); ``nonzero``:
    not the zero vector (a direction); ``unit_range``: each in [0, 1] (a colour)."""
    try:
        a = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 3 finite numbers, got {value!r}") from None
    if a.size != 3 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be 3 finite numbers, got {value!r}")
    if nonzero and not np.any(a):
        raise ValueError(f"{name} must not be the zero vector (it has no direction)")
    if unit_range and ((a < 0.0) | (a > 1.0)).any():
        raise ValueError(f"{name} must be a linear RGB colour in [0, 1], got {value!r}")
    return wp.vec3(*a.tolist())


#: how far from 1 the norm of a rotation quaternion may be (float32 round-off of
#: a normalised quaternion is ~1e-7; Warp's transform_point scales by |q|^2, so a
#: quaternion of norm 3 draws a shape 9 times larger)
UNIT_QUAT_TOL = 1.0e-3


def _check_transforms(arr, name: str, rows: int | None = None, finite: bool = True) -> None:
    """Raises ValueError naming ``name`` unless the ``wp.transform`` values of ``arr``
    (the first ``rows`` when given) have unit rotation quaternions and, with
    ``finite``, are finite (a host read: set-up only). Without ``finite`` a
    non-finite transform passes (its vertices are non-finite, whose faces the
    sensor drops, as documented for non-finite vertices)."""
    host = arr.numpy() if isinstance(arr, wp.array) else arr
    a = np.asarray(host, dtype=np.float64).reshape(-1, 7)
    if rows is not None:
        a = a[:rows]
    if finite and not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    norm = np.linalg.norm(a[:, 3:], axis=1)
    bad = np.flatnonzero(np.isfinite(norm) & (np.abs(norm - 1.0) > UNIT_QUAT_TOL))
    if bad.size:
        raise ValueError(
            f"{name} must have unit rotation quaternions (|q| = 1 within {UNIT_QUAT_TOL}); "
            f"entry {int(bad[0])} has |q| = {norm[bad[0]]:.6g} (a non-unit quaternion "
            "scales the shape by |q|^2): normalise it"
        )


def _is_int(value) -> bool:
    """An ``int`` or NumPy integer, not a ``bool``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum`` (TypeError / ValueError naming ``name``)."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_nonnegative(value, name: str) -> float:
    """``value`` as a finite ``float`` >= 0 (TypeError / ValueError naming ``name``)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (math.isfinite(number) and number >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return number


def check_frame(frame, frame_count: int) -> None:
    """Raises TypeError / ValueError unless ``frame`` is a slot in ``[0, frame_count)``."""
    if not _is_int(frame):
        raise TypeError(f"frame must be an int, got {frame!r}")
    if not 0 <= frame < frame_count:
        raise ValueError(f"frame must be in [0, {frame_count}), got {frame}")


def check_array(arr, name: str, dtype, device, min_rows: int, ndim: int = 1) -> None:
    """Raises TypeError / ValueError (naming ``name``) unless ``arr`` is an ``ndim``-d
    ``wp.array`` of ``dtype`` on ``device`` with at least ``min_rows`` rows (reads
    metadata only)."""
    if not isinstance(arr, wp.array):
        raise TypeError(f"{name} must be a wp.array, got {type(arr).__name__}")
    if arr.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype.__name__}, got {arr.dtype.__name__}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-d, got shape {arr.shape}")
    if arr.device != device:
        raise ValueError(f"{name} is on {arr.device}, the sensor on {device}")
    if arr.shape[0] < min_rows:
        raise ValueError(f"{name} has {arr.shape[0]} entries, the geometry uses {min_rows}")


def check_source(arr, name: str, dtype, device, used: int, why: str) -> None:
    """A particle or body array of which ``used`` > 0 entries are read: required
    (``why``: by whom), then as :func:`check_array`."""
    if arr is None:
        raise ValueError(f"{name} is required: {why}")
    check_array(arr, name, dtype, device, used)


def look_at_transform(eye, target, up=(0.0, 0.0, 1.0)) -> wp.transform:
    """Camera-to-world transform of a camera at ``eye`` looking at ``target``
    (Newton's camera frame: looks down -Z, +Y up).

    Raises:
        ValueError: non-finite input, ``target == eye``, a zero ``up`` or one
            parallel to the viewing direction.
    """
    eye = np.array(_vec3(eye, "eye"), dtype=np.float64)
    up = np.array(_vec3(up, "up", nonzero=True), dtype=np.float64)
    fwd = np.array(_vec3(target, "target"), dtype=np.float64) - eye
    if not np.any(fwd):
        raise ValueError("target must differ from eye (there is no viewing direction)")
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, up / np.linalg.norm(up))
    if np.linalg.norm(right) < 1e-9:
        raise ValueError("up is parallel to the viewing direction")
    right /= np.linalg.norm(right)
    cam_up = np.cross(right, fwd)
    rot = np.stack([right, cam_up, -fwd], axis=1)  # columns: camera axes in world
    q = wp.quat_from_matrix(wp.mat33(*rot.reshape(-1).tolist()))
    return wp.transform(wp.vec3(*eye.tolist()), q)


def sensor_light_rows(lights, device, num_worlds: int, num_cameras: int, deterministic: bool):
    """(the kernels' :class:`~warpraster.shading.lighting.LightRows` of a sensor's
    ``lights`` (None: placeholders), whether its rows are per world), checked: kind,
    device, one row, one per world or one per image, at most ``MAX_LAMBERT_LIGHTS``
    an image, and no trained arrays with the deterministic backward."""
    from ..shading.lighting import (  # noqa: PLC0415
        MAX_LAMBERT_LIGHTS,
        LightList,
        LightRows,
        LightsBase,
        light_rows,
    )
    from ..structs import new_struct  # noqa: PLC0415

    num_images = num_worlds * num_cameras
    if lights is None:
        return new_struct(LightRows, device), False
    if not isinstance(lights, (LightList, LightsBase)):
        raise TypeError(
            "lights must be a LightList or a DirectionalLights / PointLights / "
            f"AmbientLights, got {type(lights).__name__}"
        )
    if lights.device != device:
        raise ValueError(f"lights are on {lights.device}, the sensor on {device}")
    if len(lights) not in (1, num_worlds, num_images):
        raise ValueError(
            f"lights: {len(lights)} rows; give 1 (every image), one per world "
            f"({num_worlds}) or one per image (world_count * camera_count = {num_images})"
        )
    if isinstance(lights, LightList):
        most = int(np.diff(lights.first.numpy()).max())  # set-up: one host read
        if most > MAX_LAMBERT_LIGHTS:
            raise ValueError(
                f"lights: an image has {most} lights; the sensor takes at most {MAX_LAMBERT_LIGHTS}"
            )
    rows = light_rows(lights, device)
    trained = [a for a in (rows.param, rows.ambient, rows.diffuse) if a.requires_grad]
    if deterministic and trained:
        raise ValueError(
            "lights: arrays that require gradients need CameraSensor(deterministic=False) "
            "(the deterministic backward gives the light list's arrays none)"
        )
    return rows, len(lights) == num_worlds and num_worlds != num_images


class FixedOptions:
    """Refuses rebinding, after construction (once ``self._fixed`` is set), the
    attributes :attr:`_FIXED` names: what the sensor's buffers, kernels, structs and
    captured graphs are built for. Rebound, one would be seen by some launches and
    not by others (a replayed graph keeps what it captured), so it raises instead:
    assign new values into the arrays (``.assign``) or make a new sensor."""

    _FIXED = frozenset((
        "world_count", "camera_count", "frame_count", "image_size", "silhouette_sigma",
        "blur_radius", "antialias", "near_clip", "clear_color", "clear_depth", "ambient",
        "smooth_normals", "grad_channels", "channels", "_written", "up", "deterministic",
        "exact_perspective_grad",
        "bin_size", "device", "lights", "requires_grad", "geometry", "material_grad",
        "shape_colors", "light_direction", "light_intensity", "atlas",
    ))  # fmt: skip

    def __setattr__(self, name, value):
        if name in self._FIXED and self.__dict__.get("_fixed", False):
            raise AttributeError(
                f"{type(self).__name__}.{name} is fixed at construction (the sensor's "
                "buffers, kernels and captured graphs are built for it): assign new "
                f"values into its arrays (.assign) or make a new {type(self).__name__}"
            )
        super().__setattr__(name, value)
