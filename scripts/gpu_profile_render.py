"""Per-kernel GPU time of the renderer bench scenes (forward, and forward + backward;
the image alone, without the extra channels).

``python scripts/gpu_profile_render.py [--scenes a,b] [--runs 10]``: CUDA activity
timing (``wp.timing_begin``), summed per kernel name, divided by the runs.
"""

import argparse
import collections

import warp as wp

from warpraster.bench_render import loss_step, make_renderer, run


def profile(name, device, runs):
    r, verts = make_renderer(name, device, ())  # the image alone, as the targets
    # every kernel launched on its own (no call graphs), so that each is listed
    r.call_graphs = False
    for o in r.outputs:
        o.workspace.tuning = o.workspace.tuning.replace(call_graphs=False)
    out = r.render(verts)
    target = wp.zeros_like(out.image)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    fb = loss_step(r, verts, target, loss)
    fb()
    wp.synchronize()
    for label, fn in (("fwd", lambda: r.render(verts)), ("f+b", fb)):
        wp.timing_begin(cuda_filter=wp.TIMING_ALL)
        for _ in range(runs):
            fn()
        res = wp.timing_end()
        acc = collections.defaultdict(float)
        cnt = collections.Counter()
        for t in res:
            acc[t.name] += t.elapsed
            cnt[t.name] += 1
        total = sum(acc.values()) / runs
        print(
            f"--- {name} {label}: {total:.3f} ms device time per call, "
            f"{sum(cnt.values()) // runs} ops"
        )
        for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:24]:
            print(f"   {v / runs:8.3f} ms  x{cnt[k] // runs:<3d} {k[:90]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--scenes",
        default="softphong_ico5x8_512_k8,softphong_ico5x8_512_k8_blur,hardphong_mip1024_ico5x8_512_k1",
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    dev = wp.get_device("cuda:0")
    for s in a.scenes.split(","):
        profile(s, dev, a.runs)
        if a.bench:
            print(run(s, dev, 10))
