"""Central differences of a scalar loss with respect to one float32 of a Warp array
(the float32 lanes of a vector or transform array numbered as NumPy views them)."""

import numpy as np
import warp as wp


def floats(a: wp.array) -> np.ndarray:
    """A host copy of ``a`` as float32 lanes, shape ``(a.shape[0], -1)``."""
    return a.numpy().copy().view(np.float32).reshape(a.shape[0], -1)


def central_difference(arr: wp.array, index, step: float, loss_at) -> float:
    """``(L(x + h) - L(x - h)) / 2h`` for lane ``index`` (of :func:`floats`'s view) of
    ``arr``, ``L`` = ``loss_at()`` (runs the forward, returns the loss); ``arr`` is
    restored after."""
    host = arr.numpy().copy()
    flat = host.view(np.float32).reshape(arr.shape[0], -1)
    values = []
    for sign in (1.0, -1.0):
        moved = flat.copy()
        moved[index] += sign * step
        arr.assign(moved.view(host.dtype).reshape(host.shape))
        values.append(float(loss_at()))
    arr.assign(host)
    return (values[0] - values[1]) / (2.0 * step)
