"""The tape helpers' fast paths give what their plain forms give: record_func's
arrays (backward/tape.py), the private tape slot (tape_slots.py), the graph rule
(raster/workspace.py graphs_enabled)."""

from __future__ import annotations

import warp as wp

from warpraster.backward.tape import record_func


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
