"""What the fused shading adjoint's time is made of (K=8 soft Phong bench scene).

``python scripts/gpu_shade_adjoint_parts.py``: renders the scene on a tape,
captures the adjoint's launch arguments, then times ``_shade_blend_adjoint``
alone (CUDA events, median of 30) with all its outputs, without the per-face
corner atomics, without the fragment-gradient writes, and with other block
sizes. Gradients accumulate across the timed runs (timing only).
"""

import statistics
import sys

import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.patches import patch_launch_size
from warpraster.shading import fused
from warpraster.shading.reductions import image_mse
from warpraster.timing import timer


def main():
    scene = sys.argv[1] if len(sys.argv) > 1 else "softphong_ico5x8_512_k8"
    device = wp.get_device("cuda:0")
    captured = {}
    real = fused.launch_shade_blend

    def spy(frag, inputs, image_out, image_grad=None):
        captured["args"] = (frag, inputs, image_out)
        return real(frag, inputs, image_out, image_grad)

    fused.launch_shade_blend = spy
    import warpraster.shading.shaders as shaders

    if hasattr(shaders, "launch_shade_blend"):
        shaders.launch_shade_blend = spy
    r, verts = make_renderer(scene, device, channels=())
    out = r.render(verts)
    target = wp.zeros_like(out.image)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        o = r.render(verts)
        image_mse(o.image, target, out=loss)
    tape.backward(loss)
    frag, inputs, image_out = captured["args"]
    g, _ = fused._shade_grads(frag, inputs)
    n, h, w, _ = frag.pix_to_face.shape
    ig = fused.ImageGrad()
    ig.grad = image_out.grad
    ig.mse = 0
    dim = patch_launch_size(n, h, w, fused.ADJOINT_PATCH_W)
    full = g.want
    timed = timer(device)

    def time_it(want, block_dim=256, runs=30):
        g.want = want

        def launch():
            wp.launch(fused._shade_blend_adjoint, dim=dim, inputs=[frag, inputs, image_out, ig],
                      outputs=[g], device=device, block_dim=block_dim)  # fmt: skip

        launch()
        return statistics.median(timed(launch) for _ in range(runs))

    faces = fused.WANT_FACE_POS | fused.WANT_FACE_NRM | fused.WANT_FACE_COL
    frag_bits = fused.WANT_BARY | fused.WANT_ZBUF | fused.WANT_DISTS
    print(f"{scene}: want bits {full:#x}")
    for label, want, bd in (
        ("all outputs", full, 256),
        ("no corner atomics", full & ~faces, 256),
        ("no fragment gradients", full & ~frag_bits, 256),
        ("neither", full & ~(faces | frag_bits), 256),
        ("only colour atomics", (full & ~(faces | frag_bits)) | fused.WANT_FACE_COL, 256),
        ("all outputs, block 128", full, 128),
        ("all outputs, block 64", full, 64),
        ("all outputs, block 512", full, 512),
        ("all outputs", full, 256),
    ):
        print(f"  {label:<28} {time_it(want, bd):.4f} ms", flush=True)


if __name__ == "__main__":
    main()
