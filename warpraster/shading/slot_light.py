"""What the pixel kernel computes for one slot: its surface, its light, its colour.

A filled slot's surface (point, normal, texel) comes from the per-face corner
tables and the barycentrics (:func:`surface`); the viewer is the camera centre,
or the camera's forward axis for an orthographic camera (:func:`view_toward`);
a two-sided render turns the normal toward the viewer; then the slot is lit
with PyTorch3D's model, summed over the image's lights (:func:`lit_colour_toward`).
The softmax blend's sums over a pixel's slots live here too: the forward kernel
(:mod:`warpraster.shading.fused`) and its adjoint
(:mod:`warpraster.shading.fused_adjoint`) both call them.
"""

from __future__ import annotations

import warp as wp

from .lighting import (
    LightKind,
    diffuse,
    direction_toward,
    light_index,
    light_kind,
    light_range,
    specular_toward,
)
from .modes import ShadingMode, TexelSource
from .params import row
from .pixel_args import PixelFragments
from .shade_inputs import (
    BLEND_EPS,
    ShadeInputs,
    camera_centre,
    camera_centre_precise,
    material_row,
    prob,
    zinv,
)

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "light_parts",
    "light_terms_at",
    "lit_colour_toward",
    "material_at",
    "slot_colour",
    "surface",
    "view_toward",
]


@wp.func
def light_terms_at(
    a: ShadeInputs,
    n: int,
    j: int,
    point: wp.vec3,
    normal: wp.vec3,
    to_eye: wp.vec3,
    shininess: float,
):
    """(diffuse, specular) light of light ``j`` of image ``n`` (before the material
    colours): PyTorch3D's ``diffuse`` and ``specular``, seen along ``to_eye``."""
    kind = light_kind(a.light, j)
    if kind == LightKind.AMBIENT:
        return wp.vec3(0.0), wp.vec3(0.0)
    lt = a.light
    p = lt.param[light_index(lt, n, j, lt.param.shape[0])]
    direction = direction_toward(kind, p, point)
    dc = lt.diffuse[light_index(lt, n, j, lt.diffuse.shape[0])]
    sc = lt.specular[light_index(lt, n, j, lt.specular.shape[0])]
    return (
        diffuse(normal, dc, direction),
        specular_toward(normal, direction, sc, to_eye, shininess),
    )


@wp.func
def light_parts(
    a: ShadeInputs,
    n: int,
    j: int,
    ma: wp.vec3,
    md: wp.vec3,
    shininess: float,
    point: wp.vec3,
    normal: wp.vec3,
    to_eye: wp.vec3,
):
    """What light ``j`` of image ``n`` is made of, for material colours ``ma``, ``md``:
    (``lit = m_a * l_a + m_d * diffuse``, ``l_a``, diffuse, specular). Its term of
    the lit colour is ``lit * texel + m_s * specular``; the adjoint reads the parts."""
    d, s = light_terms_at(a, n, j, point, normal, to_eye, shininess)
    la = a.light.ambient[light_index(a.light, n, j, a.light.ambient.shape[0])]
    return wp.cw_mul(ma, la) + wp.cw_mul(md, d), la, d, s


@wp.func
def _one_light(
    a: ShadeInputs,
    n: int,
    j: int,
    ma: wp.vec3,
    md: wp.vec3,
    ms: wp.vec3,
    shininess: float,
    point: wp.vec3,
    normal: wp.vec3,
    texel: wp.vec3,
    to_eye: wp.vec3,
) -> wp.vec3:
    """``(m_a * l_a + m_d * diffuse) * texel + m_s * specular`` of one light."""
    lit, _la, _d, s = light_parts(a, n, j, ma, md, shininess, point, normal, to_eye)
    return wp.cw_mul(lit, texel) + wp.cw_mul(ms, s)


@wp.func
def material_at(a: ShadeInputs, m: int):
    """Material row ``m``'s (shininess, ambient, diffuse, specular colours)."""
    mat = a.mat
    return (
        mat.shininess[row(m, mat.shininess.shape[0])],
        mat.ambient[row(m, mat.ambient.shape[0])],
        mat.diffuse[row(m, mat.diffuse.shape[0])],
        mat.specular[row(m, mat.specular.shape[0])],
    )


@wp.func
def lit_colour_toward(
    a: ShadeInputs,
    n: int,
    m: int,
    point: wp.vec3,
    normal: wp.vec3,
    texel: wp.vec3,
    to_eye: wp.vec3,
) -> wp.vec3:
    """PyTorch3D's lit colour with material row ``m``, summed in list order over the
    lights of image (or mesh) ``n``, seen along ``to_eye``. One light per image
    (``listed`` = 0): no loop (kernels with Warp's generated adjoint call this)."""
    shininess, ma, md, ms = material_at(a, m)
    if a.light.listed == 0:
        return _one_light(a, n, 0, ma, md, ms, shininess, point, normal, texel, to_eye)
    lo, hi = light_range(a.light, n)
    colour = wp.vec3(0.0)
    if hi > lo:
        colour = _one_light(a, n, lo, ma, md, ms, shininess, point, normal, texel, to_eye)
    for j in range(lo + 1, hi):
        colour = colour + _one_light(a, n, j, ma, md, ms, shininess, point, normal, texel, to_eye)
    return colour


@wp.func
def surface(a: ShadeInputs, n: int, y: int, x: int, k: int, f: int, b: wp.vec3):
    """(point, normal, texel) of a filled slot (as the per-slot shading kernel)."""
    pos = a.faces.pos[f]
    nrm = a.faces.nrm[f]
    point = wp.vec3(0.0)
    normal = wp.vec3(0.0)
    if a.mode == ShadingMode.FLAT:
        point = (pos[0] + pos[1] + pos[2]) / 3.0
        normal = nrm[0]
    else:
        point = b[0] * pos[0] + b[1] * pos[1] + b[2] * pos[2]
        normal = b[0] * nrm[0] + b[1] * nrm[1] + b[2] * nrm[2]
    texel = wp.vec3(1.0)
    if a.texel_source == TexelSource.VERTEX:
        col = a.faces.col[f]
        texel = b[0] * col[0] + b[1] * col[1] + b[2] * col[2]
    elif a.texel_source == TexelSource.PIXEL:
        texel = a.texels[n, y, x, k]
    return point, normal, texel


@wp.func
def view_toward(a: ShadeInputs, n: int, point: wp.vec3, eye: wp.vec3) -> wp.vec3:
    """From ``point`` toward the viewer (not normalised): ``eye - point``, or minus
    the camera's forward axis (the third column of R) when orthographic."""
    if a.orthographic != 0:
        r = a.cam.R[row(n, a.cam.R.shape[0])]
        return wp.vec3(-r[0, 2], -r[1, 2], -r[2, 2])
    return eye - point


@wp.func
def facing(a: ShadeInputs, normal: wp.vec3, to_eye: wp.vec3) -> float:
    """-1 where a two-sided render turns ``normal`` toward the viewer, else 1."""
    if a.two_sided != 0:
        if wp.dot(normal, to_eye) < 0.0:
            return -1.0
    return 1.0


@wp.func
def slot_colour(
    a: ShadeInputs, n: int, y: int, x: int, k: int, f: int, b: wp.vec3, eye: wp.vec3
) -> wp.vec3:
    """Colour of a filled slot: given, or lit."""
    if a.lit == 0:
        return a.colors[n, y, x, k]
    point, normal, texel = surface(a, n, y, x, k, f, b)
    to_eye = view_toward(a, n, point, eye)
    if facing(a, normal, to_eye) < 0.0:
        normal = -normal
    return lit_colour_toward(a, n, material_row(a, n, f), point, normal, texel, to_eye)


@wp.func
def write_rgba(image: wp.array4d(dtype=wp.float32), n: int, y: int, x: int, c: wp.vec3, a: float):
    image[n, y, x, 0] = c[0]
    image[n, y, x, 1] = c[1]
    image[n, y, x, 2] = c[2]
    image[n, y, x, 3] = a


@wp.func
def pixel_eye(a: ShadeInputs, n: int) -> wp.vec3:
    """The eye position of image ``n`` when the slots are lit (else unused: 0)."""
    if a.lit != 0:
        if a.precise_eye != 0:
            return camera_centre_precise(a.cam, n)
        return camera_centre(a.cam, n)
    return wp.vec3(0.0)


@wp.func
def depth_range(a: ShadeInputs, n: int):
    """(znear, zfar) of image ``n``."""
    return a.znear[row(n, a.znear.shape[0])], a.zfar[row(n, a.zfar.shape[0])]


@wp.func
def hard_hit(a: ShadeInputs, frag: PixelFragments, n: int, y: int, x: int) -> int:
    """The face a hard blend shows at (n, y, x): the first slot's, -1 where empty
    (or, with ``far_cut``, beyond ``zfar``)."""
    f0 = frag.pix_to_face[n, y, x, 0]
    if f0 >= 0 and a.far_cut != 0:
        if frag.zbuf[n, y, x, 0] > a.zfar[row(n, a.zfar.shape[0])]:
            f0 = -1
    return f0


@wp.func
def slot_opacity(a: ShadeInputs, n: int, y: int, x: int, k: int) -> float:
    """A hard blend's alpha of a covered slot: 1, or its clamped opacity (``slot_alpha``)."""
    if a.slot_alpha != 0:
        return wp.clamp(a.alpha[n, y, x, k], 0.0, 1.0)
    return 1.0


@wp.func
def softmax_sums(
    frag: PixelFragments,
    a: ShadeInputs,
    n: int,
    y: int,
    x: int,
    eye: wp.vec3,
    zn: float,
    zf: float,
    with_colour: int,
):
    """The softmax blend's sums over a pixel's slots: (largest inverse depth
    before the eps clamp, the first slot holding it, slots in use, coverage
    ``prod(1 - p_k)``, ``sum w_k``, ``sum w_k c_k``); the last only ``with_colour``
    (0 without: no slot is lit)."""
    kk = frag.pix_to_face.shape[3]
    zraw = float(-1.0e38)
    kmax = int(0)
    used = kk
    for k in range(kk):
        fk = frag.pix_to_face[n, y, x, k]
        zk = float(0.0)
        if fk < 0 and a.compact != 0:
            # the empty slots' zinv is 0: torch's max picks the first of them
            used = k
            if zk > zraw:
                zraw = zk
                kmax = k
            break
        zk = zinv(fk, frag.zbuf[n, y, x, k], zn, zf)
        if zk > zraw:
            zraw = zk
            kmax = k
    zmax = wp.max(zraw, BLEND_EPS)
    keep = float(1.0)
    wsum = float(0.0)
    csum = wp.vec3(0.0)
    for k in range(used):
        f = frag.pix_to_face[n, y, x, k]
        if f >= 0:
            p = prob(frag.dists[n, y, x, k], a.sigma)
            keep *= 1.0 - p
            wk = p * wp.exp((zinv(f, frag.zbuf[n, y, x, k], zn, zf) - zmax) / a.gamma)
            wsum += wk
            if with_colour != 0:
                csum += wk * slot_colour(a, n, y, x, k, f, frag.bary_coords[n, y, x, k], eye)
    return zraw, kmax, used, keep, wsum, csum


@wp.func
def softmax_denominator(zraw: float, wsum: float, gamma: float):
    """(zmax = max(zraw, eps), exp((eps - zmax) / gamma), delta = max(that, eps),
    sum w_k + delta): the background weight and the denominator of the blend."""
    zmax = wp.max(zraw, BLEND_EPS)
    dexp = wp.exp((BLEND_EPS - zmax) / gamma)
    delta = wp.max(dexp, BLEND_EPS)
    return zmax, dexp, delta, wsum + delta
