"""The torch ops' eager path: a custom op's own bodies under a plain autograd Function.

Every op of :mod:`warpraster.torch` is a ``torch.library.custom_op`` (what
``torch.compile`` traces as one opaque node, with fake kernels for its shapes).
Called eagerly, the dispatcher's layers around a custom op with autograd
(its autograd wrapper, redispatch, argument flattening, the functorch checks) cost
about as much host time as the op's own Python: measured on this project's 2-core
CPU, 1.02 -> 0.88 ms for the raster op's forward + backward on a tiny scene and 1.95
-> 0.93 ms for the renderer's. :func:`eager_path` gives a callable that runs the
same forward body, the same ``setup_context`` and the same backward function
under a ``torch.autograd.Function`` outside compilation, and the custom op inside
it: the same launches, so the same numbers (tested bit for bit). Gradients of
outputs nothing used arrive as None, which every backward here handles.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["EagerOp", "eager_path"]


class EagerOp:
    """A custom op and its eager path (see the module); call it as the op."""

    #: tests set this to compare the two paths (True: always the custom op)
    force_custom_op = False

    def __init__(self, op, function: type[torch.autograd.Function]):
        self.op = op
        self.function = function

    def __call__(self, *args):
        if EagerOp.force_custom_op or torch.compiler.is_compiling():
            return self.op(*args)
        return self.function.apply(*args)


def eager_path(
    op, impl: Callable, setup_context: Callable, backward: Callable, non_differentiable=()
) -> EagerOp:
    """``op`` (a custom op whose forward body is ``impl``) with its autograd
    (``setup_context`` / ``backward``, registered on the op here) and an eager path
    running the same three; ``non_differentiable``: indices of integer outputs."""
    op.register_autograd(backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            out = impl(*args)
            setup_context(ctx, args, out)
            outs = out if isinstance(out, tuple) else (out,)
            ctx.mark_non_differentiable(*(outs[i] for i in non_differentiable))
            ctx.set_materialize_grads(False)
            return out

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Eager.__name__ = Eager.__qualname__ = f"Eager_{impl.__name__.lstrip('_')}"
    return EagerOp(op, Eager)
