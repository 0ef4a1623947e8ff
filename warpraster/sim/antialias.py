"""The sensor's antialias pass: edges with gradients for a hard (K = 1) sensor image.

``CameraSensor(..., antialias=True)`` runs :class:`warpraster.Antialias`
(nvdiffrast's analytic antialias, :mod:`warpraster.antialiasing`) on the colour
that the channel kernel shades from the sharp pass, and the frame's ``color``
is its result: where a silhouette or occlusion edge crosses between two pixel
centres, the two colours are blended by where it crosses, so a loss of
``frame.color`` has gradients with respect to where the edges are. It is the
alternative to the soft outlines (``silhouette_sigma > 0``): the two are not
combined.

Per frame slot, built once (:class:`FrameAntialias`): the faces the op reads, the
op (its pair buffers hold the slot's recorded call until its backward has run)
and float32 ``(N, H, W, 3)`` views of the slot's vec3 ``(world, camera, H, W)``
colour buffers (the same memory, N = world x camera). A call allocates nothing
and reads nothing back (capturable).

Faces: the edge topology is that of the sensor's packed faces (which index the
projected vertices ``frame.ndc``), built once. The rasterizer drops a face with a
vertex that is not finite or not in front of the camera (view depth below
:data:`warpraster.geometry.EPS`); such a vertex has no meaningful projection, so
each call first writes the faces the op reads: a face with such a corner, or
with such an opposite vertex across one of its edges, becomes degenerate (its
first corner three times), which the op never blends across (the USD stage's
rule for faces at its near plane, :mod:`warpraster.usd.antialias`).

Gradients: the op's hand-written adjoint adds into ``hard_color.grad`` (what the
channel kernel's adjoint, generated or the sensor's deterministic one, reads as
the colour gradient) and into ``frame.ndc.grad`` (x, y): Warp's generated
projection adjoint consumes it (``deterministic=False``), the deterministic
backward adds it in its per-projection gather (``gathers.proj_gather_kernel``).
The op is recorded after the sensor's update, so its backward runs first; with
``deterministic=True`` it sums in a fixed order too.
"""

from __future__ import annotations

import copy

import warp as wp

from ..antialiasing import Antialias, AntialiasTopology
from ..antialiasing.guard import guard_faces
from ..geometry import EPS

__all__ = ["FrameAntialias", "sensor_topology"]


def sensor_topology(sensor) -> AntialiasTopology:
    """The edge topology of ``sensor``'s packed faces over its projected vertices
    (host work, once per sensor)."""
    return AntialiasTopology(sensor.faces, sensor.proj_vertex.shape[0], sensor.device)


def _float_view(a: wp.array) -> wp.array:
    """A vec3 ``(world, camera, H, W)`` image as float32 ``(world camera, H, W, 3)``, the
    same memory (and its gradient's, viewed the same way)."""
    if not a.is_contiguous:  # the sensor allocates its channels contiguous
        raise ValueError("the sensor's colour buffers must be contiguous")
    w, c, h, wd = a.shape
    shape = (w * c, h, wd, 3)
    grad = None
    if a.grad is not None:
        grad = wp.array(ptr=a.grad.ptr, dtype=wp.float32, shape=shape, device=a.device)
        grad._ref = a.grad  # keeps the owner alive
    view = wp.array(ptr=a.ptr, dtype=wp.float32, shape=shape, device=a.device, grad=grad)
    view._ref = a
    return view


class FrameAntialias:
    """One frame slot's antialias pass: its faces, op and colour views, built once.

    Args:
        topology: :func:`sensor_topology` of the sensor (shared by its slots).
        hard_color: the slot's shaded colour, vec3 ``(world, camera, H, W)`` (what the
            channel kernel writes).
        color: the slot's ``color`` channel, same shape: the antialiased image.
        ndc: the slot's projected vertices (P,) (with their gradient, if any).
        deterministic: the op sums its vertex gradients in a fixed order.

    Attributes:
        faces: (F, 3) int32, the faces the op reads (written by each call).
        op: the :class:`~warpraster.Antialias` object (test access: its
            ``pair_code`` holds the last recorded call's edge decisions, or every
            call's with ``op.store_pairs`` set).
    """

    def __init__(self, topology: AntialiasTopology, hard_color: wp.array, color: wp.array,
                 ndc: wp.array, *, deterministic: bool):  # fmt: skip
        dev = topology.device
        self.faces = wp.clone(topology.faces)
        # the shared opposite-vertex table, with this slot's own faces (the op's
        # backward reads the faces of the call it differentiates)
        self.topology = copy.copy(topology)
        self.topology.faces = self.faces
        self._sensor_faces = topology.faces
        self.hard = _float_view(hard_color)
        self.color = _float_view(color)
        self.ndc = ndc
        self.op = Antialias(self.topology, topology.num_verts, tuple(self.color.shape), dev,
                            deterministic=deterministic)  # fmt: skip
        self.device = dev

    def __call__(self, fragments) -> None:
        """Writes the slot's ``color`` from its hard colour and the sharp pass's K = 1
        ``fragments``; recorded on an active tape (with gradients to the hard colour
        and the projected vertices, where they have one)."""
        guard_faces(self._sensor_faces, self.topology.opposite, self.ndc, min_depth=EPS,
                    need_finite=True, faces_out=self.faces)  # fmt: skip
        self.op(self.hard, fragments.pix_to_face, self.ndc, zbuf=fragments.zbuf, out=self.color)
