"""Triangle setup, once per face: owning image, blur-grown bbox, vertex copy."""

import warp as wp

from ..geometry import EPS, face_area, finite_face
from ..meshes import MeshArrays
from ..stores import store4
from .coverage import PassArgs

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (docs/PERF.md).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})

#: Empty bbox coordinate (above any real NDC coordinate).
FAR_VALUE = 3.0e38
FAR = wp.constant(FAR_VALUE)


@wp.func
def _drawn_face(meshes: MeshArrays, num_meshes: int, cull_backfaces: int, f: int):
    """(owning mesh, or -1 if face f is never drawn; its three vertices)."""
    v0 = wp.vec3(0.0)
    v1 = wp.vec3(0.0)
    v2 = wp.vec3(0.0)
    # Owning mesh: the last non-empty mesh whose range starts at or before f.
    lo = int(0)
    hi = num_meshes - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if meshes.mesh_first[mid] <= f:
            lo = mid
        else:
            hi = mid - 1
    m = lo
    while m > 0 and meshes.mesh_count[m] == 0:
        m -= 1
    if f < meshes.mesh_first[m] or f >= meshes.mesh_first[m] + meshes.mesh_count[m]:
        return -1, v0, v1, v2
    nv = meshes.verts.shape[0]
    i0 = meshes.faces[f, 0]
    i1 = meshes.faces[f, 1]
    i2 = meshes.faces[f, 2]
    if i0 < 0 or i1 < 0 or i2 < 0 or i0 >= nv or i1 >= nv or i2 >= nv:
        return -1, v0, v1, v2
    v0 = meshes.verts[i0]
    v1 = meshes.verts[i1]
    v2 = meshes.verts[i2]
    if not finite_face(v0, v1, v2):
        return -1, v0, v1, v2
    area = face_area(wp.vec2(v0[0], v0[1]), wp.vec2(v1[0], v1[1]), wp.vec2(v2[0], v2[1]))
    if area <= EPS and area >= -EPS:
        return -1, v0, v1, v2
    if cull_backfaces != 0 and area < 0.0:
        return -1, v0, v1, v2
    if wp.min(wp.min(v0[2], v1[2]), v2[2]) < EPS:
        return -1, v0, v1, v2
    return m, v0, v1, v2


@wp.kernel
def setup_faces(
    # In:
    meshes: MeshArrays,
    num_meshes: int,
    cull_backfaces: int,
    # In: ps.blur_radius; Out: ps.face.mesh, face_bbox, face_verts
    ps: PassArgs,
):
    """Triangle setup, once per face: owning mesh (-1 if never drawn), blur-grown
    bbox (empty for faces never drawn) and a copy of the three vertices. Each
    output written once, the bbox in one 16-byte store (face_bbox is 16-byte
    aligned: a fresh allocation)."""
    f = wp.tid()
    m, v0, v1, v2 = _drawn_face(meshes, num_meshes, cull_backfaces, f)
    ps.face.mesh[f] = m
    if m < 0:
        store4(ps.face.bbox, f, wp.vec4(FAR, FAR, -FAR, -FAR))
        return
    r = wp.sqrt(ps.blur_radius)
    bb = wp.vec4(
        wp.min(wp.min(v0[0], v1[0]), v2[0]) - r,
        wp.min(wp.min(v0[1], v1[1]), v2[1]) - r,
        wp.max(wp.max(v0[0], v1[0]), v2[0]) + r,
        wp.max(wp.max(v0[1], v1[1]), v2[1]) + r,
    )
    store4(ps.face.bbox, f, bb)
    ps.face.verts[f] = wp.matrix_from_rows(v0, v1, v2)  # rows: the vertices
