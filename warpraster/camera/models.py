"""Camera models: FoV perspective, FoV orthographic and pinhole cameras, as PyTorch3D's.

Each model parses and validates its parameters once, at construction (on host
copies of the values), and keeps them on the device in one
:class:`~warpraster.camera.data.CameraData`; the projection kernels read
nothing else. See the package docstring for conventions, batches and gradients.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import warp as wp

from ..meshes import as_index_array, as_vec3_array
from .inputs import (
    ArrayInput,
    ParamLayout,
    ParsedParam,
    broadcast_batch,
    check_rotation,
    image_size_rows,
    pixel_frame,
    resolve_device,
)
from .params import CameraData, CameraKind, make_camera_data, replace_array
from .projection import project_points, view_to_ndc_matrices

__all__ = ["CamerasBase", "FoVOrthographicCameras", "FoVPerspectiveCameras", "PerspectiveCameras"]

_R_DEFAULT = np.eye(3)[None]
_T_DEFAULT = np.zeros((1, 3))


class CameraParam:
    """A camera parameter: how it is given, and its attribute on the camera.

    The attribute is the Warp array of that name in the camera's
    :class:`CameraData`, read-only: write new values into the array instead
    (``cam.R.assign(...)``, which a captured graph also sees).

    Args:
        layout: the shape of one camera's value.
        differentiable: whether ``requires_grad=True`` makes its NumPy copy
            track gradients.
    """

    def __init__(self, layout: ParamLayout = ParamLayout.SCALAR, *, differentiable: bool = False):
        self.layout = layout
        self.differentiable = differentiable

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, camera: CamerasBase | None, owner: type | None = None) -> wp.array:
        if camera is None:
            return self
        return getattr(camera.data, self.name)

    def __set__(self, camera: CamerasBase, value: object) -> None:
        raise AttributeError(
            f"{self.name} is fixed when the camera is made: write new values into the "
            f"array ({self.name}.assign(...)) or make a new camera"
        )


class CamerasBase:
    """What every camera does: world -> view -> NDC, matrices, batch checks.

    Attributes shared by all cameras (Warp arrays on :attr:`device`, batch 1 or N):
        R: ``mat33`` (N,) (a (N, 3, 3) float32 view is ``R.view(float)``).
        T: ``vec3`` (N,).
        device: the Warp device of the parameters and of the projection.
    """

    #: The projection of this model.
    kind: ClassVar[CameraKind]
    # The model's parameters, in argument order (its own first, then R and T).
    _SPEC: ClassVar[dict[str, CameraParam]] = {}

    R = CameraParam(ParamLayout.MAT33, differentiable=True)
    T = CameraParam(ParamLayout.VEC3, differentiable=True)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        spec: dict[str, CameraParam] = {}
        for klass in cls.__mro__:
            for name, attr in vars(klass).items():
                if isinstance(attr, CameraParam):
                    spec.setdefault(name, attr)
        cls._SPEC = spec

    def _setup(
        self,
        values: dict[str, ArrayInput],
        *,
        device: wp.DeviceLike,
        requires_grad: bool,
        degrees: bool = True,
        in_ndc: bool = True,
    ) -> None:
        """Parses ``values`` (name -> input, for every name of ``_SPEC``) into :attr:`data`."""
        params = [ParsedParam(name, p.layout, values[name]) for name, p in self._SPEC.items()]
        self._n = broadcast_batch(params)
        self.device = resolve_device(device, params)
        self._host = {}
        arrays = {}
        for p in params:
            self._host[p.name] = np.broadcast_to(p.host, (self._n, *p.host.shape[1:]))
            arrays[p.name] = p.array if p.array is not None else self._device_copy(p, requires_grad)
        check_rotation(self._host["R"])
        self._data = make_camera_data(
            self.kind, self._n, arrays, device=self.device, degrees=degrees, in_ndc=in_ndc
        )
        # Stands in for vert_to_mesh when every vertex is seen by camera 0 (never read).
        self._no_vert_to_mesh = wp.empty(0, dtype=wp.int32, device=self.device)

    def _device_copy(self, p: ParsedParam, requires_grad: bool) -> wp.array:
        """A float32 device copy of NumPy values, broadcast to N rows."""
        h = self._host[p.name]
        if p.layout is ParamLayout.FOCAL:
            h = np.broadcast_to(h, (self._n, 2))
        return wp.array(
            np.ascontiguousarray(h, dtype=np.float32),
            dtype=p.layout.dtype,
            device=self.device,
            requires_grad=bool(requires_grad and self._SPEC[p.name].differentiable),
        )

    @property
    def data(self) -> CameraData:
        """The device-side parameters that the projection kernels read (one struct)."""
        return self._data

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
        """True if x, y are divided by depth (perspective-correct barycentrics apply)."""
        return self.kind != CameraKind.FOV_ORTHOGRAPHIC

    def in_ndc(self) -> bool:
        """True if the projection lands in NDC directly (no screen -> NDC step)."""
        return True

    def get_znear(self) -> np.ndarray | None:
        """znear (N,) as validated at construction, or None for cameras without one."""
        if "znear" not in self._SPEC:
            return None
        return np.array(self._host["znear"], dtype=np.float32)

    def requires_grad(self) -> bool:
        """True if any parameter array of this camera tracks gradients."""
        return any(getattr(self, name).requires_grad for name in self._SPEC)

    # -- matrices ------------------------------------------------------------------
    def _pose64(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3, 3) R and (N, 3) T in float64, broadcast to N (reads them back)."""
        R = self.R.numpy().reshape(-1, 3, 3).astype(np.float64)
        T = self.T.numpy().reshape(-1, 3).astype(np.float64)
        return np.broadcast_to(R, (self._n, 3, 3)), np.broadcast_to(T, (self._n, 3))

    def get_world_to_view_matrix(self) -> np.ndarray:
        """(N, 4, 4) float32: ``[x y z 1] @ M`` = view coordinates (reads R, T back)."""
        R, T = self._pose64()
        m = np.zeros((self._n, 4, 4), dtype=np.float32)
        m[:, :3, :3] = R
        m[:, 3, :3] = T
        m[:, 3, 3] = 1.0
        return m

    def get_view_to_ndc_matrix(self, image_size: ArrayInput | None = None) -> np.ndarray:
        """(N, 4, 4) float32: PyTorch3D's projection composed with its NDC camera transform.

        ``h = [x_view y_view z_view 1] @ M``; NDC x, y = ``h[0] / h[3], h[1] / h[3]``.

        Args:
            image_size: (H, W) or (N, 2); only matters for screen-space cameras
                and defaults to the camera's own.
        """
        out = wp.empty(self._n, dtype=wp.mat44, device=self.device)
        return view_to_ndc_matrices(self._data_for(image_size), out).numpy()

    def get_camera_center(self) -> np.ndarray:
        """(N, 3) float32 camera positions in world coordinates (``C @ R + T = 0``)."""
        R, T = self._pose64()
        return (-np.einsum("nj,nij->ni", T, R)).astype(np.float32)

    # -- projection ----------------------------------------------------------------
    def _data_for(self, image_size: ArrayInput | None) -> CameraData:
        """The parameters to project with for a call's ``image_size`` (unused here)."""
        return self._data

    def transform_points_ndc(
        self,
        verts: ArrayInput,
        vert_to_mesh: ArrayInput | None = None,
        image_size: ArrayInput | None = None,
        out: wp.array | None = None,
    ) -> wp.array:
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

        Raises:
            TypeError, ValueError: naming the argument, before any kernel runs.
        """
        v = as_vec3_array(verts, "verts", self.device)
        n_verts = v.shape[0]
        if vert_to_mesh is None:
            if self._n != 1:
                raise ValueError(
                    f"vert_to_mesh is required with {self._n} cameras (one camera per mesh)"
                )
            v2m = self._no_vert_to_mesh
        else:
            if isinstance(vert_to_mesh, np.ndarray) and vert_to_mesh.size:
                lo, hi = int(vert_to_mesh.min()), int(vert_to_mesh.max())
                if lo < 0 or (self._n > 1 and hi >= self._n):
                    raise ValueError(
                        f"vert_to_mesh holds values in [{lo}, {hi}], outside [0, {self._n - 1}]"
                    )
            v2m = as_index_array(vert_to_mesh, "vert_to_mesh", self.device, length=n_verts)
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
                    "gradients, and an output without a gradient array would silently stop "
                    "them (pass an out allocated with requires_grad=True, or, when a renderer "
                    "or workspace owns it, construct that with requires_grad=True)"
                )
        if n_verts == 0:
            return out
        return project_points(
            self._data_for(image_size),
            v,
            v2m,
            out,
            per_vertex_camera=vert_to_mesh is not None and self._n > 1,
        )


def _check_zfar(h: dict[str, np.ndarray]) -> None:
    """Raises ValueError unless zfar > znear for every camera."""
    if (h["zfar"] <= h["znear"]).any():
        raise ValueError(
            f"zfar must be > znear, got zfar={h['zfar'].tolist()}, znear={h['znear'].tolist()}"
        )


class FoVPerspectiveCameras(CamerasBase):
    """Perspective cameras given by a field of view (OpenGL-style frustum), as PyTorch3D's.

    The frustum is symmetric: ``max_y = tan(fov / 2) * znear``,
    ``max_x = max_y * aspect_ratio`` map to NDC +1. ``aspect_ratio`` is the *pixel*
    aspect ratio: keep 1.0 for square pixels and set the image shape in the
    rasterizer (the shorter side spans NDC [-1, 1]).

    Args:
        znear: near planes, (N,) or scalar; ``0 < znear < zfar``.
        zfar: far planes, (N,) or scalar.
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
    Warp array (used zero-copy; see the package docstring).

    Raises:
        TypeError, ValueError: naming the argument (shapes, batch sizes, devices,
            non-finite values, znear <= 0, zfar <= znear, fov out of range,
            aspect_ratio <= 0, R not a rotation).
    """

    kind = CameraKind.FOV_PERSPECTIVE
    znear = CameraParam()
    zfar = CameraParam()
    aspect_ratio = CameraParam(differentiable=True)
    fov = CameraParam(differentiable=True)

    def __init__(
        self,
        znear: ArrayInput = 1.0,
        zfar: ArrayInput = 100.0,
        aspect_ratio: ArrayInput = 1.0,
        fov: ArrayInput = 60.0,
        degrees: bool = True,
        R: ArrayInput = _R_DEFAULT,
        T: ArrayInput = _T_DEFAULT,
        device: wp.DeviceLike = None,
        *,
        requires_grad: bool = False,
    ):
        self.degrees = bool(degrees)
        values = dict(znear=znear, zfar=zfar, aspect_ratio=aspect_ratio, fov=fov, R=R, T=T)
        self._setup(values, device=device, requires_grad=requires_grad, degrees=self.degrees)
        h = self._host
        if (h["znear"] <= 0).any():
            raise ValueError(
                f"znear must be > 0 for a perspective camera, got {h['znear'].tolist()}"
            )
        _check_zfar(h)
        if (h["aspect_ratio"] <= 0).any():
            raise ValueError(f"aspect_ratio must be > 0, got {h['aspect_ratio'].tolist()}")
        top = 180.0 if self.degrees else math.pi
        if ((h["fov"] <= 0) | (h["fov"] >= top)).any():
            unit = "degrees" if self.degrees else "radians (degrees=False)"
            raise ValueError(f"fov must be in (0, {top:g}) {unit}, got {h['fov'].tolist()}")


class FoVOrthographicCameras(CamerasBase):
    """Orthographic cameras given by a view box, as PyTorch3D's.

    NDC x = ``(2 x_view / (max_x - min_x)) * scale_x - (max_x + min_x) / (max_x - min_x)``,
    y likewise; depth is the view z.

    Args:
        znear: near planes, (N,) or scalar; ``zfar > znear``.
        zfar: far planes, (N,) or scalar.
        max_y: view box top, (N,) or scalar; ``max_y != min_y``.
        min_y: view box bottom, (N,) or scalar.
        max_x: view box side mapped to NDC x = +1 (before scaling), (N,) or scalar;
            ``max_x != min_x``.
        min_x: the other side, (N,) or scalar.
        scale_xyz: (N, 3) scale of each axis (differentiable).
        R: as :class:`FoVPerspectiveCameras`.
        T: as :class:`FoVPerspectiveCameras`.
        device: as :class:`FoVPerspectiveCameras`.
        requires_grad: as :class:`FoVPerspectiveCameras` (differentiable
            parameters: R, T, scale_xyz).

    The positional order is PyTorch3D's (``znear, zfar, max_y, min_y, max_x, min_x,
    scale_xyz, R, T``); pass keywords.
    """

    kind = CameraKind.FOV_ORTHOGRAPHIC
    znear = CameraParam()
    zfar = CameraParam()
    max_y = CameraParam()
    min_y = CameraParam()
    max_x = CameraParam()
    min_x = CameraParam()
    scale_xyz = CameraParam(ParamLayout.VEC3, differentiable=True)

    def __init__(
        self,
        znear: ArrayInput = 1.0,
        zfar: ArrayInput = 100.0,
        max_y: ArrayInput = 1.0,
        min_y: ArrayInput = -1.0,
        max_x: ArrayInput = 1.0,
        min_x: ArrayInput = -1.0,
        scale_xyz: ArrayInput = ((1.0, 1.0, 1.0),),
        R: ArrayInput = _R_DEFAULT,
        T: ArrayInput = _T_DEFAULT,
        device: wp.DeviceLike = None,
        *,
        requires_grad: bool = False,
    ):
        box = dict(max_y=max_y, min_y=min_y, max_x=max_x, min_x=min_x)
        values = dict(znear=znear, zfar=zfar, **box, scale_xyz=scale_xyz, R=R, T=T)
        self._setup(values, device=device, requires_grad=requires_grad)
        h = self._host
        _check_zfar(h)
        for lo, hi in (("min_x", "max_x"), ("min_y", "max_y")):
            if (h[lo] == h[hi]).any():
                raise ValueError(
                    f"{hi} must differ from {lo}, got {h[hi].tolist()} and {h[lo].tolist()}"
                )


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
        R: as :class:`FoVPerspectiveCameras`.
        T: as :class:`FoVPerspectiveCameras`.
        device: as :class:`FoVPerspectiveCameras`.
        in_ndc: whether focal length and principal point are in NDC units.
        image_size: (H, W) or (N, 2); required when ``in_ndc=False``.
        requires_grad: as :class:`FoVPerspectiveCameras` (differentiable
            parameters: R, T, focal_length, principal_point).

    The camera has no ``znear``: :meth:`get_znear` returns None, and so the
    rasterizer's default ``z_clip_value`` is None (as PyTorch3D's).

    Attributes:
        image_size: ``vec2`` (H, W) rows given at construction, or None.
    """

    kind = CameraKind.PERSPECTIVE
    focal_length = CameraParam(ParamLayout.FOCAL, differentiable=True)
    principal_point = CameraParam(ParamLayout.VEC2, differentiable=True)

    def __init__(
        self,
        focal_length: ArrayInput = 1.0,
        principal_point: ArrayInput = ((0.0, 0.0),),
        R: ArrayInput = _R_DEFAULT,
        T: ArrayInput = _T_DEFAULT,
        device: wp.DeviceLike = None,
        in_ndc: bool = True,
        image_size: ArrayInput | None = None,
        *,
        requires_grad: bool = False,
    ):
        self._in_ndc = bool(in_ndc)
        values = dict(focal_length=focal_length, principal_point=principal_point, R=R, T=T)
        self._setup(values, device=device, requires_grad=requires_grad, in_ndc=self._in_ndc)
        if (self._host["focal_length"] == 0).any():
            raise ValueError(
                f"focal_length must be nonzero, got {self._host['focal_length'].tolist()}"
            )
        # screen-space image sizes given per call -> parameters with that image_size
        self._data_by_size: dict[tuple[float, ...], CameraData] = {}
        if image_size is None:
            if not self._in_ndc:
                raise ValueError(
                    "image_size=(H, W) is required for a screen-space camera (in_ndc=False)"
                )
            self.image_size = None
            self._image_size_host = None
            return
        self._image_size_host = self._image_size_rows(image_size, " (must be 1 or N)")
        self.image_size = wp.array(
            self._image_size_host.astype(np.float32), dtype=wp.vec2, device=self.device
        )
        if not self._in_ndc:
            self._data.image_size = self.image_size

    def _image_size_rows(self, image_size: ArrayInput, hint: str = "") -> np.ndarray:
        rows = image_size_rows(image_size)
        if rows.shape[0] not in (1, self._n):
            raise ValueError(
                f"image_size has {rows.shape[0]} rows, but there are {self._n} cameras{hint}"
            )
        return rows

    def in_ndc(self) -> bool:
        return self._in_ndc

    def get_image_size(self) -> np.ndarray | None:
        """(B, 2) float64 rows of (H, W) given at construction, or None."""
        return None if self._image_size_host is None else self._image_size_host.copy()

    def _data_for(self, image_size: ArrayInput | None) -> CameraData:
        """Screen-space cameras project with ``image_size`` when given (one device
        array per distinct size, made on its first use); NDC cameras ignore it."""
        if self._in_ndc or image_size is None:
            return self._data
        rows = self._image_size_rows(image_size)
        key = tuple(rows.ravel().tolist())
        if key not in self._data_by_size:
            array = wp.array(rows.astype(np.float32), dtype=wp.vec2, device=self.device)
            self._data_by_size[key] = replace_array(self._data, "image_size", array)
        return self._data_by_size[key]

    def _ndc_intrinsics(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, 2) NDC focal length and principal point, float64 (reads them back)."""
        f = self.focal_length.numpy().astype(np.float64)
        f = np.broadcast_to(f[:, [0, -1]], (self._n, 2))
        p = np.broadcast_to(self.principal_point.numpy().astype(np.float64), (self._n, 2))
        if self._in_ndc:
            return f, p
        scale, c0 = pixel_frame(np.broadcast_to(self._image_size_host, (self._n, 2)))
        return f / scale, -(p - c0) / scale
