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
prints its own, and tens of lines per rank would fill the screen. For an error that stops the whole
job at start-up, rank 0 says it once for the job and the other ranks point at it (``job_error_line``).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from perseus.errors import PerseusError

log = logging.getLogger("perseus.runtime")


class Closable(Protocol):
    def close(self) -> None: ...


class RankExchange(Protocol):
    """The job's collective, as much of it as exchanging start-up errors needs."""

    @property
    def is_root(self) -> bool: ...

    def gather_to_root(self, obj: Any) -> list[Any] | None: ...

    def broadcast_object(self, obj: Any) -> Any: ...


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


def job_error_line(collective: RankExchange, rank: int, error: PerseusError) -> str:
    """The one line this rank prints for a start-up error (``one_line_errors``): rank 0 says it
    once for the job, naming the ranks each distinct error came from; another rank whose error is
    rank 0's says only that. If the ranks cannot exchange their errors, each its own."""
    from perseus.gpu.errors import SIM_FIX

    own = str(error)
    text = own.removeprefix("perseus: ")
    try:
        gathered = collective.broadcast_object(collective.gather_to_root((rank, own)))
    except Exception:  # noqa: BLE001 - a failed exchange must not hide the error itself
        return f"perseus: rank {rank}: {text}"
    by_message: dict[str, list[int]] = {}
    for r, message in gathered:
        if not message.startswith("perseus: another rank could not"):
            by_message.setdefault(message, []).append(r)
    root_message = gathered[0][1]  # in the group's rank order: rank 0's first
    if collective.is_root:
        size = len(gathered)
        parts = [f"{_ranks(ranks, size)}: {message.removeprefix('perseus: ')}" for message, ranks in by_message.items()]
        return "perseus: " + " | ".join(parts) if parts else f"perseus: rank {rank}: {text}"
    if own == root_message or own.startswith("perseus: another rank could not"):
        fix = f"; without a GPU: {SIM_FIX}" if SIM_FIX in root_message else ""
        return f"perseus: rank {rank}: stopped by the error rank 0 reports for the job{fix}"
    return f"perseus: rank {rank}: {text}"


def _ranks(ranks: list[int], size: int) -> str:
    if len(ranks) == size and size > 1:
        return f"all {size} ranks"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def ensure_log_handler() -> None:
    """Rank 0's progress lines must be visible even if the trainer configured no logging."""
    logger = logging.getLogger("perseus")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
