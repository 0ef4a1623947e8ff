"""Cameras: world -> view -> NDC with PyTorch3D's conventions, as one differentiable kernel.

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
kernel (its gradient sums over the cameras that share it).

Gradients: the projection is one Warp kernel, recorded on an enclosing
``wp.Tape``. Its adjoint accumulates into the ``.grad`` of the vertex array and of
every camera parameter array that has ``requires_grad`` (R, T, fov, aspect_ratio,
scale_xyz, focal_length, principal_point, ...). Parameters passed as Warp arrays
keep the caller's ``requires_grad``; for NumPy input pass ``requires_grad=True``
to make the differentiable ones (see each class) trainable Warp arrays.

Validation happens once, at construction, on host copies of the values (this
reads Warp arrays back): later writes into the arrays are not re-validated, and
:meth:`CamerasBase.get_znear` returns the value seen at construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import warp as wp

from .meshes import as_faces_array, as_index_array, as_vec3_array

# No FMA contraction: the projection rounds like PyTorch3D's (separately rounded
# products), which matters where vertices near the camera plane amplify ulps.
wp.set_module_options({"fuse_fp": False})

__all__ = [
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

#: ``R`` is accepted as a rotation when ``max |R R^T - I| < ROTATION_TOLERANCE`` and
#: ``det R > 0``. 1e-4 is ~1000x float32 rounding of a rotation built in float32
#: (look-at, quaternion) and admits matrices typed with 5 decimals; a reflection
#: or a scaled matrix is off by O(1) or by the scale and is rejected.
ROTATION_TOLERANCE = 1e-4

# Camera kinds, the ``kind`` argument of the kernels.
_KIND_FOV_PERSPECTIVE = 0
_KIND_FOV_ORTHOGRAPHIC = 1
_KIND_PERSPECTIVE = 2

# float32(pi / 180), as PyTorch3D's float32 tensor times the Python scalar rounds it.
_DEG2RAD = wp.constant(math.pi / 180.0)


# ----------------------------------------------------------------------------- kernels
@wp.func
def _row(n: int, cam: int) -> int:
    """Row of a per-camera array of batch ``n`` (1 or N) for camera ``cam``."""
    return wp.min(cam, n - 1)


@wp.func
def _fov_perspective_matrix(
    znear: float, zfar: float, aspect_ratio: float, fov: float, degrees: int
) -> wp.mat44:
    """PyTorch3D's FoVPerspectiveCameras projection, row-vector form (K transposed)."""
    angle = fov
    if degrees != 0:
        angle = _DEG2RAD * fov
    max_y = wp.tan(angle / 2.0) * znear
    min_y = -max_y
    max_x = max_y * aspect_ratio
    min_x = -max_x
    k00 = 2.0 * znear / (max_x - min_x)
    k11 = 2.0 * znear / (max_y - min_y)
    k02 = (max_x + min_x) / (max_x - min_x)
    k12 = (max_y + min_y) / (max_y - min_y)
    k22 = zfar / (zfar - znear)
    k23 = -(zfar * znear) / (zfar - znear)
    # fmt: off
    return wp.mat44(
        k00, 0.0, 0.0, 0.0,
        0.0, k11, 0.0, 0.0,
        k02, k12, k22, 1.0,
        0.0, 0.0, k23, 0.0,
    )
    # fmt: on


@wp.func
def _fov_orthographic_matrix(
    znear: float,
    zfar: float,
    min_x: float,
    max_x: float,
    min_y: float,
    max_y: float,
    scale: wp.vec3,
) -> wp.mat44:
    """PyTorch3D's FoVOrthographicCameras projection, row-vector form."""
    k00 = (2.0 / (max_x - min_x)) * scale[0]
    k11 = (2.0 / (max_y - min_y)) * scale[1]
    k03 = -(max_x + min_x) / (max_x - min_x)
    k13 = -(max_y + min_y) / (max_y - min_y)
    k22 = (1.0 / (zfar - znear)) * scale[2]
    k23 = -znear / (zfar - znear)
    # fmt: off
    return wp.mat44(
        k00, 0.0, 0.0, 0.0,
        0.0, k11, 0.0, 0.0,
        0.0, 0.0, k22, 0.0,
        k03, k13, k23, 1.0,
    )
    # fmt: on


@wp.func
def _perspective_matrix(
    fx: float, fy: float, principal_point: wp.vec2, in_ndc: int, image_size: wp.vec2
) -> wp.mat44:
    """PyTorch3D's PerspectiveCameras projection composed with its NDC camera transform.

    Column-vector pieces as PyTorch3D builds them, transposed at the end:
    ``K`` (SfM calibration), and for screen-space cameras the principal-point fix
    (x, y -= 2 p) followed by screen -> NDC (x, y += W/2, H/2, then / min(H, W)/2).
    """
    px = principal_point[0]
    py = principal_point[1]
    # fmt: off
    k = wp.mat44(
        fx, 0.0, px, 0.0,
        0.0, fy, py, 0.0,
        0.0, 0.0, 0.0, 1.0,
        0.0, 0.0, 1.0, 0.0,
    )
    if in_ndc == 0:
        h = image_size[0]
        w = image_size[1]
        s = wp.min(h, w) / 2.0
        fix = wp.mat44(
            1.0, 0.0, 0.0, -2.0 * px,
            0.0, 1.0, 0.0, -2.0 * py,
            0.0, 0.0, 1.0, 0.0,
            0.0, 0.0, 0.0, 1.0,
        )
        to_ndc = wp.mat44(
            1.0 / s, 0.0, 0.0, w / (2.0 * s),
            0.0, 1.0 / s, 0.0, h / (2.0 * s),
            0.0, 0.0, 1.0, 0.0,
            0.0, 0.0, 0.0, 1.0,
        )
        k = to_ndc @ (fix @ k)
    # fmt: on
    return wp.transpose(k)


@wp.func
def _view_to_ndc(
    cam: int,
    kind: int,
    degrees: int,
    in_ndc: int,
    znear: wp.array(dtype=float),
    zfar: wp.array(dtype=float),
    aspect_ratio: wp.array(dtype=float),
    fov: wp.array(dtype=float),
    min_x: wp.array(dtype=float),
    max_x: wp.array(dtype=float),
    min_y: wp.array(dtype=float),
    max_y: wp.array(dtype=float),
    scale_xyz: wp.array(dtype=wp.vec3),
    focal_length: wp.array2d(dtype=float),
    principal_point: wp.array(dtype=wp.vec2),
    image_size: wp.array(dtype=wp.vec2),
) -> wp.mat44:
    """The (row-vector) view -> NDC matrix of camera ``cam``."""
    if kind == 0:
        return _fov_perspective_matrix(
            znear[_row(znear.shape[0], cam)],
            zfar[_row(zfar.shape[0], cam)],
            aspect_ratio[_row(aspect_ratio.shape[0], cam)],
            fov[_row(fov.shape[0], cam)],
            degrees,
        )
    if kind == 1:
        return _fov_orthographic_matrix(
            znear[_row(znear.shape[0], cam)],
            zfar[_row(zfar.shape[0], cam)],
            min_x[_row(min_x.shape[0], cam)],
            max_x[_row(max_x.shape[0], cam)],
            min_y[_row(min_y.shape[0], cam)],
            max_y[_row(max_y.shape[0], cam)],
            scale_xyz[_row(scale_xyz.shape[0], cam)],
        )
    f = _row(focal_length.shape[0], cam)
    return _perspective_matrix(
        focal_length[f, 0],
        focal_length[f, focal_length.shape[1] - 1],
        principal_point[_row(principal_point.shape[0], cam)],
        in_ndc,
        image_size[_row(image_size.shape[0], cam)],
    )


@wp.kernel
def _project_kernel(
    verts: wp.array(dtype=wp.vec3),
    R: wp.array(dtype=wp.mat33),
    T: wp.array(dtype=wp.vec3),
    vert_to_mesh: wp.array(dtype=wp.int32),
    per_vertex_camera: int,
    num_cameras: int,
    kind: int,
    degrees: int,
    in_ndc: int,
    znear: wp.array(dtype=float),
    zfar: wp.array(dtype=float),
    aspect_ratio: wp.array(dtype=float),
    fov: wp.array(dtype=float),
    min_x: wp.array(dtype=float),
    max_x: wp.array(dtype=float),
    min_y: wp.array(dtype=float),
    max_y: wp.array(dtype=float),
    scale_xyz: wp.array(dtype=wp.vec3),
    focal_length: wp.array2d(dtype=float),
    principal_point: wp.array(dtype=wp.vec2),
    image_size: wp.array(dtype=wp.vec2),
    out: wp.array(dtype=wp.vec3),
):
    i = wp.tid()
    cam = int(0)
    if per_vertex_camera != 0:
        cam = wp.clamp(vert_to_mesh[i], 0, num_cameras - 1)
    v = verts[i] @ R[_row(R.shape[0], cam)] + T[_row(T.shape[0], cam)]
    m = _view_to_ndc(
        cam,
        kind,
        degrees,
        in_ndc,
        znear,
        zfar,
        aspect_ratio,
        fov,
        min_x,
        max_x,
        min_y,
        max_y,
        scale_xyz,
        focal_length,
        principal_point,
        image_size,
    )
    h = wp.vec4(v[0], v[1], v[2], 1.0) @ m
    out[i] = wp.vec3(h[0] / h[3], h[1] / h[3], v[2])


@wp.kernel
def _view_to_ndc_matrix_kernel(
    kind: int,
    degrees: int,
    in_ndc: int,
    znear: wp.array(dtype=float),
    zfar: wp.array(dtype=float),
    aspect_ratio: wp.array(dtype=float),
    fov: wp.array(dtype=float),
    min_x: wp.array(dtype=float),
    max_x: wp.array(dtype=float),
    min_y: wp.array(dtype=float),
    max_y: wp.array(dtype=float),
    scale_xyz: wp.array(dtype=wp.vec3),
    focal_length: wp.array2d(dtype=float),
    principal_point: wp.array(dtype=wp.vec2),
    image_size: wp.array(dtype=wp.vec2),
    out: wp.array(dtype=wp.mat44),
):
    cam = wp.tid()
    out[cam] = _view_to_ndc(
        cam,
        kind,
        degrees,
        in_ndc,
        znear,
        zfar,
        aspect_ratio,
        fov,
        min_x,
        max_x,
        min_y,
        max_y,
        scale_xyz,
        focal_length,
        principal_point,
        image_size,
    )


@wp.kernel(enable_backward=False)
def _vert_to_mesh_kernel(
    faces: wp.array2d(dtype=wp.int32),
    mesh_first: wp.array(dtype=wp.int32),
    mesh_count: wp.array(dtype=wp.int32),
    num_meshes: int,
    out: wp.array(dtype=wp.int32),
):
    f = wp.tid()
    nv = out.shape[0]
    for n in range(num_meshes):
        if f >= mesh_first[n] and f < mesh_first[n] + mesh_count[n]:
            for j in range(3):
                v = faces[f, j]
                if v >= 0 and v < nv:
                    out[v] = n


# ----------------------------------------------------------------------------- inputs
def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


# name -> (trailing shape of one camera's value, Warp dtype of the stored array)
_LAYOUTS = {
    "scalar": ((), wp.float32),
    "vec2": ((2,), wp.vec2),
    "vec3": ((3,), wp.vec3),
    "mat33": ((3, 3), wp.mat33),
    "focal": (None, None),  # (B,), (B, 1) or (B, 2) float32, stored 2-D
}


class _Param:
    """One parsed camera parameter: a Warp array to use as is, or host values to copy."""

    def __init__(self, name: str, layout: str, value):
        self.name = name
        self.layout = layout
        self.array: wp.array | None = None
        if _is_torch(value):
            raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
        if isinstance(value, wp.array):
            self.array = self._view(value)
            host = value.numpy()
        else:
            try:
                host = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise TypeError(f"{name} must be numeric, got {value!r}") from None
        self.host = self._check_shape(np.asarray(host, dtype=np.float64))
        self.batch = self.host.shape[0]
        if not np.isfinite(self.host).all():
            raise ValueError(f"{name} must be finite, got {self.host.tolist()}")

    def _view(self, a: wp.array) -> wp.array:
        name = self.name
        inner, dtype = _LAYOUTS[self.layout]
        if self.layout == "focal":
            if a.dtype == wp.vec2 and a.ndim == 1:
                return a.view(wp.float32)
            if a.dtype == wp.float32 and a.ndim == 1:
                return a.reshape((a.shape[0], 1))
            if a.dtype == wp.float32 and a.ndim == 2 and a.shape[1] in (1, 2):
                return a
            raise TypeError(
                f"{name} must be a float32 wp.array of shape (N,), (N, 1) or (N, 2) "
                f"(or vec2), got dtype {wp.types.type_repr(a.dtype)} shape {a.shape}"
            )
        if a.dtype == dtype and a.ndim == 1:
            return a
        if a.dtype == wp.float32 and a.shape[1:] == inner:
            if not a.is_contiguous:
                raise ValueError(f"{name} must be a contiguous wp.array")
            return a if dtype == wp.float32 else a.view(dtype)
        raise TypeError(
            f"{name} must be a float32 wp.array of shape (N{''.join(f', {d}' for d in inner)})"
            f" (or of {wp.types.type_repr(dtype)}), got dtype {wp.types.type_repr(a.dtype)} "
            f"shape {a.shape}"
        )

    def _check_shape(self, h: np.ndarray) -> np.ndarray:
        name = self.name
        if self.layout == "focal":
            if h.ndim == 0:
                h = h.reshape(1, 1)
            elif h.ndim == 1:
                h = h[:, None]
            if h.ndim != 2 or h.shape[1] not in (1, 2) or h.shape[0] < 1:
                raise ValueError(f"{name} must be a scalar or have shape (N,), (N, 1) or (N, 2)")
            return h
        inner = _LAYOUTS[self.layout][0]
        if self.layout == "scalar" and h.ndim == 0:
            h = h.reshape(1)
        if self.array is not None and self.layout != "scalar":
            h = h.reshape((-1, *inner))
        want = "(N" + "".join(f", {d}" for d in inner) + ")"
        if h.ndim != 1 + len(inner) or h.shape[1:] != inner or h.shape[0] < 1:
            extra = " or a scalar" if self.layout == "scalar" else ""
            raise ValueError(f"{name} must have shape {want}{extra}, got {h.shape}")
        return h


def _broadcast_batch(params: Sequence[_Param]) -> int:
    n = max(p.batch for p in params)
    bad = [p for p in params if p.batch not in (1, n)]
    if bad:
        sizes = ", ".join(f"{p.name}: {p.batch}" for p in params)
        raise ValueError(
            f"camera parameters have batch sizes that do not broadcast ({sizes}); each "
            f"must be 1 or N = {n}"
        )
    return n


def _check_rotation(R: np.ndarray, name: str = "R") -> None:
    """Raises ValueError unless every R[i] is a proper rotation (see ROTATION_TOLERANCE)."""
    eye = np.eye(3)
    for i, r in enumerate(R):
        err = float(np.abs(r @ r.T - eye).max())
        det = float(np.linalg.det(r))
        if not err < ROTATION_TOLERANCE or det <= 0.0:
            raise ValueError(
                f"{name}[{i}] is not a rotation matrix: max |R R^T - I| = {err:.3g} "
                f"(tolerance {ROTATION_TOLERANCE:g}), det = {det:.6g} (must be > 0)"
            )


def _image_size_rows(image_size, name: str = "image_size") -> np.ndarray:
    """``(H, W)``, an int, or (B, 2) -> float64 (B, 2) rows of (H, W), each >= 1."""
    if _is_torch(image_size):
        raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
    if isinstance(image_size, wp.array):
        image_size = image_size.numpy()
    a = np.asarray(image_size)
    if a.ndim == 0:
        a = np.array([a, a])
    if a.dtype.kind not in "iuf" or a.ndim not in (1, 2) or a.shape[-1] != 2:
        raise ValueError(f"{name} must be an int, (H, W) or (N, 2), got {image_size!r}")
    a = a.reshape(-1, 2).astype(np.float64)
    if not np.isfinite(a).all() or (a < 1).any() or (a != np.round(a)).any():
        raise ValueError(f"{name} must hold whole numbers >= 1, got {a.tolist()}")
    return a


def _resolve_device(device, params: Sequence[_Param]):
    arrays = [p for p in params if p.array is not None]
    if device is None:
        device = arrays[0].array.device if arrays else wp.get_device()
    device = wp.get_device(device)
    for p in arrays:
        if wp.get_device(p.array.device) != device:
            raise ValueError(
                f"{p.name} is on device {p.array.device}, but the camera is on {device}"
            )
    return device


# ----------------------------------------------------------------------------- cameras
class CamerasBase:
    """What every camera does: world -> view -> NDC, matrices, batch checks.

    Attributes shared by all cameras (Warp arrays on :attr:`device`, batch 1 or N):
        R: ``mat33`` (N,) (a (N, 3, 3) float32 view is ``R.view(float)``).
        T: ``vec3`` (N,).
    """

    _kind: int = -1
    # parameter name -> (layout, differentiable)
    _SPEC: dict[str, tuple[str, bool]] = {}

    def _setup(self, values: dict, *, device, requires_grad: bool) -> None:
        params = [_Param(name, self._SPEC[name][0], values[name]) for name in self._SPEC]
        self._n = _broadcast_batch(params)
        self.device = _resolve_device(device, params)
        self._host = {}
        for p in params:
            self._host[p.name] = np.broadcast_to(p.host, (self._n, *p.host.shape[1:]))
            if p.array is not None:
                arr = p.array
            else:
                layout = self._SPEC[p.name][0]
                h = self._host[p.name]
                if layout == "focal":
                    h = np.broadcast_to(h, (self._n, 2))
                    dtype = wp.float32
                else:
                    dtype = _LAYOUTS[layout][1]
                arr = wp.array(
                    np.ascontiguousarray(h, dtype=np.float32),
                    dtype=dtype,
                    device=self.device,
                    requires_grad=bool(requires_grad and self._SPEC[p.name][1]),
                )
            setattr(self, p.name, arr)
        _check_rotation(self._host["R"])
        self._dummy = {
            "scalar": wp.zeros(1, dtype=wp.float32, device=self.device),
            "vec2": wp.zeros(1, dtype=wp.vec2, device=self.device),
            "vec3": wp.zeros(1, dtype=wp.vec3, device=self.device),
            "focal": wp.zeros((1, 1), dtype=wp.float32, device=self.device),
            "index": wp.zeros(1, dtype=wp.int32, device=self.device),
        }
        self._image_size_cache: dict[tuple, wp.array] = {}

    # -- batch ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def check_batch(self, n_meshes: int) -> None:
        """Raises ValueError unless this batch of N cameras can render ``n_meshes``.

        As PyTorch3D's ``MeshRasterizer``: one camera per mesh, or a single camera
        shared by all meshes.
        """
        if self._n != 1 and self._n != int(n_meshes):
            raise ValueError(
                f"Wrong number ({self._n}) of cameras for {int(n_meshes)} meshes: "
                "expected one camera per mesh, or a single camera"
            )

    # -- kind ----------------------------------------------------------------------
    def is_perspective(self) -> bool:
        raise NotImplementedError

    def in_ndc(self) -> bool:
        """True if the projection lands in NDC directly (no screen -> NDC step)."""
        return True

    def get_znear(self) -> np.ndarray | None:
        """znear (N,) as validated at construction, or None for cameras without one."""
        if "znear" not in self._SPEC:
            return None
        return np.array(self._host["znear"], dtype=np.float32)

    def _parameters(self) -> list[wp.array]:
        return list(self._parameter_dict().values())

    def _parameter_dict(self) -> dict[str, wp.array]:
        return {name: getattr(self, name) for name in self._SPEC}

    def requires_grad(self) -> bool:
        """True if any parameter array of this camera tracks gradients."""
        return any(a.requires_grad for a in self._parameters())

    # -- matrices ------------------------------------------------------------------
    def get_world_to_view_matrix(self) -> np.ndarray:
        """(N, 4, 4) float32: ``[x y z 1] @ M`` = view coordinates (reads R, T back)."""
        R = np.broadcast_to(self.R.numpy().reshape(-1, 3, 3), (self._n, 3, 3))
        T = np.broadcast_to(self.T.numpy().reshape(-1, 3), (self._n, 3))
        m = np.zeros((self._n, 4, 4), dtype=np.float32)
        m[:, :3, :3] = R
        m[:, 3, :3] = T
        m[:, 3, 3] = 1.0
        return m

    def get_view_to_ndc_matrix(self, image_size=None) -> np.ndarray:
        """(N, 4, 4) float32: PyTorch3D's projection composed with its NDC camera transform.

        ``h = [x_view y_view z_view 1] @ M``; NDC x, y = ``h[0] / h[3], h[1] / h[3]``.
        ``image_size`` ((H, W) or (N, 2)) only matters for screen-space cameras and
        defaults to the camera's own.
        """
        out = wp.empty(self._n, dtype=wp.mat44, device=self.device)
        wp.launch(
            _view_to_ndc_matrix_kernel,
            dim=self._n,
            inputs=[self._kind, *self._projection_inputs(image_size)],
            outputs=[out],
            device=self.device,
            record_tape=False,
        )
        return out.numpy()

    def get_camera_center(self) -> np.ndarray:
        """(N, 3) float32 camera positions in world coordinates (``C @ R + T = 0``)."""
        R = np.broadcast_to(self.R.numpy().reshape(-1, 3, 3), (self._n, 3, 3)).astype(np.float64)
        T = np.broadcast_to(self.T.numpy().reshape(-1, 3), (self._n, 3)).astype(np.float64)
        return (-np.einsum("nj,nij->ni", T, R)).astype(np.float32)

    # -- projection ----------------------------------------------------------------
    def _projection_inputs(self, image_size) -> list:
        """degrees, in_ndc and the 12 parameter arrays of the kernels, in order."""
        d = self._dummy
        arrays = {
            "znear": d["scalar"],
            "zfar": d["scalar"],
            "aspect_ratio": d["scalar"],
            "fov": d["scalar"],
            "min_x": d["scalar"],
            "max_x": d["scalar"],
            "min_y": d["scalar"],
            "max_y": d["scalar"],
            "scale_xyz": d["vec3"],
            "focal_length": d["focal"],
            "principal_point": d["vec2"],
            "image_size": d["vec2"],
        }
        for name in arrays:
            if name in self._SPEC:
                arrays[name] = getattr(self, name)
        arrays["image_size"] = self._image_size_array(image_size)
        degrees = int(bool(getattr(self, "degrees", True)))
        return [degrees, int(self.in_ndc()), *arrays.values()]

    def _image_size_array(self, image_size) -> wp.array:
        return self._dummy["vec2"]

    def transform_points_ndc(self, verts, vert_to_mesh=None, image_size=None, out=None):
        """Projects world-space vertices: x, y in NDC, z = view-space depth.

        One kernel launch, recorded on an enclosing ``wp.Tape``: its adjoint sends
        gradients to ``verts`` and to every camera parameter array with
        ``requires_grad``. No host read-back, no allocation when ``out`` is given,
        so the call can be captured in a graph.

        Args:
            verts: (V, 3) world-space vertices: ``wp.array`` of ``vec3`` or (V, 3)
                float32 (zero-copy, gradients land in its ``.grad``), or NumPy
                (copied to the camera's device).
            vert_to_mesh: (V,) int32 camera index of each vertex (packed batches:
                mesh n owns a contiguous vertex range and is seen by camera n).
                May be None when there is a single camera. Values are clamped to
                [0, N-1] on the device (not checked on the host).
            image_size: (H, W) or (N, 2); only screen-space cameras use it
                (default: the camera's own ``image_size``).
            out: (V,) ``vec3`` output buffer; allocated when None. Must have
                ``requires_grad`` when gradients are wanted.

        Returns:
            ``out``: ``wp.array(dtype=wp.vec3)`` (V,), (x_ndc, y_ndc, z_view).
        """
        v = as_vec3_array(verts, "verts", self.device)
        n_verts = v.shape[0]
        if vert_to_mesh is None:
            if self._n != 1:
                raise ValueError(
                    f"vert_to_mesh is required with {self._n} cameras (one camera per mesh)"
                )
            v2m = self._dummy["index"]
        else:
            if isinstance(vert_to_mesh, np.ndarray) and vert_to_mesh.size:
                lo, hi = int(vert_to_mesh.min()), int(vert_to_mesh.max())
                if lo < 0 or (self._n > 1 and hi >= self._n):
                    raise ValueError(
                        f"vert_to_mesh holds values in [{lo}, {hi}], outside [0, {self._n - 1}]"
                    )
            v2m = as_index_array(vert_to_mesh, "vert_to_mesh", self.device, length=n_verts)
        per_vertex_camera = int(vert_to_mesh is not None and self._n > 1)
        needs_grad = v.requires_grad or self.requires_grad()
        if out is None:
            out = wp.empty(n_verts, dtype=wp.vec3, device=self.device, requires_grad=needs_grad)
        else:
            if not isinstance(out, wp.array) or out.dtype != wp.vec3 or out.shape != (n_verts,):
                raise ValueError(f"out must be a wp.array of vec3 with shape ({n_verts},)")
            if wp.get_device(out.device) != self.device:
                raise ValueError(
                    f"out is on device {out.device}, but the camera is on {self.device}"
                )
            if needs_grad and not out.requires_grad:
                raise ValueError(
                    "out must have requires_grad=True: verts or camera parameters track "
                    "gradients, and an output without a gradient array would silently stop them"
                )
        if n_verts == 0:
            return out
        wp.launch(
            _project_kernel,
            dim=n_verts,
            inputs=[
                v,
                self.R,
                self.T,
                v2m,
                per_vertex_camera,
                self._n,
                self._kind,
                *self._projection_inputs(image_size),
            ],
            outputs=[out],
            device=self.device,
        )
        return out
        inputs = self._projection_inputs(image_size)
        wp.launch(
            _project_kernel,
            dim=n_verts,
            inputs=[
                v,
                v2m,
                int(vert_to_mesh is not None and self._n > 1),
                self._n,
                self._kind,
                inputs[0],
                inputs[1],
                self.R,
                self.T,
                *inputs[2:],
            ],
            outputs=[out],
            device=self.device,
        )
        return out


_R_DEFAULT = np.eye(3)[None]
_T_DEFAULT = np.zeros((1, 3))


class FoVPerspectiveCameras(CamerasBase):
    """Perspective cameras given by a field of view (OpenGL-style frustum), as PyTorch3D's.

    The frustum is symmetric: ``max_y = tan(fov / 2) * znear``,
    ``max_x = max_y * aspect_ratio`` map to NDC +1. ``aspect_ratio`` is the *pixel*
    aspect ratio: keep 1.0 for square pixels and set the image shape in the
    rasterizer (the shorter side spans NDC [-1, 1]).

    Args:
        znear, zfar: near / far planes, (N,) or scalar; ``0 < znear < zfar``.
        aspect_ratio: pixel aspect ratio (> 0), (N,) or scalar.
        fov: vertical field of view, (N,) or scalar, in (0, 180) degrees
            (or (0, pi) radians with ``degrees=False``).
        degrees: whether ``fov`` is in degrees.
        R: (N, 3, 3) world -> view rotations (``X_view = X_world @ R + T``).
        T: (N, 3) translations.
        device: Warp device (default: that of the Warp array arguments, else
            Warp's default device).
        requires_grad: make the copies of NumPy inputs of the differentiable
            parameters (R, T, fov, aspect_ratio) track gradients.

    Each argument may be a Python number/sequence, a NumPy array or a float32
    Warp array (used zero-copy; see the module docstring).

    Raises:
        TypeError, ValueError: naming the argument (shapes, batch sizes, devices,
            non-finite values, znear <= 0, zfar <= znear, fov out of range,
            aspect_ratio <= 0, R not a rotation).
    """

    _kind = _KIND_FOV_PERSPECTIVE
    _SPEC = {
        "znear": ("scalar", False),
        "zfar": ("scalar", False),
        "aspect_ratio": ("scalar", True),
        "fov": ("scalar", True),
        "R": ("mat33", True),
        "T": ("vec3", True),
    }

    def __init__(
        self,
        znear=1.0,
        zfar=100.0,
        aspect_ratio=1.0,
        fov=60.0,
        degrees: bool = True,
        R=_R_DEFAULT,
        T=_T_DEFAULT,
        device=None,
        *,
        requires_grad: bool = False,
    ):
        self.degrees = bool(degrees)
        values = {"znear": znear, "zfar": zfar, "aspect_ratio": aspect_ratio, "fov": fov}
        self._setup({**values, "R": R, "T": T}, device=device, requires_grad=requires_grad)
        h = self._host
        if (h["znear"] <= 0).any():
            raise ValueError(
                f"znear must be > 0 for a perspective camera, got {h['znear'].tolist()}"
            )
        if (h["zfar"] <= h["znear"]).any():
            raise ValueError(
                f"zfar must be > znear, got zfar={h['zfar'].tolist()}, znear={h['znear'].tolist()}"
            )
        if (h["aspect_ratio"] <= 0).any():
            raise ValueError(f"aspect_ratio must be > 0, got {h['aspect_ratio'].tolist()}")
        top = 180.0 if self.degrees else math.pi
        if ((h["fov"] <= 0) | (h["fov"] >= top)).any():
            unit = "degrees" if self.degrees else "radians (degrees=False)"
            raise ValueError(f"fov must be in (0, {top:g}) {unit}, got {h['fov'].tolist()}")

    def is_perspective(self) -> bool:
        return True


class FoVOrthographicCameras(CamerasBase):
    """Orthographic cameras given by a view box, as PyTorch3D's.

    NDC x = ``(2 x_view / (max_x - min_x)) * scale_x - (max_x + min_x) / (max_x - min_x)``,
    y likewise; depth is the view z.

    Args:
        znear, zfar: near / far planes, (N,) or scalar; ``zfar > znear``.
        max_y, min_y, max_x, min_x: view box, (N,) or scalar; ``max != min``.
        scale_xyz: (N, 3) scale of each axis (differentiable).
        R, T, device, requires_grad: as :class:`FoVPerspectiveCameras`
            (differentiable parameters: R, T, scale_xyz).

    The positional order is PyTorch3D's (``znear, zfar, max_y, min_y, max_x, min_x,
    scale_xyz, R, T``); pass keywords.
    """

    _kind = _KIND_FOV_ORTHOGRAPHIC
    _SPEC = {
        "znear": ("scalar", False),
        "zfar": ("scalar", False),
        "max_y": ("scalar", False),
        "min_y": ("scalar", False),
        "max_x": ("scalar", False),
        "min_x": ("scalar", False),
        "scale_xyz": ("vec3", True),
        "R": ("mat33", True),
        "T": ("vec3", True),
    }

    def __init__(
        self,
        znear=1.0,
        zfar=100.0,
        max_y=1.0,
        min_y=-1.0,
        max_x=1.0,
        min_x=-1.0,
        scale_xyz=((1.0, 1.0, 1.0),),
        R=_R_DEFAULT,
        T=_T_DEFAULT,
        device=None,
        *,
        requires_grad: bool = False,
    ):
        values = {
            "znear": znear,
            "zfar": zfar,
            "max_y": max_y,
            "min_y": min_y,
            "max_x": max_x,
            "min_x": min_x,
            "scale_xyz": scale_xyz,
            "R": R,
            "T": T,
        }
        self._setup(values, device=device, requires_grad=requires_grad)
        h = self._host
        if (h["zfar"] <= h["znear"]).any():
            raise ValueError(
                f"zfar must be > znear, got zfar={h['zfar'].tolist()}, znear={h['znear'].tolist()}"
            )
        for lo, hi in (("min_x", "max_x"), ("min_y", "max_y")):
            if (h[lo] == h[hi]).any():
                raise ValueError(
                    f"{hi} must differ from {lo}, got {h[hi].tolist()} and {h[lo].tolist()}"
                )

    def is_perspective(self) -> bool:
        return False


class PerspectiveCameras(CamerasBase):
    """Pinhole cameras given by focal length and principal point, as PyTorch3D's.

    In NDC (``in_ndc=True``, the default): NDC x = ``fx * x_view / z_view + px``,
    y likewise. In screen space (``in_ndc=False``, ``image_size`` required): focal
    length and principal point are in pixels, the principal point measured from
    the top-left corner of the image; x, y map to NDC through PyTorch3D's
    principal-point fix and screen -> NDC transform, so that
    NDC x = ``(fx * x_view / z_view - px + W / 2) / (min(H, W) / 2)``.

    Args:
        focal_length: scalar, (N,), (N, 1) or (N, 2) ``(fx, fy)``; nonzero
            (differentiable). Stored as (N, 2) for NumPy input.
        principal_point: (N, 2) ``(px, py)`` (differentiable).
        R, T, device, requires_grad: as :class:`FoVPerspectiveCameras`.
        in_ndc: whether focal length and principal point are in NDC units.
        image_size: (H, W) or (N, 2); required when ``in_ndc=False``.

    The camera has no ``znear``: :meth:`get_znear` returns None, and so the
    rasterizer's default ``z_clip_value`` is None (as PyTorch3D's).
    """

    _kind = _KIND_PERSPECTIVE
    _SPEC = {
        "focal_length": ("focal", True),
        "principal_point": ("vec2", True),
        "R": ("mat33", True),
        "T": ("vec3", True),
    }

    def __init__(
        self,
        focal_length=1.0,
        principal_point=((0.0, 0.0),),
        R=_R_DEFAULT,
        T=_T_DEFAULT,
        device=None,
        in_ndc: bool = True,
        image_size=None,
        *,
        requires_grad: bool = False,
    ):
        self._in_ndc = bool(in_ndc)
        values = {"focal_length": focal_length, "principal_point": principal_point, "R": R, "T": T}
        self._setup(values, device=device, requires_grad=requires_grad)
        if (self._host["focal_length"] == 0).any():
            raise ValueError(
                f"focal_length must be nonzero, got {self._host['focal_length'].tolist()}"
            )
        if image_size is None:
            if not self._in_ndc:
                raise ValueError(
                    "image_size=(H, W) is required for a screen-space camera (in_ndc=False)"
                )
            self.image_size = None
            self._image_size_host = None
        else:
            rows = _image_size_rows(image_size)
            if rows.shape[0] not in (1, self._n):
                raise ValueError(
                    f"image_size has {rows.shape[0]} rows, but there are {self._n} cameras "
                    "(must be 1 or N)"
                )
            self._image_size_host = rows
            self.image_size = wp.array(rows.astype(np.float32), dtype=wp.vec2, device=self.device)

    def is_perspective(self) -> bool:
        return True

    def in_ndc(self) -> bool:
        return self._in_ndc

    def get_image_size(self) -> np.ndarray | None:
        """(B, 2) float64 rows of (H, W) given at construction, or None."""
        return None if self._image_size_host is None else self._image_size_host.copy()

    def _image_size_array(self, image_size) -> wp.array:
        if self._in_ndc:
            return self._dummy["vec2"]
        if image_size is None:
            return self.image_size
        rows = _image_size_rows(image_size)
        if rows.shape[0] not in (1, self._n):
            raise ValueError(
                f"image_size has {rows.shape[0]} rows, but there are {self._n} cameras"
            )
        key = tuple(rows.ravel().tolist())
        if key not in self._image_size_cache:
            self._image_size_cache[key] = wp.array(
                rows.astype(np.float32), dtype=wp.vec2, device=self.device
            )
        return self._image_size_cache[key]

    def _ndc_intrinsics(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, 2) NDC focal length and principal point, float64 (reads them back)."""
        f = self.focal_length.numpy().astype(np.float64)
        f = np.broadcast_to(f[:, [0, -1]], (self._n, 2))
        p = np.broadcast_to(self.principal_point.numpy().astype(np.float64), (self._n, 2))
        if self._in_ndc:
            return f, p
        hw = np.broadcast_to(self._image_size_host, (self._n, 2))
        scale = hw.min(axis=1, keepdims=True) / 2.0
        c0 = hw[:, ::-1] / 2.0
        return f / scale, -(p - c0) / scale


# ----------------------------------------------------------------------------- look-at
def _rows(x, name: str, width: int | None) -> np.ndarray:
    if _is_torch(x):
        raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
    if isinstance(x, wp.array):
        x = x.numpy()
    a = np.asarray(x, dtype=np.float64)
    if width is None:
        if a.ndim > 1:
            raise ValueError(f"{name} must be a scalar or have shape (N,), got {a.shape}")
        a = a.reshape(-1)
    else:
        if a.ndim == 1 and a.shape[0] == width:
            a = a[None]
        if a.ndim != 2 or a.shape[1] != width:
            raise ValueError(f"{name} must have shape (N, {width}) or ({width},), got {a.shape}")
    if a.shape[0] < 1:
        raise ValueError(f"{name} must not be empty")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a


def _broadcast_rows(named: dict[str, np.ndarray]) -> list[np.ndarray]:
    n = max(a.shape[0] for a in named.values())
    for name, a in named.items():
        if a.shape[0] not in (1, n):
            sizes = ", ".join(f"{k}: {v.shape[0]}" for k, v in named.items())
            raise ValueError(f"{name} does not broadcast ({sizes}); each must have 1 or N rows")
    return [np.broadcast_to(a, (n, *a.shape[1:])) for a in named.values()]


def _normalize(v: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    # torch.nn.functional.normalize: v / max(|v|, eps)
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), eps)


def look_at_rotation(camera_position, at=((0, 0, 0),), up=((0, 1, 0),)) -> np.ndarray:
    """(N, 3, 3) float32 world -> view rotations of cameras at ``camera_position``
    looking at ``at`` with world up ``up`` (PyTorch3D's ``look_at_rotation``).

    Each argument is (3,), (1, 3) or (N, 3). The view z axis points from the camera
    to ``at``; x = up x z; y = z x x; R holds them as columns.

    Raises:
        ValueError: bad shapes, or a camera whose ``up`` is (nearly) parallel to
            its viewing direction or that sits at ``at`` (no rotation is defined;
            PyTorch3D returns a degenerate matrix there).
    """
    c, a, u = _broadcast_rows(
        {
            "camera_position": _rows(camera_position, "camera_position", 3),
            "at": _rows(at, "at", 3),
            "up": _rows(up, "up", 3),
        }
    )
    z = _normalize(a - c)
    x = _normalize(np.cross(u, z))
    y = _normalize(np.cross(z, x))
    is_close = np.all(np.abs(x) <= 5e-3, axis=1, keepdims=True)
    if is_close.any():
        x = np.where(is_close, _normalize(np.cross(y, z)), x)
    R = np.stack([x, y, z], axis=2)
    bad = np.abs(np.einsum("nij,nkj->nik", R, R) - np.eye(3)).max(axis=(1, 2)) >= ROTATION_TOLERANCE
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"no look-at rotation for camera {i}: up={u[i].tolist()} is parallel to the viewing "
            f"direction {(a[i] - c[i]).tolist()} (or the camera is at `at`)"
        )
    return R.astype(np.float32)


def look_at_view_transform(
    dist=1.0,
    elev=0.0,
    azim=0.0,
    degrees: bool = True,
    eye=None,
    at=((0, 0, 0),),
    up=((0, 1, 0),),
) -> tuple[np.ndarray, np.ndarray]:
    """World -> view (R, T) of cameras looking at ``at``, as PyTorch3D's.

    The camera sits at ``eye`` if given, else at spherical coordinates around
    ``at``: ``dist * (cos(elev) sin(azim), sin(elev), cos(elev) cos(azim))``
    (elev from the xz-plane, azim from +z towards +x).

    Args:
        dist, elev, azim: scalars or (N,); angles in degrees unless ``degrees=False``.
        degrees: unit of ``elev`` and ``azim``.
        eye: (N, 3) or (3,) camera positions; overrides dist/elev/azim.
        at: (N, 3) or (3,) look-at points.
        up: (N, 3) or (3,) world up directions.

    Returns:
        ``(R, T)``: float32 NumPy arrays (N, 3, 3) and (N, 3), computed in float64.

    Raises:
        ValueError: shapes that do not broadcast, non-finite values, or a degenerate
            view (see :func:`look_at_rotation`).
    """
    if eye is not None:
        c, a, u = _broadcast_rows(
            {"eye": _rows(eye, "eye", 3), "at": _rows(at, "at", 3), "up": _rows(up, "up", 3)}
        )
    else:
        d, e, z, a, u = _broadcast_rows(
            {
                "dist": _rows(dist, "dist", None),
                "elev": _rows(elev, "elev", None),
                "azim": _rows(azim, "azim", None),
                "at": _rows(at, "at", 3),
                "up": _rows(up, "up", 3),
            }
        )
        if degrees:
            e = np.deg2rad(e)
            z = np.deg2rad(z)
        c = np.stack([d * np.cos(e) * np.sin(z), d * np.sin(e), d * np.cos(e) * np.cos(z)], 1) + a
    R = look_at_rotation(c, a, u).astype(np.float64)
    # T = -R^T C (column form), i.e. the camera centre maps to the view origin.
    T = -np.einsum("nji,nj->ni", R, c)
    return R.astype(np.float32), T.astype(np.float32)


# ----------------------------------------------------------------------------- OpenCV
def _batched(x, name: str, inner: tuple[int, ...]) -> np.ndarray:
    if _is_torch(x):
        raise TypeError(f"{name} is a torch tensor: pass NumPy or Warp arrays")
    if isinstance(x, wp.array):
        x = x.numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 + len(inner) or a.shape[1:] != inner:
        want = "(N" + "".join(f", {d}" for d in inner) + ")"
        raise ValueError(f"{name} must have shape {want}, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a


def cameras_from_opencv_projection(
    R, tvec, camera_matrix, image_size, *, device=None, requires_grad: bool = False
) -> PerspectiveCameras:
    """NDC :class:`PerspectiveCameras` equal to OpenCV pinhole cameras (PyTorch3D's rule).

    OpenCV maps a world point X to ``x_cam = R X + tvec`` and pixel
    ``(u, v) = (fx x/z + cx, fy y/z + cy)`` (+x right, +y down, the image
    spanning [0, W] x [0, H]). The result sends X to NDC with
    ``u = W/2 - s x_ndc``, ``v = H/2 - s y_ndc``, ``s = min(H, W) / 2``.

    Args:
        R: (N, 3, 3) OpenCV world -> camera rotations.
        tvec: (N, 3) OpenCV translations.
        camera_matrix: (N, 3, 3) intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
            (no skew).
        image_size: (N, 2) or (H, W), in pixels.
        device, requires_grad: as :class:`PerspectiveCameras`.

    Returns:
        :class:`PerspectiveCameras` with ``in_ndc=True`` and ``image_size`` set.

    Raises:
        ValueError: shapes, batch sizes, skew or a last row other than (0, 0, 1),
            R not a rotation.
    """
    R = _batched(R, "R", (3, 3))
    tvec = _batched(tvec, "tvec", (3,))
    K = _batched(camera_matrix, "camera_matrix", (3, 3))
    hw = _image_size_rows(image_size)
    R, tvec, K, hw = _broadcast_rows({"R": R, "tvec": tvec, "camera_matrix": K, "image_size": hw})
    if (K[:, 0, 1] != 0).any() or (K[:, 1, 0] != 0).any():
        raise ValueError("camera_matrix has skew (K[0, 1] or K[1, 0] nonzero): not supported")
    if not np.array_equal(K[:, 2], np.broadcast_to([0.0, 0.0, 1.0], K[:, 2].shape)):
        raise ValueError("camera_matrix must have last row (0, 0, 1)")
    focal = np.stack([K[:, 0, 0], K[:, 1, 1]], axis=1)
    pp = K[:, :2, 2]
    wh = hw[:, ::-1]
    scale = wh.min(axis=1, keepdims=True) / 2.0
    c0 = wh / 2.0
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
    cameras: CamerasBase, image_size
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV ``(R, tvec, camera_matrix)`` of pinhole cameras (inverse of
    :func:`cameras_from_opencv_projection`).

    Accepts :class:`PerspectiveCameras` (NDC or screen space; a screen-space
    camera is first converted to NDC with its own ``image_size``) and
    :class:`FoVPerspectiveCameras` (whose NDC focal length is the (0, 0) and
    (1, 1) entries of its view -> NDC matrix, principal point 0).

    Args:
        cameras: the cameras (N).
        image_size: (N, 2) or (H, W) of the OpenCV image, in pixels.

    Returns:
        float32 NumPy ``R`` (N, 3, 3), ``tvec`` (N, 3), ``camera_matrix`` (N, 3, 3).

    Raises:
        TypeError: an orthographic camera (no pinhole model).
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
    hw = _image_size_rows(image_size)
    if hw.shape[0] not in (1, n):
        raise ValueError(f"image_size has {hw.shape[0]} rows, but there are {n} cameras")
    wh = np.broadcast_to(hw, (n, 2))[:, ::-1]
    R_p3d = np.broadcast_to(cameras.R.numpy().reshape(-1, 3, 3), (n, 3, 3)).astype(np.float64)
    T_p3d = np.broadcast_to(cameras.T.numpy().reshape(-1, 3), (n, 3)).astype(np.float64)
    R_p3d = R_p3d.copy()
    R_p3d[:, :, :2] *= -1.0
    tvec = T_p3d.copy()
    tvec[:, :2] *= -1.0
    scale = wh.min(axis=1, keepdims=True) / 2.0
    c0 = wh / 2.0
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


# ----------------------------------------------------------------------------- batches
def vert_to_mesh_from_faces(
    faces, mesh_to_face_first_idx, num_faces_per_mesh, num_verts: int, *, out=None, device=None
) -> wp.array:
    """(V,) int32 mesh index of every vertex, from the packed faces, on the device.

    A vertex takes the index of the mesh whose faces use it; vertices used by no
    face get 0 (they are projected, but never drawn). No host read-back: usable
    in a captured graph when ``out`` is given. Packed meshes do not share
    vertices; if they do, the vertex takes one of them.

    Args:
        faces: (F, 3) int32 packed faces (``wp.array2d`` or ``vec3i``, or NumPy).
        mesh_to_face_first_idx, num_faces_per_mesh: (N,) per-mesh face ranges.
        num_verts: V.
        out: optional (V,) int32 output buffer.
        device: device for NumPy inputs (default: that of ``faces`` if it is a
            Warp array, else Warp's default device).
    """
    if device is None and isinstance(faces, wp.array):
        device = faces.device
    f = as_faces_array(faces, "faces", device)
    device = f.device
    first = as_index_array(mesh_to_face_first_idx, "mesh_to_face_first_idx", device)
    count = as_index_array(num_faces_per_mesh, "num_faces_per_mesh", device, length=first.shape[0])
    if out is None:
        out = wp.zeros(int(num_verts), dtype=wp.int32, device=device)
    else:
        out = as_index_array(out, "out", device, length=int(num_verts))
        out.zero_()
    if f.shape[0] > 0 and int(num_verts) > 0:
        wp.launch(
            _vert_to_mesh_kernel,
            dim=f.shape[0],
            inputs=[f, first, count, first.shape[0]],
            outputs=[out],
            device=device,
            record_tape=False,
        )
    return out
