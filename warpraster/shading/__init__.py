"""Shading: from fragments to pictures (interpolation, normals, textures, lights, shaders)."""

from .interpolate import interpolate_face_attributes, interpolate_vertex_attributes

__all__ = [
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
]
