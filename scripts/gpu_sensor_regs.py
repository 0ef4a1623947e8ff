"""Sensor bench (fused loss) with register caps on the per-pixel channel adjoint.

``python scripts/gpu_sensor_regs.py [caps...]`` (CUDA): fwd and fwd + bwd per cap
(none = the compiler's choice), medians of graph replays.
"""

import sys

import warp as wp

from warpraster.sim import pixel_adjoint
from warpraster.sim.bench import bench_sensor


def main(caps):
    wp.config.quiet = True
    for cap in caps:
        for key in list(pixel_adjoint.CHANNELS_ADJOINT):
            pixel_adjoint.CHANNELS_ADJOINT[key] = pixel_adjoint._make_channels_adjoint(*key, cap)
        r = bench_sensor(device="cuda:0", runs=50, fused_loss=True)
        print(
            f"cap {cap}: fwd {r['fwd_ms']:.4f} fwd_loss {r['fwd_loss_ms']:.4f} "
            f"fwd_bwd {r['fwd_bwd_ms']:.4f} ratio {r['fwd_bwd_ms'] / r['fwd_ms']:.3f}"
        )


if __name__ == "__main__":
    args = sys.argv[1:] or ["none", "80", "72", "64", "56", "48", "40"]
    main([None if a == "none" else int(a) for a in args])
