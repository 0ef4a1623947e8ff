"""Mip pyramid build: levels per launch (1, 2) on the K=1 bench texture.

``python scripts/gpu_pyramid_variants.py``: 8 maps of 1024 x 1024 x 3; forward
(build) and forward + backward (build on a tape, backward from a random level
gradient) replayed from captured graphs, medians of 50; then the K=1 renderer
bench scene with each setting. Also checks that levels and base gradients are
bit-identical across the settings.
"""

import statistics

import numpy as np
import warp as wp

from warpraster.bench_render import run
from warpraster.shading.mipmap import MipPyramid
from warpraster.timing import timer


def graph_time(fn, device, runs=50):
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        fn()
    timed = timer(device)
    return statistics.median(timed(lambda: wp.capture_launch(cap.graph)) for _ in range(runs))


def main():
    device = wp.get_device("cuda:0")
    rng = np.random.default_rng(0)
    maps = wp.array(rng.uniform(0, 1, (8, 1024, 1024, 3)).astype(np.float32), dtype=wp.float32,
                    device=device, requires_grad=True)  # fmt: skip
    ref = None
    for g in (1, 2, 1, 2):
        MipPyramid.levels_per_launch = g
        p = MipPyramid(maps)
        up = wp.array(rng.uniform(-1, 1, p.levels.shape).astype(np.float32), device=device)
        tape = wp.Tape()

        def fb(p=p, up=up, tape=tape):
            maps.grad.zero_()
            with tape:
                p.build()
            p.levels.grad.assign(up)
            tape.backward()
            tape.reset()

        fb()
        got = (p.levels.numpy(), maps.grad.numpy())
        if ref is None:
            ref = got
        same = np.array_equal(ref[0], got[0]) and np.array_equal(ref[1], got[1])
        fwd = graph_time(p.build, device)
        both = graph_time(fb, device)
        print(f"levels_per_launch={g}: build {fwd:.4f} ms, "
              f"build+backward {both:.4f} ms, bit-identical to the first: {same}",
              flush=True)  # fmt: skip
    for g in (1, 2, 1, 2):
        MipPyramid.levels_per_launch = g
        r = run("hardphong_mip1024_ico5x8_512_k1", device, 20)
        print(f"levels_per_launch={g}: K=1 render graph "
              f"{r['graph_fwd_ms']:.4f} / {r['graph_fwd_bwd_ms']:.4f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
