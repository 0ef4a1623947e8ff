"""The sensor's deterministic block reductions: many values into a few (a body's
transform, an image's camera, a shape's colour, the light).

One block per output: each thread sums a strided part of the inputs in order,
then a tile reduction combines the threads in an order fixed by the block size;
one thread writes the result. Part of :mod:`warpraster.sim.adjoint`.
"""

from __future__ import annotations

import warp as wp

from .gathers import rotate_adj_q

wp.set_module_options({"fuse_fp": False, "enable_backward": False})

#: Threads per block of the reductions.
BLOCK = 256


@wp.kernel
def body_reduce_kernel(
    # Model:
    start: wp.array(dtype=wp.int32),
    verts: wp.array(dtype=wp.int32),
    body: wp.array(dtype=wp.int32),
    local: wp.array(dtype=wp.vec3),
    # Data in:
    body_q: wp.array(dtype=wp.transform),
    points_grad: wp.array(dtype=wp.vec3),
    # Data out (added to):
    body_grad_out: wp.array(dtype=wp.transform),
):
    """One block per used body: the transform gradient of ``transform_point(q, local)``
    summed over its vertices (strided per thread, then tile sums: a fixed order)."""
    u, lane = wp.tid()
    b = body[u]
    q = wp.transform_get_rotation(body_q[b])
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    e = start[u] + lane
    while e < start[u + 1]:
        v = verts[e]
        g = points_grad[v]
        gt = gt + g
        gq = gq + rotate_adj_q(q, local[v], g)
        e += wp.block_dim()
    t0 = wp.tile_extract(wp.tile_sum(wp.tile(gt[0])), 0)
    t1 = wp.tile_extract(wp.tile_sum(wp.tile(gt[1])), 0)
    t2 = wp.tile_extract(wp.tile_sum(wp.tile(gt[2])), 0)
    q0 = wp.tile_extract(wp.tile_sum(wp.tile(gq[0])), 0)
    q1 = wp.tile_extract(wp.tile_sum(wp.tile(gq[1])), 0)
    q2 = wp.tile_extract(wp.tile_sum(wp.tile(gq[2])), 0)
    q3 = wp.tile_extract(wp.tile_sum(wp.tile(gq[3])), 0)
    if lane == 0:
        body_grad_out[b] = body_grad_out[b] + wp.transform(
            wp.vec3(t0, t1, t2), wp.quat(q0, q1, q2, q3)
        )


@wp.kernel
def image_camera_reduce_kernel(
    # Model:
    proj_start: wp.array(dtype=wp.int32),
    pixels: int,
    # Data in:
    cam_t: wp.array(dtype=wp.vec3),
    cam_q: wp.array(dtype=wp.vec4),
    fov: wp.array(dtype=float),
    rec_face: wp.array(dtype=wp.int32),
    pix_origin: wp.array(dtype=wp.vec3),
    # Data out, (N,):
    image_t_out: wp.array(dtype=wp.vec3),
    image_q_out: wp.array(dtype=wp.vec4),
    image_fov_out: wp.array(dtype=float),
):
    """One block per image n: the camera gradients of its projections (the
    contiguous range ``proj_start[n:n+2]``) and of its covered pixels' depth."""
    n, lane = wp.tid()
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    gf = float(0.0)
    j = proj_start[n] + lane
    while j < proj_start[n + 1]:
        gt = gt + cam_t[j]
        gq = gq + cam_q[j]
        gf = gf + fov[j]
        j += wp.block_dim()
    i = n * pixels + lane
    while i < (n + 1) * pixels:
        if rec_face[i] >= 0:
            gt = gt + pix_origin[i]
        i += wp.block_dim()
    t0 = wp.tile_extract(wp.tile_sum(wp.tile(gt[0])), 0)
    t1 = wp.tile_extract(wp.tile_sum(wp.tile(gt[1])), 0)
    t2 = wp.tile_extract(wp.tile_sum(wp.tile(gt[2])), 0)
    q0 = wp.tile_extract(wp.tile_sum(wp.tile(gq[0])), 0)
    q1 = wp.tile_extract(wp.tile_sum(wp.tile(gq[1])), 0)
    q2 = wp.tile_extract(wp.tile_sum(wp.tile(gq[2])), 0)
    q3 = wp.tile_extract(wp.tile_sum(wp.tile(gq[3])), 0)
    f0 = wp.tile_extract(wp.tile_sum(wp.tile(gf)), 0)
    if lane == 0:
        image_t_out[n] = wp.vec3(t0, t1, t2)
        image_q_out[n] = wp.vec4(q0, q1, q2, q3)
        image_fov_out[n] = f0


@wp.kernel
def camera_add_kernel(
    world_count: int,
    camera_count: int,
    fov_grad_on: int,
    image_t: wp.array(dtype=wp.vec3),
    image_q: wp.array(dtype=wp.vec4),
    image_fov: wp.array(dtype=float),
    # Data out (added to):
    camera_grad_out: wp.array2d(dtype=wp.transform),
    fov_grad_out: wp.array(dtype=float),
):
    """Camera c: adds each world's image sums to its transform gradient (C, W) and
    their sum over worlds, in world order, to its field-of-view gradient."""
    c = wp.tid()
    gf = float(0.0)
    for w in range(world_count):
        n = w * camera_count + c
        q = image_q[n]
        camera_grad_out[c, w] = camera_grad_out[c, w] + wp.transform(
            image_t[n], wp.quat(q[0], q[1], q[2], q[3])
        )
        gf = gf + image_fov[n]
    if fov_grad_on != 0:
        fov_grad_out[c] = fov_grad_out[c] + gf


@wp.kernel
def material_reduce_kernel(
    # Model:
    face_shape: wp.array(dtype=wp.int32),
    count: int,
    # Data in:
    rec_face: wp.array(dtype=wp.int32),
    pix_albedo: wp.array(dtype=wp.vec3),
    pix_light: wp.array(dtype=wp.vec4),
    # Data out (added to):
    shape_colors_grad_out: wp.array(dtype=wp.vec3),
    light_direction_grad_out: wp.array(dtype=wp.vec3),
    light_intensity_grad_out: wp.array(dtype=float),
):
    """Block s < S: the albedo gradient of the pixels showing shape s; block S: the
    light gradients of every covered pixel (strided, then tile sums)."""
    s, lane = wp.tid()
    num_shapes = shape_colors_grad_out.shape[0]
    acc = wp.vec4(0.0)
    i = lane
    while i < count:
        f = rec_face[i]
        if f >= 0:
            if s < num_shapes:
                if face_shape[f] == s:
                    g = pix_albedo[i]
                    acc = acc + wp.vec4(g[0], g[1], g[2], 0.0)
            else:
                acc = acc + pix_light[i]
        i += wp.block_dim()
    a0 = wp.tile_extract(wp.tile_sum(wp.tile(acc[0])), 0)
    a1 = wp.tile_extract(wp.tile_sum(wp.tile(acc[1])), 0)
    a2 = wp.tile_extract(wp.tile_sum(wp.tile(acc[2])), 0)
    a3 = wp.tile_extract(wp.tile_sum(wp.tile(acc[3])), 0)
    if lane == 0:
        if s < num_shapes:
            shape_colors_grad_out[s] = shape_colors_grad_out[s] + wp.vec3(a0, a1, a2)
        else:
            light_direction_grad_out[0] = light_direction_grad_out[0] + wp.vec3(a0, a1, a2)
            light_intensity_grad_out[0] = light_intensity_grad_out[0] + a3


__all__ = [
    "BLOCK",
    "body_reduce_kernel",
    "camera_add_kernel",
    "image_camera_reduce_kernel",
    "material_reduce_kernel",
]
