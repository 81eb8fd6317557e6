"""Hostile conditions: the real runtime through each fault the simulated GPU shows on demand.

Every fault here was met on real clusters (``perseus/gpu/sim/faults.py``). A fault must never cost
the training job: each case drives ``PerseusRuntime`` in this process (``second_process``: two
processes) on the asynchronous simulated H200, a one-stage 1F1B job of 4 microbatches running a
given plan whose instructions alternate between clocks (``mode: run``), and records what the
job saw:

- ``training_continued``: every planned step ran (no exception out of a hook or step call);
- ``max_stall_s``: the largest extra wall time of any hook call after the fault began, over the
  median of that hook's calls before it (faults present from the start: over a fault-free run's);
- ``clocks_locked_at_exit``: the GPU is locked after the runtime closed (``foreign_lock``: locks
  Perseus made only; whether the foreign lock was left alone is its own field);
- ``message_lines``: the most ``perseus`` WARNING/ERROR log lines one rank printed from the
  moment the fault began (lines, not records: a traceback counts whole).

Mid-run faults begin once the runtime has started and run its plan a while (``Case.fault_at_s``;
``follower_error``: at the 100th recorded event); ``nvml_energy_dead`` trains on until the energy
poller has declared the counter dead. ``second_process``: the first process pauses (runtime open,
plan deployed) while the second trains, because the simulated GPU runs one process's kernel at a
time where a real one would interleave them; it trains again after the second closed.

Beside the faults, the measurements that real cards make hard, each by the runtime itself on the
simulated H200 (``MEASURES``; ``--faults-only`` skips them):

- ``attr_error_forward`` / ``attr_error_backward``: attributed vs true energy per instruction kind
  (fraction) on the hostile meter with 40 ms of GPU work between steps; ``power_over_limit``:
  attributed powers above the card's limit (``hostile_attribution.py``);
- ``latency_calibration_error``: the switch latency measured in profiling vs the simulated 10 ms
  (fraction), and ``own_clock_share``: the deployed instructions that began at their own clock
  (``bench_switch_latency.py``);
- ``fastest_plan_vs_unlocked``: the fastest plan's step time over the unlocked card's, a
  memory-bound forward and a dense backward under the power cap (``hostile_unlocked.py``);
- ``energy_guard_dropped`` / ``energy_guard_steps`` / ``energy_guard_false_drops``: the energy
  guard on plans that cost more energy than default clocks and on honest ones
  (``bench_guard.py``'s energy rows, at about 3.6 % per-stage energy noise).

    python benchmarks/bench_hostile.py --json

prints ``{"faults": [{"fault": ..., ...}, ...], "control": {...}, "attr_error_forward": ..., ...}``;
without ``--json``, tables. A fault row passes where training continued, ``max_stall_s`` <= 1 s, no
Perseus lock is left and at most one line was printed (``ok``).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.frontier import Frontier, FrontierPoint
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.faults import SimFaults
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.schedules.dag import InstructionDAG
from perseus.timeline.simulator import simulate_plan

FAULTS = ("follower_error", "nvml_energy_transient", "nvml_energy_dead", "lock_refused_midrun",
          "root_without_cap", "mig", "foreign_lock", "second_process")
FAST = ("follower_error", "nvml_energy_transient", "lock_refused_midrun", "root_without_cap", "mig", "foreign_lock")
JOB = PipelineJob(num_stages=1, num_microbatches=4, stage=0)
PRESET = "H200"
WORK = {"forward": 0.004, "backward": 0.008}  # max-clock GPU seconds per instruction
TAIL_S = 0.01  # an optimizer: GPU work after the step's last instruction
CLOCKS = (1530, 1410, 1305, 1200)
DEPTH = 6  # kernels the host may run ahead of the simulated GPU
AFTER_S = 1.2  # how long each case trains on after its fault began
PRE_FAULT_S = 0.8  # how long a mid-run fault's case trains before it (beyond the runtime's start)
EVENT_FAULT_AT = 100  # follower_error: the recorded event that fails (4 per warm-up step, 11 per deployed one)
MIN_BASELINE_STEPS = 3  # fewer steps before the fault: the fault-free run's medians are the baseline
STALL_LIMIT_S = 1.0  # the acceptance: no hook call this much longer than before the fault


# ---------------------------------------------------------------- the job and its plan

def cache_plan(folder: Path) -> Path:
    """The simulated H200's own profile of the job and a one-point frontier whose plan alternates
    the instructions' clocks (every step changes clocks, so a clock fault matters), put in a
    cache as ``mode: run`` finds them; returns the cache folder. The cache key holds no fault and
    no state folder, so every case's GPU finds this entry."""
    new_gpu(folder / "probe")
    gpu = SimulatedGPU(0, state_dir=folder / "probe")
    profile = gpu.exact_profile(WORK, CLOCKS)
    gpu.close()
    schedule = JOB.build_schedule()
    dag = InstructionDAG.from_schedule(schedule)
    plan = np.array([CLOCKS[(i * 3) % len(CLOCKS)] for i in range(dag.num_nodes)], dtype=np.int64)
    sim = simulate_plan(dag, profile, plan)
    frontier = Frontier(schedule, profile.p_blocking_w, sim.time_s, sim.energy_j,
                        [FrontierPoint(sim.time_s, sim.energy_j, plan)], gpu_name=profile.gpu_name)
    cache = folder / "cache"
    with PerseusRuntime(JOB, config(folder / "probe", cache)) as rt:
        assert rt.supply.cache is not None
        rt.supply.cache.save_profile(profile)
        rt.supply.cache.save_frontier(frontier)
    return cache


def config(sim_dir: Path, cache: Path, **kw: Any) -> PerseusConfig:
    """``mode: run`` on the cached plan: every step after warm-up runs it (no probes, no straggler checks)."""
    return PerseusConfig.from_dict({
        "gpu": "sim", "device_index": 0, "sim_gpu": {"state_dir": str(sim_dir), "stream_depth": DEPTH},
        "mode": "run", "cache_dir": str(cache), "warmup_steps": 2, "p_blocking_w": 110.0, "probe_every_steps": 0,
        "straggler_period_steps": 0, "log_every_steps": 0, **kw})


def new_gpu(sim_dir: Path, faults: SimFaults | None = None) -> float:
    """A fresh simulated GPU (state file) showing ``faults``; returns when it was created (monotonic
    seconds, no later than the GPU's own ``created_s``: its faults' times count from there)."""
    created = time.monotonic()
    SimulatedGPU(0, preset=PRESET, state_dir=sim_dir, reset_state=True, stream_depth=DEPTH, faults=faults).close()
    return created


def lock_state(sim_dir: Path) -> tuple[bool, int, int, int]:
    """(locked, locked clock, lock calls, reset calls) of the simulated GPU now."""
    from perseus.gpu.sim.state import read_sim_state

    st = read_sim_state(0, sim_dir)
    return bool(st.locked), int(st.locked_mhz), int(st.n_lock), int(st.n_reset)


# ---------------------------------------------------------------- driving the runtime

class LineCounter(logging.Handler):
    """``perseus`` WARNING/ERROR lines, with when they were printed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(message)s"))
        self.lines: list[tuple[float, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        self.lines.append((time.monotonic(), text.count("\n") + 1, text))


@contextmanager
def counted_lines() -> Iterator[LineCounter]:
    logger = logging.getLogger("perseus")
    counter = LineCounter()
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)


@dataclass
class Drive:
    """One runtime's run: each hook call's (hook, start, seconds), how it ended."""

    calls: list[tuple[str, float, float]] = field(default_factory=list)
    steps: int = 0
    error: str | None = None
    start_s: float = 0.0
    close_s: float = 0.0
    lines: list[tuple[float, int, str]] = field(default_factory=list)
    fault_began: float | None = None
    events: list[str] = field(default_factory=list)  # the runtime's events (their names), for the reader
    phase: str = ""  # the runtime's phase when training ended
    # When the fault began, asked after each call with the call's start: that start (the fault
    # began in the call), another moment, or None (not yet).
    watch: Callable[[float], float | None] | None = None

    def timed(self, hook: str, call: Callable[[], None]) -> None:
        t = time.monotonic()
        try:
            call()
        finally:
            self.calls.append((hook, t, time.monotonic() - t))
            if self.fault_began is None and self.watch is not None:
                self.fault_began = self.watch(t)

    def medians_before(self, t: float) -> dict[str, float]:
        found: dict[str, list[float]] = {}
        for hook, at, s in self.calls:
            if at + s < t:
                found.setdefault(hook, []).append(s)
        return {hook: median(v) for hook, v in found.items()}

    def max_stall_after(self, t: float, baseline: dict[str, float]) -> float:
        extra = [s - baseline[hook] for hook, at, s in self.calls if at + s >= t and hook in baseline]
        return max([0.0, *extra])

    def lines_since(self, t: float) -> int:
        return sum(n for at, n, _ in self.lines if at >= t)


def one_step(rt: PerseusRuntime, d: Drive) -> None:
    kernels = rt.sim_kernels
    d.timed("step_begin", rt.on_step_begin)
    for inst in rt.schedule.stages[0]:
        args = (inst.kind, inst.microbatch, inst.chunk)
        d.timed("instruction_begin", lambda: rt.on_instruction_begin(*args))  # noqa: B023 - called at once
        if kernels is not None:
            kernels.pad(WORK[inst.kind])
        else:
            time.sleep(WORK[inst.kind])
        d.timed("instruction_end", lambda: rt.on_instruction_end(*args))  # noqa: B023 - called at once
    if kernels is not None and kernels.device.asynchronous:
        kernels.device.stream.launch(TAIL_S, activity=0.5, tag="tail")
    d.timed("step_end", rt.on_step_end)
    d.steps += 1


def drive(cfg: PerseusConfig, until: Callable[[PerseusRuntime, Drive], bool], *, max_s: float = 20.0,
          on_step: Callable[[PerseusRuntime, Drive], None] | None = None,
          watch: Callable[[PerseusRuntime, float], float | None] | None = None) -> Drive:
    """Train until ``until`` says the planned steps are done (or ``max_s``); the runtime is closed
    after. Any exception out of the runtime or the training work ends the run (``error``).
    ``watch(runtime, call start)``: when the fault began (``Drive.watch``)."""
    d = Drive()
    with counted_lines() as counter:
        t0 = time.monotonic()
        try:
            rt = PerseusRuntime(JOB, cfg)
        except Exception as exc:  # noqa: BLE001 - what the job would see is the result
            d.error = f"start: {type(exc).__name__}: {exc}"
            d.start_s = time.monotonic() - t0
            d.lines = list(counter.lines)
            return d
        d.start_s = time.monotonic() - t0
        if watch is not None:
            d.watch = lambda t: watch(rt, t)
        deadline = time.monotonic() + max_s
        try:
            while not until(rt, d) and time.monotonic() < deadline:
                one_step(rt, d)
                if on_step is not None:
                    on_step(rt, d)
            kernels = rt.sim_kernels
            if kernels is not None and kernels.device.asynchronous:
                kernels.device.stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - what the job would see is the result
            d.error = f"step {d.steps}: {type(exc).__name__}: {exc}"
        d.events = list(dict.fromkeys(what for _, what, _ in rt.events))
        d.phase = str(getattr(rt.phase, "value", rt.phase))
        t1 = time.monotonic()
        try:
            rt.close()
        except Exception as exc:  # noqa: BLE001 - what the job would see is the result
            d.error = d.error or f"close: {type(exc).__name__}: {exc}"
        d.close_s = time.monotonic() - t1
        d.lines = list(counter.lines)
    return d


def after(t_fault: float | None, seconds: float = AFTER_S, min_steps: int = 6) -> Callable[[PerseusRuntime, Drive], bool]:
    """The planned steps: at least ``min_steps``, until ``seconds`` after the fault began (``t_fault``,
    else the time the run's ``watch`` found)."""
    def done(_rt: PerseusRuntime, d: Drive) -> bool:
        began = t_fault if t_fault is not None else d.fault_began
        return d.steps >= min_steps and began is not None and time.monotonic() >= began + seconds
    return done


# ---------------------------------------------------------------- one row

@dataclass
class Case:
    """What a case needs: a temporary folder, the plan's cache, the fault-free medians."""

    folder: Path
    cache: Path
    control: dict[str, float] = field(default_factory=dict)
    start_s: float = 1.0  # the fault-free runtime's start-up

    @property
    def fault_at_s(self) -> float:
        """When a mid-run fault begins, in seconds after the GPU's state was created: after the
        runtime's start (twice the fault-free one's: the machine may be loaded) and some steps."""
        return max(1.5, 2 * self.start_s + PRE_FAULT_S)

    def sim_dir(self, name: str) -> Path:
        return self.folder / name / "sim"


def row(name: str, d: Drive, t_fault: float, baseline: dict[str, float], *, baseline_from: str,
        locked: bool, **extra: Any) -> dict[str, Any]:
    """The bench's row for a run whose fault began at ``t_fault`` (monotonic seconds); the fields
    after ``message_lines`` are for the reader (what the runtime did and said)."""
    out: dict[str, Any] = {
        "fault": name,
        "training_continued": d.error is None,
        "max_stall_s": round(d.max_stall_after(t_fault, baseline), 4),
        "clocks_locked_at_exit": locked,
        "message_lines": d.lines_since(t_fault),
        "steps": d.steps,
        "error": d.error,
        "baseline": baseline_from,
        "start_s": round(d.start_s, 3),
        "close_s": round(d.close_s, 3),
        "phase_at_end": d.phase,
        "runtime_events": d.events,
        "messages": [text for at, _, text in d.lines if at >= t_fault],
    }
    out.update(extra)
    return out


def midrun(case: Case, name: str, faults: SimFaults, began: Callable[[PerseusRuntime, float, float], float | None],
           after_s: float = AFTER_S, **kw: Any) -> dict[str, Any]:
    """A fault that begins mid-run: baseline medians from this run's steps before it.
    ``began(runtime, created, call start)``: when it began (``Drive.watch``)."""
    sim = case.sim_dir(name)
    created = new_gpu(sim, faults)
    d = drive(config(sim, case.cache, **kw), after(None, after_s), watch=lambda rt, t: began(rt, created, t),
              max_s=after_s + 20.0)
    t_fault = d.fault_began if d.fault_began is not None else float("inf")
    before = sum(1 for hook, at, s in d.calls if hook == "step_end" and at + s < t_fault)
    own = before >= MIN_BASELINE_STEPS
    return row(name, d, t_fault, d.medians_before(t_fault) if own else case.control,
               baseline_from="this run before the fault" if own else "a fault-free run", locked=lock_state(sim)[0],
               fault_began=d.fault_began is not None, steps_before_fault=before)


def at_time(at_s: float) -> Callable[[PerseusRuntime, float, float], float | None]:
    """A fault that begins ``at_s`` after the GPU's state was created."""
    return lambda _rt, created, _t: created + at_s if time.monotonic() >= created + at_s else None


def follower_error(case: Case) -> dict[str, Any]:
    """One event of the stream fails (query and synchronize raise), as a CUDA error does, e.g. a
    graph captured in the global capture mode while the follower thread polls events."""
    def began(rt: PerseusRuntime, _created: float, t: float) -> float | None:
        sim = rt.gpu.sim_device
        return t if sim is not None and sim.stream.events_recorded >= EVENT_FAULT_AT else None

    return midrun(case, "follower_error", SimFaults(event_error_at=EVENT_FAULT_AT), began)


def nvml_energy_transient(case: Case) -> dict[str, Any]:
    """Energy reads fail for 0.4 s, then work again (a busy driver)."""
    at = case.fault_at_s
    return midrun(case, "nvml_energy_transient", SimFaults(energy_fail_from_s=at, energy_fail_for_s=0.4), at_time(at))


def nvml_energy_dead(case: Case) -> dict[str, Any]:
    """Energy reads fail for good (a GPU fallen off the bus, as NVML sees it). The run goes on
    until the energy poller has declared the counter dead (``DEAD_AFTER_S`` of failed reads,
    where the poller has one), so the row shows what the job sees then too."""
    from perseus.gpu.meter import energy

    at = case.fault_at_s
    dead_after_s = float(getattr(energy, "DEAD_AFTER_S", 0.0))
    return midrun(case, "nvml_energy_dead", SimFaults(energy_fail_from_s=at), at_time(at),
                  after_s=max(AFTER_S, dead_after_s + 1.5))


def lock_refused_midrun(case: Case) -> dict[str, Any]:
    """Clock locks and resets are refused for 0.5 s mid-run (an administrator's tool takes the
    clocks); the run closes after the refusal ended, so a reset then can leave the GPU unlocked."""
    at = case.fault_at_s
    return midrun(case, "lock_refused_midrun", SimFaults(lock_refused_from_s=at, lock_refused_for_s=0.5), at_time(at))


def from_start(case: Case, name: str, faults: SimFaults, **kw: Any) -> tuple[Drive, float, Path]:
    """A fault present before the runtime starts: the whole run is after it."""
    sim = case.sim_dir(name)
    t_fault = new_gpu(sim, faults)
    d = drive(config(sim, case.cache, **kw), after(t_fault, AFTER_S, min_steps=10))
    return d, t_fault, sim


def root_without_cap(case: Case) -> dict[str, Any]:
    """Root in a user namespace without CAP_SYS_ADMIN: NVML's setters answer "no permission"; the
    config asks for measure-only where clocks cannot change."""
    if "without_clock_access" not in PerseusConfig.model_fields:
        return {"fault": "root_without_cap", "training_continued": None, "max_stall_s": None,
                "clocks_locked_at_exit": None, "message_lines": None,
                "not_available": "PerseusConfig has no without_clock_access field"}
    d, t_fault, sim = from_start(case, "root_without_cap", SimFaults(no_cap_sys_admin=True),
                                 without_clock_access="measure-only")
    return row("root_without_cap", d, t_fault, case.control, baseline_from="a fault-free run",
               locked=lock_state(sim)[0], without_clock_access="measure-only")


def mig(case: Case) -> dict[str, Any]:
    """MIG mode: no clock may change; measuring works."""
    d, t_fault, sim = from_start(case, "mig", SimFaults(mig=True))
    return row("mig", d, t_fault, case.control, baseline_from="a fault-free run", locked=lock_state(sim)[0])


def foreign_lock(case: Case) -> dict[str, Any]:
    """Someone else locked the SM clock before the job started."""
    foreign = CLOCKS[2]
    d, t_fault, sim = from_start(case, "foreign_lock", SimFaults(foreign_lock_mhz=foreign))
    locked, mhz, n_lock, n_reset = lock_state(sim)
    kept = locked and mhz == foreign
    return row("foreign_lock", d, t_fault, case.control, baseline_from="a fault-free run",
               locked=locked and not kept, foreign_lock_mhz=foreign, foreign_lock_left_alone=kept,
               foreign_lock_untouched=kept and n_lock == 0 and n_reset == 0,
               clocks_locked_at_exit_counts="locks Perseus made only: a lock at the foreign clock is the foreign one")


FIRST_STEPS = 8  # the first process's steps before the second starts, and again after it closed


def _first_process(sim_dir: str, cache: str, conn: Any) -> None:
    """The first Perseus process on the GPU: trains, pauses (its runtime open, its clocks as its
    plan left them) while the second one trains, trains again, sends its ``Drive`` back. The
    pause: the simulated GPU runs one process's kernels at a time, a real one would interleave them."""
    def on_step(rt: PerseusRuntime, d: Drive) -> None:
        if d.steps == FIRST_STEPS:
            kernels = rt.sim_kernels
            if kernels is not None and kernels.device.asynchronous:
                kernels.device.stream.synchronize()
            conn.send(("paused", time.monotonic()))
            if conn.poll(60.0):
                conn.recv()

    d = drive(config(Path(sim_dir), Path(cache)), lambda _rt, d: d.steps >= 2 * FIRST_STEPS, max_s=90.0,
              on_step=on_step)
    d.watch = None
    conn.send(("done", d))
    conn.close()


def second_process(case: Case) -> dict[str, Any]:
    """A second Perseus job starts on a GPU that a first one (another process, its plan deployed)
    holds; the row is the second's (its calls against the fault-free run's medians). The first's
    steps after the second started, against its steps before, are in ``first_*``;
    ``clocks_locked_at_exit`` is after both closed; ``message_lines`` the larger process's count."""
    sim = case.sim_dir("second_process")
    new_gpu(sim)
    ctx: Any = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_first_process, args=(str(sim), str(case.cache), there), daemon=True)
    child.start()
    first: Drive | None = None
    try:
        if not here.poll(60.0):
            raise RuntimeError("the first process did not reach its pause within 60 s")
        here.recv()
        t_fault = time.monotonic()
        d = drive(config(sim, case.cache), after(t_fault, AFTER_S, min_steps=10))
        here.send("go on")
        if here.poll(60.0):
            _, first = here.recv()
    finally:
        child.join(30.0)
        if child.is_alive():
            child.kill()
    lines = d.lines_since(t_fault)
    extra: dict[str, Any] = {"second_message_lines": lines}
    if first is not None:
        first_lines = first.lines_since(t_fault)
        extra.update(first_training_continued=first.error is None, first_error=first.error,
                     first_max_stall_s=round(first.max_stall_after(t_fault, first.medians_before(t_fault)), 4),
                     first_message_lines=first_lines,
                     first_messages=[text for at, _, text in first.lines if at >= t_fault])
        lines = max(lines, first_lines)
    else:
        extra.update(first_training_continued=False, first_error="the first process sent no result")
    out = row("second_process", d, t_fault, case.control, baseline_from="a fault-free run",
              locked=lock_state(sim)[0], **extra)
    out["message_lines"] = lines
    return out


CASES: dict[str, Callable[[Case], dict[str, Any]]] = {
    "follower_error": follower_error,
    "nvml_energy_transient": nvml_energy_transient,
    "nvml_energy_dead": nvml_energy_dead,
    "lock_refused_midrun": lock_refused_midrun,
    "root_without_cap": root_without_cap,
    "mig": mig,
    "foreign_lock": foreign_lock,
    "second_process": second_process,
}


def control(case: Case) -> dict[str, Any]:
    """The same run without a fault: the medians the faults present from the start are measured
    against, its start-up time, and the noise floor of ``max_stall_s`` (every call against them)."""
    sim = case.sim_dir("control")
    t0 = new_gpu(sim)
    d = drive(config(sim, case.cache), lambda _rt, d: d.steps >= 20)
    case.control = d.medians_before(float("inf"))
    case.start_s = d.start_s
    return row("none", d, t0, case.control, baseline_from="this run", locked=lock_state(sim)[0])


def passes(r: dict[str, Any]) -> bool:
    """The acceptance: training continued, no stall over 1 s, no Perseus lock left, at most one line."""
    return (r.get("training_continued") is True and r.get("max_stall_s") is not None
            and r["max_stall_s"] <= STALL_LIMIT_S and r.get("clocks_locked_at_exit") is False
            and r.get("message_lines") is not None and r["message_lines"] <= 1)


def run(names: tuple[str, ...] = FAULTS, folder: Path | None = None) -> dict[str, Any]:
    """Every case in ``names`` (and the fault-free control first), as the bench's JSON object."""
    with tempfile.TemporaryDirectory(prefix="perseus-hostile-") as tmp:
        base = folder or Path(tmp)
        case = Case(base, cache_plan(base))
        ctl = control(case)
        rows = []
        for name in names:
            r = CASES[name](case)
            r["ok"] = passes(r)
            rows.append(r)
    return {"faults": rows, "control": ctl}


# ---------------------------------------------------------------- the measurements

BENCHMARKS = Path(__file__).resolve().parent
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
SWITCH_LATENCY_S = 0.010
GUARD_SEEDS = 20
# each measurement's acceptance: (key, bound, "<=" / ">=" / "==")
TARGETS = (("attr_error_forward", 0.05, "<="), ("attr_error_backward", 0.05, "<="), ("power_over_limit", 0, "=="),
           ("latency_calibration_error", 0.3, "<="), ("own_clock_share", 0.95, ">="),
           ("fastest_plan_vs_unlocked", 1.01, "<="), ("energy_guard_dropped", True, "=="),
           ("energy_guard_steps", 100, "<="), ("energy_guard_false_drops", 0, "=="))


def attribution_measure() -> dict[str, Any]:
    import hostile_attribution

    out = hostile_attribution.attribution()
    return {k: out[k] for k in ("attr_error_forward", "attr_error_backward", "power_over_limit")}


def latency_measure() -> dict[str, Any]:
    import bench_switch_latency

    out = bench_switch_latency.runtime_bench(SWITCH_LATENCY_S, 1.1, 12)
    return {"latency_calibration_error": out["latency_calibration_error"], "own_clock_share": out["own_clock_share"],
            "simulated_latency_s": out["simulated_latency_s"], "measured_latency_s": out["measured_latency_s"]}


def unlocked_measure() -> dict[str, Any]:
    import hostile_unlocked

    return {"fastest_plan_vs_unlocked": hostile_unlocked.fastest_vs_unlocked()["fastest_plan_vs_unlocked"]}


def guard_measure() -> dict[str, Any]:
    import bench_guard

    row = bench_guard.energy_row("3%", GUARD_SEEDS)
    lying = row["+2%"]
    assert isinstance(lying, dict)
    return {"energy_guard_dropped": lying["largest"] is not None, "energy_guard_steps": lying["largest"],
            "energy_guard_false_drops": row["false_drops"], "energy_guard_honest_runs": row["honest_runs"]}


MEASURES: dict[str, Callable[[], dict[str, Any]]] = {
    "attribution": attribution_measure, "switch_latency": latency_measure,
    "unlocked": unlocked_measure, "energy_guard": guard_measure,
}


def measure(names: tuple[str, ...] = tuple(MEASURES)) -> dict[str, Any]:
    """The named measurements' keys, flat; a measurement that fails records its error, the rest run."""
    out: dict[str, Any] = {}
    for name in names:
        try:
            out.update(MEASURES[name]())
        except Exception as exc:  # noqa: BLE001 - one measurement's failure is reported, the rest still run
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return out


def meets(key: str, value: Any, bound: Any, op: str) -> bool:
    if value is None:
        return False
    return value <= bound if op == "<=" else value >= bound if op == ">=" else value == bound


def table(result: dict[str, Any]) -> str:
    head = f"{'fault':24} {'continued':>9} {'max stall s':>11} {'locked':>6} {'lines':>5} {'ok':>3}  error"
    out = [head, "-" * len(head)]
    for r in [result["control"], *result["faults"]]:
        if "not_available" in r:
            out.append(f"{r['fault']:24} not available: {r['not_available']}")
            continue
        out.append(f"{r['fault']:24} {str(r['training_continued']):>9} {r['max_stall_s']:>11.3f} "
                   f"{str(r['clocks_locked_at_exit']):>6} {r['message_lines']:>5} {'yes' if r.get('ok') else 'no':>3}  "
                   f"{r.get('error') or ''}")
    measured = [(k, b, op) for k, b, op in TARGETS if k in result]
    if measured:
        out += ["", f"{'measurement':28} {'value':>10} {'target':>10} {'ok':>3}"]
        for key, bound, op in measured:
            v = result[key]
            shown = f"{v:.4f}" if isinstance(v, float) else str(v)
            out.append(f"{key:28} {shown:>10} {op + ' ' + str(bound):>10} {'yes' if meets(key, v, bound, op) else 'no':>3}")
    out += [f"{k}: {v}" for k, v in result.items() if k.endswith("_error") and isinstance(v, str)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--only", nargs="+", choices=FAULTS, help="run these faults only")
    p.add_argument("--faults-only", action="store_true", help="the faults alone, none of the measurements")
    p.add_argument("--measures", nargs="+", choices=tuple(MEASURES), help="run these measurements only")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # not the INFO lines
    result = run(tuple(args.only) if args.only else FAULTS)
    if not args.faults_only:
        result.update(measure(tuple(args.measures) if args.measures else tuple(MEASURES)))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(table(result))
        for r in result["faults"]:
            for line in r.get("messages", []):
                print(f"  {r['fault']}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
