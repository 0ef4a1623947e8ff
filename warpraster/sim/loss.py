"""Image losses for sensor outputs, recorded on the tape (one slot per pixel, loop-free)."""

from __future__ import annotations

import warp as wp

wp.set_module_options({"fuse_fp": False})


@wp.kernel
def _squared_error_vec3(
    image: wp.array4d(dtype=wp.vec3),
    target: wp.array4d(dtype=wp.vec3),
    weight: float,
    loss_out: wp.array(dtype=float),
):
    """loss += weight * |image - target|^2, summed over pixels (one slot per pixel)."""
    i, j, k, l = wp.tid()
    d = image[i, j, k, l] - target[i, j, k, l]
    wp.atomic_add(loss_out, 0, weight * wp.dot(d, d))


@wp.kernel
def _squared_error_float(
    image: wp.array4d(dtype=float),
    target: wp.array4d(dtype=float),
    weight: float,
    loss_out: wp.array(dtype=float),
):
    """loss += weight * (image - target)^2, summed over pixels."""
    i, j, k, l = wp.tid()
    d = image[i, j, k, l] - target[i, j, k, l]
    wp.atomic_add(loss_out, 0, weight * d * d)


def image_loss(image: wp.array, target: wp.array, loss_out: wp.array, *, weight: float = 1.0) -> None:
    """Adds ``weight * sum((image - target)**2)`` to ``loss_out[0]``.

    Args:
        image: a sensor channel, ``wp.array4d`` of ``vec3`` or ``float32``
            (world, camera, H, W); its ``.grad`` receives the gradient when the
            launch is recorded on a ``wp.Tape``.
        target: an array of the same shape and dtype.
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
    if loss_out.dtype != wp.float32 or loss_out.shape[0] < 1:
        raise ValueError("loss_out must be a float32 array of length >= 1")
    if image.dtype == wp.vec3:
        kernel = _squared_error_vec3
    elif image.dtype == wp.float32:
        kernel = _squared_error_float
    else:
        raise TypeError(f"image must hold vec3 or float32, got {image.dtype}")
    wp.launch(kernel, dim=image.shape, inputs=[image, target, float(weight)], outputs=[loss_out],
              device=image.device)  # fmt: skip


__all__ = ["image_loss"]
