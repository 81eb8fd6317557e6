"""Fidelity on an asynchronous simulated H200: clocks landing on their instruction, time and
energy as the GPU spent them, no energy reads on the training thread (issue 33).

One training thread runs 1F1B steps (8 microbatches, forward 10 ms and backward 20 ms of max-clock
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.gpu.controller import make_controller
from perseus.gpu.gpu_time import GPUStepTimer, SimTimeline, non_instruction_work
from perseus.gpu.measurement import (
    EnergyPoller,
    attribute_energy,
    attribution_window_s,
    poll_interval_s,
)
from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.sim.stream import StreamKernel
from perseus.gpu.stream_clocks import StreamClocks
from perseus.gpu.stream_follow import FollowMechanism, StreamFollower

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
        for s in range(steps):
            timer.step_begin()
            for i, (kind, _mb) in enumerate(order):
                work = FORWARD_S if kind == "forward" else BACKWARD_S
                mhz = fixed_mhz if fixed_mhz is not None else rng.choice(CLOCKS)
                planned[(s, i)] = mhz
                planned_s = profile[(work, mhz)]
                t0 = time.thread_time()
                if fixed_mhz is None and follow:
                    ev = clocks.instruction(mhz, planned_s)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--depth", type=int, default=6, help="kernels the host may run ahead (>= 4)")
    ap.add_argument("--mechanisms", action="store_true", help="also time the follower mechanisms")
    args = ap.parse_args()
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
