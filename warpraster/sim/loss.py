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

from typing import Any

import warp as wp

from ..backward.tape import active_tape, record_func
from .options import NO_ADJOINT_OPTIONS

wp.set_module_options(NO_ADJOINT_OPTIONS)

#: Threads per block of both passes.
BLOCK = 256
#: Pixels per block of the first pass (each thread sums CHUNK / BLOCK of them).
CHUNK = 8 * BLOCK


@wp.func
def _square(d: wp.vec3) -> float:
    return wp.dot(d, d)


@wp.func
def _square(d: float) -> float:
    return d * d


@wp.func
def _chunk_sum(image: wp.array(dtype=Any), target: wp.array(dtype=Any), b: int, chunk: int,
               lane: int, stride: int) -> float:  # fmt: skip
    """This thread's part of the sum of |image - target|^2 over chunk b of the pixels
    (lanes strided; vec3 or float pixels)."""
    end = wp.min((b + 1) * chunk, image.shape[0])
    i = b * chunk + lane
    v = float(0.0)
    while i < end:
        v += _square(image[i] - target[i])
        i += stride
    return v


def _make_squared_error_kernels(value_type):
    """(partial sums, gradient) kernels of the squared error of ``value_type`` pixels."""

    def partial_sums(
        image: wp.array(dtype=value_type),
        target: wp.array(dtype=value_type),
        chunk: int,
        # Data out:
        partials_out: wp.array(dtype=float),
    ):
        """partials_out[b] = sum of |image - target|^2 over pixels [b chunk, (b+1) chunk)."""
        b, lane = wp.tid()
        v = _chunk_sum(image, target, b, chunk, lane, wp.block_dim())
        total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
        if lane == 0:
            partials_out[b] = total

    def squared_error_grad(
        image: wp.array(dtype=value_type),
        target: wp.array(dtype=value_type),
        weight: float,
        loss_grad: wp.array(dtype=float),
        # Data out (added to):
        image_grad_out: wp.array(dtype=value_type),
    ):
        """d loss / d image = 2 weight (image - target) * d(out)/d loss, added per pixel."""
        i = wp.tid()
        image_grad_out[i] = image_grad_out[i] + (2.0 * weight * loss_grad[0]) * (
            image[i] - target[i]
        )

    partial_sums.__qualname__ = f"_partial_sums_{value_type.__name__}"
    squared_error_grad.__qualname__ = f"_squared_error_grad_{value_type.__name__}"
    return wp.kernel(partial_sums), wp.kernel(squared_error_grad)


#: (partial sums, gradient) kernels by pixel type.
_SQUARED_ERROR = {t: _make_squared_error_kernels(t) for t in (wp.vec3, wp.float32)}


@wp.func
def _partials_sum(partials: wp.array(dtype=float), start: int, count: int, lane: int,
                  stride: int) -> float:  # fmt: skip
    """This thread's part of sum(partials[start : start + count]) (lanes strided)."""
    i = lane
    v = float(0.0)
    while i < count:
        v += partials[start + i]
        i += stride
    return v


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
    v = _partials_sum(partials, 0, count, lane, wp.block_dim())
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


def _active_tape():
    return active_tape()  # one home: warpraster.backward.tape (it checks the tape's thread)


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
    if image.dtype not in _SQUARED_ERROR:
        raise TypeError(f"image must hold vec3 or float32, got {image.dtype}")
    partial_sums, bwd = _SQUARED_ERROR[image.dtype]
    if not (image.is_contiguous and target.is_contiguous):
        raise ValueError("image and target must be contiguous")
    flat = image.flatten()
    flat_target = target.flatten()
    n = flat.shape[0]
    w = float(weight)
    blocks = max((n + CHUNK - 1) // CHUNK, 1)
    partials = _partials(image.device, blocks)
    wp.launch_tiled(partial_sums, dim=[blocks], inputs=[flat, flat_target, CHUNK],
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

    record_func(tape, backward, arrays=[image, loss_out])


# ------------------------------------------------------------------------ fused with the sensor
@wp.struct
class LossTerms:
    """The squared-error terms of one frame slot whose gradient the sensor's
    deterministic backward computes itself (:func:`frame_loss`): ``color`` /
    ``depth`` are the slot's channels, ``*_target`` the targets (same shapes),
    ``loss_grad`` the loss's gradient array; ``mask`` bit 0: the colour term,
    bit 3: the depth term (the bits of ``SensorFrame.CHANNELS``); 0: none."""

    color: wp.array4d(dtype=wp.vec3)
    color_target: wp.array4d(dtype=wp.vec3)
    depth: wp.array4d(dtype=float)
    depth_target: wp.array4d(dtype=float)
    color_weight: float
    depth_weight: float
    loss_grad: wp.array(dtype=float)
    mask: int


@wp.func
def loss_grads(t: LossTerms, gc: wp.vec3, gd: float, w: int, c: int, y: int, x: int):
    """(colour, depth) upstream gradients of pixel (y, x) of image (w, c) with the
    fused terms' added, in :func:`image_loss`'s backward's order of operations
    (``g + (2 weight dL) (image - target)``): bit-identical to it."""
    if (t.mask & 1) != 0:
        scale = 2.0 * t.color_weight * t.loss_grad[0]
        gc = gc + scale * (t.color[w, c, y, x] - t.color_target[w, c, y, x])
    if (t.mask & 8) != 0:
        scale = 2.0 * t.depth_weight * t.loss_grad[0]
        gd = gd + scale * (t.depth[w, c, y, x] - t.depth_target[w, c, y, x])
    return gc, gd


@wp.kernel
def _frame_partial_sums(
    color: wp.array(dtype=wp.vec3),
    color_target: wp.array(dtype=wp.vec3),
    color_blocks: int,
    depth: wp.array(dtype=float),
    depth_target: wp.array(dtype=float),
    chunk: int,
    # Data out:
    partials_out: wp.array(dtype=float),
):
    """Both terms' per-block sums in one launch: blocks [0, color_blocks) the colour
    chunks, the rest the depth chunks (each as :func:`image_loss` sums it)."""
    b, lane = wp.tid()
    v = float(0.0)
    if b < color_blocks:
        v = _chunk_sum(color, color_target, b, chunk, lane, wp.block_dim())
    else:
        v = _chunk_sum(depth, depth_target, b - color_blocks, chunk, lane, wp.block_dim())
    total = wp.tile_extract(wp.tile_sum(wp.tile(v)), 0)
    if lane == 0:
        partials_out[b] = total


@wp.kernel
def _add_frame_partials(
    partials: wp.array(dtype=float),
    color_blocks: int,
    depth_blocks: int,
    color_weight: float,
    depth_weight: float,
    # Data out:
    loss_out: wp.array(dtype=float),
):
    """loss_out[0] += color_weight * (colour sum), then += depth_weight * (depth sum):
    the adds of two :func:`image_loss` calls, in their order (one block)."""
    _b, lane = wp.tid()
    vc = _partials_sum(partials, 0, color_blocks, lane, wp.block_dim())
    tc = wp.tile_extract(wp.tile_sum(wp.tile(vc)), 0)
    vd = _partials_sum(partials, color_blocks, depth_blocks, lane, wp.block_dim())
    td = wp.tile_extract(wp.tile_sum(wp.tile(vd)), 0)
    if lane == 0:
        if color_blocks > 0:
            loss_out[0] = loss_out[0] + color_weight * tc
        if depth_blocks > 0:
            loss_out[0] = loss_out[0] + depth_weight * td


def _check_target(target, channel: wp.array, name: str) -> None:
    if not isinstance(target, wp.array):
        raise TypeError(f"{name} must be a wp.array, got {type(target).__name__}")
    if target.shape != channel.shape or target.dtype != channel.dtype:
        raise ValueError(
            f"{name} must match the frame's channel: shape {channel.shape} dtype "
            f"{channel.dtype}, got shape {target.shape} dtype {target.dtype}"
        )
    if not target.is_contiguous:
        raise ValueError(f"{name} must be contiguous")
    if target.device != channel.device:
        raise ValueError(f"{name} must be on the sensor's device {channel.device}")


def frame_loss(
    sensor,
    frame: int,
    loss_out: wp.array,
    *,
    color_target: wp.array | None = None,
    depth_target: wp.array | None = None,
    color_weight: float = 1.0,
    depth_weight: float = 1.0,
) -> None:
    """Adds ``color_weight * sum |color - color_target|^2 + depth_weight *
    sum (depth - depth_target)^2`` of a sensor frame slot to ``loss_out[0]``,
    with the backward fused into the sensor's.

    The same value, bit for bit, as :func:`image_loss` on the colour and then the
    depth channel, and on the tape the same gradients reach the simulation's
    arrays; but with a deterministic sensor the per-pixel loss gradient is not
    written to ``color.grad`` / ``depth.grad``: the sensor's backward computes it
    itself, only for the pixels that pass a gradient on (those showing a face,
    or reached by the soft silhouette). That saves a pass over every pixel of
    the channels and their gradient buffers (the sensor then needs no
    ``grad_channels``). One launch pair for both terms. With the generated
    backward (``deterministic=False``) this calls :func:`image_loss` per term.

    With a sensor made with ``antialias=True`` the colour term is not fused: the
    fused gradient is computed inside the channel adjoint, from the hard colour,
    which the antialiased ``color`` is not. The colour term then runs as
    :func:`image_loss` of ``color`` (the same value and gradients, through
    ``color.grad`` and the antialias pass's adjoint; so the sensor's
    ``grad_channels`` must hold ``color``); a depth term is still fused.

    The frame's :meth:`~warpraster.sim.CameraSensor.update` must be recorded on
    the active tape (when one is active and ``loss_out`` has a gradient), and at
    most one fused loss per recorded update.

    Args:
        sensor: the :class:`~warpraster.sim.CameraSensor`.
        frame: its frame slot.
        loss_out: float32 array of length >= 1.
        color_target: vec3 ``(world, camera, H, W)``, or None (no colour term).
        depth_target: float32 ``(world, camera, H, W)``, or None (no depth term).
        color_weight, depth_weight: the terms' scales.

    Raises:
        TypeError, ValueError: bad arguments, named (before any launch); ValueError
            for a recorded colour term of an antialiased sensor without a ``color``
            gradient buffer (``grad_channels``).
    """
    frames = getattr(sensor, "frames", None)
    if frames is None:
        raise TypeError(f"sensor must be a CameraSensor, got {type(sensor).__name__}")
    if isinstance(frame, bool) or not isinstance(frame, int) or not 0 <= frame < len(frames):
        raise ValueError(f"frame must be a slot index in [0, {len(frames)}), got {frame!r}")
    out = frames[frame]
    if color_target is None and depth_target is None:
        raise ValueError("give color_target, depth_target or both")
    for target, channel in ((color_target, "color"), (depth_target, "depth")):
        if target is not None:
            if channel not in out.names:
                raise ValueError(f"{channel}_target: the sensor does not write {channel!r} "
                                 f"(its channels: {out.names})")  # fmt: skip
            _check_target(target, getattr(out, channel), f"{channel}_target")
    if not isinstance(loss_out, wp.array):
        raise TypeError(f"loss_out must be a wp.array, got {type(loss_out).__name__}")
    if loss_out.dtype != wp.float32 or loss_out.ndim != 1 or loss_out.shape[0] < 1:
        raise ValueError("loss_out must be a 1-d float32 array of length >= 1")
    backward = getattr(sensor, "backward", None)
    tape = _active_tape()
    taped = tape is not None and loss_out.grad is not None and sensor.requires_grad
    if getattr(sensor, "antialias", False) and color_target is not None:
        # unfused: the channel adjoint sees the hard colour, not the antialiased one
        if taped and out.color.grad is None:
            raise ValueError(
                "frame_loss: with antialias the colour term's gradient goes through "
                "frame.color.grad, which this sensor does not allocate: include 'color' in "
                "CameraSensor(grad_channels=...)"
            )
        image_loss(out.color, color_target, loss_out, weight=color_weight)
        color_target = None
        if depth_target is None:
            return
    if backward is None:
        for target, image, weight in ((color_target, out.color, color_weight),
                                      (depth_target, out.depth, depth_weight)):  # fmt: skip
            if target is not None:
                image_loss(image, target, loss_out, weight=weight)
        return
    update = sensor.recorded_update(frame) if taped else None
    if taped and (update is None or update[0] is not tape):
        raise ValueError(
            f"frame: slot {frame}'s update is not recorded on the active tape (render the "
            "frame inside the tape before its fused loss)"
        )
    device = out.color.device
    nc = out.color.size if color_target is not None else 0
    nd = out.depth.size if depth_target is not None else 0
    bc = (nc + CHUNK - 1) // CHUNK
    bd = (nd + CHUNK - 1) // CHUNK
    partials = _partials(device, bc + bd)
    color = out.color.flatten()
    depth = out.depth.flatten()
    tc = color_target.flatten() if color_target is not None else color
    td = depth_target.flatten() if depth_target is not None else depth
    wc = float(color_weight)
    wd = float(depth_weight)
    wp.launch_tiled(_frame_partial_sums, dim=[bc + bd],
                    inputs=[color, tc, bc, depth, td, CHUNK], outputs=[partials],
                    block_dim=BLOCK, device=device, record_tape=False)  # fmt: skip
    wp.launch_tiled(_add_frame_partials, dim=[1], inputs=[partials, bc, bd, wc, wd],
                    outputs=[loss_out], block_dim=BLOCK, device=device,
                    record_tape=False)  # fmt: skip
    if not taped:
        return
    terms = LossTerms()
    terms.color = out.color
    terms.color_target = color_target if color_target is not None else out.color
    terms.depth = out.depth
    terms.depth_target = depth_target if depth_target is not None else out.depth
    terms.color_weight = wc
    terms.depth_weight = wd
    terms.loss_grad = loss_out.grad
    terms.mask = (1 if color_target is not None else 0) | (8 if depth_target is not None else 0)
    backward.claim_loss(out, update)

    def arm():  # runs before the sensor's backward of this update (recorded later)
        backward.arm_loss(out, terms)

    record_func(tape, arm, arrays=[loss_out])


__all__ = ["LossTerms", "frame_loss", "image_loss", "loss_grads"]
