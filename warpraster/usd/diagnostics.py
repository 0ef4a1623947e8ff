"""USD's own diagnostics while a stage is read: collected, never printed raw.

USD prints each warning (an unresolved reference, an unknown schema) to stderr
as it happens, one raw line per prim: 64 lines for one asset whose textures
moved. :func:`collecting_diagnostics` routes them into a list instead (usd-core's
``UsdUtils.CoalescingDiagnosticDelegate``), and :func:`composition_problems`
names what the stage could not compose (its ``GetCompositionErrors``), so a
caller can print one summary line and the details on request.
"""

from __future__ import annotations

import contextlib
import re

from pxr import Usd, UsdUtils

__all__ = ["collecting_diagnostics", "composition_problems"]

# "(instantiating stage on stage @x.usda@ <0x55d...>)": the same for every line, and an address
_NOISE = re.compile(r"\s*\((?:instantiating|recomposing) stage on stage @[^@]*@ <0x[0-9a-f]+>\)")


def _clean(text: str) -> str:
    return " ".join(_NOISE.sub("", str(text)).split())


@contextlib.contextmanager
def collecting_diagnostics():
    """Collects USD's warnings and status messages posted inside the block.

    Yields a list that, when the block ends, holds each distinct message once
    (one line each, in the order first posted). USD errors that raise
    ``Tf.ErrorException`` still raise.
    """
    found: list[str] = []
    delegate = UsdUtils.CoalescingDiagnosticDelegate()
    try:
        yield found
    finally:
        seen = set()
        for item in delegate.TakeUncoalescedDiagnostics():
            text = _clean(item.commentary)
            if text and text not in seen:
                seen.add(text)
                found.append(text)
        del delegate  # unregisters it: later diagnostics go where they went before


def composition_problems(stage: Usd.Stage) -> list[str]:
    """What the stage could not compose, one line each (unresolved references,
    payloads, sublayers, ...), e.g. ``Could not open asset @a.usda@ for reference
    introduced by @scene.usda@</World/A>``."""
    return [_clean(str(err)).rstrip(".") for err in stage.GetCompositionErrors()]
