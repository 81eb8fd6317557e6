"""The GPU's work between steps (the optimizer, the gradient all-reduce) on the asynchronous simulated
GPU with a step tail: the runtime launches the tail itself at every step's end, runs it at default
clocks in plan steps (a plan's last clock no longer runs on into it, nor the next step's first,
once asked for ahead), and the guard judges it as part of the step, probes and plan steps alike.

Each check is in the simulated GPU's own time: the kernels' clocks and timestamps on its stream."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_gpu_time_runtime import JOB, WORK, cache_plan, exact_plan

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import H200_MEMORY_BOUND_ACTIVITY, get_preset
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.guard.job_guard import RankGuard
from perseus.runtime.phases import Phase
from perseus.runtime.port.sim_kernels import STEP_TAIL_TAG

TAIL_S = 0.03
JOB_SYNC = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
TAILED = replace(get_preset("H200"), step_tail_s=TAIL_S, step_tail_activity=H200_MEMORY_BOUND_ACTIVITY,
                 step_tail_compute_fraction=0.1)


def config(tmp_path: Path, **kw: object) -> PerseusConfig:
    SimulatedGPU(0, model=TAILED, state_dir=tmp_path / "sim", reset_state=True, stream_depth=6).close()
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "warmup_steps": 2, "p_blocking_w": 110.0, "straggler_period_steps": 0,
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim"), "stream_depth": 6}, **kw})


def steps_of(kernels: list) -> list[tuple[list, object]]:
    """The stream's kernels as (a step's instruction kernels, its tail)."""
    out, current = [], []
    for k in kernels:
        if k.tag == STEP_TAIL_TAG:
            out.append((current, k))
            current = []
        else:
            current.append(k)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """A plan at 1200-1530 MHz with default-clock probes, 14 steps; the client launches no tail."""
    tmp_path = tmp_path_factory.mktemp("between")
    cfg = config(tmp_path, mode="run", probe_every_steps=4)
    probe = SimulatedGPU(1, preset="H200", state_dir=tmp_path / "probe", reset_state=True)
    profile, frontier = exact_plan(probe)
    probe.close()
    cache_plan(cfg, profile, frontier)
    judged: list[float] = []
    original = RankGuard.end_step

    def spy(self: RankGuard, judged_s: float, *args: object, **kw: object):  # what the guard judges
        judged.append(judged_s)
        return original(self, judged_s, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RankGuard, "end_step", spy)
        with PerseusRuntime(JOB, cfg) as rt:
            gpu = rt.gpu.sim_device
            assert gpu is not None and rt.sim_kernels is not None
            for _ in range(14):
                rt.on_step_begin()
                for inst in rt.schedule.stages[0]:
                    rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                    rt.sim_kernels.pad(WORK[inst.kind])
                    rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                rt.on_step_end()
            gpu.stream.synchronize()
            records = list(rt.reporter.records)
            clocks = rt.stage_clocks()
            kernels = gpu.stream.kernels()
    return records, steps_of(kernels), judged, clocks


def test_the_runtime_launches_the_models_tail_after_every_steps_last_instruction(run) -> None:
    records, steps, _, clocks = run
    assert len(steps) == len(records) == 14  # one tail per step, none launched by the client
    for ks, tail in steps:
        assert len(ks) == len(clocks) and tail.start_s >= ks[-1].end_s - 1e-9
        assert tail.end_s - tail.start_s >= TAIL_S - 1e-9


def test_the_work_between_steps_runs_at_default_clocks_in_plan_steps(run) -> None:
    records, steps, _, clocks = run
    default = TAILED.sm_max_mhz
    assert max(clocks) < default  # the plan runs every instruction below the default clock
    plan = [(ks, tail) for rec, (ks, tail) in zip(records, steps) if rec.phase is Phase.DEPLOYED and rec.clocks == "plan"]
    assert len(plan) >= 5
    # the tail kernel started at the default clock (before, at the next step's first clock, asked ahead)
    assert [tail.set_mhz for _, tail in plan] == [default] * len(plan)
    # and the plan's own clocks still ran: every instruction after the first (asked for at its own begin)
    own = sum(k.set_mhz == c for ks, _ in plan for k, c in zip(ks[1:], clocks[1:]))
    assert own / (len(plan) * (len(clocks) - 1)) >= 0.85


def test_the_guard_judges_the_work_between_steps_in_plan_steps_and_probes_alike(run) -> None:
    records, steps, judged, _ = run
    deployed = [(rec, s) for rec, s in zip(records, steps) if rec.phase is Phase.DEPLOYED]
    assert len(judged) == len(deployed) and {rec.clocks for rec, _ in deployed} == {"plan", "default"}
    for j, (rec, (ks, tail)) in zip(judged, deployed):
        # the GPU's step: its first instruction's begin to its end event, which follows the tail
        assert j == pytest.approx(rec.gpu_step_s, rel=1e-9)
        assert j >= ks[-1].end_s - ks[0].start_s + TAIL_S - 1e-3
        assert rec.between_steps_s == pytest.approx(tail.end_s - ks[-1].end_s, abs=2e-3)
        assert rec.between_steps_energy_j is not None and rec.between_steps_energy_j > 0


def test_on_the_synchronous_gpu_the_tail_runs_at_default_clocks_with_its_own_energy(tmp_path: Path) -> None:
    """No GPU timeline (the host's time is the GPU's): after a plan step's last instruction the host
    asks for default clocks at once, the runtime runs the tail in its step end, and the step's
    between-step energy is the tail's (the direct counter read before it: ``HostSteps.mark_tail``)."""
    import numpy as np
    from test_engine_local import DirectController  # tests/runtime is on sys.path

    from perseus.frontier import Frontier, FrontierPoint, save_frontier
    from perseus.runtime.port.gpu_port import GPUPort
    from perseus.schedules import build_schedule

    model = replace(get_preset("A100-SXM"), step_tail_s=0.02, step_tail_activity=0.5, step_tail_compute_fraction=0.1)
    low, sched = 600, build_schedule("1f1b", 1, 2)
    save_frontier(Frontier(sched, 80.0, 1.0, 10.0, [FrontierPoint(1.0, 5.0, np.full(4, low))]), tmp_path / "f.json")
    device = SimulatedGPU(0, model=model, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0,
                          reset_state=True)
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": None, "warmup_steps": 2,
                                   "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "probe_every_steps": 0,
                                   "frontier_path": str(tmp_path / "f.json"), "straggler_period_steps": 0})
    tails = []
    with PerseusRuntime(JOB_SYNC, cfg, gpu=GPUPort(device, DirectController(device))) as rt:
        for _ in range(6):
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.sim_kernels.pad(0.002)
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                last = device.last_kernel()
            rt.on_step_end()
            tails.append((rt.reporter.records[-1], last, device.last_kernel()))
    deployed = [(rec, inst, tail) for rec, inst, tail in tails if rec.phase is Phase.DEPLOYED]
    assert len(deployed) == 4
    for rec, inst, tail in deployed:
        assert inst.start_mhz == low and tail.work_s == pytest.approx(0.02)  # the plan's clock, then the tail
        assert tail.start_mhz == model.sm_max_mhz  # default clocks: asked for before it ran
        # the interval the runtime read: the tail at its power, and the idle GPU for whatever host time
        # around it the interval also held (a loaded machine's, judged against what it measured)
        assert rec.between_steps_s >= tail.duration_s
        energy = (model.busy_power_w(model.sm_max_mhz, 0.5) * tail.duration_s
                  + model.p_blocking_w * (rec.between_steps_s - tail.duration_s))
        assert rec.between_steps_energy_j == pytest.approx(energy, rel=0.05)


@pytest.mark.parametrize("depth", [0, 6])
def test_the_demos_compute_leaves_the_tail_to_the_runtime_and_times_it_in_the_iteration(tmp_path: Path,
                                                                                        depth: int) -> None:
    """The demo wrapper no longer launches the tail itself: one tail per step (it launched a second
    one, which every run on a tailed preset then carried), inside the iteration it measures."""
    from perseus_demo.common import SimulatedCompute

    model = replace(get_preset("A100-SXM"), step_tail_s=0.02, step_tail_activity=0.5, step_tail_compute_fraction=0.1)
    SimulatedGPU(0, model=model, state_dir=tmp_path / "sim", reset_state=True, stream_depth=depth).close()
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": None, "mode": "measure-only",
                                   "warmup_steps": 2, "log_every_steps": 0,
                                   "sim_gpu": {"state_dir": str(tmp_path / "sim"), "stream_depth": depth}})
    with PerseusRuntime(JOB_SYNC, cfg) as rt:
        gpu = rt.gpu.sim_device
        assert gpu is not None
        compute = SimulatedCompute(rt, gpu, {"forward": 0.002, "backward": 0.004})
        for _ in range(4):
            compute.on_step_begin()
            for inst in rt.schedule.stages[0]:
                compute.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                compute.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            compute.on_step_end()
        if depth:
            assert sum(k.tag == STEP_TAIL_TAG for k in gpu.stream.kernels()) == 4
        else:
            assert gpu.last_kernel().work_s == pytest.approx(0.02)  # the last thing the GPU ran: one tail
    busy = sum(0.002 if kind == "forward" else 0.004 for kind, *_ in compute.iterations[-1]["instructions"])
    assert all(it["time_s"] >= busy + 0.02 for it in compute.iterations)
