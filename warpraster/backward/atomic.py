"""The atomic strategy: per-slot derivatives added to per-face sums with atomics.

One thread per pixel computes each slot's derivatives (:func:`slot_grads`) and
adds them to its face's sum, three 16-byte rows per face (x, y, z, unused):
one vector atomic per row on sm_90 (Hopper) instead of three scalar ones (the
per-slot pass of :mod:`warpraster.backward.slot_pass`, shared with the sorted
strategy). One thread per face then adds its rows to its three vertices. Measured on an H200
this beat a face-centric walk (one thread per face over its bounding box) by
1.5x to 3x: the per-slot derivatives run in lock-step across a warp, while the
face-centric walk diverges. The last bits of the sums depend on thread timing on
a GPU; :mod:`warpraster.backward.sorted` is the bit-reproducible strategy.
"""

from __future__ import annotations

import warp as wp

from ..meshes import MeshArrays, mesh_arrays
from .slot_pass import SlotGradArgs, launch_slot_pass, row, slot_kernel_flags

wp.set_module_options({"enable_backward": False, "fuse_fp": False})

__all__ = ["face_grad_rows", "launch_atomic", "slot_kernel_flags"]

#: Row i of a mat33 (the name the sorted strategy imported before the shared pass).
_row = row


def face_grad_rows(num_faces: int, device) -> wp.array:
    """Zeroed per-face gradient sums: three 16-byte rows per face (vec4, w unused)."""
    return wp.zeros(3 * max(int(num_faces), 1), dtype=wp.vec4, device=device)


@wp.kernel
def _scatter_to_verts(
    # Inputs: the faces (mesh.faces), each face's mesh (< 0: none) and its rows
    mesh: MeshArrays,
    face_mesh: wp.array(dtype=wp.int32),
    face_grad: wp.array(dtype=wp.vec4),
    # Outputs:
    verts_grad_out: wp.array(dtype=wp.vec3),
):
    """verts_grad_out[faces[f, c]] += row c of face f (faces in no mesh skipped)."""
    f = wp.tid()
    if face_mesh[f] < 0:
        return
    for c in range(3):
        g = face_grad[3 * f + c]
        wp.atomic_add(verts_grad_out, mesh.faces[f, c], wp.vec3(g[0], g[1], g[2]))


def launch_atomic(
    args: SlotGradArgs,
    faces: wp.array,
    face_mesh: wp.array,
    face_grad: wp.array,
    verts_grad: wp.array,
    *,
    specialize: bool | None,
) -> None:
    """Zeroes ``face_grad`` (3F vec4 rows), sums the slots' derivatives per face
    (the per-slot pass over ``args``) and adds them to ``verts_grad``."""
    device = verts_grad.device
    face_grad.zero_()
    launch_slot_pass(args, [face_grad], stored=False, device=device, specialize=specialize)
    wp.launch(_scatter_to_verts, dim=faces.shape[0], inputs=[mesh_arrays(None, faces), face_mesh,
              face_grad], outputs=[verts_grad], device=device, record_tape=False)  # fmt: skip
