"""K = 1, binned: small faces drawn face by face with a 64-bit atomic minimum.

(depth, face) is packed into one 64-bit key, depth bits high, face index low.
For depths >= 0 the IEEE bits order as the floats do, so one unsigned
``atomic_min`` keeps the queue's (depth, face index) minimum; the queue pass
then starts from that key. Only faces larger than
:attr:`Tuning.small_face_pixels <warpraster.settings.Tuning>` are binned.
"""

import warp as wp

from ..geometry import pixel_centre
from . import binning
from .coverage import NO_FACE, PassArgs, before, test_face
from .faces import FAR

# fuse_fp off: no a*b+c contraction into FMA, so every decision is made on the
# same separately rounded float32 values as PyTorch3D's kernel (docs/PERF.md).
wp.set_module_options({"enable_backward": False, "fuse_fp": False})

_INT32_MAX = 2**31 - 1


# (depth, face) packed into one 64-bit key: depth bits high, face index low. For
# depths >= 0 the IEEE bits order as the floats do, so one unsigned atomic_min
# keeps the queue's (depth, face index) minimum. -0.0 is folded into +0.0 (equal
# depths must tie on the index).
@wp.func_native("union { float f; uint32_t u; } c; c.f = (x == 0.0f) ? 0.0f : x; return c.u;")
def _depth_bits(x: float) -> wp.uint32: ...


@wp.func_native("union { float f; uint32_t u; } c; c.u = x; return c.f;")
def bits_depth(x: wp.uint32) -> float: ...


#: Key of a pixel no small face covers (decodes to no face): every byte 0xFF.
EMPTY_KEY_VALUE = 2**64 - 1
EMPTY_KEY_BYTE = 0xFF


EMPTY_KEY = wp.constant(wp.uint64(EMPTY_KEY_VALUE))


@wp.func
def _depth_key(z: float, f: int) -> wp.uint64:
    return (wp.uint64(_depth_bits(z)) << wp.uint64(32)) | wp.uint64(f)


@wp.kernel
def small_faces_k1(ps: PassArgs, small: int, lanes: int):
    """K = 1, faces covering at most ``small`` pixels: ``lanes`` threads per face
    share its pixel box, and each covered pixel takes the atomic minimum of the
    face's (depth, index) key: the queue's order, in one pass whose work follows
    the covered pixels rather than the faces per bin."""
    if ps.split.small_off[0] != 0:
        return  # faces are split in this call: every face is binned instead
    t = wp.tid()
    f = t // lanes
    lane = t - f * lanes
    m = ps.face.mesh[f]
    if m < 0:
        return
    box = binning.pixel_box(ps.face.bbox[f], ps.height, ps.width)
    npix = binning.box_pixels(box)
    if npix == 0 or npix > small:
        return
    bw = box[3] - box[2] + 1
    for i in range(lane, npix, lanes):
        yi = box[0] + i // bw
        xi = box[2] + i % bw
        p = pixel_centre(yi, xi, ps.height, ps.width)
        hit, z, dist = test_face(ps, f, p)
        # the register queue accepts (z, f) only before its empty slot (FAR, NO_FACE)
        if hit and before(z, f, FAR, NO_FACE):
            q = (m * ps.height + yi) * ps.width + xi
            wp.atomic_min(ps.keys, q, _depth_key(z, f))


def small_face_lanes(num_faces: int, num_pixels: int, lanes: int | None = None) -> int:
    """Threads sharing one small face's pixel box (``lanes``, or by face size when
    None: more when faces are large relative to pixels, i.e. fewer faces to keep
    the GPU busy and longer walks), halved until the launch fits int32."""
    if lanes is not None:
        lanes = int(lanes)
    else:
        per_face = num_pixels / max(num_faces, 1)
        lanes = 1
        while lanes < 8 and 2 * lanes <= per_face / 2:
            lanes *= 2
    while lanes > 1 and num_faces * lanes > _INT32_MAX:
        lanes //= 2
    return lanes
