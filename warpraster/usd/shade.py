"""The colour of each sample of a scene: one Warp kernel over the K = 1 fragments.

Per covered sample: barycentric interpolation of the triangle's corner normals,
colours and UVs (the barycentrics are perspective-correct, so this is the
world-space interpolation), the material (diffuse colour times a bilinear
texture sample, specular colour, shininess, opacity; ``displayColor`` when the
triangle has no material), then ambient + the directional and point lights
with PyTorch3D's Lambert and Phong terms (:func:`warpraster.shading.lighting.diffuse`,
:func:`~warpraster.shading.lighting.specular`). Normals are turned toward the
viewer (two-sided shading). Output: linear RGB premultiplied by alpha, and
alpha = opacity where covered, 0 elsewhere; a first hit beyond the far
clipping distance counts as empty.

No gradients: this module is for pictures (``enable_backward`` off).
"""

from __future__ import annotations

import warp as wp

from ..shading.lighting import diffuse, specular
from .scene import WrapMode

wp.set_module_options({"enable_backward": False})

__all__ = ["launch_shade"]


@wp.func
def _wrap(i: int, n: int, mode: int) -> int:
    """Texel index ``i`` wrapped into [0, n) (-1 for BLACK outside)."""
    if mode == WrapMode.CLAMP:
        return wp.clamp(i, 0, n - 1)
    if mode == WrapMode.MIRROR:
        p = ((i % (2 * n)) + 2 * n) % (2 * n)
        if p >= n:
            p = 2 * n - 1 - p
        return p
    if mode == WrapMode.BLACK:
        if i < 0 or i >= n:
            return -1
        return i
    return ((i % n) + n) % n


@wp.func
def _texel(texels: wp.array(dtype=wp.vec4), base: int, w: int, h: int, ix: int, iy: int) -> wp.vec4:
    if ix < 0 or iy < 0:
        return wp.vec4(0.0, 0.0, 0.0, 1.0)
    return texels[base + iy * w + ix]


@wp.func
def _sample(texels: wp.array(dtype=wp.vec4), info: wp.vec4i, uv: wp.vec2) -> wp.vec4:
    """Bilinear sample; ``info`` = (first texel, width, height, wrap_s * 4 + wrap_t).

    v = 0 is the bottom row of the image (USD's ``st`` convention).
    """
    w = info[1]
    h = info[2]
    ws = info[3] // 4
    wt = info[3] % 4
    x = uv[0] * float(w) - 0.5
    y = (1.0 - uv[1]) * float(h) - 0.5
    x0 = wp.floor(x)
    y0 = wp.floor(y)
    fx = x - x0
    fy = y - y0
    ix0 = _wrap(int(x0), w, ws)
    ix1 = _wrap(int(x0) + 1, w, ws)
    iy0 = _wrap(int(y0), h, wt)
    iy1 = _wrap(int(y0) + 1, h, wt)
    c00 = _texel(texels, info[0], w, h, ix0, iy0)
    c10 = _texel(texels, info[0], w, h, ix1, iy0)
    c01 = _texel(texels, info[0], w, h, ix0, iy1)
    c11 = _texel(texels, info[0], w, h, ix1, iy1)
    top = c00 * (1.0 - fx) + c10 * fx
    bottom = c01 * (1.0 - fx) + c11 * fx
    return top * (1.0 - fy) + bottom * fy


@wp.kernel
def _shade_kernel(
    # Fragments in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    bary: wp.array4d(dtype=wp.vec3),
    zbuf: wp.array4d(dtype=float),
    # Geometry in:
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    corner_normals: wp.array(dtype=wp.vec3),
    corner_colors: wp.array(dtype=wp.vec4),
    corner_uvs: wp.array(dtype=wp.vec2),
    face_material: wp.array(dtype=wp.int32),
    # Materials in:
    mat_diffuse: wp.array(dtype=wp.vec3),
    mat_specular: wp.array(dtype=wp.vec3),
    mat_shininess: wp.array(dtype=float),
    mat_opacity: wp.array(dtype=float),
    mat_texture: wp.array(dtype=wp.vec4i),
    mat_tex_scale: wp.array(dtype=wp.vec4),
    mat_tex_bias: wp.array(dtype=wp.vec4),
    texels: wp.array(dtype=wp.vec4),
    # Lights and view in:
    dir_lights: wp.array2d(dtype=wp.vec3),
    point_lights: wp.array2d(dtype=wp.vec3),
    ambient: wp.array(dtype=wp.vec3),
    view: wp.array(dtype=wp.vec3),
    orthographic: int,
    # Out:
    rgba_out: wp.array2d(dtype=wp.vec4),
):
    y, x = wp.tid()
    f = pix_to_face[0, y, x, 0]
    if f < 0 or zbuf[0, y, x, 0] > view[2][0]:
        rgba_out[y, x] = wp.vec4(0.0)
        return
    b = bary[0, y, x, 0]
    b = wp.vec3(wp.max(b[0], 0.0), wp.max(b[1], 0.0), wp.max(b[2], 0.0))
    s = b[0] + b[1] + b[2]
    if s > 0.0:
        b = b / s
    c0 = 3 * f
    p = b[0] * verts[faces[f, 0]] + b[1] * verts[faces[f, 1]] + b[2] * verts[faces[f, 2]]
    n = b[0] * corner_normals[c0] + b[1] * corner_normals[c0 + 1] + b[2] * corner_normals[c0 + 2]
    col = b[0] * corner_colors[c0] + b[1] * corner_colors[c0 + 1] + b[2] * corner_colors[c0 + 2]
    uv = b[0] * corner_uvs[c0] + b[1] * corner_uvs[c0 + 1] + b[2] * corner_uvs[c0 + 2]
    eye = view[0]
    to_eye = eye - p
    if orthographic != 0:
        to_eye = -view[1]
    if wp.dot(n, to_eye) < 0.0:
        n = -n
    # a point the Phong term sees the camera from (far along -forward when orthographic)
    cam = eye
    if orthographic != 0:
        cam = p - view[1] * 1.0e6
    kd = wp.vec3(col[0], col[1], col[2])
    ks = wp.vec3(0.0)
    shininess = float(10.0)
    alpha = col[3]
    m = face_material[f]
    if m >= 0:
        kd = mat_diffuse[m]
        ks = mat_specular[m]
        shininess = mat_shininess[m]
        alpha = mat_opacity[m]
        info = mat_texture[m]
        if info[1] > 0:
            t = _sample(texels, info, uv)
            sc = mat_tex_scale[m]
            bi = mat_tex_bias[m]
            kd = wp.cw_mul(
                kd, wp.vec3(t[0] * sc[0] + bi[0], t[1] * sc[1] + bi[1], t[2] * sc[2] + bi[2])
            )
    rgb = wp.cw_mul(ambient[0], kd)
    for i in range(dir_lights.shape[0]):
        d = -dir_lights[i, 0]
        lc = dir_lights[i, 1]
        rgb += wp.cw_mul(diffuse(n, lc, d), kd) + wp.cw_mul(
            specular(p, n, d, lc, cam, shininess), ks
        )
    for i in range(point_lights.shape[0]):
        d = point_lights[i, 0] - p
        lc = point_lights[i, 1]
        rgb += wp.cw_mul(diffuse(n, lc, d), kd) + wp.cw_mul(
            specular(p, n, d, lc, cam, shininess), ks
        )
    alpha = wp.clamp(alpha, 0.0, 1.0)
    rgba_out[y, x] = wp.vec4(rgb[0] * alpha, rgb[1] * alpha, rgb[2] * alpha, alpha)


def launch_shade(fragments, buffers, *, orthographic: bool, out: wp.array) -> None:
    """Shades K = 1 ``fragments`` with ``buffers`` (a :class:`~warpraster.usd.render.StageBuffers`).

    ``buffers.view`` holds (camera position, forward, (far, 0, 0)): per-frame
    values live in device arrays so a captured graph sees new ones.
    """
    b = buffers
    h, w = out.shape
    wp.launch(
        _shade_kernel,
        dim=(h, w),
        inputs=[
            fragments.pix_to_face,
            fragments.bary_coords,
            fragments.zbuf,
            b.verts,
            b.faces,
            b.corner_normals,
            b.corner_colors,
            b.corner_uvs,
            b.face_material,
            b.mat_diffuse,
            b.mat_specular,
            b.mat_shininess,
            b.mat_opacity,
            b.mat_texture,
            b.mat_tex_scale,
            b.mat_tex_bias,
            b.texels,
            b.dir_lights,
            b.point_lights,
            b.ambient,
            b.view,
            int(orthographic),
        ],
        outputs=[out],
        device=out.device,
    )


@wp.kernel
def _resolve_kernel(
    # Samples in:
    rgba: wp.array2d(dtype=wp.vec4),
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=float),
    face_mesh: wp.array(dtype=wp.int32),
    view: wp.array(dtype=wp.vec3),
    sy: int,
    sx: int,
    # Out:
    color_out: wp.array2d(dtype=wp.vec4),
    depth_out: wp.array2d(dtype=float),
    face_out: wp.array2d(dtype=wp.int32),
    mesh_out: wp.array2d(dtype=wp.int32),
):
    y, x = wp.tid()
    acc = wp.vec4(0.0)
    for j in range(sy):
        for i in range(sx):
            acc += rgba[y * sy + j, x * sx + i]
    acc = acc / float(sy * sx)
    a = acc[3]
    if a > 0.0:
        color_out[y, x] = wp.vec4(acc[0] / a, acc[1] / a, acc[2] / a, a)
    else:
        color_out[y, x] = wp.vec4(0.0)
    cy = y * sy + sy // 2
    cx = x * sx + sx // 2
    f = pix_to_face[0, cy, cx, 0]
    z = zbuf[0, cy, cx, 0]
    if f < 0 or z > view[2][0]:
        face_out[y, x] = -1
        mesh_out[y, x] = -1
        depth_out[y, x] = wp.inf
    else:
        face_out[y, x] = f
        mesh_out[y, x] = face_mesh[f]
        depth_out[y, x] = z


def launch_resolve(
    rgba, fragments, face_mesh, view, grid: tuple[int, int], color, depth, face_id, mesh_id
) -> None:
    """Box-filters ``grid`` = (rows, columns) samples per pixel (straight alpha out).

    Depth, face and mesh come from the sample (rows // 2, columns // 2): the
    pixel centre for odd grids, the sample below-right of it for even ones
    (-1 / inf where empty or beyond the far distance, ``view[2][0]``).
    """
    h, w = color.shape
    wp.launch(
        _resolve_kernel,
        dim=(h, w),
        inputs=[rgba, fragments.pix_to_face, fragments.zbuf, face_mesh, view, *map(int, grid)],
        outputs=[color, depth, face_id, mesh_id],
        device=color.device,
    )
