"""``ClockKeeper``: holds one GPU's SM clock for one owner, and notices when that fails.

Why one class: the local controller process (``controller_proc``) and every GPU of
``perseus clockd`` must behave the same when the device refuses a clock or something else resets
it, so the runtime cannot tell which one it has. The keeper owns the device's clock calls (one
thread or process at a time) and reports two events through ``notify`` (the dicts the runtime's
``ClockController.notices()`` hands over):

- ``{"event": "failed", "message", "reset"}``: the device refused a clock (NVML ``GPU is lost``,
  ``not supported``, ...) or the clock kept being changed from outside. The keeper resets what it
  can and ignores further clock requests (resets still go through) until ``restart()``.
- ``{"event": "override", "expected", "found", "reapplied", "count", "max"}``: a read-back found
  the held lock gone (an admin's ``nvidia-smi -rgc``) and the keeper re-applied it; after
  ``MAX_OVERRIDES`` it gives up (``failed``) rather than fight the other tool.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

from perseus.gpu.device import GPUDevice

MAX_OVERRIDES = 3  # re-applications of a lock something else removed, before giving up
Outcome = Literal["applied", "skipped", "error"]


class ClockKeeper:
    """Applies clock targets to ``dev`` and watches a held lock (``maybe_check``)."""

    def __init__(self, dev: GPUDevice, notify: Callable[[dict[str, Any]], None]) -> None:
        self.dev = dev
        self.notify = notify
        self.current: int | None = None  # the lock this keeper set (None = default clocks)
        self.failed: str | None = None  # why clock changes stopped; None while they work
        self.overrides = 0
        self.applied_at = time.monotonic()
        self.checked_at = self.applied_at
        self.last_error = ""  # "<ErrorType>: <message>" of the last refused call

    def restart(self) -> None:
        """A new owner (a new clockd claim): clock changes are allowed again, overrides forgotten."""
        self.failed = None
        self.overrides = 0

    def apply(self, target: int | None, *, force: bool = False) -> Outcome:
        """Bring the device to ``target`` (None = reset); a refused lock gives up (``failed``)."""
        if (target == self.current and not force) or (self.failed is not None and target is not None):
            return "skipped"
        try:
            if target is None:
                self.dev.reset_locked_sm_clock()
            else:
                self.dev.set_locked_sm_clock(target)
        except Exception as exc:  # noqa: BLE001 - any refusal means default clocks, never a crash
            self.last_error = f"{type(exc).__name__}: {exc}"
            if target is not None:
                self.give_up(self.last_error)
            return "error"
        self.current = target
        self.applied_at = time.monotonic()
        return "applied"

    def give_up(self, why: str) -> None:
        """No more clock changes for this owner: reset what we can, say so once."""
        if self.failed is not None:
            return
        self.failed = why
        reset = True
        try:
            self.dev.reset_locked_sm_clock()
            self.current = None
        except Exception:  # noqa: BLE001 - a lost GPU: nothing left to reset
            reset = False
        self.notify({"event": "failed", "message": why, "reset": reset})

    def next_check_in(self, check_s: float) -> float | None:
        """Seconds until the next read-back is due (<= 0: now); None when there is nothing to watch.
        Only a lock held for a whole period is read: a fresh change may still be on its way."""
        if check_s <= 0 or self.current is None or self.failed is not None:
            return None
        return max(self.checked_at, self.applied_at) + check_s - time.monotonic()

    def maybe_check(self, check_s: float) -> None:
        """Read the held lock back if a check is due (``next_check_in``)."""
        due = self.next_check_in(check_s)
        if due is not None and due <= 0:
            self.checked_at = time.monotonic()
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
