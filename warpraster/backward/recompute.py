"""The fragments recomputed from ``pix_to_face`` by a straight-line kernel.

:func:`recompute_fragments` fills ``zbuf``, ``bary_coords`` and ``dists`` from a
given choice of faces. Recorded on a ``wp.Tape`` it is differentiated by Warp's
generated adjoint: a derivation independent of the hand-written backward that
the tests hold it against. It follows Warp's conventions at ties and clamps
(``wp.min``/``wp.max``/``wp.clamp`` adjoints), not PyTorch3D's, so the two agree
only away from them (docs/BACKWARD.md). With ``deterministic`` the launch is not
recorded and the sorted strategy of :mod:`warpraster.backward` (PyTorch3D's
conventions) is registered instead.
"""

from __future__ import annotations

import warp as wp

from ..fragments import FragmentRows, Fragments, fragment_rows, slot_fragment
from ..geometry import pixel_centre
from ..meshes import MeshArrays, mesh_arrays
from .sorted import SortedBackward
from .tape import active_tape, record_func

# No FMA contraction: the recomputed values must equal the render's to the bit.
wp.set_module_options({"fuse_fp": False})

__all__ = ["recompute_fragments"]


@wp.kernel
def _recompute_fragments(
    # In: the meshes (gradients reach meshes.verts), the image, the flags
    meshes: MeshArrays,
    height: int,
    width: int,
    perspective_correct: int,
    clip_barycentric_coords: int,
    # In: frags.pix_to_face; Out: frags.zbuf, bary, dists
    frags: FragmentRows,
):
    """Loop-free recompute, one thread per slot of the (N * H * W, K) rows; its
    generated adjoint scatters into ``meshes.verts.grad``."""
    q, s = wp.tid()
    r = q % (height * width)
    p = pixel_centre(r // width, r % width, height, width)
    z, bary, d = slot_fragment(
        meshes, frags.pix_to_face[q, s], p, perspective_correct, clip_barycentric_coords
    )
    frags.zbuf[q, s] = z
    frags.bary[q, s] = bary
    frags.dists[q, s] = d


def recompute_fragments(
    verts: wp.array,
    faces: wp.array,
    out: Fragments,
    *,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    deterministic: SortedBackward | bool | None = None,
    exact_perspective_grad: bool = True,
) -> None:
    """Fills ``out.zbuf``, ``out.bary_coords``, ``out.dists`` from ``out.pix_to_face``.

    Under an enclosing ``wp.Tape`` the backward accumulates into ``verts.grad``:

    * ``deterministic`` None/False: the launch is recorded and Warp's generated
      adjoint scatters with atomics (Warp's conventions at ties and clamps);
    * a :class:`~warpraster.backward.sorted.SortedBackward` (preallocated,
      graph-capturable) or True (allocated for this call): the launch is not
      recorded; the sorted strategy with PyTorch3D's conventions is registered
      (``exact_perspective_grad`` as in :func:`warpraster.backward.record_backward`).
      Its face-vertex scratch is allocated on the first such call (set-up).
    """
    n, h, w, k = out.shape
    frags = fragment_rows(out.pix_to_face, out.zbuf, out.bary_coords, out.dists)
    args = dict(
        dim=(n * h * w, k),
        inputs=[mesh_arrays(verts, faces), h, w, int(perspective_correct),
                int(clip_barycentric_coords)],
        outputs=[frags],
        device=verts.device,
    )  # fmt: skip
    if deterministic is None or deterministic is False:
        wp.launch(_recompute_fragments, **args)
        return
    if deterministic is True:
        deterministic = SortedBackward(out.shape, faces.shape[0], verts.device)
    elif not deterministic.matches(out.shape, faces.shape[0], verts.device):
        raise ValueError(
            "deterministic buffers were made for another shape, face count or device: "
            f"{deterministic.shape}, {deterministic.num_faces}, {deterministic.device} vs "
            f"{out.shape}, {faces.shape[0]}, {verts.device}"
        )
    wp.launch(_recompute_fragments, record_tape=False, **args)
    tape = active_tape()
    grads = (verts.grad, out.zbuf.grad, out.bary_coords.grad, out.dists.grad)
    if tape is None or not verts.requires_grad or any(g is None for g in grads):
        return
    det = deterministic
    det.gather_scratch()  # allocated here (set-up), not in the backward
    kw = dict(perspective_correct=bool(perspective_correct),
              clip_barycentric_coords=bool(clip_barycentric_coords),
              exact_perspective_grad=bool(exact_perspective_grad))  # fmt: skip

    def backward():
        det.backward(verts, faces, out, **kw)

    record_func(tape, backward, arrays=[verts, out.zbuf, out.bary_coords, out.dists])
