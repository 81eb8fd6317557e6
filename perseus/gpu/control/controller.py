"""Asynchronous SM-frequency control from the training thread.

Why: Perseus changes the clock before every forward/backward instruction, so the request must
cost microseconds and never block. A clock controller (``ClockController``) takes requests from
the training thread; there are three:

- ``FrequencyController`` (here): the training thread only writes an 8-byte request into a
  non-blocking pipe; a separate controller process (``perseus.gpu.control.process.main``, started
  with ``subprocess`` — fork+exec, never a bare fork of a process with torch threads) owns the
  device and applies requests. With Zeus's zeusd configured, that process's device is a
  ``ZeusdGPU``: the same process makes the changes, through zeusd's socket instead of NVML.
- ``NullController`` (here): measure-only mode; it records requests and never touches clocks.
- ``ClockdController`` (``perseus.gpu.clockd.client``): requests go to the node's
  ``perseus clockd``, which changes the clocks for unprivileged trainers.

Safety (``FrequencyController``): clocks return to default on ``close()``, on leaving a ``with``
block (also by exception), on SIGTERM/SIGINT to the trainer (handlers chain to the previous ones),
at interpreter exit, and when the trainer is SIGKILLed (the controller sees pipe EOF / a new
parent pid and resets). If the controller dies, the next request emits one
``ControllerDiedWarning``, a background thread resets the clocks, and training continues at
default clocks. If the device refuses a clock (NVML ``GPU is lost``, ``not supported``) or
something else keeps changing the clocks under us, the controller process says so with a notice
(``notices()``, drained without blocking at step ends) and stays at default clocks.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol, Self

from perseus.gpu.control.claim import GPUClaim
from perseus.gpu.control.handle import ControllerHandle
from perseus.gpu.control.process import MSG, OP_CLOSE, OP_RESET, OP_SET, OP_SYNC
from perseus.gpu.errors import GPUError, error_from_wire
from perseus.gpu.factory import open_spec
from perseus.gpu.control.latest_writer import LatestWriter
from perseus.gpu.control.notice import ClockNotice
from perseus.gpu.spec import GPUSpec

log = logging.getLogger(__name__)
_DEFAULT = -1  # marker for "default clocks" in the trainer-side dedup
# The controller process's entry: an explicit call, not ``-m perseus.gpu.control.process``, which
# runpy warns about (the package already imports that module) on every start.
_CONTROLLER_MAIN = "import sys; from perseus.gpu.control.process import main; sys.exit(main())"


class ControllerDiedWarning(RuntimeWarning):
    """The controller process is gone; training continues at default clocks."""


def caller_stacklevel() -> int:
    """``warnings.warn`` stack level of the first caller outside ``perseus.gpu``: a warning raised
    deep in the request path points at the training code (or the runtime) that made the request."""
    package = str(Path(__file__).resolve().parents[1])  # perseus/gpu
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


@dataclass
class ControllerStats:
    """What the controller process reported at the last ``flush()``."""

    applied: int = 0  # clock changes actually made
    skipped: int = 0  # requests coalesced away because the clock was already right
    errors: int = 0  # device errors while applying (printed once per type by the controller)
    received: int = 0  # requests read from the pipe (after trainer-side dedup)
    current: int | None = None  # clock the controller believes is set (None = default)
    history: list[int | None] = field(default_factory=list)  # applied clocks, in order


class ClockController(Protocol):
    """What the runtime asks of a clock controller: fire-and-forget requests, a wait, a close.

    Three implementations: ``FrequencyController`` (a child process that changes clocks, itself
    or through zeusd), ``NullController`` (measure-only mode: records requests, never touches
    clocks) and ``ClockdController`` (the node's ``perseus clockd`` changes them).
    ``timed_requests``: whether ``set_frequency`` takes an ``at`` (CLOCK_MONOTONIC seconds) to
    make the request then rather than at once (a switch latency's hiding needs it).
    """

    enabled: bool
    timed_requests: bool

    @property
    def pid(self) -> int | None:
        """The process that makes the clock changes when it is this one's child (clock traces); None
        otherwise (measure-only, the node's clock daemon)."""
        ...

    def set_frequency(self, mhz: int, at: float | None = None) -> None: ...

    def reset(self) -> None: ...

    def flush(self, timeout_s: float = 5.0) -> ControllerStats | None: ...

    @property
    def alive(self) -> bool: ...

    def close(self, timeout_s: float = 5.0) -> bool: ...

    def notices(self) -> list[ClockNotice]: ...



class NullController:
    """Measure-only mode: same interface, never touches clocks (no privileges needed)."""

    enabled = False
    timed_requests = True

    def __init__(self) -> None:
        self.requests = 0
        self.last_requested: int | None = None

    def start(self) -> NullController:
        return self

    @property
    def pid(self) -> int | None:
        return None

    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        self.requests += 1
        self.last_requested = mhz

    def reset(self) -> None:
        self.requests += 1
        self.last_requested = None

    def flush(self, timeout_s: float = 5.0) -> ControllerStats | None:
        return None

    def notices(self) -> list[ClockNotice]:
        return []

    @property
    def alive(self) -> bool:
        return True

    def close(self, timeout_s: float = 5.0) -> bool:
        return True

    def __enter__(self) -> NullController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FrequencyController(ControllerHandle):
    """Trainer-side handle of the controller process.

    ``FrequencyController(spec).start()`` (or ``with FrequencyController(spec) as c:``) spawns
    the process and waits until it has opened the device and reset its clocks. Then
    ``set_frequency(mhz)`` / ``reset()`` are fire-and-forget; ``flush()`` waits until everything
    sent so far is applied (for tests and measurement windows); ``close()`` resets and stops.
    """

    enabled = True
    timed_requests = True

    def __init__(
        self,
        spec: GPUSpec,
        *,
        install_signal_handlers: bool = True,
        start_timeout_s: float = 60.0,
        parent_poll_s: float = 0.1,
        clock_check_s: float = 0.0,
        claim: GPUClaim | None = None,
    ) -> None:
        super().__init__(start_timeout_s)
        self.spec = spec
        # The GPU's claim (``claim.py``), released with the connection; the controller process
        # inherits it, so it lasts until that process has reset the clocks, whenever the trainer goes.
        self._claim = claim
        self._check_s = clock_check_s
        self._notices: list[ClockNotice] = []
        self._install_handlers = install_signal_handlers
        self._parent_poll = parent_poll_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._req_w = -1
        self._status_r = -1
        self._status_buf = b""
        self._last = _DEFAULT
        self._writer: LatestWriter | None = None
        self._timed_sent = False  # a timed request went out since the last one without a time
        self._dead = False
        self._closing = False
        self._sync_seq = 0
        self._prev_handlers: dict[int, Any] = {}
        self.default_mhz = 0
        self.info: dict[str, Any] = {}
        self.died_warning_emitted = False

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Self:
        """Spawn the controller process and wait for it to be ready (raises its typed error)."""
        if self._proc is not None:
            return self
        req_r, req_w = os.pipe()
        status_r, status_w = os.pipe()
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-c", _CONTROLLER_MAIN, "--spec", self.spec.to_json(),
               "--req-fd", str(req_r), "--status-fd", str(status_w), "--parent-pid", str(os.getpid()),
               "--poll-s", str(self._parent_poll), "--check-s", str(self._check_s)]
        claim_fds = (self._claim.fd,) if self._claim is not None and self._claim.fd >= 0 else ()
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(req_r, status_w, *claim_fds), stdin=subprocess.DEVNULL,
                                          env=env)
        finally:
            os.close(req_r)  # only the child may hold the read end: its death must give EPIPE
            os.close(status_w)  # only the child may hold the write end: its death must give EOF
        self._req_w, self._status_r = req_w, status_r
        os.set_blocking(req_w, False)
        self._writer = LatestWriter(functools.partial(os.write, req_w), req_w, self._on_dead)
        event = self._read_event(self._start_timeout)
        if event is None or event.get("event") != "ready":
            self._fail_start(event)
        self.info = event
        self.clocks = frozenset(event["clocks"])
        self.default_mhz = int(event["default_mhz"])
        if self._install_handlers:
            self._install_signal_handlers()
        self._started()
        return self

    def _fail_start(self, event: dict[str, Any] | None) -> NoReturn:
        """The process exited (or never said ready): raise its typed error, whose message already
        says how to fix it, or say that it did not start."""
        assert self._proc is not None
        try:
            self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if event is not None and event.get("event") == "error":
            self._abort_start(error_from_wire(str(event.get("type")), str(event.get("message", "controller failed"))))
        self._abort_start(GPUError(
            f"The frequency controller process did not start (exit code {self._proc.returncode}); "
            "see its stderr above"
        ))

    @property
    def pid(self) -> int | None:
        """The controller process id (for monitoring and tests)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._dead and not self._closed and self._proc.poll() is None

    # -- hot path ---------------------------------------------------------------------------
    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        """Request SM clock ``mhz`` (fire-and-forget; a few microseconds; never blocks), at once or,
        with ``at``, at that CLOCK_MONOTONIC time (the controller holds it until then). A request
        without a time drops the timed ones the controller still holds."""
        if mhz == self._last and at is None and not self._timed_sent:
            return
        if mhz not in self.clocks:
            raise self._unsupported_clock(mhz, started=self._proc is not None)
        self._last = mhz
        self._timed_sent = at is not None
        self._send(MSG.pack(OP_SET, mhz, float(at) if at is not None and at > 0 else 0.0))

    def reset(self) -> None:
        """Request default (unlocked) clocks."""
        if self._last == _DEFAULT and not self._timed_sent:
            return
        self._last = _DEFAULT
        self._timed_sent = False
        self._send(MSG.pack(OP_RESET, 0, 0.0))

    def _send(self, msg: bytes) -> None:
        if self._dead or self._closed or self._writer is None:
            return
        self._writer.offer(msg)  # pipe full (controller stalled): only the latest request is kept

    # -- health -----------------------------------------------------------------------------
    def _on_dead(self, warn: bool = True) -> None:
        if self._dead:
            return
        self._dead = True
        code = self._proc.poll() if self._proc is not None else None
        if not self._closing:
            if not warn:
                threading.Thread(target=self._background_reset, name="perseus-clock-reset", daemon=True).start()
                return
            self.died_warning_emitted = True
            warnings.warn(
                f"Perseus frequency controller process (pid {self.pid}) exited unexpectedly "
                f"(exit code {code}). Frequency control is disabled for the rest of this run; "
                "training continues at default GPU clocks.",
                ControllerDiedWarning,
                stacklevel=caller_stacklevel(),
            )
            threading.Thread(target=self._background_reset, name="perseus-clock-reset", daemon=True).start()

    def _background_reset(self) -> None:
        """Undo a lock the dead controller may have left, off the training thread."""
        try:
            dev = open_spec(self.spec)
            try:
                dev.reset_locked_sm_clock()
            finally:
                dev.close()
        except Exception as exc:  # noqa: BLE001 - best effort, must never reach training code
            log.warning("Perseus could not reset GPU clocks after the controller died: %s", exc)

    def notices(self) -> list[ClockNotice]:
        """Notices the controller sent unasked since the last call (``override``: it re-applied a
        clock something else changed; ``failed``: the device refused a clock, default clocks from
        now on). Never blocks: one ``select`` when nothing is waiting (step ends only)."""
        if self._proc is not None and not self._dead and not self._closed and self._proc.poll() is not None:
            # Died between requests (a plan holding one clock sends none): reset now, not at the
            # next request. The caller gets the notice and says so; no second warning.
            self._on_dead(warn=False)
            self._notices.append(ClockNotice.failed(f"the controller process (pid {self.pid}) exited unexpectedly "
                                                    f"(exit code {self._proc.returncode})"))
        if self._status_r >= 0 and not self._dead and not self._closed:
            try:
                while select.select([self._status_r], [], [], 0)[0]:
                    chunk = os.read(self._status_r, 65536)
                    if not chunk:
                        break
                    self._status_buf += chunk
            except OSError:
                pass
            while b"\n" in self._status_buf:
                line, self._status_buf = self._status_buf.split(b"\n", 1)
                self._keep_notice(json.loads(line))
        out, self._notices = self._notices, []
        return out

    def _keep_notice(self, event: dict[str, Any]) -> None:
        notice = ClockNotice.from_wire(event)  # the edge: a dict on the pipe, a value from here on
        if notice is not None:
            self._notices.append(notice)

    # -- synchronization --------------------------------------------------------------------
    def _read_event(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._status_buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([self._status_r], [], [], left)
            if not readable:
                return None
            chunk = os.read(self._status_r, 65536)
            if not chunk:
                return None
            self._status_buf += chunk
        line, self._status_buf = self._status_buf.split(b"\n", 1)
        return json.loads(line)

    def flush(self, timeout_s: float = 5.0) -> ControllerStats | None:
        """Wait until every request sent so far is applied; ``None`` if the controller is gone."""
        if self._dead or self._closed or self._proc is None or self._writer is None:
            return None
        deadline = time.monotonic() + timeout_s
        self._sync_seq += 1
        if not self._writer.send(MSG.pack(OP_SYNC, self._sync_seq, 0.0), deadline):
            return None
        while True:
            event = self._read_event(max(0.0, deadline - time.monotonic()))
            if event is None:
                if self._proc.poll() is not None:
                    self._on_dead()
                return None
            self._keep_notice(event)
            if event.get("event") == "sync" and event.get("seq") == self._sync_seq:
                return ControllerStats(**{k: event[k] for k in
                                          ("applied", "skipped", "errors", "received", "current", "history")})

    def close(self, timeout_s: float = 5.0) -> bool:
        """Reset clocks and stop the controller; True if the reset was confirmed. Idempotent."""
        if self._closed or self._closing or self._proc is None:
            return False
        if self._forked():
            return False
        self._closing = True
        confirmed = False
        try:
            if not self._dead and self._writer is not None:
                deadline = time.monotonic() + timeout_s
                self._writer.send(MSG.pack(OP_CLOSE, 0, 0.0), deadline)
                while True:
                    event = self._read_event(max(0.0, deadline - time.monotonic()))
                    if event is None:
                        break
                    if event.get("event") == "closed":
                        confirmed = bool(event.get("reset"))
                        break
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.terminate()  # SIGTERM: the controller still resets before exiting
                try:
                    self._proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:
            self._closed_now()  # before ``_closing`` clears: a signal in between finds it closed
            self._closing = False
            self._restore_signal_handlers()
        return confirmed

    def _drop_connection(self) -> None:
        for fd in (self._req_w, self._status_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError as exc:
                    if exc.errno != errno.EBADF:
                        raise
        self._req_w = self._status_r = -1
        if self._claim is not None:
            self._claim.release()

    def _forget_in_forked_child(self) -> None:
        if self._claim is not None:
            self._claim.forget()  # the parent's claim stays in force
        super()._forget_in_forked_child()

    # -- signals ----------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works in the main thread; EOF detection still covers us
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._prev_handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, prev in self._prev_handlers.items():
            # Only undo our own handler; if someone chained on top of us, leave theirs in place.
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._prev_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        self.close(timeout_s=2.0)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # SIG_DFL (or unknown): die the way the signal intended
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def make_controller(spec: GPUSpec, *, enabled: bool = True, **kwargs: Any) -> FrequencyController | NullController:
    """``enabled=False`` → measure-only ``NullController`` (no process, no privileges)."""
    return FrequencyController(spec, **kwargs) if enabled else NullController()
