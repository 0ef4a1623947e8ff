"""Parsing of the array-valued parameters of lights, materials and blending.

Every colour, location, direction and shininess is kept as a Warp array with a
batch dimension B (1 or N; a batch of 1 is shared by all N images, as PyTorch3D
broadcasts):

* NumPy / Python input (``(3,)``, ``(B, 3)``, a scalar or ``(B,)``) is copied to the
  device, with ``requires_grad`` as asked;
* a Warp ``vec3`` array ``(B,)`` or float32 ``(B, 3)`` array (``(B,)`` for scalars)
  is used zero-copy: values written into it later are seen by the next render
  (also in a captured graph) and, with ``requires_grad=True``, gradients
  accumulate in the caller's ``.grad``.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..backward.tape import ThreadFlag
from ..meshes import as_vec3_array

__all__ = [
    "ParamRows",
    "check_batch",
    "check_mesh_inputs",
    "check_rows",
    "component",
    "float_rows",
    "row",
    "scalar_param",
    "vec3_param",
]


@wp.func
def row(n: int, count: int) -> int:
    """Row of image (or vertex mesh) ``n`` in a parameter with ``count`` rows (1 = shared)."""
    if count == 1:
        return 0
    return n


@wp.func
def component(v: wp.vec3, c: int) -> float:
    """``v[c]`` for a run-time ``c`` in 0..2, in registers (no local-memory index)."""
    return wp.where(c == 0, v[0], wp.where(c == 1, v[1], v[2]))


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _warp_on(value, name: str, device) -> bool:
    """Whether ``value`` is a Warp array (on ``device``, when given); TypeError for torch."""
    if _is_torch(value):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if not isinstance(value, wp.array):
        return False
    if device is not None and wp.get_device(value.device) != wp.get_device(device):
        raise ValueError(f"{name} is on device {value.device}, expected {wp.get_device(device)}")
    return True


def _host_rows(value, name: str) -> np.ndarray:
    """``value`` as a float64 NumPy array (TypeError when it is not numeric)."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be numeric, got {value!r}") from None


def _device_rows(a: np.ndarray, name: str, dtype, device, requires_grad: bool) -> wp.array:
    """Finite host rows ``a`` copied to ``device`` as ``dtype``."""
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got {a.tolist()}")
    return wp.array(
        a.astype(np.float32), dtype=dtype, device=device, requires_grad=bool(requires_grad)
    )


def vec3_param(value, name: str, device=None, requires_grad: bool = False) -> wp.array:
    """A ``(B,)`` ``wp.vec3`` array from NumPy/Python ``(3,)``/``(B, 3)`` or a Warp array.

    Raises:
        TypeError: torch tensors (use ``warpraster.torch``), non-numeric values,
            Warp arrays of another dtype.
        ValueError: wrong shape, empty batch, non-finite host values.
    """
    if _warp_on(value, name, device):
        if value.dtype == wp.float32 and value.ndim == 1 and value.shape[0] == 3:
            value = value.reshape((1, 3))
        try:
            arr = as_vec3_array(value, name, value.device)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name} must be a wp.array of vec3 (B,) or float32 (B, 3), got dtype "
                f"{wp.types.type_repr(value.dtype)} shape {value.shape}"
            ) from None
        if arr.shape[0] < 1:
            raise ValueError(f"{name} must hold at least one row")
        return arr
    a = _host_rows(value, name)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] != 3 or a.shape[0] < 1:
        raise ValueError(f"{name} must have shape (3,) or (B, 3), got {np.shape(value)}")
    return _device_rows(a, name, wp.vec3, device, requires_grad)


def scalar_param(value, name: str, device=None, requires_grad: bool = False) -> wp.array:
    """A ``(B,)`` float32 array from a Python scalar, NumPy ``(B,)`` or a Warp array."""
    if _warp_on(value, name, device):
        if value.dtype != wp.float32 or value.ndim != 1 or value.shape[0] < 1:
            raise TypeError(
                f"{name} must be a float32 wp.array of shape (B,), got dtype "
                f"{wp.types.type_repr(value.dtype)} shape {value.shape}"
            )
        return value
    a = _host_rows(value, name)
    a = a.reshape(1) if a.ndim == 0 else a
    if a.ndim != 1 or a.shape[0] < 1:
        raise ValueError(f"{name} must be a scalar or have shape (B,), got {np.shape(value)}")
    return _device_rows(a, name, wp.float32, device, requires_grad)


_CHECKED = ThreadFlag()


def values_checked():
    """Within: the lights, materials and backgrounds made here hold values their
    caller has checked already (the torch ops: the torch classes check their
    tensors once, at construction), so :func:`check_rows` reads nothing back:
    the ops then build their Warp objects on every call without a host read."""
    return _CHECKED.scope()


def check_rows(
    arr: wp.array, name: str, *, minimum: float | None = None, nonzero: bool = False
) -> None:
    """Raises ValueError (naming ``name``) unless every value of ``arr`` is finite, at
    least ``minimum`` (when given) and, with ``nonzero``, no row is all zeros.

    Reads ``arr`` back to the host: call it at construction (set-up), not per render.
    A Warp array used zero-copy is checked with the values it holds then; values
    written into it later are the caller's to keep valid. Nothing is checked
    inside :func:`values_checked`.
    """
    if _CHECKED:
        return
    a = np.asarray(arr.numpy(), dtype=np.float64)
    a = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got {a.tolist()}")
    if minimum is not None and (a < minimum).any():
        raise ValueError(f"{name} must be >= {minimum}, got {a.tolist()}")
    if nonzero and (np.abs(a).max(axis=1, initial=0.0) == 0.0).any():
        raise ValueError(f"{name} must not be a zero vector, got {a.tolist()}")


class ParamRows:
    """Named parameter arrays of B rows (lights, materials): ``len()`` is B, the
    images (or meshes) served (1: shared by all); :meth:`parameters` gives the
    arrays named in ``_names``, in that order."""

    _n: int
    _names: tuple[str, ...]

    def __len__(self) -> int:
        return self._n

    def parameters(self) -> dict[str, wp.array]:
        """The parameter arrays by name."""
        return {name: getattr(self, name) for name in self._names}


def check_batch(owner: str, arrays: dict[str, wp.array]) -> int:
    """The broadcast batch size of ``arrays`` (each 1 or N); ValueError otherwise."""
    n = max(a.shape[0] for a in arrays.values())
    bad = {k: a.shape[0] for k, a in arrays.items() if a.shape[0] not in (1, n)}
    if bad:
        sizes = ", ".join(f"{k}: {a.shape[0]}" for k, a in arrays.items())
        raise ValueError(f"{owner} parameters have batch sizes that do not broadcast ({sizes})")
    devices = {str(a.device) for a in arrays.values()}
    if len(devices) > 1:
        raise ValueError(f"{owner} parameters are on different devices: {sorted(devices)}")
    return n


def batch_fits(owner: str, batch: int, n_images: int) -> None:
    """ValueError unless a parameter batch of ``batch`` rows serves ``n_images`` images."""
    if batch not in (1, n_images):
        raise ValueError(
            f"{owner} has a batch of {batch}, but {n_images} images are rendered "
            "(expected 1 or one per image)"
        )


def check_mesh_inputs(
    num_verts: int,
    num_faces: int,
    num_meshes: int,
    *,
    textures=None,
    lights=None,
    materials=None,
) -> None:
    """Raises ValueError, naming the argument, unless the per-vertex, per-face and
    per-mesh inputs fit a packed batch of ``num_meshes`` meshes (``num_verts``
    vertices, ``num_faces`` faces): a texture's rows (its ``check_mesh``), the
    light and material batches (1 or one per mesh). Shapes only, no device read:
    the renderers call it before any kernel runs."""
    check_mesh = getattr(textures, "check_mesh", None)
    if check_mesh is not None:
        check_mesh(int(num_verts), int(num_faces), int(num_meshes))
    for name, obj in (("lights", lights), ("materials", materials)):
        if obj is not None:
            batch_fits(name, len(obj), int(num_meshes))


def float_rows(mats: wp.array) -> wp.array:
    """A contiguous array of matrices seen as its flat float32 values (same
    memory), its gradient likewise when it has one (for a generated adjoint)."""
    size = mats.shape[0] * mats.dtype._length_
    if size > 2**31 - 1:  # the gathers index the floats with 32-bit thread ids
        raise ValueError(
            f"faces: {mats.shape[0]} faces need {size} corner-table values, more than 2**31 - 1"
        )
    flat = wp.array(ptr=mats.ptr, dtype=wp.float32, shape=(size,), device=mats.device)
    flat._ref = mats  # keep the owner alive
    if mats.grad is not None:
        flat.grad = float_rows(mats.grad)
    return flat
