"""Workspaces the torch adapter reuses across calls (as nvdiffrast's ``RasterizeCudaContext``).

A :class:`RasterContext` keeps one raster workspace (face set-up, bin lists,
counters) and one set of backward buffers per (device, stream, batch size,
face count, render settings): a training loop that renders the same shapes
every step allocates no Warp memory after its first step. The outputs are
written into fresh torch tensors each call (torch's caching allocator), so a
later call never overwrites tensors an earlier call returned or saved for its
backward. The scratch is shared only by calls from one host thread on one
stream (their work is ordered); another thread or stream gets its own workspace.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import warp as wp

from ..backward import FaceGradBuffers
from ..raster import ClipWorkspace, RasterWorkspace
from ..settings import RasterSettings, Tuning

__all__ = ["RasterContext", "default_context"]


class RasterContext:
    """Reusable workspaces for :func:`warpraster.torch.rasterize_meshes`.

    Args:
        max_workspaces: most configurations kept (least recently used dropped).
        tuning: :class:`~warpraster.settings.Tuning` of the workspaces it makes.

    Pass one as ``context=`` to keep a model's buffers apart from others', or
    let the calls use :func:`default_context` (one per process).
    """

    def __init__(self, max_workspaces: int = 8, tuning: Tuning | None = None):
        if max_workspaces < 1:
            raise ValueError(f"max_workspaces must be >= 1, got {max_workspaces}")
        self.max_workspaces = int(max_workspaces)
        self.tuning = tuning
        self._entries: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, key: tuple, make):
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                hit = self._entries[key] = make()
                while len(self._entries) > self.max_workspaces:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
            return hit

    def workspace(
        self, device, stream_key, *, num_verts: int, num_faces: int, num_meshes: int,
        settings: RasterSettings,
    ) -> RasterWorkspace | ClipWorkspace:  # fmt: skip
        """The forward workspace of this configuration (made on first use)."""
        device = wp.get_device(device)
        if settings.clipped:
            key = ("clip", device.alias, stream_key, num_verts, num_faces, num_meshes, settings)
            return self._get(key, lambda: ClipWorkspace(
                num_verts=num_verts, num_faces=num_faces, num_meshes=num_meshes,
                settings=settings, device=device, tuning=self.tuning))  # fmt: skip
        structural = settings.replace(blur_radius=0.0, perspective_correct=False,
                                      clip_barycentric_coords=False, cull_backfaces=False,
                                      exact_perspective_grad=False)  # fmt: skip
        key = ("raster", device.alias, stream_key, num_faces, num_meshes, structural)
        return self._get(key, lambda: RasterWorkspace(
            num_meshes=num_meshes, num_faces=num_faces, settings=structural, device=device,
            tuning=self.tuning, allocate_outputs=False))  # fmt: skip

    def backward_buffers(self, device, stream_key, num_faces: int) -> FaceGradBuffers:
        """Per-face scratch of the backward for this face count (made on first use)."""
        device = wp.get_device(device)
        key = ("grad", device.alias, stream_key, num_faces)
        return self._get(key, lambda: FaceGradBuffers(num_faces, device, False, gather=True))

    def clear(self) -> None:
        """Drops every workspace (their memory returns to Warp's pool)."""
        with self._lock:
            self._entries.clear()


_DEFAULT = RasterContext()


def default_context() -> RasterContext:
    """The process-wide context the torch ops use when given none."""
    return _DEFAULT
