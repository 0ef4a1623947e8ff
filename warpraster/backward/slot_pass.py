"""The per-pixel pass both backward strategies share: each slot's derivatives.

One thread per pixel computes the derivatives of each of its slots
(:func:`~warpraster.backward.slot_grads.slot_grads`) and hands them on in the
way of its strategy, compiled in:

* atomic: added to its face's sum, three 16-byte rows per face (x, y, z,
  unused): one vector atomic per row on sm_90 (Hopper) instead of three scalar
  ones; empty slots end the pixel (slots are filled from the front);
* sorted: stored at the slot with its sort key (its face; empty slots get the
  key ``num_faces``, which the segmented sum drops) and its entry index.

Everything the pass reads and writes travels in one :class:`SlotGradArgs`.
"""

from __future__ import annotations

import warp as wp

from .. import variants
from ..fragments import FragmentRows, fragment_rows
from ..geometry import pixel_centre
from .slot_grads import slot_grads

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

__all__ = ["SlotGradArgs", "launch_slot_pass", "slot_grad_args", "slot_kernel_flags"]


@wp.struct
class SlotGradArgs:
    """What the per-slot pass reads: ``face_verts`` (F,) mat33 (rows = the face's
    vertices at render time; F = ``num_faces``), the image ``height`` / ``width``,
    ``grads``: the render's ``pix_to_face`` (-1 in empty slots) with the upstream
    gradients of ``zbuf``, ``bary`` and ``dists`` as (N * H * W, K) rows, and the
    flags a generic kernel reads at run time."""

    face_verts: wp.array(dtype=wp.mat33)
    num_faces: int
    height: int
    width: int
    grads: FragmentRows
    perspective_correct: int
    clip_barycentric_coords: int
    exact_perspective_grad: int


def slot_kernel_flags(perspective_correct: bool, clip_barycentric_coords: bool,
                      exact_perspective_grad: bool) -> tuple[int, int, int]:  # fmt: skip
    """The flags a per-slot kernel is specialised on (the exact-gradient flag only
    matters with perspective correction)."""
    persp = int(bool(perspective_correct))
    return persp, int(bool(clip_barycentric_coords)), persp * int(bool(exact_perspective_grad))


def slot_grad_args(
    face_verts: wp.array,
    pix_to_face: wp.array,
    grad_zbuf: wp.array,
    grad_bary: wp.array,
    grad_dists: wp.array,
    flags: tuple[int, int, int],
) -> SlotGradArgs:
    """The pass's inputs for fragments ``pix_to_face`` (N, H, W, K) and their upstream
    gradients (same shape; ``grad_bary`` of vec3)."""
    n, h, w, k = pix_to_face.shape
    args = SlotGradArgs()
    args.face_verts = face_verts
    args.num_faces = face_verts.shape[0]
    args.height = h
    args.width = w
    args.grads = fragment_rows(pix_to_face, grad_zbuf, grad_bary, grad_dists)
    args.perspective_correct, args.clip_barycentric_coords, args.exact_perspective_grad = flags
    return args


@wp.func
def row(m: wp.mat33, i: int) -> wp.vec3:
    """Row i of m."""
    return wp.vec3(m[i, 0], m[i, 1], m[i, 2])


# Per-face sums as three 16-byte rows per face, added with one vector atomic per
# row where the GPU has them (sm_90) instead of three scalar ones. CPU kernels
# run serially: a plain add.
@wp.func_native(
    """
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
atomicAdd(reinterpret_cast<float4*>(a.data) + i, make_float4(v[0], v[1], v[2], 0.0f));
#elif defined(__CUDA_ARCH__)
float* p = reinterpret_cast<float*>(a.data + i);
atomicAdd(p, v[0]);
atomicAdd(p + 1, v[1]);
atomicAdd(p + 2, v[2]);
#else
a.data[i] = a.data[i] + wp::vec4(v[0], v[1], v[2], 0.0f);
#endif
"""
)
def _add_row(a: wp.array(dtype=wp.vec4), i: int, v: wp.vec3): ...


@variants.kernel_family
def _slot_pass(flags: tuple[int, int, int] | None, stored: bool) -> wp.Kernel:
    """One thread per pixel: each held slot's derivatives, added atomically to its
    face's rows (``stored`` False) or stored at the slot with its sort key (True).
    ``flags`` = (perspective_correct, clip_barycentric_coords,
    exact_perspective_grad) compiled in, or None: read at run time (one generic
    kernel per strategy)."""

    def slot_pass(
        # In:
        args: SlotGradArgs,
        # Out (atomic: face_grad_out, added into; sorted: the other three):
        face_grad_out: wp.array(dtype=wp.vec4),
        slot_grad_out: wp.array(dtype=wp.mat33),
        keys_out: wp.array(dtype=wp.int32),
        order_out: wp.array(dtype=wp.int32),
    ):
        perspective_correct = args.perspective_correct
        clip_barycentric_coords = args.clip_barycentric_coords
        exact_perspective_grad = args.exact_perspective_grad
        if wp.static(flags is not None):
            perspective_correct = wp.static(flags[0])
            clip_barycentric_coords = wp.static(flags[1])
            exact_perspective_grad = wp.static(flags[2])
        q = wp.tid()
        k = args.grads.pix_to_face.shape[1]
        r = q % (args.height * args.width)
        p = pixel_centre(r // args.width, r % args.width, args.height, args.width)  # once
        for s in range(k):
            f = args.grads.pix_to_face[q, s]
            e = q * k + s
            if wp.static(stored):
                order_out[e] = e
                if f < 0 or f >= args.num_faces:
                    keys_out[e] = args.num_faces  # dropped by the segmented sum
                    continue
                keys_out[e] = f
            elif f < 0:
                break  # slots are filled from the front
            fv = args.face_verts[f]
            g = slot_grads(
                p, row(fv, 0), row(fv, 1), row(fv, 2), perspective_correct,
                clip_barycentric_coords, exact_perspective_grad,
                args.grads.zbuf[q, s], args.grads.bary[q, s], args.grads.dists[q, s],
            )  # fmt: skip
            if wp.static(stored):
                slot_grad_out[e] = g
            else:
                _add_row(face_grad_out, 3 * f, row(g, 0))
                _add_row(face_grad_out, 3 * f + 1, row(g, 1))
                _add_row(face_grad_out, 3 * f + 2, row(g, 2))

    name = "slot_grads_store" if stored else "slot_grads_atomic"
    return variants.variant_kernel(slot_pass, name, flags)


def launch_slot_pass(
    args: SlotGradArgs, outputs: list, *, stored: bool, device, specialize: bool | None
) -> None:
    """Runs the per-slot pass over every pixel of ``args`` (not recorded on a tape).

    Args:
        args: from :func:`slot_grad_args`.
        outputs: the atomic strategy's ``[face_grad]`` (3F vec4 rows, added into)
            or the sorted strategy's ``[slot_grad, keys, order]`` (one per slot).
        stored: the sorted strategy's stores (else the atomic adds).
        device: the arrays' Warp device.
        specialize: compile the flags into kernel variants (None: on CUDA).
    """
    flags = (args.perspective_correct, args.clip_barycentric_coords, args.exact_perspective_grad)
    kernel = _slot_pass(variants.device_flags(device, flags, specialize), bool(stored))
    outputs = [None, *outputs] if stored else [*outputs, None, None, None]
    wp.launch(kernel, dim=args.grads.pix_to_face.shape[0], inputs=[args], outputs=outputs,
              device=device, record_tape=False)  # fmt: skip
