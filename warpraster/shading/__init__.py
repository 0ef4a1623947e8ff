"""Shading: from fragments to pictures (interpolation, normals, textures, lights, shaders)."""

from .interpolate import interpolate_face_attributes, interpolate_vertex_attributes
from .mipmap import (
    BoundaryMode,
    FilterMode,
    MipPyramid,
    TexturesUVMipmap,
    build_mipmaps,
    texture,
)
from .normals import face_normals, vertex_normals
from .textures import PaddingMode, SamplingMode, TexturesUV, TexturesVertex

__all__ = [
    "BoundaryMode",
    "FilterMode",
    "MipPyramid",
    "PaddingMode",
    "SamplingMode",
    "TexturesUV",
    "TexturesUVMipmap",
    "TexturesVertex",
    "build_mipmaps",
    "face_normals",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "texture",
    "vertex_normals",
]
