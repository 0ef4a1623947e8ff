"""Graph-replay times of the renderer bench scenes with and without
``Tuning.fill_empty_once`` (the output pass and the clipped path's map back
skipping an empty group of four slots that the call before left filled with
-1), alternating A/B per run; medians, ms.

``python scripts/gpu_fill_variants.py [--runs 20]``: the render's forward and
its forward + backward with the fused loss, per scene.
"""

import argparse

import warp as wp

from warpraster.bench_render import TARGETS, loss_step, make_renderer
from warpraster.timing import alternating_medians, captured


def set_fill(r, on: bool) -> None:
    for o in r.outputs:
        o.workspace.tuning = o.workspace.tuning.replace(fill_empty_once=on)


def variants(name, device, runs):
    rs = {}
    for on in (False, True):
        r, verts = make_renderer(name, device, ())
        set_fill(r, on)
        rs[on] = (r, verts)
    target = wp.array(rs[True][0].render(rs[True][1]).image.numpy() * 0.9, dtype=wp.float32,
                      device=device)  # fmt: skip
    ref = rs[False][0].render(rs[False][1]).image.numpy()
    got = rs[True][0].render(rs[True][1]).image.numpy()
    assert (ref == got).all(), "images differ"
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    graphs = {}
    for on, (r, verts) in rs.items():
        for kind in ("fwd", "f+b"):
            if kind == "fwd":

                def step(r=r, verts=verts):
                    r.render(verts)
            else:
                step = loss_step(r, verts, target, loss, True, False)
            graphs[(kind, on)] = captured(step, device)
    med = alternating_medians(graphs, device, runs)
    print(
        f"{name}: fwd {med[('fwd', False)]:.3f} -> {med[('fwd', True)]:.3f}  "
        f"f+b {med[('f+b', False)]:.3f} -> {med[('f+b', True)]:.3f}  (fill_empty_once off -> on)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    wp.config.quiet = True
    wp.init()
    for s in TARGETS:
        variants(s, wp.get_device("cuda:0"), a.runs)
