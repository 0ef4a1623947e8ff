"""Shading: from fragments to pictures (interpolation, normals, textures, lights, shaders)."""

from .interpolate import interpolate_face_attributes, interpolate_vertex_attributes
from .normals import face_normals, vertex_normals
from .textures import PaddingMode, SamplingMode, TexturesUV, TexturesVertex

__all__ = [
    "PaddingMode",
    "SamplingMode",
    "TexturesUV",
    "TexturesVertex",
    "face_normals",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "vertex_normals",
]
