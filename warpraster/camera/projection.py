"""The camera kernels: world -> view -> NDC, view -> NDC matrices, vertex -> camera maps.

One Warp module. The projection is differentiable: its forward is launched off
the tape and a hand-written adjoint is recorded on an enclosing ``wp.Tape``. It
reaches the vertices and every array field of the
:class:`~warpraster.camera.params.CameraData` that has a gradient. A camera's
rows get the gradient of every vertex it sees: Warp's generated adjoint added
each vertex's share with float atomics into the same row, which serialised
(0.60 ms for 8 cameras x 10,242 vertices on an H200, docs/PERF.md). Here each
warp sums its vertices' (R, T, view -> NDC matrix) gradients into a stripe of
its camera (:mod:`warpraster.aggregated`), the stripes are summed per camera,
and a kernel of one thread per camera takes the sums through Warp's generated
adjoint of R, T and the matrix (to fov, focal length, ...). The vertex -> mesh
map has no gradient.

The view -> NDC matrices are PyTorch3D's, in row-vector form:
``h = [x_view y_view z_view 1] @ M``, NDC x, y = ``h[0] / h[3], h[1] / h[3]``
(plain division, no epsilon), z = view depth.
"""

from __future__ import annotations

import math
from typing import Any

import warp as wp

from ..aggregated import (
    add_projection_partial,
    launch_reduce_stripes,
    stripe_of,
    striped_partials,
    stripes_for,
)
from ..backward.tape import active_tape, record_func
from ..geometry import finite_vec3
from ..meshes import MeshArrays, as_faces_array, as_index_array, mesh_arrays
from .params import CameraData, CameraKind

# No FMA contraction: the projection rounds like PyTorch3D's (separately rounded
# products), which matters where vertices near the camera plane amplify ulps.
wp.set_module_options({"fuse_fp": False})

__all__ = ["project_points", "vert_to_mesh_from_faces", "view_to_ndc_matrices"]

# float32(pi / 180), as PyTorch3D's float32 tensor times the Python scalar rounds it.
_DEG2RAD = wp.constant(math.pi / 180.0)


# ----------------------------------------------------------------------------- matrices
@wp.func
def _per_camera(values: wp.array(dtype=Any), cam: int):
    """Row of camera ``cam`` in a per-camera array of batch 1 (shared) or N."""
    return values[wp.min(cam, values.shape[0] - 1)]


@wp.func
def _fov_perspective_matrix(camera: CameraData, cam: int) -> wp.mat44:
    """PyTorch3D's FoVPerspectiveCameras projection, row-vector form (K transposed)."""
    znear = _per_camera(camera.znear, cam)
    zfar = _per_camera(camera.zfar, cam)
    angle = _per_camera(camera.fov, cam)
    if camera.degrees:
        angle = _DEG2RAD * angle
    max_y = wp.tan(angle / 2.0) * znear
    min_y = -max_y
    max_x = max_y * _per_camera(camera.aspect_ratio, cam)
    min_x = -max_x
    k00 = 2.0 * znear / (max_x - min_x)
    k11 = 2.0 * znear / (max_y - min_y)
    k02 = (max_x + min_x) / (max_x - min_x)
    k12 = (max_y + min_y) / (max_y - min_y)
    k22 = zfar / (zfar - znear)
    k23 = -(zfar * znear) / (zfar - znear)
    # fmt: off
    return wp.mat44(
        k00, 0.0, 0.0, 0.0,
        0.0, k11, 0.0, 0.0,
        k02, k12, k22, 1.0,
        0.0, 0.0, k23, 0.0,
    )
    # fmt: on


@wp.func
def _fov_orthographic_matrix(camera: CameraData, cam: int) -> wp.mat44:
    """PyTorch3D's FoVOrthographicCameras projection, row-vector form."""
    znear = _per_camera(camera.znear, cam)
    zfar = _per_camera(camera.zfar, cam)
    min_x = _per_camera(camera.min_x, cam)
    max_x = _per_camera(camera.max_x, cam)
    min_y = _per_camera(camera.min_y, cam)
    max_y = _per_camera(camera.max_y, cam)
    scale = _per_camera(camera.scale_xyz, cam)
    k00 = (2.0 / (max_x - min_x)) * scale[0]
    k11 = (2.0 / (max_y - min_y)) * scale[1]
    k03 = -(max_x + min_x) / (max_x - min_x)
    k13 = -(max_y + min_y) / (max_y - min_y)
    k22 = (1.0 / (zfar - znear)) * scale[2]
    k23 = -znear / (zfar - znear)
    # fmt: off
    return wp.mat44(
        k00, 0.0, 0.0, 0.0,
        0.0, k11, 0.0, 0.0,
        0.0, 0.0, k22, 0.0,
        k03, k13, k23, 1.0,
    )
    # fmt: on


@wp.func
def _perspective_matrix(camera: CameraData, cam: int) -> wp.mat44:
    """PyTorch3D's PerspectiveCameras projection composed with its NDC camera transform.

    Column-vector pieces as PyTorch3D builds them, transposed at the end:
    ``K`` (SfM calibration), and for screen-space cameras the principal-point fix
    (x, y -= 2 p) followed by screen -> NDC (x, y += W/2, H/2, then / min(H, W)/2).
    ``focal_length`` is (B, 1) (fx = fy) or (B, 2).
    """
    focal = camera.focal_length
    f = wp.min(cam, focal.shape[0] - 1)
    fx = focal[f, 0]
    fy = focal[f, focal.shape[1] - 1]
    principal_point = _per_camera(camera.principal_point, cam)
    px = principal_point[0]
    py = principal_point[1]
    # fmt: off
    k = wp.mat44(
        fx, 0.0, px, 0.0,
        0.0, fy, py, 0.0,
        0.0, 0.0, 0.0, 1.0,
        0.0, 0.0, 1.0, 0.0,
    )
    if not camera.in_ndc:
        image_size = _per_camera(camera.image_size, cam)
        h = image_size[0]
        w = image_size[1]
        s = wp.min(h, w) / 2.0
        fix = wp.mat44(
            1.0, 0.0, 0.0, -2.0 * px,
            0.0, 1.0, 0.0, -2.0 * py,
            0.0, 0.0, 1.0, 0.0,
            0.0, 0.0, 0.0, 1.0,
        )
        to_ndc = wp.mat44(
            1.0 / s, 0.0, 0.0, w / (2.0 * s),
            0.0, 1.0 / s, 0.0, h / (2.0 * s),
            0.0, 0.0, 1.0, 0.0,
            0.0, 0.0, 0.0, 1.0,
        )
        k = to_ndc @ (fix @ k)
    # fmt: on
    return wp.transpose(k)


@wp.func
def view_to_ndc(camera: CameraData, cam: int) -> wp.mat44:
    """The row-vector view -> NDC matrix of camera ``cam`` of the batch ``camera``."""
    if camera.kind == CameraKind.FOV_PERSPECTIVE:
        return _fov_perspective_matrix(camera, cam)
    if camera.kind == CameraKind.FOV_ORTHOGRAPHIC:
        return _fov_orthographic_matrix(camera, cam)
    return _perspective_matrix(camera, cam)


@wp.kernel
def _view_to_ndc_matrix_kernel(
    # In:
    camera: CameraData,
    # Out:
    matrices_out: wp.array(dtype=wp.mat44),
):
    cam = wp.tid()
    matrices_out[cam] = view_to_ndc(camera, cam)


def view_to_ndc_matrices(camera: CameraData, matrices_out: wp.array) -> wp.array:
    """Writes the view -> NDC matrix of every camera (no tape record).

    Args:
        camera: the parameters of N cameras.
        matrices_out: (N,) ``mat44`` output on the cameras' device.

    Returns:
        ``matrices_out``.
    """
    wp.launch(
        _view_to_ndc_matrix_kernel,
        dim=camera.num_cameras,
        inputs=[camera],
        outputs=[matrices_out],
        device=matrices_out.device,
        record_tape=False,
    )
    return matrices_out


# ----------------------------------------------------------------------------- projection
@wp.func
def _vertex_camera(
    camera: CameraData, vert_to_mesh: wp.array(dtype=wp.int32), per_vertex_camera: wp.bool, i: int
) -> int:
    """The camera that sees vertex ``i``: its mesh's (clamped to the batch), or 0."""
    cam = int(0)
    if per_vertex_camera:
        cam = wp.clamp(vert_to_mesh[i], 0, camera.num_cameras - 1)
    return cam


@wp.func
def _to_clip(camera: CameraData, cam: int, p: wp.vec3):
    """World point ``p`` through camera ``cam``: (R, the view point ``vh = (p R + T, 1)``,
    the view -> NDC matrix M, ``h = vh M``); NDC x, y = ``h[0] / h[3], h[1] / h[3]``."""
    rot = _per_camera(camera.R, cam)
    v = p @ rot + _per_camera(camera.T, cam)
    vh = wp.vec4(v[0], v[1], v[2], 1.0)
    m = view_to_ndc(camera, cam)
    return rot, vh, m, vh @ m


@wp.kernel
def _project_kernel(
    # In:
    verts: wp.array(dtype=wp.vec3),
    vert_to_mesh: wp.array(dtype=wp.int32),
    per_vertex_camera: wp.bool,
    camera: CameraData,
    # Out:
    points_out: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    cam = _vertex_camera(camera, vert_to_mesh, per_vertex_camera, i)
    p = verts[i]
    if finite_vec3(p):
        _rot, vh, _m, h = _to_clip(camera, cam, p)
        points_out[i] = wp.vec3(h[0] / h[3], h[1] / h[3], vh[2])
    else:
        # never drawn (its faces are dropped); a constant, so the adjoint sends
        # nothing through it to the camera or the vertex
        points_out[i] = wp.vec3(wp.nan, wp.nan, wp.nan)


#: Components of a camera's projection gradient: R (9, row-major), T (3), the
#: row-vector view -> NDC matrix (16, row-major).
PROJECTION_PARTS = 28


@wp.kernel(enable_backward=False)
def _project_adjoint_kernel(
    # In:
    verts: wp.array(dtype=wp.vec3),
    vert_to_mesh: wp.array(dtype=wp.int32),
    per_vertex_camera: wp.bool,
    camera: CameraData,
    points_grad: wp.array(dtype=wp.vec3),
    consume: int,
    # Gradients out (added to):
    verts_grad_out: wp.array(dtype=wp.vec3),
    cam_part_out: wp.array2d(dtype=wp.float32),
    stripes: int,
):
    """The adjoint of :func:`_project_kernel` at vertex i: its gradient into
    ``verts_grad_out`` (when not empty), its camera's (R, T, M) gradient into a
    stripe of ``cam_part_out`` (when ``stripes`` > 0); ``points_grad[i]`` is
    zeroed once read when ``consume`` (as Warp's adjoint of a store does)."""
    i = wp.tid()
    cam = _vertex_camera(camera, vert_to_mesh, per_vertex_camera, i)
    go = points_grad[i]
    if consume != 0:
        points_grad[i] = wp.vec3(0.0)
    p = verts[i]
    g_r = wp.mat33(0.0)
    g_t = wp.vec3(0.0)
    g_m = wp.mat44(0.0)
    if finite_vec3(p):
        rot, vh, m, h = _to_clip(camera, cam, p)
        # x, y = h0 / h3, h1 / h3; z = v2
        w2 = h[3] * h[3]
        g_h = wp.vec4(go[0] / h[3], go[1] / h[3], 0.0, -go[0] * h[0] / w2 - go[1] * h[1] / w2)
        g_vh = m @ g_h
        g_t = wp.vec3(g_vh[0], g_vh[1], g_vh[2] + go[2])
        if verts_grad_out.shape[0] > 0:
            verts_grad_out[i] = verts_grad_out[i] + rot @ g_t
        g_r = wp.outer(p, g_t)
        g_m = wp.outer(vh, g_h)
    if stripes > 0:
        add_projection_partial(cam_part_out, stripe_of(cam, i, stripes), g_r, g_t, g_m)


@wp.kernel
def _camera_dot_kernel(
    # In:
    camera: CameraData,
    sums: wp.array(dtype=wp.float32),
    # Out:
    dots_out: wp.array(dtype=wp.float32),
):
    """``<sums[c], (R, T, M) of camera c>``, launched only as its adjoint (a unit
    output gradient): Warp's generated adjoint adds the sums to the rows of R and
    T and takes the matrix's share to the camera's intrinsics. A camera with zero
    sums (no vertex) adds nothing."""
    c = wp.tid()
    b = c * 28
    # fmt: off
    g_r = wp.mat33(sums[b + 0], sums[b + 1], sums[b + 2], sums[b + 3], sums[b + 4],
                   sums[b + 5], sums[b + 6], sums[b + 7], sums[b + 8])
    g_t = wp.vec3(sums[b + 9], sums[b + 10], sums[b + 11])
    g_m = wp.mat44(sums[b + 12], sums[b + 13], sums[b + 14], sums[b + 15],
                   sums[b + 16], sums[b + 17], sums[b + 18], sums[b + 19],
                   sums[b + 20], sums[b + 21], sums[b + 22], sums[b + 23],
                   sums[b + 24], sums[b + 25], sums[b + 26], sums[b + 27])
    # fmt: on
    size = wp.ddot(g_r, g_r) + wp.dot(g_t, g_t) + wp.ddot(g_m, g_m)
    if size != 0.0:  # NaN passes, as a NaN gradient should
        dots_out[c] = (
            wp.ddot(g_r, _per_camera(camera.R, c))
            + wp.dot(g_t, _per_camera(camera.T, c))
            + wp.ddot(g_m, view_to_ndc(camera, c))
        )


def _arrays_with_grad(camera: CameraData) -> list:
    """The array fields of ``camera`` that carry a gradient."""
    out = []
    for name, var in CameraData.vars.items():
        if wp.types.is_array(var.type):
            a = getattr(camera, name)
            if a is not None and a.grad is not None:
                out.append(a)
    return out


def _camera_adjoint(camera: CameraData) -> CameraData:
    """The adjoint struct of ``camera``: each array field's gradient (None without)."""
    adj = CameraData()
    for name, var in CameraData.vars.items():
        value = getattr(camera, name)
        if wp.types.is_array(var.type):
            value = value.grad if value is not None else None
        setattr(adj, name, value)
    return adj


_DOT_BUFFERS: dict = {}  # (device, cameras) -> (unit output gradient, scratch)


def _camera_dot_buffers(device, cams: int) -> tuple[wp.array, wp.array]:
    """The unit adjoint and the (unread) output of :func:`_camera_dot_kernel`."""
    key = (wp.get_device(device).alias, int(cams))
    got = _DOT_BUFFERS.get(key)
    if got is None:
        got = _DOT_BUFFERS[key] = (
            wp.ones(int(cams), dtype=wp.float32, device=device),
            wp.zeros(int(cams), dtype=wp.float32, device=device),
        )
    return got


def project_points(
    camera: CameraData,
    verts: wp.array,
    vert_to_mesh: wp.array,
    points_out: wp.array,
    *,
    per_vertex_camera: bool,
) -> wp.array:
    """Projects world-space vertices: x, y in NDC, z = view-space depth.

    One launch; on an enclosing ``wp.Tape``, when ``points_out`` has a gradient and
    ``verts`` or a camera array has one, its adjoint is recorded (one launch for
    the vertices' gradient, four more and two memsets for the camera's). Reads
    nothing back; allocates only the camera's reduction buffers, once per size
    (graph-capturable after a first call). Inputs are not validated here.

    Args:
        camera: the parameters of N cameras.
        verts: (V,) ``vec3`` world-space vertices.
        vert_to_mesh: (V,) int32 camera index of each vertex (clamped to
            [0, N-1]); read only when ``per_vertex_camera``.
        points_out: (V,) ``vec3`` output, ``(x_ndc, y_ndc, z_view)``.
        per_vertex_camera: False: every vertex is seen by camera 0.

    Returns:
        ``points_out``.
    """
    per_vertex_camera = bool(per_vertex_camera)
    device = points_out.device
    wp.launch(
        _project_kernel,
        dim=verts.shape[0],
        inputs=[verts, vert_to_mesh, per_vertex_camera, camera],
        outputs=[points_out],
        device=device,
        record_tape=False,
    )
    tape = active_tape()
    if tape is None or points_out.grad is None:
        return points_out
    cam_arrays = _arrays_with_grad(camera)
    if verts.grad is None and not cam_arrays:
        return points_out
    cams = int(camera.num_cameras)
    stripes = stripes_for(verts.shape[0], cams) if cam_arrays else 0
    if cam_arrays:
        part, sums = striped_partials(device, cams, stripes, PROJECTION_PARTS)
        ones, dots = _camera_dot_buffers(device, cams)
        cam_adj = _camera_adjoint(camera)
    else:
        part = wp.empty((0, PROJECTION_PARTS), dtype=wp.float32, device=device)
    verts_grad = verts.grad if verts.grad is not None else wp.empty(0, dtype=wp.vec3, device=device)
    consume = int(not points_out.retain_grad)

    def backward():
        if cam_arrays:
            part.zero_()
            sums.zero_()
        wp.launch(
            _project_adjoint_kernel,
            dim=verts.shape[0],
            inputs=[verts, vert_to_mesh, per_vertex_camera, camera, points_out.grad, consume],
            outputs=[verts_grad, part, stripes],
            device=device,
            record_tape=False,
        )
        if cam_arrays:
            launch_reduce_stripes(part, sums, stripes)
            # Warp's adjoint of <sums, (R, T, M)> per camera: the sums through R, T
            # and the view -> NDC matrix to every camera array with a gradient
            wp.launch(
                _camera_dot_kernel,
                dim=cams,
                inputs=[camera, sums],
                outputs=[dots],
                adj_inputs=[cam_adj, None],
                adj_outputs=[ones],
                adjoint=True,
                device=device,
                record_tape=False,
            )

    arrays = [points_out] + ([verts] if verts.grad is not None else []) + cam_arrays
    record_func(tape, backward, arrays=arrays)
    return points_out


# ----------------------------------------------------------------------------- batches
@wp.kernel(enable_backward=False)
def _vert_to_mesh_kernel(
    # In: the faces and mesh ranges
    meshes: MeshArrays,
    # Out:
    vert_to_mesh_out: wp.array(dtype=wp.int32),
):
    """Each vertex of face f gets the index of the mesh whose range holds f."""
    f = wp.tid()
    nv = vert_to_mesh_out.shape[0]
    for n in range(meshes.mesh_first.shape[0]):
        first = meshes.mesh_first[n]
        if f >= first and f < first + meshes.mesh_count[n]:
            for j in range(3):
                v = meshes.faces[f, j]
                if v >= 0 and v < nv:
                    vert_to_mesh_out[v] = n


def vert_to_mesh_from_faces(
    faces: Any,
    mesh_to_face_first_idx: Any,
    num_faces_per_mesh: Any,
    num_verts: int,
    *,
    out: wp.array | None = None,
    device: wp.DeviceLike = None,
) -> wp.array:
    """(V,) int32 mesh index of every vertex, from the packed faces, on the device.

    A vertex takes the index of the mesh whose faces use it; vertices used by no
    face get 0 (they are projected, but never drawn). No host read-back: usable
    in a captured graph when ``out`` is given. Packed meshes do not share
    vertices; if they do, the vertex takes one of them.

    Args:
        faces: (F, 3) int32 packed faces (``wp.array2d`` or ``vec3i``, or NumPy).
        mesh_to_face_first_idx: (N,) first face of each mesh.
        num_faces_per_mesh: (N,) face count of each mesh.
        num_verts: V.
        out: optional (V,) int32 output buffer.
        device: device for NumPy inputs (default: that of ``faces`` if it is a
            Warp array, else Warp's default device).

    Returns:
        ``out`` (or a new array): ``wp.array(dtype=wp.int32)`` (V,).

    Raises:
        TypeError, ValueError: naming the argument (see ``warpraster.meshes``).
    """
    if device is None and isinstance(faces, wp.array):
        device = faces.device
    f = as_faces_array(faces, "faces", device)
    device = f.device
    first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", device)
    count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", device, length=first.shape[0])
    if out is None:
        out = wp.zeros(int(num_verts), dtype=wp.int32, device=device)
    else:
        out = as_index_array(out, "out", device, length=int(num_verts))
        out.zero_()
    if f.shape[0] > 0 and int(num_verts) > 0:
        wp.launch(
            _vert_to_mesh_kernel,
            dim=f.shape[0],
            inputs=[mesh_arrays(None, f, first, count)],
            outputs=[out],
            device=device,
            record_tape=False,
        )
    return out
