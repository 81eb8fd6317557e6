"""What both trainer-side clock controllers do with their one connection: start, fork, exit.

``FrequencyController`` (a pipe to its own controller process) and ``ClockdController`` (a socket
to the node's ``perseus clockd``) each hold one connection to whatever changes the clocks, under
the same rules. It belongs to the process that started it. A forked child (a DataLoader worker)
drops its copy at once: the other side resets the clocks when the trainer dies, and a copy held
open would hide that death; nor may the child reset the parent's clocks. Interpreter exit closes
it. A start that fails leaves nothing open and raises the typed error.
"""

from __future__ import annotations

import abc
import atexit
import os
import weakref
from typing import NoReturn, Self

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError


class ControllerHandle(abc.ABC):
    """Base of the trainer-side controllers: start-up, ownership, fork and exit handling.

    A subclass says how to drop its connection (``_drop_connection``), calls ``_started()`` once
    the connection is up, begins ``close()`` with ``if self._forked(): return False`` and ends it
    with ``_closed_now()``.
    """

    def __init__(self, start_timeout_s: float) -> None:
        self._start_timeout = start_timeout_s  # how long ``start()`` waits for the other side's ready
        self._closed = False
        self._owner_pid = os.getpid()
        self.clocks: frozenset[int] = frozenset()

    @abc.abstractmethod
    def start(self) -> Self:
        """Open the connection and wait until clocks may be requested (raises a typed ``GPUError``)."""

    @abc.abstractmethod
    def close(self, timeout_s: float = 5.0) -> bool:
        """Reset the clocks and drop the connection; True if the reset was confirmed. Idempotent."""

    @abc.abstractmethod
    def _drop_connection(self) -> None:
        """Close this process's end of the connection (idempotent, never raises for a closed one)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _started(self) -> None:
        """The connection is up: this process owns it, exit closes it, a forked child forgets it."""
        self._owner_pid = os.getpid()
        atexit.register(self.close)
        _LIVE.add(self)

    def _abort_start(self, error: GPUError) -> NoReturn:
        """A start that failed: nothing is left open, and ``close()`` does nothing."""
        self._drop_connection()
        self._closed = True
        raise error

    def _forked(self) -> bool:
        """True in a forked child, where the connection is the parent's: forgotten here, and
        ``close()`` must do nothing else (in particular, not reset the parent's clocks)."""
        if os.getpid() == self._owner_pid:
            return False
        self._forget_in_forked_child()
        return True

    def _forget_in_forked_child(self) -> None:
        """Drop this process's copy of the parent's connection, and never touch it again."""
        self._closed = True  # close() (and a signal handler that calls it) does nothing from here on
        self._drop_connection()

    def _closed_now(self) -> None:
        """The end of ``close()``: the connection is dropped, and exit has nothing left to close."""
        self._closed = True
        self._drop_connection()
        atexit.unregister(self.close)
        _LIVE.discard(self)

    def _unsupported_clock(self, mhz: int, started: bool) -> GPUError:
        """The error for a clock request ``clocks`` does not hold: made before ``start()``, or a
        clock the GPU does not support."""
        if not started:
            return GPUError(f"{type(self).__name__}.set_frequency() before start()")
        return GPUInvalidArgumentError(f"{mhz} MHz is not a supported SM clock of this GPU "
                                       f"({min(self.clocks)}–{max(self.clocks)} MHz)")


# Every started, unclosed handle; one at-fork hook for all of them.
_LIVE: weakref.WeakSet[ControllerHandle] = weakref.WeakSet()


def _forget_all_in_forked_child() -> None:
    for handle in list(_LIVE):
        handle._forget_in_forked_child()


os.register_at_fork(after_in_child=_forget_all_in_forked_child)
