"""Newton adapter: a differentiable :class:`~warpraster.sim.CameraSensor` built from a
``newton.Model`` and updated from a ``newton.State``.

Needs ``newton`` (an optional dependency; ``import warpraster`` and
``import warpraster.sim`` never import it). Import explicitly::

    from warpraster.sim.newton import NewtonCameraSensor

What is drawn, as Newton's ``SensorTiledCamera`` draws it:

* visible shapes (``ShapeFlags.VISIBLE``): boxes, spheres, ellipsoids, capsules,
  cylinders, cones and finite planes tessellated (:mod:`warpraster.sim.tessellate`),
  triangle meshes as given, each moved by its body's transform
  (``state.body_q``) or fixed in the world (body -1); an infinite plane
  (size 0) becomes a square of half size ``plane_size``. Height fields, SDFs and
  Gaussians are skipped (a warning names them).
* cloth / soft-body triangles (``model.tri_indices``) on the particles
  (``state.particle_q``), white, with Newton's shape index for triangle meshes
  (0xFFFFFFFD).

Colours: ``model.shape_color`` (sRGB) converted to linear RGB as Newton's
renderer does; outputs are linear (Newton's ``hdr_color``). Shading: Newton's
hemispheric ambient about ``model.up_axis`` and an optional directional light
(``light_direction``, Newton's default light is (-1, 1, -1) normalised), no
shadows. Depth is the ray-hit distance (Newton's ``depth``); outputs have
Newton's ``(world, camera, H, W)`` layout and camera convention
(``camera_transforms`` (C, W), camera to world, looking down -Z; vertical field
of view in radians).
"""

from __future__ import annotations

import warnings

import newton
import numpy as np
import warp as wp

from .geometry import SensorGeometry
from .sensor import CameraSensor, SensorFrame
from .tessellate import _revolve, box_mesh, capsule_mesh, cylinder_mesh, plane_mesh, sphere_mesh

#: Newton's shape index of deformable triangle meshes (cloth, soft bodies).
TRIANGLE_MESH_SHAPE_ID = 0xFFFFFFFD


def _srgb_to_linear(c: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(c, np.float64), 0.0, None)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _cone_mesh(radius: float, half_height: float, segments: int):
    """Cone along Z, base at -half_height, apex at +half_height (Newton's cone)."""
    profile = np.array([[0.0, -half_height], [radius, -half_height], [0.0, half_height]])
    return _revolve(profile, segments)


def _shape_mesh(model, s: int, geo_type: int, scale: np.ndarray, segments: int, plane_size: float):
    """Local-frame (vertices, faces) of shape ``s``, or None when it is not drawn."""
    G = newton.GeoType
    if geo_type == G.BOX:
        return box_mesh(*scale)
    if geo_type == G.SPHERE:
        return sphere_mesh(scale[0], segments=segments, rings=segments // 2)
    if geo_type == G.ELLIPSOID:
        v, f = sphere_mesh(1.0, segments=segments, rings=segments // 2)
        return v * scale.astype(np.float32), f
    if geo_type == G.CAPSULE:
        return capsule_mesh(scale[0], scale[1], segments=segments, rings=max(segments // 4, 2))
    if geo_type == G.CYLINDER:
        return cylinder_mesh(scale[0], scale[1], segments=segments)
    if geo_type == G.CONE:
        return _cone_mesh(scale[0], scale[1], segments)
    if geo_type == G.PLANE:
        w = scale[0] if scale[0] > 0 else plane_size
        h = scale[1] if scale[1] > 0 else plane_size
        return plane_mesh(w, h)
    if geo_type in (G.MESH, G.CONVEX_MESH):
        src = model.shape_source[s]
        v = np.asarray(src.vertices, np.float64).reshape(-1, 3) * scale
        return v.astype(np.float32), np.asarray(src.indices, np.int32).reshape(-1, 3)
    return None


def _transform_points(tf: np.ndarray, p: np.ndarray) -> np.ndarray:
    x, y, z, w = tf[3:]
    r = np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])  # fmt: skip
    return p @ r.T + tf[:3]


def geometry_from_model(
    model, *, segments: int = 24, plane_size: float = 50.0, particles: bool = True
) -> SensorGeometry:
    """A :class:`SensorGeometry` of a ``newton.Model`` (host-side, once).

    Args:
        model: the finalized model.
        segments: segments around curved primitives (sagitta of a sphere of
            radius r: ``r (1 - cos(pi / segments))``, 0.85% of r at 24).
        plane_size: half size of infinite planes.
        particles: draw the model's triangles (cloth, soft bodies) on its particles.

    Raises:
        TypeError: ``model`` is not a ``newton.Model``.
    """
    if not isinstance(model, newton.Model):
        raise TypeError(f"model must be a newton.Model, got {type(model).__name__}")
    geo = SensorGeometry()
    n_shapes = model.shape_count
    if n_shapes:
        types = model.shape_type.numpy()
        scales = model.shape_scale.numpy().astype(np.float64)
        xforms = model.shape_transform.numpy().astype(np.float64)
        bodies = model.shape_body.numpy()
        worlds = model.shape_world.numpy()
        flags = model.shape_flags.numpy()
        colors = model.shape_color.numpy() if model.shape_color is not None else None
        skipped = set()
        for s in range(n_shapes):
            if not flags[s] & int(newton.ShapeFlags.VISIBLE):
                continue
            mesh = _shape_mesh(model, s, int(types[s]), scales[s], segments, plane_size)
            if mesh is None:
                skipped.add(newton.GeoType(int(types[s])).name)
                continue
            v, f = mesh
            v = _transform_points(xforms[s], v.astype(np.float64))
            color = (1.0, 1.0, 1.0) if colors is None else _srgb_to_linear(colors[s])
            geo.add_body_mesh(int(bodies[s]), v, f, world=int(worlds[s]), shape_index=s,
                              color=tuple(color))  # fmt: skip
        if skipped:
            warnings.warn(f"warpraster.sim: shapes of type {sorted(skipped)} are not drawn",
                          stacklevel=2)  # fmt: skip
    if particles and model.tri_count:
        tris = model.tri_indices.numpy().reshape(-1, 3)
        pworld = (
            model.particle_world.numpy()
            if model.particle_world is not None
            else np.zeros(model.particle_count, np.int32)
        )
        tri_world = pworld[tris[:, 0]]
        for w in np.unique(tri_world):
            sel = tris[tri_world == w]
            used, local = np.unique(sel, return_inverse=True)
            geo.add_particle_mesh(used, local.reshape(-1, 3), world=int(w),
                                  shape_index=TRIANGLE_MESH_SHAPE_ID)  # fmt: skip
    return geo


class NewtonCameraSensor:
    """A :class:`~warpraster.sim.CameraSensor` of a ``newton.Model``, updated from
    ``newton.State`` objects.

    Args:
        model: the finalized model (``model.world_count`` worlds).
        camera_count: cameras per world.
        image_size: ``int`` or ``(H, W)``.
        frames: frame slots (one per frame recorded on one tape).
        segments, plane_size, particles: see :func:`geometry_from_model`.
        **kwargs: passed to :class:`CameraSensor` (``silhouette_sigma``,
            ``light_direction``, ``clear_color``, ``requires_grad``, ...);
            ``up`` defaults to the model's up axis.
    """

    def __init__(self, model, *, camera_count: int = 1, image_size=64, frames: int = 1,
                 segments: int = 24, plane_size: float = 50.0, particles: bool = True,
                 **kwargs):  # fmt: skip
        self.model = model
        self.geometry = geometry_from_model(model, segments=segments, plane_size=plane_size,
                                            particles=particles)  # fmt: skip
        up = np.zeros(3)
        up[int(model.up_axis)] = 1.0
        kwargs.setdefault("up", tuple(up))
        kwargs.setdefault("device", model.device)
        self.sensor = CameraSensor(
            self.geometry, world_count=max(int(model.world_count), 1), camera_count=camera_count,
            image_size=image_size, frames=frames, **kwargs,
        )  # fmt: skip

    @property
    def frames(self) -> list[SensorFrame]:
        return self.sensor.frames

    def update(self, state, camera_transforms: wp.array, camera_fovs: wp.array, *,
               frame: int = 0) -> SensorFrame:  # fmt: skip
        """Renders ``state`` (its ``particle_q`` and ``body_q``, read on the device)
        into frame slot ``frame``; capturable, differentiable on the tape (to the
        state's arrays, the camera transforms and fields of view)."""
        if not isinstance(state, newton.State):
            raise TypeError(f"state must be a newton.State, got {type(state).__name__}")
        return self.sensor.update(
            camera_transforms=camera_transforms,
            camera_fovs=camera_fovs,
            particle_q=state.particle_q if self.sensor.num_particles > 0 else None,
            body_q=state.body_q if self.sensor.num_bodies > 0 else None,
            frame=frame,
        )


__all__ = ["NewtonCameraSensor", "TRIANGLE_MESH_SHAPE_ID", "geometry_from_model"]
