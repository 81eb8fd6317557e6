"""The runtime tests' shared helpers (toy pipelines, stand-ins, traces) live in this folder; the tests
of each runtime room sit in a sub-folder named after it and import the helpers from here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
