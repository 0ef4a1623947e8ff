"""Typed rasterizer outputs and the per-slot values they hold.

The raster pass (:mod:`warpraster.raster`) makes the discrete choice of which
faces cover each pixel, without gradients; :func:`fragment_values` computes
``zbuf``, ``bary_coords`` and ``dists`` of one slot from that choice with
straight-line code. Their backward to the vertices is :mod:`warpraster.backward`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import warp as wp

from .geometry import face_barycentric, face_depth, point_triangle_dist2
from .meshes import MeshArrays

# No FMA contraction: PyTorch3D's float32 arithmetic rounds every product, and
# contracting a*b + c moved a p05 (blur 0.01, extrapolated barycentrics)
# gradient by 2e-4 relative on CUDA.
wp.set_module_options({"fuse_fp": False})


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

    Fragments returned from a workspace (a :class:`~warpraster.RasterWorkspace`,
    the rasterizer and renderer objects) are the workspace's own arrays, which
    its next call rewrites: read them, or copy them, but do not write into them.
    That call rewrites only the slots it must (an empty group of four slots that
    the call before left filled with -1 is not written again); after writing
    into them, call the workspace's ``refill_empty_slots()``.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    pix_to_face: wp.array
    zbuf: wp.array
    bary_coords: wp.array
    dists: wp.array
    overflow_count: wp.array | None = field(default=None, repr=False)
    """int32 (1,) on the device: bins that overflowed in the last binned call
    (None on the naive path). Read it with :meth:`overflowed_bins`."""

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
        if self.overflow_count is None:
            return 0
        return int(self.overflow_count.numpy()[0])

    def numpy(self) -> dict[str, np.ndarray]:
        """Host copies (reads the device): bary_coords as (N, H, W, K, 3).

        Each array is a copy of its own (on the ``cpu`` device too, where
        ``wp.array.numpy()`` is a view): fragments kept from a loop over one
        workspace keep their values when the next call rewrites its arrays.
        """
        return {
            "pix_to_face": np.array(self.pix_to_face.numpy()),
            "zbuf": np.array(self.zbuf.numpy()),
            "bary_coords": np.array(self.bary_coords.numpy()).reshape(self.shape + (3,)),
            "dists": np.array(self.dists.numpy()),
        }


def allocate_fragments(
    n: int, h: int, w: int, k: int, device, requires_grad: bool, overflow_count=None
) -> Fragments:
    """Output arrays for one render (the float outputs carry gradients if asked)."""
    shape = (n, h, w, k)
    return Fragments(
        overflow_count=overflow_count,
        pix_to_face=wp.full(shape, -1, dtype=wp.int32, device=device),
        zbuf=wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=requires_grad),
        bary_coords=wp.zeros(shape, dtype=wp.vec3, device=device, requires_grad=requires_grad),
        dists=wp.zeros(shape, dtype=wp.float32, device=device, requires_grad=requires_grad),
    )


@wp.struct
class FragmentRows:
    """The four arrays of :class:`Fragments` (or their gradients) in a kernel,
    viewed as (N * H * W, K) rows: ``pix_to_face`` int32, ``zbuf`` float32,
    ``bary`` vec3, ``dists`` float32."""

    pix_to_face: wp.array2d(dtype=wp.int32)
    zbuf: wp.array2d(dtype=wp.float32)
    bary: wp.array2d(dtype=wp.vec3)
    dists: wp.array2d(dtype=wp.float32)


def fragment_rows(pix_to_face: wp.array, zbuf: wp.array, bary: wp.array, dists: wp.array
                  ) -> FragmentRows:  # fmt: skip
    """A :class:`FragmentRows` of four arrays of one shape (..., K) (``bary`` of vec3)."""
    k = pix_to_face.shape[-1]
    rows = FragmentRows()
    rows.pix_to_face = pix_to_face.reshape((-1, k))
    rows.zbuf = zbuf.reshape((-1, k))
    rows.bary = bary.reshape((-1, k))
    rows.dists = dists.reshape((-1, k))
    return rows


# ----------------------------------------------------------------------------- per-slot math
@wp.func
def fragment_values(
    p: wp.vec2, face: wp.mat33, perspective_correct: int, clip_barycentric_coords: int
):
    """(zbuf, bary_coords, signed dists) of ``face`` (rows: its vertices' screen x,
    y and depth) at pixel centre ``p``."""
    bary, inside = face_barycentric(p, face, perspective_correct)
    bary, z = face_depth(bary, face, clip_barycentric_coords)
    d = point_triangle_dist2(
        p,
        wp.vec2(face[0, 0], face[0, 1]),
        wp.vec2(face[1, 0], face[1, 1]),
        wp.vec2(face[2, 0], face[2, 1]),
    )
    if inside:
        d = -d
    return z, bary, d


@wp.func
def slot_fragment(
    meshes: MeshArrays, f: int, p: wp.vec2, perspective_correct: int, clip_barycentric_coords: int
):
    """(zbuf, bary_coords, dists) of a slot holding face f of ``meshes`` at pixel
    centre ``p``: :func:`fragment_values`, or the -1 fill of an empty slot (f < 0)."""
    if f < 0:
        return -1.0, wp.vec3(-1.0, -1.0, -1.0), -1.0
    verts = meshes.verts
    face = wp.vec3i(meshes.faces[f, 0], meshes.faces[f, 1], meshes.faces[f, 2])
    rows = wp.matrix_from_rows(verts[face[0]], verts[face[1]], verts[face[2]])
    return fragment_values(p, rows, perspective_correct, clip_barycentric_coords)
