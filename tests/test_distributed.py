"""Beyond one device: rank/world from the environment, frame sharding, DDP gradients,
and device plumbing (devices side by side, threads and workspaces that share nothing).

The truths: set arithmetic for the sharding (every frame exactly once), one process
rendering the whole batch for DDP, PyTorch3D's outputs (tests/data/pytorch3d) for
every render made next to another one.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES
from p3d_cases import load_case, raster_args
from p3d_compare import compare_with_case

import warpraster as wr
from warpraster.distributed import (
    RankInfo,
    ShardMode,
    device_for_rank,
    rank_info,
    shard_frames,
)

ROOT = Path(__file__).resolve().parents[1]
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


# ----------------------------------------------------------------------------- sharding
_PAIRS = [(n, w) for n in (0, 1, 2, 3, 5, 7, 16, 97, 1000) for w in (1, 2, 3, 4, 8, 13, 64)]


@pytest.mark.parametrize("mode", list(ShardMode))
def test_every_frame_exactly_once(mode):
    """For every (frames, world) pair, world > frames included, the ranks' parts are
    disjoint, cover the range, and come out the same on a second call."""
    for n, world in _PAIRS:
        frames = range(10, 10 + 3 * n, 3)  # a range with an offset and a step
        parts = [shard_frames(frames, r, world, mode=mode) for r in range(world)]
        seen = [f for p in parts for f in p]
        assert sorted(seen) == list(frames), (n, world, mode)
        assert len(seen) == len(set(seen)) == n, (n, world, mode)
        assert parts == [shard_frames(frames, r, world, mode=mode) for r in range(world)]
        sizes = [len(p) for p in parts]
        # balanced: sizes differ by at most one, the larger parts first
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
        if world > n:
            assert sizes.count(0) == world - n


def test_blocks_are_contiguous_and_round_robin_strides():
    """BLOCKS gives rank r a contiguous run in rank order; ROUND_ROBIN every world-th frame."""
    assert [list(shard_frames(10, r, 3)) for r in range(3)] == [
        [0, 1, 2, 3], [4, 5, 6], [7, 8, 9],
    ]  # fmt: skip
    assert [list(shard_frames(10, r, 3, mode="round_robin")) for r in range(3)] == [
        [0, 3, 6, 9], [1, 4, 7], [2, 5, 8],
    ]  # fmt: skip
    for n, world in _PAIRS:
        parts = [list(shard_frames(n, r, world)) for r in range(world)]
        assert sum(parts, []) == list(range(n))  # concatenated in rank order: the range itself


def test_shard_kinds_follow_the_input():
    """A count or a range gives a lazy range; a sequence gives a list of its items."""
    big = shard_frames(10**12, 3, 8)
    assert isinstance(big, range) and len(big) == 10**12 // 8 and big[0] == 3 * 10**12 // 8
    stamps = [f"t{i:03d}" for i in range(7)]
    parts = [shard_frames(stamps, r, 3) for r in range(3)]
    assert all(isinstance(p, list) for p in parts)
    assert sum(parts, []) == stamps
    assert shard_frames((5.0, 6.0, 7.5), 1, 2, mode=ShardMode.ROUND_ROBIN) == [6.0]


def test_shard_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert shard_frames(8) == range(4, 6)
    for name in _TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    assert shard_frames(8) == range(8)  # a plain process is rank 0 of 1


@pytest.mark.parametrize(
    "call, err, words",
    [
        (lambda: shard_frames(5, 2, 2), ValueError, "rank"),
        (lambda: shard_frames(5, -1, 2), ValueError, "rank"),
        (lambda: shard_frames(5, 0, 0), ValueError, "world_size"),
        (lambda: shard_frames(-1, 0, 1), ValueError, "frames"),
        (lambda: shard_frames(5, 0, None), ValueError, "both"),
        (lambda: shard_frames(True, 0, 1), TypeError, "frames"),
        (lambda: shard_frames("abc", 0, 1), TypeError, "frames"),
        (lambda: shard_frames({1, 2}, 0, 1), TypeError, "frames"),
        (lambda: shard_frames(5, 0.0, 1), TypeError, "rank"),
        (lambda: shard_frames(5, 0, 1, mode="zigzag"), ValueError, "mode"),
        (lambda: shard_frames(5, 0, 1, mode=1), TypeError, "mode"),
    ],
)
def test_shard_bad_input(call, err, words):
    with pytest.raises(err, match=words):
        call()


# ----------------------------------------------------------------------------- ranks
def test_rank_info_reads_torchrun_variables():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    info = rank_info(env)
    assert info == RankInfo(rank=5, world_size=8, local_rank=1, local_world_size=4)
    assert info.is_distributed and not info.is_main
    assert rank_info({}) == RankInfo(0, 1, 0, 1)
    assert not rank_info({}).is_distributed and rank_info({}).is_main
    # one machine: LOCAL_* default to the global values
    assert rank_info({"RANK": "1", "WORLD_SIZE": "2"}) == RankInfo(1, 2, 1, 2)


@pytest.mark.parametrize(
    "env, words",
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "world_size"),
        (
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "local_rank",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "local_world_size"),
    ],
)
def test_rank_info_rejects_inconsistent_environments(env, words):
    with pytest.raises(ValueError, match=words):
        rank_info(env)


def test_device_for_rank():
    assert device_for_rank(0, cuda_count=0) == "cpu"
    assert device_for_rank(3, cuda_count=0) == "cpu"
    assert [device_for_rank(r, cuda_count=4) for r in range(4)] == [f"cuda:{r}" for r in range(4)]
    # one visible GPU per process (CUDA_VISIBLE_DEVICES set by a scheduler)
    assert device_for_rank(3, cuda_count=1) == "cuda:0"
    assert device_for_rank(1, device="cpu", cuda_count=8) == "cpu"
    with pytest.raises(ValueError, match="local_rank 2 has no GPU"):
        device_for_rank(2, cuda_count=2)
    with pytest.raises(ValueError, match="local_rank"):
        device_for_rank(-1, cuda_count=2)
    # Warp's own count on this machine
    want = "cuda:0" if wp.get_cuda_device_count() > 0 else "cpu"
    assert device_for_rank(0) == want


def test_nothing_imported_unless_asked():
    """``import warpraster`` does not import the distributed module, and importing that
    module imports neither torch nor torch.distributed (a fresh interpreter)."""
    code = (
        "import sys, warpraster; assert 'warpraster.distributed' not in sys.modules; "
        "import warpraster.distributed as d; assert 'torch' not in sys.modules, 'torch'; "
        "d.shard_frames(10, 1, 3); d.rank_info(); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_init_process_group_is_a_no_op_for_one_plain_process(monkeypatch):
    """Without torchrun's variables nor a rendezvous address, nothing is initialised."""
    dist = pytest.importorskip("torch.distributed")
    from warpraster.distributed import init_process_group

    for name in (*_TORCHRUN_ENV, "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    assert init_process_group() == RankInfo(0, 1, 0, 1)
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- DDP
def _load_example():
    spec = importlib.util.spec_from_file_location("ddp_train", ROOT / "examples" / "ddp_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif("cpu" not in DEVICES, reason="renders on Warp's cpu device")
def test_ddp_example_shard_losses_add_up_to_the_mean():
    """In one process: the example's per-rank losses (world_size / B * sum over the
    shard) average, over the ranks, to the mean loss and its gradient; a rank without
    views contributes a zero that still reaches the parameters."""
    torch = pytest.importorskip("torch")
    ex = _load_example()
    scene = ex.Scene(3, 24, "cpu")
    g_single, loss_single = ex.single_process_grad(scene, seed=0)
    world = 4  # more ranks than views: rank 3 gets none
    total, grad = 0.0, torch.zeros_like(g_single)
    for rank in range(world):
        m = ex.MeshFit(scene, 0)
        loss = ex.shard_loss(m, shard_frames(3, rank, world), 3, world)
        loss.backward()
        assert m.offsets.grad is not None
        total += float(loss.detach()) / world
        grad += m.offsets.grad / world
    assert abs(total - loss_single) <= ex.LOSS_RTOL * abs(loss_single)
    np.testing.assert_allclose(
        grad, g_single, rtol=0, atol=ex.GRAD_RTOL * float(g_single.abs().max())
    )


@pytest.mark.skipif("cpu" not in DEVICES, reason="gloo ranks render on Warp's cpu device")
def test_ddp_gradients_equal_one_process(tmp_path):
    """2 CPU ranks under torchrun (gloo), 3 views split 2 + 1: the all-reduced gradient of
    the first step equals the gradient of one process rendering all 3 views."""
    torch = pytest.importorskip("torch")
    ex = _load_example()
    views, size = 3, 32
    # the truth, in this process (also compiles the kernels before the ranks start)
    scene = ex.Scene(views, size, "cpu")
    g_single, loss_single = ex.single_process_grad(scene, seed=0)
    assert float(g_single.abs().max()) > 0
    out = tmp_path / "ddp.npz"
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "examples" / "ddp_train.py"), "--device", "cpu", "--check", "--views",
        str(views), "--image-size", str(size), "--steps", "1", "--save", str(out), "--quiet",
    ]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "-> OK" in run.stdout
    saved = np.load(out)
    assert int(saved["world_size"]) == 2
    # the ranks' views, gathered in rank order: each view rendered by exactly one rank
    assert saved["views"].tolist() == [0, 1, 2]
    g_ddp = saved["grad"]
    tol = ex.GRAD_RTOL * float(g_single.abs().max())  # reason: see GRAD_RTOL in the example
    np.testing.assert_allclose(g_ddp, g_single.numpy(), rtol=0, atol=tol)
    assert abs(float(saved["loss"]) - loss_single) <= ex.LOSS_RTOL * abs(loss_single)
    # a lost view would show: the gradient of 2 of the 3 views differs by far more
    partial = torch.zeros_like(g_single)
    for v in (0, 1):
        m = ex.MeshFit(scene, 0)
        (m(range(v, v + 1)).sum() / views).backward()
        partial += m.offsets.grad
    assert float((partial - g_single).abs().max()) > 100 * tol


# ----------------------------------------------------------------------------- devices
def _warp_inputs(case: dict, device, scale: float = 1.0):
    args = raster_args(case)
    v = np.asarray(args.pop("verts"), np.float32) * scale
    verts = wp.array(v, dtype=wp.vec3, device=device)
    packed = [
        wp.array(np.asarray(args.pop(k), np.int32), dtype=wp.int32, device=device)
        for k in ("faces", "mesh_to_face_first_idx", "num_faces_per_mesh")
    ]
    args.update(bin_size=case["bin_size"])
    return (verts, *packed), args


def _numpy(frags) -> dict[str, np.ndarray]:
    return {k: getattr(frags, k).numpy().copy()
            for k in ("pix_to_face", "zbuf", "bary_coords", "dists")}  # fmt: skip


def _workspace(case: dict, device, **kw) -> wr.RasterWorkspace:
    return wr.RasterWorkspace(
        num_meshes=len(case["mesh_to_face_first_idx"]), num_faces=len(case["faces_packed"]),
        image_size=case["image_size"], faces_per_pixel=case["faces_per_pixel"],
        bin_size=case["bin_size"], device=device, **kw,
    )  # fmt: skip


def _device_pair() -> list[str]:
    """Two Warp devices of this process: the test devices (tests/conftest.py) and any
    further GPU, e.g. cpu + cuda:0, or cuda:0 + cuda:1 on a GPU machine."""
    devs = list(DEVICES)
    for i in range(wp.get_cuda_device_count()):
        if f"cuda:{i}" not in devs:
            devs.append(f"cuda:{i}")
    return devs[:2]


_TWO_DEVICES = pytest.mark.skipif(
    len(_device_pair()) < 2, reason="needs two Warp devices (cpu and cuda:0, or two GPUs)"
)

# bit-equal pix_to_face; float outputs within: CPU and CUDA kernels are compiled
# separately (fuse_fp off on both), so they may still differ by a few float32 ulps
# (libm vs CUDA intrinsics); 1e-5 absolute on values of magnitude <= ~10 is ~8 ulps.
_CROSS_DEVICE_ATOL = 1e-5


@_TWO_DEVICES
def test_same_scene_on_two_devices_in_one_process():
    """One case rendered on two devices, one after the other then from two threads at
    once: each equals PyTorch3D, and the two agree (same faces, values within a few ulps)."""
    case = load_case("p03_ico1_blur1e-4_k8_clipbary")
    devs = _device_pair()
    outs = {}
    for d in devs:
        inputs, kw = _warp_inputs(case, d)
        ws = _workspace(case, d)
        outs[d] = _numpy(wr.rasterize_meshes(*inputs, workspace=ws, **kw))
        compare_with_case(outs[d], case)
    a, b = (outs[d] for d in devs)
    np.testing.assert_array_equal(a["pix_to_face"], b["pix_to_face"])
    for k in ("zbuf", "bary_coords", "dists"):
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=_CROSS_DEVICE_ATOL, err_msg=k)
    _render_in_threads({d: (case, 1.0, outs[d]) for d in devs}, repeats=20)


def _render_in_threads(jobs: dict, repeats: int) -> None:
    """Each job ``device -> (case, scale, expected numpy outputs)`` renders ``repeats``
    times into its own workspace on its own thread, all threads at once; every result
    must equal the expected outputs (floats to _CROSS_DEVICE_ATOL)."""
    start = threading.Barrier(len(jobs))
    errors: list[str] = []

    def run(key, case, scale, want):
        try:
            device = key.split("#")[0]
            inputs, kw = _warp_inputs(case, device, scale)
            ws = _workspace(case, device)
            wr.rasterize_meshes(*inputs, workspace=ws, **kw)  # load modules first
            start.wait(timeout=120)
            for i in range(repeats):
                got = _numpy(wr.rasterize_meshes(*inputs, workspace=ws, validate=False, **kw))
                if not np.array_equal(got["pix_to_face"], want["pix_to_face"]):
                    errors.append(f"{key}: pix_to_face differs at repeat {i}")
                    return
                for k in ("zbuf", "bary_coords", "dists"):
                    if not np.allclose(got[k], want[k], rtol=0, atol=_CROSS_DEVICE_ATOL):
                        errors.append(f"{key}: {k} differs at repeat {i}")
                        return
        except Exception as e:  # reported in the main thread
            errors.append(f"{key}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(key, *job)) for key, job in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


@pytest.mark.skipif("cpu" not in DEVICES, reason="threads on Warp's cpu device")
def test_workspaces_on_cpu_share_no_buffers():
    """Two workspaces of the same configuration: a call on one leaves the other's
    outputs as they were, and none of their buffers overlap."""
    case = load_case("p02_ico0_k3")
    ia, kw = _warp_inputs(case, "cpu")
    ib, _ = _warp_inputs(case, "cpu", scale=0.6)  # another scene, same sizes
    wa, wb = _workspace(case, "cpu"), _workspace(case, "cpu")
    first = _numpy(wr.rasterize_meshes(*ia, workspace=wa, **kw))
    compare_with_case(first, case)
    other = _numpy(wr.rasterize_meshes(*ib, workspace=wb, **kw))
    assert not np.array_equal(other["pix_to_face"], first["pix_to_face"])  # a real change
    after = _numpy(wa.fragments)
    for k in first:
        np.testing.assert_array_equal(after[k], first[k], err_msg=k)

    def spans(ws):
        return [(a.ptr, a.ptr + a.capacity) for a in vars(ws).values()
                if isinstance(a, wp.array) and a.ptr is not None and a.capacity]  # fmt: skip

    for lo, hi in spans(wa):
        for lo2, hi2 in spans(wb):
            assert hi <= lo2 or hi2 <= lo, "two workspaces share memory"
    for a in ("pix_to_face", "zbuf", "bary_coords", "dists"):
        assert getattr(wa.fragments, a).ptr != getattr(wb.fragments, a).ptr


@pytest.mark.skipif("cpu" not in DEVICES, reason="threads on Warp's cpu device")
def test_threads_on_cpu_render_independently():
    """Two threads, two scenes (different sizes and settings), one workspace each,
    rendering at the same time: every result equals the same render done alone."""
    jobs = {}
    scenes = [("p02_ico0_k3", 0.8), ("p03_ico1_blur1e-4_k8_clipbary", 1.0)]
    for i, (name, scale) in enumerate(scenes):
        case = load_case(name)
        inputs, kw = _warp_inputs(case, "cpu", scale)
        want = _numpy(wr.rasterize_meshes(*inputs, workspace=_workspace(case, "cpu"), **kw))
        if scale == 1.0:
            compare_with_case(want, case)
        jobs[f"cpu#{i}"] = (case, scale, want)
    _render_in_threads(jobs, repeats=15)


# ----------------------------------------------------------------------------- torch adapter
def _torch_case(torch, case, device, scale=1.0):
    args = raster_args(case)
    verts = torch.tensor(np.asarray(args.pop("verts")) * scale, device=device, requires_grad=True)
    packed = [torch.tensor(args.pop(k), device=device)
              for k in ("faces", "mesh_to_face_first_idx", "num_faces_per_mesh")]  # fmt: skip
    args.update(bin_size=case["bin_size"])
    return verts, packed, args


def _torch_devices(torch) -> list[str]:
    devs = ["cpu"] if "cpu" in DEVICES else []
    return devs + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def _torch_loss(torch, out):
    p2f, zbuf, bary, dists = out
    w = torch.linspace(0.5, 1.5, zbuf.numel(), dtype=zbuf.dtype, device=zbuf.device)
    return (zbuf.reshape(-1) * w).sum() + (bary**2).sum() + dists.sum()


def test_torch_outputs_and_gradients_survive_later_calls():
    """Two calls of the same shape on the same device (what a per-device workspace
    cache would serve from one set of buffers): the first call's outputs are not
    changed by the second, and one backward through both gives each input the
    gradient it gets alone (PyTorch's rule: a returned tensor is the caller's)."""
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt

    case = load_case("p03_ico1_blur1e-4_k8_clipbary")
    for device in _torch_devices(torch):
        va, packed, kw = _torch_case(torch, case, device)
        vb, _, _ = _torch_case(torch, case, device, scale=0.7)
        out_a = wrt.rasterize_meshes(va, *packed, **kw)
        kept = [t.detach().clone() for t in out_a]
        out_b = wrt.rasterize_meshes(vb, *packed, **kw)
        assert not torch.equal(out_a[0], out_b[0])  # the second call drew something else
        for t, k in zip(out_a, kept, strict=True):
            assert torch.equal(t, k), f"a later call changed an earlier call's outputs on {device}"
        (_torch_loss(torch, out_a) + _torch_loss(torch, out_b)).backward()
        for v, s in ((va, 1.0), (vb, 0.7)):
            alone, _, _ = _torch_case(torch, case, device, scale=s)
            _torch_loss(torch, wrt.rasterize_meshes(alone, *packed, **kw)).backward()
            # same kernels, same pixels: the same sums, up to atomic order on a GPU
            torch.testing.assert_close(v.grad, alone.grad, rtol=1e-5, atol=1e-6)


def _torch_jobs(torch, wrt, devs):
    """(verts, packed, kwargs, expected outputs) of p02 at two scales, one per device."""
    case = load_case("p02_ico0_k3")
    jobs = []
    for d, s in zip(devs, (1.0, 0.75), strict=True):
        v, packed, kw = _torch_case(torch, case, d, scale=s)
        want = [t.detach().clone() for t in wrt.rasterize_meshes(v, *packed, **kw)]
        jobs.append((v.detach(), packed, kw, want))
    assert not torch.equal(jobs[0][3][0].cpu(), jobs[1][3][0].cpu())
    return jobs


def _run_torch_threads(torch, wrt, jobs, contexts, repeats: int = 15) -> list[str]:
    start, errors = threading.Barrier(len(jobs)), []

    def run(i, v, packed, kw, want):
        try:
            start.wait(timeout=120)
            for _ in range(repeats):
                got = wrt.rasterize_meshes(v, *packed, context=contexts[i], **kw)
                if not all(torch.equal(g, w) for g, w in zip(got, want, strict=True)):
                    errors.append(f"thread {i} on {v.device}: outputs differ from its own render")
                    return
        except Exception as e:
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return errors


def test_torch_calls_from_two_threads_with_their_own_contexts():
    """Two threads calling the torch op at once, each with its own RasterContext (the
    documented way to keep buffers apart), on one device or on two when present: each
    gets what it gets alone."""
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt

    devs = _torch_devices(torch)
    if not devs:
        pytest.skip("no torch device that Warp runs on here")
    devs = (devs * 2)[:2]
    jobs = _torch_jobs(torch, wrt, devs)
    errors = _run_torch_threads(torch, wrt, jobs, [wrt.RasterContext(), wrt.RasterContext()])
    assert not errors, errors


def test_torch_two_devices_from_two_threads_default_context():
    """Two devices, two threads, the default context: the workspaces are keyed by
    device, so nothing is shared."""
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt

    devs = _torch_devices(torch)
    if len(devs) < 2:
        pytest.skip("needs two devices torch and Warp both run on (cpu + cuda:0, or 2 GPUs)")
    jobs = _torch_jobs(torch, wrt, devs[:2])
    assert not _run_torch_threads(torch, wrt, jobs, [None, None])


@pytest.mark.skipif("cpu" not in DEVICES, reason="interleaves two host threads on Warp's cpu")
def test_torch_default_context_threads_do_not_share_scratch(monkeypatch):
    """Same device, same shape, the default context, two threads: thread 0 is held
    (deterministically) between its face set-up and its raster pass while thread 1
    makes a whole call; thread 0 must still get its own scene. A fixed context that
    serialises the two calls makes thread 1 wait: thread 0 stops waiting after 3 s."""
    torch = pytest.importorskip("torch")
    import warpraster.torch as wrt
    from warpraster.raster.workspace import RasterWorkspace

    jobs = _torch_jobs(torch, wrt, ["cpu", "cpu"])
    held, other_done = threading.Event(), threading.Event()
    original = RasterWorkspace.pass_for
    hold_thread = []

    def pass_for(self, *args, **kwargs):
        if hold_thread and threading.get_ident() == hold_thread[0] and not held.is_set():
            held.set()  # thread 0's faces are set up; let thread 1 run a whole call
            other_done.wait(timeout=3.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RasterWorkspace, "pass_for", pass_for)
    results: dict[int, list] = {}

    def first():
        hold_thread.append(threading.get_ident())
        v, packed, kw, _ = jobs[0]
        results[0] = wrt.rasterize_meshes(v, *packed, **kw)

    def second():
        held.wait(timeout=60)
        v, packed, kw, _ = jobs[1]
        results[1] = wrt.rasterize_meshes(v, *packed, **kw)
        other_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert held.is_set(), "the hook did not run: the raster pass no longer calls pass_for"
    for i in (0, 1):
        for got, want in zip(results[i], jobs[i][3], strict=True):
            assert torch.equal(got, want), f"thread {i} got another thread's render"


def test_torch_threads_on_one_gpu_launch_on_their_own_streams(monkeypatch):
    """Two threads on one GPU, each on its own torch stream. Warp's current stream is
    the device's (one per process), so the torch ops hold a per-device lock while
    they issue their launches (torch/streams.py): thread B, held inside its op at
    its raster pass, keeps thread A's op out until it leaves; then A issues, on
    A's stream. Checked: A makes no launch while B is inside (A's op cannot finish
    within the hold), no launches interleave, each thread's launches go to its own
    stream, and Warp's current stream is restored. (Before the lock, A's launches
    went to B's stream: this test was an expected failure, then passed unseen.)"""
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and wp.is_cuda_available()):
        pytest.skip("needs a GPU that torch and Warp both see")
    import warpraster.torch as wrt
    from warpraster.raster.workspace import RasterWorkspace

    dev = "cuda:0"
    jobs = _torch_jobs(torch, wrt, [dev, dev])
    b_inside, a_done = threading.Event(), threading.Event()
    order: list[str] = []  # the thread of every launch, in issue order
    launched: dict[str, list[int]] = {"A": [], "B": []}
    expected: dict[str, int] = {}
    a_finished_during_hold = []
    original_pass_for = RasterWorkspace.pass_for
    original_launch, original_cmd = wp.launch, wp.Launch.launch

    def pass_for(self, *args, **kwargs):
        if threading.current_thread().name == "B" and not b_inside.is_set():
            b_inside.set()
            # A tries its op now; the lock keeps it out: it cannot finish meanwhile
            a_finished_during_hold.append(a_done.wait(timeout=2.0))
        return original_pass_for(self, *args, **kwargs)

    def note(stream, device) -> None:
        name = threading.current_thread().name
        if name in launched:
            s = stream if stream is not None else wp.get_device(device).stream
            launched[name].append(int(s.cuda_stream))
            order.append(name)

    def launch(kernel, dim, *args, **kwargs):
        if not kwargs.get("record_cmd", False):
            note(kwargs.get("stream"), kwargs.get("device"))
        return original_launch(kernel, dim, *args, **kwargs)

    def launch_cmd(self, stream=None):
        note(stream, self.device)
        return original_cmd(self, stream)

    monkeypatch.setattr(RasterWorkspace, "pass_for", pass_for)
    monkeypatch.setattr(wp, "launch", launch)
    monkeypatch.setattr(wp.Launch, "launch", launch_cmd)

    def call(name, job, stream, before=None, after=None):
        if before is not None:
            before.wait(timeout=60)
        v, packed, kw, _ = job
        with torch.cuda.stream(stream):
            expected[name] = int(torch.cuda.current_stream(dev).cuda_stream)
            wrt.rasterize_meshes(v, *packed, **kw)
            stream.synchronize()
        if after is not None:
            after.set()

    sa, sb = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    threads = [
        threading.Thread(target=call, name="B", args=("B", jobs[1], sb, None, None)),
        threading.Thread(target=call, name="A", args=("A", jobs[0], sa, b_inside, a_done)),
    ]
    warp_dev = wp.get_device(dev)
    before = warp_dev.stream
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        left = warp_dev.stream
        warp_dev.set_stream(before, sync=False)
    assert a_finished_during_hold == [False], "A's op ran while B was inside its own"
    assert launched["A"] and launched["B"], "no Warp launch seen from a thread"
    first_a = order.index("A")
    assert "B" not in order[first_a:], "the two threads' launches interleaved"
    for name in ("A", "B"):
        wrong = [s for s in launched[name] if s != expected[name]]
        assert not wrong, f"{len(wrong)} of thread {name}'s launches went to another stream"
    assert left.cuda_stream == before.cuda_stream, "Warp's current stream was left changed"
