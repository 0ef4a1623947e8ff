"""The K=1 bench scene's mip-mapped sampling kernels, on the render's own inputs:
the library's one thread per slot for all channels
(``mipmap._sample_uv_mipmap_slots``, capped at ``SAMPLE_MAX_REGISTERS``), the
same uncapped, and one thread per slot and channel (``mipmap._sample_uv_mipmap``,
the generated-adjoint path's forward): CUDA-event times alternating (medians,
ms) and the outputs compared bit for bit.

``python scripts/gpu_mip_sampling_variants.py [--device cuda:0] [--runs 50]``
(``--device cpu`` compares the outputs only). H200, this release: per slot and
channel 0.179 ms, per slot at 64 registers 0.106, per slot uncapped 0.136.
"""

import argparse
import statistics

import numpy as np
import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.patches import patch_launch_size
from warpraster.shading import mipmap
from warpraster.shading.mipmap import SAMPLE_PATCH_W
from warpraster.timing import timer

# the library's per-slot kernel uncapped, in a module of its own (its float rounding)
per_slot_free = wp.kernel(
    mipmap._sample_uv_mipmap_slots.func, name="per_slot_free", enable_backward=False,
    module="unique", module_options={"fuse_fp": False},
)  # fmt: skip


def captured_launch(device):
    """The K=1 scene's sampling launch: its inputs and output view."""
    seen = {}
    real = wp.launch

    def spy(kernel, *args, **kw):
        if kernel is mipmap._sample_uv_mipmap_slots:
            seen["inputs"] = kw["inputs"][0]
            seen["out"] = kw["outputs"][0]
        return real(kernel, *args, **kw)

    r, verts = make_renderer("hardphong_mip1024_ico5x8_512_k1", device, ())
    mipmap.wp.launch = spy
    try:
        r.call_graphs = False
        r.render(verts)
    finally:
        mipmap.wp.launch = real
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    device = wp.get_device(a.device)
    seen = captured_launch(device)
    inputs, out = seen["inputs"], seen["out"]
    n, h, w, kc = out.shape
    k = kc // inputs.t.p.maps.shape[3]
    ref = out.numpy().copy()
    per_slot = patch_launch_size(n, h, w, SAMPLE_PATCH_W, k)
    kernels = {
        "per slot (library), capped": (mipmap._sample_uv_mipmap_slots, per_slot),
        "per slot, uncapped": (per_slot_free, per_slot),
        "per slot and channel": (
            mipmap._sample_uv_mipmap,
            patch_launch_size(n, h, w, SAMPLE_PATCH_W, kc),
        ),
    }
    dst = wp.zeros_like(out)
    for name, (kernel, dim) in kernels.items():
        dst.zero_()
        wp.launch(kernel, dim=dim, inputs=[inputs], outputs=[dst], device=device)
        same = np.array_equal(dst.numpy(), ref)
        print(f"{name}: output {'bit-equal to' if same else 'DIFFERS from'} the render's")
    if not device.is_cuda:
        return
    timed = timer(device)
    times = {name: [] for name in kernels}
    for _ in range(a.runs):
        for name, (kernel, dim) in kernels.items():

            def launch(kernel=kernel, dim=dim):
                wp.launch(kernel, dim=dim, inputs=[inputs], outputs=[dst], device=device)

            times[name].append(timed(launch))
    for name, v in times.items():
        print(f"  {name:<28} {statistics.median(v):.4f} ms")


if __name__ == "__main__":
    main()
