"""Image losses for sensor outputs: a deterministic block-reduced forward and a
hand-written, atomic-free backward registered on the tape.

One atomic add per pixel into a single loss value serialises on a GPU (4 M
same-address atomics took milliseconds on an H200), and adding per-block sums
with atomics makes the total depend on the order in which blocks finish (the
last bits vary run to run on a GPU). Here the sum runs in two passes, each in a
fixed order: block ``b`` sums its chunk of ``CHUNK`` pixels (each thread a
strided part, then a tile reduction, both fixed by the block size) into
``partials[b]``; one block then sums the partials the same way and adds the
total to the loss. So the loss is bit-identical run after run (and in a graph
replay). The backward writes each pixel's gradient directly (no atomics).
"""

from __future__ import annotations

import warp as wp

wp.set_module_options({"fuse_fp": False, "enable_backward": False})

#: Threads per block of both passes.
BLOCK = 256
#: Pixels per block of the first pass (each thread sums CHUNK / BLOCK of them).
CHUNK = 8 * BLOCK


@wp.func
def _sq_vec3(d: wp.vec3) -> float:
    return wp.dot(d, d)


@wp.func
def _sq_float(d: float) -> float:
    return d * d


def _make_partial_sums(value_type, square):
    def partial_sums(
        image: wp.array(dtype=value_type),
        target: wp.array(dtype=value_type),
        count: int,
        chunk: int,
        # Data out:
        partials_out: wp.array(dtype=float),
    ):
        """partials_out[b] = sum of |image - target|^2 over pixels [b chunk, (b+1) chunk)."""
        b, lane = wp.tid()
        end = wp.min((b + 1) * chunk, count)
        i = b * chunk + lane
        v = float(0.0)
        while i < end:
            v += square(value_type(image[i] - target[i]))
            i += wp.block_dim()
        total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
        if lane == 0:
            partials_out[b] = total

    partial_sums.__qualname__ = f"_partial_sums_{value_type.__name__}"
    return wp.kernel(partial_sums)


_PARTIAL_SUMS = {
    wp.vec3: _make_partial_sums(wp.vec3, _sq_vec3),
    wp.float32: _make_partial_sums(wp.float32, _sq_float),
}


@wp.kernel
def _add_partials(
    partials: wp.array(dtype=float),
    count: int,
    weight: float,
    # Data out:
    loss_out: wp.array(dtype=float),
):
    """loss_out[0] += weight * sum(partials[:count]), in a fixed order (one block)."""
    _b, lane = wp.tid()
    i = lane
    v = float(0.0)
    while i < count:
        v += partials[i]
        i += wp.block_dim()
    total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
    if lane == 0:
        loss_out[0] = loss_out[0] + weight * total


#: Per-block partial sums, one buffer per (device, stream, block count): allocated
#: by the first call of a size (set-up) and reused, never replaced (a captured
#: graph keeps the buffer it saw). Calls on one stream run in order, so they can
#: share it; calls on another stream get their own.
_PARTIALS: dict = {}


def _partials(device, count: int) -> wp.array:
    device = wp.get_device(device)
    stream = device.stream.cuda_stream if device.is_cuda else 0
    key = (str(device), stream, count)
    buf = _PARTIALS.get(key)
    if buf is None:
        buf = _PARTIALS[key] = wp.zeros(count, dtype=float, device=device)
    return buf


@wp.kernel
def _squared_error_grad_vec3(
    image: wp.array(dtype=wp.vec3),
    target: wp.array(dtype=wp.vec3),
    weight: float,
    loss_grad: wp.array(dtype=float),
    image_grad_out: wp.array(dtype=wp.vec3),
):
    """d loss / d image = 2 weight (image - target) * d(out)/d loss, added per pixel."""
    i = wp.tid()
    image_grad_out[i] = image_grad_out[i] + (2.0 * weight * loss_grad[0]) * (image[i] - target[i])


@wp.kernel
def _squared_error_grad_float(
    image: wp.array(dtype=float),
    target: wp.array(dtype=float),
    weight: float,
    loss_grad: wp.array(dtype=float),
    image_grad_out: wp.array(dtype=float),
):
    i = wp.tid()
    image_grad_out[i] = image_grad_out[i] + (2.0 * weight * loss_grad[0]) * (image[i] - target[i])


def _active_tape():
    runtime = getattr(getattr(wp, "_src", wp).context, "runtime", None)
    return getattr(runtime, "tape", None)


def image_loss(
    image: wp.array, target: wp.array, loss_out: wp.array, *, weight: float = 1.0
) -> None:
    """Adds ``weight * sum((image - target)**2)`` to ``loss_out[0]``.

    Recorded on an active ``wp.Tape`` (when ``image`` requires grad) with a
    hand-written backward that adds ``2 weight (image - target) loss_out.grad[0]``
    to ``image.grad``. No allocation after the first call of a size (a small
    per-block buffer), no host read: capturable. Deterministic: the sum runs in a
    fixed order, so the loss is bit-identical run after run on any device.

    Args:
        image: a sensor channel, contiguous ``wp.array4d`` of ``vec3`` or
            ``float32`` (world, camera, H, W).
        target: an array of the same shape and dtype (no gradient).
        loss_out: float32 array of length >= 1 (zero it before the first term).
        weight: a scale (e.g. 1 / pixel count).

    Raises:
        TypeError, ValueError: mismatched arrays, named by argument.
    """
    for name, a in (("image", image), ("target", target), ("loss_out", loss_out)):
        if not isinstance(a, wp.array):
            raise TypeError(f"{name} must be a wp.array, got {type(a).__name__}")
    if image.ndim != 4:
        raise ValueError(f"image must be 4-d (world, camera, H, W), got shape {image.shape}")
    if target.shape != image.shape or target.dtype != image.dtype:
        raise ValueError(
            f"target must match image: shape {image.shape} dtype {image.dtype}, got "
            f"shape {target.shape} dtype {target.dtype}"
        )
    if loss_out.dtype != wp.float32 or loss_out.ndim != 1 or loss_out.shape[0] < 1:
        raise ValueError("loss_out must be a 1-d float32 array of length >= 1")
    if image.dtype == wp.vec3:
        bwd = _squared_error_grad_vec3
    elif image.dtype == wp.float32:
        bwd = _squared_error_grad_float
    else:
        raise TypeError(f"image must hold vec3 or float32, got {image.dtype}")
    if not (image.is_contiguous and target.is_contiguous):
        raise ValueError("image and target must be contiguous")
    flat = image.flatten()
    flat_target = target.flatten()
    n = flat.shape[0]
    w = float(weight)
    blocks = max((n + CHUNK - 1) // CHUNK, 1)
    partials = _partials(image.device, blocks)
    wp.launch_tiled(_PARTIAL_SUMS[image.dtype], dim=[blocks], inputs=[flat, flat_target, n, CHUNK],
                    outputs=[partials], block_dim=BLOCK, device=image.device,
                    record_tape=False)  # fmt: skip
    wp.launch_tiled(_add_partials, dim=[1], inputs=[partials, blocks, w], outputs=[loss_out],
                    block_dim=BLOCK, device=image.device, record_tape=False)  # fmt: skip
    tape = _active_tape()
    if tape is None or image.grad is None or loss_out.grad is None:
        return
    flat_grad = image.grad.flatten()

    def backward():
        wp.launch(bwd, dim=n, inputs=[flat, flat_target, w, loss_out.grad], outputs=[flat_grad],
                  device=image.device)  # fmt: skip

    tape.record_func(backward, arrays=[image, loss_out])


__all__ = ["image_loss"]
