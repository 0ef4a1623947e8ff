"""Per-pixel shading and blending in one kernel, with a hand-written adjoint.

One thread per pixel walks its K slots once: it lights each filled slot
(PyTorch3D's Phong or flat model, :func:`lit_colour`) or reads a given colour,
and blends them (PyTorch3D's ``hard_rgb_blend`` or ``softmax_rgb_blend``, see
:mod:`warpraster.shading.blending` for the formulas) straight into the RGBA
image. No (N, H, W, K) colour array is written: at K = 8 and 512² for 8 images
that array is 200 MB, written once and read twice by separate shading and
blending kernels (and its gradient as much again).

The adjoint is one kernel too (one thread per pixel, recomputing the forward):
the blend's adjoint gives each slot's colour gradient, which goes straight into
the lighting adjoint written out below (torch's autograd of PyTorch3D's
``diffuse``/``specular``/``F.normalize`` formulas). Each thread owns its K
slots, so the barycentric, depth, distance and texel gradients are written
without atomics; what several pixels share (the per-face corner tables, light,
material, camera and background rows) is added with atomics, the per-image rows
only when they carry a gradient.

Blend and colour source are run-time ints: the branches are uniform across a
launch, so they cost no divergence.
"""

from __future__ import annotations

import warp as wp

from ..aggregated import add_mat33_row
from ..backward.tape import active_tape
from ..patches import patch_launch_size, patch_pixel
from .lighting import (
    NORMALIZE_EPS,
    LightKind,
    LightRows,
    light_direction,
    light_terms,
    normalize_eps,
    phong_alpha,
    phong_power,
)
from .modes import BlendMode, ShadingMode, TexelSource
from .params import new_struct, row
from .pixel_args import CameraRT, FaceCorners, MaterialRows, PixelFragments, fill_placeholders

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "BLEND_EPS",
    "ImageGrad",
    "ShadeGrads",
    "ShadeInputs",
    "camera_centre",
    "launch_shade_blend",
    "lit_colour",
    "material_row",
    "new_inputs",
    "slot_colour",
]

#: PyTorch3D's ``eps`` in ``softmax_rgb_blend``.
BLEND_EPS = wp.constant(1.0e-10)

# Bits of ShadeGrads.want: which gradients the adjoint writes.
WANT_BARY = 1
WANT_ZBUF = 2
WANT_DISTS = 4
WANT_COLORS = 8  # given colours, or the texel array (TexelSource.PIXEL)
WANT_FACE_POS = 16
WANT_FACE_NRM = 32
WANT_FACE_COL = 64
WANT_CAMERA = 128
WANT_LIGHT = 256
WANT_MATERIAL = 512
WANT_BACKGROUND = 1024


# ----------------------------------------------------------------------------- funcs
@wp.func
def camera_centre(cam: CameraRT, n: int):
    """World position of camera ``n``: ``C @ R + T = 0`` (row vectors), so ``C = -R T``."""
    r = cam.R[row(n, cam.R.shape[0])]
    t = cam.T[row(n, cam.T.shape[0])]
    return -(r * t)


@wp.func
def prob(d: float, sigma: float) -> float:
    """``sigmoid(-d / sigma)`` as torch computes it."""
    x = -d / sigma
    return 1.0 / (1.0 + wp.exp(-x))


@wp.func
def zinv(f: int, z: float, zn: float, zf: float) -> float:
    """PyTorch3D's ``(zfar - z) / (zfar - znear) * mask``."""
    if f < 0:
        return 0.0
    return (zf - z) / (zf - zn)


@wp.func
def _normalize_eps_adjoint(v: wp.vec3, g: wp.vec3) -> wp.vec3:
    """Gradient of ``v / max(|v|, eps)`` at ``v`` for the output gradient ``g``."""
    length = wp.length(v)
    if length > NORMALIZE_EPS:
        u = v / length
        return (g - u * wp.dot(u, g)) / length
    return g / NORMALIZE_EPS


# ----------------------------------------------------------------------------- structs
@wp.struct
class ShadeInputs:
    """What the pixel kernel reads besides the fragments.

    ``lit`` = 0: the slot colours are ``colors`` (blend only). ``lit`` = 1: each
    slot is lit: surface from the per-face corner tables ``faces``, the texel
    from ``texel_source``, camera ``cam``, ``light`` and material ``mat`` rows.

    ``material_per_face`` = 1: face f is lit with material row
    ``face_material[f]`` (a material table); 0: with the image's row (one
    material per image, PyTorch3D's ``Materials``).

    ``compact`` = 1 promises that each pixel's filled slots come first (the
    rasterizer's sorted queues): the slot loops stop at the first empty slot
    instead of reading all K (at K = 8 most slots are empty).
    """

    lit: int
    colors: wp.array4d(dtype=wp.vec3)
    mode: int
    texel_source: int
    faces: FaceCorners
    texels: wp.array4d(dtype=wp.vec3)
    cam: CameraRT
    light: LightRows
    mat: MaterialRows
    face_material: wp.array(dtype=wp.int32)
    material_per_face: int
    blend: int
    compact: int
    background: wp.array(dtype=wp.vec3)
    znear: wp.array(dtype=wp.float32)
    zfar: wp.array(dtype=wp.float32)
    sigma: float
    gamma: float


@wp.struct
class ShadeGrads:
    """Where the adjoint adds its gradients: those of the fragments (``frag``:
    ``bary_coords``, ``zbuf``, ``dists``; ``pix_to_face`` is not written) and of
    the arrays of :class:`ShadeInputs` (each nested struct holds the gradients of
    the same fields), and ``want``, the WANT_* bits of those it writes."""

    want: int
    frag: PixelFragments
    colors: wp.array4d(dtype=wp.vec3)
    faces: FaceCorners
    cam: CameraRT
    light: LightRows
    mat: MaterialRows
    background: wp.array(dtype=wp.vec3)


@wp.struct
class ImageGrad:
    """The image gradient the adjoint reads: ``grad`` (N, H, W, 4), the image's
    ``.grad``, plus, when ``mse`` = 1, the gradient of an image MSE computed on
    the fly (:meth:`warpraster.Renderer.image_mse`, which then writes no image
    gradient): ``2 weight loss_grad[0] (image - target)``, as
    :func:`~warpraster.shading.reductions.image_mse`'s backward adds it."""

    grad: wp.array4d(dtype=wp.float32)
    mse: int
    target: wp.array4d(dtype=wp.float32)
    loss_grad: wp.array(dtype=wp.float32)
    weight: float


#: The structs nested in ShadeInputs and ShadeGrads, by field name.
_NESTED = {"faces": FaceCorners, "cam": CameraRT, "light": LightRows, "mat": MaterialRows}


def new_inputs(device) -> ShadeInputs:
    """A :class:`ShadeInputs` whose arrays (nested ones too) are one-element
    placeholders on ``device`` (Warp's tape walks every array field of a struct
    it differentiates)."""
    a = new_struct(ShadeInputs, device)
    for name, cls in _NESTED.items():
        fill_placeholders(getattr(a, name), cls, device)
    return a


@wp.func
def _wants(g: ShadeGrads, bit: int) -> bool:
    return (g.want & bit) != 0


@wp.func
def material_row(a: ShadeInputs, n: int, f: int) -> int:
    """The material row that lights face ``f`` in image ``n``: the face's own
    (a material table, ``material_per_face``) or the image's."""
    if a.material_per_face != 0:
        return a.face_material[f]
    return n


@wp.func
def lit_colour(
    a: ShadeInputs,
    n: int,
    m: int,
    point: wp.vec3,
    normal: wp.vec3,
    texel: wp.vec3,
    eye: wp.vec3,
):
    """``(m_a * l_a + m_d * diffuse) * texel + m_s * specular`` with the light rows
    of image (or mesh) ``n`` and material row ``m`` (PyTorch3D)."""
    shininess = a.mat.shininess[row(m, a.mat.shininess.shape[0])]
    d, s = light_terms(a.light, n, point, normal, eye, shininess)
    ambient = wp.cw_mul(
        a.mat.ambient[row(m, a.mat.ambient.shape[0])],
        a.light.ambient[row(n, a.light.ambient.shape[0])],
    )
    diff = wp.cw_mul(a.mat.diffuse[row(m, a.mat.diffuse.shape[0])], d)
    spec = wp.cw_mul(a.mat.specular[row(m, a.mat.specular.shape[0])], s)
    return wp.cw_mul(ambient + diff, texel) + spec


# ----------------------------------------------------------------------------- slots
@wp.func
def _surface(a: ShadeInputs, n: int, y: int, x: int, k: int, f: int, b: wp.vec3):
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
def slot_colour(
    a: ShadeInputs, n: int, y: int, x: int, k: int, f: int, b: wp.vec3, eye: wp.vec3
) -> wp.vec3:
    """Colour of a filled slot: given, or lit."""
    if a.lit == 0:
        return a.colors[n, y, x, k]
    point, normal, texel = _surface(a, n, y, x, k, f, b)
    return lit_colour(a, n, material_row(a, n, f), point, normal, texel, eye)


@wp.func
def _light_adjoint(
    a: ShadeInputs,
    g: ShadeGrads,
    n: int,
    m: int,
    point: wp.vec3,
    normal: wp.vec3,
    texel: wp.vec3,
    eye: wp.vec3,
    gc: wp.vec3,
):
    """Adjoint of :func:`lit_colour` (light rows ``n``, material row ``m``) for the
    colour gradient ``gc``.

    Adds the light/material row gradients (when wanted) and returns the
    gradients of (point, normal, texel, eye) and the lit colour itself (the same
    float32 operations as :func:`lit_colour`)."""
    rs = row(m, a.mat.shininess.shape[0])
    ra = row(m, a.mat.ambient.shape[0])
    rd = row(m, a.mat.diffuse.shape[0])
    rsp = row(m, a.mat.specular.shape[0])
    rla = row(n, a.light.ambient.shape[0])
    shininess = a.mat.shininess[rs]
    ma = a.mat.ambient[ra]
    md = a.mat.diffuse[rd]
    ms = a.mat.specular[rsp]
    la = a.light.ambient[rla]
    d, s = light_terms(a.light, n, point, normal, eye, shininess)
    ambient = wp.cw_mul(ma, la)
    diff = wp.cw_mul(md, d)
    colour = wp.cw_mul(ambient + diff, texel) + wp.cw_mul(ms, s)
    g_texel = wp.cw_mul(gc, ambient + diff)
    g_lit = wp.cw_mul(gc, texel)  # d/d(ambient) = d/d(diff)
    g_d = wp.cw_mul(g_lit, md)
    g_s = wp.cw_mul(gc, ms)
    if _wants(g, WANT_MATERIAL):
        wp.atomic_add(g.mat.ambient, ra, wp.cw_mul(g_lit, la))
        wp.atomic_add(g.mat.diffuse, rd, wp.cw_mul(g_lit, d))
        wp.atomic_add(g.mat.specular, rsp, wp.cw_mul(gc, s))
    if _wants(g, WANT_LIGHT):
        wp.atomic_add(g.light.ambient, rla, wp.cw_mul(g_lit, ma))
    g_point = wp.vec3(0.0)
    g_normal = wp.vec3(0.0)
    g_eye = wp.vec3(0.0)
    if a.light.kind != LightKind.AMBIENT:
        rld = row(n, a.light.diffuse.shape[0])
        rls = row(n, a.light.specular.shape[0])
        direction = light_direction(a.light, n, point)
        dc = a.light.diffuse[rld]
        sc = a.light.specular[rls]
        nn = normalize_eps(normal)
        dd = normalize_eps(direction)
        cos_angle = wp.dot(nn, dd)
        g_nn = wp.vec3(0.0)
        g_dd = wp.vec3(0.0)
        # diffuse = dc * relu(cos)
        angle = wp.max(cos_angle, 0.0)
        g_angle = wp.dot(g_d, dc)
        if cos_angle > 0.0:
            g_nn += g_angle * dd
            g_dd += g_angle * nn
        # specular = sc * relu(view . reflect)^shininess, 0 where cos <= 0
        view_raw = eye - point
        view = normalize_eps(view_raw)
        reflect = -dd + 2.0 * (cos_angle * nn)
        alpha = phong_alpha(cos_angle, view, reflect)
        power = phong_power(alpha, shininess)
        g_power = wp.dot(g_s, sc)
        if alpha > 0.0:
            g_alpha = g_power * (shininess * wp.pow(alpha, shininess - 1.0))
            if _wants(g, WANT_MATERIAL):
                wp.atomic_add(g.mat.shininess, rs, g_power * (power * wp.log(alpha)))
            g_view = g_alpha * reflect
            g_reflect = g_alpha * view
            g_dd += -g_reflect
            g_two = 2.0 * g_reflect  # d/d(cos * nn)
            g_cos = wp.dot(g_two, nn)
            g_nn += g_two * cos_angle
            g_nn += g_cos * dd
            g_dd += g_cos * nn
            g_v = _normalize_eps_adjoint(view_raw, g_view)
            g_eye = g_v
            g_point = -g_v
        g_normal = _normalize_eps_adjoint(normal, g_nn)
        g_dir = _normalize_eps_adjoint(direction, g_dd)
        if a.light.kind == LightKind.POINT:
            g_point = g_point - g_dir
        if _wants(g, WANT_LIGHT):
            wp.atomic_add(g.light.param, row(n, a.light.param.shape[0]), g_dir)
            wp.atomic_add(g.light.diffuse, rld, g_d * angle)
            wp.atomic_add(g.light.specular, rls, g_s * power)
    return g_point, g_normal, g_texel, g_eye, colour


@wp.func
def _slot_adjoint(
    a: ShadeInputs,
    g: ShadeGrads,
    n: int,
    y: int,
    x: int,
    k: int,
    f: int,
    b: wp.vec3,
    eye: wp.vec3,
    gc: wp.vec3,
):
    """Adjoint of :func:`slot_colour` for the colour gradient ``gc``; returns the
    eye-position gradient (the caller adds it to the camera once per pixel) and
    the slot's colour (:func:`slot_colour`'s value, computed on the way)."""
    if a.lit == 0:
        if _wants(g, WANT_COLORS):
            g.colors[n, y, x, k] = g.colors[n, y, x, k] + gc
        return wp.vec3(0.0), a.colors[n, y, x, k]
    point, normal, texel = _surface(a, n, y, x, k, f, b)
    g_point, g_normal, g_texel, g_eye, colour = _light_adjoint(
        a, g, n, material_row(a, n, f), point, normal, texel, eye, gc
    )
    pos = a.faces.pos[f]
    nrm = a.faces.nrm[f]
    gb = wp.vec3(0.0)
    if a.mode == ShadingMode.FLAT:
        if _wants(g, WANT_FACE_POS):
            gp = g_point / 3.0
            wp.atomic_add(g.faces.pos, f, wp.matrix_from_rows(gp, gp, gp))
        if _wants(g, WANT_FACE_NRM):
            wp.atomic_add(g.faces.nrm, f, wp.matrix_from_rows(g_normal, wp.vec3(0.0), wp.vec3(0.0)))
    else:
        gb = wp.vec3(
            wp.dot(pos[0], g_point) + wp.dot(nrm[0], g_normal),
            wp.dot(pos[1], g_point) + wp.dot(nrm[1], g_normal),
            wp.dot(pos[2], g_point) + wp.dot(nrm[2], g_normal),
        )
        if _wants(g, WANT_FACE_POS):
            add_mat33_row(
                g.faces.pos, f, wp.matrix_from_rows(b[0] * g_point, b[1] * g_point, b[2] * g_point)
            )
        if _wants(g, WANT_FACE_NRM):
            add_mat33_row(
                g.faces.nrm,
                f,
                wp.matrix_from_rows(b[0] * g_normal, b[1] * g_normal, b[2] * g_normal),
            )
    if a.texel_source == TexelSource.VERTEX:
        col = a.faces.col[f]
        gb += wp.vec3(wp.dot(col[0], g_texel), wp.dot(col[1], g_texel), wp.dot(col[2], g_texel))
        if _wants(g, WANT_FACE_COL):
            add_mat33_row(
                g.faces.col, f, wp.matrix_from_rows(b[0] * g_texel, b[1] * g_texel, b[2] * g_texel)
            )
    elif a.texel_source == TexelSource.PIXEL:
        if _wants(g, WANT_COLORS):
            g.colors[n, y, x, k] = g.colors[n, y, x, k] + g_texel
    if _wants(g, WANT_BARY):
        g.frag.bary_coords[n, y, x, k] = g.frag.bary_coords[n, y, x, k] + gb
    return g_eye, colour


@wp.func
def _write_rgba(image: wp.array4d(dtype=wp.float32), n: int, y: int, x: int, c: wp.vec3, a: float):
    image[n, y, x, 0] = c[0]
    image[n, y, x, 1] = c[1]
    image[n, y, x, 2] = c[2]
    image[n, y, x, 3] = a


@wp.func
def _pixel_eye(a: ShadeInputs, n: int) -> wp.vec3:
    """The eye position of image ``n`` when the slots are lit (else unused: 0)."""
    if a.lit != 0:
        return camera_centre(a.cam, n)
    return wp.vec3(0.0)


@wp.func
def _depth_range(a: ShadeInputs, n: int):
    """(znear, zfar) of image ``n``."""
    return a.znear[row(n, a.znear.shape[0])], a.zfar[row(n, a.zfar.shape[0])]


@wp.func
def _softmax_sums(
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
def _softmax_denominator(zraw: float, wsum: float, gamma: float):
    """(zmax = max(zraw, eps), exp((eps - zmax) / gamma), delta = max(that, eps),
    sum w_k + delta): the background weight and the denominator of the blend."""
    zmax = wp.max(zraw, BLEND_EPS)
    dexp = wp.exp((BLEND_EPS - zmax) / gamma)
    delta = wp.max(dexp, BLEND_EPS)
    return zmax, dexp, delta, wsum + delta


# ----------------------------------------------------------------------------- kernels
#: CUDA register cap of both pixel kernels. Uncapped they take ~112 (forward) and
#: ~118 (adjoint) registers: 2 blocks of 256 per SM, and they wait on their
#: gathers. Capped at 80 (H200, `python scripts/gpu_render_regs.py`, graph replay,
#: median of 20): K=8 soft Phong 0.775 -> 0.739 ms forward, 1.789 -> 1.712 ms
#: forward + backward; the adjoint alone at 80: 1.749; both at 64: 0.749 / 1.749.
PIXEL_MAX_REGISTERS = 80
#: The adjoint's cap, since it lights each slot once (the slot adjoint returns the
#: colour) and reads the blend's colour from the image: 64 against 80, two
#: alternating runs each (`python scripts/gpu_render_regs.py`, graph replay, with
#: the extra channels): K=8 1.436 / 1.437 -> 1.421 / 1.423 ms forward + backward,
#: K=1 1.612 / 1.612 -> 1.604 / 1.607.
ADJOINT_MAX_REGISTERS = 64
#: Pixel patches of the two pixel kernels (:mod:`warpraster.patches`): each
#: warp's 32 threads take a patch of ``patch_w`` x (32 / ``patch_w``) pixels of one
#: image (32: a row segment, as a 3-d launch). H200, graph replay, median of 20,
#: image alone, both kernels at one width (32 / 16 / 8 / 4): K=8 forward
#: 0.655-0.659 / 0.641 / 0.633-0.636 / 0.634 ms, forward + backward 1.358-1.364 /
#: 1.354 / 1.362-1.370 / 1.371: the forward (lighting, faces gathered) gains from
#: square patches, the adjoint (atomics into the faces' rows) loses; forward at 8
#: with the adjoint at 32 / 16: 0.636-0.642 / 0.639 forward, 1.345-1.350 /
#: 1.360-1.366 forward + backward (docs/PERF.md). Since the adjoint sums each
#: warp's corner rows before its atomics (warpraster/aggregated.py), adjoint at
#: 32 / 16 / 8: K=8 forward + backward 1.178-1.179 / 1.173-1.175 / 1.181, K=1
#: 1.498-1.501 / 1.493-1.494 / 1.503 ms.
FORWARD_PATCH_W = wp.constant(8)
ADJOINT_PATCH_W = wp.constant(16)


@wp.kernel(enable_backward=False, cuda_max_registers=PIXEL_MAX_REGISTERS)
def _shade_blend_kernel(
    # Fragments in:
    frag: PixelFragments,
    # Shading in:
    a: ShadeInputs,
    # Data out:
    image_out: wp.array4d(dtype=wp.float32),
):
    n, y, x, inside = patch_pixel(
        wp.tid(), image_out.shape[0], image_out.shape[1], image_out.shape[2], FORWARD_PATCH_W
    )
    if not inside:
        return
    eye = _pixel_eye(a, n)
    bg = a.background[row(n, a.background.shape[0])]
    if a.blend == BlendMode.HARD:
        f0 = frag.pix_to_face[n, y, x, 0]
        if f0 >= 0:
            c0 = slot_colour(a, n, y, x, 0, f0, frag.bary_coords[n, y, x, 0], eye)
            _write_rgba(image_out, n, y, x, c0, 1.0)
        else:
            _write_rgba(image_out, n, y, x, bg, 0.0)
        return
    zn, zf = _depth_range(a, n)
    zraw, _kmax, _used, keep, wsum, csum = _softmax_sums(frag, a, n, y, x, eye, zn, zf, 1)
    _zmax, _dexp, delta, denom = _softmax_denominator(zraw, wsum, a.gamma)
    _write_rgba(image_out, n, y, x, (csum + delta * bg) / denom, 1.0 - keep)


@wp.func
def _image_grad(ig: ImageGrad, image: wp.array4d(dtype=wp.float32), n: int, y: int, x: int):
    """Pixel (n, y, x)'s RGBA gradient (:class:`ImageGrad`)."""
    g = wp.vec4(ig.grad[n, y, x, 0], ig.grad[n, y, x, 1], ig.grad[n, y, x, 2], ig.grad[n, y, x, 3])
    if ig.mse != 0:
        s = 2.0 * ig.weight * ig.loss_grad[0]
        for c in range(4):
            g[c] = g[c] + s * (image[n, y, x, c] - ig.target[n, y, x, c])
    return g


@wp.func
def _add_camera_grad(a: ShadeInputs, g: ShadeGrads, n: int, g_eye: wp.vec3):
    """eye = -(R t): dR = -g t^T, dt = -R^T g (rows of camera n)."""
    rr = row(n, a.cam.R.shape[0])
    rt = row(n, a.cam.T.shape[0])
    wp.atomic_add(g.cam.R, rr, -wp.outer(g_eye, a.cam.T[rt]))
    wp.atomic_add(g.cam.T, rt, -(wp.transpose(a.cam.R[rr]) * g_eye))


@wp.kernel(enable_backward=False, cuda_max_registers=ADJOINT_MAX_REGISTERS)
def _shade_blend_adjoint(
    # Fragments in:
    frag: PixelFragments,
    # Shading in:
    a: ShadeInputs,
    # The forward's image and its gradient:
    image: wp.array4d(dtype=wp.float32),
    ig: ImageGrad,
    # Gradients out (accumulated):
    g: ShadeGrads,
):
    """The adjoint of :func:`_shade_blend_kernel`, one thread per pixel. The
    softmax blend's colour ``(sum w_k c_k + delta bg) / den`` is read from the
    forward's image (the same float32 value), so only the weights are recomputed
    before the slot loop, without lighting the slots (which the slot loop does
    again)."""
    n, y, x, inside = patch_pixel(
        wp.tid(), image.shape[0], image.shape[1], image.shape[2], ADJOINT_PATCH_W
    )
    if not inside:
        return
    eye = _pixel_eye(a, n)
    brow = row(n, a.background.shape[0])
    bg = a.background[brow]
    grgba = _image_grad(ig, image, n, y, x)
    grgb = wp.vec3(grgba[0], grgba[1], grgba[2])
    g_eye = wp.vec3(0.0)
    if a.blend == BlendMode.HARD:
        f0 = frag.pix_to_face[n, y, x, 0]
        if f0 >= 0:
            g_eye, _c0 = _slot_adjoint(
                a, g, n, y, x, 0, f0, frag.bary_coords[n, y, x, 0], eye, grgb
            )
        elif _wants(g, WANT_BACKGROUND):
            wp.atomic_add(g.background, brow, grgb)
        if a.lit != 0 and _wants(g, WANT_CAMERA):
            _add_camera_grad(a, g, n, g_eye)
        return
    zn, zf = _depth_range(a, n)
    # recompute the forward's weights; its colour is in the image
    zraw, kmax, used, keep, wsum, _csum = _softmax_sums(frag, a, n, y, x, eye, zn, zf, 0)
    zmax, dexp, delta, denom = _softmax_denominator(zraw, wsum, a.gamma)
    rgb = wp.vec3(image[n, y, x, 0], image[n, y, x, 1], image[n, y, x, 2])
    # torch's autograd of PyTorch3D's formula, op by op and in its order of float32
    # operations (see blending.py's docstring): the zbuf gradient of a slot drawn
    # only through the blur is multiplied by up to 1e16 in PyTorch3D's rasterizer
    # backward, so its last bit decides O(1) of a vertex gradient there.
    ga = grgba[3]
    # rgb = num / den: d/dnum = g / den; d/dden = sum_c -g_c * ((num_c / den) / den)
    gn = wp.vec3(grgb[0] / denom, grgb[1] / denom, grgb[2] / denom)
    gden = (-grgb[0] * (rgb[0] / denom) + -grgb[1] * (rgb[1] / denom)) + -grgb[2] * (rgb[2] / denom)
    # delta feeds num (delta * bg) and den
    gdelta = gden + ((gn[0] * bg[0] + gn[1] * bg[1]) + gn[2] * bg[2])
    gmax_e = float(0.0)  # d/dzmax through the K terms exp((zinv_k - zmax) / gamma)
    gdiff_max = float(0.0)
    for k in range(used):
        f = frag.pix_to_face[n, y, x, k]
        if f >= 0:
            b = frag.bary_coords[n, y, x, k]
            p = prob(frag.dists[n, y, x, k], a.sigma)
            e = wp.exp((zinv(f, frag.zbuf[n, y, x, k], zn, zf) - zmax) / a.gamma)
            wk = p * e
            # c_k gets gn * w_k; its value comes back from the same lighting
            g_eye_k, ck = _slot_adjoint(
                a, g, n, y, x, k, f, b, eye, wp.vec3(gn[0] * wk, gn[1] * wk, gn[2] * wk)
            )
            g_eye += g_eye_k
            # w_k feeds sum_k w_k c_k and den
            gw = ((gn[0] * ck[0] + gn[1] * ck[1]) + gn[2] * ck[2]) + gden
            gdiff = ((gw * p) * e) / a.gamma  # d/d(zinv_k - zmax)
            gmax_e = gmax_e + -gdiff
            if _wants(g, WANT_DISTS):
                # p_k = sigmoid(-d_k / sigma): through w_k, then the alpha product
                dd = -((((gw * e) * (1.0 - p)) * p) / a.sigma)
                dd += ga * (-keep * p / a.sigma)
                g.frag.dists[n, y, x, k] = g.frag.dists[n, y, x, k] + dd
            if k == kmax:
                gdiff_max = gdiff
            elif _wants(g, WANT_ZBUF):
                g.frag.zbuf[n, y, x, k] = g.frag.zbuf[n, y, x, k] + -(gdiff / (zf - zn))
    if _wants(g, WANT_BACKGROUND):
        wp.atomic_add(g.background, brow, wp.vec3(gn[0] * delta, gn[1] * delta, gn[2] * delta))
    if a.lit != 0 and _wants(g, WANT_CAMERA):
        _add_camera_grad(a, g, n, g_eye)
    # zmax = max(max_k zinv_k, eps) feeds the K exponents and delta = max(exp(...), eps)
    gmax_d = float(0.0)
    if dexp >= BLEND_EPS:
        gmax_d = -((gdelta * dexp) / a.gamma)
    if _wants(g, WANT_ZBUF) and frag.pix_to_face[n, y, x, kmax] >= 0:
        gz_max = gdiff_max
        if zraw >= BLEND_EPS:
            gz_max = gdiff_max + (gmax_e + gmax_d)
        g.frag.zbuf[n, y, x, kmax] = g.frag.zbuf[n, y, x, kmax] + -(gz_max / (zf - zn))


# ----------------------------------------------------------------------------- launcher
def _has_grad(arr: wp.array) -> bool:
    return arr is not None and arr.requires_grad and arr.grad is not None


def _grad_or(arr: wp.array, fallback: wp.array) -> tuple[wp.array, bool]:
    """(``arr.grad``, True) when it carries one, else (``fallback``, False)."""
    if _has_grad(arr):
        return arr.grad, True
    return fallback, False


def with_grad(*arrays) -> list:
    """The arrays that carry a gradient (what ``tape.record_func`` may zero)."""
    return [a for a in arrays if _has_grad(a)]


def launch_image_kernel(kernel, dim, inputs: list, image_out: wp.array, device):
    """Launches ``kernel`` writing the RGBA ``image_out`` outside the tape (its
    adjoint is recorded by hand): the active tape when ``image_out`` carries a
    gradient (the adjoint is then to be recorded on it), else None."""
    wp.launch(kernel, dim=dim, inputs=inputs, outputs=[image_out], device=device, record_tape=False)
    tape = active_tape()
    if tape is None or image_out.grad is None:
        return None
    return tape


#: The nested structs written as a whole (every array, once any has a gradient), by WANT bit.
_GROUPS = {WANT_CAMERA: "cam", WANT_LIGHT: "light", WANT_MATERIAL: "mat"}


def _shade_grads(frag: PixelFragments, inputs: ShadeInputs) -> tuple[ShadeGrads, list]:
    """The :class:`ShadeGrads` of a launch (``want`` set) and the arrays it writes into."""
    g = ShadeGrads()
    want = 0
    sources = []
    # the colour gradient goes to the given colours, or to the texel array
    colours = inputs.colors if inputs.lit == 0 else inputs.texels
    g.frag.pix_to_face = frag.pix_to_face  # not written
    singles = [  # (struct, field, array, WANT bit)
        (g.frag, "bary_coords", frag.bary_coords, WANT_BARY),
        (g.frag, "zbuf", frag.zbuf, WANT_ZBUF),
        (g.frag, "dists", frag.dists, WANT_DISTS),
        (g, "colors", colours, WANT_COLORS),
        (g, "background", inputs.background, WANT_BACKGROUND),
        (g.faces, "pos", inputs.faces.pos, WANT_FACE_POS),
        (g.faces, "nrm", inputs.faces.nrm, WANT_FACE_NRM),
        (g.faces, "col", inputs.faces.col, WANT_FACE_COL),
    ]
    for target, name, arr, bit in singles:
        grad, has = _grad_or(arr, arr)
        setattr(target, name, grad)
        if has:
            sources.append(arr)
            want |= bit
    for bit, group in _GROUPS.items():
        given = getattr(inputs, group)
        arrays = {
            name: getattr(given, name)
            for name, var in _NESTED[group].vars.items()
            if wp.types.is_array(var.type)
        }
        grads = getattr(g, group)
        written = [arr for arr in arrays.values() if _has_grad(arr)]
        sources.extend(written)
        for name, arr in arrays.items():
            if _has_grad(arr):
                setattr(grads, name, arr.grad)
            elif written and inputs.lit != 0:
                # every array of a group is written: a member without a gradient gets
                # a scratch one (made while recording, not per backward)
                setattr(grads, name, wp.zeros_like(arr))
            else:
                setattr(grads, name, arr)
        if written and inputs.lit != 0:
            want |= bit
    if inputs.lit == 0:
        want &= ~(WANT_FACE_POS | WANT_FACE_NRM | WANT_FACE_COL)
    elif inputs.texel_source != TexelSource.PIXEL:
        want &= ~WANT_COLORS
    if inputs.lit != 0 and inputs.texel_source != TexelSource.VERTEX:
        want &= ~WANT_FACE_COL
    if inputs.blend == BlendMode.HARD:
        want &= ~(WANT_ZBUF | WANT_DISTS)
    g.want = want
    return g, sources


def launch_shade_blend(
    frag: PixelFragments,
    inputs: ShadeInputs,
    image_out: wp.array,
    image_grad: ImageGrad | None = None,
) -> wp.Tape | None:
    """Launches the pixel kernel (outside the tape) and records its adjoint.

    Args:
        frag: the render's fragments (:func:`~warpraster.shading.pixel_args.pixel_fragments`).
        inputs: a filled :class:`ShadeInputs` (no checks here).
        image_out: (N, H, W, 4) float32 RGBA.
        image_grad: the :class:`ImageGrad` the adjoint reads (kept by the caller,
            e.g. :class:`~warpraster.shading.shaders.ShadingBuffers`, so that a
            fused loss can set its MSE fields after this call and before the
            backward); reset here to ``image_out.grad`` alone. None: one of this call's.

    Returns:
        The tape an adjoint reading ``image_grad`` was recorded on, or None.

    The adjoint adds into the ``.grad`` of every array of ``inputs`` and of the
    fragments (``bary_coords``, ``zbuf``, ``dists``) that carries one. It reads
    ``image_out`` (the softmax blend's colour), which must then hold this
    forward's image until the backward has run.
    """
    p2f = frag.pix_to_face
    n, h, w, _ = p2f.shape
    device = p2f.device
    dim = patch_launch_size(n, h, w, FORWARD_PATCH_W)
    tape = launch_image_kernel(_shade_blend_kernel, dim, [frag, inputs], image_out, device)
    if tape is None:
        return None
    g, sources = _shade_grads(frag, inputs)
    if g.want == 0:
        return None
    ig = ImageGrad() if image_grad is None else image_grad
    ig.grad = image_out.grad
    ig.mse = 0

    def backward():
        wp.launch(
            _shade_blend_adjoint,
            dim=patch_launch_size(n, h, w, ADJOINT_PATCH_W),
            inputs=[frag, inputs, image_out, ig],
            outputs=[g],
            device=device,
        )

    tape.record_func(backward, arrays=with_grad(image_out, *sources))
    return tape
