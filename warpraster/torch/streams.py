"""Warp work on torch's device and current stream (shared by the torch ops)."""

from __future__ import annotations

import torch
import warp as wp

__all__ = ["_TorchStream"]


def _warp_device(device: torch.device):
    wp.init()  # a no-op once Warp is up
    if device.type == "cuda" and not wp.is_cuda_available():
        raise RuntimeError(
            f"the tensors are on {device}, but Warp sees no CUDA device (driver or build)"
        )
    return wp.device_from_torch(device)


class _TorchStream:
    """Runs Warp work on torch's current stream of ``device`` (and on that Warp device)."""

    def __init__(self, device: torch.device):
        wp_device = _warp_device(device)
        if wp_device.is_cuda:
            # Same stream as torch: no synchronisation needed on entry or exit.
            self._scope = wp.ScopedStream(wp.stream_from_torch(device), sync_enter=False)
        else:
            self._scope = wp.ScopedDevice(wp_device)

    def __enter__(self):
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)
