"""warpraster.scan.ExclusiveScan against NumPy's cumulative sum (integers: exact)."""

import numpy as np
import pytest
import warp as wp
from conftest import DEVICES

from warpraster.scan import SCAN_TILE, ExclusiveScan


# one tile, partial tiles, whole tiles, and two levels (more tiles than one tile holds)
@pytest.mark.parametrize("size", [0, 1, 7, SCAN_TILE, SCAN_TILE + 1, 5 * SCAN_TILE - 3,
                                  SCAN_TILE * SCAN_TILE + 9])  # fmt: skip
def test_exclusive_scan_equals_numpy(size, device):
    rng = np.random.default_rng(size)
    values = rng.integers(0, 5, size).astype(np.int32)
    scan = ExclusiveScan(size, device)
    out = wp.full(size, -7, dtype=wp.int32, device=device)
    for _ in range(2):  # the scratch is reused: a second call gives the same
        scan(wp.array(values, dtype=wp.int32, device=device), out)
        want = np.concatenate([[0], np.cumsum(values, dtype=np.int64)[:-1]])[:size]
        np.testing.assert_array_equal(out.numpy(), want)


def test_wrong_shapes_are_refused():
    scan = ExclusiveScan(10, DEVICES[0])
    a = wp.zeros(10, dtype=wp.int32, device=DEVICES[0])
    with pytest.raises(ValueError, match=r"shape \(10,\)"):
        scan(a, wp.zeros(9, dtype=wp.int32, device=DEVICES[0]))
