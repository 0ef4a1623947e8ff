"""Multi-GPU checks of warpraster (issue 17), for a machine with two or more GPUs.

Run from the repository root (Warp, torch and warpraster importable, e.g. after
``pip install -e .``); the one maintained script here: the test suite runs on one
device, and these are the multi-GPU checks behind the README's two-GPU figures::

    python scripts/gpu_multi.py            # about 1-2 minutes
    python scripts/gpu_multi.py --frames 2048 --size 512   # a longer throughput run

It prints one line per check, ``PASS``/``FAIL`` with its numbers, then a summary;
the exit status is 0 when every check passes (2: fewer than two GPUs). Checks:

1. ``same-output``: one scene rendered on ``cuda:0`` and ``cuda:1`` (Warp core, two
   settings, and the torch op with its gradient): bit-equal ``pix_to_face``, float
   outputs within :data:`FLOAT_ATOL`, gradients within :data:`GRAD_RTOL`.
2. ``threads``: two Python threads render at the same time, one per GPU, each into
   its own workspace (and through the torch op's default context); every result
   equals the one its device gave alone.
3. ``ddp-nccl``: 2 processes (torch.multiprocessing, NCCL, ``NCCL_NVLS_ENABLE=0``)
   train ``examples/ddp_train.py``'s model for one step, each rendering its share of
   the views; the all-reduced gradient equals one process rendering all views.
4. ``throughput``: N frames rendered by 1 process on 1 GPU, then sharded over 2
   processes (one per GPU) with :func:`warpraster.distributed.shard_frames`: frames
   per second of each, and every frame rendered exactly once with the same coverage.

Warp's ``cpu`` device is never used (the GPU machine's Warp has no CPU compiler).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "examples"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (inherited by ranks)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import warp as wp  # noqa: E402

wp.config.quiet = True
wp.config.log_level = wp.LOG_WARNING

import warpraster as wr  # noqa: E402
from warpraster.distributed import init_process_group, shard_frames  # noqa: E402
from warpraster.primitives import ico_sphere  # noqa: E402

FLOAT_ATOL = 1e-6
"""Float outputs, cuda:0 vs cuda:1: the same kernels compiled for the same GPU
architecture and a forward pass without float atomics, so they should agree to
the bit; 1e-6 (a few float32 ulps at the depths ~2.5 used here) only absorbs a
compiler choosing another instruction order per device, and is far below any
real difference (a face's depth or barycentric off by a pixel's share, >1e-3)."""

GRAD_RTOL = 1e-4
"""Gradients (vs the largest entry): float32 sums over pixels accumulated with
atomics in an arbitrary order on each GPU (and, for DDP, per rank then over the
ranks): reassociating a few hundred terms moves a sum by ~n * 6e-8 of their
magnitudes; a lost or doubled view moves it by ~1/B of its size."""

RESULTS: list[tuple[str, bool, str]] = []


def report(name: str, ok: bool, text: str) -> None:
    RESULTS.append((name, ok, text))
    print(f"[{name}] {'PASS' if ok else 'FAIL'} {text}", flush=True)


def section(name: str):
    """Runs a check; an exception is a FAIL with its message (the others still run)."""

    def wrap(fn):
        def run(*args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as e:
                report(name, False, f"raised {type(e).__name__}: {e}")
                traceback.print_exc(limit=6)

        return run

    return wrap


# ----------------------------------------------------------------------------- scenes
@wp.kernel
def _pose_frames(
    # Inputs:
    base: wp.array(dtype=wp.vec3),
    frame_ids: wp.array(dtype=wp.int32),
    num_frames: int,
    # Outputs:
    verts_out: wp.array(dtype=wp.vec3),
):
    """Image b shows ``base`` turned about y by frame_ids[b] / num_frames of a turn, at z ~ 2.5."""
    b, i = wp.tid()
    a = 6.2831853 * float(frame_ids[b]) / float(num_frames)
    c = wp.cos(a)
    s = wp.sin(a)
    p = base[i]
    verts_out[b * base.shape[0] + i] = wp.vec3(
        0.8 * (c * p[0] + s * p[2]), 0.8 * p[1] + 0.1 * s, 0.8 * (c * p[2] - s * p[0]) + 2.5
    )


@wp.kernel
def _coverage(
    # Inputs:
    pix_to_face: wp.array4d(dtype=wp.int32),
    slot_frame: wp.array(dtype=wp.int32),
    # Outputs:
    counts_out: wp.array(dtype=wp.int32),
):
    """counts_out[frame of image n] += covered pixels of image n."""
    n, y, x = wp.tid()
    if pix_to_face[n, y, x, 0] >= 0:
        wp.atomic_add(counts_out, slot_frame[n], 1)


class FrameBatch:
    """B frames of a turning icosphere per call, rendered into one workspace on ``device``."""

    def __init__(self, device: str, *, level: int, batch: int, size: int, k: int,
                 num_frames: int, blur: float = 0.0, bin_size=None):  # fmt: skip
        v, f = ico_sphere(level)
        self.device, self.batch, self.num_frames = device, batch, num_frames
        self.nv, self.nf = len(v), len(f)
        self.base = wp.array(v, dtype=wp.vec3, device=device)
        faces = (f[None] + self.nv * np.arange(batch)[:, None, None]).reshape(-1, 3)
        self.faces = wp.array(faces.astype(np.int32), dtype=wp.int32, device=device)
        self.first = wp.array(np.arange(batch, dtype=np.int32) * self.nf, device=device)
        self.count = wp.full(batch, self.nf, dtype=wp.int32, device=device)
        self.verts = wp.empty(batch * self.nv, dtype=wp.vec3, device=device)
        self.counts = wp.zeros(num_frames + 1, dtype=wp.int32, device=device)
        self.settings = wr.RasterSettings(image_size=size, faces_per_pixel=k, blur_radius=blur,
                                          bin_size=bin_size)  # fmt: skip
        self.ws = wr.RasterWorkspace(num_meshes=batch, num_faces=batch * self.nf,
                                     settings=self.settings, device=device)  # fmt: skip

    def plan(self, frames) -> int:
        """Uploads the frame ids of ``frames`` in calls of B (the last padded with its last
        frame; padded images count nowhere), once; returns the number of calls."""
        frames = list(frames)
        calls = max(1, -(-len(frames) // self.batch))
        pad = calls * self.batch - len(frames)
        ids = np.array(frames + [frames[-1]] * pad, dtype=np.int32).reshape(calls, self.batch)
        slots = np.array(frames + [self.num_frames] * pad, dtype=np.int32)
        self.ids = wp.array(ids, dtype=wp.int32, device=self.device)
        self.slots = wp.array(slots.reshape(calls, self.batch), dtype=wp.int32, device=self.device)
        return calls

    def render_call(self, i: int, *, validate: bool = False):
        """Call ``i`` of the plan: pose, rasterize (no allocation, no host read unless
        ``validate``), count covered pixels per frame."""
        wp.launch(_pose_frames, dim=(self.batch, self.nv),
                  inputs=[self.base, self.ids[i], self.num_frames], outputs=[self.verts],
                  device=self.device)  # fmt: skip
        frags = wr.rasterize_meshes(self.verts, self.faces, self.first, self.count,
                                    settings=self.settings, workspace=self.ws,
                                    validate=validate)  # fmt: skip
        wp.launch(_coverage, dim=frags.pix_to_face.shape[:3], inputs=[frags.pix_to_face,
                  self.slots[i]], outputs=[self.counts], device=self.device)  # fmt: skip
        return frags

    def render(self, frames, *, validate: bool = False):
        """Renders up to B frames (one call)."""
        self.plan(frames)
        return self.render_call(0, validate=validate)


def _host(frags) -> dict[str, np.ndarray]:
    return {k: getattr(frags, k).numpy().copy()
            for k in ("pix_to_face", "zbuf", "bary_coords", "dists")}  # fmt: skip


def _compare(a: dict, b: dict) -> tuple[bool, str]:
    same_faces = np.array_equal(a["pix_to_face"], b["pix_to_face"])
    diffs = {k: float(np.abs(a[k] - b[k]).max()) for k in ("zbuf", "bary_coords", "dists")}
    ok = same_faces and all(d <= FLOAT_ATOL for d in diffs.values())
    covered = int((a["pix_to_face"][..., 0] >= 0).sum())
    text = (f"pix_to_face bit-equal={'yes' if same_faces else 'NO'} ({covered} covered px); "
            + ", ".join(f"max|d{k}|={d:.1e}" for k, d in diffs.items())
            + f" (tol {FLOAT_ATOL:g})")  # fmt: skip
    return ok, text


# ----------------------------------------------------------------------------- 1. same output
@section("same-output")
def check_same_output(devs: list[str]) -> None:
    configs = [
        dict(level=4, batch=2, size=128, k=4, blur=1e-5, bin_size=None),  # binned, K = 4
        dict(level=3, batch=2, size=96, k=1, blur=0.0, bin_size=0),  # naive, K = 1
    ]
    for cfg in configs:
        outs = []
        for d in devs:
            fb = FrameBatch(d, num_frames=8, **cfg)
            outs.append(_host(fb.render([1, 6], validate=True)))
        ok, text = _compare(*outs)
        label = f"core {'binned' if cfg['bin_size'] is None else 'naive'} K={cfg['k']}"
        report("same-output", ok, f"{label} {cfg['size']}px x2 images: {text}")
    # the torch op, forward and gradient, on each device
    import ddp_train

    grads, losses = [], []
    for d in devs:
        scene = ddp_train.Scene(4, 64, d)
        g, loss = ddp_train.single_process_grad(scene)
        grads.append(g.cpu())
        losses.append(loss)
    err = float((grads[0] - grads[1]).abs().max())
    scale = float(grads[0].abs().max())
    ok = scale > 0 and err <= GRAD_RTOL * scale
    report(
        "same-output",
        ok,
        f"torch op + autograd, 4 views 64px: loss {losses[0]:.7f} vs "
        f"{losses[1]:.7f}, max|dgrad|={err:.1e} (max|g|={scale:.2e}, tol {GRAD_RTOL:g} rel)",
    )


# ----------------------------------------------------------------------------- 2. threads
@section("threads")
def check_threads(devs: list[str], repeats: int = 40) -> None:
    cfg = dict(level=4, batch=4, size=128, k=4, blur=1e-5, num_frames=16)
    keys = [f"{d}#{i}" for i, d in enumerate(devs)]
    frames = {keys[0]: [0, 1, 2, 3], keys[1]: [8, 9, 10, 11]}  # other scenes per device
    batches = {key: FrameBatch(key.split("#")[0], **cfg) for key in keys}
    alone = {key: _host(batches[key].render(frames[key], validate=True)) for key in keys}
    errors: list[str] = []
    start = threading.Barrier(len(devs))
    spans = {}

    def run(d):
        try:  # (no wp.ScopedDevice: Warp's default device is one per process, not per thread)
            start.wait(timeout=60)
            t0 = time.perf_counter()
            for i in range(repeats):
                got = _host(batches[d].render(frames[d]))
                ok, text = _compare(got, alone[d])
                if not ok:
                    errors.append(f"{d} repeat {i}: {text}")
                    return
            spans[d] = (t0, time.perf_counter())
        except Exception as e:
            errors.append(f"{d}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(key,)) for key in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    overlap = (min(s[1] for s in spans.values()) - max(s[0] for s in spans.values())
               if len(spans) == len(devs) else 0.0)  # fmt: skip
    report("threads", not errors, f"core, one workspace per GPU, {repeats} renders per thread "
           f"(overlapping {max(overlap, 0.0):.2f} s): " + ("; ".join(errors) or "every result "
           "equals its device's render alone"))  # fmt: skip

    # the torch op from two threads, one GPU each, the default context (keyed by device)
    import warpraster.torch as wrt

    v, f = ico_sphere(3)
    jobs = []
    for d, s in zip(devs, (1.0, 0.7), strict=True):
        verts = torch.tensor(v * s * 0.8, device=d)
        verts[:, 2] += 2.5
        args = (verts, torch.tensor(f, dtype=torch.int64, device=d), [0], [len(f)])
        want = [t.clone() for t in wrt.rasterize_meshes(*args, image_size=96, faces_per_pixel=4)]
        jobs.append((args, want))
    errors2: list[str] = []
    start2 = threading.Barrier(len(devs))
    # the op enters wp.ScopedDevice, whose default device is one per process: see whether
    # two threads leave it as they found it (informational: the op passes devices itself)
    wp.set_device(devs[1])

    def run_torch(i):
        args, want = jobs[i]
        try:
            start2.wait(timeout=60)
            for r in range(repeats):
                got = wrt.rasterize_meshes(*args, image_size=96, faces_per_pixel=4)
                if not all(torch.equal(g, w) for g, w in zip(got, want, strict=True)):
                    errors2.append(f"{args[0].device} repeat {r}: outputs differ")
                    return
        except Exception as e:
            errors2.append(f"{args[0].device}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run_torch, args=(i,)) for i in range(len(devs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    after = str(wp.get_device())
    wp.set_device(devs[0])
    report("threads", not errors2, f"torch op, default context, {repeats} calls per thread: "
           + ("; ".join(errors2) or "every result equals its device's call alone")
           + f" (Warp's default device before {devs[1]}, after {after})")  # fmt: skip


# ----------------------------------------------------------------------------- 3. DDP
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip


def _ddp_rank(rank: int, world: int, port: int, views: int, size: int, out_dir: str,
              devs: list[str]) -> None:  # fmt: skip
    import ddp_train
    import torch.distributed as dist

    _rank_env(rank, world, port)
    device = devs[rank]
    cuda = device.startswith("cuda")
    info = init_process_group("nccl" if cuda else "gloo", device=device)
    scene = ddp_train.Scene(views, size, device)
    model = ddp_train.MeshFit(scene, 0)
    ids = [torch.device(device).index] if cuda else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    mine = shard_frames(views, info.rank, info.world_size)
    loss = ddp_train.shard_loss(ddp, mine, views, info.world_size)
    loss.backward()
    total = loss.detach() / world
    dist.all_reduce(total)
    torch.save({"grad": model.offsets.grad.cpu(), "loss": float(total), "views": list(mine),
                "device": device}, os.path.join(out_dir, f"ddp{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


@section("ddp-nccl")
def check_ddp(devs: list[str], views: int = 6, size: int = 64) -> None:
    import ddp_train

    scene = ddp_train.Scene(views, size, devs[0])
    g_single, loss_single = ddp_train.single_process_grad(scene)
    g_single = g_single.cpu()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        torch.multiprocessing.spawn(_ddp_rank, args=(2, _free_port(), views, size, tmp, devs),
                                    nprocs=2, join=True)  # fmt: skip
        wall = time.perf_counter() - t0
        ranks = [torch.load(os.path.join(tmp, f"ddp{r}.pt")) for r in range(2)]
    scale = float(g_single.abs().max())
    errs = [float((r["grad"] - g_single).abs().max()) for r in ranks]
    seen = sorted(v for r in ranks for v in r["views"])
    ok = (scale > 0 and max(errs) <= GRAD_RTOL * scale and seen == list(range(views))
          and abs(ranks[0]["loss"] - loss_single) <= 1e-5 * abs(loss_single))  # fmt: skip
    backend = "nccl" if devs[0].startswith("cuda") else "gloo"
    report("ddp-nccl", ok, f"2 ranks, {backend} ({', '.join(r['device'] for r in ranks)}; views "
           f"{[r['views'] for r in ranks]}), {views} views {size}px: max|g_ddp - g_single| = "
           f"{max(errs):.1e} (max|g|={scale:.2e}, tol {GRAD_RTOL:g} rel); loss "
           f"{ranks[0]['loss']:.7f} vs {loss_single:.7f}; spawn+run {wall:.1f} s")  # fmt: skip


# ----------------------------------------------------------------------------- 4. throughput
def _throughput_rank(rank: int, world: int, cfg: dict, frames_total: int, repeats: int,
                     barrier, out_dir: str, devs: list[str]) -> None:  # fmt: skip
    device = devs[rank]
    wp.init()
    fb = FrameBatch(device, num_frames=frames_total, **cfg)
    mine = list(shard_frames(frames_total, rank, world))
    calls = fb.plan(mine)
    with wp.ScopedDevice(device):  # (one thread per process: the default device is ours)
        for i in range(min(calls, 2)):  # warm-up: load modules, capture the call graph
            fb.render_call(i, validate=True)
        wp.synchronize_device(device)
        times = []
        for _ in range(repeats):
            fb.counts.zero_()
            wp.synchronize_device(device)
            barrier.wait()
            t0 = time.time()
            for i in range(calls):
                fb.render_call(i)
            wp.synchronize_device(device)
            times.append((t0, time.time()))
    np.savez(os.path.join(out_dir, f"tp{rank}.npz"), times=np.array(times),
             counts=fb.counts.numpy(), frames=np.array(mine, dtype=np.int64))  # fmt: skip


def _throughput(world: int, cfg: dict, frames_total: int, repeats: int, devs: list[str]):
    ctx = torch.multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(world)
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_throughput_rank, nprocs=world, join=True,
                                    args=(world, cfg, frames_total, repeats, barrier, tmp,
                                          devs))  # fmt: skip
        ranks = [np.load(os.path.join(tmp, f"tp{r}.npz")) for r in range(world)]
        times = np.stack([r["times"] for r in ranks])  # (world, repeats, 2)
        walls = times[:, :, 1].max(axis=0) - times[:, :, 0].min(axis=0)
        counts = np.stack([r["counts"][:frames_total] for r in ranks]).sum(axis=0)
        frames = np.concatenate([r["frames"] for r in ranks])
    return float(np.median(walls)), counts, frames


@section("throughput")
def check_throughput(devs: list[str], frames_total: int, size: int, level: int, batch: int,
                     repeats: int) -> None:  # fmt: skip
    cfg = dict(level=level, batch=batch, size=size, k=1)
    one, counts1, frames1 = _throughput(1, cfg, frames_total, repeats, devs)
    two, counts2, frames2 = _throughput(2, cfg, frames_total, repeats, devs)
    once = np.array_equal(np.sort(frames2), np.arange(frames_total))
    same = np.array_equal(counts1, counts2) and bool((counts1 > 0).all())
    fps1, fps2 = frames_total / one, frames_total / two
    faces = 20 * 4**level
    report("throughput", once and same,
           f"{frames_total} frames of {faces} faces at {size}x{size}, K=1, {batch} per call "
           f"(median of {repeats}): 1 GPU {fps1:.0f} fps ({one * 1e3:.1f} ms), 2 GPUs "
           f"{fps2:.0f} fps ({two * 1e3:.1f} ms), speedup {fps2 / fps1:.2f}x; every frame "
           f"rendered exactly once={'yes' if once else 'NO'}, coverage per frame equal to the "
           f"1-GPU run={'yes' if same else 'NO'}")  # fmt: skip


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Multi-GPU checks of warpraster (issue 17)")
    p.add_argument("--frames", type=int, default=1024, help="frames of the throughput run")
    p.add_argument("--size", type=int, default=256, help="image size of the throughput run")
    p.add_argument("--level", type=int, default=5, help="icosphere level (5: 20480 faces)")
    p.add_argument("--batch", type=int, default=16, help="frames per render call")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    p.add_argument("--skip", default="", help="comma-separated checks to skip")
    p.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="run the same code on Warp's cpu device twice, gloo instead of NCCL "
        "(to develop this script without GPUs; proves nothing about GPUs)",
    )
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    wp.init()
    n = wp.get_cuda_device_count()
    names = [wp.get_device(f"cuda:{i}").name for i in range(n)]
    print(f"[env] warp {wp.__version__}, torch {torch.__version__} (cuda "
          f"{torch.version.cuda}), python {sys.version.split()[0]}, {n} GPUs: {names}, "
          f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}", flush=True)  # fmt: skip
    if args.smoke_cpu:
        devs = ["cpu", "cpu"]
        print("[env] --smoke-cpu: both 'devices' are Warp's cpu, DDP on gloo", flush=True)
    elif n < 2 or torch.cuda.device_count() < 2:
        print("[env] needs two GPUs visible to Warp and torch", flush=True)
        return 2
    else:
        devs = ["cuda:0", "cuda:1"]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if "same-output" not in skip:
        check_same_output(devs)
    if "threads" not in skip:
        check_threads(devs)
    if "ddp-nccl" not in skip:
        check_ddp(devs)
    if "throughput" not in skip:
        check_throughput(devs, args.frames, args.size, args.level, args.batch, args.repeats)
    passed = sum(ok for _, ok, _ in RESULTS)
    print(f"SUMMARY: {passed}/{len(RESULTS)} checks passed in "
          f"{time.perf_counter() - t_start:.0f} s", flush=True)  # fmt: skip
    return 0 if RESULTS and passed == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
