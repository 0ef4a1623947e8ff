"""``python -m warpraster.bench``: the benchmark (``--help`` lists the options)."""

import sys

from .cli import main

sys.exit(main())
