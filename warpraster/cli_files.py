"""The ``warpraster`` command's output: the folder checked before any loading, files
written atomically (no half-written file under its name), PNG, NPZ and depth
(EXR when openexr is installed, else 16-bit PNG with its range), and the one
error type whose message and exit code the command prints."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["CliError"]


class CliError(Exception):
    """A failure reported as one line, ``error: <message>``, with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(" ".join(str(message).split()))
        self.code = code


def _check_out_dir(out: Path) -> None:
    """Fails at once (before any loading) unless ``out`` is, or can become, a writable
    folder; creates nothing (the folder is made when there is something to write)."""
    if out.exists():
        if not out.is_dir():
            raise CliError(f"--out {out}: is a file, not a folder", 2)
        if not os.access(out, os.W_OK | os.X_OK):
            raise CliError(f"--out {out}: the folder is not writable", 2)
        return
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"--out {out}: cannot make the folder: {parent} is a file", 2)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"--out {out}: cannot make the folder: {parent} is not writable", 2)


def _make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"--out {out}: cannot make the folder ({_os_reason(err)})") from None


def _os_reason(err: OSError) -> str:
    """An OSError's reason without its repr noise: ``No space left on device``."""
    return err.strerror or str(err) or type(err).__name__


def _write_atomic(path: Path, write) -> None:
    """``write(tmp_path)`` then rename to ``path``: no half-written file under its name."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:  # name the file meant, not the temporary one
        raise OSError(err.errno, _os_reason(err), str(path)) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _save_png(path: Path, array: np.ndarray, pnginfo=None, *, compress_level: int = 6) -> None:
    """``array`` as a PNG at zlib level ``compress_level`` (6: Pillow's default)."""
    from PIL import Image

    def write(tmp):
        Image.fromarray(array).save(
            tmp, format="PNG", pnginfo=pnginfo, compress_level=compress_level
        )

    _write_atomic(path, write)


def _save_npz(path: Path, arrays: dict) -> None:
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def _encode_ids(ids: np.ndarray) -> np.ndarray:
    x = ids.astype(np.int64) + 1
    return np.stack([x & 255, (x >> 8) & 255, (x >> 16) & 255], -1).astype(np.uint8)


def _openexr():
    """The OpenEXR module (3.x API with ``OpenEXR.File``), or None."""
    try:
        import OpenEXR  # optional: float depth
    except ImportError:
        return None
    return OpenEXR if hasattr(OpenEXR, "File") else None


def _write_depth(path_stem: Path, depth: np.ndarray, fmt: str, png_level: int = 6) -> Path:
    OpenEXR = _openexr() if fmt in ("auto", "exr") else None
    if fmt == "exr" and OpenEXR is None:
        raise CliError("--depth-format exr needs the openexr package (pip install openexr)", 2)
    if OpenEXR is not None:
        out = path_stem.with_name(path_stem.name + ".exr")

        def write(tmp):
            header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
            channels = {"Z": np.ascontiguousarray(depth, np.float32)}
            with OpenEXR.File(header, channels) as exr:
                exr.write(str(tmp))

        _write_atomic(out, write)
        return out
    from PIL.PngImagePlugin import PngInfo

    hit = np.isfinite(depth)
    lo = float(depth[hit].min()) if hit.any() else 0.0
    hi = float(depth[hit].max()) if hit.any() else 0.0
    v = np.zeros(depth.shape, np.uint16)
    if hit.any():
        span = hi - lo if hi > lo else 1.0
        v[hit] = 1 + np.round((depth[hit] - lo) / span * 65534).astype(np.uint16)
    info = PngInfo()
    info.add_text("warpraster:depth_range", f"{lo!r} {hi!r}")
    out = path_stem.with_name(path_stem.name + ".png")
    _save_png(out, v, info, compress_level=png_level)
    return out
