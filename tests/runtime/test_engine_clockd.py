"""The runtime with ``PERSEUS_CLOCKD_SOCKET``: an unprivileged rank profiles clocks through the daemon."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from perseus.errors import PerseusError
from perseus.gpu.clockd.daemon import ClockDaemon, DaemonOptions
from perseus.gpu.clockd.client import ClockdController
from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    sock_dir = Path(tempfile.mkdtemp(prefix="clockd-"))  # AF_UNIX paths are short
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True).close()
    devices = [SimulatedGPU(0, state_dir=str(tmp_path / "sim"))]
    d = ClockDaemon(devices, DaemonOptions(str(sock_dir / "c.sock"), allow_uids=frozenset({os.getuid()}))).start()
    thread = threading.Thread(target=d.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("PERSEUS_CLOCKD_SOCKET", d.options.socket_path)
    yield d
    d.stop()
    thread.join(timeout=10)
    devices[0].close()
    shutil.rmtree(sock_dir, ignore_errors=True)


def config(tmp_path, **kw):
    # allow_clock_setting=False: this process itself may not change clocks
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim"), "allow_clock_setting": False},
                                    "warmup_steps": 2, "p_blocking_seconds": 0.05, **kw})


def test_unprivileged_rank_profiles_clocks_through_the_daemon(tmp_path, daemon):
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"))
    with PerseusRuntime(JOB, config(tmp_path, mode="profile", freq_min_mhz=1200, freq_step_mhz=100,
                                    iters_per_freq=1, remeasure_max=0)) as rt:
        assert isinstance(rt.gpu.controller, ClockdController)
        for _ in range(6):  # 2 warm-up + 3 clocks (no re-measuring: sleep noise must not lengthen the sweep)
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                time.sleep(0.002 * (2 if inst.kind == "backward" else 1))  # the runtime's simulated kernel
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        s = rt.summary()
    assert s["profiled_clocks_mhz"] == [1410, 1305, 1200] and s["phase"] == "steady"
    assert device.snapshot().n_lock >= 2, "the daemon locked the profiled clocks"
    assert not device.is_clock_locked(), "closing the runtime released the GPU at default clocks"
    for _ in range(500):  # the daemon notices the closed connection asynchronously
        if not daemon.clients:
            break
        time.sleep(0.01)
    assert not daemon.clients
    device.close()


def test_refusing_daemon_is_a_startup_error(tmp_path, daemon):
    daemon.options.allow_uids = frozenset({os.getuid() + 1})
    with pytest.raises(PerseusError, match="allow"):
        PerseusRuntime(JOB, config(tmp_path))
