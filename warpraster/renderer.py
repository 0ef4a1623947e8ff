"""Renderers: rasterize and shade in one call.

* :class:`MeshRenderer` is PyTorch3D's ``MeshRenderer`` for migrating code:
  ``MeshRenderer(rasterizer=MeshRasterizer(cameras=..., raster_settings=...),
  shader=SoftPhongShader(...))``, called on a packed batch of world-space meshes.
  Convenient, validating, allocating per call.
* :class:`Renderer` is the Warp-native object: it owns every buffer (projected
  vertices, the raster workspace, normals, per-slot colours, image and the
  extra channels), allocates nothing per call and reads nothing back, so a render
  (with a loss and ``tape.backward()``) can be captured in one graph.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from .antialiasing import Antialias, AntialiasTopology
from .backward.tape import active_tape
from .camera import vert_to_mesh_from_faces
from .fragments import Fragments
from .grad_buffers import clear_if_recording
from .meshes import PackedMeshes, as_faces_array, as_index_array, as_vec3_array, pack_meshes
from .patches import patch_launch_size, patch_pixel
from .raster import ClipWorkspace, RasterWorkspace
from .raster.workspace import CallGraph, StateWatch
from .rasterize import rasterize_checked
from .rasterizer import MeshRasterizer
from .shading.corner_lists import CornerLists
from .shading.fused import FORWARD_PATCH_W
from .shading.materials import face_materials_array
from .shading.modes import BlendMode
from .shading.normals import vertex_normals
from .shading.params import check_mesh_inputs
from .shading.pixel_args import PixelFragments
from .shading.reductions import checked_mse_out, image_mse, mse_forward
from .shading.shaders import ShaderBase, ShadingBuffers, ShadingMode, SoftSilhouetteShader
from .structs import new_struct
from .tape_replay import RecordedCall

__all__ = ["MeshRenderer", "RenderOutputs", "Renderer"]


class MeshRenderer:
    """Rasterizer + shader, as PyTorch3D's ``MeshRenderer``.

    Args:
        rasterizer: a :class:`warpraster.MeshRasterizer` (cameras and settings).
        shader: one of the shaders of :mod:`warpraster.shading`.
        antialias: run :func:`warpraster.antialias` on the hard image (a hard
            shader and ``faces_per_pixel=1``): silhouette and occlusion edges
            blended by where they cross the pixels, so the image has gradients
            with respect to where its edges are (nvdiffrast's ``antialias``).

    After a call, :attr:`fragments` holds the fragments the shader saw.
    """

    def __init__(self, rasterizer: MeshRasterizer, shader: ShaderBase, *, antialias: bool = False):
        if not isinstance(rasterizer, MeshRasterizer):
            raise TypeError(f"rasterizer must be a MeshRasterizer, got {type(rasterizer).__name__}")
        if not isinstance(shader, ShaderBase):
            raise TypeError(f"shader must be a warpraster shader, got {type(shader).__name__}")
        self.rasterizer = rasterizer
        self.shader = shader
        self.antialias = _check_antialias(antialias, shader)
        self.fragments: Fragments | None = None

    def __call__(
        self,
        verts_world,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        *,
        textures=None,
        return_fragments: bool = False,
        validate: bool = True,
        **shader_kwargs,
    ):
        """Renders a packed batch of world-space meshes (mesh n into image n).

        Args:
            verts_world: (V, 3) world-space vertices: ``wp.array`` of ``vec3`` or
                (V, 3) float32 (gradients arrive in its ``.grad`` on a ``wp.Tape``),
                or NumPy.
            faces: (F, 3) int32 packed faces.
            mesh_to_face_first_idx, num_faces_per_mesh: (N,) per-mesh face ranges.
            textures: ``None`` (white), ``TexturesVertex``, ``TexturesUV`` (see
                :mod:`warpraster.shading.shaders`).
            return_fragments: also return the fragments.
            validate: check the face indices and mesh ranges' values (a host read);
                False for a caller that checked them (the torch op).
            **shader_kwargs: passed to the shader (``lights=``, ``materials=``,
                ``blend_params=``, ``verts_normals=``, ``znear=``, ...).

        Returns:
            The (N, H, W, 4) float32 RGBA image (``wp.array``), or ``(image,
            fragments)``. Gradients flow on a ``wp.Tape`` to the vertices, the
            textures and every light/material/camera array with ``requires_grad``.
        """
        cameras = shader_kwargs.pop("cameras", None) or self.rasterizer.cameras
        device = cameras.device if cameras is not None else None
        verts = as_vec3_array(verts_world, "verts_world", device)
        f = as_faces_array(faces, "faces", verts.device)
        first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", verts.device)
        count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", verts.device)
        # the cameras', textures', lights' and materials' rows against the meshes,
        # before any kernel
        cameras.check_batch(first.shape[0])
        lights = shader_kwargs.get("lights") or getattr(self.shader, "lights", None)
        materials = shader_kwargs.get("materials") or getattr(self.shader, "materials", None)
        if shader_kwargs.get("face_materials") is not None:
            materials = None  # a material table: checked with its per-face ids by the shader
        check_mesh_inputs(verts.shape[0], f.shape[0], first.shape[0], textures=textures,
                          lights=lights, materials=materials)  # fmt: skip
        settings = self.rasterizer.settings_for(cameras)
        if self.antialias:
            _check_antialias_k(settings)
        v2m = None
        if first.shape[0] > 1:
            v2m = vert_to_mesh_from_faces(f, first, count, verts.shape[0], device=verts.device)
        needs_grad = verts.requires_grad or cameras.requires_grad()
        verts_ndc = wp.empty(
            verts.shape[0], dtype=wp.vec3, device=verts.device, requires_grad=needs_grad
        )
        fragments = self.rasterizer(
            verts,
            f,
            first,
            count,
            cameras=cameras,
            vert_to_mesh=v2m,
            verts_ndc=verts_ndc,
            validate=validate,
        )
        self.fragments = fragments
        shader_kwargs.setdefault("vert_to_mesh", v2m)
        shader_kwargs.setdefault("compact_slots", True)  # our rasterizer's fragments
        shader_kwargs.setdefault("verts_ndc", verts_ndc)
        shader_kwargs.setdefault(
            "perspective_correct",
            self.rasterizer.settings_for(cameras).perspective_correct,
        )
        image = self.shader(
            fragments, verts, f, textures=textures, cameras=cameras, **shader_kwargs
        )
        if self.antialias:
            aa = Antialias(f, verts.shape[0], image.shape, verts.device,
                           deterministic=settings.deterministic)  # fmt: skip
            image = aa(image, fragments.pix_to_face, verts_ndc, zbuf=fragments.zbuf)
        return (image, fragments) if return_fragments else image


def _image_grad_key(ig) -> tuple:
    """What the shading adjoint reads by value from its :class:`ImageGrad` (a fused
    loss's arguments): each state gets its own captured backward."""
    if ig.mse == 0:
        return (0,)
    return (1, ig.target.ptr, ig.loss_grad.ptr, float(ig.weight))


def _check_antialias(antialias, shader: ShaderBase) -> bool:
    """``antialias`` as a bool; ValueError unless the shader makes a hard image."""
    if not isinstance(antialias, bool):
        raise TypeError(f"antialias must be a bool, got {antialias!r}")
    if antialias and (shader.blend != BlendMode.HARD or isinstance(shader, SoftSilhouetteShader)):
        raise ValueError(
            f"antialias: the antialias pass takes a hard image (K = 1, a hard shader), got "
            f"{type(shader).__name__}; soft shaders blend their edges already"
        )
    return antialias


def _check_antialias_k(settings) -> None:
    if settings.faces_per_pixel != 1:
        raise ValueError(
            f"antialias: the antialias pass takes a K = 1 render, the raster settings have "
            f"faces_per_pixel={settings.faces_per_pixel}"
        )


# ----------------------------------------------------------------------------- Renderer
@wp.struct
class ChannelMesh:
    """The mesh arrays the channels read (``has_objects``: ``face_to_object`` given)."""

    faces: wp.array2d(dtype=wp.int32)
    verts_normals: wp.array(dtype=wp.vec3)
    face_to_object: wp.array(dtype=wp.int32)
    has_objects: int


#: the extra channels a :class:`Renderer` can write beside the image
CHANNELS = ("depth", "normals", "face_ids", "mesh_ids")


@wp.struct
class Channels:
    """The extra channels, (N, H, W) each (see :class:`RenderOutputs`), and which
    are written (``want``: bit i for ``CHANNELS[i]``; the others are (1, 1, 1)
    placeholders)."""

    depth: wp.array3d(dtype=wp.float32)
    normals: wp.array3d(dtype=wp.vec3)
    face_ids: wp.array3d(dtype=wp.int32)
    mesh_ids: wp.array3d(dtype=wp.int32)
    want: int


@wp.kernel(enable_backward=False)
def _channels_kernel(
    # Fragments in (slot 0 read):
    slot: PixelFragments,
    # Mesh in:
    mesh: ChannelMesh,
    # Data out:
    channels_out: Channels,
):
    n, y, x, inside = patch_pixel(
        wp.tid(),
        slot.pix_to_face.shape[0],
        slot.pix_to_face.shape[1],
        slot.pix_to_face.shape[2],
        FORWARD_PATCH_W,
    )
    if not inside:
        return
    f = slot.pix_to_face[n, y, x, 0]
    want = channels_out.want
    if (want & 1) != 0:
        depth = float(-1.0)
        if f >= 0:
            depth = slot.zbuf[n, y, x, 0]
        channels_out.depth[n, y, x] = depth
    if (want & 2) != 0:
        nrm = wp.vec3(0.0)
        if f >= 0:
            b = slot.bary_coords[n, y, x, 0]
            s = (
                b[0] * mesh.verts_normals[mesh.faces[f, 0]]
                + b[1] * mesh.verts_normals[mesh.faces[f, 1]]
                + b[2] * mesh.verts_normals[mesh.faces[f, 2]]
            )
            ln = wp.length(s)
            if ln > 0.0:
                nrm = s / ln
        channels_out.normals[n, y, x] = nrm
    if (want & 4) != 0:
        channels_out.face_ids[n, y, x] = f
    if (want & 8) != 0:
        object_id = int(-1)
        if f >= 0:
            object_id = n
            if mesh.has_objects != 0:
                object_id = mesh.face_to_object[f]
        channels_out.mesh_ids[n, y, x] = object_id


class RenderOutputs:
    """The buffers one render call writes (one set per recorded step).

    Attributes:
        image: (N, H, W, 4) float32 RGBA (``requires_grad`` when the renderer does).
        depth: (N, H, W) float32 view-space depth of the nearest face, -1 where empty.
        normals: (N, H, W) ``vec3`` unit world-space normal (interpolated vertex
            normal of the nearest face), 0 where empty.
        face_ids: (N, H, W) int32 packed face index of the nearest face, -1 where empty.
        mesh_ids: (N, H, W) int32 mesh (or object, see ``face_to_object``), -1 where empty.
        fragments: the step's :class:`~warpraster.Fragments` (raster workspace arrays).

    A channel the :class:`Renderer` was not asked for (its ``channels``) is None.
    """

    #: its gradient arrays are its own: cleared when a recorded forward writes it
    #: (warpraster.grad_buffers)
    owns_grad_buffers = True

    def __init__(
        self,
        shape,
        num_verts,
        num_faces,
        device,
        requires_grad,
        workspace,
        corner_lists=None,
        channels: tuple = CHANNELS,
    ):
        n, h, w, _ = shape
        self.workspace = workspace
        self.verts_ndc = wp.zeros(
            num_verts, dtype=wp.vec3, device=device, requires_grad=requires_grad
        )
        self.shading = ShadingBuffers(
            shape, num_verts, num_faces, device, requires_grad=requires_grad,
            corner_lists=corner_lists,
        )  # fmt: skip
        self.image = self.shading.image
        dtypes = {"depth": wp.float32, "normals": wp.vec3, "face_ids": wp.int32,
                  "mesh_ids": wp.int32}  # fmt: skip
        arrays = {}
        for name in CHANNELS:
            wanted = name in channels
            arrays[name] = wp.zeros((n, h, w) if wanted else (1, 1, 1), dtype=dtypes[name],
                                    device=device)  # fmt: skip
            setattr(self, name, arrays[name] if wanted else None)
        self.fragments: Fragments | None = None
        #: the packed meshes the rasterizer reads (set by the Renderer)
        self.meshes: PackedMeshes | None = None
        #: the channels kernel's arguments, built once (``channel_mesh`` by the Renderer)
        self.channels = new_struct(
            Channels,
            device,
            want=sum(1 << i for i, name in enumerate(CHANNELS) if name in channels),
            **arrays,
        )
        self.pixel_frags = new_struct(PixelFragments, device)
        self.channel_mesh: ChannelMesh | None = None

    def pixel_fragments_of(self, fragments: Fragments) -> PixelFragments:
        """:attr:`pixel_frags` holding ``fragments``' arrays (refilled only when they change)."""
        a = self.pixel_frags
        for name in PixelFragments.vars:
            array = getattr(fragments, name)
            if getattr(a, name) is not array:
                setattr(a, name, array)
        return a


class Renderer:
    """A Warp-native renderer that owns every buffer: capturable render calls.

    Topology (faces, mesh ranges, textures' static parts), cameras, lights,
    materials and shader are fixed at construction; per-frame data lives in
    device arrays the caller updates in place (``verts`` passed to
    :meth:`render`, camera ``R``/``T``, light and material arrays, texture maps).
    An object replaced all the same (``shader.lights = ...``, ``renderer.cameras =
    ...``) is drawn by the next render, eagerly and from a replayed graph alike (the
    replay's key holds the objects, :class:`~warpraster.raster.workspace.StateWatch`);
    the raster settings resolved from the construction's camera (its default
    near-plane clip) stay.
    :meth:`render` then allocates nothing, reads nothing back to the host and
    validates nothing, so a render + loss + ``tape.backward()`` can be captured
    in one graph (``wp.ScopedCapture``; on the cpu device too) and replayed.

    Args (keyword-only):
        cameras: a warpraster camera batch (one per mesh, or one for all).
        raster_settings: :class:`~warpraster.RasterizationSettings` (None resolved
            from the camera as :class:`~warpraster.MeshRasterizer` does).
        shader: a shader of :mod:`warpraster.shading` (its lights/materials/blend).
        faces: (F, 3) int32 packed faces; mesh n owns
            ``[mesh_to_face_first_idx[n], + num_faces_per_mesh[n])``.
        mesh_to_face_first_idx, num_faces_per_mesh: (N,) mesh ranges.
        num_verts: V, length of the vertex arrays passed to :meth:`render`.
        textures: ``None``, ``TexturesVertex``, ``TexturesUV`` or ``TexturesUVMipmap``.
        face_to_object: optional (F,) int32 object id per face for ``mesh_ids``
            (default: the mesh index n).
        antialias: run :func:`warpraster.antialias` on the hard image (a hard
            shader and ``faces_per_pixel=1``): ``image`` is then the antialiased
            image, differentiable with respect to where its edges are (vertices,
            camera); the shaded image stays in ``outputs.shaded``. An image loss
            on it takes the unfused route.
        face_materials: optional (F,) int32 per-face rows of the shader's
            ``materials``, then a material table of any number of rows (Phong and
            flat shaders; checked here once); None: one material per image.
        channels: the extra channels to write beside the image, any of
            ``("depth", "normals", "face_ids", "mesh_ids")`` (default: all); the
            others are None in :class:`RenderOutputs` and cost nothing (no
            launch when none is asked for).
        steps: output sets, one per render recorded on one tape (a render
            overwrites its step's buffers; the tape needs each step's own).
        requires_grad: allocate gradients (for a ``wp.Tape``).
        device: Warp device (default: the camera's).

    Gradients: the arrays you pass in (vertices, camera, light, material and
    texture arrays) accumulate, as everywhere in Warp: zero their ``.grad``
    between steps. The renderer's own buffers (projected vertices, fragments,
    per-face tables, image) are cleared by the render that records them, so a
    fresh ``wp.Tape()`` per step gives each step's gradients, eagerly or
    replayed from a captured graph; ``tape.zero()`` is never needed (and
    harmless). The backward reads the step's outputs (the softmax blend's
    adjoint reads the image): do not write into them before ``tape.backward()``.

    Example (one step captured; each replay starts from cleared gradients)::

        r = Renderer(cameras=cams, raster_settings=settings, shader=SoftPhongShader(...),
                     faces=faces, mesh_to_face_first_idx=first, num_faces_per_mesh=count,
                     num_verts=V, textures=TexturesVertex(colors))
        tape = wp.Tape()
        with wp.ScopedCapture() as cap:
            loss.zero_()
            verts.grad.zero_()  # your own arrays: zeroed by you
            with tape:
                r.render(verts)
                r.image_mse(target, out=loss)  # its gradient is added by the shading adjoint
            tape.backward(loss)
        wp.capture_launch(cap.graph)  # per step, after updating verts in place
    """

    def __init__(
        self,
        *,
        cameras,
        raster_settings,
        shader: ShaderBase,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        num_verts: int,
        textures=None,
        face_to_object=None,
        face_materials=None,
        antialias: bool = False,
        channels=CHANNELS,
        steps: int = 1,
        requires_grad: bool = True,
        device=None,
    ):
        if not isinstance(shader, ShaderBase):
            raise TypeError(f"shader must be a warpraster shader, got {type(shader).__name__}")
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if isinstance(channels, str) or not hasattr(channels, "__iter__"):
            raise TypeError(
                f"channels must be a sequence of names from {CHANNELS}, got {channels!r}"
            )
        channels = tuple(channels)
        if not all(c in CHANNELS for c in channels):
            raise ValueError(
                f"channels must be a sequence of names from {CHANNELS}, got {channels!r}"
            )
        self.channels = tuple(c for c in CHANNELS if c in channels)
        self.rasterizer = MeshRasterizer(cameras=cameras, raster_settings=raster_settings)
        self.cameras = cameras
        self.device = wp.get_device(device if device is not None else cameras.device)
        dev = self.device
        self.shader = shader
        self.textures = textures
        self.faces = as_faces_array(faces, "faces", dev)
        self.first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", dev)
        n = self.first.shape[0]
        self.count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", dev, length=n)
        self.num_verts = int(num_verts)
        cameras.check_batch(n)
        check_mesh_inputs(self.num_verts, self.faces.shape[0], n, textures=textures,
                          lights=getattr(shader, "lights", None),
                          materials=(getattr(shader, "materials", None)
                                     if face_materials is None else None))  # fmt: skip
        # validate the static topology once (host reads happen here, not per call)
        pack_meshes(
            wp.zeros(self.num_verts, dtype=wp.vec3, device=dev),
            self.faces,
            self.first,
            self.count,
            validate=True,
        )
        #: each vertex's face corners (static faces, listed once): the vertex normals
        #: and the corner tables' backward gather per vertex instead of scattering
        #: with atomics (deterministic)
        self.corner_lists = CornerLists(self.faces, self.num_verts)
        self.vert_to_mesh = None
        if n > 1 and len(cameras) > 1 or n > 1 and shader.mode == ShadingMode.GOURAUD:
            self.vert_to_mesh = vert_to_mesh_from_faces(
                self.faces, self.first, self.count, self.num_verts, device=dev
            )
        self.settings = self.rasterizer.settings_for(cameras)
        self.settings.check_slots(n)
        h, w = self.settings.image_size
        k = self.settings.faces_per_pixel
        self.shape = (n, h, w, k)
        self.face_to_object = (
            as_index_array(face_to_object, "face_to_object", dev, length=self.faces.shape[0])
            if face_to_object is not None
            else wp.zeros(1, dtype=wp.int32, device=dev)
        )
        self._has_objects = int(face_to_object is not None)
        self.face_materials = None
        if face_materials is not None:
            if shader.mode == ShadingMode.GOURAUD or isinstance(shader, SoftSilhouetteShader):
                raise ValueError("face_materials: per-face materials need a Phong or flat shader")
            self.face_materials = face_materials_array(
                face_materials, self.faces.shape[0], len(shader.materials), dev
            )
        self.requires_grad = bool(requires_grad)
        self.antialias = _check_antialias(antialias, shader)
        self._aa_topology = None
        if self.antialias:
            _check_antialias_k(self.settings)
            self._aa_topology = AntialiasTopology(self.faces, self.num_verts, dev)
        # the normals channel needs vertex normals; Phong and Gouraud compute them anyway
        self._shader_skips_normals = "normals" in self.channels and (
            shader.mode == ShadingMode.FLAT or isinstance(shader, SoftSilhouetteShader)
        )
        self.outputs = [self._make_outputs() for _ in range(int(steps))]
        #: Render calls that repeat the previous call's vertex array are captured
        #: once and replayed as one graph (None: on CUDA; True: everywhere; False:
        #: never): outside a tape the render (:class:`~warpraster.raster.workspace.CallGraph`),
        #: on a tape the render and, as a second graph, its backward
        #: (:class:`~warpraster.tape_replay.RecordedCall`), so an eager training step
        #: costs a few graph launches instead of ~40 kernel launches each way.
        self.call_graphs: bool | None = None
        self._call_graphs = [CallGraph(self.device) for _ in range(int(steps))]
        self._recorded = [RecordedCall(self.device) for _ in range(int(steps))]
        self._armed = [False] * int(steps)  # the captured render armed a fused loss
        self._rendered = [False] * int(steps)  # a render has filled the step's image
        self._state = StateWatch()  # the objects the launches read (replay key)

    def _make_outputs(self) -> RenderOutputs:
        n = self.shape[0]
        nf = self.faces.shape[0]
        if self.settings.clipped:
            ws = ClipWorkspace(
                num_verts=self.num_verts,
                num_faces=nf,
                num_meshes=n,
                settings=self.settings,
                device=self.device,
                requires_grad=self.requires_grad,
                static_faces=True,  # validated once, never changed (the clip pass may skip)
            )
        else:
            ws = RasterWorkspace(
                num_meshes=n,
                num_faces=nf,
                settings=self.settings,
                device=self.device,
                requires_grad=self.requires_grad,
            )
        out = RenderOutputs(self.shape, self.num_verts, nf, self.device, self.requires_grad, ws,
                            self.corner_lists, self.channels)  # fmt: skip
        # the packed meshes the rasterizer reads (projected vertices, static topology,
        # checked at set-up against the workspace made for them above)
        out.meshes = pack_meshes(out.verts_ndc, self.faces, self.first, self.count, validate=False)
        out.shaded = out.image
        out.antialias = None
        if self.antialias:
            out.antialias = Antialias(
                self._aa_topology,
                self.num_verts,
                out.image.shape,
                self.device,
                deterministic=self.settings.deterministic,
            )
            out.image = out.antialias.out
        out.channel_mesh = new_struct(
            ChannelMesh,
            self.device,
            faces=self.faces,
            verts_normals=out.shading.verts_normals,
            face_to_object=self.face_to_object,
            has_objects=self._has_objects,
        )
        return out

    def render(self, verts, *, step: int = 0) -> RenderOutputs:
        """Renders ``verts`` (V,) ``vec3`` (or (V, 3) float32) world-space vertices.

        Returns the step's :class:`RenderOutputs` (``image``, ``depth``, ``normals``,
        ``face_ids``, ``mesh_ids``, ``fragments``): this renderer's own arrays,
        overwritten by the next call of the same step. On a ``wp.Tape`` the image
        is differentiable w.r.t. ``verts``, texture, light, material and camera
        arrays with ``requires_grad``; the extra channels carry no gradient.
        Outside a tape, on CUDA, a call that repeats the previous call's ``verts``
        array replays the whole render as one captured graph (the arrays' current
        contents are read, as by any launch).

        Raises:
            ValueError: ``step`` outside ``[0, steps)``; ``verts`` of another length;
                ``verts`` or camera arrays that require gradients while the renderer
                was made with ``requires_grad=False``.
        """
        out = self.outputs[self._check_step(step)]
        v = (
            verts
            if isinstance(verts, wp.array) and verts.dtype == wp.vec3
            else as_vec3_array(verts, "verts", self.device)
        )
        if v.shape[0] != self.num_verts:
            raise ValueError(
                f"verts has {v.shape[0]} rows, the renderer was made for {self.num_verts}"
            )
        if not self.requires_grad and (v.requires_grad or self.cameras.requires_grad()):
            raise ValueError(
                "verts or the camera arrays require gradients, but this Renderer was made "
                "with requires_grad=False, so its buffers cannot carry them: construct it "
                "with Renderer(..., requires_grad=True)"
            )
        self._rendered[step] = True
        # (the objects the launches read: one replaced since a graph's capture, e.g.
        # shader.lights = ..., makes another key, so the render draws with it)
        sh = self.shader
        state = self._state(self.cameras, sh, getattr(sh, "lights", None),
                            getattr(sh, "materials", None), getattr(sh, "blend_params", None),
                            self.textures, self.face_materials)  # fmt: skip
        key = (v.ptr, tuple(v.shape), tuple(v.strides), v.dtype, v.grad is not None, state,
               self.settings)  # fmt: skip
        tape = active_tape()
        if tape is None:
            self._recorded[step].guard.note_render()  # overwrites what a recorded step read
            self._call_graphs[step](key, lambda: self._launch(v, out), self.call_graphs)
            return out
        rec = self._recorded[step]
        ig = out.shading.image_grad
        replayed = rec(tape, key, lambda: self._launch(v, out), mode=self.call_graphs,
                       backward_key=lambda: _image_grad_key(ig))  # fmt: skip
        if not replayed:
            self._armed[step] = out.shading.loss_armed is not None
        else:
            # what the render's Python side set (launch_shade_blend): the adjoint reads
            # only the image's gradient until a fused loss claims it on this tape
            ig.mse = 0
            out.shading.loss_armed = tape if self._armed[step] else None
        return out

    def image_mse(
        self, target: wp.array, *, out: wp.array | None = None, step: int = 0
    ) -> wp.array:
        """``mean((image - target)^2)`` of the step's last rendered image, into ``out``
        ((1,) float32, accumulated: zero it first; made when None).

        As :func:`~warpraster.shading.image_mse`, but fused into the backward:
        called on the tape right after :meth:`render`, the shading adjoint adds
        the loss's image gradient ``2 (image - target) loss.grad / size`` itself
        (read from ``out.grad`` when the backward runs), so no loss backward
        writes ``image.grad`` first (the adjoint still adds what other terms
        wrote there). Gradients are the same values either way (tested bit for
        bit). ``image.grad``
        then holds only what other terms on the tape wrote to it; the first
        fused loss per render is fused, a second one (or one for a render
        whose shader has no fused adjoint, the silhouette) takes the unfused
        route, as does a loss recorded on another tape than the render.
        ``target`` (N, H, W, 4) float32 must hold its values until the backward
        has run.
        """
        o = self.outputs[self._check_step(step)]
        out = checked_mse_out(o.image, target, out)
        if not self._rendered[step]:
            raise ValueError(f"image_mse: step {step} was not rendered yet (call render first)")
        fuse = o.antialias is None  # the antialiased image's loss is not the shading's
        if fuse and o.shading.fuse_image_mse(target, out, 1.0 / o.image.size, active_tape()):
            return mse_forward(o.image, target, out)[0]
        return image_mse(o.image, target, out=out)

    def _check_step(self, step) -> int:
        """``step`` when it is an int in ``[0, steps)``; TypeError / ValueError naming it."""
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise TypeError(f"step must be an int, got {step!r}")
        if not 0 <= step < len(self.outputs):
            raise ValueError(
                f"step must be in [0, {len(self.outputs)}) (the renderer's steps), got {step}"
            )
        return int(step)

    def _launch(self, v: wp.array, out: RenderOutputs) -> None:
        clear_if_recording(out.verts_ndc)  # the projection writes it; the rest clear their own
        self.cameras.transform_points_ndc(v, self.vert_to_mesh, None, out.verts_ndc)
        frags = rasterize_checked(out.meshes, self.settings, out.workspace)
        out.fragments = frags
        self.shader(
            frags,
            v,
            self.faces,
            textures=self.textures,
            vert_to_mesh=self.vert_to_mesh,
            cameras=self.cameras,
            verts_ndc=out.verts_ndc,
            perspective_correct=self.settings.perspective_correct,
            buffers=out.shading,
            compact_slots=True,
            face_materials=self.face_materials,
            validate=False,  # checked at construction
        )
        if out.antialias is not None:
            out.antialias(out.shaded, frags.pix_to_face, out.verts_ndc, zbuf=frags.zbuf)
        nrm = out.shading.verts_normals
        if self._shader_skips_normals:
            vertex_normals(v, self.faces, out=nrm, sums_out=out.shading.normal_sums,
                           validate=False, corner_lists=self.corner_lists)  # fmt: skip
        if not self.channels:
            return
        wp.launch(
            _channels_kernel,
            dim=patch_launch_size(*self.shape[:3], FORWARD_PATCH_W),
            inputs=[out.pixel_fragments_of(frags), out.channel_mesh],
            outputs=[out.channels],
            device=self.device,
            record_tape=False,
        )
