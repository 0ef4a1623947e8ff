"""Typed rasterizer outputs and their differentiable recompute from ``pix_to_face``.

The raster pass (:mod:`warpraster.raster`) makes the discrete choice of which
faces cover each pixel, without gradients. The kernel here recomputes ``zbuf``,
``bary_coords`` and ``dists`` from that choice with straight-line code (no loop
over faces), so Warp's generated adjoint sends exact gradients to the vertex
array through the indexed faces when the launch is recorded on a ``wp.Tape``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import warp as wp

from .geometry import (
    barycentric,
    clip_barycentric,
    is_inside,
    perspective_correct,
    pixel_centre,
    point_triangle_dist2,
)


@dataclass
class Fragments:
    """Per-pixel top-K faces of a rasterized batch, sorted by depth.

    For N images of H x W pixels and K faces per pixel (all Warp arrays on the
    rasterizer's device):

    Attributes:
        pix_to_face: int32 (N, H, W, K). Index into the packed faces of the face
            in slot k, -1 where fewer than k + 1 faces cover the pixel.
        zbuf: float32 (N, H, W, K). Depth of the face at the pixel centre
            (interpolated with the final barycentrics), -1 in empty slots.
        bary_coords: vec3 (N, H, W, K). Barycentrics of the pixel centre w.r.t.
            the face's vertices 0, 1, 2 (perspective-corrected and clipped when
            those options are on), (-1, -1, -1) in empty slots.
        dists: float32 (N, H, W, K). Signed squared xy distance from the pixel
            centre to the nearest face edge: negative inside, positive outside
            (only within ``blur_radius``), -1 in empty slots.

    Slots are ordered by ascending ``zbuf``; exact ties by ascending face index.
    Use ``pix_to_face >= 0`` as the validity mask (a valid ``dists`` can be -1).
    """

    pix_to_face: wp.array
    zbuf: wp.array
    bary_coords: wp.array
    dists: wp.array
    _overflow: wp.array | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(N, H, W, K)."""
        return tuple(self.pix_to_face.shape)

    def overflowed_bins(self) -> int:
        """How many (image, bin) face lists overflowed in the binned pass.

        An overflowed bin is still rasterized exactly (its pixels fall back to
        all faces of the mesh); this only reports that the slower path ran.
        Reads one integer back from the device: call it after the render, not
        inside a captured graph. Always 0 for the naive path.
        """
        if self._overflow is None:
            return 0
        return int(self._overflow.numpy()[0])

    def numpy(self) -> dict[str, np.ndarray]:
        """Host copies: bary_coords as (N, H, W, K, 3)."""
        return {
            "pix_to_face": self.pix_to_face.numpy(),
            "zbuf": self.zbuf.numpy(),
            "bary_coords": self.bary_coords.numpy().reshape(self.shape + (3,)),
            "dists": self.dists.numpy(),
        }


def allocate_fragments(n, h, w, k, device, requires_grad: bool) -> Fragments:
    """Output arrays for one render (the float outputs carry gradients if asked)."""
    shape = (n, h, w, k)
    return Fragments(
        pix_to_face=wp.full(shape, -1, dtype=wp.int32, device=device),
        zbuf=wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=requires_grad),
        bary_coords=wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=requires_grad),
        dists=wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=requires_grad),
    )


@wp.kernel
def _recompute_fragments(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    pix_to_face: wp.array4d(dtype=wp.int32),
    height: int,
    width: int,
    perspective: int,
    clip_bary: int,
    zbuf: wp.array4d(dtype=wp.float32),
    bary_coords: wp.array4d(dtype=wp.vec3),
    dists: wp.array4d(dtype=wp.float32),
):
    n, yi, xi, k = wp.tid()
    f = pix_to_face[n, yi, xi, k]
    if f < 0:
        zbuf[n, yi, xi, k] = -1.0
        bary_coords[n, yi, xi, k] = wp.vec3(-1.0, -1.0, -1.0)
        dists[n, yi, xi, k] = -1.0
    else:
        p = pixel_centre(yi, xi, height, width)
        v0 = verts[faces[f, 0]]
        v1 = verts[faces[f, 1]]
        v2 = verts[faces[f, 2]]
        a = wp.vec2(v0[0], v0[1])
        b = wp.vec2(v1[0], v1[1])
        c = wp.vec2(v2[0], v2[1])
        bary = barycentric(p, a, b, c)
        if perspective != 0:
            bary = perspective_correct(bary, v0[2], v1[2], v2[2])
        inside = is_inside(bary)
        if clip_bary != 0:
            bary = clip_barycentric(bary)
        d = point_triangle_dist2(p, a, b, c)
        if inside:
            d = -d
        zbuf[n, yi, xi, k] = bary[0] * v0[2] + bary[1] * v1[2] + bary[2] * v2[2]
        bary_coords[n, yi, xi, k] = bary
        dists[n, yi, xi, k] = d


def recompute_fragments(
    verts: wp.array,
    faces: wp.array,
    out: Fragments,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
) -> None:
    """Fills ``out.zbuf``, ``out.bary_coords``, ``out.dists`` from ``out.pix_to_face``.

    Launched normally, so an enclosing ``wp.Tape`` records it and its adjoint
    accumulates into ``verts.grad``.
    """
    n, h, w, k = out.shape
    wp.launch(
        _recompute_fragments,
        dim=(n, h, w, k),
        inputs=[
            verts,
            faces,
            out.pix_to_face,
            h,
            w,
            int(perspective_correct),
            int(clip_barycentric_coords),
        ],
        outputs=[out.zbuf, out.bary_coords, out.dists],
        device=verts.device,
    )
