"""The hand-written adjoint of :class:`~warpraster.shading.mipmap.TexturesUVMipmap`'s
sampling kernel.

The forward (``mip_slots._sample_uv_mipmap_slots``) runs one thread per slot.
Warp's generated adjoint of its twin with one thread per slot and channel
(``mip_slots._sample_uv_mipmap``, the object's ``_generated_adjoint`` path) replays
the whole slot in every channel's thread and adds the slot's UV /
projected-vertex gradients into the per-face corner tables once per channel.
:meth:`SampleAdjoint.record` registers instead, with ``tape.record_func``, one
thread per slot (``_sample_uv_mipmap_adjoint``) that recomputes the UV, its
screen-space derivatives and the mip level once, adds every channel's texel
gradients (atomics into the base maps and the level buffer, as the generated
adjoint does), sums the gradients of the sampling position (and,
``linear-mipmap-linear``, of the level fraction) over the channels, and takes
the chain to the barycentrics (one store per slot) and to the corner tables (one
atomic add per slot and table) once.

It gives what the generated adjoint gives, up to the order of float sums,
including where that adjoint is zero: a clamped level (0 or the coarsest), the
square root of an exactly isotropic footprint and a zero footprint, clamp mode
pinned to an edge texel's centre, far outside the map in zero mode, ``floor``
(no gradient), the nearest filter (no UV gradient). Like Warp's adjoint of the
forward's store, it consumes (zeroes) the texels' gradient it reads.
"""

from __future__ import annotations

import warp as wp

from ..aggregated import add_mat32_row, add_mat33_row
from ..backward.tape import record_func
from ..geometry import EPS, barycentric, pixel_centre
from ..patches import patch_launch_size
from ..structs import StructCache
from ..variants import kernel_family, variant_kernel, variants_on, want_pin
from .corner_lists import VertexCorners, corner_of
from .mip_pyramid import MipLevels, MipSampler, level_index, level_size
from .mip_sampling import (
    BoundaryMode,
    FilterMode,
    bilinear_position,
    boundary_texel,
    mip_level,
    near_level,
    nearest_cell,
    sample_point,
    texel_cell,
    texel_footprint,
    wrap_tap,
)
from .mip_slots import (
    SampleInputs,
    mat32,
    patch_fragment,
    pinned_values,
    sample_pin,
    slot_uv_terms,
    zero_channels,
)

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

__all__ = ["SampleAdjoint", "SampleGrads"]

#: Bits of :attr:`SampleGrads.want`: the gradients the adjoint writes.
WANT_BASE = 1  # texels of the base maps
WANT_LEVELS = 2  # texels of levels 1..L
WANT_UV = 4
WANT_NDC = 8
WANT_BARY = 16

INV_LN2 = wp.constant(1.4426950408889634)


@wp.struct
class SampleGrads:
    """Where the adjoint adds: ``texels`` (the pyramid's :class:`MipLevels` with the
    ``.grad`` of its base maps and level buffer, and its offsets), the corner
    tables' ``uv`` (F,) ``mat32`` and ``ndc`` (F,) ``mat33`` gradients, the
    barycentrics' ``bary`` (N, H, W, K) ``vec3`` gradient; ``want`` says which
    of them are written (``WANT_*`` bits; the others are placeholders)."""

    texels: MipLevels
    uv: wp.array(dtype=mat32)
    ndc: wp.array(dtype=wp.mat33)
    bary: wp.array4d(dtype=wp.vec3)
    want: int


# ----------------------------------------------------------------------------- funcs
@wp.func
def edge_grads(p: wp.vec2, a: wp.vec2, b: wp.vec2):
    """(d/da, d/db) of the edge function E(p, a, b) (``geometry.edge_function``)."""
    return wp.vec2(p[1] - b[1], b[0] - p[0]), wp.vec2(a[1] - p[1], p[0] - a[0])


@wp.func
def bary_derivatives_grad(
    p: wp.vec2,
    v0: wp.vec3,
    v1: wp.vec3,
    v2: wp.vec3,
    perspective_correct: int,
    gdx: wp.vec3,
    gdy: wp.vec3,
):
    """Adjoint of :func:`~warpraster.shading.interpolate.bary_derivatives`: the
    gradients (vec3 each) to ``v0``, ``v1``, ``v2`` of ``dot(gdx, dx) + dot(gdy, dy)``,
    where (dx, dy) are its outputs at NDC point ``p`` (a constant)."""
    area = (v2[0] - v0[0]) * (v1[1] - v0[1]) - (v2[1] - v0[1]) * (v1[0] - v0[0]) + EPS
    # d area / d x_i and d area / d y_i (also the numerators of the screen derivatives)
    nx = wp.vec3(v2[1] - v1[1], v0[1] - v2[1], v1[1] - v0[1])
    ny = wp.vec3(v1[0] - v2[0], v2[0] - v0[0], v0[0] - v1[0])
    dsx = nx / area
    dsy = ny / area
    g_dsx = gdx
    g_dsy = gdy
    g_area = float(0.0)
    gx = wp.vec3(0.0)
    gy = wp.vec3(0.0)
    gz = wp.vec3(0.0)
    if perspective_correct != 0:
        p0 = wp.vec2(v0[0], v0[1])
        p1 = wp.vec2(v1[0], v1[1])
        p2 = wp.vec2(v2[0], v2[1])
        s = barycentric(p, p0, p1, p2)
        zz = wp.vec3(v1[2] * v2[2], v0[2] * v2[2], v0[2] * v1[2])
        w = wp.cw_mul(s, zz)
        wsum = w[0] + w[1] + w[2]
        denom = wp.max(wsum, EPS)
        dwx = wp.cw_mul(dsx, zz)
        dwy = wp.cw_mul(dsy, zz)
        g_dwx = gdx / denom
        g_dwy = gdy / denom
        g_w = wp.vec3(0.0)
        if wsum > EPS:
            # d = (dw - b sum(dw)) / denom with b = w / denom, denom = wsum
            b = w / denom
            sum_x = dwx[0] + dwx[1] + dwx[2]
            sum_y = dwy[0] + dwy[1] + dwy[2]
            dx = (dwx - b * sum_x) / denom
            dy = (dwy - b * sum_y) / denom
            g_dwx = g_dwx + wp.vec3(-wp.dot(b, gdx) / denom)
            g_dwy = g_dwy + wp.vec3(-wp.dot(b, gdy) / denom)
            g_b = -(sum_x * gdx + sum_y * gdy) / denom
            g_denom = -(wp.dot(gdx, dx) + wp.dot(gdy, dy) + wp.dot(g_b, b)) / denom
            g_w = g_b / denom + wp.vec3(g_denom)
        # else: denom is the constant EPS
        g_dsx = wp.cw_mul(g_dwx, zz)
        g_dsy = wp.cw_mul(g_dwy, zz)
        g_zz = wp.cw_mul(g_dwx, dsx) + wp.cw_mul(g_dwy, dsy) + wp.cw_mul(g_w, s)
        gz = wp.vec3(
            g_zz[1] * v2[2] + g_zz[2] * v1[2],
            g_zz[0] * v2[2] + g_zz[2] * v0[2],
            g_zz[0] * v1[2] + g_zz[1] * v0[2],
        )
        # s_i = E_i / area, E_0 = E(p, v1, v2), E_1 = E(p, v2, v0), E_2 = E(p, v0, v1)
        g_s = wp.cw_mul(g_w, zz)
        g_area = -wp.dot(g_s, s) / area
        ge = g_s / area
        a1, b2 = edge_grads(p, p1, p2)
        a2, b0 = edge_grads(p, p2, p0)
        a0, b1 = edge_grads(p, p0, p1)
        g0 = ge[1] * b0 + ge[2] * a0
        g1 = ge[0] * a1 + ge[2] * b1
        g2 = ge[0] * b2 + ge[1] * a2
        gx = wp.vec3(g0[0], g1[0], g2[0])
        gy = wp.vec3(g0[1], g1[1], g2[1])
    # ds = n / area
    g_area = g_area - (wp.dot(g_dsx, dsx) + wp.dot(g_dsy, dsy)) / area
    g_nx = g_dsx / area
    g_ny = g_dsy / area
    gx = gx + g_area * nx + wp.vec3(g_ny[2] - g_ny[1], g_ny[0] - g_ny[2], g_ny[1] - g_ny[0])
    gy = gy + g_area * ny + wp.vec3(g_nx[1] - g_nx[2], g_nx[2] - g_nx[0], g_nx[0] - g_nx[1])
    return (
        wp.vec3(gx[0], gy[0], gz[0]),
        wp.vec3(gx[1], gy[1], gz[1]),
        wp.vec3(gx[2], gy[2], gz[2]),
    )


@wp.func
def mip_level_grad(
    dudx: float, dvdx: float, dudy: float, dvdy: float, h: int, w: int, max_level: int, g: float
) -> wp.vec4:
    """Adjoint of :func:`~warpraster.shading.mip_sampling.mip_level`: ``g`` times its
    gradient to (dudx, dvdx, dudy, dvdy); zero where the level is clamped (on or
    beyond 0 and ``max_level``) or the footprint is zero; the square root's term
    only where its argument is positive."""
    sx, tx, sy, ty, a, b, cc, l2a, major = texel_footprint(dudx, dvdx, dudy, dvdy, h, w)
    if not (major > 0.0):
        return wp.vec4(0.0)
    flevel = 0.5 * wp.log2(major)
    if flevel <= 0.0 or flevel >= float(max_level):
        return wp.vec4(0.0)
    g_major = (1.0 / major) * INV_LN2 * (0.5 * g)
    g_a = 0.5 * g_major
    g_b = 0.5 * g_major
    g_cc = float(0.0)
    if l2a > 0.0:
        g_l2n = 0.5 * (1.0 / l2a) * g_major
        g_amb = 0.5 * (a - b) * g_l2n
        g_a = g_a + g_amb
        g_b = g_b - g_amb
        g_cc = 2.0 * cc * g_l2n
    g_sx = 2.0 * sx * g_a + sy * g_cc
    g_tx = 2.0 * tx * g_a + ty * g_cc
    g_sy = 2.0 * sy * g_b + sx * g_cc
    g_ty = 2.0 * ty * g_b + tx * g_cc
    return wp.vec4(g_sx * float(w), g_tx * float(h), g_sy * float(w), g_ty * float(h))


@wp.struct
class LevelTaps:
    """A bilinear sample's taps in one level (a local value of the kernel):
    :func:`~warpraster.shading.mip_sampling.bilinear_position`, ``near_level`` and
    ``texel_cell`` of ``level`` (size ``h`` x ``w``; the taps are not set where not
    ``near``), ``gx``, ``gy`` the derivatives d fx / d u and d fy / d v (0 where clamp
    pins the sample), and ``want``: whether this level's texel gradients are written."""

    level: int
    h: int
    w: int
    x0: int
    y0: int
    dx: int
    dy: int
    fx: float
    fy: float
    near: bool
    gx: float
    gy: float
    want: bool


@wp.func
def level_taps(t: MipSampler, level: int, u: float, v: float, want: int) -> LevelTaps:
    """The :class:`LevelTaps` of the sample at (u, v) in ``level`` (``want``: the
    kernel's ``WANT_*`` bits)."""
    q = LevelTaps()
    hw = level_size(t.p, level)
    q.level = level
    q.h = hw[0]
    q.w = hw[1]
    x, y, dx, dy = bilinear_position(q.h, q.w, u, v, t.boundary)
    q.dx = dx
    q.dy = dy
    q.near = near_level(x, y, q.h, q.w)
    if q.near:
        x0, y0, fx, fy = texel_cell(x, y)
        q.x0 = x0
        q.y0 = y0
        q.fx = fx
        q.fy = fy
    # x = u * w - 0.5 (u wrapped: d/du 1; clamp pinned to an edge centre: dx = 0)
    q.gx = float(q.w * q.dx)
    q.gy = float(q.h * q.dy)
    if level == 0:
        q.want = (want & WANT_BASE) != 0
    else:
        q.want = (want & WANT_LEVELS) != 0
    return q


@wp.func
def add_texel_grad(
    gp: MipLevels, q: LevelTaps, m: int, y: int, x: int, c: int, boundary: int, value: float
):
    """Adds ``value`` to the gradient of the texel the tap (y, x) of ``q`` reads (none
    outside the level in zero / clamp mode)."""
    yy, xx, inside = wrap_tap(y, x, q.h, q.w, boundary)
    if inside:
        if q.level == 0:
            wp.atomic_add(gp.maps, m, yy, xx, c, value)
        else:
            wp.atomic_add(gp.levels, level_index(gp, q.level, m, yy, xx, c), value)


@wp.func
def bilinear_channel_grad(
    p: MipLevels, gp: MipLevels, q: LevelTaps, m: int, c: int, boundary: int, g: float
) -> wp.vec3:
    """Channel ``c`` of the bilinear sample at the taps ``q`` and its adjoint for the
    output gradient ``g``: ``(value, g_u, g_v)`` (all 0 far outside the level); adds
    the four texel gradients when ``q.want``."""
    if not q.near:
        return wp.vec3(0.0)
    x1 = q.x0 + q.dx
    y1 = q.y0 + q.dy
    a00 = boundary_texel(p, q.level, m, q.y0, q.x0, c, q.h, q.w, boundary)
    a10 = boundary_texel(p, q.level, m, q.y0, x1, c, q.h, q.w, boundary)
    a01 = boundary_texel(p, q.level, m, y1, q.x0, c, q.h, q.w, boundary)
    a11 = boundary_texel(p, q.level, m, y1, x1, c, q.h, q.w, boundary)
    top = a00 + q.fx * (a10 - a00)
    bottom = a01 + q.fx * (a11 - a01)
    g_bottom = q.fy * g
    g_top = g - g_bottom
    if q.want:
        add_texel_grad(gp, q, m, q.y0, q.x0, c, boundary, g_top - q.fx * g_top)
        add_texel_grad(gp, q, m, q.y0, x1, c, boundary, q.fx * g_top)
        add_texel_grad(gp, q, m, y1, q.x0, c, boundary, g_bottom - q.fx * g_bottom)
        add_texel_grad(gp, q, m, y1, x1, c, boundary, q.fx * g_bottom)
    g_fx = g_top * (a10 - a00) + g_bottom * (a11 - a01)
    return wp.vec3(top + q.fy * (bottom - top), g_fx * q.gx, (g * (bottom - top)) * q.gy)


# ----------------------------------------------------------------------------- kernel
#: CUDA register cap of the adjoint (145 registers uncapped). K=1 hard Phong with
#: a 1024² mip-mapped texture on an H200 (`python scripts/gpu_mip_adjoint.py
#: --regs 64,96`): the kernel 0.477 ms uncapped, 0.356 at 96, 0.395 at 64; render
#: + MSE + backward, graph replay, 2.205 -> 2.081 ms at 96 (Warp's generated
#: adjoint: 0.788 ms, 2.516).
ADJOINT_MAX_REGISTERS = 96
#: Pixel patch width of the adjoint's launch (:mod:`~warpraster.patches`).
ADJOINT_PATCH_W = wp.constant(32)


@kernel_family
def _sample_uv_mipmap_adjoint(pins: tuple[int, ...] | None) -> wp.Kernel:
    """One thread per slot: the adjoint of ``mip_slots._sample_uv_mipmap_slots`` (and
    of its per-channel twin ``_sample_uv_mipmap``) over all C channels, launched
    over pixel patches (:mod:`~warpraster.patches`); ``pins``: the sampler's and
    corner tables' flags (:data:`~warpraster.shading.mip_slots.PINNED`) and ``want``,
    compiled in (None: read at run time)."""
    pin_a = sample_pin(None if pins is None else pins[:-1])
    pin_g = want_pin(SampleGrads, None if pins is None else pins[-1])

    def sample_uv_mipmap_adjoint(
        # In: the forward's inputs; the output's gradient (consumed: zeroed once
        # read), an (N, H, W, K * C) float view
        a: SampleInputs,
        texels_grad: wp.array4d(dtype=wp.float32),
        # Gradients out (added to):
        g: SampleGrads,
    ):
        a = wp.static(pin_a)(a)
        g = wp.static(pin_g)(g)
        n, yi, xi, k, f = patch_fragment(a.frag, wp.tid(), ADJOINT_PATCH_W)
        nc = a.t.p.maps.shape[3]
        j0 = k * nc
        if f < 0:
            if f == -1:
                zero_channels(texels_grad, n, yi, xi, j0, nc)
            return
        b = a.frag.bary_coords[n, yi, xi, k]
        shape = wp.vec2i(a.frag.pix_to_face.shape[1], a.frag.pix_to_face.shape[2])
        uv, duv_dx, duv_dy, uv0, uv1, uv2, dbx, dby, step = slot_uv_terms(
            a.corners, f, b, yi, xi, shape
        )
        m, u, v, dvx, dvy = sample_point(a.t, n, uv, duv_dx, duv_dy)
        base = level_size(a.t.p, 0)
        g_uv = wp.vec2(0.0)  # to (u, v) as the sampler reads them
        g_d = wp.vec4(0.0)  # to (du/dx, dv/dx, du/dy, dv/dy) as the sampler reads them
        two = False  # linear-mipmap-linear above level 0: two levels blended
        if a.t.filter_mode == FilterMode.NEAREST:
            iy, ix = nearest_cell(base[0], base[1], u, v, a.t.boundary)
            inside = True
            if a.t.boundary == BoundaryMode.ZERO:
                inside = ix >= 0 and ix < base[1] and iy >= 0 and iy < base[0]
            iy = wp.clamp(iy, 0, base[0] - 1)
            ix = wp.clamp(ix, 0, base[1] - 1)
            for c in range(nc):
                gc = texels_grad[n, yi, xi, j0 + c]
                texels_grad[n, yi, xi, j0 + c] = 0.0
                if inside and (g.want & WANT_BASE) != 0:
                    wp.atomic_add(g.texels.maps, m, iy, ix, c, gc)
        else:
            level0 = int(0)
            level1 = int(0)
            frac = float(0.0)
            if a.t.filter_mode != FilterMode.LINEAR and a.t.max_level != 0:
                flevel = mip_level(duv_dx[0], dvx, duv_dy[0], dvy, base[0], base[1], a.t.max_level)
                level0 = int(wp.floor(flevel))
                if a.t.filter_mode == FilterMode.LINEAR_MIPMAP_LINEAR and flevel > 0.0:
                    two = True
                    level1 = wp.min(level0 + 1, a.t.max_level)
                    frac = flevel - float(level0)
            q0 = level_taps(a.t, level0, u, v, g.want)
            q1 = level_taps(a.t, level1, u, v, g.want)
            g_frac = float(0.0)
            for c in range(nc):
                gc = texels_grad[n, yi, xi, j0 + c]
                texels_grad[n, yi, xi, j0 + c] = 0.0
                if two:  # a + frac (b - a)
                    gb = frac * gc
                    ra = bilinear_channel_grad(a.t.p, g.texels, q0, m, c, a.t.boundary, gc - gb)
                    rb = bilinear_channel_grad(a.t.p, g.texels, q1, m, c, a.t.boundary, gb)
                    g_uv += wp.vec2(ra[1] + rb[1], ra[2] + rb[2])
                    g_frac += gc * (rb[0] - ra[0])
                else:
                    ra = bilinear_channel_grad(a.t.p, g.texels, q0, m, c, a.t.boundary, gc)
                    g_uv += wp.vec2(ra[1], ra[2])
            if two:
                g_d = mip_level_grad(
                    duv_dx[0], dvx, duv_dy[0], dvy, base[0], base[1], a.t.max_level, g_frac
                )
        if a.t.flip_v != 0:
            g_uv = wp.vec2(g_uv[0], -g_uv[1])
            g_d = wp.vec4(g_d[0], -g_d[1], g_d[2], -g_d[3])
        # the chain through slot_uv, once per slot
        g0 = b[0] * g_uv
        g1 = b[1] * g_uv
        g2 = b[2] * g_uv
        if two and a.corners.derivatives != 0:
            sdx = step * wp.vec2(g_d[0], g_d[1])
            sdy = step * wp.vec2(g_d[2], g_d[3])
            g0 = g0 + dbx[0] * sdx + dby[0] * sdy
            g1 = g1 + dbx[1] * sdx + dby[1] * sdy
            g2 = g2 + dbx[2] * sdx + dby[2] * sdy
            if (g.want & WANT_NDC) != 0:
                g_dbx = wp.vec3(wp.dot(sdx, uv0), wp.dot(sdx, uv1), wp.dot(sdx, uv2))
                g_dby = wp.vec3(wp.dot(sdy, uv0), wp.dot(sdy, uv1), wp.dot(sdy, uv2))
                ndc = a.corners.ndc[f]
                p = pixel_centre(yi, xi, shape[0], shape[1])
                gv0, gv1, gv2 = bary_derivatives_grad(
                    p, ndc[0], ndc[1], ndc[2], a.corners.perspective_correct, g_dbx, g_dby
                )
                add_mat33_row(g.ndc, f, wp.matrix_from_rows(gv0, gv1, gv2))
        if (g.want & WANT_UV) != 0:
            add_mat32_row(g.uv, f, mat32(g0[0], g0[1], g1[0], g1[1], g2[0], g2[1]))
        if (g.want & WANT_BARY) != 0:
            g_b = wp.vec3(wp.dot(g_uv, uv0), wp.dot(g_uv, uv1), wp.dot(g_uv, uv2))
            g.bary[n, yi, xi, k] = g.bary[n, yi, xi, k] + g_b

    return variant_kernel(sample_uv_mipmap_adjoint, "sample_uv_mipmap_adjoint", pins,
                          ADJOINT_MAX_REGISTERS)  # fmt: skip


# ----------------------------------------------------------------------------- recording
def _grad_of(arr: wp.array | None) -> wp.array | None:
    """``arr.grad`` when ``arr`` carries one, else None."""
    if arr is not None and arr.requires_grad and arr.grad is not None:
        return arr.grad
    return None


class SampleAdjoint:
    """Records the adjoint of one texture object's sampling launches on the active
    tape (the structs it passes are made again only when the gradient arrays
    change: no device allocation per call)."""

    def __init__(self):
        self._structs = StructCache()  # the kernels' argument structs, kept between calls

    def record(
        self, tape, dim: tuple, inputs: SampleInputs, texels: wp.array, *,
        specialize: bool | None = None,
    ) -> None:  # fmt: skip
        """Registers the adjoint of a ``_sample_uv_mipmap`` launch of ``dim`` (N, H,
        W, K * C) with these ``inputs`` and its (N, H, W, K * C) float32 output view
        ``texels`` (which carries a gradient) on ``tape``; ``specialize``: the kernel
        as a variant with its flags and gradient bits compiled in (None: on CUDA)."""
        frag, corners, sampler = inputs.frag, inputs.corners, inputs.t
        device = texels.device
        pairs = [  # (array, its gradient, WANT bit)
            (sampler.p.maps, _grad_of(sampler.p.maps), WANT_BASE),
            (sampler.p.levels, _grad_of(sampler.p.levels), WANT_LEVELS),
            (corners.uv, _grad_of(corners.uv), WANT_UV),
            (corners.ndc, _grad_of(corners.ndc) if corners.derivatives else None, WANT_NDC),
            (frag.bary_coords, _grad_of(frag.bary_coords), WANT_BARY),
        ]
        want = 0
        sources = [texels]
        for arr, grad, bit in pairs:
            if grad is not None:
                want |= bit
                sources.append(arr)
        texel_grads = self._structs.new(MipLevels, device, maps=pairs[0][1],
                                        levels=pairs[1][1], offsets=sampler.p.offsets)  # fmt: skip
        grads = self._structs.new(SampleGrads, device, texels=texel_grads, uv=pairs[2][1],
                                  ndc=pairs[3][1], bary=pairs[4][1], want=want)  # fmt: skip
        n, h, w, kc = dim
        k = kc // max(sampler.p.maps.shape[3], 1)
        texels_grad = texels.grad
        pins = (*pinned_values(inputs), want) if variants_on(device, specialize) else None
        kernel = _sample_uv_mipmap_adjoint(pins)

        def backward():
            wp.launch(
                kernel,
                dim=patch_launch_size(n, h, w, ADJOINT_PATCH_W, k),
                inputs=[inputs, texels_grad],
                outputs=[grads],
                device=device,
            )

        record_func(tape, backward, arrays=sources)


# ----------------------------------------------------------------------------- corner tables
@wp.kernel
def _uv_corners_adjoint(
    # In: each UV vertex's corners, the per-face UV rows' gradient
    lists: VertexCorners,
    uv_grad: wp.array(dtype=mat32),
    # Out (added to): (T, 2)
    verts_uvs_grad: wp.array2d(dtype=wp.float32),
):
    """UV vertex t: adds the rows of its corners (ascending 3 f + c): the adjoint of
    :func:`~warpraster.shading.mip_slots._gather_corners`' UV rows, without atomics."""
    t = wp.tid()
    g0 = float(0.0)
    g1 = float(0.0)
    for e in range(lists.start[t], lists.start[t + 1]):
        fc = corner_of(lists, e)
        m = uv_grad[fc[0]]
        g0 += m[fc[1], 0]
        g1 += m[fc[1], 1]
    verts_uvs_grad[t, 0] = verts_uvs_grad[t, 0] + g0
    verts_uvs_grad[t, 1] = verts_uvs_grad[t, 1] + g1


@wp.kernel
def _ndc_corners_adjoint(
    # In: each vertex's corners, the per-face projected-vertex rows' gradient
    lists: VertexCorners,
    ndc_grad: wp.array(dtype=wp.mat33),
    # Out (added to): (V,)
    verts_ndc_grad: wp.array(dtype=wp.vec3),
):
    """Vertex v: adds the rows of its corners (ascending 3 f + c): the adjoint of the
    corner gather's projected-vertex rows, without atomics."""
    v = wp.tid()
    g = wp.vec3(0.0)
    for e in range(lists.start[v], lists.start[v + 1]):
        fc = corner_of(lists, e)
        m = ndc_grad[fc[0]]
        g += m[fc[1]]
    verts_ndc_grad[v] = verts_ndc_grad[v] + g


def record_corners_adjoint(tape, tables, uv_lists, verts_uvs, ndc_lists, verts_ndc) -> None:
    """Registers the gathers above as the adjoint of one corner-table gather:
    into ``verts_uvs.grad`` over ``uv_lists`` (the texture's ``faces_uvs``), and
    into ``verts_ndc.grad`` over ``ndc_lists`` (the mesh faces; None: the tables'
    projected rows were not gathered). Afterwards the tables' gradients are
    cleared (consumed, as Warp's adjoint of the gather's stores leaves them)."""
    device = tables.uv.device
    uv_grad = verts_uvs.grad
    ndc_grad = verts_ndc.grad if (ndc_lists is not None and verts_ndc is not None) else None

    def backward():
        if uv_grad is not None and uv_lists.num_verts:
            wp.launch(_uv_corners_adjoint, dim=uv_lists.num_verts,
                      inputs=[uv_lists.args, tables.uv.grad], outputs=[uv_grad],
                      device=device)  # fmt: skip
        if ndc_grad is not None and ndc_lists.num_verts:
            wp.launch(_ndc_corners_adjoint, dim=ndc_lists.num_verts,
                      inputs=[ndc_lists.args, tables.ndc.grad], outputs=[ndc_grad],
                      device=device)  # fmt: skip
        for table in (tables.uv, tables.ndc):
            if table.grad is not None:
                table.grad.zero_()

    arrays = [a for a in (tables.uv, tables.ndc, verts_uvs, verts_ndc)
              if a is not None and a.grad is not None]  # fmt: skip
    record_func(tape, backward, arrays=arrays)
