"""Timing for the benchmarks: CUDA events on a GPU, the wall clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import warp as wp

__all__ = ["alternating_medians", "captured", "timer"]


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


def captured(fn: Callable[[], object], device) -> wp.Graph:
    """``fn`` run once (its kernels loaded, its buffers made), then captured as a
    CUDA graph."""
    fn()
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        fn()
    return cap.graph


def alternating_medians(graphs: dict, device, runs: int) -> dict:
    """Median milliseconds of replaying each of ``graphs`` (key -> graph), ``runs``
    rounds that replay every graph once in turn (A/B comparisons on a shared
    machine)."""
    timed = timer(device)
    times = {k: [] for k in graphs}
    for _ in range(runs):
        for k, g in graphs.items():
            times[k].append(timed(lambda g=g: wp.capture_launch(g)))
    return {k: statistics.median(v) for k, v in times.items()}
