"""The shaders' buffers and per-face corner tables: what a shader call writes
before the pixel kernel reads it.

:class:`ShadingBuffers` holds a shader call's preallocated outputs (the image,
per-slot colours and texels, vertex and face normals, the per-face tables, the
argument structs); :class:`FaceTables` the per-face corner tables
(positions, normals, colours) that :func:`gather_faces` fills from per-vertex
arrays, with its adjoint (Warp's generated one, or a hand-written gather over
:class:`~warpraster.shading.corner_lists.CornerLists`: no atomics).
"""

from __future__ import annotations

from functools import cached_property

import warp as wp

from ..backward.tape import active_tape, record_func
from ..structs import StructCache, new_struct, placeholder
from .corner_lists import CornerLists, VertexCorners
from .fused import ImageGrad, _grad_or, with_grad
from .mipmap import CornerTables
from .modes import ShadingMode, TexelSource
from .params import component, float_rows
from .pixel_args import FaceCorners

wp.set_module_options({"fuse_fp": False})

__all__ = ["FaceTables", "ShadingBuffers", "gather_faces"]


# ----------------------------------------------------------------------------- gather
@wp.kernel
def _gather_faces_kernel(
    # Mesh in:
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    normals: wp.array(dtype=wp.vec3),  # per vertex (Phong) or per face (flat)
    mode: int,
    texel_source: int,
    vert_colors: wp.array(dtype=wp.vec3),
    # Data out: the (F,) mat33 corner tables as (9 F,) floats, value 9 f + 3 r + c
    # holding component c of corner r of face f
    pos_out: wp.array(dtype=float),
    nrm_out: wp.array(dtype=float),
    col_out: wp.array(dtype=float),
):
    """One thread per table float: consecutive threads store consecutive floats
    (a thread per face storing its 36-byte rows issued 27 strided 4-byte stores,
    each touching 32 sectors: on an H200 the gather took 0.049 ms for 164k faces,
    L2-bound at 2% of DRAM bandwidth)."""
    j = wp.tid()
    f = j // 9
    rc = j - 9 * f
    r = rc // 3
    c = rc - 3 * r
    i = faces[f, r]
    pos_out[j] = component(verts[i], c)
    if mode == ShadingMode.FLAT:
        nrm_out[j] = wp.where(r == 0, component(normals[f], c), 0.0)
    else:
        nrm_out[j] = component(normals[i], c)
    if texel_source == TexelSource.VERTEX:
        col_out[j] = component(vert_colors[i], c)


@wp.func
def _wanted_row(rows: wp.array(dtype=wp.vec3), r: int, wanted: int):
    """``rows[r]``, or zero (not read) where not ``wanted``."""
    if wanted != 0:
        return rows[r]
    return wp.vec3(0.0)


@wp.func
def _add_wanted(grad_out: wp.array(dtype=wp.vec3), i: int, g: wp.vec3, wanted: int):
    """``grad_out[i] += g`` where ``wanted`` (one writer per row: no atomic)."""
    if wanted != 0:
        grad_out[i] = grad_out[i] + g


@wp.kernel(enable_backward=False)
def _gather_faces_adjoint(
    # Mesh in:
    corners: VertexCorners,
    # Gradient in: the tables' gradients as (3F,) rows (row 3 f + c: corner c of
    # face f, as the list's entries), and which vertex rows to write
    pos_rows: wp.array(dtype=wp.vec3),
    nrm_rows: wp.array(dtype=wp.vec3),
    col_rows: wp.array(dtype=wp.vec3),
    want: wp.vec3i,  # (positions, vertex normals (not flat shading), vertex colours)
    # Gradient out (added to), (V,) each:
    verts_grad_out: wp.array(dtype=wp.vec3),
    normals_grad_out: wp.array(dtype=wp.vec3),
    vert_colors_grad_out: wp.array(dtype=wp.vec3),
):
    """Vertex v: adds the table rows of its face corners, in list order (the adjoint
    of :func:`_gather_faces_kernel`'s per-vertex rows, gathered: no atomics)."""
    v = wp.tid()
    sums = wp.mat33(0.0)  # rows: position, normal, colour gradients
    for e in range(corners.start[v], corners.start[v + 1]):
        r = corners.entries[e]
        sums += wp.matrix_from_rows(
            _wanted_row(pos_rows, r, want[0]),
            _wanted_row(nrm_rows, r, want[1]),
            _wanted_row(col_rows, r, want[2]),
        )
    _add_wanted(verts_grad_out, v, sums[0], want[0])
    _add_wanted(normals_grad_out, v, sums[1], want[1])
    _add_wanted(vert_colors_grad_out, v, sums[2], want[2])


@wp.kernel(enable_backward=False)
def _face_normal_rows_adjoint(
    # Gradient in: (3F,) rows of the normal tables' gradients (flat shading: row 3 f)
    nrm_rows: wp.array(dtype=wp.vec3),
    # Gradient out (added to), (F,):
    normals_grad_out: wp.array(dtype=wp.vec3),
):
    f = wp.tid()
    normals_grad_out[f] = normals_grad_out[f] + nrm_rows[3 * f]


class FaceTables:
    """Per-face corner tables the slot kernel reads (positions, normals, colours).

    Gathering the three corners of every face once (F threads) lets the per-slot
    kernel read one row per face: its adjoint then adds into per-face rows
    (contended by the slots of one face) instead of per-vertex rows (contended by
    the slots of all faces around a vertex), and the gather's adjoint sends the F
    rows to the vertices: scattered with atomics (Warp's generated adjoint), or
    gathered per vertex over :class:`~warpraster.shading.corner_lists.CornerLists`
    (see :func:`gather_faces`).
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(self, num_faces: int, device, requires_grad: bool):
        def mats():
            return wp.zeros(num_faces, dtype=wp.mat33, device=device, requires_grad=requires_grad)

        self.num_faces = int(num_faces)
        self.pos, self.nrm, self.col = mats(), mats(), mats()
        self.corners = new_struct(FaceCorners, device, pos=self.pos, nrm=self.nrm, col=self.col)
        #: the tables as (9F,) floats for the gather (same memory, gradients too)
        self.floats = tuple(float_rows(t) for t in (self.pos, self.nrm, self.col))
        self._grad_rows = None

    def grad_rows(self) -> tuple[wp.array, wp.array, wp.array] | None:
        """The gradients of ``pos``, ``nrm``, ``col`` viewed as (3F,) ``vec3`` rows
        (row 3 f + c: corner c of face f; views made once), None without gradients."""
        if self.pos.grad is None:
            return None
        if self._grad_rows is None:
            self._grad_rows = tuple(_rows_view(t.grad) for t in (self.pos, self.nrm, self.col))
        return self._grad_rows


def _rows_view(mats: wp.array) -> wp.array:
    """A (F,) ``mat33`` array seen as its (3F,) ``vec3`` rows (same memory)."""
    rows = wp.array(ptr=mats.ptr, dtype=wp.vec3, shape=(3 * mats.shape[0],), device=mats.device)
    rows._ref = mats  # keep the owner alive
    return rows


def gather_faces(
    verts, faces, normals, *, mode, texels_from, vert_colors, tables, corner_lists=None
) -> None:
    """Launches the per-face corner gather into ``tables`` (on the tape).

    ``corner_lists``: the :class:`~warpraster.shading.corner_lists.CornerLists` of
    ``faces`` (static faces, the very array listed): the backward then gathers
    each vertex's table rows (:func:`_gather_faces_adjoint`, recorded by hand: no
    atomics, the same bits run to run). None: Warp's generated adjoint (scatters
    the rows with atomics; faces may change from call to call). Either way every
    vertex, normal and colour gradient is the same sum; only its order differs.
    The hand-written backward leaves the tables' gradients as they are (the
    generated one zeroes each row it reads): ``tape.zero()`` clears both.
    """
    nf = faces.shape[0]
    if not nf:
        return
    device = verts.device
    inputs = [verts, faces, normals, int(mode), int(texels_from), vert_colors]
    if corner_lists is None:
        wp.launch(_gather_faces_kernel, dim=9 * nf, inputs=inputs, outputs=tables.floats,
                  device=device)  # fmt: skip
        return
    corner_lists.check(faces, verts.shape[0])
    wp.launch(_gather_faces_kernel, dim=9 * nf, inputs=inputs, outputs=tables.floats,
              device=device, record_tape=False)  # fmt: skip
    tape = active_tape()
    rows = tables.grad_rows()
    if tape is None or rows is None:
        return
    flat = int(mode) == int(ShadingMode.FLAT)
    spare = placeholder(wp.vec3, 1, device)
    pos_grad, want_pos = _grad_or(verts, spare)
    nrm_grad, want_nrm = _grad_or(normals, spare)
    col_grad, want_col = _grad_or(vert_colors, spare)
    want_col = want_col and int(texels_from) == int(TexelSource.VERTEX)
    want = wp.vec3i(int(want_pos), int(want_nrm and not flat), int(want_col))
    if not any(want) and not (flat and want_nrm):
        return

    def backward():
        if any(want):
            wp.launch(_gather_faces_adjoint, dim=verts.shape[0],
                      inputs=[corner_lists.args, *rows, want],
                      outputs=[pos_grad, nrm_grad, col_grad], device=device)  # fmt: skip
        if flat and want_nrm:
            wp.launch(_face_normal_rows_adjoint, dim=nf, inputs=[rows[1]], outputs=[nrm_grad],
                      device=device)  # fmt: skip

    sources = (verts, normals, vert_colors) if want_col else (verts, normals)
    record_func(tape, backward, arrays=with_grad(tables.pos, tables.nrm, tables.col, *sources))


# ----------------------------------------------------------------------------- buffers
class ShadingBuffers:
    """Preallocated shading outputs (no allocation per render call).

    Attributes:
        colors: (N, H, W, K) ``vec3`` per-slot colours (Gouraud; made on first use:
            the Phong and flat shaders light the slots inside the blend kernel).
        image: (N, H, W, 4) float32 RGBA.
        shaded_verts: (V,) ``vec3`` lit vertex colours (Gouraud).
        verts_normals, normal_sums: (V,) ``vec3`` vertex normals and their scratch sums.
        faces_normals: (F,) ``vec3`` face normals.
        ones: (N, H, W, K) ``vec3`` of ones (silhouette colours).
        image_grad: the :class:`~warpraster.shading.fused.ImageGrad` the last
            shader call's recorded adjoint reads (``loss_armed``: the tape it was
            recorded on while no fused loss has claimed it, else None; see
            :meth:`fuse_image_mse`).
        corner_lists: the :class:`~warpraster.shading.corner_lists.CornerLists` of
            static faces, or None. Given, every shader call with these buffers must
            pass the very faces array listed (checked: ValueError otherwise), and the
            vertex normals and the corner tables' backward gather per vertex (no
            atomics); None: Warp's generated adjoints (faces may change per call).
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        shape,
        num_verts: int,
        num_faces: int,
        device,
        requires_grad: bool = True,
        *,
        corner_lists: CornerLists | None = None,
    ):
        n, h, w, k = shape
        self.shape = tuple(shape)
        self.num_verts = int(num_verts)
        self.num_faces = int(num_faces)
        self.device = wp.get_device(device)
        rg = bool(requires_grad)
        self.requires_grad = rg
        self.image = wp.zeros((n, h, w, 4), dtype=wp.float32, device=device, requires_grad=rg)

        def vec3s(count):
            return wp.zeros(count, dtype=wp.vec3, device=device, requires_grad=rg)

        self.shaded_verts = vec3s(self.num_verts)
        self.verts_normals = vec3s(self.num_verts)
        self.normal_sums = vec3s(self.num_verts)
        self.faces_normals = vec3s(self.num_faces)
        self.face_tables = FaceTables(self.num_faces, device, rg)
        self.structs = StructCache()  # the kernels' argument structs, kept between calls
        self.image_grad = ImageGrad()
        self.loss_armed: wp.Tape | None = None
        #: the pixel kernels as variants with the render's flags compiled in (None: on
        #: CUDA, True / False: always / never; :func:`~warpraster.shading.fused.launch_shade_blend`)
        self.specialize: bool | None = None
        self._corners = None
        if corner_lists is not None and (
            corner_lists.num_verts != self.num_verts
            or corner_lists.faces.shape[0] != self.num_faces
        ):
            raise ValueError(
                f"corner_lists were built for {corner_lists.faces.shape[0]} faces and "
                f"{corner_lists.num_verts} vertices, the buffers are for {self.num_faces} "
                f"and {self.num_verts}"
            )
        self.corner_lists = corner_lists

    def _slot_vec3s(self) -> wp.array:
        return wp.zeros(
            self.shape, dtype=wp.vec3, device=self.device, requires_grad=self.requires_grad
        )

    @cached_property
    def texels(self) -> wp.array:
        """(N, H, W, K) ``vec3`` sampled texels (UV textures), allocated on first use."""
        return self._slot_vec3s()

    @cached_property
    def colors(self) -> wp.array:
        """(N, H, W, K) ``vec3`` per-slot colours (Gouraud), allocated on first use."""
        return self._slot_vec3s()

    def corner_tables(self, num_faces: int) -> CornerTables:
        """Per-face UV / projected-vertex corners of a mip-mapped texture (made once)."""
        if self._corners is None or self._corners.num_faces != num_faces:
            self._corners = CornerTables(num_faces, self.device, self.requires_grad)
        return self._corners

    @cached_property
    def ones(self) -> wp.array:
        """(N, H, W, K) ``vec3`` of ones (silhouette colours), allocated on first use."""
        return wp.full(self.shape, wp.vec3(1.0), dtype=wp.vec3, device=self.device)

    def fuse_image_mse(
        self, target: wp.array, loss: wp.array, weight: float, tape: wp.Tape | None
    ) -> bool:
        """Lets the last shader call's recorded adjoint add the gradient of
        ``loss = weight * sum((image - target)^2)`` itself (read from ``loss.grad``
        at the backward) instead of a loss backward writing ``image.grad``; False
        (nothing changed) when no such adjoint waits on ``tape`` (none recorded,
        recorded on another tape, or claimed)."""
        if tape is None or self.loss_armed is not tape or loss.grad is None:
            return False
        ig = self.image_grad
        ig.mse = 1
        ig.target = target
        ig.loss_grad = loss.grad
        ig.weight = float(weight)
        self.loss_armed = None
        return True

    def matches(self, shape, num_verts, num_faces, device) -> bool:
        return (
            self.shape == tuple(shape)
            and self.num_verts == int(num_verts)
            and self.num_faces == int(num_faces)
            and self.device == wp.get_device(device)
        )
