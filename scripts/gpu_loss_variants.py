"""Graph-replay times of one training step of the renderer bench scenes, by how
the loss and the gradient clearing are done (medians, ms).

``python scripts/gpu_loss_variants.py [--runs 30]``: render + MSE + backward with
the fused loss (:meth:`Renderer.image_mse`), the unfused one
(:func:`warpraster.shading.image_mse`), and each with ``tape.zero()`` before
the backward (which a training loop needs: it clears every gradient the
render recorded, the fragments' included), alternating A/B per run.
"""

import argparse

import warp as wp

from warpraster.bench_render import TARGETS, loss_step, make_renderer
from warpraster.timing import alternating_medians, captured


def variants(name, device, runs):
    r, verts = make_renderer(name, device, ())
    out = r.render(verts)
    target = wp.array(out.image.numpy() * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    def step(fused, zero):
        return loss_step(r, verts, target, loss, fused, zero)

    labels = {(True, False): "fused", (False, False): "unfused",
              (True, True): "fused+zero", (False, True): "unfused+zero"}  # fmt: skip
    graphs = {key: captured(step(*key), device) for key in labels}
    med = alternating_medians(graphs, device, runs)
    print(name, "  ".join(f"{labels[k]} {v:.3f}" for k, v in med.items()))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    for s in TARGETS:
        variants(s, wp.get_device("cuda:0"), a.runs)
