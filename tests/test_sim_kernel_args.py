"""The sensor's kernel-argument helpers (:mod:`warpraster.sim.kernel_args`).

Truth: NumPy's row-major reshape of the same records. No kernels run here.
"""

import numpy as np
import warp as wp

from warpraster.sim.kernel_args import PixelRecords, make, pixel_row


def _random_array(dtype, shape, rng) -> wp.array:
    """A cpu ``wp.array`` of ``dtype`` and ``shape`` with distinct random entries."""
    inner = tuple(getattr(dtype, "_shape_", ()))
    if dtype == wp.int32:
        values = rng.integers(-1, 1000, size=shape, dtype=np.int32)
    else:
        values = rng.standard_normal(shape + inner).astype(np.float32)
    return wp.array(values, dtype=dtype, device="cpu")


def test_pixel_row_views_every_record_as_one_row_of_pixels_without_copying():
    """Pixel (n, y, x) of the (N, H, W) records is entry [0, 0, (n H + y) W + x] of the
    view (the soft slots keep their last axis), and the view shares the memory."""
    n, h, w, slots = 2, 3, 5, 8
    rng = np.random.default_rng(7)
    fields = {}
    for name, var in PixelRecords.vars.items():
        shape = (n, h, w, slots) if var.type.ndim == 4 else (n, h, w)
        fields[name] = _random_array(var.type.dtype, shape, rng)
    records = make(PixelRecords, **fields)
    row = pixel_row(records)
    for name in PixelRecords.vars:
        a, v = getattr(records, name), getattr(row, name)
        assert v.ptr == a.ptr, name  # a view: the reductions read what the pixels wrote
        assert v.shape == (1, 1, n * h * w, *a.shape[3:]), name
        want = a.numpy().reshape(n * h * w, *a.numpy().shape[3:])
        np.testing.assert_array_equal(v.numpy()[0, 0], want, err_msg=name)
