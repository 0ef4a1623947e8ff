"""Renderer bench scenes with CUDA register caps on the shading and texture kernels.

``python scripts/gpu_render_regs.py`` (CUDA): for each configuration (kernel ->
cap), the kernels are re-made with ``cuda_max_registers`` and the scene timed
(eager and graph replay, medians), so the caps can be compared in one run.
"""

import importlib

import warp as wp

from warpraster.bench_render import run

K8 = "softphong_ico5x8_512_k8"
K1 = "hardphong_mip1024_ico5x8_512_k1"
FUSED = "warpraster.shading.fused"
MIP = "warpraster.shading.mipmap"
CONFIGS = [
    (K8, {}),
    (K8, {(FUSED, "_shade_blend_adjoint"): 64}),
    (K8, {}),
    (K8, {(FUSED, "_shade_blend_adjoint"): 64}),
    (K1, {}),
    (K1, {(FUSED, "_shade_blend_adjoint"): 64}),
    (K1, {}),
    (K1, {(FUSED, "_shade_blend_adjoint"): 64}),
]


def main():
    wp.config.quiet = True
    dev = wp.get_device("cuda:0")
    names = {key for _, caps in CONFIGS for key in caps}
    orig = {key: getattr(importlib.import_module(key[0]), key[1]) for key in names}
    for scene, caps in CONFIGS:
        for (mod, name), k in orig.items():
            cap = caps.get((mod, name))
            if cap is not None:
                k = wp.kernel(
                    k.func,
                    name=f"{name}_r{cap}",
                    module="unique",
                    module_options=dict(k.module.options),
                    cuda_max_registers=cap,
                    enable_backward=k.options.get("enable_backward"),
                )
            setattr(importlib.import_module(mod), name, k)
        r = run(scene, dev, 20)
        label = ", ".join(f"{n}={c}" for (_, n), c in caps.items()) or "uncapped"
        print(
            f"{scene} [{label}]: eager {r['fwd_ms']:.3f}/{r['fwd_bwd_ms']:.3f} "
            f"graph {r['graph_fwd_ms']:.3f}/{r['graph_fwd_bwd_ms']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
