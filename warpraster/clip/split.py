"""The clip pass: each input face classified (kept, dropped, split at the near
plane, culled), the clipped list's topology and mesh ranges written, and the
crossings and barycentric conversions computed (differentiable in the vertices).
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape
from ..meshes import MeshArrays
from ..structs import new_struct
from .buffers import (
    _DROP,
    _KEEP,
    _QUAD,
    _TRIANGLE,
    ClipBuffers,
    ClippedFaces,
    ClipSettings,
    FaceCases,
    _check_array,
    _run_to_run,
)
from .frustum import FrustumCullRule, _all_beyond, _outside_planes

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

__all__ = ["clip_faces"]


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
    if s == 0:
        # every face kept (count 1 each, none split): the list is the input's
        whole = cases.offsets[num_faces] == num_faces and cases.any_split[0] == 0
        cases.identity[0] = wp.where(whole, 1, 0)


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
def _copy_verts(
    # In: the input vertices; with ``test`` != 0, the plane and whether the
    # buffers hold the input list unchanged (FaceCases.identity)
    src: wp.array(dtype=wp.vec3),
    settings: ClipSettings,
    identity: wp.array(dtype=wp.int32),
    test: int,
    # Out: the clipped list's first V vertices; pass_needed[0] set to 1 (zeroed
    # before) when the clip pass must run: a vertex behind the plane, or a list
    # held that is not the input's
    dst_out: wp.array(dtype=wp.vec3),
    pass_needed_out: wp.array(dtype=wp.int32),
):
    i = wp.tid()
    p = src[i]
    dst_out[i] = p
    if test != 0:
        if p[2] < settings.z_clip or (i == 0 and identity[0] == 0):
            pass_needed_out[0] = 1  # every writer stores the same value


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


_clip_geometry_deterministic = _run_to_run(
    _clip_geometry.func, "_clip_geometry_deterministic", enable_backward=True
)


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
    settings = new_struct(
        ClipSettings,
        d,
        z_clip=0.0 if z_clip_value is None else z_clip_value,
        do_z_clip=int(z_clip_value is not None),
        cull_rule=int(rule) if cull_to_frustum else 0,
        perspective_correct=int(bool(perspective_correct)),
    )

    meshes = buffers.inputs_for(verts, faces, mesh_to_face_first_idx, num_faces_per_mesh)
    cases = buffers.cases
    record = verts.requires_grad  # nothing to differentiate otherwise: not on a tape
    skip = _may_skip(buffers, settings, record)
    if skip:
        buffers.pass_needed.zero_()
    if v > 0:
        wp.launch(_copy_verts, dim=v, inputs=[verts, settings, buffers.identity, int(skip)],
                  outputs=[buffers.verts, buffers.pass_needed], device=d,
                  record_tape=record)  # fmt: skip

    def classify():
        buffers.any_split.zero_()
        if f > 0:
            wp.launch(_classify_faces, dim=f, inputs=[meshes, settings], outputs=[cases],
                      device=d, record_tape=False)  # fmt: skip

    def write_list():
        if f > 0:
            wp.launch(_write_topology, dim=2 * f, inputs=[meshes, cases],
                      outputs=[buffers.clipped], device=d, record_tape=False)  # fmt: skip
        if n > 0:
            wp.launch(_mesh_ranges, dim=n, inputs=[meshes, cases],
                      outputs=[buffers.mesh_to_face_first_idx, buffers.num_faces_per_mesh],
                      device=d, record_tape=False)  # fmt: skip
        if f > 0:
            wp.launch(
                _clip_geometry_deterministic if deterministic else _clip_geometry,
                dim=f,
                inputs=[verts, faces, cases, settings],
                outputs=[buffers.verts, buffers.barycentric_conversion],
                device=d,
                record_tape=record,
            )

    if skip:
        # one conditional node; its scan keeps its scratch (Warp's array_scan
        # allocates, which a conditional node's body may not)
        def clip_pass():
            classify()
            buffers.scan(buffers.counts, buffers.offsets)
            write_list()

        wp.capture_if(buffers.pass_needed, on_true=clip_pass)
    else:
        classify()
        wp.utils.array_scan(buffers.counts, buffers.offsets, inclusive=False)
        write_list()
    return buffers


def _may_skip(buffers: ClipBuffers, settings: ClipSettings, recorded: bool) -> bool:
    """Whether this call may skip the clip pass when nothing changed (then a
    device flag decides, :func:`wp.capture_if`): ``static_faces`` buffers, a near
    plane without frustum culling (a culled face is dropped with no vertex
    behind the plane), and no launch recorded on a tape (``recorded``: the
    vertices require grad and a tape is active; a tape replays every launch
    captured under a conditional node in its backward). On CUDA only inside a
    graph capture (a conditional node; outside one the flag would be read back,
    a device sync); on the cpu device the flag is read directly."""
    if not buffers.static_faces or settings.do_z_clip == 0 or settings.cull_rule != 0:
        return False
    if buffers.num_verts == 0 or buffers.num_faces == 0:
        return False
    if recorded and active_tape() is not None:
        return False
    d = buffers.device
    return d.is_cpu or (d.is_capturing and wp.is_conditional_graph_supported())
