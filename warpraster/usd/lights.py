"""``UsdLux`` lights to the renderer's lights.

* ``DistantLight``: a directional light travelling along the light's -Z axis.
* ``SphereLight`` (and a ``radius`` 0 sphere, USD's point light): a point light
  at the light's origin (its radius is ignored: no soft shadows here).
* ``DomeLight``: ambient light of its colour (its texture is ignored).
* Other UsdLux lights (rect, disk, cylinder) are treated as point lights at
  their origin.

Strength: a light's colour is ``color * intensity * 2^exposure`` (times its
``colorTemperature`` tint is not applied). Physical units are not modelled (no
distance falloff, as PyTorch3D's lights), so all strengths are divided by the
largest non-dome strength: the brightest light has strength 1 and the others
keep their ratios. A dome light alone has strength 1 scaled by its own
intensity / the same divisor when there are other lights.

A stage without lights gets a headlight: a directional light of strength 0.85
travelling along the view direction, plus 0.15 ambient. A stage with lights but
no dome light gets 0.05 ambient, so unlit sides stay readable.
"""

from __future__ import annotations

import numpy as np
from pxr import Usd, UsdGeom, UsdLux

from .scene import LightSet, headlight

__all__ = ["headlight", "read_lights"]

AMBIENT_WITHOUT_DOME = 0.05


def _strength(light: UsdLux.LightAPI, time) -> np.ndarray:
    color = np.asarray(light.GetColorAttr().Get(time) or (1.0, 1.0, 1.0), np.float64)
    intensity = light.GetIntensityAttr().Get(time)
    exposure = light.GetExposureAttr().Get(time)
    intensity = 1.0 if intensity is None else float(intensity)
    exposure = 0.0 if exposure is None else float(exposure)
    return color * intensity * 2.0**exposure


def read_lights(stage: Usd.Stage, time) -> LightSet:
    """The stage's lights at ``time`` (a headlight when it has none). Visible lights only."""
    cache = UsdGeom.XformCache(time)
    directional, point, dome, names, dome_names = [], [], [], [], []
    it = iter(Usd.PrimRange.Stage(stage, Usd.TraverseInstanceProxies()))
    for prim in it:
        if prim.IsA(UsdGeom.Imageable):
            if UsdGeom.Imageable(prim).GetVisibilityAttr().Get(time) == UsdGeom.Tokens.invisible:
                it.PruneChildren()
                continue
        if not prim.HasAPI(UsdLux.LightAPI):
            continue
        light = UsdLux.LightAPI(prim)
        strength = _strength(light, time)
        m = np.array(cache.GetLocalToWorldTransform(prim), np.float64)
        if prim.IsA(UsdLux.DomeLight):
            dome.append(strength)
            dome_names.append(str(prim.GetPath()))
            continue
        if prim.IsA(UsdLux.DistantLight):
            d = np.array([0.0, 0.0, -1.0]) @ m[:3, :3]
            d /= max(np.linalg.norm(d), 1e-12)
            directional.append((d, strength))
        else:
            point.append((m[3, :3], strength))
        names.append(str(prim.GetPath()))
    if not names and not dome:
        return headlight()
    strengths = [s.max() for _, s in directional + point]
    scale = max(strengths) if strengths else (max(s.max() for s in dome) if dome else 1.0)
    scale = scale if scale > 0 else 1.0
    ambient = (sum(dome) / scale) if dome else np.full(3, AMBIENT_WITHOUT_DOME)

    def pack(rows):
        if not rows:
            return np.zeros((0, 2, 3), np.float32)
        return np.array([[a, s / scale] for a, s in rows], np.float32)

    return LightSet(
        directional=pack(directional),
        point=pack(point),
        ambient=np.asarray(ambient, np.float32),
        names=names + dome_names,
    )
