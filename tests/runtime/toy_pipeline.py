"""A framework-free pipeline-parallel trainer for exercising the runtime for real.

Each process is one pipeline stage of one data-parallel replica (rank = dp × stages + stage). It
executes its stage's instructions of a ``Schedule`` in order, with real P2P over torch.distributed
(gloo): a forward receives its activation from the previous virtual stage and sends its output
to the next; a backward receives the gradient from the next and sends one to the previous.
"Compute" is a kernel of the simulated GPU: the runtime makes every instruction one
(``perseus.runtime.port.sim_kernels``), and the toy pads it to its exact max-clock ``duration``, so
it lasts ``duration × t(f)/t(f_max)`` at the GPU's current clock and integrates busy power,
while waiting in ``recv`` integrates P_blocking: frequency plans change time and energy exactly
as on hardware (per the simulated GPU's DVFS model). The runtime is driven only through the
adapter event API (plus that padding).

Launch with ``launch(ToyConfig(...), out_dir)``; each rank writes ``rank<N>.json`` (the runtime's
summary, per-step times and energies, warnings) into ``out_dir``.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from perseus.schedules import Instruction, Schedule, build_schedule
from perseus.runtime.phases import Phase


@dataclass
class ToyConfig:
    """What to run: pipeline shape, per-stage work, disturbances, and the Perseus settings."""

    num_stages: int = 2
    num_microbatches: int = 4
    schedule: str = "1f1b"
    num_chunks: int = 1
    dp_size: int = 1
    steps: int = 10
    forward_s: float = 0.004  # one forward at the max clock on a weight-1.0 stage
    backward_ratio: float = 2.0
    stage_weights: list[float] = field(default_factory=list)  # default: last stage 1.3x heavier
    activity: float = 1.0
    compute_fraction: float = 0.8
    sim_preset: str = "A100-SXM"
    sim_dir: str = ""
    # Energy counter period of the simulated GPUs. Real counters tick every ~100 ms against
    # iterations of seconds; the toy's iterations are tens of ms, so its counter ticks faster.
    energy_update_period_s: float = 0.002
    perseus: dict[str, Any] = field(default_factory=dict)
    perseus_enabled: bool = True
    # Steps spent waiting for the background planner do not count towards ``steps``, so tests do
    # not depend on how fast the planner is on a loaded machine (toy steps take milliseconds, the
    # planner seconds to a minute there). The bound is only a hang guard, like launch's timeout.
    planning_grace_steps: int = 100_000
    # Disturbances for tests: a slower DP replica during [slow_from, slow_until) steps, a schedule
    # change (different microbatch count) from a step on, an exception at a step.
    slow_dp: int | None = None
    slow_factor: float = 1.3
    slow_from_step: int = 0
    slow_until_step: int | None = None
    change_microbatches_at_step: int | None = None
    raise_at_step: int | None = None
    hang_at_step: int | None = None  # sleep forever (for SIGTERM tests)
    target_slowdown: float | None = None  # runtime.set_target_slowdown before training
    # Faults: rank ``die_rank`` SIGKILLs itself at the end (before ``on_step_end``) of its
    # ``die_after``-th step in phase ``die_phase``; ``admin_reset_at_step``: every rank resets its
    # own simulated GPU's clocks from outside Perseus (an admin's ``nvidia-smi -rgc``) at that step.
    die_rank: int | None = None
    die_phase: str = "profiling"
    die_after: int = 1
    die_on_attempt: int | None = None  # only in this torchrun attempt (TORCHELASTIC_RESTART_COUNT)
    admin_reset_at_step: int | None = None
    kill_controller_at_step: int | None = None  # every rank SIGKILLs its clock controller process
    dist_timeout_s: float = 300.0  # the training's own process group (P2P)
    tensor_numel: int = 64

    def weight(self, stage: int) -> float:
        if self.stage_weights:
            return self.stage_weights[stage]
        return 1.3 if stage == self.num_stages - 1 and self.num_stages > 1 else 1.0


def _tag(inst: Instruction, num_chunks: int) -> int:
    return ((inst.microbatch * num_chunks + inst.chunk) << 1) | (inst.kind == "backward")


class _StageWorker:
    """Executes one stage's instruction list with P2P and simulated compute."""

    def __init__(self, cfg: ToyConfig, rank: int, device: Any, kernels: Any = None) -> None:
        import torch

        self.torch = torch
        self.cfg = cfg
        self.rank = rank
        self.stage = rank % cfg.num_stages
        self.dp = rank // cfg.num_stages
        self.device = device
        self.kernels = kernels  # the runtime's SimulatedKernels (None with Perseus disabled)
        if kernels is not None:
            kernels.activity, kernels.compute_fraction = cfg.activity, cfg.compute_fraction
        self.buf = torch.zeros(cfg.tensor_numel)

    def peer(self, stage: int) -> int:
        return self.dp * self.cfg.num_stages + stage

    def compute(self, seconds: float) -> None:
        """Inside an instruction: its kernel takes exactly ``seconds`` at the max clock."""
        if self.kernels is not None:
            self.kernels.pad(seconds)  # the runtime's kernel waits it out when the instruction ends
        else:
            self.device.run_for(seconds, activity=self.cfg.activity, compute_fraction=self.cfg.compute_fraction)

    def run_instruction(self, sched: Schedule, inst: Instruction, listener: Any, step: int) -> None:
        import torch.distributed as dist

        cfg = self.cfg
        s = sched.num_stages
        v = sched.virtual_stage(self.stage, inst.chunk)
        last_v = s * sched.num_chunks - 1
        forward = inst.kind == "forward"
        src_v = v - 1 if forward else v + 1
        if 0 <= src_v <= last_v:
            dist.recv(self.buf, src=self.peer(src_v % s), tag=_tag(inst, sched.num_chunks))
        duration = cfg.forward_s * cfg.weight(self.stage) * (1.0 if forward else cfg.backward_ratio)
        if cfg.slow_dp == self.dp and step >= cfg.slow_from_step and (
            cfg.slow_until_step is None or step < cfg.slow_until_step
        ):
            duration *= cfg.slow_factor
        listener.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
        self.compute(duration)
        listener.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        dst_v = v + 1 if forward else v - 1
        if 0 <= dst_v <= last_v:
            nxt = Instruction(inst.kind, inst.microbatch, dst_v // s)
            self.pending.append(dist.isend(self.buf.clone(), dst=self.peer(dst_v % s), tag=_tag(nxt, sched.num_chunks)))

    def run_step(self, sched: Schedule, listener: Any, step: int) -> None:
        self.pending: list[Any] = []
        listener.on_step_begin()
        for inst in sched.stages[self.stage]:
            self.run_instruction(sched, inst, listener, step)
        for work in self.pending:
            work.wait()
        listener.on_step_end()


class _DieAtStepEnd:
    """The runtime's listener, except that the step's end is this process's SIGKILL."""

    def __init__(self, runtime: Any, marker: Path) -> None:
        self._runtime, self._marker = runtime, marker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def on_step_end(self) -> None:
        self._marker.write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


class _WarningCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def run_rank(rank: int, world_size: int, cfg: ToyConfig, out_dir: str, store_path: str) -> None:
    """Body of one toy-pipeline process; ``store_path`` "" means torchrun's ``env://``."""
    import torch.distributed as dist

    from perseus.gpu.sim.device import SimulatedGPU
    from perseus.runtime.config import PerseusConfig
    from perseus.runtime import install_process_hooks
    from perseus.runtime.engine import PerseusRuntime
    from perseus.runtime.job import PipelineJob

    os.environ["PERSEUS_SIM_GPU_DIR"] = cfg.sim_dir
    collector = _WarningCollector()
    logging.getLogger("perseus").addHandler(collector)
    logging.getLogger("perseus").setLevel(logging.INFO)
    out = Path(out_dir)
    result: dict[str, Any] = {"rank": rank, "steps": [], "error": None, "attempt": _attempt()}
    runtime = None
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{store_path}" if store_path else "env://", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
        )
        device = SimulatedGPU(rank, preset=cfg.sim_preset, state_dir=cfg.sim_dir,
                              energy_update_period_s=cfg.energy_update_period_s, reset_state=True)
        job = PipelineJob(
            num_stages=cfg.num_stages, num_microbatches=cfg.num_microbatches, stage=rank % cfg.num_stages,
            schedule=cfg.schedule, num_chunks=cfg.num_chunks, dp_rank=rank // cfg.num_stages, dp_size=cfg.dp_size,
            rank=rank, world_size=world_size, model_config={"toy": asdict(cfg) | {"perseus": None, "steps": None}},
        )
        config = PerseusConfig.from_dict({"gpu": "sim", "device_index": rank, **cfg.perseus,
                                          "enabled": cfg.perseus_enabled})
        sched = job.build_schedule()
        if config.enabled:
            install_process_hooks()  # this trainer is its process's entry point: SIGTERM closes the runtime
        with PerseusRuntime(job, config) as runtime:
            worker = _StageWorker(cfg, rank, device, runtime.sim_kernels)
            (out / f"rank{rank}.pid").write_text(str(os.getpid()))
            if cfg.target_slowdown is not None:
                runtime.set_target_slowdown(cfg.target_slowdown)
            step, planning_extra, in_die_phase = 0, 0, 0
            while step < cfg.steps + planning_extra:
                if cfg.change_microbatches_at_step is not None and step == cfg.change_microbatches_at_step:
                    sched = build_schedule(cfg.schedule, cfg.num_stages, cfg.num_microbatches + 1, cfg.num_chunks)
                if cfg.raise_at_step == step:
                    raise RuntimeError(f"toy trainer failure injected at step {step}")
                if cfg.hang_at_step == step:
                    (out / f"rank{rank}.hanging").write_text("1")
                    while True:
                        time.sleep(0.05)
                if cfg.admin_reset_at_step == step:
                    admin = SimulatedGPU(rank, state_dir=cfg.sim_dir)
                    held = admin.locked_sm_clock_mhz() if admin.is_clock_locked() else None
                    t_reset = time.monotonic()
                    admin.reset_locked_sm_clock()
                    relocked_s = None
                    if held is not None and held < admin.default_sm_clock_mhz():
                        # wait at the step boundary (P2P partners wait too) for the controller to
                        # re-apply the lock; the bound is a hang guard
                        while time.monotonic() - t_reset < 60.0 and relocked_s is None:
                            time.sleep(0.005)
                            if admin.locked_sm_clock_mhz() == held:
                                relocked_s = time.monotonic() - t_reset
                    result["admin_reset"] = {"step": step, "held_mhz": held, "relocked_s": relocked_s}
                    admin.close()
                if cfg.kill_controller_at_step == step:
                    pid = runtime.gpu.controller.pid
                    result["controller_killed"] = {"step": step, "wall": time.time(), "was_locked": device.is_clock_locked()}
                    os.kill(pid, signal.SIGKILL)  # like the OOM killer; the runtime's handle reaps it
                listener: Any = runtime
                if cfg.die_rank == rank and runtime.phase.value == cfg.die_phase and (
                    cfg.die_on_attempt is None or cfg.die_on_attempt == _attempt()
                ):
                    in_die_phase += 1
                    if in_die_phase == cfg.die_after:
                        listener = _DieAtStepEnd(runtime, out / f"rank{rank}.died")
                e0, t0 = device.total_energy_j(), time.perf_counter()
                worker.run_step(sched, listener, step)
                result["steps"].append(
                    {"step": step, "time_s": time.perf_counter() - t0, "energy_j": device.total_energy_j() - e0,
                     "phase": runtime.phase.value, "clock_locked": device.is_clock_locked(), "wall": time.time()}
                )
                # Phase changes happen at step boundaries on all ranks together, so every rank
                # extends its loop identically and P2P partners stay matched.
                if runtime.phase is Phase.PLANNING and planning_extra < cfg.planning_grace_steps:
                    planning_extra += 1
                step += 1
            result["summary"] = runtime.summary()
            result["stage_clocks"] = runtime.stage_clocks()
            if runtime.prometheus is not None:  # what a scrape sees at the end of training
                import urllib.request

                with urllib.request.urlopen(runtime.prometheus.url, timeout=30) as resp:
                    result["prometheus"] = resp.read().decode()
        device.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher through the result file
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        if runtime is not None:
            result["summary"] = runtime.summary()
    finally:
        result["warnings"] = collector.messages
        (out / f"rank{rank}.json").write_text(json.dumps(result, default=str))
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - teardown of a test process: the result is already written
                pass


def launch(cfg: ToyConfig, out_dir: str | Path, *, timeout_s: float = 120.0, start_method: str = "fork") -> list[dict[str, Any]]:
    """Run the toy pipeline on ``dp_size × num_stages`` local processes; returns per-rank results."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not cfg.sim_dir:
        cfg.sim_dir = str(out / "sim-gpus")
    world = cfg.dp_size * cfg.num_stages
    store = out / "dist-store"
    if store.exists():
        store.unlink()
    procs = start(cfg, out, start_method=start_method)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    if hung:
        raise TimeoutError(f"toy pipeline: {len(hung)} of {world} ranks did not finish within {timeout_s} s")
    return collect(out, world)


def start(cfg: ToyConfig, out: Path, *, start_method: str = "fork") -> list[Any]:
    """Start the rank processes without waiting (for signal tests)."""
    ctx = mp.get_context(start_method)
    world = cfg.dp_size * cfg.num_stages
    procs = [ctx.Process(target=run_rank, args=(r, world, cfg, str(out), str(out / "dist-store")), daemon=False)
             for r in range(world)]
    # Forked from a multi-threaded parent (pytest, torch): a forked rank that garbage-collects the
    # parent's objects has crashed (a segfault in "Garbage-collecting", seen twice in loaded suites).
    # Frozen objects are never traversed by the children's collector.
    gc.collect()
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
    return procs


def collect(out: Path, world: int) -> list[dict[str, Any]]:
    results = []
    for r in range(world):
        path = out / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {"rank": r, "error": "no result file"})
    return results
