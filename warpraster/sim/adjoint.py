"""The sensor's deterministic backward: hand-written adjoints, every float sum in a fixed order.

Warp's generated adjoint of a kernel that reads one array element from many
threads adds into that element's gradient with float atomics; on a GPU the order
of those adds follows thread timing, so gradients differ in the last bits run to
run, and contended atomics (every pixel of an image into one camera, every
vertex of a body into one transform) are slow. Here the whole sensor backward,
from the channel gradients to the simulation's arrays, is one function
registered on the tape (:meth:`SensorBackward.run`), built from kernels in
which every element is written by exactly one thread and every sum is taken in
an order fixed by the topology (static, built once at set-up) or by the
fragments:

1. ``channels_adjoint`` (:mod:`~warpraster.sim.pixel_adjoint`, one thread per
   pixel): recomputes the pixel's shading and writes, for the face it shows, the
   gradients with respect to that face's NDC vertices (through barycentrics and
   depth, :func:`warpraster.backward.slot_grads`, PyTorch3D's per-slot
   derivatives), its world vertices (hit point, face normal) and vertex normals;
   with a soft silhouette, also each blurred slot's distance gradient. The
   outline point of a soft pixel goes through Warp's generated adjoint of
   :func:`~warpraster.sim.render.outline_kernel` on per-pixel copies of its
   inputs (each pixel owns its element: no contention).
2. ``face_gather`` (:mod:`~warpraster.sim.gathers`, as steps 3 and 4; one thread
   per packed face): walks the face's pixel bounding box (grown by the blur
   radius) in row order and sums the records of the pixels that show it; a face
   with a box of more than ``BIG_AREA`` pixels (a ground plane, a wall) is
   summed by ``BIG_STRIPS`` threads, one per set of rows, whose sums are then
   added in strip order.
3. ``proj_gather`` (one thread per projected vertex): sums its face corners
   (CSR of the packed faces, ascending) and, with antialias, adds the antialias
   pass's gradient of the vertex (``frame.ndc.grad``, written by that pass's
   deterministic backward, which runs before this one), then the projection's
   adjoint: the gradient of the world point, of the camera transform and of the
   field of view.
4. ``vertex_gather`` (one thread per sensor vertex): sums its projections
   (CSR, ascending); with smooth normals, then the vertex normals' adjoint
   (per face, then per vertex over its corners).
5. Sources: one thread per particle sums its sensor vertices; one block per body
   (:mod:`~warpraster.sim.reductions`) sums the transform gradients of its
   vertices (strided per thread, then a tile reduction: fixed by the block
   size); one block per image sums the camera gradients of its projections and
   pixels; one thread per camera sums its worlds; one block per shape (and one
   for the light) sums the material gradients of the pixels.

Cost: the per-pixel and per-face passes read each covered pixel's records once
(72 bytes, 108 with smooth normals); the face walk reads one int per pixel of
each face's box.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..backward.sorted import SegmentEntries, SortedSegmentSum
from .gathers import (
    BIG_AREA,
    BIG_CAPACITY,
    BIG_STRIPS,
    FACE_KERNELS,
    normal_face_adjoint_kernel,
    normal_vertex_gather_kernel,
    particle_gather_kernel,
    proj_gather_kernel,
    vertex_gather_kernel,
)
from .kernel_args import (
    BigFaces,
    CameraGrads,
    Channels,
    Csr,
    FaceSums,
    FaceWalk,
    MaterialArrays,
    Outline,
    PixelRecords,
    SourceGroups,
    TexelTaps,
    VertexGrads,
    make,
    pixel_row,
)
from .loss import LossTerms
from .pixel_adjoint import CHANNELS_ADJOINT
from .reductions import (
    BLOCK,
    add_texel_grads_kernel,
    body_reduce_kernel,
    camera_add_kernel,
    image_camera_reduce_kernel,
    material_reduce_kernel,
)
from .render import SOFT_SLOTS


def csr(keys: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(start (count + 1,), entries) listing, for each key in ``[0, count)``, the
    positions i with ``keys[i] == key`` in ascending order (negative keys dropped)."""
    keys = np.asarray(keys, np.int64).reshape(-1)
    keep = np.nonzero(keys >= 0)[0]
    order = keep[np.argsort(keys[keep], kind="stable")]
    start = np.zeros(count + 1, np.int64)
    np.add.at(start, keys[keep] + 1, 1)
    return np.cumsum(start).astype(np.int32), order.astype(np.int32)


def _dummy(shape, dtype, device) -> wp.array:
    return wp.zeros(shape, dtype=dtype, device=device)


class SensorBackward:
    """The static topology (CSR lists, built once) and the scratch of the deterministic
    backward of one :class:`~warpraster.sim.CameraSensor`.

    The scratch is shared by the sensor's frame slots: the tape runs their
    backwards one after another, and each uses it only while it runs. Per-pixel
    records (N, H, W): 76 bytes (112 with smooth normals; a soft silhouette adds
    ``SOFT_SLOTS`` x 36 + 60); per packed face 108; per projected vertex 48.
    Camera scratch is allocated by the first backward that needs camera gradients.

    Args:
        sensor: the sensor (its packed topology and options are read here).
        big_area: faces whose pixel box holds more pixels are summed by
            ``big_strips`` threads each.
        big_capacity: at most this many such faces per backward (more are
            walked by one thread each).
        big_strips: threads (row strips) per big face.
    """

    def __init__(self, sensor, *, big_area: int = BIG_AREA, big_capacity: int = BIG_CAPACITY,
                 big_strips: int = BIG_STRIPS):  # fmt: skip
        dev = sensor.device
        self.device = dev
        self.sensor = sensor
        n = sensor.num_images
        h, w = sensor.image_size
        soft = sensor.silhouette_sigma > 0.0
        smooth = sensor.smooth_normals
        self.soft = soft
        self.smooth = smooth
        faces = sensor.faces.numpy()
        num_faces = faces.shape[0]
        num_proj = sensor.proj_vertex.shape[0]
        num_verts = sensor.vertex_source.shape[0]
        first = sensor.mesh_first.numpy()
        count = sensor.mesh_count.numpy()
        face_image = np.full(num_faces, -1, np.int32)
        for i in range(n):
            face_image[first[i] : first[i] + count[i]] = i
        proj_image = sensor.proj_image.numpy()
        if np.any(np.diff(proj_image) < 0):
            raise ValueError("projected vertices must be grouped by image")  # packing invariant
        # a face's pixels lie within its bounding box grown by the blur radius
        margin = float(np.sqrt(sensor.blur_radius)) if soft else 0.0
        self.walk = make(FaceWalk, face_image=wp.array(face_image, dtype=wp.int32, device=dev),
                         margin_ndc=margin)  # fmt: skip
        self.proj_corners = self._csr(faces.reshape(-1), num_proj)
        self.image_projs = self._csr(proj_image, n)
        self.vertex_projs = self._csr(sensor.proj_vertex.numpy(), num_verts)
        self.vertex_corners = self._csr(sensor.sensor_faces.numpy().reshape(-1), num_verts)
        src = sensor.vertex_source.numpy()
        idx = sensor.vertex_index.numpy()
        from .geometry import VertexSource  # noqa: PLC0415

        self.particles = self._source_lists(src, idx, VertexSource.PARTICLE)
        self.bodies = self._source_lists(src, idx, VertexSource.BODY)

        rg = sensor.requires_grad
        img = (n, h, w) if rg else (1, 1, 1)
        self.rec_face = wp.full(img, -1, dtype=wp.int32, device=dev)
        self.rec_ndc = wp.zeros(img, dtype=wp.mat33, device=dev)
        self.rec_world = wp.zeros(img, dtype=wp.mat33, device=dev)
        self.rec_vn = wp.zeros(img if smooth else (1, 1, 1), dtype=wp.mat33, device=dev)
        simg = img if soft else (1, 1, 1)
        # the per-pixel outline points of soft pixels
        self.point_pass = soft
        pimg = simg
        self.rec_soft = wp.zeros((*simg, SOFT_SLOTS) if soft else (1, 1, 1, 1), dtype=wp.mat33,
                                 device=dev)  # fmt: skip
        self.outline_on = wp.zeros(pimg, dtype=wp.int32, device=dev)
        self.outline_verts = wp.zeros(pimg, dtype=wp.mat33, device=dev)
        self.outline_g_bary = wp.zeros(pimg, dtype=wp.vec3, device=dev)
        self.outline_g_depth = wp.zeros(pimg, dtype=float, device=dev)
        self.outline_bary = wp.zeros(pimg, dtype=wp.vec3, device=dev)
        self.outline_depth = wp.zeros(pimg, dtype=float, device=dev)
        mimg = img if sensor.material_grad else (1, 1, 1)
        self.pix_albedo = wp.zeros(mimg, dtype=wp.vec3, device=dev)
        self.pix_light = wp.zeros(mimg, dtype=wp.vec4, device=dev)
        fa = max(num_faces, 1) if rg else 1
        self.face_sums = self._face_sums((fa, 1))
        cap = max(min(int(big_capacity), fa), 1) if rg else 1
        self.big = make(BigFaces, count=wp.zeros(1, dtype=wp.int32, device=dev),
                        faces=wp.zeros(cap, dtype=wp.int32, device=dev),
                        area=int(big_area))  # fmt: skip
        self.strip_sums = self._face_sums((cap, max(int(big_strips), 1)) if rg else (1, 1))
        pa = max(num_proj, 1) if rg else 1
        self.proj_grads = make(VertexGrads, point=wp.zeros(pa, dtype=wp.vec3, device=dev),
                               vn=wp.zeros(pa, dtype=wp.vec3, device=dev))  # fmt: skip
        va = max(num_verts, 1) if rg else 1
        self.vn_grad = wp.zeros(va, dtype=wp.vec3, device=dev)
        sf = sensor.sensor_faces.shape[0] if (rg and smooth) else 1
        self.normal_face_grad = wp.zeros(max(sf, 1), dtype=wp.mat33, device=dev)
        self._camera = None  # camera scratch (allocated on first need)
        self._dummy4 = {t: _dummy((1, 1, 1, 1), t, dev) for t in (wp.vec3, wp.float32, wp.uint32)}
        self._dummy3 = _dummy((1, 1, 1), wp.vec3, dev)
        self._dummy_fov = _dummy(1, wp.float32, dev)
        self._no_ndc_grad = _dummy(1, wp.vec3, dev)
        self._no_camera = make(CameraGrads, t=_dummy(1, wp.vec3, dev), q=_dummy(1, wp.vec4, dev),
                               fov=self._dummy_fov)  # fmt: skip
        self._dummy_cam = _dummy((1, 1), wp.transform, dev)
        self.records = make(
            PixelRecords, face=self.rec_face, ndc=self.rec_ndc, world=self.rec_world,
            vn=self.rec_vn, soft=self.rec_soft, origin=self._dummy3, albedo=self.pix_albedo,
            light=self.pix_light,
        )  # fmt: skip
        self.outline = make(Outline, on=self.outline_on, verts=self.outline_verts,
                            g_bary=self.outline_g_bary, g_depth=self.outline_g_depth)  # fmt: skip
        self.varying_albedo = bool(sensor.geometry.varying_albedo)
        self.texel_sum, self.texel_grad = None, None
        num_texels = sensor.atlas.texels.shape[0]
        if sensor.textured and sensor.material_grad:
            # texel gradients: 4 taps a pixel, summed per texel in sorted order
            self.texel_sum = SortedSegmentSum(4 * n * h * w, wp.vec3, device=dev)
            self.texel_grad = wp.zeros(num_texels, dtype=wp.vec3, device=dev)
            values = wp.zeros(self.texel_sum.count, dtype=wp.vec3, device=dev)
            entries = self.texel_sum.entries(values)
        else:
            none = _dummy(1, wp.int32, dev)
            entries = make(SegmentEntries, values=_dummy(1, wp.vec3, dev), keys=none, order=none)
        self.taps = make(TexelTaps, entries=entries, num_texels=num_texels)
        self.flat = pixel_row(self.records)  # what the block reductions read
        self._grads = {}  # per frame slot: (its channel gradients as a Channels, mask)
        self._vertex_grads = {}  # per frame slot: its sensor vertices' VertexGrads
        self._material_grads = None  # (key, the material gradients as a MaterialArrays)
        self._no_loss = make(
            LossTerms, color=self._dummy4[wp.vec3], color_target=self._dummy4[wp.vec3],
            depth=self._dummy4[wp.float32], depth_target=self._dummy4[wp.float32],
            color_weight=0.0, depth_weight=0.0, loss_grad=self._dummy_fov, mask=0,
        )  # fmt: skip
        self._loss_claims = {}  # per frame slot: the recorded update its fused loss is on
        self._armed = {}  # per frame slot: the fused loss terms of the running backward

    def claim_loss(self, frame, update) -> None:
        """Notes a fused loss (:func:`~warpraster.sim.frame_loss`) on the recorded
        update ``update`` (``(tape, position)``) of frame slot ``frame``; raises
        ValueError for a second one on the same update."""
        claim = update[0].launches[update[1]]  # the update's recorded backward
        if self._loss_claims.get(id(frame)) is claim:
            raise ValueError(
                "frame: a fused loss is already recorded for this update of the slot (give "
                "both targets to one frame_loss call, or use image_loss for more terms)"
            )
        self._loss_claims[id(frame)] = claim

    def arm_loss(self, frame, terms: LossTerms) -> None:
        """Hands the next :meth:`run` of frame slot ``frame`` its fused loss terms (the
        loss's tape entry runs just before the update's)."""
        self._armed[id(frame)] = terms

    def take_loss(self, frame) -> LossTerms:
        """The fused loss terms armed for the next :meth:`run` of ``frame`` (removed),
        or the no-loss terms."""
        return self._armed.pop(id(frame), self._no_loss)

    def _face_sums(self, shape):
        """A :class:`FaceSums` of zeroed ``shape`` arrays: (F, 1) per face, (capacity,
        strips) per big-face strip."""
        dev = self.device
        return make(FaceSums, ndc=wp.zeros(shape, dtype=wp.mat33, device=dev),
                    world=wp.zeros(shape, dtype=wp.mat33, device=dev),
                    vn=wp.zeros(shape, dtype=wp.mat33, device=dev))  # fmt: skip

    def _csr(self, keys, count) -> Csr:
        start, entries = csr(keys, count)
        dev = self.device
        return make(Csr, start=wp.array(start, dtype=wp.int32, device=dev),
                    entries=wp.array(entries, dtype=wp.int32, device=dev))  # fmt: skip

    def _source_lists(self, src, idx, kind):
        sel = np.nonzero(src == int(kind))[0]
        ids = np.unique(idx[sel]) if sel.size else np.zeros(0, np.int64)
        if ids.size == 0:
            return None
        pos = np.searchsorted(ids, idx[sel])
        keys = np.full(src.shape[0], -1, np.int64)
        keys[sel] = pos
        ids = wp.array(ids.astype(np.int32), dtype=wp.int32, device=self.device)
        return make(SourceGroups, verts=self._csr(keys, ids.shape[0]), ids=ids)

    def _camera_scratch(self):
        if self._camera is None:
            s = self.sensor
            dev = self.device
            h, w = s.image_size
            p = max(s.proj_vertex.shape[0], 1)
            n = s.num_images
            self._camera = dict(proj=self._camera_grads(p), image=self._camera_grads(n))
            origin = wp.zeros((n, h, w), dtype=wp.vec3, device=dev)
            self.records.origin = origin
            self.flat = pixel_row(self.records)
        return self._camera

    def _camera_grads(self, count: int) -> CameraGrads:
        dev = self.device
        return make(CameraGrads, t=wp.zeros(count, dtype=wp.vec3, device=dev),
                    q=wp.zeros(count, dtype=wp.vec4, device=dev),
                    fov=wp.zeros(count, dtype=float, device=dev))  # fmt: skip

    def prepare(self, camera_transforms, camera_fovs) -> None:
        """Allocates what a backward with these inputs will need (call at record time)."""
        if camera_transforms.grad is not None or camera_fovs.grad is not None:
            self._camera_scratch()
        if camera_transforms.grad is None and camera_fovs.grad is not None:
            if self._dummy_cam.shape != tuple(camera_transforms.shape):
                self._dummy_cam = wp.zeros(camera_transforms.shape, dtype=wp.transform,
                                           device=self.device)  # fmt: skip

    def _channel_grads(self, frame) -> tuple[Channels, int]:
        """The frame's channel gradients as a :class:`Channels` (absent ones: a dummy)
        and the mask of those present; packed once per slot and set of gradients."""
        # with antialias, the colour gradient is the hard colour's (the pass's adjoint
        # runs first and writes it)
        arrays = tuple(frame.written(name).grad for name in frame.CHANNELS[:6])
        key = tuple(id(a) for a in arrays)
        cached = self._grads.get(id(frame))
        if cached is None or cached[0] != key:
            mask = 0
            fields = {"shape_index": self._dummy4[wp.uint32]}
            for bit, (name, g) in enumerate(zip(frame.CHANNELS, arrays, strict=False)):
                if g is None:
                    g = self._dummy4[
                        wp.vec3 if name in ("color", "albedo", "normal") else wp.float32
                    ]
                else:
                    mask |= 1 << bit
                fields[name] = g
            cached = (key, make(Channels, **fields), mask)
            self._grads[id(frame)] = cached
        return cached[1], cached[2]

    def _vertex_grads_of(self, frame) -> VertexGrads:
        """The frame's sensor-vertex gradients (``points.grad`` and the normal scratch)
        as a :class:`VertexGrads`, packed once per slot and ``points.grad``."""
        cached = self._vertex_grads.get(id(frame))
        if cached is None or cached.point is not frame.points.grad:
            cached = make(VertexGrads, point=frame.points.grad, vn=self.vn_grad)
            self._vertex_grads[id(frame)] = cached
        return cached

    def _material_grads_of(self) -> MaterialArrays:
        """The ``.grad`` arrays of the sensor's :class:`MaterialArrays`, packed once per set
        of gradient arrays."""
        mats = self.sensor.look.materials
        arrays = {name: getattr(mats, name).grad for name in MaterialArrays.vars}
        key = tuple(id(a) for a in arrays.values())
        if self._material_grads is None or self._material_grads[0] != key:
            self._material_grads = (key, make(MaterialArrays, **arrays))
        return self._material_grads[1]

    def run(self, frame, *, camera_transforms, camera_fovs, particle_q, body_q,
            loss: LossTerms | None = None) -> None:  # fmt: skip
        """Adds d(loss)/d(inputs) of frame ``frame`` (from its channels' ``.grad``) to the
        ``.grad`` of ``particle_q``, ``body_q``, ``camera_transforms``, ``camera_fovs``
        and the sensor's material arrays (those that have one); overwrites
        ``frame.points.grad`` with the sensor vertices' gradient. The frame's fragments,
        geometry and look are read through its ``scene``. ``loss``: the fused loss terms
        (default: :meth:`take_loss`)."""
        s = self.sensor
        dev = self.device
        n = s.num_images
        h, w = s.image_size
        soft = self.soft
        smooth = int(self.smooth)
        cam_on = camera_transforms.grad is not None or camera_fovs.grad is not None
        cam = self._camera_scratch() if cam_on else None
        mat_on = s.shape_colors.grad is not None
        grads, mask = self._channel_grads(frame)
        loss = self.take_loss(frame) if loss is None else loss
        wp.launch(
            CHANNELS_ADJOINT[soft, bool(smooth), self.varying_albedo, s.lit],
            dim=(n, h, w),
            inputs=[frame.scene, camera_transforms, grads, mask, loss, int(cam_on), int(mat_on),
                    int(s.exact_perspective_grad)],
            outputs=[self.records, self.outline, self.taps],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        if self.point_pass:
            from .render import outline_kernel  # noqa: PLC0415

            wp.launch(
                outline_kernel,
                dim=(n, h, w),
                inputs=[self.outline_on, h, w, self.outline_verts],
                outputs=[self.outline_bary, self.outline_depth],
                adj_inputs=[None, 0, 0, self.rec_ndc],
                adj_outputs=[self.outline_g_bary, self.outline_g_depth],
                adjoint=True,
                device=dev,
                record_tape=False,
            )
        num_faces = s.faces.shape[0]
        scene = frame.scene
        if num_faces:
            face_gather_kernel, big_face_strips_kernel, big_face_sum_kernel = FACE_KERNELS[
                soft, bool(smooth)
            ]
            self.big.count.zero_()
            walk = [self.walk, scene, self.records]
            wp.launch(face_gather_kernel, dim=num_faces, inputs=walk, outputs=[self.face_sums,
                      self.big], device=dev, record_tape=False)  # fmt: skip
            strips = self.strip_sums
            wp.launch(big_face_strips_kernel, dim=strips.ndc.shape, inputs=[*walk, self.big],
                      outputs=[strips], device=dev, record_tape=False)  # fmt: skip
            wp.launch(big_face_sum_kernel, dim=self.big.faces.shape[0], inputs=[self.big, strips],
                      outputs=[self.face_sums], device=dev, record_tape=False)  # fmt: skip
        # the antialias pass's NDC gradient (its backward ran first), added per projection
        aa_on = frame.antialias is not None and frame.ndc.grad is not None
        wp.launch(
            proj_gather_kernel,
            dim=s.proj_vertex.shape[0],
            inputs=[self.proj_corners, s.view, smooth, int(cam_on), int(aa_on), self.face_sums,
                    frame.points, camera_transforms, camera_fovs,
                    frame.ndc.grad if aa_on else self._no_ndc_grad],
            outputs=[self.proj_grads, cam["proj"] if cam_on else self._no_camera],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        vertex = self._vertex_grads_of(frame)  # frame.points.grad and the normal scratch
        num_verts = vertex.point.shape[0]
        wp.launch(
            vertex_gather_kernel,
            dim=num_verts,
            inputs=[self.vertex_projs, smooth, self.proj_grads],
            outputs=[vertex],
            device=dev,
            record_tape=False,
        )  # fmt: skip
        if smooth:
            wp.launch(normal_face_adjoint_kernel, dim=s.sensor_faces.shape[0],
                      inputs=[s.sensor_mesh, frame.points, vertex],
                      outputs=[self.normal_face_grad], device=dev, record_tape=False)  # fmt: skip
            wp.launch(normal_vertex_gather_kernel, dim=num_verts,
                      inputs=[s.sensor_mesh, self.normal_face_grad],
                      outputs=[vertex], device=dev, record_tape=False)  # fmt: skip
        if self.particles is not None and particle_q.grad is not None:
            wp.launch(particle_gather_kernel, dim=self.particles.ids.shape[0],
                      inputs=[self.particles, vertex], outputs=[particle_q.grad],
                      device=dev, record_tape=False)  # fmt: skip
        if self.bodies is not None and body_q.grad is not None:
            wp.launch_tiled(body_reduce_kernel, dim=[self.bodies.ids.shape[0]],
                            inputs=[self.bodies, s.sources, body_q, vertex],
                            outputs=[body_q.grad], block_dim=BLOCK, device=dev,
                            record_tape=False)  # fmt: skip
        if cam_on:
            wp.launch_tiled(
                image_camera_reduce_kernel,
                dim=[n],
                inputs=[self.image_projs, h * w, cam["proj"], self.flat],
                outputs=[cam["image"]],
                block_dim=BLOCK,
                device=dev,
                record_tape=False,
            )  # fmt: skip
            cam_grad = camera_transforms.grad
            if cam_grad is None:
                cam_grad = self._dummy_cam  # sized by prepare()
            fov_grad = camera_fovs.grad
            wp.launch(
                camera_add_kernel,
                dim=s.camera_count,
                inputs=[s.world_count, s.camera_count, int(fov_grad is not None), cam["image"]],
                outputs=[cam_grad, self._dummy_fov if fov_grad is None else fov_grad],
                device=dev,
                record_tape=False,
            )  # fmt: skip
        if mat_on and self.texel_sum is not None and s.atlas.texels.grad is not None:
            self.texel_grad.zero_()
            self.texel_sum.run(self.taps.entries.values, self.taps.num_texels, self.texel_grad,
                               accumulate=False)  # fmt: skip
            wp.launch(add_texel_grads_kernel, dim=self.texel_grad.shape[0],
                      inputs=[self.texel_grad], outputs=[s.atlas.texels.grad], device=dev,
                      record_tape=False)  # fmt: skip
        if mat_on:
            wp.launch_tiled(
                material_reduce_kernel,
                dim=[s.shape_colors.shape[0] + 1],
                inputs=[s.surface, n * h * w, self.flat],
                outputs=[self._material_grads_of()],
                block_dim=BLOCK,
                device=dev,
                record_tape=False,
            )  # fmt: skip


__all__ = ["SensorBackward", "csr"]
