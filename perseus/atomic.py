"""Atomic file writes: readers see the old file or the new one, never half of one.

Every file perseus writes (frontiers, profiles, cache entries, figures) goes through here. The
data goes to a temporary file in the target's directory (same file system, so the rename is
atomic), is flushed and fsynced, and only then renamed over the target with ``os.replace``. On
any error — including a full disk half way through — the temporary file is removed and the old
target, if there was one, is left untouched. It sits in the base layer, beside ``perseus.errors``,
so every layer that writes a file can use it.
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

TMP_SUFFIX = ".tmp"


def _open_temp(path: Path) -> tuple[Path, int]:
    """A new, exclusive temporary file next to ``path`` (mode 0666 minus the umask, like open())."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


@contextmanager
def atomic_output(path: str | Path) -> Iterator[BinaryIO]:
    """Binary file object whose contents replace ``path`` when the block ends without error."""
    path = Path(path)
    tmp, fd = _open_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def remove_temporaries(directory: str | Path, pid: int) -> list[Path]:
    """Remove the temporary files process ``pid`` left in ``directory``: a writer stopped by a
    signal (SIGTERM's default, SIGKILL, ``os._exit``) runs no cleanup. Only a process that knows
    ``pid`` has ended may call it: a live writer's file would go."""
    pattern = re.compile(rf"\..+\.{pid}\.[0-9a-f]{{8}}{re.escape(TMP_SUFFIX)}")
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if pattern.fullmatch(name):
            path = Path(directory) / name
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (str is written as UTF-8) atomically."""
    payload = data.encode() if isinstance(data, str) else data
    with atomic_output(path) as f:
        f.write(payload)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; best effort (not every platform or file system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
