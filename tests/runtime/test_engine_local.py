"""Single-process runtime (no torch.distributed): modes, privileges, targets, disabled runtime,
and the simulated GPU stretching a client's plain CPU work."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from perseus.errors import ConfigError
from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.control.controller import NullController
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import get_preset
from perseus.profile import load_json
from perseus.profile.fit import robust_stats
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.store.cache import RunCache
from perseus.runtime.port.gpu_port import GPUPort
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

sys.path.insert(0, str(Path(__file__).parent))
import local_steps

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)


def sim(tmp_path, **kw):
    return SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True, **kw)


def config(tmp_path, **kw):
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                    "p_blocking_seconds": 0.05, **kw})


def train(runtime, device, steps, t=0.002):
    """A client whose instructions are plain CPU work: the runtime makes each a simulated kernel."""
    local_steps.train(runtime, steps, t)


def test_measure_only_without_profile_never_touches_clocks(tmp_path, caplog):
    device = sim(tmp_path)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path, mode="measure-only")) as rt:
            assert isinstance(rt.gpu.controller, NullController), "measure-only is the GPU layer's NullController"
            train(rt, device, 4)
            s = rt.summary()
    assert [p for _, p in s["phase_history"]] == ["warmup", "steady"]
    assert s["baseline"]["energy_j"] > 0 and s["baseline"]["time_s"] > 0
    assert device.snapshot().n_lock == 0, "measure-only must never lock a clock"
    assert "no frequency sweep" in caplog.text


def test_measure_only_plans_from_provided_profile(tmp_path):
    device = sim(tmp_path)
    # a privileged profile-mode run leaves a profile in the cache ...
    with PerseusRuntime(JOB, config(tmp_path, mode="profile", freq_min_mhz=1200, freq_step_mhz=100,
                                    iters_per_freq=1, remeasure_max=0)) as rt:
        train(rt, device, 6)  # 2 warm-up + 3 clocks (no re-measuring: sleep noise must not lengthen the sweep)
        s = rt.summary()
    assert s["profiled_clocks_mhz"] == [1410, 1305, 1200] and s["phase"] == "steady"
    assert "frontier" not in s
    (entry,) = [p for p in (tmp_path / "cache").iterdir()]
    profile_path = entry / "profile.json"
    assert load_json(profile_path).get(0, "backward").freqs_mhz == (1410, 1305, 1200)
    locks = device.snapshot().n_lock
    # ... which an unprivileged measure-only run uses for planning only
    cfg = config(tmp_path, mode="measure-only", profile_path=str(profile_path), cache_dir=None)
    with PerseusRuntime(JOB, cfg) as rt:
        train(rt, device, 4)
        deadline = time.monotonic() + 300  # hang guard: the planner process starts slowly on a loaded machine
        while rt.phase.value == "planning" and time.monotonic() < deadline:
            train(rt, device, 1)  # planning runs in the background; training goes on meanwhile
        s = rt.summary()
    assert [p for _, p in s["phase_history"]] == ["warmup", "planning", "steady"]
    assert s["frontier"]["points"] >= 1
    assert device.snapshot().n_lock == locks


def test_plan_wait_deploys_at_the_first_planning_step_however_long_planning_takes(tmp_path, monkeypatch):
    import planner_stand_ins as stand_ins

    from perseus.runtime.supply import planning

    monkeypatch.setattr(planning, "plan_frontier", stand_ins.slow)  # 3 s: many of these 1-ms steps
    device = sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path, mode="profile", freq_min_mhz=1200, freq_step_mhz=100,
                                    iters_per_freq=1, remeasure_max=0)) as rt:
        train(rt, device, 6)  # 2 warm-up + 3 clocks (no re-measuring: sleep noise must not lengthen the sweep)
    (entry,) = [p for p in (tmp_path / "cache").iterdir()]
    cfg = config(tmp_path, mode="measure-only", profile_path=str(entry / "profile.json"), cache_dir=None,
                 plan_wait_s=200.0)
    with PerseusRuntime(JOB, cfg) as rt:
        train(rt, device, 3, t=0.0005)
        history = rt.summary()["phase_history"]
    assert [p for _, p in history] == ["warmup", "planning", "steady"]
    (planning_step, _), (steady_step, _) = history[1], history[2]
    assert steady_step == planning_step + 1, history  # one step waited for the plan, none ran without it


def test_plan_wait_must_stay_below_the_collective_timeout():
    with pytest.raises(ConfigError, match="plan_wait_s .* must be below collective_timeout_s"):
        PerseusConfig.from_dict({"plan_wait_s": 300, "collective_timeout_s": 300})


def test_run_mode_without_clock_privilege_is_config_error(tmp_path):
    sim(tmp_path, allow_clock_setting=False).close()
    cfg = config(tmp_path, sim_gpu={"state_dir": str(tmp_path / "sim"), "allow_clock_setting": False},
                 without_clock_access="fail")  # the default measures only (tests/runtime/port/test_clock_access.py)
    with pytest.raises(ConfigError, match="measure-only"):
        PerseusRuntime(JOB, cfg)


def test_invalid_job_and_targets(tmp_path):
    with pytest.raises(ConfigError, match="stage 3"):
        PerseusRuntime(PipelineJob(num_stages=2, num_microbatches=2, stage=3), config(tmp_path, mode="measure-only"))
    sim(tmp_path)
    with PerseusRuntime(JOB, config(tmp_path, mode="measure-only")) as rt:
        with pytest.raises(ConfigError, match="slowdown"):
            rt.set_target_slowdown(0.5)
        with pytest.raises(ConfigError, match="target time"):
            rt.set_target_time(0)


def test_provided_frontier_for_another_job_is_rejected(tmp_path):
    import numpy as np

    from perseus.frontier import Frontier, FrontierPoint
    from perseus.schedules import build_schedule

    sched = build_schedule("1f1b", 1, 4)
    save_frontier(Frontier(sched, 80.0, 1.0, 1.0, [FrontierPoint(1.0, 1.0, np.full(8, 1410))]), tmp_path / "f.json")
    sim(tmp_path)
    with pytest.raises(ConfigError, match="plan for this job"):
        PerseusRuntime(JOB, config(tmp_path, mode="measure-only", frontier_path=str(tmp_path / "f.json")))


def test_disabled_runtime_is_inert(tmp_path):
    rt = PerseusRuntime(JOB, PerseusConfig.from_dict({"enabled": False, "gpu": "nvml"}))
    rt.on_step_begin()
    rt.on_instruction_begin("forward", 0)
    rt.on_instruction_end("forward", 0)
    rt.on_step_end()
    assert rt.summary() == {"enabled": False}
    rt.close()
    rt.close()


def test_cache_key_changes_with_microbatches(tmp_path):
    a = RunCache(tmp_path, {"microbatches": 2})
    b = RunCache(tmp_path, {"microbatches": 4})
    assert a.dir != b.dir


def test_simulated_gpu_defaults_to_the_ranks_own_index(tmp_path):
    # Simulated GPUs are files named by index: without device_index, rank 3 must not share GPU 0.
    device = SimulatedGPU(3, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    job = PipelineJob(num_stages=1, num_microbatches=2, stage=0, rank=3, world_size=4)
    cfg = config(tmp_path, mode="measure-only").replace(device_index=None)
    with PerseusRuntime(job, cfg) as rt:
        assert rt.gpu.device.index == 3
    device.close()


class RecordingController(NullController):
    """Measure-free stand-in for the controller process that remembers the order of requests."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        super().set_frequency(mhz, at)
        self.log.append(("request", mhz))


@pytest.mark.parametrize("switch_ahead", [True, False])
def test_switch_ahead_requests_the_next_clock_when_the_previous_instruction_ends(tmp_path, switch_ahead):
    schedule = build_schedule("1f1b", 1, 2)  # forward 0, backward 0, forward 1, backward 1
    clocks = np.array([1410, 900, 1200, 900])
    point = FrontierPoint(1.0, 1.0, clocks)
    save_frontier(Frontier(schedule, 80.0, 1.0, 2.0, [point]), tmp_path / "f.json")
    log: list = []
    device = sim(tmp_path)
    port = GPUPort(device, RecordingController(log))
    cfg = config(tmp_path, frontier_path=str(tmp_path / "f.json"), warmup_steps=1, switch_ahead=switch_ahead,
                 probe_every_steps=0)  # no probe block among the 2 deployed steps
    with PerseusRuntime(JOB, cfg, gpu=port) as rt:
        for _ in range(3):
            rt.on_step_begin()
            for inst in schedule.stages[0]:
                log.append(("begin", inst.kind, inst.microbatch))
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        assert rt.phase.value == "deployed"
    ahead = [("begin", "forward", 0), ("request", 900), ("begin", "backward", 0), ("request", 1200),
             ("begin", "forward", 1), ("request", 900), ("begin", "backward", 1), ("request", 1410)]
    at_start = [("begin", "forward", 0), ("request", 1410), ("begin", "backward", 0), ("request", 900),
                ("begin", "forward", 1), ("request", 1200), ("begin", "backward", 1), ("request", 900)]
    # ahead: each clock is asked for when the previous instruction ends (the next step's first at
    # the end of a step), so it is already right when its instruction begins
    assert log[-8:] == (ahead if switch_ahead else at_start)


class DirectController(NullController):
    """Applies each clock at once, in the calling thread (no controller process): clocks change only
    in the hooks, outside the kernels, so every kernel runs at one known clock."""

    enabled = True

    def __init__(self, device: SimulatedGPU) -> None:
        super().__init__()
        self.device = device

    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        super().set_frequency(mhz, at)
        self.device.set_locked_sm_clock(mhz)

    def reset(self) -> None:
        super().reset()
        self.device.reset_locked_sm_clock()


def test_plain_cpu_work_is_stretched_by_the_clock_profiled_and_planned(tmp_path):
    """A client that only sleeps inside its instructions (no busy section of its own): on the
    simulated GPU each instruction is a kernel whose max-clock time is that CPU time, stretched
    by the clock; profiling records the stretched times, and the deployed plan's clocks change
    the simulated energy. Exact identities of the simulator's own accounting, whatever the load."""
    model = get_preset("A100-SXM")
    waits: list[float] = []  # the simulated GPU's waits for the rest of a kernel, after the CPU work

    def sleep(dt: float) -> None:
        waits.append(dt)
        time.sleep(dt)

    device = sim(tmp_path, sleep=sleep)
    port = GPUPort(device, DirectController(device))
    # noise_k 0: planned on the fitted times themselves; with a noise margin a loaded machine's profile
    # may rightly plan all-max clocks, and this test is about the simulator's accounting, not noise
    cfg = config(tmp_path, freq_min_mhz=900, freq_step_mhz=255, iters_per_freq=1, early_stop_patience=0,
                 remeasure_max=0, noise_k=0.0, p_blocking_w=model.p_blocking_w, switch_ahead=False)
    cpu_s = {"forward": 0.004, "backward": 0.008}
    kernels: list[dict] = []
    with PerseusRuntime(JOB, cfg, gpu=port) as rt:
        assert rt.sim_kernels is not None and rt.sim_kernels.device is device
        # Less energy at a slower pace (as behind a straggler): the deployed plan lowers clocks.
        rt.set_target_slowdown(1.4)
        for _ in range(5000):  # hang guard: planning runs in the background meanwhile
            if rt.phase.value == "deployed" and sum(k["phase"] == "deployed" for k in kernels) >= 8:
                break
            rt.on_step_begin()
            phase = rt.phase.value
            for inst in rt.schedule.stages[0]:
                waits.clear()
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                begin = device.snapshot()  # settled when the kernel began
                time.sleep(cpu_s[inst.kind])
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                end = device.snapshot()
                start, duration = device.last_busy_interval()
                kernels.append({"phase": phase, "kind": inst.kind, "mhz": device.last_busy_clock_mhz(),
                                "start": start, "duration": duration, "wait": sum(waits),
                                "energy": end.energy_j - begin.energy_j, "span": end.t_ref - begin.t_ref})
                assert start == begin.busy_start and begin.busy
            rt.on_step_end()
        summary = rt.summary()
        profile = rt.supply.profile
        # Stopped (the demo's "baseline again"): default clocks, steps no longer counted or
        # checked, and the instructions are still kernels of the simulated GPU.
        rt.stop()
        steps = rt.step
        train(rt, device, 2)
        assert rt.step == steps and rt.phase.value == "deployed" and not device.is_clock_locked()
        assert device.last_busy_clock_mhz() == 1410 and device.last_busy_interval()[0] > kernels[-1]["start"]
    assert summary["phase"] == "deployed" and summary["fallback"] is None, summary
    assert summary["profiled_clocks_mhz"] == [1410, 1155, 900]
    assert {k["phase"] for k in kernels} >= {"warmup", "profiling", "planning", "deployed"}

    # 1. Every instruction, in every phase, was a kernel: its CPU time (the kernel's time before
    # the simulated GPU waited) is its max-clock time, stretched by the clock it ran at.
    for k in kernels:
        cpu = k["duration"] - k["wait"]
        assert cpu >= cpu_s[k["kind"]], k  # the kernel contains the client's work
        assert k["duration"] == pytest.approx(cpu * model.slowdown(k["mhz"], 0.8), rel=1e-9), k
    slow = [k for k in kernels if k["mhz"] < 1410]
    assert slow and all(k["wait"] > 0 for k in slow), "a lower clock makes the instruction take longer"

    # 2. Profiling recorded the stretched kernels: per kind and clock, the median of its kernels
    # (the raw time); the planner's time is the monotone fit plus a noise margin.
    assert profile is not None
    for kind in cpu_s:
        entry = profile.get(0, kind)
        assert entry.freqs_mhz == (1410, 1155, 900)
        q = profile.quality[(0, 0, kind)]
        for f, t, r, fit in zip(entry.freqs_mhz, entry.times_s, q["raw_time_s"], q["fitted_time_s"]):
            runs = [k["duration"] for k in kernels if k["phase"] == "profiling" and k["kind"] == kind and k["mhz"] == f]
            # the median after outliers (a descheduled sleep) are dropped: profile_fit.robust_stats
            assert runs and r == pytest.approx(robust_stats(runs).median, rel=1e-6), (kind, f, r, runs)
            assert t >= fit - 1e-12, (kind, f, t, fit)  # the fit pools a load-stretched clock with the next
            assert t >= cpu_s[kind] * model.slowdown(f, 0.8)

    # 3. The deployed plan ran below the max clock, and the simulated GPU's energy followed each
    # kernel's clock: busy power at that clock while it ran, blocking power around it.
    deployed = [k for k in kernels if k["phase"] == "deployed"]
    assert any(k["mhz"] < 1410 for k in deployed), deployed
    for k in kernels:
        busy = model.busy_power_w(k["mhz"], 1.0) * k["duration"]
        assert k["energy"] == pytest.approx(busy + model.p_blocking_w * (k["span"] - k["duration"]), rel=1e-9), k
    for k in deployed:  # the same max-clock work costs less energy at the plan's lower clocks
        if k["mhz"] < 1410:
            cpu = k["duration"] - k["wait"]
            assert model.busy_power_w(k["mhz"], 1.0) * k["duration"] < model.busy_power_w(1410, 1.0) * cpu
    device.close()
