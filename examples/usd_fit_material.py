"""Recover a USD stage's material colours from a picture, by gradient descent.

Loads a stage (the bundled ``assets/default_scene.usda`` unless another is
given), renders a target picture with its own materials, then starts every
material's diffuse colour from grey and recovers them from the picture alone:
each step renders through ``usd.StageRenderer(requires_grad=True)`` on a
``wp.Tape``, takes the mean squared error against the target (a Warp kernel on
the tape), runs ``tape.backward`` and moves the colours by Adam. A fresh tape
per step; only the colours' gradient is zeroed.

Run ``python examples/usd_fit_material.py [SCENE] [--device cuda:0] [--steps N]
[--test]``; ``--test`` is a short run (small picture) that prints the start and
final errors and exits 1 unless every colour is within 0.01 of the stage's
(the loss is quadratic in the colours: a converged run is within 1e-3).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from warpraster.cli import init_warp

wp = init_warp()

import warpraster.usd as wu  # noqa: E402

#: --test: a converged fit is within 1e-3 of the stage's colours; 0.01 leaves room
#: for a slower descent on another device, far below the grey start (0.3-0.5 off)
TEST_TOLERANCE = 0.01


@wp.kernel
def _mse(
    color: wp.array2d(dtype=wp.vec4),
    target: wp.array2d(dtype=wp.vec4),
    scale: float,
    loss: wp.array(dtype=float),
):
    y, x = wp.tid()
    d = color[y, x] - target[y, x]
    wp.atomic_add(loss, 0, wp.dot(d, d) * scale)


class FitMaterial:
    """A stage renderer, its target picture and an Adam state for the colours."""

    def __init__(self, scene, *, image_size, spp: int, device, lr: float = 0.05):
        self.r = wu.StageRenderer(scene, image_size=image_size, spp=spp, requires_grad=True,
                                  device=device)  # fmt: skip
        self.colours = self.r.buffers.atlas.diffuse  # (M + 1,) vec3; row M is unused
        self.truth = self.colours.numpy().copy()
        self.r.render_device()
        self.target = wp.clone(self.r.color)
        start = self.truth.copy()
        start[:-1] = 0.5
        self.colours.assign(start)
        self.loss = wp.zeros(1, dtype=float, device=self.r.device, requires_grad=True)
        h, w = image_size
        self.scale = 1.0 / (h * w * 4)
        self.lr = lr
        self.m = np.zeros_like(start)
        self.v = np.zeros_like(start)
        self.t = 0

    def error(self) -> float:
        """Largest difference of a material colour from the stage's."""
        return float(np.abs(self.colours.numpy()[:-1] - self.truth[:-1]).max())

    def step(self) -> float:
        self.colours.grad.zero_()
        self.loss.zero_()
        tape = wp.Tape()
        with tape:
            self.r.render_device()
            wp.launch(_mse, dim=self.r.image_size, inputs=[self.r.color, self.target, self.scale],
                      outputs=[self.loss], device=self.r.device)  # fmt: skip
        tape.backward(self.loss)
        g = self.colours.grad.numpy()
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * g
        self.v = 0.999 * self.v + 0.001 * g * g
        mh = self.m / (1 - 0.9**self.t)
        vh = self.v / (1 - 0.999**self.t)
        c = self.colours.numpy() - self.lr * mh / (np.sqrt(vh) + 1e-12)
        self.colours.assign(np.maximum(c, 0.0))
        return float(self.loss.numpy()[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scene", nargs="?", default=None, help="a USD stage (default: the bundled one)")
    p.add_argument("--device", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--test", action="store_true", help="short run; exit 1 unless it converges")
    args = p.parse_args(argv)
    path = args.scene or str(Path(__file__).resolve().parents[1] / "assets/default_scene.usda")
    scene = wu.load_stage(path)
    size = (48, 72) if args.test else (240, 360)
    steps = args.steps or (200 if args.test else 300)
    fit = FitMaterial(scene, image_size=size, spp=1 if args.test else 4, device=args.device)
    start = fit.error()
    for i in range(steps):
        loss = fit.step()
        if not args.test and i % 50 == 0:
            print(f"step {i}: loss {loss:.3e}, largest colour error {fit.error():.4f}")
        if fit.error() < 1e-3:
            break
    end = fit.error()
    print(f"largest colour error: {start:.4f} at the start, {end:.4f} after {i + 1} steps")
    if args.test and not end < TEST_TOLERANCE:
        print(f"not converged: {end:.4f} >= {TEST_TOLERANCE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
