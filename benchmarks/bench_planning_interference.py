"""Does planning slow rank 0's training steps? Steps while the planner runs against steps before.

Rank 0 plans while it trains. A GPU-bound trainer's Python thread spends most of a step blocked
(waiting on the GPU, a collective) and wakes up for short bursts of Python work (hooks, kernel
launches). Each "training step" here is ``--instructions`` × (``--burst-us`` of Python work, then
``--wait-ms`` asleep, like a blocking GPU sync): what it measures is how long the trainer waits
for a CPU (and for the GIL) at its wake-ups while something plans beside it.

Planning modes (``--modes``):

- ``thread``: ``plan_frontier`` in a thread of the trainer's process (the runtime before the
  planner process: the planner's Python work holds the GIL);
- ``shared``: the runtime's planner process at nice 10 in the trainer's session (the planner
  process before it got a session of its own);
- ``own``: the runtime's planner process as it starts now (``start_child``): nice 10, its own
  session (so its own autogroup where the kernel has autogroup scheduling), single-threaded;
- ``own0``: the same at nice 0 (``planner_nice: 0``, what the CPU demos use).

Fair on a shared machine: the windows alternate, ``none, mode, none, mode, ...`` (the modes'
order rotates every round), and each planning window's median step is divided by the mean of the
two no-planning windows around it, so slow drifts of the machine's load cancel. The noise floor is
the same ratio between two consecutive no-planning windows ("before" against "before"). Each
planning window starts a fresh planner, waits ``--child-start-s`` for it to import and start
planning (not measured), and plans the ``--stages`` × ``--microbatches`` 1F1B pipeline on the
public GPT-3 A100 profile (/work/shared/data, or ``PERSEUS_ARTIFACT_DATA``) over and over, so every
measured step overlaps planning. It also records the CPU time the planner got (a planner that
does not slow the trainer because it hardly runs would show here), and the load average.

The planner can only take CPU time from the trainer when no core is idle: on a machine with cores
to spare every mode that keeps the planner out of the trainer's process is within noise.
``--busy N`` starts N busy-looping processes, each in a session of its own (other jobs, other
users, data loaders), for the whole run, so the saturated case is measured whatever else the
machine does.

    python benchmarks/bench_planning_interference.py
    python benchmarks/bench_planning_interference.py --rounds 12 --steps 40   # docs/runtime.md's run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "perseus-sosp24"))
MODES = ("thread", "shared", "own", "own0")
LABELS = {"none": "none (before vs before)", "thread": "thread", "shared": "process, trainer's session",
          "own": "process, own session (now)", "own0": "process, own session, nice 0"}
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _plan_inputs(stages: int, microbatches: int):
    from perseus.profile import load_profile
    from perseus.schedules import build_schedule

    return build_schedule("1f1b", stages, microbatches), load_profile(DATA / "gpt3-175b+a100_sxm_bf16.csv", 83.64)


def plan_forever(schedule, profile, options):
    """Planner function for the runtime's planner process: plans until the process is stopped."""
    from perseus.planner import plan_frontier

    while True:
        plan_frontier(schedule, profile, options)


def _cpu_s(stat_path: str) -> float:
    """User + system CPU seconds of a process or thread (/proc/.../stat)."""
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def _step(instructions: int, burst_s: float, wait_s: float) -> float:
    t0 = time.perf_counter()
    for _ in range(instructions):
        end = time.perf_counter() + burst_s
        x = 0
        while time.perf_counter() < end:  # Python work of the hooks and launches
            x += 1
        time.sleep(wait_s)  # blocked on the GPU: the GIL is free
    return time.perf_counter() - t0


def _steps(args: argparse.Namespace) -> np.ndarray:
    return np.array([_step(args.instructions, args.burst_us * 1e-6, args.wait_ms * 1e-3) for _ in range(args.steps)])


class _PlannerThread:
    """The runtime before the planner process: ``plan_frontier`` in a daemon thread, in a loop."""

    def __init__(self, schedule, profile) -> None:
        self._stop = threading.Event()
        self._tid: list[int] = []
        self._thread = threading.Thread(target=self._run, args=(schedule, profile), daemon=True)
        self._thread.start()
        while not self._tid:
            time.sleep(0.01)
        self.stat = f"/proc/self/task/{self._tid[0]}/stat"

    def _run(self, schedule, profile) -> None:
        from perseus.planner import plan_frontier

        self._tid.append(threading.get_native_id())
        while not self._stop.is_set():
            plan_frontier(schedule, profile)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()  # finishes its current plan first


def planning_window(mode: str, args: argparse.Namespace, schedule, profile) -> tuple[np.ndarray, float]:
    """Step times while ``mode`` plans, and the planner's CPU share (CPU s per wall s) meanwhile."""
    from perseus.planner import PlannerOptions
    from perseus.planner.process import ProcessPlanner, start_child

    if mode == "thread":
        planner = _PlannerThread(schedule, profile)
        stat = planner.stat
    else:
        import bench_planning_interference as me  # by module name: the child imports it (not __main__)

        child = start_child(nice=0 if mode == "own0" else 10, own_session=mode != "shared")
        planner = ProcessPlanner(schedule, profile, PlannerOptions(), me.plan_forever, started=child)
        stat = f"/proc/{child.pid}/stat"
    time.sleep(args.child_start_s)  # let it import and start planning before measuring
    cpu0, wall0 = _cpu_s(stat), time.perf_counter()
    times = _steps(args)
    share = (_cpu_s(stat) - cpu0) / (time.perf_counter() - wall0)
    if mode != "thread" and planner.status != 0:
        raise SystemExit(f"the planner process stopped early: {planner.error}")
    planner.close()
    return times, share


def _spread(values: list[float]) -> str:
    v = np.array(values)
    return f"{np.median(v):.3f} ({np.percentile(v, 25):.2f}..{np.percentile(v, 75):.2f}; {v.min():.2f}..{v.max():.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="thread,shared,own", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=32)
    ap.add_argument("--instructions", type=int, default=32, help="wake-ups per training step")
    ap.add_argument("--burst-us", type=float, default=50.0)
    ap.add_argument("--wait-ms", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=40, help="steps per window")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--child-start-s", type=float, default=3.0, help="wait for the planner to start")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes (own sessions) for the whole run")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: pick from {', '.join(MODES)} (got {args.modes!r})")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(args.busy)]
    try:
        run(args, modes)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace, modes: list[str]) -> None:
    schedule, profile = _plan_inputs(args.stages, args.microbatches)
    ratio: dict[str, list[float]] = {m: [] for m in ["none", *modes]}
    p90: dict[str, list[float]] = {m: [] for m in ["none", *modes]}
    share: dict[str, list[float]] = {m: [] for m in modes}
    loads: list[float] = []
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        before = _steps(args)
        loads.append(os.getloadavg()[0])
        for mode in order:
            during, cpu = planning_window(mode, args, schedule, profile)
            after = _steps(args)
            ratio[mode].append(float(np.median(during) / np.mean([np.median(before), np.median(after)])))
            p90[mode].append(float(np.percentile(during, 90) / np.mean([np.percentile(before, 90), np.percentile(after, 90)])))
            ratio["none"].append(float(np.median(after) / np.median(before)))
            p90["none"].append(float(np.percentile(after, 90) / np.percentile(before, 90)))
            share[mode].append(cpu)
            before = after
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds} (load {loads[-2]:.1f}..{loads[-1]:.1f}): "
              + ", ".join(f"{m} x{ratio[m][-1]:.2f}" for m in order), file=sys.stderr, flush=True)
    print(f"training step: {args.instructions} x ({args.burst_us:.0f} us Python + {args.wait_ms:.1f} ms blocked); "
          f"planning 1f1b {args.stages}x{args.microbatches} (GPT-3 A100 profile) in a loop; {args.rounds} rounds x "
          f"{args.steps} steps per window; {os.cpu_count()} CPUs, {args.busy} busy processes; load average {min(loads):.1f}..{max(loads):.1f} "
          f"(median {np.median(loads):.1f})")
    print("ratio = window's step time / mean of the no-planning windows before and after it; "
          "median (quartiles; min..max) over windows")
    print(f"{'planning':<30} {'windows':>7} {'median step ratio':>34} {'p90 step ratio':>34} {'planner CPU share':>18}")
    for mode in ["none", *modes]:
        cpu = f"{np.median(share[mode]):.2f}" if mode in share else "-"
        print(f"{LABELS[mode]:<30} {len(ratio[mode]):>7} {_spread(ratio[mode]):>34} {_spread(p90[mode]):>34} {cpu:>18}")


if __name__ == "__main__":
    main()
