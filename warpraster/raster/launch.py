"""The render call proper: issue setup, binning, queue and output passes.

No validation, no allocation, no host reads: everything here runs on buffers a
:class:`~warpraster.raster.workspace.RasterWorkspace` owns, through its launch
cache, and repeated calls replay as one graph (:class:`CallGraph`). The
backward is registered on the active tape by :mod:`warpraster.backward`.
"""

from __future__ import annotations

import warp as wp

from ..backward import record_backward
from ..backward.tape import active_tape
from ..fragments import Fragments
from ..meshes import PackedMeshes
from ..settings import RasterSettings
from . import binning
from .faces import setup_faces
from .outputs import write_outputs_kernel
from .queue import raster_naive_at, raster_output_queue, register_kernel
from .small_faces import EMPTY_KEY_BYTE, small_face_lanes, small_faces_k1
from .workspace import RasterWorkspace, array_key, make_pass

__all__ = ["rasterize_naive_at", "rasterize_packed"]

#: Thread block of the output-array queue pass when it serves only the bins of
#: split faces (the register queue serves the rest; a bin is still one warp at
#: K > 1): most threads exit at once, and in bin-sized blocks (32 threads at K > 1)
#: launching the blocks bounded the pass. K=8 render forward on an H200: 32
#: threads 0.601 ms, 64 0.585, 128 0.584-0.585, 256 0.590
#: (``python scripts/gpu_launch_shapes.py``).
ORDERED_ONLY_BLOCK = 128
#: About the most threads of that pass (a grid-stride loop over the pixels
#: beyond, whole bins a stride): without split faces its threads end at once,
#: and over one thread per pixel that still took 0.014 ms at K=8.
ORDERED_ONLY_THREADS = 1 << 17


def rasterize_packed(
    meshes: PackedMeshes,
    workspace: RasterWorkspace,
    settings: RasterSettings,
    out: Fragments | None = None,
) -> Fragments:
    """Rasterizes validated meshes into ``workspace`` (no clipping; see
    :func:`warpraster.raster.clipped.rasterize_clipped`).

    ``out``: output arrays of the workspace's shape to write instead of the
    workspace's own (the torch adapter writes into fresh tensors while reusing
    one workspace's scratch). Such a call is not recorded on a ``wp.Tape``
    (its caller runs the backward with :func:`warpraster.backward.grads_from_pix_to_face`);
    it raises if a tape is recording and the vertices require gradients.

    ``meshes`` may be a capacity buffer (e.g. clipped faces) whose per-mesh
    ranges live only on the device; faces outside every range are ignored. On
    CUDA (``Tuning.call_graphs``), a call repeating the previous call's arrays,
    settings and tuning replays the workspace's launches as one graph; inside a
    user's capture the launches are issued as usual.
    """
    ws = workspace
    if out is not None:
        _check_out(out, ws, meshes)
    elif ws.fragments is None:
        raise ValueError("workspace was made with allocate_outputs=False: pass out=")
    frags = ws.fragments if out is None else out
    key = (
        *(array_key(a) for a in (meshes.verts, meshes.faces, meshes.mesh_to_face_first_idx,
                                 meshes.num_faces_per_mesh)),
        None if meshes.clipped_faces_neighbor_idx is None
        else array_key(meshes.clipped_faces_neighbor_idx),
        meshes.has_neighbors,
        None if meshes.split_flag is None else array_key(meshes.split_flag),
        settings, ws.tuning,
        *(array_key(a) for a in (frags.pix_to_face, frags.zbuf, frags.bary_coords, frags.dists)),
    )  # fmt: skip
    ws.call_graph(key, lambda: _launch_passes(meshes, ws, settings, frags), ws.tuning.call_graphs)
    if out is not None:
        # not recorded, but it rewrote the face set-up a recorded backward reads
        ws.face_grads.guard.note_render()
        return out
    record_backward(
        meshes,
        ws,
        perspective_correct=settings.perspective_correct,
        clip_barycentric_coords=settings.clip_barycentric_coords,
        exact_perspective_grad=settings.exact_perspective_grad,
    )
    return ws.fragments


def _check_out(out: Fragments, ws: RasterWorkspace, meshes: PackedMeshes) -> None:
    shape = ws.shape
    for name, dtype in (("pix_to_face", wp.int32), ("zbuf", wp.float32),
                        ("bary_coords", wp.vec3), ("dists", wp.float32)):  # fmt: skip
        a = getattr(out, name)
        if tuple(a.shape) != shape or a.dtype != dtype or not a.is_contiguous:
            raise ValueError(f"out.{name} must be a contiguous {dtype.__name__} array of shape "
                             f"{shape}, got {a.dtype.__name__} {tuple(a.shape)}")  # fmt: skip
        if wp.get_device(a.device) != ws.device:
            raise ValueError(f"out.{name} is on {a.device}, the workspace on {ws.device}")
    if meshes.verts.requires_grad and active_tape() is not None:
        raise ValueError("a call with out= is not recorded on a wp.Tape: render into the "
                         "workspace's own fragments to get gradients on the tape")  # fmt: skip


def _launch_passes(
    meshes: PackedMeshes, ws: RasterWorkspace, settings: RasterSettings, frags: Fragments
) -> None:
    """Issues the render's kernels (setup, binning, queue, outputs)."""
    h, w = ws.image_size
    n = ws.num_meshes
    nf = meshes.num_faces
    k = ws.faces_per_pixel
    tuning = ws.tuning
    launch = ws.launches
    # Split faces (near-plane clipping): PyTorch3D's rule for the two halves of a
    # split face depends on the order faces are offered in, so the pixels of bins
    # that a split face touches see their faces in ascending index order, in a
    # queue of exactly K slots (the output-array queue over sorted lists); every
    # other bin keeps the register queue. Without bins (naive) every pixel does.
    ordered = meshes.has_neighbors
    split = ordered and ws.binned
    register = tuning.register_queue_serves(k, settings.blur_radius > 0.0) and (
        split or not ordered
    )
    # K = 1 binned: small faces drawn face by face (an atomic minimum, order-free).
    # With split partners possible, only where the clipper's device flag says no
    # face is split in this call (the pass and the binning read it): PyTorch3D's
    # rule for split halves needs every face of their bins offered in order.
    small_ok = not ordered or meshes.split_flag is not None
    small = tuning.small_face_pixels if (k == 1 and ws.binned and small_ok) else 0
    ps, ps_key = ws.pass_for(meshes, settings, frags, seeded=small > 0, split_bins=split,
                             split_only=split and register)  # fmt: skip
    if nf > 0:
        cull = int(settings.cull_backfaces)
        arrays, arrays_key = ws.meshes_for(meshes)
        launch("setup", setup_faces, nf, [arrays, n, cull, ps], key=(arrays_key, n, cull, ps_key))
    if small > 0:
        ws.depth_key_bytes.fill_(EMPTY_KEY_BYTE)  # every key EMPTY_KEY_VALUE
        if nf > 0:
            lanes = small_face_lanes(nf, n * h * w, tuning.small_face_lanes)
            launch("small", small_faces_k1, nf * lanes, [ps, small, lanes], key=(ps_key, lanes))
    if ws.binned:
        ws.counters.zero_()  # bin counts and cursors, split marks, overflow, any mark
        if nf > 0:
            binning.coarse_bin(ps, ps_key, nf, ws.bin_cursor, launch, small)
            if ordered:
                binning.sort_bins(ps, ps_key, launch)
        else:
            ws.bin_offset.zero_()
    per_bin = ws.bin_h * ws.bin_w
    threads = n * ws.bins_y * ws.bins_x * per_bin
    block = min(per_bin, 256)
    if register:
        flags = (int(settings.perspective_correct), int(settings.clip_barycentric_coords),
                 int(settings.blur_radius > 0.0))  # fmt: skip
        kernel = register_kernel(k, ws.device, flags, tuning)
        launch("queue", kernel, threads, [ps], key=ps_key, block_dim=block)
    if not register or split:
        # serving only the split-face bins (usually none): see ORDERED_ONLY_BLOCK
        ordered_block = ORDERED_ONLY_BLOCK if register else block
        cap = max(ORDERED_ONLY_THREADS // per_bin, 1) * per_bin  # whole bins a stride
        ordered = min(threads, cap) if register else threads
        launch("queue_ordered", raster_output_queue, ordered, [ps, threads, ordered],
               key=(ps_key, threads, ordered), block_dim=ordered_block)  # fmt: skip
    slots = n * h * w * k
    wide = ps.wide != 0
    write = write_outputs_kernel(ws.device, settings.perspective_correct,
                                 settings.clip_barycentric_coords, ps.write_dists != 0, wide, k,
                                 tuning)  # fmt: skip
    launch("outputs", write, slots // 4 if wide else slots, [ps], key=ps_key)


def rasterize_naive_at(
    meshes: PackedMeshes, workspace: RasterWorkspace, pixels: wp.array, settings: RasterSettings
) -> wp.array:
    """``pix_to_face`` rows (M, K) of the naive pass at M (image, row, column) pixels.

    A check for fast paths: reuses the face setup that the last
    :func:`rasterize_packed` call on ``workspace`` left (same meshes and settings).
    """
    k = workspace.faces_per_pixel
    m = pixels.shape[0]
    p2f = wp.empty((m, k), dtype=wp.int32, device=workspace.device)
    zbuf = wp.empty((m, k), dtype=wp.float32, device=workspace.device)
    ps = make_pass(meshes, workspace, settings, p2f, zbuf)
    wp.launch(raster_naive_at, dim=m, inputs=[ps, pixels], device=workspace.device,
              record_tape=False)  # fmt: skip
    return p2f
