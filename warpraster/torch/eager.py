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

import functools
from collections.abc import Callable

import torch

__all__ = ["EagerOp", "eager_path", "first_order_only", "without_grad"]


def without_grad(fn: Callable, *args):
    """``fn(*args)`` with grad mode off: entered only where it is on (a
    ``torch.no_grad()`` scope costs ~3.5 us of host time, and a backward without
    ``create_graph`` or an autograd Function's forward runs with it off already)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    with torch.no_grad():
        return fn(*args)


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


def first_order_only(backward: Callable) -> Callable:
    """An autograd Function's ``backward`` that has no derivative of its own (the
    ops' adjoints are Warp kernels): run without recording, and, under
    ``create_graph=True``, its gradients returned through a node that raises when
    anything differentiates them (a gradient penalty, a Hessian-vector product).

    ``torch.autograd.function.once_differentiable`` does this only when an upstream
    gradient requires grad; these gradients depend on the saved inputs as well (an
    antialiased image's vertex gradient on the vertices), so a linear loss's second
    derivative would vanish silently there."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # (no create_graph: no scope to enter)
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if torch.compiler.is_compiling():
            return outputs
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        # (a custom op's backward returns a list for a list input: its tensors too)
        flat = [g for o in outs for g in (o if isinstance(o, list) else [o])]
        err = torch._C._functions.DelayedError(
            b"warpraster's ops have first derivatives only: a gradient computed with "
            b"create_graph=True cannot be differentiated again",
            len(flat),
        )
        guarded = iter(err(*[None if g is None else g.detach().requires_grad_(True)
                             for g in flat]))  # fmt: skip
        out = tuple(
            [next(guarded) for _ in o] if isinstance(o, list) else next(guarded) for o in outs
        )
        return out if isinstance(outputs, tuple) else out[0]

    return wrapper


def eager_path(
    op, impl: Callable, setup_context: Callable, backward: Callable, non_differentiable=()
) -> EagerOp:
    """``op`` (a custom op whose forward body is ``impl``) with its autograd
    (``setup_context`` / ``backward``, registered on the op here) and an eager path
    running the same three; ``non_differentiable``: indices of integer outputs."""
    backward = first_order_only(backward)
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
