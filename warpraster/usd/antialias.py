"""The antialias pass of the stage renderer: edges with gradients for stage poses and shapes.

:class:`StageAntialias` runs :class:`warpraster.Antialias` (nvdiffrast's analytic
antialias, :mod:`warpraster.antialiasing`) on the stage's shaded K = 1 sample
image (premultiplied RGBA, so the two colours of a pair blend with their
coverage) before the box filter resolves it to pixels. It is built once per
:class:`~warpraster.usd.render.StageRenderer` (``antialias=True``); a call
allocates nothing and reads nothing back (capturable).

Faces and edges:

* The edge topology is that of the stage's own faces, not of the faces the
  rasterizer drew. A back face that the stage culls (a single-sided mesh seen
  from behind, collapsed to a point) never shows in ``pix_to_face``, so it is
  never the examined face of a pair; as the neighbour across an edge of a front
  face it folds over that face on screen (a back face of a consistently wound
  mesh has the opposite screen orientation), which is exactly nvdiffrast's
  silhouette test: the edge between a drawn front face and a culled back face
  is a silhouette, an edge between two front faces is not.
* Near-plane clipping (perspective): a vertex closer than the rasterizer's
  ``z_clip_value`` has a meaningless projection (a point behind the camera, or
  one whose edge the clip replaced by a cut along the near plane). Each call
  first writes the faces the op reads: the stage's faces, except that a face
  with a corner, or an edge's opposite vertex, closer than the clip distance
  becomes degenerate (its first corner three times), which the op never blends
  across. So pairs whose front face touches clipped geometry keep their hard
  colours and get no edge gradient; everywhere else the pass is unchanged.
  The near-plane cut itself is not antialiased.
* A later frame's faces (:meth:`update_faces`) refresh the opposite-vertex
  table in place (host work, only when the faces changed).
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

from ..antialiasing import Antialias, AntialiasTopology, edge_opposites
from ..antialiasing.guard import guard_faces

__all__ = ["StageAntialias"]


class StageAntialias:
    """The antialias op for one stage renderer: topology, faces and buffers built once.

    Args:
        faces: (F, 3) int32 ``wp.array``, the stage's faces (``StageBuffers.faces``).
        num_verts: V, the length of the projected-vertex array.
        sample_size: (Hs, Ws) of the sample grid.
        device: Warp device.

    Attributes:
        faces: (F, 3) int32, the faces the op reads (written by each call).
        topology: the :class:`~warpraster.AntialiasTopology` of the stage's faces.
        op: the :class:`~warpraster.Antialias` object; ``op.out`` is the
            antialiased (1, Hs, Ws, 4) sample image of the last call.
    """

    def __init__(self, faces: wp.array, num_verts: int, sample_size, device):
        self.device = wp.get_device(device)
        self._stage_faces = faces
        self._host_faces = faces.numpy().copy()
        self.faces = wp.clone(faces)
        self.topology = AntialiasTopology(self.faces, num_verts, self.device)
        hs, ws = sample_size
        self.op = Antialias(self.topology, num_verts, (1, hs, ws, 4), self.device)

    @property
    def out(self) -> wp.array:
        return self.op.out

    def update_faces(self, faces: np.ndarray) -> None:
        """A later frame's faces (same count): the opposite-vertex table remade in place
        when they differ from the last ones (host work, not capturable)."""
        faces = np.asarray(faces, np.int32).reshape(-1, 3)
        if faces.shape != self._host_faces.shape or np.array_equal(faces, self._host_faces):
            return
        self._host_faces = faces.copy()
        table = edge_opposites(faces, self.topology.num_verts)
        self.topology.opposite.assign(table)

    def __call__(self, samples: wp.array, frags, verts_ndc: wp.array,
                 z_clip: float | None) -> wp.array:  # fmt: skip
        """The antialiased sample image (``self.out``), recorded on an active tape.

        Args:
            samples: (1, Hs, Ws, 4) float32 shaded samples (premultiplied RGBA).
            frags: the K = 1 fragments they were shaded from (input face ids).
            verts_ndc: (V,) ``vec3`` vertices as the rasterizer projected them.
            z_clip: the rasterizer's near-clip distance, None when it does not clip.
        """
        guard_faces(self._stage_faces, self.topology.opposite, verts_ndc,
                    min_depth=-math.inf if z_clip is None else float(z_clip),
                    need_finite=False, faces_out=self.faces)  # fmt: skip
        return self.op(samples, frags.pix_to_face, verts_ndc, zbuf=frags.zbuf)
