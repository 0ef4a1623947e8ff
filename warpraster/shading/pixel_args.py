"""The argument bundles of the shading kernels (``@wp.struct``), and their builders.

Arrays that travel together from kernel to kernel are one struct: the
fragments a pixel kernel reads, the per-face corner tables, a camera's R/T rows
and a material's rows. :class:`~warpraster.shading.fused.ShadeInputs` nests
them, and :class:`~warpraster.shading.fused.ShadeGrads` nests the same structs
for their gradients (same field names: the gradient of ``a.mat.diffuse`` is
``g.mat.diffuse``). Arrays inside a struct get gradients on a ``wp.Tape``
(Warp's tape mirrors the struct with the arrays' ``.grad``); scalar fields do not.

Structs are host-side objects (no device allocation); a render keeps its own
between calls in a :class:`~warpraster.structs.StructCache` (setting a struct's
arrays costs host time).
"""

from __future__ import annotations

import warp as wp

from ..structs import new_struct

__all__ = [
    "CameraRT",
    "FaceCorners",
    "MaterialRows",
    "PixelFragments",
    "pixel_fragments",
]


@wp.struct
class PixelFragments:
    """The (N, H, W, K) fragments a pixel kernel reads (:class:`warpraster.Fragments`):
    ``pix_to_face`` int32 (-1: empty slot), ``bary_coords`` ``vec3``, ``zbuf`` and
    ``dists`` float32."""

    pix_to_face: wp.array4d(dtype=wp.int32)
    bary_coords: wp.array4d(dtype=wp.vec3)
    zbuf: wp.array4d(dtype=wp.float32)
    dists: wp.array4d(dtype=wp.float32)


@wp.struct
class FaceCorners:
    """Per-face corner tables (F,) ``mat33``, one row per corner: world positions
    ``pos``, normals ``nrm`` (flat shading keeps the face normal in row 0) and
    vertex colours ``col``."""

    pos: wp.array(dtype=wp.mat33)
    nrm: wp.array(dtype=wp.mat33)
    col: wp.array(dtype=wp.mat33)


@wp.struct
class CameraRT:
    """World-to-view rotations ``R`` (B,) ``mat33`` and translations ``T`` (B,) ``vec3``
    (row vectors, PyTorch3D's convention; B = 1 or N)."""

    R: wp.array(dtype=wp.mat33)
    T: wp.array(dtype=wp.vec3)


@wp.struct
class MaterialRows:
    """A :class:`~warpraster.shading.materials.Materials` as kernels read it: (B,)
    ``vec3`` reflectivities and float32 ``shininess``."""

    ambient: wp.array(dtype=wp.vec3)
    diffuse: wp.array(dtype=wp.vec3)
    specular: wp.array(dtype=wp.vec3)
    shininess: wp.array(dtype=wp.float32)


def pixel_fragments(fragments) -> PixelFragments:
    """The :class:`PixelFragments` of a :class:`warpraster.Fragments` (no checks)."""
    return new_struct(
        PixelFragments,
        fragments.pix_to_face.device,
        pix_to_face=fragments.pix_to_face,
        bary_coords=fragments.bary_coords,
        zbuf=fragments.zbuf,
        dists=fragments.dists,
    )
