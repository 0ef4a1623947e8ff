"""The renderer suite's torch column: the same scenes through ``warpraster.torch``.

``warpraster bench --suite renderer --torch``: each scene of the renderer suite
is built again from torch tensors (PyTorch3D's classes as ``warpraster.torch``
exports them: ``FoVPerspectiveCameras``, ``PointLights``, ``Materials``,
``SoftPhongShader`` / ``HardPhongShader``, ``TexturesVertex`` /
``TexturesUVMipmap``, ``MeshRenderer``) and timed as a torch user runs it:
``renderer(verts, faces, first, count, textures=...)`` (forward) and that, torch's
MSE against a target and ``loss.backward()`` (forward + backward, the leaves'
gradients set to None first, as a training loop's ``zero_grad()`` does),
eagerly from Python, medians of ``--runs`` after warm-up (CUDA events on a GPU,
the wall clock on the CPU), twice, alternated call by call: with the op's slots
launching their kernels one by one (``torch f`` / ``torch f+b``) and with the
slots replaying their captured graphs (``RenderContext.call_graphs``: ``torch g
f`` / ``torch g f+b``). Needs torch; the scenes' arrays are
:func:`warpraster.bench.renderer._scene`'s, so every column renders the same
geometry, textures and camera.
"""

from __future__ import annotations

import statistics

import numpy as np

from ..camera import look_at_view_transform
from .torch_timing import torch_timer

__all__ = ["make_torch_scene", "mse_loss", "run_torch_scene"]


def mse_loss(image, target):
    """The torch step's loss: torch's fused MSE (``torch.nn.functional.mse_loss``, one
    autograd node), as the Warp step's ``image_mse`` is one fused loss. Written out as
    ``((image - target) ** 2).mean()`` it is three nodes, each with its backward:
    ~35 us more host time a step on this project's CPU (16x16 image)."""
    import torch

    return torch.nn.functional.mse_loss(image, target)


def torch_device(device: str):
    """The torch device of a Warp device name (``cuda:0`` / ``cpu``)."""
    import torch

    if device.startswith("cuda"):
        return torch.device("cuda", int(device.split(":")[1]) if ":" in device else 0)
    return torch.device("cpu")


def make_torch_scene(name: str, dev) -> tuple:
    """Scene ``name`` of the renderer suite from torch tensors on torch device ``dev``:
    (renderer, call arguments, textures, trainable leaves by name)."""
    import torch

    import warpraster.torch as wrt

    from .renderer import _scene

    verts, faces, first, count, uvs, colors = _scene()
    n = len(first)
    aa = name.endswith("_aa")
    name = name.removesuffix("_aa")
    camgrad = name.endswith("_camgrad")
    R, T = look_at_view_transform(dist=2.7, elev=10.0, azim=20.0)
    R = torch.tensor(np.repeat(R, n, 0), device=dev, requires_grad=camgrad)
    T = torch.tensor(np.repeat(T, n, 0), device=dev, requires_grad=camgrad)
    cams = wrt.FoVPerspectiveCameras(R=R, T=T, device=dev)
    lights = wrt.PointLights(location=((1.0, 2.0, 3.0),), device=dev)
    materials = wrt.Materials(device=dev)
    v = torch.tensor(verts, device=dev, requires_grad=True)
    f = torch.tensor(faces, device=dev)
    fi = torch.tensor(first, device=dev)
    cn = torch.tensor(count, device=dev)
    if name.startswith("softphong"):
        sigma = 1e-4
        blur = 0.0
        if name.removesuffix("_camgrad").endswith("_blur"):
            blur = float(np.log(1.0 / 1e-4 - 1.0) * sigma)
        settings = wrt.RasterizationSettings(image_size=512, faces_per_pixel=8, blur_radius=blur)
        blend = wrt.BlendParams(sigma=sigma, gamma=1e-4)
        shader = wrt.SoftPhongShader(device=dev, cameras=cams, lights=lights, materials=materials,
                                     blend_params=blend)  # fmt: skip
        leaf = torch.tensor(colors, device=dev, requires_grad=True)
        textures = wrt.TexturesVertex(leaf)
    else:
        settings = wrt.RasterizationSettings(image_size=512, faces_per_pixel=1)
        shader = wrt.HardPhongShader(device=dev, cameras=cams, lights=lights, materials=materials)
        rng = np.random.default_rng(1)
        leaf = torch.tensor(rng.uniform(0.0, 1.0, (n, 1024, 1024, 3)).astype(np.float32),
                            device=dev, requires_grad=True)  # fmt: skip
        textures = wrt.TexturesUVMipmap(leaf, f, torch.tensor(uvs, device=dev),
                                        filter_mode="linear-mipmap-linear")  # fmt: skip
    renderer = wrt.MeshRenderer(rasterizer=wrt.MeshRasterizer(cameras=cams,
                                                              raster_settings=settings),
                                shader=shader, antialias=aa)  # fmt: skip
    leaves = {"verts": v, "textures": leaf}
    if camgrad:
        leaves.update(R=R, T=T)
    return renderer, (v, f, fi, cn), textures, leaves


def run_torch_scene(name: str, device: str, runs: int) -> dict:
    """Forward and forward + backward medians (ms) of scene ``name`` through the
    torch ``MeshRenderer`` on ``device`` (a Warp device name: ``cuda:0`` / ``cpu``),
    the op's slots launching eagerly and replaying graphs, alternated."""
    import torch

    from ..torch.render_context import default_render_context

    dev = torch_device(device)
    renderer, args, textures, leaves = make_torch_scene(name, dev)
    with torch.no_grad():
        target = renderer(*args, textures=textures) * 0.9

    def forward():
        with torch.no_grad():
            renderer(*args, textures=textures)

    def forward_backward():
        for leaf in leaves.values():  # a training loop's zero_grad() (set_to_none)
            leaf.grad = None
        img = renderer(*args, textures=textures)
        mse_loss(img, target).backward()

    ctx = default_render_context()
    before = ctx.call_graphs
    timed = torch_timer(dev)
    modes = {"": False, "_graph": None}  # None: graphs where graphs_enabled allows them
    times = {f"torch{m}_{k}": [] for m in modes for k in ("fwd_ms", "fwd_bwd_ms")}
    try:
        for mode in modes.values():  # warm-up: modules, the context, the graphs
            ctx.call_graphs = mode
            for _ in range(3):
                forward()
                forward_backward()
        for _ in range(runs):
            for m, mode in modes.items():
                ctx.call_graphs = mode
                times[f"torch{m}_fwd_ms"].append(timed(forward))
                times[f"torch{m}_fwd_bwd_ms"].append(timed(forward_backward))
    finally:
        ctx.call_graphs = before
    return {"name": name, **{k: statistics.median(v) for k, v in times.items()}}


def profile_torch_scene(name: str, device: str) -> None:
    """``--torch --profile``: scene ``name``'s torch training step profiled beside the
    Warp-native eager step (:func:`~warpraster.bench.torch_profile.print_profile`)."""
    import torch
    import warp as wp

    from .renderer import loss_step, make_renderer
    from .torch_profile import print_profile

    dev = torch_device(device)
    renderer, args, textures, leaves = make_torch_scene(name, dev)
    with torch.no_grad():
        target = renderer(*args, textures=textures) * 0.9

    def torch_step():
        for leaf in leaves.values():
            leaf.grad = None
        mse_loss(renderer(*args, textures=textures), target).backward()

    for _ in range(3):  # warm-up: the context's slots and graphs
        torch_step()
    r, verts = make_renderer(name, device, channels=())
    out = r.render(verts)
    warp_target = wp.array(out.image.numpy() * 0.9, dtype=wp.float32, device=device)
    loss = wp.zeros(1, dtype=wp.float32, device=device, requires_grad=True)
    print_profile(name, torch_step, loss_step(r, verts, warp_target, loss), device)
