"""16-byte loads and stores (``float4`` / ``int4`` casts) for the raster passes and
the clipped path's map back.

Warp's vectors are 4-byte aligned, so ``a[i] = v`` on a ``vec4`` array compiles
to four 4-byte stores (lanes 16 bytes apart, partial sectors per instruction);
these cast to CUDA's 16-byte-aligned ``float4`` / ``int4`` (the arrays must be
16-byte aligned) for one coalesced 16-byte access per lane. On the CPU they are
plain element accesses.
"""

import warp as wp

wp.set_module_options({"enable_backward": False})


# 16-byte accesses: Warp's vectors are 4-byte aligned, so ``a[i] = v`` on a vec4
# array compiles to four 4-byte stores (lanes 16 bytes apart, partial sectors per
# instruction); these cast to CUDA's 16-byte-aligned float4 / int4 (the views
# are 16-byte aligned, see wide_views) for one coalesced 16-byte access per lane.
@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
reinterpret_cast<float4*>(a.data)[i] = make_float4(v[0], v[1], v[2], v[3]);
#else
a.data[i] = v;
#endif
"""
)
def store4(a: wp.array(dtype=wp.vec4), i: int, v: wp.vec4): ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
reinterpret_cast<int4*>(a.data)[i] = make_int4(v[0], v[1], v[2], v[3]);
#else
a.data[i] = v;
#endif
"""
)
def store4i(a: wp.array(dtype=wp.vec4i), i: int, v: wp.vec4i): ...


@wp.func_native(
    """
#if defined(__CUDA_ARCH__)
int4 t = reinterpret_cast<const int4*>(a.data)[i];
return wp::vec4i(t.x, t.y, t.z, t.w);
#else
return a.data[i];
#endif
"""
)
def load4i(a: wp.array(dtype=wp.vec4i), i: int) -> wp.vec4i: ...


@wp.struct
class FillState:
    """Which groups of four slots of a reused output array may hold values other
    than the empty-slot fill (-1), left by an earlier call: ``held`` (one uint8 per
    group, 1: may hold values), used only when ``on`` is 1 (0: every group is
    written on every call, as for arrays that are new each call).

    Most slots of a K = 8 render are empty (89% of the groups of four on the bench
    scene), and their fill is most of the bytes the output pass writes; a group
    that an earlier call left filled with -1 needs no stores (docs/PERF.md)."""

    held: wp.array(dtype=wp.uint8)
    on: int
    # the same bytes four at a time (``held`` is allocated to a multiple of 4)
    words: wp.array(dtype=wp.uint32)


@wp.func
def group_needs_write(fill: FillState, g: int, empty: bool) -> bool:
    """Whether group g, empty (all four slots -1) or not, must be written this
    call; updates its ``held`` mark for the next call."""
    if fill.on == 0:
        return True
    held = fill.held[g] != wp.uint8(0)
    if empty:
        if held:
            fill.held[g] = wp.uint8(0)
        return held
    if not held:
        fill.held[g] = wp.uint8(1)
    return True


def allocate_marks(groups: int, device) -> wp.array:
    """The ``held`` bytes of ``groups`` groups of four slots, all 1 (the first
    call writes every slot), allocated to a multiple of four bytes."""
    return wp.ones(4 * max((groups + 3) // 4, 1), dtype=wp.uint8, device=device)


def fill_state(held: wp.array | None, on: bool, device) -> FillState:
    """A :class:`FillState` over ``held`` (from :func:`allocate_marks`; None, or
    ``on`` False: off, every group written)."""
    s = FillState()
    s.on = int(bool(on) and held is not None)
    s.held = held if held is not None else wp.zeros(4, dtype=wp.uint8, device=device)
    s.words = wp.array(ptr=s.held.ptr, dtype=wp.uint32, shape=(s.held.size // 4,),
                       device=s.held.device)  # fmt: skip
    return s


@wp.struct
class WideRows:
    """The four outputs as flat arrays of 16-byte vectors, four slots each (``bary``:
    four floats of the vec3 rows), written through ``store4`` / ``store4i``
    (docs/PERF.md v15)."""

    pix_to_face: wp.array(dtype=wp.vec4i)
    zbuf: wp.array(dtype=wp.vec4)
    bary: wp.array(dtype=wp.vec4)
    dists: wp.array(dtype=wp.vec4)
