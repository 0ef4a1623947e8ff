"""The ``warpraster`` command: render a USD scene to images, describe a scene, run the benchmark.

``warpraster render [SCENE] --out DIR`` renders every frame of a USD stage
(``.usd``, ``.usda``, ``.usdc``, ``.usdz``; an ``.obj`` mesh works too) through
one of its cameras (or a default camera framing it) and writes one RGBA colour
PNG per frame, ``color.<frame>.png`` (alpha = coverage), plus depth, id images
and raw fragments on request. With no scene it renders the bundled scene.
``warpraster info SCENE`` lists meshes, materials, cameras, lights and the
frame range. ``warpraster bench --suite raster|renderer|sensor|usd ...`` runs the
benchmark (``warpraster bench --help``; the :mod:`warpraster.bench` package).

Start-up: this module imports no Warp kernel and no pxr; the arguments are
parsed (and ``--help``, ``--version`` and argument errors answered) before the
command imports what it needs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np

from . import __version__
from .cli_files import CliError, _check_out_dir, _make_out_dir, _openexr, _os_reason
from .distributed import device_for_rank, rank_info, shard_frames
from .usd.errors import SceneError, SceneWarning

USD_SUFFIXES = (".usd", ".usda", ".usdc", ".usdz")
MESH_SUFFIXES = (".obj",)
DEFAULT_SCENE_NAME = "default_scene.usda"
DEFAULT_WIDTH = 640

_RENDER_EPILOG = """\
outputs (in --out; frame = the time code as 4 digits, e.g. color.0001.png, 0000 for a
stage without a frame range):
  color.<frame>.png    RGBA, 8-bit sRGB colour, alpha = coverage (straight alpha)
  depth.<frame>.png    with --depth: 16-bit, 0 = empty, v in 1..65535 maps linearly to
                       view depth between the frame's nearest and farthest hit, which the
                       PNG's text chunk "warpraster:depth_range" holds; depth.<frame>.exr
                       (float32 view depth, inf = empty) when the openexr package is installed
  face_id.<frame>.png  with --ids: id + 1 as 24-bit RGB (R + 256 G + 65536 B; 0 = empty),
  mesh_id.<frame>.png  face ids index the packed triangles, mesh ids the meshes in `info` order
  fragments.<frame>.npz  with --fragments: pix_to_face, zbuf, bary_coords, dists (K = 1)
Files are written under a temporary name and renamed when complete, on worker threads
while the next frames render.

exit codes: 0 done, 1 the scene cannot be read or rendered or a file cannot be written,
2 bad arguments (an --out that cannot be a writable folder included), 130 interrupted
"""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), exit code 2."""

    def error(self, message):
        if message.endswith("required: cmd"):  # no command given: name them
            message += " (a command: render, info or bench)"
        raise CliError(f"{self.prog}: {message} (see {self.prog} --help)", 2)


# --------------------------------------------------------------------------- set-up
def default_scene_path() -> Path:
    """The bundled USD scene (package data, so it works from any folder after install)."""
    return Path(str(resources.files("warpraster") / "assets" / DEFAULT_SCENE_NAME))


@contextlib.contextmanager
def _stderr_silenced(active: bool):
    """Silences file descriptor 2 (native Warp start-up notices) while active."""
    if not active:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def init_warp(verbose: bool = False):
    """Imports and starts Warp; returns the ``warp`` module.

    Quiet unless ``verbose``: no banner, no module-load lines, no native start-up
    notice (e.g. "Could not find or load the NVIDIA CUDA driver" on a machine
    without a GPU). The command and the examples start Warp through this.
    """
    import warp as wp

    if not verbose:
        wp.config.quiet = True
        wp.config.log_level = wp.LOG_WARNING
    with _stderr_silenced(not verbose):
        wp.init()
    return wp


def _device(wp, name: str | None):
    if name is None:
        return wp.get_device()
    try:
        dev = wp.get_device(name)
    except Exception:  # Warp raises ValueError / RuntimeError depending on the name
        dev = None
    if dev is None:
        have = ", ".join(str(d) for d in wp.get_devices())
        raise CliError(f"--device {name}: not available on this machine (Warp sees: {have})", 2)
    return dev


def _parse_size(text: str) -> tuple[int, int]:
    """``WxH`` -> (H, W)."""
    parts = text.lower().split("x")
    try:
        w, h = (int(p) for p in parts)
    except ValueError:
        raise CliError(f"--size must be WxH with two whole numbers, got {text!r}", 2) from None
    if w < 1 or h < 1:
        raise CliError(f"--size must be at least 1x1, got {text!r}", 2)
    return h, w


def _image_size(args, aspect: float, resolution=None) -> tuple[int, int]:
    """(H, W) from --size / --width / --height, else the render settings' ``(W, H)``
    ``resolution``, else 640 wide at the camera's aspect."""
    for flag in ("width", "height"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise CliError(f"--{flag} must be >= 1, got {v}", 2)
    if args.size is not None:
        h, w = _parse_size(args.size)
    else:
        w = args.width if args.width is not None else None
        h = args.height
        if w is None and h is None and resolution is not None:
            w, h = (max(1, int(x)) for x in resolution)
        if w is None and h is None:
            w = DEFAULT_WIDTH
        if w is None:
            w = max(1, round(h * aspect))
        if h is None:
            h = max(1, round(w / aspect))
    if h * w > 64_000_000:
        raise CliError(f"image of {w}x{h} pixels is too large (at most 64 megapixels)", 2)
    return h, w


# --------------------------------------------------------------------------- reading
def _read_obj(path: Path):
    """Vertices and fan-triangulated faces of an OBJ file, with one-line errors."""
    raw = path.read_bytes()
    if b"\x00" in raw[:65536]:
        raise CliError(f"{path}: not a text OBJ file (binary data)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text OBJ file (not UTF-8)") from None
    verts, faces = [], []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        try:
            if parts[0] == "v":
                verts.append([float(x) for x in parts[1:4]])
                if len(verts[-1]) != 3:
                    raise ValueError
            elif parts[0] == "f":
                idx = [int(p.split("/")[0]) for p in parts[1:]]
                if len(idx) < 3:
                    raise ValueError
                idx = [i - 1 if i > 0 else len(verts) + i for i in idx]
                faces.extend([idx[0], idx[k], idx[k + 1]] for k in range(1, len(idx) - 1))
        except ValueError:
            raise CliError(
                f"{path} line {n}: malformed {parts[0]!r} line: {line.strip()[:60]!r}"
            ) from None
    if not faces:
        raise CliError(f"{path}: no faces to render")
    f = np.asarray(faces, np.int64)
    if f.min() < 0 or f.max() >= len(verts):
        bad = int(f.max()) + 1 if f.max() >= len(verts) else int(f.min()) + 1
        raise CliError(
            f"{path}: a face refers to vertex {bad} but the file has {len(verts)} vertices"
        )
    return np.asarray(verts, np.float32).reshape(-1, 3), f.astype(np.int32)


def _load(path: Path, *, require_meshes: bool):
    """A Scene from a USD or OBJ file; one-line CliError for anything unreadable."""
    suffix = path.suffix.lower()
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a folder, not a scene file")
    if suffix in MESH_SUFFIXES:
        from .usd.scene import scene_from_arrays

        v, f = _read_obj(path)
        return scene_from_arrays(v, f, name=path.stem, source=str(path), smooth=False)
    if suffix not in USD_SUFFIXES:
        raise CliError(
            f"{path}: unsupported file type {suffix or '(none)'!r} "
            f"(reads {', '.join(USD_SUFFIXES + MESH_SUFFIXES)})"
        )
    try:
        from .usd import SceneError, load_stage
    except ImportError:
        raise CliError(
            f"{path}: reading USD needs usd-core (pip install 'warpraster[usd]')"
        ) from None
    try:
        with warnings.catch_warnings():  # printed by _report_load, one line each
            warnings.simplefilter("ignore", SceneWarning)
            return load_stage(path, require_meshes=require_meshes)
    except SceneError as err:
        raise CliError(str(err)) from None


# --------------------------------------------------------------------------- render
def _why_empty(scene, camera, image_size, *, double_sided: bool = False) -> str:
    """Why nothing was drawn: behind the camera, beyond far, outside the view, or
    seen from behind."""
    from .usd.cameras import opencv_from_usd_camera
    from .usd.scene import Projection

    v = np.asarray(scene.meshes.verts, np.float64)
    v = v[np.isfinite(v).all(1)]
    if len(v) == 0:
        if len(scene.meshes.nonfinite_meshes()) == len(scene.meshes.names):
            return "every mesh has non-finite points (NaN or inf), which are never drawn"
        return "every mesh is invisible at this time or has non-finite points"
    rot = np.asarray(camera.cam_to_world, np.float64)
    forward = -rot[2, :3] / np.linalg.norm(rot[2, :3])
    z = (v - camera.position) @ forward
    if not (z > camera.near).any():
        return "every mesh is behind the camera (or nearer than its near clipping distance)"
    if not (z[z > camera.near] < camera.far).any():
        return "every mesh is beyond the camera's far clipping distance"
    if camera.projection == Projection.PERSPECTIVE:
        R, t, K = opencv_from_usd_camera(camera, image_size)
        pc = v @ R.T + t
        front = pc[:, 2] > 0
        uv = pc[front, :2] / pc[front, 2:] * K[[0, 1], [0, 1]] + K[:2, 2]
        h, w = image_size
        if (
            (uv[:, 0] < 0).all()
            or (uv[:, 0] > w).all()
            or (uv[:, 1] < 0).all()
            or (uv[:, 1] > h).all()
        ):
            return "every mesh is outside the camera's field of view"
    sided = scene.meshes.double_sided
    if not double_sided and sided is not None and not np.all(sided):
        return (
            "the meshes are outside the view, too small to cover a pixel centre, or seen from "
            "behind (back faces of meshes that are not doubleSided are culled; --double-sided "
            "draws them)"
        )
    return "the meshes are outside the view or too small to cover a pixel centre"


def _report_load(scene, path: Path, verbose: bool) -> None:
    """The reader's warnings (one line each) and a summary of USD's diagnostics
    (each of them with ``--verbose``), on stderr."""
    for text in getattr(scene, "warnings", ()):
        print(f"warning: {text}", file=sys.stderr)
    bad = scene.meshes.nonfinite_meshes()
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        print(
            f"warning: {len(bad)} mesh{'es' * (len(bad) != 1)} with non-finite points "
            f"(NaN or inf; faces through them are not drawn): {names}",
            file=sys.stderr,
        )
    diagnostics = getattr(scene, "diagnostics", [])
    if diagnostics:
        n, k = len(diagnostics), len(getattr(scene, "unresolved", []))
        what = f", {k} of them unresolved (references, payloads or sublayers)" if k else ""
        more = "" if verbose else "; --verbose lists them"
        print(
            f"warning: USD reported {n} problem{'s' * (n != 1)} reading {path}{what}{more}",
            file=sys.stderr,
        )
        if verbose:
            for text in diagnostics:
                print(f"  {text}", file=sys.stderr)


def _cmd_render(args) -> int:
    if args.spp < 1:
        raise CliError(f"--spp must be >= 1, got {args.spp}", 2)
    if args.depth and args.depth_format == "exr" and _openexr() is None:
        raise CliError("--depth-format exr needs the openexr package (pip install openexr)", 2)
    _image_size(args, 1.0)  # bad --size / --width / --height fail before any work
    out_dir = Path(args.out)
    _check_out_dir(out_dir)  # before the load: an --out that cannot be written fails at once
    wp = init_warp(args.verbose)
    device = _device(wp, args.device)
    path = Path(args.scene) if args.scene else default_scene_path()
    scene = _load(path, require_meshes=True)
    _report_load(scene, path, args.verbose)
    if scene.meshes.num_faces == 0:
        raise CliError(f"{path}: no meshes to render")
    from .frame_writer import FrameWriter, render_frames
    from .usd.render import StageRenderer
    from .usd.scene import AspectConform

    is_usd = path.suffix.lower() in USD_SUFFIXES
    if args.camera is not None and args.camera not in scene.cameras:
        have = ", ".join(sorted(scene.cameras)) or "none"
        if is_usd:
            prim = scene.stage.GetPrimAtPath(args.camera) if args.camera.startswith("/") else None
            if prim:
                raise CliError(
                    f"{args.camera}: is a {prim.GetTypeName() or 'typeless prim'}, "
                    f"not a camera (cameras in {path}: {have})"
                )
        raise CliError(f"{args.camera}: no such camera in {path} (cameras: {have})")
    rs = scene.render_settings
    cam = StageRenderer.resolve_camera(scene, args.camera, aspect=4.0 / 3.0)
    image_size = _image_size(args, cam.aspect, rs.resolution if rs is not None else None)
    if cam.name == "default camera":  # frame the scene at the picture's aspect
        cam = StageRenderer.resolve_camera(scene, None, aspect=image_size[1] / image_size[0])
    frames = [None]
    anim = None
    if is_usd:
        from .usd.animation import StageAnimation, parse_frames

        try:
            frames = parse_frames(args.frames, scene.frame_range) or [None]
        except ValueError as err:
            raise CliError(str(err), 2) from None
        anim = StageAnimation(scene)
    elif args.frames is not None:
        raise CliError(f"--frames: {path} is not animated (an OBJ mesh)", 2)
    # Under torchrun (RANK / WORLD_SIZE set): this rank's share of the frames, each
    # frame on exactly one rank, on the GPU of its local rank unless --device says.
    rank = rank_info()
    if rank.is_distributed:
        frames = shard_frames(frames, rank.rank, rank.world_size)
        if args.device is None:
            device = wp.get_device(device_for_rank(rank.local_rank))
        if not frames:
            print(f"rank {rank.rank}/{rank.world_size}: no frames to render")
            return 0
    if args.conform is not None:
        conform = AspectConform[args.conform.upper().replace("-", "_")]
    elif rs is not None and rs.conform is not None:
        conform = rs.conform
    else:
        conform = AspectConform.EXPAND_APERTURE  # UsdRender's fallback
    cache_dir = Path(wp.config.kernel_cache_dir or "")
    cached_before = set(os.listdir(cache_dir)) if cache_dir.is_dir() else set()

    if args.ids and max(scene.meshes.num_faces, len(scene.meshes.names)) >= 2**24 - 1:
        raise CliError(f"--ids: {scene.meshes.num_faces:,} triangles do not fit 24-bit id images")
    _make_out_dir(out_dir)
    t0 = time.perf_counter()
    if anim is not None and frames[0] is not None:  # the first frame: its camera
        anim.evaluate(frames[0])
        if args.camera is not None:
            cam = scene.cameras[args.camera]
        elif scene.cameras:
            cam = StageRenderer.resolve_camera(scene, None)
    renderer = StageRenderer(scene, camera=cam, image_size=image_size, spp=args.spp,
                             conform=conform, double_sided=args.double_sided,
                             antialias=args.antialias, device=device)  # fmt: skip
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: no bar
        tqdm = None
    show = not args.no_progress and rank.is_main
    bar = tqdm(frames, unit="frame", disable=None if show else True, file=sys.stderr,
               leave=False) if tqdm else frames  # fmt: skip
    try:
        with FrameWriter(renderer, out_dir, depth=args.depth, depth_format=args.depth_format,
                         ids=args.ids, png_level=args.png_level) as writer:  # fmt: skip
            first = render_frames(renderer, bar, writer, anim=anim, camera=args.camera,
                                  fragments=args.fragments)  # fmt: skip
            coverage, written = writer.finish()
    finally:
        if tqdm and hasattr(bar, "close"):
            bar.close()
    end = time.perf_counter()
    compiled = cache_dir.is_dir() and bool(set(os.listdir(cache_dir)) - cached_before)

    h, w = image_size
    n = len(frames)  # after the first: the whole run's wall clock, writes included
    per = (end - first) / (n - 1) if n > 1 else end - t0
    timing = f"{per * 1000:.0f} ms per frame"
    if n > 1:
        timing += f" ({1 / per:.1f} frames/s; first frame {first - t0:.2f} s"
        timing += ", includes kernel compilation)" if compiled else ")"
    elif compiled:
        timing += " (includes kernel compilation)"
    cam_name = renderer.camera.name
    who = f"rank {rank.rank}/{rank.world_size}: " if rank.is_distributed else ""
    print(
        f"{who}rendered {n} frame{'s' * (n != 1)} of {path} through {cam_name}: "
        f"{scene.meshes.num_faces:,} triangles in {len(scene.meshes.names)} mesh"
        f"{'es' * (len(scene.meshes.names) != 1)}, {w}x{h}, {args.spp} spp, {timing}"
    )
    if max(coverage) == 0.0:
        print(
            f"warning: nothing drawn (0 pixels covered): "
            f"{_why_empty(scene, renderer.camera, image_size, double_sided=args.double_sided)}"
        )
    else:
        print(
            f"coverage {min(coverage):.0%}-{max(coverage):.0%} of the pixels"
            if n > 1
            else f"coverage {coverage[0]:.0%} of the pixels"
        )
    shown = written if len(written) <= 4 else [written[0], written[-1]]
    sep = ", " if len(written) <= 4 else " ... "
    print(
        f"wrote {len(written)} file{'s' * (len(written) != 1)} to {out_dir}/: "
        + sep.join(str(p) for p in shown)
    )
    return 0


# --------------------------------------------------------------------------- info
def _cmd_info(args) -> int:
    path = Path(args.scene) if args.scene else default_scene_path()
    scene = _load(path, require_meshes=False)
    _report_load(scene, path, args.verbose)
    m = scene.meshes
    lines = [f"{path}"]
    rng = scene.frame_range
    lines.append(
        f"  up axis {scene.up_axis}, "
        + (f"frames {rng[0]:g}-{rng[1]:g}" if rng else "static (no frame range)")
    )
    unresolved = getattr(scene, "unresolved", [])
    if unresolved:
        lines.append(f"unresolved: {len(unresolved)} (what they hold is not in this listing)")
        lines.extend(f"  {text}" for text in unresolved)
    anim = getattr(scene, "mesh_set", None)
    nonfinite = set(m.nonfinite_meshes())
    lines.append(f"meshes: {len(m.names)} ({m.num_faces:,} triangles, {m.num_verts:,} points)")
    for i, name in enumerate(m.names):
        f0, nf = int(m.face_first[i]), int(m.face_count[i])
        mats = sorted({int(x) for x in m.face_material[f0 : f0 + nf]})
        mat_names = [scene.materials[k].name if k >= 0 else "displayColor" for k in mats]
        tags = []
        if anim is not None and anim.dynamic[i]:
            tags.append("animated")
        if anim is not None and (
            anim.items[i].prim.IsInstanceProxy() or hasattr(anim.items[i], "instancer")
        ):
            tags.append("instance")
        if name in nonfinite:
            tags.append("non-finite points")
        lines.append(
            f"  {name}: {nf:,} triangles, {int(m.vert_count[i]):,} points, "
            f"material {', '.join(mat_names) or '-'}" + (f" [{', '.join(tags)}]" if tags else "")
        )
    for sub, rows in m.subsets.items():
        lines.append(f"    subset {sub}: {len(rows):,} triangles")
    lines.append(f"materials: {len(scene.materials)}")
    for mat in scene.materials:
        tex = f", texture {mat.texture.path}" if mat.texture is not None else ""
        d = ", ".join(f"{x:.3g}" for x in mat.diffuse)
        lines.append(
            f"  {mat.name}: diffuse ({d}){tex}, shininess {mat.shininess:.3g}, "
            f"opacity {mat.opacity:.3g}"
        )
    lines.append(f"cameras: {len(scene.cameras)}")
    for name, c in scene.cameras.items():
        kind = c.projection.name.lower()
        lines.append(
            f"  {name}: {kind}, focal length {c.focal_length:g}, aperture "
            f"{c.horizontal_aperture:g} x {c.vertical_aperture:g}, clipping {c.near:g}-{c.far:g}"
        )
    lights = scene.lights
    if lights.headlight:
        lines.append("lights: none (a headlight is used)")
    else:
        lines.append(f"lights: {len(lights.names)}")
        lines.extend(f"  {n}" for n in lights.names)
    print("\n".join(lines))
    return 0


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="warpraster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser(
        "render",
        help="render a USD scene (or OBJ mesh) to colour / depth / id images",
        description="Render every frame of a USD scene to RGBA colour PNGs (and depth / ids).",
        epilog=_RENDER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "scene", nargs="?", help=f"USD file or OBJ mesh (default: the bundled {DEFAULT_SCENE_NAME})"
    )
    r.add_argument(
        "--camera",
        metavar="PRIM",
        help="camera prim path (default: the render settings' camera, else the scene's first "
        "camera, else one framing the scene)",
    )
    r.add_argument(
        "--frames",
        metavar="A:B",
        help="time codes A..B inclusive (A, A:B or A:B:STEP; "
        "default: the stage's frame range, or its default time)",
    )
    r.add_argument(
        "--size",
        metavar="WxH",
        help=f"image size (default: the render settings' resolution, else {DEFAULT_WIDTH} wide "
        "at the camera's aspect)",
    )
    r.add_argument("--width", type=int, default=None, help="image width (when --size is not given)")
    r.add_argument(
        "--height", type=int, default=None, help="image height (when --size is not given)"
    )
    r.add_argument(
        "--spp",
        type=int,
        default=4,
        help="samples per pixel, on a grid as square as N allows (default: 4 = 2 x 2)",
    )
    r.add_argument(
        "--device", default=None, help="Warp device, e.g. cpu or cuda:0 (default: Warp's default)"
    )
    r.add_argument("--out", default="out", help="output folder (default: out)")
    r.add_argument("--depth", action="store_true", help="also write depth images")
    r.add_argument(
        "--depth-format",
        choices=["auto", "png", "exr"],
        default="auto",
        help="depth file format (auto: EXR when openexr is installed, else 16-bit PNG)",
    )
    r.add_argument("--ids", action="store_true", help="also write face-id and mesh-id images")
    r.add_argument(
        "--png-level",
        type=int,
        default=1,
        choices=range(10),
        metavar="0-9",
        help="zlib compression level of the PNGs (default: 1, a frame dump's level: about "
        "three times as fast to write as Pillow's default 6, in files about 15%% larger; the "
        "pixels are the same at every level)",
    )
    r.add_argument(
        "--fragments", action="store_true", help="also write the raw fragments (.npz, large)"
    )
    r.add_argument(
        "--conform",
        default=None,
        choices=[
            "adjust-pixel-aspect-ratio",
            "expand-aperture",
            "crop-aperture",
            "adjust-aperture-width",
            "adjust-aperture-height",
        ],
        help="image aspect unlike the camera aperture's: UsdRender's policies (default: the "
        "stage's render settings, else UsdRender's fallback expand-aperture, which widens one "
        "aperture so the image shows more and pixels stay square; adjust-pixel-aspect-ratio "
        "keeps both apertures and stretches the pixels)",
    )
    r.add_argument(
        "--double-sided",
        action="store_true",
        help="draw the back faces of every mesh (default: as usdview, only of the meshes "
        "whose doubleSided is true; the others' back faces are culled)",
    )
    r.add_argument(
        "--antialias",
        action="store_true",
        help="blend the colours across silhouette and occlusion edges by where each edge "
        "crosses between sample centres (nvdiffrast's analytic antialias, before the --spp "
        "box filter)",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument(
        "--verbose", action="store_true", help="show Warp's start-up and module-load messages"
    )
    r.set_defaults(func=_cmd_render)
    i = sub.add_parser(
        "info",
        help="list a scene's meshes, materials, cameras, lights and frames",
        description="List a scene's meshes, materials, cameras, lights and frame range.",
    )
    i.add_argument(
        "scene", nargs="?", help=f"USD file or OBJ mesh (default: the bundled {DEFAULT_SCENE_NAME})"
    )
    i.add_argument("--verbose", action="store_true", help="list each of USD's warnings")
    i.set_defaults(func=_cmd_info)
    sub.add_parser(
        "bench",
        help="run a benchmark suite: raster, renderer, sensor or usd (warpraster bench --help)",
        add_help=False,
    )
    return parser


def main(argv=None) -> int:
    """Runs the command; returns the exit code (errors: one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            from . import bench  # its own parser: every option and the real --help

            return bench.main(argv[1:])
        args = build_parser().parse_args(argv)
        return args.func(args)
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    except SceneError as err:  # a frame that cannot be read (e.g. topology changing over time)
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C, during start-up (imports, kernel loads) too
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # anything else the system refused: one line, no traceback
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{_os_reason(err)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `warpraster info ... | head`
        sys.stderr.close()
        return 1


if __name__ == "__main__":
    sys.exit(main())
