"""Writes the bundled default scene, ``assets/default_scene.obj``.

A torus and an icosphere that interpenetrate, in world units, centred near the
origin: enough overlap to exercise the depth queue, back faces and silhouettes.
Run from the repository root: ``python examples/make_assets.py``.
"""

from pathlib import Path

import numpy as np

from warpraster.primitives import ico_sphere, save_obj, torus


def default_scene() -> tuple[np.ndarray, np.ndarray]:
    tv, tf = torus(major_radius=1.0, minor_radius=0.35, rings=64, sides=32)
    c, s = np.cos(0.6), np.sin(0.6)
    tilt = np.array([[1, 0, 0], [0, c, -s], [0, s, c]], np.float32)
    tv = tv @ tilt.T
    sv, sf = ico_sphere(3)
    sv = sv * 0.55 + np.array([0.55, 0.25, 0.1], np.float32)
    verts = np.concatenate([tv, sv]).astype(np.float32)
    faces = np.concatenate([tf, sf + len(tv)]).astype(np.int32)
    return verts, faces


def main():
    out = Path(__file__).resolve().parents[1] / "assets" / "default_scene.obj"
    out.parent.mkdir(exist_ok=True)
    v, f = default_scene()
    save_obj(
        out, v, f, header="warpraster default scene: torus + icosphere (examples/make_assets.py)"
    )
    print(f"wrote {out} ({len(v)} vertices, {len(f)} faces)")


if __name__ == "__main__":
    main()
