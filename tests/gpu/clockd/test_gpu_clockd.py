"""``perseus clockd``: the per-node clock daemon and its client, against simulated GPUs.

The daemon runs in a thread of the test process (or, for signals, as a ``perseus clockd``
subprocess); trainers that must die run as real subprocesses.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from clockd_process import connectable

from perseus.errors import PerseusError
from perseus.gpu import GPUError, GPUInvalidArgumentError, GPUNotFoundError, GPUPermissionError, SimulatedGPU, read_sim_state
from perseus.gpu.clockd import wire
from perseus.gpu.clockd.daemon import ClockDaemon, DaemonOptions
from perseus.gpu.clockd.client import ClockdController, ClockdRefusedError
from perseus.gpu.control.controller import ControllerDiedWarning

ROOT = Path(__file__).resolve().parents[3]


def _wait_until(cond, timeout_s: float) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)


@pytest.fixture
def clockd(sim_dir, sock_dir):
    """``start(n_gpus=2, **options)`` → a running in-thread daemon over simulated GPUs 0..n-1."""
    running: list[tuple[ClockDaemon, threading.Thread, list[SimulatedGPU]]] = []

    def start(n_gpus: int = 2, **options) -> ClockDaemon:
        for i in range(n_gpus):
            SimulatedGPU(i, preset="A100-SXM", reset_state=True).close()
        devices = [SimulatedGPU(i) for i in range(n_gpus)]
        options.setdefault("allow_uids", frozenset({os.getuid()}))
        daemon = ClockDaemon(devices, DaemonOptions(str(sock_dir / "clockd.sock"), **options)).start()
        thread = threading.Thread(target=daemon.serve_forever, name="clockd", daemon=True)
        thread.start()
        running.append((daemon, thread, devices))
        return daemon

    yield start
    for daemon, thread, devices in running:
        daemon.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
        for d in devices:
            d.close()


def _client(daemon: ClockDaemon, gpu: int, **kw) -> ClockdController:
    uuid = SimulatedGPU(gpu).uuid
    return ClockdController(daemon.options.socket_path, uuid=uuid, device_index=gpu,
                            cuda_visible_devices=None, **kw).start()


class RawClient:
    """A hand-driven connection for malformed and hostile input."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(5.0)
        self.buf = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def msg(self, obj) -> None:
        self.send(wire.frame(obj) if isinstance(obj, dict) else
                  struct.pack(">I", len(obj)) + obj)

    def reply(self) -> dict | None:
        """Next reply, or None at EOF."""
        while True:
            frames = wire.split_frames(self.buf, wire.MAX_REPLY)
            if frames:
                self.buf[:0] = b"".join(wire.HEADER.pack(len(f)) + f for f in frames[1:])
                return json.loads(frames[0])
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------- wire format

def test_wire_frames_and_request_validation():
    buf = bytearray(wire.frame({"op": "sync", "seq": 1}) + wire.frame({"op": "bye"}) + b"\0\0")
    assert [json.loads(p)["op"] for p in wire.split_frames(buf, wire.MAX_REQUEST)] == ["sync", "bye"]
    assert buf == b"\0\0"  # an incomplete header stays
    with pytest.raises(wire.ProtocolError) as err:
        wire.split_frames(bytearray(struct.pack(">I", wire.MAX_REQUEST + 1)), wire.MAX_REQUEST)
    assert err.value.code == wire.E_TOO_BIG
    assert isinstance(err.value, PerseusError), "a protocol error is a user-facing PerseusError (one line in the CLI)"
    assert wire.parse_request(b'{"op":"set","gpu":0,"mhz":1005}') == wire.SetClock(0, 1005)
    hello = wire.parse_request(json.dumps({"op": "hello", "v": 1, "pid": 7, "cuda_visible_devices": "2,3",
                                           "devices": [1], "uuids": None}).encode())
    assert hello == wire.Hello(7, "2,3", (1,), None) and (hello.version, hello.clock_check_s) == (1, 0.0)
    v2 = wire.parse_request(b'{"op":"hello","v":2,"pid":7,"devices":[0],"clock_check_s":0.5}')
    assert (v2.version, v2.clock_check_s) == (2, 0.5)
    for bad in [b"\xff\xfe", b"[1]", b"{}", b'{"op":5}', b'{"op":"nope"}', b'{"op":"set","gpu":0,"mhz":"1005"}',
                b'{"op":"set","gpu":true,"mhz":1005}', b'{"op":"set","gpu":0,"mhz":1e3}',
                b'{"op":"set","gpu":-1,"mhz":1005}', b'{"op":"sync","seq":99999999999999}',
                b'{"op":"hello","v":3,"pid":1}', b'{"op":"hello","v":true,"pid":1}', b'{"op":"hello","v":"2","pid":1}',
                b'{"op":"hello","v":1,"pid":1,"devices":[0,0]}',
                b'{"op":"hello","v":1,"pid":1,"devices":[0],"uuids":["a","b"]}', b"[" * 4000,
                b'{"op":"hello","v":1,"pid":1,"clock_check_s":1}',  # a v2 field in a v1 HELLO
                b'{"op":"hello","v":2,"pid":1,"clock_check_s":-1}', b'{"op":"hello","v":2,"pid":1,"clock_check_s":NaN}',
                b'{"op":"hello","v":2,"pid":1,"clock_check_s":1e400}', b'{"op":"hello","v":2,"pid":1,"clock_check_s":true}',
                b'{"op":"hello","v":2,"pid":1,"clock_check_s":"1"}']:
        with pytest.raises(wire.ProtocolError):
            wire.parse_request(bad)


# ---------------------------------------------------------------- end to end

def test_unprivileged_client_sets_and_resets_clocks_through_the_daemon(sim_dir, sock_dir, clockd):
    SimulatedGPU(0, preset="A100-SXM", reset_state=True).set_locked_sm_clock(705)  # a crashed job's lock
    daemon = clockd(1)
    trainer_view = SimulatedGPU(0, allow_clock_setting=False)  # the trainer may not change clocks
    assert not trainer_view.can_set_clocks()
    assert not trainer_view.is_clock_locked(), "the daemon resets its GPUs when it starts"
    with ClockdController(daemon.options.socket_path, uuid=trainer_view.uuid, cuda_visible_devices=None) as c:
        assert c.alive and c.default_mhz == 1410 and 1005 in c.clocks
        c.set_frequency(1005)
        stats = c.flush()
        assert stats.current == 1005 and trainer_view.locked_sm_clock_mhz() == 1005
        c.reset()
        assert c.flush().current is None and not trainer_view.is_clock_locked()
        c.set_frequency(900)
        assert c.flush().history == [1005, None, 900]
        with pytest.raises(GPUInvalidArgumentError, match="210–1410"):
            c.set_frequency(1001)  # checked on the trainer side too
    assert not c.alive
    assert not trainer_view.is_clock_locked(), "close() resets"
    assert c.close() is False  # idempotent


def test_client_not_on_the_allowlist_is_refused(clockd):
    daemon = clockd(1, allow_uids=frozenset({os.getuid() + 1}), allow_gids=frozenset({os.getgid() + 1}))
    with pytest.raises(ClockdRefusedError, match="--allow-uid") as err:
        _client(daemon, 0)
    assert isinstance(err.value, GPUPermissionError)
    raw = RawClient(daemon.options.socket_path)  # refused at accept, before any HELLO
    assert raw.reply()["code"] == wire.E_FORBIDDEN
    assert raw.reply() is None  # and closed
    assert read_sim_state(0).n_lock == 0


def test_allowlisted_gid_is_enough(clockd):
    daemon = clockd(1, allow_uids=frozenset(), allow_gids=frozenset({os.getgid()}))
    with _client(daemon, 0) as c:
        c.set_frequency(1200)
        assert c.flush().current == 1200


def test_unsupported_clock_is_refused_by_the_daemon(clockd):
    daemon = clockd(1)
    raw = RawClient(daemon.options.socket_path)
    raw.msg({"op": "hello", "v": 1, "pid": os.getpid(), "devices": [0], "cuda_visible_devices": None})
    assert raw.reply()["op"] == "ok"
    raw.msg({"op": "set", "gpu": 0, "mhz": 1001})
    assert raw.reply()["code"] == wire.E_BAD_CLOCK
    raw.msg({"op": "set", "gpu": 0, "mhz": 99999})
    assert raw.reply()["code"] == wire.E_BAD_CLOCK
    raw.msg({"op": "sync", "seq": 1})
    assert raw.reply()["received"] == 0
    assert not read_sim_state(0).locked
    raw.close()


def test_the_daemon_enforces_its_minimum_read_back_period(clockd):
    daemon = clockd(1, min_clock_check_s=0.2)
    for asked, granted in [(0.001, 0.2), (0.5, 0.5), (0, 0.0)]:
        raw = RawClient(daemon.options.socket_path)
        raw.msg({"op": "hello", "v": 2, "pid": os.getpid(), "devices": [0], "cuda_visible_devices": None,
                 "clock_check_s": asked})
        reply = raw.reply()
        assert reply["op"] == "ok" and reply["v"] == 2 and reply["clock_check_s"] == granted
        raw.close()
        _wait_until(lambda: daemon.gpus[0].holder is None, 5.0)
    with pytest.raises(GPUInvalidArgumentError, match="minimum clock-check period"):
        DaemonOptions("x.sock", allow_uids=frozenset({0}), min_clock_check_s=0)


# ---------------------------------------------------------------- isolation

def test_two_clients_on_different_gpus_are_isolated(clockd):
    daemon = clockd(2)
    a, b = _client(daemon, 0), _client(daemon, 1)
    a.set_frequency(1005)
    b.set_frequency(900)
    assert a.flush().current == 1005 and b.flush().current == 900
    assert read_sim_state(0).locked_mhz == 1005 and read_sim_state(1).locked_mhz == 900
    # nobody else may claim a held GPU, by UUID or through CUDA_VISIBLE_DEVICES
    with pytest.raises(GPUError, match="held by another client"):
        _client(daemon, 0)
    with pytest.raises(GPUError, match="held by another client"):
        ClockdController(daemon.options.socket_path, device_index=0, cuda_visible_devices="1").start()
    # a client can only address its own slots
    raw = RawClient(daemon.options.socket_path)
    raw.msg({"op": "set", "gpu": 0, "mhz": 705})
    assert raw.reply()["code"] == wire.E_BAD_REQUEST  # no HELLO accepted yet
    raw.msg({"op": "hello", "v": 1, "pid": os.getpid(), "devices": [1], "cuda_visible_devices": "0,1"})
    assert raw.reply()["code"] == wire.E_BUSY
    raw.msg({"op": "set", "gpu": 1, "mhz": 705})
    assert raw.reply()["code"] == wire.E_BAD_REQUEST
    raw.close()
    b.close()
    assert not read_sim_state(1).locked and read_sim_state(0).locked_mhz == 1005  # only b's GPU reset
    # once released, GPU 1 can be claimed again: here as CUDA device 0 of CUDA_VISIBLE_DEVICES=1
    with ClockdController(daemon.options.socket_path, device_index=0, cuda_visible_devices="1").start() as c:
        assert c.info["index"] == 1
        c.set_frequency(1200)
        c.flush()
        assert read_sim_state(1).locked_mhz == 1200 and read_sim_state(0).locked_mhz == 1005
    with pytest.raises(GPUNotFoundError, match="entry 5"):
        ClockdController(daemon.options.socket_path, device_index=0, cuda_visible_devices="5").start()
    a.close()
    assert not read_sim_state(0).locked


# ---------------------------------------------------------------- rate limiting

def test_excess_requests_coalesce_to_the_latest(clockd):
    daemon = clockd(1, rate_hz=5.0, burst=2)
    with _client(daemon, 0) as c:
        t0 = time.monotonic()
        burst = [1410 - 15 * (i % 40) for i in range(1, 200)]
        for mhz in burst:
            c.set_frequency(mhz)  # never blocks, never errors
        stats = c.flush(timeout_s=30)
        elapsed = time.monotonic() - t0
        assert stats.current == burst[-1] == read_sim_state(0).locked_mhz
        assert stats.applied <= 2 + 5.0 * elapsed + 1  # the bucket bounded the device calls...
        assert stats.applied < stats.received and read_sim_state(0).n_lock == stats.applied  # ...the rest coalesced
        assert stats.errors == 0


def test_set_frequency_does_not_block_when_the_socket_is_full(clockd):
    daemon = clockd(1)
    with _client(daemon, 0) as c:
        c.flush()
        daemon_thread_paused = threading.Event()
        release = threading.Event()

        def pause():  # stall the daemon: requests pile up in the socket until it is full
            daemon_thread_paused.set()
            release.wait(10)

        original = daemon._check_liveness
        daemon._check_liveness = lambda: (pause(), original())  # type: ignore[method-assign]  # a pause to test
        daemon._next_liveness = 0.0
        daemon._wake_w.send(b"x")
        assert daemon_thread_paused.wait(5)
        try:
            for i in range(20000):
                c.set_frequency(900 if i % 2 else 1005)
            assert c._writer.pending is not None or c._writer.tail, "the socket filled up and the latest was kept"
        finally:
            daemon._check_liveness = original  # type: ignore[method-assign]  # the pause undone
            release.set()
        assert c.flush(timeout_s=30).current == 900  # the last request (i = 19999) wins


# ---------------------------------------------------------------- client death

TRAINER = """
import os, sys, time
from perseus.gpu import SimulatedGPU
from perseus.gpu.clockd.client import ClockdController
g = SimulatedGPU(0)
c = ClockdController(sys.argv[1], uuid=g.uuid, cuda_visible_devices=None).start()
c.set_frequency(1005)
c.flush()
if "--leak-fd" in sys.argv:
    leaked = os.dup(c._sock.fileno())  # e.g. a fork from C code that the at-fork hook cannot see
if "--fork" in sys.argv or "--leak-fd" in sys.argv:
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def _start_trainer(daemon: ClockDaemon, *args: str) -> tuple[subprocess.Popen[str], int | None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-c", TRAINER, daemon.options.socket_path, *args], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child = None
    line = p.stdout.readline().strip()
    if line.isdigit():
        child = int(line)
        line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        raise AssertionError(p.stderr.read())
    assert read_sim_state(0).locked_mhz == 1005
    return p, child


@pytest.mark.parametrize("variant", ["plain", "--fork", "--leak-fd"])
def test_sigkilled_client_gets_its_gpu_reset(clockd, variant):
    """SIGKILL closes the socket; a forked child drops its copy at fork; a leaked copy is caught
    by the daemon's peer-pid check."""
    daemon = clockd(1, liveness_s=0.1)
    p, child = _start_trainer(daemon, *([] if variant == "plain" else [variant]))
    try:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        _wait_until(lambda: read_sim_state(0).locked == 0, 5.0)
        _wait_until(lambda: not daemon.clients, 5.0)
        with _client(daemon, 0) as c:  # the GPU is free again
            c.set_frequency(1200)
            assert c.flush().current == 1200
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------- hostile input

def _garbage(rng: random.Random) -> list[bytes]:
    """Random bytes, truncated frames, oversized frames and well-framed nonsense."""
    good = wire.frame({"op": "hello", "v": 1, "pid": 1, "devices": [0]})
    return [
        rng.randbytes(rng.randrange(1, 3000)),
        good[: rng.randrange(1, len(good))],  # truncated, then the connection closes
        struct.pack(">I", wire.MAX_REQUEST + 1) + b"x" * 100,  # oversized
        struct.pack(">I", 0xFFFFFFFF),
        struct.pack(">I", 5) + b"\xff\xfe\x00{]",
        struct.pack(">I", 4000) + b"[" * 4000,
        wire.frame({"op": "set", "gpu": 0, "mhz": 1005}) * 3,  # before HELLO
        wire.frame({"op": "hello", "v": 1, "pid": -5, "devices": "all"}),
        wire.frame({"op": "hello", "v": 1, "pid": 1, "devices": [0], "uuids": ["GPU-" + "f" * 100]}),
        wire.frame({"op": "hello", "v": 1, "pid": 1, "devices": [63], "cuda_visible_devices": "MIG-1,x"}),
        wire.frame({"op": "sync", "seq": 1}) + struct.pack(">I", 50) + b"{",  # half a frame left hanging
        wire.frame({"op": "hello", "v": 2, "pid": 1, "devices": [0], "clock_check_s": rng.choice([-1, 1e9, "x", None])}),
        wire.frame({"op": "hello", "v": 1, "pid": 1, "devices": [0], "clock_check_s": 0.1}),  # a v2 field in v1
        wire.frame({"op": "hello", "v": rng.choice([0, 3, 2**40, 1.5]), "pid": 1, "devices": [0]}),
        wire.frame({"op": "notice", "gpu": 0, "event": "failed"}),  # daemon-to-client only
    ]


def test_malformed_input_never_stops_the_daemon(clockd):
    daemon = clockd(2)
    good = _client(daemon, 0)
    rng = random.Random(14)
    hanging = []
    for round_ in range(6):
        for blob in _garbage(rng):
            raw = RawClient(daemon.options.socket_path)
            raw.send(blob)
            if round_ % 2:
                hanging.append(raw)  # keep some connections open mid-frame
            else:
                raw.sock.shutdown(socket.SHUT_WR)
                while (reply := raw.reply()) is not None:  # errors, then (for fatal ones) EOF
                    assert reply["op"] in ("error", "sync"), reply
                raw.close()
            mhz = rng.choice(sorted(good.clocks))
            good.set_frequency(mhz)
            assert good.flush().current == mhz and read_sim_state(0).locked_mhz == mhz
    # a client that keeps sending bad messages is dropped; others are unaffected
    raw = RawClient(daemon.options.socket_path)
    codes = []
    for _ in range(40):
        try:
            raw.msg(b"not json")
        except OSError:
            break
    while (reply := raw.reply()) is not None:
        codes.append(reply["code"])
    assert codes and set(codes) == {wire.E_BAD_REQUEST} and len(codes) <= 20
    # an oversized frame gets an error, then the connection is closed
    raw = RawClient(daemon.options.socket_path)
    raw.send(struct.pack(">I", 1 << 30))
    assert raw.reply()["code"] == wire.E_TOO_BIG and raw.reply() is None
    for raw in hanging:
        raw.close()
    good.reset()
    assert good.flush().current is None
    with _client(daemon, 1) as other:  # still accepting new clients
        other.set_frequency(705)
        assert other.flush().current == 705
    good.close()
    _wait_until(lambda: not daemon.clients, 5.0)


def test_too_many_clients_are_turned_away_and_idle_ones_closed(clockd):
    daemon = clockd(1, max_clients=2, hello_timeout_s=0.2, liveness_s=0.05)
    a = RawClient(daemon.options.socket_path)
    b = RawClient(daemon.options.socket_path)
    c = RawClient(daemon.options.socket_path)
    assert c.reply()["code"] == wire.E_OVERLOADED and c.reply() is None
    assert a.reply() is None and b.reply() is None  # no HELLO: closed after hello_timeout_s
    for raw in (a, b, c):
        raw.close()
    with _client(daemon, 0) as ok:  # slots are free again
        assert ok.flush() is not None


# ---------------------------------------------------------------- the daemon process

def test_cli_daemon_resets_on_sigterm_and_clients_continue(sim_dir, sock_dir):
    SimulatedGPU(0, preset="A100-SXM", reset_state=True).close()
    SimulatedGPU(1, preset="A100-SXM", reset_state=True).close()
    path = sock_dir / "clockd.sock"
    path.write_text("")  # not a socket: refused, never deleted
    cmd = [sys.executable, "-m", "perseus.cli", "clockd", "--socket", str(path), "--allow-uid", str(os.getuid()),
           "--gpu", "sim", "--gpus", "0,1", "--sim-dir", str(sim_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a socket" in done.stderr
    path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a stale socket of a killed daemon: replaced
    stale.close()
    daemon = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(lambda: daemon.poll() is not None or connectable(path), 60.0)
        assert daemon.poll() is None, daemon.stderr.read()
        c = ClockdController(str(path), uuid=SimulatedGPU(1).uuid, cuda_visible_devices=None).start()
        c.set_frequency(1005)
        assert c.flush().current == 1005 and read_sim_state(1).locked_mhz == 1005
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
        assert not read_sim_state(1).locked and not path.exists()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for mhz in (900, 1200, 705):
                c.set_frequency(mhz)  # never raises, never blocks
            assert c.flush() is None and not c.alive
        died = [w for w in caught if issubclass(w.category, ControllerDiedWarning)]
        assert len(died) == 1 and died[0].filename == __file__  # points at the training code's call
        c.close()
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
    assert "GPU(s) [1] reset" in daemon.stderr.read()


# ---------------------------------------------------------------- NVML (fake pynvml)

def test_nvml_daemon_maps_cuda_visible_devices_by_uuid(fake_nvml, sock_dir):
    from perseus.gpu.clockd.daemon import open_devices

    devices = open_devices("nvml", None, None)
    assert [d.index for d in devices] == [0, 1, 2]
    daemon = ClockDaemon(devices, DaemonOptions(str(sock_dir / "n.sock"), allow_uids=frozenset({os.getuid()}))).start()
    thread = threading.Thread(target=daemon.serve_forever, daemon=True)
    thread.start()
    path = daemon.options.socket_path
    h100, a100 = fake_nvml.devices[2], fake_nvml.devices[0]
    assert daemon.gpus[2].rdev == os.makedev(195, 2)  # /dev/nvidia2, for --require-open-device
    try:
        # the job sees two GPUs, by UUID prefix; its CUDA device 0 is physical GPU 2
        with ClockdController(path, device_index=0, cuda_visible_devices="GPU-bbbc,GPU-aaaa").start() as c:
            assert c.info["uuid"] == h100.uuid
            c.set_frequency(1005)
            c.flush()
            assert h100.locked == (1005, 1005) and a100.locked is None
        assert h100.locked is None
        # a UUID the client names must be the CUDA device it claims to be
        with pytest.raises(GPUNotFoundError, match="is not CUDA device 0"):
            ClockdController(path, uuid=a100.uuid, device_index=0, cuda_visible_devices="GPU-bbbc,GPU-aaaa").start()
        with ClockdController(path, uuid=a100.uuid, device_index=1, cuda_visible_devices="GPU-bbbc,GPU-aaaa").start():
            pass
        # MIG instances are whole-GPU clock changes in disguise: refused
        with pytest.raises(GPUError, match="MIG"):
            ClockdController(path, device_index=0, cuda_visible_devices="MIG-1234").start()
    finally:
        daemon.stop()
        thread.join(timeout=10)
        for d in devices:
            d.close()


def test_require_open_device_checks_the_peers_device_files(clockd):
    """With --require-open-device a client must hold the GPU's device file open (the scheduler's
    device cgroup decides who can); simulated here with /dev/null and /dev/zero as the GPUs' files."""
    daemon = clockd(2, require_open_device=True)
    daemon.gpus[0].rdev = os.stat("/dev/null").st_rdev
    daemon.gpus[1].rdev = os.stat("/dev/zero").st_rdev
    held = open("/dev/null", "rb")  # kept open for the claim
    try:
        with _client(daemon, 0) as c:
            c.set_frequency(1005)
            assert c.flush().current == 1005
        from perseus.gpu.clockd.peers import open_char_devices

        if daemon.gpus[1].rdev not in open_char_devices(os.getpid()):  # pytest itself has no /dev/zero open
            with pytest.raises(ClockdRefusedError, match="device file"):
                _client(daemon, 1)
    finally:
        held.close()


def test_verify_environ_compares_with_the_peers_exec_environment(clockd):
    from perseus.gpu.clockd.peers import proc_environ_cvd

    daemon = clockd(1, verify_environ=True)
    readable, actual = proc_environ_cvd(os.getpid())
    assert readable
    uuid = SimulatedGPU(0).uuid
    with ClockdController(daemon.options.socket_path, uuid=uuid, cuda_visible_devices=actual).start():
        pass
    with pytest.raises(ClockdRefusedError, match="differs from the process environment"):
        ClockdController(daemon.options.socket_path, uuid=uuid, cuda_visible_devices=(actual or "") + "7").start()


def test_shipped_service_and_daemonset_run_valid_clockd_commands():
    """deploy/systemd/perseus-clockd.service and the DaemonSet stay in sync with the CLI's flags."""
    import shlex

    from perseus.cli import build_parser

    text = (ROOT / "deploy" / "systemd" / "perseus-clockd.service").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[:3] == ["/usr/bin/env", "perseus", "clockd"]
    args = build_parser().parse_args(argv[2:])
    assert args.socket == "/run/perseus/clockd.sock" and args.require_open_device
    assert "RuntimeDirectory=perseus" in text and "KillSignal=SIGTERM" in text

    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "perseus-clockd-daemonset.yaml").read_text()) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert container["command"][:2] == ["perseus", "clockd"] and args.gpu == "nvml"
    assert pod["hostPID"] is True and container["securityContext"]["privileged"] is True
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume["hostPath"]["path"] == mount["mountPath"] == str(Path(args.socket).parent)


def test_a_refused_clock_is_a_failed_notice_and_that_claim_stays_at_default(clockd):
    """As with the local controller: the device refuses a lock → one ``failed`` notice, the GPU
    reset, later locks ignored for that claim; other clients' GPUs untouched; a new claim starts over.
    A version-1 client still gets the refusal as an error reply."""
    daemon = clockd(2)
    device = daemon.gpus[0].device
    real = device.set_locked_sm_clock

    def flaky(mhz):
        if mhz == 1005:
            raise GPUError("the driver said no")
        real(mhz)

    device.set_locked_sm_clock = flaky  # type: ignore[method-assign]  # a driver that refuses once
    with _client(daemon, 0) as c, _client(daemon, 1) as other:
        other.set_frequency(1005)
        c.set_frequency(900)
        assert c.flush().current == 900 and other.flush().current == 1005
        c.set_frequency(1005)
        stats = c.flush()
        assert stats.errors == 1 and stats.current is None and not read_sim_state(0).locked
        (notice,) = c.notices()
        assert notice.kind == "failed" and "the driver said no" in notice.message and notice.reset is True
        assert c.errors == [], "reported once, as the notice"
        c.set_frequency(705)
        assert c.flush().current is None and not read_sim_state(0).locked, "ignored from now on"
        assert c.notices() == []
        other.set_frequency(900)
        assert other.flush().current == 900 == read_sim_state(1).locked_mhz and other.notices() == []
    with _client(daemon, 0) as c:  # a new claim: clock changes work again
        c.set_frequency(900)
        assert c.flush().current == 900
    raw = RawClient(daemon.options.socket_path)
    raw.msg({"op": "hello", "v": 1, "pid": os.getpid(), "devices": [0], "cuda_visible_devices": None})
    assert "v" not in raw.reply()  # a version-1 OK: no notices for this client
    raw.msg({"op": "set", "gpu": 0, "mhz": 1005})
    raw.msg({"op": "sync", "seq": 1})
    error = raw.reply()
    assert error["code"] == wire.E_DEVICE and "the driver said no" in error["message"]
    assert raw.reply()["op"] == "sync"
    raw.close()


def test_a_second_daemon_on_the_same_socket_touches_nothing(clockd, sock_dir):
    daemon = clockd(1)
    with _client(daemon, 0) as c:
        c.set_frequency(1005)
        c.flush()
        second = ClockDaemon([SimulatedGPU(0)], DaemonOptions(daemon.options.socket_path,
                                                              allow_uids=frozenset({os.getuid()})))
        with pytest.raises(GPUError, match="already serves"):
            second.start()
        assert read_sim_state(0).locked_mhz == 1005, "the running daemon's client keeps its clock"
        c.set_frequency(900)
        assert c.flush().current == 900


def test_a_flood_of_syncs_behind_rate_limited_requests_drops_that_client(clockd):
    daemon = clockd(1, rate_hz=0.01, burst=1)
    raw = RawClient(daemon.options.socket_path)
    raw.msg({"op": "hello", "v": 1, "pid": os.getpid(), "devices": [0], "cuda_visible_devices": None})
    assert raw.reply()["op"] == "ok"
    raw.msg({"op": "set", "gpu": 0, "mhz": 1005})
    raw.msg({"op": "sync", "seq": 0})
    assert raw.reply()["current"] == [1005]  # the one token is spent
    raw.send(wire.frame({"op": "set", "gpu": 0, "mhz": 900})
             + b"".join(wire.frame({"op": "sync", "seq": i}) for i in range(1, 1100)))
    reply = raw.reply()
    assert reply["op"] == "error" and "unanswered SYNCs" in reply["message"]
    assert raw.reply() is None
    _wait_until(lambda: not read_sim_state(0).locked, 5.0)  # dropped: its GPU is reset
    raw.close()
