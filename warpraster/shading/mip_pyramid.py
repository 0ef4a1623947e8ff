"""Mip pyramids: levels 1..L of a batch of maps, built on the device, with the
build's hand-written adjoint.

:class:`MipPyramid` / :func:`build_mipmaps`: levels 1..L of a batch of maps
``(N, Ht, Wt, C)``, built on the device by 2 x 2 box filtering (a 1 x 2 pair
once one extent is 1), level l of size ``(max(Ht >> l, 1), max(Wt >> l, 1))``,
as nvdiffrast (an odd extent > 1 cannot be halved: limit ``max_mip_level``).
The build kernels are recorded on a ``wp.Tape``: gradients reaching a level
flow back to the base texels. :class:`MipSampler` is what the sampling kernels
(:mod:`.mip_sampling`, :mod:`.mip_slots`) read of a pyramid and its options.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..backward.tape import active_tape, record_func
from ..grad_buffers import clear_if_recording
from ..structs import new_struct
from .textures import as_maps, first_device

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "MipLevels",
    "MipPyramid",
    "MipSampler",
    "build_mipmaps",
    "mip_level_sizes",
    "mip_sampler",
]


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
            record_func(tape, self._build_backward, arrays=[self.maps, self.levels])
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


# ----------------------------------------------------------------------------- sampler
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
