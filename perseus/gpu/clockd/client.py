"""``ClockdController``: the trainer's handle on ``perseus clockd`` (no privileges needed).

Same surface as ``FrequencyController`` (``start``, ``set_frequency``, ``reset``, ``flush``,
``notices``, ``close``, ``alive``, context manager), so ``GPUPort`` and the runtime use either
without asking which. On the training thread, ``set_frequency`` looks up a pre-encoded frame and
does one non-blocking ``send`` (``LatestWriter``); if the socket buffer is full (the daemon is
busy or rate-limiting), the request is kept and replaced by later ones, i.e. coalesced to the
latest, and goes out at the next call or ``flush()``.

Faults arrive as the local controller's do: the daemon reads a held clock back every
``clock_check_s`` and sends ``override`` and ``failed`` notices (``ClockKeeper``), which
``notices()`` drains without blocking at step ends; a daemon that closes the connection is a
``failed`` notice too (it reset the GPU as it went).

Clock safety is the daemon's job: it resets the GPU when this connection closes, which the kernel
does for us on any exit, SIGKILL included. So there are no signal handlers here; an at-fork hook
(``ControllerHandle``, shared with ``FrequencyController``) closes a forked child's copy of the
socket (a DataLoader worker must not keep the connection, and with it the clock lock, alive after
the trainer dies).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
import warnings
from typing import Any, Self

from perseus.gpu.clockd import wire
from perseus.gpu.control.controller import ControllerDiedWarning, ControllerStats, caller_stacklevel
from perseus.gpu.control.handle import ControllerHandle
from perseus.gpu.errors import (
    GPUError,
    GPUInvalidArgumentError,
    GPUNotFoundError,
    GPUPermissionError,
    error_from_wire,
)
from perseus.gpu.control.latest_writer import LatestWriter
from perseus.gpu.control.notice import ClockNotice

log = logging.getLogger(__name__)
ENV_SOCKET = "PERSEUS_CLOCKD_SOCKET"
_DEFAULT = -1  # "default clocks" in the trainer-side dedup
_UNSET = object()


def clockd_socket_from_env() -> str | None:
    """``$PERSEUS_CLOCKD_SOCKET``, or ``None`` when unset or empty."""
    value = os.environ.get(ENV_SOCKET, "").strip()
    return value or None


class ClockdRefusedError(GPUPermissionError):
    """The clock daemon refused this process (not on its uid/gid allowlist, or a failed check)."""

    def __init__(self, what: str) -> None:
        self.what = what
        GPUError.__init__(self, f"{what}. Ask the node administrator to allow your uid/gid in "
                                "`perseus clockd` (--allow-uid/--allow-gid), or run in measure-only mode.")

    @classmethod
    def from_wire(cls, message: str) -> Self:
        """The daemon's refusal says why; what to do about it is this side's to add."""
        return cls(message)


# The error classes of the daemon's error codes (``GPUError`` for the others).
ERROR_CLASSES: dict[str, type[GPUError]] = {wire.E_FORBIDDEN: ClockdRefusedError, wire.E_NOT_FOUND: GPUNotFoundError,
                                            wire.E_BAD_CLOCK: GPUInvalidArgumentError}


class ClockdController(ControllerHandle):
    """Clock requests for this process's GPU(s), served by ``perseus clockd``.

    ``uuid`` (the GPU's UUID as this process sees it: ``device.uuid``) identifies the GPU even in a
    container whose CUDA numbering differs from the node's; ``device_index`` (CUDA index) and
    ``cuda_visible_devices`` (default: this process's environment) are sent too, and the daemon
    resolves them when no UUID is given. ``clock_check_s`` > 0: the daemon reads a held clock
    back that often (at least its ``--min-clock-check-s``) and re-applies it if something else
    changed it. The daemon makes every request at once (``timed_requests`` False): the runtime
    then asks for each clock when the instruction before it ends instead of timing its switches
    (docs/runtime.md, "Clock-switch latency").
    """

    enabled = True
    timed_requests = False

    def __init__(
        self,
        socket_path: str,
        *,
        uuid: str | None = None,
        device_index: int = 0,
        cuda_visible_devices: Any = _UNSET,
        start_timeout_s: float = 30.0,
        clock_check_s: float = 0.0,
    ) -> None:
        super().__init__(start_timeout_s)
        self.socket_path = str(socket_path)
        self.uuid = uuid
        self.device_index = int(device_index)
        self.cuda_visible_devices: str | None = (os.environ.get("CUDA_VISIBLE_DEVICES")
                                                 if cuda_visible_devices is _UNSET else cuda_visible_devices)
        self.clock_check_s = float(clock_check_s)
        self._sock: socket.socket | None = None
        self._rbuf = bytearray()
        self._writer: LatestWriter | None = None
        self._notices: list[ClockNotice] = []
        self._frames: dict[int, bytes] = {}
        self._reset_frame = wire.frame({"op": "reset", "gpu": 0})
        self._last = _DEFAULT
        self._dead = False
        self._closing = False
        self._sync_seq = 0
        self.default_mhz = 0
        self.info: dict[str, Any] = {}
        self.errors: list[str] = []  # asynchronous error replies seen so far (capped)
        self.died_warning_emitted = False

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """None: the clocks are changed by the node's daemon, not a child of this process."""
        return None

    def start(self) -> Self:
        """Connect, claim the GPU, wait for the daemon's OK (raises a typed ``GPUError``)."""
        if self._sock is not None:
            return self
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._start_timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise GPUError(f"cannot reach the perseus clock daemon at {self.socket_path} ({exc}); is "
                           f"`perseus clockd` running on this node, and is {ENV_SOCKET} right?") from None
        self._sock = sock
        hello = {"op": "hello", "v": wire.VERSION, "pid": os.getpid(),
                 "cuda_visible_devices": self.cuda_visible_devices, "devices": [self.device_index],
                 "uuids": [self.uuid] if self.uuid else None, "clock_check_s": self.clock_check_s}
        failure = "no reply to HELLO (daemon gone or too slow)"
        try:
            sock.sendall(wire.frame(hello))
        except OSError as exc:  # a refusing daemon may answer and close before reading HELLO
            failure = f"connection failed ({exc})"
        try:
            reply = self._read_reply(time.monotonic() + self._start_timeout, blocking_sock=True)
        except OSError as exc:
            reply, failure = None, f"connection failed ({exc})"
        if reply is None:
            reply = {"op": "error", "code": "io", "message": failure}
        if reply.get("op") != "ok":
            text = f"perseus clockd at {self.socket_path}: {reply.get('message')}"
            self._abort_start(error_from_wire(str(reply.get("code")), text, ERROR_CLASSES))
        gpu = reply["gpus"][0]
        self.info = gpu
        self.clocks = frozenset(int(c) for c in gpu["clocks"])
        self.default_mhz = int(gpu["default_mhz"])
        self._frames = {c: wire.frame({"op": "set", "gpu": 0, "mhz": c}) for c in self.clocks}
        sock.setblocking(False)
        self._writer = LatestWriter(lambda data: sock.send(data, socket.MSG_NOSIGNAL), sock.fileno(), self._on_dead)
        self._started()
        return self

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self._dead and not self._closed

    # -- hot path ---------------------------------------------------------------------------
    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        """Request SM clock ``mhz`` (fire-and-forget; one non-blocking send; never blocks)."""
        if at is not None:
            raise GPUInvalidArgumentError("perseus clockd makes clock requests at once; it takes no request time")
        if mhz == self._last:
            return
        frame = self._frames.get(mhz)
        if frame is None:
            raise self._unsupported_clock(mhz, started=self._sock is not None)
        self._last = mhz
        self._send(frame)

    def reset(self) -> None:
        """Request default (unlocked) clocks."""
        if self._last == _DEFAULT:
            return
        self._last = _DEFAULT
        self._send(self._reset_frame)

    def _send(self, frame: bytes) -> None:
        if self._dead or self._closed or self._writer is None:
            return
        self._writer.offer(frame)  # the latest wins; older unsent requests are dropped

    # -- health -----------------------------------------------------------------------------
    def _on_dead(self) -> None:
        if self._dead:
            return
        self._dead = True
        if not self._closed and not self._closing:
            self.died_warning_emitted = True
            warnings.warn(
                f"The perseus clock daemon at {self.socket_path} closed the connection. Frequency "
                "control is disabled for the rest of this run; the daemon resets the GPU's clocks "
                "when a connection ends (and on its own shutdown), so training continues at default clocks.",
                ControllerDiedWarning,
                stacklevel=caller_stacklevel(),
            )

    # -- synchronization --------------------------------------------------------------------
    def _read_reply(self, deadline: float, *, blocking_sock: bool = False) -> dict[str, Any] | None:
        """Next reply frame, or None on timeout/EOF."""
        assert self._sock is not None
        while True:
            try:
                payloads = wire.split_frames(self._rbuf, wire.MAX_REPLY)
            except wire.ProtocolError:
                return None
            if payloads:
                # put back any extra frames behind the first one
                rest = b"".join(wire.HEADER.pack(len(p)) + p for p in payloads[1:])
                self._rbuf[:0] = rest
                try:
                    return wire.decode(payloads[0])
                except wire.ProtocolError:
                    return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if blocking_sock:
                self._sock.settimeout(left)
                try:
                    chunk = self._sock.recv(65536)
                except (socket.timeout, BlockingIOError):
                    return None
            else:
                readable, _, _ = select.select([self._sock], [], [], left)
                if not readable:
                    return None
                try:
                    chunk = self._sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
            if not chunk:
                return None
            self._rbuf += chunk

    def _note_error(self, reply: dict[str, Any]) -> None:
        message = f"{reply.get('code')}: {reply.get('message')}"
        if not any(e == message for e in self.errors):
            log.warning("perseus clockd reported an error: %s", message)
        if len(self.errors) < 100:
            self.errors.append(message)

    def flush(self, timeout_s: float = 5.0) -> ControllerStats | None:
        """Wait until everything sent so far is applied; ``None`` if the daemon is gone."""
        if self._dead or self._closed or self._sock is None:
            return None
        assert self._writer is not None
        deadline = time.monotonic() + timeout_s
        self._sync_seq += 1
        if not self._writer.send(wire.frame({"op": "sync", "seq": self._sync_seq}), deadline):
            return None
        while True:
            reply = self._read_reply(deadline)
            if reply is None:
                if time.monotonic() < deadline:  # EOF or garbage, not a timeout
                    self._on_dead()
                return None
            op = reply.get("op")
            if op in ("error", "notice"):
                self._unasked(reply)
            elif op == "sync" and reply.get("seq") == self._sync_seq:
                current = reply.get("current") or [None]
                history = reply.get("history") or [[]]
                return ControllerStats(applied=int(reply["applied"]), skipped=int(reply["skipped"]),
                                       errors=int(reply["errors"]), received=int(reply["received"]),
                                       current=current[0], history=list(history[0]))

    def _unasked(self, reply: dict[str, Any]) -> None:
        """An error reply (logged once) or a notice (kept for ``notices()``)."""
        if reply.get("op") == "error":
            self._note_error(reply)
        elif (notice := ClockNotice.from_wire(reply)) is not None:  # the edge: a dict on the socket
            self._notices.append(notice)

    def notices(self) -> list[ClockNotice]:
        """Notices the daemon sent unasked since the last call (``override``: it re-applied a clock
        something else changed; ``failed``: the device refused a clock, or the daemon closed the
        connection: default clocks from now on). Never blocks: reads only what has arrived."""
        if self._sock is not None and not self._dead and not self._closed:
            eof = False
            try:
                while select.select([self._sock], [], [], 0)[0]:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        eof = True
                        break
                    self._rbuf += chunk
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                eof = True
            while (reply := self._read_reply(0.0)) is not None:
                self._unasked(reply)
            if eof:
                # The daemon went away between requests (a plan holding one clock sends none). It
                # resets a GPU when the connection ends; say so once, as the notice, not a warning.
                self._dead = True
                self._notices.append(ClockNotice.failed(
                    f"the perseus clock daemon at {self.socket_path} closed the connection (the daemon resets "
                    "the GPU as it does; one killed outright does so when it starts again)"))
        out, self._notices = self._notices, []
        return out

    def close(self, timeout_s: float = 5.0) -> bool:
        """Ask the daemon to reset and release the GPU; True if the reset was confirmed. Idempotent."""
        if self._closed or self._sock is None or self._forked():
            return False
        confirmed = False
        self._closing = True
        try:
            if not self._dead and self._writer is not None:
                deadline = time.monotonic() + timeout_s
                if self._writer.send(wire.frame({"op": "bye"}), deadline):
                    while True:
                        reply = self._read_reply(deadline)
                        if reply is None:
                            break
                        if reply.get("op") in ("error", "notice"):
                            self._unasked(reply)
                        elif reply.get("op") == "bye":
                            confirmed = bool(reply.get("reset"))
                            break
        finally:
            self._closed_now()
        return confirmed

    def _drop_connection(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
