"""The benchmark: ``warpraster bench --suite raster|renderer|sensor|usd`` (also
``python -m warpraster.bench``); ``warpraster bench --help`` lists the options.

One module a suite (``raster.py``, ``renderer.py``, ``sensor.py``, ``usd.py``),
the scenes in ``scenes.py`` and the command line in ``cli.py``, which parses
before importing Warp. Importing this package imports no Warp.
"""

from .cli import main

__all__ = ["main"]
