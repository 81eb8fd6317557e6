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
  checked (``wire``); a bad message gets an error reply, an oversized frame, too many
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

This module serves: the socket, connections, the loop and the daemon's lifecycle. What requests
do is ``handler``'s; a GPU and its applier thread are ``managed_gpu``'s; what is known of a peer
is ``peers``'; the policy is ``options``' ``DaemonOptions`` (importable from here too).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import stat
import threading
import time
from typing import Any

from perseus.gpu.clockd import wire
from perseus.gpu.clockd.handler import Client, RequestHandler
from perseus.gpu.clockd.managed_gpu import ManagedGPU
from perseus.gpu.clockd.options import DaemonOptions
from perseus.gpu.clockd.peers import peer_credentials, proc_start_ticks
from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError, GPUPermissionError

log = logging.getLogger("perseus.clockd")

MAX_OUTBUF = 256 * 1024  # a client that stops reading its replies is dropped beyond this
MAX_BAD_REQUESTS = 16  # malformed messages tolerated per client before it is dropped


class ClockDaemon:
    """The daemon: ``ClockDaemon(devices, options).serve_forever()`` until ``stop()`` or a signal."""

    def __init__(self, devices: list[GPUDevice], options: DaemonOptions) -> None:
        if not devices:
            raise GPUInvalidArgumentError("clockd: no GPUs to manage")
        self.options = options
        self.gpus = [ManagedGPU(d) for d in devices]
        self._requests = RequestHandler(self.gpus, options, self)
        self.clients: dict[int, Client] = {}
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = False
        self._stop_why = ""
        self._next_liveness = 0.0
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
            g.thread = threading.Thread(target=g.run_applier, args=(self.wake,), daemon=True,
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
        self.wake()

    def wake(self) -> None:
        """Run the loop again at once (thread- and signal-safe)."""
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
            g.reset()
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
                client: Client = key.data
                if client.sock.fileno() < 0 or not self.connected(client):
                    continue  # dropped earlier in this round
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(client)
                    if mask & selectors.EVENT_WRITE and self.connected(client):
                        self._write(client)
                except Exception as exc:  # one client's problem never stops the daemon
                    log.exception("perseus clockd: dropping %s after an unexpected error", client.who)
                    self._drop(client, f"internal error: {exc}")
        self._requests.collect_results()
        for client in list(self.clients.values()):
            if self._requests.answer_bye(client):
                continue
            if not client.closing and self.connected(client):
                try:
                    self._requests.service(client)
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
                pid, uid, gid = peer_credentials(sock)
            except OSError as exc:  # the peer is already gone
                log.debug("perseus clockd: dropping a connection without credentials: %s", exc)
                sock.close()
                continue
            now = time.monotonic()
            client = Client(sock, pid, uid, gid, proc_start_ticks(pid) if pid > 0 else None,
                            tokens=float(self.options.burst), t_tokens=now, connected_at=now)
            self.clients[sock.fileno()] = client
            self._sel.register(sock, selectors.EVENT_READ, client)
            if uid not in self.options.allow_uids and gid not in self.options.allow_gids:
                log.warning("perseus clockd: refused %s: not on the allowlist", client.who)
                self.fail(client, wire.E_FORBIDDEN,
                           f"uid {uid} / gid {gid} may not change GPU clocks through this daemon; "
                           "ask the administrator to add it (--allow-uid / --allow-gid)")
            elif len(self.clients) > self.options.max_clients:
                self.fail(client, wire.E_OVERLOADED, f"too many clients (limit {self.options.max_clients})")
            else:
                log.info("perseus clockd: connection from %s", client.who)

    def _read(self, client: Client) -> None:
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
            self.fail(client, exc.code, str(exc))
        for payload in payloads:
            if client.closing:
                break
            try:
                self._requests.handle(client, wire.parse_request(payload))
            except wire.ProtocolError as exc:
                self.error(client, exc.code, str(exc))
                if exc.code == wire.E_BAD_REQUEST:
                    client.bad += 1
                    if client.bad > MAX_BAD_REQUESTS:
                        self.fail(client, wire.E_BAD_REQUEST, "too many malformed requests")

    def _write(self, client: Client) -> None:
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

    # -- answers (the request handler's ``Outbox``) -----------------------------------------
    def connected(self, client: Client) -> bool:
        """Whether ``client`` is still one of this daemon's connections (not dropped)."""
        return self.clients.get(client.sock.fileno()) is client

    def reply(self, client: Client, msg: dict[str, Any]) -> None:
        was_empty = not client.outbuf
        client.outbuf += wire.frame(msg)
        if len(client.outbuf) > MAX_OUTBUF:
            self._drop(client, "not reading its replies")
            return
        if was_empty:
            self._write(client)  # usually goes out at once
            if client.outbuf and self.connected(client):
                self._sel.modify(client.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)

    def error(self, client: Client, code: str, message: str) -> None:
        self.reply(client, {"op": "error", "code": code, "message": message})

    def fail(self, client: Client, code: str, message: str) -> None:
        """Final error: send it, then drop the client (releasing and resetting its GPUs now)."""
        self._requests.release(client)
        if not self.connected(client):
            return
        client.closing = True
        client.pending.clear()
        self.error(client, code, message)

    # -- connections ------------------------------------------------------------------------
    def _drop(self, client: Client, why: str) -> None:
        if not self.connected(client):
            return
        had = [g.index for g in client.gpus]
        self._requests.release(client)
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
                if proc_start_ticks(client.pid) != client.start_ticks:
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
