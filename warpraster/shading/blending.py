"""Blending the K shaded faces of each pixel into an RGBA image, as PyTorch3D.

* :func:`hard_rgb_blend`: colour of the nearest face (slot 0), background where
  the pixel is empty; alpha 1 / 0.
* :func:`sigmoid_alpha_blend`: RGB = slot 0's colour (no background), alpha =
  ``1 - prod_k (1 - sigmoid(-dists_k / sigma))`` over the filled slots (SoftRas).
* :func:`softmax_rgb_blend`: PyTorch3D's ``softmax_rgb_blend``, written out::

      p_k     = sigmoid(-dists_k / sigma) * mask_k
      zinv_k  = (zfar - zbuf_k) / (zfar - znear) * mask_k
      M       = max(max_k zinv_k, eps)                    eps = 1e-10
      w_k     = p_k * exp((zinv_k - M) / gamma)
      delta   = max(exp((eps - M) / gamma), eps)
      rgb     = (sum_k w_k c_k + delta * background) / (sum_k w_k + delta)
      alpha   = 1 - prod_k (1 - p_k)

The soft blends loop over the K slots, which Warp's generated adjoint gets
wrong (a loop with a dynamic trip count, see WARP-NOTES): their forward kernels
are launched outside the tape and a hand-written adjoint kernel (one thread per
pixel, recomputing the forward) is registered with ``tape.record_func``. The
hard and softmax blends are the pixel kernel of :mod:`warpraster.shading.fused`
(which the Phong and flat shaders also use to light the slots on the way). It
follows torch's autograd of the formulas above, including the gradient through
the max (to the first slot holding it, torch's ``max`` index) and the clamps.
The softmax adjoint also computes the ``zbuf`` gradient in torch's order of float32
operations (``(g / den)``, ``-g * ((num / den) / den)`` summed over the channels,
``((grad_w * p) * e) / gamma``, the max's share added before the division by
``zfar - znear``): PyTorch3D's rasterizer backward multiplies the ``zbuf``
gradient of a slot outside its face whose perspective denominator is clamped by
up to 1e16 (docs/BACKWARD.md, "Blur-only slots"), so its last bit matters there.
``exp`` and ``sigmoid`` are Warp's, which can differ from torch's vectorised ones
by an ulp.
Gradients reach ``colors``, ``dists``, ``zbuf`` and a background colour array with
``requires_grad``; ``znear``/``zfar`` get none.

Shapes: ``colors`` (N, H, W, K) ``vec3`` (Warp arrays have at most 4 dimensions;
NumPy (N, H, W, K, 3) is copied); fragments as :class:`warpraster.Fragments`; the image is a
(N, H, W, 4) float32 Warp array.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import warp as wp

from ..backward.tape import record_func
from .fused import (
    BLEND_EPS,
    ShadeInputs,
    _grad_or,
    _write_rgba,
    launch_image_kernel,
    launch_shade_blend,
    new_inputs,
    prob,
)
from .fused import with_grad as _with_grad
from .params import check_rows, scalar_param, vec3_param
from .pixel_args import PixelFragments, pixel_fragments

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "BLEND_EPS",
    "BlendParams",
    "hard_rgb_blend",
    "sigmoid_alpha_blend",
    "softmax_rgb_blend",
]


@dataclass(frozen=True)
class BlendParams:
    """PyTorch3D's ``BlendParams``.

    Attributes:
        sigma: width of the sigmoid of the signed distance (edge sharpness), > 0.
        gamma: softmax temperature of the depth weighting (opacity), > 0.
        background_color: RGB, a 3-sequence, NumPy ``(3,)`` (``(N, 3)`` per image)
            or a Warp ``vec3``/float32 array (used zero-copy; trainable with
            ``requires_grad``). Host values (sequences, NumPy) are copied at
            construction into a tuple of floats (a tuple of rows for ``(N, 3)``):
            changing the NumPy array afterwards changes nothing; make a new
            ``BlendParams`` (or pass a Warp array and write into it) instead.
    """

    sigma: float = 1e-4
    gamma: float = 1e-4
    background_color: Any = (1.0, 1.0, 1.0)
    _cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self):
        for name in ("sigma", "gamma"):
            v = getattr(self, name)
            if not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
                raise TypeError(f"BlendParams.{name} must be a finite number, got {v!r}")
            if v <= 0:
                raise ValueError(f"BlendParams.{name} must be > 0, got {v}")
        # parse once (raises on a bad colour) and keep an immutable copy of host
        # values; the device array is made per device on demand
        bg = self.background_color
        if not isinstance(bg, wp.array):
            vec3_param(bg, "background_color", "cpu")
            a = np.asarray(bg, dtype=np.float64)
            copy = (
                tuple(float(c) for c in a)
                if a.ndim == 1
                else tuple(tuple(float(c) for c in r) for r in a)
            )
            object.__setattr__(self, "background_color", copy)
        else:  # zero-copy: its values now are checked once (a host read at set-up)
            check_rows(vec3_param(bg, "background_color", bg.device), "background_color")

    def background_array(self, device) -> wp.array:
        """The background colour as a ``vec3`` (B,) array on ``device`` (cached)."""
        bg = self.background_color
        device = wp.get_device(device)
        if isinstance(bg, wp.array):
            return vec3_param(bg, "background_color", device)
        key = str(device)
        if key not in self._cache:
            self._cache[key] = vec3_param(bg, "background_color", device)
        return self._cache[key]


# ----------------------------------------------------------------------------- inputs
def as_colors_array(colors, shape: tuple, device, name: str = "colors") -> wp.array:
    """(N, H, W, K) ``vec3`` colours: a Warp array as is, NumPy (N, H, W, K, 3) copied."""
    if type(colors).__module__.startswith("torch"):
        raise TypeError(f"{name} is a torch tensor: use warpraster.torch for torch inputs")
    if isinstance(colors, wp.array):
        if wp.get_device(colors.device) != wp.get_device(device):
            raise ValueError(f"{name} is on device {colors.device}, the fragments on {device}")
        if colors.dtype == wp.vec3 and colors.shape == shape:
            return colors
        raise ValueError(
            f"{name} must be a vec3 wp.array of shape {shape}, got dtype "
            f"{wp.types.type_repr(colors.dtype)} shape {colors.shape}"
        )
    a = np.asarray(colors, dtype=np.float32)
    if a.shape != (*shape, 3):
        raise ValueError(f"{name} must have shape {(*shape, 3)}, got {a.shape}")
    return wp.array(a, dtype=wp.vec3, device=device)


def check_fragments(fragments) -> tuple[int, int, int, int]:
    """(N, H, W, K) of a Fragments-like object; TypeError/ValueError if malformed."""
    for name in ("pix_to_face", "zbuf", "bary_coords", "dists"):
        if not isinstance(getattr(fragments, name, None), wp.array):
            raise TypeError(f"fragments.{name} must be a wp.array (pass warpraster.Fragments)")
    p2f = fragments.pix_to_face
    if p2f.dtype != wp.int32 or p2f.ndim != 4:
        raise TypeError(f"fragments.pix_to_face must be int32 (N, H, W, K), got {p2f.shape}")
    shape = tuple(p2f.shape)
    for name in ("zbuf", "dists"):
        a = getattr(fragments, name)
        if a.dtype != wp.float32 or tuple(a.shape) != shape:
            raise ValueError(f"fragments.{name} must be float32 {shape}, got {a.shape}")
    b = fragments.bary_coords
    if b.dtype != wp.vec3 or tuple(b.shape) != shape:
        raise ValueError(f"fragments.bary_coords must be vec3 {shape}, got {b.shape}")
    return shape


def float_out(out, shape: tuple, device, requires_grad: bool, name: str = "out") -> wp.array:
    """The float32 output ``out`` of ``shape`` (checked), or a new one when None."""
    shape = tuple(shape)
    if out is None:
        return wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=requires_grad)
    if not isinstance(out, wp.array) or out.dtype != wp.float32 or out.shape != shape:
        raise ValueError(f"{name} must be a float32 wp.array of shape {shape}")
    if requires_grad and not out.requires_grad:
        raise ValueError(f"{name} must have requires_grad=True: an input tracks gradients")
    return out


def _image_out(out, shape, device, requires_grad: bool) -> wp.array:
    """The (N, H, W, 4) RGBA output for fragments of ``shape`` (N, H, W, K)."""
    return float_out(out, (*shape[:3], 4), device, requires_grad)


def z_param(value, name: str, device, cache: dict | None = None) -> wp.array:
    """znear/zfar as a (B,) float32 array: a Warp array as is (checked), host
    values copied (once per value when a ``cache`` dict is given)."""
    if isinstance(value, wp.array):
        return scalar_param(value, name, device)
    rows = np.asarray(value, dtype=np.float64).reshape(-1)
    if cache is None:
        return scalar_param(rows, name, device)
    key = (name, str(device), tuple(rows.tolist()))
    if key not in cache:
        cache[key] = scalar_param(rows, name, device)
    return cache[key]


def _blend_inputs(colors, fragments, blend_params):
    """(blend parameters (default ``BlendParams()``), fragment shape (N, H, W, K),
    device, colours array) of a blend call, checked."""
    blend_params = BlendParams() if blend_params is None else blend_params
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    return blend_params, shape, device, as_colors_array(colors, shape, device)


# ----------------------------------------------------------------------------- hard
def hard_rgb_blend(colors, fragments, blend_params: BlendParams | None = None, *, out=None):
    """RGB of the nearest face, background where the pixel is empty; alpha 1 / 0.

    Args:
        colors: (N, H, W, K) ``vec3`` Warp array (or NumPy (N, H, W, K, 3)) of colours.
        fragments: :class:`warpraster.Fragments` (``pix_to_face`` is used).
        blend_params: :class:`BlendParams` (background colour).
        out: optional (N, H, W, 4) float32 output (no allocation).

    Returns:
        (N, H, W, 4) float32 RGBA image; differentiable on a ``wp.Tape``.
    """
    blend_params, shape, device, colors = _blend_inputs(colors, fragments, blend_params)
    bg = blend_params.background_array(device)
    out = _image_out(out, shape, device, colors.requires_grad or bg.requires_grad)
    launch_hard_blend(fragments, colors, bg, out)
    return out


def _given(colors, background, blend: int) -> ShadeInputs:
    a = new_inputs(colors.device)
    a.lit = 0
    a.colors = colors
    a.blend = blend
    a.background = background
    return a


def launch_hard_blend(fragments, colors, background, image_out) -> None:
    """The kernel of :func:`hard_rgb_blend` + its adjoint on the active tape (no checks)."""
    launch_shade_blend(pixel_fragments(fragments), _given(colors, background, 0), image_out)


# ----------------------------------------------------------------------------- sigmoid
@wp.kernel(enable_backward=False)
def _sigmoid_blend_kernel(
    # Data in:
    frag: PixelFragments,
    colors: wp.array4d(dtype=wp.vec3),
    sigma: float,
    # Data out:
    image_out: wp.array4d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    keep = float(1.0)
    for k in range(frag.pix_to_face.shape[3]):
        if frag.pix_to_face[n, y, x, k] >= 0:
            keep *= 1.0 - prob(frag.dists[n, y, x, k], sigma)
    _write_rgba(image_out, n, y, x, colors[n, y, x, 0], 1.0 - keep)


@wp.kernel(enable_backward=False)
def _sigmoid_blend_adjoint(
    # Data in:
    frag: PixelFragments,
    image: wp.array4d(dtype=wp.float32),
    image_grad: wp.array4d(dtype=wp.float32),
    sigma: float,
    # Gradients out (accumulated; written when want_* != 0):
    dists_grad_out: wp.array4d(dtype=wp.float32),
    colors_grad_out: wp.array4d(dtype=wp.vec3),
    want_dists: int,
    want_colors: int,
):
    n, y, x = wp.tid()
    if want_colors != 0:
        g = wp.vec3(image_grad[n, y, x, 0], image_grad[n, y, x, 1], image_grad[n, y, x, 2])
        colors_grad_out[n, y, x, 0] = colors_grad_out[n, y, x, 0] + g
    if want_dists != 0:
        keep = 1.0 - image[n, y, x, 3]  # as PyTorch3D's backward: from the saved alpha
        ga = image_grad[n, y, x, 3]
        for k in range(frag.pix_to_face.shape[3]):
            if frag.pix_to_face[n, y, x, k] >= 0:
                p = prob(frag.dists[n, y, x, k], sigma)
                dists_grad_out[n, y, x, k] = (
                    dists_grad_out[n, y, x, k] + ga * (-1.0 / sigma) * p * keep
                )


def sigmoid_alpha_blend(colors, fragments, blend_params: BlendParams | None = None, *, out=None):
    """Silhouette blend: RGB of slot 0, alpha ``1 - prod_k (1 - sigmoid(-d_k / sigma))``.

    Args and returns as :func:`hard_rgb_blend` (``blend_params.sigma`` is used; no
    background: an empty pixel keeps slot 0's colour, as PyTorch3D).
    Gradients (hand-written adjoint on the tape) reach ``colors`` and ``fragments.dists``.
    """
    blend_params, shape, device, colors = _blend_inputs(colors, fragments, blend_params)
    out = _image_out(out, shape, device, colors.requires_grad or fragments.dists.requires_grad)
    launch_sigmoid_blend(pixel_fragments(fragments), colors, float(blend_params.sigma), out)
    return out


def launch_sigmoid_blend(frag: PixelFragments, colors, sigma: float, image_out) -> None:
    """Forward kernel of :func:`sigmoid_alpha_blend` + its adjoint on the active tape
    (``frag``: :func:`~warpraster.shading.pixel_args.pixel_fragments`)."""
    dists = frag.dists
    n, h, w, _ = dists.shape
    device = dists.device
    tape = launch_image_kernel(
        _sigmoid_blend_kernel, (n, h, w), [frag, colors, sigma], image_out, device
    )
    if tape is None:
        return
    dgrad, want_d = _grad_or(dists, dists)
    cgrad, want_c = _grad_or(colors, colors)
    if not (want_d or want_c):
        return

    def backward():
        wp.launch(
            _sigmoid_blend_adjoint,
            dim=(n, h, w),
            inputs=[frag, image_out, image_out.grad, sigma],
            outputs=[dgrad, cgrad, int(want_d), int(want_c)],
            device=device,
        )

    record_func(tape, backward, arrays=_with_grad(image_out, dists, colors))


# ----------------------------------------------------------------------------- softmax
def softmax_rgb_blend(
    colors,
    fragments,
    blend_params: BlendParams | None = None,
    znear=1.0,
    zfar=100.0,
    *,
    out=None,
):
    """PyTorch3D's softmax blend (module docstring gives the formula).

    Args:
        colors: (N, H, W, K) ``vec3`` Warp array (or NumPy (N, H, W, K, 3)) of colours.
        fragments: :class:`warpraster.Fragments` (``pix_to_face``, ``dists``, ``zbuf``).
        blend_params: :class:`BlendParams` (sigma, gamma, background colour).
        znear, zfar: scalars or (N,) per image (NumPy or float32 Warp arrays);
            PyTorch3D's shaders pass the camera's.
        out: optional (N, H, W, 4) float32 output.

    Returns:
        (N, H, W, 4) float32 RGBA; on a ``wp.Tape`` a hand-written adjoint sends
        gradients to ``colors``, ``fragments.dists``, ``fragments.zbuf`` and a
        trainable background array. The adjoint reads this image: leave it as it
        is until ``tape.backward()`` has run.
    """
    blend_params, shape, device, colors = _blend_inputs(colors, fragments, blend_params)
    bg = blend_params.background_array(device)
    zn = z_param(znear, "znear", device)
    zf = z_param(zfar, "zfar", device)
    for name, a in (("znear", zn), ("zfar", zf), ("background_color", bg)):
        if a.shape[0] not in (1, shape[0]):
            raise ValueError(f"{name} has {a.shape[0]} rows for {shape[0]} images")
    rg = any(a.requires_grad for a in (colors, bg, fragments.dists, fragments.zbuf))
    out = _image_out(out, shape, device, rg)
    launch_softmax_blend(
        fragments, colors, bg, zn, zf, float(blend_params.sigma), float(blend_params.gamma), out
    )
    return out


def launch_softmax_blend(fragments, colors, background, znear, zfar, sigma, gamma, image_out):
    """Forward kernel of :func:`softmax_rgb_blend` + its adjoint on the active tape."""
    a = _given(colors, background, 1)
    a.znear, a.zfar, a.sigma, a.gamma = znear, zfar, float(sigma), float(gamma)
    launch_shade_blend(pixel_fragments(fragments), a, image_out)
