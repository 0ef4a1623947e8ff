"""PyTorch3D's clipped path: clip, rasterize the clipped list, map the fragments back."""

from __future__ import annotations

from typing import Any

import warp as wp

from ..clip import ClipBuffers, FrustumCullRule, clip_faces, unclip_in_place
from ..fragments import Fragments
from ..meshes import PackedMeshes
from ..settings import RasterSettings, Tuning
from ..stores import FillState, allocate_marks, fill_state
from .launch import rasterize_packed
from .workspace import RasterWorkspace, SettingsViews, default_max_faces_per_bin

__all__ = ["ClipWorkspace", "rasterize_clipped"]


class ClipWorkspace(SettingsViews):
    """Everything a clipped render allocates, made once and reused.

    Holds the :class:`~warpraster.clip.ClipBuffers`, a :class:`RasterWorkspace`
    for the 2F-face clipped list, and the final :class:`Fragments` (whose
    ``pix_to_face`` / ``bary_coords`` refer to the input faces; ``zbuf``,
    ``dists`` and ``bary_coords`` are the raster workspace's arrays, the
    barycentrics of split faces converted in place).

    Args:
        num_verts, num_faces, num_meshes: V, F, N of the unclipped input.
        settings: the render settings. ``max_faces_per_bin=None`` means
            PyTorch3D's default here, sized from the unclipped face count, as
            PyTorch3D does on this path.
        device, requires_grad, tuning: as for :class:`RasterWorkspace`.
        static_faces: every call passes the same faces and mesh ranges, unchanged
            (a ``Renderer``'s, a sensor's; not a stage renderer's, whose back-face cull
            rewrites them every call): a graph-captured call (any
            call on the cpu device) then skips the clip pass when no vertex is
            behind the near plane and the last pass kept every face
            (:class:`~warpraster.clip.ClipBuffers`).
        write_dists: as for :class:`RasterWorkspace` (False: ``fragments.dists``
            are not computed and hold NaN).
        **sizing: instead of ``settings``, the keywords ``image_size``,
            ``faces_per_pixel``, ``bin_size``, ``max_faces_per_bin`` and
            ``deterministic``, as for :class:`RasterWorkspace`
            (:meth:`RasterSettings.sizing <warpraster.settings.RasterSettings.sizing>`).
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        *,
        num_verts: int,
        num_faces: int,
        num_meshes: int,
        settings: RasterSettings | None = None,
        device=None,
        requires_grad: bool = False,
        tuning: Tuning | None = None,
        static_faces: bool = False,
        write_dists: bool = True,
        **sizing: Any,
    ):
        settings = RasterSettings.sizing(settings, **sizing)
        device = wp.get_device(device)
        self.settings = settings
        self.clip = ClipBuffers(num_verts, num_faces, num_meshes, device,
                                requires_grad=requires_grad, static_faces=static_faces)  # fmt: skip
        inner = settings
        if settings.binned and settings.max_faces_per_bin is None:
            inner = settings.replace(max_faces_per_bin=default_max_faces_per_bin(num_faces))
        self.raster = RasterWorkspace(
            num_meshes=num_meshes, num_faces=2 * num_faces, settings=inner, device=device,
            requires_grad=requires_grad, tuning=tuning, write_dists=write_dists,
        )  # fmt: skip
        frags = self.raster.fragments
        # zbuf, dists and bary_coords are the raster workspace's own arrays: the
        # barycentrics of split faces are converted in place (unclip_in_place)
        self.fragments = Fragments(
            pix_to_face=wp.full(frags.shape, -1, dtype=wp.int32, device=device),
            zbuf=frags.zbuf,
            bary_coords=frags.bary_coords,
            dists=frags.dists,
            overflow_count=frags.overflow_count,
        )
        # which groups of four of its pix_to_face slots hold faces (all, at first)
        self._map_held = allocate_marks((frags.pix_to_face.size + 3) // 4, device)
        self._map_fill = {on: fill_state(self._map_held, on, device) for on in (False, True)}
        self._map_marks_stale = False  # calls without the marks did not update them

    def map_fill(self) -> FillState:
        """The map back's :class:`~warpraster.stores.FillState` under the current
        tuning (after calls without it, every slot is rewritten once first)."""
        on = self.tuning.fill_empty_once
        if on and self._map_marks_stale:
            self._map_held.fill_(1)
        self._map_marks_stale = not on
        return self._map_fill[on]

    def refill_empty_slots(self) -> None:
        """Makes the next call write every slot of the fragments, empty ones
        included: call it after writing into them."""
        self._map_held.fill_(1)
        self.raster.refill_empty_slots()

    @property
    def tuning(self) -> Tuning:
        """The inner raster workspace's tuning (assignable)."""
        return self.raster.tuning

    @tuning.setter
    def tuning(self, value: Tuning) -> None:
        self.raster.tuning = value

    def matches(self, num_verts: int, num_faces: int, num_meshes: int,
                settings: RasterSettings, device) -> bool:  # fmt: skip
        """Whether this workspace serves a call of this size, settings and device."""
        return (
            self.clip.num_verts == num_verts
            and self.clip.num_faces == num_faces
            and self.raster.matches(num_meshes, 2 * num_faces, settings, device)
        )


def rasterize_clipped(
    meshes: PackedMeshes,
    settings: RasterSettings,
    workspace: ClipWorkspace,
    frustum_cull_rule: FrustumCullRule = FrustumCullRule.PYTORCH3D,
) -> Fragments:
    """Clip, rasterize the clipped list, map the fragments back.

    The barycentrics are shared with the clipped list's fragments and converted
    in place for split faces (as is their gradient, during the backward: after
    ``tape.backward`` a split slot's ``bary_coords.grad`` holds the gradient of
    the clipped face's barycentrics).

    ``meshes`` is validated input (its ``clipped_faces_neighbor_idx`` is replaced by
    the clipper's, as in PyTorch3D). The returned fragments index the input faces;
    ``zbuf`` and ``dists`` are those of the clipped sub-triangles.
    """
    clipped = clip_faces(
        meshes.verts,
        meshes.faces,
        meshes.mesh_to_face_first_idx,
        meshes.num_faces_per_mesh,
        z_clip_value=settings.z_clip_value,
        cull_to_frustum=settings.cull_to_frustum,
        perspective_correct=settings.perspective_correct,
        buffers=workspace.clip,
        frustum_cull_rule=frustum_cull_rule,
        deterministic=settings.deterministic,
    )
    inner = rasterize_packed(clipped.packed, workspace.raster, settings)
    out = workspace.fragments
    unclip_in_place(inner.pix_to_face, inner.bary_coords, clipped, out.pix_to_face,
                    workspace.raster.face_verts, perspective_correct=settings.perspective_correct,
                    clip_barycentric_coords=settings.clip_barycentric_coords,
                    deterministic=settings.deterministic,
                    marks=(workspace.map_fill(), workspace.raster.fill_marks()))  # fmt: skip
    return out
