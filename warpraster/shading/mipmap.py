"""Mip-mapped texture sampling, as nvdiffrast's ``texture``, with exact gradients.

* :class:`MipPyramid` / :func:`build_mipmaps`: levels 1..L of a batch of maps
  ``(N, Ht, Wt, C)``, built on the device by 2 x 2 box filtering (a 1 x 2 pair
  once one extent is 1), level l of size ``(max(Ht >> l, 1), max(Wt >> l, 1))``,
  as nvdiffrast (an odd extent > 1 cannot be halved: limit ``max_mip_level``).
  The build kernels are recorded on a ``wp.Tape``: gradients reaching a level
  flow back to the base texels.
* :func:`texture`: samples per-slot UVs ``(N, H, W, K)`` with their screen-space
  derivatives (``uv_dx``, ``uv_dy``: per pixel, x right, y down, as
  :func:`~warpraster.shading.interpolate_vertex_attributes` returns them).
* :class:`TexturesUVMipmap`: a texture object (maps, ``faces_uvs``, ``verts_uvs``)
  that interpolates the UVs and their analytic derivatives and samples the
  pyramid in one kernel, for renderers.

Filtering (:class:`FilterMode`): ``nearest`` and ``linear`` read the base level;
``linear-mipmap-nearest`` reads bilinearly the level ``floor(lambda)``,
``linear-mipmap-linear`` blends levels ``floor(lambda)`` and the next by the
fraction. The level is nvdiffrast's: with texel-space derivatives
``s = u * Wt``, ``t = v * Ht``, ``A = s_x^2 + t_x^2``, ``B = s_y^2 + t_y^2``,
``C = s_x s_y + t_x t_y``, the squared major axis of the pixel footprint ellipse
is ``(A + B) / 2 + sqrt((A - B)^2 / 4 + C^2)`` and
``lambda = 0.5 * log2(major^2)``, clamped to [0, L].
Boundaries (:class:`BoundaryMode`): ``wrap`` (repeat), ``clamp`` (to the edge
texels' centres) and ``zero``. Texel centres sit at ``(i + 0.5) / size``; with
``flip_v`` (the texture objects' default) v is replaced by ``1 - v`` first, so
maps keep PyTorch3D's row order (row 0 at v = 1); without it row 0 is at v = 0
(nvdiffrast's convention).

The samplers are loop-free ``@wp.func`` code; Warp's generated adjoint sends
gradients to the texels of every level read (then through the pyramid to the
base), to the UVs, and, in the ``linear-mipmap-linear`` mode, through the level
fraction to the UV derivatives. The square root and logarithm are taken only
where their argument is positive, so the adjoint stays finite: the square
root's kink at an exactly isotropic footprint contributes nothing there, and a
degenerate (zero) footprint or a clamped level gets zero gradient.
:func:`texture` records that generated adjoint; :class:`TexturesUVMipmap`
records a hand-written one that gives the same gradients with one thread per
slot instead of one per slot and channel (:mod:`.mip_adjoint`).
"""

from __future__ import annotations

import enum

import numpy as np
import warp as wp

from ..backward.tape import active_tape
from ..geometry import pixel_centre
from ..grad_buffers import clear_if_recording
from ..meshes import as_faces_array, as_vec3_array
from ..patches import patch_launch_size, patch_slot
from .corner_lists import CornerLists
from .interpolate import (
    ScreenFaces,
    alloc_vector_out,
    as_float_array,
    as_slot_array,
    bary_derivatives,
    check_face_range,
    float_view,
    slot_channel,
)
from .params import component, float_rows, new_struct, row
from .pixel_args import PixelFragments
from .textures import (
    FaceUVs,
    LastStruct,
    UVTextures,
    as_maps,
    check_map_batch,
    face_uvs,
    first_device,
    parse_enum,
)

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "BoundaryMode",
    "FilterMode",
    "MipPyramid",
    "TexturesUVMipmap",
    "build_mipmaps",
    "mip_level_sizes",
    "texture",
]


class FilterMode(enum.IntEnum):
    """nvdiffrast's ``filter_mode``."""

    NEAREST = 0
    LINEAR = 1
    LINEAR_MIPMAP_NEAREST = 2
    LINEAR_MIPMAP_LINEAR = 3


class BoundaryMode(enum.IntEnum):
    """nvdiffrast's ``boundary_mode`` (cube maps excluded)."""

    WRAP = 0
    CLAMP = 1
    ZERO = 2


def mip_level_sizes(height: int, width: int, max_mip_level: int | None = None) -> list:
    """[(h_l, w_l)] for l = 0..L, as nvdiffrast's mip stack.

    Halves until 1 x 1 or ``max_mip_level`` levels above the base.

    Raises:
        ValueError: an odd extent > 1 would have to be halved.
    """
    if max_mip_level is not None and (not isinstance(max_mip_level, int) or max_mip_level < 0):
        raise ValueError(f"max_mip_level must be None or an int >= 0, got {max_mip_level!r}")
    sizes = [(height, width)]
    h, w = height, width
    while (h > 1 or w > 1) and (max_mip_level is None or len(sizes) - 1 < max_mip_level):
        if (w > 1 and w % 2) or (h > 1 and h % 2):
            raise ValueError(
                f"maps of {height} x {width} texels cannot be halved at level {len(sizes)} "
                f"({h} x {w}: an odd extent > 1); use power-of-two maps or limit max_mip_level"
            )
        h, w = max(h // 2, 1), max(w // 2, 1)
        sizes.append((h, w))
    return sizes


# ----------------------------------------------------------------------------- pyramid
@wp.struct
class MipLevels:
    """A :class:`MipPyramid`'s arrays in a kernel: the float32 base ``maps``
    (N or 1, Ht, Wt, C), the flat ``levels`` buffer of levels 1..L and their
    ``offsets`` (see :class:`MipPyramid`)."""

    maps: wp.array4d(dtype=wp.float32)
    levels: wp.array(dtype=wp.float32)
    offsets: wp.array(dtype=wp.int32)


@wp.func
def level_size(p: MipLevels, level: int) -> wp.vec2i:
    """(h, w) of ``level`` of the pyramid ``p``."""
    return wp.vec2i(wp.max(p.maps.shape[1] >> level, 1), wp.max(p.maps.shape[2] >> level, 1))


@wp.func
def level_index(p: MipLevels, level: int, m: int, y: int, x: int, c: int) -> int:
    """Index in ``p.levels`` of texel (y, x), channel c of map m at ``level`` >= 1."""
    hw = level_size(p, level)
    return p.offsets[level] + ((m * hw[0] + y) * hw[1] + x) * p.maps.shape[3] + c


@wp.func
def level_texel(p: MipLevels, level: int, m: int, y: int, x: int, c: int) -> float:
    """Texel (y, x), channel c of map m at ``level`` (0: ``maps``; else the flat buffer)."""
    if level == 0:
        return p.maps[m, y, x, c]
    return p.levels[level_index(p, level, m, y, x, c)]


@wp.func
def flat_index4(i: int, d1: int, d2: int, d3: int):
    """(a, b, c, d) of flat index ``i`` = ((a d1 + b) d2 + c) d3 + d, with 32-bit
    divisions (a 4-d launch decodes its thread index with 64-bit ones: a few percent
    of these texture kernels' time on an H200)."""
    d = i % d3
    t = i // d3
    c = t % d2
    t = t // d2
    return t // d1, t % d1, c, d


@wp.func
def _halved_texel(p: MipLevels, src: int, m: int, y: int, x: int, c: int) -> float:
    """Texel (y, x), channel c of map m at level ``src + 1``: the 2 x 2 box of level
    ``src`` (a 1 x 2 pair where one of its extents is 1)."""
    hs = wp.max(p.maps.shape[1] >> src, 1)
    ws = wp.max(p.maps.shape[2] >> src, 1)
    if hs == 1:
        return 0.5 * (level_texel(p, src, m, 0, 2 * x, c) + level_texel(p, src, m, 0, 2 * x + 1, c))
    if ws == 1:
        return 0.5 * (level_texel(p, src, m, 2 * y, 0, c) + level_texel(p, src, m, 2 * y + 1, 0, c))
    return 0.25 * (
        level_texel(p, src, m, 2 * y, 2 * x, c)
        + level_texel(p, src, m, 2 * y, 2 * x + 1, c)
        + level_texel(p, src, m, 2 * y + 1, 2 * x, c)
        + level_texel(p, src, m, 2 * y + 1, 2 * x + 1, c)
    )


@wp.func
def _halved_block(v00: float, v01: float, v10: float, v11: float, hw: wp.vec2i) -> float:
    """The next level's texel from the 2 x 2 block (v00 v01 / v10 v11) of an
    (hw[0], hw[1]) level, in registers: the same sums as :func:`_halved_texel`."""
    if hw[0] == 1:
        return 0.5 * (v00 + v01)
    if hw[1] == 1:
        return 0.5 * (v00 + v10)
    return 0.25 * (v00 + v01 + v10 + v11)


@wp.func
def _store_texel(
    p: MipLevels, levels_out: wp.array(dtype=wp.float32), level: int, m: int, y: int, x: int,
    c: int, v: float,
):  # fmt: skip
    levels_out[level_index(p, level, m, y, x, c)] = v


@wp.func
def _two_levels(
    p: MipLevels, levels_out: wp.array(dtype=wp.float32), level: int, m: int, y: int, x: int,
    c: int,
) -> float:  # fmt: skip
    """Texel (y, x) of level ``level + 1``: computes and stores its 2 x 2 block of
    ``level`` (the one texel row / column where that level's extent is 1; extents
    > 1 are even) from level ``level - 1``; returns the texel (not stored)."""
    hw = level_size(p, level)
    y0 = wp.where(hw[0] > 1, 2 * y, 0)
    x0 = wp.where(hw[1] > 1, 2 * x, 0)
    v00 = _halved_texel(p, level - 1, m, y0, x0, c)
    _store_texel(p, levels_out, level, m, y0, x0, c, v00)
    v01 = float(0.0)
    v10 = float(0.0)
    v11 = float(0.0)
    if hw[1] > 1:
        v01 = _halved_texel(p, level - 1, m, y0, x0 + 1, c)
        _store_texel(p, levels_out, level, m, y0, x0 + 1, c, v01)
    if hw[0] > 1:
        v10 = _halved_texel(p, level - 1, m, y0 + 1, x0, c)
        _store_texel(p, levels_out, level, m, y0 + 1, x0, c, v10)
        if hw[1] > 1:
            v11 = _halved_texel(p, level - 1, m, y0 + 1, x0 + 1, c)
            _store_texel(p, levels_out, level, m, y0 + 1, x0 + 1, c, v11)
    return _halved_block(v00, v01, v10, v11, hw)


@wp.kernel
def _build_level(
    # Texture in (levels below ``level``):
    p: MipLevels,
    level: int,
    # Data out (the same flat buffer as ``p.levels``, level ``level``):
    levels_out: wp.array(dtype=wp.float32),
):
    """One thread per texel and channel of ``level``, launched flat: the (map, row,
    column, channel) index decoded with 32-bit integer divisions (a 4-d launch
    decodes its thread index with 64-bit ones; on an H200 the 10 levels of the K=1
    bench scene took 0.134 ms instead of 0.139, their adjoint 0.192 instead of 0.199)."""
    hw = level_size(p, level)
    m, y, x, c = flat_index4(wp.tid(), hw[0], hw[1], p.maps.shape[3])
    _store_texel(p, levels_out, level, m, y, x, c, _halved_texel(p, level - 1, m, y, x, c))


@wp.kernel
def _build_two_levels(
    # Texture in (levels below ``level``):
    p: MipLevels,
    level: int,
    # Data out (the same flat buffer as ``p.levels``, levels ``level`` and ``level + 1``):
    levels_out: wp.array(dtype=wp.float32),
):
    """Levels ``level`` and ``level + 1`` in one launch: one thread per texel and
    channel of ``level + 1`` (flat launch), which computes its 2 x 2 block of
    ``level`` and keeps it in registers."""
    hw = level_size(p, level + 1)
    m, y, x, c = flat_index4(wp.tid(), hw[0], hw[1], p.maps.shape[3])
    v = _two_levels(p, levels_out, level, m, y, x, c)
    _store_texel(p, levels_out, level + 1, m, y, x, c, v)


@wp.func
def _add_texel(g: MipLevels, level: int, m: int, y: int, x: int, c: int, v: float):
    """Adds ``v`` to the gradient of texel (y, x), channel c of map m at ``level``
    (``g``: the gradients as a :class:`MipLevels`; one writer per texel: no atomic)."""
    if level == 0:
        g.maps[m, y, x, c] = g.maps[m, y, x, c] + v
    else:
        i = level_index(g, level, m, y, x, c)
        g.levels[i] = g.levels[i] + v


@wp.func
def _halved_texel_adjoint(g: MipLevels, src: int, m: int, y: int, x: int, c: int, gv: float):
    """Adjoint of :func:`_halved_texel` for the gradient ``gv`` of texel (y, x) of
    level ``src + 1``: adds its share to each texel of level ``src`` it averages
    (the same float32 products as Warp's generated adjoint)."""
    hs = wp.max(g.maps.shape[1] >> src, 1)
    ws = wp.max(g.maps.shape[2] >> src, 1)
    if hs == 1:
        s = 0.5 * gv
        _add_texel(g, src, m, 0, 2 * x, c, s)
        _add_texel(g, src, m, 0, 2 * x + 1, c, s)
    elif ws == 1:
        s = 0.5 * gv
        _add_texel(g, src, m, 2 * y, 0, c, s)
        _add_texel(g, src, m, 2 * y + 1, 0, c, s)
    else:
        s = 0.25 * gv
        _add_texel(g, src, m, 2 * y, 2 * x, c, s)
        _add_texel(g, src, m, 2 * y, 2 * x + 1, c, s)
        _add_texel(g, src, m, 2 * y + 1, 2 * x, c, s)
        _add_texel(g, src, m, 2 * y + 1, 2 * x + 1, c, s)


@wp.func
def _fine_texel_adjoint(
    g: MipLevels, level: int, m: int, y: int, x: int, c: int, share: float
):  # fmt: skip
    """Texel (y, x) of ``level`` (>= 1) receives ``share`` from the level above, and
    its total gradient goes to the level below."""
    i = level_index(g, level, m, y, x, c)
    gv = g.levels[i] + share
    g.levels[i] = gv
    _halved_texel_adjoint(g, level - 1, m, y, x, c, gv)


@wp.kernel(enable_backward=False)
def _build_levels_adjoint(
    # Gradients in (levels ``level`` and, when ``two``, ``level + 1``) and out (added
    # to: the levels below), as a MipLevels of the pyramid's gradient arrays:
    g: MipLevels,
    level: int,
    two: int,
):
    """Adjoint of :func:`_build_two_levels` (``two`` = 1) or :func:`_build_level`
    (``two`` = 0), by hand: one thread per texel and channel of ``level``, which
    adds its share of its parent's gradient (``two``) to its own and sends the
    total to its 2 x 2 block below. Each texel below is added to by exactly one
    thread, so no atomics, and the same float32 sums as the chain of Warp's
    generated level adjoints (H200, 8 maps of 1024 x 1024 x 3, forward +
    backward: 0.363 ms with those; 0.338 with one thread per texel of
    ``level + 1`` doing its 4 x 4 block below; 0.317 with this mapping)."""
    hw = level_size(g, level)
    m, y, x, c = flat_index4(wp.tid(), hw[0], hw[1], g.maps.shape[3])
    if two == 0:
        _halved_texel_adjoint(g, level - 1, m, y, x, c, g.levels[level_index(g, level, m, y, x, c)])
        return
    share = g.levels[level_index(g, level + 1, m, y // 2, x // 2, c)]
    if hw[0] == 1 or hw[1] == 1:
        share = 0.5 * share
    else:
        share = 0.25 * share
    _fine_texel_adjoint(g, level, m, y, x, c, share)


#: levels per launch -> build kernel
_BUILD_KERNELS = {1: _build_level, 2: _build_two_levels}


class MipPyramid:
    """Mip levels of a batch of maps, in one flat device buffer.

    Args:
        maps: (N, Ht, Wt, C) maps (float32 ``wp.array``, (N, Ht, Wt) ``vector(C)``
            ``wp.array`` or NumPy); level 0 is read from ``maps`` itself.
        max_mip_level: most levels above the base (None: down to 1 x 1).
        device, requires_grad: for NumPy ``maps``.

    Attributes:
        maps: the float32 (N, Ht, Wt, C) base.
        levels: float32 flat buffer of levels 1..L (level l, map m, row y, column x,
            channel c at ``offsets[l] + ((m * h_l + y) * w_l + x) * C + c``).
        offsets: int32 (L + 1,) device array of level offsets (entry 0 unused).
        sizes: [(h_l, w_l)] for l = 0..L.
        arrays: the three arrays as the kernels' :class:`MipLevels` struct.

    :meth:`build` fills the levels from the current base texels (no allocation:
    graph-capturable; recorded on a tape, gradients reach the base). Construction
    calls it once.
    """

    def __init__(
        self, maps, *, max_mip_level: int | None = None, device=None, requires_grad: bool = False
    ):
        self.maps = as_maps(maps, first_device((maps,), device), requires_grad)
        n, h, w, c = self.maps.shape
        self.device = self.maps.device
        self.sizes = mip_level_sizes(h, w, max_mip_level)
        offs = [0, 0]
        for lh, lw in self.sizes[1:]:
            offs.append(offs[-1] + n * lh * lw * c)
        self.offsets = wp.array(np.array(offs[:-1], np.int32), dtype=wp.int32, device=self.device)
        self.levels = wp.zeros(
            max(offs[-1], 1),
            dtype=wp.float32,
            device=self.device,
            requires_grad=self.maps.requires_grad,
        )
        self.arrays = new_struct(
            MipLevels, self.device, maps=self.maps, levels=self.levels, offsets=self.offsets
        )
        self._samplers: dict = {}
        self._adjoint: MipLevels | None = None  # the gradients as MipLevels, made on first use
        self.build()

    @property
    def max_level(self) -> int:
        """L, the index of the coarsest level."""
        return len(self.sizes) - 1

    def sampler(self, filter_mode, boundary_mode, flip_v: bool) -> MipSampler:
        """The kernels' :class:`MipSampler` of this pyramid with these options (made
        once per distinct options)."""
        key = (int(filter_mode), int(boundary_mode), bool(flip_v))
        if key not in self._samplers:
            self._samplers[key] = mip_sampler(self.arrays, self.max_level, *key)
        return self._samplers[key]

    #: most levels one build launch computes (1 or 2)
    levels_per_launch: int = 2

    def build(self) -> MipPyramid:
        """Recomputes levels 1..L from the base texels: two levels per launch
        (the finer one kept in registers for the coarser).

        On a tape (base texels with ``requires_grad``) it records a hand-written
        backward, group by group from the coarsest (:func:`_build_levels_adjoint`:
        no atomics, the same sums as Warp's generated adjoint). H200, 8 maps of
        1024 x 1024 x 3 (``python scripts/gpu_pyramid_variants.py``), the generated
        adjoint of one level per launch: forward 0.125 ms, forward + backward
        0.405; two levels per launch: 0.081 and 0.403 with its own generated
        adjoint (its longer chain per thread took as long as the launches saved),
        0.363 with the one-level kernel's generated adjoint per level, 0.317 with
        this backward (0.439 with one thread per base texel reading its parent and
        grandparent: 25 M threads, each decoding its index with three run-time
        divisions); three levels per launch: 0.110 and 1.381 ms.
        """
        n, _, _, c = self.maps.shape
        clear_if_recording(self.levels)  # the levels are this build's: gradients from zero
        for lev, g in self._groups():
            lh, lw = self.sizes[lev + g - 1]
            wp.launch(
                _BUILD_KERNELS[g],
                dim=n * lh * lw * c,
                inputs=[self.arrays, lev],
                outputs=[self.levels],
                device=self.device,
                record_tape=False,
            )
        tape = active_tape()
        if tape is not None and self.maps.requires_grad and len(self.sizes) > 1:
            tape.record_func(self._build_backward, arrays=[self.maps, self.levels])
        return self

    def _groups(self) -> list:
        """[(first level, levels)] of the build launches."""
        groups = []
        lev = 1
        while lev < len(self.sizes):
            g = min(self.levels_per_launch, len(self.sizes) - lev)
            groups.append((lev, g))
            lev += g
        return groups

    def _build_backward(self) -> None:
        """The build's adjoint, group by group from the coarsest (see
        :func:`_build_levels_adjoint`)."""
        if self._adjoint is None:
            self._adjoint = new_struct(MipLevels, self.device, maps=self.maps.grad,
                                       levels=self.levels.grad, offsets=self.offsets)  # fmt: skip
        n, _, _, c = self.maps.shape
        for lev, g in reversed(self._groups()):
            lh, lw = self.sizes[lev]
            wp.launch(_build_levels_adjoint, dim=n * lh * lw * c,
                      inputs=[self._adjoint, lev, g - 1], device=self.device)  # fmt: skip


def build_mipmaps(maps, *, max_mip_level: int | None = None) -> MipPyramid:
    """A :class:`MipPyramid` of ``maps`` (built on the device)."""
    return MipPyramid(maps, max_mip_level=max_mip_level)


# ----------------------------------------------------------------------------- sampling
@wp.func
def clamp_branch(x: float, lo: float, hi: float) -> float:
    """Clamp with zero gradient on and beyond the limits."""
    if x <= lo:
        return lo
    if x >= hi:
        return hi
    return x


@wp.func
def wrap_tap(y: int, x: int, h: int, w: int, boundary: int):
    """(row, column, inside) of texel (y, x) of an h x w level: wrapped (wrap); ``inside``
    False off the level (zero, clamp: the tap reads 0)."""
    xx = x
    yy = y
    if boundary == BoundaryMode.WRAP:
        if xx < 0:
            xx = xx + w
        if xx >= w:
            xx = xx - w
        if yy < 0:
            yy = yy + h
        if yy >= h:
            yy = yy - h
    return yy, xx, xx >= 0 and xx < w and yy >= 0 and yy < h


@wp.func
def boundary_texel(
    p: MipLevels, level: int, m: int, y: int, x: int, c: int, h: int, w: int, boundary: int
) -> float:
    """Texel of a bilinear tap, wrapped (wrap), or 0 outside the level (zero, clamp)."""
    yy, xx, inside = wrap_tap(y, x, h, w, boundary)
    if not inside:
        return 0.0
    return level_texel(p, level, m, yy, xx, c)


@wp.func
def bilinear_position(h: int, w: int, u: float, v: float, boundary: int):
    """Where a bilinear sample of an h x w level at (u, v) reads (texel centres at
    (i + 0.5) / size): ``(x, y, dx, dy)``, the texel-space position (wrapped, or
    clamped to the edge texels' centres) and the column / row offsets of the taps
    after the first (0 where clamp pins the sample to an edge texel's centre: the
    sample then has zero gradient along that axis)."""
    uu = u
    vv = v
    if boundary == BoundaryMode.WRAP:
        uu = uu - wp.floor(uu)
        vv = vv - wp.floor(vv)
    x = uu * float(w) - 0.5
    y = vv * float(h) - 0.5
    dx = 1
    dy = 1
    if boundary == BoundaryMode.CLAMP:
        x = clamp_branch(x, 0.0, float(w - 1))
        y = clamp_branch(y, 0.0, float(h - 1))
        if x == 0.0 or x == float(w - 1):
            dx = 0
        if y == 0.0 or y == float(h - 1):
            dy = 0
    return x, y, dx, dy


@wp.func
def near_level(x: float, y: float, h: int, w: int) -> bool:
    """Whether a bilinear sample at texel-space (x, y) of an h x w level has a tap
    inside (False far outside in zero mode, or NaN: the sample is 0; keeps int()
    in range)."""
    return x > -2.0 and x < float(w) + 1.0 and y > -2.0 and y < float(h) + 1.0


@wp.func
def texel_cell(x: float, y: float):
    """(x0, y0, fx, fy): the first tap of a bilinear sample at texel-space (x, y)
    and the fractions."""
    x0f = wp.floor(x)
    y0f = wp.floor(y)
    return int(x0f), int(y0f), x - x0f, y - y0f


@wp.func
def bilinear_level(
    p: MipLevels, level: int, m: int, c: int, u: float, v: float, boundary: int
) -> float:
    """Bilinear sample of ``level`` at (u, v) (texel centres at (i + 0.5) / size)."""
    hw = level_size(p, level)
    h = hw[0]
    w = hw[1]
    x, y, dx, dy = bilinear_position(h, w, u, v, boundary)
    if not near_level(x, y, h, w):
        return 0.0
    x0, y0, fx, fy = texel_cell(x, y)
    a00 = boundary_texel(p, level, m, y0, x0, c, h, w, boundary)
    a10 = boundary_texel(p, level, m, y0, x0 + dx, c, h, w, boundary)
    a01 = boundary_texel(p, level, m, y0 + dy, x0, c, h, w, boundary)
    a11 = boundary_texel(p, level, m, y0 + dy, x0 + dx, c, h, w, boundary)
    top = a00 + fx * (a10 - a00)
    bottom = a01 + fx * (a11 - a01)
    return top + fy * (bottom - top)


@wp.func
def nearest_cell(h: int, w: int, u: float, v: float, boundary: int):
    """(row, column) of the texel nearest to (u, v) in an h x w level (nvdiffrast's
    nearest mode), before the zero test and the clamp to the level."""
    uu = u
    vv = v
    if boundary == BoundaryMode.WRAP:
        uu = uu - wp.floor(uu)
        vv = vv - wp.floor(vv)
    # Bounded (and NaN sent to -1) before int(); the outcome is unchanged.
    x = uu * float(w)
    y = vv * float(h)
    if not (x >= -1.0):
        x = -1.0
    if not (y >= -1.0):
        y = -1.0
    x = wp.min(x, float(w) + 1.0)
    y = wp.min(y, float(h) + 1.0)
    return int(wp.floor(y)), int(wp.floor(x))


@wp.func
def nearest_base(
    maps: wp.array4d(dtype=wp.float32), m: int, c: int, u: float, v: float, boundary: int
) -> float:
    """Nearest texel of the base level (nvdiffrast's nearest mode)."""
    h = maps.shape[1]
    w = maps.shape[2]
    iy, ix = nearest_cell(h, w, u, v, boundary)
    if boundary == BoundaryMode.ZERO:
        if ix < 0 or ix >= w or iy < 0 or iy >= h:
            return 0.0
    return maps[m, wp.clamp(iy, 0, h - 1), wp.clamp(ix, 0, w - 1), c]


@wp.func
def texel_footprint(dudx: float, dvdx: float, dudy: float, dvdy: float, h: int, w: int):
    """nvdiffrast's pixel footprint in texels of an h x w level: ``(sx, tx, sy, ty, a,
    b, cc, l2a, major)``, the texel-space derivatives, the quadratic form's
    ``A = sx^2 + tx^2``, ``B = sy^2 + ty^2``, ``C = sx sy + tx ty``, the square root
    ``l2a`` (0 where its argument is not positive) and the squared major axis."""
    sx = dudx * float(w)
    sy = dudy * float(w)
    tx = dvdx * float(h)
    ty = dvdy * float(h)
    a = sx * sx + tx * tx
    b = sy * sy + ty * ty
    cc = sx * sy + tx * ty
    l2b = 0.5 * (a + b)
    l2n = 0.25 * (a - b) * (a - b) + cc * cc
    l2a = float(0.0)
    if l2n > 0.0:
        l2a = wp.sqrt(l2n)
    return sx, tx, sy, ty, a, b, cc, l2a, l2b + l2a


@wp.func
def mip_level(
    dudx: float, dvdx: float, dudy: float, dvdy: float, h: int, w: int, max_level: int
) -> float:
    """nvdiffrast's level: 0.5 log2 of the squared major axis of the texel footprint."""
    sx, tx, sy, ty, a, b, cc, l2a, major = texel_footprint(dudx, dvdx, dudy, dvdy, h, w)
    flevel = float(0.0)
    if major > 0.0:
        flevel = 0.5 * wp.log2(major)
    return clamp_branch(flevel, 0.0, float(max_level))


@wp.struct
class MipSampler:
    """What the sampling kernels read: the pyramid's arrays (``p``), the index
    ``max_level`` of its coarsest level, the :class:`FilterMode`, the
    :class:`BoundaryMode` and ``flip_v`` (0 or 1), made by :func:`mip_sampler`
    (once per pyramid and options: :meth:`MipPyramid.sampler`; host-side only)."""

    p: MipLevels
    max_level: int
    filter_mode: int
    boundary: int
    flip_v: int


def mip_sampler(
    arrays: MipLevels, max_level: int, filter_mode, boundary_mode, flip_v: bool
) -> MipSampler:
    """A :class:`MipSampler` of a pyramid's ``arrays`` (``max_level`` 0: the base only)."""
    s = MipSampler()
    s.p = arrays
    s.max_level = int(max_level)
    s.filter_mode = int(filter_mode)
    s.boundary = int(boundary_mode)
    s.flip_v = int(bool(flip_v))
    return s


@wp.func
def sample_point(t: MipSampler, n: int, uv: wp.vec2, uv_dx: wp.vec2, uv_dy: wp.vec2):
    """(map m, u, v, dv/dx, dv/dy) that image ``n``'s sample reads: the map's row
    (0 when shared) and v, with its derivatives, flipped (``1 - v``) with ``flip_v``."""
    v = uv[1]
    dvx = uv_dx[1]
    dvy = uv_dy[1]
    if t.flip_v != 0:
        v = 1.0 - v
        dvx = -dvx
        dvy = -dvy
    return row(n, t.p.maps.shape[0]), uv[0], v, dvx, dvy


@wp.func
def mip_sample_channel(
    t: MipSampler, n: int, c: int, uv: wp.vec2, uv_dx: wp.vec2, uv_dy: wp.vec2
) -> float:
    """Channel ``c`` of image ``n``'s map (the one map when shared) sampled as
    nvdiffrast's ``texture`` at ``uv``."""
    m, u, v, dvx, dvy = sample_point(t, n, uv, uv_dx, uv_dy)
    if t.filter_mode == FilterMode.NEAREST:
        return nearest_base(t.p.maps, m, c, u, v, t.boundary)
    if t.filter_mode == FilterMode.LINEAR or t.max_level == 0:
        return bilinear_level(t.p, 0, m, c, u, v, t.boundary)
    flevel = mip_level(
        uv_dx[0], dvx, uv_dy[0], dvy, t.p.maps.shape[1], t.p.maps.shape[2], t.max_level
    )
    level0 = int(wp.floor(flevel))
    a = bilinear_level(t.p, level0, m, c, u, v, t.boundary)
    if t.filter_mode == FilterMode.LINEAR_MIPMAP_LINEAR and flevel > 0.0:
        level1 = wp.min(level0 + 1, t.max_level)
        frac = flevel - float(level0)
        bb = bilinear_level(t.p, level1, m, c, u, v, t.boundary)
        a = a + frac * (bb - a)
    return a


@wp.struct
class SlotUVs:
    """What :func:`texture` samples, per slot (N, H, W, K): ``uv`` (``vec2``), its
    screen-space derivatives ``uv_dx``, ``uv_dy`` (read when ``derivatives``) and
    ``pix_to_face`` (int32, read when ``masked``: slots with -1 give zeros)."""

    uv: wp.array4d(dtype=wp.vec2)
    derivatives: int
    uv_dx: wp.array4d(dtype=wp.vec2)
    uv_dy: wp.array4d(dtype=wp.vec2)
    masked: int
    pix_to_face: wp.array4d(dtype=wp.int32)


@wp.kernel
def _texture(
    # Slots in:
    s: SlotUVs,
    # Texture in:
    t: MipSampler,
    # Data out: (N, H, W, K * C) float view of a vector(C) array
    texels_out: wp.array4d(dtype=wp.float32),
):
    n, yi, xi, j = wp.tid()
    k, c = slot_channel(j, t.p.maps.shape[3])
    if s.masked != 0:
        if s.pix_to_face[n, yi, xi, k] < 0:
            texels_out[n, yi, xi, j] = 0.0
            return
    dx = wp.vec2(0.0)
    dy = wp.vec2(0.0)
    if s.derivatives != 0:
        dx = s.uv_dx[n, yi, xi, k]
        dy = s.uv_dy[n, yi, xi, k]
    texels_out[n, yi, xi, j] = mip_sample_channel(t, n, c, s.uv[n, yi, xi, k], dx, dy)


def _modes(filter_mode, boundary_mode, has_derivatives: bool):
    if isinstance(filter_mode, str) and filter_mode.strip().lower() == "auto":
        filter_mode = FilterMode.LINEAR_MIPMAP_LINEAR if has_derivatives else FilterMode.LINEAR
    fm = parse_enum(filter_mode, FilterMode, "filter_mode")
    bm = parse_enum(boundary_mode, BoundaryMode, "boundary_mode")
    return fm, bm


def texture(
    tex,
    uv,
    uv_dx=None,
    uv_dy=None,
    *,
    pix_to_face=None,
    filter_mode: str | FilterMode = "auto",
    boundary_mode: str | BoundaryMode = "wrap",
    max_mip_level: int | None = None,
    flip_v: bool = False,
    out: wp.array | None = None,
) -> wp.array:
    """Samples maps at per-slot UVs, as nvdiffrast's ``texture`` (mip-mapped with derivatives).

    Args:
        tex: (N, Ht, Wt, C) maps (one per image, or one shared; float32 / vector
            ``wp.array`` or NumPy; row 0 at v = 0 unless ``flip_v``) or a
            :class:`MipPyramid` (capturable: rebuild it with ``tex.build()`` when
            the texels change).
        uv: (N, H, W, K) ``vec2`` array (or NumPy (N, H, W, K, 2)).
        uv_dx, uv_dy: d uv / d x and d uv / d y per pixel (x right, y down), same
            shape; required by the mip-mapped filter modes.
        pix_to_face: optional (N, H, W, K) int32: slots with -1 give zeros.
        filter_mode: ``"auto"`` (``linear-mipmap-linear`` with derivatives, else
            ``linear``), ``"nearest"``, ``"linear"``, ``"linear-mipmap-nearest"``,
            ``"linear-mipmap-linear"`` (or :class:`FilterMode`).
        boundary_mode: ``"wrap"``, ``"clamp"`` or ``"zero"`` (or :class:`BoundaryMode`).
        max_mip_level: limit of the pyramid built from plain maps (ignored for a
            :class:`MipPyramid`).
        flip_v: sample at ``1 - v`` (maps in PyTorch3D's row order).
        out: optional preallocated (N, H, W, K) ``vector(C)`` result.

    Returns:
        ``wp.array`` (N, H, W, K) of ``vector(C, float32)``. On a ``wp.Tape``
        gradients flow to the texels, ``uv`` and (``linear-mipmap-linear``)
        ``uv_dx``/``uv_dy``.
    """
    fm, bm = _modes(filter_mode, boundary_mode, uv_dx is not None)
    mips = fm in (FilterMode.LINEAR_MIPMAP_NEAREST, FilterMode.LINEAR_MIPMAP_LINEAR)
    if isinstance(tex, MipPyramid):
        pyramid = tex
    elif mips:
        pyramid = MipPyramid(tex, max_mip_level=max_mip_level, device=first_device((uv,)))
    else:
        pyramid = None
    if pyramid is not None:
        maps, sampler = pyramid.maps, pyramid.sampler(fm, bm, flip_v)
    else:
        maps = as_float_array(tex, "tex", (None, None, None, None), first_device((uv,)))
        sampler = mip_sampler(new_struct(MipLevels, maps.device, maps=maps), 0, fm, bm, flip_v)
    device = maps.device
    uvs = as_slot_array(uv, "uv", wp.vec2, device)
    shape = tuple(uvs.shape)
    if mips and (uv_dx is None or uv_dy is None):
        raise ValueError(f"filter_mode {fm.name.lower()} needs uv_dx and uv_dy")
    if (uv_dx is None) != (uv_dy is None):
        raise ValueError("uv_dx and uv_dy must be given together")
    dxs = None if uv_dx is None else as_slot_array(uv_dx, "uv_dx", wp.vec2, device, shape)
    dys = None if uv_dy is None else as_slot_array(uv_dy, "uv_dy", wp.vec2, device, shape)
    p2f = None
    if pix_to_face is not None:
        p2f = as_slot_array(pix_to_face, "pix_to_face", wp.int32, device, shape)
    check_map_batch(maps, shape[0], "tex")
    c = maps.shape[3]
    rg = bool(maps.requires_grad or uvs.requires_grad or (dxs is not None and dxs.requires_grad))
    texels = alloc_vector_out(out, "out", shape, c, device, rg)
    n, h, w, k = shape
    # arrays left None become placeholders, not read (the flags say so)
    slots = new_struct(SlotUVs, device, uv=uvs, derivatives=int(dxs is not None), uv_dx=dxs,
                       uv_dy=dys, masked=int(p2f is not None), pix_to_face=p2f)  # fmt: skip
    wp.launch(
        _texture,
        dim=(n, h, w, k * c),
        inputs=[slots, sampler],
        outputs=[float_view(texels)],
        device=device,
    )
    return texels


# ----------------------------------------------------------------------------- texture object
mat32 = wp.types.matrix(shape=(3, 2), dtype=wp.float32)


@wp.kernel
def _gather_corners(
    # Texture in:
    uvs: FaceUVs,
    # Geometry in (derivatives; absent without mipmaps):
    screen: ScreenFaces,
    # Data out: per face, its three corners' UVs (rows) and projected vertices, as
    # flat floats: (6 F,) UVs (6 f + 2 r + c) and (9 F,) vertices (9 f + 3 r + c)
    uv_out: wp.array(dtype=float),
    ndc_out: wp.array(dtype=float),
):
    """Nine threads per face, one per float of the vertex rows (the first six also
    store the UVs): consecutive threads store consecutive floats (see
    :func:`~warpraster.shading.shaders._gather_faces_kernel`)."""
    j = wp.tid()
    f = j // 9
    rc = j - 9 * f
    if rc < 6:
        r = rc // 2
        uv_out[6 * f + rc] = uvs.verts_uvs[uvs.faces_uvs[f, r], rc - 2 * r]
    if screen.with_derivatives != 0:
        r = rc // 3
        ndc_out[j] = component(screen.verts_ndc[screen.ndc_faces[f, r]], rc - 3 * r)


@wp.struct
class UVCorners:
    """A :class:`CornerTables` in the sampling kernel: ``uv`` (F,) ``mat32`` (rows:
    a face's corner UVs), ``ndc`` (F,) ``mat33`` (rows: its projected vertices, read
    when ``derivatives``) and the rasterizer's ``perspective_correct`` setting."""

    uv: wp.array(dtype=mat32)
    ndc: wp.array(dtype=wp.mat33)
    derivatives: int
    perspective_correct: int


class CornerTables:
    """Per-face corner tables the sampling kernel reads (UVs, projected vertices).

    Gathered once per call (nine threads per face), so the sampling kernel's adjoint adds
    into per-face rows (shared by the slots and channels of one face, ~15 on the
    bench scene) instead of per-vertex rows (shared by all faces around a vertex,
    ~90), and the gather's adjoint adds F rows into the vertices.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(self, num_faces: int, device, requires_grad: bool):
        self.num_faces = int(num_faces)
        n = max(self.num_faces, 1)
        self.uv = wp.zeros(n, dtype=mat32, device=device, requires_grad=requires_grad)
        self.ndc = wp.zeros(n, dtype=wp.mat33, device=device, requires_grad=requires_grad)
        #: both as flat floats for the gather (same memory, gradients too)
        self.floats = (float_rows(self.uv), float_rows(self.ndc))


@wp.func
def corner_uvs(corners: UVCorners, f: int):
    """The UVs (``vec2``) of face ``f``'s three corners."""
    t = corners.uv[f]
    return wp.vec2(t[0, 0], t[0, 1]), wp.vec2(t[1, 0], t[1, 1]), wp.vec2(t[2, 0], t[2, 1])


@wp.func
def blend3(w: wp.vec3, a: wp.vec2, b: wp.vec2, c: wp.vec2) -> wp.vec2:
    """w[0] a + w[1] b + w[2] c."""
    return w[0] * a + w[1] * b + w[2] * c


@wp.func
def pixel_bary_derivatives(corners: UVCorners, f: int, yi: int, xi: int, shape: wp.vec2i):
    """(d bary / d X_ndc, d bary / d Y_ndc, step) of face ``f`` at the centre of pixel
    (yi, xi) of an image of ``shape`` (H, W); ``step`` times a derivative is per
    pixel, x right, y down."""
    p = pixel_centre(yi, xi, shape[0], shape[1])
    m = corners.ndc[f]
    dbx, dby = bary_derivatives(p, m[0], m[1], m[2], corners.perspective_correct)
    return dbx, dby, -2.0 / float(wp.min(shape[0], shape[1]))


@wp.func
def slot_uv_terms(corners: UVCorners, f: int, b: wp.vec3, yi: int, xi: int, shape: wp.vec2i):
    """:func:`slot_uv`'s outputs and the terms they are made of: ``(uv, duv_dx,
    duv_dy, uv0, uv1, uv2, dbx, dby, step)``, the corner UVs and, with derivatives,
    :func:`pixel_bary_derivatives` (zeros without)."""
    uv0, uv1, uv2 = corner_uvs(corners, f)
    uv = blend3(b, uv0, uv1, uv2)
    duv_dx = wp.vec2(0.0)
    duv_dy = wp.vec2(0.0)
    dbx = wp.vec3(0.0)
    dby = wp.vec3(0.0)
    step = float(0.0)
    if corners.derivatives != 0:
        dbx, dby, step = pixel_bary_derivatives(corners, f, yi, xi, shape)
        duv_dx = step * blend3(dbx, uv0, uv1, uv2)
        duv_dy = step * blend3(dby, uv0, uv1, uv2)
    return uv, duv_dx, duv_dy, uv0, uv1, uv2, dbx, dby, step


@wp.func
def slot_uv(corners: UVCorners, f: int, b: wp.vec3, yi: int, xi: int, shape: wp.vec2i):
    """(uv, duv/dx, duv/dy) of a filled slot of face ``f`` in an image of ``shape``
    (H, W): the UVs interpolated with the barycentrics, and their analytic
    screen-space derivatives (per pixel, x right, y down) when ``corners.derivatives``."""
    uv, duv_dx, duv_dy, uv0, uv1, uv2, dbx, dby, step = slot_uv_terms(corners, f, b, yi, xi, shape)
    return uv, duv_dx, duv_dy


#: CUDA register cap of the mip-mapped sampling kernel (its forward, and Warp's
#: generated backward, which uncapped takes over 200 registers). K=1 hard Phong
#: with a 1024² mip-mapped texture on an H200 (`python scripts/gpu_render_regs.py`,
#: graph replay, median of 20): 0.858 -> 0.789 ms forward, 2.508 -> 2.322 ms
#: forward + backward (80: 0.809 / 2.299).
SAMPLE_MAX_REGISTERS = 64


@wp.struct
class SampleInputs:
    """What the sampling kernel reads, and its hand-written adjoint
    (:mod:`.mip_adjoint`) again: the fragments ``frag`` (``pix_to_face``,
    ``bary_coords``), the per-face ``corners`` and the texture's sampler ``t``."""

    frag: PixelFragments
    corners: UVCorners
    t: MipSampler


#: Pixel patch width of the sampling kernel (:mod:`~warpraster.patches`).
SAMPLE_PATCH_W = wp.constant(8)


@wp.func
def patch_fragment(frag: PixelFragments, tid: int, patch_w: int):
    """(n, yi, xi, k, f) of thread ``tid`` of a launch over the slots of ``frag`` in
    pixel patches ``patch_w`` wide (:mod:`~warpraster.patches`): its slot and face
    (-1: an empty slot; -2: a thread past the last slot)."""
    p2f = frag.pix_to_face
    n, yi, xi, k, inside = patch_slot(
        tid, p2f.shape[0], p2f.shape[1], p2f.shape[2], p2f.shape[3], patch_w
    )
    f = int(-2)
    if inside:
        f = p2f[n, yi, xi, k]
    return n, yi, xi, k, f


@wp.func
def zero_channels(a: wp.array4d(dtype=wp.float32), n: int, yi: int, xi: int, j0: int, c: int):
    """a[n, yi, xi, j0 .. j0 + c - 1] = 0 (a slot's channels)."""
    for j in range(j0, j0 + c):
        a[n, yi, xi, j] = 0.0


@wp.kernel(cuda_max_registers=SAMPLE_MAX_REGISTERS)
def _sample_uv_mipmap(
    # In: fragments, corners (per face, see CornerTables), sampler
    a: SampleInputs,
    # Data out: (N, H, W, K * C) float view of a vector(C) array
    texels_out: wp.array4d(dtype=wp.float32),
):
    """One thread per slot and channel (any channel count C), launched flat over
    pixel patches (:mod:`~warpraster.patches`, ``SAMPLE_PATCH_W``; the index
    decoded with 32-bit divisions: see :func:`_build_level`)."""
    p2f = a.frag.pix_to_face
    n, yi, xi, j, inside = patch_slot(
        wp.tid(), p2f.shape[0], p2f.shape[1], p2f.shape[2], texels_out.shape[3], SAMPLE_PATCH_W
    )
    if not inside:
        return
    k, c = slot_channel(j, a.t.p.maps.shape[3])
    f = a.frag.pix_to_face[n, yi, xi, k]
    if f < 0:
        texels_out[n, yi, xi, j] = 0.0
        return
    shape = wp.vec2i(a.frag.pix_to_face.shape[1], a.frag.pix_to_face.shape[2])
    uv, duv_dx, duv_dy = slot_uv(a.corners, f, a.frag.bary_coords[n, yi, xi, k], yi, xi, shape)
    texels_out[n, yi, xi, j] = mip_sample_channel(a.t, n, c, uv, duv_dx, duv_dy)


@wp.kernel(cuda_max_registers=SAMPLE_MAX_REGISTERS, enable_backward=False)
def _sample_uv_mipmap_slots(
    # In: fragments, corners (per face, see CornerTables), sampler
    a: SampleInputs,
    # Data out: (N, H, W, K * C) float view of a vector(C) array
    texels_out: wp.array4d(dtype=wp.float32),
):
    """:func:`_sample_uv_mipmap` with one thread per slot for all C channels: the
    face, barycentrics, corner rows, UV derivatives and footprint are read and
    computed once per slot instead of once per channel (the same float32 operations
    per channel: bit-equal outputs). H200, K=1 bench scene (``python
    scripts/gpu_mip_sampling_variants.py``, medians of 50): 0.179 ms per slot and
    channel, 0.106 per slot at 64 registers, 0.136 per slot uncapped. Its adjoint is
    :mod:`.mip_adjoint`'s (Warp's generated one is recorded from
    :func:`_sample_uv_mipmap` instead)."""
    n, yi, xi, k, f = patch_fragment(a.frag, wp.tid(), SAMPLE_PATCH_W)
    channels = a.t.p.maps.shape[3]
    if f < 0:
        if f == -1:
            zero_channels(texels_out, n, yi, xi, k * channels, channels)
        return
    p2f = a.frag.pix_to_face
    shape = wp.vec2i(p2f.shape[1], p2f.shape[2])
    uv, duv_dx, duv_dy = slot_uv(a.corners, f, a.frag.bary_coords[n, yi, xi, k], yi, xi, shape)
    for c in range(channels):
        texels_out[n, yi, xi, k * channels + c] = mip_sample_channel(a.t, n, c, uv, duv_dx, duv_dy)


class TexturesUVMipmap(UVTextures):
    """UV textures filtered as nvdiffrast's ``texture`` (mip-mapped, wrap/clamp/zero).

    Same inputs as :class:`~warpraster.shading.TexturesUV` (maps in PyTorch3D's
    row order by default, ``faces_uvs``, ``verts_uvs``); sampling interpolates the
    UVs, their analytic screen-space derivatives (from the projected vertices) and
    samples the pyramid, in one kernel.

    Args:
        maps: (N, Ht, Wt, C) (or (1, Ht, Wt, C) shared); float32 / vector
            ``wp.array`` (zero-copy) or NumPy.
        faces_uvs: (F, 3) indices into ``verts_uvs``.
        verts_uvs: (T, 2) UVs (float32 ``wp.array``, ``vec2`` ``wp.array`` or NumPy).
        filter_mode: see :func:`texture` (default ``linear-mipmap-linear``).
        boundary_mode: ``wrap`` (default), ``clamp`` or ``zero``.
        max_mip_level: limit of the pyramid (None: down to 1 x 1).
        flip_v: True (default): row 0 at v = 1 (PyTorch3D); False: nvdiffrast's rows.
        device, requires_grad: for NumPy inputs.

    :meth:`sample_textures` (the textures' one call) takes two more keyword
    options, see :meth:`_sample`: the pyramid is rebuilt from the base texels by
    every call (so texel updates are seen and gradients reach the base) unless
    ``rebuild_mipmaps=False`` (texels constant); ``corners`` preallocates the
    per-face tables.
    """

    def __init__(
        self,
        maps,
        faces_uvs,
        verts_uvs,
        *,
        filter_mode: str | FilterMode = "linear-mipmap-linear",
        boundary_mode: str | BoundaryMode = "wrap",
        max_mip_level: int | None = None,
        flip_v: bool = True,
        device=None,
        requires_grad: bool = False,
    ):
        device = first_device((maps, verts_uvs, faces_uvs), device)
        self.filter_mode, self.boundary_mode = _modes(filter_mode, boundary_mode, True)
        self.flip_v = bool(flip_v)
        self.pyramid = MipPyramid(
            maps,
            max_mip_level=max_mip_level if self.uses_mipmaps else 0,
            device=device,
            requires_grad=requires_grad,
        )
        self.maps = self.pyramid.maps
        self.device = self.pyramid.device
        self.uvs = face_uvs(faces_uvs, verts_uvs, self.device, requires_grad)
        # the per-call structs, made again only when their arrays or flags change
        self._fragments = LastStruct(PixelFragments)
        self._screen = LastStruct(ScreenFaces)
        self._corners = LastStruct(UVCorners)
        self._inputs = LastStruct(SampleInputs)
        self._adjoint = None  # the recorder of the sampling adjoint (mip_adjoint.py)
        #: Record Warp's generated adjoint of the sampling kernel instead of the
        #: hand-written one (tests and timings compare the two).
        self._generated_adjoint = False
        self._uv_lists = None  # CornerLists of faces_uvs, made by the first call needing them

    @property
    def sampler(self) -> MipSampler:
        """The kernel's :class:`MipSampler` (the pyramid's, with this texture's modes)."""
        return self.pyramid.sampler(self.filter_mode, self.boundary_mode, self.flip_v)

    @property
    def uses_mipmaps(self) -> bool:
        return self.filter_mode in (
            FilterMode.LINEAR_MIPMAP_NEAREST,
            FilterMode.LINEAR_MIPMAP_LINEAR,
        )

    def _sample(
        self,
        p2f,
        bary,
        faces,
        out,
        validate: bool,
        verts_ndc,
        perspective_correct,
        *,
        rebuild_mipmaps: bool = True,
        corners: CornerTables | None = None,
        corner_lists=None,
    ) -> wp.array:
        """Per-slot texels for :meth:`sample_textures` (its arguments, then the options).

        ``faces`` and ``verts_ndc`` are required by the mip-mapped modes (the UV
        derivatives come from them); ``validate`` checks their indices on the host.
        With ``out`` and ``validate=False`` the call allocates nothing (capturable).

        Args:
            rebuild_mipmaps: rebuild the pyramid from the base texels first.
            corners: preallocated :class:`CornerTables` for the faces (one per call
                recorded on a tape; allocated here when None).
            corner_lists: the :class:`~warpraster.shading.CornerLists` of ``faces``
                (static faces, e.g. a ``Renderer``'s): the corner tables' adjoint
                then gathers per vertex without atomics (the UV side always does,
                over lists of ``faces_uvs`` made by the first call that needs them).

        Returns:
            ``wp.array`` (N, H, W, K) of ``vector(C, float32)``; on a ``wp.Tape``
            gradients flow to ``maps`` (through the pyramid), ``verts_uvs``, the
            barycentrics and ``verts_ndc``.
        """
        check_map_batch(self.maps, p2f.shape[0])
        vn = None
        fcs = None
        if self.uses_mipmaps:
            if verts_ndc is None or faces is None:
                raise ValueError(
                    f"filter_mode {self.filter_mode.name.lower()} needs verts_ndc and faces "
                    "(the UV derivatives come from the projected vertices)"
                )
        if verts_ndc is not None and self.uses_mipmaps:  # base-level modes need no derivatives
            if faces is None:
                raise ValueError("faces must be given with verts_ndc")
            vn = as_vec3_array(verts_ndc, "verts_ndc", self.device)
            fcs = as_faces_array(faces, "faces", self.device)
            if fcs.shape[0] != self.faces_uvs.shape[0]:
                raise ValueError(
                    f"faces has {fcs.shape[0]} faces, faces_uvs has {self.faces_uvs.shape[0]}"
                )
            if validate:
                check_face_range(fcs, vn.shape[0], "faces", "vertices in verts_ndc")
        if rebuild_mipmaps and self.uses_mipmaps:
            self.pyramid.build()
        c = self.channels
        rg = bool(
            self.maps.requires_grad
            or self.verts_uvs.requires_grad
            or bary.requires_grad
            or (vn is not None and vn.requires_grad)
        )
        texels = alloc_vector_out(out, "out", tuple(p2f.shape), c, self.device, rg)
        nf = self.faces_uvs.shape[0]
        if corners is None or corners.num_faces != nf:
            corners = CornerTables(nf, self.device, rg)
        # vn, fcs left None (base-level modes) become placeholders, not read
        screen = self._screen(self.device, verts_ndc=vn, ndc_faces=fcs,
                              perspective_correct=int(bool(perspective_correct)),
                              with_derivatives=int(vn is not None))  # fmt: skip
        tape = active_tape()
        # the tables' adjoint as per-vertex gathers (mip_adjoint.record_corners_adjoint)
        # where every vertex array with a gradient has its corner lists
        hand = tape is not None and rg and not self._generated_adjoint
        if hand and vn is not None and vn.grad is not None:
            if corner_lists is None:
                hand = False
            else:
                corner_lists.check(fcs, vn.shape[0])
        if nf:
            wp.launch(
                _gather_corners,
                dim=9 * nf,
                inputs=[self.uvs, screen],
                outputs=corners.floats,
                device=self.device,
                record_tape=not hand,
            )
            if hand:
                from .mip_adjoint import record_corners_adjoint  # builds on this module

                if self._uv_lists is None:  # set-up: one host read of faces_uvs
                    self._uv_lists = CornerLists(self.faces_uvs, self.verts_uvs.shape[0])
                record_corners_adjoint(tape, corners, self._uv_lists, self.verts_uvs,
                                       corner_lists if vn is not None else None, vn)  # fmt: skip
        nn, h, w, k = p2f.shape
        corner_args = self._corners(self.device, uv=corners.uv, ndc=corners.ndc,
                                    derivatives=screen.with_derivatives,
                                    perspective_correct=screen.perspective_correct)  # fmt: skip
        # One thread per slot for all channels, its adjoint hand-written, one
        # thread per slot (mip_adjoint.py); with ``_generated_adjoint``, one thread
        # per slot and channel and Warp's generated adjoint of that kernel (the
        # tests' second truth for the hand-written one).
        frag = self._fragments(self.device, pix_to_face=p2f, bary_coords=bary)
        view = float_view(texels)
        dim = (nn, h, w, k * c)
        inputs = self._inputs(self.device, frag=frag, corners=corner_args, t=self.sampler)
        per_channel = self._generated_adjoint
        wp.launch(
            _sample_uv_mipmap if per_channel else _sample_uv_mipmap_slots,
            # flat over pixel patches (see the kernels)
            dim=patch_launch_size(nn, h, w, SAMPLE_PATCH_W, k * c if per_channel else k),
            inputs=[inputs],
            outputs=[view],
            device=self.device,
            record_tape=self._generated_adjoint,
        )
        if not self._generated_adjoint and tape is not None and view.grad is not None:
            if self._adjoint is None:
                from .mip_adjoint import SampleAdjoint  # builds on this module

                self._adjoint = SampleAdjoint()
            self._adjoint.record(tape, dim, inputs, view)
        return texels
