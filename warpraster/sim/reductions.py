"""The sensor's deterministic block reductions: many values into a few (a body's
transform, an image's camera, a shape's colour, the light).

One block per output: each thread sums a strided part of the inputs in order,
then a tile reduction combines the threads in an order fixed by the block size;
one thread writes the result. Part of :mod:`warpraster.sim.adjoint`.
"""

from __future__ import annotations

import warp as wp

from .gathers import rotate_adj_q
from .kernel_args import (
    CameraGrads,
    Csr,
    MaterialArrays,
    PixelRecords,
    SourceGroups,
    Surface,
    VertexGrads,
    VertexSources,
)
from .options import NO_ADJOINT_OPTIONS

wp.set_module_options(NO_ADJOINT_OPTIONS)

#: Threads per block of the reductions.
BLOCK = 256


@wp.func
def block_sum(v: float) -> float:
    """The sum of ``v`` over the block's threads (a tile reduction: a fixed order)."""
    return wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)


@wp.func
def block_sum3(v: wp.vec3) -> wp.vec3:
    """The sum of ``v`` over the block's threads, per component."""
    return wp.vec3(block_sum(v[0]), block_sum(v[1]), block_sum(v[2]))


@wp.func
def block_sum4(v: wp.vec4) -> wp.vec4:
    """The sum of ``v`` over the block's threads, per component."""
    return wp.vec4(block_sum(v[0]), block_sum(v[1]), block_sum(v[2]), block_sum(v[3]))


@wp.kernel
def body_reduce_kernel(
    # Model:
    bodies: SourceGroups,
    sources: VertexSources,
    # Data in:
    body_q: wp.array(dtype=wp.transform),
    vertex: VertexGrads,
    # Data out (added to):
    body_grad_out: wp.array(dtype=wp.transform),
):
    """One block per used body: the transform gradient of ``transform_point(q, local)``
    summed over its vertices (strided per thread, then tile sums: a fixed order)."""
    u, lane = wp.tid()
    b = bodies.ids[u]
    q = wp.transform_get_rotation(body_q[b])
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    verts = bodies.verts
    e = verts.start[u] + lane
    while e < verts.start[u + 1]:
        v = verts.entries[e]
        g = vertex.point[v]
        gt = gt + g
        gq = gq + rotate_adj_q(q, sources.local[v], g)
        e += wp.block_dim()
    t = block_sum3(gt)
    r = block_sum4(gq)
    if lane == 0:
        body_grad_out[b] = body_grad_out[b] + wp.transform(t, wp.quat(r[0], r[1], r[2], r[3]))


@wp.kernel
def image_camera_reduce_kernel(
    # Model:
    image_projs: Csr,
    pixels: int,
    # Data in:
    proj: CameraGrads,
    records: PixelRecords,  # as one row of pixels (kernel_args.pixel_row)
    # Data out, (N,):
    image_out: CameraGrads,
):
    """One block per image n: the camera gradients of its projections (the
    contiguous range ``image_projs.start[n:n+2]``) and of its covered pixels' depth."""
    n, lane = wp.tid()
    gt = wp.vec3(0.0)
    gq = wp.vec4(0.0)
    gf = float(0.0)
    j = image_projs.start[n] + lane
    while j < image_projs.start[n + 1]:
        gt = gt + proj.t[j]
        gq = gq + proj.q[j]
        gf = gf + proj.fov[j]
        j += wp.block_dim()
    i = n * pixels + lane
    while i < (n + 1) * pixels:
        if records.face[0, 0, i] >= 0:
            gt = gt + records.origin[0, 0, i]
        i += wp.block_dim()
    t = block_sum3(gt)
    q = block_sum4(gq)
    f0 = block_sum(gf)
    if lane == 0:
        image_out.t[n] = t
        image_out.q[n] = q
        image_out.fov[n] = f0


@wp.kernel
def camera_add_kernel(
    # Model:
    world_count: int,
    camera_count: int,
    fov_grad_on: int,
    # Data in, (N,):
    image: CameraGrads,
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
        q = image.q[n]
        camera_grad_out[c, w] = camera_grad_out[c, w] + wp.transform(
            image.t[n], wp.quat(q[0], q[1], q[2], q[3])
        )
        gf = gf + image.fov[n]
    if fov_grad_on != 0:
        fov_grad_out[c] = fov_grad_out[c] + gf


@wp.kernel
def material_reduce_kernel(
    # Model:
    surface: Surface,
    count: int,
    # Data in, the records as one row of pixels (kernel_args.pixel_row):
    records: PixelRecords,
    # Data out (added to): the material gradients
    grads_out: MaterialArrays,
):
    """Block s < S (S rows of the material table): the diffuse-colour gradient of the
    pixels showing a face of material s; block S: the light gradients of every
    covered pixel (strided, then tile sums)."""
    s, lane = wp.tid()
    num_rows = grads_out.colors.shape[0]
    acc = wp.vec4(0.0)
    i = lane
    while i < count:
        f = records.face[0, 0, i]
        if f >= 0:
            if s < num_rows:
                if surface.face_material[f] == s:
                    g = records.albedo[0, 0, i]
                    acc = acc + wp.vec4(g[0], g[1], g[2], 0.0)
            else:
                acc = acc + records.light[0, 0, i]
        i += wp.block_dim()
    a = block_sum4(acc)
    rgb = wp.vec3(a[0], a[1], a[2])
    if lane == 0:
        if s < num_rows:
            grads_out.colors[s] = grads_out.colors[s] + rgb
        else:
            grads_out.light_direction[0] = grads_out.light_direction[0] + rgb
            grads_out.light_intensity[0] = grads_out.light_intensity[0] + a[3]


@wp.kernel
def add_texel_grads_kernel(
    # Data in: each texel's rgb gradient (T,)
    texel_grad: wp.array(dtype=wp.vec3),
    # Data out (added to): the atlas texels' gradient, RGBA (T,)
    texels_grad_out: wp.array(dtype=wp.vec4),
):
    """Adds the sorted sums of the texel taps into the atlas's texel gradient (the
    alpha channel does not reach the sensor's colours)."""
    i = wp.tid()
    g = texel_grad[i]
    texels_grad_out[i] = texels_grad_out[i] + wp.vec4(g[0], g[1], g[2], 0.0)


__all__ = [
    "BLOCK",
    "add_texel_grads_kernel",
    "body_reduce_kernel",
    "camera_add_kernel",
    "image_camera_reduce_kernel",
    "material_reduce_kernel",
]
