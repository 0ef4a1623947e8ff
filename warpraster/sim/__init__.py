"""Differentiable camera sensor for Warp simulations (import explicitly: ``import warpraster.sim``).

:class:`CameraSensor` renders W worlds x C cameras per call into Newton's
``(world, camera, H, W)`` layout, on a ``wp.Tape`` and inside captured graphs.
The Newton adapter is :mod:`warpraster.sim.newton` (needs ``newton``; never
imported by ``import warpraster`` or ``import warpraster.sim``).
"""

from .geometry import SensorGeometry, VertexSource
from .loss import frame_loss, image_loss
from .multi import MultiDeviceSensor
from .scene_geometry import add_scene, stage_camera
from .sensor import CameraSensor, SensorFrame, look_at_transform
from .tessellate import (
    box_mesh,
    capsule_mesh,
    cylinder_mesh,
    grid_mesh,
    plane_mesh,
    sphere_mesh,
)

__all__ = [
    "CameraSensor",
    "MultiDeviceSensor",
    "SensorFrame",
    "SensorGeometry",
    "VertexSource",
    "add_scene",
    "box_mesh",
    "capsule_mesh",
    "cylinder_mesh",
    "grid_mesh",
    "frame_loss",
    "image_loss",
    "look_at_transform",
    "plane_mesh",
    "sphere_mesh",
    "stage_camera",
]
