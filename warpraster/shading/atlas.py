"""Per-slot albedo and opacity from a material table and a texel atlas.

A scene's materials (a USD stage's ``UsdPreviewSurface`` materials) each have a
diffuse colour, an opacity and optionally a texture: one image of an atlas that
holds every texture's texels one after the other, read bilinearly with its own
wrap modes and a ``texel * scale + bias`` (``UsdUVTexture``). For each filled
slot (n, y, x, k) of the fragments, :func:`sample_atlas` writes

* the albedo: the face's material diffuse colour times its texture at the
  slot's interpolated UV, the diffuse colour alone for an untextured material,
  or the slot's interpolated corner colour for a face without a material
  (id -1: USD's ``displayColor``);
* the opacity: the material's, or the interpolated corner alpha
  (``displayOpacity``) for a face without one;

which the pixel kernel reads as its texels (``TexelSource.PIXEL``) and
per-slot opacity (``slot_alpha``). The formula is
:func:`~warpraster.shading.material_table.face_albedo` on the atlas's
:class:`~warpraster.shading.material_table.MaterialTable` (the camera sensor's
kernels call it too). UV convention: v = 0 is the bottom row of a texture
(USD's ``st``); row 0 of the stored texels is the top.

The kernel is loop-free (one thread per slot), so Warp's generated adjoint is
right: on a ``wp.Tape`` gradients reach the texels (each slot's four bilinear
taps, atomically), the material diffuse colours and opacities, the corner
UVs and colours, and the barycentrics (through the interpolated UV and
colour).
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..grad_buffers import note_on_tape
from .material_table import CornerAlbedo, MaterialTable, TextureWrap, face_albedo, material_table

wp.set_module_options({"fuse_fp": False})

__all__ = ["Atlas", "TextureWrap", "sample_atlas"]


@wp.kernel
def _sample_atlas_kernel(
    # Fragments in:
    pix_to_face: wp.array4d(dtype=wp.int32),
    bary_coords: wp.array4d(dtype=wp.vec3),
    # Faces in: material row (-1: none) and per-corner UVs and RGBA colours, (F, 3)
    face_material: wp.array(dtype=wp.int32),
    corners: CornerAlbedo,
    # Materials in:
    table: MaterialTable,
    # Data out, (N, H, W, K):
    albedo_out: wp.array4d(dtype=wp.vec3),
    opacity_out: wp.array4d(dtype=wp.float32),
):
    n, y, x, k = wp.tid()
    f = pix_to_face[n, y, x, k]
    if f < 0:
        albedo_out[n, y, x, k] = wp.vec3(0.0)
        opacity_out[n, y, x, k] = 0.0
        return
    c = face_albedo(table, face_material[f], corners, f, bary_coords[n, y, x, k])
    albedo_out[n, y, x, k] = wp.vec3(c[0], c[1], c[2])
    opacity_out[n, y, x, k] = c[3]


class Atlas:
    """A material table with its texture atlas, on the device.

    Args (keyword-only):
        diffuse: (M, 3) diffuse colours (multiplied by the texture, if any).
        opacity: (M,) opacities.
        textures: M entries, each None or ``(texels, wrap_s, wrap_t, scale, bias)``:
            (h, w, 4) float32 RGBA (row 0 the top), :class:`TextureWrap` modes and
            the (4,) ``texel * scale + bias`` of ``UsdUVTexture``.
        device: Warp device.
        requires_grad: the diffuse colours, opacities and texels take gradients.

    Attributes:
        diffuse, opacity, texels: the trainable arrays ((M,) ``vec3``, (M,)
            float32, (T,) ``vec4``; texel 0 is a black one no texture uses).
        texture, tex_scale, tex_bias: (M,) per-material texture info
            ((first texel, w, h, wrap_s * 4 + wrap_t), width 0 for none), scale, bias.
        table: these arrays as one kernel argument
            (:class:`~warpraster.shading.material_table.MaterialTable`).
    """

    def __init__(self, *, diffuse, opacity, textures, device=None, requires_grad: bool = False):
        d = wp.get_device(device)
        diffuse = np.asarray(diffuse, np.float32).reshape(-1, 3)
        m = diffuse.shape[0]
        opacity = np.asarray(opacity, np.float32).reshape(-1)
        if opacity.shape[0] != m or len(textures) != m:
            raise ValueError(
                f"diffuse ({m}), opacity ({opacity.shape[0]}) and textures ({len(textures)}) "
                "need one entry per material"
            )
        info = np.zeros((m, 4), np.int32)
        scale = np.ones((m, 4), np.float32)
        bias = np.zeros((m, 4), np.float32)
        chunks, offset = [np.zeros((1, 4), np.float32)], 1
        for i, tex in enumerate(textures):
            if tex is None:
                continue
            texels, wrap_s, wrap_t, sc, bi = tex
            texels = np.asarray(texels, np.float32)
            h, w = texels.shape[:2]
            info[i] = (offset, w, h, int(wrap_s) * 4 + int(wrap_t))
            scale[i], bias[i] = sc, bi
            chunks.append(texels.reshape(-1, 4))
            offset += h * w
        rg = bool(requires_grad)
        self.device = d
        self.num_materials = m
        self.diffuse = wp.array(diffuse, dtype=wp.vec3, device=d, requires_grad=rg)
        self.opacity = wp.array(opacity, dtype=wp.float32, device=d, requires_grad=rg)
        self.texels = wp.array(np.concatenate(chunks), dtype=wp.vec4, device=d, requires_grad=rg)
        self.texture = wp.array(info, dtype=wp.vec4i, device=d)
        self.tex_scale = wp.array(scale, dtype=wp.vec4, device=d)
        self.tex_bias = wp.array(bias, dtype=wp.vec4, device=d)
        self.table = material_table(self)

    def texel_range(self, material: int) -> tuple[int, int, int]:
        """(first texel, width, height) of a material's texture (width 0: none)."""
        first, w, h, _ = (int(v) for v in self.texture.numpy()[material])
        return first, w, h


def sample_atlas(
    fragments,
    face_material: wp.array,
    corners: CornerAlbedo,
    atlas: Atlas,
    *,
    albedo_out: wp.array,
    opacity_out: wp.array,
) -> None:
    """Writes each slot's albedo and opacity (see the module docs; on the tape).

    Args:
        fragments: (N, H, W, K) fragments (``pix_to_face``, ``bary_coords``).
        face_material: (F,) int32 material rows, -1 for the corner colours.
        corners: the faces' (F, 3) ``vec2`` UVs and ``vec4`` RGBA colours.
        atlas: the :class:`Atlas`.
        albedo_out: (N, H, W, K) ``vec3``; opacity_out: (N, H, W, K) float32.
    """
    # the table's and the corners' arrays reach the kernel inside structs: tape.zero()
    # must know them
    note_on_tape(atlas.diffuse, atlas.opacity, atlas.texels, corners.uv, corners.color)
    wp.launch(
        _sample_atlas_kernel,
        dim=fragments.pix_to_face.shape,
        inputs=[
            fragments.pix_to_face,
            fragments.bary_coords,
            face_material,
            corners,
            atlas.table,
        ],
        outputs=[albedo_out, opacity_out],
        device=albedo_out.device,
    )
