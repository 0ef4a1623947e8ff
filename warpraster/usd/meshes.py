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

Modules: ``implicit.py`` (implicit gprims tessellated), ``mesh_prims.py``
(finding the prims and reading each once: :class:`MeshItem`, instances) and
this one (:class:`MeshSet`: packing and per-time evaluation).
"""

from __future__ import annotations

import numpy as np
from pxr import Usd, UsdGeom

from .errors import SceneError
from .mesh_prims import (
    DEFAULT_DISPLAY_COLOR,
    InstanceItem,
    MeshItem,
    _Instancer,
    _normalize,
    corner_values,
    find_meshes,
    read_topology,
)
from .scene import SceneMeshes
from .triangulate import Triangulation, _cross, triangulate

__all__ = ["MeshItem", "MeshSet", "corner_values", "find_meshes"]


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
