"""The map back from the clipped list to the input faces: face ids through
``to_unclipped``, barycentrics through the conversion matrices, copying
(:func:`unclip_fragments`) or in place (:func:`unclip_in_place`, the rasterizer's
clipped path), each with its hand-written adjoint (float atomics, or Warp's
RUN_TO_RUN mode with ``deterministic``)."""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape, record_func
from ..fragments import fragment_values
from ..geometry import pixel_centre
from ..stores import FillState, group_needs_write, load4i, store4i
from ..structs import new_struct
from .buffers import _KEEP, ClipBuffers, ClipMap, SlotViews, _check_array, _run_to_run

# fuse_fp off, as the clip pass (split.py): the same float32 operations on every device.
wp.set_module_options({"fuse_fp": False})

__all__ = ["unclip_fragments", "unclip_in_place"]


@wp.func
def _was_split(m: ClipMap, face: int) -> bool:
    """Whether input face ``face`` was split (its clipped faces' conversion is not
    the identity: only their slots are converted, and only their matrices' gradient
    is added; a kept face's identity is a constant nothing reads the gradient of)."""
    return m.face_case[face] != _KEEP


@wp.struct
class MappedSlots:
    """(N, H, W, K) fragments the copying map back reads or writes: ``pix_to_face``
    int32 (-1: empty slot), ``bary`` vec3 and ``bary_grad``, the gradient of
    ``bary`` (added to by the adjoint; None outside it)."""

    pix_to_face: wp.array4d(dtype=wp.int32)
    bary: wp.array4d(dtype=wp.vec3)
    bary_grad: wp.array4d(dtype=wp.vec3)


def _mapped_slots(pix_to_face: wp.array, bary: wp.array, bary_grad: wp.array | None = None
                  ) -> MappedSlots:  # fmt: skip
    return new_struct(MappedSlots, pix_to_face.device, pix_to_face=pix_to_face, bary=bary,
                      bary_grad=bary_grad)  # fmt: skip


@wp.kernel(enable_backward=False)
def _unclip(
    # In:
    src: MappedSlots,
    m: ClipMap,
    # Out: its pix_to_face and bary
    dst_out: MappedSlots,
):
    n, y, x, k = wp.tid()
    p = src.pix_to_face[n, y, x, k]
    b = src.bary[n, y, x, k]
    if p >= 0:
        dst_out.pix_to_face[n, y, x, k] = m.to_unclipped[p]
        dst_out.bary[n, y, x, k] = m.conversion[p] * b
    else:
        dst_out.pix_to_face[n, y, x, k] = -1
        dst_out.bary[n, y, x, k] = b


def _unclip_adjoint_fn(
    # In: as _unclip (dst: the gradient of its bary in bary_grad)
    src: MappedSlots,
    m: ClipMap,
    dst: MappedSlots,
    # Out (accumulated): the gradient of m.conversion, and src.bary_grad
    conversion_grad_out: wp.array(dtype=wp.mat33),
):
    """Adjoint of :func:`_unclip`, one thread per slot: ``b_out = M b`` gives
    ``db += M^T g`` (no other thread writes the slot) and ``dM += g b^T``, added
    only for split faces (:func:`_was_split`), so most slots add nothing to a
    shared row."""
    n, y, x, k = wp.tid()
    p = src.pix_to_face[n, y, x, k]
    g = dst.bary_grad[n, y, x, k]
    db = src.bary_grad[n, y, x, k]
    if p >= 0:
        src.bary_grad[n, y, x, k] = db + wp.transpose(m.conversion[p]) * g
        if _was_split(m, m.to_unclipped[p]):
            wp.atomic_add(conversion_grad_out, p, wp.outer(g, src.bary[n, y, x, k]))
    else:
        src.bary_grad[n, y, x, k] = db + g


_unclip_adjoint = wp.kernel(_unclip_adjoint_fn, enable_backward=False)
_unclip_adjoint_deterministic = _run_to_run(_unclip_adjoint_fn, "_unclip_adjoint_deterministic")


@wp.func
def _group_is_wide(s: SlotViews, j: int) -> bool:
    """Whether slots 4j .. 4j + 3 all exist and go through the int4 view."""
    return s.aligned != 0 and 4 * j + 4 <= s.flat.shape[0]


@wp.func
def _load_slots(s: SlotViews, j: int) -> wp.vec4i:
    """Slots 4j .. 4j + 3 (-1 past the end): one 16-byte load where it can."""
    if _group_is_wide(s, j):
        return load4i(s.wide, j)
    p = wp.vec4i(-1, -1, -1, -1)
    for lane in range(4):
        if 4 * j + lane < s.flat.shape[0]:
            p[lane] = s.flat[4 * j + lane]
    return p


@wp.func
def _store_slots(s: SlotViews, j: int, u: wp.vec4i):
    """Writes slots 4j .. 4j + 3 (those that exist): one 16-byte store where it can."""
    if _group_is_wide(s, j):
        store4i(s.wide, j, u)
    else:
        for lane in range(4):
            if 4 * j + lane < s.flat.shape[0]:
                s.flat[4 * j + lane] = u[lane]


@wp.struct
class SlotPair:
    """The two slot arrays of an in-place map back: ``src`` the clipped list's
    pix_to_face (read) and ``dst`` the input-face pix_to_face (written), each as
    :class:`SlotViews` (same shape, each its own alignment); ``fill``: which
    groups of four ``dst`` slots an earlier call left holding faces (a group
    that is empty now and was then is not written again); ``now``: the raster
    output pass's marks of this call for ``src`` (1: the group holds faces), when
    on: a group empty in both is skipped without reading ``src``."""

    src: SlotViews
    dst: SlotViews
    fill: FillState
    now: FillState


#: Most threads a map-back kernel is launched with (a grid-stride loop over the
#: groups of four slots beyond; the forward takes four groups a step). Its
#: adjoint exits at once without split faces; over one thread per group (4 M at
#: K=8) that exit still took 0.019 ms. K=8 render forward on an H200 by thread
#: count, when the forward took one group a step: 256 K 0.584-0.585 ms, 512 K
#: 0.583-0.584, 1 M 0.581-0.582, one per group 0.591 (``python
#: scripts/gpu_launch_shapes.py``).
MAP_BACK_THREADS = 1 << 20


@wp.func
def _unclip_group(slots: SlotPair, m: ClipMap, bary: wp.array(dtype=wp.vec3), j: int, split: bool,
                  same: bool):  # fmt: skip
    """Slots 4j .. 4j + 3 of :func:`_unclip_in_place` (``same``: the clipped list is
    the input's, each face its own input face: no lookup)."""
    if slots.now.on != 0 and slots.fill.on != 0:
        if slots.now.held[j] == wp.uint8(0) and slots.fill.held[j] == wp.uint8(0):
            return  # empty now, and its -1 fill already written
    p = _load_slots(slots.src, j)
    u = wp.vec4i(-1, -1, -1, -1)
    for lane in range(4):
        q = p[lane]
        if q >= 0:
            v = q
            if not same:
                v = m.to_unclipped[q]
            u[lane] = v
            if split:
                if _was_split(m, v):
                    bary[4 * j + lane] = m.conversion[q] * bary[4 * j + lane]
    # (a group of four slots may span pixels: empty only if all four are)
    if group_needs_write(slots.fill, j, wp.max(wp.max(u[0], u[1]), wp.max(u[2], u[3])) < 0):
        _store_slots(slots.dst, j, u)


@wp.kernel(enable_backward=False)
def _unclip_in_place(
    # In: the clipped list's slots (slots.src), the map, the group count and
    # the launch's thread count
    slots: SlotPair,
    m: ClipMap,
    groups: int,
    stride: int,
    # Out: input-face slots (slots.dst); the barycentrics (flat), converted in place
    bary: wp.array(dtype=wp.vec3),
):
    """:func:`_unclip` with the barycentrics converted in place, and only for the
    slots of split faces (a kept face's conversion is the identity); four slots
    read and written as 16 bytes (8 bytes a slot instead of a copy of every
    slot's 16: 4.5x faster than a 4-d launch on the K = 8 bench scene), four such
    groups a step of a grid-stride loop."""
    split = m.any_split[0] != 0
    same = m.identity[0] != 0
    skip = slots.now.on != 0 and slots.fill.on != 0
    # four groups a step: their marks read as one word
    for w in range(wp.tid(), (groups + 3) // 4, stride):
        if skip:
            if slots.now.words[w] == wp.uint32(0) and slots.fill.words[w] == wp.uint32(0):
                continue  # all four empty now, and their -1 fill already written
        for b in range(4):
            j = 4 * w + b
            if j < groups:
                _unclip_group(slots, m, bary, j, split, same)


@wp.struct
class ClippedRows:
    """What the raster output pass computed the clipped list's barycentrics from,
    for the in-place adjoint to recompute them: ``face_verts`` (2F,) ``mat33`` the
    clipped faces' set-up rows (row c = vertex c), ``size`` (H, W, K) of the slot
    array, and the render's ``perspective_correct`` and ``clip_barycentric_coords`` flags (0/1)."""

    face_verts: wp.array(dtype=wp.mat33)
    size: wp.vec3i
    perspective_correct: int
    clip_barycentric_coords: int


@wp.func
def _clipped_bary(rows: ClippedRows, q: int, i: int) -> wp.vec3:
    """Barycentrics of clipped face q at flat slot i, as the output pass computed them."""
    size = rows.size
    pixel = i // size[2]
    y = (pixel // size[1]) % size[0]
    m = rows.face_verts[q]
    centre = pixel_centre(y, pixel % size[1], size[0], size[1])
    _z, b, _d = fragment_values(centre, m, rows.perspective_correct, rows.clip_barycentric_coords)
    return b


@wp.struct
class InPlaceGrads:
    """The gradients the in-place adjoint updates: ``bary`` (N H W K,) ``vec3``, the
    one the clipped and the unclipped fragments share (converted in place), and
    ``conversion`` (2F,) ``mat33`` (added to)."""

    bary: wp.array(dtype=wp.vec3)
    conversion: wp.array(dtype=wp.mat33)


def _unclip_in_place_adjoint_fn(
    # In: the clipped list's slots and the map, as _unclip_in_place, and what the
    # clipped barycentrics were computed from
    slots: SlotViews,
    m: ClipMap,
    rows: ClippedRows,
    groups: int,
    stride: int,
    # In and out:
    grads: InPlaceGrads,
):
    """Adjoint of :func:`_unclip_in_place` on the gradient the clipped and the
    unclipped fragments share: for split faces only, ``g <- M^T g`` and
    ``dM += g b^T``, ``b`` the clipped face's barycentrics recomputed
    (:func:`_clipped_bary`)."""
    if m.any_split[0] == 0:
        return  # nothing to convert: no face crosses the plane (the common case)
    for j in range(wp.tid(), groups, stride):
        p = _load_slots(slots, j)
        for lane in range(4):
            q = p[lane]
            if q >= 0:
                if _was_split(m, m.to_unclipped[q]):
                    i = 4 * j + lane
                    g = grads.bary[i]
                    wp.atomic_add(grads.conversion, q, wp.outer(g, _clipped_bary(rows, q, i)))
                    grads.bary[i] = wp.transpose(m.conversion[q]) * g


_unclip_in_place_adjoint = wp.kernel(_unclip_in_place_adjoint_fn, enable_backward=False)
_unclip_in_place_adjoint_deterministic = _run_to_run(
    _unclip_in_place_adjoint_fn, "_unclip_in_place_adjoint_deterministic"
)


def unclip_fragments(
    pix_to_face: wp.array,
    bary_coords: wp.array,
    buffers: ClipBuffers,
    out_pix_to_face: wp.array,
    out_bary_coords: wp.array,
    *,
    deterministic: bool = False,
) -> None:
    """Maps fragments of the clipped faces back to the input faces.

    ``out_pix_to_face`` gets the input-face index (-1 stays -1); ``out_bary_coords``
    the barycentrics w.r.t. the input face's vertices (``M @ b``, unchanged for
    faces that were not clipped and for empty slots). ``zbuf`` and ``dists`` need no
    conversion: they are those of the clipped sub-triangle, as in PyTorch3D.
    Differentiable in ``bary_coords`` and ``buffers.barycentric_conversion`` when
    recorded on a ``wp.Tape``.

    Args:
        pix_to_face: int32 (N, H, W, K), indices into ``buffers.faces``.
        bary_coords: vec3 (N, H, W, K).
        buffers: the :class:`ClipBuffers` the fragments were rasterized from.
        out_pix_to_face: int32 (N, H, W, K); must not alias ``pix_to_face``.
        out_bary_coords: vec3 (N, H, W, K); must not alias ``bary_coords``.
        deterministic: sum the split faces' conversion gradients in a fixed order
            (Warp's RUN_TO_RUN mode) instead of with float atomics.
    """
    d = buffers.device
    shape = tuple(pix_to_face.shape)
    _check_array(pix_to_face, "pix_to_face", wp.int32, 4, None, d)
    _check_array(bary_coords, "bary_coords", wp.vec3, 4, shape, d)
    _check_array(out_pix_to_face, "out_pix_to_face", wp.int32, 4, shape, d)
    _check_array(out_bary_coords, "out_bary_coords", wp.vec3, 4, shape, d)
    if out_pix_to_face.ptr == pix_to_face.ptr or out_bary_coords.ptr == bary_coords.ptr:
        raise ValueError("unclip_fragments needs output arrays distinct from its inputs")

    def adjoint(conv_grad):
        # an input without a gradient gets a scratch one (allocated while recording)
        grad = bary_coords.grad if bary_coords.grad is not None else wp.empty_like(bary_coords)
        src = _mapped_slots(pix_to_face, bary_coords, grad)

        def args():  # the output's gradient is read at each backward
            dst = _mapped_slots(out_pix_to_face, out_bary_coords, out_bary_coords.grad)
            return [src, buffers.map, dst, conv_grad]

        return args

    _map_back(
        buffers, shape, (_unclip, _unclip_adjoint, _unclip_adjoint_deterministic), deterministic,
        [_mapped_slots(pix_to_face, bary_coords), buffers.map,
         _mapped_slots(out_pix_to_face, out_bary_coords)],
        adjoint, watched=out_bary_coords,
        arrays=[out_bary_coords, bary_coords, buffers.barycentric_conversion],
    )  # fmt: skip


def _map_back(buffers, dim, kernels, deterministic, inputs, adjoint, *, watched, arrays,
              adjoint_dim=None) -> None:  # fmt: skip
    """Launches ``kernels[0]`` on ``inputs``, unrecorded; on an active tape, when
    ``watched`` has a gradient, records its adjoint (``kernels[1]``, or ``kernels[2]``
    when ``deterministic``) launched on ``adjoint(conversion_grad)()``. ``adjoint`` is
    called once, when recording, with the conversion matrices' gradient (a scratch
    one where they have none); what it returns, at each backward."""
    d = buffers.device
    adjoint_dim = dim if adjoint_dim is None else adjoint_dim
    wp.launch(kernels[0], dim=dim, inputs=inputs, device=d, record_tape=False)
    tape = active_tape()
    if tape is None or watched.grad is None:
        return
    conversion = buffers.barycentric_conversion
    conv_grad = conversion.grad if conversion.grad is not None else wp.empty_like(conversion)
    kernel = kernels[2] if deterministic else kernels[1]
    args = adjoint(conv_grad)

    def backward():
        wp.launch(kernel, dim=adjoint_dim, inputs=args(), device=d)

    record_func(tape, backward, arrays=arrays)


def unclip_in_place(
    pix_to_face: wp.array,
    bary_coords: wp.array,
    buffers: ClipBuffers,
    out_pix_to_face: wp.array,
    face_verts: wp.array,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    deterministic: bool = False,
    marks: tuple[FillState | None, FillState | None] = (None, None),
) -> None:
    """:func:`unclip_fragments` for the rasterizer's clipped path, without a copy.

    ``bary_coords`` (the clipped list's fragments) is converted in place for the
    slots of split faces, so the clipped and the unclipped fragments share it
    (and its gradient); ``out_pix_to_face`` gets the input-face indices. The
    adjoint converts the shared gradient back in place before the rasterizer's
    backward reads it, recomputing a split slot's clipped barycentrics from
    ``face_verts`` (the clipped list's set-up rows) with the render's
    ``perspective_correct`` and ``clip_barycentric_coords``. ``marks``: the
    :class:`~warpraster.stores.FillState` of ``out_pix_to_face`` when it is
    reused call after call (None: every slot written), and the raster output
    pass's of this call's ``pix_to_face`` (None: not known; see
    :class:`SlotPair`). No checks: internal.
    """
    _n, height, width, k = pix_to_face.shape
    groups = (pix_to_face.size + 3) // 4
    threads = max(1, min(groups, MAP_BACK_THREADS))
    forward_threads = max(1, min((groups + 3) // 4, MAP_BACK_THREADS))
    slots = buffers._kept(
        "pair", SlotPair, src=buffers.slot_views(pix_to_face),
        dst=buffers.slot_views(out_pix_to_face),
        fill=buffers.no_fill if marks[0] is None else marks[0],
        now=buffers.no_fill if marks[1] is None else marks[1],
    )  # fmt: skip

    def adjoint(conv_grad):
        rows = buffers._kept(
            "rows", ClippedRows, face_verts=face_verts, size=wp.vec3i(height, width, k),
            perspective_correct=int(bool(perspective_correct)),
            clip_barycentric_coords=int(bool(clip_barycentric_coords)),
        )  # fmt: skip
        grads = buffers._kept("grads", InPlaceGrads, bary=bary_coords.grad.flatten(),
                              conversion=conv_grad)  # fmt: skip
        return lambda: [slots.src, buffers.map, rows, groups, threads, grads]

    _map_back(
        buffers, forward_threads,
        (_unclip_in_place, _unclip_in_place_adjoint, _unclip_in_place_adjoint_deterministic),
        deterministic, [slots, buffers.map, groups, forward_threads, bary_coords.flatten()],
        adjoint,
        watched=bary_coords, arrays=[bary_coords, buffers.barycentric_conversion],
        adjoint_dim=threads,
    )  # fmt: skip
