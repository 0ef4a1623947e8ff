"""The sensor's per-pixel adjoint: the channel kernel's backward, one thread per pixel.

Part of the deterministic backward (:mod:`warpraster.sim.adjoint`): each pixel
writes only its own records (no atomics).
"""

from __future__ import annotations

import warp as wp

from ..backward import slot_grads
from ..backward.sorted import set_entry
from ..geometry import pixel_centre
from ..shading.lighting import lambert_light_sum, lambert_light_sum_adjoint
from ..shading.material_table import (
    MaterialTable,
    face_albedo_adjoint,
    face_uv,
    texel_taps,
)
from .kernel_args import Channels, FrameScene, Outline, PixelRecords, TexelTaps
from .loss import LossTerms, loss_grads
from .options import NO_ADJOINT_OPTIONS
from .render import (
    SOFT_SLOTS,
    _slot_alpha,
    ambient_light,
    cut_face_point_adjoint,
    face_points,
    light_row,
    nearest_slot,
    outline_point,
    scene_parts,
    sharp_fragment,
    surface_albedo,
)

wp.set_module_options(NO_ADJOINT_OPTIONS)

_vec8 = wp.types.vector(length=SOFT_SLOTS, dtype=float)


@wp.func
def normalize_adj(v: wp.vec3, g: wp.vec3) -> wp.vec3:
    """Gradient w.r.t. ``v`` of ``g . normalize(v)`` (0 where ``v`` is 0, as Warp's)."""
    n = wp.length(v)
    if n > 0.0:
        u = v / n
        return (g - u * wp.dot(u, g)) / n
    return wp.vec3(0.0)


@wp.func
def _masked(g: wp.array4d(dtype=wp.vec3), on: bool, w: int, c: int, y: int, x: int) -> wp.vec3:
    """g[w, c, y, x], or zero where the channel has no gradient (``on`` False)."""
    if on:
        return g[w, c, y, x]
    return wp.vec3(0.0)


@wp.func
def _masked(g: wp.array4d(dtype=float), on: bool, w: int, c: int, y: int, x: int) -> float:
    """g[w, c, y, x], or zero where the channel has no gradient (``on`` False)."""
    if on:
        return g[w, c, y, x]
    return 0.0


@wp.func
def upstream_grads(grads: Channels, mask: int, w: int, c: int, y: int, x: int):
    """(colour, albedo, normal, depth, forward depth, alpha) gradients of pixel (y, x)
    of image (w, c); zero for a channel whose bit in ``mask`` (bit i: channel i of
    ``SensorFrame.CHANNELS``) is clear."""
    return (
        _masked(grads.color, (mask & 1) != 0, w, c, y, x),
        _masked(grads.albedo, (mask & 2) != 0, w, c, y, x),
        _masked(grads.normal, (mask & 4) != 0, w, c, y, x),
        _masked(grads.depth, (mask & 8) != 0, w, c, y, x),
        _masked(grads.forward_depth, (mask & 16) != 0, w, c, y, x),
        _masked(grads.alpha, (mask & 32) != 0, w, c, y, x),
    )


@wp.func
def _write_taps(taps: TexelTaps, table: MaterialTable, m: int, uv: wp.vec2, g_t: wp.vec3, i: int):
    """Pixel i's four texel-gradient entries (key ``num_texels``: none)."""
    info = wp.vec4i(0)
    if m >= 0:
        info = table.texture[m]
    if info[1] > 0:
        idx, wgt, _fx, _fy = texel_taps(info, uv)
        for j in range(4):
            key = idx[j]
            if key < 0:
                key = taps.num_texels
            set_entry(taps.entries, 4 * i + j, key, wgt[j] * g_t)
    else:
        _no_taps(taps, i)


@wp.func
def _no_taps(taps: TexelTaps, i: int):
    """Pixel i adds no texel gradient."""
    for j in range(4):
        set_entry(taps.entries, 4 * i + j, taps.num_texels, wp.vec3(0.0))


def _make_channels_adjoint(
    soft: bool, smooth_normals: bool, textured: bool, lit: bool, max_registers: int | None = None
):
    """The adjoint of ``render.channels_kernel(soft, textured, ...)`` (the same inputs), per pixel;
    ``smooth_normals`` compiled in (the ``smooth`` argument is then ignored), so
    each variant keeps only its own registers; ``textured``: an albedo that varies
    over a face (a texture or corner colours), with its gradients (to the
    barycentrics and, with ``material_grad``, the texels as ``taps_out``
    entries); ``lit``: the core's lights (their gradients to the hit point and the
    normal; the light arrays get none here); ``max_registers``: a CUDA cap."""

    @wp.kernel(module="unique", module_options=NO_ADJOINT_OPTIONS, cuda_max_registers=max_registers)
    def channels_adjoint(
        # Data in: the frame's forward values (as the channel kernel reads them)
        scene: FrameScene,
        camera_transforms: wp.array2d(dtype=wp.transform),
        # Upstream gradients, (world, camera, H, W); bit i of grad_mask: channel i has one
        grads: Channels,
        grad_mask: int,
        # Fused image-loss terms (their mask 0: none), added to the upstream gradients
        loss: LossTerms,
        camera_grad: int,
        material_grad: int,
        exact_perspective_grad: int,
        # Data out, (N, H, W) (image n = world * C + camera) unless noted:
        records_out: PixelRecords,
        outline_out: Outline,
        taps_out: TexelTaps,
    ):
        """Per pixel: the gradients of the shown face's NDC vertices (``rec_ndc``),
        world vertices (``rec_world``) and raw vertex normals (``rec_vn``), rows =
        the face's corners; ``rec_face`` the face (-1: none). Soft pixels: each
        blurred slot's distance gradient as NDC vertex gradients (``rec_soft``,
        (N, H, W, SOFT_SLOTS)), and the inputs and output gradients of the outline
        point (``outline_*``) for its generated adjoint. With ``camera_grad``: the
        camera-origin gradient of the depth; with ``material_grad``: the albedo
        and light (direction, intensity) gradients. ``exact_perspective_grad``:
        the sharp slots' flag of :func:`~warpraster.backward.slot_grads` (the
        blurred pass is not perspective-corrected)."""
        n, y, x = wp.tid()
        sharp_frags, blurred, view, surface, look, frame = scene_parts(scene)
        w, c, f, b, fwd = sharp_fragment(scene, n, y, x)
        sharp = f >= 0
        a = float(1.0)
        pc = pixel_centre(y, x, view.height, view.width)
        om = _vec8()
        sigma = look.sigma
        sp = blurred.pix_to_face
        if wp.static(soft):
            outline_out.on[n, y, x] = 0
            if not sharp and sigma > 0.0:
                prod = float(1.0)
                for k in range(SOFT_SLOTS):
                    om[k] = 1.0 - _slot_alpha(blurred, n, y, x, k, sigma)
                    prod = prod * om[k]
                a = 1.0 - prod
                f = sp[n, y, x, nearest_slot(blurred, n, y, x)]
                if f >= 0:
                    v0, v1, v2, b, fwd = outline_point(view, surface.faces, frame.ndc, f, y, x)
                    outline_out.on[n, y, x] = 1
                    outline_out.verts[n, y, x] = wp.matrix_from_rows(v0, v1, v2)
        records_out.face[n, y, x] = f
        pixel = (n * view.height + y) * view.width + x
        if wp.static(textured):
            if material_grad != 0 and f < 0:
                _no_taps(taps_out, pixel)
        if f < 0:
            return
        gc, galb, gn, gd, gfd, ga = upstream_grads(grads, grad_mask, w, c, y, x)
        gc, gd = loss_grads(loss, gc, gd, w, c, y, x)
        # ---- forward (as the channel kernel)
        i, p0, p1, p2 = face_points(surface, frame.points, f)
        hit = b[0] * p0 + b[1] * p1 + b[2] * p2
        origin = wp.transform_get_translation(camera_transforms[c, w])
        ray = hit - origin
        depth = wp.length(ray)
        e1 = p1 - p0
        e2 = p2 - p0
        c_raw = wp.cross(e1, e2)
        nrm = wp.normalize(c_raw)
        m0 = wp.vec3(0.0)
        m1 = wp.vec3(0.0)
        m2 = wp.vec3(0.0)
        s_raw = wp.vec3(0.0)
        vn = frame.vertex_normals
        if wp.static(smooth_normals):
            m0 = wp.normalize(vn[i[0]])
            m1 = wp.normalize(vn[i[1]])
            m2 = wp.normalize(vn[i[2]])
            s_raw = b[0] * m0 + b[1] * m1 + b[2] * m2
            nrm = wp.normalize(s_raw)
        mat = look.materials
        fs = surface.face_source[f]
        fm = surface.face_material[f]
        albedo = look.table.diffuse[fm]
        if wp.static(textured):
            albedo = surface_albedo(surface, look, f, b)
        amb = wp.vec3(0.0)
        if look.ambient != 0:
            amb = ambient_light(look, nrm)
        l_raw = mat.light_direction[0]
        to_light = -wp.normalize(l_raw)
        ndl = wp.dot(nrm, to_light)
        ndotl = wp.max(ndl, 0.0)
        intensity = mat.light_intensity[0]
        shaded = wp.cw_mul(albedo, amb) + albedo * (ndotl * intensity)
        ls = wp.vec3(0.0)
        if wp.static(lit):
            ls = lambert_light_sum(look.lights, light_row(look, n, w), hit, nrm)
            shaded = shaded + wp.cw_mul(albedo, ls)
        # ---- adjoint
        clear_depth = look.clear_depth
        g_a = (
            wp.dot(gc, shaded - look.clear_color)
            + wp.dot(galb, albedo)
            + wp.dot(gn, nrm)
            + gd * (depth - clear_depth)
            + gfd * (fwd - clear_depth)
            + ga
        )
        g_sh = a * gc
        g_alb = a * galb + wp.cw_mul(g_sh, amb) + g_sh * (ndotl * intensity)
        g_nrm = a * gn
        g_lit_point = wp.vec3(0.0)
        if wp.static(lit):
            g_alb = g_alb + wp.cw_mul(g_sh, ls)
            g_lit_point, g_lit_nrm = lambert_light_sum_adjoint(
                look.lights, light_row(look, n, w), hit, nrm, wp.cw_mul(g_sh, albedo)
            )
            g_nrm = g_nrm + g_lit_nrm
        g_sh_alb = wp.dot(g_sh, albedo)
        if look.ambient != 0:
            g_hemi = wp.dot(
                wp.cw_mul(g_sh, albedo), (look.sky - look.ground) * look.ambient_intensity
            )
            g_nrm = g_nrm + (0.5 * g_hemi) * look.up
        g_tl = wp.vec3(0.0)
        if ndl > 0.0:
            g_ndotl = intensity * g_sh_alb
            g_nrm = g_nrm + g_ndotl * to_light
            g_tl = g_ndotl * nrm
        g_b = wp.vec3(0.0)
        g_hit = wp.vec3(0.0)
        if depth > 0.0:
            g_hit = (a * gd / depth) * ray
        # the hit point's gradient: the depth's (which the camera origin's mirrors) and
        # the point lights'
        g_point = g_hit + g_lit_point
        g_b = wp.vec3(wp.dot(g_point, p0), wp.dot(g_point, p1), wp.dot(g_point, p2))
        g_p0 = b[0] * g_point
        g_p1 = b[1] * g_point
        g_p2 = b[2] * g_point
        g_vn = wp.mat33(0.0)
        if wp.static(smooth_normals):
            g_s = normalize_adj(s_raw, g_nrm)
            g_b = g_b + wp.vec3(wp.dot(g_s, m0), wp.dot(g_s, m1), wp.dot(g_s, m2))
            g_vn = wp.matrix_from_rows(
                normalize_adj(vn[i[0]], b[0] * g_s),
                normalize_adj(vn[i[1]], b[1] * g_s),
                normalize_adj(vn[i[2]], b[2] * g_s),
            )
        else:
            g_c = normalize_adj(c_raw, g_nrm)
            g_e1 = wp.cross(e2, g_c)
            g_e2 = wp.cross(g_c, e1)
            g_p0 = g_p0 - g_e1 - g_e2
            g_p1 = g_p1 + g_e1
            g_p2 = g_p2 + g_e2
        g_kd = g_alb
        if wp.static(textured):
            # the albedo's texture, read at the interpolated UV: its gradient reaches
            # the barycentrics, the diffuse row and the taps' texels
            g_kd, g_b_tex, g_t = face_albedo_adjoint(look.table, fm, surface.corners, fs, b, g_alb)
            g_b = g_b + g_b_tex
            if material_grad != 0:
                _write_taps(taps_out, look.table, fm, face_uv(surface.corners, fs, b), g_t, pixel)
        g_fwd = a * gfd
        records_out.world[n, y, x] = wp.matrix_from_rows(g_p0, g_p1, g_p2)
        if wp.static(smooth_normals):
            records_out.vn[n, y, x] = g_vn
        ndc = frame.ndc
        faces = surface.faces
        if sharp:
            v0 = ndc[faces[f, 0]]
            v1 = ndc[faces[f, 1]]
            v2 = ndc[faces[f, 2]]
            if wp.min(wp.min(v0[2], v1[2]), v2[2]) < view.near:
                # a face the near plane cuts: its point from its own vertices
                # (render.cut_face_point, whose denominator may be negative for it)
                records_out.ndc[n, y, x] = cut_face_point_adjoint(pc, v0, v1, v2, g_b, g_fwd)
            else:
                records_out.ndc[n, y, x] = slot_grads(
                    pc, v0, v1, v2, 1, 0, exact_perspective_grad, g_fwd, g_b, 0.0
                )
        if wp.static(soft):
            if not sharp:
                # the outline point's part is added by the generated adjoint of
                # render.outline_kernel; here its inputs' gradients
                records_out.ndc[n, y, x] = wp.mat33(0.0)
                outline_out.g_bary[n, y, x] = g_b
                outline_out.g_depth[n, y, x] = g_fwd
                # coverage: a = 1 - prod_k (1 - a_k), a_k = min(2 / (1 + exp(d_k / sigma)), 1)
                for k in range(SOFT_SLOTS):
                    fk = sp[n, y, x, k]
                    g_slot = wp.mat33(0.0)
                    if fk >= 0:
                        others = float(1.0)
                        for j in range(SOFT_SLOTS):
                            if j != k:
                                others = others * om[j]
                        e = wp.exp(blurred.dists[n, y, x, k] / sigma)
                        t = 2.0 / (1.0 + e)
                        if t < 1.0:
                            g_d = (g_a * others) * (-2.0 * e / (sigma * (1.0 + e) * (1.0 + e)))
                            g_slot = slot_grads(
                                pc, ndc[faces[fk, 0]], ndc[faces[fk, 1]], ndc[faces[fk, 2]],
                                0, 0, 0, 0.0, wp.vec3(0.0), g_d,
                            )  # fmt: skip
                    records_out.soft[n, y, x, k] = g_slot
        if camera_grad != 0:
            records_out.origin[n, y, x] = -g_hit
        if material_grad != 0:
            g_l = -normalize_adj(l_raw, g_tl)
            records_out.albedo[n, y, x] = g_kd
            records_out.light[n, y, x] = wp.vec4(g_l[0], g_l[1], g_l[2], ndotl * g_sh_alb)

    return channels_adjoint


#: CUDA register caps by variant. The sharp, flat-normal adjoint takes 96 registers
#: uncapped: 25% occupancy for a kernel that waits on its gathers (Nsight Compute:
#: L1TEX scoreboard stalls lead). Capped at 64, the sensor bench's forward +
#: backward went from 0.524 to 0.476 ms on an H200 (80: 0.492, 72: 0.495, 56: 0.480;
#: scripts/gpu_sensor_regs.py). The other variants are not measured: uncapped.
_MAX_REGISTERS = {(False, False, False, False): 64}

#: The per-pixel adjoints by (soft silhouette, smooth normals, textured, core lights).
CHANNELS_ADJOINT = {
    (soft, smooth, tex, lit): _make_channels_adjoint(
        soft, smooth, tex, lit, _MAX_REGISTERS.get((soft, smooth, tex, lit))
    )
    for soft in (False, True)
    for smooth in (False, True)
    for tex in (False, True)
    for lit in (False, True)
}


__all__ = ["CHANNELS_ADJOINT", "normalize_adj"]
