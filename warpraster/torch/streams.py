"""Warp work on torch's device and current stream (shared by the torch ops)."""

from __future__ import annotations

import threading

import torch
import warp as wp

from ..tape_slots import private_tape_slot

__all__ = ["_TorchStream"]


def _warp_device(device: torch.device):
    wp.init()  # a no-op once Warp is up
    if device.type == "cuda" and not wp.is_cuda_available():
        raise RuntimeError(
            f"the tensors are on {device}, but Warp sees no CUDA device (driver or build)"
        )
    return wp.device_from_torch(device)


_OWN_STREAMS: dict[str, wp.Stream] = {}


def _own_stream(device) -> wp.Stream:
    """A Warp stream of the device's own for the torch ops (made once, kept)."""
    with _LOCKS_GUARD:
        stream = _OWN_STREAMS.get(device.alias)
        if stream is None:
            stream = _OWN_STREAMS[device.alias] = wp.Stream(device)
        return stream


_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def _device_lock(alias: str) -> threading.RLock:
    with _LOCKS_GUARD:
        lock = _LOCKS.get(alias)
        if lock is None:
            lock = _LOCKS[alias] = threading.RLock()
        return lock


def _resolve(device: torch.device) -> tuple:
    """(Warp device, its lock, the Warp stream to run on (None on the cpu), torch's
    stream as a Warp stream where an event wait each way is needed (else None)) for
    torch's current stream of ``device``."""
    wp_device = _warp_device(device)
    lock = _device_lock(wp_device.alias)
    if not wp_device.is_cuda:
        return wp_device, lock, None, None
    torch_stream = torch.cuda.current_stream(device)
    if torch_stream.cuda_stream != 0:
        # Same stream as torch: no synchronisation needed on entry or exit.
        return wp_device, lock, wp.stream_from_torch(torch_stream), None
    # torch's legacy default stream, which a CUDA graph cannot capture (the
    # workspaces replay repeated calls as graphs): Warp's work goes on a stream of
    # its own for the device, ordered after torch's work on entry and before it on
    # exit. A blocking stream (Warp makes its own so) is ordered with the legacy
    # default stream by CUDA itself, both ways; only a non-blocking one needs an
    # event wait each way (two CUDA calls each, ~10 us of host time a call on an
    # H200 host)
    own = _own_stream(wp_device)
    return wp_device, lock, own, None if own.is_blocking else wp.stream_from_torch(torch_stream)


#: :func:`_resolve` by (torch device, torch's current stream handle): made once (the
#: Warp device lookup, the locks and streams cost ~35 us of host time a call on an
#: H200 host). torch keeps its streams for the process's life (a pool it reuses).
_RESOLVED: dict = {}


class _TorchStream(private_tape_slot):
    """Runs Warp work on torch's current stream of ``device`` (and on that Warp device).

    Warp's current stream is a property of the device, not of the thread, so two
    host threads issuing work to one device with their own torch streams would
    swap streams: the scope holds a per-device lock while it issues the launches
    (the device work itself still overlaps).

    The scope is also a :class:`~warpraster.tape_slots.private_tape_slot` (entered and
    left with it): the thread gets a Warp tape slot of its own, so no launch inside
    is recorded on a ``wp.Tape`` the user has open, in this thread or another, and a
    ``wp.Tape`` entered inside records only this thread's launches."""

    __slots__ = (
        "_device", "_lock", "_run_on", "_saved_device", "_saved_stream", "_torch_stream",
        "stream_key",
    )  # fmt: skip

    def __init__(self, device: torch.device):
        stream = None
        if device.type == "cuda":
            if device.index is None:  # "cuda": the current device (the key names it)
                device = torch.device("cuda", torch.cuda.current_device())
            stream = torch.cuda.current_stream(device).cuda_stream
        #: torch's current stream handle on CUDA (None on the cpu): a key for the
        #: state kept per stream, read once here
        self.stream_key = stream
        key = (device, stream)
        resolved = _RESOLVED.get(key)
        if resolved is None:
            resolved = _RESOLVED[key] = _resolve(device)
            while len(_RESOLVED) > 64:
                _RESOLVED.pop(next(iter(_RESOLVED)), None)
        self._device, self._lock, self._run_on, self._torch_stream = resolved

    def __enter__(self):
        self._lock.acquire()
        try:
            # the thread's own, empty tape slot (re-entrant: the outer one comes back)
            private_tape_slot.__enter__(self)
            try:
                self._enter_device()
                if self._torch_stream is not None:
                    try:
                        self._run_on.wait_stream(self._torch_stream)
                    except BaseException:
                        self._exit_device()
                        raise
            except BaseException:
                private_tape_slot.__exit__(self)
                raise
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc):
        try:
            try:
                if self._torch_stream is not None:
                    self._torch_stream.wait_stream(self._run_on)
            finally:
                self._exit_device()
        finally:
            try:
                private_tape_slot.__exit__(self)
            finally:
                self._lock.release()

    # wp.ScopedDevice / wp.ScopedStream(sync_enter=False) inline, their saved state
    # on the scope (one object a scope, not one or two more): the Warp device made
    # the default (and its CUDA context current), the stream made the device's
    def _enter_device(self):
        device = self._device
        runtime = device.runtime
        self._saved_device = runtime.default_device
        runtime.default_device = device
        try:
            device.context_guard.__enter__()
        except BaseException:
            runtime.default_device = self._saved_device
            raise
        run_on = self._run_on
        if run_on is not None:
            try:
                self._saved_stream = device.stream
                device.set_stream(run_on, False)
            except BaseException:
                self._exit_context()
                raise

    def _exit_device(self):
        run_on = self._run_on
        try:
            if run_on is not None:
                self._device.set_stream(self._saved_stream, False)
        finally:
            self._exit_context()

    def _exit_context(self):
        try:
            self._device.context_guard.__exit__(None, None, None)
        finally:
            self._device.runtime.default_device = self._saved_device
