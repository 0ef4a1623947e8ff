"""Coarse pass: per-(image, bin) lists of the faces whose bounding box touches the bin.

Bins are ``bin_size`` x ``bin_size`` pixel tiles. Each list has a fixed capacity
``max_faces_per_bin``; its counter keeps counting past the capacity, so the fine
pass sees that a bin overflowed and falls back to all faces of the mesh for that
bin's pixels: the output stays exact whatever the capacity. The number of
overflowed bins is counted on the device for the caller to read afterwards.
"""

from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})


@wp.func
def ndc_span_to_pixels(lo: float, hi: float, s1: int, s2: int) -> wp.vec2i:
    """Conservative range of pixel indices (counted from the +NDC end) whose centres
    may lie in [lo, hi] on an axis of ``s1`` pixels; (1, 0) when empty.

    One pixel of margin on each side absorbs float rounding: the fine pass
    re-tests the exact bounding box, so a superset is all that is needed here.
    """
    ratio = float(1.0)
    if s1 > s2:
        ratio = float(s1) / float(s2)
    rng = 2.0 * ratio
    offset = rng / 2.0
    scale = float(s1) / rng
    a = wp.clamp((lo + offset) * scale - 0.5, -4.0, float(s1) + 4.0)
    b = wp.clamp((hi + offset) * scale - 0.5, -4.0, float(s1) + 4.0)
    i0 = wp.max(int(wp.floor(a)) - 1, 0)
    i1 = wp.min(int(wp.ceil(b)) + 1, s1 - 1)
    return wp.vec2i(i0, i1)


@wp.kernel
def _coarse_bin(
    face_mesh: wp.array(dtype=wp.int32),
    face_bbox: wp.array(dtype=wp.vec4),
    height: int,
    width: int,
    bin_size: int,
    max_faces_per_bin: int,
    bin_count: wp.array3d(dtype=wp.int32),
    bin_faces: wp.array4d(dtype=wp.int32),
    overflow: wp.array(dtype=wp.int32),
):
    f = wp.tid()
    m = face_mesh[f]
    if m < 0:
        return
    bb = face_bbox[f]
    # bbox = (xmin, ymin, xmax, ymax); pixel indices count from the +NDC end,
    # so column xi = W - 1 - i and row yi = H - 1 - j.
    sx = ndc_span_to_pixels(bb[0], bb[2], width, height)
    sy = ndc_span_to_pixels(bb[1], bb[3], height, width)
    if sx[0] > sx[1] or sy[0] > sy[1]:
        return
    bx0 = (width - 1 - sx[1]) // bin_size
    bx1 = (width - 1 - sx[0]) // bin_size
    by0 = (height - 1 - sy[1]) // bin_size
    by1 = (height - 1 - sy[0]) // bin_size
    for by in range(by0, by1 + 1):
        for bx in range(bx0, bx1 + 1):
            slot = wp.atomic_add(bin_count, m, by, bx, 1)
            if slot < max_faces_per_bin:
                bin_faces[m, by, bx, slot] = f
            elif slot == max_faces_per_bin:
                wp.atomic_add(overflow, 0, 1)


def bin_grid(height: int, width: int, bin_size: int) -> tuple[int, int]:
    """Number of bins along (y, x)."""
    return (height + bin_size - 1) // bin_size, (width + bin_size - 1) // bin_size


def coarse_bin(face_mesh, face_bbox, height, width, bin_size, bin_count, bin_faces, overflow):
    """Fills the per-bin face lists (counters and overflow flag must be zeroed first)."""
    wp.launch(
        _coarse_bin,
        dim=face_mesh.shape[0],
        inputs=[face_mesh, face_bbox, height, width, bin_size, bin_faces.shape[3]],
        outputs=[bin_count, bin_faces, overflow],
        device=face_mesh.device,
        record_tape=False,
    )
