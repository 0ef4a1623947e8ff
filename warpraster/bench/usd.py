"""The usd suite: a USD stage as ``warpraster render`` draws it (the bundled scene
unless ``--usd-scene``), at the command's default 4 samples per pixel.

Columns: ``load ms`` (:func:`~warpraster.usd.load_stage`, median of ``--runs``
loads), ``frame ms`` and ``frames/s`` (a whole pass over the frames as the
command makes it, after a warm-up frame: the stage evaluated at each frame and
written into the renderer, rendered, copied to the host, converted to sRGB and
written as a PNG at the command's default level, the files of frame t written on
:class:`~warpraster.frame_writer.FrameWriter`'s threads while frame t+1 renders;
the pass's wall clock until the last file is written, over its frames, median of
``--runs`` passes), ``render ms`` (the device render alone,
``StageRenderer.render_device``, eager) and ``graph ms`` (the same captured in a
CUDA graph and replayed). Render columns: medians after a warm-up frame (CUDA
events on a GPU, the wall clock otherwise).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import warp as wp

from ..cli import default_scene_path
from ..frame_writer import FrameWriter, render_frames
from ..timing import timer
from ..usd import load_stage
from ..usd.animation import StageAnimation, parse_frames
from ..usd.render import StageRenderer

__all__ = ["run"]

#: Frames of the stage's range timed when ``--frames`` is not given.
MAX_FRAMES = 24
#: Samples per pixel: the command's default.
SPP = 4


def run(args, argv: list[str]) -> int:
    """The suite for the parsed options ``args``."""
    device = wp.get_device(args.device)
    path = Path(args.usd_scene) if args.usd_scene else default_scene_path()
    loads = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        scene = load_stage(str(path), require_meshes=True)
        loads.append((time.perf_counter() - t0) * 1e3)
    frames = parse_frames(args.frames, scene.frame_range) or [None]
    if args.frames is None:
        frames = frames[:MAX_FRAMES]
    cam = StageRenderer.resolve_camera(scene, None)
    size = (max(1, round(args.width / cam.aspect)), args.width)
    anim = StageAnimation(scene) if scene.frame_range is not None else None
    renderer = StageRenderer(scene, camera=cam, image_size=size, spp=SPP, device=device)
    passes = []
    with tempfile.TemporaryDirectory() as tmp, FrameWriter(renderer, Path(tmp)) as writer:
        render_frames(renderer, frames[:1], writer, anim=anim)  # warm-up: kernels, buffers
        writer.finish()
        for _ in range(args.runs):
            t0 = time.perf_counter()
            render_frames(renderer, frames, writer, anim=anim)
            writer.finish()
            passes.append((time.perf_counter() - t0) * 1e3 / len(frames))
    timed = timer(device)
    render = statistics.median(timed(renderer.render_device) for _ in range(args.runs))
    graph = None
    if device.is_cuda:
        with wp.ScopedCapture(device=device, force_module_load=False) as cap:
            renderer.render_device()
        graph = statistics.median(
            timed(lambda: wp.capture_launch(cap.graph)) for _ in range(args.runs)
        )
    row = {
        "scene": str(path.name),
        "device": str(device),
        "triangles": int(scene.meshes.num_faces),
        "image_size": list(size),
        "spp": SPP,
        "frames": len(frames),
        "runs": args.runs,
        "load_ms": statistics.median(loads),
        "frame_ms": statistics.median(passes),
        "frames_per_s": 1e3 / statistics.median(passes),
        "render_ms": render,
        "graph_render_ms": graph,
    }
    print(f"warpraster bench --suite usd on {device} ({getattr(device, 'name', '')}), {SPP} spp")
    print(f"{'scene':<28}{'triangles':>10}{'size':>10}{'frames':>7}{'load ms':>9}"
          f"{'frame ms':>9}{'frames/s':>9}{'render ms':>10}{'graph ms':>9}")  # fmt: skip
    g = f"{graph:>9.3f}" if graph is not None else f"{'-':>9}"
    shape = f"{size[1]}x{size[0]}"
    print(f"{row['scene']:<28}{row['triangles']:>10}{shape:>10}{len(frames):>7}"
          f"{row['load_ms']:>9.1f}{row['frame_ms']:>9.2f}{row['frames_per_s']:>9.1f}"
          f"{render:>10.3f}{g}")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([row], fh, indent=1)
    return 0
