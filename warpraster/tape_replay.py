"""A recorded render replayed as captured graphs: its forward as one, its backward as another.

Eagerly, a render recorded on a ``wp.Tape`` is ~40 launches from Python (each
~70 us of host time: argument packing, launch bounds, module lookups), and so is
its backward: host-bound while the GPU waits. :class:`RecordedCall` makes a
repeated call cost two graph launches instead:

* the first call with a key launches as usual (recorded on the caller's tape);
* the second with the same key runs the launches once more inside a capture,
  recorded on a private tape (:class:`warpraster.tape_slots.private_tape_slot`),
  and keeps the graph and that tape; from then on a call with this key replays
  the graph and registers one function on the caller's tape;
* that function replays the private tape's backward, captured the first time it
  runs (per ``backward_key``: state the backward reads by value, e.g. a fused
  loss's arguments, selects its own graph).

A graph reads whatever its arrays hold when it runs, as any launch, so new values
written into the same arrays are seen; a key holds what must not change (the
arrays' addresses, flags). Gradients are the eager ones: the same launches on the
same arrays (bit for bit on the cpu device, tested). The Python inside the
recorded backward functions (guards, checks) runs once, at the capture; the
guard here keeps one replayed render per tape.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import warp as wp

from .backward.tape import RecordGuard, record_func, replay_scope
from .raster.workspace import graphs_enabled
from .tape_slots import private_tape_slot

__all__ = ["RecordedCall"]


class RecordedCall:
    """One call site's recorded launches, replayed as captured graphs (see the module).

    Args:
        device: the Warp device the launches run on.
    """

    def __init__(self, device):
        self.device = wp.get_device(device)
        self._seen = None  # the key of the last call launched as usual
        self._key = None
        self._forward: wp.Graph | None = None
        self._tape: wp.Tape | None = None  # the private tape of the captured forward
        self._arrays: list = []
        self._backward: dict = {}
        #: renders through this call site (replayed or not): a replayed backward
        #: refuses to run after a later render overwrote what it reads
        self.guard = RecordGuard()

    def enabled(self, mode: bool | None) -> bool:
        """Whether to capture (``mode`` None: on CUDA with the memory pool, where it
        saves the host time; True: on every device, the cpu device's graphs being
        experimental in Warp 1.19; False: never)."""
        return graphs_enabled(self.device, mode)

    def __call__(
        self,
        tape: wp.Tape,
        key: Hashable,
        launch_all: Callable[[], None],
        *,
        mode: bool | None = None,
        backward_key: Callable[[], Hashable] = lambda: None,
        enabled: bool | None = None,
    ) -> bool:
        """Runs ``launch_all`` recorded on ``tape``: launched, or replayed as a graph.

        ``enabled``: :meth:`enabled` of ``mode`` as the caller just read it in this
        scope (None: read here).

        Returns True when the call was replayed (then the launches' own Python side
        effects did not run: the caller restores what they set, see the module).
        """
        self.guard.check_record(tape)
        render = self.guard.note_render()
        if not (self.enabled(mode) if enabled is None else enabled):
            launch_all()
            return False
        if self._forward is None or key != self._key:
            if key != self._seen:
                self._seen, self._forward, self._key = key, None, None
                launch_all()
                return False
            self._capture(launch_all, key)
        wp.capture_launch(self._forward)

        def backward():
            self.guard.check_backward(render)
            self._replay_backward(backward_key())

        record_func(tape, backward, arrays=self._arrays)
        self.guard.recorded(tape, backward)
        return True

    def _capture(self, launch_all, key) -> None:
        with private_tape_slot():
            tape = wp.Tape()
            with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
                with tape:
                    launch_all()
        self._forward, self._key, self._tape = cap.graph, key, tape
        self._backward = {}
        arrays = {}
        for launch in tape.launches:
            if callable(launch):
                continue
            for a in (*launch[3], *launch[4]):
                if isinstance(a, wp.array) and a.grad is not None:
                    arrays[id(a)] = a
        for a in tape.gradients:
            if isinstance(a, wp.array) and a.grad is not None:
                arrays[id(a)] = a
        self._arrays = list(arrays.values())

    def _replay_backward(self, bkey) -> None:
        graph = self._backward.get(bkey)
        if graph is None:
            # the buffers' own render counters count Python-side renders only: this
            # object's guard (checked by the caller) stands for them here
            with private_tape_slot(), replay_scope():
                with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
                    self._tape.backward()
            graph = self._backward[bkey] = cap.graph
        wp.capture_launch(graph)

    def captured_tape(self) -> wp.Tape | None:
        """The private tape of the captured forward (None before the capture)."""
        return self._tape if self._forward is not None else None
