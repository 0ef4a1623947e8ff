"""The renderer suite's torch column: the same scenes through ``warpraster.torch``.

``warpraster bench --suite renderer --torch``: each scene of the renderer suite
is built again from torch tensors (PyTorch3D's classes as ``warpraster.torch``
exports them: ``FoVPerspectiveCameras``, ``PointLights``, ``Materials``,
``SoftPhongShader`` / ``HardPhongShader``, ``TexturesVertex`` /
``TexturesUVMipmap``, ``MeshRenderer``) and timed as a torch user runs it:
``renderer(verts, faces, first, count, textures=...)`` (forward) and that, an
MSE against a target in torch and ``loss.backward()`` (forward + backward),
eagerly (torch has no graph of the op), medians of ``--runs`` after warm-up
(CUDA events on a GPU, the wall clock on the CPU). Needs torch; the scenes'
arrays are :func:`warpraster.bench.renderer._scene`'s, so both columns render
the same geometry, textures and camera.
"""

from __future__ import annotations

import statistics

import numpy as np

from ..camera import look_at_view_transform
from .torch_timing import torch_timer

__all__ = ["run_torch_scene"]


def run_torch_scene(name: str, device: str, runs: int) -> dict:
    """Forward and forward + backward medians (ms) of scene ``name`` through the
    torch ``MeshRenderer`` on ``device`` (a Warp device name: ``cuda:0`` / ``cpu``)."""
    import torch

    import warpraster.torch as wrt

    from .renderer import _scene

    dev = torch.device("cuda", int(device.split(":")[1]) if ":" in device else 0) \
        if device.startswith("cuda") else torch.device("cpu")  # fmt: skip
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
        textures = wrt.TexturesVertex(torch.tensor(colors, device=dev, requires_grad=True))
    else:
        settings = wrt.RasterizationSettings(image_size=512, faces_per_pixel=1)
        shader = wrt.HardPhongShader(device=dev, cameras=cams, lights=lights, materials=materials)
        rng = np.random.default_rng(1)
        maps = torch.tensor(rng.uniform(0.0, 1.0, (n, 1024, 1024, 3)).astype(np.float32),
                            device=dev, requires_grad=True)  # fmt: skip
        textures = wrt.TexturesUVMipmap(maps, f, torch.tensor(uvs, device=dev),
                                        filter_mode="linear-mipmap-linear")  # fmt: skip
    renderer = wrt.MeshRenderer(rasterizer=wrt.MeshRasterizer(cameras=cams,
                                                              raster_settings=settings),
                                shader=shader, antialias=aa)  # fmt: skip
    with torch.no_grad():
        target = renderer(v, f, fi, cn, textures=textures) * 0.9

    def forward():
        with torch.no_grad():
            renderer(v, f, fi, cn, textures=textures)

    def forward_backward():
        img = renderer(v, f, fi, cn, textures=textures)
        loss = ((img - target) ** 2).mean()
        loss.backward()

    timed = torch_timer(dev)
    for _ in range(3):  # warm-up: modules, the op's persistent context
        forward()
        forward_backward()
    fwd = statistics.median(timed(forward) for _ in range(runs))
    both = statistics.median(timed(forward_backward) for _ in range(runs))
    return {"name": name, "torch_fwd_ms": fwd, "torch_fwd_bwd_ms": both}
