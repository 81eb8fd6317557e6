"""The control plane's one thread: every collective of the hierarchical plane runs here, in the
order the training thread asked for them.

Why a thread: the periodic job check's data-parallel all-gather grows with the number of
replicas, so it must not run on the training thread. The training thread submits it at one check
and picks the answer up at the next (``Pending``); the synchronous collectives (flags, plans)
are submitted and waited for, so every rank's collectives still run in one program order on each
group, which gloo requires.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class ControlThread:
    """A daemon worker with a FIFO of calls; ``close`` lets a running call finish (gloo's timeout bounds it)."""

    def __init__(self, name: str = "perseus-control") -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        future: Future[T] = Future()
        self._calls.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the control thread and wait for it (its exception is raised here)."""
        return self.submit(fn).result()

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                future.set_exception(exc)

    def close(self, wait_s: float = 1.0) -> None:
        """Calls not started yet are cancelled (their ranks are leaving too); the running one ends."""
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        self._calls.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(wait_s)
