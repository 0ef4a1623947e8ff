"""Writes the ``warpraster render`` command's files while the next frames render.

One frame's files are written on a small thread pool while the main thread
evaluates the stage at the next time and renders it (zlib, Pillow's encoder and
NumPy's ufuncs release the GIL). The renderer's device outputs are copied into
one of a few host buffer sets (pinned on CUDA, so the copy is asynchronous on the
renderer's stream and an event says when it landed); a worker waits for that
event, turns the buffers into the frame's images (sRGB, ids, depth), hands the
set back and encodes and writes the files. The files are those the sequential
command wrote, byte for byte at the same PNG level: same arrays, same encoder.

A write that fails is raised in the main thread (by :meth:`FrameWriter.submit` or
:meth:`FrameWriter.finish`) as the command's one-line :class:`CliError`; leaving
the ``with`` block by it or by Ctrl-C cancels the frames not yet started and
waits for those being written, whose files are whole (written under a temporary
name and renamed); leaving it by another error (a frame that cannot be read)
first writes the frames rendered before it.
"""

from __future__ import annotations

import os
import queue
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import warp as wp

from .cli_files import (
    CliError,
    _encode_ids,
    _os_reason,
    _save_npz,
    _save_png,
    _write_atomic,
    _write_depth,
)
from .usd.render import linear_to_srgb

__all__ = ["FrameWriter", "frame_label", "render_frames", "srgb8"]

#: zlib level of the command's PNGs: 1 writes them about three times as fast as
#: Pillow's default 6, in files about 15 % larger; the pixels are the same.
DEFAULT_PNG_LEVEL = 1


def frame_label(t) -> str:
    """The frame part of a file name: the time code as 4 digits, ``0000`` for None."""
    if t is None:
        return "0000"
    if float(t).is_integer():
        return f"{int(t):04d}"
    return f"{t:09.4f}".rstrip("0")


def srgb8(color: np.ndarray) -> np.ndarray:
    """(H, W, 4) linear RGB + alpha to the colour PNG's 8-bit sRGB + alpha."""
    rgba = np.concatenate([linear_to_srgb(color[..., :3]), color[..., 3:]], -1)
    return np.round(rgba * 255).astype(np.uint8)


def default_workers() -> int:
    """Writer threads: one core is left to the render loop, at most 8."""
    return max(1, min(8, (os.cpu_count() or 2) - 1))


class _HostFrame:
    """One set of host buffers a frame's device outputs are copied into."""

    def __init__(self, renderer, names: tuple[str, ...]):
        dev = renderer.device
        self.names = names
        self.arrays = {
            n: wp.empty_like(getattr(renderer, n), device="cpu", pinned=dev.is_cuda) for n in names
        }
        self.event = wp.Event(dev) if dev.is_cuda else None

    def copy_from(self, renderer) -> None:
        """Queues the copies on the renderer's stream (synchronous on the cpu device)."""
        for n in self.names:
            wp.copy(self.arrays[n], getattr(renderer, n))
        if self.event is not None:
            renderer.device.stream.record_event(self.event)

    def read(self) -> dict[str, np.ndarray]:
        """Waits for the copies; views of the buffers (valid until the set is reused)."""
        if self.event is not None:
            wp.synchronize_event(self.event)
        return {n: a.numpy() for n, a in self.arrays.items()}


@dataclass
class _Written:
    coverage: float
    paths: list[Path]


class FrameWriter:
    """Writes each rendered frame's files on worker threads, in frame order.

    Args:
        renderer: the :class:`~warpraster.usd.render.StageRenderer` whose outputs
            (``color``, ``face_id``; ``depth``, ``mesh_id`` when asked) are written.
        out_dir: the folder (it exists).
        depth: also write ``depth.<frame>`` (``depth_format``: auto, png or exr).
        ids: also write ``face_id.<frame>.png`` and ``mesh_id.<frame>.png``.
        png_level: zlib level 0-9 of every PNG.
        workers: writer threads (default: :func:`default_workers`).
    """

    def __init__(self, renderer, out_dir: Path, *, depth: bool = False, depth_format="auto",
                 ids: bool = False, png_level: int = DEFAULT_PNG_LEVEL,
                 workers: int | None = None):  # fmt: skip
        self.out_dir = Path(out_dir)
        self.depth, self.depth_format, self.ids = depth, depth_format, ids
        self.png_level = png_level
        self.workers = workers or default_workers()
        names = ("color", "face_id") + ("depth",) * depth + ("mesh_id",) * ids
        # a set being filled, one waiting for a worker, one per worker converting
        self._free: queue.SimpleQueue[_HostFrame] = queue.SimpleQueue()
        for _ in range(self.workers + 2):
            self._free.put(_HostFrame(renderer, names))
        self._renderer = renderer
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="warpraster-write")
        self._pending: deque[Future] = deque()
        self._done: list[_Written] = []

    def __enter__(self) -> FrameWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Ctrl-C or a failed write: the frames not yet started are dropped (the
        # files being written are finished: whole files only); any other error
        # (a frame that cannot be read) lets the frames rendered before it be written
        stop = exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, CliError))
        if stop:
            for f in self._pending:
                f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=stop)

    def submit(self, t, fragments: dict | None = None) -> None:
        """Hands the renderer's current outputs, frame time ``t``, to the writers.

        Call it after ``renderer.render_device()``; the next render may start at
        once. ``fragments``: host arrays to write as ``fragments.<frame>.npz``.
        Raises the first failed write of an earlier frame.
        """
        self._collect(block=len(self._pending) >= 2 * self.workers)
        buf = self._free.get()  # waits while every set is being converted
        buf.copy_from(self._renderer)
        self._pending.append(self._pool.submit(self._write, buf, frame_label(t), fragments))

    def finish(self) -> tuple[list[float], list[Path]]:
        """Waits for every frame handed over since the last call; returns their
        coverages and their files, in frame order."""
        while self._pending:
            self._collect(block=True)
        done, self._done = self._done, []
        return [w.coverage for w in done], [p for w in done for p in w.paths]

    def _collect(self, *, block: bool) -> None:
        """Takes the finished frames off the front (the oldest one waited for if
        ``block``); a failed write is raised as the command's error."""
        while self._pending and (block or self._pending[0].done()):
            block = False
            try:
                self._done.append(self._pending.popleft().result())
            except OSError as err:  # a full disk, a folder removed meanwhile, ...
                name = Path(err.filename).name if err.filename else "a file"
                raise CliError(f"{self.out_dir}: cannot write {name} ({_os_reason(err)})") from None

    def _write(self, buf: _HostFrame, label: str, fragments) -> _Written:
        """One frame's files (on a worker thread)."""
        try:
            host = buf.read()
            color = srgb8(host["color"])
            coverage = float((host["face_id"] >= 0).mean())
            depth = host["depth"].copy() if self.depth else None
            ids = {k: _encode_ids(host[k]) for k in ("face_id", "mesh_id")} if self.ids else {}
        finally:
            self._free.put(buf)
        out, level = self.out_dir, self.png_level
        png = out / f"color.{label}.png"
        _save_png(png, color, compress_level=level)
        paths = [png]
        if depth is not None:
            paths.append(_write_depth(out / f"depth.{label}", depth, self.depth_format, level))
        for key, image in ids.items():
            paths.append(out / f"{key}.{label}.png")
            _save_png(paths[-1], image, compress_level=level)
        if fragments is not None:
            paths.append(out / f"fragments.{label}.npz")
            _write_atomic(paths[-1], lambda tmp: _save_npz(tmp, fragments))
        return _Written(coverage, paths)


def render_frames(renderer, frames, writer: FrameWriter, *, anim=None, camera=None,
                  fragments: bool = False) -> float:  # fmt: skip
    """Renders each time of ``frames`` and hands it to ``writer``: the stage evaluated
    at the time by ``anim`` (a :class:`~warpraster.usd.animation.StageAnimation`;
    None, or a time None, renders the renderer's scene as it is) through ``camera``
    (a prim path, None for the renderer's). Returns the ``time.perf_counter()`` at
    which the first frame was handed over (rendered, not yet written)."""
    first = None
    for t in frames:
        if anim is not None and t is not None:
            anim.frame(renderer, t, camera)
        renderer.render_device()
        writer.submit(t, renderer.fragments().numpy() if fragments else None)
        if first is None:
            first = time.perf_counter()
    return first
