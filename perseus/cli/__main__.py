"""``python -m perseus.cli``: the ``perseus`` command without the console script."""

import sys

from perseus.cli import main

sys.exit(main())
