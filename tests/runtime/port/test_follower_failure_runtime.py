"""A deployed plan on the asynchronous simulated GPU whose stream raises a CUDA error from an event
in the middle of the run (``event_error_at``, as a graph captured in the global capture mode does
while the follower polls): training goes on without a stall, the GPU is at default clocks from that
step on and unlocked after close, and the rank says so in one line.

This failed with the follower thread that died on the error: every later step waited the fence's
5 s, and the GPU stayed at the plan's last clock."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from test_gpu_time_runtime import JOB, WORK, TAIL_S, cache_plan, exact_plan

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.state import read_sim_state
from perseus.runtime import PerseusConfig, PerseusRuntime
from perseus.runtime.phases import Phase

STEPS = 12
# 17 events a warm-up step (warm-up times each of the 8 instructions one by one: its begin and its
# end, and the step's end), 9 a deployed one of this plan (a begin event for 7 of its 8
# instructions: the step's first marks the step's begin, the last hangs the request for the
# between-steps default clocks, and one whose next instruction keeps its clock has nothing hanging
# on it; the span's end; its end): the instruction begins of the third deployed step (events
# 35+9+9=53 to 59), where the plan's clock requests hang, which only the follower asks about (a
# failing step end: the fence unit test's).
FAULT = {"event_error_at": 53, "event_error_count": 7}
MAX_STALL_S = 1.0  # a correct step end waits for the step's queued GPU work: ~0.1 s here


def faulty_config(tmp_path: Path) -> PerseusConfig:
    """A JSON-like config: the fault is a dict in ``sim_gpu``, as a config file holds it."""
    sim = {"state_dir": str(tmp_path / "sim"), "stream_depth": 6, "faults": dict(FAULT)}
    SimulatedGPU(0, preset="H200", reset_state=True, **sim).close()
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "warmup_steps": 2, "p_blocking_w": 110.0, "straggler_period_steps": 0,
                                    "mode": "run", "probe_every_steps": 0, "sim_gpu": sim})


def test_a_failed_follower_costs_no_stall_and_leaves_default_clocks(tmp_path: Path, caplog) -> None:
    cfg = faulty_config(tmp_path)
    probe = SimulatedGPU(1, preset="H200", state_dir=tmp_path / "probe", reset_state=True)
    profile, frontier = exact_plan(probe)
    probe.close()
    cache_plan(cfg, profile, frontier)
    stalls: list[float] = []
    locked_after: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="perseus"), PerseusRuntime(JOB, cfg) as rt:
        gpu, kernels = rt.gpu.sim_device, rt.sim_kernels
        assert gpu is not None and kernels is not None
        for _ in range(STEPS):
            rt.on_step_begin()
            for inst in rt.schedule.stages[0]:
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                kernels.pad(WORK[inst.kind])
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            gpu.stream.launch(TAIL_S, activity=0.5, tag="tail")
            t = time.monotonic()
            rt.on_step_end()
            stalls.append(time.monotonic() - t)
            locked_after.append(gpu.is_clock_locked())
        while gpu.stream.ahead():  # the GPU finishes (an event the host records now may still raise)
            time.sleep(0.005)
        records = list(rt.reporter.records)
        events = list(rt.events)
        phase = rt.phase
        default_mhz = gpu.default_sm_clock_mhz()
        kernels_run = gpu.stream.kernels()
        follower = rt.gpu.timeline
    assert not read_sim_state(0, tmp_path / "sim").locked  # nothing left locked after close
    assert not SimulatedGPU(0, state_dir=tmp_path / "sim").is_clock_locked()

    (failed,) = [(step, data) for step, what, data in events if what == "follower_failed"]
    deployed = min(step for step, what, data in events if what == "phase" and data == Phase.DEPLOYED.value)
    fault_step = failed[0] - 1  # the event is logged after the step that saw it ended
    assert "CUDA error" in failed[1]
    assert deployed <= fault_step <= STEPS - 4  # in the middle of a deployed run
    assert phase is Phase.FALLBACK and follower is None  # the port no longer follows the stream
    assert len(records) == STEPS  # training went on, every step measured
    after = records[fault_step + 1:]
    assert all(r.gpu_step_s is None and r.time_s > 0 and r.energy_j is not None for r in after)  # host-timed
    assert max(stalls[fault_step:]) <= MAX_STALL_S, stalls
    assert not any(locked_after[fault_step:])  # reset from the host at that step's end
    tails = [i for i, k in enumerate(kernels_run) if k.tag == "tail"]
    later = kernels_run[tails[fault_step] + 1:]
    assert later and all(k.set_mhz == default_mhz for k in later)  # no stream request came after it

    lines = [r.getMessage() for r in caplog.records if "following the GPU stream failed" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("perseus: rank 0: following the GPU stream failed (CUDA error")
    assert "continuing at default clocks for the rest of the run" in lines[0]
    assert 'capture_error_mode="thread_local"' in lines[0]
