"""The benchmark scenes, generated in code (NumPy only: ``warpraster bench --help``
lists them without starting Warp)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..primitives import ico_sphere

__all__ = ["CPU_SCENES", "GPU_SCENES", "RENDERER_TARGETS", "Scene", "make_scene"]


@dataclass
class Scene:
    """A raster suite scene: ``copies`` icospheres of ``level`` (0: the 2k-face
    body) in ``height`` x ``width`` images, ``k`` faces per pixel."""

    name: str
    level: int
    copies: int
    height: int
    width: int
    k: int
    blur: float = 0.0
    target_ms: float | None = None  # the forward target on an H200


GPU_SCENES = [
    Scene("ico5x8_512_k8", 5, 8, 512, 512, 8, target_ms=0.42),
    Scene("ico5x8_512_k1", 5, 8, 512, 512, 1, target_ms=0.33),
    Scene("ico6x8_512_k1", 6, 8, 512, 512, 1, target_ms=0.52),
    Scene("ico4x32_256_k8", 4, 32, 256, 256, 8, target_ms=0.44),
    Scene("ico7x1_1024_k1", 7, 1, 1024, 1024, 1, target_ms=0.46),
    Scene("ico8x1_1024_k1", 8, 1, 1024, 1024, 1, target_ms=1.22),
    Scene("ico5x8_1024x512_k8_blur", 5, 8, 512, 1024, 8, blur=1e-5),
    Scene("sim_2k_x64_128_k4", 0, 64, 128, 128, 4),  # level 0 marks the 2k-face mesh
]
CPU_SCENES = [
    Scene("ico4x1_256_k1", 4, 1, 256, 256, 1),
    Scene("ico4x1_256_k8", 4, 1, 256, 256, 8),
    Scene("ico5x1_256_k8", 5, 1, 256, 256, 8),
]

#: The renderer suite's scenes and the issue's anchors on one H200 (ms, forward /
#: forward + backward): nvdiffrast's whole pipeline for the K=1 mip-textured
#: scene, 40x PyTorch3D's MeshRenderer for the K=8 soft Phong one.
RENDERER_TARGETS = {
    "softphong_ico5x8_512_k8": (0.57, 1.2),
    "hardphong_mip1024_ico5x8_512_k1": (0.55, 1.6),
    # the same with the cameras' R and T trainable (camera-pose fitting): the
    # issue's bound is the scene's own + 0.1 ms for the camera's gradient
    "softphong_ico5x8_512_k8_camgrad": (0.57, 1.3),
    "hardphong_mip1024_ico5x8_512_k1_camgrad": (0.55, 1.7),
    # K = 1 + antialias, against nvdiffrast's rasterize + interpolate + texture +
    # antialias (the antialias issue's bound: half of it, measured in the same run)
    "hardphong_mip1024_ico5x8_512_k1_aa": (None, None),
}


def make_scene(scene: Scene, seed: int = 0):
    """Packed NDC vertices / faces / offsets / counts of a raster suite scene."""
    rng = np.random.default_rng(seed)
    if scene.level == 0:
        v, f = ico_sphere(3)  # 1280 faces ...
        v2, f2 = ico_sphere(2)  # ... + 320 + 320 + 80 = 2000 faces: a "2k-face" body
        v3, f3 = ico_sphere(1)
        parts = [(v, f), (v2 * 0.5 + [0.3, 0.2, -0.2], f2), (v2 * 0.4 - [0.3, 0.3, 0.1], f2)]
        parts.append((v3 * 0.3 + [0.0, -0.4, 0.3], f3))
        vs, fs, off = [], [], 0
        for pv, pf in parts:
            vs.append(pv)
            fs.append(pf + off)
            off += len(pv)
        v, f = np.concatenate(vs).astype(np.float32), np.concatenate(fs).astype(np.int32)
    else:
        v, f = ico_sphere(scene.level)
    verts, faces = [], []
    for i in range(scene.copies):
        shift = rng.uniform(-0.15, 0.15, 3) + np.array([0.0, 0.0, 2.0])
        verts.append(v * 0.8 + shift)
        faces.append(f + i * len(v))
    nf = len(f)
    first = np.arange(scene.copies, dtype=np.int32) * nf
    count = np.full(scene.copies, nf, np.int32)
    return (
        np.concatenate(verts).astype(np.float32),
        np.concatenate(faces).astype(np.int32),
        first,
        count,
    )
