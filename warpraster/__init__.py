"""warpraster: a differentiable triangle-mesh rasterizer written as NVIDIA Warp kernels.

``import warpraster`` imports Warp and NumPy only; the torch adapter
(``warpraster.torch``) and USD reader (``warpraster.usd``) are imported explicitly.
"""

from .fragments import Fragments
from .meshes import PackedMeshes, pack_meshes
from .raster import RasterWorkspace, rasterize_meshes

__version__ = "0.1.0"

__all__ = [
    "Fragments",
    "PackedMeshes",
    "RasterWorkspace",
    "pack_meshes",
    "rasterize_meshes",
]
