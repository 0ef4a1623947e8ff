"""The torch ops' stream scope (warpraster.torch.streams._TorchStream): the Warp device
and stream it makes current, and what it brings back on exit (nested, on exceptions).
A stand-in device takes the CUDA branch (own stream, event waits) on any host."""

import threading

import pytest

torch = pytest.importorskip("torch")

import warp as wp  # noqa: E402

from warpraster.torch import streams  # noqa: E402
from warpraster.torch.streams import _TorchStream  # noqa: E402

CPU = torch.device("cpu")


class _Runtime:
    default_device = "previous device"


class _Guard:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("push")

    def __exit__(self, *exc):
        self.log.append("pop")


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


class _Device:
    def __init__(self, log, fail_set=False):
        self.runtime = _Runtime()
        self.context_guard = _Guard(log)
        self.stream = _Stream("previous stream", log)
        self.log, self.fail_set = log, fail_set

    def set_stream(self, stream, sync=True):
        if self.fail_set:
            raise RuntimeError("set_stream failed")
        self.log.append(f"set {stream.name} sync={sync}")
        self.stream = stream


def _stand_in(monkeypatch, fail_set=False):
    log = []
    dev = _Device(log, fail_set)
    lock = threading.RLock()
    run_on, torch_stream = _Stream("own", log), _Stream("torch", log)
    monkeypatch.setitem(streams._RESOLVED, (CPU, None), (dev, lock, run_on, torch_stream))
    return dev, lock, run_on, log


def test_scope_makes_device_and_stream_current_and_restores_them(monkeypatch):
    dev, lock, run_on, log = _stand_in(monkeypatch)
    previous = dev.stream
    with _TorchStream(CPU):
        assert dev.runtime.default_device is dev and dev.stream is run_on
        with _TorchStream(CPU):  # nested: the same device and stream (kept objects)
            assert dev.runtime.default_device is dev and dev.stream is run_on
        assert dev.runtime.default_device is dev and dev.stream is run_on
    assert dev.runtime.default_device == "previous device" and dev.stream is previous
    assert log == [
        "push", "set own sync=False", "own waits torch",
        "push", "set own sync=False", "own waits torch",
        "torch waits own", "set own sync=False", "pop",
        "torch waits own", "set previous stream sync=False", "pop",
    ]  # fmt: skip
    assert lock.acquire(blocking=False)  # released (re-entrant: ours now)
    lock.release()


def test_scope_restores_device_and_stream_on_exceptions(monkeypatch):
    dev, lock, run_on, log = _stand_in(monkeypatch)
    previous = dev.stream
    runtime = wp._src.context.runtime
    user = wp.Tape()
    with user:
        with pytest.raises(KeyError):
            with _TorchStream(CPU):
                with pytest.raises(ValueError):
                    with _TorchStream(CPU):
                        raise ValueError
                assert dev.runtime.default_device is dev and dev.stream is run_on
                raise KeyError
        assert runtime.tape is user
    assert dev.runtime.default_device == "previous device" and dev.stream is previous
    assert log.count("push") == log.count("pop") == 2


def test_scope_entry_failure_leaves_nothing_changed(monkeypatch):
    dev, lock, run_on, log = _stand_in(monkeypatch, fail_set=True)
    previous = dev.stream
    runtime = wp._src.context.runtime
    user = wp.Tape()
    with user:
        with pytest.raises(RuntimeError, match="set_stream failed"):
            with _TorchStream(CPU):
                pass
        assert runtime.tape is user
    assert dev.runtime.default_device == "previous device" and dev.stream is previous
    assert log == ["push", "pop"]
    ok = []
    t = threading.Thread(target=lambda: ok.append(lock.acquire(blocking=False)))
    t.start()
    t.join()
    assert ok == [True]  # the device lock released


def test_scope_on_the_cpu_device_restores_warp_default_device():
    runtime = wp._src.context.runtime
    before = runtime.default_device
    cpu = wp.get_device("cpu")
    with pytest.raises(ValueError):
        with _TorchStream(CPU):
            assert wp.get_device() is cpu
            with _TorchStream(CPU):
                assert wp.get_device() is cpu
            raise ValueError
    assert runtime.default_device is before
