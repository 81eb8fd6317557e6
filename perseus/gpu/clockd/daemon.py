"""``perseus clockd``: a per-node clock daemon, so trainers need no privileges to change clocks.

An administrator runs it once per node with CAP_SYS_ADMIN (systemd unit, Kubernetes DaemonSet:
see ``scripts/``). It owns the GPUs it is told to manage and serves a Unix stream socket; trainers
without privileges ask it for clocks through ``ClockdController`` (same surface as
``FrequencyController``), which the runtime uses when ``PERSEUS_CLOCKD_SOCKET`` is set.

Security model (docs/gpu.md, "clockd"):

- every connection is authenticated by the kernel (``SO_PEERCRED``): its uid or gid must be on
  the allowlist, otherwise it gets one ``forbidden`` error and is closed;
- a client claims GPUs in HELLO (its CUDA_VISIBLE_DEVICES and CUDA indices, or their UUIDs) and
  may claim a GPU only if no other live client holds it; every later request names one of *its*
  claimed GPUs, so it can never touch another job's;
- only the GPU's supported SM clocks are accepted; requests are rate-limited per client by a token
  bucket, and the excess coalesces to the latest target (Perseus sends one per instruction);
- a GPU's clocks are reset when its client says BYE, disconnects, dies (SIGKILL closes the
  socket; the peer pid is also polled), and on the daemon's own SIGTERM/SIGINT; at start the
  daemon resets every managed GPU, undoing what a killed daemon may have left;
- input is never trusted: length-prefixed frames of at most ``MAX_REQUEST`` bytes, every field
  checked (``clockd_wire``); a bad message gets an error reply, an oversized frame, too many
  errors or a client that stops reading get that client dropped, and the daemon keeps serving.

Faults are handled as by the local controller process, with the same ``ClockKeeper`` per GPU: a
refused lock resets that GPU, stops locking it for that claim and sends the holder a ``failed``
notice; a clock changed from outside is read back (every ``clock_check_s`` the client asked for,
at least ``--min-clock-check-s``), re-applied and reported (``override``), and given up after
``MAX_OVERRIDES``. Notices go only to the holder of the claim they came from (protocol v2).

One ``selectors`` loop owns every connection, claim and rate limit, so the ownership rules are
race-free; the driver calls (and read-backs) run on one applier thread per GPU (a clock change
takes milliseconds, and eight GPUs must not queue behind each other). A request the applier has
not taken yet is replaced by the next one (coalescing); SYNC and BYE are answered once the
applier is past them.
"""

from __future__ import annotations

import collections
import logging
import os
import selectors
import signal
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from perseus.gpu.clockd import wire
from perseus.gpu.control.keeper import ClockKeeper
from perseus.gpu.nvml.cuda_visible import parse_cuda_visible_devices, resolve_physical_index
from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUPermissionError

log = logging.getLogger("perseus.clockd")

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
MAX_OUTBUF = 256 * 1024  # a client that stops reading its replies is dropped beyond this
MAX_BAD_REQUESTS = 16  # malformed messages tolerated per client before it is dropped
MAX_WAITING_SYNCS = 1024  # SYNCs waiting for rate-limited requests; more is a flood
HISTORY_LEN = 256
NVIDIA_MAJOR = 195


@dataclass
class DaemonOptions:
    """Policy knobs of one daemon (the CLI flags of ``perseus clockd``)."""

    socket_path: str
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()
    rate_hz: float = 500.0  # sustained clock changes per second per client
    burst: int = 50  # bucket size: changes allowed back to back
    max_clients: int = 64
    socket_mode: int = 0o666  # who may connect() at all; the uid/gid allowlist is the real check
    verify_environ: bool = False  # require CUDA_VISIBLE_DEVICES in HELLO == the peer's /proc environ
    require_open_device: bool = False  # the peer must hold each claimed GPU's /dev/nvidia<N> open
    liveness_s: float = 0.5  # how often peer pids are checked (a leaked socket fd hides a death)
    hello_timeout_s: float = 30.0  # a connection that holds no GPU after this long is closed
    min_clock_check_s: float = 0.05  # a client's read-back period is at least this (one device read each)

    def __post_init__(self) -> None:
        if not self.allow_uids and not self.allow_gids:
            raise GPUInvalidArgumentError("clockd needs at least one --allow-uid or --allow-gid")
        if self.rate_hz <= 0 or self.burst < 1:
            raise GPUInvalidArgumentError("clockd: rate must be > 0 and burst >= 1")
        if not 0 < self.min_clock_check_s <= wire.MAX_CHECK_S:
            raise GPUInvalidArgumentError(f"clockd: the minimum clock-check period must be in (0, {wire.MAX_CHECK_S:g}] s")


class _GPU:
    """A managed GPU: its device, its holder and the clock the daemon last set (None = default)."""

    def __init__(self, device: GPUDevice) -> None:
        self.device = device
        self.index = device.index
        self.uuid = device.uuid
        self.name = device.name
        self.clocks = list(device.supported_sm_clocks_mhz())
        self.clockset = frozenset(self.clocks)
        self.default_mhz = int(device.default_sm_clock_mhz())
        self.holder: _Client | None = None
        self.requested: int | None = None  # loop-owned: the latest target handed to the applier
        # The applier thread (one per GPU) owns the device while serving: a driver call takes
        # milliseconds, and GPUs must not wait for each other. Its ``keeper`` applies targets,
        # gives up when the device refuses one and reads a held lock back, exactly as the local
        # controller process does. Shared with the loop under ``cond``:
        self.cond = threading.Condition()
        self.want: int | None = None
        self.want_tag: object = None
        self.want_force = False
        self.want_claim: _Claim | None = None  # a new holder for the keeper, handed over with a request
        self.want_seq = 0  # bumped per request; requests not yet taken are coalesced to the latest
        self.done_seq = 0  # want_seq of the last request the applier finished
        self.results: list[tuple[object, str, int | None, dict[str, Any]]] = []  # (tag, kind, target, info)
        self.stopping = False
        self.keeper = ClockKeeper(device, self._keeper_event)  # applier-owned
        self.claim = _Claim(None, 0.0)  # applier-owned: whose notices these are, how often to read back
        self.thread: threading.Thread | None = None
        minor = device.minor_number()
        # st_rdev of /dev/nvidia<minor> (NVIDIA's character-device major is 195); None: unknown
        self.rdev: int | None = os.makedev(NVIDIA_MAJOR, minor) if minor is not None else None

    @property
    def current(self) -> int | None:
        """The clock the applier last set (None = default)."""
        return self.keeper.current

    def request(self, target: int | None, tag: object, *, force: bool = False, claim: _Claim | None = None) -> int:
        """Hand ``target`` to the applier (replacing one it has not taken yet); returns its seq.
        ``claim``: the GPU changes hands (HELLO, release) before ``target`` is applied."""
        with self.cond:
            self.want, self.want_tag = target, tag
            self.want_force = force or self.want_force
            self.want_claim = claim if claim is not None else self.want_claim
            self.want_seq += 1
            self.cond.notify()
            return self.want_seq

    def _keeper_event(self, event: dict[str, Any]) -> None:
        """A keeper notice (``failed``, ``override``): for the holder of the claim it came from."""
        with self.cond:
            self.results.append((self.claim.holder, event["event"], None, event))

    def run_applier(self, wake: Callable[[], None]) -> None:
        while True:
            with self.cond:
                while self.done_seq == self.want_seq and not self.stopping:
                    due = self.keeper.next_check_in(self.claim.check_s)
                    if due is not None and due <= 0:
                        break
                    self.cond.wait(due)
                if self.done_seq == self.want_seq:
                    if self.stopping:
                        return  # stopping, and nothing left to apply
                    request = None  # a read-back is due
                else:
                    request = (self.want, self.want_tag, self.want_seq, self.want_force, self.want_claim)
                    self.want_force, self.want_claim = False, None
            if request is None:
                self.keeper.maybe_check(self.claim.check_s)
                wake()
                continue
            target, tag, seq, force, claim = request
            if claim is not None:
                self.claim = claim
                self.keeper.restart()
            outcome = self.keeper.apply(target, force=force)
            with self.cond:
                self.done_seq = seq
                self.results.append((tag, outcome, target, {"message": self.keeper.last_error}))
            wake()

    def describe(self, slot: int) -> dict[str, Any]:
        return {"slot": slot, "uuid": self.uuid, "name": self.name, "index": self.index,
                "clocks": self.clocks, "default_mhz": self.default_mhz}


@dataclass(frozen=True)
class _Claim:
    """Who holds a GPU, as its applier sees it: notices go to ``holder``; ``check_s`` > 0 reads a
    held lock back that often (the client's ``clock_check_s``, at least the daemon's minimum)."""

    holder: _Client | None
    check_s: float


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    pid: int
    uid: int
    gid: int
    start_ticks: str | None
    tokens: float
    t_tokens: float
    connected_at: float = 0.0
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    gpus: list[_GPU] = field(default_factory=list)
    pending: dict[int, int | None] = field(default_factory=dict)  # slot → coalesced target
    marks: dict[int, int] = field(default_factory=dict)  # slot → seq a SYNC must see applied
    bye_marks: list[tuple[_GPU, int]] | None = None  # BYE answered once these resets are done
    bye_ok: bool = True
    syncs: list[int] = field(default_factory=list)  # SYNC seqs answered once pending is applied
    received: int = 0
    applied: int = 0
    skipped: int = 0
    errors: int = 0
    bad: int = 0
    closing: bool = False  # drop once outbuf is flushed
    version: int = 1  # the protocol version its HELLO spoke (2: notices, read-back)
    history: list[collections.deque[int | None]] = field(default_factory=list)

    @property
    def who(self) -> str:
        return f"pid {self.pid} (uid {self.uid}, gid {self.gid})"


def _proc_start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/PID/stat): tells a live peer from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.rsplit(b")", 1)[-1].split()[19].decode()


def _open_char_devices(pid: int, device_prefix: str = "/dev/") -> set[int] | None:
    """``st_rdev`` of every character device ``pid`` holds open; None if its fds can't be read.

    Holding ``/dev/nvidia<N>`` open proves the job was given that GPU: the scheduler's device
    cgroup (Kubernetes device plugin, SLURM ConstrainDevices) decides who may open it.
    """
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return None
    found: set[int] = set()
    for name in names:
        try:
            # Only stat device nodes: stat on a hostile FUSE file could block the daemon's loop.
            if not os.readlink(f"{base}/{name}").startswith(device_prefix):
                continue
            st = os.stat(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        if stat.S_ISCHR(st.st_mode):
            found.add(st.st_rdev)
    return found


def _proc_environ_cvd(pid: int) -> tuple[bool, str | None]:
    """(readable, CUDA_VISIBLE_DEVICES) of the peer's exec-time environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False, None
    for entry in entries:
        if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
            return True, entry.split(b"=", 1)[1].decode(errors="replace")
    return True, None


class ClockDaemon:
    """The daemon: ``ClockDaemon(devices, options).serve_forever()`` until ``stop()`` or a signal."""

    def __init__(self, devices: list[GPUDevice], options: DaemonOptions) -> None:
        if not devices:
            raise GPUInvalidArgumentError("clockd: no GPUs to manage")
        self.options = options
        self.gpus = [_GPU(d) for d in devices]
        by_index = {g.index: g for g in self.gpus}
        if len(by_index) != len(self.gpus):
            raise GPUInvalidArgumentError("clockd: a GPU index is given twice")
        self._by_index = by_index
        self._by_uuid = {g.uuid.lower(): g for g in self.gpus}
        # For CUDA_VISIBLE_DEVICES resolution: physical index → UUID ("" = not managed here).
        self._uuid_table = [by_index[i].uuid if i in by_index else "" for i in range(max(by_index) + 1)]
        self.clients: dict[int, _Client] = {}
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = False
        self._stop_why = ""
        self._next_liveness = 0.0
        self._done: dict[int, int] = {}
        self.ready = threading.Event()  # set once the socket accepts connections (tests, threads)

    # -- lifecycle --------------------------------------------------------------------------
    def _check_privileges(self) -> None:
        for g in self.gpus:
            if not g.device.can_set_clocks():
                raise GPUPermissionError(f"clockd: changing the clocks of GPU {g.index} ({g.name})")

    def _bind(self) -> socket.socket:
        path = self.options.socket_path
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise GPUError(f"clockd: {path} exists and is not a socket; refusing to replace it")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale socket of a daemon that died
            else:
                raise GPUError(f"clockd: another daemon already serves {path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, self.options.socket_mode)
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise GPUError(f"clockd: cannot serve {path}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return sock

    def start(self) -> ClockDaemon:
        """Check privileges, reset every managed GPU, bind the socket."""
        self._check_privileges()
        self._listener = self._bind()  # first: if another daemon serves this path, touch nothing
        try:
            for g in self.gpus:
                g.device.reset_locked_sm_clock()  # undo what a killed daemon (or a crashed job) left
        except BaseException:
            self._listener.close()
            self._listener = None
            os.unlink(self.options.socket_path)
            raise
        for g in self.gpus:
            g.thread = threading.Thread(target=g.run_applier, args=(self._wake,), daemon=True,
                                        name=f"perseus-clockd-gpu{g.index}")
            g.thread.start()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        log.info("perseus clockd: serving %s for GPUs %s (uids %s, gids %s)", self.options.socket_path,
                 ", ".join(f"{g.index} {g.uuid}" for g in self.gpus),
                 sorted(self.options.allow_uids), sorted(self.options.allow_gids))
        self.ready.set()
        return self

    def stop(self, why: str = "stop requested") -> None:
        """Ask the loop to shut down (thread- and signal-safe)."""
        self._stop_why = self._stop_why or why
        self._stop = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # already woken (buffer full) or shutting down

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT → reset every GPU, remove the socket, exit (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop(signal.Signals(signum).name))

    def serve_forever(self) -> str:
        """Run until ``stop()``; always resets the GPUs and removes the socket. Returns why it stopped."""
        if self._listener is None:
            self.start()
        try:
            while not self._stop:
                self._step(self._timeout())
        finally:
            self._shutdown()
        return self._stop_why

    def _shutdown(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client, "daemon shutting down")
        for g in self.gpus:
            with g.cond:
                g.stopping = True
                g.cond.notify()
        for g in self.gpus:
            if g.thread is not None:
                g.thread.join(timeout=30)
        for g in self.gpus:  # appliers are done: reset here, whatever they managed
            self._reset_gpu(g)
        if self._listener is not None:
            self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.options.socket_path)
            except FileNotFoundError:
                pass
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        log.info("perseus clockd: stopped (%s); clocks reset", self._stop_why)

    # -- the loop ---------------------------------------------------------------------------
    def _timeout(self) -> float:
        timeout = self.options.liveness_s
        now = time.monotonic()
        for c in self.clients.values():
            if c.pending and not c.closing:
                timeout = min(timeout, max(0.0, (1.0 - c.tokens) / self.options.rate_hz
                                           - (now - c.t_tokens)))
        return timeout

    def _step(self, timeout: float) -> None:
        for key, mask in self._sel.select(timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            else:
                client: _Client = key.data
                if client.sock.fileno() < 0 or self.clients.get(client.sock.fileno()) is not client:
                    continue  # dropped earlier in this round
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(client)
                    if mask & selectors.EVENT_WRITE and self.clients.get(client.sock.fileno()) is client:
                        self._write(client)
                except Exception as exc:  # one client's problem never stops the daemon
                    log.exception("perseus clockd: dropping %s after an unexpected error", client.who)
                    self._drop(client, f"internal error: {exc}")
        # What the appliers had finished *before* collecting their results: SYNC and BYE answers
        # then carry the stats of everything they wait for.
        self._done = {id(g): g.done_seq for g in self.gpus}
        self._collect_results()
        for client in list(self.clients.values()):
            if client.bye_marks is not None and all(self._done[id(g)] >= seq for g, seq in client.bye_marks):
                client.bye_marks = None
                self._reply(client, {"op": "bye", "reset": client.bye_ok})
            elif not client.closing and self.clients.get(client.sock.fileno()) is client:
                try:
                    self._service(client)
                except Exception as exc:  # as above
                    log.exception("perseus clockd: dropping %s after an unexpected error", client.who)
                    self._drop(client, f"internal error: {exc}")
        now = time.monotonic()
        if now >= self._next_liveness:
            self._next_liveness = now + self.options.liveness_s
            self._check_liveness()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the clients we have
                log.warning("perseus clockd: accept failed: %s", exc)
                return
            try:
                sock.setblocking(False)
                pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            except OSError as exc:  # the peer is already gone
                log.debug("perseus clockd: dropping a connection without credentials: %s", exc)
                sock.close()
                continue
            now = time.monotonic()
            client = _Client(sock, pid, uid, gid, _proc_start_ticks(pid) if pid > 0 else None,
                             tokens=float(self.options.burst), t_tokens=now, connected_at=now)
            self.clients[sock.fileno()] = client
            self._sel.register(sock, selectors.EVENT_READ, client)
            if uid not in self.options.allow_uids and gid not in self.options.allow_gids:
                log.warning("perseus clockd: refused %s: not on the allowlist", client.who)
                self._fail(client, wire.E_FORBIDDEN,
                           f"uid {uid} / gid {gid} may not change GPU clocks through this daemon; "
                           "ask the administrator to add it (--allow-uid / --allow-gid)")
            elif len(self.clients) > self.options.max_clients:
                self._fail(client, wire.E_OVERLOADED, f"too many clients (limit {self.options.max_clients})")
            else:
                log.info("perseus clockd: connection from %s", client.who)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(client, f"receive failed: {exc}")
            return
        if not data:
            self._drop(client, "disconnected")
            return
        if client.closing:
            return  # already answered with a final error; ignore the rest
        client.inbuf += data
        try:
            payloads = wire.split_frames(client.inbuf, wire.MAX_REQUEST)
        except wire.ProtocolError as exc:  # oversized frame: cannot resynchronize
            payloads = []
            self._fail(client, exc.code, str(exc))
        for payload in payloads:
            if client.closing:
                break
            try:
                self._handle(client, wire.parse_request(payload))
            except wire.ProtocolError as exc:
                self._error(client, exc.code, str(exc))
                if exc.code == wire.E_BAD_REQUEST:
                    client.bad += 1
                    if client.bad > MAX_BAD_REQUESTS:
                        self._fail(client, wire.E_BAD_REQUEST, "too many malformed requests")

    def _write(self, client: _Client) -> None:
        if client.outbuf:
            try:
                n = client.sock.send(client.outbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._drop(client, f"send failed: {exc}")
                return
            del client.outbuf[:n]
        if not client.outbuf:
            if client.closing and client.bye_marks is None:
                self._drop(client, "closed after a final reply")
            else:
                self._sel.modify(client.sock, selectors.EVENT_READ, client)

    def _reply(self, client: _Client, msg: dict[str, Any]) -> None:
        was_empty = not client.outbuf
        client.outbuf += wire.frame(msg)
        if len(client.outbuf) > MAX_OUTBUF:
            self._drop(client, "not reading its replies")
            return
        if was_empty:
            self._write(client)  # usually goes out at once
            if client.outbuf and self.clients.get(client.sock.fileno()) is client:
                self._sel.modify(client.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)

    def _error(self, client: _Client, code: str, message: str) -> None:
        self._reply(client, {"op": "error", "code": code, "message": message})

    def _fail(self, client: _Client, code: str, message: str) -> None:
        """Final error: send it, then drop the client (releasing and resetting its GPUs now)."""
        self._release(client)
        if self.clients.get(client.sock.fileno()) is not client:
            return
        client.closing = True
        client.pending.clear()
        self._error(client, code, message)

    # -- requests ---------------------------------------------------------------------------
    def _handle(self, client: _Client, req: wire.Request) -> None:
        if isinstance(req, wire.Hello):
            self._hello(client, req)
            return
        if not client.gpus:
            raise wire.ProtocolError("send HELLO (and have it accepted) first")
        if isinstance(req, wire.SetClock):
            gpu = self._slot(client, req.gpu)
            if req.mhz not in gpu.clockset:
                raise wire.ProtocolError(
                    f"{req.mhz} MHz is not a supported SM clock of GPU {gpu.index} "
                    f"({gpu.clocks[-1]}–{gpu.clocks[0]} MHz)", wire.E_BAD_CLOCK)
            client.received += 1
            client.pending[req.gpu] = req.mhz
        elif isinstance(req, wire.ResetClock):
            self._slot(client, req.gpu)
            client.received += 1
            client.pending[req.gpu] = None
        elif isinstance(req, wire.Sync):
            if len(client.syncs) >= MAX_WAITING_SYNCS:
                self._fail(client, wire.E_BAD_REQUEST, f"more than {MAX_WAITING_SYNCS} unanswered SYNCs")
                return
            client.syncs.append(req.seq)
        elif isinstance(req, wire.Bye):
            client.bye_marks = self._release(client, tag=("bye", client))
            client.closing = True
            client.pending.clear()
            self._wake()  # answered by the loop once the resets are done

    def _slot(self, client: _Client, slot: int) -> _GPU:
        if slot >= len(client.gpus):
            raise wire.ProtocolError(f"GPU slot {slot} is not yours (you hold {len(client.gpus)})", wire.E_NOT_FOUND)
        return client.gpus[slot]

    def _resolve(self, hello: wire.Hello) -> list[_GPU]:
        try:
            visible = parse_cuda_visible_devices(hello.cuda_visible_devices)
        except Exception:  # noqa: BLE001 - defensive: the parser only sees a checked string
            raise wire.ProtocolError("unparsable cuda_visible_devices") from None
        uuid_tokens = visible is not None and bool(visible) and all(t.upper().startswith("GPU-") for t in visible)
        found: list[_GPU] = []
        for k, cuda_index in enumerate(hello.devices):
            gpu: _GPU | None = None
            by_cvd: _GPU | None = None
            if hello.uuids is None or uuid_tokens:
                try:
                    phys = resolve_physical_index(cuda_index, visible, self._uuid_table)
                except GPUError as exc:
                    raise wire.ProtocolError(f"CUDA device {cuda_index}: {exc}", wire.E_NOT_FOUND) from None
                by_cvd = self._by_index.get(phys)
                if by_cvd is None:
                    raise wire.ProtocolError(f"GPU {phys} is not managed by this daemon", wire.E_NOT_FOUND)
            if hello.uuids is not None:
                gpu = self._by_uuid.get(hello.uuids[k].lower())
                if gpu is None:
                    raise wire.ProtocolError(f"GPU {hello.uuids[k][:64]} is not managed by this daemon",
                                             wire.E_NOT_FOUND)
                if by_cvd is not None and by_cvd is not gpu:
                    raise wire.ProtocolError(
                        f"UUID {gpu.uuid} is not CUDA device {cuda_index} of CUDA_VISIBLE_DEVICES="
                        f"{hello.cuda_visible_devices}", wire.E_NOT_FOUND)
            chosen = gpu or by_cvd
            assert chosen is not None  # named by UUID: gpu, else by index: by_cvd (each checked above)
            found.append(chosen)
        if len({id(g) for g in found}) != len(found):
            raise wire.ProtocolError("the same GPU is named twice")
        return found

    def _hello(self, client: _Client, hello: wire.Hello) -> None:
        if client.gpus:
            raise wire.ProtocolError("HELLO was already accepted on this connection")
        if self.options.verify_environ:
            readable, cvd = _proc_environ_cvd(client.pid) if client.pid > 0 else (False, None)
            if not readable:
                raise wire.ProtocolError(f"cannot read the environment of pid {client.pid} to verify "
                                         "CUDA_VISIBLE_DEVICES (is the daemon in the host pid namespace?)",
                                         wire.E_FORBIDDEN)
            if cvd != hello.cuda_visible_devices:
                raise wire.ProtocolError(f"CUDA_VISIBLE_DEVICES={hello.cuda_visible_devices!r} differs from "
                                         f"the process environment ({cvd!r})", wire.E_FORBIDDEN)
        gpus = self._resolve(hello)
        if self.options.require_open_device:
            self._check_open_devices(client, gpus)
        for g in gpus:
            if g.holder is not None and g.holder is not client:
                raise wire.ProtocolError(
                    f"GPU {g.index} ({g.uuid}) is held by another client, {g.holder.who}", wire.E_BUSY)
        check_s = max(hello.clock_check_s, self.options.min_clock_check_s) if hello.clock_check_s > 0 else 0.0
        client.version = hello.version
        for slot, g in enumerate(gpus):
            g.holder = client
            # start from a known state; the applier takes the claim (read-back period, fresh
            # keeper) before it resets
            client.marks[slot] = g.request(None, None, force=True, claim=_Claim(client, check_s))
            g.requested = None
        client.gpus = gpus
        client.history = [collections.deque(maxlen=HISTORY_LEN) for _ in gpus]
        log.info("perseus clockd: %s holds GPU(s) %s", client.who, ", ".join(str(g.index) for g in gpus))
        reply: dict[str, Any] = {"op": "ok", "gpus": [g.describe(i) for i, g in enumerate(gpus)]}
        if client.version >= 2:
            reply.update(v=client.version, clock_check_s=check_s)
        self._reply(client, reply)

    def _check_open_devices(self, client: _Client, gpus: list[_GPU]) -> None:
        held = _open_char_devices(client.pid) if client.pid > 0 else None
        if held is None:
            raise wire.ProtocolError(f"cannot inspect the open files of pid {client.pid} (the daemon needs "
                                     "the host pid namespace and CAP_SYS_PTRACE)", wire.E_FORBIDDEN)
        for g in gpus:
            if g.rdev is None:
                raise wire.ProtocolError(f"GPU {g.index} has no known device file; cannot verify the claim",
                                         wire.E_FORBIDDEN)
            if g.rdev not in held:
                raise wire.ProtocolError(
                    f"pid {client.pid} does not hold GPU {g.index}'s device file "
                    f"(/dev/nvidia{os.minor(g.rdev)}) open: initialize CUDA on it before asking for clocks, "
                    "or the GPU is not assigned to this job", wire.E_FORBIDDEN)

    # -- applying ---------------------------------------------------------------------------
    def _service(self, client: _Client) -> None:
        """Apply coalesced targets as the client's token bucket allows; then answer SYNCs."""
        if client.pending:
            now = time.monotonic()
            client.tokens = min(float(self.options.burst),
                                client.tokens + (now - client.t_tokens) * self.options.rate_hz)
            client.t_tokens = now
            for slot in list(client.pending):
                gpu, target = client.gpus[slot], client.pending[slot]
                if target == gpu.requested:
                    client.skipped += 1
                elif client.tokens < 1.0:
                    break
                else:
                    client.tokens -= 1.0
                    client.marks[slot] = gpu.request(target, client)
                    gpu.requested = target
                del client.pending[slot]
        if (not client.pending and client.syncs
                and all(self._done[id(g)] >= client.marks.get(i, 0) for i, g in enumerate(client.gpus))):
            seqs, client.syncs = client.syncs, []
            for seq in seqs:
                self._reply(client, {"op": "sync", "seq": seq, "applied": client.applied,
                                     "skipped": client.skipped, "errors": client.errors,
                                     "received": client.received,
                                     "current": [g.current for g in client.gpus],
                                     "history": [list(h) for h in client.history]})

    def _collect_results(self) -> None:
        """Account what the appliers did to the client that asked (if it is still connected), and
        pass the keepers' notices on to their GPU's holder."""
        for g in self.gpus:
            with g.cond:
                results, g.results = g.results, []
            for tag, kind, target, info in results:
                if isinstance(tag, tuple):  # ("bye", client): a release it waits for
                    if kind == "error":
                        tag[1].bye_ok = False
                    tag = None
                if kind == "error" and target is None:
                    log.error("perseus clockd: GPU %d: resetting the clocks failed: %s", g.index, info["message"])
                elif kind == "failed":
                    log.error("perseus clockd: GPU %d: clock control failed (%s); the GPU is %s, and stays at default "
                              "clocks until its client reconnects", g.index, info["message"],
                              "reset" if info["reset"] else "NOT reset (the device refused that too)")
                elif kind == "override":
                    log.warning("perseus clockd: GPU %d: the SM clock was changed outside the daemon (held %s MHz, read "
                                "%s MHz); %s (%s of at most %s times)", g.index, info["expected"], info["found"],
                                "re-applied it" if info["reapplied"] else "re-applying failed", info["count"], info["max"])
                client = tag if isinstance(tag, _Client) else None
                if client is None or g.holder is not client or self.clients.get(client.sock.fileno()) is not client:
                    continue
                slot = client.gpus.index(g)
                if kind == "applied":
                    client.applied += 1
                    client.history[slot].append(target)
                elif kind == "skipped":
                    client.skipped += 1
                elif kind == "error":
                    client.errors += 1
                    if client.version < 2 or target is None:  # a refused lock is a ``failed`` notice in v2
                        self._error(client, wire.E_DEVICE, f"GPU {g.index}: {info['message']}")
                elif client.version >= 2:  # "failed", "override": what the local controller reports
                    self._reply(client, {"op": "notice", "gpu": slot, **info})

    def _reset_gpu(self, gpu: _GPU) -> bool:
        if gpu.keeper.apply(None, force=True) == "error":
            log.error("perseus clockd: resetting GPU %d failed: %s", gpu.index, gpu.keeper.last_error)
            return False
        return True

    def _release(self, client: _Client, tag: object = None) -> list[tuple[_GPU, int]]:
        """Reset and free the client's GPUs (no rate limit: this is the safety path); returns
        the (GPU, seq) of each reset, done once ``gpu.done_seq >= seq``."""
        marks = []
        for g in client.gpus:
            if g.holder is client:
                marks.append((g, g.request(None, tag, force=True, claim=_Claim(None, 0.0))))
                g.requested = None
                g.holder = None
        client.gpus = []
        client.marks = {}
        return marks

    def _drop(self, client: _Client, why: str) -> None:
        if self.clients.get(client.sock.fileno()) is not client:
            return
        had = [g.index for g in client.gpus]
        self._release(client)
        del self.clients[client.sock.fileno()]
        try:
            self._sel.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        if had:
            log.info("perseus clockd: %s %s; GPU(s) %s reset", client.who, why, had)
        else:
            log.debug("perseus clockd: %s %s", client.who, why)

    def _check_liveness(self) -> None:
        """A peer whose pid is gone (or reused) is dropped even if its socket fd leaked elsewhere;
        a connection that never got a GPU is closed after ``hello_timeout_s`` (idle slots are few)."""
        now = time.monotonic()
        for client in list(self.clients.values()):
            if client.pid > 0 and client.start_ticks is not None and client.gpus:
                if _proc_start_ticks(client.pid) != client.start_ticks:
                    self._drop(client, "exited (pid gone)")
            elif not client.gpus and now - client.connected_at > self.options.hello_timeout_s:
                self._drop(client, "held no GPU for too long")


# -- entry point (``perseus clockd``) ---------------------------------------------------------

def open_devices(kind: str, indices: list[int] | None, sim_dir: str | None) -> list[GPUDevice]:
    """Open the GPUs to manage by *physical* index (``None``: every NVML GPU; sim: GPU 0)."""
    from perseus.gpu.factory import open_gpu

    if kind == "sim":
        return [open_gpu("sim", i, zeusd_socket="", state_dir=sim_dir) for i in (indices if indices is not None else [0])]
    if kind != "nvml":
        raise GPUInvalidArgumentError(f"clockd: unknown GPU kind {kind!r} (nvml or sim)")
    from perseus.gpu.nvml.device import load_pynvml, translate_nvml_error

    # The daemon addresses physical GPUs: its own CUDA_VISIBLE_DEVICES must not renumber them.
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    if indices is None:
        nv = load_pynvml()
        try:
            nv.nvmlInit()
            try:
                indices = list(range(nv.nvmlDeviceGetCount()))
            finally:
                nv.nvmlShutdown()
        except nv.NVMLError as exc:
            raise translate_nvml_error(exc, "clockd: counting GPUs") from exc
    return [open_gpu("nvml", i, zeusd_socket="") for i in indices]  # the daemon clocks its GPUs itself


def run(kind: str, indices: list[int] | None, sim_dir: str | None, options: DaemonOptions) -> int:
    """Open the devices, serve until SIGTERM/SIGINT, reset everything; the CLI's handler."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    devices = open_devices(kind, indices, sim_dir)
    daemon = ClockDaemon(devices, options)
    try:
        daemon.install_signal_handlers()
        daemon.start()
        daemon.serve_forever()
    finally:
        for d in devices:
            d.close()
    return 0


__all__ = ["ClockDaemon", "DaemonOptions", "open_devices", "run"]
