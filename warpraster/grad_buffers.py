"""The library's own gradient buffers: cleared by the forward that writes them.

A render recorded on a ``wp.Tape`` writes buffers the library owns (fragments,
projected vertices, per-face tables, the image, a sensor's channels), and the
backward *adds* into their ``.grad`` arrays: first the user's loss, then each
stage's adjoint. Nothing else clears those gradients: the user zeroes only their
own arrays, and a fresh ``wp.Tape()`` per step knows nothing of the last one
(``tape.zero()`` also misses arrays held inside struct arguments). Left alone,
step 2 would add its gradients to step 1's.

So each producer clears the gradients of the buffers it writes when it records
its forward on a tape (:func:`clear_owned_grads`): every recorded step starts
from zero, eagerly or replayed from a captured graph (the clears are memsets,
captured with the forward). Arrays the user passes in are never touched here:
they accumulate, as everywhere in Warp.

Buffer objects mark themselves with ``owns_grad_buffers = True``; the walk
descends into their attributes (arrays, lists, tuples, dicts and other marked
objects) and nowhere else, so a user's vertices or texture maps held by a
workspace or a struct are never reached.
"""

from __future__ import annotations

import warp as wp

from .backward.tape import active_tape

__all__ = ["clear_if_recording", "clear_owned_grads", "note_on_tape", "owned_grads"]


def _walk(value, found: dict, seen: set) -> None:
    if isinstance(value, wp.array):
        g = value.grad
        if g is not None and g.ptr is not None:
            found.setdefault((g.ptr, g.capacity), g)
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _walk(v, found, seen)
        return
    if isinstance(value, dict):
        for v in value.values():
            _walk(v, found, seen)
        return
    if getattr(type(value), "owns_grad_buffers", False) and id(value) not in seen:
        seen.add(id(value))
        for v in vars(value).values():
            _walk(v, found, seen)


def owned_grads(*owners) -> list[wp.array]:
    """The distinct ``.grad`` arrays of the buffers ``owners`` hold (objects
    marked ``owns_grad_buffers``; arrays are taken as they are)."""
    found: dict = {}
    seen: set = set()
    for owner in owners:
        _walk(owner, found, seen)
    return list(found.values())


def clear_owned_grads(*owners) -> None:
    """Zeroes the gradients of every buffer ``owners`` hold (one memset each).

    Called by a forward that records on a tape, after or before its launches
    (forward kernels never read gradients). No allocation, no host read: safe
    under graph capture. The arrays are listed anew each call, so buffers a
    stage allocates on first use are included from then on."""
    for g in owned_grads(*owners):
        g.zero_()


def clear_if_recording(*owners) -> None:
    """:func:`clear_owned_grads` when a ``wp.Tape`` is recording (else nothing:
    no backward will add into the buffers)."""
    if active_tape() is not None:
        clear_owned_grads(*owners)


def note_on_tape(*arrays) -> None:
    """Tells the recording tape (if any) of ``arrays`` that a launch reads through
    a struct argument, so that ``tape.zero()`` clears their gradients before the
    first ``backward()`` too (Warp registers a struct's arrays only when its
    backward runs). None and arrays without gradients are skipped."""
    tape = active_tape()
    if tape is None:
        return
    for a in arrays:
        if isinstance(a, wp.array) and a.grad is not None:
            tape.gradients[a] = a.grad
