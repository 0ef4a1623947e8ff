"""Old vs new backward of the vertex normals and the per-face corner tables (CUDA).

``python scripts/gpu_corner_adjoints.py [--scene softphong_ico5x8_512_k8] [--runs 20]``

The bench scene's :class:`~warpraster.Renderer` runs twice: with its corner lists
(per-vertex gathers, hand-written adjoints: the new path) and with them removed
(``_scatter_corner_normals`` with atomics and Warp's generated adjoints of it and
of ``_gather_faces_kernel``: the old path). For each it prints

* the device time per render + MSE + backward of the kernels concerned (CUDA
  activity timing, summed per kernel name, divided by the runs) and of all;
* the graph-replay time of the forward and of forward + backward (medians);
* whether three backwards give the same bits (vertex and colour gradients).

and, last, the largest difference of the two paths' vertex gradients (relative to
the largest entry; float32 summation order alone: ~1e-7, plus whatever the other
atomic kernels of the backward add run to run).
"""

from __future__ import annotations

import argparse
import collections
import statistics

import numpy as np
import warp as wp

from warpraster.bench_render import make_renderer
from warpraster.shading.reductions import image_mse
from warpraster.timing import timer

#: substrings of the kernel names this change concerns
WATCHED = ("gather_faces", "corner_normals", "face_normal_rows", "normalize_rows")


def use_lists(r, lists) -> None:
    """Gives the renderer (and every step's shading buffers) ``lists`` (None: old path)."""
    r.corner_lists = lists
    for out in r.outputs:
        out.shading.corner_lists = lists


def measure(r, verts, target, device, runs: int, label: str) -> dict:
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    tex = r.textures.verts_features
    tape = wp.Tape()

    def forward():
        r.render(verts)

    def forward_backward():
        # reset(): zeroes every gradient of the previous step (intermediate buffers
        # too; without it they add up from step to step) and forgets its launches
        tape.reset()
        loss.zero_()
        with tape:
            o = r.render(verts)
            image_mse(o.image, target, out=loss)
        tape.backward(loss)

    forward_backward()  # loads every module
    wp.synchronize_device(device)
    grads = []
    for _ in range(3):
        forward_backward()
        grads.append((verts.grad.numpy().copy(), tex.grad.numpy().copy()))
    same_bits = all(
        np.array_equal(a, b) for g in grads[1:] for a, b in zip(grads[0], g, strict=True)
    )

    wp.timing_begin(cuda_filter=wp.TIMING_ALL)
    for _ in range(runs):
        forward_backward()
    results = wp.timing_end()
    per_name = collections.defaultdict(float)
    for t in results:
        per_name[t.name] += t.elapsed / runs
    total = sum(per_name.values())

    timed = timer(device)
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        forward()
    g_fwd = cap.graph
    with wp.ScopedCapture(device=device, force_module_load=False) as cap:
        forward_backward()
    g_both = cap.graph
    for _ in range(3):
        wp.capture_launch(g_both)  # warm
    fwd = statistics.median(timed(lambda: wp.capture_launch(g_fwd)) for _ in range(runs))
    both = statistics.median(timed(lambda: wp.capture_launch(g_both)) for _ in range(runs))

    print(f"--- {label}")
    print(f"    graph replay: forward {fwd:.3f} ms, forward + backward {both:.3f} ms")
    print(f"    device time per render + MSE + backward (all kernels): {total:.3f} ms")
    for name, ms in sorted(per_name.items(), key=lambda kv: -kv[1]):
        if any(w in name for w in WATCHED):
            print(f"    {ms:8.4f} ms  {name[:100]}")
    print(f"    three backwards give the same bits: {same_bits}")
    return {"grads": grads[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scene", default="softphong_ico5x8_512_k8")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    device = wp.get_device(a.device)
    r, verts = make_renderer(a.scene, device)
    r.call_graphs = False  # no cached eager graph across the switch of paths
    target = wp.zeros_like(r.render(verts).image)
    target.assign(r.outputs[0].image.numpy() * 0.9)
    lists = r.corner_lists
    print(f"{a.scene} on {device}: {verts.shape[0]} vertices, {r.faces.shape[0]} faces")
    new = measure(r, verts, target, device, a.runs, "new: corner lists (gathers)")
    use_lists(r, None)
    old = measure(r, verts, target, device, a.runs, "old: atomic scatters, generated adjoints")
    use_lists(r, lists)
    for name, x, y in zip(("verts", "colours"), new["grads"], old["grads"], strict=True):
        rel = np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)
        print(f"new vs old {name} gradient: max |diff| / max |old| = {rel:.2e}")


if __name__ == "__main__":
    main()
