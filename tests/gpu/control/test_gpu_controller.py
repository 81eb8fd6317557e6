"""Frequency controller: real processes against the simulated GPU."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from perseus.gpu import GPUInvalidArgumentError, GPUPermissionError, SimulatedGPU, read_sim_state
from perseus.gpu.control.controller import (
    ControllerDiedWarning,
    FrequencyController,
    NullController,
    make_controller,
)
from perseus.gpu.spec import GPUSpec

from fake_zeusd import FakeZeusd

BACKENDS = ["nvml-like", "zeusd"]  # who the controller process asks: the device itself, or zeusd over HTTP


@pytest.fixture(params=BACKENDS)
def backend(request, sim_dir, sock_dir, monkeypatch):
    """The clock-safety tests run for both: the controller process locking the (simulated) device
    itself, and the same process asking a fake zeusd on a real Unix socket. Yields the fake (or
    None); with it, ``PERSEUS_ZEUSD_SOCKET`` is set for this test and the processes it starts."""
    if request.param != "zeusd":
        monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)
        yield None
        return
    pytest.importorskip("httpx")  # the [zeusd] extra (in [dev])
    with FakeZeusd(sock_dir / "zeusd.sock", sim_dir=sim_dir) as fake:
        monkeypatch.setenv("PERSEUS_ZEUSD_SOCKET", fake.socket_path)
        yield fake


def _spec(g, fake) -> GPUSpec:
    """``g``'s spec, through ``fake`` zeusd when there is one."""
    return dataclasses.replace(g.spec(), zeusd_socket=fake.socket_path) if fake is not None else g.spec()


def _went_through(fake) -> None:
    """With zeusd, the lock and the reset were its HTTP calls (not a local device call)."""
    if fake is not None:
        assert fake.calls("/gpu/set_gpu_locked_clocks") and fake.calls("/gpu/reset_gpu_locked_clocks")

TRAINER = """
import os, signal, sys, time
from perseus.gpu import open_gpu
from perseus.gpu.control.controller import FrequencyController
# Python's own SIGINT handling, as in a program started from a terminal: a background job of a
# non-interactive shell (CI, nohup) inherits SIGINT ignored, and the controller rightly keeps that.
signal.signal(signal.SIGINT, signal.default_int_handler)
if "--own-handler" in sys.argv:
    def own(signum, frame):
        print("own handler ran", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, own)
g = open_gpu("sim", 0)  # through zeusd when PERSEUS_ZEUSD_SOCKET is set (the backend fixture)
c = FrequencyController(g.spec()).start()
c.set_frequency(1005)
c.flush()
print(c.pid, flush=True)
if "--fork" in sys.argv or "--leak-fd" in sys.argv:
    leaked = os.dup(c._req_w) if "--leak-fd" in sys.argv else None  # e.g. a fork from C code
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
while True:
    with g.busy():
        time.sleep(0.005)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)  # zombie = exited
    except FileNotFoundError:
        return True


HANG_S = 60.0  # hang guards only: how long a step may take on a busy machine before the test fails


def _wait_until(cond, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)
    return time.monotonic() - t0


_SPAWNED: list[subprocess.Popen[str] | int] = []  # trainers and their forked children


@pytest.fixture(autouse=True)
def _kill_leftovers():
    """Kill what a test started, even when it failed halfway (no orphaned busy loops)."""
    yield
    while _SPAWNED:
        proc = _SPAWNED.pop()
        if isinstance(proc, subprocess.Popen):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        else:
            _kill_quietly(proc)


def _start_trainer(sim_dir, *args: str) -> tuple[subprocess.Popen[str], int]:
    SimulatedGPU(0, preset="A100-SXM", reset_state=True)
    env = {**os.environ, "PERSEUS_SIM_GPU_DIR": str(sim_dir)}
    p = subprocess.Popen([sys.executable, "-c", TRAINER, *args], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _SPAWNED.append(p)
    line = p.stdout.readline()
    assert line.strip().isdigit(), p.stderr.read()
    st = read_sim_state(0, sim_dir)
    assert (st.locked, st.locked_mhz) == (1, 1005)
    return p, int(line)


def test_sigkilled_trainer_gets_clocks_reset_by_the_controller(sim_dir, backend):
    p, ctl_pid = _start_trainer(sim_dir)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=HANG_S)
    _wait_until(lambda: read_sim_state(0, sim_dir).locked == 0, HANG_S)
    _wait_until(lambda: _gone(ctl_pid), HANG_S)  # and the controller exits
    _went_through(backend)


def test_forked_child_neither_hides_the_trainers_death_nor_resets_its_clocks(sim_dir, backend):
    p, ctl_pid = _start_trainer(sim_dir, "--fork")
    child = int(p.stdout.readline())
    _SPAWNED.append(child)
    os.kill(child, signal.SIGTERM)  # a DataLoader worker being stopped
    time.sleep(0.3)
    assert read_sim_state(0, sim_dir).locked == 1  # the parent's controller is untouched
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=HANG_S)
    _wait_until(lambda: read_sim_state(0, sim_dir).locked == 0, HANG_S)
    _went_through(backend)


def test_leaked_pipe_fd_falls_back_to_parent_pid_polling(sim_dir, backend):
    p, ctl_pid = _start_trainer(sim_dir, "--leak-fd")
    child = int(p.stdout.readline())  # holds a dup of the request pipe: no EOF on trainer death
    _SPAWNED.append(child)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=HANG_S)
    _wait_until(lambda: read_sim_state(0, sim_dir).locked == 0, HANG_S)
    _wait_until(lambda: _gone(ctl_pid), HANG_S)
    _went_through(backend)


def _kill_quietly(pid: int) -> None:
    """Kill a forked trainer child by pid, only if that pid is still one of ours (no reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"FrequencyController(g.spec())" not in f.read():
                return
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass


def test_sigterm_resets_synchronously_then_dies_by_the_signal(sim_dir, backend):
    p, ctl_pid = _start_trainer(sim_dir)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=HANG_S) == -signal.SIGTERM  # chained to the default action
    assert read_sim_state(0, sim_dir).locked == 0  # reset happened before the trainer exited
    _wait_until(lambda: _gone(ctl_pid), HANG_S)
    _went_through(backend)


def test_sigterm_chains_to_the_previous_handler(sim_dir, backend):
    p, _ = _start_trainer(sim_dir, "--own-handler")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=HANG_S) == 7
    assert "own handler ran" in p.stdout.read()
    assert read_sim_state(0, sim_dir).locked == 0
    _went_through(backend)


def test_sigint_resets_and_raises_keyboardinterrupt(sim_dir, backend):
    p, _ = _start_trainer(sim_dir)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=HANG_S) != 0
    assert "KeyboardInterrupt" in p.stderr.read()
    assert read_sim_state(0, sim_dir).locked == 0
    _went_through(backend)


def test_exception_in_with_block_resets_and_restores_handlers(sim_dir, backend):
    g = SimulatedGPU(0, reset_state=True)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="boom"):
        with FrequencyController(_spec(g, backend)) as c:
            assert signal.getsignal(signal.SIGTERM) == c._on_signal
            c.set_frequency(1005)
            assert c.flush().current == 1005
            assert g.locked_sm_clock_mhz() == 1005
            raise RuntimeError("boom")
    assert not g.is_clock_locked()
    assert signal.getsignal(signal.SIGTERM) == before
    assert not c.alive and _gone(c.pid)
    _went_through(backend)


def test_dead_controller_warns_once_and_training_continues_at_default(sim_dir, backend):
    g = SimulatedGPU(0, reset_state=True)
    c = FrequencyController(_spec(g, backend), install_signal_handlers=False).start()
    c.set_frequency(1005)
    c.flush()
    os.kill(c.pid, signal.SIGKILL)
    c._proc.wait(timeout=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mhz in (1200, 1095, 1005, 900):
            c.set_frequency(mhz)  # never raises, never blocks
        c.reset()
    died = [w for w in caught if issubclass(w.category, ControllerDiedWarning)]
    assert len(died) == 1 and "continues at default GPU clocks" in str(died[0].message)
    assert died[0].filename == __file__  # points at the training code's call site
    assert not c.alive and c.flush() is None
    _wait_until(lambda: not g.is_clock_locked(), HANG_S)  # background reset of the leftover lock
    c.close()
    _went_through(backend)


def test_requests_are_coalesced_to_the_latest(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    with FrequencyController(g.spec(), install_signal_handlers=False) as c:
        c.set_frequency(1200)
        s0 = c.flush()
        os.kill(c.pid, signal.SIGSTOP)  # a busy controller: requests pile up in the pipe
        try:
            for i in range(100):
                c.set_frequency(900 if i % 2 else 1005)
        finally:
            os.kill(c.pid, signal.SIGCONT)
        s1 = c.flush()
        assert s1.received - s0.received == 100
        assert s1.applied - s0.applied == 1 and s1.current == 900
        assert g.snapshot().n_lock == 2  # 1200, then only the latest of the burst
        # skip when the drained target equals the current clock
        os.kill(c.pid, signal.SIGSTOP)
        try:
            c.set_frequency(1005)
            c.set_frequency(900)
        finally:
            os.kill(c.pid, signal.SIGCONT)
        s2 = c.flush()
        assert s2.applied == s1.applied and s2.skipped == s1.skipped + 1
        assert g.snapshot().n_lock == 2
        c.set_frequency(900)  # trainer-side dedup: not even sent
        assert c.flush().received == s2.received


def test_order_is_preserved(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    seq = [1005, 1200, 900, 1410, 705, 1005]
    with FrequencyController(g.spec(), install_signal_handlers=False) as c:
        for mhz in seq:
            c.set_frequency(mhz)
            c.flush()
        c.reset()
        assert c.flush().history == [*seq, None]
        burst = [1410 - 15 * (i % 40) for i in range(500)]
        for mhz in burst:
            c.set_frequency(mhz)
        hist = c.flush().history[len(seq) + 1:]
        it = iter(burst)
        assert all(any(h == b for b in it) for h in hist)  # an in-order subsequence...
        assert hist[-1] == burst[-1] == g.locked_sm_clock_mhz()  # ...ending at the latest


def test_invalid_frequency_and_missing_privileges(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    with FrequencyController(g.spec(), install_signal_handlers=False) as c:
        with pytest.raises(GPUInvalidArgumentError, match="210–1410"):
            c.set_frequency(1001)
    locked = SimulatedGPU(1, reset_state=True, allow_clock_setting=False)
    with pytest.raises(GPUPermissionError, match="measure-only"):
        FrequencyController(locked.spec(), install_signal_handlers=False).start()
    null = make_controller(locked.spec(), enabled=False)
    assert isinstance(null, NullController)
    null.set_frequency(1005)
    null.reset()
    assert null.requests == 2 and null.flush() is None and not locked.is_clock_locked()


def test_requests_never_block_the_training_thread_even_when_the_controller_stalls(sim_dir, backend):
    # The controller process stopped (SIGSTOP: a stalled NVML call, a descheduled process), or
    # zeusd stuck in an HTTP request: far more requests than the pipe holds still return, and once
    # it runs again the latest is applied. What a request costs in time is measured by
    # benchmarks/bench_controller.py and benchmarks/bench_zeusd.py.
    g = SimulatedGPU(0, reset_state=True)
    with FrequencyController(_spec(g, backend), install_signal_handlers=False) as c:
        os.kill(c.pid, signal.SIGSTOP)
        if backend is not None:
            backend.hold.acquire()  # and zeusd answers nothing meanwhile
        try:
            for i in range(50_000):
                c.set_frequency(1005 if i % 2 else 1200)
            if backend is not None:
                os.kill(c.pid, signal.SIGCONT)  # the controller now sits in an unanswered HTTP call
                time.sleep(0.2)
                for i in range(50_000):
                    c.set_frequency(1005 if i % 2 else 1200)
        finally:
            os.kill(c.pid, signal.SIGCONT)
            if backend is not None:
                backend.hold.release()
        c.set_frequency(900)
        c.flush()
        assert g.locked_sm_clock_mhz() == 900
    _went_through(backend)


def test_starting_the_controller_prints_no_runtime_warning(sim_dir):
    """The controller process starts without runpy's "found in sys.modules" RuntimeWarning."""
    script = (
        "from perseus.gpu import SimulatedGPU\n"
        "from perseus.gpu.control.controller import FrequencyController\n"
        "g = SimulatedGPU(0)\n"
        "with FrequencyController(g.spec()) as c:\n"
        "    c.set_frequency(1005)\n"
        "    assert c.flush().current == 1005\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "default"})
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_timed_requests_wait_in_time_order_and_the_latest_due_one_wins():
    from perseus.gpu.control.process import TimedRequests

    q = TimedRequests()
    assert q.wait_s(5.0, 0.1) == 0.1 and q.due(5.0) is None
    q.add(7.0, 900)
    q.add(6.0, 1200)
    q.add(6.0, 1005)  # same time: in the order received
    assert len(q) == 3 and q.wait_s(5.0, 10.0) == 1.0 and q.wait_s(6.5, 10.0) == 0.0
    assert q.due(5.9) is None
    assert q.due(6.0) == 1005 and len(q) == 1  # both due at 6: the later one replaces the earlier
    assert q.drain() == 900 and len(q) == 0
    q.add(1.0, 705)
    q.clear()
    assert q.due(2.0) is None


def test_a_timed_request_is_made_at_its_time_and_a_request_without_one_drops_it(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    with FrequencyController(g.spec(), install_signal_handlers=False) as c:
        c.set_frequency(1200)
        c.flush()
        at = time.monotonic() + 2.0
        c.set_frequency(900, at)
        held = g.locked_sm_clock_mhz()
        if time.monotonic() < at:  # read before its time (2 s: only a stalled machine gets here late)
            assert held == 1200
        deadline = time.monotonic() + HANG_S
        while g.locked_sm_clock_mhz() != 900 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert g.locked_sm_clock_mhz() == 900 and time.monotonic() >= at
        assert c.flush().history[-2:] == [1200, 900]
        # a request without a time is the trainer's latest word: the held one is never made
        c.set_frequency(705, time.monotonic() + 0.2)
        c.set_frequency(1005)
        time.sleep(0.3)
        assert c.flush().history[-2:] == [900, 1005] and g.locked_sm_clock_mhz() == 1005
        # a flush makes held requests at once
        c.set_frequency(705, time.monotonic() + 600)
        assert c.flush().current == 705 and g.locked_sm_clock_mhz() == 705
