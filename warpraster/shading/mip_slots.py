"""The mip-mapped texture object's kernels: per-face corner tables and per-slot sampling.

:class:`CornerTables` holds each face's corner UVs and projected vertices,
gathered once per call (:func:`_gather_corners`); the sampling kernels
interpolate a slot's UV and its analytic screen-space derivatives from them
(:func:`slot_uv`) and sample the pyramid (:mod:`.mip_sampling`): one thread per
slot for all channels (:func:`_sample_uv_mipmap_slots`, whose adjoint is
:mod:`.mip_adjoint`'s) or per slot and channel (:func:`_sample_uv_mipmap`,
Warp's generated adjoint). :class:`~warpraster.shading.mipmap.TexturesUVMipmap`
launches them.
"""

from __future__ import annotations

import functools
import operator

import warp as wp

from ..geometry import pixel_centre
from ..patches import patch_slot
from ..variants import kernel_family, same_struct, struct_ints, variant_kernel, variant_name
from .interpolate import ScreenFaces, bary_derivatives, slot_channel
from .mip_pyramid import MipSampler
from .mip_sampling import mip_sample_channel
from .params import component, float_rows
from .pixel_args import PixelFragments
from .textures import FaceUVs

wp.set_module_options({"fuse_fp": False})

__all__ = ["PINNED", "CornerTables", "SampleInputs", "UVCorners", "pinned_values", "sample_pin"]


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


#: The int fields of :class:`SampleInputs` a kernel variant compiles in as constants
#: (:func:`sample_pin`), in order: the sampler's, then the corner tables'.
PINNED = ("filter_mode", "boundary", "flip_v", "derivatives", "perspective_correct")


_PINNED_OF = operator.attrgetter(
    "t.filter_mode", "t.boundary", "t.flip_v", "corners.derivatives", "corners.perspective_correct"
)


def pinned_values(a: SampleInputs) -> tuple[int, ...]:
    """``a``'s :data:`PINNED` flags (a kernel variant's key)."""
    return struct_ints(_PINNED_OF, a)


@functools.cache
def sample_pin(values: tuple[int, ...] | None) -> wp.Function:
    """A Warp function ``pin(a) -> a`` returning ``a`` with its :data:`PINNED`
    flags set to the constants ``values``, so that a kernel starting with ``a =
    wp.static(sample_pin(values))(a)`` keeps only its filter's, boundary's and
    derivatives' paths (the identity for None: the generic kernel)."""
    if values is None:
        return same_struct(SampleInputs)
    filter_mode, boundary, flip_v, derivatives, perspective_correct = values

    def pin(a: SampleInputs):
        a.t.filter_mode = filter_mode
        a.t.boundary = boundary
        a.t.flip_v = flip_v
        a.corners.derivatives = derivatives
        a.corners.perspective_correct = perspective_correct
        return a

    return wp.func(pin, name=variant_name("sample_pin", values), module="unique")


@kernel_family
def _sample_uv_mipmap_slots(pins: tuple[int, ...] | None) -> wp.Kernel:
    """:func:`_sample_uv_mipmap` with one thread per slot for all C channels: the
    face, barycentrics, corner rows, UV derivatives and footprint are read and
    computed once per slot instead of once per channel (the same float32 operations
    per channel: bit-equal outputs). H200, K=1 bench scene (``python
    scripts/gpu_mip_sampling_variants.py``, medians of 50): 0.179 ms per slot and
    channel, 0.106 per slot at 64 registers, 0.136 per slot uncapped. Its adjoint is
    :mod:`.mip_adjoint`'s (Warp's generated one is recorded from
    :func:`_sample_uv_mipmap` instead).

    ``pins``: the :data:`PINNED` flags compiled in (None: read at run time)."""
    pin = sample_pin(pins)

    def sample_uv_mipmap_slots(
        # In: fragments, corners (per face, see CornerTables), sampler
        a: SampleInputs,
        # Data out: (N, H, W, K * C) float view of a vector(C) array
        texels_out: wp.array4d(dtype=wp.float32),
    ):
        a = wp.static(pin)(a)
        n, yi, xi, k, f = patch_fragment(a.frag, wp.tid(), SAMPLE_PATCH_W)
        channels = a.t.p.maps.shape[3]
        if f < 0:
            if f == -1:
                zero_channels(texels_out, n, yi, xi, k * channels, channels)
            return
        p2f = a.frag.pix_to_face
        shape = wp.vec2i(p2f.shape[1], p2f.shape[2])
        b = a.frag.bary_coords[n, yi, xi, k]
        uv, duv_dx, duv_dy = slot_uv(a.corners, f, b, yi, xi, shape)
        for c in range(channels):
            texel = mip_sample_channel(a.t, n, c, uv, duv_dx, duv_dy)
            texels_out[n, yi, xi, k * channels + c] = texel

    return variant_kernel(sample_uv_mipmap_slots, "sample_uv_mipmap_slots", pins,
                          SAMPLE_MAX_REGISTERS)  # fmt: skip
