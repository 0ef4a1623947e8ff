"""The active ``wp.Tape`` and the guard against recording one workspace twice on it.

A render writes its fragments into its workspace's arrays, and the backward
registered on the tape reads them (and the workspace's per-face buffers) when
``tape.backward()`` runs. A second render with the same workspace overwrites
them: the first render's backward would then run on the second render's
fragments and give wrong gradients without a word (WARP-NOTES: overwriting an
array the tape still needs). :class:`RecordGuard` catches both ways this
happens:

* at record time: the workspace is recorded again on a tape that still holds
  its earlier recording (``tape.reset()`` clears a tape's recordings;
  ``tape.zero()`` only zeroes gradients and does not);
* at backward time: the workspace rendered again (on another tape or with no
  tape at all) after the recording that is being replayed.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import warp as wp

from ..tape_slots import install as install_tape_slot
from ..tape_slots import shared_tape_owner

__all__ = ["RecordGuard", "ThreadFlag", "active_tape", "record_func", "replay_scope", "replaying"]


_SLOT_INSTALLED = False


def active_tape():
    """The ``wp.Tape`` currently recording, or None (Warp keeps it on its runtime).

    Raises:
        ValueError: the tape was entered in another thread. Warp's tape is
            process-global: a render recorded from this thread would land its
            launches on that thread's tape (a Warp limit; the torch ops avoid it
            with a private slot per op, :mod:`warpraster.tape_slots`).
    """
    global _SLOT_INSTALLED
    runtime = getattr(wp._src.context, "runtime", None)
    if runtime is None:
        return None
    if not _SLOT_INSTALLED:
        install_tape_slot()  # from now on the shared slot records its tape's thread
        _SLOT_INSTALLED = True
    tape = getattr(runtime, "tape", None)
    if tape is not None:
        owner = shared_tape_owner(runtime, tape)
        if owner is not None and owner != threading.get_ident():
            raise ValueError(
                "a wp.Tape entered in another thread is recording: Warp's tape is "
                "process-global, so this thread's render would be recorded on it. Render "
                "and record in the thread that holds the tape, or let that thread leave "
                "its tape first (the torch ops are not affected: each runs on a private "
                "tape slot)"
            )
    return tape


_WORKSPACE_ADVICE = (
    "use one workspace per render recorded on a tape (e.g. one RasterWorkspace per frame), "
    "or call tape.reset() before recording the workspace again"
)


def record_func(tape: wp.Tape, backward, arrays) -> None:
    """``tape.record_func(backward, arrays=...)`` with the arrays ``tape.zero()`` can
    clear: those with a non-empty gradient. Warp refuses an array whose gradient is
    empty (a batch with no vertices or no faces), and there is nothing to clear in it.

    A tape whose class sets ``lists_arrays = False`` never reads them (it is never
    zeroed: the torch op's slot tape, whose ``record_func`` keeps the function
    alone) and gets none: the filter, ~2.4 us of host time a call for a replayed
    render's 15 arrays on the cpu, would be thrown away."""
    if type(tape) is not wp.Tape and not getattr(tape, "lists_arrays", True):
        tape.record_func(backward, arrays=())
        return
    tape.record_func(
        backward, arrays=[a for a in arrays if a is not None and a.grad is not None and a.size]
    )


class ThreadFlag:
    """A flag set for the span of a ``with flag.scope():`` block, in this thread only
    (re-entrant): how a caller tells the code below it a fact about the current
    call without passing it through every signature."""

    def __init__(self):
        self._local = threading.local()

    def __bool__(self) -> bool:
        return getattr(self._local, "on", False)

    @contextlib.contextmanager
    def scope(self):
        prior = bool(self)
        self._local.on = True
        try:
            yield
        finally:
            self._local.on = prior


_REPLAY = ThreadFlag()


def replay_scope():
    """Within: the backward of a render replayed from a captured graph is being
    captured (:class:`warpraster.tape_replay.RecordedCall`). Its forward was just
    replayed into the same buffers, and the replaying object guards its own
    renders, so the per-buffer render counters (which count Python-side renders,
    not graph replays) are not consulted."""
    return _REPLAY.scope()


def replaying() -> bool:
    """Inside :func:`replay_scope` (in this thread)."""
    return bool(_REPLAY)


class RecordGuard:
    """Per-workspace record of the renders and of the tape entry of the last one."""

    def __init__(self):
        self.renders = 0  # renders into the workspace so far
        self._tape = None  # weakref to the tape of the last recording
        self._entry = None  # (index in tape.launches, the recorded callable)

    def note_render(self) -> int:
        """Counts a render into the workspace (every render, recorded or not)."""
        self.renders += 1
        return self.renders

    def check_record(self, tape) -> None:
        """Raises ValueError if ``tape`` still holds a recording of this workspace."""
        if self._tape is None or self._tape() is not tape:
            return
        i, fn = self._entry
        if i < len(tape.launches) and tape.launches[i] is fn:
            raise ValueError(
                "workspace: this workspace is already recorded on the active tape; a second "
                "render with it overwrites the fragments the first render's backward needs "
                f"({_WORKSPACE_ADVICE})"
            )

    def recorded(self, tape, fn) -> None:
        """Notes that ``fn`` was just appended to ``tape.launches``."""
        self._tape = weakref.ref(tape)
        self._entry = (len(tape.launches) - 1, fn)

    def check_backward(self, render: int) -> None:
        """Raises ValueError if the workspace rendered again after render ``render``
        (not while a replayed render's backward is captured, :func:`replaying`)."""
        if self.renders != render and not replaying():
            raise ValueError(
                "workspace: the workspace rendered again after this render was recorded on "
                "the tape, so its fragments no longer belong to the render being "
                f"differentiated ({_WORKSPACE_ADVICE})"
            )
