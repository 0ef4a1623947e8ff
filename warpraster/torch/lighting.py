"""PyTorch3D's lights, materials and blend parameters on tensors."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from .. import shading as _shading
from .cameras import _f32, _Holder

__all__ = ["AmbientLights", "BlendParams", "DirectionalLights", "Materials", "PointLights"]


class _Mirror(_Holder):
    """A holder that takes the arguments of the Warp class it mirrors (``_warp`` in
    :mod:`warpraster.shading`): the same names in the same order (positional too,
    as PyTorch3D's) with the same defaults, then ``device`` (a torch device).
    Colours, locations and directions become float32 (B, 3) rows; the names in
    ``_scalars`` (B,) values."""

    _scalars: tuple[str, ...] = ()
    _warp = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        warp_args = inspect.signature(getattr(_shading, cls._warp)).parameters.values()
        own = [p for p in warp_args if p.name not in ("device", "requires_grad", "validate")]
        cls._names = tuple(p.name for p in own)
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        cls.__signature__ = inspect.Signature(
            [p.replace(kind=kind) for p in own] + [inspect.Parameter("device", kind, default=None)]
        )

    def __init__(self, *args, **kwargs):
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        device = values.pop("device")
        for name, v in values.items():
            t = _f32(v, device).reshape(-1) if name in self._scalars else _f32(v, device, 3)
            setattr(self, name, t)
        # the values checked once, here, as the Warp class checks them (host copies):
        # the op then builds its Warp objects per call without reading them back
        host = {n: getattr(self, n).detach().cpu().numpy() for n in values}
        getattr(_shading, self._warp)(**host, device="cpu")


class PointLights(_Mirror):
    """PyTorch3D's ``PointLights`` on tensors (arguments of
    :class:`warpraster.shading.PointLights`)."""

    _warp = "PointLights"


class DirectionalLights(_Mirror):
    """PyTorch3D's ``DirectionalLights`` on tensors (arguments of
    :class:`warpraster.shading.DirectionalLights`)."""

    _warp = "DirectionalLights"


class AmbientLights(_Holder):
    """PyTorch3D's ``AmbientLights`` on tensors."""

    _names = ("ambient_color",)
    _warp = "AmbientLights"

    def __init__(self, *, ambient_color=None, device=None):
        self.ambient_color = _f32(
            ((1.0, 1.0, 1.0),) if ambient_color is None else ambient_color, device, 3
        )


class Materials(_Mirror):
    """PyTorch3D's ``Materials`` on tensors (arguments of
    :class:`warpraster.shading.Materials`)."""

    _warp = "Materials"
    _scalars = ("shininess",)


@dataclass
class BlendParams:
    """PyTorch3D's ``BlendParams``; ``background_color`` may be a tensor (gets a gradient)."""

    sigma: float = 1e-4
    gamma: float = 1e-4
    background_color: object = (1.0, 1.0, 1.0)


LIGHTS = (PointLights, DirectionalLights, AmbientLights)
