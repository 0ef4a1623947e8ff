"""``python -m warpraster``: the ``warpraster`` command."""

import sys

from .cli import main

sys.exit(main())
