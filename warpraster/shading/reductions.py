"""Loss-ready images from fragments, with correct gradients on the ``wp.Tape``.

Why this module exists: a user kernel that loops over the K slots of a pixel
and is recorded on a tape gets *wrong* gradients from Warp's generated adjoint
(a loop whose trip count is a kernel argument is not replayed correctly: 27-130 %
errors measured, see WARP-NOTES). Every image here is either loop-free (one
thread per pixel reading slot 0, or per slot) and differentiated by Warp, or
built from the soft blends of :mod:`warpraster.shading.blending`, whose K loops
have hand-written adjoints registered with ``tape.record_func``:

* :func:`soft_silhouette` / coverage: ``1 - prod_k (1 - sigmoid(-d_k / sigma))``
  (hand-written adjoint: the sigmoid blend's);
* :func:`soft_depth`: the softmax blend (PyTorch3D's weights) of the slot
  depths: a loop-free kernel writes each slot's depth as a colour, the blend's
  hand-written adjoint does the K loop, and the tape chains the two;
* :func:`hard_depth`: depth of the nearest face, a background value elsewhere
  (loop-free);
* :func:`image_mse`: ``mean((image - target)^2)`` accumulated with atomics into
  4096 partial sums, then into the loss (loop-free; Warp's adjoint of
  ``atomic_add`` is exact).

Unsafe, for the record: writing your own ``for k in range(K)`` accumulation in a
kernel launched on a tape; reusing one output array for two recorded calls (the
tape needs the first values); reductions written as ``loss[0] = loss[0] + v``
(races on the GPU). Every function takes preallocated outputs (``out=``) so a
render + loss + backward can be captured in one graph.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from .blending import (
    BlendParams,
    check_fragments,
    launch_sigmoid_blend,
    launch_softmax_blend,
)
from .params import scalar_param

wp.set_module_options({"fuse_fp": False})

__all__ = ["hard_depth", "image_mse", "make_scratch", "soft_depth", "soft_silhouette"]


@wp.kernel
def _channel(
    # Data in:
    image: wp.array4d(dtype=wp.float32),
    c: int,
    # Data out:
    out: wp.array3d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    out[n, y, x] = image[n, y, x, c]


@wp.kernel
def _depth_as_colour(
    # Data in:
    zbuf: wp.array4d(dtype=wp.float32),
    # Data out:
    colors_out: wp.array4d(dtype=wp.vec3),
):
    n, y, x, k = wp.tid()
    z = zbuf[n, y, x, k]
    colors_out[n, y, x, k] = wp.vec3(z, z, z)


@wp.kernel
def _hard_depth(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=wp.float32),
    background: float,
    # Data out:
    out: wp.array3d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    d = background
    if pix_to_face[n, y, x, 0] >= 0:
        d = zbuf[n, y, x, 0]
    out[n, y, x] = d


#: Partial sums of :func:`image_mse`: one atomic target per 4096 threads' worth of
#: slots instead of one for all (8M float atomics on one address took 14.7 ms on
#: an H200; spread over 4096 addresses they cost ~0.05 ms).
MSE_PARTIALS = 4096


@wp.kernel
def _squared_error(
    # Data in:
    image: wp.array4d(dtype=wp.float32),
    target: wp.array4d(dtype=wp.float32),
    scale: float,
    # Data out:
    partials_out: wp.array(dtype=wp.float32),
):
    n, y, x, c = wp.tid()
    e = image[n, y, x, c] - target[n, y, x, c]
    i = ((n * image.shape[1] + y) * image.shape[2] + x) * image.shape[3] + c
    wp.atomic_add(partials_out, i % partials_out.shape[0], scale * e * e)


@wp.kernel
def _sum_partials(
    # Data in:
    partials: wp.array(dtype=wp.float32),
    # Data out:
    loss_out: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    wp.atomic_add(loss_out, 0, partials[i])


_PARTIALS: dict = {}  # (device, out array address) -> (MSE_PARTIALS,) float32 scratch


class _Scratch:
    """Per-shape scratch images (cached per call site via ``scratch=``)."""

    def __init__(self, shape, device, requires_grad=True):
        n, h, w, k = shape
        self.image = wp.zeros(
            (n, h, w, 4), dtype=wp.float32, device=device, requires_grad=requires_grad
        )
        self.colors = wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=requires_grad)
        self.ones = wp.full(shape, wp.vec3(1.0), dtype=wp.vec3, device=device)


def _z(value, name, device, scratch) -> wp.array:
    """A (B,) float32 array for znear/zfar, cached on the scratch for host values."""
    if isinstance(value, wp.array):
        return scalar_param(value, name, device)
    key = (name, tuple(np.asarray(value, dtype=np.float64).reshape(-1).tolist()))
    cache = scratch.__dict__.setdefault("z", {})
    if key not in cache:
        cache[key] = scalar_param(np.asarray(value, dtype=np.float64).reshape(-1), name, device)
    return cache[key]


def _out3(out, shape, device, requires_grad, name="out"):
    n, h, w, _ = shape
    if out is None:
        return wp.zeros((n, h, w), dtype=wp.float32, device=device, requires_grad=requires_grad)
    if not isinstance(out, wp.array) or out.dtype != wp.float32 or out.shape != (n, h, w):
        raise ValueError(f"{name} must be a float32 wp.array of shape {(n, h, w)}")
    if requires_grad and not out.requires_grad:
        raise ValueError(f"{name} must have requires_grad=True: the fragments track gradients")
    return out


def soft_silhouette(fragments, sigma: float = 1e-4, *, out=None, scratch=None) -> wp.array:
    """Soft coverage ``1 - prod_k (1 - sigmoid(-dists_k / sigma))`` per pixel (SoftRas).

    Args:
        fragments: :class:`warpraster.Fragments` (``pix_to_face``, ``dists``).
        sigma: edge sharpness (NDC squared-distance units), > 0.
        out: optional (N, H, W) float32 output.
        scratch: optional object returned by :func:`make_scratch` (no allocation).

    Returns:
        (N, H, W) float32; on a ``wp.Tape`` gradients reach ``fragments.dists``.
    """
    shape = check_fragments(fragments)
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    device = fragments.pix_to_face.device
    rg = fragments.dists.requires_grad
    out = _out3(out, shape, device, rg)
    s = scratch if scratch is not None else _Scratch(shape, device, rg)
    launch_sigmoid_blend(fragments, s.ones, float(sigma), s.image)
    wp.launch(_channel, dim=shape[:3], inputs=[s.image, 3], outputs=[out], device=device)
    return out


def soft_depth(
    fragments,
    blend_params: BlendParams | None = None,
    znear=1.0,
    zfar=100.0,
    *,
    out=None,
    scratch=None,
) -> wp.array:
    """Softmax-blended depth per pixel: PyTorch3D's ``softmax_rgb_blend`` of the slot depths.

    The background colour's first channel is the depth of empty pixels.

    Args:
        fragments: :class:`warpraster.Fragments`.
        blend_params: sigma, gamma, background colour (default ``BlendParams()``).
        znear, zfar: scalars or (N,) per image.
        out, scratch: optional preallocated (N, H, W) output and scratch.

    Returns:
        (N, H, W) float32; gradients reach ``fragments.zbuf`` and ``fragments.dists``.
    """
    blend_params = BlendParams() if blend_params is None else blend_params
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    rg = fragments.zbuf.requires_grad or fragments.dists.requires_grad
    out = _out3(out, shape, device, rg)
    s = scratch if scratch is not None else _Scratch(shape, device, rg)
    zn = _z(znear, "znear", device, s)
    zf = _z(zfar, "zfar", device, s)
    wp.launch(
        _depth_as_colour, dim=shape, inputs=[fragments.zbuf], outputs=[s.colors], device=device
    )
    launch_softmax_blend(
        fragments,
        s.colors,
        blend_params.background_array(device),
        zn,
        zf,
        float(blend_params.sigma),
        float(blend_params.gamma),
        s.image,
    )
    wp.launch(_channel, dim=shape[:3], inputs=[s.image, 0], outputs=[out], device=device)
    return out


def hard_depth(fragments, background: float = -1.0, *, out=None) -> wp.array:
    """Depth of the nearest face per pixel (``zbuf[..., 0]``), ``background`` where empty.

    Returns (N, H, W) float32; gradients reach ``fragments.zbuf`` (loop-free kernel).
    """
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    out = _out3(out, shape, device, fragments.zbuf.requires_grad)
    wp.launch(
        _hard_depth,
        dim=shape[:3],
        inputs=[fragments.pix_to_face, fragments.zbuf, float(background)],
        outputs=[out],
        device=device,
    )
    return out


def image_mse(image: wp.array, target: wp.array, *, out: wp.array | None = None) -> wp.array:
    """``mean((image - target)^2)`` into a (1,) float32 array (accumulated: zero ``out`` first).

    Args:
        image, target: float32 arrays of one shape, (N, H, W, C) or (N, H, W).
        out: optional (1,) float32 with ``requires_grad`` (zeroed by the caller
            before each recorded call, e.g. ``out.zero_()`` inside the capture).
    """
    if not isinstance(image, wp.array) or not isinstance(target, wp.array):
        raise TypeError("image and target must be wp.arrays")
    if image.shape != target.shape or image.dtype != wp.float32 or target.dtype != wp.float32:
        raise ValueError(
            f"image and target must be float32 of one shape, got {image.shape}, {target.shape}"
        )
    im = image if image.ndim == 4 else image.reshape((*image.shape, 1))
    tg = target if target.ndim == 4 else target.reshape((*target.shape, 1))
    if out is None:
        out = wp.zeros(1, dtype=wp.float32, device=image.device, requires_grad=image.requires_grad)
    elif out.shape != (1,) or out.dtype != wp.float32:
        raise ValueError("out must be a (1,) float32 wp.array")
    key = (str(image.device), out.ptr, bool(out.requires_grad))
    partials = _PARTIALS.get(key)
    if partials is None:  # once per output array (set-up, not per call)
        partials = _PARTIALS[key] = wp.zeros(
            MSE_PARTIALS, dtype=wp.float32, device=image.device, requires_grad=out.requires_grad
        )
    partials.zero_()
    wp.launch(
        _squared_error,
        dim=im.shape,
        inputs=[im, tg, 1.0 / float(image.size)],
        outputs=[partials],
        device=image.device,
    )
    wp.launch(_sum_partials, dim=MSE_PARTIALS, inputs=[partials], outputs=[out],
              device=image.device)  # fmt: skip
    return out


def make_scratch(fragments_shape, device, requires_grad: bool = True) -> _Scratch:
    """Scratch buffers for :func:`soft_silhouette` / :func:`soft_depth` (allocation-free calls)."""
    return _Scratch(tuple(fragments_shape), device, requires_grad)
