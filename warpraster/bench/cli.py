"""``warpraster bench`` / ``python -m warpraster.bench``: the options, parsed before
Warp is imported (``--help`` and argument errors answer at once), then one suite."""

from __future__ import annotations

import argparse
import sys

from .scenes import CPU_SCENES, GPU_SCENES, RENDERER_TARGETS

__all__ = ["SUITES", "build_parser", "main"]

DESCRIPTION = """\
The benchmark, one suite a run (eager and graph columns: a Python call, and the
same work captured in a CUDA graph and replayed, as a simulation loop runs it):

  raster    rasterize_packed on icosphere scenes, forward and forward + backward;
            every scene checks itself first (binned == naive on random pixels)
            and reports its memory (workspace, outputs, pool high-water mark)
  renderer  Renderer: rasterize + shade + blend, and render + image MSE + backward
  sensor    CameraSensor: W worlds x C cameras of a posed 2,000-triangle body,
            colour + depth, update and update + loss + backward (--newton: also
            Newton's SensorTiledCamera on the same scene)
  usd       the bundled USD scene (or --usd-scene) as `warpraster render` draws it:
            load, then per frame set the frame, render, copy back and write the PNG
  antialias Antialias alone on the textured K = 1 render (ico5 x8 512²): the sparse
            (default), gather and deterministic forwards, forward and forward +
            backward (--nvdiffrast: also nvdiffrast's antialias on the same inputs)

Times are medians of --runs timed calls after warm-up (CUDA events on a GPU, the
wall clock on the CPU; the sensor suite: the mean over --runs calls).
"""

#: suite -> its scene names (None: one scene, set by the suite's options)
SUITES = {
    "raster": [s.name for s in GPU_SCENES + CPU_SCENES],
    "renderer": list(RENDERER_TARGETS),
    "sensor": None,
    "usd": None,
    "antialias": None,
}

#: The raster suite's on/off options: (flag, help).
_RASTER_SWITCHES = (
    ("--no-memory", "skip the per-scene memory probe (CUDA: one child process per scene)"),
    (
        "--generic-kernels",
        "CUDA: queue kernels read the flags at run time (no compiled-in variants)",
    ),
    ("--narrow-outputs", "outputs written one slot per store (not four per 16-byte store)"),
    (
        "--no-call-graphs",
        "eager calls issue their launches from Python every time (Tuning.call_graphs)",
    ),
    (
        "--deterministic",
        "RasterSettings(deterministic=True): the backward sums in a fixed "
        "order (compare its backward column with a run without)",
    ),
)

#: Raster options the memory probe's child processes are given again.
TUNING_FLAGS = ("--no-call-graphs", "--generic-kernels", "--narrow-outputs", "--deterministic")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="warpraster bench",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--suite", choices=list(SUITES), default=None, help="which benchmark (default: raster)"
    )
    ap.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    ap.add_argument(
        "--runs",
        type=int,
        default=None,
        help="timed runs per scene (default: 20; sensor 50; usd 3)",
    )
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument(
        "--scenes",
        default=None,
        metavar="A,B",
        help="comma-separated scene names (default: every scene of the suite; raster: the "
        f"device's list). raster GPU: {', '.join(s.name for s in GPU_SCENES)}. "
        f"raster CPU: {', '.join(s.name for s in CPU_SCENES)}. "
        f"renderer: {', '.join(RENDERER_TARGETS)}",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="per-kernel times (CUDA); renderer with --torch: the torch step's "
        "host timeline and its kernels beside the Warp step's",
    )
    ap.add_argument("--renderer", action="store_true", help="the same as --suite renderer")
    ap.add_argument("--sensor", action="store_true", help="the same as --suite sensor")
    r = ap.add_argument_group("raster suite")
    r.add_argument("--bin-size", type=int, default=None, help="override the bin size")
    for flag, text in _RASTER_SWITCHES:
        r.add_argument(flag, action="store_true", help=text)
    r.add_argument(
        "--max-regs",
        default=None,
        help="CUDA register caps, e.g. queue8=56,outputs=40 (Tuning.max_registers)",
    )
    r.add_argument(
        "--small-lanes",
        type=int,
        default=None,
        help="threads per face in the K=1 small-face pass (default: automatic)",
    )
    r.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    g = ap.add_argument_group("renderer suite")
    g.add_argument(
        "--channels",
        choices=("none", "all", "both"),
        default="both",
        help="extra channels (depth, normals, face and mesh ids) beside the image: "
        "none (the image alone, as the anchors), all, or both rows",
    )
    g.add_argument(
        "--torch",
        action="store_true",
        help="also the torch columns: each scene through warpraster.torch's MeshRenderer "
        "(forward, and forward + MSE + backward with autograd), called eagerly, its slots "
        "launching kernel by kernel (torch) and replaying captured graphs (torch g)",
    )
    g.add_argument(
        "--nvdiffrast",
        action="store_true",
        help="also nvdiffrast's pipeline (rasterize + interpolate + texture + antialias) on "
        "the textured K = 1 scene, eager (needs nvdiffrast and CUDA)",
    )
    s = ap.add_argument_group("sensor suite")
    s.add_argument("--worlds", type=int, default=64)
    s.add_argument("--cameras", type=int, default=2)
    s.add_argument("--size", type=int, default=128, help="image size (square)")
    s.add_argument("--newton", action="store_true", help="also time Newton's SensorTiledCamera")
    s.add_argument(
        "--materials",
        action="store_true",
        help="each torus textured (a 64² texture) and the core's lights on",
    )
    s.add_argument(
        "--near-clip",
        type=float,
        default=None,
        help="the sensor's near_clip (default: the sensor's default; 0: no clipping)",
    )
    s.add_argument(
        "--generated-backward",
        action="store_true",
        help="Warp's generated adjoints instead of the deterministic backward",
    )
    u = ap.add_argument_group("usd suite")
    u.add_argument(
        "--usd-scene", default=None, metavar="FILE", help="USD file (default: the bundled scene)"
    )
    u.add_argument(
        "--frames",
        default=None,
        metavar="A:B",
        help="frames to render (default: the stage's range, at most 24)",
    )
    u.add_argument("--width", type=int, default=640, help="image width (the camera sets H)")
    return ap


def parse(argv) -> argparse.Namespace:
    """The options, checked (``--scenes`` against the suite's scene list)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    picked = [n for n, on in (("renderer", args.renderer), ("sensor", args.sensor)) if on]
    if args.suite is not None:
        picked.append(args.suite)
    if len(set(picked)) > 1:
        ap.error(f"one suite at a time, got {', '.join(sorted(set(picked)))}")
    args.suite = picked[0] if picked else "raster"
    if args.runs is None:
        args.runs = {"sensor": 50, "usd": 3}.get(args.suite, 20)
    if args.runs < 1:
        ap.error(f"--runs must be >= 1, got {args.runs}")
    if args.scenes is not None:
        known = SUITES[args.suite]
        if known is None:
            ap.error(f"--scenes: the {args.suite} suite has one scene (set by its options)")
        wanted = [n for n in args.scenes.split(",") if n]
        unknown = [n for n in wanted if n not in known]
        if unknown or not wanted:
            ap.error(
                f"--scenes: no scene named {', '.join(unknown) or repr(args.scenes)} "
                f"({args.suite} scenes: {', '.join(known)})"
            )
    return args


def main(argv=None) -> int:
    """Parses, then runs the chosen suite; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    from ..cli import init_warp

    init_warp()  # quiet: no banner, no module-load lines, no native start-up notice
    if args.suite == "raster":
        from . import raster as suite
    elif args.suite == "renderer":
        from . import renderer as suite
    elif args.suite == "sensor":
        from . import sensor as suite
    elif args.suite == "antialias":
        from . import antialias as suite
    else:
        from . import usd as suite
    return suite.run(args, argv)
