"""A scene's per-face corner tables from its points, corner normals and mesh transforms.

A scene whose normals are given per face corner (a USD stage: authored
``faceVarying`` normals or normals computed on the host) places each mesh with
a per-mesh transform on the device, then gathers the per-face tables the pixel
kernel reads (:class:`~warpraster.shading.pixel_args.FaceCorners`):

* :func:`place_points`: world points = points @ the mesh's (4, 4) row-vector
  transform (USD's convention, identity by default);
* :func:`gather_corner_tables`: per face, the three world corners and the three
  corner normals times the transform's 3 x 3 part (right for rotations and
  uniform scales, which the lighting's normalisation absorbs).

Both kernels are loop-free: Warp's generated adjoints send gradients to the
points, the transforms and the corner normals. An identity transform changes
no bit (``p * 1 + q * 0 + 0 = p``).
"""

from __future__ import annotations

import warp as wp

wp.set_module_options({"fuse_fp": False})

__all__ = ["gather_corner_tables", "place_points"]


@wp.func
def _dir_times(n: wp.vec3, m: wp.mat44) -> wp.vec3:
    """``n @ m[:3, :3]`` (row vector)."""
    return wp.vec3(
        n[0] * m[0, 0] + n[1] * m[1, 0] + n[2] * m[2, 0],
        n[0] * m[0, 1] + n[1] * m[1, 1] + n[2] * m[2, 1],
        n[0] * m[0, 2] + n[1] * m[1, 2] + n[2] * m[2, 2],
    )


@wp.func
def _row_times(p: wp.vec3, m: wp.mat44) -> wp.vec3:
    """``(p, 1) @ m`` (row vector), the first three components: the rotation part
    (:func:`_dir_times`), then the translation row added last."""
    return _dir_times(p, m) + wp.vec3(m[3, 0], m[3, 1], m[3, 2])


@wp.kernel
def _place_points_kernel(
    # Model:
    vert_mesh: wp.array(dtype=wp.int32),
    # Data in:
    points: wp.array(dtype=wp.vec3),
    transforms: wp.array(dtype=wp.mat44),
    # Data out:
    world_out: wp.array(dtype=wp.vec3),
):
    v = wp.tid()
    world_out[v] = _row_times(points[v], transforms[vert_mesh[v]])


@wp.kernel
def _gather_corner_tables_kernel(
    # Model:
    faces: wp.array2d(dtype=wp.int32),
    face_mesh: wp.array(dtype=wp.int32),
    # Data in:
    world: wp.array(dtype=wp.vec3),
    corner_normals: wp.array2d(dtype=wp.vec3),
    transforms: wp.array(dtype=wp.mat44),
    # Data out, (F,) rows per corner:
    pos_out: wp.array(dtype=wp.mat33),
    nrm_out: wp.array(dtype=wp.mat33),
):
    f = wp.tid()
    m = transforms[face_mesh[f]]
    pos_out[f] = wp.matrix_from_rows(world[faces[f, 0]], world[faces[f, 1]], world[faces[f, 2]])
    nrm_out[f] = wp.matrix_from_rows(
        _dir_times(corner_normals[f, 0], m),
        _dir_times(corner_normals[f, 1], m),
        _dir_times(corner_normals[f, 2], m),
    )


def place_points(points, vert_mesh, transforms, *, out) -> None:
    """World points ``out`` (V,) = ``points`` placed by their mesh's transform (on the tape)."""
    if points.shape[0]:
        wp.launch(_place_points_kernel, dim=points.shape[0], inputs=[vert_mesh, points, transforms],
                  outputs=[out], device=out.device)  # fmt: skip


def gather_corner_tables(faces, face_mesh, world, corner_normals, transforms, *, pos_out, nrm_out):
    """Per-face corner positions and transformed corner normals (F,) ``mat33`` (on the tape)."""
    if faces.shape[0]:
        wp.launch(
            _gather_corner_tables_kernel,
            dim=faces.shape[0],
            inputs=[faces, face_mesh, world, corner_normals, transforms],
            outputs=[pos_out, nrm_out],
            device=pos_out.device,
        )
