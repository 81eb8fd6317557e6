"""``perseus clockd`` as a real process for tests: started as an administrator would, stopped by SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


def connectable(path: str | os.PathLike[str]) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.fspath(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


@contextlib.contextmanager
def clockd_process(socket_path: str | os.PathLike[str], *args: str, log_path: str | os.PathLike[str],
                   env: dict[str, str] | None = None, start_timeout_s: float = 60.0) -> Iterator[subprocess.Popen[bytes]]:
    """``perseus clockd --socket PATH --allow-uid <this uid> ARGS...`` with this checkout first on
    ``PYTHONPATH``; yields once it accepts connections (its log goes to ``log_path``). On leaving,
    SIGTERM, and the exit code must be 0 (it reset its GPUs)."""
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "perseus.cli", "clockd", "--socket", os.fspath(socket_path),
           "--allow-uid", str(os.getuid()), *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=base, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not connectable(socket_path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"perseus clockd did not start: {Path(log_path).read_text()}")
            time.sleep(0.02)
        yield proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, Path(log_path).read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
