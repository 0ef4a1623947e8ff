"""warpraster: a differentiable triangle-mesh rasterizer written as NVIDIA Warp kernels.

``import warpraster`` imports Warp and NumPy only; the torch adapter is imported
explicitly (``import warpraster.torch``).
"""

from .camera import (
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
from .settings import RasterSettings, Tuning

__version__ = "0.1.0"

__all__ = [
    "ClipWorkspace",
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "Fragments",
    "MeshRasterizer",
    "PackedMeshes",
    "PerspectiveCameras",
    "RasterSettings",
    "RasterWorkspace",
    "RasterizationSettings",
    "Tuning",
    "cameras_from_opencv_projection",
    "look_at_view_transform",
    "opencv_from_cameras_projection",
    "pack_meshes",
    "rasterize_meshes",
]
