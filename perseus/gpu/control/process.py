"""The frequency-controller process (``main``; ``FrequencyController`` runs it with ``python -c``
and an explicit call, since ``-m`` on a module its package already imported makes runpy warn).

Why a separate process: clock changes take milliseconds of driver time and can block; doing them
on the training thread would slow training, and a thread would compete for the GIL. This process
owns its own device, applies requests in order, coalesces bursts to the latest one, and resets
the clocks whenever it stops: on CLOSE, on pipe EOF (the trainer exited or was SIGKILLed), when
its parent pid changes, on SIGTERM, and on any error.

Faults it reports on its own (JSON lines the trainer drains at step ends, ``notices``):

- ``failed``: the device refused a clock change (NVML ``GPU is lost``, ``not supported``, ...),
  or kept refusing it through the keeper's retries (``RETRY_DELAYS_S``: a refusal that may pass is
  retried between requests, never blocking the pipe). The process resets what it can and ignores
  further clock requests: default clocks from then on.
- ``override``: something else changed the clock under us (an admin's ``nvidia-smi -rgc``). While
  it holds a lock it reads the applied clock back every ``--check-s`` seconds (one device read,
  in this process, never on the training thread) and re-applies the lock; after
  ``MAX_OVERRIDES`` overrides it gives up (``failed``) rather than fight the other tool.

Both come from ``keeper.ClockKeeper``, which ``perseus clockd`` runs per GPU as well.

Timed requests: a SET may carry a time (CLOCK_MONOTONIC, system-wide) at which to make it, so a
clock switch with a latency lands when the plan needs it (``perseus.timeline.switch_timing``): this
process holds it until then (``TimedRequests``). A request without a time, a RESET or a CLOSE
drops the timed ones still held (the trainer's latest word is "now"); a SYNC makes them at once.

Wire protocol (see ``controller.py``): 16-byte little-endian ``(op: i32, arg: i32, at: f64)``
requests on one pipe (``at`` 0: at once), JSON lines back on another.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import select
import signal
import struct
import sys
import time
from typing import Any

from perseus.errors import write_line
from perseus.gpu.control.keeper import ClockKeeper, Outcome
from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import GPUError, wire_kind
from perseus.gpu.factory import open_spec
from perseus.gpu.spec import GPUSpec

MSG = struct.Struct("<iid")
OP_SET, OP_RESET, OP_SYNC, OP_CLOSE = 1, 2, 3, 4
HISTORY_LEN = 4096


class TimedRequests:
    """SET requests to make at given times, in time order (ties: in the order received)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, at: float, mhz: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, mhz))

    def clear(self) -> None:
        self._heap.clear()

    def wait_s(self, now: float, longest: float) -> float:
        """How long to wait for the next request at most: until the next one is due."""
        return min(longest, max(self._heap[0][0] - now, 0.0)) if self._heap else longest

    def due(self, now: float) -> int | None:
        """The latest of the requests due by ``now`` (removing them all; earlier ones would be
        replaced by it anyway), or None."""
        found = None
        while self._heap and self._heap[0][0] <= now:
            found = heapq.heappop(self._heap)[2]
        return found

    def drain(self) -> int | None:
        """All held requests at once (a SYNC): the last one, or None."""
        return self.due(float("inf"))


class _Worker:
    """The process's ``ClockKeeper`` plus what ``flush()`` reports (counts, applied history)."""

    def __init__(self, dev: GPUDevice, status_fd: int) -> None:
        self.status_fd = status_fd
        self.keeper = ClockKeeper(dev, self.send)
        self.applied = 0
        self.skipped = 0
        self.errors = 0
        self.received = 0
        self.history: collections.deque[int | None] = collections.deque(maxlen=HISTORY_LEN)
        self._reported_errors: set[str] = set()

    def send(self, event: dict[str, Any]) -> None:
        try:
            os.write(self.status_fd, (json.dumps(event) + "\n").encode())
        except OSError:
            pass  # trainer gone; nothing to tell

    def apply(self, target: int | None) -> None:
        """Bring the device to ``target`` (None = reset), skipping if it is already there."""
        self._count(self.keeper.apply(target))

    def retry(self) -> None:
        """Retry a refused clock call once it is due (``ClockKeeper.maybe_retry``)."""
        retried = self.keeper.maybe_retry()
        if retried is not None:
            self._count(retried[0])

    def _count(self, outcome: Outcome) -> None:
        if outcome == "skipped":
            self.skipped += 1
        elif outcome in ("error", "retrying"):  # a refused call; said only once the retries are spent
            self.errors += 1
            key = self.keeper.last_error.split(":", 1)[0]
            if outcome == "error" and key not in self._reported_errors:  # one line per error type
                self._reported_errors.add(key)
                write_line(sys.stderr, f"perseus controller: {self.keeper.last_error.split(': ', 1)[-1]}")
        else:
            self.applied += 1
            self.history.append(self.keeper.current)

    def stats(self) -> dict[str, Any]:
        return {"applied": self.applied, "skipped": self.skipped, "errors": self.errors,
                "received": self.received, "current": self.keeper.current, "history": list(self.history)}


def serve(dev: GPUDevice, req_fd: int, status_fd: int, parent_pid: int, poll_s: float, check_s: float = 0.0) -> str:
    """Main loop; returns why it stopped. Clocks are reset by the caller in all cases.
    ``check_s`` > 0: read a held lock back that often (``_Worker.check_clock``)."""
    worker = _Worker(dev, status_fd)
    stop = {"why": ""}

    def on_term(signum: int, frame: object) -> None:
        stop["why"] = "SIGTERM"

    signal.signal(signal.SIGTERM, on_term)
    # Start from a known state: undo whatever a crashed job left (not counted; a refusal is retried).
    if worker.keeper.apply(None, force=True) == "error":  # a lost GPU: nothing to serve
        raise GPUError(f"resetting the clocks failed: {worker.keeper.last_error}")
    worker.send({"event": "ready", "pid": os.getpid(), "name": dev.name, "uuid": dev.uuid,
                 "clocks": dev.supported_sm_clocks_mhz(), "default_mhz": dev.default_sm_clock_mhz()})
    buf = b""
    wait_s = min(poll_s, check_s) if check_s > 0 else poll_s
    timed = TimedRequests()
    while not stop["why"]:
        retry_s = worker.keeper.retry_in()  # a refused call waits for its retry here, not in a sleep
        longest = wait_s if retry_s is None else min(wait_s, max(retry_s, 0.0))
        readable, _, _ = select.select([req_fd], [], [], timed.wait_s(time.monotonic(), longest))
        if os.getppid() != parent_pid:
            return "parent exited"
        if not len(timed):  # a held switch is a change on its way: read back between them only
            worker.keeper.maybe_check(check_s)
        pending: int | None = None  # coalesced SET/RESET target not yet applied (None = reset) ...
        held = False  # ... when one is held
        if readable:
            data = os.read(req_fd, 65536)
            if not data:
                return "trainer closed the request pipe"
            buf += data
            n = len(buf) // MSG.size
            for i in range(n):
                op, arg, at = MSG.unpack_from(buf, i * MSG.size)
                if op == OP_SET and at > 0:
                    worker.received += 1
                    timed.add(at, arg)
                elif op == OP_SET:
                    worker.received += 1
                    pending, held = arg, True
                    timed.clear()
                elif op == OP_RESET:
                    worker.received += 1
                    pending, held = None, True
                    timed.clear()
                elif op == OP_SYNC:
                    drained = timed.drain()
                    if drained is not None:
                        pending, held = drained, True
                    if held:
                        worker.apply(pending)
                        held = False
                    worker.send({"event": "sync", "seq": arg, **worker.stats()})
                elif op == OP_CLOSE:
                    worker.apply(None)
                    return "close requested"
            buf = buf[n * MSG.size:]
        if held:
            worker.apply(pending)
        due = timed.due(time.monotonic())
        if due is not None:
            worker.apply(due)
        worker.retry()
    return stop["why"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perseus-controller", description=__doc__)
    ap.add_argument("--spec", required=True, help="GPUSpec as JSON")
    ap.add_argument("--req-fd", type=int, required=True)
    ap.add_argument("--status-fd", type=int, required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--poll-s", type=float, default=0.1)
    ap.add_argument("--check-s", type=float, default=0.0, help="read a held clock back this often (0: never)")
    args = ap.parse_args(argv)
    # Ctrl-C reaches the whole foreground process group; the trainer decides what it means and
    # its exit (pipe EOF) makes us reset, so ignoring SIGINT here avoids a racing early exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status_fd = args.status_fd
    try:
        dev = open_spec(GPUSpec.from_json(args.spec))
        if not dev.can_set_clocks():
            dev.set_locked_sm_clock(dev.default_sm_clock_mhz())  # raises the typed permission error
    except GPUError as exc:
        # The nearest class the trainer side rebuilds (``error_from_wire``): a zeusd refusal
        # arrives as the GPUPermissionError it is, so a caller may still fall back to measure-only.
        os.write(status_fd, (json.dumps({"event": "error", "type": wire_kind(exc),
                                         "message": str(exc)}) + "\n").encode())
        return 3
    why = "error"
    try:
        why = serve(dev, args.req_fd, status_fd, args.parent_pid, args.poll_s, args.check_s)
    finally:
        closing = ClockKeeper(dev, lambda event: None)  # a refused reset is retried: never leave a lock behind
        reset_ok = closing.reset_now()
        if not reset_ok:
            why_not = closing.last_error.split(": ", 1)[-1]
            write_line(sys.stderr, f"perseus controller: resetting clocks failed: {why_not}")
        try:
            os.write(status_fd, (json.dumps({"event": "closed", "why": why, "reset": reset_ok,
                                             "time": time.time()}) + "\n").encode())
        except OSError:
            pass
        dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
