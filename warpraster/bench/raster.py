"""The raster suite: icosphere scenes, ``rasterize_packed`` forward and forward +
backward, on one Warp device.

Scenes (:mod:`.scenes`): unit icospheres of radius 0.8 in NDC centred near
z = 2, N copies jittered by up to 0.15, blur 0 unless stated. Times are medians
of ``--runs`` timed calls after warm-up (CUDA events on a GPU, wall clock on the
CPU): eager (a Python call, which replays the workspace's call graph from its
third call on) and graph (the same captured with ``wp.ScopedCapture`` and
replayed). Every scene checks its own answer first: the timed (binned) output
must equal the naive pass on a random subsample of pixels, so a fast wrong
kernel cannot win. Memory: the workspace's buffers (forward and backward) and
the output arrays; on CUDA also the memory pool's high-water mark over eager
calls ("peak MB", forward + backward, counted from before the scene's inputs
were made) and what the calls allocate on top of the persistent buffers
("+call"), each scene measured in a child process of its own (Warp 1.19 cannot
reset the high-water mark; ``--no-memory`` skips this).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import warp as wp

from ..fragments import FragmentRows, fragment_rows, slot_fragment
from ..geometry import pixel_centre
from ..meshes import MeshArrays, mesh_arrays, pack_meshes
from ..raster import RasterWorkspace, rasterize_naive_at, rasterize_packed
from ..raster.small_faces import small_face_lanes
from ..settings import RasterSettings, Tuning
from ..timing import timer
from .cli import TUNING_FLAGS
from .scenes import CPU_SCENES, GPU_SCENES, Scene, make_scene

__all__ = ["memory_probe", "run", "run_scene", "scene_settings"]


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


def scene_settings(scene: Scene, bin_size=None, deterministic: bool = False) -> RasterSettings:
    """The render settings of a benchmark scene."""
    return RasterSettings(image_size=(scene.height, scene.width), faces_per_pixel=scene.k,
                          blur_radius=scene.blur, bin_size=bin_size,
                          deterministic=deterministic)  # fmt: skip


def run_scene(
    scene: Scene,
    device,
    runs: int,
    bin_size=None,
    check_pixels: int = 2048,
    profile_kernels=False,
    tuning: Tuning | None = None,
    deterministic: bool = False,
) -> dict:
    v, f, first, count = make_scene(scene)
    verts = wp.array(v, dtype=wp.vec3, device=device, requires_grad=True)
    meshes = pack_meshes(verts, wp.array(f, dtype=wp.int32, device=device), first, count)
    h, w = scene.height, scene.width
    bs = bin_size
    settings = scene_settings(scene, bs, deterministic)
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
        "deterministic": deterministic,
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


def memory_probe(
    scene: Scene, device, tuning: Tuning | None = None, deterministic: bool = False
) -> dict:
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
    settings = scene_settings(scene, deterministic=deterministic)
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


def run(args, argv: list[str]) -> int:
    """The suite for the parsed options ``args`` (``argv``: the command line, whose
    tuning flags the memory probe's child processes get again)."""
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
    det = args.deterministic
    if args.memory_probe is not None:
        scene = next(s for s in GPU_SCENES + CPU_SCENES if s.name == args.memory_probe)
        print(json.dumps(memory_probe(scene, device, tuning, det)))
        return 0
    # the child processes of the memory probe run with the same tuning
    passed_on = [a for a in argv if a.split("=")[0] in TUNING_FLAGS]
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
    print(f"warpraster bench --suite raster on {device} ({getattr(device, 'name', '')})")
    print(head)
    for sc in scenes:
        r = run_scene(sc, device, args.runs, bin_size=args.bin_size, profile_kernels=args.profile,
                      tuning=tuning, deterministic=det)  # fmt: skip
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
