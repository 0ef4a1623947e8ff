"""Resolve a grid of samples per pixel: box filter, un-premultiply, centre channels.

The pixel kernel renders a sample image of (H sy) x (W sx) samples with
premultiplied colour (``premultiply``); :func:`resolve_samples` averages the
sy x sx samples of each pixel (in row-major order) and divides the colour by
the mean alpha (straight alpha out, 0 where nothing covers the pixel), and
takes depth, face and mesh from the pixel's sample (sy // 2, sx // 2).

The box filter has a hand-written adjoint recorded on the tape (its sample loop
has a run-time trip count, which Warp's generated adjoint would get wrong): each
pixel's thread writes the gradients of its own samples, no atomics. Where the
mean alpha is 0 the output is a constant 0 and sends no gradient. Depth and the
ids carry none.
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape, record_func

wp.set_module_options({"fuse_fp": False})

__all__ = ["resolve_samples"]


@wp.func
def _box_sum(image: wp.array4d(dtype=wp.float32), y: int, x: int, sy: int, sx: int) -> wp.vec4:
    """The premultiplied mean of pixel (y, x)'s samples of image 0."""
    acc = wp.vec4(0.0)
    for j in range(sy):
        for i in range(sx):
            ys = y * sy + j
            xs = x * sx + i
            acc += wp.vec4(image[0, ys, xs, 0], image[0, ys, xs, 1], image[0, ys, xs, 2],
                           image[0, ys, xs, 3])  # fmt: skip
    return acc / float(sy * sx)


@wp.kernel(enable_backward=False)
def _resolve_kernel(
    # Samples in (image 0 of (N, H sy, W sx, 4), premultiplied; K = 1 fragments):
    image: wp.array4d(dtype=wp.float32),
    pix_to_face: wp.array4d(dtype=wp.int32),
    zbuf: wp.array4d(dtype=float),
    sy: int,
    sx: int,
    far: wp.array(dtype=float),
    face_mesh: wp.array(dtype=wp.int32),
    # Data out, (H, W):
    color_out: wp.array2d(dtype=wp.vec4),
    depth_out: wp.array2d(dtype=float),
    face_out: wp.array2d(dtype=wp.int32),
    mesh_out: wp.array2d(dtype=wp.int32),
):
    y, x = wp.tid()
    acc = _box_sum(image, y, x, sy, sx)
    a = acc[3]
    if a > 0.0:
        color_out[y, x] = wp.vec4(acc[0] / a, acc[1] / a, acc[2] / a, a)
    else:
        color_out[y, x] = wp.vec4(0.0)
    cy = y * sy + sy // 2
    cx = x * sx + sx // 2
    f = pix_to_face[0, cy, cx, 0]
    z = zbuf[0, cy, cx, 0]
    if f < 0 or z > far[0]:
        face_out[y, x] = -1
        mesh_out[y, x] = -1
        depth_out[y, x] = wp.inf
    else:
        face_out[y, x] = f
        mesh_out[y, x] = face_mesh[f]
        depth_out[y, x] = z


@wp.kernel(enable_backward=False)
def _resolve_adjoint(
    # The forward's samples and the colour's gradient:
    image: wp.array4d(dtype=wp.float32),
    sy: int,
    sx: int,
    color_grad: wp.array2d(dtype=wp.vec4),
    # Gradient out (added to), the samples':
    image_grad_out: wp.array4d(dtype=wp.float32),
):
    y, x = wp.tid()
    acc = _box_sum(image, y, x, sy, sx)
    a = acc[3]
    if a <= 0.0:
        return
    g = color_grad[y, x]
    # colour = acc.rgb / a, alpha = a
    ga = g[3] - (g[0] * (acc[0] / a) + g[1] * (acc[1] / a) + g[2] * (acc[2] / a)) / a
    s = 1.0 / float(sy * sx)
    gm = wp.vec4(g[0] / a * s, g[1] / a * s, g[2] / a * s, ga * s)
    for j in range(sy):
        for i in range(sx):
            ys = y * sy + j
            xs = x * sx + i
            for c in range(4):
                image_grad_out[0, ys, xs, c] = image_grad_out[0, ys, xs, c] + gm[c]


def resolve_samples(
    image: wp.array,
    fragments,
    *,
    grid: tuple[int, int],
    far: wp.array,
    face_mesh: wp.array,
    color: wp.array,
    depth: wp.array,
    face_id: wp.array,
    mesh_id: wp.array,
) -> None:
    """Resolves image 0 of the premultiplied sample image ``image`` into pixels.

    Args:
        image: (N, H sy, W sx, 4) float32 premultiplied samples (image 0 is read).
        fragments: its K = 1 fragments (the centre sample's face and depth).
        grid: (sy, sx) samples per pixel.
        far: (1,) float32: a centre sample beyond it counts as empty.
        face_mesh: (F,) int32 mesh of each face.
        color: (H, W) ``vec4`` straight RGB and alpha (differentiable: on a
            ``wp.Tape`` its gradient reaches ``image.grad``).
        depth, face_id, mesh_id: (H, W) centre-sample channels (inf / -1 where empty).
    """
    h, w = color.shape
    sy, sx = (int(v) for v in grid)
    device = color.device
    wp.launch(
        _resolve_kernel,
        dim=(h, w),
        inputs=[image, fragments.pix_to_face, fragments.zbuf, sy, sx, far, face_mesh],
        outputs=[color, depth, face_id, mesh_id],
        device=device,
        record_tape=False,
    )
    tape = active_tape()
    if tape is None or color.grad is None or image.grad is None:
        return

    def backward():
        wp.launch(_resolve_adjoint, dim=(h, w), inputs=[image, sy, sx, color.grad],
                  outputs=[image.grad], device=device)  # fmt: skip

    record_func(tape, backward, arrays=[color, image])
