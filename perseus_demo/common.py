"""What both frameworks' demos share: simulated compute, the phase loop, torchrun launch, results.

A demo runs a real framework pipeline on CPU under torchrun (baseline steps → online profiling →
planning → deployed plan → default clocks again) and reports measured iteration time and energy
per phase. ``perseus_demo.megatron_demo`` and ``perseus_demo.deepspeed_demo`` are the per-rank
bodies; ``perseus_demo.cli`` picks one and draws the pictures.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from perseus.errors import PerseusError
from perseus.runtime.guard.closed_loop import ClosedLoop
from perseus.runtime.port.sim_kernels import STEP_TAIL_TAG
from perseus_demo.job_metrics import write_job_metrics

if TYPE_CHECKING:
    from perseus.gpu.sim.stream import SimEvent, SimStream

DEFAULT_SIM_GPU = {"preset": "A100-SXM", "energy_update_period_s": 0.005}
# planner_nice 0: CPU training is CPU-bound itself, so a niced planner would be starved on a busy machine.
DEFAULT_PERSEUS = {"freq_min_mhz": 900, "freq_step_mhz": 150, "warmup_steps": 6, "iters_per_freq": 2,
                   "straggler_period_steps": 0, "log_every_steps": 0, "cache_dir": None, "planner_nice": 0}

# Deployed steps the runtime ran at default clocks (its no-slowdown check): a row of their own.
PROBE_PHASE = "deployed probe"


class SimulatedCompute:
    """Listener in front of the runtime: pads each instruction's kernel to a nominal time and records it.

    On a simulated GPU the runtime itself makes every instruction a kernel (``sim_kernels``): its
    CPU time is the time at the max clock, stretched by the clock. The demo's instructions are a
    tiny model's, so before each one ends this wrapper pads that kernel to ``nominal_s`` per kind
    at the max clock (the CPU time counts when it is longer), so CPU noise on a shared machine
    does not drown the clock's effect; nothing else depends on it. Each iteration is measured from
    step begin to step end into ``iterations``, with the clock and energy counter at step begin
    (the data-parallel gradient sync after a step is outside it, so a cycle is begin to next
    begin); ``phase`` labels them (the runtime's phase unless a demo overrides it).
    ``slow_factor`` > 1 makes this GPU a straggler (its kernels take that much longer).

    Every iteration also lists its instructions as ``[kind, microbatch, chunk, clock]``, the clock
    being the SM clock the GPU held when the instruction's kernel ended: what tests check against
    the plan and account for in the simulator, independent of how busy the machine was; and, in
    ``instruction_times``, ``[begin, end]`` on the machine-wide monotonic clock (begin before the
    runtime sees it, end after its kernel's wait), so tests can check that an instruction started
    only after every instruction the planner's DAG says it waits for had ended, across ranks.

    On an asynchronous simulated GPU (``sim_gpu["stream_depth"]`` ≥ 1: the host runs ahead of the
    GPU, whose kernels run on a stream) everything is in the GPU's time instead: an iteration lasts
    from an event recorded at step begin to one recorded at step end and waited for (the runtime
    waits for its step's end anyway, so the default-clock steps after ``stop`` run alike), its energy
    is the counter between the two, each instruction's clock is the one set when its kernel
    started and its times are the kernel's. ``gpu_step_s`` is the runtime's own step time
    (``StepMetrics.gpu_step_s``) where the runtime timed the step, else None.

    A step ends with the GPU's step tail where its model has one (the runtime launches it at its step
    end, ``SimulatedKernels.step_end``: the optimizer and all-reduce, inside the step as on a real
    trainer), and every iteration also keeps the simulator's exact energy (``true_energy_j``), the
    truth a real card's meter is judged by.
    """

    def __init__(self, runtime: Any, gpu: Any, nominal_s: dict[str, float] | None = None) -> None:
        kernels = runtime.sim_kernels
        if kernels is None:
            raise PerseusError("SimulatedCompute needs Perseus enabled on a simulated GPU (gpu: 'sim')")
        self.listener, self.kernels, self.gpu = runtime, kernels, gpu
        self.nominal_s = nominal_s or {}
        # the runtime's stream onto the simulated GPU; None when the GPU is synchronous
        self.stream: SimStream | None = kernels.device.stream if kernels.device.asynchronous else None
        self._begin_event: SimEvent | None = None
        self._first_kernel = 0
        self.iterations: list[dict[str, Any]] = []
        self.phase_override: str | None = None
        self.phase_suffix = ""
        self.slow_factor = 1.0
        self._step_t0 = self._step_e0 = self._step_true0 = 0.0
        self._phase = ""
        self._instructions: list[list[Any]] = []
        self._times: list[list[float]] = []
        self._begin = 0.0

    def on_step_begin(self) -> None:
        self.listener.on_step_begin()
        phase = self.phase_override or self.listener.phase.value
        loop = getattr(self.listener, "loop", None)  # the runtime's closed loop: default-clock probe steps
        if phase == "deployed" and isinstance(loop, ClosedLoop) and loop.probing:
            phase = PROBE_PHASE
        self._phase = phase + self.phase_suffix
        self._instructions = []
        self._times = []
        if self.stream is not None:
            self._begin_event, self._first_kernel = self.stream.record(), self.kernels.launched
        self._step_e0, self._step_t0 = self.gpu.total_energy_j(), time.perf_counter()
        self._step_true0 = self.gpu.true_energy_j()

    def on_step_end(self) -> None:
        if self.stream is None:
            tail = self.kernels.device.model.step_tail_s > 0  # the runtime's step end runs it: measured after
            if tail:
                self.listener.on_step_end()
            self.iterations.append(self._iteration(time.perf_counter() - self._step_t0,
                                                   self.gpu.total_energy_j() - self._step_e0, None))
            if not tail:
                self.listener.on_step_end()
            return
        records = self.listener.reporter.records
        timed = len(records)
        self.listener.on_step_end()
        end = self.stream.record()
        end.synchronize()
        host_s = time.perf_counter() - self._step_t0
        energy = self.gpu.total_energy_j() - self._step_e0
        assert self._begin_event is not None
        gpu_step_s = records[-1].gpu_step_s if len(records) > timed else None
        kernels = [k for k in self.stream.kernels()[self._first_kernel:self.kernels.launched] if k.tag != STEP_TAIL_TAG]
        for inst, kernel in zip(self._instructions, kernels):
            inst[3] = kernel.set_mhz
        self._times = [[k.start_s, k.end_s] for k in kernels]
        begin_s = self._begin_event.gpu_time_s
        self.iterations.append({**self._iteration(end.gpu_time_s - begin_s, energy, gpu_step_s),
                                "gpu_begin_s": begin_s, "host_time_s": host_s})

    def _iteration(self, time_s: float, energy_j: float, gpu_step_s: float | None) -> dict[str, Any]:
        return {"phase": self._phase, "time_s": time_s, "energy_j": energy_j, "gpu_step_s": gpu_step_s,
                "true_energy_j": self.gpu.true_energy_j() - self._step_true0,
                "begin_s": self._step_t0, "begin_energy_j": self._step_e0, "slow_factor": self.slow_factor,
                "instructions": self._instructions, "instruction_times": self._times}

    def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0,
                             backward: tuple[int, int] | None = None) -> None:
        self._begin = time.monotonic()
        self.listener.on_instruction_begin(kind, microbatch, chunk, backward)

    def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0,
                           backward: tuple[int, int] | None = None) -> None:
        # The kernel's max-clock time: the nominal one, or the CPU work if that took longer. The
        # runtime's kernel then waits out the stretched duration in one sleep.
        self.kernels.pad(self.nominal_s.get(kind, 0.0) * self.slow_factor)
        self.listener.on_instruction_end(kind, microbatch, chunk, backward)
        # asynchronous: the kernel's clock and times are filled in at step end, once it has run
        clock = self.gpu.last_busy_clock_mhz() if self.stream is None else 0
        self._instructions.append([kind, microbatch, chunk, clock])
        if self.stream is None:
            self._times.append([self._begin, time.monotonic()])


@dataclass(frozen=True)
class Straggler:
    """Data-parallel replica ``dp_rank`` runs ``factor``× slower during deployed iterations [start, stop).

    A disturbance for demos and tests of extrinsic bloat: every GPU of that replica stretches its
    kernels (as a throttled node would); the other replicas should slow down to match, then
    speed up again once it recovers. Iterations inside the window are labelled "... (straggler)"
    on every rank.
    """

    dp_rank: int = 1
    factor: float = 1.3
    start: int = 3
    stop: int = 17
    # After the planned deployed iterations, keep training (at most this many more) while any
    # rank still runs a slowed-down plan: recovery takes as many checks as the noise demands.
    recovery_steps: int = 0

    def __post_init__(self) -> None:
        if not (self.factor >= 1.0 and 0 <= self.start < self.stop and self.recovery_steps >= 0):
            raise PerseusError(f"straggler: need factor >= 1, 0 <= start < stop and recovery_steps >= 0, got {self}")

    def apply(self, compute: list[SimulatedCompute], dp_rank: int, deployed: int) -> None:
        """Set this rank's slowness and labels for the next iteration (``deployed`` so far)."""
        window = self.start <= deployed < self.stop
        for c in compute:
            c.slow_factor = self.factor if window and dp_rank == self.dp_rank else 1.0
            c.phase_suffix = " (straggler)" if window else ""


@dataclass
class DemoSettings:
    """What a framework demo runs, common to both frameworks; every rank reads it from config.json."""

    stages: int = 4
    microbatches: int = 8
    dp_size: int = 1  # data-parallel pipelines (torchrun starts stages × dp_size ranks)
    straggler: dict[str, Any] | None = None  # Straggler fields: one slow replica for a while
    max_steps: int = 60
    # Steps spent waiting for the planner do not count towards ``max_steps``: it plans in a process
    # of its own, so how many steps pass meanwhile depends on the machine's load, not on the demo.
    # This bound (the same on every rank: phases change on all ranks together) is a hang guard.
    planning_grace_steps: int = 20_000
    deployed_steps: int = 8  # iterations with the plan deployed
    # Then this many iterations at default clocks again (A/B/A): a baseline measured at the same
    # time as the plan, so machine load that drifts during the run does not fake a saving.
    rebaseline_steps: int = 6
    startup_steps: int = 2  # first iterations (allocator, lazy init) are slow: left out of the baseline
    # Nominal kernel time at the max clock: each instruction's real CPU work is stretched up to it,
    # so that CPU noise on a shared machine does not drown the clock's effect (0: CPU time only).
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    last_stage_weight: float = 1.3  # the loss layer makes the last stage heavier, as on real pipelines
    hidden_size: int = 64
    micro_batch_size: int = 4
    sim_gpu: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SIM_GPU))
    perseus: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PERSEUS))

    def nominal_s(self, stage: int) -> dict[str, float]:
        """Kernel time per instruction kind at the max clock on this stage."""
        weight = self.last_stage_weight if stage == self.stages - 1 else 1.0
        return {"forward": weight * self.forward_ms / 1e3, "backward": weight * self.backward_ms / 1e3}


def run_phases(train_step: Any, compute: list[SimulatedCompute], handle: Any, settings: DemoSettings,
               dp_rank: int = 0) -> tuple[list[dict[str, Any]], dict]:
    """Train through Perseus's phases, then A/B/A: the deployed plan, then default clocks again
    (the runtime stopped: its instructions stay kernels of the simulated GPU, at default clocks).

    ``handle`` has ``.runtime`` and ``.summary()`` (both adapters' handles do). Returns the
    per-iteration records (the first ``startup_steps`` labelled "startup") and the runtime summary.
    With ``settings.straggler``, one data-parallel replica slows down for a window of deployed
    iterations.
    """
    straggler = Straggler(**settings.straggler) if settings.straggler else None
    # Python's full collections walk every object the imports made: 150-300 ms in each torch demo
    # rank, all ranks within ~0.1 s of each other, every few seconds. On the simulated GPU an
    # instruction's CPU time is its kernel's work, so a phase a collection lands in looked 200 ms per
    # iteration slower (the torch demo's A/B read +8 to +35 % from it). What exists after setup is
    # frozen out of collection (as trainers that manage GC do; Megatron-LM has --manual-gc).
    gc.freeze()

    def iterations() -> list[dict[str, Any]]:
        return [it for c in compute for it in c.iterations]

    deployed = planning = 0
    while len(iterations()) < settings.max_steps + planning and deployed < settings.deployed_steps:
        if straggler is not None:
            straggler.apply(compute, dp_rank, deployed)
        before = len(iterations())
        train_step()
        phase = iterations()[-1]["phase"]
        deployed += phase.startswith("deployed")
        if phase == "planning" and planning < settings.planning_grace_steps:
            planning += len(iterations()) - before
    if straggler is not None and deployed:
        for _ in range(straggler.recovery_steps):
            if not _any_rank(handle.summary()["slowdown"] > 1.0):
                break
            straggler.apply(compute, dp_rank, deployed)
            train_step()
            deployed += 1
    summary = handle.summary()
    if deployed:
        # Same model, nominal times and simulated GPU, but default clocks and Perseus stopped.
        for c in compute:
            c.phase_override, c.phase_suffix, c.slow_factor = "baseline again", "", 1.0
        handle.runtime.stop()
        for _ in range(settings.rebaseline_steps):
            train_step()
    trace = getattr(handle.runtime, "clock_trace", None)
    if trace is not None:  # trace_clocks: every traced iteration's clock events, the re-measured baseline's too
        summary = {**summary, "clock_trace": trace.to_dict()}
    records = [{**it, "step": i, "phase": "startup" if i < settings.startup_steps else it["phase"]}
               for i, it in enumerate(iterations())]
    return records, summary


def _any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any (all ranks must call it together)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def save_rank_result(out_dir: Path, rank: int, stage: int, dp_rank: int, records: list[dict[str, Any]],
                     summary: dict[str, Any]) -> dict[str, Any]:
    """What one rank hands back to ``launch_ranks``: ``rankN.json`` in the output directory."""
    result = {"rank": rank, "stage": stage, "dp_rank": dp_rank, "steps": records, "summary": summary}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    return result


def phase_table(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: median iteration time (slowest rank) and median job energy (sum over ranks).

    Medians, because on a shared CPU machine a single iteration can be slowed by other processes.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for result in results:
        for rec in result["steps"]:
            row = by_step.setdefault(rec["step"], {"phase": rec["phase"], "time_s": 0.0, "energy_j": 0.0})
            row["time_s"] = max(row["time_s"], rec["time_s"])
            # a step one rank could not measure (its energy counter failed) has no job energy
            row["energy_j"] = None if row["energy_j"] is None or rec["energy_j"] is None else row["energy_j"] + rec["energy_j"]
    phases: dict[str, list[dict[str, Any]]] = {}
    for row in by_step.values():
        phases.setdefault(row["phase"], []).append(row)
    return {
        phase: {"iterations": len(rows), "time_s": median(r["time_s"] for r in rows),
                "energy_j": median(energies) if (energies := [r["energy_j"] for r in rows if r["energy_j"] is not None])
                else math.nan}
        for phase, rows in phases.items()
    }


def format_report(table: dict[str, dict[str, float]]) -> str:
    """Per-phase table, then the deployed plan against default clocks."""
    lines = [f"{'phase':<16}{'iterations':>11}{'time/iter':>12}{'energy/iter':>14}   (medians; energy: all GPUs)"]
    for phase, row in table.items():
        lines.append(f"{phase:<16}{row['iterations']:>11}{row['time_s'] * 1e3:>10.1f}ms{row['energy_j']:>12.2f} J")
    plan = table.get("deployed")
    # Both ran at default clocks, but warm-up also pays for process start-up (controller processes,
    # first-iteration allocations), so the baseline re-measured after the plan (A/B/A) is fairer.
    if (ab := ab_line(table)) is not None:
        lines.append(ab)
    if not plan:
        lines.append("the plan was not deployed within max_steps; raise --max-steps")
    return "\n".join(lines)


def ab_line(table: dict[str, dict[str, float]], energy: str = "energy") -> str | None:
    """The deployed plan against default clocks (the re-measured baseline, else warm-up), or None."""
    name = "baseline again" if "baseline again" in table else "warmup"
    base, plan = table.get(name), table.get("deployed")
    if not base or not plan:
        return None
    return (f"deployed plan vs {name} (default clocks): {100 * (1 - plan['energy_j'] / base['energy_j']):.1f}% "
            f"less {energy}, iteration time {100 * (plan['time_s'] / base['time_s'] - 1):+.1f}%")


def true_energy_line(results: list[dict[str, Any]]) -> str | None:
    """The same A/B by the simulator's exact energy: how far the GPUs' meters moved the measured one."""
    exact = [{**r, "steps": [{**s, "energy_j": s.get("true_energy_j")} for s in r["steps"]]} for r in results]
    return ab_line(phase_table(exact), "energy by the simulator's exact integral (no meter error)")


def launch_ranks(module: str, nproc: int, out_dir: Path, config: dict[str, Any], env: dict[str, str],
                 timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run ``python -m module --worker OUT`` under torchrun and collect each rank's ``rankN.json``.

    Also writes ``job-metrics.jsonl``, the job's iterations in the metrics-file format
    (``perseus_demo.job_metrics``), for ``perseus report``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    (out_dir / "config.json").write_text(json.dumps(config))
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PERSEUS_GPU="sim", PERSEUS_SIM_GPU_DIR=str(out_dir / "sim-gpus"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]), **env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", module, "--worker", str(out_dir)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PerseusError(f"{module} did not finish within {timeout_s:.0f} s") from None
    results = []
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            raise PerseusError(f"{module} rank {rank} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        results.append(json.loads(path.read_text()))
    write_job_metrics(out_dir, results)  # what perseus report reads: the job's iterations
    return results


def launch_demo(module: str, cfg: DemoSettings, out_dir: Path, env: dict[str, str] | None = None,
                timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run a framework demo module under torchrun (one process per stage and replica)."""
    return launch_ranks(module, cfg.stages * cfg.dp_size, out_dir, asdict(cfg), env or {}, timeout_s)


def demo_main(argv: list[str] | None, *, doc: str, config_cls: type[DemoSettings], run_rank: Any, launch: Any,
              title: str) -> None:
    """``python -m perseus_<framework>.demo``: a torchrun worker (``--worker``) or the launcher."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--stages", type=int, default=config_cls.stages)
    parser.add_argument("--microbatches", type=int, default=config_cls.microbatches)
    parser.add_argument("--max-steps", type=int, default=config_cls.max_steps)
    parser.add_argument("--out", help="directory for per-rank results (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.worker:
        out = Path(args.worker)
        run_rank(config_cls(**json.loads((out / "config.json").read_text())), out)
        return
    if not 2 <= args.stages <= 8:
        raise SystemExit("--stages must be between 2 and 8 (one CPU process per stage)")
    cfg = config_cls(stages=args.stages, microbatches=args.microbatches, max_steps=args.max_steps)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="perseus-demo-"))
    started = time.perf_counter()
    results = launch(cfg, out)
    print(f"{title}, {cfg.stages} pipeline stages x {cfg.microbatches} microbatches, simulated "
          f"{cfg.sim_gpu['preset']} GPUs ({time.perf_counter() - started:.0f} s, results in {out})")
    print(format_report(phase_table(results)))
