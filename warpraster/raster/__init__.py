"""The raster stages, one module each, in the order a render runs them:

``faces`` (triangle setup) -> ``binning`` (per-bin face lists) ->
``small_faces`` (K = 1 atomic-min pass) -> ``queue`` (per-pixel top-K) ->
``outputs`` (zbuf, bary_coords, dists). ``coverage`` holds the per-pixel face
test they share, ``stores`` the 16-byte accesses, ``workspace`` the buffers and
launch replay, ``launch`` the render call, ``clipped`` the clipped path. No
gradients here: :mod:`warpraster.backward` registers them.
"""

from .clipped import ClipWorkspace, rasterize_clipped
from .launch import rasterize_naive_at, rasterize_packed
from .workspace import CallGraph, LaunchCache, RasterWorkspace, bin_shape, default_max_faces_per_bin

__all__ = [
    "CallGraph",
    "ClipWorkspace",
    "LaunchCache",
    "RasterWorkspace",
    "default_max_faces_per_bin",
    "rasterize_clipped",
    "rasterize_naive_at",
    "rasterize_packed",
    "bin_shape",
]
