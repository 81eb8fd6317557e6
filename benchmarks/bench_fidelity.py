"""Fidelity on an asynchronous simulated H200: clocks landing on their instruction, time and
energy as the GPU spent them, no energy reads on the training thread (issue 33).

The default (``--json``) drives the real runtime: ``PerseusRuntime`` on a one-stage 1F1B job (8
microbatches, forward 10 ms and backward 20 ms of max-clock work, a 30 ms non-instruction tail per
step launched after the last instruction) on the simulated H200 in asynchronous mode, the host up
to ``--depth`` kernels ahead. Two runs: ``mode: run`` with a given frontier whose plan gives every
instruction its own clock (clock landing, step time and energy against the GPU's record, the
hooks' CPU time), and ``mode: profile`` sweeping two clocks (the profile's forward and backward
energy per instruction against what the simulated GPU spent). ``--layer`` runs the GPU-layer
version below instead.

``--layer``: one training thread runs 1F1B steps (8 microbatches, forward 10 ms and backward 20 ms of max-clock
work, a 30 ms optimizer-like tail of non-instruction GPU work per step) onto the simulated H200's
stream (the host runs up to ``--depth`` kernels ahead and never synchronizes). Each instruction
has its own planned clock; ``StreamClocks`` hangs the request on the stream, the real clock
controller process makes it. The simulated GPU's record of what it ran is the truth.

    python benchmarks/bench_fidelity.py --json

prints one JSON object: own_clock_share, step_time_ratio, energy_step_ratio, attr_error_forward,
attr_error_backward, training_thread_nvml_reads, training_thread_us_per_instruction, plus the
same numbers for the request-at-the-hook and host-timed baselines, and the follower mechanisms'
delays (``--mechanisms``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import threading
import time
from statistics import median
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.gpu.control.controller import make_controller
from perseus.gpu.stream.gpu_time import GPUStepTimer, SimTimeline, non_instruction_work
from perseus.gpu.meter.energy import (
    EnergyPoller,
    attribute_energy,
    attribution_window_s,
    poll_interval_s,
)
from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.sim.stream import StreamKernel
from perseus.gpu.stream.clocks import StreamClocks
from perseus.gpu.stream.follow import FollowMechanism, StreamFollower

FORWARD_S, BACKWARD_S, TAIL_S = 0.010, 0.020, 0.030
TAIL_ACTIVITY = 0.5
MICROBATCHES = 8
CLOCKS = (1530, 1410, 1305, 1200)
FOLLOW = FollowMechanism.BLOCK


def one_f_one_b(stages: int = 4, stage: int = 1, n: int = MICROBATCHES) -> list[tuple[str, int]]:
    """Stage ``stage``'s 1F1B order: warm-up forwards, steady F/B pairs, cool-down backwards."""
    warm = min(stages - stage - 1, n)
    order = [("forward", m) for m in range(warm)]
    f, b = warm, 0
    while f < n:
        order += [("forward", f), ("backward", b)]
        f, b = f + 1, b + 1
    order += [("backward", m) for m in range(b, n)]
    return order


@dataclass
class Run:
    kernels: list[StreamKernel]
    planned: dict[tuple[int, int], int]
    steps: list
    us_per_instruction: float
    main_reads: int
    max_ahead: int
    updates: list


def run(gpu: SimulatedGPU, steps: int, *, follow: bool, fixed_mhz: int | None, seed: int = 0) -> Run:
    """``steps`` 1F1B steps; ``follow``: requests through the stream follower (else at the hook)."""
    stream = gpu.stream
    first_kernel = len(stream.kernels())
    controller = make_controller(gpu.spec(), enabled=True).start()
    follower = StreamFollower(FOLLOW)
    clocks = StreamClocks(stream, follower, controller.set_frequency, timed=controller.timed_requests)
    timer = GPUStepTimer(stream, follower, SimTimeline())
    poller = EnergyPoller(gpu, poll_interval_s(gpu.energy_update_period_s), clock=time.monotonic).start()
    rng = random.Random(seed)
    order = one_f_one_b()
    # the plan's durations (a profile): each kind's GPU time at each clock
    profile = {(w, f): gpu.kernel_time_s(w, f) for w in (FORWARD_S, BACKWARD_S) for f in (*CLOCKS, fixed_mhz or 1530)}
    planned: dict[tuple[int, int], int] = {}
    settled = []
    hook_s, n_inst = 0.0, 0
    try:
        if fixed_mhz is not None:
            controller.set_frequency(fixed_mhz)
            controller.flush()
        # the plan, drawn up front: the runtime hands each instruction's hook the next one's clock too
        plan = [fixed_mhz if fixed_mhz is not None else rng.choice(CLOCKS) for _ in range(steps * len(order))]
        for s in range(steps):
            timer.step_begin()
            for i, (kind, _mb) in enumerate(order):
                work = FORWARD_S if kind == "forward" else BACKWARD_S
                at = s * len(order) + i
                mhz = plan[at]
                planned[(s, i)] = mhz
                planned_s = profile[(work, mhz)]
                t0 = time.thread_time()
                if fixed_mhz is None and follow:
                    ev = clocks.instruction(mhz, planned_s, plan[at + 1] if at + 1 < len(plan) else None)
                    timer.begin(kind, ev)
                else:
                    if fixed_mhz is None:
                        controller.set_frequency(mhz)  # today's request at the hook
                    timer.begin(kind)
                t1 = time.thread_time()
                stream.launch(work, tag=(s, i))
                t2 = time.thread_time()
                timer.end()
                hook_s += (t1 - t0) + (time.thread_time() - t2)
                n_inst += 1
            stream.launch(TAIL_S, activity=TAIL_ACTIVITY, tag=(s, "tail"))
            timer.step_end()
            settled += timer.settled(poller.updates())
        stream.synchronize()
        follower.drain()
        time.sleep(gpu.energy_update_period_s * 1.5)
        settled += timer.settled(poller.updates())
    finally:
        poller.stop()
        follower.close()
        controller.reset()
        controller.close()
    main_reads = gpu.energy_reads[threading.get_ident()]
    return Run(stream.kernels()[first_kernel:], planned, settled, hook_s / n_inst * 1e6, main_reads, stream.max_ahead,
               poller.updates())


def true_energy(gpu: SimulatedGPU, kernels: list[StreamKernel], t0: float, t1: float) -> float:
    """What the simulated GPU spent in [t0, t1]: its kernels at their power, P_blocking between."""
    m = gpu.model
    busy_j, busy_s = 0.0, 0.0
    for k in kernels:
        s, e = max(k.start_s, t0), min(k.end_s, t1)
        if e > s:
            activity = TAIL_ACTIVITY if k.tag[1] == "tail" else 1.0
            mhz = m.throttled_clock(k.set_mhz, activity, m.tdp_w)
            busy_j += m.busy_power_w(mhz, activity) * (e - s)
            busy_s += e - s
    return busy_j + m.p_blocking_w * (t1 - t0 - busy_s)


def own_clock_share(r: Run) -> float:
    inst = [k for k in r.kernels if k.tag[1] != "tail"]
    return sum(k.set_mhz == r.planned[k.tag] for k in inst) / len(inst)


def step_ratios(gpu: SimulatedGPU, r: Run) -> tuple[float, float]:
    by_step: dict[int, list[StreamKernel]] = {}
    for k in r.kernels:
        by_step.setdefault(k.tag[0], []).append(k)
    t_rt = t_true = e_rt = e_true = 0.0
    for st in r.steps[1:-1]:
        ks = by_step[st.index]
        inst = [k for k in ks if k.tag[1] != "tail"]
        t_rt += st.instruction_span_s
        t_true += inst[-1].end_s - inst[0].start_s
        e_rt += st.energy_j
        e_true += true_energy(gpu, r.kernels, inst[0].start_s, ks[-1].end_s)
    return t_rt / t_true, e_rt / e_true


def attribution_errors(gpu: SimulatedGPU, r: Run) -> dict[str, float]:
    instructions = [i for st in r.steps for i in st.instructions]
    instructions += [w for st in r.steps for w in non_instruction_work(st)]
    result = attribute_energy(r.updates, instructions, idle_power_w=gpu.model.p_blocking_w)
    m = gpu.model
    true_w = m.busy_power_w(m.throttled_clock(1530, 1.0, m.tdp_w), 1.0)
    return {f"attr_error_{k}": abs(result.keys[k].power_w - true_w) / true_w for k in ("forward", "backward")} | {
        f"attr_stderr_{k}_w": result.keys[k].power_stderr_w for k in ("forward", "backward")}


def mechanisms(gpu: SimulatedGPU, n: int = 80) -> dict[str, dict[str, float]]:
    """Each follower mechanism's delay from the GPU reaching a boundary to the action, and its CPU."""
    out = {}
    stream = gpu.stream
    for name, mech, poll in (("poll_50us", FollowMechanism.POLL, 50e-6), ("poll_200us", FollowMechanism.POLL, 2e-4),
                             ("block", FollowMechanism.BLOCK, 50e-6)):
        follower = StreamFollower(mech, poll, keep_log=True)
        events = []
        t0 = time.monotonic()
        for i in range(n):
            ev = stream.record()
            follower.follow(ev, lambda seen: None)
            events.append(ev)
            stream.launch(0.005, tag=(-1, i))
        stream.synchronize()
        follower.drain()
        wall = time.monotonic() - t0
        assert follower.log is not None
        delays = sorted((f.seen_s - e.gpu_time_s) * 1e6 for f, e in zip(follower.log, events))
        out[name] = {"delay_median_us": delays[len(delays) // 2], "delay_p99_us": delays[int(0.99 * (len(delays) - 1))],
                     "cpu_cores": follower.cpu_s / wall}
        follower.close()
    return out


# ==================================================================== the real runtime

RT_CLOCKS = (1530, 1410, 1305, 1200)


@dataclass
class RuntimeRun:
    steps: list  # per step: (record, [kernels], tail kernel)
    kinds: list[str]
    clocks: list[int] | None
    hook_us: float  # the hooks' time per instruction (median), with the simulated H200's event cost charged
    event_us: float  # of which event cost
    main_reads: int
    max_ahead: int
    profile: object | None
    energy_se: dict
    hook_mean_us: float  # the same, mean over the instructions (a preempted one counts in full)


def _exact_inputs(gpu: SimulatedGPU, job) -> tuple:
    """A profile (the simulated H200's own times and energies) and a one-point frontier whose plan
    gives each instruction a random clock: what ``mode: run`` deploys (from the cache, so the plan
    carries its planned timeline)."""
    import numpy as np

    from perseus.frontier import Frontier, FrontierPoint
    from perseus.schedules.dag import InstructionDAG
    from perseus.timeline.simulator import simulate_plan

    profile = gpu.exact_profile({"forward": FORWARD_S, "backward": BACKWARD_S}, RT_CLOCKS)
    sched = job.build_schedule()
    dag = InstructionDAG.from_schedule(sched)
    rng = random.Random(7)
    plan = np.array([rng.choice(RT_CLOCKS) for _ in range(dag.num_nodes)], dtype=np.int64)
    sim = simulate_plan(dag, profile, plan)
    frontier = Frontier(sched, profile.p_blocking_w, sim.time_s, sim.energy_j,
                        [FrontierPoint(sim.time_s, sim.energy_j, plan)], gpu_name=profile.gpu_name)
    return profile, frontier


# The hooks are timed on the wall clock, the framework's launch and the simulator's code subtracted
# (its event code, whose charged cost is added back, and ``SimulatedKernels``, the runtime's side of
# the simulated kernels, absent on a real GPU), and the median instruction taken: none of them
# blocks, and a median leaves out the instructions another process preempted on this shared
# machine. Not ``time.thread_time``: one call costs 1.5-6.5 µs on this virtual machine (a system
# call; ``perf_counter`` 0.1-0.8 µs), and the timing wrappers inside the hooks made about ten per
# instruction, most of the 27-35 µs it read.
HOOK_CLOCK = time.perf_counter


def runtime_run(d: Path, depth: int, steps: int, settings: dict, plan: tuple | None = None) -> RuntimeRun:
    """``steps`` steps of a one-stage 1F1B job through ``PerseusRuntime``'s hooks; ``plan``:
    (profile, frontier) put in the run's cache first."""
    from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob

    job = PipelineJob(num_stages=1, num_microbatches=MICROBATCHES, stage=0)
    state = d / "sim"
    SimulatedGPU(0, preset="H200", state_dir=state, reset_state=True, stream_depth=depth).close()
    cfg = PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(d / "cache"), "warmup_steps": 2,
                                   "p_blocking_w": 110.0, "log_every_steps": 0,
                                   "sim_gpu": {"state_dir": str(state), "stream_depth": depth}, **settings})
    if plan is not None:
        with PerseusRuntime(job, cfg) as rt:  # opens the cache entry of this job: the plan goes there
            assert rt.supply.cache is not None
            rt.supply.cache.save_profile(plan[0])
            rt.supply.cache.save_frontier(plan[1])
    launch_cpu = [0.0]
    out: list = []
    with PerseusRuntime(job, cfg) as rt:
        gpu = rt.gpu.sim_device
        assert gpu is not None and rt.sim_kernels is not None
        stream = gpu.stream
        launch = stream.launch

        def timed_launch(work_s: float, **kw: object) -> None:  # the framework's launch: not the hooks' cost
            c = HOOK_CLOCK()
            launch(work_s, **kw)  # type: ignore[arg-type]  # the stream's own keywords, passed through
            launch_cpu[0] += HOOK_CLOCK() - c

        stream.launch = timed_launch  # type: ignore[method-assign]  # timed for this run only
        kernels = rt.sim_kernels
        kernels_begin, kernels_end = kernels.begin, kernels.end

        def timed_begin() -> None:  # the simulator's kernel (it opens on the stream): no real card runs it
            c = HOOK_CLOCK()
            kernels_begin()
            launch_cpu[0] += HOOK_CLOCK() - c

        def timed_end(kind: object = None, chunk: int = 0) -> None:  # as above: it closes the kernel
            c = HOOK_CLOCK()
            kernels_end(kind, chunk)  # type: ignore[arg-type]  # the engine's arguments, passed through
            launch_cpu[0] += HOOK_CLOCK() - c

        kernels.begin = timed_begin  # type: ignore[method-assign]  # timed for this run only
        kernels.end = timed_end  # type: ignore[method-assign]  # timed for this run only
        record = stream.record

        def timed_record(*args: object) -> object:  # the simulator's own event code: a real card's is the charged cost
            c = HOOK_CLOCK()
            event = record(*args)  # type: ignore[arg-type]  # the stream's own arguments, passed through
            launch_cpu[0] += HOOK_CLOCK() - c
            return event

        stream.record = timed_record  # type: ignore[method-assign, assignment]  # timed for this run only
        order = list(rt.schedule.stages[0])
        samples: list[float] = []
        me = threading.get_ident()
        event_s = 0.0
        for step in range(steps):
            if step == steps // 3:  # the event pool has filled: the steady state's cost from here on
                samples, event_s = [], -stream.event_cost_s[me]
            rt.on_step_begin()
            for inst in order:
                before = launch_cpu[0]
                c0 = HOOK_CLOCK()
                rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                c1 = HOOK_CLOCK()
                rt.sim_kernels.pad(FORWARD_S if inst.kind == "forward" else BACKWARD_S)
                c2 = HOOK_CLOCK()
                rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                c3 = HOOK_CLOCK()
                samples.append((c1 - c0) + (c3 - c2) - (launch_cpu[0] - before))
            launch(TAIL_S, activity=TAIL_ACTIVITY, tag="tail")
            rt.on_step_end()
        stream.synchronize()
        kernels = stream.kernels()
        clocks = rt.stage_clocks()
        profile = rt.supply.profile if settings.get("mode") == "profile" else None
        run = rt.supply.profiling
        energy_se = dict(run.recorder.energy_se) if run is not None else {}
        main_reads = gpu.energy_reads[me]
        event_s += stream.event_cost_s[me]
        records = list(rt.reporter.records)
        max_ahead = stream.max_ahead
    step_kernels: list = []
    current: list = []
    for k in kernels:
        if k.tag == "tail":
            step_kernels.append((current, k))
            current = []
        else:
            current.append(k)
    out = [(rec, ks, tail) for rec, (ks, tail) in zip(records, step_kernels)]
    n = len(samples)
    event_us = event_s / n * 1e6
    return RuntimeRun(out, [i.kind for i in order], clocks, median(samples) * 1e6 + event_us, event_us, main_reads,
                      max_ahead, profile, energy_se, sum(samples) / n * 1e6 + event_us)


def _true_energy(gpu_model, kernels: list, t0: float, t1: float) -> float:
    busy_j = busy_s = 0.0
    for k in kernels:
        s, e = max(k.start_s, t0), min(k.end_s, t1)
        if e > s:
            activity = TAIL_ACTIVITY if k.tag == "tail" else 1.0
            busy_j += gpu_model.busy_power_w(k.run_mhz, activity) * (e - s)
            busy_s += e - s
    return busy_j + gpu_model.p_blocking_w * (t1 - t0 - busy_s)


def runtime_bench(depth: int, steps: int) -> dict[str, object]:
    from perseus.gpu.sim.dvfs import get_preset
    from perseus.runtime import PipelineJob

    model = get_preset("H200")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        probe = SimulatedGPU(1, preset="H200", state_dir=d / "probe", reset_state=True)
        plan = _exact_inputs(probe, PipelineJob(num_stages=1, num_microbatches=MICROBATCHES, stage=0))
        probe.close()
        deployed = runtime_run(d / "run", depth, steps, {"mode": "run"}, plan)
        profiled = runtime_run(d / "profile", depth, 40, {"mode": "profile", "freq_min_mhz": 1305, "freq_max_mhz": 1530,
                                                          "freq_step_mhz": 225, "iters_per_freq": 6, "remeasure_max": 0})
    assert deployed.clocks is not None
    own = total = 0
    t_rt = t_true = e_rt = e_true = 0.0
    all_kernels = [k for _, ks, tail in deployed.steps for k in (*ks, tail)]
    for rec, ks, tail in deployed.steps:
        if rec.phase.value != "deployed" or rec.clocks != "plan":  # not the guard's default-clock probes
            continue
        own += sum(k.set_mhz == c for k, c in zip(ks, deployed.clocks))
        total += len(ks)
        t_rt += rec.time_s
        t_true += tail.end_s - ks[0].start_s
        e_rt += rec.energy_j
        e_true += _true_energy(model, all_kernels, ks[0].start_s, tail.end_s)
    errors: dict[str, float] = {}
    ses: dict[str, float] = {}
    profile = profiled.profile
    assert profile is not None
    for kind in ("forward", "backward"):
        entry = profile.get(0, kind, 0)  # type: ignore[attr-defined]  # the run's Profile, kept as object
        worst = 0.0
        for f, e in zip(entry.freqs_mhz, entry.energies_j):
            spent = [model.busy_power_w(k.run_mhz, 1.0) * (k.end_s - k.start_s)
                     for rec, ks, _ in profiled.steps if rec.phase.value == "profiling"
                     for k, kk in zip(ks, profiled.kinds) if kk == kind and k.set_mhz == f]
            if spent:
                truth = sum(spent) / len(spent)
                worst = max(worst, abs(e - truth) / truth)
        errors[f"attr_error_{kind}"] = worst
        se = [v for (key, _f), v in profiled.energy_se.items() if key[1] == kind]
        ses[f"attr_stderr_{kind}_j"] = max(se) if se else float("nan")
    return {
        "own_clock_share": own / max(total, 1),
        "step_time_ratio": t_rt / t_true,
        "energy_step_ratio": e_rt / e_true,
        **errors,
        "training_thread_nvml_reads": deployed.main_reads + profiled.main_reads,
        "training_thread_us_per_instruction": deployed.hook_us,
        "training_thread_us_per_instruction_mean": deployed.hook_mean_us,
        "training_thread_event_us_per_instruction": deployed.event_us,
        "host_max_ahead_instructions": deployed.max_ahead,
        "deployed_plan_steps": sum(rec.clocks == "plan" for rec, _, _ in deployed.steps),
        **ses,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--layer", action="store_true", help="drive the GPU-layer pieces directly, not the runtime")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--depth", type=int, default=6, help="kernels the host may run ahead (>= 4)")
    ap.add_argument("--mechanisms", action="store_true", help="also time the follower mechanisms (--layer)")
    args = ap.parse_args()
    if not args.layer:
        result = runtime_bench(args.depth, max(args.steps, 8) + 12)
        print(json.dumps(result) if args.json else "\n".join(f"{k:40s} {v}" for k, v in result.items()))
        return
    with tempfile.TemporaryDirectory() as d:
        gpu = SimulatedGPU(0, preset="H200", state_dir=d, reset_state=True, stream_depth=args.depth)
        try:
            followed = run(gpu, args.steps, follow=True, fixed_mhz=None)
            at_hook = run(gpu, max(3, args.steps // 3), follow=False, fixed_mhz=None, seed=1)
            # attribution's window from the counter period: 60 counter intervals at ~0.33 s a step
            window = attribution_window_s(gpu.energy_update_period_s, intervals=60)
            fixed = run(gpu, max(args.steps, math.ceil(window / 0.33)), follow=True, fixed_mhz=1530)
            t_ratio, e_ratio = step_ratios(gpu, followed)
            result: dict[str, object] = {
                "own_clock_share": own_clock_share(followed),
                "step_time_ratio": t_ratio,
                "energy_step_ratio": e_ratio,
                **attribution_errors(gpu, fixed),
                "training_thread_nvml_reads": followed.main_reads + fixed.main_reads,
                "training_thread_us_per_instruction": followed.us_per_instruction,
                "host_max_ahead_instructions": followed.max_ahead,
                "baseline_own_clock_share_at_hook": own_clock_share(at_hook),
            }
            if args.mechanisms:
                result["mechanisms"] = mechanisms(gpu)
        finally:
            gpu.close()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:40s} {v}")


if __name__ == "__main__":
    main()
