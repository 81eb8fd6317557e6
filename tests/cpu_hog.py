"""A CPU-bound neighbour for end-to-end runs: issue 24's "beside a CPU-bound process".

The runtime's decisions are checked on a machine whose load moves, as a shared node's does. The
neighbour (``python -c "while True: pass"``) starts before the run and is killed by its own pid
afterwards, whatever happens (shared by tests/deepspeed and tests/megatron).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def cpu_hog(enabled: bool = True) -> Iterator[None]:
    """Run a busy loop beside the body (nothing when ``enabled`` is False)."""
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if enabled else None
    try:
        yield
    finally:
        if neighbour is not None:
            os.kill(neighbour.pid, signal.SIGKILL)
            neighbour.wait()
