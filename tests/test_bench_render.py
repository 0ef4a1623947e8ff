"""The renderer bench's memory count: each allocation once, views and repeats not."""

import warp as wp

from warpraster.bench.renderer import owned_bytes
from warpraster.shading.pixel_args import PixelFragments


class _Holder:  # stands for a warpraster object holding buffers
    __module__ = "warpraster.test_holder"

    def __init__(self, **arrays):
        self.__dict__.update(arrays)


def test_owned_bytes_counts_each_allocation_once():
    a = wp.zeros((4, 2, 3, 2), dtype=wp.int32, device="cpu")  # 192 bytes
    g = wp.zeros(10, dtype=wp.vec3, device="cpu", requires_grad=True)  # 120 + 120 (grad)
    view = wp.array(ptr=g.ptr, dtype=wp.float32, shape=(30,), device="cpu")  # owns nothing
    frag = PixelFragments()
    frag.pix_to_face = a  # reached again through a struct
    inner = _Holder(arrays=[a, view], table={"g": g})
    outer = _Holder(inner=inner, frag=frag, again=a, scalar=3)
    assert owned_bytes(outer) == 192 + 120 + 120
    assert owned_bytes(view) == 0
    assert owned_bytes(outer, g) == 192 + 240


def test_owned_bytes_leaves_out_what_is_excluded_and_its_gradient():
    a = wp.zeros(8, dtype=wp.float32, device="cpu")  # 32 bytes
    t = wp.zeros(4, dtype=wp.float32, device="cpu", requires_grad=True)  # 16 + 16
    holder = _Holder(a=a, target=t)
    assert owned_bytes(holder) == 64
    assert owned_bytes(holder, exclude=[t]) == 32
