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

from .deterministic import DEFAULT_CHUNK, SortedSegmentSum
from .geometry import (
    barycentric,
    clip_barycentric,
    is_inside,
    perspective_correct,
    pixel_centre,
    point_triangle_dist2,
)

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
    """

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
        """Host copies: bary_coords as (N, H, W, K, 3)."""
        return {
            "pix_to_face": self.pix_to_face.numpy(),
            "zbuf": self.zbuf.numpy(),
            "bary_coords": self.bary_coords.numpy().reshape(self.shape + (3,)),
            "dists": self.dists.numpy(),
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


# ----------------------------------------------------------------------------- per-slot math
@wp.func
def fragment_values(
    p: wp.vec2, v0: wp.vec3, v1: wp.vec3, v2: wp.vec3, perspective: int, clip_bary: int
):
    """(zbuf, bary_coords, signed dists) of the face (v0, v1, v2) at pixel centre ``p``."""
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
    z = bary[0] * v0[2] + bary[1] * v1[2] + bary[2] * v2[2]
    return z, bary, d


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
    """Recompute; its generated adjoint scatters into ``verts.grad`` with atomics."""
    n, yi, xi, k = wp.tid()
    f = pix_to_face[n, yi, xi, k]
    if f < 0:
        zbuf[n, yi, xi, k] = -1.0
        bary_coords[n, yi, xi, k] = wp.vec3(-1.0, -1.0, -1.0)
        dists[n, yi, xi, k] = -1.0
    else:
        p = pixel_centre(yi, xi, height, width)
        z, bary, d = fragment_values(
            p, verts[faces[f, 0]], verts[faces[f, 1]], verts[faces[f, 2]], perspective, clip_bary
        )
        zbuf[n, yi, xi, k] = z
        bary_coords[n, yi, xi, k] = bary
        dists[n, yi, xi, k] = d


# ----------------------------------------------------------------------------- deterministic
@wp.func
def _slot_face_verts(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    f: int,
    slot_grad: wp.array(dtype=wp.mat33),
    s: int,
) -> wp.mat33:
    """Rows: face f's three vertices. Its adjoint stores the slot's gradient (no atomics)."""
    return wp.matrix_from_rows(verts[faces[f, 0]], verts[faces[f, 1]], verts[faces[f, 2]])


@wp.func_grad(_slot_face_verts)
def _adj_slot_face_verts(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    f: int,
    slot_grad: wp.array(dtype=wp.mat33),
    s: int,
    adj_ret: wp.mat33,
):
    slot_grad[s] = adj_ret


@wp.kernel
def _recompute_fragments_per_slot(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    pix_to_face: wp.array4d(dtype=wp.int32),
    height: int,
    width: int,
    perspective: int,
    clip_bary: int,
    slot_grad: wp.array(dtype=wp.mat33),
    zbuf: wp.array4d(dtype=wp.float32),
    bary_coords: wp.array4d(dtype=wp.vec3),
    dists: wp.array4d(dtype=wp.float32),
):
    """Same values as ``_recompute_fragments``; launched only as an adjoint.

    The adjoint writes d loss / d (v0, v1, v2) of each valid slot into
    ``slot_grad[slot]`` (rows = face corners) instead of scattering into the
    vertices; slots with ``pix_to_face < 0`` are not written.
    """
    n, yi, xi, k = wp.tid()
    f = pix_to_face[n, yi, xi, k]
    if f < 0:
        zbuf[n, yi, xi, k] = -1.0
        bary_coords[n, yi, xi, k] = wp.vec3(-1.0, -1.0, -1.0)
        dists[n, yi, xi, k] = -1.0
    else:
        s = ((n * height + yi) * width + xi) * pix_to_face.shape[3] + k
        m = _slot_face_verts(verts, faces, f, slot_grad, s)
        p = pixel_centre(yi, xi, height, width)
        z, bary, d = fragment_values(p, m[0], m[1], m[2], perspective, clip_bary)
        zbuf[n, yi, xi, k] = z
        bary_coords[n, yi, xi, k] = bary
        dists[n, yi, xi, k] = d


@wp.kernel(enable_backward=False)
def _slot_keys(
    pix_to_face: wp.array4d(dtype=wp.int32),
    num_faces: int,
    keys: wp.array(dtype=wp.int32),
    order: wp.array(dtype=wp.int32),
):
    """Sort entries for the per-face sum: key = face (num_faces for an empty slot)."""
    n, yi, xi, k = wp.tid()
    s = ((n * pix_to_face.shape[1] + yi) * pix_to_face.shape[2] + xi) * pix_to_face.shape[3] + k
    f = pix_to_face[n, yi, xi, k]
    key = num_faces
    if f >= 0 and f < num_faces:
        key = f
    keys[s] = key
    order[s] = s


@wp.kernel(enable_backward=False)
def _corner_keys(
    faces: wp.array2d(dtype=wp.int32),
    num_verts: int,
    keys: wp.array(dtype=wp.int32),
    order: wp.array(dtype=wp.int32),
):
    """Sort entries for the per-vertex sum: key = vertex of face corner (f, c)."""
    f, c = wp.tid()
    e = 3 * f + c
    v = faces[f, c]
    key = num_verts
    if v >= 0 and v < num_verts:
        key = v
    keys[e] = key
    order[e] = e


class DeterministicBackward:
    """Buffers and launches of the atomic-free backward of :func:`recompute_fragments`.

    The backward is registered on the tape by hand (the forward is launched with
    ``record_tape=False``) and runs, without host reads or allocation:

    1. the adjoint of a per-slot recompute whose custom gradient stores each
       slot's d loss / d (v0, v1, v2) in ``slot_grad[slot]`` (no scatter);
    2. a stable sort of the slots by face and a fixed-order segmented sum into
       ``face_grad[face]`` (:class:`~warpraster.deterministic.SortedSegmentSum`);
    3. a stable sort of the face corners by vertex and a fixed-order segmented
       sum of ``face_grad`` rows, added into ``verts.grad``.

    Every addition happens in an order fixed by ``pix_to_face`` and the
    topology, so ``verts.grad`` is bit-identical run after run. Memory, on top
    of the fragments: about 55 bytes per slot (N*H*W*K: the slot's 3x3
    gradient, sort keys and indices twice over, reduction levels) and 90 per
    face.

    Args:
        shape: (N, H, W, K) of the fragments.
        num_faces: F, the length of the packed face array rendered.
        device: Warp device.
        chunk: entries one thread sums per reduction level.
    """

    def __init__(self, shape, num_faces: int, device=None, chunk: int = DEFAULT_CHUNK):
        self.shape = tuple(int(s) for s in shape)
        self.num_faces = int(num_faces)
        self.device = wp.get_device(device)
        slots = int(np.prod(self.shape))
        f_alloc = max(self.num_faces, 1)
        self.slot_grad = wp.empty(slots, dtype=wp.mat33, device=self.device)
        self.face_grad = wp.zeros(f_alloc, dtype=wp.mat33, device=self.device)
        # The same memory as 3F vec3 rows: entry 3f + c is corner c of face f.
        self.corner_grad = wp.array(
            ptr=self.face_grad.ptr, dtype=wp.vec3, shape=(3 * f_alloc,), device=self.device
        )
        self.corner_grad._ref = self.face_grad
        self.slot_sum = SortedSegmentSum(slots, wp.mat33, self.device, chunk)
        self.corner_sum = SortedSegmentSum(3 * f_alloc, wp.vec3, self.device, chunk)

    def matches(self, shape, num_faces: int, device) -> bool:
        return (
            self.shape == tuple(shape)
            and self.num_faces == int(num_faces)
            and self.device == wp.get_device(device)
        )

    def backward(
        self,
        verts: wp.array,
        faces: wp.array,
        out: Fragments,
        *,
        perspective_correct: bool,
        clip_barycentric_coords: bool,
    ) -> None:
        """Adds d loss / d verts (from the fragments' ``.grad``) into ``verts.grad``."""
        if self.num_faces == 0:
            return
        n, h, w, k = self.shape
        dev = self.device
        wp.launch(
            _slot_keys,
            dim=(n, h, w, k),
            inputs=[out.pix_to_face, self.num_faces],
            outputs=[self.slot_sum.keys, self.slot_sum.order],
            device=dev,
            record_tape=False,
        )
        wp.launch(
            _recompute_fragments_per_slot,
            dim=(n, h, w, k),
            inputs=[
                verts,
                faces,
                out.pix_to_face,
                h,
                w,
                int(perspective_correct),
                int(clip_barycentric_coords),
                self.slot_grad,
            ],
            outputs=[out.zbuf, out.bary_coords, out.dists],
            adj_inputs=[None, None, None, 0, 0, 0, 0, None],
            adj_outputs=[out.zbuf.grad, out.bary_coords.grad, out.dists.grad],
            adjoint=True,
            device=dev,
            record_tape=False,
        )
        self.face_grad.zero_()
        self.slot_sum.run(self.slot_grad, self.num_faces, self.face_grad, accumulate=False)
        wp.launch(
            _corner_keys,
            dim=(self.num_faces, 3),
            inputs=[faces, verts.shape[0]],
            outputs=[self.corner_sum.keys, self.corner_sum.order],
            device=dev,
            record_tape=False,
        )
        self.corner_sum.run(self.corner_grad, verts.shape[0], verts.grad, accumulate=True)


def _active_tape():
    """The ``wp.Tape`` currently recording, or None (Warp keeps it on its runtime)."""
    runtime = getattr(wp._src.context, "runtime", None)
    return getattr(runtime, "tape", None)


def recompute_fragments(
    verts: wp.array,
    faces: wp.array,
    out: Fragments,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    deterministic: DeterministicBackward | bool | None = None,
) -> None:
    """Fills ``out.zbuf``, ``out.bary_coords``, ``out.dists`` from ``out.pix_to_face``.

    Under an enclosing ``wp.Tape``, the backward accumulates into ``verts.grad``:

    * ``deterministic`` None/False: the launch is recorded and Warp's generated
      adjoint scatters with atomics (the fastest; on CUDA the last bits of
      ``verts.grad`` vary run to run);
    * a :class:`DeterministicBackward` (preallocated, graph-capturable) or True
      (allocated for this call): the launch is not recorded; a hand-written,
      atomic-free backward is registered with ``tape.record_func`` and gives
      bit-identical gradients run after run.
    """
    n, h, w, k = out.shape
    args = dict(
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
    if deterministic is None or deterministic is False:
        wp.launch(_recompute_fragments, **args)
        return
    if deterministic is True:
        deterministic = DeterministicBackward(out.shape, faces.shape[0], verts.device)
    elif not deterministic.matches(out.shape, faces.shape[0], verts.device):
        raise ValueError(
            "deterministic buffers were made for another shape, face count or device: "
            f"{deterministic.shape}, {deterministic.num_faces}, {deterministic.device} vs "
            f"{out.shape}, {faces.shape[0]}, {verts.device}"
        )
    wp.launch(_recompute_fragments, record_tape=False, **args)
    tape = _active_tape()
    grads = (verts.grad, out.zbuf.grad, out.bary_coords.grad, out.dists.grad)
    if tape is None or not verts.requires_grad or any(g is None for g in grads):
        return
    det = deterministic
    persp = bool(perspective_correct)
    clip = bool(clip_barycentric_coords)

    def backward():
        det.backward(verts, faces, out, perspective_correct=persp, clip_barycentric_coords=clip)

    tape.record_func(backward, arrays=[verts, out.zbuf, out.bary_coords, out.dists])
