"""The JSONL metrics file, appended a whole line at a time, never left with half a line.

Why its own writer: a text file object flushes whenever its buffer fills, so a full disk can cut
a line anywhere and every later reader of the file trips over it. Here each line is one
``os.write`` (looped over short writes) at the end of the file; if the disk fills half way, the
file is truncated back to its last whole line, one warning says metrics stopped, and training
goes on without them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("perseus.runtime")


class MetricsFile:
    """Append-only JSONL file of whole lines; stops (with one warning) at the first write error."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self.error: str | None = None

    def write_line(self, line: str) -> None:
        """Append ``line`` and a newline, or nothing at all."""
        fd = self._fd
        if fd is None:
            return
        data = memoryview((line + "\n").encode())
        start = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError as exc:
            self._stop(start, exc)

    def _stop(self, start: int, exc: OSError) -> None:
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            os.ftruncate(fd, start)  # drop the part of the line that did land
        except OSError:
            pass
        os.close(fd)
        self.error = f"{exc.strerror or exc}"
        log.warning("perseus: writing the metrics file %s failed (%s); it ends at its last whole line and "
                    "metrics are no longer written to it", self.path, self.error)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
