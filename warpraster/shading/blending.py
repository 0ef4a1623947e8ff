"""Blending the K shaded faces of each pixel into an RGBA image, as PyTorch3D.

* :func:`hard_rgb_blend`: colour of the nearest face (slot 0), background where
  the pixel is empty; alpha 1 / 0. One loop-free kernel, differentiated by Warp.
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

The two soft blends loop over the K slots, which Warp's generated adjoint gets
wrong (a loop with a dynamic trip count, see WARP-NOTES): their forward kernels
are launched outside the tape and a hand-written adjoint kernel (one thread per
pixel, recomputing the forward) is registered with ``tape.record_func``. It
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

from .params import row, scalar_param, vec3_param

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "BLEND_EPS",
    "BlendParams",
    "hard_rgb_blend",
    "sigmoid_alpha_blend",
    "softmax_rgb_blend",
]

#: PyTorch3D's ``eps`` in ``softmax_rgb_blend``.
BLEND_EPS = wp.constant(1.0e-10)


def active_tape():
    """The ``wp.Tape`` being recorded, or None."""
    runtime = getattr(wp._src.context, "runtime", None)
    return getattr(runtime, "tape", None)


@dataclass(frozen=True)
class BlendParams:
    """PyTorch3D's ``BlendParams``.

    Attributes:
        sigma: width of the sigmoid of the signed distance (edge sharpness), > 0.
        gamma: softmax temperature of the depth weighting (opacity), > 0.
        background_color: RGB, a 3-sequence, NumPy ``(3,)`` (``(N, 3)`` per image)
            or a Warp ``vec3``/float32 array (used zero-copy; trainable with
            ``requires_grad``).
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
        # parse once (raises on a bad colour); the array is made per device on demand
        if not isinstance(self.background_color, wp.array):
            vec3_param(self.background_color, "background_color", "cpu")

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


def _image_out(out, shape, device, requires_grad: bool) -> wp.array:
    n, h, w, _ = shape
    if out is None:
        return wp.zeros((n, h, w, 4), dtype=wp.float32, device=device, requires_grad=requires_grad)
    if not isinstance(out, wp.array) or out.dtype != wp.float32 or out.shape != (n, h, w, 4):
        raise ValueError(f"out must be a float32 wp.array of shape {(n, h, w, 4)}")
    if requires_grad and not out.requires_grad:
        raise ValueError("out must have requires_grad=True: an input tracks gradients")
    return out


def _with_grad(*arrays) -> list:
    """The arrays that carry a gradient (what ``tape.record_func`` may zero)."""
    return [a for a in arrays if a.requires_grad and a.grad is not None]


def _z_param(value, name, device) -> wp.array:
    if isinstance(value, wp.array):
        return scalar_param(value, name, device)
    return scalar_param(np.asarray(value, dtype=np.float64).reshape(-1), name, device)


# ----------------------------------------------------------------------------- hard
@wp.kernel
def _hard_blend_kernel(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    colors: wp.array4d(dtype=wp.vec3),
    background: wp.array(dtype=wp.vec3),
    # Data out:
    image_out: wp.array4d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    c = background[row(n, background.shape[0])]
    a = float(0.0)
    if pix_to_face[n, y, x, 0] >= 0:
        c = colors[n, y, x, 0]
        a = 1.0
    image_out[n, y, x, 0] = c[0]
    image_out[n, y, x, 1] = c[1]
    image_out[n, y, x, 2] = c[2]
    image_out[n, y, x, 3] = a


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
    blend_params = BlendParams() if blend_params is None else blend_params
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    colors = as_colors_array(colors, shape, device)
    bg = blend_params.background_array(device)
    out = _image_out(out, shape, device, colors.requires_grad or bg.requires_grad)
    launch_hard_blend(fragments.pix_to_face, colors, bg, out)
    return out


def launch_hard_blend(pix_to_face, colors, background, image_out) -> None:
    """The kernel of :func:`hard_rgb_blend` (no checks, no allocation; on the tape)."""
    n, h, w, _ = pix_to_face.shape
    wp.launch(
        _hard_blend_kernel,
        dim=(n, h, w),
        inputs=[pix_to_face, colors, background],
        outputs=[image_out],
        device=pix_to_face.device,
    )


# ----------------------------------------------------------------------------- sigmoid
@wp.func
def _prob(d: float, sigma: float) -> float:
    """``sigmoid(-d / sigma)`` as torch computes it."""
    x = -d / sigma
    return 1.0 / (1.0 + wp.exp(-x))


@wp.kernel(enable_backward=False)
def _sigmoid_blend_kernel(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=wp.float32),
    colors: wp.array4d(dtype=wp.vec3),
    sigma: float,
    # Data out:
    image_out: wp.array4d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    keep = float(1.0)
    for k in range(pix_to_face.shape[3]):
        if pix_to_face[n, y, x, k] >= 0:
            keep *= 1.0 - _prob(dists[n, y, x, k], sigma)
    c = colors[n, y, x, 0]
    image_out[n, y, x, 0] = c[0]
    image_out[n, y, x, 1] = c[1]
    image_out[n, y, x, 2] = c[2]
    image_out[n, y, x, 3] = 1.0 - keep


@wp.kernel(enable_backward=False)
def _sigmoid_blend_adjoint(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=wp.float32),
    image: wp.array4d(dtype=wp.float32),
    image_grad: wp.array4d(dtype=wp.float32),
    sigma: float,
    # Gradients out (accumulated):
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
        for k in range(pix_to_face.shape[3]):
            if pix_to_face[n, y, x, k] >= 0:
                p = _prob(dists[n, y, x, k], sigma)
                dists_grad_out[n, y, x, k] = (
                    dists_grad_out[n, y, x, k] + ga * (-1.0 / sigma) * p * keep
                )


def sigmoid_alpha_blend(colors, fragments, blend_params: BlendParams | None = None, *, out=None):
    """Silhouette blend: RGB of slot 0, alpha ``1 - prod_k (1 - sigmoid(-d_k / sigma))``.

    Args and returns as :func:`hard_rgb_blend` (``blend_params.sigma`` is used; no
    background: an empty pixel keeps slot 0's colour, as PyTorch3D).
    Gradients (hand-written adjoint on the tape) reach ``colors`` and ``fragments.dists``.
    """
    blend_params = BlendParams() if blend_params is None else blend_params
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    colors = as_colors_array(colors, shape, device)
    out = _image_out(out, shape, device, colors.requires_grad or fragments.dists.requires_grad)
    launch_sigmoid_blend(fragments, colors, float(blend_params.sigma), out)
    return out


def launch_sigmoid_blend(fragments, colors, sigma: float, image_out) -> None:
    """Forward kernel of :func:`sigmoid_alpha_blend` + its adjoint on the active tape."""
    p2f, dists = fragments.pix_to_face, fragments.dists
    n, h, w, _ = p2f.shape
    device = p2f.device
    wp.launch(
        _sigmoid_blend_kernel,
        dim=(n, h, w),
        inputs=[p2f, dists, colors, sigma],
        outputs=[image_out],
        device=device,
        record_tape=False,
    )
    tape = active_tape()
    if tape is None or image_out.grad is None:
        return
    want_d = dists.requires_grad and dists.grad is not None
    want_c = colors.requires_grad and colors.grad is not None
    if not (want_d or want_c):
        return
    dgrad = dists.grad if want_d else dists
    cgrad = colors.grad if want_c else colors

    def backward():
        wp.launch(
            _sigmoid_blend_adjoint,
            dim=(n, h, w),
            inputs=[p2f, dists, image_out, image_out.grad, sigma],
            outputs=[dgrad, cgrad, int(want_d), int(want_c)],
            device=device,
        )

    tape.record_func(backward, arrays=_with_grad(image_out, dists, colors))


# ----------------------------------------------------------------------------- softmax
@wp.func
def _zinv(f: int, z: float, zn: float, zf: float) -> float:
    if f < 0:
        return 0.0
    return (zf - z) / (zf - zn)


@wp.kernel(enable_backward=False)
def _softmax_blend_kernel(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=wp.float32),
    zbuf: wp.array4d(dtype=wp.float32),
    colors: wp.array4d(dtype=wp.vec3),
    background: wp.array(dtype=wp.vec3),
    znear: wp.array(dtype=wp.float32),
    zfar: wp.array(dtype=wp.float32),
    sigma: float,
    gamma: float,
    # Data out:
    image_out: wp.array4d(dtype=wp.float32),
):
    n, y, x = wp.tid()
    kk = pix_to_face.shape[3]
    zn = znear[row(n, znear.shape[0])]
    zf = zfar[row(n, zfar.shape[0])]
    bg = background[row(n, background.shape[0])]
    # pass 1: the largest inverse depth
    zmax = float(-1.0e38)
    for k in range(kk):
        zmax = wp.max(zmax, _zinv(pix_to_face[n, y, x, k], zbuf[n, y, x, k], zn, zf))
    zmax = wp.max(zmax, BLEND_EPS)
    # pass 2: weights, colour sum, coverage
    keep = float(1.0)
    wsum = float(0.0)
    csum = wp.vec3(0.0)
    for k in range(kk):
        f = pix_to_face[n, y, x, k]
        if f >= 0:
            p = _prob(dists[n, y, x, k], sigma)
            keep *= 1.0 - p
            wk = p * wp.exp((_zinv(f, zbuf[n, y, x, k], zn, zf) - zmax) / gamma)
            wsum += wk
            csum += wk * colors[n, y, x, k]
    delta = wp.max(wp.exp((BLEND_EPS - zmax) / gamma), BLEND_EPS)
    denom = wsum + delta
    c = (csum + delta * bg) / denom
    image_out[n, y, x, 0] = c[0]
    image_out[n, y, x, 1] = c[1]
    image_out[n, y, x, 2] = c[2]
    image_out[n, y, x, 3] = 1.0 - keep


@wp.kernel(enable_backward=False)
def _softmax_blend_adjoint(
    # Data in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    dists: wp.array4d(dtype=wp.float32),
    zbuf: wp.array4d(dtype=wp.float32),
    colors: wp.array4d(dtype=wp.vec3),
    background: wp.array(dtype=wp.vec3),
    znear: wp.array(dtype=wp.float32),
    zfar: wp.array(dtype=wp.float32),
    sigma: float,
    gamma: float,
    image_grad: wp.array4d(dtype=wp.float32),
    # Gradients out (accumulated; a flag says which are wanted):
    dists_grad_out: wp.array4d(dtype=wp.float32),
    zbuf_grad_out: wp.array4d(dtype=wp.float32),
    colors_grad_out: wp.array4d(dtype=wp.vec3),
    background_grad_out: wp.array(dtype=wp.vec3),
    want_dists: int,
    want_zbuf: int,
    want_colors: int,
    want_background: int,
):
    n, y, x = wp.tid()
    kk = pix_to_face.shape[3]
    zn = znear[row(n, znear.shape[0])]
    zf = zfar[row(n, zfar.shape[0])]
    brow = row(n, background.shape[0])
    bg = background[brow]
    # recompute the forward
    zraw = float(-1.0e38)
    kmax = int(0)
    for k in range(kk):
        zk = _zinv(pix_to_face[n, y, x, k], zbuf[n, y, x, k], zn, zf)
        if zk > zraw:
            zraw = zk
            kmax = k
    zmax = wp.max(zraw, BLEND_EPS)
    keep = float(1.0)
    wsum = float(0.0)
    csum = wp.vec3(0.0)
    for k in range(kk):
        f = pix_to_face[n, y, x, k]
        if f >= 0:
            p = _prob(dists[n, y, x, k], sigma)
            keep *= 1.0 - p
            wk = p * wp.exp((_zinv(f, zbuf[n, y, x, k], zn, zf) - zmax) / gamma)
            wsum += wk
            csum += wk * colors[n, y, x, k]
    dexp = wp.exp((BLEND_EPS - zmax) / gamma)
    delta = wp.max(dexp, BLEND_EPS)
    denom = wsum + delta
    rgb = (csum + delta * bg) / denom
    # torch's autograd of PyTorch3D's formula, op by op and in its order of float32
    # operations (see the module docstring): the zbuf gradient of a slot drawn only
    # through the blur is multiplied by up to 1e16 in PyTorch3D's rasterizer
    # backward, so its last bit decides O(1) of a vertex gradient there.
    g = wp.vec3(image_grad[n, y, x, 0], image_grad[n, y, x, 1], image_grad[n, y, x, 2])
    ga = image_grad[n, y, x, 3]
    # rgb = num / den: d/dnum = g / den; d/dden = sum_c -g_c * ((num_c / den) / den)
    gn = wp.vec3(g[0] / denom, g[1] / denom, g[2] / denom)
    gden = (-g[0] * (rgb[0] / denom) + -g[1] * (rgb[1] / denom)) + -g[2] * (rgb[2] / denom)
    # delta feeds num (delta * bg) and den
    gdelta = gden + ((gn[0] * bg[0] + gn[1] * bg[1]) + gn[2] * bg[2])
    gmax_e = float(0.0)  # d/dzmax through the K terms exp((zinv_k - zmax) / gamma)
    gdiff_max = float(0.0)
    for k in range(kk):
        f = pix_to_face[n, y, x, k]
        if f >= 0:
            p = _prob(dists[n, y, x, k], sigma)
            e = wp.exp((_zinv(f, zbuf[n, y, x, k], zn, zf) - zmax) / gamma)
            wk = p * e
            ck = colors[n, y, x, k]
            # w_k feeds sum_k w_k c_k and den
            gw = ((gn[0] * ck[0] + gn[1] * ck[1]) + gn[2] * ck[2]) + gden
            if want_colors != 0:
                colors_grad_out[n, y, x, k] = colors_grad_out[n, y, x, k] + wp.vec3(
                    gn[0] * wk, gn[1] * wk, gn[2] * wk
                )
            gdiff = ((gw * p) * e) / gamma  # d/d(zinv_k - zmax)
            gmax_e = gmax_e + -gdiff
            if want_dists != 0:
                # p_k = sigmoid(-d_k / sigma): through w_k, then the alpha product
                dd = -((((gw * e) * (1.0 - p)) * p) / sigma)
                dd += ga * (-keep * p / sigma)
                dists_grad_out[n, y, x, k] = dists_grad_out[n, y, x, k] + dd
            if k == kmax:
                gdiff_max = gdiff
            elif want_zbuf != 0:
                zbuf_grad_out[n, y, x, k] = zbuf_grad_out[n, y, x, k] + -(gdiff / (zf - zn))
    if want_background != 0:
        wp.atomic_add(
            background_grad_out, brow, wp.vec3(gn[0] * delta, gn[1] * delta, gn[2] * delta)
        )
    # zmax = max(max_k zinv_k, eps) feeds the K exponents and delta = max(exp(...), eps)
    gmax_d = float(0.0)
    if dexp >= BLEND_EPS:
        gmax_d = -((gdelta * dexp) / gamma)
    if want_zbuf != 0 and pix_to_face[n, y, x, kmax] >= 0:
        gz_max = gdiff_max
        if zraw >= BLEND_EPS:
            gz_max = gdiff_max + (gmax_e + gmax_d)
        zbuf_grad_out[n, y, x, kmax] = zbuf_grad_out[n, y, x, kmax] + -(gz_max / (zf - zn))


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
        trainable background array.
    """
    blend_params = BlendParams() if blend_params is None else blend_params
    shape = check_fragments(fragments)
    device = fragments.pix_to_face.device
    colors = as_colors_array(colors, shape, device)
    bg = blend_params.background_array(device)
    zn = _z_param(znear, "znear", device)
    zf = _z_param(zfar, "zfar", device)
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
    p2f, dists, zbuf = fragments.pix_to_face, fragments.dists, fragments.zbuf
    n, h, w, _ = p2f.shape
    device = p2f.device
    inputs = [p2f, dists, zbuf, colors, background, znear, zfar, sigma, gamma]
    wp.launch(
        _softmax_blend_kernel,
        dim=(n, h, w),
        inputs=inputs,
        outputs=[image_out],
        device=device,
        record_tape=False,
    )
    tape = active_tape()
    if tape is None or image_out.grad is None:
        return
    wants = [a.requires_grad and a.grad is not None for a in (dists, zbuf, colors, background)]
    if not any(wants):
        return
    grads = [
        a.grad if want else a
        for a, want in zip((dists, zbuf, colors, background), wants, strict=True)
    ]

    def backward():
        wp.launch(
            _softmax_blend_adjoint,
            dim=(n, h, w),
            inputs=[*inputs, image_out.grad],
            outputs=[*grads, *(int(x) for x in wants)],
            device=device,
        )

    tape.record_func(backward, arrays=_with_grad(image_out, dists, zbuf, colors, background))
