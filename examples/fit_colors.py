"""Fit a mesh's vertex colours to target images by gradient descent.

Four cameras look at an icosphere; the targets are rendered with a known
colour pattern; the optimiser starts from grey and recovers the pattern from
the images alone. One step is: tile the colours over the four packed copies of
the mesh (a loop-free kernel, so gradients sum back), render with the Warp
``Renderer`` (soft Phong, one point light), MSE against the targets,
``tape.backward``, a gradient step. With ``--graph`` the whole step is captured
once and replayed (CUDA or cpu).

Run ``python examples/fit_colors.py [--device cuda:0] [--graph] [--test]``;
``--test`` is a short run (small images, few steps) that prints the start and
final losses and fails unless the loss fell by 10x.
"""

from __future__ import annotations

import argparse

import numpy as np
import warp as wp

import warpraster as wr
from warpraster import shading
from warpraster.cli import init_warp
from warpraster.primitives import ico_sphere
from warpraster.renderer import Renderer


@wp.kernel
def _tile(colors: wp.array(dtype=wp.vec3), n_verts: int, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = colors[i % n_verts]


@wp.kernel
def _descend(colors: wp.array(dtype=wp.vec3), grad: wp.array(dtype=wp.vec3), lr: float):
    i = wp.tid()
    colors[i] = colors[i] - lr * grad[i]


class FitColors:
    """step(): forward + backward + update; loss(): the last loss (reads it back)."""

    VIEWS = 4

    def __init__(self, device=None, image_size=64, use_graph=False, lr=None):
        self.device = wp.get_device(device)
        v, f = ico_sphere(2)
        self.n_verts = len(v)
        n = self.VIEWS
        verts = np.concatenate([v] * n).astype(np.float32)
        faces = np.concatenate([f + i * len(v) for i in range(n)]).astype(np.int32)
        R, T = wr.look_at_view_transform(
            dist=2.7, elev=[15.0, -10.0, 30.0, 0.0], azim=[0.0, 90.0, 180.0, 270.0]
        )
        cams = wr.FoVPerspectiveCameras(R=R, T=T, device=self.device)
        sigma = 1e-4
        settings = wr.RasterizationSettings(
            image_size=image_size,
            faces_per_pixel=4,
            blur_radius=float(np.log(1 / 1e-4 - 1) * sigma),
        )
        lights = shading.PointLights(location=(0.0, 2.0, 3.0), device=self.device)
        self.tiled = wp.zeros(len(verts), dtype=wp.vec3, device=self.device, requires_grad=True)
        shader = shading.SoftPhongShader(
            cameras=cams,
            lights=lights,
            device=self.device,
            blend_params=shading.BlendParams(sigma=sigma, gamma=1e-2),
        )
        self.renderer = Renderer(
            cameras=cams,
            raster_settings=settings,
            shader=shader,
            faces=faces,
            mesh_to_face_first_idx=np.arange(n) * len(f),
            num_faces_per_mesh=[len(f)] * n,
            num_verts=len(verts),
            textures=shading.TexturesVertex(self.tiled),
        )
        self.verts = wp.array(verts, dtype=wp.vec3, device=self.device)
        # target: a colour pattern from the vertex positions
        truth = 0.5 + 0.45 * np.stack([v[:, 0], v[:, 1] * v[:, 2] * 2, -v[:, 2]], 1)
        self.truth = np.clip(truth, 0.0, 1.0).astype(np.float32)
        self.colors = wp.array(self.truth, dtype=wp.vec3, device=self.device)
        self._tile_colors()
        out = self.renderer.render(self.verts)
        self.target = wp.clone(out.image)
        # start from grey
        self.colors = wp.full(
            self.n_verts, wp.vec3(0.5), dtype=wp.vec3, device=self.device, requires_grad=True
        )
        self.loss_buf = wp.zeros(1, dtype=wp.float32, device=self.device, requires_grad=True)
        # a pixel sees ~1-2 vertices' colour through the image mean: the MSE
        # gradient per vertex is ~1/(V * 3); scale the step to that
        self.lr = float(lr) if lr is not None else 3.0 * self.n_verts
        self.tape = wp.Tape()
        self.graph = None
        if use_graph:
            self._step_body()  # load every module before capture
            with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
                self._step_body()
            self.graph = cap.graph

    def _tile_colors(self):
        wp.launch(
            _tile,
            dim=self.tiled.shape[0],
            inputs=[self.colors, self.n_verts],
            outputs=[self.tiled],
            device=self.device,
        )

    def _step_body(self):
        self.tape.reset()
        self.loss_buf.zero_()
        with self.tape:
            self._tile_colors()
            self.renderer.render(self.verts)
            self.renderer.image_mse(self.target, out=self.loss_buf)
        self.tape.backward(self.loss_buf)
        wp.launch(
            _descend,
            dim=self.n_verts,
            inputs=[self.colors, self.colors.grad, self.lr],
            device=self.device,
        )

    def step(self):
        if self.graph is not None:
            wp.capture_launch(self.graph)
        else:
            self._step_body()

    def loss(self) -> float:
        return float(self.loss_buf.numpy()[0])

    def colour_error(self) -> float:
        return float(np.abs(self.colors.numpy() - self.truth).mean())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None)
    p.add_argument("--graph", action="store_true", help="capture one step, replay it")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--test", action="store_true", help="short run; fail unless the loss fell 10x")
    p.add_argument("--verbose", action="store_true", help="Warp's start-up and module-load lines")
    args = p.parse_args(argv)
    init_warp(args.verbose)
    if args.test:
        args.steps, args.size = 40, 32
    fit = FitColors(device=args.device, image_size=args.size, use_graph=args.graph)
    fit.step()
    start = fit.loss()
    for _ in range(args.steps - 1):
        fit.step()
    fit.step()
    final = fit.loss()
    print(
        f"loss: start {start:.6g} -> final {final:.6g} ({start / max(final, 1e-30):.1f}x lower); "
        f"mean |colour - truth| {fit.colour_error():.4f}"
    )
    if args.test and not final < 0.1 * start:
        raise SystemExit(f"the loss did not fall 10x: {start} -> {final}")
    return start, final


if __name__ == "__main__":
    main()
