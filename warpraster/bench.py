"""Benchmark: icosphere scenes, forward and forward + backward, on one Warp device.

``python -m warpraster.bench [--device cuda:0] [--json out.json] [--runs 20]`` (also
``warpraster bench ...``)

Scenes are generated in code: unit icospheres of radius 0.8 in NDC centred near
z = 2, N copies jittered by up to 0.15, blur 0 unless stated. Times are medians
of ``--runs`` timed calls after warm-up (CUDA events on a GPU, wall clock on the
CPU). Every scene checks its own answer first: the timed (binned) output must
equal the naive pass on a random subsample of pixels, so a fast wrong kernel
cannot win. Memory: the workspace's buffers (forward and backward) and the
output arrays; on CUDA also the memory pool's high-water mark over eager calls
("peak MB", forward + backward, counted from before the scene's inputs were
made) and what the calls allocate on top of the persistent buffers ("+call"),
each scene measured in a child process of its own (Warp 1.19 cannot reset the
high-water mark; ``--no-memory`` skips this).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass

import numpy as np
import warp as wp

from . import bench_render
from .fragments import FragmentRows, fragment_rows, slot_fragment
from .geometry import pixel_centre
from .meshes import MeshArrays, mesh_arrays, pack_meshes
from .primitives import ico_sphere
from .raster import RasterWorkspace, rasterize_naive_at, rasterize_packed
from .raster.small_faces import small_face_lanes
from .settings import RasterSettings, Tuning
from .sim import bench as sim_bench
from .timing import timer


@dataclass
class Scene:
    name: str
    level: int
    copies: int
    height: int
    width: int
    k: int
    blur: float = 0.0
    target_ms: float | None = None  # the forward target on an H200


GPU_SCENES = [
    Scene("ico5x8_512_k8", 5, 8, 512, 512, 8, target_ms=0.42),
    Scene("ico5x8_512_k1", 5, 8, 512, 512, 1, target_ms=0.33),
    Scene("ico6x8_512_k1", 6, 8, 512, 512, 1, target_ms=0.52),
    Scene("ico4x32_256_k8", 4, 32, 256, 256, 8, target_ms=0.44),
    Scene("ico7x1_1024_k1", 7, 1, 1024, 1024, 1, target_ms=0.46),
    Scene("ico8x1_1024_k1", 8, 1, 1024, 1024, 1, target_ms=1.22),
    Scene("ico5x8_1024x512_k8_blur", 5, 8, 512, 1024, 8, blur=1e-5),
    Scene("sim_2k_x64_128_k4", 0, 64, 128, 128, 4),  # level 0 marks the 2k-face mesh
]
CPU_SCENES = [
    Scene("ico4x1_256_k1", 4, 1, 256, 256, 1),
    Scene("ico4x1_256_k8", 4, 1, 256, 256, 8),
    Scene("ico5x1_256_k8", 5, 1, 256, 256, 8),
]


def make_scene(scene: Scene, seed: int = 0):
    """Packed NDC vertices / faces / offsets / counts of a benchmark scene."""
    rng = np.random.default_rng(seed)
    if scene.level == 0:
        v, f = ico_sphere(3)  # 1280 faces ...
        v2, f2 = ico_sphere(2)  # ... + 320 + 320 + 80 = 2000 faces: a "2k-face" body
        v3, f3 = ico_sphere(1)
        parts = [(v, f), (v2 * 0.5 + [0.3, 0.2, -0.2], f2), (v2 * 0.4 - [0.3, 0.3, 0.1], f2)]
        parts.append((v3 * 0.3 + [0.0, -0.4, 0.3], f3))
        vs, fs, off = [], [], 0
        for pv, pf in parts:
            vs.append(pv)
            fs.append(pf + off)
            off += len(pv)
        v, f = np.concatenate(vs).astype(np.float32), np.concatenate(fs).astype(np.int32)
    else:
        v, f = ico_sphere(scene.level)
    verts, faces = [], []
    for i in range(scene.copies):
        shift = rng.uniform(-0.15, 0.15, 3) + np.array([0.0, 0.0, 2.0])
        verts.append(v * 0.8 + shift)
        faces.append(f + i * len(v))
    nf = len(f)
    first = np.arange(scene.copies, dtype=np.int32) * nf
    count = np.full(scene.copies, nf, np.int32)
    return (
        np.concatenate(verts).astype(np.float32),
        np.concatenate(faces).astype(np.int32),
        first,
        count,
    )


@wp.kernel(enable_backward=False, module="unique", module_options={"fuse_fp": False})
def _values_at(
    # In:
    meshes: MeshArrays,
    pix: wp.array(dtype=wp.vec3i),
    height: int,
    width: int,
    # In: rows.pix_to_face; Out: rows.zbuf, bary, dists
    rows: FragmentRows,
):
    """The fragment values of rows ``rows.pix_to_face`` at pixels ``pix``, computed
    afresh from the vertices (the check for zbuf / bary / dists; no blur flags here)."""
    i, s = wp.tid()
    p = pixel_centre(pix[i][1], pix[i][2], height, width)
    z, b, d = slot_fragment(meshes, rows.pix_to_face[i, s], p, 0, 0)
    rows.zbuf[i, s] = z
    rows.bary[i, s] = b
    rows.dists[i, s] = d


def _nbytes(*arrays) -> int:
    return int(sum(a.capacity for a in arrays if a is not None))


def scene_settings(scene: Scene, bin_size=None) -> RasterSettings:
    """The render settings of a benchmark scene."""
    return RasterSettings(image_size=(scene.height, scene.width), faces_per_pixel=scene.k,
                          blur_radius=scene.blur, bin_size=bin_size)  # fmt: skip


def run_scene(
    scene: Scene,
    device,
    runs: int,
    bin_size=None,
    check_pixels: int = 2048,
    profile_kernels=False,
    tuning: Tuning | None = None,
) -> dict:
    v, f, first, count = make_scene(scene)
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    meshes = pack_meshes(verts, wp.array(f, dtype=wp.int32, device=device), first, count)
    h, w = scene.height, scene.width
    bs = bin_size
    settings = scene_settings(scene, bs)
    ws = RasterWorkspace(num_meshes=scene.copies, num_faces=len(f), settings=settings,
                         device=device, requires_grad=True, tuning=tuning)  # fmt: skip
    frags = rasterize_packed(meshes, ws, settings)  # warm-up: compiles, loads

    # Self-check: the timed path against the naive pass on a pixel subsample.
    rng = np.random.default_rng(1)
    m = min(check_pixels, scene.copies * h * w)
    pix = np.stack(
        [rng.integers(0, scene.copies, m), rng.integers(0, h, m), rng.integers(0, w, m)], 1
    ).astype(np.int32)
    pix_wp = wp.array(pix, dtype=wp.vec3i, device=device)
    ref = rasterize_naive_at(meshes, ws, pix_wp, settings).numpy()
    at = (pix[:, 0], pix[:, 1], pix[:, 2])
    got = frags.pix_to_face.numpy()[at]
    mismatches = int((got != ref).any(-1).sum())
    # ... and the values written for those faces: equal bits to a fresh
    # computation (same float32 operations, no FMA contraction on either side).
    want = [
        wp.empty((m, scene.k), dtype=t, device=device) for t in (wp.float32, wp.vec3, wp.float32)
    ]
    rows = fragment_rows(wp.array(got, dtype=wp.int32, device=device), *want)
    arrays = mesh_arrays(meshes.verts, meshes.faces)
    wp.launch(_values_at, dim=(m, scene.k), inputs=[arrays, pix_wp, h, w, rows],
              device=device)  # fmt: skip
    for a, b in zip((frags.zbuf, frags.bary_coords, frags.dists), want, strict=True):
        same = a.numpy()[at] == b.numpy()
        mismatches += int((~same.reshape(m, -1).all(-1)).sum())
    covered = float((frags.pix_to_face.numpy()[..., 0] >= 0).mean())

    timed = timer(device)
    fwd = [timed(lambda: rasterize_packed(meshes, ws, settings)) for _ in range(runs)]

    # Upstream gradients seeded once (a loss kernel would write them); each timed
    # run is forward + backward, with only the vertex gradient zeroed in between.
    tape = wp.Tape()
    with tape:
        out = rasterize_packed(meshes, ws, settings)
    out.zbuf.grad.fill_(1.0)
    out.dists.grad.fill_(0.5)
    out.bary_coords.grad.fill_(wp.vec3(0.25, -0.5, 0.75))

    def fwd_bwd():
        t = wp.Tape()  # a fresh tape: Tape.reset() would also zero the seeded gradients
        with t:
            rasterize_packed(meshes, ws, settings)
        verts.grad.zero_()
        t.backward()

    fwd_bwd()
    both = [timed(fwd_bwd) for _ in range(runs)]

    # The same calls captured in a CUDA graph (how a simulation loop runs them):
    # no Python launch overhead.
    graph_fwd = graph_both = None
    if device.is_cuda:
        with wp.ScopedCapture(device=device) as cap:
            rasterize_packed(meshes, ws, settings)
        g_fwd = cap.graph
        with wp.ScopedCapture(device=device) as cap:
            fwd_bwd()
        g_both = cap.graph
        wp.capture_launch(g_fwd)
        wp.capture_launch(g_both)
        graph_fwd = statistics.median(timed(lambda: wp.capture_launch(g_fwd)) for _ in range(runs))
        graph_both = statistics.median(
            timed(lambda: wp.capture_launch(g_both)) for _ in range(runs)
        )
    profile = None
    if profile_kernels and device.is_cuda:
        wp.synchronize_device(device)
        wp.timing_begin(cuda_filter=wp.TIMING_KERNEL | wp.TIMING_MEMSET)
        for _ in range(5):
            fwd_bwd()
        results = wp.timing_end()
        profile = {}
        for r in results:
            profile[r.name] = profile.get(r.name, 0.0) + r.elapsed / 5
    fr = ws.fragments
    ws_bytes = _nbytes(
        ws.face_mesh, ws.face_bbox, ws.face_verts, ws.no_neighbors, ws.counters,
        ws.bin_offset, ws.bin_faces, ws.depth_keys, ws.face_grads.face_grad,
    )  # fmt: skip
    out_bytes = _nbytes(fr.pix_to_face, fr.zbuf, fr.bary_coords, fr.dists)
    return {
        **asdict(scene),
        "faces": int(len(f)),
        "bin_size": bs,
        "bin": f"{ws.bin_h}x{ws.bin_w}",
        "device": str(device),
        "fwd_ms": statistics.median(fwd),
        "graph_fwd_ms": graph_fwd,
        "graph_fwd_bwd_ms": graph_both,
        "fwd_bwd_ms": statistics.median(both),
        "bwd_ms": statistics.median(both) - statistics.median(fwd),
        "runs": runs,
        "check_pixels": m,
        "check_mismatches": mismatches,
        "coverage": covered,
        "overflowed_bins": fr.overflowed_bins(),
        "workspace_bytes": ws_bytes,
        "output_bytes": out_bytes,
        "kernel_ms": profile,
        "small_face_lanes": (
            small_face_lanes(len(f), scene.copies * h * w, ws.tuning.small_face_lanes)
            if scene.k == 1
            else None
        ),
    }


def memory_probe(scene: Scene, device, tuning: Tuning | None = None) -> dict:
    """Device memory of one scene's calls, measured by the CUDA memory pool in a
    process of its own (its high-water mark cannot be reset, so a process that
    ran other scenes first would hide a smaller peak).

    ``persistent``: inputs, workspace, outputs and their gradient buffers (all
    allocated before the first call); ``fwd_peak`` / ``fwd_bwd_peak``: the
    pool's high-water mark over eager forward calls (launched, captured,
    replayed) and then forward + backward calls, both counted from the same
    start, so ``fwd_peak - persistent`` is what the calls allocate on top."""
    wp.synchronize_device(device)
    c0 = wp.get_mempool_used_mem_current(device)
    v, f, first, count = make_scene(scene)
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    meshes = pack_meshes(verts, wp.array(f, dtype=wp.int32, device=device), first, count)
    settings = scene_settings(scene)
    ws = RasterWorkspace(num_meshes=scene.copies, num_faces=len(f), settings=settings,
                         device=device, requires_grad=True, tuning=tuning)  # fmt: skip
    wp.synchronize_device(device)
    c1 = wp.get_mempool_used_mem_current(device)
    for _ in range(3):
        rasterize_packed(meshes, ws, settings)
    wp.synchronize_device(device)
    h1 = wp.get_mempool_used_mem_high(device)
    for _ in range(3):
        tape = wp.Tape()
        with tape:
            out = rasterize_packed(meshes, ws, settings)
        out.zbuf.grad.fill_(1.0)
        verts.grad.zero_()
        tape.backward()
    wp.synchronize_device(device)
    h2 = wp.get_mempool_used_mem_high(device)
    return {"persistent": c1 - c0, "fwd_peak": h1 - c0, "fwd_bwd_peak": h2 - c0}


def _probe_memory(scene: Scene, device, argv_flags: list[str]) -> dict | None:
    """memory_probe in a child process (None where the pool cannot tell)."""
    if not (device.is_cuda and wp.is_mempool_enabled(device)):
        return None
    cmd = [sys.executable, "-m", "warpraster.bench", "--device", str(device),
           "--memory-probe", scene.name, *argv_flags]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        print(f"memory probe of {scene.name} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


_TUNING_FLAGS = ("--no-call-graphs", "--generic-kernels", "--narrow-outputs")

#: The on/off options of the command line: (flag, help).
_SWITCHES = (
    ("--profile", "per-kernel times (CUDA)"),
    ("--no-memory", "skip the per-scene memory probe (CUDA: one child process per scene)"),
    ("--generic-kernels",
     "CUDA: queue kernels read the flags at run time (no compiled-in variants)"),
    ("--narrow-outputs", "outputs written one slot per store (not four per 16-byte store)"),
    ("--no-call-graphs",
     "eager calls issue their launches from Python every time (Tuning.call_graphs)"),
    ("--renderer", "run the renderer scenes instead (python -m warpraster.bench_render)"),
    ("--sensor", "run the simulation sensor scene instead: 64 worlds x 2 cameras, 128², colour + "
     "depth (python -m warpraster.sim.bench; add --newton there to time Newton's sensor)"),
)  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m warpraster.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per scene (median)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument(
        "--scenes",
        default=None,
        metavar="A,B",
        help="comma-separated scene names (default: every scene of the device's list). "
        f"GPU: {', '.join(s.name for s in GPU_SCENES)}. "
        f"CPU: {', '.join(s.name for s in CPU_SCENES)}. "
        f"--renderer: {', '.join(bench_render.TARGETS)}",
    )
    ap.add_argument("--bin-size", type=int, default=None, help="override the bin size")
    for flag, text in _SWITCHES:
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--max-regs",
        default=None,
        help="CUDA register caps, e.g. queue8=56,outputs=40 (Tuning.max_registers)",
    )
    ap.add_argument(
        "--small-lanes",
        type=int,
        default=None,
        help="threads per face in the K=1 small-face pass (default: automatic)",
    )
    args = ap.parse_args(argv)
    if args.scenes is not None:
        known = (
            list(bench_render.TARGETS)
            if args.renderer
            else [s.name for s in GPU_SCENES + CPU_SCENES]
        )
        wanted = [n for n in args.scenes.split(",") if n]
        unknown = [n for n in wanted if n not in known]
        if unknown or not wanted:
            ap.error(
                f"--scenes: no scene named {', '.join(unknown) or repr(args.scenes)} "
                f"(scenes{' with --renderer' if args.renderer else ''}: {', '.join(known)})"
            )
    passed = ["--runs", str(args.runs)] + (["--device", args.device] if args.device else [])
    if args.renderer:
        return bench_render.main(passed + (["--scenes", args.scenes] if args.scenes else []))
    if args.sensor:
        return sim_bench.main(passed + (["--json", args.json] if args.json else []))
    wp.config.quiet = True
    wp.config.log_level = getattr(wp, "LOG_WARNING", 30)  # no per-module load lines
    wp.init()
    device = wp.get_device(args.device)
    regs = {}
    for item in filter(None, (args.max_regs or "").split(",")):
        name, cap = item.split("=")
        regs[name] = int(cap) or None  # 0: the compiler's choice
    tuning = Tuning(
        small_face_lanes=args.small_lanes,
        specialize=False if args.generic_kernels else None,
        max_registers=tuple(regs.items()),
        call_graphs=False if args.no_call_graphs else None,
        wide_outputs=not args.narrow_outputs,
    )
    if args.memory_probe is not None:
        scene = next(s for s in GPU_SCENES + CPU_SCENES if s.name == args.memory_probe)
        print(json.dumps(memory_probe(scene, device, tuning)))
        return 0
    # the child processes of the memory probe run with the same tuning
    passed_on = [a for a in (argv if argv is not None else sys.argv[1:])
                 if a.split("=")[0] in _TUNING_FLAGS]  # fmt: skip
    scenes = GPU_SCENES if device.is_cuda else CPU_SCENES
    if args.scenes:
        wanted = set(args.scenes.split(","))
        scenes = [s for s in GPU_SCENES + CPU_SCENES if s.name in wanted]
    rows = []
    head = (
        f"{'scene':<26}{'faces':>9}{'bin':>5}{'fwd ms':>10}{'fwd+bwd':>10}{'bwd':>9}"
        f"{'target':>8}{'check':>7}{'ws MB':>8}{'out MB':>8}{'graph fwd':>10}{'g f+b':>8}"
        f"{'peak MB':>9}{'+call':>7}"
    )
    print(f"warpraster bench on {device} ({getattr(device, 'name', '')})")
    print(head)
    for sc in scenes:
        r = run_scene(sc, device, args.runs, bin_size=args.bin_size, profile_kernels=args.profile,
                      tuning=tuning)  # fmt: skip
        r["memory_bytes"] = None if args.no_memory else _probe_memory(sc, device, passed_on)
        rows.append(r)
        mem = r["memory_bytes"]
        tgt = f"{sc.target_ms:.2f}" if sc.target_ms else "-"
        ok = "ok" if r["check_mismatches"] == 0 else f"{r['check_mismatches']}!"
        print(
            f"{sc.name:<26}{r['faces']:>9}{r['bin']:>5}{r['fwd_ms']:>10.3f}"
            f"{r['fwd_bwd_ms']:>10.3f}{r['bwd_ms']:>9.3f}{tgt:>8}{ok:>7}"
            f"{r['workspace_bytes'] / 2**20:>8.1f}{r['output_bytes'] / 2**20:>8.1f}"
            + (
                f"{r['graph_fwd_ms']:>10.3f}{r['graph_fwd_bwd_ms']:>8.3f}"
                if r["graph_fwd_ms"] is not None
                else ""
            )
            + (
                f"{mem['fwd_bwd_peak'] / 2**20:>9.1f}"
                f"{(mem['fwd_bwd_peak'] - mem['persistent']) / 2**20:>7.1f}"
                if mem
                else ""
            ),
            flush=True,
        )
        if r["kernel_ms"]:
            for name, ms in sorted(r["kernel_ms"].items(), key=lambda kv: -kv[1]):
                print(f"    {ms:8.3f} ms  {name}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
        print(f"results written to {os.path.abspath(args.json)}")
    bad = [r["name"] for r in rows if r["check_mismatches"]]
    if bad:
        print(f"SELF-CHECK FAILED (binned != naive) for: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
