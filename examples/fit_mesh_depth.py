"""Fit a mesh's pose to a target depth image, the Warp way: a parameter kernel,
a render, a loss kernel and the backward pass on one ``wp.Tape``, optionally
captured in one graph.

The "simulation" here is a rigid offset applied to an icosphere by a Warp
kernel; the optimiser recovers the offset from a depth image rendered at the
true offset. Run ``python examples/fit_mesh_depth.py [--device cuda:0]
[--graph] [--test]``.
"""

from __future__ import annotations

import argparse

import numpy as np
import warp as wp

import warpraster as wr
from warpraster.cli import init_warp
from warpraster.primitives import ico_sphere


@wp.kernel
def _move(
    base: wp.array(dtype=wp.vec3), offset: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)
):
    i = wp.tid()
    out[i] = base[i] + offset[0]


@wp.kernel
def _depth_loss(
    zbuf: wp.array4d(dtype=wp.float32),
    pix_to_face: wp.array4d(dtype=wp.int32),
    target: wp.array4d(dtype=wp.float32),
    loss: wp.array(dtype=wp.float32),
):
    n, y, x = wp.tid()
    if pix_to_face[n, y, x, 0] >= 0 and target[n, y, x, 0] > 0.0:
        d = zbuf[n, y, x, 0] - target[n, y, x, 0]
        wp.atomic_add(loss, 0, d * d)


@wp.kernel
def _sgd(offset: wp.array(dtype=wp.vec3), grad: wp.array(dtype=wp.vec3), lr: float):
    offset[0] = offset[0] - lr * grad[0]


class FitMeshDepth:
    """step(): one forward + backward + update; render(): the current depth image."""

    def __init__(self, device=None, image_size=64, use_graph=False):
        self.device = wp.get_device(device)
        v, f = ico_sphere(2)
        v = v * 0.6 + np.array([0.0, 0.0, 2.0], np.float32)
        self.faces = wp.array(f, dtype=wp.int32, device=self.device)
        self.first = wp.array([0], dtype=wp.int32, device=self.device)
        self.count = wp.array([len(f)], dtype=wp.int32, device=self.device)
        self.base = wp.array(v, dtype=wp.vec3, device=self.device)
        self.true_offset = np.array([0.12, -0.08, 0.1], np.float32)
        self.offset = wp.zeros(1, dtype=wp.vec3, device=self.device, requires_grad=True)
        self.verts = wp.zeros(len(v), dtype=wp.vec3, device=self.device, requires_grad=True)
        self.loss = wp.zeros(1, dtype=wp.float32, device=self.device, requires_grad=True)
        kw = dict(num_meshes=1, num_faces=len(f), image_size=image_size, faces_per_pixel=1)
        self.workspace = wr.RasterWorkspace(
            **kw, bin_size=8, device=self.device, requires_grad=True
        )
        self.settings = dict(image_size=image_size, faces_per_pixel=1, bin_size=8)
        self.lr = 1e-4  # loss is a sum over ~1000 pixels
        # the target: a render at the true offset (a separate workspace, kept)
        target_ws = wr.RasterWorkspace(**kw, bin_size=8, device=self.device)
        moved = wp.array(v + self.true_offset, dtype=wp.vec3, device=self.device)
        self.target = self._render(moved, target_ws).zbuf
        self._render(self.verts, self.workspace)  # compile and check the topology once
        self.tape = wp.Tape()
        self.graph = None
        if use_graph:
            self.step()  # load every module before capturing
            with wp.ScopedCapture(device=self.device) as cap:
                self._step()
            self.graph = cap.graph

    def _render(self, verts, workspace, validate=True):
        return wr.rasterize_meshes(
            verts, self.faces, self.first, self.count, workspace=workspace, validate=validate,
            **self.settings,
        )  # fmt: skip

    def _step(self):
        self.tape.reset()
        self.loss.zero_()
        with self.tape:
            wp.launch(_move, dim=self.base.shape[0], inputs=[self.base, self.offset],
                      outputs=[self.verts], device=self.device)  # fmt: skip
            frags = self._render(self.verts, self.workspace, validate=False)
            h, w = self.settings["image_size"], self.settings["image_size"]
            wp.launch(_depth_loss, dim=(1, h, w),
                      inputs=[frags.zbuf, frags.pix_to_face, self.target],
                      outputs=[self.loss], device=self.device)  # fmt: skip
        self.tape.backward(loss=self.loss)
        wp.launch(_sgd, dim=1, inputs=[self.offset, self.offset.grad, self.lr], device=self.device)

    def step(self) -> float:
        if self.graph is not None:
            wp.capture_launch(self.graph)
        else:
            self._step()
        return float(self.loss.numpy()[0])

    def render(self) -> np.ndarray:
        return self.workspace.fragments.zbuf.numpy()[0, ..., 0]

    def error(self) -> float:
        return float(np.abs(self.offset.numpy()[0] - self.true_offset).max())


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog=__doc__.split("\n\n", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    ap.add_argument("--steps", type=int, default=200, help="optimiser steps (default 200)")
    ap.add_argument("--graph", action="store_true", help="capture each step in a graph")
    ap.add_argument("--test", action="store_true", help="short run that checks convergence")
    ap.add_argument("--verbose", action="store_true", help="Warp's start-up and module-load lines")
    args = ap.parse_args(argv)
    init_warp(args.verbose)
    fit = FitMeshDepth(device=args.device, use_graph=args.graph)
    steps = 60 if args.test else args.steps
    first = fit.step()
    for _ in range(steps - 1):
        last = fit.step()
    print(f"loss {first:.4g} -> {last:.4g}, offset error {fit.error():.4f}")
    if args.test and not (last < 0.05 * first):
        raise SystemExit("the fit did not converge")
    return 0


if __name__ == "__main__":
    main()
