"""Near-plane clipping and frustum culling on the device, and the map back to source faces.

This is PyTorch3D's ``pytorch3d/renderer/mesh/clip.py`` as Warp kernels that never
read device data on the host, so a render that clips can be captured in a graph.

Every face of the packed input falls in one of PyTorch3D's cases:

* **keep**: no vertex behind ``z_clip_value`` and not culled: copied unchanged;
* **drop**: all three vertices behind the plane, or culled by the frustum test;
* **triangle**: two vertices behind: replaced by the smaller triangle
  ``(p4, p5, p1)`` where ``p1`` is the vertex in front and ``p4``/``p5`` the
  crossings of edges ``p1->p2`` and ``p1->p3`` (``p2, p3`` follow ``p1`` in the
  face's vertex order);
* **quad**: one vertex (``p1``) behind: the quad in front is split into
  ``t1 = (p4, p2, p5)`` and ``t2 = (p5, p2, p3)``, marked as each other's neighbour.

Output order is PyTorch3D's: the clipped list is the original face order with
dropped faces removed and each quad's ``t2`` right after its ``t1`` (an exclusive
scan of 0/1/2 outputs per face). Meshes stay contiguous and in order, so mesh n
owns ``[first[n], first[n] + count[n])`` of the clipped list.

The crossings are ``p = p1 * (1 - w) + q * w`` with ``w = (p1.z - c) / (p1.z - q.z)``;
with ``perspective_correct`` their x, y are interpolated on ``xy * z`` and divided
by ``c`` (x, y are NDC, z is view depth). As in PyTorch3D, the weight of the
``p1->p3`` crossing is detached (no gradient flows through it), the ``p1->p2`` one
is not.

Frustum culling (``cull_to_frustum``) has two rules (:class:`FrustumCullRule`);
the default reproduces PyTorch3D 0.7.9 exactly, including its indexing slip.

Memory layout of :class:`ClipBuffers` for V vertices and F faces: the clipped
vertices are the V input vertices followed by two slots per input face
(``V + 2f`` holds ``p4``, ``V + 2f + 1`` holds ``p5`` of face f, when it is
clipped); the clipped faces have capacity ``2F``. Slots past the clipped total
hold the degenerate face (0, 0, 0), which no mesh range covers.

Buffers made with ``static_faces`` (the ``Renderer``'s and the sensor's: every call
passes the same faces and mesh ranges) skip the pass when it would rewrite what
they hold: the vertex copy tests each vertex against the plane, and the
rest of the pass runs under one ``wp.capture_if`` only when a vertex is behind it
or the list held is not the input's (a device flag the topology pass writes; the
pass's scan there is :class:`warpraster.scan.ExclusiveScan`, which allocates
nothing when it runs, as a conditional node's body must). Skipping applies to
graph-captured calls on CUDA (a conditional node; an eager call would read the
flag back) and to every call on the cpu device; calls recorded on a tape and
frustum culling run the whole pass.

Modules, in the order they build on each other: ``buffers.py`` (the device
buffers, the structs the kernels read of them, the face cases), ``frustum.py``
(the cull rules), ``split.py`` (the clip pass: :func:`clip_faces`, differentiable
in the crossings) and ``map_back.py`` (:func:`unclip_fragments`,
:func:`unclip_in_place` and their hand-written adjoints).
"""

from .buffers import ClipBuffers
from .frustum import FrustumCullRule
from .map_back import unclip_fragments, unclip_in_place
from .split import clip_faces

__all__ = [
    "ClipBuffers",
    "FrustumCullRule",
    "clip_faces",
    "unclip_fragments",
    "unclip_in_place",
]
