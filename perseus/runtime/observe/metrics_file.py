"""The JSONL metrics file, appended a whole line at a time, never left with half a line.

Why its own writer: a text file object flushes whenever its buffer fills, so a full disk can cut
a line anywhere and every later reader of the file trips over it. Here each line is one
``os.write`` (looped over short writes) at the end of the file; if the disk fills half way, the
file is truncated back to its last whole line, one warning says metrics stopped, and training
goes on without them.

Every line carries the run id of the runtime that wrote it (``"run_id"``, the first key): one id
per ``MetricsFile``, i.e. per runtime instance. A metrics file is appended across restarts and
reruns, so without it ``perseus report`` could not tell where one run ends and the next begins.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("perseus.runtime")

RUN_ID_KEY = "run_id"


def new_run_id() -> str:
    """``20261125T202416Z-12345-3fa9c1``: start time (UTC), process id and 24 random bits.

    Time and pid make it readable and sort runs by start; the random part keeps two runtimes
    started in the same second by recycled pids (containers) apart."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}-{secrets.token_hex(3)}"


def stamp(line: str, run_id: str) -> str:
    """``line`` (one JSON object) with ``"run_id"`` inserted as its first key; other text as is."""
    text = line.lstrip()
    if not text.startswith("{"):
        return line
    body = text[1:].lstrip()
    head = "{" + json.dumps(RUN_ID_KEY) + ": " + json.dumps(run_id)
    return head + (body if body.startswith("}") else ", " + body)


class MetricsFile:
    """Append-only JSONL file of whole lines; stops (with one warning) at the first write error.

    ``run_id``: the id stamped on every line (default: a new one, ``new_run_id()``)."""

    def __init__(self, path: str | Path, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self.error: str | None = None

    def write_record(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one JSON line (values JSON cannot hold are written as text)."""
        self.write_line(json.dumps(dict(record), default=str))

    def write_line(self, line: str) -> None:
        """Append ``line`` (a JSON object, stamped with the run id) and a newline, or nothing at all."""
        fd = self._fd
        if fd is None:
            return
        data = memoryview((stamp(line, self.run_id) + "\n").encode())
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
