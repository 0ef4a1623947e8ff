"""The one exception the USD reader raises for bad input."""

from __future__ import annotations

__all__ = ["SceneError"]


class SceneError(ValueError):
    """A scene file or prim that cannot be read; the message is one line naming it.

    A ``ValueError``, so callers that catch bad input generally catch it too.
    """

    def __init__(self, where: str, what: str):
        self.where = str(where)
        self.what = " ".join(str(what).split())  # one line
        super().__init__(f"{self.where}: {self.what}")
