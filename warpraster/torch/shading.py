"""PyTorch3D-shaped rendering on tensors (a compatibility module).

The classes live in :mod:`warpraster.torch.cameras`, :mod:`.lighting`,
:mod:`.textures` and :mod:`.renderer` (the custom op in :mod:`.render_op`), and
are all exported by :mod:`warpraster.torch`; ``from warpraster.torch.shading
import X`` keeps working for every name below.
"""

from ..rasterizer import RasterizationSettings
from .cameras import (
    FoVOrthographicCameras,
    FoVPerspectiveCameras,
    PerspectiveCameras,
    camera_position_from_spherical_angles,
    look_at_rotation,
    look_at_view_transform,
)
from .lighting import AmbientLights, BlendParams, DirectionalLights, Materials, PointLights
from .renderer import (
    Fragments,
    HardFlatShader,
    HardGouraudShader,
    HardPhongShader,
    MeshRasterizer,
    MeshRenderer,
    MeshRendererWithFragments,
    SoftGouraudShader,
    SoftPhongShader,
    SoftSilhouetteShader,
)
from .textures import TexturesUV, TexturesUVMipmap, TexturesVertex

__all__ = [
    "AmbientLights",
    "BlendParams",
    "DirectionalLights",
    "FoVOrthographicCameras",
    "FoVPerspectiveCameras",
    "Fragments",
    "HardFlatShader",
    "HardGouraudShader",
    "HardPhongShader",
    "Materials",
    "MeshRasterizer",
    "MeshRenderer",
    "MeshRendererWithFragments",
    "PerspectiveCameras",
    "PointLights",
    "RasterizationSettings",
    "SoftGouraudShader",
    "SoftPhongShader",
    "SoftSilhouetteShader",
    "TexturesUV",
    "TexturesUVMipmap",
    "TexturesVertex",
    "camera_position_from_spherical_angles",
    "look_at_rotation",
    "look_at_view_transform",
]
