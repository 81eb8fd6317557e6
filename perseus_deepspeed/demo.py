"""End-to-end demo: a real DeepSpeed ``PipelineEngine`` on CPU with Perseus and simulated GPUs.

    python -m perseus_deepspeed.demo            # 4 pipeline stages under torchrun, prints a table
    perseus demo --framework deepspeed          # the same, plus frontier and timeline pictures

Each torchrun rank is one pipeline stage of a small ``PipelineModule`` (Linear layers) trained
with ``PipelineEngine.train_batch`` (DeepSpeed's own TrainSchedule, gloo). Perseus is started by
``perseus_deepspeed.initialize`` from the DeepSpeed config's ``"perseus"`` section. Every
forward/backward runs inside a busy section of a simulated GPU (``PERSEUS_GPU=sim``): its time
is the kernel time at the maximum clock, a lower clock stretches it, power is integrated; so
profiling, planning and the per-instruction frequency plan change the measured iteration time
and energy as they would on hardware. Phases: baseline (default clocks) → online profiling →
planning → deployed plan.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from perseus.errors import PerseusError


@dataclass
class DemoConfig:
    """What the demo runs; every rank reads it from ``config.json`` in the output directory."""

    stages: int = 4
    microbatches: int = 8
    max_steps: int = 60
    deployed_steps: int = 8  # stop after this many iterations with the plan deployed
    startup_steps: int = 2  # first iterations (allocator, lazy init) are slow: left out of the baseline
    # Kernel time at the max clock per instruction: the real CPU work is padded up to it so that
    # CPU noise on a shared machine does not drown the clock's effect.
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    last_stage_weight: float = 1.3  # the loss layer makes the last stage heavier, as on real pipelines
    hidden_size: int = 64
    micro_batch_size: int = 4
    sim_gpu: dict[str, Any] = field(default_factory=lambda: {"preset": "A100-SXM", "energy_update_period_s": 0.005})
    perseus: dict[str, Any] = field(default_factory=lambda: {
        "freq_min_mhz": 900, "freq_step_mhz": 150, "warmup_steps": 6, "iters_per_freq": 2,
        "straggler_period_steps": 0, "log_every_steps": 0, "cache_dir": None,
    })


class SimulatedCompute:
    """Listener in front of the runtime: each instruction is a busy section of this rank's simulated GPU.

    The runtime sees the instruction begin first (it may change the clock); the simulated GPU
    then times the work at that clock, padded to ``nominal_s`` per kind, and stretches it on the
    way out before the runtime records the end. It also measures each iteration from the
    runtime's step begin to its step end, i.e. the training work without Perseus's one-time
    step-boundary work (P_blocking measurement, collectives), into ``iterations``.
    """

    def __init__(self, runtime: Any, gpu: Any, nominal_s: dict[str, float]) -> None:
        self.runtime, self.gpu, self.nominal_s = runtime, gpu, nominal_s
        self.iterations: list[dict[str, Any]] = []
        self._t0 = self._step_t0 = self._step_e0 = 0.0
        self._phase = ""

    def on_step_begin(self) -> None:
        self.runtime.on_step_begin()
        self._phase = self.runtime.phase.value
        self._step_e0, self._step_t0 = self.gpu.total_energy_j(), time.perf_counter()

    def on_step_end(self) -> None:
        self.iterations.append({"phase": self._phase, "time_s": time.perf_counter() - self._step_t0,
                                "energy_j": self.gpu.total_energy_j() - self._step_e0})
        self.runtime.on_step_end()

    def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        self.runtime.on_instruction_begin(kind, microbatch, chunk)
        self.gpu.begin_busy()
        self._t0 = time.perf_counter()

    def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        pad = self.nominal_s.get(kind, 0.0) - (time.perf_counter() - self._t0)
        if pad > 0:
            time.sleep(pad)
        self.gpu.end_busy()
        self.runtime.on_instruction_end(kind, microbatch, chunk)


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: train until the plan has run ``deployed_steps`` iterations."""
    from perseus.gpu.simulated import SimulatedGPU
    from perseus_deepspeed.cpu import init_cpu_distributed
    from perseus_deepspeed.integration import get_handle, initialize
    from perseus_deepspeed.tiny_pipe import TinyPipeShape, build_pipeline, client_optimizer, data_iterator, deepspeed_config

    rank = int(os.environ["RANK"])
    init_cpu_distributed()
    shape = TinyPipeShape(hidden_size=cfg.hidden_size, layers_per_stage=2, micro_batch_size=cfg.micro_batch_size)
    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    weight = cfg.last_stage_weight if rank == cfg.stages - 1 else 1.0
    nominal = {"forward": weight * cfg.forward_ms / 1e3, "backward": weight * cfg.backward_ms / 1e3}
    section = {**cfg.perseus, "gpu": "sim", "device_index": rank, "sim_gpu": cfg.sim_gpu}
    model = build_pipeline(cfg.stages, shape)
    compute: list[SimulatedCompute] = []

    def wrap(runtime: Any) -> SimulatedCompute:
        compute.append(SimulatedCompute(runtime, gpu, nominal))
        return compute[-1]

    engine, *_ = initialize(
        model=model, optimizer=client_optimizer(model), config=deepspeed_config(cfg.microbatches, shape, section),
        model_config={"demo": "tiny-linear"}, listener_wrapper=wrap,
    )
    handle = get_handle(engine)
    assert handle is not None
    data = data_iterator(shape)
    try:
        deployed = 0
        while len(compute[0].iterations) < cfg.max_steps and deployed < cfg.deployed_steps:
            engine.train_batch(data)
            deployed += compute[0].iterations[-1]["phase"] == "deployed"
        summary = handle.summary()
    finally:
        engine.destroy()  # closes Perseus first: default clocks
        gpu.close()
    records = [{**it, "step": step, "phase": "startup" if step < cfg.startup_steps else it["phase"]}
               for step, it in enumerate(compute[0].iterations)]
    result = {"rank": rank, "steps": records, "summary": summary}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    return result


def phase_table(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: median iteration time (slowest rank) and median job energy (sum over ranks) per iteration.

    Medians, because on a shared CPU machine a single iteration can be slowed by other processes.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for result in results:
        for rec in result["steps"]:
            row = by_step.setdefault(rec["step"], {"phase": rec["phase"], "time_s": 0.0, "energy_j": 0.0})
            row["time_s"] = max(row["time_s"], rec["time_s"])
            row["energy_j"] += rec["energy_j"]
    phases: dict[str, list[dict[str, Any]]] = {}
    for row in by_step.values():
        phases.setdefault(row["phase"], []).append(row)
    return {
        phase: {"iterations": len(rows), "time_s": median(r["time_s"] for r in rows),
                "energy_j": median(r["energy_j"] for r in rows)}
        for phase, rows in phases.items()
    }


def format_report(table: dict[str, dict[str, float]]) -> str:
    """The per-phase table, then deployed plan vs baseline (warm-up at default clocks)."""
    lines = [f"{'phase':<12}{'iterations':>11}{'time/iter':>12}{'energy/iter':>14}   (medians; energy: all GPUs)"]
    for phase, row in table.items():
        lines.append(f"{phase:<12}{row['iterations']:>11}{row['time_s'] * 1e3:>10.1f}ms{row['energy_j']:>12.2f} J")
    base, plan = table.get("warmup"), table.get("deployed")
    if base and plan:
        lines.append(
            f"deployed vs baseline: energy {100 * (1 - plan['energy_j'] / base['energy_j']):+.1f}% saved, "
            f"iteration time {100 * (plan['time_s'] / base['time_s'] - 1):+.1f}%"
        )
    else:
        lines.append("the plan was not deployed within max_steps; raise --max-steps")
    return "\n".join(lines)


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage) and collect every rank's result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    (out_dir / "config.json").write_text(json.dumps(asdict(cfg)))
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PERSEUS_GPU="sim", PERSEUS_SIM_GPU_DIR=str(out_dir / "sim-gpus"), DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.stages}",
           "-m", "perseus_deepspeed.demo", "--worker", str(out_dir)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PerseusError(f"the DeepSpeed demo did not finish within {timeout_s:.0f} s") from None
    results = []
    for rank in range(cfg.stages):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            raise PerseusError(f"DeepSpeed demo rank {rank} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        results.append(json.loads(path.read_text()))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--stages", type=int, default=DemoConfig.stages)
    parser.add_argument("--microbatches", type=int, default=DemoConfig.microbatches)
    parser.add_argument("--max-steps", type=int, default=DemoConfig.max_steps)
    parser.add_argument("--out", help="directory for per-rank results (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.worker:
        out = Path(args.worker)
        run_rank(DemoConfig(**json.loads((out / "config.json").read_text())), out)
        return
    if not 2 <= args.stages <= 8:
        raise SystemExit("--stages must be between 2 and 8 (one CPU process per stage)")
    cfg = DemoConfig(stages=args.stages, microbatches=args.microbatches, max_steps=args.max_steps)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="perseus-deepspeed-demo-"))
    started = time.perf_counter()
    results = launch(cfg, out)
    print(f"DeepSpeed PipelineEngine, {cfg.stages} pipeline stages x {cfg.microbatches} microbatches, simulated "
          f"{cfg.sim_gpu['preset']} GPUs ({time.perf_counter() - started:.0f} s, results in {out})")
    print(format_report(phase_table(results)))


if __name__ == "__main__":
    main()
