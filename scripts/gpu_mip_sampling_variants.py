"""The K=1 bench scene's mip-mapped sampling kernel against a candidate with one
thread per slot for all channels (the UV, its screen-space derivatives and the
face-corner gathers once per slot instead of once per channel), on the render's
own inputs: CUDA-event times alternating (medians, ms) and the outputs compared.

``python scripts/gpu_mip_sampling_variants.py [--device cuda:0] [--runs 50]``
(``--device cpu`` checks the candidate's output only). A candidate kept in the
library must also get its adjoint's launch shape checked (mip_adjoint.py reads
the forward's launch dims).
"""

import argparse
import statistics

import numpy as np
import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.patches import patch_launch_size, patch_slot
from warpraster.shading import mipmap
from warpraster.shading.mipmap import SAMPLE_PATCH_W, SampleInputs, mip_sample_channel, slot_uv
from warpraster.timing import timer


def _per_slot(a: SampleInputs, texels_out: wp.array4d(dtype=wp.float32)):
    """One thread per slot: every channel of it."""
    p2f = a.frag.pix_to_face
    k_count = p2f.shape[3]
    n, yi, xi, k, inside = patch_slot(
        wp.tid(), p2f.shape[0], p2f.shape[1], p2f.shape[2], k_count, SAMPLE_PATCH_W
    )
    if not inside:
        return
    channels = a.t.p.maps.shape[3]
    f = p2f[n, yi, xi, k]
    if f < 0:
        for c in range(channels):
            texels_out[n, yi, xi, k * channels + c] = 0.0
        return
    shape = wp.vec2i(p2f.shape[1], p2f.shape[2])
    uv, duv_dx, duv_dy = slot_uv(a.corners, f, a.frag.bary_coords[n, yi, xi, k], yi, xi, shape)
    for c in range(channels):
        texels_out[n, yi, xi, k * channels + c] = mip_sample_channel(a.t, n, c, uv, duv_dx, duv_dy)


# the library's module options (its float rounding), in modules of their own
_OPTIONS = dict(enable_backward=False, module="unique", module_options={"fuse_fp": False})
per_slot_64 = wp.kernel(_per_slot, name="per_slot_64", cuda_max_registers=64, **_OPTIONS)
per_slot_free = wp.kernel(_per_slot, name="per_slot_free", **_OPTIONS)


def captured_launch(device):
    """The K=1 scene's sampling launch: (inputs, output view, dim)."""
    seen = {}
    real = wp.launch

    def spy(kernel, *args, **kw):
        if kernel is mipmap._sample_uv_mipmap:
            seen["inputs"] = kw["inputs"][0]
            seen["out"] = kw["outputs"][0]
            seen["dim"] = kw["dim"]
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
    channels = inputs.t.p.maps.shape[3]
    k = kc // channels
    ref = out.numpy().copy()
    cand = wp.zeros_like(out)
    kernels = {
        "library (slot x channel)": (mipmap._sample_uv_mipmap, seen["dim"], out),
        "per slot, 64 registers": (
            per_slot_64,
            patch_launch_size(n, h, w, SAMPLE_PATCH_W, k),
            cand,
        ),
        "per slot, uncapped": (per_slot_free, patch_launch_size(n, h, w, SAMPLE_PATCH_W, k), cand),
    }
    for name, (kernel, dim, dst) in kernels.items():
        dst.zero_()
        wp.launch(kernel, dim=dim, inputs=[inputs], outputs=[dst], device=device)
        same = np.array_equal(dst.numpy(), ref)
        print(f"{name}: output {'bit-equal to' if same else 'DIFFERS from'} the library's")
    if not device.is_cuda:
        return
    timed = timer(device)
    times = {name: [] for name in kernels}
    for _ in range(a.runs):
        for name, (kernel, dim, dst) in kernels.items():

            def launch(kernel=kernel, dim=dim, dst=dst):
                wp.launch(kernel, dim=dim, inputs=[inputs], outputs=[dst], device=device)

            times[name].append(timed(launch))
    for name, v in times.items():
        print(f"  {name:<26} {statistics.median(v):.4f} ms")


if __name__ == "__main__":
    main()
