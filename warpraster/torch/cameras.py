"""PyTorch3D's cameras on tensors, its look-at helpers, and per-call camera overrides.

The camera classes hold their parameters as float32 tensors (gradients reach any
that require grad through the render op); :meth:`_Camera.overridden` gives the
camera of one call with PyTorch3D's per-call keywords (``R=``, ``T=``, the
projection's ``znear=``, ``fov=``, ...) applied, without changing the object.
:func:`look_at_view_transform`, :func:`look_at_rotation` and
:func:`camera_position_from_spherical_angles` are PyTorch3D's, in torch (so they
are differentiable, e.g. with respect to a camera position being fitted).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

__all__ = [
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "PerspectiveCameras",
    "camera_position_from_spherical_angles",
    "look_at_rotation",
    "look_at_view_transform",
]


def _f32(x, device=None, width: int | None = None) -> torch.Tensor:
    """A float32 contiguous tensor (rows of ``width`` when given; a row is broadcast as (1, w))."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)
    elif device is not None and x.device != device:
        x = x.to(device)
    t = x if x.dtype == torch.float32 else x.to(torch.float32)
    if width is not None and t.ndim == 1 and t.shape[0] == width:
        t = t.reshape(1, width)
    return t if t.is_contiguous() else t.contiguous()


class _Holder:
    """Named float32 tensors (the differentiable inputs) plus static options."""

    _names: tuple[str, ...] = ()

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in self._names}

    def to(self, device):
        for n in self._names:
            setattr(self, n, getattr(self, n).to(device))
        return self

    @property
    def device(self) -> torch.device:
        return getattr(self, self._names[0]).device


class _Camera(_Holder):
    """A camera: ``_names`` its tensors; ``_widths`` how a value of each becomes rows
    (a width: (B, width) rows; 0: (B,) values; -1: (B, 3, 3) matrices; -2: (B, 1))."""

    _widths: dict[str, int] = {}
    _warp = ""

    def _convert(self, name: str, value, device) -> torch.Tensor:
        width = self._widths.get(name, 0)
        if width == -1:
            return _f32(value, device).reshape(-1, 3, 3)
        if width == -2:
            t = _f32(value, device)
            return t.reshape(-1, 1) if t.ndim <= 1 else t
        if width == 0:
            return _f32(value, device).reshape(-1)
        return _f32(value, device, width)

    def _set(self, device, **values) -> None:
        for name, value in values.items():
            setattr(self, name, self._convert(name, value, device))

    def _set_pose(self, R, T, device) -> None:
        """PyTorch3D's R (N, 3, 3), default identity, and T (N, 3), default zero."""
        self._set(
            device,
            R=torch.eye(3)[None] if R is None else R,
            T=torch.zeros(1, 3) if T is None else T,
        )

    def call_keywords(self) -> tuple[str, ...]:
        """The keywords a call may override (PyTorch3D's camera reads them from the
        rasterizer's kwargs): its tensors, and ``degrees`` for FoV perspective cameras."""
        return self._names

    def overridden(self, values: dict) -> _Camera:
        """A copy with ``values`` (a subset of :meth:`call_keywords`) replacing its own,
        converted as the constructor converts them (on this camera's device)."""
        new = copy.copy(self)
        for name, value in values.items():
            if name == "degrees":
                new.degrees = bool(value)
            else:
                setattr(new, name, self._convert(name, value, self.device))
        return new

    def is_perspective(self) -> bool:
        return True

    def _warp_kwargs(self) -> dict:
        return {}


class FoVPerspectiveCameras(_Camera):
    """PyTorch3D's ``FoVPerspectiveCameras`` on tensors (fov in degrees by default)."""

    _names = ("znear", "zfar", "aspect_ratio", "fov", "R", "T")
    _widths = {"R": -1, "T": 3}
    _warp = "FoVPerspectiveCameras"

    def __init__(self, znear=1.0, zfar=100.0, aspect_ratio=1.0, fov=60.0, degrees=True,
                 R=None, T=None, K=None, device=None):  # fmt: skip
        if K is not None:
            raise TypeError("FoVPerspectiveCameras: K (a projection matrix) is not supported")
        self.degrees = bool(degrees)
        self._set(device, znear=znear, zfar=zfar, aspect_ratio=aspect_ratio, fov=fov)
        self._set_pose(R, T, device)

    def call_keywords(self) -> tuple[str, ...]:
        return (*self._names, "degrees")

    def _warp_kwargs(self):
        return {"degrees": self.degrees}


class FoVOrthographicCameras(_Camera):
    """PyTorch3D's ``FoVOrthographicCameras`` on tensors."""

    _names = ("znear", "zfar", "max_y", "min_y", "max_x", "min_x", "scale_xyz", "R", "T")
    _widths = {"R": -1, "T": 3, "scale_xyz": 3}
    _warp = "FoVOrthographicCameras"

    def __init__(self, znear=1.0, zfar=100.0, max_y=1.0, min_y=-1.0, max_x=1.0, min_x=-1.0,
                 scale_xyz=((1.0, 1.0, 1.0),), R=None, T=None, K=None, device=None):  # fmt: skip
        if K is not None:
            raise TypeError("FoVOrthographicCameras: K (a projection matrix) is not supported")
        self._set(device, znear=znear, zfar=zfar, max_y=max_y, min_y=min_y, max_x=max_x,
                  min_x=min_x, scale_xyz=scale_xyz)  # fmt: skip
        self._set_pose(R, T, device)

    def is_perspective(self) -> bool:
        return False


class PerspectiveCameras(_Camera):
    """PyTorch3D's ``PerspectiveCameras`` on tensors (NDC or screen space)."""

    _names = ("focal_length", "principal_point", "R", "T")
    _widths = {"R": -1, "T": 3, "principal_point": 2, "focal_length": -2}
    _warp = "PerspectiveCameras"

    def __init__(self, focal_length=1.0, principal_point=((0.0, 0.0),), R=None, T=None,
                 K=None, device=None, in_ndc=True, image_size=None):  # fmt: skip
        if K is not None:
            raise TypeError("PerspectiveCameras: K (a projection matrix) is not supported")
        self._set(device, focal_length=focal_length, principal_point=principal_point)
        self._set_pose(R, T, device)
        self.in_ndc = bool(in_ndc)
        self.image_size = None if image_size is None else np.asarray(image_size).tolist()

    def _warp_kwargs(self):
        return {"in_ndc": self.in_ndc, "image_size": self.image_size}


# ----------------------------------------------------------------------------- look-at
def _rows(x, device, width: int | None) -> torch.Tensor:
    """``x`` as float32 rows: (B, width) vectors, or (B,) scalars when ``width`` is None."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x, dtype=np.float32))
    t = t.to(device=device, dtype=torch.float32)
    if width is None:
        return t.reshape(-1)
    return t.reshape(-1, width)


def _broadcast(*ts: torch.Tensor) -> list[torch.Tensor]:
    n = max(t.shape[0] for t in ts)
    bad = [t.shape[0] for t in ts if t.shape[0] not in (1, n)]
    if bad:
        raise ValueError(f"batch sizes {[t.shape[0] for t in ts]} do not broadcast")
    return [t.expand(n, *t.shape[1:]) for t in ts]


def camera_position_from_spherical_angles(distance, elevation, azimuth, degrees: bool = True,
                                          device="cpu") -> torch.Tensor:  # fmt: skip
    """PyTorch3D's: (N, 3) camera positions at ``distance`` from the origin,
    ``elevation`` above the xz-plane, ``azimuth`` from +z towards +x."""
    d, e, a = _broadcast(*(_rows(x, device, None) for x in (distance, elevation, azimuth)))
    if degrees:
        e, a = e * (math.pi / 180.0), a * (math.pi / 180.0)
    return torch.stack([d * torch.cos(e) * torch.sin(a), d * torch.sin(e),
                        d * torch.cos(e) * torch.cos(a)], dim=1)  # fmt: skip


def _unit(v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(v, dim=1, eps=1e-5)


def look_at_rotation(camera_position, at=((0, 0, 0),), up=((0, 1, 0),),
                     device="cpu") -> torch.Tensor:  # fmt: skip
    """PyTorch3D's: (N, 3, 3) world -> view rotations of cameras at ``camera_position``
    looking at ``at`` (columns x = up x z, y = z x x, z towards ``at``); where up is
    (nearly) parallel to the view direction x is recomputed from y, as PyTorch3D does.
    Differentiable with respect to every tensor argument."""
    if isinstance(camera_position, torch.Tensor):
        device = camera_position.device
    c, a, u = _broadcast(*(_rows(x, device, 3) for x in (camera_position, at, up)))
    z = _unit(a - c)
    x = _unit(torch.cross(u, z, dim=1))
    y = _unit(torch.cross(z, x, dim=1))
    close = (x.abs() <= 5e-3).all(dim=1, keepdim=True)
    if bool(close.any()):
        x = torch.where(close, _unit(torch.cross(y, z, dim=1)), x)
    return torch.stack([x, y, z], dim=2)


def look_at_view_transform(dist=1.0, elev=0.0, azim=0.0, degrees: bool = True, eye=None,
                           at=((0, 0, 0),), up=((0, 1, 0),), device="cpu"):  # fmt: skip
    """PyTorch3D's: ``(R, T)`` (N, 3, 3) and (N, 3) of cameras at ``eye`` (or at
    ``dist``, ``elev``, ``azim`` around ``at``) looking at ``at``."""
    if eye is not None:
        c, a, u = _broadcast(*(_rows(x, device, 3) for x in (eye, at, up)))
    else:
        d, e, z, a, u = _broadcast(
            *(_rows(x, device, None) for x in (dist, elev, azim)),
            *(_rows(x, device, 3) for x in (at, up)),
        )
        c = camera_position_from_spherical_angles(d, e, z, degrees=degrees, device=device) + a
    R = look_at_rotation(c, a, u, device=device)
    T = -torch.bmm(R.transpose(1, 2), c[:, :, None])[:, :, 0]
    return R, T
