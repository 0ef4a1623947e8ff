"""The pixels of a scene: one Warp kernel per pixel over its grid of K = 1 samples.

Per covered sample: barycentric interpolation of the triangle's corner normals,
colours and UVs (the barycentrics are perspective-correct, so this is the
world-space interpolation), the material (diffuse colour times a bilinear
texture sample, specular colour, shininess, opacity; ``displayColor`` when the
triangle has no material), then ambient + the directional and point lights
with PyTorch3D's Lambert and Phong terms (:func:`warpraster.shading.lighting.diffuse`,
:func:`~warpraster.shading.lighting.specular`). Normals are turned toward the
viewer (two-sided shading). Output: linear RGB premultiplied by alpha, and
alpha = opacity where covered, 0 elsewhere; a first hit beyond the far
clipping distance counts as empty. Per pixel: the box filter of its samples
(straight alpha), and the depth, face and mesh of its centre sample.

No gradients: this module is for pictures (``enable_backward`` off).
"""

from __future__ import annotations

import warp as wp

from ..shading.lighting import diffuse, specular
from .scene import WrapMode

wp.set_module_options({"enable_backward": False})

__all__ = ["Corner", "Lighting", "MaterialRow", "Surface", "launch_shade"]


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


@wp.struct
class Corner:
    """What a triangle corner carries: world ``normal``, ``color`` (linear RGB
    ``displayColor`` and ``displayOpacity``) and texture coordinates ``uv``."""

    normal: wp.vec3
    color: wp.vec4
    uv: wp.vec2


@wp.struct
class Surface:
    """The packed triangles of a scene (arrays of :class:`~warpraster.usd.render.StageBuffers`).

    ``verts`` (V,) world positions; ``faces`` (F, 3) vertex indices; ``corners``
    (3 F,) the corners of face f at rows 3 f .. 3 f + 2; ``face_material`` (F,)
    row of :class:`MaterialRow`, -1 for ``displayColor``; ``face_mesh`` (F,)
    mesh index.
    """

    verts: wp.array(dtype=wp.vec3)
    faces: wp.array2d(dtype=wp.int32)
    corners: wp.array(dtype=Corner)
    face_material: wp.array(dtype=wp.int32)
    face_mesh: wp.array(dtype=wp.int32)


@wp.struct
class MaterialRow:
    """One material: linear RGB ``diffuse`` and ``specular``, the Phong exponent
    ``shininess``, ``opacity``; ``texture`` = (first texel in the atlas, width,
    height, wrap_s * 4 + wrap_t), width 0 for none; the texel is read as
    ``texel * tex_scale + tex_bias`` (``UsdUVTexture`` scale and bias)."""

    diffuse: wp.vec3
    specular: wp.vec3
    shininess: float
    opacity: float
    texture: wp.vec4i
    tex_scale: wp.vec4
    tex_bias: wp.vec4


@wp.struct
class Lighting:
    """The lights and the viewpoint, rewritten in place per frame.

    ``directional`` (D, 2) rows of (direction the light travels, colour);
    ``point`` (P, 2) rows of (position, colour); ``ambient`` (1,) colour;
    ``view`` (3,) = (camera position, forward, (far, 0, 0)).
    """

    directional: wp.array2d(dtype=wp.vec3)
    point: wp.array2d(dtype=wp.vec3)
    ambient: wp.array(dtype=wp.vec3)
    view: wp.array(dtype=wp.vec3)


@wp.func
def _empty(f: int, z: float, view: wp.array(dtype=wp.vec3)) -> bool:
    """A sample of face ``f`` at depth ``z`` shows nothing: no face, or beyond the far distance."""
    return f < 0 or z > view[2][0]


@wp.func
def _material_colours(mat: MaterialRow, texels: wp.array(dtype=wp.vec4), uv: wp.vec2):
    """(diffuse, specular, shininess, opacity) of ``mat`` at ``uv`` (diffuse times its texture)."""
    kd = mat.diffuse
    info = mat.texture
    if info[1] > 0:
        t = _sample(texels, info, uv)
        sc = mat.tex_scale
        bi = mat.tex_bias
        kd = wp.cw_mul(
            kd, wp.vec3(t[0] * sc[0] + bi[0], t[1] * sc[1] + bi[1], t[2] * sc[2] + bi[2])
        )
    return kd, mat.specular, mat.shininess, mat.opacity


@wp.func
def _phong(
    p: wp.vec3,
    n: wp.vec3,
    direction: wp.vec3,
    light: wp.vec3,
    cam: wp.vec3,
    kd: wp.vec3,
    ks: wp.vec3,
    shininess: float,
) -> wp.vec3:
    """Lambert + Phong light of colour ``light`` from ``direction`` (toward the light)."""
    return wp.cw_mul(diffuse(n, light, direction), kd) + wp.cw_mul(
        specular(p, n, direction, light, cam, shininess), ks
    )


@wp.func
def _sample_colour(
    surface: Surface,
    materials: wp.array(dtype=MaterialRow),
    texels: wp.array(dtype=wp.vec4),
    lighting: Lighting,
    orthographic: int,
    f: int,
    bary: wp.vec3,
) -> wp.vec4:
    """Premultiplied RGBA of face ``f`` at ``bary`` (clamped to >= 0, renormalised)."""
    b = wp.vec3(wp.max(bary[0], 0.0), wp.max(bary[1], 0.0), wp.max(bary[2], 0.0))
    s = b[0] + b[1] + b[2]
    if s > 0.0:
        b = b / s
    verts = surface.verts
    faces = surface.faces
    p = b[0] * verts[faces[f, 0]] + b[1] * verts[faces[f, 1]] + b[2] * verts[faces[f, 2]]
    c0 = surface.corners[3 * f]
    c1 = surface.corners[3 * f + 1]
    c2 = surface.corners[3 * f + 2]
    n = b[0] * c0.normal + b[1] * c1.normal + b[2] * c2.normal
    col = b[0] * c0.color + b[1] * c1.color + b[2] * c2.color
    uv = b[0] * c0.uv + b[1] * c1.uv + b[2] * c2.uv
    view = lighting.view
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
    m = surface.face_material[f]
    if m >= 0:
        kd, ks, shininess, alpha = _material_colours(materials[m], texels, uv)
    rgb = wp.cw_mul(lighting.ambient[0], kd)
    for i in range(lighting.directional.shape[0]):
        light = lighting.directional[i, 1]
        rgb += _phong(p, n, -lighting.directional[i, 0], light, cam, kd, ks, shininess)
    for i in range(lighting.point.shape[0]):
        light = lighting.point[i, 1]
        rgb += _phong(p, n, lighting.point[i, 0] - p, light, cam, kd, ks, shininess)
    alpha = wp.clamp(alpha, 0.0, 1.0)
    return wp.vec4(rgb[0] * alpha, rgb[1] * alpha, rgb[2] * alpha, alpha)


@wp.kernel
def _shade_kernel(
    # Fragments in (K = 1, sy x sx samples per pixel):
    pix_to_face: wp.array4d(dtype=wp.int32),
    bary: wp.array4d(dtype=wp.vec3),
    zbuf: wp.array4d(dtype=float),
    sy: int,
    sx: int,
    # Scene in:
    surface: Surface,
    materials: wp.array(dtype=MaterialRow),
    texels: wp.array(dtype=wp.vec4),
    lighting: Lighting,
    orthographic: int,
    # Out, (H, W):
    color_out: wp.array2d(dtype=wp.vec4),
    depth_out: wp.array2d(dtype=float),
    face_out: wp.array2d(dtype=wp.int32),
    mesh_out: wp.array2d(dtype=wp.int32),
):
    y, x = wp.tid()
    view = lighting.view
    acc = wp.vec4(0.0)
    for j in range(sy):
        for i in range(sx):
            ys = y * sy + j
            xs = x * sx + i
            f = pix_to_face[0, ys, xs, 0]
            if not _empty(f, zbuf[0, ys, xs, 0], view):
                b = bary[0, ys, xs, 0]
                acc += _sample_colour(surface, materials, texels, lighting, orthographic, f, b)
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
    if _empty(f, z, view):
        face_out[y, x] = -1
        mesh_out[y, x] = -1
        depth_out[y, x] = wp.inf
    else:
        face_out[y, x] = f
        mesh_out[y, x] = surface.face_mesh[f]
        depth_out[y, x] = z


def launch_shade(
    fragments,
    buffers,
    *,
    grid: tuple[int, int],
    orthographic: bool,
    color: wp.array,
    depth: wp.array,
    face_id: wp.array,
    mesh_id: wp.array,
) -> None:
    """Shades the K = 1 ``fragments`` of a sample grid and resolves each pixel.

    Every sample is shaded (premultiplied RGBA, transparent where empty or
    beyond the far distance) and the ``grid`` = (rows, columns) samples of a
    pixel are box-filtered (straight alpha out). Depth, face and mesh come from
    the sample (rows // 2, columns // 2): the pixel centre for odd grids, the
    sample below-right of it for even ones (-1 / inf where empty or beyond the
    far distance).

    Args:
        fragments: the K = 1 fragments of the (H rows, W columns) sample grid.
        buffers: the scene's device arrays (:class:`~warpraster.usd.render.StageBuffers`);
            ``buffers.lighting.view`` holds (camera position, forward, (far, 0, 0)):
            per-frame values live in device arrays so a captured graph sees new ones.
        grid: (rows, columns) samples per pixel.
        orthographic: the camera is orthographic (parallel view rays).
        color: (H, W) ``vec4`` output: linear RGB and alpha = coverage x opacity.
        depth: (H, W) float32 output: view depth, ``inf`` where empty.
        face_id, mesh_id: (H, W) int32 outputs: triangle and mesh, -1 where empty.
    """
    h, w = color.shape
    wp.launch(
        _shade_kernel,
        dim=(h, w),
        inputs=[
            fragments.pix_to_face,
            fragments.bary_coords,
            fragments.zbuf,
            *map(int, grid),
            buffers.surface,
            buffers.materials,
            buffers.texels,
            buffers.lighting,
            int(orthographic),
        ],
        outputs=[color, depth, face_id, mesh_id],
        device=color.device,
    )
