"""The one exception the USD reader raises for bad input, and its one warning category."""

from __future__ import annotations

__all__ = ["SceneError", "SceneWarning"]


class SceneError(ValueError):
    """A scene file or prim that cannot be read; the message is one line naming it.

    A ``ValueError``, so callers that catch bad input generally catch it too.
    """

    def __init__(self, where: str, what: str):
        self.where = str(where)
        self.what = " ".join(str(what).split())  # one line
        super().__init__(f"{self.where}: {self.what}")


class SceneWarning(UserWarning):
    """Something of the scene that is drawn in a fallback way (a texture that cannot
    be read is drawn in its fallback colour, a mesh with non-finite points is not
    drawn); one line naming it. :attr:`Scene.warnings` keeps them too."""
