"""One :class:`~warpraster.sim.CameraSensor` per device, each for its own worlds.

A :class:`MultiDeviceSensor` splits W simulated worlds over several Warp devices
(typically one simulation per GPU): device ``i`` renders the contiguous worlds
``shard_frames(W, i, len(devices))`` (:func:`warpraster.distributed.shard_frames`,
balanced, in order), with a :class:`CameraSensor` whose static geometry holds only
the shapes of those worlds and the shapes of world -1 (shared by every world,
hence drawn on every device).

The split happens once, at construction, from one host-side
:class:`~warpraster.sim.SensorGeometry` of all worlds. Per step, each device
reads the arrays the simulation on that device owns::

    sensor = MultiDeviceSensor(geometry, devices=["cuda:0", "cuda:1"],
                               world_count=W, camera_count=C, image_size=64,
                               body_offsets=[0, body_world_start[W // 2] - body_world_start[0]])
    frames = sensor.update(
        camera_transforms=[sims[i].camera_q for i in range(2)],  # (C, W_i) on device i
        camera_fovs=[sims[i].fovs for i in range(2)],            # (C,) on device i
        body_q=[sims[i].state.body_q for i in range(2)],
    )
    # frames[i]: device i's SensorFrame, images (W_i, C, H, W)
    depth = sensor.gather("depth")  # host (W, C, H, W), for inspection only

Index numbering per device: a shape of one of device ``i``'s own worlds reads
body ``index - body_offsets[i]`` of that device's ``body_q`` (and particle
``index - particle_offsets[i]`` of its ``particle_q``), where ``index`` is the
shape's body/particle in the global geometry. Shapes of world -1 keep their
global indices on every device (so they must be static, or read bodies/particles
that every device's simulation numbers the same way, e.g. placed before the
per-world ones). With Newton-style per-world blocks (world ``w``'s bodies are
``body_world_start[w] .. body_world_start[w + 1] - 1`` in the model of all worlds,
and each device's model holds the world -1 bodies first, then its own worlds in
order), ``body_offsets[i] = body_world_start[first_world_i] - body_world_start[0]``.
Offsets of 0 (the default) mean every device's arrays are numbered like the
global model (e.g. a full copy of the state on every device).

Contract per device, as for :class:`CameraSensor`: after set-up, an update
allocates nothing and reads nothing back, so each device's step can be
captured in its own graph (``wp.ScopedCapture(device=...)`` around
``sensor.sensors[i].update(...)``, or around the whole :meth:`update` when every
device is the same one). Gradients flow per device: a loss on
``frames[i]`` recorded on a ``wp.Tape`` reaches device ``i``'s inputs (body and
particle arrays, camera transforms, fields of view, and with
``material_grad=True`` that device's ``shape_colors`` and lights); summing the
gradients of parameters shared between devices (all-reduce) is the caller's job.
:meth:`gather` and :meth:`numpy` read every device back: outside the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import warp as wp

from ..distributed import shard_frames
from .geometry import SensorGeometry, VertexSource
from .sensor import (
    CameraSensor,
    SensorFrame,
    check_array,
    check_frame,
    check_int,
    check_source,
)


def _offsets(value, name: str, count: int) -> list[int]:
    if value is None:
        return [0] * count
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a sequence of {count} ints (one per device), got {value!r}"
        )
    if len(value) != count:
        raise ValueError(f"{name} must have one entry per device ({count}), got {len(value)}")
    return [check_int(v, f"{name}[{i}]", 0) for i, v in enumerate(value)]


def _shard_geometry(
    geometry: SensorGeometry, worlds: range, body_offset: int, particle_offset: int, device: int
) -> tuple[SensorGeometry, list[int]]:
    """The shapes of ``worlds`` (renumbered from 0) and of world -1, in their global
    order, with re-based body/particle indices. Returns (geometry, global shape rows)."""
    src, idx, local = geometry.packed_vertices()
    sub = SensorGeometry()
    rows = []
    for row, s in enumerate(geometry.shapes):
        if s.world != -1 and s.world not in worlds:
            continue
        world = -1 if s.world == -1 else s.world - worlds.start
        verts = slice(s.first_vertex, s.first_vertex + s.vertex_count)
        faces = s.faces - s.first_vertex
        kind = VertexSource(int(src[verts][0])) if s.vertex_count else VertexSource.STATIC
        kw = dict(world=world, shape_index=s.shape_index, color=s.color)
        if kind == VertexSource.STATIC:
            sub.add_static_mesh(local[verts], faces, **kw)
            rows.append(row)
            continue
        offset = body_offset if kind == VertexSource.BODY else particle_offset
        offset = 0 if s.world == -1 else offset
        index = idx[verts].astype(np.int64) - offset
        if index.min() < 0:
            what = "body" if kind == VertexSource.BODY else "particle"
            raise ValueError(
                f"{what}_offsets[{device}] = {offset} is larger than {what} "
                f"{int(idx[verts].min())} of shape {row} (world {s.world}, on device {device})"
            )
        if kind == VertexSource.BODY:
            sub.add_body_mesh(int(index[0]), local[verts], faces, **kw)
        else:
            sub.add_particle_mesh(index, faces, **kw)
        rows.append(row)
    if sub.num_vertices == 0:
        # no shape in these worlds and none shared: one vertex, no face, so the
        # device renders the clear values like the worlds' images of a single sensor
        sub.add_static_mesh(np.zeros((1, 3)), np.zeros((0, 3), np.int64), world=-1)
    return sub, rows


class MultiDeviceSensor:
    """Renders W worlds x C cameras split over devices, one :class:`CameraSensor` each.

    Args:
        geometry: the static scene of all W worlds (host-side; split once here).
        devices: the Warp devices, one shard of worlds each (a device may repeat,
            e.g. ``["cpu", "cpu"]``; at most ``world_count`` devices).
        world_count: W, the total number of worlds.
        camera_count: C, cameras per world (the same on every device).
        body_offsets: per device, subtracted from the body index of the shapes of
            that device's own worlds (default all 0; see the module docstring).
        particle_offsets: the same for particle indices.
        **sensor_options: keyword options of :class:`CameraSensor` (``image_size``,
            ``frames``, ``silhouette_sigma``, ``clear_color``, ``clear_depth``,
            lights, ``requires_grad``, ``material_grad``, ``grad_channels``, ...),
            the same for every device; not ``device``.

    Attributes:
        sensors: the per-device :class:`CameraSensor` (``sensors[i].update`` is
            the step of device ``i`` alone, for one thread or process per GPU).
        world_ranges: the global worlds of each device (``range``).
        shape_rows: per device, the row in ``geometry.shapes`` of each row of that
            sensor's ``shape_colors`` (a device whose worlds have no shape and
            no world -1 shape holds one empty placeholder shape, not listed).
    """

    def __init__(
        self,
        geometry: SensorGeometry,
        *,
        devices: Sequence,
        world_count: int,
        camera_count: int = 1,
        body_offsets: Sequence[int] | None = None,
        particle_offsets: Sequence[int] | None = None,
        **sensor_options,
    ):
        if not isinstance(geometry, SensorGeometry):
            raise TypeError(f"geometry must be a SensorGeometry, got {type(geometry).__name__}")
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
            raise TypeError(f"devices must be a sequence of Warp devices, got {devices!r}")
        if len(devices) == 0:
            raise ValueError("devices must name at least one device")
        self.world_count = check_int(world_count, "world_count")
        self.camera_count = check_int(camera_count, "camera_count")
        if len(devices) > self.world_count:
            raise ValueError(
                f"devices: {len(devices)} devices for {self.world_count} worlds "
                f"(every device needs at least one world)"
            )
        if "device" in sensor_options:
            raise TypeError("device is not an option here: pass devices=[...]")
        if geometry.num_vertices == 0:
            raise ValueError("geometry has no shapes")
        for s in geometry.shapes:
            if s.world >= self.world_count:
                raise ValueError(
                    f"a shape belongs to world {s.world}, but world_count={self.world_count}"
                )
        n = len(devices)
        bodies = _offsets(body_offsets, "body_offsets", n)
        particles = _offsets(particle_offsets, "particle_offsets", n)
        self.devices = [wp.get_device(d) for d in devices]
        self.world_ranges = [shard_frames(self.world_count, i, n) for i in range(n)]
        shards = [
            _shard_geometry(geometry, worlds, bodies[i], particles[i], i)
            for i, worlds in enumerate(self.world_ranges)
        ]
        self.geometry = geometry
        self.shape_rows = [rows for _, rows in shards]
        self.sensors = [
            CameraSensor(
                sub,
                world_count=len(worlds),
                camera_count=self.camera_count,
                device=dev,
                **sensor_options,
            )  # fmt: skip
            for (sub, _), worlds, dev in zip(shards, self.world_ranges, self.devices, strict=True)
        ]
        self.image_size = self.sensors[0].image_size
        self.frame_count = self.sensors[0].frame_count

    # ------------------------------------------------------------------ checks
    def _per_device(self, value, name: str) -> list:
        n = len(self.sensors)
        if value is None:
            return [None] * n
        if isinstance(value, wp.array) or not isinstance(value, Sequence):
            raise TypeError(
                f"{name} must be a sequence of {n} wp.arrays (one per device), "
                f"got {type(value).__name__}"
            )
        if len(value) != n:
            raise ValueError(f"{name} must have one array per device ({n}), got {len(value)}")
        return list(value)

    # ------------------------------------------------------------------ per step
    def update(
        self,
        *,
        camera_transforms: Sequence[wp.array],
        camera_fovs: Sequence[wp.array],
        particle_q: Sequence[wp.array] | None = None,
        body_q: Sequence[wp.array] | None = None,
        frame: int = 0,
    ) -> list[SensorFrame]:
        """Renders every device's worlds into its frame slot ``frame``.

        Every device's inputs are checked (metadata only, on the host) before any
        device launches a kernel; then each device's :meth:`CameraSensor.update`
        is launched in turn (on CUDA the launches are asynchronous, so the
        devices render at the same time). Allocates nothing and reads nothing back.

        Args:
            camera_transforms: per device ``i``, ``wp.array2d`` of ``wp.transform``
                ``(C, W_i)`` on device ``i``: camera to world of its worlds
                (column ``j`` is global world ``world_ranges[i][j]``).
            camera_fovs: per device, float32 ``(C,)`` on that device [rad].
            particle_q: per device, vec3 particle positions (local numbering, see
                ``particle_offsets``); required when the device's shapes use particles.
            body_q: per device, ``wp.transform`` body to world (local numbering,
                see ``body_offsets``); required when the device's shapes use bodies.
            frame: the frame slot to render into (the same on every device).

        Returns:
            Device ``i``'s :class:`SensorFrame` at position ``i``: images
            ``(W_i, C, H, W)``, overwritten by the next update of that slot.
        """
        check_frame(frame, self.frame_count)
        cams = self._per_device(camera_transforms, "camera_transforms")
        fovs = self._per_device(camera_fovs, "camera_fovs")
        parts = self._per_device(particle_q, "particle_q")
        bods = self._per_device(body_q, "body_q")
        c = self.camera_count
        for i, s in enumerate(self.sensors):
            name = f"camera_transforms[{i}]"
            check_array(cams[i], name, wp.transform, s.device, c, 2)
            if tuple(cams[i].shape) != (c, s.world_count):
                raise ValueError(
                    f"{name} must have shape {(c, s.world_count)}, got {cams[i].shape}"
                )
            check_array(fovs[i], f"camera_fovs[{i}]", wp.float32, s.device, c)
            if s.num_particles > 0:
                check_source(parts[i], f"particle_q[{i}]", wp.vec3, s.device, s.num_particles,
                             f"device {i}'s shapes use particles")  # fmt: skip
            if s.num_bodies > 0:
                check_source(bods[i], f"body_q[{i}]", wp.transform, s.device, s.num_bodies,
                             f"device {i}'s shapes use bodies")  # fmt: skip
        return [
            s.update(
                camera_transforms=cams[i],
                camera_fovs=fovs[i],
                particle_q=parts[i] if s.num_particles > 0 else None,
                body_q=bods[i] if s.num_bodies > 0 else None,
                frame=frame,
            )  # fmt: skip
            for i, s in enumerate(self.sensors)
        ]

    # ------------------------------------------------------------------ inspection
    def gather(self, channel: str, *, frame: int = 0) -> np.ndarray:
        """One host array ``(W, C, H, W[, 3])`` of ``channel`` over all devices, worlds
        in global order. Reads every device back (waits for it): for inspection,
        logging and tests, outside the simulation step.

        Args:
            channel: one of the channels the sensors write (``channels``; all of
                :attr:`SensorFrame.CHANNELS` by default).
            frame: the frame slot.
        """
        names = self.sensors[0].channels
        if channel not in names:
            raise ValueError(f"channel must be one of the channels written {names}, "
                             f"got {channel!r}")  # fmt: skip
        check_frame(frame, self.frame_count)
        return np.concatenate(
            [getattr(s.frames[frame], channel).numpy() for s in self.sensors], axis=0
        )

    def numpy(self, *, frame: int = 0) -> dict[str, np.ndarray]:
        """:meth:`gather` of every channel written (host read, outside the step)."""
        return {name: self.gather(name, frame=frame) for name in self.sensors[0].channels}


__all__ = ["MultiDeviceSensor"]
