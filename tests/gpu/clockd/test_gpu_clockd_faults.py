"""Faults under ``perseus clockd``, the daemon a real process as an administrator would run it.

The same faults the local controller process handles (docs/reliability.md): a clock reset from
outside (read back, re-applied, given up after ``MAX_OVERRIDES``), and NVML refusing a clock or
losing the GPU of one client (that client is told, its GPU reset, every other client unaffected).
Times to recover are printed (``pytest -s``); the waits are hang guards, never latency limits.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest
from clockd_process import clockd_process
from fake_pynvml import read_clock_calls, write_shim

from perseus.gpu import SimulatedGPU, read_sim_state
from perseus.gpu.control.keeper import MAX_OVERRIDES
from perseus.gpu.clockd.client import ClockdController
from perseus.gpu.control.notice import ClockNotice

HANG_S = 30.0
CLOCK_CHECK_S = 0.1


def _next_notice(client: ClockdController, admin: SimulatedGPU, held: int) -> tuple[ClockNotice, float | None]:
    """Poll like a trainer's step ends until a notice arrives; also when the lock was back."""
    t0 = time.monotonic()
    relocked = None
    while time.monotonic() - t0 < HANG_S:
        if relocked is None and admin.locked_sm_clock_mhz() == held:
            relocked = time.monotonic() - t0
        notices = client.notices()
        if notices:
            assert len(notices) == 1, notices
            if relocked is None and admin.locked_sm_clock_mhz() == held:
                relocked = time.monotonic() - t0
            return notices[0], relocked
        time.sleep(0.005)
    raise AssertionError("no notice from the daemon")


def test_clock_reset_under_a_clockd_client_is_reapplied_then_given_up(sim_dir, sock_dir, tmp_path):
    """An admin resets the clock a client holds: the daemon reads it back within the client's
    ``clock_check_s``, re-applies it and sends an ``override`` notice; the fourth time it gives up
    (``failed``, GPU at default, later requests ignored). The other client's GPU keeps its lock."""
    for i in (0, 1):
        SimulatedGPU(i, preset="A100-SXM", reset_state=True).close()
    sock = sock_dir / "c.sock"
    log = tmp_path / "clockd.log"
    with clockd_process(sock, "--gpu", "sim", "--gpus", "0,1", "--sim-dir", str(sim_dir), log_path=log):
        admin = SimulatedGPU(0)
        watched = ClockdController(str(sock), uuid=admin.uuid, cuda_visible_devices=None,
                                   clock_check_s=CLOCK_CHECK_S).start()
        other = ClockdController(str(sock), uuid=SimulatedGPU(1).uuid, cuda_visible_devices=None).start()
        other.set_frequency(900)
        watched.set_frequency(705)
        assert watched.flush().current == 705 and other.flush().current == 900
        events, relocked = [], []
        for _ in range(MAX_OVERRIDES + 1):
            admin.reset_locked_sm_clock()  # nvidia-smi -rgc
            notice, after = _next_notice(watched, admin, 705)
            events.append(notice)
            relocked.append(after)
        assert [n.kind for n in events] == ["override"] * MAX_OVERRIDES + ["failed"]
        for count, n in enumerate(events[:-1], 1):
            assert (n.expected, n.found, n.reapplied, n.count, n.max) == (705, 1410, True, count, MAX_OVERRIDES)
            assert relocked[count - 1] is not None
        assert "changed outside Perseus" in events[-1].message and events[-1].reset is True
        assert not read_sim_state(0).locked
        watched.set_frequency(900)  # ignored from now on, as by the local controller
        assert watched.flush().current is None and not read_sim_state(0).locked
        assert read_sim_state(1).locked_mhz == 900 and other.notices() == [] and other.flush().current == 900
        watched.close()
        other.close()
        admin.close()
    text = log.read_text()
    assert text.count("changed outside the daemon") == MAX_OVERRIDES and "GPU 0: clock control failed" in text
    assert not read_sim_state(0).locked and not read_sim_state(1).locked
    print(f"\nclockd: clock reset from outside re-applied after "
          f"{', '.join(f'{t:.3f}' for t in relocked[:-1])} s (clock_check_s {CLOCK_CHECK_S})")


UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000"]


@pytest.mark.parametrize("code, what, reset", [(3, "not supported", True), (15, "GPU not found", False)])
def test_nvml_failing_for_one_clients_gpu_leaves_the_other_client_alone(sock_dir, tmp_path, code, what, reset):
    """The daemon on fake NVML GPUs; GPU 0 refuses lower clocks (NOT_SUPPORTED, or GPU_IS_LOST
    after which every call on it fails). Its client gets one ``failed`` notice at its next step
    end and default clocks; the daemon resets that GPU (a lost one cannot be) and tries no further
    lock on it; the client of GPU 1 sets clocks before, during and after, untouched."""
    shim, calls = tmp_path / "shim", tmp_path / "calls"
    shim.mkdir()
    calls.mkdir()
    devices = [{"uuid": UUIDS[0], "lock_error": code, "lost_marker": str(tmp_path / "gpu0-lost")}, {"uuid": UUIDS[1]}]
    env = {**os.environ, **write_shim(shim, {"log_dir": str(calls), "devices": devices})}
    env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    sock = sock_dir / "n.sock"
    log = tmp_path / "clockd.log"
    with clockd_process(sock, "--gpu", "nvml", log_path=log, env=env):
        failing = ClockdController(str(sock), uuid=UUIDS[0], cuda_visible_devices=None, clock_check_s=0.1).start()
        other = ClockdController(str(sock), uuid=UUIDS[1], cuda_visible_devices=None, clock_check_s=0.1).start()
        other.set_frequency(1005)
        assert other.flush().current == 1005
        t0 = time.monotonic()
        failing.set_frequency(1005)
        stats = failing.flush()  # the step's work: flush only to make the test's timeline exact
        (notice,) = failing.notices()  # the step end
        told_s = time.monotonic() - t0
        assert stats.current is None and stats.errors == 1
        assert notice.kind == "failed" and what in notice.message and notice.reset is reset
        failing.set_frequency(900)  # ignored from now on
        other.set_frequency(900)
        assert failing.flush().current is None
        assert other.flush().current == 900 and other.notices() == [] and other.alive
        assert failing.notices() == []
        failing.close()
        other.close()
    (daemon_calls,) = read_clock_calls(calls).values()  # one process used the fake: the daemon
    gpu0 = [c for c in daemon_calls if c["device"] == 0]
    refused = [i for i, c in enumerate(gpu0) if c["call"] == "nvmlDeviceSetGpuLockedClocks" and not c["ok"]]
    assert len(refused) == 1 and gpu0[refused[0]]["error"] == code
    assert gpu0[refused[0] + 1]["call"] == "nvmlDeviceResetGpuLockedClocks" and gpu0[refused[0] + 1]["ok"] is reset
    assert not [c for c in gpu0[refused[0] + 1:] if c["call"] == "nvmlDeviceSetGpuLockedClocks"]
    gpu1 = [c for c in daemon_calls if c["device"] == 1]
    assert [c["args"] for c in gpu1 if c["call"] == "nvmlDeviceSetGpuLockedClocks" and c["args"][0] < 1410] == \
        [[1005, 1005], [900, 900]]
    assert all(c["ok"] for c in gpu1) and gpu1[-1]["locked"] is None
    text = Path(log).read_text()
    assert "GPU 0: clock control failed" in text and "GPU 1: clock control failed" not in text
    print(f"\nclockd, NVML error {code} on one GPU: its client told after {told_s:.3f} s; the other client unaffected")


def test_daemon_stopped_while_a_plan_holds_a_clock_is_a_failed_notice(sim_dir, sock_dir, tmp_path):
    """A plan holding one clock sends no requests; the daemon stops (SIGTERM) and resets the GPU.
    The client learns it at its next step end (``notices()``, no warning), as the local controller's
    trainer learns of a dead controller process; afterwards nothing raises or blocks."""
    SimulatedGPU(0, preset="A100-SXM", reset_state=True).close()
    sock = sock_dir / "c.sock"
    with clockd_process(sock, "--gpu", "sim", "--sim-dir", str(sim_dir), log_path=tmp_path / "clockd.log"):
        client = ClockdController(str(sock), uuid=SimulatedGPU(0).uuid, cuda_visible_devices=None,
                                  clock_check_s=CLOCK_CHECK_S).start()
        client.set_frequency(705)
        assert client.flush().current == 705 and client.notices() == []
    assert not read_sim_state(0).locked, "the daemon reset the GPU on its way out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the notice is the one report: no ControllerDiedWarning
        (notice,) = client.notices()
        assert notice.kind == "failed" and "closed the connection" in notice.message
        assert client.notices() == [] and not client.alive
        client.set_frequency(900)
        client.reset()
        assert client.flush() is None
        assert client.close() is False
