"""Hand-written backward of the fragment values to the vertices.

The forward pass writes ``zbuf``, ``bary_coords`` and ``dists`` for each slot
from the face chosen in ``pix_to_face``; their derivatives with respect to the
three vertices of that face are written out here by the chain rule (the same
derivatives Warp's generated adjoint of :func:`warpraster.fragments.recompute_fragments`
gives, which the tests check, and PyTorch3D's backward gives).

Accumulation: one thread per pixel computes the contribution of each slot it
holds and adds it atomically to a per-face sum; one thread per face then adds
its sum to its three vertices. Measured on an H200 this beat a face-centric walk
(one thread per face over its bounding box) by 1.5x to 3x: the per-slot
derivatives run in lock-step across a warp, while the face-centric walk
diverges (and one thread walks a whole screen for a screen-sized face). With
``deterministic`` the sorted backward of :mod:`warpraster.fragments` runs
instead: per-slot derivatives, a stable sort by face, fixed-order sums, then by
vertex; bit-identical run after run.
"""

from __future__ import annotations

import warp as wp

from . import variants
from .geometry import BARY_CLIP_EPS, EPS, edge_function, pixel_centre, point_segment_dist2

wp.set_module_options({"enable_backward": False, "fuse_fp": False})


@wp.func
def _edge_grads(pp: wp.vec2, a: wp.vec2, b: wp.vec2):
    """d/dP, d/dA, d/dB of E(P, A, B) = (P.x - A.x)(B.y - A.y) - (P.y - A.y)(B.x - A.x)."""
    d_p = wp.vec2(b[1] - a[1], -(b[0] - a[0]))
    d_b = wp.vec2(-(pp[1] - a[1]), pp[0] - a[0])
    d_a = -d_p - d_b
    return d_p, d_a, d_b


@wp.func
def _segment_dist2_grads(p: wp.vec2, a: wp.vec2, b: wp.vec2, g: float):
    """g * (d/da, d/db) of the squared distance from p to segment (a, b)."""
    ab = b - a
    l2 = wp.dot(ab, ab)
    ga = wp.vec2(0.0, 0.0)
    gb = wp.vec2(0.0, 0.0)
    if l2 <= EPS:
        gb = -2.0 * g * (p - b)
    else:
        ap = p - a
        t = wp.dot(ab, ap) / l2
        tt = wp.clamp(t, 0.0, 1.0)
        q = p - (a + tt * ab)
        g_q = 2.0 * g * q
        ga = -g_q
        g_ab = -g_q * tt
        if t >= 0.0 and t < 1.0:  # as Warp's clamp adjoint: the upper bound takes t == 1
            g_t = -wp.dot(g_q, ab)
            g_ab = g_ab + (g_t / l2) * ap + (-2.0 * g_t * t / l2) * ab
            ga = ga - (g_t / l2) * ab
        gb = g_ab
        ga = ga - g_ab
    return ga, gb


@wp.func
def fragment_grads(
    p: wp.vec2,
    v0: wp.vec3,
    v1: wp.vec3,
    v2: wp.vec3,
    perspective: int,
    clip_bary: int,
    g_z: float,
    g_bary: wp.vec3,
    g_dist: float,
) -> wp.mat33:
    """Gradient of ``g_z * zbuf + g_bary . bary + g_dist * dist`` w.r.t. the vertices
    (rows 0, 1, 2 of the result), for the face (v0, v1, v2) at pixel centre p."""
    a = wp.vec2(v0[0], v0[1])
    b = wp.vec2(v1[0], v1[1])
    c = wp.vec2(v2[0], v2[1])
    zv = wp.vec3(v0[2], v1[2], v2[2])
    # ---- forward (as geometry.barycentric & co.)
    area = edge_function(c, a, b) + EPS
    e = wp.vec3(edge_function(p, b, c), edge_function(p, c, a), edge_function(p, a, b))
    w = e / area
    u = w
    t = wp.vec3(0.0, 0.0, 0.0)
    s = float(0.0)
    den = float(1.0)
    if perspective != 0:
        t = wp.vec3(w[0] * zv[1] * zv[2], w[1] * zv[0] * zv[2], w[2] * zv[0] * zv[1])
        s = t[0] + t[1] + t[2]
        den = wp.max(s, EPS)
        u = t / den
    inside = u[0] > 0.0 and u[1] > 0.0 and u[2] > 0.0
    bf = u
    cl = wp.vec3(0.0, 0.0, 0.0)
    csum = float(0.0)
    cden = float(1.0)
    if clip_bary != 0:
        cl = wp.vec3(wp.max(u[0], 0.0), wp.max(u[1], 0.0), wp.max(u[2], 0.0))
        csum = cl[0] + cl[1] + cl[2]
        cden = wp.max(csum, BARY_CLIP_EPS)
        bf = cl / cden
    # ---- backward
    g_bf = g_bary + g_z * zv
    g_zv = g_z * bf
    g_u = g_bf
    if clip_bary != 0:
        g_c = g_bf / cden
        if csum > BARY_CLIP_EPS:
            r = wp.dot(g_bf, cl) / (cden * cden)
            g_c = g_c - wp.vec3(r, r, r)
        g_u = wp.vec3(
            wp.where(u[0] > 0.0, g_c[0], 0.0),
            wp.where(u[1] > 0.0, g_c[1], 0.0),
            wp.where(u[2] > 0.0, g_c[2], 0.0),
        )
    g_w = g_u
    if perspective != 0:
        g_t = g_u / den
        if s > EPS:
            r = wp.dot(g_u, t) / (den * den)
            g_t = g_t - wp.vec3(r, r, r)
        g_w = wp.vec3(g_t[0] * zv[1] * zv[2], g_t[1] * zv[0] * zv[2], g_t[2] * zv[0] * zv[1])
        g_zv = g_zv + wp.vec3(
            g_t[1] * w[1] * zv[2] + g_t[2] * zv[1] * w[2],
            g_t[0] * w[0] * zv[2] + g_t[2] * zv[0] * w[2],
            g_t[0] * w[0] * zv[1] + g_t[1] * zv[0] * w[1],
        )
    g_e = g_w / area
    g_area = -wp.dot(g_w, w) / area
    d_p, d_a, d_b = _edge_grads(c, a, b)  # area = E(c, a, b)
    ga = g_area * d_a
    gb = g_area * d_b
    gc = g_area * d_p
    d_p, d_a, d_b = _edge_grads(p, b, c)  # e0 = E(p, b, c)
    gb = gb + g_e[0] * d_a
    gc = gc + g_e[0] * d_b
    d_p, d_a, d_b = _edge_grads(p, c, a)  # e1 = E(p, c, a)
    gc = gc + g_e[1] * d_a
    ga = ga + g_e[1] * d_b
    d_p, d_a, d_b = _edge_grads(p, a, b)  # e2 = E(p, a, b)
    ga = ga + g_e[2] * d_a
    gb = gb + g_e[2] * d_b
    # ---- signed distance: min over the three edges (ties as Warp's min adjoint)
    g_d = g_dist
    if inside:
        g_d = -g_dist
    d01 = point_segment_dist2(p, a, b)
    d02 = point_segment_dist2(p, a, c)
    d12 = point_segment_dist2(p, b, c)
    m = wp.min(d01, d02)
    if m < d12:
        if d01 < d02:
            s_a, s_b = _segment_dist2_grads(p, a, b, g_d)
            ga = ga + s_a
            gb = gb + s_b
        else:
            s_a, s_b = _segment_dist2_grads(p, a, c, g_d)
            ga = ga + s_a
            gc = gc + s_b
    else:
        s_a, s_b = _segment_dist2_grads(p, b, c, g_d)
        gb = gb + s_a
        gc = gc + s_b
    return wp.mat33(ga[0], ga[1], g_zv[0], gb[0], gb[1], g_zv[1], gc[0], gc[1], g_zv[2])


@wp.func
def _row(m: wp.mat33, i: int) -> wp.vec3:
    return wp.vec3(m[i, 0], m[i, 1], m[i, 2])


# Per-face sums as three 16-byte rows per face (x, y, z, unused), added with one
# vector atomic per row where the GPU has them (sm_90: Hopper) instead of three
# scalar ones. CPU kernels run serially: a plain add.
@wp.func_native(
    """
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
atomicAdd(reinterpret_cast<float4*>(a.data) + i, make_float4(v[0], v[1], v[2], 0.0f));
#elif defined(__CUDA_ARCH__)
float* p = reinterpret_cast<float*>(a.data + i);
atomicAdd(p, v[0]);
atomicAdd(p + 1, v[1]);
atomicAdd(p + 2, v[2]);
#else
a.data[i] = a.data[i] + wp::vec4(v[0], v[1], v[2], 0.0f);
#endif
"""
)
def _add_row(a: wp.array(dtype=wp.vec4), i: int, v: wp.vec3): ...


@wp.func
def _add_face_grad(face_grad: wp.array(dtype=wp.vec4), f: int, g: wp.mat33):
    _add_row(face_grad, 3 * f, _row(g, 0))
    _add_row(face_grad, 3 * f + 1, _row(g, 1))
    _add_row(face_grad, 3 * f + 2, _row(g, 2))


def face_grad_rows(num_faces: int, device) -> wp.array:
    """Zeroed per-face gradient sums: three 16-byte rows per face (see _add_row)."""
    return wp.zeros(3 * max(int(num_faces), 1), dtype=wp.vec4, device=device)


def _make_slot_grads(flags: tuple[int, int] | None):
    """One thread per pixel: each held slot's contribution, atomically added to its
    face. ``flags`` = (perspective, clip_bary) compiled in, or None: read at run time."""

    def slot_grads(
        face_verts: wp.array(dtype=wp.mat33),
        pix_to_face: wp.array2d(dtype=wp.int32),
        g_zbuf: wp.array2d(dtype=wp.float32),
        g_bary: wp.array2d(dtype=wp.vec3),
        g_dists: wp.array2d(dtype=wp.float32),
        height: int,
        width: int,
        perspective_in: int,
        clip_bary_in: int,
        face_grad: wp.array(dtype=wp.vec4),
    ):
        perspective = perspective_in
        clip_bary = clip_bary_in
        if wp.static(flags is not None):
            perspective = wp.static(flags[0])
            clip_bary = wp.static(flags[1])
        q = wp.tid()
        r = q % (height * width)
        yi = r // width
        xi = r % width
        p = pixel_centre(yi, xi, height, width)  # once: its divisions are not free
        for s in range(pix_to_face.shape[1]):
            f = pix_to_face[q, s]
            if f < 0:
                break
            fv = face_verts[f]
            g = fragment_grads(
                p, _row(fv, 0), _row(fv, 1), _row(fv, 2), perspective, clip_bary,
                g_zbuf[q, s], g_bary[q, s], g_dists[q, s],
            )  # fmt: skip
            _add_face_grad(face_grad, f, g)

    slot_grads.__name__ = slot_grads.__qualname__ = variants.variant_name("slot_grads", flags)
    return wp.kernel(
        slot_grads, enable_backward=False, module="unique", module_options={"fuse_fp": False}
    )


@wp.kernel
def _scatter_to_verts(
    faces: wp.array2d(dtype=wp.int32),
    face_mesh: wp.array(dtype=wp.int32),
    face_grad: wp.array(dtype=wp.vec4),
    verts_grad: wp.array(dtype=wp.vec3),
):
    f = wp.tid()
    if face_mesh[f] < 0:
        return
    for c in range(3):
        g = face_grad[3 * f + c]
        wp.atomic_add(verts_grad, faces[f, c], wp.vec3(g[0], g[1], g[2]))


class FaceGradBuffers:
    """Per-face gradient sums (atomic mode) or the sorted deterministic backward's
    buffers (:class:`~warpraster.fragments.DeterministicBackward`)."""

    def __init__(self, num_faces: int, device, deterministic: bool, shape=None):
        self.deterministic = bool(deterministic)
        self.face_grad = None
        self.sorted = None
        if self.deterministic:
            from .fragments import DeterministicBackward  # noqa: PLC0415

            self.sorted = DeterministicBackward(shape, num_faces, device)
        else:
            self.face_grad = face_grad_rows(num_faces, device)


def _launch_slot_grads(
    faces, face_mesh, face_verts, pix_to_face, grad_zbuf, grad_bary, grad_dists, face_grad,
    verts_grad, *, perspective_correct: bool, clip_barycentric_coords: bool,
) -> None:  # fmt: skip
    """Per-slot derivatives summed per face (atomics), then added to the vertices.
    ``face_grad`` must be zero; the (N, H, W, K) arrays are viewed as rows of K."""
    n, h, w, k = pix_to_face.shape
    device = verts_grad.device
    flags = (perspective_correct, clip_barycentric_coords)
    wp.launch(
        variants.kernel_for("slot_grads", _make_slot_grads, device, flags),
        dim=n * h * w,
        inputs=[
            face_verts,
            pix_to_face.reshape((-1, k)),
            grad_zbuf.reshape((-1, k)),
            grad_bary.reshape((-1, k)),
            grad_dists.reshape((-1, k)),
            h,
            w,
            int(perspective_correct),
            int(clip_barycentric_coords),
        ],
        outputs=[face_grad],
        device=device,
        record_tape=False,
    )
    wp.launch(
        _scatter_to_verts,
        dim=faces.shape[0],
        inputs=[faces, face_mesh, face_grad],
        outputs=[verts_grad],
        device=device,
        record_tape=False,
    )


def accumulate_vertex_grads(
    faces,
    face_mesh,
    face_verts,
    fragments,
    verts_grad,
    buffers: FaceGradBuffers,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
) -> None:
    """Adds d(loss)/d(verts) to ``verts_grad`` from the gradients on the fragments.

    Reads ``fragments.{zbuf,bary_coords,dists}.grad`` (slots with
    ``pix_to_face == -1`` are ignored). Capturable: no allocation, no host read.
    """
    if faces.shape[0] == 0:
        return
    buffers.face_grad.zero_()
    _launch_slot_grads(
        faces, face_mesh, face_verts, fragments.pix_to_face, fragments.zbuf.grad,
        fragments.bary_coords.grad, fragments.dists.grad, buffers.face_grad, verts_grad,
        perspective_correct=perspective_correct, clip_barycentric_coords=clip_barycentric_coords,
    )  # fmt: skip


@wp.kernel
def _gather_face_verts(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    face_verts: wp.array(dtype=wp.mat33),
):
    f = wp.tid()
    face_verts[f] = wp.matrix_from_rows(verts[faces[f, 0]], verts[faces[f, 1]], verts[faces[f, 2]])


def grads_from_pix_to_face(
    verts,
    faces,
    pix_to_face,
    grad_zbuf,
    grad_bary,
    grad_dists,
    verts_grad,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
) -> None:
    """The backward without a workspace: adds d(loss)/d(verts) to ``verts_grad`` for
    fragments whose face choice is ``pix_to_face`` (N, H, W, K) and whose upstream
    gradients are the given (N, H, W, K) arrays (``grad_bary`` of vec3).

    For callers that keep no raster workspace between forward and backward (the
    torch adapter). Allocates per-face scratch; every face index in
    ``pix_to_face`` must be valid for ``faces`` (as the forward guarantees).
    """
    nf = faces.shape[0]
    if nf == 0:
        return
    device = verts_grad.device
    face_verts = wp.empty(nf, dtype=wp.mat33, device=device)
    face_grad = face_grad_rows(nf, device)
    face_mesh = wp.zeros(nf, dtype=wp.int32, device=device)  # every face may be scattered
    wp.launch(_gather_face_verts, dim=nf, inputs=[verts, faces], outputs=[face_verts],
              device=device, record_tape=False)  # fmt: skip
    _launch_slot_grads(
        faces, face_mesh, face_verts, pix_to_face, grad_zbuf, grad_bary, grad_dists, face_grad,
        verts_grad, perspective_correct=perspective_correct,
        clip_barycentric_coords=clip_barycentric_coords,
    )  # fmt: skip


def _active_tape():
    runtime = getattr(wp._src.context, "runtime", None)
    return getattr(runtime, "tape", None)


def record_backward(meshes, workspace, *, perspective_correct: bool, clip_barycentric_coords: bool):
    """Registers the backward of one render on the active ``wp.Tape`` (if any)."""
    tape = _active_tape()
    verts = meshes.verts
    out = workspace.fragments
    if tape is None or not verts.requires_grad:
        return
    if out.zbuf.grad is None:
        raise ValueError(
            "the vertices require gradients but the workspace was made with requires_grad=False"
        )
    faces = meshes.faces
    ws = workspace
    persp = bool(perspective_correct)
    clip = bool(clip_barycentric_coords)

    def backward():
        if ws.face_grads.deterministic:
            ws.face_grads.sorted.backward(
                verts, faces, out, perspective_correct=persp, clip_barycentric_coords=clip
            )
            return
        accumulate_vertex_grads(
            faces, ws.face_mesh, ws.face_verts, out, verts.grad, ws.face_grads,
            perspective_correct=persp, clip_barycentric_coords=clip,
        )  # fmt: skip

    tape.record_func(backward, arrays=[verts, out.zbuf, out.bary_coords, out.dists])


__all__ = [
    "FaceGradBuffers",
    "accumulate_vertex_grads",
    "fragment_grads",
    "grads_from_pix_to_face",
]
