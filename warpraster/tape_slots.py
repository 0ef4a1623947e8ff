"""Warp's process-global tape, made safe for threads: private slots and an owner.

Warp keeps the recording tape on its process-wide runtime (``runtime.tape``): a
launch from any thread is recorded on whatever tape is open, and a second
``wp.Tape`` cannot be entered anywhere while one is (WARP-NOTES). The torch ops
launch Warp kernels in their forward and record a private ``wp.Tape`` in their
backward, so without care

* a torch forward beside an open tape (in this thread or another) lands its
  launches on that tape, whose backward then replays them;
* a torch backward beside an open tape fails ("entering a tape while one is
  already active"), or its private tape swallows the other thread's launches.

:class:`private_tape_slot` gives the calling thread a tape slot of its own for
the span of a torch op: inside it, ``runtime.tape`` reads and writes that slot
(empty at entry), so the op's launches are recorded on no one else's tape and its
private backward tape sees no one else's launches; every other thread keeps
seeing the shared slot, exactly as Warp has it. The slot is a data descriptor
installed once on Warp's ``Runtime`` class; outside a torch op it reads and
writes the shared value, so pure Warp code behaves as it always has, including
its limit: two threads recording two ``wp.Tape`` at once still collide in Warp
itself (Warp raises "entering a tape while one is already active").

The shared slot also remembers the thread that entered its tape
(:func:`shared_tape_owner`): a warpraster render recorded from another thread
while that tape is open would land its launches on it, so
:func:`warpraster.backward.tape.active_tape` raises instead (one clear error for
the limit that remains in Warp).
"""

from __future__ import annotations

import threading

import warp as wp

__all__ = ["install", "private_tape_slot", "shared_tape_owner"]

_NO_SLOT = object()  # a thread outside any torch op: it uses the shared slot
_LOCAL = threading.local()


def _slot_of_thread():
    """This thread's private slot, or ``_NO_SLOT``: read from the thread's own dict of
    ``_LOCAL`` (``getattr`` with a default raises and catches an AttributeError for a
    thread that never set one, ~1 us on every ``Runtime.tape`` read; this ~0.1 us)."""
    return _LOCAL.__dict__.get("slot", _NO_SLOT)


_INSTALL_LOCK = threading.Lock()
# the installed descriptor and the look-up in its class's namespace (a live view):
# what private_tape_slot checks at every entry (~0.05 us) instead of install()
_SLOT: object = object()  # (none installed yet: no class holds this)
_RUNTIME_GET = {}.get


class _TapeSlot:
    """``Runtime.tape``: the calling thread's private slot inside a torch op, else
    the process-wide one."""

    def __init__(self, shared):
        self.shared = shared
        # the thread that put a tape in the shared slot (None: empty, or a tape
        # entered before the slot was installed, whose thread is unknown)
        self.owner = None

    def __get__(self, runtime, owner_type=None):
        if runtime is None:
            return self
        slot = _slot_of_thread()
        return self.shared if slot is _NO_SLOT else slot

    def __set__(self, runtime, value):
        if _slot_of_thread() is _NO_SLOT:
            self.shared = value
            self.owner = None if value is None else threading.get_ident()
        else:
            _LOCAL.slot = value


def install() -> _TapeSlot:
    """The slot descriptor on Warp's Runtime class (installed once, keeping the value
    the runtime holds now)."""
    global _SLOT, _RUNTIME_GET
    wp.init()
    runtime_type = type(wp._src.context.runtime)
    slot = runtime_type.__dict__.get("tape")
    if not isinstance(slot, _TapeSlot):
        with _INSTALL_LOCK:
            slot = runtime_type.__dict__.get("tape")
            if not isinstance(slot, _TapeSlot):
                runtime = wp._src.context.runtime
                slot = _TapeSlot(runtime.__dict__.pop("tape", None))
                runtime_type.tape = slot
    _SLOT, _RUNTIME_GET = slot, runtime_type.__dict__.get
    return slot


class private_tape_slot:  # (lower case: it was a function, and is used as one)
    """``with private_tape_slot():`` within, this thread's Warp launches see an empty
    tape slot of their own (a ``wp.Tape`` entered inside records only this thread's
    launches); on exit the thread sees the shared slot again (or the enclosing
    private one: re-entrant, one object per ``with``).

    A class, not a generator context manager: ~1 us of host time a scope on the cpu
    instead of ~3.7 us. Each entry checks that the slot descriptor is (still) the
    one on Warp's Runtime class, and installs it where it is not. A subclass may
    enter and leave the slot from its own ``__enter__``/``__exit__`` (the torch ops'
    stream scope, :mod:`warpraster.torch.streams`)."""

    __slots__ = ("_outer_slot",)

    def __enter__(self):
        if _RUNTIME_GET("tape") is not _SLOT:
            install()
        self._outer_slot = _slot_of_thread()
        _LOCAL.slot = None
        return self

    def __exit__(self, *exc) -> None:
        if self._outer_slot is _NO_SLOT:
            del _LOCAL.slot
        else:
            _LOCAL.slot = self._outer_slot


def shared_tape_owner(runtime, tape) -> int | None:
    """The ident of the thread that entered ``tape`` when it is the tape of the
    shared slot, else None (a private slot's tape, no tape, the slot not
    installed yet, or a tape entered before it was)."""
    slot = type(runtime).__dict__.get("tape")
    if not isinstance(slot, _TapeSlot) or tape is None or slot.shared is not tape:
        return None
    return slot.owner
