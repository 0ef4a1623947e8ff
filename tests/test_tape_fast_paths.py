"""The tape helpers' fast paths give what their plain forms give: record_func's
arrays (backward/tape.py), the private tape slot (tape_slots.py), the graph rule
(raster/workspace.py graphs_enabled)."""

from __future__ import annotations

import warp as wp

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
