"""The backward of the fragments to the vertices: one entry, two strategies.

A render makes the discrete choice (``pix_to_face``) without gradients; the
values that carry gradients (``zbuf``, ``bary_coords``, ``dists``) depend on the
vertices of the chosen face only. Their derivatives are written out by hand,
slot by slot, following PyTorch3D's backward kernel at every tie and clamp and
in its order of operations (:mod:`warpraster.backward.slot_grads`;
the conventions are listed in ``docs/BACKWARD.md``). The per-slot numbers are
then summed per face and per vertex by one of two strategies:

* atomic (:mod:`~warpraster.backward.atomic`, the default): per-face sums with
  16-byte vector atomics, then a scatter to the vertices; fastest, the last
  bits vary run to run on a GPU;
* sorted (:mod:`~warpraster.backward.sorted`, ``deterministic=True``): per-slot
  stores, stable sorts and fixed-order segmented sums; bit-identical run after
  run.

Both are reached through :func:`accumulate_vertex_grads`, which the Warp tape
(:func:`record_backward`, called by every render) and the torch adapter
(:func:`grads_from_pix_to_face`) use. Nothing here allocates or reads back
after set-up, so the backward can be captured in a graph.
"""

from __future__ import annotations

import warp as wp

from .atomic import face_grad_rows, launch_atomic
from .recompute import recompute_fragments
from .slot_grads import slot_grads
from .slot_pass import SlotGradArgs, slot_grad_args, slot_kernel_flags
from .sorted import SortedBackward, SortedSegmentSum, gather_face_verts
from .tape import RecordGuard, active_tape, record_func

__all__ = [
    "DeterministicBackward",
    "FaceGradBuffers",
    "SortedBackward",
    "SortedSegmentSum",
    "accumulate_vertex_grads",
    "grads_from_pix_to_face",
    "recompute_fragments",
    "record_backward",
    "slot_grads",
]

#: The sorted strategy's buffers, under their earlier name.
DeterministicBackward = SortedBackward


class FaceGradBuffers:
    """The backward's buffers for one fragments shape and face count.

    Args:
        num_faces: F, faces of the packed face array rendered.
        device: Warp device.
        deterministic: the sorted strategy (else atomic).
        shape: (N, H, W, K) of the fragments (needed by the sorted strategy).
        gather: also hold the per-face vertex scratch that callers without a
            raster workspace need (:func:`grads_from_pix_to_face`).

    Attributes:
        face_grad: atomic strategy: (3F,) vec4 rows of per-face sums, else None.
        sorted: sorted strategy: a :class:`SortedBackward`, else None.
        guard: the tape-safety record of the workspace owning these buffers.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(self, num_faces: int, device, deterministic: bool, shape=None, *,
                 gather: bool = False):  # fmt: skip
        self.num_faces = int(num_faces)
        self.device = wp.get_device(device)
        self.deterministic = bool(deterministic)
        self.face_grad = None
        self.sorted = None
        if self.deterministic:
            if shape is None:
                raise ValueError("shape: the sorted (deterministic) backward needs (N, H, W, K)")
            self.sorted = SortedBackward(shape, self.num_faces, self.device)
        else:
            self.face_grad = face_grad_rows(self.num_faces, self.device)
        self.face_verts = None
        self.face_mesh = None
        if gather:
            f_alloc = max(self.num_faces, 1)
            self.face_verts = wp.empty(f_alloc, dtype=wp.mat33, device=self.device)
            self.face_mesh = wp.zeros(f_alloc, dtype=wp.int32, device=self.device)
        self.guard = RecordGuard()
        self._slot_args = None  # (key, SlotGradArgs) of the last call

    def slot_args(
        self, face_verts: wp.array, pix_to_face: wp.array, grad_zbuf: wp.array,
        grad_bary: wp.array, grad_dists: wp.array, flags: tuple,
    ) -> SlotGradArgs:  # fmt: skip
        """The per-slot pass's argument struct, rebuilt only when an array or flag
        changed (packing it costs tens of microseconds of host time per call).
        Buffers made with ``gather`` serve callers whose arrays are new every call
        (the torch adapter): no cache there, which would keep them alive."""
        arrays = (face_verts, pix_to_face, grad_zbuf, grad_bary, grad_dists)
        if self.face_verts is not None:
            return slot_grad_args(*arrays, flags)
        key = (*((a.ptr, a.shape, a.strides, a.dtype) for a in arrays), flags)
        if self._slot_args is None or self._slot_args[0] != key:
            self._slot_args = (key, slot_grad_args(*arrays, flags))
        return self._slot_args[1]


def accumulate_vertex_grads(
    faces: wp.array,
    face_mesh: wp.array,
    face_verts: wp.array,
    pix_to_face: wp.array,
    grad_zbuf: wp.array,
    grad_bary: wp.array,
    grad_dists: wp.array,
    verts_grad: wp.array,
    buffers: FaceGradBuffers,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    exact_perspective_grad: bool = True,
    specialize: bool | None = None,
) -> None:
    """The one entry: adds d(loss)/d(verts) to ``verts_grad``.

    Args:
        faces: (F, 3) int32 vertex indices.
        face_mesh: (F,) int32, < 0 for faces in no mesh (skipped).
        face_verts: (F,) mat33, rows = the face's vertices at render time.
        pix_to_face: (N, H, W, K) int32, the faces chosen; -1 in empty slots
            (valid slots first in each pixel, as the render writes them).
        grad_zbuf, grad_dists: (N, H, W, K) float32 upstream gradients.
        grad_bary: (N, H, W, K) vec3 upstream gradients.
        verts_grad: (V,) vec3, accumulated into.
        buffers: the strategy's buffers (:class:`FaceGradBuffers`).
        perspective_correct, clip_barycentric_coords: the render's flags.
        exact_perspective_grad: True (default): the true derivative where the
            perspective denominator is clamped; False: PyTorch3D's numbers there
            (docs/BACKWARD.md).
        specialize: compile the flags into kernel variants (None: on CUDA).

    Capturable: no allocation, no host read. Empty slots are ignored.
    """
    if faces.shape[0] == 0:
        return
    flags = slot_kernel_flags(perspective_correct, clip_barycentric_coords,
                              exact_perspective_grad)  # fmt: skip
    args = buffers.slot_args(face_verts, pix_to_face, grad_zbuf, grad_bary, grad_dists, flags)
    if buffers.deterministic:
        buffers.sorted.run(faces, args, verts_grad, specialize=specialize)
    else:
        launch_atomic(args, faces, face_mesh, buffers.face_grad, verts_grad,
                      specialize=specialize)  # fmt: skip


def grads_from_pix_to_face(
    verts: wp.array,
    faces: wp.array,
    pix_to_face: wp.array,
    grad_zbuf: wp.array,
    grad_bary: wp.array,
    grad_dists: wp.array,
    verts_grad: wp.array,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    exact_perspective_grad: bool = True,
    buffers: FaceGradBuffers | None = None,
) -> None:
    """The backward without a raster workspace (the torch adapter's): adds
    d(loss)/d(verts) to ``verts_grad`` for fragments whose face choice is
    ``pix_to_face`` (N, H, W, K) and whose upstream gradients are the given
    (N, H, W, K) arrays (``grad_bary`` of vec3).

    ``buffers``: a :class:`FaceGradBuffers` made with ``gather=True`` for this
    face count (and shape, if deterministic): then nothing is allocated; None
    allocates atomic-strategy buffers for this call. Every face index in
    ``pix_to_face`` must be valid for ``faces`` (as the forward guarantees).
    """
    nf = faces.shape[0]
    if nf == 0:
        return
    device = verts_grad.device
    if buffers is None:
        buffers = FaceGradBuffers(nf, device, False, gather=True)
    elif buffers.face_verts is None or buffers.num_faces != nf:
        raise ValueError(
            f"buffers: need FaceGradBuffers made with gather=True for {nf} faces, got "
            f"{buffers.num_faces} faces, gather={buffers.face_verts is not None}"
        )
    elif buffers.deterministic and not buffers.sorted.matches(pix_to_face.shape, nf, device):
        raise ValueError(
            f"buffers: sorted buffers were made for shape {buffers.sorted.shape}, "
            f"got pix_to_face of shape {tuple(pix_to_face.shape)}"
        )
    gather_face_verts(verts, faces, buffers.face_verts)
    accumulate_vertex_grads(
        faces, buffers.face_mesh, buffers.face_verts, pix_to_face, grad_zbuf, grad_bary,
        grad_dists, verts_grad, buffers, perspective_correct=perspective_correct,
        clip_barycentric_coords=clip_barycentric_coords,
        exact_perspective_grad=exact_perspective_grad,
    )  # fmt: skip


def record_backward(
    meshes,
    workspace,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    exact_perspective_grad: bool = True,
) -> None:
    """Registers the backward of the render just made into ``workspace`` on the active
    ``wp.Tape`` (if any and if ``meshes.verts`` requires gradients).

    Call it after every render into ``workspace``, recorded or not: it counts the
    renders, so that a backward replayed after the workspace rendered again
    raises instead of differentiating the wrong fragments. Reads
    ``workspace.fragments``, ``workspace.face_grads`` (:class:`FaceGradBuffers`),
    ``workspace.face_verts`` (rows = vertices, written by the render's set-up),
    ``workspace.face_mesh`` and, if present, ``workspace.tuning.specialize``.

    Raises:
        ValueError: the workspace is already recorded on the active tape (two
            renders with one workspace on one tape), or it was made without
            gradient buffers while the vertices require gradients.
    """
    buffers: FaceGradBuffers = workspace.face_grads
    tape = active_tape()
    verts = meshes.verts
    if tape is None or not verts.requires_grad:
        buffers.guard.note_render()
        return
    out = workspace.fragments
    if out.zbuf.grad is None:
        raise ValueError(
            "workspace: the vertices require gradients but the workspace was made with "
            "requires_grad=False"
        )
    buffers.guard.check_record(tape)
    render = buffers.guard.note_render()
    faces = meshes.faces
    ws = workspace
    tuning = getattr(workspace, "tuning", None)
    specialize = getattr(tuning, "specialize", None)
    kw = dict(
        perspective_correct=bool(perspective_correct),
        clip_barycentric_coords=bool(clip_barycentric_coords),
        exact_perspective_grad=bool(exact_perspective_grad),
        specialize=specialize,
    )

    def backward():
        buffers.guard.check_backward(render)
        accumulate_vertex_grads(
            faces, ws.face_mesh, ws.face_verts, out.pix_to_face, out.zbuf.grad,
            out.bary_coords.grad, out.dists.grad, verts.grad, buffers, **kw,
        )  # fmt: skip

    record_func(tape, backward, arrays=[verts, out.zbuf, out.bary_coords, out.dists])
    buffers.guard.recorded(tape, backward)
