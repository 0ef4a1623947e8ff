"""The USD stage renderer through torch: its parameters as tensors, its picture with autograd.

``usd.StageRenderer(..., requires_grad=True)`` owns its scene on the device
(points, per-mesh transforms, the material table and texel atlas, lights,
camera). Here those arrays are seen as torch tensors that share their memory
(:func:`stage_parameters`: an optimiser stepping them changes what the next
render reads), and :func:`render_stage` renders the current frame as a torch
``(H, W, 4)`` image whose backward runs the renderer's own adjoint (recorded on
a private ``wp.Tape``, as the other torch ops) and returns each parameter's
gradient to autograd.

An ``autograd.Function`` (the renderer is a Python object holding device
state): not a ``torch.library`` op, so ``torch.compile(fullgraph=True)`` does not
trace it.
"""

from __future__ import annotations

import torch
import warp as wp

from ..grad_buffers import clear_owned_grads
from .eager import first_order_only
from .streams import _TorchStream

__all__ = ["render_stage", "stage_parameters"]


def _named_arrays(renderer) -> dict[str, wp.array]:
    b = renderer.buffers
    cams = renderer.cameras
    named = {
        "points": b.verts,
        "mesh_xform": b.mesh_xform,
        "diffuse": b.atlas.diffuse,
        "opacity": b.atlas.opacity,
        "texels": b.atlas.texels,
        "specular": b.materials.specular_color,
        "shininess": b.materials.shininess,
        "light_param": b.lights.param,
        "light_color": b.lights.diffuse_color,
        "light_ambient": b.lights.ambient_color,
        "camera_R": cams.R,
        "camera_T": cams.T,
    }
    return {k: a for k, a in named.items() if a is not None and a.grad is not None}


def stage_parameters(renderer) -> dict[str, torch.Tensor]:
    """The trainable arrays of ``renderer`` (made with ``requires_grad=True``) as torch
    leaf tensors sharing their memory (float32, the Warp vector types as a last
    dimension): ``points``, ``mesh_xform``, ``diffuse``, ``opacity``, ``texels``,
    ``specular``, ``shininess``, ``light_param``, ``light_color``, ``light_ambient``,
    ``camera_R``, ``camera_T``. Pass them (all, in this order) to
    :func:`render_stage`; their ``.grad`` is torch's own.

    Raises:
        ValueError: the renderer was made without ``requires_grad=True``.
    """
    if not getattr(renderer, "requires_grad", False):
        raise ValueError(
            "renderer: make the StageRenderer with requires_grad=True to train its parameters"
        )
    out = {}
    for name, arr in _named_arrays(renderer).items():
        t = wp.to_torch(arr, requires_grad=False).detach()
        t.requires_grad_(True)
        out[name] = t
    return out


class _RenderStage(torch.autograd.Function):
    @staticmethod
    def forward(ctx, renderer, names, *params):
        arrays = _named_arrays(renderer)
        for name, t in zip(names, params, strict=True):
            if t.data_ptr() != arrays[name].ptr:
                raise ValueError(
                    f"params: {name} is not the renderer's own tensor (use stage_parameters)"
                )
        device = params[0].device if params else torch.device(str(renderer.device))
        with _TorchStream(device):
            tape = wp.Tape()
            with tape:
                renderer.render_device()
            image = (
                wp.to_torch(renderer.color, requires_grad=False)
                .reshape(*renderer.color.shape, 4)
                .clone()
            )  # the renderer's buffer is rewritten by its next render
        ctx.renderer, ctx.names, ctx.tape = renderer, names, tape
        # saved for torch's version check: the adjoint reads the parameters' memory
        # when it runs, so one changed in place before the backward (an optimiser
        # step) would give the gradient at another point: torch raises instead
        ctx.save_for_backward(*params)
        return image

    @staticmethod
    @first_order_only
    def backward(ctx, grad_image):
        renderer, names, tape = ctx.renderer, ctx.names, ctx.tape
        ctx.saved_tensors  # noqa: B018 - raises if a parameter changed in place since
        arrays = _named_arrays(renderer)
        device = grad_image.device
        with _TorchStream(device):
            # the parameters' gradients are returned to autograd, which accumulates
            # them itself: the Warp side starts from zero for this backward
            clear_owned_grads(*(arrays[n] for n in names))
            color_grad = wp.to_torch(renderer.color.grad, requires_grad=False)
            color_grad.copy_(grad_image.reshape(color_grad.shape))
            try:
                tape.backward()
            except ValueError as e:
                if "rendered again" not in str(e):
                    raise
                raise ValueError(
                    "render_stage: the renderer rendered again before this render's "
                    "backward ran (its buffers hold one render): call backward before "
                    "the next render_stage, or use one StageRenderer per render"
                ) from e
            grads = [wp.to_torch(arrays[n].grad, requires_grad=False).clone() for n in names]
            tape.reset()
        return (None, None, *grads)


def render_stage(renderer, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The current frame of ``renderer`` as a ``(H, W, 4)`` float32 tensor (linear RGB,
    straight alpha), differentiable with respect to ``params``
    (:func:`stage_parameters`).

    Example::

        r = warpraster.usd.StageRenderer(scene, image_size=(120, 160), requires_grad=True)
        params = stage_parameters(r)
        opt = torch.optim.Adam([params["diffuse"]], lr=0.05)
        for _ in range(100):
            opt.zero_grad()
            loss = ((render_stage(r, params) - target) ** 2).mean()
            loss.backward()
            opt.step()  # writes the renderer's own memory
    """
    names = tuple(params)
    return _RenderStage.apply(renderer, names, *params.values())
