"""Mip-mapped texture sampling, as nvdiffrast's ``texture``, with exact gradients.

* :class:`MipPyramid` / :func:`build_mipmaps` (:mod:`.mip_pyramid`): levels 1..L
  of a batch of maps ``(N, Ht, Wt, C)``, built on the device by 2 x 2 box
  filtering, as nvdiffrast; gradients reaching a level flow back to the base texels.
* :func:`texture` (:mod:`.mip_sampling`, with the filter and boundary modes):
  samples per-slot UVs ``(N, H, W, K)`` with their screen-space derivatives.
* :class:`TexturesUVMipmap` (here): a texture object (maps, ``faces_uvs``,
  ``verts_uvs``) that interpolates the UVs and their analytic derivatives and
  samples the pyramid in one kernel (:mod:`.mip_slots`), for renderers; its
  hand-written adjoint is :mod:`.mip_adjoint`'s.

The modules build on each other in that order (pyramid, sampling, slots,
adjoint, this object); this one re-exports the public names.
"""

from __future__ import annotations

import warp as wp

from ..backward.tape import active_tape
from ..meshes import as_faces_array, as_vec3_array
from ..patches import patch_launch_size
from ..structs import StructCache
from ..tape_slots import private_tape_slot
from ..variants import variants_on
from .corner_lists import CornerLists
from .interpolate import ScreenFaces, alloc_vector_out, check_face_range, float_view
from .mip_adjoint import SampleAdjoint, record_corners_adjoint
from .mip_pyramid import MipPyramid, MipSampler, build_mipmaps, mip_level_sizes
from .mip_sampling import BoundaryMode, FilterMode, _modes, texture
from .mip_slots import (
    SAMPLE_PATCH_W,
    CornerTables,
    SampleInputs,
    UVCorners,
    _gather_corners,
    _sample_uv_mipmap,
    _sample_uv_mipmap_slots,
    pinned_values,
)
from .pixel_args import PixelFragments
from .textures import UVTextures, check_map_batch, face_uvs, first_device

__all__ = [
    "BoundaryMode",
    "CornerTables",
    "FilterMode",
    "MipPyramid",
    "TexturesUVMipmap",
    "build_mipmaps",
    "mip_level_sizes",
    "texture",
]


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
        # built off any tape that may be open: a render rebuilds and records the
        # levels (recorded here too, the texels' gradient would arrive twice)
        with private_tape_slot():
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
        self._structs = StructCache()  # the kernels' argument structs, kept between calls
        self._adjoint = None  # the recorder of the sampling adjoint (mip_adjoint.py)
        #: Record Warp's generated adjoint of the sampling kernel instead of the
        #: hand-written one (tests and timings compare the two).
        self._generated_adjoint = False
        #: the sampling kernel and its hand-written adjoint as kernel variants with
        #: their flags compiled in (None: on CUDA; :mod:`warpraster.variants`)
        self.specialize: bool | None = None
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
        screen = self._structs.new(ScreenFaces, self.device, verts_ndc=vn, ndc_faces=fcs,
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
                if self._uv_lists is None:  # set-up: one host read of faces_uvs
                    self._uv_lists = CornerLists(self.faces_uvs, self.verts_uvs.shape[0])
                record_corners_adjoint(tape, corners, self._uv_lists, self.verts_uvs,
                                       corner_lists if vn is not None else None, vn)  # fmt: skip
        nn, h, w, k = p2f.shape
        corner_args = self._structs.new(UVCorners, self.device, uv=corners.uv, ndc=corners.ndc,
                                        derivatives=screen.with_derivatives,
                                        perspective_correct=screen.perspective_correct)  # fmt: skip
        # One thread per slot for all channels, its adjoint hand-written, one
        # thread per slot (mip_adjoint.py); with ``_generated_adjoint``, one thread
        # per slot and channel and Warp's generated adjoint of that kernel (the
        # tests' second truth for the hand-written one).
        frag = self._structs.new(PixelFragments, self.device, pix_to_face=p2f, bary_coords=bary)
        view = float_view(texels)
        dim = (nn, h, w, k * c)
        inputs = self._structs.new(
            SampleInputs, self.device, frag=frag, corners=corner_args, t=self.sampler
        )
        per_channel = self._generated_adjoint
        if per_channel:
            kernel = _sample_uv_mipmap
        else:
            on = variants_on(self.device, self.specialize)
            kernel = _sample_uv_mipmap_slots(pinned_values(inputs) if on else None)
        wp.launch(
            kernel,
            # flat over pixel patches (see the kernels)
            dim=patch_launch_size(nn, h, w, SAMPLE_PATCH_W, k * c if per_channel else k),
            inputs=[inputs],
            outputs=[view],
            device=self.device,
            record_tape=self._generated_adjoint,
        )
        if not self._generated_adjoint and tape is not None and view.grad is not None:
            if self._adjoint is None:
                self._adjoint = SampleAdjoint()
            self._adjoint.record(tape, dim, inputs, view, specialize=self.specialize)
        return texels
