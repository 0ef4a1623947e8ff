"""Buffers of one rasterization configuration, and the replay of its launches.

:class:`RasterWorkspace` owns every buffer a render writes (face setup, bin
lists, the outputs, the backward's buffers), its :class:`~warpraster.settings.Tuning`,
a :class:`LaunchCache` (recorded launches replayed while their arguments are
unchanged) and a :class:`CallGraph` (repeated calls replayed as one graph).
"""

from __future__ import annotations

import math

import warp as wp

from ..backward import FaceGradBuffers
from ..fragments import FragmentRows, Fragments, allocate_fragments
from ..meshes import MeshArrays, mesh_arrays
from ..settings import RasterSettings, Tuning
from ..stores import FillState, WideRows, allocate_marks, fill_state
from . import binning
from .coverage import BinLists, FaceSetup, PassArgs, SplitBins
from .outputs import wide_views


def bin_shape(bin_size: int | None, faces_per_pixel: int) -> tuple[int, int]:
    """(rows, columns) of pixels of a bin.

    ``bin_size=b``: b x b. The naive pass (0) runs the same kernels over 16 x 16
    bins without face lists (one thread block reads the same face at a time).
    ``None``: 8 x 8 for K = 1, 4 x 8 (one 32-thread warp) for K > 1, the
    fastest measured (docs/PERF.md, v14 and "Design measurements").
    """
    if bin_size is None:
        return (8, 8) if faces_per_pixel == 1 else (4, 8)
    b = int(bin_size)
    return (b, b) if b > 0 else (16, 16)


def default_max_faces_per_bin(num_faces: int) -> int:
    """PyTorch3D's default capacity, capped at the face count (a list never needs more)."""
    return max(1, min(num_faces, max(10000, num_faces // 5)))


def array_key(a: wp.array) -> tuple:
    """What a kernel sees of an array: its address, shape, strides and type."""
    return (a.ptr, a.shape, a.strides, a.dtype)


def _field(v):
    """A struct field as compared: an array itself (by identity), a nested struct's
    fields, a Warp vector or matrix as a tuple (its values: read anew per access)."""
    if isinstance(v, wp.array) or v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(getattr(v, "_cls", None), "vars"):
        return _bound(v)
    try:
        return tuple(v)
    except TypeError:
        return v


def _bound(o) -> tuple:
    """What ``o`` holds now: its attributes' values (a Warp struct's fields, nested)."""
    cls = getattr(o, "_cls", None)
    if cls is not None and hasattr(cls, "vars"):  # a Warp struct instance
        return tuple(_field(getattr(o, name)) for name in cls.vars)
    values = tuple(vars(o).values())
    return values + tuple(_bound(v) for v in values if hasattr(getattr(v, "_cls", None), "vars"))


def _same(a, b) -> bool:
    """The same object, or equal plain values (numbers, strings, tuples of them)."""
    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, wp.array):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same, a, b))
    return isinstance(a, (bool, int, float, str)) and a == b


class StateWatch:
    """A version number that changes whenever an attribute of the watched objects
    (cameras, a shader, its lights, materials and blend parameters, textures) is
    rebound, or the objects themselves are others: part of a replayed graph's key,
    since a graph bakes in what these objects held at its capture (a replay after
    ``shader.lights = ...`` would draw the old lights).

    Compares what :func:`_bound` finds (kept, so no identity can be reused
    meanwhile): arrays and objects by identity (an array assigned into in place is
    the same object: its new values are read by any launch, replayed or not; a
    rebound attribute is another), numbers, strings and vectors by value.
    """

    def __init__(self):
        self._seen: list | None = None
        self.version = 0

    def __call__(self, *objects) -> int:
        now = [(o, None if o is None else _bound(o)) for o in objects]
        seen = self._seen
        if (
            seen is None
            or len(seen) != len(now)
            or not all(a is b and _same(x, y) for (a, x), (b, y) in zip(seen, now, strict=True))
        ):
            self._seen = now
            self.version += 1
        return self.version


def _optional_key(a: wp.array | None) -> tuple | None:
    return None if a is None else array_key(a)


class LaunchCache:
    """Recorded launches (``wp.Launch``) of one workspace, replayed while their
    arguments are unchanged.

    Saves host time only (the device work is the same): packing a launch's
    arguments costs tens of microseconds, which an eager render would pay for
    each of its kernels on every call. Arrays are compared by address, shape,
    strides and type; a struct argument needs an explicit ``key``.
    """

    def __init__(self, device):
        self.device = device
        self._cmds: dict[str, tuple] = {}

    def __call__(self, name, kernel, dim, inputs, outputs=(), *, key=None, block_dim=None):
        if key is None:
            key = tuple(array_key(a) if isinstance(a, wp.array) else a for a in (*inputs, *outputs))
        key = (kernel, dim, block_dim, key)
        hit = self._cmds.get(name)
        if hit is None or hit[0] != key:
            kw = {} if block_dim is None else {"block_dim": block_dim}
            cmd = wp.launch(
                kernel, dim=dim, inputs=list(inputs), outputs=list(outputs), device=self.device,
                record_tape=False, record_cmd=True, **kw,
            )  # fmt: skip
            hit = self._cmds[name] = (key, cmd)
        hit[1].launch()


def graphs_enabled(device, mode: bool | None) -> bool:
    """Whether a call may be captured into a CUDA graph and replayed on ``device``:
    ``mode`` None: on CUDA (True: on the cpu device too; False: never); not while
    a capture is open, not on the legacy default stream (a graph cannot capture it:
    torch's default stream), and on CUDA only with the memory pool (the launches
    allocate stream-ordered scratch, e.g. the prefix sum's).

    Read live every call, nothing kept: the device's current stream, its memory
    pool flag (``device.is_mempool_enabled``, the field ``wp.is_mempool_enabled``
    returns and ``wp.set_mempool_enabled`` writes, read without that function's
    ``wp.init()`` and device lookup) and ``device.is_capturing`` (last: on CUDA a
    driver call)."""
    if not (device.is_cuda if mode is None else mode):
        return False
    if device.is_cuda and (device.stream.cuda_stream == 0 or not device.is_mempool_enabled):
        return False
    return not device.is_capturing


class CallGraph:
    """A workspace's render launches captured once and replayed as one graph.

    A call whose key (its arrays by address, shape, strides and type; its flags;
    the module settings) equals the previous call's is captured, then replayed
    while the key stays the same: one graph launch instead of ~10 kernel
    launches and memsets from Python. A first call, or one whose key changed,
    launches as usual (so inputs that change every call never pay a capture).
    A graph keeps the pointers it saw: what it reads is whatever the arrays
    hold at replay, as for any launch.
    """

    def __init__(self, device):
        self.device = device
        self._seen = None
        self._key = None
        self._graph = None

    def enabled(self, mode: bool | None) -> bool:
        """Whether to capture/replay (``mode`` is ``Tuning.call_graphs``: None = on
        CUDA, where it saves the host time of ~10 launches per call; True = on
        every device, the cpu device's graphs being experimental in Warp 1.19)."""
        return graphs_enabled(self.device, mode)

    def __call__(self, key, launch_all, mode: bool | None = None) -> None:
        if not self.enabled(mode):
            launch_all()
            return
        if self._graph is not None and key == self._key:
            wp.capture_launch(self._graph)
            return
        if key == self._seen:
            # the first call with this key loaded every module it launches
            with wp.ScopedCapture(device=self.device, force_module_load=False) as cap:
                launch_all()
            self._graph, self._key = cap.graph, key
            wp.capture_launch(self._graph)
            return
        self._graph = self._key = None
        self._seen = key
        launch_all()


class SettingsViews:
    """The sizing settings of a workspace's ``settings`` as read-only attributes."""

    settings: RasterSettings

    @property
    def image_size(self) -> tuple[int, int]:
        return self.settings.image_size

    @property
    def faces_per_pixel(self) -> int:
        return self.settings.faces_per_pixel

    @property
    def bin_size(self) -> int | None:
        return self.settings.bin_size

    @property
    def binned(self) -> bool:
        return self.settings.binned

    @property
    def deterministic(self) -> bool:
        return self.settings.deterministic


class RasterWorkspace(SettingsViews):
    """Buffers of one rasterization configuration, allocated once and reused.

    A render call that is given a workspace allocates nothing and reads nothing
    back to the host, so it can be captured in a CUDA graph. The fragments it
    returns are this workspace's output arrays: keep one workspace per frame
    recorded on a tape (a later call overwrites them). With ``deterministic``
    the backward to the vertices is atomic-free and bit-identical run after run
    (see :mod:`warpraster.backward`).

    Args:
        num_meshes: N, images per call.
        num_faces: F, packed faces per call (a capacity: faces beyond every mesh
            range are ignored).
        settings: the :class:`~warpraster.settings.RasterSettings` of the calls
            (their image size, K, bins and backward strategy size the buffers;
            the per-call flags such as ``blur_radius`` may change between calls).
            Or give ``image_size``, ``faces_per_pixel``, ``bin_size``,
            ``max_faces_per_bin`` and ``deterministic`` as keywords instead.
        device: Warp device.
        requires_grad: allocate the outputs' gradients (for a ``wp.Tape``).
        tuning: :class:`~warpraster.settings.Tuning` (default: the measured
            defaults); ``ws.tuning`` may be reassigned between calls.
        allocate_outputs: False for a workspace whose calls always pass their
            own output arrays (``out=``; the torch adapter): ``fragments`` is None.
        write_dists: False for a caller that never reads ``fragments.dists``
            (the sensor's sharp pass): the output pass neither computes nor
            stores them, and they hold NaN (so a blend that reads them anyway
            shows it). Calls with ``out=`` still write theirs. Gradients are
            unaffected: the backward recomputes each slot's values from the faces.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        *,
        num_meshes: int,
        num_faces: int,
        settings: RasterSettings | None = None,
        image_size=None,
        faces_per_pixel: int | None = None,
        bin_size: int | None = None,
        max_faces_per_bin: int | None = None,
        device=None,
        requires_grad: bool = False,
        deterministic: bool = False,
        tuning: Tuning | None = None,
        allocate_outputs: bool = True,
        write_dists: bool = True,
    ):
        settings = RasterSettings.sizing(
            settings, image_size=image_size, faces_per_pixel=faces_per_pixel, bin_size=bin_size,
            max_faces_per_bin=max_faces_per_bin, deterministic=deterministic,
        )  # fmt: skip
        self.settings = settings
        self.tuning = Tuning() if tuning is None else tuning
        h, w = settings.image_size
        self.device = wp.get_device(device)
        self.num_meshes = int(num_meshes)
        self.num_faces = int(num_faces)
        self.requires_grad = bool(requires_grad)
        self.write_dists = bool(write_dists)
        f_alloc = max(self.num_faces, 1)
        self.face_mesh = wp.empty(f_alloc, dtype=wp.int32, device=self.device)
        self.face_bbox = wp.empty(f_alloc, dtype=wp.vec4, device=self.device)
        self.face_verts = wp.empty(f_alloc, dtype=wp.mat33, device=self.device)
        # the split-partner index of meshes without split faces (-1 for all)
        self.no_neighbors = wp.full(f_alloc, -1, dtype=wp.int32, device=self.device)
        # the split flag of meshes without one (0: the small-face pass may run)
        self.no_split_flag = wp.zeros(1, dtype=wp.int32, device=self.device)
        self.bin_h, self.bin_w = bin_shape(settings.bin_size, settings.faces_per_pixel)
        self.bins_y, self.bins_x = binning.bin_grid(h, w, self.bin_h, self.bin_w)
        num_bins = self.num_meshes * self.bins_y * self.bins_x
        if self.binned:
            cap = settings.max_faces_per_bin
            blur_px = math.sqrt(settings.blur_radius) * min(h, w) / 2.0  # NDC 2 = short side
            capacity = binning.default_capacity(
                self.num_faces, num_bins, blur_px, self.bin_h, self.bin_w
            )
            if cap is None:
                self.max_faces_per_bin = max(self.num_faces, 1)
            else:
                self.max_faces_per_bin = cap
                capacity = min(num_bins * cap, capacity)
            # the counters zeroed before each call, in one buffer (one memset):
            # bin counts, bin cursors, split-face marks, the overflow count, any mark
            self.counters = wp.zeros(3 * num_bins + 2, dtype=wp.int32, device=self.device)
            self.bin_count = self.counters[:num_bins]
            self.bin_cursor = self.counters[num_bins : 2 * num_bins]
            self.bin_split = self.counters[2 * num_bins : 3 * num_bins]
            self.overflow = self.counters[3 * num_bins : 3 * num_bins + 1]
            # 1 when any bin is marked in bin_split
            self.any_split_bin = self.counters[3 * num_bins + 1 :]
            self.bin_offset = wp.zeros(num_bins, dtype=wp.int32, device=self.device)
            self.bin_faces = wp.zeros(capacity, dtype=wp.int32, device=self.device)
        else:
            self.max_faces_per_bin = 0
            self.overflow = self.counters = wp.zeros(1, dtype=wp.int32, device=self.device)
            self.bin_count = self.bin_offset = self.bin_cursor = self.bin_faces = wp.zeros(
                1, dtype=wp.int32, device=self.device
            )
            self.bin_split = self.any_split_bin = self.bin_count
        self.fragments = None
        if allocate_outputs:
            self.fragments = allocate_fragments(
                self.num_meshes, h, w, self.faces_per_pixel, self.device, self.requires_grad,
                overflow_count=self.overflow if self.binned else None,
            )  # fmt: skip
            if not self.write_dists:
                self.fragments.dists.fill_(float("nan"))
        # the workspace's own outputs: which groups of four slots an earlier call
        # left holding values (all at first: the first call writes every slot)
        self.fill_held = None
        if allocate_outputs and self.faces_per_pixel % 4 == 0:
            groups = self.num_meshes * h * w * self.faces_per_pixel // 4
            self.fill_held = allocate_marks(groups, self.device)
        # K = 1 binned: one (depth, face) key per pixel for the small-face pass
        key_count = self.num_meshes * h * w if self.faces_per_pixel == 1 and self.binned else 1
        self.depth_keys = wp.empty(key_count, dtype=wp.uint64, device=self.device)
        # the same bytes: the empty key is all ones, so one byte memset clears them
        # (``fill_`` of 64-bit values launches a fill kernel)
        self.depth_key_bytes = wp.array(ptr=self.depth_keys.ptr, dtype=wp.uint8,
                                        shape=(8 * key_count,), device=self.device)  # fmt: skip
        self.launches = LaunchCache(self.device)
        self.call_graph = CallGraph(self.device)
        self._pass = None
        self._marks_stale = False  # see pass_for
        self._meshes = None
        self.face_grads = FaceGradBuffers(
            self.num_faces, self.device, self.deterministic, self.shape
        )

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(N, H, W, K) of the outputs."""
        return (self.num_meshes, *self.settings.image_size, self.settings.faces_per_pixel)

    def pass_for(self, meshes, settings: RasterSettings, out: Fragments | None = None, *,
                 seeded: bool, split_bins: bool, split_only: bool):  # fmt: skip
        """The raster passes' argument struct for these meshes, settings and output
        arrays (default: the workspace's), and its key; rebuilt only when one of
        them (or the tuning) changed: it packs ~30 fields."""
        out = self.fragments if out is None else out
        key = (
            _optional_key(meshes.clipped_faces_neighbor_idx),
            _optional_key(meshes.split_flag),
            array_key(meshes.mesh_to_face_first_idx),
            array_key(meshes.num_faces_per_mesh),
            settings.blur_radius, settings.perspective_correct,
            settings.clip_barycentric_coords, bool(seeded), bool(split_bins), bool(split_only),
            self.tuning,
            array_key(out.pix_to_face), array_key(out.zbuf), array_key(out.bary_coords),
            array_key(out.dists),
        )  # fmt: skip
        if self._pass is None or self._pass[1] != key:
            own = out is self.fragments
            ps = make_pass(meshes, self, settings, out.pix_to_face, out.zbuf, out.bary_coords,
                           out.dists, own=own)  # fmt: skip
            if own:
                # a call over the workspace's own outputs without the marks (the
                # tuning's, or K not a multiple of 4) wrote them without updating
                # the marks: trust them again only after every slot is rewritten
                if ps.fill.on != 0 and self._marks_stale:
                    self.refill_empty_slots()
                self._marks_stale = ps.fill.on == 0
            ps.seeded = int(seeded)
            ps.split.on = int(split_bins)
            ps.split.only = int(split_only)
            self._pass = (ps, key)
        return self._pass

    def meshes_for(self, meshes) -> tuple[MeshArrays, tuple]:
        """The face set-up's :class:`~warpraster.meshes.MeshArrays` of these meshes and
        its key; rebuilt only when one of the four arrays changed (a call usually
        brings a new :class:`~warpraster.meshes.PackedMeshes` of the same arrays)."""
        arrays = (meshes.verts, meshes.faces, meshes.mesh_to_face_first_idx,
                  meshes.num_faces_per_mesh)  # fmt: skip
        key = tuple(array_key(a) for a in arrays)
        if self._meshes is None or self._meshes[1] != key:
            self._meshes = (mesh_arrays(*arrays), key)
        return self._meshes

    def fill_marks(self) -> FillState | None:
        """The last call's :class:`~warpraster.stores.FillState` of the output
        pass (after the call, a group's mark is 1 exactly where it holds faces),
        or None when that pass kept none (not the workspace's own outputs, K not
        a multiple of 4, or ``Tuning.fill_empty_once`` off)."""
        if self._pass is None or self._pass[0].fill.on == 0:
            return None
        return self._pass[0].fill

    def refill_empty_slots(self) -> None:
        """Makes the next call write every slot of the workspace's fragments,
        empty ones included: call it after writing into them (a call otherwise
        leaves an empty group of four slots that the call before filled alone)."""
        if self.fill_held is not None:
            self.fill_held.fill_(1)

    def matches(self, num_meshes: int, num_faces: int, settings: RasterSettings, device) -> bool:
        """Whether this workspace serves a call of this size, settings and device."""
        mine, theirs = self.settings, settings
        return (
            self.num_meshes == num_meshes
            and self.num_faces == num_faces
            and mine.image_size == theirs.image_size
            and mine.faces_per_pixel == theirs.faces_per_pixel
            and mine.bin_size == theirs.bin_size
            and self.device == wp.get_device(device)
        )


def make_pass(meshes, ws: RasterWorkspace, settings: RasterSettings, pix_to_face, zbuf, bary=None,
              dists=None, *, own: bool = False) -> PassArgs:  # fmt: skip
    """The argument struct of the raster passes (outputs viewed as (N*H*W, K) rows;
    their 16-byte views too when the tuning and K allow; ``own``: the outputs are
    the workspace's fragments, whose fill marks it keeps)."""
    n, h, w, k = ws.shape
    ps = PassArgs()
    face = FaceSetup()
    face.mesh = ws.face_mesh
    face.bbox = ws.face_bbox
    face.verts = ws.face_verts
    ps.face = face
    ps.neighbor = meshes.clipped_faces_neighbor_idx
    if ps.neighbor is None:
        ps.neighbor = ws.no_neighbors
    ps.mesh_first = meshes.mesh_to_face_first_idx
    ps.mesh_count = meshes.num_faces_per_mesh
    ps.height = h
    ps.width = w
    ps.faces_per_pixel = k
    ps.blur_radius = settings.blur_radius
    ps.perspective_correct = int(settings.perspective_correct)
    ps.clip_barycentric_coords = int(settings.clip_barycentric_coords)
    ps.naive = int(not ws.binned)
    bins = BinLists()
    bins.h = ws.bin_h
    bins.w = ws.bin_w
    bins.rows = ws.bins_y
    bins.cols = ws.bins_x
    bins.count = ws.bin_count
    bins.offset = ws.bin_offset
    bins.faces = ws.bin_faces
    bins.max_per_bin = max(ws.max_faces_per_bin, 1)
    bins.overflow = ws.overflow
    ps.bins = bins
    split = SplitBins()
    split.on = 0
    split.only = 0
    split.max_sorted = ws.tuning.max_sorted_bin
    split.marked = ws.bin_split
    split.any = ws.any_split_bin
    split.small_off = ws.no_split_flag if meshes.split_flag is None else meshes.split_flag
    ps.split = split
    ps.seeded = 0
    ps.keys = ws.depth_keys
    out = FragmentRows()
    out.pix_to_face = pix_to_face.reshape((-1, k))
    out.zbuf = zbuf.reshape((-1, k))
    ps.wide = 0
    # the caller's own arrays (not the workspace's) always get theirs
    ps.write_dists = int(bary is not None and (ws.write_dists or not own))
    if bary is not None:
        out.bary = bary.reshape((-1, k))
        out.dists = dists.reshape((-1, k))
        views = wide_views(pix_to_face, zbuf, bary, dists) if ws.tuning.wide_outputs else None
        if views is not None:
            ps.wide = 1
            out4 = WideRows()
            out4.pix_to_face, out4.zbuf, out4.bary, out4.dists = views
            ps.out4 = out4
    ps.fill = fill_state(ws.fill_held, own and ps.wide != 0 and ws.tuning.fill_empty_once,
                         ws.device)  # fmt: skip
    ps.out = out
    return ps
