"""The clip pass's device buffers (:class:`ClipBuffers`), allocated once and
reused, and the structs its kernels read of them; the face cases."""

from __future__ import annotations

import operator

import warp as wp

from ..meshes import MeshArrays, PackedMeshes, mesh_arrays
from ..scan import ExclusiveScan
from ..stores import fill_state
from ..structs import StructCache, new_struct

__all__ = ["ClipBuffers", "ClipMap", "ClipSettings", "ClippedFaces", "FaceCases", "SlotViews"]


# Face cases (values are stored in ClipBuffers.face_case).
_DROP = wp.constant(0)
_KEEP = wp.constant(1)
_TRIANGLE = wp.constant(3)
_QUAD = wp.constant(4)


@wp.struct
class FaceCases:
    """What :func:`_classify_faces` decides per input face f (scratch of
    :class:`ClipBuffers`, under the same names): ``face_case`` (_DROP, _KEEP,
    _TRIANGLE or _QUAD), ``face_pivot`` (the corner that is p1), ``face_w3`` (the
    detached p1->p3 weight), ``counts``
    (F + 1,) output faces (``counts[F]`` stays 0) and ``offsets`` (F + 1,) their
    exclusive scan: face f's first clipped slot; ``offsets[F]`` is the total;
    ``any_split`` (1,) set to 1 when a face is split (zeroed before);
    ``identity`` (1,) 1 when the clipped list last written is the input list
    unchanged (every face kept), 0 otherwise or when not known."""

    face_case: wp.array(dtype=wp.int32)
    face_pivot: wp.array(dtype=wp.int32)
    face_w3: wp.array(dtype=wp.float32)
    counts: wp.array(dtype=wp.int32)
    offsets: wp.array(dtype=wp.int32)
    any_split: wp.array(dtype=wp.int32)
    identity: wp.array(dtype=wp.int32)


@wp.struct
class ClippedFaces:
    """The clipped list's topology (capacity 2F, outputs of :class:`ClipBuffers`):
    ``faces`` (2F, 3) vertex indices, ``to_unclipped`` (2F,) the input face of
    each clipped face (-1 past the total), ``neighbor`` (2F,) the other half of a
    split quad (-1: none)."""

    faces: wp.array2d(dtype=wp.int32)
    to_unclipped: wp.array(dtype=wp.int32)
    neighbor: wp.array(dtype=wp.int32)


@wp.struct
class ClipSettings:
    """One :func:`clip_faces` call's settings as its kernels read them: the plane
    ``z_clip`` (clipping only where ``do_z_clip`` != 0), ``cull_rule`` (0: no
    culling, else a :class:`FrustumCullRule`) and ``perspective_correct`` (1: the crossings'
    x, y interpolated on ``xy * z``)."""

    z_clip: float
    do_z_clip: int
    cull_rule: int
    perspective_correct: int


@wp.struct
class ClipMap:
    """What the map back from the clipped list reads (views of :class:`ClipBuffers`):
    ``to_unclipped`` (2F,) the input face of each clipped face, ``face_case`` (F,)
    each input face's case and ``conversion`` (2F,) ``mat33``, ``b_original =
    M @ b_clipped``, ``any_split`` (1,) whether any face was split, ``identity``
    (1,) whether the list is the input's (:class:`FaceCases`). Shared by the
    copying and the in-place map back and their adjoints."""

    to_unclipped: wp.array(dtype=wp.int32)
    face_case: wp.array(dtype=wp.int32)
    conversion: wp.array(dtype=wp.mat33)
    any_split: wp.array(dtype=wp.int32)
    identity: wp.array(dtype=wp.int32)


def _run_to_run(fn, name: str, *, enable_backward: bool = False) -> wp.Kernel:
    """``fn`` as a kernel in Warp's RUN_TO_RUN mode (module of its own), for
    ``deterministic=True``: float atomics become a scatter, sort and fixed-order sum."""
    options = {"fuse_fp": False, "deterministic": wp.DeterministicMode.RUN_TO_RUN}
    return wp.kernel(fn, name=name, enable_backward=enable_backward, module="unique",
                     module_options=options)  # fmt: skip


@wp.struct
class SlotViews:
    """A contiguous int32 slot array (N, H, W, K) as kernel argument: ``flat``
    (N H W K,), ``wide`` the same memory as int4 (the whole groups of four), and
    ``aligned`` (1: ``wide`` may be read and written as 16-byte words)."""

    flat: wp.array(dtype=wp.int32)
    wide: wp.array(dtype=wp.vec4i)
    aligned: int


# ----------------------------------------------------------------------------- buffers
class ClipBuffers:
    """Device buffers of one clipping configuration, allocated once and reused.

    For V input vertices, F input faces and N meshes. Outputs of :func:`clip_faces`
    (the clipped list has at most 2F faces):

    Attributes:
        verts: vec3 (V + 2F,): input vertices, then each input face f's crossings at
            ``V + 2f`` (p4) and ``V + 2f + 1`` (p5). Carries gradients.
        faces: int32 (2F, 3): clipped faces, indices into ``verts``.
        mesh_to_face_first_idx: int32 (N,): first clipped face of each mesh.
        num_faces_per_mesh: int32 (N,): clipped faces of each mesh.
        clipped_faces_neighbor_idx: int32 (2F,): the other half of a split quad, -1 none.
        faces_clipped_to_unclipped_idx: int32 (2F,): input face of each clipped face
            (-1 past the clipped total).
        barycentric_conversion: mat33 (2F,): ``b_original = M @ b_clipped`` (identity
            for unchanged faces). Carries gradients.
        num_clipped_faces: int32 (1,): the clipped total (a view; read it only
            outside a captured graph).
        packed: the clipped list as a :class:`~warpraster.meshes.PackedMeshes` (a
            view of these arrays).

    One :func:`clip_faces` call overwrites them: keep one buffers object per call
    recorded on a ``wp.Tape``.

    ``static_faces=True`` promises that every call passes the same faces and mesh
    ranges (the same arrays, their contents unchanged; after changing them in
    place, call :meth:`faces_changed`). The clip pass then skips its work when it
    would rewrite what the buffers hold: when no vertex is behind the plane and
    the list it last wrote kept every face (:func:`clip_faces`).
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        num_verts: int,
        num_faces: int,
        num_meshes: int,
        device=None,
        *,
        requires_grad: bool = True,
        static_faces: bool = False,
    ):
        sizes = []
        for name, value in (
            ("num_verts", num_verts),
            ("num_faces", num_faces),
            ("num_meshes", num_meshes),
        ):
            try:
                size = operator.index(value)
            except TypeError:
                raise TypeError(f"{name} must be an int, got {value!r}") from None
            if isinstance(value, bool) or size < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
            sizes.append(size)
        self.device = wp.get_device(device)
        self.num_verts, self.num_faces, self.num_meshes = sizes
        self.requires_grad = bool(requires_grad)
        self.static_faces = bool(static_faces)
        v, f, n, d = *sizes, self.device
        cap = 2 * f
        self.verts = wp.zeros(v + cap, dtype=wp.vec3, device=d, requires_grad=self.requires_grad)
        self.faces = wp.zeros((cap, 3), dtype=wp.int32, device=d)
        self.mesh_to_face_first_idx = wp.zeros(n, dtype=wp.int32, device=d)
        self.num_faces_per_mesh = wp.zeros(n, dtype=wp.int32, device=d)
        self.clipped_faces_neighbor_idx = wp.full(cap, -1, dtype=wp.int32, device=d)
        self.faces_clipped_to_unclipped_idx = wp.full(cap, -1, dtype=wp.int32, device=d)
        self.barycentric_conversion = wp.zeros(
            cap, dtype=wp.mat33, device=d, requires_grad=self.requires_grad
        )
        # Scratch: per input face, and the scan (counts[F] stays 0, so offsets[F] = total).
        self.face_case = wp.zeros(f, dtype=wp.int32, device=d)
        self.face_pivot = wp.zeros(f, dtype=wp.int32, device=d)
        self.face_w3 = wp.zeros(f, dtype=wp.float32, device=d)
        self.counts = wp.zeros(f + 1, dtype=wp.int32, device=d)
        self.offsets = wp.zeros(f + 1, dtype=wp.int32, device=d)
        self.num_clipped_faces = self.offsets[f:]
        self.any_split = wp.zeros(1, dtype=wp.int32, device=d)
        self.identity = wp.zeros(1, dtype=wp.int32, device=d)
        # 1: this call's clip pass must run (static_faces; see clip_faces), and the
        # scan of the pass that may be skipped (its scratch made here)
        self.pass_needed = wp.zeros(1, dtype=wp.int32, device=d)
        self.scan = ExclusiveScan(f + 1, d) if self.static_faces else None
        # the same arrays as kernel arguments
        self.cases = new_struct(FaceCases, d, face_case=self.face_case, face_pivot=self.face_pivot,
                                face_w3=self.face_w3, counts=self.counts,
                                offsets=self.offsets, any_split=self.any_split,
                                identity=self.identity)  # fmt: skip
        self.clipped = new_struct(ClippedFaces, d, faces=self.faces,
                                  to_unclipped=self.faces_clipped_to_unclipped_idx,
                                  neighbor=self.clipped_faces_neighbor_idx)  # fmt: skip
        self.map = new_struct(ClipMap, d, to_unclipped=self.faces_clipped_to_unclipped_idx,
                              face_case=self.face_case,
                              conversion=self.barycentric_conversion,
                              any_split=self.any_split, identity=self.identity)  # fmt: skip
        self._inputs = None  # (key, MeshArrays) of the last call's input arrays
        self.no_fill = fill_state(None, False, d)  # every map-back slot written
        self._slot_views = {}  # slot array (ptr, shape) -> its SlotViews
        self._structs = StructCache()  # kept by _kept

    def slot_views(self, slots: wp.array) -> SlotViews:
        """A contiguous int32 slot array as :class:`SlotViews` (made once per array)."""
        key = (slots.ptr, slots.shape)
        views = self._slot_views.get(key)
        if views is None:
            views = self._slot_views[key] = SlotViews()
            views.flat = slots.flatten()
            views.wide = wp.array(ptr=slots.ptr, dtype=wp.vec4i, shape=(slots.size // 4,),
                                  device=slots.device)  # fmt: skip
            views.aligned = int(slots.ptr % 16 == 0)
        return views

    def _kept(self, name: str, cls, **fields):
        """A ``cls`` (a ``wp.struct``) of ``fields``, made again only when one changed
        (an array: its pointer or shape): setting a struct's array field costs
        microseconds, and the in-place map back's structs are the same call after call."""
        key = tuple((v.ptr, v.shape) if isinstance(v, wp.array) else v for v in fields.values())
        return self._structs.get(name, key, lambda: new_struct(cls, self.device, **fields))

    def inputs_for(self, verts: wp.array, faces: wp.array, first: wp.array, count: wp.array
                   ) -> MeshArrays:  # fmt: skip
        """The input arrays as one kernel argument, rebuilt only when one changed."""
        arrays = (verts, faces, first, count)
        key = tuple((a.ptr, a.shape, a.strides) for a in arrays)
        if self._inputs is None or self._inputs[0] != key:
            if self._inputs is None or self._inputs[0][1:] != key[1:]:
                self.faces_changed()  # other faces or mesh ranges (not only vertices)
            self._inputs = (key, mesh_arrays(*arrays))
        return self._inputs[1]

    def faces_changed(self) -> None:
        """Forgets what the clipped list held (the next call runs the whole pass):
        for ``static_faces`` buffers whose faces or mesh ranges changed in place."""
        self.identity.zero_()

    @property
    def packed(self):
        """The clipped list as the rasterizer's :class:`~warpraster.meshes.PackedMeshes`."""
        return PackedMeshes(
            self.verts,
            self.faces,
            self.mesh_to_face_first_idx,
            self.num_faces_per_mesh,
            self.clipped_faces_neighbor_idx,
            has_neighbors=True,
            split_flag=self.any_split,
        )


def _check_array(arr, name: str, dtype, ndim: int, shape, device) -> None:
    if not isinstance(arr, wp.array):
        raise TypeError(f"{name} must be a wp.array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.ndim != ndim:
        raise TypeError(
            f"{name} must be a {ndim}-d wp.array of {wp.types.type_repr(dtype)}, "
            f"got {arr.ndim}-d of {wp.types.type_repr(arr.dtype)}"
        )
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(arr.shape)}")
    if wp.get_device(arr.device) != device:
        raise ValueError(f"{name} is on {arr.device}, the clip buffers on {device}")
