"""Atomic adds summed across a warp first, for per-face tables and per-image rows.

The pixel adjoints add each slot's derivatives to its face's row of a per-face
table. Neighbouring pixels of a warp (a row segment) often hold the same face
in the same slot, and their float atomics to one address are serialized at the
L2 cache. Here the lanes that add to one face, in runs of consecutive lanes,
first sum their values with warp shuffles (a segmented tree reduction, five
steps), and the first lane of each run adds the sum: one atomic per run and
element instead of one per lane (K=8 render's forward + backward 1.310 ->
1.245 ms on an H200, docs/PERF.md). The sum is the same up to float rounding
(the order of a GPU's atomics is not fixed anyway); on the CPU, which runs a
launch's threads one after the other, it is a plain add.

Every lane of the warp that reaches the call takes part (``__activemask``);
lanes elsewhere in the code are not waited for.

A row that every thread of an image adds to (a camera's pose) still gets one
atomic per warp: for those, the warps add into stripes of the row and
:func:`reduce_stripes` sums the stripes (see the section "stripes" below).
"""

import math

import warp as wp

wp.set_module_options({"enable_backward": False})

__all__ = [
    "STRIPE_WARPS",
    "add_float_row",
    "add_mat32_row",
    "add_mat33_row",
    "add_projection_partial",
    "add_rt_partial",
    "add_vec3_row",
    "mat32",
    "launch_reduce_stripes",
    "reduce_stripes",
    "stripe_of",
    "striped_partials",
    "stripes_for",
]

mat32 = wp.types.matrix(shape=(3, 2), dtype=wp.float32)


def _snippet(count: int, value: str, add_gpu: str, add_cpu: str) -> str:
    """CUDA / CPU source summing ``count`` floats (``value``: the expression of
    element j) over each run of lanes with the same key ``i``, then adding them
    (``add_gpu``: at the run's first lane, from ``s[j]``; ``add_cpu``: directly)."""
    return f"""
#if defined(__CUDA_ARCH__)
const unsigned active = __activemask();
const int lane = threadIdx.x & 31;
const int before = __shfl_up_sync(active, i, 1);
const bool head = lane == 0 || !((active >> (lane - 1)) & 1u) || before != i;
// a run ends at the next head or at the next lane not taking part
const unsigned bounds = __ballot_sync(active, head) | ~active;
const unsigned above = lane == 31 ? 0u : bounds & (0xffffffffu << (lane + 1));
const int end = above ? __ffs(above) - 1 : 32;
float s[{count}];
for (int j = 0; j < {count}; ++j) s[j] = {value};
for (int d = 1; d < 32; d <<= 1) {{
    const bool take = lane + d < end;
    for (int j = 0; j < {count}; ++j) {{
        const float o = __shfl_down_sync(active, s[j], d);
        if (take) s[j] += o;
    }}
}}
if (head) {{
{add_gpu}
}}
#else
{add_cpu}
#endif
"""


_ROW = "reinterpret_cast<float*>(reinterpret_cast<char*>(a.data) + i * a.strides[0])"


@wp.func_native(
    _snippet(
        9,
        "v.data[j / 3][j % 3]",
        f"float* row = {_ROW};\nfor (int j = 0; j < 9; ++j) atomicAdd(row + j, s[j]);",
        f"float* row = {_ROW};\nfor (int j = 0; j < 9; ++j) row[j] += v.data[j / 3][j % 3];",
    )
)
def add_mat33_row(a: wp.array(dtype=wp.mat33), i: int, v: wp.mat33):
    """``a[i] += v``, summed first over the warp's run of lanes adding to row i."""
    ...


@wp.func_native(
    _snippet(
        6,
        "v.data[j / 2][j % 2]",
        f"float* row = {_ROW};\nfor (int j = 0; j < 6; ++j) atomicAdd(row + j, s[j]);",
        f"float* row = {_ROW};\nfor (int j = 0; j < 6; ++j) row[j] += v.data[j / 2][j % 2];",
    )
)
def add_mat32_row(a: wp.array(dtype=mat32), i: int, v: mat32):
    """``a[i] += v`` (3 x 2), summed first over the warp's run of lanes adding to row i."""
    ...


@wp.func_native(
    _snippet(
        12,
        "(j < 9 ? r.data[j / 3][j % 3] : t.c[j - 9])",
        f"float* row = {_ROW};\nfor (int j = 0; j < 12; ++j) atomicAdd(row + j, s[j]);",
        f"float* row = {_ROW};\n"
        "for (int j = 0; j < 12; ++j) row[j] += (j < 9 ? r.data[j / 3][j % 3] : t.c[j - 9]);",
    )
)
def add_rt_partial(a: wp.array2d(dtype=wp.float32), i: int, r: wp.mat33, t: wp.vec3):
    """``a[i, 0:9] += r`` (row-major) and ``a[i, 9:12] += t``, summed first over
    the warp's run of lanes adding to slot ``i``: a per-warp partial sum of a
    camera's (R, T) gradient, one slot per warp (no contention across warps)."""
    ...


@wp.func_native(
    _snippet(
        3,
        "v.c[j]",
        f"float* row = {_ROW};\nfor (int j = 0; j < 3; ++j) atomicAdd(row + j, s[j]);",
        f"float* row = {_ROW};\nfor (int j = 0; j < 3; ++j) row[j] += v.c[j];",
    )
)
def add_vec3_row(a: wp.array(dtype=wp.vec3), i: int, v: wp.vec3):
    """``a[i] += v``, summed first over the warp's run of lanes adding to row i: the
    shading adjoint's per-image (light, background) and per-material rows, which
    every pixel of an image (or of a material's faces) adds to."""
    ...


@wp.func_native(
    _snippet(
        1,
        "v",
        f"float* row = {_ROW};\natomicAdd(row, s[0]);",
        f"float* row = {_ROW};\nrow[0] += v;",
    )
)
def add_float_row(a: wp.array(dtype=wp.float32), i: int, v: float):
    """``a[i] += v``, summed first over the warp's run of lanes adding to row i."""
    ...


@wp.func_native(
    _snippet(
        28,
        "(j < 9 ? r.data[j / 3][j % 3] : j < 12 ? t.c[j - 9] : m.data[(j - 12) / 4][(j - 12) % 4])",
        f"float* row = {_ROW};\nfor (int j = 0; j < 28; ++j) atomicAdd(row + j, s[j]);",
        f"float* row = {_ROW};\n"
        "for (int j = 0; j < 28; ++j)\n"
        "    row[j] += (j < 9 ? r.data[j / 3][j % 3] : j < 12 ? t.c[j - 9]"
        " : m.data[(j - 12) / 4][(j - 12) % 4]);",
    )
)
def add_projection_partial(
    a: wp.array2d(dtype=wp.float32), i: int, r: wp.mat33, t: wp.vec3, m: wp.mat44
):
    """``a[i, 0:9] += r``, ``a[i, 9:12] += t``, ``a[i, 12:28] += m`` (row-major),
    summed first over the warp's run of lanes adding to row ``i``: the projection's
    per-camera (R, T, view -> NDC matrix) gradient, into a stripe of
    :func:`striped_partials`."""
    ...


# ----------------------------------------------------------------------------- stripes
# A per-image parameter (a camera's pose, ...) gets a gradient from every thread of
# its image. Atomics into its one row serialise at the L2; per-warp slots reduced by
# a loop afterwards are latency-bound (0.46 ms for 65,536 slots on an H200). Here each
# warp adds its run sum into one of S stripes of its row (stripe = warp index mod S,
# so about STRIPE_WARPS warps share an address), and :func:`reduce_stripes` sums the
# S stripes of every (row, component) with one warp per 32 stripes: two launches, no
# loop, a few atomics per address.

#: Warps of one row that add into one stripe (the contention per address).
STRIPE_WARPS = 16
#: The most stripes per row (the reduction's threads per row and component).
MAX_STRIPES = 4096


def stripes_for(threads: int, rows: int) -> int:
    """Stripes per row for a launch of ``threads`` threads adding into ``rows`` rows
    (as if spread evenly): a multiple of 32 (one warp of the reduction per 32)."""
    per_row = math.ceil(max(int(threads), 1) / 32 / max(int(rows), 1))
    return min(MAX_STRIPES, 32 * max(1, math.ceil(per_row / STRIPE_WARPS / 32)))


_PARTIALS: dict = {}  # (device, rows, stripes, count) -> (part, sums), shared by launches


def striped_partials(device, rows: int, stripes: int, count: int) -> tuple[wp.array, wp.array]:
    """The stripes (``rows * stripes``, ``count``) float32 and the sums (``rows *
    count``,) float32 of a striped reduction, made once per shape and device (a
    backward zeroes, fills and reduces them before the next one runs, on the same
    stream). Make them before a graph capture."""
    key = (wp.get_device(device).alias, int(rows), int(stripes), int(count))
    got = _PARTIALS.get(key)
    if got is None:
        got = _PARTIALS[key] = (
            wp.zeros((int(rows) * int(stripes), int(count)), dtype=wp.float32, device=device),
            wp.zeros(int(rows) * int(count), dtype=wp.float32, device=device),
        )
    return got


@wp.func
def stripe_of(row: int, t: int, stripes: int) -> int:
    """The stripe thread ``t`` adds into for row ``row`` (its warp's, mod ``stripes``)."""
    return row * stripes + (t // 32) % stripes


@wp.kernel
def reduce_stripes(
    # Partial sums in: (rows * stripes, count)
    part: wp.array2d(dtype=wp.float32),
    stripes: int,
    # Sums out (added to): (rows * count,)
    sums_out: wp.array(dtype=wp.float32),
):
    """Thread t sums stripe ``t % stripes`` of (row, component) ``t // stripes``
    into ``sums_out[row * count + component]`` (one atomic per warp)."""
    t = wp.tid()
    rc = t // stripes
    count = part.shape[1]
    r = rc // count
    add_float_row(sums_out, rc, part[r * stripes + t % stripes, rc % count])


def launch_reduce_stripes(part: wp.array, sums: wp.array, stripes: int) -> None:
    """``sums`` += the stripes of ``part`` (see :func:`reduce_stripes`)."""
    wp.launch(
        reduce_stripes,
        dim=part.shape[0] * part.shape[1],
        inputs=[part, int(stripes)],
        outputs=[sums],
        device=part.device,
        record_tape=False,
    )
