"""A differentiable multi-world, multi-camera sensor for Warp simulations.

One :meth:`CameraSensor.update` runs, with no allocation and no host read:

1. ``world_points_kernel``: sensor vertices from particle positions, body
   transforms and fixed points (the simulation's own device arrays);
2. ``project_kernel``: every (world, camera) image's vertices to NDC (camera
   poses and fields of view from device arrays);
3. :func:`warpraster.rasterize_meshes` of the packed batch (W x C images, K = 1)
   into the frame's :class:`~warpraster.ClipWorkspace` (faces cut by the near
   plane split there; ``near_clip=0``: a :class:`~warpraster.RasterWorkspace`);
4. ``channels_kernel``: colour, albedo, normal, depth, forward depth, coverage and
   shape index, in Newton's ``(world, camera, H, W)`` layout; the albedo is the
   face's material (the stage renderer's table: colour x UV texture, or corner
   colours, :func:`~warpraster.shading.material_table.face_albedo`), lit by
   Newton's ambient and light and the core's ``lights``;
5. with ``antialias``: :class:`warpraster.Antialias` of the shaded colour into
   ``color`` (:mod:`warpraster.sim.antialias`).

Gradients of any image loss reach particle positions, body transforms, camera
transforms, fields of view, material colours, texels and light parameters, on an
enclosing ``wp.Tape``. A repeated eager update replays its launches (and its
backward) as captured graphs on CUDA (``call_graphs``, :mod:`warpraster.sim.replay`).
Every frame slot owns its buffers (the tape needs the old values of a recorded
frame): render frame ``t`` of a rollout into slot ``t``.

Two backwards (``deterministic``):

* ``True`` (the default): the kernels above run unrecorded and one hand-written
  backward (:mod:`warpraster.sim.adjoint`) is registered on the tape per update:
  per pixel, then gathered per face, per projected vertex, per sensor vertex and
  per source in orders fixed by the topology; no float atomics. The forward is
  atomic-free too (vertex normals summed per vertex). So a step, and its graph
  replay, is bit-identical run after run on CUDA as on the cpu device (with
  :func:`~warpraster.sim.image_loss`, which sums in a fixed order, or
  :func:`~warpraster.sim.frame_loss`, the same loss whose per-pixel gradient
  this backward computes itself: faster, and the sensor then needs no
  ``grad_channels``).
* ``False``: Warp's generated adjoints of steps 1, 2 and 4 and the rasterizer's
  atomic backward for step 3. On CUDA their float atomics make the last bits of
  the gradients vary run to run (bit-identical on the cpu device only).

Edges: ``silhouette_sigma > 0`` gives soft outlines, only against empty
background (or the clear values): where one surface occludes another, the edge
is hard and gives no gradient. ``antialias=True`` instead antialiases the hard
colour (:mod:`warpraster.sim.antialias`): silhouette and occlusion edges alike
give gradients, in the ``color`` channel only.
Near plane: faces cut by the plane at view depth ``near_clip`` are clipped there
(split as PyTorch3D's rasterizer splits them: :mod:`warpraster.clip`), so a ground
under the camera is drawn up to the plane; both backwards differentiate the part
drawn (the deterministic one through the face's own perspective-correct
barycentrics, valid for a vertex behind the camera too: ``render.cut_face_point``
and its hand-written derivative).
Such faces get no soft outline or antialiasing (their edges stay hard).
``near_clip=0`` drops every face with a vertex behind the camera instead.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import warp as wp

from .. import ClipWorkspace, RasterWorkspace, rasterize_meshes
from ..backward.tape import active_tape, record_func
from ..grad_buffers import clear_if_recording
from ..settings import parse_image_size
from ..shading.atlas import Atlas
from .adjoint import SensorBackward
from .antialias import FrameAntialias, sensor_topology
from .checks import (
    FixedOptions,
    _check_transforms,
    _vec3,
    check_array,
    check_frame,
    check_int,
    check_nonnegative,
    check_source,
    look_at_transform,
    sensor_light_rows,
)
from .frame import SensorFrame, select_channels
from .geometry import SensorGeometry, VertexSource
from .kernel_args import Channels, SensorMesh, frame_structs, make, sensor_structs
from .render import (
    SOFT_SLOTS,
    channels_kernel,
    project_kernel,
    vertex_normals_gather_kernel,
    vertex_normals_kernel,
    world_points_kernel,
)
from .replay import SensorReplay

#: PyTorch3D's soft-silhouette cut-off: a face counts out to the squared distance
#: where sigmoid(-d / sigma) falls to 1e-4, i.e. d = sigma * ln(1 / 1e-4 - 1).
_BLUR_PER_SIGMA = math.log(1.0 / 1.0e-4 - 1.0)


class CameraSensor(FixedOptions):
    """Renders W worlds x C cameras of a :class:`SensorGeometry`, differentiably.

    Args:
        geometry: the static scene (topology, vertex sources, colours, worlds).
        world_count: W.
        camera_count: C.
        image_size: ``int`` or ``(H, W)``.
        frames: number of frame slots (one per frame recorded on one tape).
        silhouette_sigma: 0 for hard coverage; > 0 for a soft silhouette
            outside object outlines (a second, blurred raster pass of 8 faces
            per pixel within the blur radius ``sigma ln(9999)``; see
            ``warpraster.sim.render.channels_kernel``): coverage is continuous
            as outlines move and gives gradients there.
        antialias: antialias the hard colour (nvdiffrast's analytic antialias,
            :mod:`warpraster.sim.antialias`): ``color`` is then the antialiased
            image and has gradients with respect to where silhouette and occlusion
            edges are (the other channels stay hard). An alternative to
            ``silhouette_sigma > 0``, not combined with it. A
            :func:`~warpraster.sim.frame_loss` colour term then runs unfused
            (:func:`~warpraster.sim.image_loss`, so ``grad_channels`` must hold
            ``color``).
        clear_color: linear RGB of empty pixels.
        clear_depth: depth of empty pixels (Newton's default 0).
        ambient: Newton's hemispheric ambient light on/off.
        smooth_normals: shade with interpolated vertex normals (area-weighted,
            per shape), so colour is continuous across edges; False: face
            normals (Newton's triangle meshes). The ``normal`` channel follows.
        up: the world's up axis for the ambient term (Newton: +Z).
        light_direction: direction a directional light travels (Newton's default
            light: (-1, 1, -1) normalised), or None for none.
        light_intensity: its intensity.
        bin_size: passed to the rasterizer (None = its default bins).
        device: Warp device.
        requires_grad: allocate gradients for every buffer (needed for the tape).
        grad_channels: the float channels that get gradient buffers (None: every
            float channel written: color, albedo, normal, depth, forward_depth,
            alpha); a loss can only use these. Fewer means less memory to zero
            and read back.
        channels: the channels each update writes (None: all of
            ``SensorFrame.CHANNELS``); the others are empty arrays and their
            stores are not compiled into the channel kernel (H200, the bench's 64
            worlds x 2 cameras: colour and depth alone 0.252 ms a graph-replayed
            update against 0.267 for all seven).
        material_grad: also give ``shape_colors`` (the material table's colours),
            the texels of textured materials (``atlas.texels``), ``light_direction``
            and ``light_intensity`` gradients (every covered pixel contributes to
            these few values: off unless they are trained).
        deterministic: True (default): the hand-written backward of
            :mod:`warpraster.sim.adjoint`, bit-identical run after run and in
            graph replays on every device, with no contended atomics (meant to
            be the faster one on a GPU; ``warpraster bench --suite sensor`` with
            and without ``--generated-backward`` times both). False: Warp's
            generated adjoints and the rasterizer's atomic backward (the last
            bits vary on a GPU).
        lights: more lights, the shading core's: a
            :class:`~warpraster.shading.LightList` (ambient, directional and point
            lights, for all images, per world or per image n = world * C + camera)
            or one light per image or world (``DirectionalLights``, ``PointLights``,
            ``AmbientLights``), at most
            8 an image; each adds PyTorch3D's ambient colour and Lambert diffuse term
            (:func:`~warpraster.shading.lighting.lambert_light_sum`: reflectivities 1,
            no specular) times the albedo, after Newton's ambient and light.
            Gradients reach their arrays with ``deterministic=False`` only.
        near_clip: view depth of the near plane (> 0) faces are clipped at; 0 drops
            the faces with a vertex behind the camera whole (default 1e-3: close to
            a ray caster's, which draws all in front of the camera).
        exact_perspective_grad: True (default): the true derivative where the
            perspective denominator of the sharp (perspective-correct) pass is
            clamped; False: PyTorch3D's numbers there (see
            :class:`warpraster.RasterSettings`; both backwards follow it).

    Raises (at construction, naming the argument): TypeError / ValueError for an
    ``image_size`` that is not an int or (H, W) of ints (a string too), a NaN
    ``clear_depth``, colours (``clear_color``, the geometry's shape colours) that
    are not finite linear RGB in [0, 1], ``antialias`` with ``silhouette_sigma > 0``,
    a zero ``up`` or ``light_direction``, a ``light_intensity`` that is not finite
    and >= 0. The per-frame device inputs are checked by the first :meth:`update`
    (:meth:`check_inputs`).

    Materials: ``atlas`` (a :class:`~warpraster.shading.atlas.Atlas`, the USD stage
    renderer's material table) holds a row per shape (its colour) and then the
    geometry's materials (:meth:`SensorGeometry.add_material`: a colour and a
    texture read at the faces' UVs); ``shape_colors`` is its colour column.

    The colours (``shape_colors``, vec3 (S + M,)), light direction and intensity live
    in device arrays (``light_direction``, ``light_intensity``, (1,)): assign new
    values into them (``.assign``; the kernels' structs, packed once at set-up, hold
    these arrays), or pass ``material_grad=True`` to train them. Rebinding these
    attributes, or any option above, after construction raises ``AttributeError``
    (:class:`~warpraster.sim.checks.FixedOptions`); ``call_graphs`` stays settable.
    """

    def __init__(
        self,
        geometry: SensorGeometry,
        *,
        world_count: int = 1,
        camera_count: int = 1,
        image_size=64,
        frames: int = 1,
        silhouette_sigma: float = 0.0,
        antialias: bool = False,
        clear_color=(0.0, 0.0, 0.0),
        clear_depth: float = 0.0,
        ambient: bool = True,
        smooth_normals: bool = False,
        up=(0.0, 0.0, 1.0),
        light_direction=None,
        light_intensity: float = 1.0,
        bin_size: int | None = None,
        device=None,
        requires_grad: bool = False,
        material_grad: bool = False,
        grad_channels=None,
        channels=None,
        deterministic: bool = True,
        lights=None,
        near_clip: float = 1.0e-3,
        exact_perspective_grad: bool = True,
    ):
        if not isinstance(geometry, SensorGeometry):
            raise TypeError(f"geometry must be a SensorGeometry, got {type(geometry).__name__}")
        self.world_count = check_int(world_count, "world_count")
        self.camera_count = check_int(camera_count, "camera_count")
        self.frame_count = check_int(frames, "frames")
        self.image_size = parse_image_size(image_size)
        sigma = check_nonnegative(silhouette_sigma, "silhouette_sigma")
        self.silhouette_sigma = sigma
        self.blur_radius = sigma * _BLUR_PER_SIGMA
        if not isinstance(antialias, bool):
            raise TypeError(f"antialias must be a bool, got {antialias!r}")
        if antialias and sigma > 0.0:
            raise ValueError(
                "antialias: the antialias pass and the soft outlines (silhouette_sigma > 0) "
                "are alternatives; pass one of them"
            )
        self.antialias = antialias
        self.near_clip = check_nonnegative(near_clip, "near_clip")
        self.clear_color = _vec3(clear_color, "clear_color", unit_range=True)
        self.clear_depth = float(clear_depth)
        if math.isnan(self.clear_depth):
            raise ValueError(f"clear_depth must be a number, got {clear_depth!r}")
        self.ambient = bool(ambient)
        self.smooth_normals = bool(smooth_normals)
        self.channels, self.grad_channels = select_channels(channels, grad_channels, antialias)
        #: the channel kernel's ``written`` bits
        self._written = sum(1 << i for i, c in enumerate(SensorFrame.CHANNELS)
                            if c in self.channels)  # fmt: skip
        self.up = _vec3(up, "up", nonzero=True)
        self.deterministic = bool(deterministic)
        self.exact_perspective_grad = bool(exact_perspective_grad)
        #: Newton's hemispheric ambient: sky and ground colours, intensity.
        self.ambient_terms = (wp.vec3(0.4, 0.4, 0.45), wp.vec3(0.1, 0.1, 0.12), 0.5)
        self.bin_size = bin_size
        self.device = wp.get_device(device)
        self.lights = lights
        self.light_rows, self.light_per_world = sensor_light_rows(
            lights, self.device, self.world_count, self.camera_count, deterministic
        )
        self.requires_grad = bool(requires_grad)
        if geometry.num_vertices == 0:
            raise ValueError("geometry has no shapes")
        self.geometry = geometry

        dev = self.device
        src, idx, local = geometry.packed_vertices()
        self.num_particles = geometry.max_index(VertexSource.PARTICLE) + 1
        self.num_bodies = geometry.max_index(VertexSource.BODY) + 1
        self.vertex_source = wp.array(src, dtype=wp.int32, device=dev)
        self.vertex_index = wp.array(idx, dtype=wp.int32, device=dev)
        self.vertex_local = wp.array(local, dtype=wp.vec3, device=dev)
        packed = geometry.images(self.world_count, self.camera_count)
        self.sensor_faces = wp.array(geometry.all_faces(), dtype=wp.int32, device=dev)
        self.proj_vertex = wp.array(packed["proj_vertex"], dtype=wp.int32, device=dev)
        self.proj_image = wp.array(packed["proj_image"], dtype=wp.int32, device=dev)
        self.faces = wp.array(packed["faces"], dtype=wp.int32, device=dev)
        self.face_vertices = wp.array(packed["face_vertices"], dtype=wp.int32, device=dev)
        self.face_shape = wp.array(packed["face_shape"], dtype=wp.int32, device=dev)
        self.mesh_first = wp.array(packed["first"], dtype=wp.int32, device=dev)
        self.mesh_count = wp.array(packed["count"], dtype=wp.int32, device=dev)
        shape_idx = geometry.shape_indices()
        if shape_idx.size and (shape_idx.min() < 0 or shape_idx.max() > 0xFFFFFFFF):
            raise ValueError("shape_index values must fit in uint32")
        self.shape_index = wp.array(shape_idx.astype(np.uint32), dtype=wp.uint32, device=dev)
        mg = bool(material_grad) and self.requires_grad
        self.material_grad = mg
        colors = geometry.shape_colors()
        bad = np.flatnonzero(~(np.isfinite(colors) & (colors >= 0.0) & (colors <= 1.0)).all(1))
        if bad.size:
            raise ValueError(
                f"geometry: shape {int(bad[0])} has color {colors[bad[0]].tolist()}, "
                "not a linear RGB colour in [0, 1]"
            )
        # the material table: a row per shape (its colour), then the geometry's
        # materials; textured rows read the texel atlas at the faces' UVs
        self.atlas = Atlas(**geometry.material_table(), device=dev)
        self.atlas.diffuse.requires_grad = mg
        # texel gradients: the generated backward's atomics, or the deterministic
        # backward's sorted sums
        self.atlas.texels.requires_grad = mg and geometry.textured
        self.textured = geometry.textured
        self.shape_colors = self.atlas.diffuse
        # per face of the sensor's own triangles (the packed faces map to them)
        tables = geometry.face_tables()
        self.face_source = wp.array(packed["face_source"], dtype=wp.int32, device=dev)
        # each packed face's material row (read per pixel: one load, no indirection)
        rows = tables["face_material"][packed["face_source"]].astype(np.int32)
        self.face_material = wp.array(rows, dtype=wp.int32, device=dev)
        self.corner_uv = wp.array(tables["corner_uv"], dtype=wp.vec2, device=dev)
        self.corner_color = wp.array(tables["corner_color"], dtype=wp.vec4, device=dev)
        direction = (0.0, 0.0, -1.0) if light_direction is None else light_direction
        self.light_direction = wp.array(
            [_vec3(direction, "light_direction", nonzero=True)],
            dtype=wp.vec3,
            device=dev,
            requires_grad=mg,
        )
        intensity = check_nonnegative(light_intensity, "light_intensity")
        intensity = 0.0 if light_direction is None else intensity
        self.light_intensity = wp.array([intensity], dtype=wp.float32, device=dev,
                                        requires_grad=mg)  # fmt: skip
        # stand-ins for a source the geometry does not use
        self._no_particles = wp.zeros(1, dtype=wp.vec3, device=dev)
        self._no_bodies = wp.zeros(1, dtype=wp.transform, device=dev)
        # the kernels' static arguments, packed once
        self.sources, self.view, self.surface, self.look = sensor_structs(self)
        self._aa_topology = sensor_topology(self) if antialias else None
        self.frames = [self._allocate_frame() for _ in range(self.frame_count)]
        self.backward = SensorBackward(self) if self.deterministic else None
        #: the sensor's triangles and each vertex's corners (the deterministic normals)
        self.sensor_mesh = (
            make(SensorMesh, faces=self.sensor_faces, corners=self.backward.vertex_corners)
            if self.deterministic
            else None
        )
        # per frame slot: renders so far, and (tape weakref, tape index, backward) of
        # its last recording (the deterministic backward's guard; see _check_slot)
        self._renders = [0] * self.frame_count
        self._recorded = [None] * self.frame_count
        #: whether the per-frame inputs' values were checked (by the first update)
        self._inputs_checked = False
        #: An update repeating the slot's previous inputs (and tape flag) replays its
        #: launches, and its backward, as captured graphs (None: on CUDA; True: on
        #: every device; False: never): :mod:`warpraster.sim.replay`.
        self.call_graphs: bool | None = None
        self._replay = SensorReplay(self.device, self.frame_count)
        self._fixed = True  # its options can no longer be rebound (FixedOptions)

    # ------------------------------------------------------------------ set-up
    @property
    def lit(self) -> bool:
        """Whether the core's lights are on (:attr:`lights`)."""
        return self.lights is not None

    @property
    def num_images(self) -> int:
        return self.world_count * self.camera_count

    def _allocate_frame(self) -> SensorFrame:
        dev, rg = self.device, self.requires_grad
        shape = (self.world_count, self.camera_count, *self.image_size)

        def img(dtype, name=None):
            grad = rg and name in self.grad_channels
            size = shape if name in self.channels else (*shape[:2], 0, 0)
            return wp.zeros(size, dtype=dtype, device=dev, requires_grad=grad)

        det = self.deterministic

        def workspace(k=1, clipped=False, dists=True):
            kw = dict(
                num_meshes=self.num_images,
                num_faces=self.faces.shape[0],
                image_size=self.image_size,
                faces_per_pixel=k,
                bin_size=self.bin_size,
                device=dev,
                requires_grad=rg and not det,  # the deterministic backward needs none
                write_dists=dists,
            )
            if clipped:
                return ClipWorkspace(num_verts=self.proj_vertex.shape[0], static_faces=True, **kw)
            return RasterWorkspace(**kw)

        ndc = wp.zeros(self.proj_vertex.shape[0], dtype=wp.vec3, device=dev, requires_grad=rg)
        ndc_nograd = None
        if det:
            ndc_nograd = wp.array(ptr=ndc.ptr, dtype=wp.vec3, shape=ndc.shape, device=dev)
            ndc_nograd._ref = ndc  # keeps the owner alive
        frame = SensorFrame(
            # the channels as the kernels' Channels struct declares them (name, dtype)
            **{name: img(Channels.vars[name].type.dtype, name) for name in SensorFrame.CHANNELS},
            points=wp.zeros(
                self.vertex_source.shape[0], dtype=wp.vec3, device=dev, requires_grad=rg
            ),
            ndc=ndc,
            vertex_normals=wp.zeros(
                self.vertex_source.shape[0] if self.smooth_normals else 1,
                dtype=wp.vec3,
                device=dev,
                requires_grad=rg,
            ),
            # the sharp pass's dists are read by nothing (the outlines use the blurred pass's)
            workspace=workspace(clipped=self.near_clip > 0.0, dists=False),
            soft_workspace=workspace(SOFT_SLOTS) if self.silhouette_sigma > 0.0 else None,
            ndc_nograd=ndc_nograd,
            hard_color=img(wp.vec3, "color") if self.antialias else None,
            names=self.channels,
        )
        frame.scene, frame.channels = frame_structs(self, frame)
        if self.antialias:
            frame.antialias = FrameAntialias(self._aa_topology, frame.hard_color, frame.color,
                                             ndc, deterministic=det)  # fmt: skip
        return frame

    def _source_input(self, arr, name, dtype, used, stand_in, kind):
        """``arr`` checked when the geometry uses ``used`` > 0 of its entries (then
        required), else the stand-in array."""
        if used == 0:
            return stand_in
        check_source(arr, name, dtype, self.device, used, f"the geometry has {kind} meshes")
        return arr

    def check_inputs(
        self,
        *,
        camera_transforms: wp.array,
        camera_fovs: wp.array,
        particle_q: wp.array | None = None,
        body_q: wp.array | None = None,
    ) -> None:
        """Checks the values of :meth:`update`'s per-frame inputs on the host: camera
        transforms finite, camera and body rotations unit quaternions, fields of
        view in (0, pi) (only the entries the geometry uses). Non-finite particle
        positions and body transforms pass: their vertices' faces are dropped (see
        the non-finite vertex rules).

        Reads the arrays back (a device synchronisation): a set-up check. The first
        :meth:`update` of a sensor runs it (unless a graph is being captured);
        call it yourself where later values may go wrong. The kernels read the
        inputs as they are: a quaternion of norm 3 would draw a shape 9 times
        larger, a field of view outside (0, pi) a mirrored or empty image.

        Raises:
            TypeError, ValueError: bad input, named by argument.
        """
        c, w = self.camera_count, self.world_count
        check_array(camera_transforms, "camera_transforms", wp.transform, self.device, c, 2)
        check_array(camera_fovs, "camera_fovs", wp.float32, self.device, c)
        _check_transforms(camera_transforms.numpy()[:c, :w], "camera_transforms")
        fov = camera_fovs.numpy()[:c]
        if not (np.isfinite(fov) & (fov > 0.0) & (fov < math.pi)).all():
            raise ValueError(f"camera_fovs must be in (0, pi) radians, got {fov.tolist()}")
        if self.num_bodies:
            check_source(body_q, "body_q", wp.transform, self.device, self.num_bodies,
                         "the geometry has body meshes")  # fmt: skip
            _check_transforms(body_q, "body_q", self.num_bodies, finite=False)
        if self.num_particles:
            check_source(particle_q, "particle_q", wp.vec3, self.device, self.num_particles,
                         "the geometry has particle meshes")  # fmt: skip

    # ------------------------------------------------------------------ per step
    def update(
        self,
        *,
        camera_transforms: wp.array,
        camera_fovs: wp.array,
        particle_q: wp.array | None = None,
        body_q: wp.array | None = None,
        frame: int = 0,
    ) -> SensorFrame:
        """Renders every (world, camera) image into frame slot ``frame``.

        Allocates nothing and reads nothing back (capturable in a graph); checks
        only array metadata on the host, except the sensor's first update, which
        also checks the inputs' values once (:meth:`check_inputs`: unit
        quaternions, fields of view in (0, pi); later values are read as they are).

        Args:
            camera_transforms: ``wp.array2d`` of ``wp.transform`` (C, W), camera
                to world (Newton's ``SensorTiledCamera`` layout); may require grad.
            camera_fovs: float32 (C,), vertical field of view [rad]; may require grad.
            particle_q: vec3 (>= particles used,), particle positions.
            body_q: ``wp.transform`` (>= bodies used,), body to world.
            frame: the frame slot to render into.

        Returns:
            The slot's :class:`SensorFrame` (its arrays are overwritten by the next
            update of the same slot).

        Raises:
            TypeError, ValueError: bad input, named by argument, before any kernel
                runs; ValueError also when the update is recorded on a ``wp.Tape``
                with inputs that require gradients but the sensor was made with
                ``requires_grad=False`` (its gradients would silently be zero).
        """
        check_frame(frame, self.frame_count)
        dev = self.device
        check_array(camera_transforms, "camera_transforms", wp.transform, dev, self.camera_count, 2)
        if camera_transforms.shape[1] != self.world_count:
            raise ValueError(
                f"camera_transforms must have shape (camera_count, world_count) = "
                f"{(self.camera_count, self.world_count)}, got {camera_transforms.shape}"
            )
        check_array(camera_fovs, "camera_fovs", wp.float32, dev, self.camera_count)
        particle_q = self._source_input(particle_q, "particle_q", wp.vec3, self.num_particles,
                                        self._no_particles, "particle")  # fmt: skip
        body_q = self._source_input(body_q, "body_q", wp.transform, self.num_bodies,
                                    self._no_bodies, "body")  # fmt: skip
        if not self._inputs_checked and not dev.is_capturing:
            # set-up: the first update checks the values once (a host read)
            self.check_inputs(camera_transforms=camera_transforms, camera_fovs=camera_fovs,
                              particle_q=particle_q, body_q=body_q)  # fmt: skip
            self._inputs_checked = True
        if not self.requires_grad and _active_tape() is not None:
            tracked = [name for name, a in (("camera_transforms", camera_transforms),
                       ("camera_fovs", camera_fovs), ("particle_q", particle_q),
                       ("body_q", body_q)) if a.requires_grad]  # fmt: skip
            if tracked:
                raise ValueError(
                    f"update is recorded on a wp.Tape and {', '.join(tracked)} require "
                    "gradients, but this sensor was made with requires_grad=False, so its "
                    "gradients would all be zero: construct it with "
                    "CameraSensor(..., requires_grad=True)"
                )
        if self.deterministic and self.requires_grad:
            self._check_slot(frame)
        self._renders[frame] += 1
        out = self.frames[frame]
        inputs = dict(camera_transforms=camera_transforms, camera_fovs=camera_fovs,
                      particle_q=particle_q, body_q=body_q)  # fmt: skip
        tape = _active_tape()
        det, aa = self.deterministic, out.antialias is not None
        key = self._replay.input_key(self, inputs.values(), tape is not None)
        if tape is not None and not det:  # the generated adjoints: a RecordedCall
            self._replay.recorded_call(self, frame, tape, key,
                                       lambda: self._launch(out, inputs, True))  # fmt: skip
            return out
        if tape is None:
            self._replay.note_render(frame)
        # on a tape the antialias pass records its own backward: launched after the graph
        self._replay.forward(frame, key, lambda: self._launch(out, inputs, tape is None),
                             self.call_graphs)  # fmt: skip
        if det and self.requires_grad:
            self._record_backward(frame, camera_transforms, camera_fovs, particle_q, body_q)
        if aa and tape is not None:
            # recorded after the update: its backward runs first and hands the
            # sensor's backward its colour and NDC grads
            out.antialias(out.workspace.fragments)
        return out

    def _launch(self, out: SensorFrame, inputs: dict, antialias: bool) -> None:
        """The update's launches (``antialias``: with the antialias pass)."""
        clear_if_recording(out)  # the slot's gradients start from zero in every recorded update
        dev = self.device
        camera_transforms, camera_fovs = inputs["camera_transforms"], inputs["camera_fovs"]
        det = self.deterministic
        rec = not det  # the generated adjoints go on the tape only without `deterministic`
        wp.launch(
            world_points_kernel,
            dim=out.points.shape[0],
            inputs=[self.sources, inputs["particle_q"], inputs["body_q"]],
            outputs=[out.points],
            device=dev,
            record_tape=rec,
        )
        if self.smooth_normals:
            if det:
                wp.launch(vertex_normals_gather_kernel, dim=out.vertex_normals.shape[0],
                          inputs=[self.sensor_mesh, out.points], outputs=[out.vertex_normals],
                          device=dev, record_tape=False)  # fmt: skip
            else:
                out.vertex_normals.zero_()
                wp.launch(vertex_normals_kernel, dim=self.sensor_faces.shape[0],
                          inputs=[self.sensor_faces, out.points], outputs=[out.vertex_normals],
                          device=dev)  # fmt: skip
        h, w = self.image_size
        wp.launch(
            project_kernel,
            dim=out.ndc.shape[0],
            inputs=[self.view, out.points, camera_transforms, camera_fovs],
            outputs=[out.ndc],
            device=dev,
            record_tape=rec,
        )  # fmt: skip
        # into the workspaces' own fragments (out.scene reads them)
        self._rasterize(out, out.workspace, 0.0, 1)
        if out.soft_workspace is not None:
            # only coverage (pix_to_face, dists) is read from the blurred pass;
            # without perspective correction: extrapolated perspective-correct
            # depths just outside a face can be wild or negative, which drops
            # the face or reorders the slots
            self._rasterize(out, out.soft_workspace, self.blur_radius, SOFT_SLOTS)
        wp.launch(
            channels_kernel(self.silhouette_sigma > 0.0, self.geometry.varying_albedo, self.lit,
                            self._written),  # fmt: skip
            dim=(self.num_images, h, w),
            inputs=[out.scene, camera_transforms],
            outputs=[out.channels],
            device=dev,
            record_tape=rec,
        )  # fmt: skip
        if antialias and out.antialias is not None:
            out.antialias(out.workspace.fragments)

    def recorded_update(self, frame: int) -> tuple | None:
        """``(tape, position)`` of frame slot ``frame``'s update on the tape that still
        holds it (its backward at ``tape.launches[position]``), or None."""
        entry = self._recorded[frame]
        if entry is None:
            return None
        tape, i, fn = entry[0](), entry[1], entry[2]
        if tape is None or i >= len(tape.launches) or tape.launches[i] is not fn:
            return None
        return tape, i

    def _check_slot(self, frame: int) -> None:
        """Raises ValueError if frame slot ``frame`` is still recorded on the active
        tape: a second update would overwrite the buffers the first one's backward
        reads (the rasterizer's workspaces guard themselves the same way)."""
        tape = _active_tape()
        entry = self._recorded[frame]
        if tape is None or entry is None or entry[0]() is not tape:
            return
        _, i, fn = entry
        if i < len(tape.launches) and tape.launches[i] is fn:
            raise ValueError(
                f"frame: slot {frame} is already recorded on the active tape; a second update "
                "into it overwrites what the first one's backward needs (use one slot per "
                "recorded frame, or tape.reset() before recording the slot again)"
            )

    def _record_backward(self, frame, camera_transforms, camera_fovs, particle_q, body_q) -> None:
        """Registers the deterministic backward of this update on the active tape."""
        tape = _active_tape()
        if tape is None:
            return
        out = self.frames[frame]
        bw = self.backward
        bw.prepare(camera_transforms, camera_fovs)
        inputs = dict(camera_transforms=camera_transforms, camera_fovs=camera_fovs,
                      particle_q=particle_q, body_q=body_q)  # fmt: skip
        render = self._renders[frame]

        def backward():
            if self._renders[frame] != render:
                raise ValueError(
                    f"frame: slot {frame} was rendered again after this update was recorded, "
                    "so its buffers no longer hold the frame being differentiated (use one "
                    "slot per recorded frame)"
                )
            self._replay.backward(self, frame, inputs, self.call_graphs)

        arrays = [out.written(name) for name in self.grad_channels]
        arrays += [a for a in (out.points, *inputs.values(), self.shape_colors,
                               self.atlas.texels, self.light_direction, self.light_intensity)
                   if a.grad is not None]  # fmt: skip
        record_func(tape, backward, arrays=arrays)
        self._recorded[frame] = (weakref.ref(tape), len(tape.launches) - 1, backward)

    def _rasterize(self, out: SensorFrame, workspace, blur_radius: float, k: int):
        """The sharp pass (clipped at the near plane when ``near_clip`` > 0) or the
        blurred one (unclipped: a face the near plane cuts has no soft outline)."""
        clip = {}
        if isinstance(workspace, ClipWorkspace):
            clip = dict(z_clip_value=self.near_clip)
        return rasterize_meshes(
            out.ndc if out.ndc_nograd is None else out.ndc_nograd,
            self.faces,
            self.mesh_first,
            self.mesh_count,
            image_size=self.image_size,
            blur_radius=blur_radius,
            faces_per_pixel=k,
            bin_size=self.bin_size,
            perspective_correct=blur_radius == 0.0,
            exact_perspective_grad=self.exact_perspective_grad,
            workspace=workspace,
            validate=False,
            **clip,
        )


def _active_tape():
    return active_tape()  # one home: warpraster.backward.tape (it checks the tape's thread)


__all__ = ["CameraSensor", "SensorFrame", "look_at_transform"]
