"""What a ``perseus clockd`` client's requests do: its claims, its coalesced targets, its answers.

HELLO claims GPUs (named by CUDA index under the client's CUDA_VISIBLE_DEVICES, or by UUID) that
no other live client holds, once the peer passes the checks the options ask for (``peers``);
every later request names one of the client's own slots. SET and RESET coalesce per slot into
one pending target, applied as the client's token bucket allows; SYNC is answered once all of it
is applied, BYE once the client's GPUs are reset. What the appliers report goes back to the
client that asked, and a keeper's notices to the holder of its claim.
"""

from __future__ import annotations

import collections
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from perseus.gpu.clockd import wire
from perseus.gpu.clockd.managed_gpu import Claim, ManagedGPU
from perseus.gpu.clockd.options import DaemonOptions
from perseus.gpu.clockd.peers import verify_environ, verify_open_devices
from perseus.gpu.errors import GPUError, GPUInvalidArgumentError
from perseus.gpu.nvml.cuda_visible import parse_cuda_visible_devices, resolve_physical_index

log = logging.getLogger("perseus.clockd")

MAX_WAITING_SYNCS = 1024  # SYNCs waiting for rate-limited requests; more is a flood
HISTORY_LEN = 256


@dataclass(eq=False)
class Client:
    """One connection: the peer the kernel vouches for, its buffers, claims, requests and stats."""

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
    gpus: list[ManagedGPU] = field(default_factory=list)
    pending: dict[int, int | None] = field(default_factory=dict)  # slot → coalesced target
    marks: dict[int, int] = field(default_factory=dict)  # slot → seq a SYNC must see applied
    bye_marks: list[tuple[ManagedGPU, int]] | None = None  # BYE answered once these resets are done
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


class Outbox(Protocol):
    """What request handling needs of the serving loop: answers on a connection, and a wake-up."""

    def reply(self, client: Client, msg: dict[str, Any]) -> None: ...

    def error(self, client: Client, code: str, message: str) -> None: ...

    def fail(self, client: Client, code: str, message: str) -> None:
        """Answer with a final error and drop the client, releasing its GPUs."""
        ...

    def wake(self) -> None:
        """Run the loop again soon (a BYE waits for resets)."""
        ...

    def connected(self, client: Client) -> bool: ...


class RequestHandler:
    """The requests of every client over the daemon's GPUs; the loop's thread only."""

    def __init__(self, gpus: list[ManagedGPU], options: DaemonOptions, out: Outbox) -> None:
        by_index = {g.index: g for g in gpus}
        if len(by_index) != len(gpus):
            raise GPUInvalidArgumentError("clockd: a GPU index is given twice")
        self.gpus = gpus
        self.options = options
        self._out = out
        self._by_index = by_index
        self._by_uuid = {g.uuid.lower(): g for g in gpus}
        # For CUDA_VISIBLE_DEVICES resolution: physical index → UUID ("" = not managed here).
        self._uuid_table = [by_index[i].uuid if i in by_index else "" for i in range(max(by_index) + 1)]
        self.done: dict[int, int] = {}  # id(GPU) → its done_seq when this round's results were collected

    def handle(self, client: Client, req: wire.Request) -> None:
        """Act on one parsed request (``wire.ProtocolError``: the error to answer it with)."""
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
                self._out.fail(client, wire.E_BAD_REQUEST, f"more than {MAX_WAITING_SYNCS} unanswered SYNCs")
                return
            client.syncs.append(req.seq)
        elif isinstance(req, wire.Bye):
            client.bye_marks = self.release(client, tag=("bye", client))
            client.closing = True
            client.pending.clear()
            self._out.wake()  # answered by the loop once the resets are done

    def _slot(self, client: Client, slot: int) -> ManagedGPU:
        if slot >= len(client.gpus):
            raise wire.ProtocolError(f"GPU slot {slot} is not yours (you hold {len(client.gpus)})", wire.E_NOT_FOUND)
        return client.gpus[slot]

    def _resolve(self, hello: wire.Hello) -> list[ManagedGPU]:
        try:
            visible = parse_cuda_visible_devices(hello.cuda_visible_devices)
        except Exception:  # noqa: BLE001 - defensive: the parser only sees a checked string
            raise wire.ProtocolError("unparsable cuda_visible_devices") from None
        uuid_tokens = visible is not None and bool(visible) and all(t.upper().startswith("GPU-") for t in visible)
        found: list[ManagedGPU] = []
        for k, cuda_index in enumerate(hello.devices):
            gpu: ManagedGPU | None = None
            by_cvd: ManagedGPU | None = None
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

    def _hello(self, client: Client, hello: wire.Hello) -> None:
        if client.gpus:
            raise wire.ProtocolError("HELLO was already accepted on this connection")
        if self.options.verify_environ:
            verify_environ(client.pid, hello.cuda_visible_devices)
        gpus = self._resolve(hello)
        if self.options.require_open_device:
            verify_open_devices(client.pid, gpus)
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
            client.marks[slot] = g.request(None, None, force=True, claim=Claim(client, check_s))
            g.requested = None
        client.gpus = gpus
        client.history = [collections.deque(maxlen=HISTORY_LEN) for _ in gpus]
        log.info("perseus clockd: %s holds GPU(s) %s", client.who, ", ".join(str(g.index) for g in gpus))
        reply: dict[str, Any] = {"op": "ok", "gpus": [g.describe(i) for i, g in enumerate(gpus)]}
        if client.version >= 2:
            reply.update(v=client.version, clock_check_s=check_s)
        self._out.reply(client, reply)

    def service(self, client: Client) -> None:
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
                and all(self.done[id(g)] >= client.marks.get(i, 0) for i, g in enumerate(client.gpus))):
            seqs, client.syncs = client.syncs, []
            for seq in seqs:
                self._out.reply(client, {"op": "sync", "seq": seq, "applied": client.applied,
                                         "skipped": client.skipped, "errors": client.errors,
                                         "received": client.received,
                                         "current": [g.current for g in client.gpus],
                                         "history": [list(h) for h in client.history]})

    def collect_results(self) -> None:
        """Account what the appliers did to the client that asked (if it is still connected), and
        pass the keepers' notices on to their GPU's holder."""
        # What the appliers had finished *before* collecting their results: SYNC and BYE answers
        # then carry the stats of everything they wait for.
        self.done = {id(g): g.done_seq for g in self.gpus}
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
                client = tag if isinstance(tag, Client) else None
                if client is None or g.holder is not client or not self._out.connected(client):
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
                        self._out.error(client, wire.E_DEVICE, f"GPU {g.index}: {info['message']}")
                elif client.version >= 2:  # "failed", "override": what the local controller reports
                    self._out.reply(client, {"op": "notice", "gpu": slot, **info})

    def release(self, client: Client, tag: object = None) -> list[tuple[ManagedGPU, int]]:
        """Reset and free the client's GPUs (no rate limit: this is the safety path); returns
        the (GPU, seq) of each reset, done once ``gpu.done_seq >= seq``."""
        marks = []
        for g in client.gpus:
            if g.holder is client:
                marks.append((g, g.request(None, tag, force=True, claim=Claim(None, 0.0))))
                g.requested = None
                g.holder = None
        client.gpus = []
        client.marks = {}
        return marks

    def answer_bye(self, client: Client) -> bool:
        """Answer the client's BYE once the resets it waits for are done; True if it was answered now."""
        if client.bye_marks is None or not all(self.done[id(g)] >= seq for g, seq in client.bye_marks):
            return False
        client.bye_marks = None
        self._out.reply(client, {"op": "bye", "reset": client.bye_ok})
        return True
