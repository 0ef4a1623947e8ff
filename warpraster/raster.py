"""The raster pass: per-pixel top-K queue of faces sorted by depth (no gradients).

Two paths give identical output:

* naive (``bin_size=0``): one thread per pixel loops over all faces of its mesh;
* binned (``bin_size > 0``): :mod:`warpraster.binning` builds per-bin face lists,
  then one thread per pixel loops over its bin's list (or, if the list
  overflowed, over all faces of the mesh).

Both write ``pix_to_face`` only; :mod:`warpraster.fragments` then recomputes the
differentiable outputs from it. The queue lives in the output arrays themselves
(sorted insertion into the pixel's K slots, keyed by (z, face index)), so K is
bounded by memory, not by registers: the candidate order does not change the
result because (z, face) is a total order.
"""

from __future__ import annotations

import math

import numpy as np
import warp as wp

from . import binning
from .fragments import (
    DeterministicBackward,
    Fragments,
    allocate_fragments,
    recompute_fragments,
)
from .geometry import (
    EPS,
    barycentric,
    clip_barycentric,
    face_area,
    is_inside,
    perspective_correct,
    pixel_centre,
    point_triangle_dist2,
)
from .meshes import PackedMeshes, pack_meshes

wp.set_module_options({"enable_backward": False})

_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- kernels
@wp.func
def _finite3(v: wp.vec3) -> bool:
    return wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2])


@wp.kernel
def _setup_faces(
    verts: wp.array(dtype=wp.vec3),
    faces: wp.array2d(dtype=wp.int32),
    mesh_first: wp.array(dtype=wp.int32),
    mesh_count: wp.array(dtype=wp.int32),
    num_meshes: int,
    blur_radius: float,
    cull_backfaces: int,
    face_mesh: wp.array(dtype=wp.int32),
    face_bbox: wp.array(dtype=wp.vec4),
):
    """Per face: owning mesh (-1 if the face can never be drawn) and blur-grown bbox."""
    f = wp.tid()
    face_mesh[f] = -1
    # Owning mesh: the last non-empty mesh whose range starts at or before f.
    lo = int(0)
    hi = num_meshes - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mesh_first[mid] <= f:
            lo = mid
        else:
            hi = mid - 1
    m = lo
    while m > 0 and mesh_count[m] == 0:
        m -= 1
    if f < mesh_first[m] or f >= mesh_first[m] + mesh_count[m]:
        return
    nv = verts.shape[0]
    i0 = faces[f, 0]
    i1 = faces[f, 1]
    i2 = faces[f, 2]
    if i0 < 0 or i1 < 0 or i2 < 0 or i0 >= nv or i1 >= nv or i2 >= nv:
        return
    v0 = verts[i0]
    v1 = verts[i1]
    v2 = verts[i2]
    if not (_finite3(v0) and _finite3(v1) and _finite3(v2)):
        return
    area = face_area(wp.vec2(v0[0], v0[1]), wp.vec2(v1[0], v1[1]), wp.vec2(v2[0], v2[1]))
    if area <= EPS and area >= -EPS:
        return
    if cull_backfaces != 0 and area < 0.0:
        return
    if wp.min(wp.min(v0[2], v1[2]), v2[2]) < EPS:
        return
    r = wp.sqrt(blur_radius)
    face_bbox[f] = wp.vec4(
        wp.min(wp.min(v0[0], v1[0]), v2[0]) - r,
        wp.min(wp.min(v0[1], v1[1]), v2[1]) - r,
        wp.max(wp.max(v0[0], v1[0]), v2[0]) + r,
        wp.max(wp.max(v0[1], v1[1]), v2[1]) + r,
    )
    face_mesh[f] = m


@wp.struct
class _Pass:
    verts: wp.array(dtype=wp.vec3)
    faces: wp.array2d(dtype=wp.int32)
    neighbor: wp.array(dtype=wp.int32)
    face_mesh: wp.array(dtype=wp.int32)
    face_bbox: wp.array(dtype=wp.vec4)
    mesh_first: wp.array(dtype=wp.int32)
    mesh_count: wp.array(dtype=wp.int32)
    height: int
    width: int
    faces_per_pixel: int
    blur_radius: float
    perspective: int
    clip_bary: int
    pix_to_face: wp.array4d(dtype=wp.int32)
    zq: wp.array4d(dtype=wp.float32)


@wp.func
def _test_face(ps: _Pass, f: int, n: int, p: wp.vec2):
    """(hit, z, unsigned squared distance) of face f at pixel centre p of image n."""
    hit = False
    z = float(0.0)
    dist = float(0.0)
    if ps.face_mesh[f] == n:
        bb = ps.face_bbox[f]
        if not (p[0] > bb[2] or p[0] < bb[0] or p[1] > bb[3] or p[1] < bb[1]):
            v0 = ps.verts[ps.faces[f, 0]]
            v1 = ps.verts[ps.faces[f, 1]]
            v2 = ps.verts[ps.faces[f, 2]]
            a = wp.vec2(v0[0], v0[1])
            b = wp.vec2(v1[0], v1[1])
            c = wp.vec2(v2[0], v2[1])
            bary = barycentric(p, a, b, c)
            if ps.perspective != 0:
                bary = perspective_correct(bary, v0[2], v1[2], v2[2])
            inside = is_inside(bary)
            if ps.clip_bary != 0:
                bary = clip_barycentric(bary)
            z = bary[0] * v0[2] + bary[1] * v1[2] + bary[2] * v2[2]
            if z >= 0.0:
                dist = point_triangle_dist2(p, a, b, c)
                hit = inside or dist < ps.blur_radius
    return hit, z, dist


@wp.func
def _consider(ps: _Pass, f: int, n: int, yi: int, xi: int, p: wp.vec2, size: int) -> int:
    """Offers face f to the pixel's queue; returns the new queue size."""
    hit, z, dist = _test_face(ps, f, n, p)
    if not hit:
        return size
    k = ps.faces_per_pixel
    if size == k:
        zl = ps.zq[n, yi, xi, k - 1]
        if z > zl or (z == zl and f > ps.pix_to_face[n, yi, xi, k - 1]):
            return size
    # A face split in two by near-plane clipping: of the two halves covering the
    # pixel only the one nearer in xy is kept (ties: the lower index).
    g = ps.neighbor[f]
    if g >= 0:
        hit_g, z_g, dist_g = _test_face(ps, g, n, p)
        if hit_g and (dist_g < dist or (dist_g == dist and g < f)):
            return size
    pos = size
    if size == k:
        pos = k - 1
    else:
        size += 1
    while pos > 0:
        zp = ps.zq[n, yi, xi, pos - 1]
        fp = ps.pix_to_face[n, yi, xi, pos - 1]
        if zp > z or (zp == z and fp > f):
            ps.zq[n, yi, xi, pos] = zp
            ps.pix_to_face[n, yi, xi, pos] = fp
            pos -= 1
        else:
            break
    ps.zq[n, yi, xi, pos] = z
    ps.pix_to_face[n, yi, xi, pos] = f
    return size


@wp.func
def _finish(ps: _Pass, n: int, yi: int, xi: int, size: int):
    for j in range(size, ps.faces_per_pixel):
        ps.pix_to_face[n, yi, xi, j] = -1


@wp.kernel
def _raster_naive(ps: _Pass):
    n, yi, xi = wp.tid()
    p = pixel_centre(yi, xi, ps.height, ps.width)
    first = ps.mesh_first[n]
    size = int(0)
    for f in range(first, first + ps.mesh_count[n]):
        size = _consider(ps, f, n, yi, xi, p, size)
    _finish(ps, n, yi, xi, size)


@wp.kernel
def _raster_fine(
    ps: _Pass,
    bin_size: int,
    bin_count: wp.array3d(dtype=wp.int32),
    bin_faces: wp.array4d(dtype=wp.int32),
):
    n, yi, xi = wp.tid()
    p = pixel_centre(yi, xi, ps.height, ps.width)
    by = yi // bin_size
    bx = xi // bin_size
    count = bin_count[n, by, bx]
    size = int(0)
    if count > bin_faces.shape[3]:
        # Overflowed list: exact fallback over every face of the mesh.
        first = ps.mesh_first[n]
        for f in range(first, first + ps.mesh_count[n]):
            size = _consider(ps, f, n, yi, xi, p, size)
    else:
        for j in range(count):
            size = _consider(ps, bin_faces[n, by, bx, j], n, yi, xi, p, size)
    _finish(ps, n, yi, xi, size)


# ----------------------------------------------------------------------------- settings
def parse_image_size(image_size) -> tuple[int, int]:
    """``int`` or ``(H, W)`` -> (H, W), each >= 1."""
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        h = w = int(image_size)
    else:
        try:
            h, w = (int(s) for s in image_size)
        except (TypeError, ValueError):
            raise TypeError(f"image_size must be an int or (H, W), got {image_size!r}") from None
    if h < 1 or w < 1:
        raise ValueError(f"image_size must be >= 1 on both sides, got {(h, w)}")
    return h, w


def default_bin_size(height: int, width: int) -> int:
    """PyTorch3D's CUDA heuristic: 8 up to 64 px, then 2**max(ceil(log2(max side)) - 4, 4)."""
    m = max(height, width)
    if m <= 64:
        return 8
    return 2 ** max(int(math.ceil(math.log2(m))) - 4, 4)


def default_max_faces_per_bin(num_faces: int) -> int:
    """PyTorch3D's default capacity, capped at the face count (a list never needs more)."""
    return max(1, min(num_faces, max(10000, num_faces // 5)))


# ----------------------------------------------------------------------------- workspace
class RasterWorkspace:
    """Buffers of one rasterization configuration, allocated once and reused.

    A render call that is given a workspace allocates nothing and reads nothing
    back to the host, so it can be captured in a CUDA graph. The fragments it
    returns are this workspace's output arrays: keep one workspace per frame
    recorded on a tape (a later call overwrites them). With ``deterministic``
    the backward to the vertices is atomic-free and bit-identical run after run
    (:class:`~warpraster.fragments.DeterministicBackward`, extra buffers).
    """

    def __init__(
        self,
        *,
        num_meshes: int,
        num_faces: int,
        image_size,
        faces_per_pixel: int,
        bin_size: int,
        max_faces_per_bin: int | None = None,
        device=None,
        requires_grad: bool = False,
        deterministic: bool = False,
    ):
        h, w = parse_image_size(image_size)
        self.device = wp.get_device(device)
        self.num_meshes = int(num_meshes)
        self.num_faces = int(num_faces)
        self.image_size = (h, w)
        self.faces_per_pixel = int(faces_per_pixel)
        self.bin_size = int(bin_size)
        self.requires_grad = bool(requires_grad)
        f_alloc = max(self.num_faces, 1)
        self.face_mesh = wp.empty(f_alloc, dtype=wp.int32, device=self.device)
        self.face_bbox = wp.empty(f_alloc, dtype=wp.vec4, device=self.device)
        self.overflow = wp.zeros(1, dtype=wp.int32, device=self.device)
        if self.bin_size > 0:
            if max_faces_per_bin is None:
                max_faces_per_bin = default_max_faces_per_bin(self.num_faces)
            self.max_faces_per_bin = int(max_faces_per_bin)
            by, bx = binning.bin_grid(h, w, self.bin_size)
            self.bin_count = wp.zeros((self.num_meshes, by, bx), dtype=wp.int32, device=self.device)
            self.bin_faces = wp.empty(
                (self.num_meshes, by, bx, self.max_faces_per_bin),
                dtype=wp.int32,
                device=self.device,
            )
        else:
            self.max_faces_per_bin = 0
            self.bin_count = None
            self.bin_faces = None
        self.fragments = allocate_fragments(
            self.num_meshes, h, w, self.faces_per_pixel, self.device, self.requires_grad
        )
        self.fragments._overflow = self.overflow if self.bin_size > 0 else None
        self.deterministic = bool(deterministic)
        self.deterministic_backward = (
            DeterministicBackward(self.fragments.shape, self.num_faces, self.device)
            if self.deterministic
            else None
        )

    def matches(self, *, num_meshes, num_faces, image_size, faces_per_pixel, bin_size, device):
        return (
            self.num_meshes == num_meshes
            and self.num_faces == num_faces
            and self.image_size == tuple(image_size)
            and self.faces_per_pixel == faces_per_pixel
            and self.bin_size == bin_size
            and self.device == wp.get_device(device)
        )


# ----------------------------------------------------------------------------- entry
def _check_settings(faces_per_pixel, blur_radius, bin_size, max_faces_per_bin):
    if isinstance(faces_per_pixel, bool) or not isinstance(faces_per_pixel, (int, np.integer)):
        raise TypeError(f"faces_per_pixel must be an int, got {faces_per_pixel!r}")
    if faces_per_pixel < 1:
        raise ValueError(f"faces_per_pixel must be >= 1, got {faces_per_pixel}")
    blur = float(blur_radius)
    if not math.isfinite(blur) or blur < 0.0:
        raise ValueError(f"blur_radius must be finite and >= 0, got {blur_radius}")
    if bin_size is not None:
        if isinstance(bin_size, bool) or not isinstance(bin_size, (int, np.integer)):
            raise TypeError(f"bin_size must be None or an int, got {bin_size!r}")
        if bin_size < 0:
            raise ValueError(f"bin_size must be None, 0 (naive) or > 0, got {bin_size}")
    if max_faces_per_bin is not None:
        if isinstance(max_faces_per_bin, bool) or not isinstance(
            max_faces_per_bin, (int, np.integer)
        ):
            raise TypeError(f"max_faces_per_bin must be None or an int, got {max_faces_per_bin!r}")
        if max_faces_per_bin < 1:
            raise ValueError(f"max_faces_per_bin must be >= 1, got {max_faces_per_bin}")


def rasterize_meshes(
    verts,
    faces,
    mesh_to_face_first_idx,
    num_faces_per_mesh,
    *,
    image_size=256,
    blur_radius: float = 0.0,
    faces_per_pixel: int = 8,
    bin_size: int | None = None,
    max_faces_per_bin: int | None = None,
    perspective_correct: bool = False,
    clip_barycentric_coords: bool = False,
    cull_backfaces: bool = False,
    clipped_faces_neighbor_idx=None,
    z_clip_value: float | None = None,
    cull_to_frustum: bool = False,
    workspace: RasterWorkspace | None = None,
    validate: bool = True,
    deterministic: bool = False,
) -> Fragments:
    """Rasterizes a packed batch of triangle meshes, as PyTorch3D's ``rasterize_meshes``.

    Each mesh n of the batch is drawn into its own H x W image; every pixel keeps
    the K nearest faces that cover it (or come within ``blur_radius`` of it).

    Args:
        verts: (V, 3) vertices in NDC (x left, y up) with z = depth: a
            ``wp.array`` of ``vec3`` (its ``.grad`` receives gradients when the
            call is recorded on a ``wp.Tape``), a (V, 3) float32 ``wp.array``
            (reinterpreted in place), or a NumPy array (copied to Warp's default
            device).
        faces: (F, 3) int vertex indices into ``verts`` (packed, global).
        mesh_to_face_first_idx: (N,) first face of each mesh.
        num_faces_per_mesh: (N,) face count of each mesh (0 allowed).
        image_size: ``int`` or ``(H, W)``; non-square images keep square pixels.
        blur_radius: squared NDC distance within which a face outside a pixel
            still covers it (the bounding box grows by its square root).
        faces_per_pixel: K >= 1. Bounded only by memory (N*H*W*K < 2**31): the
            queue lives in the output arrays, not in registers.
        bin_size: None = heuristic (PyTorch3D's CUDA rule), 0 = naive, > 0 =
            coarse-to-fine with bins of that many pixels. Output is identical.
        max_faces_per_bin: capacity of each bin's face list (None = PyTorch3D's
            default). An overflowing bin still renders exactly: its pixels fall
            back to all faces of the mesh; ``Fragments.overflowed_bins()`` says
            how many bins did.
        perspective_correct: perspective-correct barycentrics (z = view depth).
        clip_barycentric_coords: clamp negative barycentrics to 0, renormalise.
        cull_backfaces: skip faces that are clockwise in NDC xy (PyTorch3D's rule).
        clipped_faces_neighbor_idx: (F,) index of the other half of a face split
            by near-plane clipping, -1 for none (the default).
        z_clip_value: split faces crossing the plane z = z_clip_value and drop
            the parts in front of it (None = no clipping).
        cull_to_frustum: drop faces wholly outside the NDC view frustum.
        workspace: reusable buffers (see :class:`RasterWorkspace`). With one, the
            call allocates nothing; without, one is made for this call.
        validate: check face indices and offsets on the host (a device read).
            Pass False in a captured loop once the topology has been checked.
        deterministic: atomic-free backward, bit-identical gradients run after
            run (slower, more memory). A given workspace must have been made
            with ``deterministic=True``.

    Returns:
        :class:`Fragments` (``pix_to_face``, ``zbuf``, ``bary_coords``, ``dists``).

    Non-finite vertices: a face with any NaN or inf vertex coordinate is never
    drawn (it covers no pixel and gets no gradient); other faces are unaffected.

    Raises:
        TypeError, ValueError: bad input, named by argument, before any kernel runs.
    """
    h, w = parse_image_size(image_size)
    _check_settings(faces_per_pixel, blur_radius, bin_size, max_faces_per_bin)
    meshes = pack_meshes(
        verts,
        faces,
        mesh_to_face_first_idx,
        num_faces_per_mesh,
        clipped_faces_neighbor_idx,
        validate=validate,
    )
    n = meshes.num_meshes
    k = int(faces_per_pixel)
    if n * h * w * k > _INT32_MAX:
        raise ValueError(
            f"faces_per_pixel={k} with {n} images of {h}x{w} needs more than 2**31 slots"
        )
    if z_clip_value is not None or cull_to_frustum:
        if deterministic:
            raise ValueError("deterministic=True is not supported with z clipping / culling yet")
        from .clip import rasterize_clipped  # noqa: PLC0415 - optional path

        return rasterize_clipped(
            meshes,
            image_size=(h, w),
            blur_radius=float(blur_radius),
            faces_per_pixel=k,
            bin_size=bin_size,
            max_faces_per_bin=max_faces_per_bin,
            perspective_correct=bool(perspective_correct),
            clip_barycentric_coords=bool(clip_barycentric_coords),
            cull_backfaces=bool(cull_backfaces),
            z_clip_value=z_clip_value,
            cull_to_frustum=bool(cull_to_frustum),
            workspace=workspace,
        )
    if bin_size is None:
        bin_size = default_bin_size(h, w)
    if workspace is None:
        workspace = RasterWorkspace(
            num_meshes=n,
            num_faces=meshes.num_faces,
            image_size=(h, w),
            faces_per_pixel=k,
            bin_size=int(bin_size),
            max_faces_per_bin=max_faces_per_bin,
            device=meshes.device,
            requires_grad=meshes.verts.requires_grad,
            deterministic=deterministic,
        )
    elif not workspace.matches(
        num_meshes=n,
        num_faces=meshes.num_faces,
        image_size=(h, w),
        faces_per_pixel=k,
        bin_size=int(bin_size),
        device=meshes.device,
    ):
        raise ValueError(
            "workspace was made for another configuration (meshes, faces, image size, "
            "faces_per_pixel, bin_size or device differ)"
        )
    elif deterministic and not workspace.deterministic:
        raise ValueError("deterministic=True needs a workspace made with deterministic=True")
    return rasterize_packed(
        meshes,
        workspace,
        blur_radius=float(blur_radius),
        perspective_correct=bool(perspective_correct),
        clip_barycentric_coords=bool(clip_barycentric_coords),
        cull_backfaces=bool(cull_backfaces),
    )


def rasterize_packed(
    meshes: PackedMeshes,
    workspace: RasterWorkspace,
    *,
    blur_radius: float,
    perspective_correct: bool,
    clip_barycentric_coords: bool,
    cull_backfaces: bool,
) -> Fragments:
    """The render call proper: no validation, no allocation, no host reads.

    ``meshes`` may be a capacity buffer (e.g. clipped faces) whose per-mesh
    ranges live only on the device; faces outside every range are ignored.
    """
    ws = workspace
    device = ws.device
    h, w = ws.image_size
    n = ws.num_meshes
    out = ws.fragments
    if meshes.num_faces > 0:
        wp.launch(
            _setup_faces,
            dim=meshes.num_faces,
            inputs=[
                meshes.verts,
                meshes.faces,
                meshes.mesh_to_face_first_idx,
                meshes.num_faces_per_mesh,
                n,
                blur_radius,
                int(cull_backfaces),
            ],
            outputs=[ws.face_mesh, ws.face_bbox],
            device=device,
            record_tape=False,
        )
    ps = _Pass()
    ps.verts = meshes.verts
    ps.faces = meshes.faces
    ps.neighbor = meshes.clipped_faces_neighbor_idx
    ps.face_mesh = ws.face_mesh
    ps.face_bbox = ws.face_bbox
    ps.mesh_first = meshes.mesh_to_face_first_idx
    ps.mesh_count = meshes.num_faces_per_mesh
    ps.height = h
    ps.width = w
    ps.faces_per_pixel = ws.faces_per_pixel
    ps.blur_radius = blur_radius
    ps.perspective = int(perspective_correct)
    ps.clip_bary = int(clip_barycentric_coords)
    ps.pix_to_face = out.pix_to_face
    ps.zq = out.zbuf
    if ws.bin_size > 0:
        ws.bin_count.zero_()
        ws.overflow.zero_()
        if meshes.num_faces > 0:
            binning.coarse_bin(
                ws.face_mesh,
                ws.face_bbox,
                h,
                w,
                ws.bin_size,
                ws.bin_count,
                ws.bin_faces,
                ws.overflow,
            )
        wp.launch(
            _raster_fine,
            dim=(n, h, w),
            inputs=[ps, ws.bin_size, ws.bin_count, ws.bin_faces],
            device=device,
            record_tape=False,
        )
    else:
        wp.launch(_raster_naive, dim=(n, h, w), inputs=[ps], device=device, record_tape=False)
    recompute_fragments(
        meshes.verts,
        meshes.faces,
        out,
        perspective_correct=perspective_correct,
        clip_barycentric_coords=clip_barycentric_coords,
        deterministic=ws.deterministic_backward,
    )
    return out
