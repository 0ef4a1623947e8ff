"""Torch DDP with warpraster: each rank renders its own views, back-propagates, all-reduces.

A mesh (an icosphere with a learnable per-vertex offset) is fitted to target
images of an ellipsoid seen from B views. Each rank takes its share of the views
(:func:`warpraster.distributed.shard_frames`), renders them in one
:func:`warpraster.torch.rasterize_meshes` call, computes a loss on every output
(soft silhouette from ``dists``, depth from ``zbuf``, an attribute interpolated
with ``bary_coords``) and back-propagates; ``DistributedDataParallel`` averages
the gradients over the ranks.

Each rank's loss is ``world_size / B * sum(its view losses)``, so the averaged
gradient is the gradient of the mean loss over all B views: the same as one
process rendering the whole batch. ``--check`` proves it: every rank also
renders all B views in one process and asserts the all-reduced gradients equal
the single-process ones (tolerance: :data:`GRAD_RTOL`).

Run (CPU, gloo)::

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --device cpu --check
    python examples/ddp_train.py --nproc 2 --device cpu --check   # torch.multiprocessing

On GPUs (NCCL, one GPU per rank: ``cuda:<LOCAL_RANK>``)::

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --check
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a checkout: find warpraster beside it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.distributed as dist

import warpraster.torch as wrt
from warpraster.cli import init_warp
from warpraster.distributed import device_for_rank, init_process_group, rank_info, shard_frames
from warpraster.primitives import ico_sphere

GRAD_RTOL = 1e-4
"""``max |g_ddp - g_single| <= GRAD_RTOL * max |g_single|``. Both sides add the
same float32 per-pixel contributions, in another order: each rank sums its own
views, the all-reduce adds the ranks, DDP divides by the world size (and on a
GPU the backward's atomics add in any order). Reassociating n float32 terms
moves a sum by at most ~n * 6e-8 of the sum of their magnitudes; a vertex here
collects at most a few hundred pixel terms, so 1e-4 of the largest gradient
covers it, while one view lost or counted twice moves a gradient by ~1/B of
its size (25% for B = 4)."""

LOSS_RTOL = 1e-5
"""All-reduced loss vs the single-process loss: sums of B float32 view losses in
another order (a relative error of a few float32 ulps)."""


# ----------------------------------------------------------------------------- scene
class Scene:
    """Static data of the fit, identical on every rank: mesh, views, targets.

    Args:
        num_views: B views around the vertical axis.
        image_size: H = W of each view, pixels.
        device: torch device of every tensor.
        level: icosphere subdivision (level 1: 42 vertices, 80 faces).
    """

    def __init__(self, num_views: int, image_size: int, device: str, level: int = 1):
        v, f = ico_sphere(level)
        self.device = torch.device(device)
        self.image_size = int(image_size)
        self.num_views = int(num_views)
        self.base = torch.tensor(v * 0.6, device=self.device)
        self.faces = torch.tensor(f, dtype=torch.int64, device=self.device)
        # a per-vertex attribute interpolated with bary_coords (a height ramp)
        self.attr = (self.base[:, 1] - self.base[:, 1].min()).contiguous()
        angles = torch.arange(self.num_views, dtype=torch.float64) * (2 * math.pi / num_views)
        c, s = torch.cos(angles), torch.sin(angles)
        rot = torch.zeros(self.num_views, 3, 3, dtype=torch.float64)
        rot[:, 0, 0], rot[:, 0, 2], rot[:, 1, 1], rot[:, 2, 0], rot[:, 2, 2] = c, s, 1.0, -s, c
        self.rot = rot.to(torch.float32).to(self.device)
        shift = torch.stack([0.1 * s, 0.05 * c, torch.full_like(c, 2.5)], dim=1)
        self.shift = shift.to(torch.float32).to(self.device)
        self.settings = dict(image_size=self.image_size, faces_per_pixel=4, blur_radius=1e-3)
        self.sigma = 1e-4  # soft-silhouette sharpness (PyTorch3D's default sigma)
        target = self.base * torch.tensor([1.25, 0.8, 1.0], device=self.device)
        with torch.no_grad():
            self.target = self.images(target, range(self.num_views))

    def render(self, verts: torch.Tensor, views) -> tuple:
        """Fragments of ``verts`` (V, 3) seen from ``views`` (indices), one image each."""
        views = torch.as_tensor(list(views), dtype=torch.int64, device=self.device)
        b, nv, nf = views.numel(), self.base.shape[0], self.faces.shape[0]
        # orthographic views: rotate about y, shift, z = depth
        packed = (verts.unsqueeze(0) @ self.rot[views].transpose(1, 2)) + self.shift[views, None]
        faces = self.faces.unsqueeze(0) + nv * torch.arange(b, device=self.device)[:, None, None]
        first = torch.arange(b, device=self.device) * nf
        count = torch.full((b,), nf, dtype=torch.int64, device=self.device)
        frags = wrt.rasterize_meshes(packed.reshape(-1, 3), faces.reshape(-1, 3), first, count,
                                     **self.settings)  # fmt: skip
        return frags, faces.reshape(-1, 3)

    def images(self, verts: torch.Tensor, views) -> dict[str, torch.Tensor]:
        """Soft silhouette (b, H, W), nearest depth and interpolated attribute (b, H, W)."""
        (p2f, zbuf, bary, dists), faces = self.render(verts, views)
        valid = p2f >= 0
        prob = torch.where(valid, torch.sigmoid(-dists / self.sigma), 0.0)
        alpha = 1.0 - torch.prod(1.0 - prob, dim=-1)
        near = valid[..., 0]
        depth = torch.where(near, zbuf[..., 0], 0.0)
        corner_attr = self.attr.repeat(len(views))[faces[p2f[..., 0].clamp(min=0)]]  # (b,H,W,3)
        attr = torch.where(near, (bary[..., 0, :] * corner_attr).sum(-1), 0.0)
        return {"alpha": alpha, "depth": depth, "attr": attr, "near": near}

    def view_losses(self, verts: torch.Tensor, views) -> torch.Tensor:
        """(b,) loss of each view: silhouette, depth and attribute errors (pixel means)."""
        views = list(views)
        img = self.images(verts, views)
        tgt = {k: v[views] for k, v in self.target.items()}
        both = img["near"] & tgt["near"]
        sil = ((img["alpha"] - tgt["alpha"]) ** 2).mean(dim=(1, 2))
        depth = torch.where(both, (img["depth"] - tgt["depth"]) ** 2, 0.0).mean(dim=(1, 2))
        attr = torch.where(both, (img["attr"] - tgt["attr"]) ** 2, 0.0).mean(dim=(1, 2))
        return sil + depth + 10.0 * attr


class MeshFit(torch.nn.Module):
    """The learnable mesh: base icosphere + per-vertex offsets (seeded, identical on every rank)."""

    def __init__(self, scene: Scene, seed: int = 0):
        super().__init__()
        self.scene = scene
        g = torch.Generator().manual_seed(seed)
        init = 0.02 * torch.randn(scene.base.shape, generator=g)
        self.offsets = torch.nn.Parameter(init.to(scene.device))

    def forward(self, views) -> torch.Tensor:
        """(b,) losses of ``views``; for no views, one zero that still depends on the
        parameters (a rank without views must run DDP's forward and backward too)."""
        if len(views) == 0:
            return (self.offsets * 0.0).sum().reshape(1)
        return self.scene.view_losses(self.scene.base + self.offsets, views)


def shard_loss(model: torch.nn.Module, views, num_views: int, world_size: int) -> torch.Tensor:
    """``world_size / B * sum(view losses)``: DDP's average of it over the ranks is the mean
    over all B views. A rank without views still joins the all-reduce (zero gradient)."""
    return model(views).sum() * (world_size / num_views)


def single_process_grad(scene: Scene, seed: int = 0) -> tuple[torch.Tensor, float]:
    """Gradient and value of the mean loss over all views, rendered in one call."""
    model = MeshFit(scene, seed)
    loss = model(range(scene.num_views)).mean()
    loss.backward()
    return model.offsets.grad.detach().clone(), float(loss.detach())


# ----------------------------------------------------------------------------- one rank
def train(args) -> dict:
    """The DDP run of this process (rank from the environment); returns a summary."""
    init_warp(getattr(args, "verbose", False))  # quiet: no banner, no module-load lines
    info = init_process_group(device=_device(args))
    device = _device(args)
    scene = Scene(args.views, args.image_size, device)
    model = MeshFit(scene, args.seed)
    ddp = model
    if dist.is_initialized():
        ids = [torch.device(device).index] if device.startswith("cuda") else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    mine = shard_frames(args.views, info.rank, info.world_size)
    summary = {"rank": info.rank, "world_size": info.world_size, "device": device,
               "views": list(mine)}  # fmt: skip
    for step in range(args.steps):
        opt.zero_grad(set_to_none=False)
        loss = shard_loss(ddp, mine, args.views, info.world_size)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        total = loss.detach() / info.world_size
        if dist.is_initialized():
            dist.all_reduce(total)
        if step == 0:
            summary["grad"] = model.offsets.grad.detach().clone()
            summary["loss"] = float(total)
        opt.step()
        if info.is_main and not args.quiet:
            print(f"step {step}: loss {float(total):.6f}", flush=True)
    summary["final_loss"] = float(total)
    if args.check:
        check(summary, scene, args.seed, info)
    if dist.is_initialized():
        # DDP keeps the replicas equal: every rank ends with rank 0's parameters
        p = model.offsets.detach().clone()
        dist.broadcast(p, 0)
        assert torch.equal(p, model.offsets.detach()), "parameters differ between ranks"
        views = [None] * info.world_size
        dist.all_gather_object(views, summary["views"])
        summary["all_views"] = views
        # Release DDP (its reducer holds the process group) while the group is
        # alive: destroyed afterwards, as the frame unwinds, it could hang a
        # rank at exit under load (seen on a 2-core CPU run).
        del opt
        ddp = None
        dist.barrier()
        dist.destroy_process_group()
    if args.save and info.is_main:
        np.savez(args.save, grad=summary["grad"].cpu().numpy(), loss=summary["loss"],
                 world_size=info.world_size,
                 views=np.array(sum(summary.get("all_views", [summary["views"]]), [])))  # fmt: skip
    return summary


def check(summary: dict, scene: Scene, seed: int, info) -> None:
    """Asserts the all-reduced gradient and loss equal one process's (see GRAD_RTOL)."""
    g_single, loss_single = single_process_grad(scene, seed)
    g_ddp = summary["grad"]
    err = float((g_ddp - g_single).abs().max())
    scale = float(g_single.abs().max())
    ok = err <= GRAD_RTOL * scale and abs(summary["loss"] - loss_single) <= LOSS_RTOL * abs(
        loss_single
    )
    if info.is_main or not ok:
        print(f"check rank {info.rank}/{info.world_size} on {summary['device']}: "
              f"max|g_ddp - g_single| = {err:.3e} (max|g| = {scale:.3e}, tol {GRAD_RTOL:g} "
              f"rel); loss {summary['loss']:.7f} vs {loss_single:.7f} -> "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)  # fmt: skip
    assert scale > 0, "the single-process gradient is zero: the check would prove nothing"
    assert ok, "DDP gradients differ from the single-process gradients"


def _device(args) -> str:
    local_rank = rank_info().local_rank
    if args.device in (None, "auto"):
        return device_for_rank(local_rank)
    if args.device == "cuda":
        return device_for_rank(local_rank, cuda_count=torch.cuda.device_count())
    return device_for_rank(local_rank, device=args.device)


# ----------------------------------------------------------------------------- launch
def _spawned(local_rank: int, world: int, port: int, args) -> None:
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    train(args)


def free_port() -> int:
    """A TCP port free on this machine now (for the rendezvous of spawned ranks)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto",
                   help="auto (cuda:<LOCAL_RANK> when CUDA is present, else cpu), cpu, cuda, "
                        "or a device name")  # fmt: skip
    p.add_argument("--views", type=int, default=4, help="B, views in the whole batch")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true",
                   help="assert the all-reduced gradients equal one process's")  # fmt: skip
    p.add_argument(
        "--nproc",
        type=int,
        default=0,
        help="spawn this many ranks with torch.multiprocessing (not under torchrun)",
    )
    p.add_argument("--save", default=None, help="rank 0 writes the first step's gradient (.npz)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--verbose", action="store_true", help="Warp's start-up and module-load lines")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.nproc > 0 and "RANK" not in os.environ:
        torch.multiprocessing.spawn(_spawned, args=(args.nproc, free_port(), args),
                                    nprocs=args.nproc, join=True)  # fmt: skip
        return 0
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
