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

Materials: each shape has a colour (its own row of the sensor's material table,
row ``s`` for shape ``s``); :meth:`SensorGeometry.add_material` adds shared
materials (a diffuse colour and optionally a texture, rows after the shapes'),
which a shape takes for all its faces (``material=``) or per face
(``face_materials=``). A textured material reads its texture at the shape's
UVs (``uvs=`` per vertex or ``face_uvs=`` per face corner; v = 0 is the bottom
row of the texture, USD's ``st``), as the USD stage renderer does
(:class:`warpraster.shading.atlas.Atlas`, the same table and formula).
"""

from __future__ import annotations

import enum
import math
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
    face_materials: np.ndarray | None = None  # (F,) int64 geometry material ids, or None
    face_uvs: np.ndarray | None = None  # (F, 3, 2) float32, or None
    corner_colors: np.ndarray | None = None  # (F, 3, 4) float32 for material -1, or None


@dataclass
class _Material:
    color: tuple[float, float, float]
    texture: np.ndarray | None  # (h, w, 4) float32 RGBA, row 0 the top
    wrap: tuple[int, int]  # TextureWrap of s and t
    scale: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    bias: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)


def _texture_rgba(texture) -> np.ndarray:
    """A (h, w, 3|4) linear texture in [0, 1] as float32 RGBA, checked."""
    t = np.asarray(texture, dtype=np.float64)
    if t.ndim != 3 or t.shape[2] not in (3, 4) or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"texture must have shape (h, w, 3) or (h, w, 4), got {t.shape}")
    if not (np.isfinite(t).all() and t.min() >= 0.0):
        raise ValueError("texture: texels must be finite linear values >= 0")
    if t.shape[2] == 3:
        t = np.concatenate([t, np.ones(t.shape[:2] + (1,))], axis=2)
    return t.astype(np.float32)


def _wrap_mode(value, name: str) -> int:
    from ..shading.atlas import TextureWrap

    if isinstance(value, str):
        try:
            return int(TextureWrap[value.upper()])
        except KeyError:
            raise ValueError(
                f"{name}: unknown wrap mode {value!r}; choose from "
                f"{[m.name.lower() for m in TextureWrap]}"
            ) from None
    try:
        return int(TextureWrap(value))
    except ValueError:
        raise ValueError(f"{name}: unknown wrap mode {value!r}") from None


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
      keeps the colours in a device array that may require gradients);
    * ``material`` (a material id) or ``face_materials`` ((F,) ids): materials added
      with :meth:`add_material` instead of ``color``;
    * ``uvs`` ((V, 2)) or ``face_uvs`` ((F, 3, 2)): texture coordinates (needed by a
      textured material);
    * ``corner_colors`` ((F, 3, 3|4)): linear colours per face corner, the albedo of
      the faces whose ``face_materials`` id is -1 (a USD mesh's ``displayColor``).
    """

    source: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    local: list[np.ndarray] = field(default_factory=list)
    shapes: list[_Shape] = field(default_factory=list)
    materials: list[_Material] = field(default_factory=list)

    def add_material(
        self,
        color=(1.0, 1.0, 1.0),
        texture=None,
        *,
        wrap=("repeat", "repeat"),
        scale=(1.0, 1.0, 1.0, 1.0),
        bias=(0.0, 0.0, 0.0, 0.0),
    ) -> int:
        """Adds a material shapes can share (``material=`` / ``face_materials=``).

        Args:
            color: linear RGB diffuse colour, >= 0 (multiplies the texture).
            texture: None, or an (h, w, 3|4) array of linear texels >= 0, row 0
                the top of the image (alpha is not used by the sensor).
            wrap: (s, t) wrap modes: ``"repeat"``, ``"clamp"``, ``"mirror"`` or
                ``"black"`` (:class:`~warpraster.shading.atlas.TextureWrap`).
            scale, bias: RGBA; the texture reads ``texel * scale + bias``
                (``UsdUVTexture``'s).

        Returns:
            The material id (its row in the sensor's material table is
            ``len(shapes) + id``).
        """
        color = tuple(float(c) for c in color)
        if len(color) != 3 or not all(math.isfinite(c) and c >= 0.0 for c in color):
            raise ValueError(f"color must be 3 finite linear RGB values >= 0, got {color!r}")
        tex = None if texture is None else _texture_rgba(texture)
        if isinstance(wrap, str) or len(wrap) != 2:
            raise ValueError(f"wrap must be a pair (s, t) of wrap modes, got {wrap!r}")
        modes = (_wrap_mode(wrap[0], "wrap"), _wrap_mode(wrap[1], "wrap"))
        affine = []
        for name, v in (("scale", scale), ("bias", bias)):
            v = tuple(float(c) for c in v)
            if len(v) != 4 or not all(math.isfinite(c) for c in v):
                raise ValueError(f"{name} must be 4 finite numbers (RGBA), got {v!r}")
            affine.append(v)
        self.materials.append(_Material(color, tex, modes, *affine))
        return len(self.materials) - 1

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
        material: int | None = None,
        face_materials=None,
        uvs=None,
        face_uvs=None,
        corner_colors=None,
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
        mats, corner_uvs, colors = self._shape_materials(faces, nv, material, face_materials,
                                                         uvs, face_uvs, corner_colors)  # fmt: skip
        first = len(self.source)
        self.source.extend([int(kind)] * nv)
        self.index.extend(np.broadcast_to(np.asarray(index, dtype=np.int64), (nv,)).tolist())
        self.local.append(local)
        if shape_index is None:
            shape_index = len(self.shapes)
        faces = faces.astype(np.int64) + first
        self.shapes.append(
            _Shape(
                int(world), int(shape_index), color, first, nv, faces, mats, corner_uvs, colors
            )  # fmt: skip
        )
        return len(self.shapes) - 1

    def _shape_materials(self, faces, nv, material, face_materials, uvs, face_uvs,
                         corner_colors):  # fmt: skip
        """(face material ids (F,) or None, per-corner UVs (F, 3, 2) or None, per-corner
        RGBA (F, 3, 4) or None), checked."""
        nf = faces.shape[0]
        if material is not None and face_materials is not None:
            raise ValueError("pass material or face_materials, not both")
        mats = None
        if material is not None:
            face_materials = np.full(nf, material)
        if face_materials is not None:
            mats = np.asarray(face_materials)
            if mats.shape != (nf,) or not np.issubdtype(mats.dtype, np.integer):
                raise ValueError(f"face_materials must be (F,) = ({nf},) integers, got "
                                 f"{mats.shape} {mats.dtype}")  # fmt: skip
            lowest = -1 if corner_colors is not None else 0
            if mats.size and (mats.min() < lowest or mats.max() >= len(self.materials)):
                raise ValueError(
                    f"face_materials / material: ids must be materials added with "
                    f"add_material, in [0, {len(self.materials) - 1}] (or -1 with "
                    f"corner_colors), got [{mats.min()}, {mats.max()}]"
                )
            mats = mats.astype(np.int64)
        colors = None
        if corner_colors is not None:
            colors = np.asarray(corner_colors, dtype=np.float64)
            if colors.ndim != 3 or colors.shape[:2] != (nf, 3) or colors.shape[2] not in (3, 4):
                raise ValueError(
                    f"corner_colors must have shape (F, 3, 3|4) = ({nf}, 3, 3|4), got "
                    f"{colors.shape}"
                )
            if not (np.isfinite(colors).all() and colors.min() >= 0.0):
                raise ValueError("corner_colors must be finite linear values >= 0")
            if colors.shape[2] == 3:
                colors = np.concatenate([colors, np.ones((nf, 3, 1))], axis=2)
            colors = colors.astype(np.float32)
        if uvs is not None and face_uvs is not None:
            raise ValueError("pass uvs or face_uvs, not both")
        corner_uvs = None
        if uvs is not None:
            uvs = np.asarray(uvs, dtype=np.float64)
            if uvs.shape != (nv, 2):
                raise ValueError(f"uvs must have shape (V, 2) = ({nv}, 2), got {uvs.shape}")
            corner_uvs = uvs[faces]
        elif face_uvs is not None:
            corner_uvs = np.asarray(face_uvs, dtype=np.float64)
            if corner_uvs.shape != (nf, 3, 2):
                raise ValueError(
                    f"face_uvs must have shape (F, 3, 2) = ({nf}, 3, 2), got {corner_uvs.shape}"
                )
        if corner_uvs is not None and not np.isfinite(corner_uvs).all():
            raise ValueError("uvs / face_uvs must be finite")
        textured = mats is not None and any(self.materials[m].texture is not None
                                            for m in np.unique(mats) if m >= 0)  # fmt: skip
        if textured and corner_uvs is None:
            raise ValueError("a textured material needs the shape's uvs (or face_uvs)")
        return mats, None if corner_uvs is None else corner_uvs.astype(np.float32), colors

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
            the sensor vertices of each packed face; ``face_source`` (F,) its row
            of :meth:`all_faces` (and of :meth:`face_tables`); ``first`` and
            ``count`` (N,) the per-image face ranges.
        """
        for s in self.shapes:
            if s.world >= world_count:
                raise ValueError(
                    f"a shape belongs to world {s.world}, but world_count={world_count}"
                )
        proj_vertex, proj_image, faces, face_shape, face_vertices = [], [], [], [], []
        face_source = []
        face_offset = np.concatenate([[0], np.cumsum([len(s.faces) for s in self.shapes])])
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
                    face_source.append(face_offset[si] + np.arange(len(s.faces)))
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
            "face_source": cat(face_source, (0,)),
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

    def _face_rows(self, si: int) -> np.ndarray:
        """Material-table rows of shape si's faces: its own row si, or its materials'."""
        s = self.shapes[si]
        if s.face_materials is None:
            return np.full(len(s.faces), si)
        return np.where(s.face_materials < 0, -1, s.face_materials + len(self.shapes))

    def face_tables(self) -> dict:
        """Per face of :meth:`all_faces`: ``face_material`` (F_s,) its material-table
        row (-1: its corner colours), ``corner_uv`` (F_s, 3, 2) and ``corner_color``
        (F_s, 3, 4) (zeros where a shape has none)."""
        rows, uvs, colors = [], [], []
        for si, s in enumerate(self.shapes):
            nf = len(s.faces)
            rows.append(self._face_rows(si))
            uvs.append(np.zeros((nf, 3, 2), np.float32) if s.face_uvs is None else s.face_uvs)
            colors.append(
                np.zeros((nf, 3, 4), np.float32) if s.corner_colors is None else s.corner_colors
            )
        return {
            "face_material": np.concatenate(rows).astype(np.int32)
            if rows
            else np.zeros(0, np.int32),
            "corner_uv": np.concatenate(uvs).reshape(-1, 3, 2) if uvs else np.zeros((0, 3, 2)),
            "corner_color": np.concatenate(colors).reshape(-1, 3, 4)
            if colors
            else np.zeros((0, 3, 4)),
        }

    def material_table(self) -> dict:
        """The sensor's material table, the keyword arguments of an
        :class:`~warpraster.shading.atlas.Atlas`: a row per shape (its colour), then
        a row per material added with :meth:`add_material`."""
        diffuse = [s.color for s in self.shapes] + [m.color for m in self.materials]
        textures = [None] * len(self.shapes) + [
            None if m.texture is None else (m.texture, m.wrap[0], m.wrap[1], m.scale, m.bias)
            for m in self.materials
        ]
        return {"diffuse": np.asarray(diffuse, np.float32).reshape(-1, 3),
                "opacity": np.ones(len(diffuse), np.float32), "textures": textures}  # fmt: skip

    @property
    def varying_albedo(self) -> bool:
        """Whether some face's albedo varies over it (a texture, or corner colours)."""
        return self.textured or any(
            s.face_materials is not None
            and s.corner_colors is not None
            and (s.face_materials < 0).any()
            for s in self.shapes
        )

    @property
    def textured(self) -> bool:
        """Whether a shape uses a textured material."""
        return any(
            s.face_materials is not None
            and any(
                self.materials[m].texture is not None for m in np.unique(s.face_materials) if m >= 0
            )
            for s in self.shapes
        )

    def shape_indices(self) -> np.ndarray:
        return np.asarray([s.shape_index for s in self.shapes], dtype=np.int64).reshape(-1)


__all__ = ["SensorGeometry", "VertexSource"]
