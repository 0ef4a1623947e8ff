"""The tape helpers' fast paths give what their plain forms give: record_func's
arrays (backward/tape.py), the private tape slot (tape_slots.py), the graph rule
(raster/workspace.py graphs_enabled)."""

from __future__ import annotations

import warp as wp

from warpraster import tape_slots
from warpraster.backward.tape import record_func
from warpraster.raster.workspace import graphs_enabled


def _arrays():
    with_grad = wp.zeros(3, dtype=wp.float32, device="cpu", requires_grad=True)
    no_grad = wp.zeros(3, dtype=wp.float32, device="cpu")
    empty = wp.zeros(0, dtype=wp.float32, device="cpu", requires_grad=True)
    return with_grad, no_grad, empty


class _Listing(wp.Tape):
    def record_func(self, backward, arrays):
        self.seen = list(arrays)
        super().record_func(backward, arrays)


class _NotListing(_Listing):
    lists_arrays = False


def test_record_func_filters_for_tapes_that_list_arrays():
    with_grad, no_grad, empty = _arrays()
    fn = lambda: None  # noqa: E731
    tape = wp.Tape()
    record_func(tape, fn, [with_grad, None, no_grad, empty])
    assert tape.launches == [fn]
    assert list(tape.gradients) == [with_grad]
    sub = _Listing()
    record_func(sub, fn, [with_grad, None, no_grad, empty])
    assert sub.seen == [with_grad] and sub.launches == [fn]
    # a gradient removed since the last call is filtered out again (read every call)
    with_grad.grad = None
    record_func(sub, fn, [with_grad, None, no_grad, empty])
    assert sub.seen == []


def test_record_func_gives_no_arrays_to_a_tape_that_does_not_list_them():
    with_grad, no_grad, empty = _arrays()
    fn = lambda: None  # noqa: E731
    tape = _NotListing()
    record_func(tape, fn, [with_grad, None, no_grad, empty])
    assert tape.seen == [] and tape.launches == [fn] and not tape.gradients


class _CudaLike:
    """What graphs_enabled reads of a CUDA device, each settable (counted reads of
    ``is_capturing``)."""

    is_cuda = True

    def __init__(self):
        self.stream = type("S", (), {"cuda_stream": 1})()
        self.is_mempool_enabled = True
        self.capturing = False
        self.capture_reads = 0

    @property
    def is_capturing(self):
        self.capture_reads += 1
        return self.capturing


def test_graphs_enabled_reads_the_memory_pool_the_stream_and_the_capture_every_call():
    dev = _CudaLike()
    assert graphs_enabled(dev, None) and graphs_enabled(dev, True)
    assert not graphs_enabled(dev, False)
    dev.is_mempool_enabled = False  # (wp.set_mempool_enabled writes this field)
    assert not graphs_enabled(dev, None) and not graphs_enabled(dev, True)
    dev.is_mempool_enabled = True
    assert graphs_enabled(dev, None)
    dev.stream.cuda_stream = 0  # the legacy default stream
    assert not graphs_enabled(dev, None)
    dev.stream.cuda_stream = 2
    reads = dev.capture_reads
    dev.capturing = True
    assert not graphs_enabled(dev, None)
    dev.capturing = False
    assert graphs_enabled(dev, None) and dev.capture_reads == reads + 2


def test_graphs_enabled_on_the_cpu_device():
    dev = wp.get_device("cpu")
    # the field read for CUDA devices is the one wp.is_mempool_enabled returns
    assert type(dev.is_mempool_enabled) is bool
    assert dev.is_mempool_enabled == wp.is_mempool_enabled(dev)
    assert not graphs_enabled(dev, None) and not graphs_enabled(dev, False)
    assert graphs_enabled(dev, True)
    with wp.ScopedCapture(device=dev, force_module_load=False):
        assert not graphs_enabled(dev, True)
    assert graphs_enabled(dev, True)


def _runtime():
    return wp._src.context.runtime


def test_private_tape_slots_nest_each_empty_and_give_the_outer_tape_back():
    tape_slots.install()
    runtime = _runtime()
    outer = wp.Tape()
    with outer:
        with tape_slots.private_tape_slot() as a:
            assert runtime.tape is None
            inner = wp.Tape()
            with inner:
                with tape_slots.private_tape_slot():
                    assert runtime.tape is None
                assert runtime.tape is inner
            assert runtime.tape is None
        assert runtime.tape is outer and isinstance(a, tape_slots.private_tape_slot)
        try:  # left on an exception too
            with tape_slots.private_tape_slot():
                raise KeyError
        except KeyError:
            pass
        assert runtime.tape is outer
    assert runtime.tape is None


def test_a_private_tape_slot_installs_the_descriptor_again_where_it_is_gone(monkeypatch):
    """The entry checks the descriptor on Warp's Runtime class each time (nothing
    remembered from an earlier install): where it was taken off (or replaced by
    another), the slot installs it again and is still private."""
    tape_slots.install()
    runtime_type = type(_runtime())
    with tape_slots.private_tape_slot():
        pass  # the descriptor seen installed once
    monkeypatch.delattr(runtime_type, "tape")  # gone (restored after the test)
    _runtime().__dict__["tape"] = None
    outer = wp.Tape()
    with outer:
        with tape_slots.private_tape_slot():
            assert isinstance(runtime_type.__dict__.get("tape"), tape_slots._TapeSlot)
            assert _runtime().tape is None  # private: the outer tape is not seen
        assert _runtime().tape is outer
    monkeypatch.undo()
    with tape_slots.private_tape_slot():  # the original descriptor back on the class
        assert runtime_type.__dict__["tape"] is tape_slots._SLOT
