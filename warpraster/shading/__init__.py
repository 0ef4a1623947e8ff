"""Shading: from fragments to pictures (interpolation, normals, textures, lights, shaders)."""

from .blending import BlendParams, hard_rgb_blend, sigmoid_alpha_blend, softmax_rgb_blend
from .corner_lists import CornerLists
from .interpolate import interpolate_face_attributes, interpolate_vertex_attributes
from .lighting import AmbientLights, DirectionalLights, LightKind, PointLights
from .materials import Materials
from .mipmap import (
    BoundaryMode,
    FilterMode,
    MipPyramid,
    TexturesUVMipmap,
    build_mipmaps,
    texture,
)
from .normals import face_normals, vertex_normals
from .reductions import hard_depth, image_mse, soft_depth, soft_silhouette
from .shaders import (
    HardFlatShader,
    HardGouraudShader,
    HardPhongShader,
    ShadingBuffers,
    SoftGouraudShader,
    SoftPhongShader,
    SoftSilhouetteShader,
)
from .textures import PaddingMode, SamplingMode, TexturesUV, TexturesVertex

__all__ = [
    "AmbientLights",
    "BlendParams",
    "BoundaryMode",
    "CornerLists",
    "DirectionalLights",
    "FilterMode",
    "HardFlatShader",
    "HardGouraudShader",
    "HardPhongShader",
    "LightKind",
    "Materials",
    "MipPyramid",
    "PaddingMode",
    "PointLights",
    "SamplingMode",
    "ShadingBuffers",
    "SoftGouraudShader",
    "SoftPhongShader",
    "SoftSilhouetteShader",
    "TexturesUV",
    "TexturesUVMipmap",
    "TexturesVertex",
    "build_mipmaps",
    "face_normals",
    "hard_depth",
    "hard_rgb_blend",
    "image_mse",
    "interpolate_face_attributes",
    "interpolate_vertex_attributes",
    "sigmoid_alpha_blend",
    "soft_depth",
    "soft_silhouette",
    "softmax_rgb_blend",
    "texture",
    "vertex_normals",
]
