"""Loader for the PyTorch3D golden cases in ``tests/data/pytorch3d/*.npz``.

The cases ship with the repository (a fresh clone runs every parity test); the
environment variable ``WARPRASTER_P3D_REFERENCE`` names another directory of
cases in the same format instead. The format is described in that directory's
``README.md``.

Tests parametrised with :func:`case_params` skip with a clear reason only when
an override names a directory that is missing.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

__all__ = [
    "REFERENCE_ENV",
    "camera_case_names",
    "case_names",
    "case_params",
    "case_paths",
    "load_case",
    "raster_args",
    "raw_case_names",
    "reference_dir",
    "require_reference",
]

REFERENCE_ENV = "WARPRASTER_P3D_REFERENCE"


def reference_dir() -> Path:
    """The directory holding the ``.npz`` cases (it may not exist)."""
    override = os.environ.get(REFERENCE_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "data" / "pytorch3d"


def _missing_reason() -> str:
    return (
        f"PyTorch3D reference cases not found in {reference_dir()} "
        f"(set {REFERENCE_ENV} to the directory holding p01_*.npz ...)"
    )


def case_paths() -> list[Path]:
    """All case files, sorted by name; empty if the directory is missing."""
    d = reference_dir()
    if not d.is_dir():
        return []
    return sorted(d.glob("*.npz"))


def case_names() -> list[str]:
    """All case names (file stems), sorted."""
    return [p.stem for p in case_paths()]


@cache
def _case_kind(path: Path) -> str:
    with np.load(path, allow_pickle=False) as d:
        return str(d["case_kind"])


def raw_case_names() -> list[str]:
    """Cases made by calling ``rasterize_meshes`` directly (``case_kind == "raw"``)."""
    return [p.stem for p in case_paths() if _case_kind(p) == "raw"]


def camera_case_names() -> list[str]:
    """Cases made through ``MeshRasterizer`` (``case_kind == "camera"``)."""
    return [p.stem for p in case_paths() if _case_kind(p) == "camera"]


def require_reference() -> Path:
    """Return the reference directory, or skip the calling test if it is missing."""
    d = reference_dir()
    if not d.is_dir() or not case_paths():
        pytest.skip(_missing_reason())
    return d


def case_params(names: list[str]) -> list:
    """``pytest.mark.parametrize`` values for case names.

    With no cases available this is a single parameter that skips with the
    reason, instead of pytest's anonymous "empty parameter set".
    """
    if names:
        return list(names)
    return [pytest.param(None, marks=pytest.mark.skip(reason=_missing_reason()), id="no-cases")]


def load_case(name: str) -> dict:
    """Load one case as a dict of NumPy arrays.

    As the README's minimal loader: ``meta`` parsed from JSON, ``z_clip_value``
    NaN -> None, ``bin_size`` / ``max_faces_per_bin`` -1 -> None, ``image_size``
    a tuple ``(H, W)``. Scalar flags become Python ``bool`` / ``int`` / ``float``
    and string keys Python ``str``; arrays are kept as they are stored.

    Args:
        name: file stem, e.g. ``"p02_ico0_k3"`` (``.npz`` may be included).
    """
    require_reference()
    path = reference_dir() / (name if name.endswith(".npz") else name + ".npz")
    if not path.is_file():
        raise FileNotFoundError(f"no PyTorch3D reference case {path}")
    with np.load(path, allow_pickle=False) as d:
        case = {k: d[k] for k in d.files}
    case["name"] = path.stem
    case["meta"] = json.loads(str(case["meta"]))
    for k in ("case_kind", "camera_type"):
        case[k] = str(case[k])
    zc = float(case["z_clip_value"])
    case["z_clip_value"] = None if np.isnan(zc) else zc
    for k in ("bin_size", "max_faces_per_bin"):
        v = int(case[k])
        case[k] = None if v == -1 else v
    for k in (
        "perspective_correct",
        "clip_barycentric_coords",
        "cull_backfaces",
        "cull_to_frustum",
    ):
        case[k] = bool(case[k])
    case["blur_radius"] = float(case["blur_radius"])
    case["faces_per_pixel"] = int(case["faces_per_pixel"])
    H, W = (int(x) for x in case["image_size"])
    case["image_size"] = (H, W)
    return case


def raster_args(case: dict) -> dict:
    """Keyword arguments of ``rasterize_meshes`` for a loaded case.

    Camera cases use ``verts_ndc_packed`` (what ``MeshRasterizer`` handed to
    ``rasterize_meshes``); raw cases use ``verts_packed``. Clipping settings
    are not included: the caller decides whether it can honour them.
    """
    verts = case["verts_ndc_packed"] if case["case_kind"] == "camera" else case["verts_packed"]
    return {
        "verts": verts,
        "faces": case["faces_packed"],
        "mesh_to_face_first_idx": case["mesh_to_face_first_idx"],
        "num_faces_per_mesh": case["num_faces_per_mesh"],
        "image_size": case["image_size"],
        "blur_radius": case["blur_radius"],
        "faces_per_pixel": case["faces_per_pixel"],
        "perspective_correct": case["perspective_correct"],
        "clip_barycentric_coords": case["clip_barycentric_coords"],
        "cull_backfaces": case["cull_backfaces"],
    }
