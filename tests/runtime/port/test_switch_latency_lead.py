"""The measured clock-switch latency is the GPU timeline's request lead where none is configured: on
the asynchronous simulated H200 with a 10 ms switch latency, the plan's clocks land on their own
instruction (judged from the simulated GPU's own kernel record, ``SimStream.kernels()``), where a
lead of 0 let each switch land about 9 ms into the instruction it was meant for.

The share is judged per step, the median step: on this shared machine a burst of load delays the
clock controller's wake-up past the requests' 1 ms margin for a step or two, and a run without any
switch latency then misses as often (0.83-0.98 of its instructions at load 10 on 2 cores)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from statistics import mean, median

import numpy as np

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.sim.device import SimulatedGPU
from perseus.profile import Profile
from perseus.profile.model import SwitchLatency
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import simulate_plan

LATENCY_S = 0.010
WORK = {"forward": 0.015, "backward": 0.030}  # longer than the latency: each switch can land in time
TAIL_S = 0.03
CLOCKS = (1530, 1410, 1305, 1200)
JOB = PipelineJob(num_stages=1, num_microbatches=4, stage=0)


def _inputs(tmp_path: Path, latency: SwitchLatency | None) -> tuple[Profile, Frontier]:
    """The simulated H200's own profile (with ``latency`` as measured) and a one-point frontier
    giving each instruction a random clock."""
    probe = SimulatedGPU(1, preset="H200", state_dir=tmp_path / "probe", reset_state=True)
    exact = probe.exact_profile(WORK, CLOCKS)
    probe.close()
    profile = replace(exact, switch_latency=latency)
    sched = JOB.build_schedule()
    dag = InstructionDAG.from_schedule(sched)
    rng = random.Random(5)
    plan = np.array([rng.choice(CLOCKS) for _ in range(dag.num_nodes)], dtype=np.int64)
    sim = simulate_plan(dag, profile, plan)
    return profile, Frontier(sched, profile.p_blocking_w, sim.time_s, sim.energy_j,
                             [FrontierPoint(sim.time_s, sim.energy_j, plan)], gpu_name=profile.gpu_name)


def _deployed(tmp_path: Path, latency: SwitchLatency | None, steps: int = 9) -> tuple[list[float], PerseusRuntime]:
    """Per deployed plan step, the share of its instructions that started at their own clock (the
    first one's is set between steps: not counted)."""
    state = tmp_path / "sim"
    SimulatedGPU(0, preset="H200", state_dir=state, reset_state=True, stream_depth=6,
                 switch_latency_s=LATENCY_S).close()
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                   "warmup_steps": 2, "p_blocking_w": 110.0, "straggler_period_steps": 0,
                                   "probe_every_steps": 0, "mode": "run", "log_every_steps": 0,
                                   "sim_gpu": {"state_dir": str(state), "stream_depth": 6}})
    profile, frontier = _inputs(tmp_path, latency)
    with PerseusRuntime(JOB, cfg) as rt:
        assert rt.supply.cache is not None
        rt.supply.cache.save_profile(profile)
        rt.supply.cache.save_frontier(frontier)
    with PerseusRuntime(JOB, cfg) as rt:
        gpu, kernels = rt.gpu.sim_device, rt.sim_kernels
        assert gpu is not None and kernels is not None and gpu.asynchronous
        for _ in range(steps):
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                kernels.pad(WORK[inst.kind])
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            gpu.stream.launch(TAIL_S, activity=0.5, tag="tail")
            rt.on_step_end()
        gpu.stream.synchronize()
        clocks = rt.stage_clocks()
        assert clocks is not None
        records, per_step, current = list(rt.reporter.records), [], []
        for k in gpu.stream.kernels():
            if k.tag == "tail":
                per_step.append(current)
                current = []
            else:
                current.append(k)
        shares = [sum(k.set_mhz == c for k, c in zip(ks[1:], clocks[1:])) / (len(ks) - 1)
                  for rec, ks in zip(records, per_step) if rec.clocks == "plan"]
        assert len(shares) >= 5
        return shares, rt


def test_the_profiles_measured_latency_is_the_request_lead_and_the_clocks_land_in_time(tmp_path: Path) -> None:
    shares, rt = _deployed(tmp_path, SwitchLatency(LATENCY_S, 6))
    # what the lead decides, with room for a loaded machine waking the follower late (one switch in
    # seven missed beside three busy processes); without the lead the median is about 0.14, and the
    # 0.95 target is benchmarks/bench_switch_latency.py's
    assert median(shares) >= 0.8 and mean(shares) >= 0.7, shares
    summary = rt.summary()["switch_latency"]
    assert summary["source"] == "measured" and summary["seconds"] == LATENCY_S and summary["origin"] == "profile"
    assert [data["source"] for _, what, data in rt.events if what == "switch_latency"] == ["measured"]
    assert rt.gpu.switch_latency_s == LATENCY_S


def test_without_a_measured_latency_the_switches_land_late(tmp_path: Path) -> None:
    """The same run from a profile that has none: the lead is 0 and most switches land inside the
    instruction they were meant for (what the issue saw on the H200 replay); the run says so."""
    shares, rt = _deployed(tmp_path, None, steps=7)
    assert median(shares) < 0.5, shares
    assert rt.summary()["switch_latency"]["source"] == "default"
