"""``UsdGeom.Mesh`` prims to one packed, world-space triangle list.

Read once per mesh (topology, primvars, material per triangle; NumPy over whole
arrays), then evaluated at any time: world positions from the points at that
time and ``UsdGeom.XformCache`` (row vectors: ``p @ M[:3, :3] + M[3, :3]``).

What is drawn: every ``UsdGeom.Mesh`` reached by
``Usd.PrimRange.Stage(stage, Usd.TraverseInstanceProxies())`` (instances
included), skipping subtrees whose ``visibility`` is ``invisible`` or whose
``purpose`` is not in ``purposes`` (``default`` and ``render`` by default);
implicit gprims (Cube, Sphere, Cylinder, Cone, Capsule, Plane) tessellated;
every instance of a ``UsdGeom.PointInstancer`` (its prototypes' meshes placed
by ``ComputeInstanceTransformsAtTime``; prototypes are not drawn on their own).
The instance count and the implicit prims' sizes are read at the load time;
points, transforms, instance placements and animated visibility follow time
(a mesh hidden at a frame gets NaN positions there: the rasterizer never draws
a face with a NaN vertex).

Winding: ``orientation = "leftHanded"`` reverses each polygon, and so does a
world transform with a negative determinant (a mirror), so triangles are
counter-clockwise seen from their front in world space.

Normals: an authored ``primvars:normals`` (else ``normals``) with its
interpolation, transformed by the inverse transpose of the world matrix. When
none is authored they are computed: smooth (area-weighted vertex normals) for
subdivision meshes (``subdivisionScheme`` other than ``none``, USD's fallback
being ``catmullClark``), flat for ``none``; the authored normals of a
subdivision mesh are ignored, as USD specifies.
"""

from __future__ import annotations

import numpy as np
from pxr import Sdf, Usd, UsdGeom

from .errors import SceneError
from .scene import SceneMeshes
from .triangulate import Triangulation, _cross, triangulate

__all__ = ["MeshItem", "MeshSet", "corner_values", "find_meshes"]

#: Primvar names tried, in order, for texture coordinates when no material names one.
UV_NAMES = ("st", "st0", "st_0", "UVMap", "uv", "map1")

DEFAULT_DISPLAY_COLOR = (0.5, 0.5, 0.5)


def find_meshes(
    stage: Usd.Stage,
    time: Usd.TimeCode,
    purposes=("default", "render"),
    *,
    root=None,
    instancers: list | None = None,
) -> list[Usd.Prim]:
    """Mesh prims to draw (instance proxies included; invisible / other purposes pruned).

    ``UsdGeom.PointInstancer`` prims are appended to ``instancers`` (when given)
    and their descendants skipped: prototypes are drawn only through them.
    ``root`` limits the search to one prim's subtree.
    """
    prims = []
    if root is None:
        rng = Usd.PrimRange.Stage(stage, Usd.TraverseInstanceProxies())
    else:
        rng = Usd.PrimRange(root, Usd.TraverseInstanceProxies())
    it = iter(rng)
    for prim in it:
        if prim.IsA(UsdGeom.PointInstancer):
            if instancers is not None:
                instancers.append(prim)
            it.PruneChildren()
            continue
        if prim.IsA(UsdGeom.Imageable):
            img = UsdGeom.Imageable(prim)
            vis = img.GetVisibilityAttr()
            # animated visibility: kept, and hidden per frame (see MeshItem.visible_at)
            if vis.Get(time) == UsdGeom.Tokens.invisible and not vis.ValueMightBeTimeVarying():
                it.PruneChildren()
                continue
            purpose = img.GetPurposeAttr().Get()
            if purpose and purpose not in purposes:
                it.PruneChildren()
                continue
        if prim.IsA(UsdGeom.Mesh) or implicit_kind(prim) is not None:
            prims.append(prim)
    return prims


# ----------------------------------------------------------------------------- implicit prims
IMPLICIT_SEGMENTS = 32


def implicit_kind(prim: Usd.Prim) -> str | None:
    """``"Cube"``, ``"Sphere"``, ``"Cylinder"``, ``"Cone"``, ``"Capsule"``, ``"Plane"`` or None."""
    for name in ("Cube", "Sphere", "Cylinder", "Cone", "Capsule", "Plane"):
        if prim.IsA(getattr(UsdGeom, name)):
            return name
    return None


def _along_axis(p: np.ndarray, axis: str) -> np.ndarray:
    """Points built along +Z turned to ``axis`` (a cyclic permutation: a rotation)."""
    if axis == "X":
        return p[:, [2, 0, 1]]
    if axis == "Y":
        return p[:, [1, 2, 0]]
    return p


def _rings(radii: np.ndarray, heights: np.ndarray, n: int):
    """Quads between consecutive circles (radius, z) of n segments; each circle its own points."""
    ang = 2 * np.pi * np.arange(n) / n
    pts = np.concatenate(
        [
            np.stack([r * np.cos(ang), r * np.sin(ang), np.full(n, z)], 1)
            for r, z in zip(radii, heights, strict=True)
        ]
    )
    k = np.arange(n)
    quads = [
        np.stack([i * n + k, i * n + (k + 1) % n, (i + 1) * n + (k + 1) % n, (i + 1) * n + k], 1)
        for i in range(len(radii) - 1)
    ]
    return pts, np.concatenate(quads)


def _cap(radius: float, z: float, n: int, up: bool, first: int):
    ang = 2 * np.pi * np.arange(n) / n
    pts = np.stack([radius * np.cos(ang), radius * np.sin(ang), np.full(n, z)], 1)
    idx = np.arange(n) if up else np.arange(n)[::-1]
    return pts, (idx + first)[None]


def implicit_topology(prim: Usd.Prim, time: Usd.TimeCode):
    """Polygons of an implicit gprim at ``time``: counts, indices, points (float32).

    Curved surfaces use 32 segments; creases have their own points (so smooth
    vertex normals are flat across caps and cube faces).
    """
    kind = implicit_kind(prim)
    n = IMPLICIT_SEGMENTS
    get = lambda name, d: prim.GetAttribute(name).Get(time) if prim.HasAttribute(name) else d  # noqa: E731
    axis = str(get("axis", "Z") or "Z")
    if kind == "Cube":
        s = float(get("size", 2.0)) / 2
        c = np.array([[x, y, z] for x in (-s, s) for y in (-s, s) for z in (-s, s)])
        quads = np.array(
            [[0, 1, 3, 2], [4, 6, 7, 5], [0, 4, 5, 1], [2, 3, 7, 6], [0, 2, 6, 4], [1, 5, 7, 3]]
        )
        pts = c[quads.ravel()]
        polys = np.arange(24).reshape(6, 4)
    elif kind == "Sphere":
        from ..primitives import ico_sphere

        v, f = ico_sphere(3)
        pts, polys = v * float(get("radius", 1.0)), f
    elif kind in ("Cylinder", "Cone", "Capsule"):
        r = float(get("radius", 0.5 if kind == "Capsule" else 1.0))
        h = float(get("height", 1.0 if kind == "Capsule" else 2.0)) / 2
        if kind == "Cylinder":
            radii, heights = np.array([r, r]), np.array([-h, h])
        elif kind == "Cone":
            radii, heights = np.array([r, 0.0]), np.array([-h, h])
        else:
            t = np.linspace(0, np.pi / 2, 9)
            radii = np.concatenate([r * np.sin(t), r * np.sin(t)[::-1]])
            heights = np.concatenate([-h - r * np.cos(t), h + r * np.cos(t)[::-1]])
        pts, polys = _rings(radii, heights, n)
        polys = [polys]
        if kind != "Capsule":
            bottom, bi = _cap(r, -h, n, False, len(pts))
            pts = np.concatenate([pts, bottom])
            polys.append(bi)
            if kind == "Cylinder":
                top, ti = _cap(r, h, n, True, len(pts))
                pts = np.concatenate([pts, top])
                polys.append(ti)
        counts = np.concatenate([np.full(len(p), p.shape[1]) for p in polys])
        indices = np.concatenate([p.ravel() for p in polys])
        return (
            counts.astype(np.int64),
            indices.astype(np.int64),
            _along_axis(pts, axis).astype(np.float32),
        )
    else:  # Plane
        w, ln = float(get("width", 2.0)) / 2, float(get("length", 2.0)) / 2
        pts = np.array([[-w, -ln, 0], [w, -ln, 0], [w, ln, 0], [-w, ln, 0]], np.float64)
        polys = np.array([[0, 1, 2, 3]])
    counts = np.full(len(polys), np.asarray(polys).shape[1])
    return (
        counts.astype(np.int64),
        np.asarray(polys).ravel().astype(np.int64),
        _along_axis(pts, axis).astype(np.float32),
    )


def corner_values(
    values: np.ndarray, interpolation: str, tri: Triangulation, num_points: int, where: str
) -> np.ndarray:
    """A primvar's values expanded to every triangle corner, (T, 3, D).

    ``constant``: value 0 everywhere; ``uniform``: one per polygon; ``vertex`` and
    ``varying``: one per point; ``faceVarying``: one per face-vertex.
    Indexed primvars must be flattened first (``ComputeFlattened``).
    """
    values = np.asarray(values)
    if values.ndim == 1:
        values = values[:, None]
    n = values.shape[0]
    need = {
        "constant": 1,
        "uniform": tri.num_polygons,
        "vertex": num_points,
        "varying": num_points,
        "faceVarying": None,
    }
    if interpolation not in need:
        raise SceneError(where, f"unknown primvar interpolation {interpolation!r}")
    if interpolation == "constant":
        if n < 1:
            raise SceneError(where, "constant primvar has no value")
        return np.broadcast_to(values[:1][None], (len(tri), 3, values.shape[1]))
    if interpolation == "uniform":
        rows = tri.face
    elif interpolation == "faceVarying":
        rows = tri.corner
    else:
        rows = tri.vertex
    want = need[interpolation]
    if want is not None and n < want:
        raise SceneError(where, f"{interpolation} primvar has {n} values, needs {want}")
    if len(tri) and rows.max() >= n:
        raise SceneError(
            where, f"{interpolation} primvar has {n} values, needs {int(rows.max()) + 1}"
        )
    if interpolation == "uniform":
        return np.repeat(values[rows][:, None], 3, axis=1)
    return values[rows]


def _flattened(primvar: UsdGeom.Primvar, time: Usd.TimeCode, where: str) -> np.ndarray | None:
    value = primvar.ComputeFlattened(time)
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float32)
    if primvar.IsIndexed():
        idx = primvar.GetIndices(time)
        raw = primvar.Get(time)
        if idx is not None and raw is not None and len(idx):
            i = np.asarray(idx)
            if i.min() < 0 or i.max() >= len(raw):
                raise SceneError(where, f"indices out of range (0..{len(raw) - 1})")
    return arr


def _time_varying_visibility(prim: Usd.Prim) -> bool:
    p = prim
    while p and not p.IsPseudoRoot():
        if (
            p.IsA(UsdGeom.Imageable)
            and UsdGeom.Imageable(p).GetVisibilityAttr().ValueMightBeTimeVarying()
        ):
            return True
        p = p.GetParent()
    return False


def _time_varying_xform(prim: Usd.Prim) -> bool:
    p = prim
    while p and not p.IsPseudoRoot():
        if p.IsA(UsdGeom.Xformable) and UsdGeom.Xformable(p).TransformMightBeTimeVarying():
            return True
        p = p.GetParent()
    return False


def _smooth_normals(points: np.ndarray, tri: np.ndarray) -> np.ndarray:
    """(N, 3) area-weighted vertex normals (zero where no face touches)."""
    p = points[tri]
    fn = _cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    flat = tri.reshape(-1)
    n = points.shape[0]
    acc = np.stack(
        [np.bincount(flat, weights=np.repeat(fn[:, k], 3), minlength=n) for k in range(3)], axis=1
    )
    return acc


def _normalize(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(norm > 0, norm, 1.0)


def read_topology(prim: Usd.Prim, time: Usd.TimeCode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``faceVertexCounts`` (int64), ``faceVertexIndices`` (int64) and points (float32).

    Raises:
        SceneError: naming the prim, for inconsistent counts or indices out of range.
    """
    where = str(prim.GetPath())
    if not prim.IsA(UsdGeom.Mesh):
        return implicit_topology(prim, time)
    mesh = UsdGeom.Mesh(prim)
    counts = mesh.GetFaceVertexCountsAttr().Get(time)
    indices = mesh.GetFaceVertexIndicesAttr().Get(time)
    points = mesh.GetPointsAttr().Get(time)
    counts = np.zeros(0, np.int64) if counts is None else np.asarray(counts, np.int64)
    indices = np.zeros(0, np.int64) if indices is None else np.asarray(indices, np.int64)
    points = np.zeros((0, 3), np.float32) if points is None else np.asarray(points, np.float32)
    if points.ndim != 2 or points.shape[1] != 3:
        raise SceneError(where, f"points must be (N, 3), got shape {points.shape}")
    if (counts < 0).any():
        raise SceneError(where, "faceVertexCounts has a negative count")
    if int(counts.sum()) != indices.shape[0]:
        raise SceneError(
            where,
            f"faceVertexCounts sum to {int(counts.sum())} but faceVertexIndices has "
            f"{indices.shape[0]} entries",
        )
    if indices.size and (indices.min() < 0 or indices.max() >= points.shape[0]):
        bad = int(indices.max()) if indices.max() >= points.shape[0] else int(indices.min())
        raise SceneError(
            where,
            f"faceVertexIndices refers to point {bad} but the mesh has {points.shape[0]} points",
        )
    return counts, indices, points


class MeshItem:
    """One mesh prim: topology and primvars read once, world data at any time.

    Attributes:
        prim: the mesh prim (possibly an instance proxy).
        path: its path as a string.
        tri: :class:`~warpraster.usd.triangulate.Triangulation` (local winding).
        num_points: points of the mesh at the load time.
        colors: (T, 3, 4) float32 displayColor + displayOpacity per corner, or None
            when neither is authored (the default grey, opaque).
        uvs: (T, 3, 2) float32 or None.
        dynamic: points, normals or a transform above it may change over time.
        double_sided: the prim's ``doubleSided`` (USD's fallback: False, so a renderer
            culls its back faces, as Storm does).
    """

    def __init__(
        self,
        prim: Usd.Prim,
        time: Usd.TimeCode,
        uv_name: str | None = None,
        *,
        raw: tuple | None = None,
        tri: Triangulation | None = None,
    ):
        self.prim = prim
        self.path = str(prim.GetPath())
        self.implicit = implicit_kind(prim)
        mesh = UsdGeom.Mesh(prim) if self.implicit is None else None
        self.mesh = mesh
        where = self.path
        counts, indices, points = read_topology(prim, time) if raw is None else raw
        self.num_points = points.shape[0]
        orientation = UsdGeom.Gprim(prim).GetOrientationAttr().Get()
        self.left_handed = orientation == UsdGeom.Tokens.leftHanded
        self.double_sided = bool(UsdGeom.Gprim(prim).GetDoubleSidedAttr().Get())
        self.points = points
        self.tri = triangulate(counts, indices, points) if tri is None else tri
        self.flipped = False
        # implicit prims: smooth normals over points that are split at creases
        self.subdivided = (
            mesh is None or mesh.GetSubdivisionSchemeAttr().Get() != UsdGeom.Tokens.none
        )
        pv_api = UsdGeom.PrimvarsAPI(prim)

        # displayColor / displayOpacity (constant primvars inherit down namespace);
        # None = the default colour everywhere
        colors = None
        for name, sl in (("displayColor", slice(0, 3)), ("displayOpacity", slice(3, 4))):
            pv = pv_api.FindPrimvarWithInheritance(name)
            if pv and pv.HasValue():
                vals = _flattened(pv, time, f"{where} primvars:{name}")
                if vals is not None and vals.size:
                    if colors is None:
                        colors = np.empty((len(self.tri), 3, 4), np.float32)
                        colors[..., :3] = DEFAULT_DISPLAY_COLOR
                        colors[..., 3] = 1.0
                    colors[..., sl] = corner_values(
                        vals,
                        pv.GetInterpolation(),
                        self.tri,
                        self.num_points,
                        f"{where} primvars:{name}",
                    )
        self.colors = colors

        # texture coordinates
        self.uvs = None
        self.uv_name = None
        for name in ((uv_name,) if uv_name else ()) + UV_NAMES:
            pv = pv_api.GetPrimvar(name)
            if pv and pv.HasValue():
                break
        else:
            pv = next(
                (
                    p
                    for p in pv_api.GetPrimvarsWithValues()
                    if p.GetTypeName().role == Sdf.ValueRoleNames.TextureCoordinate
                    and p.GetTypeName().scalarType.type.pythonClass.__name__.endswith("2f")
                ),
                None,
            )
        if pv:
            vals = _flattened(pv, time, f"{where} primvars:{pv.GetPrimvarName()}")
            if vals is not None and vals.size:
                if vals.ndim != 2 or vals.shape[1] < 2:
                    raise SceneError(where, f"primvar {pv.GetPrimvarName()} is not 2-D")
                self.uvs = np.ascontiguousarray(
                    corner_values(
                        vals[:, :2],
                        pv.GetInterpolation(),
                        self.tri,
                        self.num_points,
                        f"{where} primvars:{pv.GetPrimvarName()}",
                    ),
                    dtype=np.float32,
                )
                self.uv_name = str(pv.GetPrimvarName())

        # authored normals (ignored on subdivision surfaces, as USD specifies)
        self._normals_source = None
        if not self.subdivided:
            pv = pv_api.GetPrimvar("normals")
            if pv and pv.HasValue():
                self._normals_source = ("primvar", pv)
            elif mesh.GetNormalsAttr().HasValue():
                self._normals_source = ("attr", mesh.GetNormalsAttr())
        normals_vary = False
        if self._normals_source is not None:
            kind, src = self._normals_source
            attr = src.GetAttr() if kind == "primvar" else src
            normals_vary = attr.ValueMightBeTimeVarying()
        self.visibility_varies = _time_varying_visibility(prim)
        self.dynamic = (
            (mesh is not None and mesh.GetPointsAttr().ValueMightBeTimeVarying())
            or self.visibility_varies
            or normals_vary
            or _time_varying_xform(prim)
        )
        self.face_material = np.full(len(self.tri), -1, np.int32)
        self.subsets: dict[str, np.ndarray] = {}

    # -------------------------------------------------------------- per-time data
    def world_matrix(self, cache: UsdGeom.XformCache, time: Usd.TimeCode) -> np.ndarray:
        """4x4 float64 row-vector local-to-world matrix at ``time``."""
        return np.array(cache.GetLocalToWorldTransform(self.prim), dtype=np.float64)

    def visible_at(self, time: Usd.TimeCode) -> bool:
        """False where animated visibility hides the mesh at ``time``."""
        if not self.visibility_varies:
            return True
        return UsdGeom.Imageable(self.prim).ComputeVisibility(time) != UsdGeom.Tokens.invisible

    @property
    def normal_kind(self) -> int:
        """0: flat (computed), 1: smooth (computed), 2: authored."""
        if self._normals_source is not None:
            return 2
        return 1 if self.subdivided else 0

    def points_at(self, time: Usd.TimeCode) -> np.ndarray:
        """(N, 3) local points at ``time`` (the load-time points when they are not animated)."""
        if self.mesh is None:
            return self.points  # implicit prims: size / radius read at the load time
        attr = self.mesh.GetPointsAttr()
        if not attr.ValueMightBeTimeVarying():
            return self.points
        points = attr.Get(time)
        points = np.zeros((0, 3), np.float32) if points is None else np.asarray(points, np.float32)
        if points.shape[0] != self.num_points:
            raise SceneError(
                self.path,
                f"has {points.shape[0]} points at time {time}, {self.num_points} at the load time "
                "(topology must not change over time)",
            )
        return points

    def authored_normals(self, time: Usd.TimeCode, m3: np.ndarray) -> np.ndarray | None:
        """(T, 3, 3) world normals per corner (local corner order) from the authored ones."""
        if self._normals_source is None:
            return None
        where = self.path
        kind, src = self._normals_source
        if kind == "primvar":
            vals = _flattened(src, time, f"{where} primvars:normals")
            interp = src.GetInterpolation()
        else:
            vals = src.Get(time)
            vals = None if vals is None else np.asarray(vals, np.float64)
            interp = self.mesh.GetNormalsInterpolation()
        if vals is None or not len(vals):
            return None
        local = corner_values(vals, interp, self.tri, self.num_points, f"{where} normals")
        inv_t = np.linalg.inv(m3).T if np.linalg.det(m3) != 0 else np.eye(3)
        return _normalize(local.astype(np.float64) @ inv_t)


class _Instancer:
    """A PointInstancer's instance transforms, per time (row-vector, instancer space)."""

    def __init__(self, prim: Usd.Prim, time: Usd.TimeCode):
        self.prim = prim
        self.path = str(prim.GetPath())
        self.pi = UsdGeom.PointInstancer(prim)
        idx = self.pi.GetProtoIndicesAttr().Get(time)
        self.proto_indices = np.zeros(0, np.int64) if idx is None else np.asarray(idx, np.int64)
        attrs = [self.pi.GetPositionsAttr(), self.pi.GetOrientationsAttr(),
                 self.pi.GetScalesAttr(), self.pi.GetProtoIndicesAttr()]  # fmt: skip
        self.dynamic = _time_varying_xform(prim) or any(a.ValueMightBeTimeVarying() for a in attrs)
        self._time = None
        self._xforms = None

    def transforms(self, time: Usd.TimeCode) -> np.ndarray:
        """(K, 4, 4) instance-to-instancer matrices at ``time`` (computed once per time)."""
        if self._time != time:
            x = np.array(self.pi.ComputeInstanceTransformsAtTime(time, time), np.float64)
            if x.shape[0] != self.proto_indices.shape[0]:
                raise SceneError(
                    self.path,
                    f"has {x.shape[0]} instances at time {time}, {self.proto_indices.shape[0]} "
                    "at the load time (the instance count must not change)",
                )
            self._time, self._xforms = time, x
        return self._xforms


class InstanceItem:
    """One mesh of one PointInstancer instance: the prototype mesh's data, its own placement.

    world = (mesh relative to its prototype root) @ (instance transform, which
    includes the prototype root's own transform, USD's default) @ (instancer
    local-to-world), row vectors.
    """

    def __init__(self, base: MeshItem, instancer: _Instancer, index: int, relative: np.ndarray):
        self.base = base
        self.instancer = instancer
        self.index = index
        self.relative = relative
        self.path = f"{instancer.path}[{index}]{base.path}"
        self.flipped = False
        self.dynamic = base.dynamic or instancer.dynamic

    def __getattr__(self, name):
        return getattr(self.base, name)

    def world_matrix(self, cache: UsdGeom.XformCache, time: Usd.TimeCode) -> np.ndarray:
        inst = self.instancer.transforms(time)[self.index]
        outer = np.array(cache.GetLocalToWorldTransform(self.instancer.prim), np.float64)
        return self.relative @ inst @ outer


class MeshSet:
    """All meshes of a stage, packed; static topology, world data re-evaluated per time.

    Args:
        stage: the stage.
        time: the load time (topology, primvars, materials, visibility).
        materials: a :class:`~warpraster.usd.materials.MaterialLibrary` (bindings
            become ``face_material``), or None.
        purposes: the purposes drawn.
    """

    def __init__(
        self,
        stage: Usd.Stage,
        time: Usd.TimeCode,
        *,
        materials=None,
        purposes=("default", "render"),
    ):
        self.stage = stage
        self.items: list[MeshItem] = []
        instancers: list[Usd.Prim] = []
        self.items = self._read_items(find_meshes(stage, time, purposes, instancers=instancers),
                                      time, materials)  # fmt: skip
        for prim in instancers:
            self.items.extend(self._instance_items(prim, time, materials, purposes))
        counts_f = np.array([len(it.tri) for it in self.items], np.int64)
        counts_v = np.array([it.num_points for it in self.items], np.int64)
        self.face_first = np.cumsum(counts_f) - counts_f
        self.vert_first = np.cumsum(counts_v) - counts_v
        self.face_count = counts_f
        self.vert_count = counts_v
        self.dynamic = np.array([it.dynamic for it in self.items], bool)

    @staticmethod
    def _read_items(prims, time, materials) -> list[MeshItem]:
        raws = [read_topology(p, time) for p in prims]
        tris = _triangulate_all(raws)
        items = []
        for prim, raw, tri in zip(prims, raws, tris, strict=True):
            uv_name = materials.uv_primvar_for(prim) if materials is not None else None
            item = MeshItem(prim, time, uv_name, raw=raw, tri=tri)
            if materials is not None:
                item.face_material, item.subsets = materials.per_triangle(prim, item.tri, time)
            items.append(item)
        return items

    def _instance_items(self, prim, time, materials, purposes) -> list:
        """One :class:`InstanceItem` per (instance, prototype mesh) of a PointInstancer."""
        inst = _Instancer(prim, time)
        protos = []
        for target in UsdGeom.PointInstancer(prim).GetPrototypesRel().GetTargets():
            root = self.stage.GetPrimAtPath(target)
            if not root:
                raise SceneError(str(prim.GetPath()), f"prototype {target} does not exist")
            meshes = self._read_items(find_meshes(self.stage, time, purposes, root=root), time,
                                      materials)  # fmt: skip
            cache = UsdGeom.XformCache(time)
            rel = [
                np.array(cache.ComputeRelativeTransform(m.prim, root)[0], np.float64)
                for m in meshes
            ]
            protos.append(list(zip(meshes, rel, strict=True)))
        out = []
        for k, p in enumerate(inst.proto_indices.tolist()):
            if not 0 <= p < len(protos):
                raise SceneError(
                    str(prim.GetPath()),
                    f"protoIndices has {p} but there are {len(protos)} prototypes",
                )
            out.extend(InstanceItem(base, inst, k, rel) for base, rel in protos[p])
        return out

    @property
    def num_faces(self) -> int:
        return int(self.face_count.sum())

    def evaluate(self, time: Usd.TimeCode, out: SceneMeshes | None = None) -> SceneMeshes:
        """The packed meshes at ``time``.

        With ``out`` (a result of an earlier call) only the dynamic meshes are
        re-read, and their positions, faces and normals are written into
        ``out``'s arrays in place (same arrays, same shapes); corner data that
        follows the winding (colours, UVs) is permuted when a mirror flips.
        Computed normals of all re-read meshes come from one vectorised pass.
        Non-finite points (NaN, inf) are kept as they are, without NumPy warnings:
        the rasterizer never draws a face through one, and ``out.nonfinite`` flags
        the meshes that have one.
        """
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return self._evaluate(time, out)

    def _evaluate(self, time: Usd.TimeCode, out: SceneMeshes | None) -> SceneMeshes:
        cache = UsdGeom.XformCache(time)
        first = out is None
        if first:
            out = self._unfilled()
            todo = list(range(len(self.items)))
        else:
            todo = np.nonzero(self.dynamic)[0].tolist()
        verts, faces, normals = out.verts, out.faces, out.normals
        colors, uvs, face_mesh = out.colors, out.uvs, out.face_mesh
        swap = [0, 2, 1]
        for i in todo:
            it = self.items[i]
            f0, f1 = int(self.face_first[i]), int(self.face_first[i] + self.face_count[i])
            v0 = int(self.vert_first[i])
            m = it.world_matrix(cache, time)
            m3 = m[:3, :3]
            verts[v0 : v0 + it.num_points] = it.points_at(time).astype(np.float64) @ m3 + m[3, :3]
            out.nonfinite[i] = not np.isfinite(verts[v0 : v0 + it.num_points]).all()
            if not it.visible_at(time):
                verts[v0 : v0 + it.num_points] = np.nan  # never drawn: faces with NaN are skipped
            flip = bool(it.left_handed != (np.linalg.det(m3) < 0))
            if first or flip != it.flipped:
                tri = it.tri.vertex[:, swap] if flip else it.tri.vertex
                faces[f0:f1] = tri + v0
                if first:
                    order = swap if flip else slice(None)
                    if it.colors is not None:
                        colors[f0:f1] = it.colors[:, order]
                    if it.uvs is not None:
                        uvs[f0:f1] = it.uvs[:, order]
                    out.face_material[f0:f1] = it.face_material
                    for name, rows in it.subsets.items():
                        out.subsets[name] = rows + f0
                else:  # the winding changed since the last frame: permute in place
                    colors[f0:f1] = colors[f0:f1][:, swap]
                    uvs[f0:f1] = uvs[f0:f1][:, swap]
                it.flipped = flip
            authored = it.authored_normals(time, m3)
            if authored is not None:
                normals[f0:f1] = authored[:, swap] if flip else authored
        self._computed_normals(todo, verts, faces, face_mesh, normals)
        return out

    def _unfilled(self) -> SceneMeshes:
        """The packed arrays of every mesh before the first read: zero positions,
        faces and normals, the default display colour, no UVs, no material."""
        nf, nv = self.num_faces, int(self.vert_count.sum())
        colors = np.empty((nf, 3, 4), np.float32)
        colors[..., :3] = DEFAULT_DISPLAY_COLOR
        colors[..., 3] = 1.0
        return SceneMeshes(
            names=[it.path for it in self.items],
            verts=np.zeros((nv, 3), np.float32),
            faces=np.zeros((nf, 3), np.int32),
            vert_first=self.vert_first,
            vert_count=self.vert_count,
            face_first=self.face_first,
            face_count=self.face_count,
            face_mesh=np.repeat(np.arange(len(self.items), dtype=np.int32), self.face_count),
            normals=np.zeros((nf, 3, 3), np.float32),
            colors=colors,
            uvs=np.zeros((nf, 3, 2), np.float32),
            face_material=np.full(nf, -1, np.int32),
            double_sided=np.array([it.double_sided for it in self.items], bool),
            nonfinite=np.zeros(len(self.items), bool),
        )

    def _computed_normals(self, todo, verts, faces, face_mesh, normals) -> None:
        """Flat and smooth normals of the meshes ``todo``, all triangles in one pass each."""
        if not todo:
            return
        kind = np.array([it.normal_kind for it in self.items], np.int8)
        chosen = np.zeros(len(self.items), bool)
        chosen[todo] = True
        tri_kind = np.where(chosen[face_mesh], kind[face_mesh], -1)
        flat = np.nonzero(tri_kind == 0)[0]
        if flat.size == tri_kind.size:
            flat = slice(None)  # every triangle: slices instead of gathers
        if not isinstance(flat, np.ndarray) or flat.size:
            p = verts[faces[flat]]
            fn = _normalize(_cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]))
            normals[flat] = fn[:, None]
        smooth = np.nonzero(tri_kind == 1)[0]
        if smooth.size:
            vn = _normalize(_smooth_normals(verts, faces[smooth]))
            normals[smooth] = vn[faces[smooth]]


def _triangulate_all(raws) -> list[Triangulation]:
    """Triangulates every mesh in one vectorised pass, then splits per mesh."""
    if not raws:
        return []
    counts = [r[0] for r in raws]
    npoly = np.array([len(c) for c in counts], np.int64)
    npts = np.array([len(r[2]) for r in raws], np.int64)
    ncorner = np.array([len(r[1]) for r in raws], np.int64)
    pt0 = np.cumsum(npts) - npts
    poly0 = np.cumsum(npoly) - npoly
    corner0 = np.cumsum(ncorner) - ncorner
    all_idx = np.concatenate([r[1] + o for r, o in zip(raws, pt0, strict=True)])
    all_pts = np.concatenate([r[2] for r in raws])
    tri = triangulate(np.concatenate(counts), all_idx, all_pts)
    bounds = np.searchsorted(tri.face, np.append(poly0, poly0[-1] + npoly[-1]))
    out = []
    for i in range(len(raws)):
        a, b = bounds[i], bounds[i + 1]
        out.append(
            Triangulation(
                (tri.vertex[a:b] - pt0[i]).astype(np.int32),
                tri.corner[a:b] - corner0[i],
                tri.face[a:b] - poly0[i],
                int(npoly[i]),
                tri.concave[(tri.concave >= poly0[i]) & (tri.concave < poly0[i] + npoly[i])]
                - poly0[i],
            )
        )
    return out
