"""Near-plane clipping and frustum culling on the device, and the map back to source faces.

This is PyTorch3D's ``pytorch3d/renderer/mesh/clip.py`` as Warp kernels that never
read device data on the host, so a render that clips can be captured in a graph.

Every face of the packed input falls in one of PyTorch3D's cases:

* **keep**: no vertex behind ``z_clip_value`` and not culled: copied unchanged;
* **drop**: all three vertices behind the plane, or culled by the frustum test;
* **triangle**: two vertices behind: replaced by the smaller triangle
  ``(p4, p5, p1)`` where ``p1`` is the vertex in front and ``p4``/``p5`` the
  crossings of edges ``p1->p2`` and ``p1->p3`` (``p2, p3`` follow ``p1`` in the
  face's vertex order);
* **quad**: one vertex (``p1``) behind: the quad in front is split into
  ``t1 = (p4, p2, p5)`` and ``t2 = (p5, p2, p3)``, marked as each other's neighbour.

Output order is PyTorch3D's: the clipped list is the original face order with
dropped faces removed and each quad's ``t2`` right after its ``t1`` (an exclusive
scan of 0/1/2 outputs per face). Meshes stay contiguous and in order, so mesh n
owns ``[first[n], first[n] + count[n])`` of the clipped list.

The crossings are ``p = p1 * (1 - w) + q * w`` with ``w = (p1.z - c) / (p1.z - q.z)``;
with ``perspective_correct`` their x, y are interpolated on ``xy * z`` and divided
by ``c`` (x, y are NDC, z is view depth). As in PyTorch3D, the weight of the
``p1->p3`` crossing is detached (no gradient flows through it), the ``p1->p2`` one
is not.

Frustum culling (``cull_to_frustum``) has two rules (:class:`FrustumCullRule`);
the default reproduces PyTorch3D 0.7.9 exactly, including its indexing slip.

Memory layout of :class:`ClipBuffers` for V vertices and F faces: the clipped
vertices are the V input vertices followed by two slots per input face
(``V + 2f`` holds ``p4``, ``V + 2f + 1`` holds ``p5`` of face f, when it is
clipped); the clipped faces have capacity ``2F``. Slots past the clipped total
hold the degenerate face (0, 0, 0), which no mesh range covers.
"""

from __future__ import annotations

import enum
import operator

import warp as wp

from .backward.tape import active_tape
from .fragments import fragment_values
from .geometry import pixel_centre
from .meshes import MeshArrays, PackedMeshes, mesh_arrays
from .stores import FillState, fill_state, group_needs_write, load4i, store4i

# fuse_fp off: PyTorch3D computes the crossings as separately rounded float32
# operations; without FMA contraction CUDA gives those same bits (as the cpu device
# does), so depth ties between clipped faces break the same way everywhere.
# The backward adds gradients only for faces that were split (the others are copied
# unchanged), with float atomics; ``deterministic=True`` launches kernel variants in
# Warp's RUN_TO_RUN mode (scatter, sort, reduce in a fixed order), which is
# bit-identical run to run and between a captured replay and an eager call on a GPU.
# It is not the module default: on every face it cost host reads of record counts
# in eager mode and a worst-case-sized sort under capture (docs/PERF.md).
wp.set_module_options({"fuse_fp": False})

__all__ = [
    "ClipBuffers",
    "FrustumCullRule",
    "clip_faces",
    "unclip_fragments",
    "unclip_in_place",
]


class FrustumCullRule(enum.IntEnum):
    """Which faces ``cull_to_frustum`` removes (the frustum is x, y in [-1, 1]).

    Culling only saves work when it is right; both rules keep the z clipping as is.
    """

    PYTORCH3D = 1
    """PyTorch3D 0.7.9 (issue #1936): ``face_verts[:, axis]`` picks a *vertex*, not a
    coordinate, so a face is dropped when vertex 0 has x, y and z all < -1 or all > 1,
    or vertex 1 has x, y and z all < -1 or all > 1. It can drop visible faces and keep
    faces wholly outside. The default, for parity."""

    PLANES = 2
    """The intended rule: drop a face when all three vertices have x < -1, or all x > 1,
    or all y < -1, or all y > 1. Note that on the long side of a non-square image the
    NDC range exceeds [-1, 1], so this too can drop visible faces there."""


# Face cases (values are stored in ClipBuffers.face_case).
_DROP = wp.constant(0)
_KEEP = wp.constant(1)
_TRIANGLE = wp.constant(3)
_QUAD = wp.constant(4)


@wp.struct
class FaceCases:
    """What :func:`_classify_faces` decides per input face f (scratch of
    :class:`ClipBuffers`, under the same names): ``face_case`` (_DROP, _KEEP,
    _TRIANGLE or _QUAD), ``face_pivot`` (the corner that is p1), ``face_w3`` (the
    detached p1->p3 weight), ``counts``
    (F + 1,) output faces (``counts[F]`` stays 0) and ``offsets`` (F + 1,) their
    exclusive scan: face f's first clipped slot; ``offsets[F]`` is the total;
    ``any_split`` (1,) set to 1 when a face is split (zeroed before)."""

    face_case: wp.array(dtype=wp.int32)
    face_pivot: wp.array(dtype=wp.int32)
    face_w3: wp.array(dtype=wp.float32)
    counts: wp.array(dtype=wp.int32)
    offsets: wp.array(dtype=wp.int32)
    any_split: wp.array(dtype=wp.int32)


@wp.struct
class ClippedFaces:
    """The clipped list's topology (capacity 2F, outputs of :class:`ClipBuffers`):
    ``faces`` (2F, 3) vertex indices, ``to_unclipped`` (2F,) the input face of
    each clipped face (-1 past the total), ``neighbor`` (2F,) the other half of a
    split quad (-1: none)."""

    faces: wp.array2d(dtype=wp.int32)
    to_unclipped: wp.array(dtype=wp.int32)
    neighbor: wp.array(dtype=wp.int32)


@wp.struct
class ClipSettings:
    """One :func:`clip_faces` call's settings as its kernels read them: the plane
    ``z_clip`` (clipping only where ``do_z_clip`` != 0), ``cull_rule`` (0: no
    culling, else a :class:`FrustumCullRule`) and ``perspective_correct`` (1: the crossings'
    x, y interpolated on ``xy * z``)."""

    z_clip: float
    do_z_clip: int
    cull_rule: int
    perspective_correct: int


@wp.struct
class ClipMap:
    """What the map back from the clipped list reads (views of :class:`ClipBuffers`):
    ``to_unclipped`` (2F,) the input face of each clipped face, ``face_case`` (F,)
    each input face's case and ``conversion`` (2F,) ``mat33``, ``b_original =
    M @ b_clipped``, ``any_split`` (1,) whether any face was split. Shared by the
    copying and the in-place map back and their adjoints."""

    to_unclipped: wp.array(dtype=wp.int32)
    face_case: wp.array(dtype=wp.int32)
    conversion: wp.array(dtype=wp.mat33)
    any_split: wp.array(dtype=wp.int32)


# ----------------------------------------------------------------------------- kernels
@wp.func
def _all_beyond(v: wp.vec3, lo: float, hi: float) -> bool:
    """PyTorch3D 0.7.9's test of one vertex: all of x, y, z < lo, or all > hi."""
    below = v[0] < lo and v[1] < lo and v[2] < lo
    above = v[0] > hi and v[1] > hi and v[2] > hi
    return below or above


@wp.func
def _outside_planes(v0: wp.vec3, v1: wp.vec3, v2: wp.vec3) -> bool:
    """All three vertices beyond the same side of the square x, y in [-1, 1]."""
    left = v0[0] < -1.0 and v1[0] < -1.0 and v2[0] < -1.0
    right = v0[0] > 1.0 and v1[0] > 1.0 and v2[0] > 1.0
    top = v0[1] < -1.0 and v1[1] < -1.0 and v2[1] < -1.0
    bottom = v0[1] > 1.0 and v1[1] > 1.0 and v2[1] > 1.0
    return left or right or top or bottom


@wp.func
def _crossing_weight(p1: wp.vec3, q: wp.vec3, clip: float) -> float:
    """w such that p1.z * (1 - w) + q.z * w = clip (PyTorch3D's float32 operations)."""
    return (p1[2] - clip) / (p1[2] - q[2])


@wp.kernel(enable_backward=False)
def _classify_faces(
    # In:
    meshes: MeshArrays,
    settings: ClipSettings,
    # Out: its face_case, face_pivot, face_w3 and counts
    cases_out: FaceCases,
):
    """Per input face: case, pivot vertex p1, the detached p1->p3 weight, output count."""
    f = wp.tid()
    verts = meshes.verts
    faces = meshes.faces
    v0 = verts[faces[f, 0]]
    v1 = verts[faces[f, 1]]
    v2 = verts[faces[f, 2]]
    z_clip = settings.z_clip
    culled = False
    if settings.cull_rule == 1:
        culled = _all_beyond(v0, -1.0, 1.0) or _all_beyond(v1, -1.0, 1.0)
    elif settings.cull_rule == 2:
        culled = _outside_planes(v0, v1, v2)
    b0 = int(0)
    b1 = int(0)
    b2 = int(0)
    if settings.do_z_clip != 0:
        b0 = wp.where(v0[2] < z_clip, 1, 0)
        b1 = wp.where(v1[2] < z_clip, 1, 0)
        b2 = wp.where(v2[2] < z_clip, 1, 0)
    behind = b0 + b1 + b2
    case = _KEEP
    pivot = int(0)
    if culled or behind == 3:
        case = _DROP
    elif behind == 2:
        case = _TRIANGLE
        # p1 is the one vertex in front of the plane.
        pivot = wp.where(b0 == 0, 0, wp.where(b1 == 0, 1, 2))
    elif behind == 1:
        case = _QUAD
        # p1 is the one vertex behind the plane.
        pivot = wp.where(b0 == 1, 0, wp.where(b1 == 1, 1, 2))
    w3 = float(0.0)
    if case == _TRIANGLE or case == _QUAD:
        p1 = verts[faces[f, pivot]]
        p3 = verts[faces[f, (pivot + 2) % 3]]
        w3 = _crossing_weight(p1, p3, z_clip)
        cases_out.any_split[0] = 1  # every writer stores the same value
    cases_out.face_case[f] = case
    cases_out.face_pivot[f] = pivot
    cases_out.face_w3[f] = w3
    cases_out.counts[f] = wp.where(case == _QUAD, 2, wp.where(case == _DROP, 0, 1))


@wp.func
def _put_face(out: ClippedFaces, o: int, a: int, b: int, c: int, f: int, neighbor: int):
    """Clipped slot o: the face (a, b, c), cut from input face f (-1: unused slot),
    with its split partner ``neighbor`` (-1: none)."""
    out.faces[o, 0] = a
    out.faces[o, 1] = b
    out.faces[o, 2] = c
    out.to_unclipped[o] = f
    out.neighbor[o] = neighbor


@wp.kernel(enable_backward=False)
def _write_topology(
    # In:
    meshes: MeshArrays,
    cases: FaceCases,
    # Out:
    clipped_out: ClippedFaces,
):
    """One thread per clipped slot s in [0, 2F): slot s < F also scatters input face s;
    slots at or past the clipped total get the unused-slot values."""
    s = wp.tid()
    faces = meshes.faces
    num_faces = faces.shape[0]
    if s < num_faces:
        f = s
        case = cases.face_case[f]
        o = cases.offsets[f]
        i1 = cases.face_pivot[f]
        i2 = (i1 + 1) % 3
        i3 = (i1 + 2) % 3
        p4 = meshes.verts.shape[0] + 2 * f
        p5 = p4 + 1
        if case == _KEEP:
            _put_face(clipped_out, o, faces[f, 0], faces[f, 1], faces[f, 2], f, -1)
        elif case == _TRIANGLE:
            _put_face(clipped_out, o, p4, p5, faces[f, i1], f, -1)
        elif case == _QUAD:
            _put_face(clipped_out, o, p4, faces[f, i2], p5, f, o + 1)
            _put_face(clipped_out, o + 1, p5, faces[f, i2], faces[f, i3], f, o)
    if s >= cases.offsets[num_faces]:
        _put_face(clipped_out, s, 0, 0, 0, -1, -1)


@wp.kernel(enable_backward=False)
def _mesh_ranges(
    # In: the input mesh ranges, the clipped slots of the input faces
    meshes: MeshArrays,
    cases: FaceCases,
    # Out:
    clipped_first_out: wp.array(dtype=wp.int32),
    clipped_count_out: wp.array(dtype=wp.int32),
):
    n = wp.tid()
    first = meshes.mesh_first[n]
    a = cases.offsets[first]
    clipped_first_out[n] = a
    clipped_count_out[n] = cases.offsets[first + meshes.mesh_count[n]] - a


@wp.kernel
def _copy_verts(src: wp.array(dtype=wp.vec3), dst_out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    dst_out[i] = src[i]


@wp.func
def _crossing(p1: wp.vec3, q: wp.vec3, w: float, clip: float, perspective_correct: int) -> wp.vec3:
    """The point of edge p1->q at weight w; x, y perspective-correct if asked."""
    p = p1 * (1.0 - w) + q * w
    x = (p1[0] * p1[2] * (1.0 - w) + q[0] * q[2] * w) / clip
    y = (p1[1] * p1[2] * (1.0 - w) + q[1] * q[2] * w) / clip
    return wp.where(perspective_correct != 0, wp.vec3(x, y, p[2]), p)


@wp.func
def _bary2(i: int, j: int, wi: float, wj: float) -> wp.vec3:
    """Barycentric vector with wi at slot i, wj at slot j (i != j), 0 elsewhere."""
    return wp.vec3(
        wp.where(i == 0, wi, wp.where(j == 0, wj, 0.0)),
        wp.where(i == 1, wi, wp.where(j == 1, wj, 0.0)),
        wp.where(i == 2, wi, wp.where(j == 2, wj, 0.0)),
    )


@wp.kernel
def _clip_geometry(
    # In: the input vertices and faces as plain arrays (through a struct, Warp's
    # generated adjoint adds to the gradient the struct was filled with, outside
    # the RUN_TO_RUN mode's fixed-order sums)
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    cases: FaceCases,
    settings: ClipSettings,
    # Out:
    clipped_verts: wp.array(dtype=wp.vec3),
    conversion: wp.array(dtype=wp.mat33),
):
    """Per input face, straight-line: the new vertices p4, p5 and the barycentric
    conversion matrix of each output face (column k = the original-face barycentrics
    of the clipped face's vertex k). Differentiable in ``verts``; ``cases.face_w3`` is a
    plain (no-grad) input, which is how the p1->p3 weight is detached."""
    f = wp.tid()
    case = cases.face_case[f]
    o = cases.offsets[f]
    z_clip = settings.z_clip
    perspective_correct = settings.perspective_correct
    nv = verts.shape[0]
    if case == _KEEP:
        conversion[o] = wp.identity(n=3, dtype=wp.float32)
    elif case == _TRIANGLE or case == _QUAD:
        i1 = cases.face_pivot[f]
        i2 = (i1 + 1) % 3
        i3 = (i1 + 2) % 3
        p1 = verts[faces[f, i1]]
        p2 = verts[faces[f, i2]]
        p3 = verts[faces[f, i3]]
        w2 = _crossing_weight(p1, p2, z_clip)
        w3 = cases.face_w3[f]
        clipped_verts[nv + 2 * f] = _crossing(p1, p2, w2, z_clip, perspective_correct)
        clipped_verts[nv + 2 * f + 1] = _crossing(p1, p3, w3, z_clip, perspective_correct)
        b4 = _bary2(i1, i2, 1.0 - w2, w2)
        b5 = _bary2(i1, i3, 1.0 - w3, w3)
        if case == _TRIANGLE:
            conversion[o] = wp.matrix_from_cols(b4, b5, _bary2(i1, i2, 1.0, 0.0))
        else:
            b2 = _bary2(i2, i1, 1.0, 0.0)
            conversion[o] = wp.matrix_from_cols(b4, b2, b5)
            conversion[o + 1] = wp.matrix_from_cols(b5, b2, _bary2(i3, i1, 1.0, 0.0))


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
    return _struct(MappedSlots, pix_to_face=pix_to_face, bary=bary, bary_grad=bary_grad)


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


def _run_to_run(fn, name: str, *, enable_backward: bool = False) -> wp.Kernel:
    """``fn`` as a kernel in Warp's RUN_TO_RUN mode (module of its own), for
    ``deterministic=True``: float atomics become a scatter, sort and fixed-order sum."""
    options = {"fuse_fp": False, "deterministic": wp.DeterministicMode.RUN_TO_RUN}
    return wp.kernel(fn, name=name, enable_backward=enable_backward, module="unique",
                     module_options=options)  # fmt: skip


_unclip_adjoint = wp.kernel(_unclip_adjoint_fn, enable_backward=False)
_unclip_adjoint_deterministic = _run_to_run(_unclip_adjoint_fn, "_unclip_adjoint_deterministic")
_clip_geometry_deterministic = _run_to_run(
    _clip_geometry.func, "_clip_geometry_deterministic", enable_backward=True
)


@wp.struct
class SlotViews:
    """A contiguous int32 slot array (N, H, W, K) as kernel argument: ``flat``
    (N H W K,), ``wide`` the same memory as int4 (the whole groups of four), and
    ``aligned`` (1: ``wide`` may be read and written as 16-byte words)."""

    flat: wp.array(dtype=wp.int32)
    wide: wp.array(dtype=wp.vec4i)
    aligned: int


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
def _unclip_group(slots: SlotPair, m: ClipMap, bary: wp.array(dtype=wp.vec3), j: int, split: bool):
    """Slots 4j .. 4j + 3 of :func:`_unclip_in_place`."""
    if slots.now.on != 0 and slots.fill.on != 0:
        if slots.now.held[j] == wp.uint8(0) and slots.fill.held[j] == wp.uint8(0):
            return  # empty now, and its -1 fill already written
    p = _load_slots(slots.src, j)
    u = wp.vec4i(-1, -1, -1, -1)
    for lane in range(4):
        q = p[lane]
        if q >= 0:
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
    skip = slots.now.on != 0 and slots.fill.on != 0
    # four groups a step: their marks read as one word
    for w in range(wp.tid(), (groups + 3) // 4, stride):
        if skip:
            if slots.now.words[w] == wp.uint32(0) and slots.fill.words[w] == wp.uint32(0):
                continue  # all four empty now, and their -1 fill already written
        for b in range(4):
            j = 4 * w + b
            if j < groups:
                _unclip_group(slots, m, bary, j, split)


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


# ----------------------------------------------------------------------------- buffers
class ClipBuffers:
    """Device buffers of one clipping configuration, allocated once and reused.

    For V input vertices, F input faces and N meshes. Outputs of :func:`clip_faces`
    (the clipped list has at most 2F faces):

    Attributes:
        verts: vec3 (V + 2F,): input vertices, then each input face f's crossings at
            ``V + 2f`` (p4) and ``V + 2f + 1`` (p5). Carries gradients.
        faces: int32 (2F, 3): clipped faces, indices into ``verts``.
        mesh_to_face_first_idx: int32 (N,): first clipped face of each mesh.
        num_faces_per_mesh: int32 (N,): clipped faces of each mesh.
        clipped_faces_neighbor_idx: int32 (2F,): the other half of a split quad, -1 none.
        faces_clipped_to_unclipped_idx: int32 (2F,): input face of each clipped face
            (-1 past the clipped total).
        barycentric_conversion: mat33 (2F,): ``b_original = M @ b_clipped`` (identity
            for unchanged faces). Carries gradients.
        num_clipped_faces: int32 (1,): the clipped total (a view; read it only
            outside a captured graph).
        packed: the clipped list as a :class:`~warpraster.meshes.PackedMeshes` (a
            view of these arrays).

    One :func:`clip_faces` call overwrites them: keep one buffers object per call
    recorded on a ``wp.Tape``.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        num_verts: int,
        num_faces: int,
        num_meshes: int,
        device=None,
        *,
        requires_grad: bool = True,
    ):
        sizes = []
        for name, value in (
            ("num_verts", num_verts),
            ("num_faces", num_faces),
            ("num_meshes", num_meshes),
        ):
            try:
                size = operator.index(value)
            except TypeError:
                raise TypeError(f"{name} must be an int, got {value!r}") from None
            if isinstance(value, bool) or size < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
            sizes.append(size)
        self.device = wp.get_device(device)
        self.num_verts, self.num_faces, self.num_meshes = sizes
        self.requires_grad = bool(requires_grad)
        v, f, n, d = *sizes, self.device
        cap = 2 * f
        self.verts = wp.zeros(v + cap, dtype=wp.vec3, device=d, requires_grad=self.requires_grad)
        self.faces = wp.zeros((cap, 3), dtype=wp.int32, device=d)
        self.mesh_to_face_first_idx = wp.zeros(n, dtype=wp.int32, device=d)
        self.num_faces_per_mesh = wp.zeros(n, dtype=wp.int32, device=d)
        self.clipped_faces_neighbor_idx = wp.full(cap, -1, dtype=wp.int32, device=d)
        self.faces_clipped_to_unclipped_idx = wp.full(cap, -1, dtype=wp.int32, device=d)
        self.barycentric_conversion = wp.zeros(
            cap, dtype=wp.mat33, device=d, requires_grad=self.requires_grad
        )
        # Scratch: per input face, and the scan (counts[F] stays 0, so offsets[F] = total).
        self.face_case = wp.zeros(f, dtype=wp.int32, device=d)
        self.face_pivot = wp.zeros(f, dtype=wp.int32, device=d)
        self.face_w3 = wp.zeros(f, dtype=wp.float32, device=d)
        self.counts = wp.zeros(f + 1, dtype=wp.int32, device=d)
        self.offsets = wp.zeros(f + 1, dtype=wp.int32, device=d)
        self.num_clipped_faces = self.offsets[f:]
        self.any_split = wp.zeros(1, dtype=wp.int32, device=d)
        # the same arrays as kernel arguments
        self.cases = _struct(FaceCases, face_case=self.face_case, face_pivot=self.face_pivot,
                             face_w3=self.face_w3, counts=self.counts,
                             offsets=self.offsets, any_split=self.any_split)  # fmt: skip
        self.clipped = _struct(ClippedFaces, faces=self.faces,
                               to_unclipped=self.faces_clipped_to_unclipped_idx,
                               neighbor=self.clipped_faces_neighbor_idx)  # fmt: skip
        self.map = _struct(ClipMap, to_unclipped=self.faces_clipped_to_unclipped_idx,
                           face_case=self.face_case,
                           conversion=self.barycentric_conversion,
                           any_split=self.any_split)  # fmt: skip
        self._inputs = None  # (key, MeshArrays) of the last call's input arrays
        self.no_fill = fill_state(None, False, d)  # every map-back slot written
        self._slot_views = {}  # slot array (ptr, shape) -> its SlotViews
        self._structs = {}  # name -> (key, struct) kept by _kept

    def slot_views(self, slots: wp.array) -> SlotViews:
        """A contiguous int32 slot array as :class:`SlotViews` (made once per array)."""
        key = (slots.ptr, slots.shape)
        views = self._slot_views.get(key)
        if views is None:
            views = self._slot_views[key] = SlotViews()
            views.flat = slots.flatten()
            views.wide = wp.array(ptr=slots.ptr, dtype=wp.vec4i, shape=(slots.size // 4,),
                                  device=slots.device)  # fmt: skip
            views.aligned = int(slots.ptr % 16 == 0)
        return views

    def _kept(self, name: str, cls, **fields):
        """A ``cls`` (a ``wp.struct``) of ``fields``, made again only when one changed
        (an array: its pointer or shape): setting a struct's array field costs
        microseconds, and the in-place map back's structs are the same call after call."""
        key = tuple((v.ptr, v.shape) if isinstance(v, wp.array) else v for v in fields.values())
        hit = self._structs.get(name)
        if hit is None or hit[0] != key:
            hit = self._structs[name] = (key, _struct(cls, **fields))
        return hit[1]

    def inputs_for(self, verts: wp.array, faces: wp.array, first: wp.array, count: wp.array
                   ) -> MeshArrays:  # fmt: skip
        """The input arrays as one kernel argument, rebuilt only when one changed."""
        arrays = (verts, faces, first, count)
        key = tuple((a.ptr, a.shape, a.strides) for a in arrays)
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = (key, mesh_arrays(*arrays))
        return self._inputs[1]

    @property
    def packed(self):
        """The clipped list as the rasterizer's :class:`~warpraster.meshes.PackedMeshes`."""
        return PackedMeshes(
            self.verts,
            self.faces,
            self.mesh_to_face_first_idx,
            self.num_faces_per_mesh,
            self.clipped_faces_neighbor_idx,
            has_neighbors=True,
            split_flag=self.any_split,
        )


def _struct(cls, **fields):
    """A ``cls`` (a ``wp.struct``) with these fields."""
    value = cls()
    for name, field in fields.items():
        setattr(value, name, field)
    return value


def _check_array(arr, name: str, dtype, ndim: int, shape, device) -> None:
    if not isinstance(arr, wp.array):
        raise TypeError(f"{name} must be a wp.array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.ndim != ndim:
        raise TypeError(
            f"{name} must be a {ndim}-d wp.array of {wp.types.type_repr(dtype)}, "
            f"got {arr.ndim}-d of {wp.types.type_repr(arr.dtype)}"
        )
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(arr.shape)}")
    if wp.get_device(arr.device) != device:
        raise ValueError(f"{name} is on {arr.device}, the clip buffers on {device}")


def clip_faces(
    verts: wp.array,
    faces: wp.array,
    mesh_to_face_first_idx: wp.array,
    num_faces_per_mesh: wp.array,
    *,
    z_clip_value: float | None,
    cull_to_frustum: bool,
    perspective_correct: bool,
    buffers: ClipBuffers,
    frustum_cull_rule: FrustumCullRule = FrustumCullRule.PYTORCH3D,
    deterministic: bool = False,
) -> ClipBuffers:
    """Clips faces at ``z = z_clip_value`` and culls them to the frustum, on the device.

    No host read and no allocation: the call can be captured in a graph. Launches
    recorded on an enclosing ``wp.Tape`` make ``buffers.verts`` and
    ``buffers.barycentric_conversion`` differentiable w.r.t. ``verts``.

    Args:
        verts: vec3 (V,): x, y in NDC, z = view depth.
        faces: int32 (F, 3): packed, global vertex indices (assumed in range).
        mesh_to_face_first_idx: int32 (N,) on the device: first face of each mesh.
        num_faces_per_mesh: int32 (N,) on the device: faces of each mesh (ranges
            contiguous, ascending, disjoint, as for the rasterizer).
        z_clip_value: keep the part of each face with ``z >= z_clip_value``; None
            clips nothing.
        cull_to_frustum: drop faces outside the frustum (see ``frustum_cull_rule``).
        perspective_correct: interpolate the crossings' x, y on ``xy * z``.
        buffers: made for (V, F, N) on the same device.
        frustum_cull_rule: :class:`FrustumCullRule`; PyTorch3D's by default.
        deterministic: record the geometry kernel in Warp's RUN_TO_RUN mode, so the
            gradients of split faces' crossings are summed in a fixed order on a GPU.

    Returns:
        ``buffers``, filled (see :class:`ClipBuffers`).

    Raises:
        TypeError, ValueError: wrong types, shapes, devices or settings.
    """
    d = buffers.device
    v, f, n = buffers.num_verts, buffers.num_faces, buffers.num_meshes
    _check_array(verts, "verts", wp.vec3, 1, (v,), d)
    _check_array(faces, "faces", wp.int32, 2, (f, 3), d)
    _check_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", wp.int32, 1, (n,), d)
    _check_array(num_faces_per_mesh, "num_faces_per_mesh", wp.int32, 1, (n,), d)
    if verts.requires_grad and not buffers.requires_grad:
        raise ValueError(
            "verts requires grad but the clip buffers were made with requires_grad=False: "
            "its gradients would be silently dropped"
        )
    if z_clip_value is not None:
        z_clip_value = float(z_clip_value)
        if z_clip_value != z_clip_value or abs(z_clip_value) == float("inf"):
            raise ValueError(f"z_clip_value must be finite or None, got {z_clip_value}")
        if perspective_correct and z_clip_value == 0.0:
            raise ValueError("z_clip_value must be nonzero with perspective_correct")
    rule = FrustumCullRule(frustum_cull_rule)
    settings = _struct(
        ClipSettings,
        z_clip=0.0 if z_clip_value is None else z_clip_value,
        do_z_clip=int(z_clip_value is not None),
        cull_rule=int(rule) if cull_to_frustum else 0,
        perspective_correct=int(bool(perspective_correct)),
    )

    meshes = buffers.inputs_for(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh)
    cases = buffers.cases
    buffers.any_split.zero_()
    if f > 0:
        wp.launch(_classify_faces, dim=f, inputs=[meshes, settings], outputs=[cases], device=d,
                  record_tape=False)  # fmt: skip
    wp.utils.array_scan(buffers.counts, buffers.offsets, inclusive=False)
    if f > 0:
        wp.launch(_write_topology, dim=2 * f, inputs=[meshes, cases], outputs=[buffers.clipped],
                  device=d, record_tape=False)  # fmt: skip
    if n > 0:
        wp.launch(_mesh_ranges, dim=n, inputs=[meshes, cases],
                  outputs=[buffers.mesh_to_face_first_idx, buffers.num_faces_per_mesh], device=d,
                  record_tape=False)  # fmt: skip
    if v > 0:
        wp.launch(_copy_verts, dim=v, inputs=[verts], outputs=[buffers.verts], device=d)
    if f > 0:
        wp.launch(
            _clip_geometry_deterministic if deterministic else _clip_geometry,
            dim=f,
            inputs=[verts, faces, cases, settings],
            outputs=[buffers.verts, buffers.barycentric_conversion],
            device=d,
        )
    return buffers


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

    tape.record_func(backward, arrays=arrays)


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
