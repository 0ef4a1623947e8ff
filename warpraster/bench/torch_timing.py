"""Timing of torch work in the suites' peer columns (torch ops, nvdiffrast)."""

from __future__ import annotations

import time

__all__ = ["torch_timer"]


def torch_timer(device):
    """A function timing one call of ``fn`` in milliseconds on the torch ``device``:
    CUDA events around it on a GPU (the call's device time, the caller having warmed
    up), the wall clock on the CPU."""
    import torch

    if torch.device(device).type == "cuda":

        def timed(fn):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        return timed

    def timed_cpu(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return timed_cpu
