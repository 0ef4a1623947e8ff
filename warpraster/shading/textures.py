"""Textures of packed meshes: per-vertex colours and UV maps, sampled per fragment slot.

* :class:`TexturesVertex`: per-vertex features ``(V, C)``, interpolated with the
  fragments' barycentrics (PyTorch3D's ``TexturesVertex``).
* :class:`TexturesUV`: one map per mesh ``(N, Ht, Wt, C)``, UVs ``(T, 2)`` with their
  own faces ``(F, 3)``, sampled exactly as PyTorch3D's ``TexturesUV.sample_textures``
  (``torch.nn.functional.grid_sample`` at ``torch.lerp((-1, 1), (1, -1), uv)``: v
  is flipped, so row 0 of a map is at v = 1) with its ``align_corners``,
  ``padding_mode`` and ``sampling_mode``.
* :class:`TexturesUVMipmap` (in :mod:`warpraster.shading.mipmap`): the same maps and
  UVs, filtered with a mip pyramid as nvdiffrast's ``texture``.

Every texture object has ``sample_textures(fragments, faces=None, *, ..., out=None)``
returning the per-slot texel values, a ``wp.array`` (N, H, W, K) of
``vector(C, float32)``; empty slots (``pix_to_face < 0``) hold zeros (PyTorch3D
samples the map at uv = (0, 0) there, a value every blend discards).

The UV sampler is written out (Warp's built-in texture sampling has no adjoint):
one loop-free kernel per (slot, channel) that interpolates the UVs and reads the
taps from the map array, so Warp's generated adjoint gives exact gradients to the
texels (atomic scatter), to the UVs, and through the barycentrics to the vertices.
The coordinate arithmetic follows PyTorch3D's and PyTorch's CPU ``grid_sample``
operation by operation, not only their algebra (which matters where a coordinate
lands on an exact texel tie, e.g. v = 0.5 on a 12-texel map): ``torch.lerp``'s two
branches, the unnormalisation (``(g + 1) * ((size - 1) / 2)`` with
``align_corners``, ``(g + 1) * (size / 2) - 0.5`` without), border clip,
reflection, nearest as round-half-to-even on the map as stored (not flipped),
bilinear weights ``w = x - floor(x)`` and ``1 - w``, and the FMAs that torch's
CPU build contracts (``(g + 1) * (size / 2) - 0.5`` and the running sum of the
four weighted taps; measured bit for bit against torch 2.13's CPU
``grid_sample``, tests/test_texture_ties.py). A clipped coordinate has
zero gradient on and beyond the clip limits, as there. (Flipping the map and
sampling at ``2 v - 1`` is the same algebra but picks the other texel at a
nearest-mode tie.)
"""

from __future__ import annotations

import enum

import numpy as np
import warp as wp

from ..meshes import as_faces_array
from ..structs import StructCache, new_struct
from .adjoint_args import grad_view, no_adjoint, upstream_view
from .interpolate import (
    alloc_vector_out,
    as_float_array,
    as_fragment_arrays,
    check_face_range,
    check_pix_to_face,
    float_view,
    interpolate_vertex_attributes,
    slot_channel,
)
from .params import row
from .pixel_args import PixelFragments

wp.set_module_options({"fuse_fp": False})

__all__ = [
    "FaceUVs",
    "PaddingMode",
    "SamplingMode",
    "TexturesUV",
    "TexturesVertex",
    "UVTextures",
    "fragment_arrays",
]


class PaddingMode(enum.IntEnum):
    """Where ``grid_sample`` reads outside the map (PyTorch's ``padding_mode``)."""

    ZEROS = 0
    BORDER = 1
    REFLECTION = 2


class SamplingMode(enum.IntEnum):
    """``grid_sample``'s ``mode``."""

    BILINEAR = 0
    NEAREST = 1


def parse_enum(value, enum_type, name: str):
    """An ``enum_type`` member from a member, its value, or its name (case and '-'/'_' free)."""
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        key = value.strip().upper().replace("-", "_")
        if key in enum_type.__members__:
            return enum_type[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_type(value)
        except ValueError:
            pass
    choices = ", ".join(repr(m.name.lower().replace("_", "-")) for m in enum_type)
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def fragment_arrays(fragments, name: str = "fragments"):
    """(pix_to_face, bary_coords) of a :class:`~warpraster.Fragments` or a (p2f, bary) pair."""
    if isinstance(fragments, (tuple, list)) and len(fragments) == 2:
        return as_fragment_arrays(fragments[0], fragments[1])
    if hasattr(fragments, "pix_to_face") and hasattr(fragments, "bary_coords"):
        return as_fragment_arrays(fragments.pix_to_face, fragments.bary_coords)
    raise TypeError(
        f"{name} must be a Fragments (pix_to_face, bary_coords) or a (pix_to_face, "
        f"bary_coords) pair, got {type(fragments).__name__}"
    )


def first_device(values, device=None):
    """The device of the first Warp array among ``values`` (else ``device``)."""
    for x in values:
        if isinstance(x, wp.array):
            return x.device
    return device


def as_maps(maps, device=None, requires_grad: bool = False) -> wp.array:
    """Non-empty (N, Ht, Wt, C) float32 ``maps`` (see ``as_float_array``)."""
    arr = as_float_array(maps, "maps", (None, None, None, None), device, requires_grad)
    if min(arr.shape) < 1:
        raise ValueError(f"maps must be non-empty (N, Ht, Wt, C), got {arr.shape}")
    return arr


def check_map_batch(maps: wp.array, num_images: int, name: str = "maps") -> None:
    """ValueError unless ``maps`` holds one map per image or one shared map."""
    if maps.shape[0] not in (1, num_images):
        raise ValueError(
            f"{name} has {maps.shape[0]} maps for {num_images} images (need 1 or {num_images})"
        )


@wp.struct
class FaceUVs:
    """A UV texture's layout as kernels read it: per packed face, the indices
    ``faces_uvs`` (F, 3) int32 of its corners' UVs in ``verts_uvs`` (T, 2) float32."""

    faces_uvs: wp.array2d(dtype=wp.int32)
    verts_uvs: wp.array2d(dtype=wp.float32)


def face_uvs(
    faces_uvs, verts_uvs, device=None, requires_grad: bool = False, validate: bool = True
) -> FaceUVs:
    """The :class:`FaceUVs` of a UV texture's inputs (Warp arrays zero-copy, NumPy
    copied to ``device``); ``validate`` checks on the host that ``faces_uvs``
    indexes ``verts_uvs``.

    Raises:
        TypeError, ValueError: bad input, named by argument.
    """
    verts = as_float_array(verts_uvs, "verts_uvs", (None, 2), device, requires_grad)
    faces = as_faces_array(faces_uvs, "faces_uvs", device)
    if validate:
        check_face_range(faces, verts.shape[0], "faces_uvs", "UVs")
        check_finite(verts, "verts_uvs")  # a NaN UV would sample nothing, silently
    return new_struct(FaceUVs, verts.device, faces_uvs=faces, verts_uvs=verts)


def check_finite(arr: wp.array, name: str) -> None:
    """Raises ValueError naming ``name`` unless every value of ``arr`` is finite (reads
    it back to the host: a set-up check)."""
    a = arr.numpy()
    if a.size and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)).ravel()
        raise ValueError(f"{name} must be finite; rows {bad[:8].tolist()} are not")


def row_count(x) -> int:
    """Rows of an array-like (Warp, NumPy or a sequence) without reading its values."""
    shape = getattr(x, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else len(x)


class SlotTextures:
    """What :class:`TexturesVertex`, :class:`TexturesUV` and
    :class:`~warpraster.shading.mipmap.TexturesUVMipmap` share: PyTorch3D's
    ``sample_textures`` call, which each answers with its ``_sample``."""

    def sample_textures(
        self,
        fragments,
        faces=None,
        *,
        verts_ndc=None,
        perspective_correct: bool = True,
        out: wp.array | None = None,
        validate: bool = True,
        **options,
    ) -> wp.array:
        """Per-slot texture values (zeros in empty slots).

        Args:
            fragments: :class:`~warpraster.Fragments` (or a (pix_to_face, bary_coords)
                pair) whose face indices are rows of the texture's faces.
            faces: (F, 3) packed faces the fragments index (required by
                :class:`TexturesVertex` and by the mip-mapped filter modes; for the UV
                textures only its row count is read, which must equal that of
                ``faces_uvs``).
            verts_ndc: (V, 3) projected vertices the fragments were rasterized from:
                the UV derivatives of the mip-mapped filter modes come from them
                (required there, unused by the other textures).
            perspective_correct: the rasterizer's setting (read with ``verts_ndc``).
            out: optional preallocated (N, H, W, K) ``vector(C)`` result: the call then
                allocates nothing (and, with ``validate=False``, reads nothing back:
                graph-capturable).
            validate: the object's host checks (see its ``_sample``); without
                ``faces``, also that the fragments' face indices are rows of the
                texture's faces (a read of ``pix_to_face``).
            **options: the texture's own keyword options (see its ``_sample``;
                :class:`TexturesVertex` and :class:`TexturesUV` take none).

        Returns:
            ``wp.array`` (N, H, W, K) of ``vector(C, float32)``; on a ``wp.Tape``
            gradients flow to the texture's arrays and the barycentrics (and, for
            derivatives, ``verts_ndc``).
        """
        p2f, bary = fragment_arrays(fragments)
        self._check_fragments(p2f, faces, validate)
        return self._sample(
            p2f, bary, faces, out, validate, verts_ndc, perspective_correct, **options
        )

    def check_mesh(self, num_verts: int, num_faces: int, num_meshes: int) -> None:
        """Raises ValueError, naming the argument, unless this texture's per-vertex,
        per-face and per-mesh inputs fit a packed batch of ``num_meshes`` meshes
        with ``num_verts`` vertices and ``num_faces`` faces (shapes only: no device
        read). The renderers call it before anything runs."""
        raise NotImplementedError

    def _check_fragments(self, p2f: wp.array, faces, validate: bool) -> None:
        """The checks of :meth:`sample_textures` before its kernels (see the subclasses)."""


# ----------------------------------------------------------------------------- vertex colours
class TexturesVertex(SlotTextures):
    """Per-vertex features of a packed batch (PyTorch3D's ``TexturesVertex``).

    Args:
        verts_features: (V, C) float32 ``wp.array``, (V,) ``vector(C)`` ``wp.array``
            (zero-copy: later writes are seen, gradients arrive in it) or NumPy.
        device: where NumPy input goes (default: Warp's default device).
        requires_grad: for NumPy input, whether the copy records gradients.
        validate: check that the features are finite (reads them back to the host).

    Raises:
        TypeError, ValueError: bad input, named by argument.
    """

    def __init__(
        self,
        verts_features,
        *,
        device=None,
        requires_grad: bool = False,
        validate: bool = True,
    ):
        if isinstance(verts_features, wp.array):
            device = verts_features.device
        self.verts_features = as_float_array(
            verts_features, "verts_features", (None, None), device, requires_grad
        )
        if self.verts_features.shape[1] < 1:
            raise ValueError("verts_features must have C >= 1 channels")
        self.device = self.verts_features.device
        if validate:  # a host read, at set-up
            check_finite(self.verts_features, "verts_features")

    def check_mesh(self, num_verts: int, num_faces: int, num_meshes: int) -> None:
        if self.verts_features.shape[0] != num_verts:
            raise ValueError(
                f"verts_features has {self.verts_features.shape[0]} rows for "
                f"{num_verts} vertices (one row per packed vertex)"
            )

    @property
    def channels(self) -> int:
        return self.verts_features.shape[1]

    def _sample(
        self, p2f, bary, faces, out, validate: bool, verts_ndc, perspective_correct
    ) -> wp.array:
        """Per-slot features ``sum_i bary[i] * verts_features[faces[f, i]]`` (``faces``
        required; ``validate`` checks its indices on the host; no derivatives: the
        geometry arguments are unused)."""
        if faces is None:
            raise ValueError("faces must be given to sample a TexturesVertex")
        return interpolate_vertex_attributes(
            p2f, bary, self.verts_features, faces, out=out, validate=validate
        )


# ----------------------------------------------------------------------------- grid_sample
# PyTorch3D's TexturesUV.sample_textures maps UVs to grid coordinates with
# ``torch.lerp((-1, 1), (1, -1), uv)`` (flipping v, not the map) and calls
# ``grid_sample`` on the map as it is. The functions below follow that arithmetic
# operation by operation (torch's lerp branches; the CPU grid sampler's
# unnormalisation, clip, reflection, floor/round-half-even and weights), so that a
# coordinate on an exact texel tie picks PyTorch3D's texel.
@wp.func_native(
    "return fmaf(a, b, c);",
    "adj_a += b * adj_ret; adj_b += a * adj_ret; adj_c += adj_ret;",
)
def fused_multiply_add(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once (torch's CPU grid sampler is compiled with its
    ``x * y + z`` contracted to FMAs; this module otherwise rounds every product)."""
    ...


@wp.func
def torch_lerp(start: float, end: float, weight: float) -> float:
    """``torch.lerp(start, end, weight)`` as torch computes it: ``start + weight *
    (end - start)`` for ``|weight| < 0.5``, else ``end - (end - start) * (1 - weight)``."""
    if wp.abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)


@wp.func
def clip_coordinate(x: float, size: int) -> float:
    """``min(max(x, 0), size - 1)`` (NaN to 0) with zero gradient on and beyond the
    limits, as PyTorch's grid sampler."""
    hi = float(size - 1)
    if not (x > 0.0):
        return 0.0
    if x >= hi:
        return hi
    return x


@wp.func
def reflect_coordinate(x: float, low: float, twice_span: float) -> float:
    """Reflects ``x`` into [low, low + twice_span / 2], as PyTorch's CPU grid sampler
    (``|x - low|`` folded by whole double spans, then mirrored once if past the span)."""
    if twice_span <= 0.0:
        return 0.0
    d = x - low
    a = d
    if d < 0.0:
        a = -d
    flips = wp.trunc(a / twice_span)
    extra = a - flips * twice_span
    reflected = twice_span - extra
    if extra > reflected:
        return reflected + low
    return extra + low


@wp.func
def grid_source_index(g: float, size: int, padding: int, align_corners: int) -> float:
    """Texel coordinate of normalised grid coordinate ``g`` in [-1, 1] (PyTorch's CPU kernel)."""
    x = float(0.0)
    if align_corners != 0:
        x = (g + 1.0) * (float(size - 1) / 2.0)
    else:
        x = fused_multiply_add(g + 1.0, float(size) / 2.0, -0.5)
    if padding == PaddingMode.BORDER:
        x = clip_coordinate(x, size)
    elif padding == PaddingMode.REFLECTION:
        if align_corners != 0:
            x = reflect_coordinate(x, 0.0, float(size - 1) * 2.0)
        else:
            x = reflect_coordinate(x, -0.5, float(size) * 2.0)
        x = clip_coordinate(x, size)
    return x


@wp.func
def map_texel(maps: wp.array4d(dtype=wp.float32), m: int, y: int, x: int, c: int) -> float:
    """Texel (row ``y``, column ``x``) of map ``m`` as stored (row 0 at v = 1), 0 outside."""
    if x < 0 or x >= maps.shape[2] or y < 0 or y >= maps.shape[1]:
        return 0.0
    return maps[m, y, x, c]


@wp.struct
class GridSampler:
    """A :class:`TexturesUV`'s maps (N or 1, Ht, Wt, C) and its ``grid_sample``
    options as ints (built with it)."""

    maps: wp.array4d(dtype=wp.float32)
    padding: int
    align_corners: int
    sampling: int


@wp.func
def grid_sample_channel(s: GridSampler, m: int, c: int, u: float, v: float) -> float:
    """Channel ``c`` of PyTorch3D's ``TexturesUV`` sample of map ``m`` at (u, v)."""
    h = s.maps.shape[1]
    w = s.maps.shape[2]
    # PyTorch3D: grid = lerp((-1, 1), (1, -1), uv); v = 1 is row 0 of the map
    ix = grid_source_index(torch_lerp(-1.0, 1.0, u), w, s.padding, s.align_corners)
    iy = grid_source_index(torch_lerp(1.0, -1.0, v), h, s.padding, s.align_corners)
    # Far outside (or NaN) with zero padding: no tap is inside; keeps int() in range.
    if not (ix > -2.0 and ix < float(w) + 1.0 and iy > -2.0 and iy < float(h) + 1.0):
        return 0.0
    if s.sampling == SamplingMode.NEAREST:  # round half to even, as torch's nearest
        return map_texel(s.maps, m, int(wp.rint(iy)), int(wp.rint(ix)), c)
    x0f = wp.floor(ix)
    y0f = wp.floor(iy)
    x0 = int(x0f)
    y0 = int(y0f)
    we = ix - x0f  # distance to the west column: the east taps' weight
    ww = 1.0 - we
    wn = iy - y0f  # distance to the north row: the south taps' weight
    ws = 1.0 - wn
    # nw + ne + sw + se, each sum an FMA with the product after it (torch's CPU build)
    acc = map_texel(s.maps, m, y0, x0, c) * (ws * ww)
    acc = fused_multiply_add(map_texel(s.maps, m, y0, x0 + 1, c), ws * we, acc)
    acc = fused_multiply_add(map_texel(s.maps, m, y0 + 1, x0, c), wn * ww, acc)
    return fused_multiply_add(map_texel(s.maps, m, y0 + 1, x0 + 1, c), wn * we, acc)


@wp.kernel
def _sample_uv(
    # Fragments in (pix_to_face, bary_coords):
    frag: PixelFragments,
    # Texture in:
    uvs: FaceUVs,
    sampler: GridSampler,
    # Data out: (N, H, W, K * C) float view of a vector(C) array
    texels_out: wp.array4d(dtype=wp.float32),
):
    n, yi, xi, j = wp.tid()
    k, c = slot_channel(j, sampler.maps.shape[3])
    f = frag.pix_to_face[n, yi, xi, k]
    if f < 0:
        texels_out[n, yi, xi, j] = 0.0
        return
    b = frag.bary_coords[n, yi, xi, k]
    t0 = uvs.faces_uvs[f, 0]
    t1 = uvs.faces_uvs[f, 1]
    t2 = uvs.faces_uvs[f, 2]
    u = b[0] * uvs.verts_uvs[t0, 0] + b[1] * uvs.verts_uvs[t1, 0] + b[2] * uvs.verts_uvs[t2, 0]
    v = b[0] * uvs.verts_uvs[t0, 1] + b[1] * uvs.verts_uvs[t1, 1] + b[2] * uvs.verts_uvs[t2, 1]
    texels_out[n, yi, xi, j] = grid_sample_channel(sampler, row(n, sampler.maps.shape[0]), c, u, v)


class UVTextures(SlotTextures):
    """What the UV textures (:class:`TexturesUV`,
    :class:`~warpraster.shading.mipmap.TexturesUVMipmap`) share: float32
    ``maps`` (N or 1, Ht, Wt, C) and the UV layout ``uvs`` (:class:`FaceUVs`,
    as their kernels read it; made with :func:`face_uvs`)."""

    maps: wp.array
    uvs: FaceUVs

    @property
    def channels(self) -> int:
        return self.maps.shape[3]

    @property
    def faces_uvs(self) -> wp.array:
        """(F, 3) int32: per packed face, the rows of its corners in :attr:`verts_uvs`."""
        return self.uvs.faces_uvs

    def check_mesh(self, num_verts: int, num_faces: int, num_meshes: int) -> None:
        self._check_faces(num_faces)
        check_map_batch(self.maps, num_meshes)

    def _check_faces(self, num_faces: int) -> None:
        """ValueError unless ``faces_uvs`` has one row per packed face (a shorter one
        would be read past its end)."""
        nf = self.faces_uvs.shape[0]
        if nf != num_faces:
            raise ValueError(
                f"faces_uvs has {nf} rows for {num_faces} faces (one row per packed face)"
            )

    def _check_fragments(self, p2f: wp.array, faces, validate: bool) -> None:
        check_map_batch(self.maps, p2f.shape[0])
        if faces is not None:
            self._check_faces(row_count(faces))
        elif validate:
            check_pix_to_face(p2f, self.faces_uvs.shape[0], "faces_uvs")

    @property
    def verts_uvs(self) -> wp.array:
        """(T, 2) float32 UVs (the array given, when it was a Warp array)."""
        return self.uvs.verts_uvs


class TexturesUV(UVTextures):
    """UV-mapped textures of a packed batch, sampled as PyTorch3D's ``TexturesUV``.

    Args:
        maps: (N, Ht, Wt, C) one map per mesh (or (1, Ht, Wt, C) shared), PyTorch3D's
            row order (row 0 at v = 1): float32 ``wp.array``, (N, Ht, Wt)
            ``vector(C)`` ``wp.array`` (zero-copy; gradients arrive in it) or NumPy.
        faces_uvs: (F, 3) int indices into ``verts_uvs``, one row per packed face.
        verts_uvs: (T, 2) UVs: float32 ``wp.array``, (T,) ``vec2`` ``wp.array`` or NumPy.
        padding_mode: ``"zeros"``, ``"border"`` or ``"reflection"`` (or :class:`PaddingMode`).
        align_corners: ``grid_sample``'s: True maps u = 0, 1 to the centres of the
            edge texels, False to their outer edges.
        sampling_mode: ``"bilinear"`` or ``"nearest"`` (or :class:`SamplingMode`).
        device: where NumPy input goes.
        requires_grad: for NumPy ``maps``/``verts_uvs``, whether the copies record gradients.
        validate: check that ``faces_uvs`` indexes ``verts_uvs`` and that the UVs
            are finite (reads them back to the host; pass False where they were
            checked already).

    Raises:
        TypeError, ValueError: bad input, named by argument.
    """

    def __init__(
        self,
        maps,
        faces_uvs,
        verts_uvs,
        padding_mode: str | PaddingMode = "border",
        align_corners: bool = True,
        sampling_mode: str | SamplingMode = "bilinear",
        *,
        device=None,
        requires_grad: bool = False,
        validate: bool = True,
    ):
        device = first_device((maps, verts_uvs, faces_uvs), device)
        self.padding_mode = parse_enum(padding_mode, PaddingMode, "padding_mode")
        self.sampling_mode = parse_enum(sampling_mode, SamplingMode, "sampling_mode")
        if not isinstance(align_corners, (bool, int)):
            raise TypeError(f"align_corners must be a bool, got {type(align_corners).__name__}")
        self.align_corners = bool(align_corners)
        self.maps = as_maps(maps, device, requires_grad)
        self.device = device = self.maps.device
        # validate: a host read; callers that checked the indices already pass False
        self.uvs = face_uvs(faces_uvs, verts_uvs, device, requires_grad, validate)
        self._structs = StructCache()
        self.sampler = new_struct(
            GridSampler,
            device,
            maps=self.maps,
            padding=int(self.padding_mode),
            align_corners=int(self.align_corners),
            sampling=int(self.sampling_mode),
        )

    def _sample(
        self, p2f, bary, faces, out, validate: bool, verts_ndc, perspective_correct
    ) -> wp.array:
        """Per-slot texels, as PyTorch3D's ``TexturesUV.sample_textures``: image n
        samples map n (the geometry arguments unused, nothing read back:
        graph-capturable with ``out``)."""
        if wp.get_device(p2f.device) != wp.get_device(self.device):
            raise ValueError(f"fragments are on {p2f.device}, the texture on {self.device}")
        c = self.channels
        rg = bool(self.maps.requires_grad or self.verts_uvs.requires_grad or bary.requires_grad)
        texels = alloc_vector_out(out, "out", tuple(p2f.shape), c, self.device, rg)
        nn, h, w, k = p2f.shape
        wp.launch(
            _sample_uv,
            dim=(nn, h, w, k * c),
            inputs=[
                self._structs.new(PixelFragments, self.device, pix_to_face=p2f, bary_coords=bary),
                self.uvs,
                self.sampler,
            ],
            outputs=[float_view(texels)],
            device=self.device,
        )
        return texels

    def sample_textures_adjoint(
        self,
        fragments,
        texels_grad: wp.array,
        *,
        bary_coords_grad: wp.array | None = None,
        maps_grad: wp.array | None = None,
        verts_uvs_grad: wp.array | None = None,
    ) -> None:
        """The adjoint of :meth:`sample_textures` alone: adds the gradients for
        ``texels_grad`` ((N, H, W, K) ``vector(C)``, contiguous) to the buffers given
        (None: not computed): ``bary_coords_grad`` (N, H, W, K) ``vec3``,
        ``maps_grad`` and ``verts_uvs_grad`` float32 shaped as :attr:`maps` and
        :attr:`verts_uvs`. The forward is not run: the sampler's inputs (the
        fragments, the maps, the UVs, as the call had them) are all its adjoint reads.

        The launch a ``wp.Tape``'s replay makes (the same bits), with the gradient
        buffers as arguments (not the arrays' ``.grad``): no device memory is
        allocated, nothing is read back and ``texels_grad`` is only read (see
        :mod:`warpraster.shading.adjoint_args`).
        """
        p2f, bary = fragment_arrays(fragments)
        nn, h, w, k = p2f.shape
        frag = new_struct(PixelFragments, self.device, pix_to_face=p2f,
                          bary_coords=grad_view(bary, bary_coords_grad))  # fmt: skip
        uvs = new_struct(FaceUVs, self.device, faces_uvs=self.faces_uvs,
                         verts_uvs=grad_view(self.verts_uvs, verts_uvs_grad))  # fmt: skip
        sampler = new_struct(GridSampler, self.device, maps=grad_view(self.maps, maps_grad),
                             padding=int(self.padding_mode), align_corners=int(self.align_corners),
                             sampling=int(self.sampling_mode))  # fmt: skip
        wp.launch(
            _sample_uv,
            dim=(nn, h, w, k * self.channels),
            inputs=[frag, uvs, sampler],
            outputs=[upstream_view(texels_grad)],
            adj_inputs=[no_adjoint(PixelFragments), no_adjoint(FaceUVs), no_adjoint(GridSampler)],
            adj_outputs=[None],
            adjoint=True,
            device=self.device,
        )
