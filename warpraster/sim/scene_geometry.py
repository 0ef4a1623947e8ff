"""A loaded scene (a USD stage's meshes, materials and cameras) as sensor geometry.

:func:`add_scene` adds every mesh of a :class:`warpraster.usd.scene.Scene` (what
:func:`warpraster.usd.load_stage` returns; the container is free of pxr) to a
:class:`~warpraster.sim.SensorGeometry`: its ``UsdPreviewSurface`` materials
become the sensor's materials (diffuse colour, diffuse texture with its wrap
modes and ``scale`` / ``bias``: the rows the USD stage renderer's
:class:`~warpraster.shading.atlas.Atlas` holds), its per-face material bindings
the faces' materials, its ``st`` the corner UVs and its ``displayColor`` the
corner colours of faces without a material. :func:`stage_camera` turns a stage
camera into the sensor's camera transform and vertical field of view.

What the sensor does not take from a stage: specular colour, shininess and
opacity (its shading is Newton's: hemispheric ambient and one directional
light), the stage's lights, and orthographic cameras.
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

from .geometry import SensorGeometry

__all__ = ["add_scene", "stage_camera"]


def add_scene(
    geometry: SensorGeometry,
    scene,
    *,
    world: int = -1,
    bodies: dict[str, int] | None = None,
) -> list[int]:
    """Adds the meshes of a loaded scene, and the materials they use.

    Args:
        geometry: the sensor geometry to add to.
        scene: a :class:`warpraster.usd.scene.Scene` (its ``meshes`` and
            ``materials`` are read).
        world: the world the meshes belong to (-1: every world).
        bodies: mesh prim path -> body index: those meshes move with the body
            (``body_q`` of :meth:`~warpraster.sim.CameraSensor.update`); their
            points at the scene's time are their rest positions in the body's
            frame, so a body transform of identity draws them where the stage
            has them. The other meshes are static.

    Returns:
        The shapes' positions in ``geometry.shapes``, one per mesh (empty meshes
        are skipped and get none).

    Raises:
        ValueError: a name in ``bodies`` that is not a mesh of the scene, or a
            negative body index.
    """
    m = scene.meshes
    bodies = dict(bodies or {})
    unknown = sorted(set(bodies) - set(m.names))
    if unknown:
        raise ValueError(f"bodies: {unknown} are not meshes of the scene ({len(m.names)} meshes)")
    for name, b in bodies.items():
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
            raise ValueError(f"bodies: {name!r} maps to {b!r}, not a body index >= 0")
    used = np.unique(m.face_material[m.face_material >= 0]) if m.num_faces else []
    first_id = {}
    for i in used:
        mat = scene.materials[int(i)]
        tex = mat.texture
        kwargs = {}
        if tex is not None:
            kwargs = dict(texture=tex.texels, wrap=(int(tex.wrap_s), int(tex.wrap_t)),
                          scale=tex.scale, bias=tex.bias)  # fmt: skip
        first_id[int(i)] = geometry.add_material(mat.diffuse, **kwargs)
    lookup = np.full(len(scene.materials) + 1, -1, np.int64)
    for i, gid in first_id.items():
        lookup[i] = gid
    added = []
    for k, name in enumerate(m.names):
        fs, fc = int(m.face_first[k]), int(m.face_count[k])
        vs, vc = int(m.vert_first[k]), int(m.vert_count[k])
        if fc == 0:
            continue
        faces = m.faces[fs : fs + fc].astype(np.int64) - vs
        verts = np.asarray(m.verts[vs : vs + vc], np.float64)
        ids = m.face_material[fs : fs + fc]
        options = dict(
            world=world,
            face_materials=np.where(ids >= 0, lookup[np.maximum(ids, 0)], -1),
            face_uvs=m.uvs[fs : fs + fc],
            corner_colors=m.colors[fs : fs + fc, :, :3],
        )
        if name in bodies:
            added.append(geometry.add_body_mesh(int(bodies[name]), verts, faces, **options))
        else:
            added.append(geometry.add_static_mesh(verts, faces, **options))
    return added


def stage_camera(camera) -> tuple[wp.transform, float]:
    """(camera transform, vertical field of view [rad]) of a stage camera for the
    sensor's ``camera_transforms`` / ``camera_fovs``.

    ``camera`` is a :class:`warpraster.usd.scene.CameraParams`: USD's camera looks
    down its -Z with +Y up, as the sensor's (Newton's) does; a scaled or sheared
    camera transform is orthonormalised (the rotation's nearest one). The sensor's
    rays span the image's aspect with this vertical field of view: the stage's
    view when the image has the apertures' aspect (aperture offsets are not taken).

    Raises:
        ValueError: an orthographic camera (the sensor is a pinhole).
    """
    from ..usd.scene import Projection

    if camera.projection != Projection.PERSPECTIVE:
        raise ValueError(f"camera: {camera.name} is orthographic; the sensor is a pinhole camera")
    m = np.asarray(camera.cam_to_world, np.float64)
    rot = m[:3, :3].T  # row-vector matrix: the columns of the transpose are the axes
    u, _, vt = np.linalg.svd(rot)
    rot = u @ vt
    if np.linalg.det(rot) < 0:
        rot = u @ np.diag([1.0, 1.0, -1.0]) @ vt
    q = wp.quat_from_matrix(wp.mat33(*rot.ravel().tolist()))
    fov = 2.0 * math.atan(0.5 * camera.vertical_aperture / camera.focal_length)
    return wp.transform(wp.vec3(*m[3, :3].tolist()), q), fov
