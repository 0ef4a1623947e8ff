"""Timing for the benchmarks: CUDA events on a GPU, the wall clock on the CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import warp as wp

__all__ = ["timer"]


def timer(device) -> Callable[[Callable[[], object]], float]:
    """``timed(fn)``: milliseconds of one call of ``fn`` on ``device`` (synchronised)."""
    if device.is_cuda:

        def timed(fn):
            start = wp.Event(device, enable_timing=True)
            end = wp.Event(device, enable_timing=True)
            wp.record_event(start)
            fn()
            wp.record_event(end)
            wp.synchronize_event(end)
            return wp.get_event_elapsed_time(start, end)

    else:

        def timed(fn):
            t0 = time.perf_counter()
            fn()
            wp.synchronize_device(device)
            return (time.perf_counter() - t0) * 1e3

    return timed
