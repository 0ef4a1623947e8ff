"""Runs a few render + MSE + backward steps of a renderer bench scene, eagerly
(for Nsight Compute: ``ncu -k regex:NAME --launch-skip 2 --launch-count 1
python scripts/gpu_render_step.py SCENE``)."""

import sys

import warp as wp

from warpraster.bench_render import loss_step, make_renderer

if __name__ == "__main__":
    wp.config.quiet = True
    wp.init()
    dev = wp.get_device("cuda:0")
    r, verts = make_renderer(sys.argv[1], dev, ())
    out = r.render(verts)
    target = wp.array(out.image.numpy() * 0.9, dtype=wp.float32, device=dev)
    loss = wp.zeros(1, dtype=wp.float32, device=dev, requires_grad=True)
    step = loss_step(r, verts, target, loss)
    for _ in range(4):
        step()
    wp.synchronize()
