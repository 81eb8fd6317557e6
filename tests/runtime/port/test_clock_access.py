"""A run that should change clocks where a rank may not: root without CAP_SYS_ADMIN, MIG, a GPU
another Perseus process claimed, a lock someone else holds. ``without_clock_access`` decides for
the whole job: ``fail`` stops before training in one line; ``measure-only`` (the default) trains on
without changing a clock, as ``mode = measure-only``, and rank 0 says why once."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from perseus.errors import ConfigError
from perseus.gpu.clock_service import NoClockAccess
from perseus.gpu.control.controller import FrequencyController, NullController
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.faults import SimFaults
from perseus.runtime import Mode, PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.port.gpu_port import GPUPort, open_port

sys.path.insert(0, str(Path(__file__).parents[1]))
import local_steps

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)


@pytest.fixture(autouse=True)
def _no_clock_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)


def sim(tmp_path: Path, index: int = 0, **faults: Any) -> SimulatedGPU:
    """The GPU, made before the run with its faults (they live in its state file: the runtime attaches)."""
    return SimulatedGPU(index, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True,
                        faults=SimFaults(**faults))


def config(tmp_path: Path, **kw: Any) -> PerseusConfig:
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                    "p_blocking_seconds": 0.05, **kw})


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


# ---------------------------------------------------------------- root without CAP_SYS_ADMIN

def test_root_without_the_capability_and_fail_stops_before_training_in_one_line(tmp_path):
    device = sim(tmp_path, no_cap_sys_admin=True)
    with pytest.raises(ConfigError) as info:
        PerseusRuntime(JOB, config(tmp_path, without_clock_access="fail"))
    line = info.value.line
    assert line is not None and "\n" not in line and "CAP_SYS_ADMIN" in line and "--cap-add SYS_ADMIN" in line
    assert device.snapshot().n_lock == 0 and device.snapshot().n_reset == 0, "nothing touched the clocks"
    device.close()


def test_root_without_the_capability_trains_on_measuring_only_and_says_why_once(tmp_path, caplog):
    device = sim(tmp_path, no_cap_sys_admin=True)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path)) as rt:  # the default: measure-only
            assert rt.config.mode is Mode.MEASURE_ONLY and isinstance(rt.gpu.controller, NullController)
            local_steps.train(rt, 4, 0.002)
            s = rt.summary()
    assert [p for _, p in s["phase_history"]] == ["warmup", "steady"]
    assert s["baseline"]["energy_j"] > 0
    lines = warnings_about(caplog, "CAP_SYS_ADMIN")
    assert len(lines) == 1 and "rank 0" in lines[0] and "measuring only" in lines[0], lines
    snap = device.snapshot()
    assert snap.n_lock == 0 and not snap.locked, "default clocks throughout"
    device.close()


# ---------------------------------------------------------------- MIG

def test_mig_measures_and_run_mode_falls_back_or_stops_in_one_line(tmp_path, caplog):
    device = sim(tmp_path, mig=True)
    port = GPUPort.open("sim", 0, {"state_dir": str(tmp_path / "sim")}, control=False)
    try:
        assert port.energy_j() >= 0 and port.device.power_w() > 0
    finally:
        port.close()
    with pytest.raises(NoClockAccess) as info:
        GPUPort.open("sim", 0, {"state_dir": str(tmp_path / "sim")}, control=True)
    assert "MIG" in str(info.value) and "\n" not in str(info.value)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path)) as rt:
            assert rt.config.mode is Mode.MEASURE_ONLY
            local_steps.train(rt, 3, 0.001)
    assert len(warnings_about(caplog, "MIG")) == 1
    with pytest.raises(ConfigError, match="MIG"):
        PerseusRuntime(JOB, config(tmp_path, without_clock_access="fail"))
    assert device.snapshot().n_lock == 0
    device.close()


# ---------------------------------------------------------------- the GPU is claimed

def test_a_second_perseus_process_on_the_gpu_measures_only_and_the_first_keeps_control(tmp_path, caplog):
    device = sim(tmp_path)
    with caplog.at_level(logging.INFO, logger="perseus"):
        first = PerseusRuntime(JOB, config(tmp_path))
        try:
            assert isinstance(first.gpu.controller, FrequencyController) and first.config.mode is Mode.RUN
            with PerseusRuntime(JOB, config(tmp_path)) as second:
                assert second.config.mode is Mode.MEASURE_ONLY and isinstance(second.gpu.controller, NullController)
                first.gpu.apply(1200)  # the first still changes the clocks
                assert device.locked_sm_clock_mhz() == device.model.nearest_clock(1200)
            lines = warnings_about(caplog, "claimed by another Perseus process")
            assert len(lines) == 1 and "the other process's work included" in lines[0], lines
            assert device.is_clock_locked(), "the second one reset nothing"
        finally:
            first.close()
    assert not device.is_clock_locked()
    port = GPUPort.open("sim", 0, {"state_dir": str(tmp_path / "sim")}, control=True)  # the claim went with it
    try:
        assert port.controller.enabled
    finally:
        port.close()
    device.close()


def test_a_claimed_gpu_with_fail_stops_the_second_run(tmp_path):
    device = sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path)):
        with pytest.raises(ConfigError, match="claimed by another Perseus process"):
            PerseusRuntime(JOB, config(tmp_path, without_clock_access="fail"))
    device.close()


# ---------------------------------------------------------------- someone else's lock

def test_a_lock_someone_else_holds_is_reported_and_left_in_force(tmp_path, caplog):
    device = sim(tmp_path, foreign_lock_mhz=1200)
    held = device.locked_sm_clock_mhz()
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path)) as rt:
            assert rt.config.mode is Mode.MEASURE_ONLY
            local_steps.train(rt, 3, 0.001)
    lines = warnings_about(caplog, "already locked")
    assert len(lines) == 1 and f"at {held} MHz by someone else" in lines[0] and "-rgc" in lines[0], lines
    snap = device.snapshot()
    assert snap.locked and device.locked_sm_clock_mhz() == held, "the lock is someone else's: still in force"
    assert snap.n_reset == 0
    with pytest.raises(ConfigError, match="already locked"):
        PerseusRuntime(JOB, config(tmp_path, without_clock_access="fail"))
    assert device.is_clock_locked()
    device.close()


# ---------------------------------------------------------------- the job decides together

class Ranks:
    """An in-process stand-in for the job's collective, one instance per rank (threads)."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots: list[Any] = [None] * size

    def rank(self, r: int) -> Any:
        ranks = self

        class One:
            is_root = r == 0

            def _exchange(self, obj: Any) -> list[Any]:
                ranks.slots[r] = obj
                ranks.barrier.wait()
                out = list(ranks.slots)
                ranks.barrier.wait()
                return out

            def all_true(self, flag: bool) -> bool:
                return all(self._exchange(flag))

            def gather_to_root(self, obj: Any) -> list[Any] | None:
                out = self._exchange(obj)
                return out if self.is_root else None

            def broadcast_object(self, obj: Any) -> Any:
                return self._exchange(obj)[0]

        return One()


def open_ports(cfg: PerseusConfig, size: int) -> list[Any]:
    """Each rank's ``open_port`` outcome (port and config, or the error), run on threads."""
    ranks, out = Ranks(size), [None] * size

    def run(r: int) -> None:
        try:
            out[r] = open_port(cfg, ranks.rank(r), r)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_one_rank_without_clock_access_makes_every_rank_measure_only(tmp_path, caplog):
    gpus = [sim(tmp_path, 0), sim(tmp_path, 1, no_cap_sys_admin=True)]
    cfg = config(tmp_path, device_index=None)  # a simulated GPU per rank
    with caplog.at_level(logging.INFO, logger="perseus"):
        outcomes = open_ports(cfg, 2)
    try:
        for port, run_config in outcomes:
            assert run_config.mode is Mode.MEASURE_ONLY and isinstance(port.controller, NullController)
        lines = warnings_about(caplog, "measuring only")
        assert len(lines) == 1 and "rank 1: " in lines[0] and "CAP_SYS_ADMIN" in lines[0], lines
    finally:
        for port, _ in outcomes:
            port.close()
    assert not gpus[0].is_clock_locked() and gpus[1].snapshot().n_lock == 0
    outcomes = open_ports(cfg.replace(without_clock_access="fail"), 2)
    assert all(isinstance(o, ConfigError) for o in outcomes), outcomes
    assert "rank 1: " in outcomes[0].line and "CAP_SYS_ADMIN" in outcomes[0].line
    for g in gpus:
        g.close()
