"""The sensor's per-pixel adjoint: the channel kernel's backward, one thread per pixel.

Part of the deterministic backward (:mod:`warpraster.sim.adjoint`): each pixel
writes only its own records (no atomics).
"""

from __future__ import annotations

import warp as wp

from ..backward import slot_grads
from ..geometry import pixel_centre
from .render import SOFT_SLOTS, _nearer, _slot_alpha, outline_barycentrics

wp.set_module_options({"fuse_fp": False, "enable_backward": False})

_vec8 = wp.types.vector(length=SOFT_SLOTS, dtype=float)


@wp.func
def normalize_adj(v: wp.vec3, g: wp.vec3) -> wp.vec3:
    """Gradient w.r.t. ``v`` of ``g . normalize(v)`` (0 where ``v`` is 0, as Warp's)."""
    n = wp.length(v)
    if n > 0.0:
        u = v / n
        return (g - u * wp.dot(u, g)) / n
    return wp.vec3(0.0)


def _make_channels_adjoint(soft: bool, smooth_normals: bool):
    """The adjoint of ``render.CHANNEL_KERNELS[soft]`` (the same inputs), per pixel;
    ``smooth_normals`` compiled in (the ``smooth`` argument is then ignored), so
    each variant keeps only its own registers."""

    @wp.kernel(module="unique")
    def channels_adjoint(
        # Fragments of the sharp pass (K = 1) and of the blurred pass:
        pix_to_face: wp.array4d(dtype=wp.int32),
        bary: wp.array4d(dtype=wp.vec3),
        zbuf: wp.array4d(dtype=float),
        soft_pix_to_face: wp.array4d(dtype=wp.int32),
        soft_dists: wp.array4d(dtype=float),
        # Model:
        faces: wp.array2d(dtype=wp.int32),
        face_vertices: wp.array2d(dtype=wp.int32),
        face_shape: wp.array(dtype=wp.int32),
        camera_count: int,
        ndc_height: int,
        ndc_width: int,
        sigma: float,
        ambient: int,
        up: wp.vec3,
        sky: wp.vec3,
        ground: wp.vec3,
        ambient_intensity: float,
        clear_color: wp.vec3,
        clear_depth: float,
        smooth: int,
        # Data in (the frame's forward values):
        shape_colors: wp.array(dtype=wp.vec3),
        light_direction: wp.array(dtype=wp.vec3),
        light_intensity: wp.array(dtype=float),
        points: wp.array(dtype=wp.vec3),
        ndc: wp.array(dtype=wp.vec3),
        vertex_normals: wp.array(dtype=wp.vec3),
        camera_transforms: wp.array2d(dtype=wp.transform),
        # Upstream gradients, (world, camera, H, W); bit i of grad_mask: channel i has one
        grad_mask: int,
        g_color: wp.array4d(dtype=wp.vec3),
        g_albedo: wp.array4d(dtype=wp.vec3),
        g_normal: wp.array4d(dtype=wp.vec3),
        g_depth: wp.array4d(dtype=float),
        g_forward_depth: wp.array4d(dtype=float),
        g_alpha: wp.array4d(dtype=float),
        camera_grad: int,
        material_grad: int,
        # Data out, (N, H, W) (image n = world * C + camera) unless noted:
        rec_face_out: wp.array3d(dtype=wp.int32),
        rec_ndc_out: wp.array3d(dtype=wp.mat33),
        rec_world_out: wp.array3d(dtype=wp.mat33),
        rec_vn_out: wp.array3d(dtype=wp.mat33),
        rec_soft_out: wp.array4d(dtype=wp.mat33),
        outline_on_out: wp.array3d(dtype=wp.int32),
        outline_verts_out: wp.array3d(dtype=wp.mat33),
        outline_g_bary_out: wp.array3d(dtype=wp.vec3),
        outline_g_depth_out: wp.array3d(dtype=float),
        pix_origin_out: wp.array3d(dtype=wp.vec3),
        pix_albedo_out: wp.array3d(dtype=wp.vec3),
        pix_light_out: wp.array3d(dtype=wp.vec4),
    ):
        """Per pixel: the gradients of the shown face's NDC vertices (``rec_ndc``),
        world vertices (``rec_world``) and raw vertex normals (``rec_vn``), rows =
        the face's corners; ``rec_face`` the face (-1: none). Soft pixels: each
        blurred slot's distance gradient as NDC vertex gradients (``rec_soft``,
        (N, H, W, SOFT_SLOTS)), and the inputs and output gradients of the outline
        point (``outline_*``) for its generated adjoint. With ``camera_grad``: the
        camera-origin gradient of the depth; with ``material_grad``: the albedo
        and light (direction, intensity) gradients."""
        n, y, x = wp.tid()
        w = n // camera_count
        c = n - w * camera_count
        f = pix_to_face[n, y, x, 0]
        b = wp.vec3(0.0)
        fwd = float(0.0)
        sharp = f >= 0
        if sharp:
            b = bary[n, y, x, 0]
            fwd = zbuf[n, y, x, 0]
        a = float(1.0)
        pc = pixel_centre(y, x, ndc_height, ndc_width)
        om = _vec8()
        if wp.static(soft):
            outline_on_out[n, y, x] = 0
            if not sharp and sigma > 0.0:
                prod = float(1.0)
                for k in range(SOFT_SLOTS):
                    om[k] = 1.0 - _slot_alpha(soft_pix_to_face, soft_dists, n, y, x, k, sigma)
                    prod = prod * om[k]
                a = 1.0 - prod
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 1, 0)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 2, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 3, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 4, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 5, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 6, k)
                k = _nearer(soft_pix_to_face, soft_dists, n, y, x, 7, k)
                f = soft_pix_to_face[n, y, x, k]
                if f >= 0:
                    v0 = ndc[faces[f, 0]]
                    v1 = ndc[faces[f, 1]]
                    v2 = ndc[faces[f, 2]]
                    b = outline_barycentrics(pc, v0, v1, v2)
                    fwd = 1.0 / (b[0] / v0[2] + b[1] / v1[2] + b[2] / v2[2])
                    outline_on_out[n, y, x] = 1
                    outline_verts_out[n, y, x] = wp.matrix_from_rows(v0, v1, v2)
        rec_face_out[n, y, x] = f
        if f < 0:
            return
        # ---- upstream gradients
        gc = wp.vec3(0.0)
        galb = wp.vec3(0.0)
        gn = wp.vec3(0.0)
        gd = float(0.0)
        gfd = float(0.0)
        ga = float(0.0)
        if (grad_mask & 1) != 0:
            gc = g_color[w, c, y, x]
        if (grad_mask & 2) != 0:
            galb = g_albedo[w, c, y, x]
        if (grad_mask & 4) != 0:
            gn = g_normal[w, c, y, x]
        if (grad_mask & 8) != 0:
            gd = g_depth[w, c, y, x]
        if (grad_mask & 16) != 0:
            gfd = g_forward_depth[w, c, y, x]
        if (grad_mask & 32) != 0:
            ga = g_alpha[w, c, y, x]
        # ---- forward (as the channel kernel)
        i0 = face_vertices[f, 0]
        i1 = face_vertices[f, 1]
        i2 = face_vertices[f, 2]
        p0 = points[i0]
        p1 = points[i1]
        p2 = points[i2]
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
        if wp.static(smooth_normals):
            m0 = wp.normalize(vertex_normals[i0])
            m1 = wp.normalize(vertex_normals[i1])
            m2 = wp.normalize(vertex_normals[i2])
            s_raw = b[0] * m0 + b[1] * m1 + b[2] * m2
            nrm = wp.normalize(s_raw)
        shape = face_shape[f]
        albedo = shape_colors[shape]
        amb = wp.vec3(0.0)
        if ambient != 0:
            hemi = 0.5 * (wp.dot(nrm, up) + 1.0)
            amb = (sky * hemi + ground * (1.0 - hemi)) * ambient_intensity
        l_raw = light_direction[0]
        to_light = -wp.normalize(l_raw)
        ndl = wp.dot(nrm, to_light)
        ndotl = wp.max(ndl, 0.0)
        intensity = light_intensity[0]
        shaded = wp.cw_mul(albedo, amb) + albedo * (ndotl * intensity)
        # ---- adjoint
        g_a = (
            wp.dot(gc, shaded - clear_color)
            + wp.dot(galb, albedo)
            + wp.dot(gn, nrm)
            + gd * (depth - clear_depth)
            + gfd * (fwd - clear_depth)
            + ga
        )
        g_sh = a * gc
        g_alb = a * galb + wp.cw_mul(g_sh, amb) + g_sh * (ndotl * intensity)
        g_nrm = a * gn
        g_sh_alb = wp.dot(g_sh, albedo)
        if ambient != 0:
            g_hemi = wp.dot(wp.cw_mul(g_sh, albedo), (sky - ground) * ambient_intensity)
            g_nrm = g_nrm + (0.5 * g_hemi) * up
        g_tl = wp.vec3(0.0)
        if ndl > 0.0:
            g_ndotl = intensity * g_sh_alb
            g_nrm = g_nrm + g_ndotl * to_light
            g_tl = g_ndotl * nrm
        g_b = wp.vec3(0.0)
        g_hit = wp.vec3(0.0)
        if depth > 0.0:
            g_hit = (a * gd / depth) * ray
        g_b = wp.vec3(wp.dot(g_hit, p0), wp.dot(g_hit, p1), wp.dot(g_hit, p2))
        g_p0 = b[0] * g_hit
        g_p1 = b[1] * g_hit
        g_p2 = b[2] * g_hit
        g_vn = wp.mat33(0.0)
        if wp.static(smooth_normals):
            g_s = normalize_adj(s_raw, g_nrm)
            g_b = g_b + wp.vec3(wp.dot(g_s, m0), wp.dot(g_s, m1), wp.dot(g_s, m2))
            g_vn = wp.matrix_from_rows(
                normalize_adj(vertex_normals[i0], b[0] * g_s),
                normalize_adj(vertex_normals[i1], b[1] * g_s),
                normalize_adj(vertex_normals[i2], b[2] * g_s),
            )
        else:
            g_c = normalize_adj(c_raw, g_nrm)
            g_e1 = wp.cross(e2, g_c)
            g_e2 = wp.cross(g_c, e1)
            g_p0 = g_p0 - g_e1 - g_e2
            g_p1 = g_p1 + g_e1
            g_p2 = g_p2 + g_e2
        g_fwd = a * gfd
        rec_world_out[n, y, x] = wp.matrix_from_rows(g_p0, g_p1, g_p2)
        if wp.static(smooth_normals):
            rec_vn_out[n, y, x] = g_vn
        if sharp:
            rec_ndc_out[n, y, x] = slot_grads(
                pc, ndc[faces[f, 0]], ndc[faces[f, 1]], ndc[faces[f, 2]], 1, 0, 0,
                g_fwd, g_b, 0.0,
            )  # fmt: skip
        if wp.static(soft):
            if not sharp:
                # the outline point's part is added by the generated adjoint of
                # render.outline_kernel; here its inputs' gradients
                rec_ndc_out[n, y, x] = wp.mat33(0.0)
                outline_g_bary_out[n, y, x] = g_b
                outline_g_depth_out[n, y, x] = g_fwd
                # coverage: a = 1 - prod_k (1 - a_k), a_k = min(2 / (1 + exp(d_k / sigma)), 1)
                for k in range(SOFT_SLOTS):
                    fk = soft_pix_to_face[n, y, x, k]
                    g_slot = wp.mat33(0.0)
                    if fk >= 0:
                        others = float(1.0)
                        for j in range(SOFT_SLOTS):
                            if j != k:
                                others = others * om[j]
                        e = wp.exp(soft_dists[n, y, x, k] / sigma)
                        t = 2.0 / (1.0 + e)
                        if t < 1.0:
                            g_d = (g_a * others) * (-2.0 * e / (sigma * (1.0 + e) * (1.0 + e)))
                            g_slot = slot_grads(
                                pc, ndc[faces[fk, 0]], ndc[faces[fk, 1]], ndc[faces[fk, 2]],
                                0, 0, 0, 0.0, wp.vec3(0.0), g_d,
                            )  # fmt: skip
                    rec_soft_out[n, y, x, k] = g_slot
        if camera_grad != 0:
            pix_origin_out[n, y, x] = -g_hit
        if material_grad != 0:
            g_l = -normalize_adj(l_raw, g_tl)
            pix_albedo_out[n, y, x] = g_alb
            pix_light_out[n, y, x] = wp.vec4(g_l[0], g_l[1], g_l[2], ndotl * g_sh_alb)

    return channels_adjoint


#: The per-pixel adjoints by (soft silhouette, smooth normals).
CHANNELS_ADJOINT = {
    (soft, smooth): _make_channels_adjoint(soft, smooth)
    for soft in (False, True)
    for smooth in (False, True)
}


__all__ = ["CHANNELS_ADJOINT", "normalize_adj"]
