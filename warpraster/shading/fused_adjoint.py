"""The adjoint of the pixel kernel (:mod:`warpraster.shading.fused`), one kernel.

One thread per pixel recomputes the forward: the blend's adjoint gives each
slot's colour gradient, which goes straight into the lighting adjoint written
out below (torch's autograd of PyTorch3D's ``diffuse``/``specular``/
``F.normalize`` formulas, summed over the image's lights). Each thread owns its
K slots, so the barycentric, depth, distance, texel and opacity gradients are
written without atomics; what several pixels share (the per-face corner tables,
light, material, camera and background rows) is added with atomics, the
per-image rows only when they carry a gradient.
"""

from __future__ import annotations

import warp as wp

from ..aggregated import add_float_row, add_mat33_row, add_rt_partial, add_vec3_row, stripe_of
from ..patches import patch_pixel
from ..variants import kernel_family, variant_kernel, want_pin
from .lighting import (
    LightKind,
    direction_toward,
    light_index,
    light_kind,
    light_range,
    normalize_eps,
    normalize_eps_adjoint,
    phong_alpha,
    phong_power,
)
from .modes import BlendMode, ShadingMode, TexelSource
from .params import row
from .pixel_args import PixelFragments
from .shade_inputs import (
    BLEND_EPS,
    ImageGrad,
    ShadeGrads,
    ShadeInputs,
    Want,
    inputs_pin,
    material_row,
    prob,
    wants,
    zinv,
)
from .slot_light import (
    depth_range,
    facing,
    hard_hit,
    light_parts,
    material_at,
    pixel_eye,
    slot_opacity,
    softmax_denominator,
    softmax_sums,
    surface,
    view_toward,
)

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "ADJOINT_MAX_REGISTERS",
    "ADJOINT_PATCH_W",
    "add_camera_sums",
    "shade_blend_adjoint",
]

#: The adjoint's register cap. It was 64 (measured against 80 when the adjoint lit
#: one light per image); since the light list, the two-sided/orthographic views and
#: per-slot opacity joined it, 64 spills: H200, `warpraster bench --suite renderer
#: --channels none`, graph forward + backward, caps alternated in one call: K=8 soft
#: Phong 1.435-1.436 (64) / 1.400-1.405 (96) / 1.374 ms (128), K=1 mip 1.512-1.515 /
#: 1.512-1.516 / 1.504 ms.
ADJOINT_MAX_REGISTERS = 128
#: The adjoint's pixel patch width (see FORWARD_PATCH_W in :mod:`warpraster.shading.fused`).
ADJOINT_PATCH_W = wp.constant(16)


@wp.func
def _one_light_adjoint(
    a: ShadeInputs,
    g: ShadeGrads,
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
    gc: wp.vec3,
):
    """Adjoint of one light's term of :func:`~warpraster.shading.slot_light.lit_colour_toward`
    for the colour gradient ``gc``: adds the light's row gradients (when wanted);
    returns (its colour term, and the gradients of texel, point, normal, to_eye,
    material ambient, diffuse, specular, shininess, and whether the specular
    term is on (shininess has a gradient))."""
    lt = a.light
    kind = light_kind(lt, j)
    lit, la, d, s = light_parts(a, n, j, ma, md, shininess, point, normal, to_eye)
    colour = wp.cw_mul(lit, texel) + wp.cw_mul(ms, s)
    g_texel = wp.cw_mul(gc, lit)
    g_lit = wp.cw_mul(gc, texel)  # d/d(ambient) = d/d(diff)
    g_d = wp.cw_mul(g_lit, md)
    g_s = wp.cw_mul(gc, ms)
    g_ma = wp.cw_mul(g_lit, la)
    g_md = wp.cw_mul(g_lit, d)
    g_ms = wp.cw_mul(gc, s)
    if wants(g, Want.LIGHT):
        rla = light_index(lt, n, j, lt.ambient.shape[0])
        add_vec3_row(g.light.ambient, rla, wp.cw_mul(g_lit, ma))
    g_point = wp.vec3(0.0)
    g_normal = wp.vec3(0.0)
    g_to_eye = wp.vec3(0.0)
    g_shin = float(0.0)
    shin_on = int(0)
    if kind != LightKind.AMBIENT:
        rp = light_index(lt, n, j, lt.param.shape[0])
        rld = light_index(lt, n, j, lt.diffuse.shape[0])
        rls = light_index(lt, n, j, lt.specular.shape[0])
        direction = direction_toward(kind, lt.param[rp], point)
        dc = lt.diffuse[rld]
        sc = lt.specular[rls]
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
        view = normalize_eps(to_eye)
        reflect = -dd + 2.0 * (cos_angle * nn)
        alpha = phong_alpha(cos_angle, view, reflect)
        power = phong_power(alpha, shininess)
        g_power = wp.dot(g_s, sc)
        if alpha > 0.0:
            g_alpha = g_power * (shininess * wp.pow(alpha, shininess - 1.0))
            g_shin = g_power * (power * wp.log(alpha))
            shin_on = 1
            g_view = g_alpha * reflect
            g_reflect = g_alpha * view
            g_dd += -g_reflect
            g_two = 2.0 * g_reflect  # d/d(cos * nn)
            g_cos = wp.dot(g_two, nn)
            g_nn += g_two * cos_angle
            g_nn += g_cos * dd
            g_dd += g_cos * nn
            g_to_eye = normalize_eps_adjoint(to_eye, g_view)
        g_normal = normalize_eps_adjoint(normal, g_nn)
        g_dir = normalize_eps_adjoint(direction, g_dd)
        if kind == LightKind.POINT:
            g_point = -g_dir
        if wants(g, Want.LIGHT):
            add_vec3_row(g.light.param, rp, g_dir)
            add_vec3_row(g.light.diffuse, rld, g_d * angle)
            add_vec3_row(g.light.specular, rls, g_s * power)
    return colour, g_texel, g_point, g_normal, g_to_eye, g_ma, g_md, g_ms, g_shin, shin_on


@wp.func
def _light_adjoint(
    a: ShadeInputs,
    g: ShadeGrads,
    n: int,
    m: int,
    point: wp.vec3,
    normal: wp.vec3,
    texel: wp.vec3,
    to_eye: wp.vec3,
    gc: wp.vec3,
):
    """Adjoint of :func:`~warpraster.shading.slot_light.lit_colour_toward` (lights of
    image ``n``, material row ``m``) for the colour gradient ``gc``.

    Adds the light/material row gradients (when wanted) and returns the
    gradients of (point, normal, texel, to_eye) and the lit colour itself (the
    same float32 operations as the forward)."""
    shininess, ma, md, ms = material_at(a, m)
    lo, hi = light_range(a.light, n)
    colour = wp.vec3(0.0)
    g_texel = wp.vec3(0.0)
    g_point = wp.vec3(0.0)
    g_normal = wp.vec3(0.0)
    g_to_eye = wp.vec3(0.0)
    g_ma = wp.vec3(0.0)
    g_md = wp.vec3(0.0)
    g_ms = wp.vec3(0.0)
    g_shin = float(0.0)
    shin_on = int(0)
    for j in range(lo, hi):
        c, gt, gp, gn, ge, gma, gmd, gms, gsh, on = _one_light_adjoint(
            a, g, n, j, ma, md, ms, shininess, point, normal, texel, to_eye, gc
        )
        if j == lo:
            colour = c
        else:
            colour = colour + c
        g_texel += gt
        g_point += gp
        g_normal += gn
        g_to_eye += ge
        g_ma += gma
        g_md += gmd
        g_ms += gms
        g_shin += gsh
        shin_on = wp.max(shin_on, on)
    if wants(g, Want.MATERIAL):
        add_vec3_row(g.mat.ambient, row(m, a.mat.ambient.shape[0]), g_ma)
        add_vec3_row(g.mat.diffuse, row(m, a.mat.diffuse.shape[0]), g_md)
        add_vec3_row(g.mat.specular, row(m, a.mat.specular.shape[0]), g_ms)
        if shin_on != 0:
            add_float_row(g.mat.shininess, row(m, a.mat.shininess.shape[0]), g_shin)
    return g_point, g_normal, g_texel, g_to_eye, colour


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
    """Adjoint of :func:`~warpraster.shading.slot_light.slot_colour` for the colour
    gradient ``gc``; returns the camera's gradient (the caller adds it once per
    pixel: the eye position's, or the forward axis' when orthographic) and the
    slot's colour (the forward's value, computed on the way)."""
    if a.lit == 0:
        if wants(g, Want.COLORS):
            g.colors[n, y, x, k] = g.colors[n, y, x, k] + gc
        return wp.vec3(0.0), a.colors[n, y, x, k]
    point, normal, texel = surface(a, n, y, x, k, f, b)
    to_eye = view_toward(a, n, point, eye)
    flip = facing(a, normal, to_eye) < 0.0
    if flip:
        normal = -normal
    g_point, g_normal, g_texel, g_to_eye, colour = _light_adjoint(
        a, g, n, material_row(a, n, f), point, normal, texel, to_eye, gc
    )
    if flip:
        g_normal = -g_normal
    g_cam = g_to_eye
    if a.orthographic != 0:
        g_cam = -g_to_eye  # to_eye = -forward
    else:
        g_point = g_point - g_to_eye  # to_eye = eye - point
    pos = a.faces.pos[f]
    nrm = a.faces.nrm[f]
    gb = wp.vec3(0.0)
    if a.mode == ShadingMode.FLAT:
        if wants(g, Want.FACE_POS):
            gp = g_point / 3.0
            wp.atomic_add(g.faces.pos, f, wp.matrix_from_rows(gp, gp, gp))
        if wants(g, Want.FACE_NRM):
            wp.atomic_add(g.faces.nrm, f, wp.matrix_from_rows(g_normal, wp.vec3(0.0), wp.vec3(0.0)))
    else:
        gb = wp.vec3(
            wp.dot(pos[0], g_point) + wp.dot(nrm[0], g_normal),
            wp.dot(pos[1], g_point) + wp.dot(nrm[1], g_normal),
            wp.dot(pos[2], g_point) + wp.dot(nrm[2], g_normal),
        )
        if wants(g, Want.FACE_POS):
            add_mat33_row(
                g.faces.pos, f, wp.matrix_from_rows(b[0] * g_point, b[1] * g_point, b[2] * g_point)
            )
        if wants(g, Want.FACE_NRM):
            add_mat33_row(
                g.faces.nrm,
                f,
                wp.matrix_from_rows(b[0] * g_normal, b[1] * g_normal, b[2] * g_normal),
            )
    if a.texel_source == TexelSource.VERTEX:
        col = a.faces.col[f]
        gb += wp.vec3(wp.dot(col[0], g_texel), wp.dot(col[1], g_texel), wp.dot(col[2], g_texel))
        if wants(g, Want.FACE_COL):
            add_mat33_row(
                g.faces.col, f, wp.matrix_from_rows(b[0] * g_texel, b[1] * g_texel, b[2] * g_texel)
            )
    elif a.texel_source == TexelSource.PIXEL:
        if wants(g, Want.COLORS):
            g.colors[n, y, x, k] = g.colors[n, y, x, k] + g_texel
    if wants(g, Want.BARY):
        g.frag.bary_coords[n, y, x, k] = g.frag.bary_coords[n, y, x, k] + gb
    return g_cam, colour


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
def _add_camera_grad(a: ShadeInputs, g: ShadeGrads, t: int, n: int, g_cam: wp.vec3):
    """Perspective: eye = -(R t): dR = -g t^T, dt = -R^T g (rows of camera n).
    Orthographic: ``g_cam`` is the gradient of the forward axis, R's third column.

    Every pixel of an image adds to the same camera row: instead of atomics into
    it (serialised: 27 ms for one 8 x 512² render's adjoint on an H200), thread
    ``t`` adds into one of ``g.cam_stripes`` stripes of image n in ``g.cam_part``
    (its warp's, summed across the warp first,
    :func:`~warpraster.aggregated.add_rt_partial`); the stripes are summed after
    the adjoint (:func:`~warpraster.aggregated.reduce_stripes`) and
    :func:`add_camera_sums` adds each image's sum to its camera rows."""
    slot = stripe_of(n, t, g.cam_stripes)
    if a.orthographic != 0:
        z = wp.vec3(0.0)
        add_rt_partial(g.cam_part, slot, wp.matrix_from_cols(z, z, g_cam), wp.vec3(0.0))
        return
    rr = row(n, a.cam.R.shape[0])
    rt = row(n, a.cam.T.shape[0])
    add_rt_partial(g.cam_part, slot, -wp.outer(g_cam, a.cam.T[rt]),
                   -(wp.transpose(a.cam.R[rr]) * g_cam))  # fmt: skip


@wp.kernel(enable_backward=False)
def add_camera_sums(
    # Sums in: (N * 12,) image n's R (row-major) then T
    sums: wp.array(dtype=wp.float32),
    # Gradients out (added to):
    r_grad: wp.array(dtype=wp.mat33),
    t_grad: wp.array(dtype=wp.vec3),
    with_t: int,
):
    """Thread n adds image n's summed (R, T) gradient to its camera rows."""
    n = wp.tid()
    b = n * 12
    # fmt: off
    wp.atomic_add(r_grad, row(n, r_grad.shape[0]),
                  wp.mat33(sums[b + 0], sums[b + 1], sums[b + 2], sums[b + 3], sums[b + 4],
                           sums[b + 5], sums[b + 6], sums[b + 7], sums[b + 8]))
    # fmt: on
    if with_t != 0:
        wp.atomic_add(
            t_grad, row(n, t_grad.shape[0]), wp.vec3(sums[b + 9], sums[b + 10], sums[b + 11])
        )


@wp.func
def _hard_adjoint(
    frag: PixelFragments,
    a: ShadeInputs,
    g: ShadeGrads,
    n: int,
    y: int,
    x: int,
    eye: wp.vec3,
    grgba: wp.vec4,
    brow: int,
) -> wp.vec3:
    """The hard blend's adjoint at pixel (n, y, x); returns the camera gradient."""
    grgb = wp.vec3(grgba[0], grgba[1], grgba[2])
    g_cam = wp.vec3(0.0)
    f0 = hard_hit(a, frag, n, y, x)
    if f0 >= 0:
        al = slot_opacity(a, n, y, x, 0)
        gc = grgb
        if a.premultiply != 0:
            gc = grgb * al
        g_cam, c0 = _slot_adjoint(a, g, n, y, x, 0, f0, frag.bary_coords[n, y, x, 0], eye, gc)
        if a.slot_alpha != 0 and wants(g, Want.ALPHA):
            g_al = grgba[3]
            if a.premultiply != 0:
                g_al = wp.dot(grgb, c0) + g_al
            o = a.alpha[n, y, x, 0]
            if o >= 0.0 and o <= 1.0:  # the clamp passes the gradient inside [0, 1] (as torch's)
                g.alpha[n, y, x, 0] = g.alpha[n, y, x, 0] + g_al
    elif wants(g, Want.BACKGROUND):
        add_vec3_row(g.background, brow, grgb)
    return g_cam


@kernel_family
def shade_blend_adjoint(pins: tuple[int, ...] | None, want: int | None) -> wp.Kernel:
    """The adjoint of the pixel kernel, one thread per pixel, with ``ShadeInputs``'
    :data:`~warpraster.shading.shade_inputs.PINNED_FIELDS` compiled in as ``pins``
    and ``ShadeGrads.want`` as ``want`` (None: read at run time). The softmax blend's
    colour ``(sum w_k c_k + delta bg) / den`` is read from the forward's image (the
    same float32 value), so only the weights are recomputed before the slot loop,
    without lighting the slots (which the slot loop does again)."""
    pin_a = inputs_pin(pins)
    pin_g = want_pin(ShadeGrads, want)

    def shade_blend_adjoint(
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
        t = wp.tid()
        n, y, x, inside = patch_pixel(
            t, image.shape[0], image.shape[1], image.shape[2], ADJOINT_PATCH_W
        )
        if not inside:
            return
        a = wp.static(pin_a)(a)
        g = wp.static(pin_g)(g)
        eye = pixel_eye(a, n)
        brow = row(n, a.background.shape[0])
        bg = a.background[brow]
        grgba = _image_grad(ig, image, n, y, x)
        grgb = wp.vec3(grgba[0], grgba[1], grgba[2])
        g_eye = wp.vec3(0.0)
        if a.blend == BlendMode.HARD:
            g_eye = _hard_adjoint(frag, a, g, n, y, x, eye, grgba, brow)
            if a.lit != 0 and wants(g, Want.CAMERA):
                _add_camera_grad(a, g, t, n, g_eye)
            return
        zn, zf = depth_range(a, n)
        # recompute the forward's weights; its colour is in the image
        zraw, kmax, used, keep, wsum, _csum = softmax_sums(frag, a, n, y, x, eye, zn, zf, 0)
        zmax, dexp, delta, denom = softmax_denominator(zraw, wsum, a.gamma)
        rgb = wp.vec3(image[n, y, x, 0], image[n, y, x, 1], image[n, y, x, 2])
        # torch's autograd of PyTorch3D's formula, op by op and in its order of float32
        # operations (see blending.py's docstring): the zbuf gradient of a slot drawn
        # only through the blur is multiplied by up to 1e16 in PyTorch3D's rasterizer
        # backward, so its last bit decides O(1) of a vertex gradient there.
        ga = grgba[3]
        # rgb = num / den: d/dnum = g / den; d/dden = sum_c -g_c * ((num_c / den) / den)
        gn = wp.vec3(grgb[0] / denom, grgb[1] / denom, grgb[2] / denom)
        gden = (-grgb[0] * (rgb[0] / denom) + -grgb[1] * (rgb[1] / denom)) + -grgb[2] * (
            rgb[2] / denom
        )
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
                if wants(g, Want.DISTS):
                    # p_k = sigmoid(-d_k / sigma): through w_k, then the alpha product
                    dd = -((((gw * e) * (1.0 - p)) * p) / a.sigma)
                    dd += ga * (-keep * p / a.sigma)
                    g.frag.dists[n, y, x, k] = g.frag.dists[n, y, x, k] + dd
                if k == kmax:
                    gdiff_max = gdiff
                elif wants(g, Want.ZBUF):
                    g.frag.zbuf[n, y, x, k] = g.frag.zbuf[n, y, x, k] + -(gdiff / (zf - zn))
        if wants(g, Want.BACKGROUND):
            add_vec3_row(g.background, brow, wp.vec3(gn[0] * delta, gn[1] * delta, gn[2] * delta))
        if a.lit != 0 and wants(g, Want.CAMERA):
            _add_camera_grad(a, g, t, n, g_eye)
        # zmax = max(max_k zinv_k, eps) feeds the K exponents and delta = max(exp(...), eps)
        gmax_d = float(0.0)
        if dexp >= BLEND_EPS:
            gmax_d = -((gdelta * dexp) / a.gamma)
        if wants(g, Want.ZBUF) and frag.pix_to_face[n, y, x, kmax] >= 0:
            gz_max = gdiff_max
            if zraw >= BLEND_EPS:
                gz_max = gdiff_max + (gmax_e + gmax_d)
            g.frag.zbuf[n, y, x, kmax] = g.frag.zbuf[n, y, x, kmax] + -(gz_max / (zf - zn))

    key = None if pins is None else (*pins, want)
    return variant_kernel(shade_blend_adjoint, "shade_blend_adjoint", key, ADJOINT_MAX_REGISTERS)
