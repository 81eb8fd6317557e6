"""``ClockKeeper``: holds one GPU's SM clock for one owner, and notices when that fails.

Why one class: the local controller process (``control.process``) and every GPU of
``perseus clockd`` must behave the same when the device refuses a clock or something else resets
it, so the runtime cannot tell which one it has. The keeper owns the device's clock calls (one
thread or process at a time) and reports two events through ``notify`` (the dicts the runtime's
``ClockController.notices()`` hands over):

- ``{"event": "failed", "message", "reset"}``: the device refused a clock (NVML ``GPU is lost``,
  ``not supported``, ...) or the clock kept being changed from outside. The keeper resets what it
  can and ignores further clock requests (resets still go through) until ``restart()``.
  A refusal that may pass (no permission: an administrator's tool held the clocks for a moment) is
  retried first, ``RETRY_DELAYS_S`` apart, and only one that outlasts them fails; any other error
  (a lost GPU, ``not supported``, a driver's own error) fails at once.
  Retries never block the caller: ``apply`` says ``"retrying"``, the owner's loop calls
  ``maybe_retry`` when ``retry_in`` says so (its requests meanwhile replace the retried target).
- ``{"event": "override", "expected", "found", "reapplied", "count", "max"}``: a read-back found
  the held lock gone (an admin's ``nvidia-smi -rgc``) and the keeper re-applied it; after
  ``MAX_OVERRIDES`` it gives up (``failed``) rather than fight the other tool.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import GPUPermissionError

MAX_OVERRIDES = 3  # re-applications of a lock something else removed, before giving up
# The waits before each retry of a refused clock call: 3 retries, the last 1.75 s after the refusal.
# An administrator's tool (nvidia-smi -lgc/-rgc, a health check) holds the clocks for well under a
# second; a refusal still there after ~2 s is not passing, and the run is better at default clocks.
RETRY_DELAYS_S = (0.25, 0.5, 1.0)
Outcome = Literal["applied", "skipped", "error", "retrying"]


def _may_pass(exc: Exception) -> bool:
    """Whether a refusal is worth retrying: a permission refused mid-run (the process had it at
    start-up, ``can_set_clocks``), as when another tool holds the clocks; zeusd's refusals arrive so too."""
    return isinstance(exc, GPUPermissionError)


class ClockKeeper:
    """Applies clock targets to ``dev`` and watches a held lock (``maybe_check``)."""

    def __init__(self, dev: GPUDevice, notify: Callable[[dict[str, Any]], None], *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.dev = dev
        self.notify = notify
        self._clock = clock
        self._sleep = sleep
        self.current: int | None = None  # the lock this keeper set (None = default clocks)
        self.failed: str | None = None  # why clock changes stopped; None while they work
        self.overrides = 0
        self.applied_at = clock()
        self.checked_at = self.applied_at
        self.last_error = ""  # "<ErrorType>: <message>" of the last refused call
        self.refusals = 0  # refused calls in a row (retries included); 0 after one goes through
        # refused locks since the last lock that went through: resets between them (a plan resets
        # the clocks after every step) neither end nor hide a lock refused for good
        self.lock_refusals = 0
        self._retry: tuple[int | None, float] | None = None  # (target, when) of the refused call to retry

    def restart(self) -> None:
        """A new owner (a new clockd claim): clock changes are allowed again, overrides and
        refusals forgotten (its first call, a reset, tries the device afresh)."""
        self.failed = None
        self.overrides = 0
        self.refusals, self._retry = 0, None
        self.lock_refusals = 0

    def apply(self, target: int | None, *, force: bool = False) -> Outcome:
        """Bring the device to ``target`` (None = reset). A refusal that may pass is retried later
        (``"retrying"``; while one is pending a new target replaces it, ``force`` tries at once); one
        that does not, or outlasts ``RETRY_DELAYS_S``, gives a lock up (``failed``)."""
        if self.failed is not None and target is not None:
            return "skipped"
        if self._retry is not None and not force:
            if target == self.current:  # back to what the device holds: nothing left to retry
                self.refusals, self._retry = 0, None
                return "skipped"
            self._retry = (target, self._retry[1])
            return "retrying"
        if target == self.current and not force:
            return "skipped"
        return self._call(target)

    def _call(self, target: int | None) -> Outcome:
        try:
            if target is None:
                self.dev.reset_locked_sm_clock()
            else:
                self.dev.set_locked_sm_clock(target)
        except Exception as exc:  # noqa: BLE001 - any refusal means default clocks, never a crash
            self.last_error = f"{type(exc).__name__}: {exc}"
            return self._refused(target, exc)
        self.refusals, self._retry = 0, None
        if target is not None:
            self.lock_refusals = 0
        self.current = target
        self.applied_at = self._clock()
        return "applied"

    def _refused(self, target: int | None, exc: Exception) -> Outcome:
        self.refusals += 1
        if target is not None:
            self.lock_refusals += 1
        spent = max(self.refusals, self.lock_refusals)
        if _may_pass(exc) and spent <= len(RETRY_DELAYS_S):
            self._retry = (target, self._clock() + RETRY_DELAYS_S[spent - 1])
            return "retrying"
        self.refusals, self._retry = 0, None
        if target is not None:
            self.lock_refusals = 0
        if target is not None:
            self.give_up(self.last_error)
        return "error"

    def retry_in(self) -> float | None:
        """Seconds until a refused call is retried (<= 0: now); None when none is pending."""
        return None if self._retry is None else self._retry[1] - self._clock()

    def maybe_retry(self) -> tuple[Outcome, int | None] | None:
        """Retry the refused call if it is due (``retry_in``): (its outcome, its target), else None."""
        if self._retry is None or self._retry[1] > self._clock():
            return None
        target = self._retry[0]
        self._retry = None
        if self.failed is not None and target is not None:
            return "skipped", target
        return self._call(target), target

    def settle(self) -> Outcome | None:
        """Wait out the retries of a refused call (at most ``sum(RETRY_DELAYS_S)``; where nothing else
        is served meanwhile: a GPU changing hands, exit): the last outcome, None if none was pending."""
        outcome: Outcome | None = None
        while (due := self.retry_in()) is not None:
            self._sleep(max(due, 0.0))
            retried = self.maybe_retry()
            outcome = retried[0] if retried is not None else outcome
        return outcome

    def reset_now(self) -> bool:
        """Reset the clocks, retrying a refusal until it passes or the retries are spent (blocking:
        at exit); False if the GPU may still be locked (``last_error`` says why)."""
        outcome = self.apply(None, force=True)
        if outcome == "retrying":
            outcome = self.settle() or outcome
        return outcome == "applied"

    def give_up(self, why: str) -> None:
        """No more clock changes for this owner: reset what we can (a refused reset is retried, see
        ``apply``), say so once."""
        if self.failed is not None:
            return
        self.failed = why
        self.refusals, self._retry = 0, None
        outcome = self._call(None)
        self.notify({"event": "failed", "message": why, "reset": outcome == "applied"})

    def next_check_in(self, check_s: float) -> float | None:
        """Seconds until the next read-back is due (<= 0: now); None when there is nothing to watch.
        Only a lock held for a whole period is read: a fresh change may still be on its way, and none
        while a refused call waits for its retry."""
        if check_s <= 0 or self.current is None or self.failed is not None or self._retry is not None:
            return None
        return max(self.checked_at, self.applied_at) + check_s - self._clock()

    def maybe_check(self, check_s: float) -> None:
        """Read the held lock back if a check is due (``next_check_in``)."""
        due = self.next_check_in(check_s)
        if due is not None and due <= 0:
            self.checked_at = self._clock()
            self.check_clock()

    def check_clock(self) -> None:
        """Read the applied clock back; re-apply a lock something else removed (or give up).

        A read above the lock means the lock is gone (throttling only ever lowers the clock, so a
        read below it is no override)."""
        if self.current is None or self.failed is not None:
            return
        try:
            found = self.dev.locked_sm_clock_mhz()
        except Exception:  # noqa: BLE001 - the next clock change reports a broken device
            return
        if found is None or found <= self.current:
            return
        self.overrides += 1
        expected = self.current
        if self.overrides > MAX_OVERRIDES:
            self.give_up(f"the SM clock was changed outside Perseus {self.overrides} times (found {found} MHz, "
                         f"held {expected} MHz); leaving the clocks to the other tool")
            return
        reapplied = self.apply(expected, force=True) == "applied"
        self.notify({"event": "override", "expected": expected, "found": found, "reapplied": reapplied,
                     "count": self.overrides, "max": MAX_OVERRIDES})
