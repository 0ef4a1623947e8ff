"""USD scenes in, images out: ``import warpraster.usd`` (needs ``usd-core``).

Reading (pxr): :func:`load_stage` gives a :class:`Scene` (packed world-space
meshes, materials, cameras, lights, frame range) from a file or a ``Usd.Stage``;
:class:`StageAnimation` re-evaluates time-sampled points and transforms into
the same device buffers. Rendering (no pxr): :class:`StageRenderer` draws a
scene to RGBA colour, depth and id images through a USD camera.

Loading is vectorised over whole arrays (one triangulation pass and one
normals pass for the whole stage; Python loops only per prim, never per face or
vertex). Measured with usd-core 26.11 on a shared 2-core machine: a generated
``.usdc`` stage of 1,000 meshes of 1,000 quads each (2,000,000 triangles,
1,066,000 points) loads in 3.3-3.6 s of CPU time (5.1-11.5 s wall, the machine
at load average 5-10).

The containers and the renderer do not import pxr, so
``warpraster.usd.scene`` and ``warpraster.usd.render`` also serve scenes read
from other formats; the names that need pxr are imported on first use.
"""

from __future__ import annotations

import importlib

from .errors import SceneError, SceneWarning

# the pxr-free containers: every public name of .scene (listed once, in its __all__)
from .scene import *  # noqa: F403
from .scene import __all__ as _containers

_LAZY = {
    "load_stage": "load",
    "read_cameras": "load",
    "read_render_settings": "load",
    "open_stage": "stage",
    "StageAnimation": "animation",
    "StageRenderer": "render",
    "RenderOutput": "render",
    "raster_camera": "cameras",
    "default_camera": "cameras",
    "opencv_from_usd_camera": "cameras",
    "read_camera": "cameras",
    "read_lights": "lights",
    "linear_to_srgb": "render",
    "parse_frames": "animation",
    "triangulate": "triangulate",
    "collecting_diagnostics": "diagnostics",
    "composition_problems": "diagnostics",
}

__all__ = [*_containers, "SceneError", "SceneWarning", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
