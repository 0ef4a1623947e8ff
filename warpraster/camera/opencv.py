"""OpenCV pinhole cameras to and from warpraster cameras (PyTorch3D's rules).

OpenCV maps a world point X to ``x_cam = R X + tvec`` and pixel
``(u, v) = (fx x/z + cx, fy y/z + cy)`` (+x right, +y down, the image spanning
[0, W] x [0, H]); PyTorch3D's view frame flips x and y, and its NDC has +x left,
+y up, the shorter image side spanning [-1, 1].
"""

from __future__ import annotations

import numpy as np
import warp as wp

from .inputs import ArrayInput, batched, broadcast_rows, image_size_rows, pixel_frame
from .models import CamerasBase, FoVPerspectiveCameras, PerspectiveCameras

__all__ = ["cameras_from_opencv_projection", "opencv_from_cameras_projection"]


def cameras_from_opencv_projection(
    R: ArrayInput,
    tvec: ArrayInput,
    camera_matrix: ArrayInput,
    image_size: ArrayInput,
    *,
    device: wp.DeviceLike = None,
    requires_grad: bool = False,
) -> PerspectiveCameras:
    """NDC :class:`PerspectiveCameras` equal to OpenCV pinhole cameras.

    The result sends X to NDC with ``u = W/2 - s x_ndc``, ``v = H/2 - s y_ndc``,
    ``s = min(H, W) / 2``.

    Args:
        R: (N, 3, 3) OpenCV world -> camera rotations.
        tvec: (N, 3) OpenCV translations.
        camera_matrix: (N, 3, 3) intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
            (no skew).
        image_size: (N, 2) or (H, W), in pixels.
        device: as :class:`PerspectiveCameras`.
        requires_grad: as :class:`PerspectiveCameras`.

    Returns:
        :class:`PerspectiveCameras` with ``in_ndc=True`` and ``image_size`` set.

    Raises:
        ValueError: shapes, batch sizes, skew or a last row other than (0, 0, 1),
            R not a rotation.
    """
    R = batched(R, "R", (3, 3))
    tvec = batched(tvec, "tvec", (3,))
    K = batched(camera_matrix, "camera_matrix", (3, 3))
    hw = image_size_rows(image_size)
    R, tvec, K, hw = broadcast_rows({"R": R, "tvec": tvec, "camera_matrix": K, "image_size": hw})
    if (K[:, 0, 1] != 0).any() or (K[:, 1, 0] != 0).any():
        raise ValueError("camera_matrix has skew (K[0, 1] or K[1, 0] nonzero): not supported")
    if not np.array_equal(K[:, 2], np.broadcast_to([0.0, 0.0, 1.0], K[:, 2].shape)):
        raise ValueError("camera_matrix must have last row (0, 0, 1)")
    focal = np.stack([K[:, 0, 0], K[:, 1, 1]], axis=1)
    pp = K[:, :2, 2]
    scale, c0 = pixel_frame(hw)
    R_p3d = R.transpose(0, 2, 1).copy()
    R_p3d[:, :, :2] *= -1.0
    T_p3d = tvec.copy()
    T_p3d[:, :2] *= -1.0
    return PerspectiveCameras(
        focal_length=focal / scale,
        principal_point=-(pp - c0) / scale,
        R=R_p3d,
        T=T_p3d,
        device=device,
        image_size=hw,
        requires_grad=requires_grad,
    )


def opencv_from_cameras_projection(
    cameras: CamerasBase, image_size: ArrayInput
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV ``(R, tvec, camera_matrix)`` of pinhole cameras.

    The inverse of :func:`cameras_from_opencv_projection`. Accepts
    :class:`PerspectiveCameras` (NDC or screen space; a screen-space camera is
    first converted to NDC with its own ``image_size``) and
    :class:`FoVPerspectiveCameras` (whose NDC focal length is the (0, 0) and
    (1, 1) entries of its view -> NDC matrix, principal point 0).

    Args:
        cameras: the cameras (N).
        image_size: (N, 2) or (H, W) of the OpenCV image, in pixels.

    Returns:
        float32 NumPy ``R`` (N, 3, 3), ``tvec`` (N, 3), ``camera_matrix`` (N, 3, 3).

    Raises:
        TypeError: an orthographic camera (no pinhole model).
        ValueError: ``image_size`` with neither 1 nor N rows.
    """
    if isinstance(cameras, PerspectiveCameras):
        focal, p0 = cameras._ndc_intrinsics()
    elif isinstance(cameras, FoVPerspectiveCameras):
        m = cameras.get_view_to_ndc_matrix().astype(np.float64)
        focal = np.stack([m[:, 0, 0], m[:, 1, 1]], axis=1)
        p0 = np.stack([m[:, 2, 0], m[:, 2, 1]], axis=1)
    else:
        raise TypeError(
            f"cameras must be PerspectiveCameras or FoVPerspectiveCameras, got "
            f"{type(cameras).__name__}"
        )
    n = len(cameras)
    hw = image_size_rows(image_size)
    if hw.shape[0] not in (1, n):
        raise ValueError(f"image_size has {hw.shape[0]} rows, but there are {n} cameras")
    scale, c0 = pixel_frame(np.broadcast_to(hw, (n, 2)))
    R_p3d, T_p3d = cameras._pose64()
    R_p3d = R_p3d.copy()
    R_p3d[:, :, :2] *= -1.0
    tvec = T_p3d.copy()
    tvec[:, :2] *= -1.0
    K = np.zeros((n, 3, 3))
    K[:, 0, 0] = focal[:, 0] * scale[:, 0]
    K[:, 1, 1] = focal[:, 1] * scale[:, 0]
    K[:, :2, 2] = -p0 * scale + c0
    K[:, 2, 2] = 1.0
    return (
        R_p3d.transpose(0, 2, 1).astype(np.float32),
        tvec.astype(np.float32),
        K.astype(np.float32),
    )
