"""The renderer suite's nvdiffrast columns: the textured K = 1 scene as nvdiffrast draws it.

``warpraster bench --suite renderer --nvdiffrast`` (needs torch and nvdiffrast
on a CUDA device): the ``hardphong_mip1024_ico5x8_512_k1`` scene's world
vertices, UVs, vertex colours and 1024² maps go through nvdiffrast's pipeline,
``rasterize`` + ``interpolate`` (UVs with their screen derivatives, colours) +
``texture`` (linear-mipmap-linear, the pyramid built per call as ours is) +
``antialias`` (its topology hash built once), with the same camera matrix
(PyTorch3D's world -> NDC, mapped to nvdiffrast's clip space: x and y flipped,
z into [-1, 1]); forward, and forward + MSE + backward with autograd; eager (its
ops are not graph-capturable), medians of ``--runs`` after warm-up, CUDA events.
The fraction of pixels where both renderers show the same face is reported.
nvdiffrast's lighting is not the Phong shader's (texture x vertex colour here):
the columns compare the work of the pipelines, not their pictures.
"""

from __future__ import annotations

import statistics

import numpy as np

from ..camera import FoVPerspectiveCameras, look_at_view_transform
from .torch_timing import torch_timer

__all__ = ["run_nvdiffrast_scene"]


def run_nvdiffrast_scene(name: str, device, runs: int, renderer=None) -> dict:
    """nvdiffrast's forward and forward + backward medians (ms) on scene ``name``
    (the textured K = 1 scene; others return {}); ``renderer``: our renderer of the
    scene, for the face agreement."""
    if not name.startswith("hardphong_mip") or "camgrad" in name:
        return {}
    import nvdiffrast.torch as dr
    import torch

    from .renderer import _scene

    tdev = torch.device(str(device))
    ctx = dr.RasterizeCudaContext(device=tdev)
    verts, faces, first, count, uvs, colors = _scene()
    n, nf = len(first), int(count[0])
    nv = len(verts) // n
    R, T = look_at_view_transform(dist=2.7, elev=10.0, azim=20.0)
    cams = FoVPerspectiveCameras(R=np.repeat(R, n, 0), T=np.repeat(T, n, 0), device=device)
    m = (np.asarray(cams.get_world_to_view_matrix())[0].astype(np.float64)
         @ np.asarray(cams.get_view_to_ndc_matrix())[0].astype(np.float64))  # fmt: skip
    # PyTorch3D NDC (+x left, +y up, z = depth) -> nvdiffrast clip (row 0 at y = -1)
    flip = np.array([[-1, 0, 0, 0], [0, -1, 0, 0], [0, 0, 2, 0], [0, 0, -1, 1]], np.float64)
    mc = torch.from_numpy((m @ flip).astype(np.float32)).to(tdev)
    maps = np.random.default_rng(1).uniform(0.0, 1.0, (n, 1024, 1024, 3)).astype(np.float32)
    vt = torch.from_numpy(verts.reshape(n, nv, 3).copy()).to(tdev).requires_grad_(True)
    tex = torch.from_numpy(maps).to(tdev).requires_grad_(True)
    uv_t = torch.from_numpy(np.ascontiguousarray(uvs[:nv]))[None].to(tdev)
    col_t = torch.from_numpy(colors.reshape(n, nv, 3).copy()).to(tdev)
    tri = torch.from_numpy(np.ascontiguousarray(faces[:nf])).to(tdev, torch.int32)
    topo = dr.antialias_construct_topology_hash(tri)
    bg = torch.zeros((), device=tdev)

    def pipe():
        pos = torch.nn.functional.pad(vt, (0, 1), value=1.0) @ mc
        rast, rast_db = dr.rasterize(ctx, pos, tri, (512, 512))
        uv, uv_da = dr.interpolate(uv_t, rast, tri, rast_db=rast_db, diff_attrs="all")
        col, _ = dr.interpolate(col_t, rast, tri)
        t = dr.texture(tex, uv, uv_da, filter_mode="linear-mipmap-linear")
        img = torch.where(rast[..., 3:] > 0, t * col, bg)
        return dr.antialias(img, rast, pos, tri, topology_hash=topo), rast

    with torch.no_grad():
        img0, rast0 = pipe()
        target = img0 * 0.9

    def forward():
        with torch.no_grad():
            pipe()

    def forward_backward():
        vt.grad = None
        tex.grad = None
        img, _ = pipe()
        ((img - target) ** 2).mean().backward()

    timed = torch_timer(tdev)

    for _ in range(3):
        forward()
        forward_backward()
    row = {
        "nv_fwd_ms": statistics.median(timed(forward) for _ in range(runs)),
        "nv_fwd_bwd_ms": statistics.median(timed(forward_backward) for _ in range(runs)),
    }
    if renderer is not None:
        ids = rast0[..., 3].cpu().numpy().astype(np.int64) - 1
        p2f = renderer.outputs[0].fragments.pix_to_face.numpy()[..., 0]
        local = np.where(p2f >= 0, p2f - first[:, None, None], -1)
        row["nv_face_agree"] = float((local == ids).mean())
    return row
