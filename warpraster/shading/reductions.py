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
* :func:`image_mse`: ``mean((image - target)^2)``, summed per block and then
  over the blocks in a fixed order (bit-identical run to run), with a
  hand-written adjoint.

Unsafe, for the record: writing your own ``for k in range(K)`` accumulation in a
kernel launched on a tape; reusing one output array for two recorded calls (the
tape needs the first values); reductions written as ``loss[0] = loss[0] + v``
(races on the GPU). Every function takes preallocated outputs (``out=``) so a
render + loss + backward can be captured in one graph.
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape, record_func
from ..grad_buffers import clear_if_recording
from .blending import (
    BlendParams,
    check_fragments,
    float_out,
    launch_sigmoid_blend,
    launch_softmax_blend,
    z_param,
)
from .pixel_args import PixelFragments, pixel_fragments

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "hard_depth",
    "image_mse",
    "checked_mse_out",
    "make_scratch",
    "mse_forward",
    "soft_depth",
    "soft_silhouette",
]


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
    frag: PixelFragments,
    background: float,
    # Data out:
    out: wp.array3d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    d = background
    if frag.pix_to_face[n, y, x, 0] >= 0:
        d = frag.zbuf[n, y, x, 0]
    out[n, y, x] = d


#: The two-pass sum of :func:`image_mse`: threads per block, and values each
#: block sums (each thread a strided eighth). One atomic add per value into a
#: few partial sums took 0.09 ms forward and 0.11 ms backward for the 8 M values
#: of the renderer bench image on an H200, and summed in a varying order.
SUM_BLOCK = 256
SUM_CHUNK = 8 * SUM_BLOCK


@wp.kernel(enable_backward=False)
def _squared_error_partials(
    # Data in (flat views of one size):
    image: wp.array(dtype=wp.float32),
    target: wp.array(dtype=wp.float32),
    # Data out:
    partials_out: wp.array(dtype=wp.float32),
):
    """partials_out[b] = sum of (image - target)^2 over values [b CHUNK, (b+1) CHUNK)."""
    b, lane = wp.tid()
    end = wp.min((b + 1) * SUM_CHUNK, image.shape[0])
    i = b * SUM_CHUNK + lane
    v = float(0.0)
    while i < end:
        d = image[i] - target[i]
        v += d * d
        i += wp.block_dim()  # SUM_BLOCK on a GPU; 1 on the cpu device
    total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
    if lane == 0:
        partials_out[b] = total


@wp.kernel(enable_backward=False)
def _add_partials(
    # Data in:
    partials: wp.array(dtype=wp.float32),
    weight: float,
    # Data out (accumulated):
    loss_out: wp.array(dtype=wp.float32),
):
    """loss_out[0] += weight * sum(partials), in a fixed order (one block)."""
    _b, lane = wp.tid()
    i = lane
    v = float(0.0)
    while i < partials.shape[0]:
        v += partials[i]
        i += wp.block_dim()  # SUM_BLOCK on a GPU; 1 on the cpu device
    total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
    if lane == 0:
        loss_out[0] = loss_out[0] + weight * total


@wp.kernel(enable_backward=False)
def _squared_error_adjoint(
    # Data in (flat views):
    image: wp.array(dtype=wp.float32),
    target: wp.array(dtype=wp.float32),
    weight: float,
    loss_grad: wp.array(dtype=wp.float32),
    # Gradient out (accumulated, one thread per value):
    image_grad_out: wp.array(dtype=wp.float32),
):
    i = wp.tid()
    image_grad_out[i] = image_grad_out[i] + (2.0 * weight * loss_grad[0]) * (image[i] - target[i])


_PARTIALS: dict = {}  # (device, blocks) -> per-block partial sums of image_mse


class _Scratch:
    """Per-shape scratch images (cached per call site via ``scratch=``)."""

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(self, shape, device, requires_grad=True):
        n, h, w, k = shape
        self.image = wp.zeros(
            (n, h, w, 4), dtype=wp.float32, device=device, requires_grad=requires_grad
        )
        self.colors = wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=requires_grad)
        self.ones = wp.full(shape, wp.vec3(1.0), dtype=wp.vec3, device=device)
        self.z_cache: dict = {}  # znear/zfar arrays of host values


def _out3(out, shape, device, requires_grad) -> wp.array:
    """The (N, H, W) output for fragments of ``shape`` (N, H, W, K)."""
    return float_out(out, shape[:3], device, requires_grad)


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
    clear_if_recording(scratch)  # reused: its gradients start from zero
    launch_sigmoid_blend(pixel_fragments(fragments), s.ones, float(sigma), s.image)
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
    clear_if_recording(scratch)  # reused: its gradients start from zero
    zn = z_param(znear, "znear", device, s.z_cache)
    zf = z_param(zfar, "zfar", device, s.z_cache)
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
        inputs=[pixel_fragments(fragments), float(background)],
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
    out, weight = mse_forward(image, target, out)
    tape = active_tape()
    if tape is None or not image.requires_grad or image.grad is None or out.grad is None:
        return out
    device = image.device
    flat_im, flat_tg, flat_grad = image.flatten(), target.flatten(), image.grad.flatten()

    def backward():
        wp.launch(_squared_error_adjoint, dim=image.size,
                  inputs=[flat_im, flat_tg, weight, out.grad], outputs=[flat_grad],
                  device=device)  # fmt: skip

    record_func(tape, backward, arrays=[image, out])
    return out


def checked_mse_out(image: wp.array, target: wp.array, out: wp.array | None) -> wp.array:
    """The checks of :func:`image_mse` (errors naming ``image``, ``target``, ``out``);
    returns ``out``, made when None."""
    if not isinstance(image, wp.array) or not isinstance(target, wp.array):
        raise TypeError("image and target must be wp.arrays")
    if image.shape != target.shape or image.dtype != wp.float32 or target.dtype != wp.float32:
        raise ValueError(
            f"image and target must be float32 of one shape, got {image.shape}, {target.shape}"
        )
    if not (image.is_contiguous and target.is_contiguous):
        raise ValueError("image and target must be contiguous arrays")
    if image.device != target.device:
        raise ValueError(f"target is on device {target.device}, the image on {image.device}")
    if out is None:
        return wp.zeros(1, dtype=wp.float32, device=image.device, requires_grad=image.requires_grad)
    if out.shape != (1,) or out.dtype != wp.float32 or out.device != image.device:
        raise ValueError("out must be a (1,) float32 wp.array on the image's device")
    return out


def mse_forward(image: wp.array, target: wp.array, out: wp.array | None) -> tuple[wp.array, float]:
    """The forward of :func:`image_mse` (checks, then the sum into ``out``, made
    when None): ``(out, weight)``, ``weight`` = 1 / the number of values."""
    out = checked_mse_out(image, target, out)
    device = image.device
    count = image.size
    blocks = max((count + SUM_CHUNK - 1) // SUM_CHUNK, 1)
    key = (str(device), blocks)
    partials = _PARTIALS.get(key)
    if partials is None:  # once per size (set-up, not per call); never replaced
        partials = _PARTIALS[key] = wp.zeros(blocks, dtype=wp.float32, device=device)
    weight = 1.0 / float(max(count, 1))
    flat = [image.flatten(), target.flatten()]
    wp.launch_tiled(_squared_error_partials, dim=[blocks], inputs=flat, outputs=[partials],
                    device=device, block_dim=SUM_BLOCK, record_tape=False)  # fmt: skip
    wp.launch_tiled(_add_partials, dim=[1], inputs=[partials, weight], outputs=[out],
                    device=device, block_dim=SUM_BLOCK, record_tape=False)  # fmt: skip
    return out, weight


def make_scratch(fragments_shape, device, requires_grad: bool = True) -> _Scratch:
    """Scratch buffers for :func:`soft_silhouette` / :func:`soft_depth` (allocation-free calls)."""
    return _Scratch(tuple(fragments_shape), device, requires_grad)
