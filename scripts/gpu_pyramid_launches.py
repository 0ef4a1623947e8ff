"""Mip pyramid build of the K=1 bench texture (8 maps of 1024 x 1024 x 3), launch
by launch: the library's two-levels kernel (one thread per texel and channel of
the coarser level) against one thread per texel for all channels; each launch's
CUDA-event time (medians, ms), the whole build replayed from a captured graph, and
the candidate's levels compared with the library's.

``python scripts/gpu_pyramid_launches.py [--device cuda:0] [--runs 50]``
(``--device cpu`` checks the candidate's output only).
"""

import argparse

import numpy as np
import warp as wp

from warpraster.shading.mipmap import (
    MipLevels,
    MipPyramid,
    _build_two_levels,
    _store_texel,
    _two_levels,
    flat_index4,
    level_size,
)
from warpraster.timing import alternating_medians, captured, timer


def _all_channels(p: MipLevels, level: int, levels_out: wp.array(dtype=wp.float32)):
    """One thread per texel of ``level + 1``, all channels."""
    hw = level_size(p, level + 1)
    m, y, x, _ = flat_index4(wp.tid(), hw[0], hw[1], 1)
    for c in range(p.maps.shape[3]):
        v = _two_levels(p, levels_out, level, m, y, x, c)
        _store_texel(p, levels_out, level + 1, m, y, x, c, v)


_OPTIONS = dict(enable_backward=False, module="unique", module_options={"fuse_fp": False})
all_channels = wp.kernel(_all_channels, name="pyr_all_channels", **_OPTIONS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    device = wp.get_device(a.device)
    rng = np.random.default_rng(0)
    s = a.size
    maps = wp.array(rng.uniform(0, 1, (8, s, s, 3)).astype(np.float32), dtype=wp.float32,
                    device=device)  # fmt: skip
    p = MipPyramid(maps)
    ref = p.levels.numpy().copy()
    n, _, _, c = maps.shape
    groups = p._groups()

    def launches(kernel, per_channel):
        out = []
        for lev, g in groups:
            lh, lw = p.sizes[lev + g - 1]
            k = kernel if g == 2 else None
            if k is None:  # a last single level: the library's
                from warpraster.shading.mipmap import _build_level

                k, dim = _build_level, n * lh * lw * c
            else:
                dim = n * lh * lw * (c if per_channel else 1)

            def launch(k=k, dim=dim, lev=lev):
                wp.launch(k, dim=dim, inputs=[p.arrays, lev], outputs=[p.levels], device=device)

            out.append((f"levels {lev}-{lev + g - 1}", launch))
        return out

    variants = {"library": launches(_build_two_levels, True),
                "all channels": launches(all_channels, False)}  # fmt: skip
    for name, ls in variants.items():
        p.levels.zero_()
        for _, launch in ls:
            launch()
        same = np.array_equal(p.levels.numpy(), ref)
        print(f"{name}: levels {'bit-equal to' if same else 'DIFFER from'} the library's")
    if not device.is_cuda:
        return
    timed = timer(device)
    for name, ls in variants.items():
        for label, launch in ls:
            t = sorted(timed(launch) for _ in range(a.runs))[a.runs // 2]
            print(f"  {name:<14} {label:<12} {t:.4f} ms")
    graphs = {}
    for name, ls in variants.items():
        graphs[name] = captured(lambda ls=ls: [launch() for _, launch in ls], device)
    for name, t in alternating_medians(graphs, device, a.runs).items():
        print(f"  {name:<14} whole build, graph replay: {t:.4f} ms")


if __name__ == "__main__":
    main()
