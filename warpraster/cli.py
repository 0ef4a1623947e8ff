"""The ``warpraster`` command: render a mesh file to images, or run the benchmark.

``warpraster render [MESH.obj] --out DIR`` rasterizes the mesh through a
perspective camera looking at it and writes ``depth.png``, ``faces.png`` (face
ids in hashed colours) and ``shaded.png`` (Lambert shading from face normals),
plus ``fragments.npz`` with the raw outputs. With no mesh it renders the bundled
default scene, ``assets/default_scene.obj``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "assets" / "default_scene.obj"


def _hash_colours(ids: np.ndarray) -> np.ndarray:
    """A stable, well-spread RGB colour per face id; black for -1."""
    x = (ids.astype(np.int64) + 1) * 2654435761 % (2**32)
    rgb = np.stack([(x >> 16) & 255, (x >> 8) & 255, x & 255], -1).astype(np.uint8)
    rgb = rgb // 2 + 96
    rgb[ids < 0] = 0
    return rgb


def render_images(
    verts: np.ndarray,
    faces: np.ndarray,
    *,
    image_size=(384, 512),
    faces_per_pixel: int = 1,
    dist: float = 3.2,
    elev: float = 25.0,
    azim: float = 30.0,
    fov: float = 50.0,
    device: str | None = None,
) -> dict[str, np.ndarray]:
    """Rasterizes one world-space mesh through a look-at perspective camera.

    Returns the fragments as NumPy arrays plus ``depth``, ``faces`` and ``shaded``
    images (uint8, (H, W) or (H, W, 3)).
    """
    import warp as wp

    from .camera import FoVPerspectiveCameras, look_at_view_transform
    from .rasterizer import MeshRasterizer, RasterizationSettings

    wp.init()
    h, w = image_size
    R, T = look_at_view_transform(dist=dist, elev=elev, azim=azim)
    cameras = FoVPerspectiveCameras(R=R, T=T, fov=fov, aspect_ratio=1.0, device=device)
    settings = RasterizationSettings(image_size=(h, w), faces_per_pixel=faces_per_pixel)
    rasterizer = MeshRasterizer(cameras=cameras, raster_settings=settings)
    v = wp.array(verts, dtype=wp.vec3, device=device)
    f = wp.array(faces, dtype=wp.int32, device=device)
    frags = rasterizer(v, f, np.array([0], np.int32), np.array([len(faces)], np.int32))
    out = frags.numpy()
    p2f = out["pix_to_face"][0, ..., 0]
    z = out["zbuf"][0, ..., 0]
    hit = p2f >= 0
    depth = np.zeros((h, w), np.uint8)
    if hit.any():
        lo, hi = z[hit].min(), z[hit].max()
        depth[hit] = (255 - 200 * (z[hit] - lo) / max(hi - lo, 1e-9)).astype(np.uint8)
    tri = verts[faces]
    normals = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)
    eye = -np.asarray(T, np.float64)[0] @ np.asarray(R, np.float64)[0].T  # camera centre
    light = eye / np.linalg.norm(eye)
    lam = np.abs(normals @ light)
    base = np.array([0.85, 0.55, 0.3])
    shaded = np.zeros((h, w, 3), np.uint8)
    shaded[hit] = (255 * np.clip(0.15 + 0.85 * lam[p2f[hit], None] * base, 0, 1)).astype(np.uint8)
    out.update(depth=depth, faces=_hash_colours(p2f), shaded=shaded)
    return out


def _cmd_render(args) -> int:
    from .primitives import load_obj

    path = Path(args.mesh) if args.mesh else DEFAULT_SCENE
    if not path.is_file():
        print(f"error: no mesh file {path}", file=sys.stderr)
        return 2
    verts, faces = load_obj(path)
    t0 = time.perf_counter()
    out = render_images(
        verts,
        faces,
        image_size=(args.height, args.width),
        faces_per_pixel=args.faces_per_pixel,
        dist=args.dist,
        elev=args.elev,
        azim=args.azim,
        device=args.device,
    )
    dt = time.perf_counter() - t0
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    for key in ("depth", "faces", "shaded"):
        Image.fromarray(out[key]).save(dest / f"{key}.png")
    np.savez_compressed(
        dest / "fragments.npz",
        **{k: out[k] for k in ("pix_to_face", "zbuf", "bary_coords", "dists")},
    )
    covered = int((out["pix_to_face"][..., 0] >= 0).sum())
    print(
        f"rendered {path.name}: {len(faces)} faces, {args.height}x{args.width}, "
        f"{covered} pixels covered, {dt:.2f} s (first call includes kernel compilation)"
    )
    print(f"wrote {dest / 'depth.png'}, {dest / 'faces.png'}, {dest / 'shaded.png'}, fragments.npz")
    return 0


def _cmd_bench(args) -> int:
    from . import bench

    return bench.main(args.bench_args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="warpraster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render a mesh (OBJ) to depth / face-id / shaded PNGs")
    r.add_argument("mesh", nargs="?", help=f"OBJ file (default: {DEFAULT_SCENE.name})")
    r.add_argument("--out", default="out", help="output folder (default: out)")
    r.add_argument("--height", type=int, default=384)
    r.add_argument("--width", type=int, default=512)
    r.add_argument("--faces-per-pixel", type=int, default=1)
    r.add_argument("--dist", type=float, default=3.2, help="camera distance")
    r.add_argument("--elev", type=float, default=25.0, help="camera elevation, degrees")
    r.add_argument("--azim", type=float, default=30.0, help="camera azimuth, degrees")
    r.add_argument("--device", default=None, help="Warp device (default: Warp's default)")
    r.set_defaults(func=_cmd_render)
    b = sub.add_parser("bench", help="run the benchmark (python -m warpraster.bench --help)")
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
