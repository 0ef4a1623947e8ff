"""The mip-mapped texture sampling's adjoint: Warp's generated one vs the hand-written one.

``python scripts/gpu_mip_adjoint.py [--scene NAME] [--runs 20] [--regs 64,80,96]`` (CUDA):
on the bench scene (default ``hardphong_mip1024_ico5x8_512_k1``), for each way of
recording the adjoint of ``mipmap._sample_uv_mipmap`` (``generated``: Warp's,
one thread per slot and channel; ``hand``: ``mip_adjoint._sample_uv_mipmap_adjoint``,
one thread per slot, uncapped and with each ``--regs`` cap):

* the gradients of one render + MSE + backward against the generated path's
  (largest difference over the largest entry: float atomics in another order);
* per-kernel device time of render + MSE + backward (CUDA activity timing,
  ``wp.timing_begin``), the sampling kernels and the largest others;
* render + MSE + backward, eager and replayed from a captured graph (medians).
"""

from __future__ import annotations

import argparse
import collections
import statistics

import numpy as np
import warp as wp

import warpraster.shading.mip_adjoint as mip_adjoint
from warpraster.bench_render import make_renderer
from warpraster.shading.reductions import image_mse
from warpraster.timing import timer

ADJOINT = mip_adjoint._sample_uv_mipmap_adjoint


def _use_adjoint_cap(cap: int | None) -> None:
    """Re-makes the hand-written adjoint kernel with ``cuda_max_registers=cap`` (None:
    the uncapped original)."""
    k = ADJOINT
    if cap is not None:
        k = wp.kernel(ADJOINT.func, name=f"_sample_uv_mipmap_adjoint_r{cap}", module="unique",
                      module_options=dict(ADJOINT.module.options), cuda_max_registers=cap,
                      enable_backward=False)  # fmt: skip
    mip_adjoint._sample_uv_mipmap_adjoint = k


def _step(scene: str, device, generated: bool):
    r, verts = make_renderer(scene, device)
    r.textures._generated_adjoint = generated
    out = r.render(verts)
    target = wp.zeros_like(out.image)
    target.assign(out.image.numpy() * 0.9)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape = wp.Tape()

    def forward_backward():
        tape.reset()  # zeroes the previous step's gradients
        loss.zero_()
        with tape:
            image_mse(r.render(verts).image, target, out=loss)
        tape.backward(loss)

    return forward_backward, [verts, r.textures.maps, r.textures.verts_uvs]


def measure(scene: str, device, runs: int, generated: bool, label: str, want=None):
    fb, arrays = _step(scene, device, generated)
    fb()  # loads the modules
    fb()
    grads = [a.grad.numpy().copy() for a in arrays]
    if want is not None:
        errs = [
            np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)
            for g, w in zip(grads, want, strict=True)
        ]
        print(f"[{label}] gradient differences vs generated (max |diff| / max |generated|): "
              f"verts {errs[0]:.2e}, maps {errs[1]:.2e}, verts_uvs {errs[2]:.2e}")  # fmt: skip
    wp.synchronize()
    wp.timing_begin(cuda_filter=wp.TIMING_KERNEL)
    for _ in range(runs):
        fb()
    res = wp.timing_end()
    acc = collections.defaultdict(float)
    for t in res:
        acc[t.name] += t.elapsed
    total = sum(acc.values()) / runs
    print(f"[{label}] render + MSE + backward: {total:.3f} ms kernel time per step")
    for name, ms in sorted(acc.items(), key=lambda kv: -kv[1])[:8]:
        mark = "*" if "sample_uv_mipmap" in name else " "
        print(f"   {mark}{ms / runs:8.3f} ms  {name[:90]}")
    timed = timer(device)
    eager = statistics.median(timed(fb) for _ in range(runs))
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        fb()
    graph = statistics.median(timed(lambda: wp.capture_launch(cap.graph)) for _ in range(runs))
    print(f"[{label}] render + MSE + backward: eager {eager:.3f} ms, graph {graph:.3f} ms",
          flush=True)  # fmt: skip
    return grads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/gpu_mip_adjoint.py")
    ap.add_argument("--scene", default="hardphong_mip1024_ico5x8_512_k1")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--regs", default="", help="register caps to try on the hand adjoint")
    ap.add_argument("--device", default="cuda:0", help="(cpu: a slow smoke run, no timings)")
    a = ap.parse_args(argv)
    wp.config.quiet = True
    wp.init()
    device = wp.get_device(a.device)
    want = measure(a.scene, device, a.runs, True, "generated")
    for cap in [None] + [int(c) for c in a.regs.split(",") if c.strip()]:
        _use_adjoint_cap(cap)
        measure(a.scene, device, a.runs, False, f"hand, regs {cap or 'uncapped'}", want)
    _use_adjoint_cap(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
