"""warpraster: a differentiable triangle-mesh rasterizer written as NVIDIA Warp kernels.

``import warpraster`` imports Warp and NumPy only; the torch adapter, the USD
reader, the simulation sensor and the multi-process helpers are imported
explicitly (``import warpraster.torch``, ``warpraster.usd``, ``warpraster.sim``,
``warpraster.distributed``).
"""

from . import shading
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

__version__ = "0.1.0"

__all__ = [
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
    "cameras_from_opencv_projection",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "look_at_view_transform",
    "opencv_from_cameras_projection",
    "pack_meshes",
    "rasterize_meshes",
    "shading",
]
