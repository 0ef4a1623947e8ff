"""The camera parameter carrier: one Warp struct of device arrays, and the camera kinds.

Every camera batch hands its parameters to the kernels as one :class:`CameraData`
instance. Warp passes a struct by value and differentiates only its array fields,
so every parameter that can carry a gradient is an array field; the scalar fields
(kind, flags, batch size) are fixed when the camera is made.
"""

from __future__ import annotations

from enum import IntEnum

import warp as wp

__all__ = ["CameraData", "CameraKind"]


class CameraKind(IntEnum):
    """The projection of a camera batch: :attr:`CameraData.kind`, compared inside kernels."""

    #: :class:`~warpraster.camera.FoVPerspectiveCameras`: an OpenGL-style frustum.
    FOV_PERSPECTIVE = 0
    #: :class:`~warpraster.camera.FoVOrthographicCameras`: a view box.
    FOV_ORTHOGRAPHIC = 1
    #: :class:`~warpraster.camera.PerspectiveCameras`: focal length and principal point.
    PERSPECTIVE = 2


@wp.struct
class CameraData:
    """The parameters of a batch of N cameras, as the projection kernels read them.

    Every array field holds a batch of 1 or N rows (a batch of 1 is shared by all
    cameras; its gradient sums over them). A field the camera kind does not use
    is an empty array of the field's dtype and is never read. Arrays are the
    camera's own (often the caller's, zero-copy), so values written into them
    later are seen by the next launch, also in a captured graph.

    Attributes:
        kind: a :class:`CameraKind` value.
        num_cameras: N.
        degrees: whether ``fov`` is in degrees (FoV perspective cameras).
        in_ndc: whether focal length and principal point are in NDC units
            (perspective cameras); False: in pixels, mapped with ``image_size``.
        R: ``mat33`` world -> view rotations (``X_view = X_world @ R + T``).
        T: ``vec3`` translations.
        znear: near planes, float32.
        zfar: far planes, float32.
        aspect_ratio: pixel aspect ratios, float32 (FoV perspective).
        fov: vertical fields of view, float32 (FoV perspective).
        min_x: view box, float32 (FoV orthographic).
        max_x: view box, float32 (FoV orthographic).
        min_y: view box, float32 (FoV orthographic).
        max_y: view box, float32 (FoV orthographic).
        scale_xyz: ``vec3`` per-axis scales (FoV orthographic).
        focal_length: float32 (B, 1) or (B, 2) ``(fx, fy)`` (perspective).
        principal_point: ``vec2`` ``(px, py)`` (perspective).
        image_size: ``vec2`` ``(H, W)`` in pixels (screen-space perspective only).
    """

    kind: int
    num_cameras: int
    degrees: wp.bool
    in_ndc: wp.bool
    R: wp.array(dtype=wp.mat33)
    T: wp.array(dtype=wp.vec3)
    znear: wp.array(dtype=wp.float32)
    zfar: wp.array(dtype=wp.float32)
    aspect_ratio: wp.array(dtype=wp.float32)
    fov: wp.array(dtype=wp.float32)
    min_x: wp.array(dtype=wp.float32)
    max_x: wp.array(dtype=wp.float32)
    min_y: wp.array(dtype=wp.float32)
    max_y: wp.array(dtype=wp.float32)
    scale_xyz: wp.array(dtype=wp.vec3)
    focal_length: wp.array2d(dtype=wp.float32)
    principal_point: wp.array(dtype=wp.vec2)
    image_size: wp.array(dtype=wp.vec2)


def make_camera_data(
    kind: CameraKind,
    num_cameras: int,
    arrays: dict[str, wp.array],
    *,
    device: wp.DeviceLike,
    degrees: bool = True,
    in_ndc: bool = True,
) -> CameraData:
    """A :class:`CameraData` holding ``arrays``; every other array field is empty.

    Empty arrays own no device memory, so this allocates nothing on the device.

    Args:
        kind: the camera kind.
        num_cameras: N.
        arrays: field name -> Warp array (of the field's dtype and dimension).
        device: the device of the arrays.
        degrees: see :class:`CameraData`.
        in_ndc: see :class:`CameraData`.

    Returns:
        The struct instance.
    """
    data = CameraData()
    data.kind = int(kind)
    data.num_cameras = int(num_cameras)
    data.degrees = bool(degrees)
    data.in_ndc = bool(in_ndc)
    for name, var in CameraData.vars.items():
        if wp.types.is_array(var.type):
            empty = wp.empty((0,) * var.type.ndim, dtype=var.type.dtype, device=device)
            setattr(data, name, arrays.get(name, empty))
    return data


def replace_array(data: CameraData, name: str, array: wp.array) -> CameraData:
    """A copy of ``data`` whose array field ``name`` is ``array`` (no device copy).

    Args:
        data: the struct to copy.
        name: an array field of :class:`CameraData`.
        array: the new array of that field.

    Returns:
        A new struct instance sharing every other field with ``data``.
    """
    out = CameraData()
    for field in CameraData.vars:
        setattr(out, field, getattr(data, field))
    setattr(out, name, array)
    return out
