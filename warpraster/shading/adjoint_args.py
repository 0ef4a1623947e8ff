"""The arguments of a kernel's adjoint launched alone, without a tape.

``wp.launch(kernel, ..., adjoint=True)`` runs Warp's generated adjoint of a kernel
with no forward before it: for inputs that are plain arrays the gradient buffers
are the ``adj_inputs`` / ``adj_outputs``. For arrays inside struct arguments
(:class:`~warpraster.shading.pixel_args.PixelFragments` and the like) the adjoint
reads and adds to the arrays' own ``.grad`` (the mirrored structs a launch takes
are not read for them), so such a launch is given:

* :func:`grad_view`: each forward array as a view whose ``.grad`` is the buffer to
  add to (or none);
* :func:`upstream_view`: each result as its upstream gradient, a view that is its
  own ``.grad`` and is kept (a tape's adjoint zeroes a result's ``.grad`` once
  read). An adjoint launch writes no forward output (Warp does not replay stores
  or atomics), so the gradient stands in for the result;
* :func:`no_adjoint`: an empty struct as each struct's adjoint argument.

The launch is then the one a ``wp.Tape``'s replay of the forward makes (the same
bits on the same inputs). Views are host objects: no device memory is allocated.
"""

from __future__ import annotations

import warp as wp

__all__ = ["grad_view", "no_adjoint", "upstream_view"]

_NO_ADJOINT: dict = {}


def no_adjoint(cls):
    """An empty instance of the ``@wp.struct`` ``cls`` (made once): the adjoint
    argument of a struct whose gradients travel as its arrays' ``.grad``."""
    if cls not in _NO_ADJOINT:
        _NO_ADJOINT[cls] = cls()
    return _NO_ADJOINT[cls]


def grad_view(arr: wp.array, grad: wp.array | None) -> wp.array:
    """``arr`` (contiguous) with ``grad`` (same dtype and shape; None: none, so the
    adjoint adds nothing for it) as its ``.grad``: a view sharing its data, or
    ``arr`` itself when that is its ``.grad`` already."""
    if arr.grad is grad:
        return arr
    view = wp.array(ptr=arr.ptr, dtype=arr.dtype, shape=arr.shape, device=arr.device, grad=grad)
    view._ref = arr  # keep the owner alive
    return view


def upstream_view(g: wp.array) -> wp.array:
    """A result's upstream gradient ``g`` (contiguous float32 or ``vector(D)``, shape
    ``(..., n)``) as that result for an adjoint launch: a float32 ``(..., n * D)`` view
    whose ``.grad`` is itself, kept (``retain_grad``: read, left as it is)."""
    d = int(g.dtype._length_) if wp.types.type_is_vector(g.dtype) else 1
    shape = (*g.shape[:-1], g.shape[-1] * d)
    grad = wp.array(ptr=g.ptr, dtype=wp.float32, shape=shape, device=g.device)
    view = wp.array(ptr=g.ptr, dtype=wp.float32, shape=shape, device=g.device, grad=grad,
                    retain_grad=True)  # fmt: skip
    view._ref = g
    return view
