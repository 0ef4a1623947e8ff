"""Materials: ambient/diffuse/specular reflectivity and shininess, as PyTorch3D's.

A :class:`Materials` of B rows is either one material per image (PyTorch3D's
meaning: B = 1 or N) or, with per-face material ids (``face_materials``, (F,)
int32 rows of the table, :func:`face_materials_array`), a material table that
lights each face with its own row: the shaders, ``MeshRenderer`` and
``Renderer`` take the ids, and gradients reach each row from its faces' pixels.
"""

from __future__ import annotations

import numpy as np
import warp as wp

from ..meshes import as_index_array
from .params import ParamRows, check_batch, check_rows, scalar_param, vec3_param

__all__ = ["Materials", "face_materials_array"]


class Materials(ParamRows):
    """A batch of materials (one per image), as PyTorch3D's ``Materials``.

    Args (keyword-only):
        ambient_color, diffuse_color, specular_color: ``(3,)``, ``(1, 3)`` or ``(N, 3)``
            reflectivities, default (1, 1, 1) each (NumPy, or Warp ``vec3``/float32 arrays
            used zero-copy).
        shininess: specular exponent, a scalar or ``(N,)``, default 64.
        device: Warp device (default: that of the Warp arrays given, else Warp's default).
        requires_grad: make NumPy-given parameters trainable Warp arrays.

    Attributes:
        ambient_color, diffuse_color, specular_color: ``wp.vec3`` (B,) arrays.
        shininess: float32 (B,) array.

    Raises:
        TypeError, ValueError: bad input, named by argument; every value must be
            finite and >= 0 (Warp arrays are read back once, at construction).
    """

    _names = ("ambient_color", "diffuse_color", "specular_color", "shininess")

    def __init__(
        self,
        *,
        ambient_color=((1.0, 1.0, 1.0),),
        diffuse_color=((1.0, 1.0, 1.0),),
        specular_color=((1.0, 1.0, 1.0),),
        shininess=64.0,
        device=None,
        requires_grad: bool = False,
    ):
        given = [ambient_color, diffuse_color, specular_color, shininess]
        if device is None:
            arrays = [v for v in given if isinstance(v, wp.array)]
            device = arrays[0].device if arrays else None
        self.device = wp.get_device(device)
        self.ambient_color = vec3_param(ambient_color, "ambient_color", self.device, requires_grad)
        self.diffuse_color = vec3_param(diffuse_color, "diffuse_color", self.device, requires_grad)
        self.specular_color = vec3_param(
            specular_color, "specular_color", self.device, requires_grad
        )
        self.shininess = scalar_param(shininess, "shininess", self.device, requires_grad)
        self._n = check_batch("Materials", self.parameters())
        # set-up checks of the values (a host read of Warp arrays, once): a negative
        # shininess makes relu(v . r) ** shininess blow up (7e8) where v . r is small
        for name, arr in self.parameters().items():
            check_rows(arr, name, minimum=0.0)

    def kernel_args(self) -> list:
        """[ambient, diffuse, specular, shininess]: the kernels' material arguments."""
        return [self.ambient_color, self.diffuse_color, self.specular_color, self.shininess]


def face_materials_array(
    face_materials, num_faces: int, num_materials: int, device, *, validate: bool = True
) -> wp.array:
    """Per-face material ids as an (F,) int32 array, checked against the table.

    Args:
        face_materials: (F,) ints (NumPy, a list or an int32 ``wp.array``, used
            zero-copy), each a row of a :class:`Materials` of ``num_materials`` rows.
        num_faces: F, the packed faces rendered.
        num_materials: B, rows of the material table.
        device: where NumPy input goes (a Warp array must be there).
        validate: check the values (a host read of a Warp array: set-up time).

    Raises:
        TypeError, ValueError: not integers, not one per face, or an id outside
            ``[0, num_materials)``; named ``face_materials``.
    """
    ids = as_index_array(face_materials, "face_materials", device, length=int(num_faces))
    if validate and ids.shape[0]:
        host = ids.numpy()
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= num_materials:
            bad = int(np.flatnonzero((host < 0) | (host >= num_materials))[0])
            raise ValueError(
                f"face_materials[{bad}] = {int(host[bad])} is not a row of the {num_materials} "
                f"materials (ids must be in [0, {num_materials}))"
            )
    return ids
