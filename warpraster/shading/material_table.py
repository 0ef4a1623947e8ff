"""The texture formula of a material table and a face's albedo, on the device.

:class:`MaterialTable` is the :class:`~warpraster.shading.atlas.Atlas` (diffuse
colours, opacities, per-material texture info and the texel atlas) packed as a
Warp struct, so a kernel that shades per face reads every material through one
argument. A texture is read bilinearly with its own wrap modes
(:class:`TextureWrap`): :func:`texel_taps` finds the four taps and their
weights, :func:`bilinear` blends them (the one home of that formula).
:class:`CornerAlbedo` holds what a face's corners add (UVs, colours).
:func:`face_albedo` is the albedo and opacity of a point of a face: its
material's diffuse colour times the material's texture at the point's
interpolated UV (``texel * scale + bias``), or the diffuse colour alone for an
untextured material, and the material's opacity; a face without a material (-1)
takes its interpolated corner colour. The stage's per-slot kernel
(:func:`~warpraster.shading.atlas.sample_atlas`, Warp's generated adjoint) and
the sensor's kernels call it.
:func:`face_albedo_adjoint` is its hand-written derivative for adjoints written
by hand (the sensor's deterministic backward): the gradients of the diffuse row, of the
barycentrics (through the UV) and, for texel gradients, the four taps and their
weights.

The texel derivative is the bilinear one: inside a texel cell the sample is
bilinear in the UV, so ``d/du = w * d/dfx`` and ``d/dv = -h * d/dfy`` (v = 0
is the bottom row); across cell borders it jumps, as any bilinear lookup's does.
"""

from __future__ import annotations

from enum import IntEnum

import warp as wp

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "CornerAlbedo",
    "MaterialTable",
    "TextureWrap",
    "bilinear",
    "face_albedo",
    "face_albedo_adjoint",
    "material_table",
    "texel_taps",
]


class TextureWrap(IntEnum):
    """How a texel index outside the image is read (``UsdUVTexture`` ``wrapS``/``wrapT``)."""

    REPEAT = 0
    CLAMP = 1
    MIRROR = 2
    BLACK = 3  # outside reads (0, 0, 0, 1)


@wp.func
def _wrap(i: int, n: int, mode: int) -> int:
    """Texel index ``i`` wrapped into [0, n) (-1 for BLACK outside)."""
    if mode == TextureWrap.CLAMP:
        return wp.clamp(i, 0, n - 1)
    if mode == TextureWrap.MIRROR:
        p = ((i % (2 * n)) + 2 * n) % (2 * n)
        if p >= n:
            p = 2 * n - 1 - p
        return p
    if mode == TextureWrap.BLACK:
        if i < 0 or i >= n:
            return -1
        return i
    return ((i % n) + n) % n


@wp.func
def texel_taps(info: wp.vec4i, uv: wp.vec2):
    """The bilinear lookup of ``uv`` in the texture ``info`` = (first texel, width,
    height, wrap_s * 4 + wrap_t), v = 0 the bottom row of the image (USD's ``st``):
    (texel indices of the taps c00, c10, c01, c11 (-1: outside, a BLACK border),
    their weights, fx, fy)."""
    w = info[1]
    h = info[2]
    x = uv[0] * float(w) - 0.5
    y = (1.0 - uv[1]) * float(h) - 0.5
    x0 = wp.floor(x)
    y0 = wp.floor(y)
    fx = x - x0
    fy = y - y0
    ws = info[3] // 4
    wt = info[3] % 4
    ix0 = _wrap(int(x0), w, ws)
    ix1 = _wrap(int(x0) + 1, w, ws)
    iy0 = _wrap(int(y0), h, wt)
    iy1 = _wrap(int(y0) + 1, h, wt)
    idx = wp.vec4i(
        _tap(info[0], w, ix0, iy0),
        _tap(info[0], w, ix1, iy0),
        _tap(info[0], w, ix0, iy1),
        _tap(info[0], w, ix1, iy1),
    )
    wgt = wp.vec4((1.0 - fx) * (1.0 - fy), fx * (1.0 - fy), (1.0 - fx) * fy, fx * fy)
    return idx, wgt, fx, fy


@wp.func
def _tap(base: int, w: int, ix: int, iy: int) -> int:
    if ix < 0 or iy < 0:
        return -1
    return base + iy * w + ix


@wp.func
def _texel_at(texels: wp.array(dtype=wp.vec4), i: int) -> wp.vec4:
    """Texel ``i`` of the atlas; (0, 0, 0, 1) for -1 (a BLACK border)."""
    if i < 0:
        return wp.vec4(0.0, 0.0, 0.0, 1.0)
    return texels[i]


@wp.func
def _lerp(a: wp.vec4, b: wp.vec4, t: float) -> wp.vec4:
    return a * (1.0 - t) + b * t


@wp.func
def bilinear(texels: wp.array(dtype=wp.vec4), info: wp.vec4i, uv: wp.vec2) -> wp.vec4:
    """Bilinear sample of ``uv`` in the texture ``info`` (see :func:`texel_taps`)."""
    idx, _wgt, fx, fy = texel_taps(info, uv)
    top = _lerp(_texel_at(texels, idx[0]), _texel_at(texels, idx[1]), fx)
    bottom = _lerp(_texel_at(texels, idx[2]), _texel_at(texels, idx[3]), fx)
    return _lerp(top, bottom, fy)


@wp.struct
class MaterialTable:
    """An :class:`~warpraster.shading.atlas.Atlas`'s device arrays: ``diffuse`` (M,)
    vec3, ``opacity`` (M,), ``texture`` (M,) vec4i (first texel, width, height,
    wrap_s * 4 + wrap_t; width 0: untextured), ``tex_scale`` / ``tex_bias`` (M,)
    vec4, ``texels`` (T,) vec4 RGBA."""

    diffuse: wp.array(dtype=wp.vec3)
    opacity: wp.array(dtype=wp.float32)
    texture: wp.array(dtype=wp.vec4i)
    tex_scale: wp.array(dtype=wp.vec4)
    tex_bias: wp.array(dtype=wp.vec4)
    texels: wp.array(dtype=wp.vec4)


def material_table(atlas) -> MaterialTable:
    """The :class:`MaterialTable` of an ``Atlas`` (its arrays, not copies)."""
    t = MaterialTable()
    for name in MaterialTable.vars:
        setattr(t, name, getattr(atlas, name))
    return t


@wp.struct
class CornerAlbedo:
    """The per-corner tables :func:`face_albedo` reads, (F, 3) rows of a face's
    corners: texture coordinates ``uv`` (``vec2``) and linear RGBA ``color``
    (``vec4``, the albedo of a face without a material)."""

    uv: wp.array2d(dtype=wp.vec2)
    color: wp.array2d(dtype=wp.vec4)


@wp.func
def face_uv(corners: CornerAlbedo, f: int, b: wp.vec3) -> wp.vec2:
    """The UV of the point with barycentrics ``b`` of face ``f`` (per-corner UVs)."""
    return b[0] * corners.uv[f, 0] + b[1] * corners.uv[f, 1] + b[2] * corners.uv[f, 2]


@wp.func
def _scaled(t: wp.vec4, sc: wp.vec4, bi: wp.vec4) -> wp.vec3:
    return wp.vec3(t[0] * sc[0] + bi[0], t[1] * sc[1] + bi[1], t[2] * sc[2] + bi[2])


@wp.func
def face_albedo(table: MaterialTable, m: int, corners: CornerAlbedo, f: int, b: wp.vec3) -> wp.vec4:
    """Albedo (rgb) and opacity (a) of material ``m`` at the point with barycentrics
    ``b`` of face ``f`` (its row of ``corners``): the diffuse colour, times
    ``texel * scale + bias`` of its texture at the interpolated UV when it has one,
    and the material's opacity; for ``m`` = -1 (no material) the interpolated
    corner colour and alpha (USD's ``displayColor`` / ``displayOpacity``)."""
    if m < 0:
        return b[0] * corners.color[f, 0] + b[1] * corners.color[f, 1] + b[2] * corners.color[f, 2]
    kd = table.diffuse[m]
    info = table.texture[m]
    if info[1] > 0:
        t = bilinear(table.texels, info, face_uv(corners, f, b))
        kd = wp.cw_mul(kd, _scaled(t, table.tex_scale[m], table.tex_bias[m]))
    return wp.vec4(kd[0], kd[1], kd[2], table.opacity[m])


@wp.func
def face_albedo_adjoint(
    table: MaterialTable, m: int, corners: CornerAlbedo, f: int, b: wp.vec3, g: wp.vec3
):
    """Gradients of :func:`face_albedo`'s rgb for an upstream gradient ``g`` of it:
    (of the diffuse row ``m``, of the barycentrics ``b``, of the scaled texel
    (``g * diffuse * scale``, rgb: a tap's texel gradient is its weight times this)).
    Untextured: (g, 0, 0); no material (``m`` = -1): (0, the corner colours', 0)."""
    if m < 0:
        c0 = corners.color[f, 0]
        c1 = corners.color[f, 1]
        c2 = corners.color[f, 2]
        g_c = wp.vec3(
            g[0] * c0[0] + g[1] * c0[1] + g[2] * c0[2],
            g[0] * c1[0] + g[1] * c1[1] + g[2] * c1[2],
            g[0] * c2[0] + g[1] * c2[1] + g[2] * c2[2],
        )
        return wp.vec3(0.0), g_c, wp.vec3(0.0)
    kd = table.diffuse[m]
    info = table.texture[m]
    if info[1] <= 0:
        return g, wp.vec3(0.0), wp.vec3(0.0)
    uv = face_uv(corners, f, b)
    sc = table.tex_scale[m]
    bi = table.tex_bias[m]
    idx, _wgt, fx, fy = texel_taps(info, uv)
    texels = table.texels
    c00 = _texel_at(texels, idx[0])
    c10 = _texel_at(texels, idx[1])
    c01 = _texel_at(texels, idx[2])
    c11 = _texel_at(texels, idx[3])
    top = _lerp(c00, c10, fx)
    bottom = _lerp(c01, c11, fx)
    t = _lerp(top, bottom, fy)
    g_kd = wp.cw_mul(g, _scaled(t, sc, bi))
    g_t = wp.cw_mul(wp.cw_mul(g, kd), wp.vec3(sc[0], sc[1], sc[2]))
    d_fx = _lerp(c10 - c00, c11 - c01, fy)
    d_fy = bottom - top
    g_u = float(info[1]) * (g_t[0] * d_fx[0] + g_t[1] * d_fx[1] + g_t[2] * d_fx[2])
    g_v = -float(info[2]) * (g_t[0] * d_fy[0] + g_t[1] * d_fy[1] + g_t[2] * d_fy[2])
    g_uv = wp.vec2(g_u, g_v)
    g_b = wp.vec3(
        wp.dot(g_uv, corners.uv[f, 0]),
        wp.dot(g_uv, corners.uv[f, 1]),
        wp.dot(g_uv, corners.uv[f, 2]),
    )
    return g_kd, g_b, g_t
