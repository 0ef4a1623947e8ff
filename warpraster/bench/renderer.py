"""The renderer suite: rasterize + shade + blend, forward and forward + backward.

``warpraster bench --suite renderer [--device cuda:0] [--runs 20]`` (also
``python -m warpraster.bench --suite renderer``).

Two scenes, generated in code, seen by one perspective camera per image:

* ``softphong_ico5x8_512_k8``: 8 icospheres of 20,480 faces, 512², K = 8, blur
  for sigma 1e-4, ``SoftPhongShader`` (softmax blend), a point light, per-vertex
  colours;
* ``hardphong_mip1024_ico5x8_512_k1``: the same geometry, K = 1,
  ``HardPhongShader`` with a 1024² UV texture sampled linear-mipmap-linear
  (``TexturesUVMipmap``, spherical UVs); ``..._aa``: its image antialiased
  (``Renderer(antialias=True)``), as nvdiffrast's pipeline (``--nvdiffrast``) is.

Each is timed as the :class:`~warpraster.renderer.Renderer` call alone
(forward) and as render + image MSE (:meth:`Renderer.image_mse`, fused into the
shading adjoint) + ``tape.backward`` (forward + backward), eagerly and replayed
from a captured graph (``unfused``: graph forward + backward with
:func:`~warpraster.shading.image_mse` instead); medians of ``--runs`` after warm-up
(CUDA events on a GPU, wall clock on the CPU); by default once with the image
alone (as the anchors, which produce only colour) and once with the extra
channels (depth, normals, face and mesh ids, ``+channels``). ``MB``: the device
memory of every array the renderer holds (raster workspace, fragments,
shading buffers, textures and their mip levels, outputs, and all their
gradient buffers; :func:`owned_bytes`; not the loss target it refers to),
after a forward + backward.
"""

from __future__ import annotations

import json
import statistics

import numpy as np
import warp as wp

from ..camera import FoVPerspectiveCameras, look_at_view_transform
from ..primitives import ico_sphere
from ..rasterizer import RasterizationSettings
from ..renderer import CHANNELS, Renderer
from ..shading import (
    BlendParams,
    HardPhongShader,
    Materials,
    PointLights,
    SoftPhongShader,
    TexturesUVMipmap,
    TexturesVertex,
)
from ..shading.reductions import image_mse
from ..timing import timer
from .scenes import RENDERER_TARGETS

__all__ = ["loss_step", "make_renderer", "owned_bytes", "run", "run_scene"]


def _scene(copies: int = 8, level: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    v, f = ico_sphere(level)
    verts = np.concatenate([v * 0.8 + rng.uniform(-0.15, 0.15, 3) for _ in range(copies)])
    faces = np.concatenate([f + i * len(v) for i in range(copies)]).astype(np.int32)
    first = np.arange(copies, dtype=np.int32) * len(f)
    count = np.full(copies, len(f), np.int32)
    # spherical UVs of the unit sphere, per vertex (faces_uvs = faces)
    uv = np.stack([0.5 + np.arctan2(v[:, 2], v[:, 0]) / (2 * np.pi),
                   0.5 + np.arcsin(np.clip(v[:, 1], -1, 1)) / np.pi], 1)  # fmt: skip
    uvs = np.tile(uv, (copies, 1)).astype(np.float32)
    colors = rng.uniform(0.2, 1.0, (len(verts), 3)).astype(np.float32)
    return verts.astype(np.float32), faces, first, count, uvs, colors


def make_renderer(name: str, device, channels=CHANNELS) -> tuple[Renderer, wp.array]:
    """The renderer and vertex array of a benchmark scene (``channels``: the extra
    channels it writes beside the image)."""
    verts, faces, first, count, uvs, colors = _scene()
    n = len(first)
    aa = name.endswith("_aa")  # the hard image antialiased (nvdiffrast's pipeline has it)
    name = name.removesuffix("_aa")
    camgrad = name.endswith("_camgrad")  # the cameras' R, T, fov and aspect ratio trainable
    R, T = look_at_view_transform(dist=2.7, elev=10.0, azim=20.0)
    cams = FoVPerspectiveCameras(R=np.repeat(R, n, 0), T=np.repeat(T, n, 0), device=device,
                                 requires_grad=camgrad)  # fmt: skip
    lights = PointLights(location=((1.0, 2.0, 3.0),), device=device)
    materials = Materials(device=device)
    if name.startswith("softphong"):
        sigma = 1e-4
        blur = 0.0
        if name.removesuffix("_camgrad").endswith("_blur"):
            blur = float(np.log(1.0 / 1e-4 - 1.0) * sigma)  # SoftRas's rule, as PyTorch3D's docs
        settings = RasterizationSettings(image_size=512, faces_per_pixel=8, blur_radius=blur)
        shader = SoftPhongShader(cameras=cams, lights=lights, materials=materials,
                                 blend_params=BlendParams(sigma=sigma, gamma=1e-4))  # fmt: skip
        textures = TexturesVertex(colors, device=device, requires_grad=True)
    else:
        settings = RasterizationSettings(image_size=512, faces_per_pixel=1)
        shader = HardPhongShader(cameras=cams, lights=lights, materials=materials)
        rng = np.random.default_rng(1)
        maps = rng.uniform(0.0, 1.0, (n, 1024, 1024, 3)).astype(np.float32)
        textures = TexturesUVMipmap(maps, faces, uvs, filter_mode="linear-mipmap-linear",
                                    device=device, requires_grad=True)  # fmt: skip
    r = Renderer(cameras=cams, raster_settings=settings, shader=shader, faces=faces,
                 mesh_to_face_first_idx=first, num_faces_per_mesh=count, num_verts=len(verts),
                 textures=textures, channels=channels, device=device,
                 antialias=aa)  # fmt: skip
    return r, wp.array(verts, dtype=wp.vec3, device=device, requires_grad=True)


def loss_step(
    r: Renderer, verts: wp.array, target: wp.array, loss: wp.array, fused=True, zero=False
):
    """The timed forward + backward: a render, its image MSE against ``target``
    into ``loss`` (zeroed first) and ``tape.backward``, on a fresh tape. The MSE
    is :meth:`Renderer.image_mse` (its gradient computed inside the shading
    adjoint), or with ``fused=False`` :func:`~warpraster.shading.image_mse`
    (whose backward writes the image gradient the adjoint reads). ``zero``:
    ``tape.zero()`` before the backward, as a training loop clears the
    gradients of the previous step."""

    def step():
        loss.zero_()
        tape = wp.Tape()
        with tape:
            o = r.render(verts)
            if fused:
                r.image_mse(target, out=loss)
            else:
                image_mse(o.image, target, out=loss)
        if zero:
            tape.zero()
        tape.backward(loss)

    return step


def owned_bytes(*roots, exclude=()) -> int:
    """Device memory held by the Warp arrays reachable from ``roots`` through
    warpraster objects, struct fields, containers and ``.grad``: each allocation
    counted once (views, which own nothing, are not counted), the arrays of
    ``exclude`` (and their gradients) not at all (e.g. a loss target the
    renderer refers to but does not own)."""
    total = 0
    seen: set = {id(x) for a in exclude for x in (a, a.grad) if x is not None}
    owners: set = set()
    stack = list(roots)
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen or isinstance(o, (str, bytes, int, float, bool)):
            continue
        seen.add(id(o))
        if isinstance(o, wp.array):
            if o.deleter is not None and o.ptr is not None and o.ptr not in owners:
                owners.add(o.ptr)
                total += o.capacity
            stack.append(o.grad)
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif hasattr(o, "_cls") and hasattr(o._cls, "vars"):  # a wp.struct instance
            stack.extend(getattr(o, name) for name in o._cls.vars)
        elif type(o).__module__.startswith("warpraster") and hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
    return total


def run_scene(name: str, device, runs: int, channels=CHANNELS) -> dict:
    r, verts = make_renderer(name, device, channels)
    out = r.render(verts)
    target = wp.array(out.image.numpy() * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)

    def forward():
        r.render(verts)

    forward_backward = loss_step(r, verts, target, loss)
    unfused = loss_step(r, verts, target, loss, fused=False)
    timed = timer(device)
    forward_backward()  # warm-up: loads every module
    unfused()
    fwd = statistics.median(timed(forward) for _ in range(runs))
    both = statistics.median(timed(forward_backward) for _ in range(runs))
    graph_fwd = graph_both = graph_unfused = None
    if device.is_cuda:
        graphs = []
        for fn in (forward, forward_backward, unfused):
            with wp.ScopedCapture(device=device, force_module_load=False) as cap:
                fn()
            graphs.append(cap.graph)
        graph_fwd, graph_both, graph_unfused = (
            statistics.median(timed(lambda g=g: wp.capture_launch(g)) for _ in range(runs))
            for g in graphs
        )
    o = r.outputs[0]
    nbytes = sum(a.capacity for a in (o.image, o.depth, o.normals, o.face_ids, o.mesh_ids)
                 if a is not None)  # fmt: skip
    covered = o.fragments.pix_to_face.numpy()[..., 0] >= 0
    return {"name": name, "fwd_ms": fwd, "fwd_bwd_ms": both, "graph_fwd_ms": graph_fwd,
            "graph_fwd_bwd_ms": graph_both, "graph_unfused_ms": graph_unfused,
            "image_mb": nbytes / 2**20,
            "renderer_mb": owned_bytes(r, exclude=[target, loss]) / 2**20,
            "coverage": float(covered.mean()), "_renderer": r}  # fmt: skip


def run(args, argv: list[str]) -> int:
    """The suite for the parsed options ``args``."""
    rows = []
    device = wp.get_device(args.device)
    names = list(RENDERER_TARGETS) if not args.scenes else args.scenes.split(",")
    print(f"warpraster bench --suite renderer on {device} ({getattr(device, 'name', '')})")
    torch_cols = getattr(args, "torch", False)
    nvdr_cols = getattr(args, "nvdiffrast", False)
    print(f"{'scene':<44}{'fwd ms':>9}{'f+b ms':>9}{'graph f':>9}{'graph f+b':>10}"
          f"{'unfused':>9}{'target f / f+b':>16}{'cover':>7}{'MB':>8}"
          + (f"{'torch f':>9}{'torch f+b':>10}{'torch g f':>10}{'g f+b':>9}"
             if torch_cols else "")
          + (f"{'nvdr f':>9}{'nvdr f+b':>10}{'agree':>7}" if nvdr_cols else ""))  # fmt: skip
    variants = {"none": [()], "all": [CHANNELS], "both": [(), CHANNELS]}[args.channels]
    for name in names:
        for channels in variants:
            row = run_scene(name, device, args.runs, channels)
            renderer = row.pop("_renderer")
            rows.append(row)
            row["channels"] = bool(channels)
            tf, tb = RENDERER_TARGETS.get(name, (None, None))
            g = (f"{row['graph_fwd_ms']:>9.3f}{row['graph_fwd_bwd_ms']:>10.3f}"
                 f"{row['graph_unfused_ms']:>9.3f}"
                 if row["graph_fwd_ms"] is not None else f"{'-':>9}{'-':>10}{'-':>9}")  # fmt: skip
            label = name + (" +channels" if channels else "")
            t = ""
            if torch_cols and not channels:  # the torch renderer returns the image alone
                from .torch_renderer import run_torch_scene  # noqa: PLC0415 - needs torch

                row.update(run_torch_scene(name, str(device), args.runs))
                t = (
                    f"{row['torch_fwd_ms']:>9.3f}{row['torch_fwd_bwd_ms']:>10.3f}"
                    f"{row['torch_graph_fwd_ms']:>10.3f}{row['torch_graph_fwd_bwd_ms']:>9.3f}"
                )
            if nvdr_cols and not channels:
                from .nvdiffrast_pipeline import run_nvdiffrast_scene  # noqa: PLC0415

                nv = run_nvdiffrast_scene(name, device, args.runs, renderer)
                row.update(nv)
                cells = f"{'-':>9}{'-':>10}{'-':>7}"
                if nv:
                    cells = (f"{nv['nv_fwd_ms']:>9.3f}{nv['nv_fwd_bwd_ms']:>10.3f}"
                             f"{nv['nv_face_agree']:>7.3f}")  # fmt: skip
                t += cells
            print(f"{label:<44}{row['fwd_ms']:>9.3f}{row['fwd_bwd_ms']:>9.3f}{g}"
                  f"{f'{tf} / {tb}':>16}{row['coverage']:>7.2f}{row['renderer_mb']:>8.0f}{t}",
                  flush=True)  # fmt: skip
            if torch_cols and not channels and getattr(args, "profile", False):
                from .torch_renderer import profile_torch_scene  # noqa: PLC0415

                profile_torch_scene(name, str(device))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0
