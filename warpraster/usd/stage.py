"""Opening a stage and reading its time range.

Every failure is a :class:`~warpraster.usd.errors.SceneError` whose one-line
message names the file (or the prim), never a multi-line ``Tf`` traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pxr import Tf, Usd, UsdGeom

from .errors import SceneError

__all__ = ["USD_SUFFIXES", "frame_range", "open_stage", "stage_name", "time_code"]

#: File name endings the reader opens.
USD_SUFFIXES = (".usd", ".usda", ".usdc", ".usdz")


def _tf_message(err: Exception) -> str:
    """The root cause of a ``Tf.ErrorException``, one line.

    USD lists its errors as ``Error in 'function' at line N in file F : 'reason'``,
    the cause first (a parse error: ``/path/x.usda:6:9: parse error matching
    ...``) and the consequence last (``Failed to open layer``). The first reason
    is kept, its ``path:line:column:`` prefix becomes ``line 6, column 9:`` (the
    caller names the file) and C++ namespaces are dropped.
    """
    text = str(err)
    reasons = re.findall(r"Error in '.*?' at line \d+ in file .*? : '(.*?)'\s*(?=\n\s*Error in|\Z)",
                         text, flags=re.S)  # fmt: skip
    if not reasons:
        return " ".join(text.split())[:200]
    reason = " ".join(reasons[0].split())
    reason = re.sub(r"\b\w+__pxrReserved__::|\bSdf_\w+::", "", reason)
    where = re.match(r"(.*?):(\d+):(\d+): (.*)", reason)
    if where:
        reason = f"line {where[2]}, column {where[3]}: {where[4]}"
    return reason[:300]


def open_stage(source) -> Usd.Stage:
    """The stage of a file path (``.usd``, ``.usda``, ``.usdc``, ``.usdz``) or a ``Usd.Stage``.

    Args:
        source: a path (``str`` or ``os.PathLike``) or an already open ``Usd.Stage``
            (in-memory stages included), returned as is.

    Raises:
        SceneError: no such file, a folder, a suffix USD does not read, or a layer
            USD cannot parse (the message names the file).
    """
    if isinstance(source, Usd.Stage):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a path or a Usd.Stage, got {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise SceneError(str(path), "no such file")
    if path.is_dir():
        raise SceneError(str(path), "is a folder, not a USD file")
    if path.suffix.lower() not in USD_SUFFIXES:
        raise SceneError(
            str(path),
            f"not a USD file (suffix {path.suffix or 'none'!r}; reads {', '.join(USD_SUFFIXES)})",
        )
    try:
        stage = Usd.Stage.Open(str(path))
    except Tf.ErrorException as err:
        raise SceneError(str(path), f"not a readable USD layer ({_tf_message(err)})") from None
    if stage is None:
        raise SceneError(str(path), "not a readable USD layer")
    return stage


def stage_name(stage: Usd.Stage) -> str:
    """The file of the stage's root layer, or its identifier for an in-memory stage."""
    layer = stage.GetRootLayer()
    return layer.realPath or layer.identifier


def frame_range(stage: Usd.Stage) -> tuple[float, float] | None:
    """``(start, end)`` time codes authored on the stage, or None for a static stage."""
    if not stage.HasAuthoredTimeCodeRange():
        return None
    return float(stage.GetStartTimeCode()), float(stage.GetEndTimeCode())


def time_code(time) -> Usd.TimeCode:
    """A ``Usd.TimeCode`` from None (the default value) or a number."""
    if time is None:
        return Usd.TimeCode.Default()
    if isinstance(time, Usd.TimeCode):
        return time
    return Usd.TimeCode(float(time))


def up_axis(stage: Usd.Stage) -> str:
    """``"Y"`` or ``"Z"``: the stage's up axis (USD's fallback is Y)."""
    return str(UsdGeom.GetStageUpAxis(stage))
