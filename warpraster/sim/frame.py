"""A sensor frame slot: the buffers one :meth:`CameraSensor.update` writes.

Every frame slot owns its buffers (the tape needs the old values of a recorded
frame): render frame ``t`` of a rollout into slot ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from .. import ClipWorkspace, RasterWorkspace
from .antialias import FrameAntialias
from .kernel_args import Channels, FrameScene

__all__ = ["SensorFrame", "select_channels"]

#: Every image channel of a frame, in the order of the channel kernel's bits.
CHANNELS = ("color", "albedo", "normal", "depth", "forward_depth", "alpha", "shape_index")


@dataclass
class SensorFrame:
    """The buffers of one frame slot (all on the sensor's device).

    Image outputs have shape ``(world_count, camera_count, H, W)``:

    Attributes:
        color: vec3, linear RGB, shaded (Newton's ``hdr_color``), composited over
            ``clear_color`` by ``alpha``; with ``antialias``, ``hard_color``
            antialiased.
        albedo: vec3, linear unshaded colour (premultiplied by ``alpha``).
        normal: vec3, world-space face normal (counter-clockwise front), zero
            where empty.
        depth: float32, ray-hit distance from the camera centre (Newton's
            ``depth``), ``clear_depth`` where empty.
        forward_depth: float32, view-space depth along the camera's -Z axis.
        alpha: float32, coverage: 1 / 0 (hard) or the soft silhouette.
        shape_index: uint32, the shape's index, 0xFFFFFFFF where empty (a pixel
            only reached by the soft silhouette's blur counts as empty).
        points: vec3 (V,), world positions of the sensor vertices (with
            ``deterministic``, its ``.grad`` holds the last backward's gradient of
            these points, overwritten by each backward of the slot).
        ndc: vec3 (P,), projected vertices of every image (with ``deterministic``
            its ``.grad`` holds only the antialias pass's gradient, if any: the
            backward goes from the faces to the points directly).
        vertex_normals: vec3 (V,), area-weighted vertex normals (``smooth_normals``).
        workspace: the frame's rasterizer buffers (its ``fragments``), sharp pass.
        soft_workspace: those of the blurred pass (``silhouette_sigma > 0`` only).
        hard_color: vec3, the shaded colour before the antialias pass (``antialias``
            only; else None).
        antialias: the slot's :class:`~warpraster.sim.antialias.FrameAntialias`
            (``antialias`` only; else None).
        names: the channels the sensor writes (its ``channels``); the others are
            empty arrays of shape ``(world_count, camera_count, 0, 0)``.
    """

    color: wp.array
    albedo: wp.array
    normal: wp.array
    depth: wp.array
    forward_depth: wp.array
    alpha: wp.array
    shape_index: wp.array
    points: wp.array
    ndc: wp.array
    vertex_normals: wp.array
    workspace: RasterWorkspace | ClipWorkspace
    soft_workspace: RasterWorkspace | None = None
    #: ``ndc``'s memory without a gradient (the deterministic backward's raster input).
    ndc_nograd: wp.array | None = None
    #: The kernels' structs of the arrays above (built once with the slot): all a
    #: pixel reads (with the sensor's model and materials), the channels written.
    scene: FrameScene | None = None
    channels: Channels | None = None
    hard_color: wp.array | None = None
    antialias: FrameAntialias | None = None
    names: tuple[str, ...] = CHANNELS

    CHANNELS = CHANNELS

    #: its gradient arrays are its own: cleared when a recorded update writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def written(self, name: str) -> wp.array:
        """The array the channel kernel writes for channel ``name`` (``hard_color``
        for ``color`` with antialias): its ``.grad`` is what the kernel's adjoint reads."""
        if name == "color" and self.hard_color is not None:
            return self.hard_color
        return getattr(self, name)

    def numpy(self) -> dict[str, np.ndarray]:
        """Host copies of the image channels the sensor writes (reads the device).

        Each array is a copy of its own (on the ``cpu`` device too, where
        ``wp.array.numpy()`` is a view): frames kept from a loop over one slot
        keep their values when the next update rewrites the slot.
        """
        return {name: np.array(getattr(self, name).numpy()) for name in self.names}


def select_channels(channels, grad_channels, antialias: bool) -> tuple[tuple[str, ...], frozenset]:
    """(the channels written, in :data:`CHANNELS` order; the channels with gradient
    buffers) of a sensor's ``channels`` and ``grad_channels`` arguments (None: every
    channel; every float channel written). Raises TypeError / ValueError naming the
    argument."""
    for arg, given in (("channels", channels), ("grad_channels", grad_channels)):
        if isinstance(given, str):
            raise TypeError(f"{arg} must be a sequence of channel names, not a string")
        if given is not None:
            unknown = set(given) - set(CHANNELS)
            if unknown:
                raise ValueError(f"{arg}: unknown {sorted(unknown)}; choose from {CHANNELS}")
    written = CHANNELS if channels is None else tuple(c for c in CHANNELS if c in set(channels))
    if not written:
        raise ValueError("channels must name at least one channel")
    floats = [c for c in written if c != "shape_index"]
    grads = frozenset(floats if grad_channels is None else grad_channels)
    if "shape_index" in grads:
        raise ValueError("grad_channels: shape_index is an integer channel (no gradient)")
    unwritten = grads - set(written)
    if unwritten:
        raise ValueError(f"grad_channels: {sorted(unwritten)} not among the channels written "
                         f"(channels={written})")  # fmt: skip
    if antialias and "color" not in written:
        raise ValueError("antialias: the antialias pass writes the colour; include 'color' "
                         "in channels")  # fmt: skip
    return written, grads
