"""Cameras: world -> view -> NDC with PyTorch3D's conventions, as one differentiable kernel.

Modules, in the order a projection uses them:

* ``inputs``: host-side parsing and validation of camera arguments;
* ``params``: :class:`CameraData`, the one ``@wp.struct`` carrying a camera
  batch's parameters to the kernels, and :class:`CameraKind`;
* ``projection``: the kernels (world -> NDC, view -> NDC matrices, vertex ->
  mesh map) and the functions launching them;
* ``models``: :class:`FoVPerspectiveCameras`, :class:`FoVOrthographicCameras`,
  :class:`PerspectiveCameras` on :class:`CamerasBase`;
* ``look_at``, ``opencv``: poses and conversions computed on the host.

Conventions (PyTorch3D's, see ``docs/ARCHITECTURE.md``):

* World to view with row vectors: ``X_view = X_world @ R + T``; ``R`` is (N, 3, 3),
  ``T`` is (N, 3). View space: +X left, +Y up, +Z into the screen.
* View to NDC: the 4x4 matrix of PyTorch3D's
  ``get_projection_transform().compose(get_ndc_camera_transform())`` applied to
  ``[x, y, z, 1]`` as a row vector, then x, y divided by the fourth coordinate
  (plain division, no epsilon). For the FoV cameras and NDC-space
  :class:`PerspectiveCameras` the NDC camera transform is the identity, whatever
  the image shape: a non-square image is handled by the rasterizer (the shorter
  side spans [-1, 1]). Only screen-space :class:`PerspectiveCameras`
  (``in_ndc=False``) use an image size, to map pixels to NDC.
* :meth:`CamerasBase.transform_points_ndc` writes x, y in NDC and z = **view-space
  depth**, which is what PyTorch3D's ``MeshRasterizer`` hands to the rasterizer
  (PyTorch3D's own ``transform_points_ndc`` keeps the projected z instead).

Batches: every per-camera parameter has a batch of 1 or N; a batch of 1 is
shared by all N cameras (PyTorch3D broadcasts the same way). NumPy and Python
inputs are copied and broadcast to N. Warp arrays are used as given, zero-copy,
so gradients land in the caller's ``.grad`` and values written into them later
(``arr.assign(...)``) are seen by the next launch, also in a captured graph; a
Warp array with a batch of 1 stays a batch of 1 and is broadcast inside the
kernel (its gradient sums over the cameras that share it). The parameter
attributes (``cam.R``, ``cam.fov``, ...) are those arrays, read-only.

Gradients: the projection is one Warp kernel, recorded on an enclosing
``wp.Tape``. Its adjoint accumulates into the ``.grad`` of the vertex array and of
every camera parameter array that has ``requires_grad`` (R, T, fov, aspect_ratio,
scale_xyz, focal_length, principal_point, ...): they are the array fields of
:class:`CameraData` (Warp differentiates a struct's array fields only).
Parameters passed as Warp arrays keep the caller's ``requires_grad``; for NumPy
input pass ``requires_grad=True`` to make the differentiable ones (see each
class) trainable Warp arrays.

Validation happens once, at construction, on host copies of the values (this
reads Warp arrays back): later writes into the arrays are not re-validated, and
:meth:`CamerasBase.get_znear` returns the value seen at construction.
"""

from .inputs import ROTATION_TOLERANCE
from .look_at import look_at_rotation, look_at_view_transform
from .models import CamerasBase, FoVOrthographicCameras, FoVPerspectiveCameras, PerspectiveCameras
from .opencv import cameras_from_opencv_projection, opencv_from_cameras_projection
from .params import CameraData, CameraKind
from .projection import vert_to_mesh_from_faces

__all__ = [
    "CameraData",
    "CameraKind",
    "CamerasBase",
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "PerspectiveCameras",
    "ROTATION_TOLERANCE",
    "cameras_from_opencv_projection",
    "look_at_rotation",
    "look_at_view_transform",
    "opencv_from_cameras_projection",
    "vert_to_mesh_from_faces",
]
