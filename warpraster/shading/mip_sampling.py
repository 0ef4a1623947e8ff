"""Mip-mapped sampling as nvdiffrast's ``texture``: the loop-free samplers every
texture kernel calls, and :func:`texture`, the functional op over per-slot UVs.

:func:`texture` samples per-slot UVs ``(N, H, W, K)`` with their screen-space
derivatives (``uv_dx``, ``uv_dy``: per pixel, x right, y down, as
:func:`~warpraster.shading.interpolate_vertex_attributes` returns them).

Filtering (:class:`FilterMode`): ``nearest`` and ``linear`` read the base level;
``linear-mipmap-nearest`` reads bilinearly the level ``floor(lambda)``,
``linear-mipmap-linear`` blends levels ``floor(lambda)`` and the next by the
fraction. The level is nvdiffrast's: with texel-space derivatives
``s = u * Wt``, ``t = v * Ht``, ``A = s_x^2 + t_x^2``, ``B = s_y^2 + t_y^2``,
``C = s_x s_y + t_x t_y``, the squared major axis of the pixel footprint ellipse
is ``(A + B) / 2 + sqrt((A - B)^2 / 4 + C^2)`` and
``lambda = 0.5 * log2(major^2)``, clamped to [0, L].
Boundaries (:class:`BoundaryMode`): ``wrap`` (repeat), ``clamp`` (to the edge
texels' centres) and ``zero``. Texel centres sit at ``(i + 0.5) / size``; with
``flip_v`` (the texture objects' default) v is replaced by ``1 - v`` first, so
maps keep PyTorch3D's row order (row 0 at v = 1); without it row 0 is at v = 0
(nvdiffrast's convention).

The samplers are loop-free ``@wp.func`` code; Warp's generated adjoint sends
gradients to the texels of every level read (then through the pyramid to the
base), to the UVs, and, in the ``linear-mipmap-linear`` mode, through the level
fraction to the UV derivatives. The square root and logarithm are taken only
where their argument is positive, so the adjoint stays finite: the square
root's kink at an exactly isotropic footprint contributes nothing there, and a
degenerate (zero) footprint or a clamped level gets zero gradient.
:func:`texture` records that generated adjoint;
:class:`~warpraster.shading.mipmap.TexturesUVMipmap` records a hand-written one
that gives the same gradients with one thread per slot instead of one per slot
and channel (:mod:`.mip_adjoint`).
"""

from __future__ import annotations

import enum

import warp as wp

from ..structs import new_struct
from .interpolate import (
    alloc_vector_out,
    as_float_array,
    as_slot_array,
    float_view,
    slot_channel,
)
from .mip_pyramid import MipLevels, MipPyramid, MipSampler, level_size, level_texel, mip_sampler
from .params import row
from .textures import check_map_batch, first_device, parse_enum

wp.set_module_options({"fuse_fp": False})

__all__ = ["BoundaryMode", "FilterMode", "texture"]


class FilterMode(enum.IntEnum):
    """nvdiffrast's ``filter_mode``."""

    NEAREST = 0
    LINEAR = 1
    LINEAR_MIPMAP_NEAREST = 2
    LINEAR_MIPMAP_LINEAR = 3


class BoundaryMode(enum.IntEnum):
    """nvdiffrast's ``boundary_mode`` (cube maps excluded)."""

    WRAP = 0
    CLAMP = 1
    ZERO = 2


# ----------------------------------------------------------------------------- sampling
@wp.func
def clamp_branch(x: float, lo: float, hi: float) -> float:
    """Clamp with zero gradient on and beyond the limits."""
    if x <= lo:
        return lo
    if x >= hi:
        return hi
    return x


@wp.func
def wrap_tap(y: int, x: int, h: int, w: int, boundary: int):
    """(row, column, inside) of texel (y, x) of an h x w level: wrapped (wrap); ``inside``
    False off the level (zero, clamp: the tap reads 0)."""
    xx = x
    yy = y
    if boundary == BoundaryMode.WRAP:
        if xx < 0:
            xx = xx + w
        if xx >= w:
            xx = xx - w
        if yy < 0:
            yy = yy + h
        if yy >= h:
            yy = yy - h
    return yy, xx, xx >= 0 and xx < w and yy >= 0 and yy < h


@wp.func
def boundary_texel(
    p: MipLevels, level: int, m: int, y: int, x: int, c: int, h: int, w: int, boundary: int
) -> float:
    """Texel of a bilinear tap, wrapped (wrap), or 0 outside the level (zero, clamp)."""
    yy, xx, inside = wrap_tap(y, x, h, w, boundary)
    if not inside:
        return 0.0
    return level_texel(p, level, m, yy, xx, c)


@wp.func
def bilinear_position(h: int, w: int, u: float, v: float, boundary: int):
    """Where a bilinear sample of an h x w level at (u, v) reads (texel centres at
    (i + 0.5) / size): ``(x, y, dx, dy)``, the texel-space position (wrapped, or
    clamped to the edge texels' centres) and the column / row offsets of the taps
    after the first (0 where clamp pins the sample to an edge texel's centre: the
    sample then has zero gradient along that axis)."""
    uu = u
    vv = v
    if boundary == BoundaryMode.WRAP:
        uu = uu - wp.floor(uu)
        vv = vv - wp.floor(vv)
    x = uu * float(w) - 0.5
    y = vv * float(h) - 0.5
    dx = 1
    dy = 1
    if boundary == BoundaryMode.CLAMP:
        x = clamp_branch(x, 0.0, float(w - 1))
        y = clamp_branch(y, 0.0, float(h - 1))
        if x == 0.0 or x == float(w - 1):
            dx = 0
        if y == 0.0 or y == float(h - 1):
            dy = 0
    return x, y, dx, dy


@wp.func
def near_level(x: float, y: float, h: int, w: int) -> bool:
    """Whether a bilinear sample at texel-space (x, y) of an h x w level has a tap
    inside (False far outside in zero mode, or NaN: the sample is 0; keeps int()
    in range)."""
    return x > -2.0 and x < float(w) + 1.0 and y > -2.0 and y < float(h) + 1.0


@wp.func
def texel_cell(x: float, y: float):
    """(x0, y0, fx, fy): the first tap of a bilinear sample at texel-space (x, y)
    and the fractions."""
    x0f = wp.floor(x)
    y0f = wp.floor(y)
    return int(x0f), int(y0f), x - x0f, y - y0f


@wp.func
def bilinear_level(
    p: MipLevels, level: int, m: int, c: int, u: float, v: float, boundary: int
) -> float:
    """Bilinear sample of ``level`` at (u, v) (texel centres at (i + 0.5) / size)."""
    hw = level_size(p, level)
    h = hw[0]
    w = hw[1]
    x, y, dx, dy = bilinear_position(h, w, u, v, boundary)
    if not near_level(x, y, h, w):
        return 0.0
    x0, y0, fx, fy = texel_cell(x, y)
    a00 = boundary_texel(p, level, m, y0, x0, c, h, w, boundary)
    a10 = boundary_texel(p, level, m, y0, x0 + dx, c, h, w, boundary)
    a01 = boundary_texel(p, level, m, y0 + dy, x0, c, h, w, boundary)
    a11 = boundary_texel(p, level, m, y0 + dy, x0 + dx, c, h, w, boundary)
    top = a00 + fx * (a10 - a00)
    bottom = a01 + fx * (a11 - a01)
    return top + fy * (bottom - top)


@wp.func
def nearest_cell(h: int, w: int, u: float, v: float, boundary: int):
    """(row, column) of the texel nearest to (u, v) in an h x w level (nvdiffrast's
    nearest mode), before the zero test and the clamp to the level."""
    uu = u
    vv = v
    if boundary == BoundaryMode.WRAP:
        uu = uu - wp.floor(uu)
        vv = vv - wp.floor(vv)
    # Bounded (and NaN sent to -1) before int(); the outcome is unchanged.
    x = uu * float(w)
    y = vv * float(h)
    if not (x >= -1.0):
        x = -1.0
    if not (y >= -1.0):
        y = -1.0
    x = wp.min(x, float(w) + 1.0)
    y = wp.min(y, float(h) + 1.0)
    return int(wp.floor(y)), int(wp.floor(x))


@wp.func
def nearest_base(
    maps: wp.array4d(dtype=wp.float32), m: int, c: int, u: float, v: float, boundary: int
) -> float:
    """Nearest texel of the base level (nvdiffrast's nearest mode)."""
    h = maps.shape[1]
    w = maps.shape[2]
    iy, ix = nearest_cell(h, w, u, v, boundary)
    if boundary == BoundaryMode.ZERO:
        if ix < 0 or ix >= w or iy < 0 or iy >= h:
            return 0.0
    return maps[m, wp.clamp(iy, 0, h - 1), wp.clamp(ix, 0, w - 1), c]


@wp.func
def texel_footprint(dudx: float, dvdx: float, dudy: float, dvdy: float, h: int, w: int):
    """nvdiffrast's pixel footprint in texels of an h x w level: ``(sx, tx, sy, ty, a,
    b, cc, l2a, major)``, the texel-space derivatives, the quadratic form's
    ``A = sx^2 + tx^2``, ``B = sy^2 + ty^2``, ``C = sx sy + tx ty``, the square root
    ``l2a`` (0 where its argument is not positive) and the squared major axis."""
    sx = dudx * float(w)
    sy = dudy * float(w)
    tx = dvdx * float(h)
    ty = dvdy * float(h)
    a = sx * sx + tx * tx
    b = sy * sy + ty * ty
    cc = sx * sy + tx * ty
    l2b = 0.5 * (a + b)
    l2n = 0.25 * (a - b) * (a - b) + cc * cc
    l2a = float(0.0)
    if l2n > 0.0:
        l2a = wp.sqrt(l2n)
    return sx, tx, sy, ty, a, b, cc, l2a, l2b + l2a


@wp.func
def mip_level(
    dudx: float, dvdx: float, dudy: float, dvdy: float, h: int, w: int, max_level: int
) -> float:
    """nvdiffrast's level: 0.5 log2 of the squared major axis of the texel footprint."""
    sx, tx, sy, ty, a, b, cc, l2a, major = texel_footprint(dudx, dvdx, dudy, dvdy, h, w)
    flevel = float(0.0)
    if major > 0.0:
        flevel = 0.5 * wp.log2(major)
    return clamp_branch(flevel, 0.0, float(max_level))


@wp.func
def sample_point(t: MipSampler, n: int, uv: wp.vec2, uv_dx: wp.vec2, uv_dy: wp.vec2):
    """(map m, u, v, dv/dx, dv/dy) that image ``n``'s sample reads: the map's row
    (0 when shared) and v, with its derivatives, flipped (``1 - v``) with ``flip_v``."""
    v = uv[1]
    dvx = uv_dx[1]
    dvy = uv_dy[1]
    if t.flip_v != 0:
        v = 1.0 - v
        dvx = -dvx
        dvy = -dvy
    return row(n, t.p.maps.shape[0]), uv[0], v, dvx, dvy


@wp.func
def mip_sample_channel(
    t: MipSampler, n: int, c: int, uv: wp.vec2, uv_dx: wp.vec2, uv_dy: wp.vec2
) -> float:
    """Channel ``c`` of image ``n``'s map (the one map when shared) sampled as
    nvdiffrast's ``texture`` at ``uv``."""
    m, u, v, dvx, dvy = sample_point(t, n, uv, uv_dx, uv_dy)
    if t.filter_mode == FilterMode.NEAREST:
        return nearest_base(t.p.maps, m, c, u, v, t.boundary)
    if t.filter_mode == FilterMode.LINEAR or t.max_level == 0:
        return bilinear_level(t.p, 0, m, c, u, v, t.boundary)
    flevel = mip_level(
        uv_dx[0], dvx, uv_dy[0], dvy, t.p.maps.shape[1], t.p.maps.shape[2], t.max_level
    )
    level0 = int(wp.floor(flevel))
    a = bilinear_level(t.p, level0, m, c, u, v, t.boundary)
    if t.filter_mode == FilterMode.LINEAR_MIPMAP_LINEAR and flevel > 0.0:
        level1 = wp.min(level0 + 1, t.max_level)
        frac = flevel - float(level0)
        bb = bilinear_level(t.p, level1, m, c, u, v, t.boundary)
        a = a + frac * (bb - a)
    return a


@wp.struct
class SlotUVs:
    """What :func:`texture` samples, per slot (N, H, W, K): ``uv`` (``vec2``), its
    screen-space derivatives ``uv_dx``, ``uv_dy`` (read when ``derivatives``) and
    ``pix_to_face`` (int32, read when ``masked``: slots with -1 give zeros)."""

    uv: wp.array4d(dtype=wp.vec2)
    derivatives: int
    uv_dx: wp.array4d(dtype=wp.vec2)
    uv_dy: wp.array4d(dtype=wp.vec2)
    masked: int
    pix_to_face: wp.array4d(dtype=wp.int32)


@wp.kernel
def _texture(
    # Slots in:
    s: SlotUVs,
    # Texture in:
    t: MipSampler,
    # Data out: (N, H, W, K * C) float view of a vector(C) array
    texels_out: wp.array4d(dtype=wp.float32),
):
    n, yi, xi, j = wp.tid()
    k, c = slot_channel(j, t.p.maps.shape[3])
    if s.masked != 0:
        if s.pix_to_face[n, yi, xi, k] < 0:
            texels_out[n, yi, xi, j] = 0.0
            return
    dx = wp.vec2(0.0)
    dy = wp.vec2(0.0)
    if s.derivatives != 0:
        dx = s.uv_dx[n, yi, xi, k]
        dy = s.uv_dy[n, yi, xi, k]
    texels_out[n, yi, xi, j] = mip_sample_channel(t, n, c, s.uv[n, yi, xi, k], dx, dy)


def _modes(filter_mode, boundary_mode, has_derivatives: bool):
    if isinstance(filter_mode, str) and filter_mode.strip().lower() == "auto":
        filter_mode = FilterMode.LINEAR_MIPMAP_LINEAR if has_derivatives else FilterMode.LINEAR
    fm = parse_enum(filter_mode, FilterMode, "filter_mode")
    bm = parse_enum(boundary_mode, BoundaryMode, "boundary_mode")
    return fm, bm


def texture(
    tex,
    uv,
    uv_dx=None,
    uv_dy=None,
    *,
    pix_to_face=None,
    filter_mode: str | FilterMode = "auto",
    boundary_mode: str | BoundaryMode = "wrap",
    max_mip_level: int | None = None,
    flip_v: bool = False,
    out: wp.array | None = None,
) -> wp.array:
    """Samples maps at per-slot UVs, as nvdiffrast's ``texture`` (mip-mapped with derivatives).

    Args:
        tex: (N, Ht, Wt, C) maps (one per image, or one shared; float32 / vector
            ``wp.array`` or NumPy; row 0 at v = 0 unless ``flip_v``) or a
            :class:`MipPyramid` (capturable: rebuild it with ``tex.build()`` when
            the texels change).
        uv: (N, H, W, K) ``vec2`` array (or NumPy (N, H, W, K, 2)).
        uv_dx, uv_dy: d uv / d x and d uv / d y per pixel (x right, y down), same
            shape; required by the mip-mapped filter modes.
        pix_to_face: optional (N, H, W, K) int32: slots with -1 give zeros.
        filter_mode: ``"auto"`` (``linear-mipmap-linear`` with derivatives, else
            ``linear``), ``"nearest"``, ``"linear"``, ``"linear-mipmap-nearest"``,
            ``"linear-mipmap-linear"`` (or :class:`FilterMode`).
        boundary_mode: ``"wrap"``, ``"clamp"`` or ``"zero"`` (or :class:`BoundaryMode`).
        max_mip_level: limit of the pyramid built from plain maps (ignored for a
            :class:`MipPyramid`).
        flip_v: sample at ``1 - v`` (maps in PyTorch3D's row order).
        out: optional preallocated (N, H, W, K) ``vector(C)`` result.

    Returns:
        ``wp.array`` (N, H, W, K) of ``vector(C, float32)``. On a ``wp.Tape``
        gradients flow to the texels, ``uv`` and (``linear-mipmap-linear``)
        ``uv_dx``/``uv_dy``.
    """
    fm, bm = _modes(filter_mode, boundary_mode, uv_dx is not None)
    mips = fm in (FilterMode.LINEAR_MIPMAP_NEAREST, FilterMode.LINEAR_MIPMAP_LINEAR)
    if isinstance(tex, MipPyramid):
        pyramid = tex
    elif mips:
        pyramid = MipPyramid(tex, max_mip_level=max_mip_level, device=first_device((uv,)))
    else:
        pyramid = None
    if pyramid is not None:
        maps, sampler = pyramid.maps, pyramid.sampler(fm, bm, flip_v)
    else:
        maps = as_float_array(tex, "tex", (None, None, None, None), first_device((uv,)))
        sampler = mip_sampler(new_struct(MipLevels, maps.device, maps=maps), 0, fm, bm, flip_v)
    device = maps.device
    uvs = as_slot_array(uv, "uv", wp.vec2, device)
    shape = tuple(uvs.shape)
    if mips and (uv_dx is None or uv_dy is None):
        raise ValueError(f"filter_mode {fm.name.lower()} needs uv_dx and uv_dy")
    if (uv_dx is None) != (uv_dy is None):
        raise ValueError("uv_dx and uv_dy must be given together")
    dxs = None if uv_dx is None else as_slot_array(uv_dx, "uv_dx", wp.vec2, device, shape)
    dys = None if uv_dy is None else as_slot_array(uv_dy, "uv_dy", wp.vec2, device, shape)
    p2f = None
    if pix_to_face is not None:
        p2f = as_slot_array(pix_to_face, "pix_to_face", wp.int32, device, shape)
    check_map_batch(maps, shape[0], "tex")
    c = maps.shape[3]
    rg = bool(maps.requires_grad or uvs.requires_grad or (dxs is not None and dxs.requires_grad))
    texels = alloc_vector_out(out, "out", shape, c, device, rg)
    n, h, w, k = shape
    # arrays left None become placeholders, not read (the flags say so)
    slots = new_struct(SlotUVs, device, uv=uvs, derivatives=int(dxs is not None), uv_dx=dxs,
                       uv_dy=dys, masked=int(p2f is not None), pix_to_face=p2f)  # fmt: skip
    wp.launch(
        _texture,
        dim=(n, h, w, k * c),
        inputs=[slots, sampler],
        outputs=[float_view(texels)],
        device=device,
    )
    return texels
