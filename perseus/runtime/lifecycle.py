"""Never leave a locked clock: every live runtime is closed on every normal way out of the process.

atexit and SIGTERM (when nobody else handles it) close all live runtimes, which resets their
clocks. SIGTERM becomes ``SystemExit`` after the reset, so the trainer's ``finally`` blocks and
context managers run too. SIGKILL is covered by the GPU layer's controller process, which resets
the clocks when its parent disappears.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import weakref
from typing import Any, Protocol

log = logging.getLogger("perseus.runtime")


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_EXIT_HOOKED = False


def track(runtime: Closable) -> None:
    """Close ``runtime`` at process exit unless it was closed (or collected) before."""
    _LIVE.add(runtime)


def close_all() -> None:
    for runtime in list(_LIVE):
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - shutdown must go on
            log.exception("perseus: failed to reset clocks at exit")


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    raise SystemExit(128 + signum)


def install_exit_hooks() -> None:
    """atexit + SIGTERM (when nobody else handles it), once per process. Call it before the
    controller starts, so the controller's SIGTERM handler chains to this one."""
    global _EXIT_HOOKED
    if _EXIT_HOOKED:
        return
    _EXIT_HOOKED = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def ensure_log_handler() -> None:
    """Rank 0's progress lines must be visible even if the trainer configured no logging."""
    logger = logging.getLogger("perseus")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
