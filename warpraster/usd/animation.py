"""Time-sampled points, transforms, cameras and lights, frame by frame.

Topology, primvars and materials are read once (at the load time);
:meth:`StageAnimation.evaluate` re-reads only the meshes whose points, normals
or a transform above them may vary, writing into the scene's host arrays in
place, and :meth:`StageAnimation.frame` hands the new frame to a
:class:`~warpraster.usd.render.StageRenderer`, which writes it into the same
device buffers (``wp.array.assign``; no reallocation per frame).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import SceneError
from .lights import read_lights
from .load import read_cameras
from .scene import CameraParams, Scene
from .stage import time_code

__all__ = ["StageAnimation", "parse_frames"]


def parse_frames(spec: str | None, frame_range) -> list[float]:
    """Time codes of ``"A:B"`` (inclusive, step 1), ``"A:B:STEP"`` or ``"A"``.

    None gives every frame of ``frame_range`` (or ``[None]``-like ``[]`` for a
    static stage, meaning the default time).
    """
    if spec is None:
        if frame_range is None:
            return []
        a, b = frame_range
        return [a + i for i in range(int(math.floor(b - a + 1e-9)) + 1)]
    parts = spec.split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--frames must be A, A:B or A:B:STEP (numbers), got {spec!r}") from None
    if len(nums) == 1:
        return nums
    if len(nums) not in (2, 3):
        raise ValueError(f"--frames must be A, A:B or A:B:STEP, got {spec!r}")
    a, b = nums[0], nums[1]
    step = nums[2] if len(nums) == 3 else 1.0
    if step <= 0 or b < a:
        raise ValueError(f"--frames needs A <= B and STEP > 0, got {spec!r}")
    n = int(math.floor((b - a) / step + 1e-9)) + 1
    return [a + i * step for i in range(n)]


class StageAnimation:
    """Evaluates a loaded USD scene at other times, in place.

    Args:
        scene: a scene from :func:`warpraster.usd.load_stage` (it keeps its stage).
    """

    def __init__(self, scene: Scene):
        if not hasattr(scene, "mesh_set"):
            raise TypeError("scene must come from warpraster.usd.load_stage (it has no stage)")
        self.scene = scene

    @property
    def dynamic_meshes(self) -> list[str]:
        """Paths of the meshes re-read per frame."""
        ms = self.scene.mesh_set
        return [it.path for it, d in zip(ms.items, ms.dynamic, strict=True) if d]

    def evaluate(self, time) -> Scene:
        """Updates ``scene.meshes`` (in place), cameras and lights to ``time``."""
        t = time_code(time)
        self.scene.mesh_set.evaluate(t, out=self.scene.meshes)
        self.scene.cameras = read_cameras(self.scene.stage, t)
        self.scene.lights = read_lights(self.scene.stage, t)
        self.scene.time = None if time is None else float(time)
        return self.scene

    def frame(self, renderer, time, camera: str | CameraParams | None = None):
        """Evaluates ``time`` and writes it into ``renderer``'s buffers; returns the camera used."""
        self.evaluate(time)
        if isinstance(camera, CameraParams):
            cam = camera
        elif camera is None and renderer.camera.name not in self.scene.cameras:
            cam = renderer.camera  # a default camera stays where it is
        else:
            name = camera if camera is not None else renderer.camera.name
            if name not in self.scene.cameras:
                raise SceneError(name, "not a camera at this time")
            cam = self.scene.cameras[name]
        renderer.set_frame(self.scene.meshes, cam, self.scene.lights)
        return cam

    def positions(self, time) -> np.ndarray:
        """(V, 3) float32 world positions at ``time`` (a copy)."""
        return self.evaluate(time).meshes.verts.copy()
