"""``UsdGeom.Camera`` to warpraster cameras, and a default camera framing the scene.

A USD camera looks down its local -Z with +Y up; its local-to-world matrix
(row vectors) places it. Image-plane coordinates are ``f * x / -z``; the
aperture window spans ``offset +- aperture / 2`` (perspective; apertures,
offsets and focal length in the same units, so only ratios matter) or
``0.1 * (offset +- aperture / 2)`` scene units (orthographic: apertures are in
tenths of a scene unit, USD's ``GfCamera`` convention).

The window maps onto the image: horizontal aperture to the full width,
vertical aperture to the full height (:class:`AspectConform` says what happens
when the image aspect differs). So for a W x H image a perspective camera is the
OpenCV pinhole ``fx = W f / ha``, ``fy = H f / va``,
``cx = W (1/2 - h_offset / ha)``, ``cy = H (1/2 + v_offset / va)``, built with
:func:`warpraster.cameras_from_opencv_projection`. Orthographic cameras become
:class:`warpraster.FoVOrthographicCameras` with the equivalent view box.

The rotation is the camera matrix's rows normalised (a scale in the camera's
transform does not scale the picture). ``clippingRange``: near becomes the
rasterizer's ``z_clip_value`` (faces crossing it are split, as PyTorch3D
clips), far is applied when shading (farther first hits count as empty).
"""

from __future__ import annotations

import math

import numpy as np

from .scene import AspectConform, CameraParams, Projection

__all__ = [
    "conformed_apertures",
    "default_camera",
    "look_at_matrix",
    "opencv_from_usd_camera",
    "raster_camera",
    "read_camera",
]

#: Scene units per aperture unit of an orthographic camera (USD's GfCamera::APERTURE_UNIT).
APERTURE_UNIT = 0.1


def read_camera(prim, time) -> CameraParams:
    """:class:`CameraParams` of a ``UsdGeom.Camera`` prim at ``time`` (pxr needed)."""
    from pxr import Gf, UsdGeom

    from .errors import SceneError

    where = str(prim.GetPath())
    if not prim.IsA(UsdGeom.Camera):
        raise SceneError(where, f"is a {prim.GetTypeName() or 'typeless prim'}, not a Camera")
    gc = UsdGeom.Camera(prim).GetCamera(time)
    ha, va, f = gc.horizontalAperture, gc.verticalAperture, gc.focalLength
    if not (ha > 0 and va > 0):
        raise SceneError(where, f"apertures must be > 0, got {ha} x {va}")
    persp = gc.projection == Gf.Camera.Perspective
    if persp and not f > 0:
        raise SceneError(where, f"focalLength must be > 0, got {f}")
    near, far = gc.clippingRange.min, gc.clippingRange.max
    if not (0 <= near < far):
        raise SceneError(where, f"clippingRange must have 0 <= near < far, got ({near}, {far})")
    xf = UsdGeom.XformCache(time).GetLocalToWorldTransform(prim)
    return CameraParams(
        name=where,
        cam_to_world=np.array(xf, np.float64),
        projection=Projection.PERSPECTIVE if persp else Projection.ORTHOGRAPHIC,
        focal_length=float(f),
        horizontal_aperture=float(ha),
        vertical_aperture=float(va),
        horizontal_aperture_offset=float(gc.horizontalApertureOffset),
        vertical_aperture_offset=float(gc.verticalApertureOffset),
        near=float(near),
        far=float(far),
    )


def conformed_apertures(
    cam: CameraParams, image_size, conform: AspectConform = AspectConform.ADJUST_PIXEL_ASPECT_RATIO
) -> tuple[float, float]:
    """``(horizontal, vertical)`` apertures after resolving the image aspect (UsdRender's rules)."""
    h, w = image_size
    ha, va = cam.horizontal_aperture, cam.vertical_aperture
    img = w / h
    conform = AspectConform(conform)
    if conform == AspectConform.ADJUST_PIXEL_ASPECT_RATIO:
        return ha, va
    wider = img > ha / va
    if (
        conform == AspectConform.ADJUST_APERTURE_WIDTH
        or (conform == AspectConform.EXPAND_APERTURE and wider)
        or (conform == AspectConform.CROP_APERTURE and not wider)
    ):
        return va * img, va
    return ha, ha / img


def _rotation_rows(cam_to_world: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(3, 3) orthonormal rows of the camera axes in world space, and the centre."""
    m = np.asarray(cam_to_world, np.float64)
    rows = m[:3, :3]
    # nearest rotation (polar decomposition): removes scale and shear
    u, _, vt = np.linalg.svd(rows)
    rot = u @ vt
    if np.linalg.det(rot) < 0:
        rot = u @ np.diag([1.0, 1.0, -1.0]) @ vt
    return rot, m[3, :3].copy()


def opencv_from_usd_camera(
    cam: CameraParams, image_size, conform: AspectConform = AspectConform.ADJUST_PIXEL_ASPECT_RATIO
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV ``(R, tvec, K)`` (float64) of a perspective USD camera for an (H, W) image."""
    h, w = image_size
    ha, va = conformed_apertures(cam, image_size, conform)
    f = cam.focal_length
    K = np.array(
        [
            [w * f / ha, 0.0, w * (0.5 - cam.horizontal_aperture_offset / ha)],
            [0.0, h * f / va, h * (0.5 + cam.vertical_aperture_offset / va)],
            [0.0, 0.0, 1.0],
        ]
    )
    rot, centre = _rotation_rows(cam.cam_to_world)
    # camera coords (column) = rot @ (p - centre); OpenCV flips y and z (y down, z forward)
    R = np.diag([1.0, -1.0, -1.0]) @ rot
    tvec = -R @ centre
    return R, tvec, K


def raster_camera(
    cam: CameraParams,
    image_size,
    *,
    conform: AspectConform = AspectConform.ADJUST_PIXEL_ASPECT_RATIO,
    device=None,
    requires_grad: bool = False,
):
    """The warpraster camera drawing ``cam``'s window onto an (H, W) image
    (``requires_grad``: its differentiable parameters take gradients).

    Returns:
        :class:`warpraster.PerspectiveCameras` (NDC, from the OpenCV form) or
        :class:`warpraster.FoVOrthographicCameras`.
    """
    import warpraster as wr

    h, w = image_size
    if cam.projection == Projection.PERSPECTIVE:
        R, tvec, K = opencv_from_usd_camera(cam, image_size, conform)
        return wr.cameras_from_opencv_projection(
            R[None],
            tvec[None],
            K[None],
            np.array([[h, w]], np.float64),
            device=device,
            requires_grad=requires_grad,
        )
    ha, va = conformed_apertures(cam, image_size, conform)
    rot, centre = _rotation_rows(cam.cam_to_world)
    # PyTorch3D view = USD camera coords with x and z negated; row vectors
    R = rot.T @ np.diag([-1.0, 1.0, -1.0])
    T = -centre @ R
    s = min(h, w) / 2.0
    a = APERTURE_UNIT
    span_x = 2.0 * s * a * ha / w
    span_y = 2.0 * s * a * va / h
    sum_x = -2.0 * a * cam.horizontal_aperture_offset
    sum_y = 2.0 * a * cam.vertical_aperture_offset
    near = cam.near
    far = max(cam.far, near * (1 + 1e-6) + 1e-6)
    return wr.FoVOrthographicCameras(
        znear=near,
        zfar=far,
        max_x=(sum_x + span_x) / 2.0,
        min_x=(sum_x - span_x) / 2.0,
        max_y=(sum_y + span_y) / 2.0,
        min_y=(sum_y - span_y) / 2.0,
        R=R[None],
        T=T[None],
        device=device,
        requires_grad=requires_grad,
    )


def look_at_matrix(eye, target, up) -> np.ndarray:
    """4x4 row-vector camera-to-world matrix of a USD camera at ``eye`` looking at ``target``."""
    eye, target, up = (np.asarray(x, np.float64) for x in (eye, target, up))
    back = eye - target
    back /= np.linalg.norm(back)
    right = np.cross(up, back)
    if np.linalg.norm(right) < 1e-9:  # looking along up: any perpendicular
        right = np.cross(
            np.array([1.0, 0.0, 0.0]) if abs(back[0]) < 0.9 else np.array([0.0, 1.0, 0.0]), back
        )
    right /= np.linalg.norm(right)
    upv = np.cross(back, right)
    m = np.eye(4)
    m[0, :3], m[1, :3], m[2, :3], m[3, :3] = right, upv, back, eye
    return m


def default_camera(
    lo, hi, *, up_axis: str = "Y", aspect: float = 4.0 / 3.0, azim: float = 30.0, elev: float = 25.0
) -> CameraParams:
    """A perspective camera framing the box ``[lo, hi]`` (the scene's bounds).

    It looks at the box centre from ``azim`` degrees around the up axis and
    ``elev`` degrees above the horizon, through a 50 mm lens on a 24 mm high
    aperture as wide as ``aspect`` asks, just far enough back that all eight
    corners of the box are inside the picture with a 5 % margin; near and far
    bracket the box.
    """
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    centre = (lo + hi) / 2.0
    radius = max(float(np.linalg.norm(hi - lo)) / 2.0, 1e-3)
    f, va = 50.0, 24.0
    ha = va * aspect
    a, e = math.radians(azim), math.radians(elev)
    if up_axis.upper() == "Z":
        d = np.array([math.cos(e) * math.sin(a), -math.cos(e) * math.cos(a), math.sin(e)])
        up = np.array([0.0, 0.0, 1.0])
    else:
        d = np.array([math.cos(e) * math.sin(a), math.sin(e), math.cos(e) * math.cos(a)])
        up = np.array([0.0, 1.0, 0.0])
    axes = look_at_matrix(centre + d, centre, up)[:3, :3]  # rows: right, up, back
    corners = np.array(
        [[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
    )
    c = (corners - centre) @ axes.T  # corner offsets along right, up, back
    tan_x, tan_y = ha / (2.0 * f) / 1.05, va / (2.0 * f) / 1.05
    # a corner at offset c is in view when |c_x| <= tan_x (dist - c_back), same for y
    dist = float(
        max((np.abs(c[:, 0]) / tan_x + c[:, 2]).max(), (np.abs(c[:, 1]) / tan_y + c[:, 2]).max())
    )
    dist = max(dist, radius * 1e-3)
    eye = centre + dist * d
    return CameraParams(
        name="default camera",
        cam_to_world=look_at_matrix(eye, centre, up),
        focal_length=f,
        horizontal_aperture=ha,
        vertical_aperture=va,
        near=max(dist - radius * 1.5, dist * 1e-3),
        far=dist + radius * 1.5,
    )
