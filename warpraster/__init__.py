"""warpraster: a differentiable triangle-mesh rasterizer written as NVIDIA Warp kernels.

``import warpraster`` is light: each public name imports its module (and Warp) on
first use, so the ``warpraster`` command answers ``--help`` without loading a
kernel. The torch adapter, the USD reader, the simulation sensor and the
multi-process helpers are imported explicitly (``import warpraster.torch``,
``warpraster.usd``, ``warpraster.sim``, ``warpraster.distributed``).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, for type checkers and editors
    from . import shading
    from .antialiasing import Antialias, AntialiasTopology, antialias
    from .camera import (
        CameraData,
        CameraKind,
        FoVOrthographicCameras,
        FoVPerspectiveCameras,
        PerspectiveCameras,
        cameras_from_opencv_projection,
        look_at_view_transform,
        opencv_from_cameras_projection,
    )
    from .fragments import Fragments
    from .meshes import PackedMeshes, pack_meshes
    from .raster import ClipWorkspace, RasterWorkspace
    from .rasterize import rasterize_meshes
    from .rasterizer import MeshRasterizer, RasterizationSettings
    from .renderer import MeshRenderer, Renderer, RenderOutputs
    from .settings import RasterSettings, Tuning
    from .shading import interpolate_face_attributes, interpolate_vertex_attributes

# public name -> the module that defines it; imported on first use (PEP 562), so that
# `warpraster --help` and `import warpraster.distributed` do not compile-load every kernel
_LAZY = {
    "shading": ".shading",
    "Antialias": ".antialiasing",
    "AntialiasTopology": ".antialiasing",
    "antialias": ".antialiasing",
    **dict.fromkeys(
        [
            "CameraData",
            "CameraKind",
            "FoVOrthographicCameras",
            "FoVPerspectiveCameras",
            "PerspectiveCameras",
            "cameras_from_opencv_projection",
            "look_at_view_transform",
            "opencv_from_cameras_projection",
        ],
        ".camera",
    ),
    "Fragments": ".fragments",
    "PackedMeshes": ".meshes",
    "pack_meshes": ".meshes",
    "ClipWorkspace": ".raster",
    "RasterWorkspace": ".raster",
    "rasterize_meshes": ".rasterize",
    "MeshRasterizer": ".rasterizer",
    "RasterizationSettings": ".rasterizer",
    "MeshRenderer": ".renderer",
    "Renderer": ".renderer",
    "RenderOutputs": ".renderer",
    "RasterSettings": ".settings",
    "Tuning": ".settings",
    "interpolate_face_attributes": ".shading",
    "interpolate_vertex_attributes": ".shading",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    mod = importlib.import_module(module, __name__)
    value = mod if name == "shading" else getattr(mod, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Antialias",
    "AntialiasTopology",
    "CameraData",
    "CameraKind",
    "ClipWorkspace",
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "Fragments",
    "MeshRasterizer",
    "MeshRenderer",
    "PackedMeshes",
    "PerspectiveCameras",
    "RasterSettings",
    "RasterWorkspace",
    "RasterizationSettings",
    "RenderOutputs",
    "Renderer",
    "Tuning",
    "antialias",
    "cameras_from_opencv_projection",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "look_at_view_transform",
    "opencv_from_cameras_projection",
    "pack_meshes",
    "rasterize_meshes",
    "shading",
]
