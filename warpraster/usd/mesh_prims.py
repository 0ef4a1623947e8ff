"""Mesh prims found on a stage and read once each: topology, primvars (colours,
UVs, normals) per triangle corner, and their world data at any time
(:class:`MeshItem`; :class:`InstanceItem` for a PointInstancer's instances).
:class:`~warpraster.usd.meshes.MeshSet` packs them."""

from __future__ import annotations

import numpy as np
from pxr import Sdf, Usd, UsdGeom

from .errors import SceneError
from .implicit import implicit_kind, implicit_topology
from .triangulate import Triangulation, triangulate

__all__ = ["InstanceItem", "MeshItem", "corner_values", "find_meshes", "read_topology"]

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
