"""The faces an antialias call reads: a face next to an undrawable vertex made a point.

A renderer that runs :class:`warpraster.Antialias` on a hard image first writes
the faces the op reads: its own faces, except that a face with a corner, or an
edge's opposite vertex, that has no meaningful projection becomes degenerate
(its first corner three times), which the op never blends across. Pairs whose
front face touches such geometry keep their hard colours and get no edge
gradient. The stage renderer (:mod:`warpraster.usd.antialias`: vertices closer
than its near clip) and the camera sensor (:mod:`warpraster.sim.antialias`:
vertices not finite or not in front of the camera) share this rule.
"""

from __future__ import annotations

import warp as wp

from ..geometry import finite_vec3
from ..meshes import store_face_or_point

__all__ = ["guard_faces"]

wp.set_module_options({"enable_backward": False})  # integer outputs only


@wp.func
def _drawable(v: wp.vec3, min_depth: float, need_finite: int) -> bool:
    """Whether projected vertex ``v`` counts: not closer than ``min_depth`` (view
    depth; a NaN depth passes this test) and, when ``need_finite``, finite."""
    if need_finite != 0:
        if not finite_vec3(v):
            return False
    return not (v[2] < min_depth)


@wp.kernel
def _guard_faces_kernel(
    # Model:
    faces: wp.array2d(dtype=wp.int32),
    opposite: wp.array2d(dtype=wp.int32),
    # Data in:
    verts_ndc: wp.array(dtype=wp.vec3),
    min_depth: float,
    need_finite: int,
    # Data out:
    faces_out: wp.array2d(dtype=wp.int32),
):
    """Copies each face, or its first corner three times when a corner or an edge's
    opposite vertex is not :func:`_drawable`."""
    f = wp.tid()
    a = faces[f, 0]
    b = faces[f, 1]
    c = faces[f, 2]
    keep = (
        _drawable(verts_ndc[a], min_depth, need_finite)
        and _drawable(verts_ndc[b], min_depth, need_finite)
        and _drawable(verts_ndc[c], min_depth, need_finite)
    )
    for e in range(3):
        o = opposite[f, e]
        if o >= 0:
            if not _drawable(verts_ndc[o], min_depth, need_finite):
                keep = False
    store_face_or_point(faces_out, f, a, b, c, keep)


def guard_faces(
    faces: wp.array,
    opposite: wp.array,
    verts_ndc: wp.array,
    *,
    min_depth: float,
    need_finite: bool,
    faces_out: wp.array,
) -> None:
    """Writes ``faces_out``: each face of ``faces``, or its first corner three times
    when one of its corners or of its edges' ``opposite`` vertices is closer than
    ``min_depth`` (the view depth, ``verts_ndc[:, 2]``; ``-inf``: none is) or, with
    ``need_finite``, not finite. Unrecorded (integer outputs), allocates nothing.

    Args:
        faces: (F, 3) int32 faces, indices into ``verts_ndc``.
        opposite: (F, 3) int32 opposite vertex across each edge (-1: none), as
            :class:`~warpraster.AntialiasTopology` holds it.
        verts_ndc: (V,) ``vec3`` projected vertices.
        min_depth: the smallest view depth a vertex may have.
        need_finite: a vertex with a non-finite coordinate is undrawable too.
        faces_out: (F, 3) int32, written.
    """
    wp.launch(
        _guard_faces_kernel,
        dim=faces_out.shape[0],
        inputs=[faces, opposite, verts_ndc, float(min_depth), int(need_finite)],
        outputs=[faces_out],
        device=faces_out.device,
        record_tape=False,
    )
