"""Clock traces: per-instruction requested/applied clock events and their breakdown (runtime.clock_trace)."""

from __future__ import annotations

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.control.controller import NullController
from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.port.clock_trace import InstructionTrace, StepTrace, breakdown, from_dict, lateness_s
from perseus.runtime.port.gpu_port import GPUPort
from perseus.schedules import build_schedule
from perseus.frontier import save_frontier

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)
PLAN = [1410, 900, 900, 1200]  # forward 0, backward 0, forward 1, backward 1


class LoggingDirectController(NullController):
    """Applies each request to the simulated GPU in the calling thread and logs it."""

    enabled = True

    def __init__(self, device: SimulatedGPU, log: list) -> None:
        super().__init__()
        self.device, self.log = device, log

    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        super().set_frequency(mhz, at)
        self.log.append(("request", mhz))
        self.device.set_locked_sm_clock(mhz)

    def reset(self) -> None:
        super().reset()
        self.device.reset_locked_sm_clock()


def run(tmp_path, steps: int, stop_after: int | None = None, **kw):
    schedule = build_schedule("1f1b", 1, 2)
    save_frontier(Frontier(schedule, 80.0, 1.0, 2.0, [FrontierPoint(1.0, 1.0, np.array(PLAN))]), tmp_path / "f.json")
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    log: list = []
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                   "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 1,
                                   "probe_every_steps": 0,  # no default-clock probe steps among the traced ones
                                   "frontier_path": str(tmp_path / "f.json"), **kw})
    with PerseusRuntime(JOB, cfg, gpu=GPUPort(device, LoggingDirectController(device, log))) as rt:
        for step in range(steps):
            if step == stop_after:
                rt.stop()
            rt.on_step_begin()
            for inst in schedule.stages[0]:
                log.append(("begin", inst.kind, inst.microbatch))
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.sim_kernels.pad(0.002)
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        trace = rt.clock_trace
        data = trace.to_dict() if trace is not None else None
    device.close()
    return data, log


def test_no_trace_unless_asked(tmp_path):
    data, _ = run(tmp_path, 2)
    assert data is None


def test_each_instruction_records_its_planned_requested_and_applied_clock(tmp_path):
    data, _ = run(tmp_path, 5, stop_after=3, trace_clocks=True)
    insts, steps = from_dict(data)
    assert [s.phase for s in steps] == ["warmup", "deployed", "deployed", "stopped", "stopped"]
    assert [s.step for s in steps] == [0, 1, 2, 3, 4] and len(insts) == 5 * 4
    deployed = [i for i in insts if i.step in (1, 2)]
    assert [i.planned_mhz for i in deployed] == PLAN * 2
    assert all(i.planned_mhz is None for i in insts if i.step not in (1, 2))
    for i in deployed[1:]:
        # switch ahead with an instant switch: asked for before the kernel started, in force at its start
        assert i.requested_mhz == i.planned_mhz and i.requested_at is not None
        assert i.requested_at <= i.kernel_start and i.clock_applied_at <= i.kernel_start
        assert i.start_mhz == i.end_mhz == i.planned_mhz and lateness_s(i) == 0.0
        assert i.begin <= i.kernel_start <= i.kernel_start + i.kernel_s <= i.wait_returned <= i.end
        assert i.work_s == pytest.approx(0.002) and i.hook_s >= 0
    for i in insts:
        if i.step >= 3:  # default clocks after stop(): the kernels run at the max clock
            assert i.start_mhz == i.end_mhz == 1410
    assert all(s.trainer_cpu_s >= 0 for s in steps)


def test_without_the_plans_timeline_a_known_latency_is_not_hidden_and_says_so(tmp_path, caplog):
    # a frontier given without its profile: each clock is asked for when the instruction before ends
    data, log = run(tmp_path, 3, trace_clocks=True, planner_options={"switch_latency_s": 0.02})
    assert log[-7:] == [("begin", "forward", 0), ("request", 900), ("begin", "backward", 0),
                        ("begin", "forward", 1), ("request", 1200), ("begin", "backward", 1), ("request", 1410)]
    assert sum("not hidden" in r.message for r in caplog.records) == 1
    insts, _ = from_dict(data)
    assert [i.planned_mhz for i in insts if i.step == 2] == PLAN


class TimedLoggingController(NullController):
    """Logs each request with the time it is to be made at."""

    enabled = True
    timed_requests = True

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def set_frequency(self, mhz: int, at: float | None = None) -> None:
        super().set_frequency(mhz, at)
        self.log.append(("request", mhz, at))


def test_with_the_plans_timeline_each_switch_is_asked_for_latency_before_it_lands(tmp_path):
    from perseus.profile import InstructionProfile, Profile
    from perseus.runtime.supply.sources import cache_key
    from perseus.store.cache import RunCache
    from perseus.timeline.switch_timing import request_schedule

    # forward 10/12/15 ms, backward 20/24/30 ms at 1410/1200/900 MHz: the plan runs forward 0 at 0-10 ms,
    # backward 0 at 10-40, forward 1 at 40-55, backward 1 at 55-79
    clocks = (1410, 1200, 900)
    times = {"forward": (0.010, 0.012, 0.015), "backward": (0.020, 0.024, 0.030)}
    profile = Profile({(0, 0, k): InstructionProfile(clocks, t, tuple(300 * x for x in t)) for k, t in times.items()},
                      80.0, "A100-SXM4-40GB")
    schedule = build_schedule("1f1b", 1, 2)
    frontier = Frontier(schedule, 80.0, 0.079, 30.0, [FrontierPoint(0.079, 20.0, np.array(PLAN))])
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    log: list = []
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                   "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 1,
                                   "probe_every_steps": 0, "trace_clocks": True, "planner_options": {"switch_latency_s": 0.005}})
    port = GPUPort(device, TimedLoggingController(log))
    cache = RunCache(tmp_path / "cache", cache_key(JOB, schedule, port.name, port.driver_version, cfg,
                                                   gpus={"0": [port.key_settings()]}))
    cache.save_profile(profile)
    cache.save_frontier(frontier)
    hooks = []
    with PerseusRuntime(JOB, cfg, gpu=port) as rt:
        for _ in range(4):
            rt.on_step_begin()
            for inst in schedule.stages[0]:
                hooks.append(len(log))
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                rt.sim_kernels.pad(0.002)
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
            rt.on_step_end()
        insts, steps = from_dict(rt.clock_trace.to_dict())
    device.close()
    assert [s.phase for s in steps] == ["warmup", "deployed", "deployed", "deployed"]
    want = request_schedule([0, 0.010, 0.040, 0.055], [0.010, 0.040, 0.055, 0.079], PLAN, 0.005, 0.079)
    # onto backward 0 (900) from forward 0's begin; onto backward 1 (1200) from forward 1's begin;
    # onto the next step's forward 0 (1410) from backward 1's begin
    assert [(r.anchor, r.at_end, r.clock_mhz, r.next_step) for r in want] == [
        (3, False, 1410, True), (0, False, 900, False), (2, False, 1200, False)]
    deployed = [i for i in insts if i.step >= 1]
    timed = [entry for entry in log if entry[0] == "request" and entry[2] is not None]
    assert [m for _, m, _ in timed] == [900, 1200, 1410] * 3
    delays = {r.clock_mhz: r.delay_s for r in want}
    for (_, mhz, at), inst in zip(timed, [i for i in deployed if i.index in (0, 2, 3)]):
        # made in that instruction's begin hook, the delay after the hook read the clock; the one
        # for the next step also moved by how much longer than planned (0) the time between steps was
        assert inst.begin + delays[mhz] <= at
        if mhz != 1410:
            assert at <= inst.begin + delays[mhz] + inst.hook_s
    first_deployed = hooks[4]  # the new plan's first clock at once, before the first deployed step
    assert ("request", 1410, None) in log[:first_deployed + 1]


def _inst(planned, start_mhz, end_mhz, kernel_start, kernel_s, applied_at, model_s, wait_returned, hook_s=0.001, step=0):
    return InstructionTrace(step, 0, "forward", 0, 0, planned, planned, 0.0, kernel_start, wait_returned + 0.001,
                            hook_s, wait_returned, kernel_start, kernel_s, 0.01, start_mhz, end_mhz, applied_at, model_s)


def test_lateness_and_breakdown_are_what_the_records_say():
    on_time = _inst(900, 900, 900, 1.0, 0.012, 0.5, 0.012, 1.013)
    landed_inside = _inst(1410, 900, 1410, 2.0, 0.015, 2.010, 0.010, 2.015)
    never = _inst(1410, 900, 900, 3.0, 0.020, 0.5, 0.010, 3.020)
    raised = _inst(900, 1410, 1410, 4.0, 0.008, 3.99, 0.010, 4.008)  # faster than planned: not late
    assert lateness_s(on_time) == 0.0 and lateness_s(raised) == 0.0
    assert lateness_s(landed_inside) == pytest.approx(0.010)
    assert lateness_s(never) == pytest.approx(0.020)  # the planned clock never came: the whole kernel
    steps = [StepTrace(0, "deployed", 0.0, 4.0, 0.02, 0.5), StepTrace(1, "stopped", 4.0, 5.0, None, 0.4)]
    b = breakdown([on_time, landed_inside, never, raised], steps, lambda p: p == "deployed")
    assert (b.steps, b.instructions) == (1, 4)
    assert b.late_share == pytest.approx(2 / 4) and b.faster_share == pytest.approx(1 / 4)
    assert b.late_median_s == pytest.approx(0.015)
    assert b.late_max_s == pytest.approx(0.020)
    assert b.stretch_s == pytest.approx(0.005 + 0.010 - 0.002)  # kernel time beyond the planned clock's
    assert b.overshoot_s == pytest.approx(0.001)  # the first one's wait returned 1 ms after its kernel ended
    assert b.hook_s == pytest.approx(0.004) and b.controller_cpu_s == 0.02 and b.step_s == 4.0
    assert breakdown([on_time], steps, lambda p: p == "stopped").steps == 0


def test_apply_returns_once_a_latent_switch_has_landed(tmp_path):
    """The profiling sweep's clock change: with a 20 ms switch latency the controller's flush
    returns before the clock is in force; apply waits for it, so no profiled instruction runs at the
    previous clock."""
    device = SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True,
                          switch_latency_s=0.02)
    port = GPUPort(device, LoggingDirectController(device, []))
    port.apply(900)
    assert device.locked_sm_clock_mhz() == 900
    device.close()


def test_a_traced_kernel_on_the_model_runs_its_head_at_the_clock_before_a_switch_landing_inside_it():
    from perseus.runtime.port.clock_trace import kernel_on_model

    cost = {1410: (0.010, 4.0), 900: (0.015, 3.0)}.__getitem__  # (time, energy) of the work held at a clock
    held = _inst(900, 900, 900, 1.0, 0.015, 0.5, 0.015, 1.016)
    assert kernel_on_model(held, cost) == (0.015, 3.0)
    # the switch to 900 landed 4 ms into a kernel that began at 1410: 4/10 of the work at 1410
    landed = _inst(900, 1410, 900, 2.0, 0.013, 2.004, 0.015, 2.014)
    time_s, energy_j = kernel_on_model(landed, cost)
    assert time_s == pytest.approx(0.004 + 0.6 * 0.015) and energy_j == pytest.approx(0.4 * 4.0 + 0.6 * 3.0)
    # landed after the work at the first clock would have ended: all of it at that clock
    late = _inst(900, 1410, 900, 3.0, 0.010, 3.050, 0.015, 3.011)
    assert kernel_on_model(late, cost) == pytest.approx((0.010, 4.0))
    with pytest.raises(ValueError, match="simulated GPU's kernel record"):
        kernel_on_model(InstructionTrace(0, 0, "forward", 0, 0, 900, 900, 0.0, 1.0, 1.1, 0.001), cost)
