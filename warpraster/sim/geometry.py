"""Static sensor geometry: which triangles exist, where their vertices come from.

A :class:`SensorGeometry` is built once on the host (topology, per-vertex source,
per-shape colour, world membership) and packed into device arrays by
:class:`~warpraster.sim.CameraSensor`. Per-step data (particle positions, body
transforms) never passes through it: the sensor reads them from the
simulation's own device arrays.

Each sensor vertex has one source (:class:`VertexSource`):

* ``PARTICLE``: the position of particle ``index`` (cloth, soft bodies);
* ``BODY``: a rest point in the frame of body ``index``, moved by that body's
  transform (rigid meshes and tessellated primitives);
* ``STATIC``: a fixed world-space point.

Each shape belongs to one world, or to all worlds (``world=-1``, Newton's
"global" shapes such as a shared ground).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class VertexSource(enum.IntEnum):
    """Where a sensor vertex takes its world position from."""

    PARTICLE = 0
    BODY = 1
    STATIC = 2


@dataclass
class _Shape:
    world: int
    shape_index: int
    color: tuple[float, float, float]
    first_vertex: int
    vertex_count: int
    faces: np.ndarray  # (F, 3) int64, global sensor vertex indices


@dataclass
class SensorGeometry:
    """Host-side description of everything a :class:`~warpraster.sim.CameraSensor` draws.

    Add shapes with :meth:`add_particle_mesh`, :meth:`add_body_mesh` and
    :meth:`add_static_mesh`; the sensor packs them once. Each takes the same
    keyword-only shape options:

    * ``world`` (int, default 0): the world the shape belongs to, -1 for every world;
    * ``shape_index`` (int or None): the value of the ``shape_index`` channel
      (default: the order of addition);
    * ``color`` (3 floats, default white): linear RGB albedo in [0, 1] (the sensor
      keeps the colours in a device array that may require gradients).
    """

    source: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    local: list[np.ndarray] = field(default_factory=list)
    shapes: list[_Shape] = field(default_factory=list)

    # ------------------------------------------------------------------ building
    def _add(
        self,
        kind: VertexSource,
        index,
        local,
        faces,
        *,
        world: int = 0,
        shape_index: int | None = None,
        color=(1.0, 1.0, 1.0),
    ) -> int:
        """Appends one shape (the options of every ``add_*`` method are checked and
        defaulted here, once)."""
        faces = np.asarray(faces)
        if faces.ndim != 2 or faces.shape[1] != 3:
            raise ValueError(f"faces must have shape (F, 3), got {faces.shape}")
        if not np.issubdtype(faces.dtype, np.integer):
            raise TypeError(f"faces must be integers, got dtype {faces.dtype}")
        local = np.asarray(local, dtype=np.float64).reshape(-1, 3)
        nv = local.shape[0]
        if faces.size and (faces.min() < 0 or faces.max() >= nv):
            raise ValueError(
                f"faces index vertices in [{faces.min()}, {faces.max()}], outside [0, {nv - 1}]"
            )
        if not np.all(np.isfinite(local)):
            raise ValueError("vertex positions must be finite")
        if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < -1:
            raise ValueError(f"world must be an int >= -1, got {world!r}")
        color = tuple(float(c) for c in color)
        if len(color) != 3:
            raise ValueError(f"color must have 3 components, got {color!r}")
        first = len(self.source)
        self.source.extend([int(kind)] * nv)
        self.index.extend(np.broadcast_to(np.asarray(index, dtype=np.int64), (nv,)).tolist())
        self.local.append(local)
        if shape_index is None:
            shape_index = len(self.shapes)
        self.shapes.append(
            _Shape(int(world), int(shape_index), color, first, nv, faces.astype(np.int64) + first)
        )
        return len(self.shapes) - 1

    def add_particle_mesh(self, particle_indices, faces, **options: Any) -> int:
        """Adds a triangle mesh whose vertices are simulation particles.

        Args:
            particle_indices: (V,) int, the particle of each mesh vertex.
            faces: (F, 3) int, indices into ``particle_indices`` (counter-clockwise
                seen from the front).
            **options: the shape options (``world``, ``shape_index``, ``color``).

        Returns:
            The shape's position in :attr:`shapes` (its row in ``shape_colors``).
        """
        idx = np.asarray(particle_indices, dtype=np.int64).reshape(-1)
        if idx.size and idx.min() < 0:
            raise ValueError("particle_indices must be >= 0")
        return self._add(VertexSource.PARTICLE, idx, np.zeros((idx.size, 3)), faces, **options)

    def add_body_mesh(self, body: int, vertices, faces, **options: Any) -> int:
        """Adds a rigid triangle mesh attached to body ``body`` (``body=-1``: static).

        Args:
            body: index into the body transform array (``wp.transform``, body to
                world) passed to :meth:`CameraSensor.update`; -1 for a static mesh.
            vertices: (V, 3) rest positions in the body frame.
            faces: (F, 3) int, counter-clockwise seen from outside.
            **options: the shape options (``world``, ``shape_index``, ``color``).

        Returns:
            The shape's position in :attr:`shapes`.
        """
        if body < 0:
            return self.add_static_mesh(vertices, faces, **options)
        return self._add(VertexSource.BODY, int(body), vertices, faces, **options)

    def add_static_mesh(self, vertices, faces, **options: Any) -> int:
        """Adds a fixed triangle mesh given in world coordinates (``vertices`` (V, 3),
        ``faces`` (F, 3) int; the shape options as keywords); returns its position
        in :attr:`shapes`."""
        return self._add(VertexSource.STATIC, -1, vertices, faces, **options)

    # ------------------------------------------------------------------ packing
    @property
    def num_vertices(self) -> int:
        return len(self.source)

    def packed_vertices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source int32 (V,), index int32 (V,), local float32 (V, 3))."""
        local = np.concatenate(self.local) if self.local else np.zeros((0, 3))
        return (
            np.asarray(self.source, dtype=np.int32),
            np.asarray(self.index, dtype=np.int32),
            local.astype(np.float32),
        )

    def max_index(self, kind: VertexSource) -> int:
        """Largest particle or body index used (-1 when none)."""
        src, idx, _ = self.packed_vertices()
        sel = idx[src == int(kind)]
        return int(sel.max()) if sel.size else -1

    def images(self, world_count: int, camera_count: int):
        """Packs the per-image batch: image ``n = w * camera_count + c`` draws every
        shape of world ``w`` and every shape of world -1, seen by camera ``c``.

        Returns:
            dict of NumPy arrays: ``proj_vertex`` (P,) the sensor vertex of each
            projected vertex, ``proj_image`` (P,) its image; ``faces`` (F, 3)
            indices into the projected vertices; ``face_shape`` (F,) the shape
            (row of :attr:`shapes`) of each packed face; ``face_vertices`` (F, 3)
            the sensor vertices of each packed face; ``first`` and ``count`` (N,)
            the per-image face ranges.
        """
        for s in self.shapes:
            if s.world >= world_count:
                raise ValueError(
                    f"a shape belongs to world {s.world}, but world_count={world_count}"
                )
        proj_vertex, proj_image, faces, face_shape, face_vertices = [], [], [], [], []
        first, count = [], []
        n_proj = 0
        n_faces = 0
        for w in range(world_count):
            shapes = [i for i, s in enumerate(self.shapes) if s.world in (w, -1)]
            for c in range(camera_count):
                img = w * camera_count + c
                first.append(n_faces)
                img_faces = 0
                for si in shapes:
                    s = self.shapes[si]
                    verts = np.arange(s.first_vertex, s.first_vertex + s.vertex_count)
                    proj_vertex.append(verts)
                    proj_image.append(np.full(verts.size, img))
                    faces.append(s.faces - s.first_vertex + n_proj)
                    face_vertices.append(s.faces)
                    face_shape.append(np.full(len(s.faces), si))
                    n_proj += verts.size
                    img_faces += len(s.faces)
                count.append(img_faces)
                n_faces += img_faces

        def cat(parts, shape):
            return np.concatenate(parts).astype(np.int32) if parts else np.zeros(shape, np.int32)

        return {
            "proj_vertex": cat(proj_vertex, (0,)),
            "proj_image": cat(proj_image, (0,)),
            "faces": cat(faces, (0, 3)).reshape(-1, 3),
            "face_shape": cat(face_shape, (0,)),
            "face_vertices": cat(face_vertices, (0, 3)).reshape(-1, 3),
            "first": np.asarray(first, np.int32),
            "count": np.asarray(count, np.int32),
        }

    def all_faces(self) -> np.ndarray:
        """(F, 3) int32 faces of every shape, in sensor vertex indices."""
        parts = [s.faces for s in self.shapes]
        return (
            (np.concatenate(parts) if parts else np.zeros((0, 3))).astype(np.int32).reshape(-1, 3)
        )

    def shape_colors(self) -> np.ndarray:
        return np.asarray([s.color for s in self.shapes], dtype=np.float32).reshape(-1, 3)

    def shape_indices(self) -> np.ndarray:
        return np.asarray([s.shape_index for s in self.shapes], dtype=np.int64).reshape(-1)


__all__ = ["SensorGeometry", "VertexSource"]
