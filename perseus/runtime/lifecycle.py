"""Never leave a locked clock: every live runtime is closed on every normal way out of the process.

The process's hooks belong to its entry point, not to the runtime: ``install_process_hooks`` is
called by the adapters' entry points (``perseus_megatron.enable``, ``perseus_deepspeed.initialize``,
``perseus_torch.enable``, unless ``process_hooks`` is off) and by a trainer that builds
``PerseusRuntime`` itself; the runtime only registers itself (``track``). With the hooks, atexit
and SIGTERM (when nobody else handles it) close all live runtimes, which resets their clocks and
finishes their files; SIGTERM becomes ``SystemExit`` after the reset, so the trainer's ``finally``
blocks and context managers run too. Without them the clocks are still reset on every exit: the
GPU layer's controller closes itself at exit and on SIGTERM/SIGINT, and its process resets the
clocks when the trainer disappears, SIGKILL included (docs/gpu.md, "Clock safety").

A Perseus error nobody catches (a rank that cannot open its GPU, a bad setting) ends the process
with one line instead of Python's chained tracebacks (``one_line_errors``): every rank of a job
prints its own, so tens of lines per rank were the whole screen.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import weakref
from typing import Any, Protocol

log = logging.getLogger("perseus.runtime")


class Closable(Protocol):
    def close(self) -> None: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_EXIT_HOOKED = False
_ERRORS_HOOKED = False
ENV_TRACEBACK = "PERSEUS_TRACEBACK"  # set (to anything) to get Python's full traceback instead


def track(runtime: Closable) -> None:
    """Close ``runtime`` at process exit unless it was closed (or collected) before."""
    _LIVE.add(runtime)


def close_all() -> None:
    for runtime in list(_LIVE):
        try:
            runtime.close()
        except Exception:  # shutdown must go on
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


def install_process_hooks() -> None:
    """The process-wide hooks, once per process, for an entry point to call before it starts a
    runtime (so the clock controller's SIGTERM handler chains to this one): atexit and SIGTERM close
    every live runtime; an uncaught ``PerseusError`` prints one line."""
    install_exit_hooks()
    one_line_errors()


def one_line_errors() -> None:
    """An uncaught ``PerseusError`` prints one line on stderr and exits 1 (Python's default exit
    for an uncaught exception); any other exception, and every error with ``$PERSEUS_TRACEBACK``
    set, goes to the previous hook unchanged. Callers who catch the error still get it, typed.
    Once per process."""
    global _ERRORS_HOOKED
    if _ERRORS_HOOKED:
        return
    _ERRORS_HOOKED = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        from perseus.errors import PerseusError, write_line

        if not isinstance(value, PerseusError) or os.environ.get(ENV_TRACEBACK):
            previous(kind, value, tb)
            return
        line = value.line or error_line(value)
        write_line(sys.stderr, f"{line} ({ENV_TRACEBACK}=1 shows the traceback)")

    sys.excepthook = hook


def error_line(error: BaseException) -> str:
    """``perseus: rank N: message`` on one line (the rank from the launcher's ``$RANK``)."""
    text = " ".join(str(error).split()).removeprefix("perseus: ")
    rank = os.environ.get("RANK")
    return f"perseus: rank {rank}: {text}" if rank is not None else f"perseus: {text}"


def ensure_log_handler() -> None:
    """Rank 0's progress lines must be visible even if the trainer configured no logging."""
    logger = logging.getLogger("perseus")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
