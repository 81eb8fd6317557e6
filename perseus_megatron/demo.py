"""End-to-end demo: a real megatron-core GPT pipeline on CPU with Perseus and simulated GPUs.

    python -m perseus_megatron.demo            # 4 pipeline stages under torchrun, prints a table

Each torchrun rank is one pipeline stage of a tiny ``GPTModel`` trained with megatron-core's own
1F1B schedule over gloo. Every forward/backward runs inside a busy section of a simulated GPU
(``PERSEUS_GPU=sim``): its CPU time is the kernel time at the maximum clock, a lower clock
stretches it, and power is integrated, so Perseus's profiling, planning and per-instruction
frequency plan change the measured iteration time and energy as they would on hardware.
Phases: baseline (default clocks) → online profiling → planning → deployed plan.
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
from statistics import fmean
from typing import Any

from perseus.errors import PerseusError


@dataclass
class DemoConfig:
    """What the demo runs; every rank receives it as JSON."""

    stages: int = 4
    microbatches: int = 8
    max_steps: int = 60
    deployed_steps: int = 8  # iterations with the plan deployed
    # Then this many iterations at default clocks again (A/B/A): a baseline measured at the same
    # time as the plan, so machine load that drifts during the run does not fake a saving.
    rebaseline_steps: int = 6
    startup_steps: int = 2  # first iterations (allocator, lazy init) are slow: left out of the baseline
    # Nominal kernel time at the max clock: each instruction's real CPU work is padded up to it,
    # so that CPU noise on a shared machine does not drown the clock's effect (0: CPU time only).
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    last_stage_weight: float = 1.3  # the LM head makes the last stage heavier, as on real pipelines
    hidden_size: int = 64
    seq_length: int = 32
    micro_batch_size: int = 4
    sim_gpu: dict[str, Any] = field(default_factory=lambda: {"preset": "A100-SXM", "energy_update_period_s": 0.005})
    perseus: dict[str, Any] = field(default_factory=lambda: {
        "freq_min_mhz": 900, "freq_step_mhz": 150, "warmup_steps": 6, "iters_per_freq": 2,
        "straggler_period_steps": 0, "log_every_steps": 0, "cache_dir": None,
    })


class _NoListener:
    """Stands in for the runtime while the demo re-measures the baseline at default clocks."""

    def on_step_begin(self) -> None: ...
    def on_step_end(self) -> None: ...
    def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0) -> None: ...
    def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0) -> None: ...


class SimulatedCompute:
    """Listener wrapper: each instruction's compute is a busy section of this rank's simulated GPU.

    The runtime sees the instruction begin first (it may change the clock), the simulated GPU
    then times the work at that clock; on the way out the simulated GPU stretches the section
    before the runtime records its end. ``nominal_s`` pads the real work to a fixed duration
    per kind (the kernel time at the max clock).
    """

    def __init__(self, listener: Any, gpu: Any, nominal_s: dict[str, float] | None = None):
        self.listener, self.gpu = listener, gpu
        self.nominal_s = nominal_s or {}
        self._t0 = 0.0

    def on_step_begin(self) -> None:
        self.listener.on_step_begin()

    def on_step_end(self) -> None:
        self.listener.on_step_end()

    def on_instruction_begin(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        self.listener.on_instruction_begin(kind, microbatch, chunk)
        self.gpu.begin_busy()
        self._t0 = time.perf_counter()

    def on_instruction_end(self, kind: Any, microbatch: int, chunk: int = 0) -> None:
        pad = self.nominal_s.get(kind, 0.0) - (time.perf_counter() - self._t0)
        if pad > 0:
            time.sleep(pad)
        self.gpu.end_busy()
        self.listener.on_instruction_end(kind, microbatch, chunk)


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: train until the plan has run ``deployed_steps`` iterations."""
    from perseus.gpu.simulated import SimulatedGPU
    from perseus_megatron.cpu import cpu_execution
    from perseus_megatron.integration import enable
    from perseus_megatron.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel

    rank = int(os.environ["RANK"])
    shape = TinyGPTShape(num_layers=cfg.stages, hidden_size=cfg.hidden_size, seq_length=cfg.seq_length,
                         micro_batch_size=cfg.micro_batch_size)
    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    records: list[dict[str, Any]] = []
    with cpu_execution():
        initialize_parallel(cfg.stages)
        trainer = TinyGPTTrainer(shape, cfg.stages)
        weight = cfg.last_stage_weight if rank == cfg.stages - 1 else 1.0
        nominal = {"forward": weight * cfg.forward_ms / 1e3, "backward": weight * cfg.backward_ms / 1e3}
        wrappers: list[SimulatedCompute] = []

        def wrap(runtime: Any) -> SimulatedCompute:
            wrappers.append(SimulatedCompute(runtime, gpu, nominal))
            return wrappers[-1]

        handle = enable({**cfg.perseus, "device_index": rank, "sim_gpu": cfg.sim_gpu}, listener_wrapper=wrap)
        try:
            deployed, rebaselined, phase = 0, 0, "warmup"
            for step in range(cfg.max_steps + cfg.rebaseline_steps):
                e0, t0 = gpu.total_energy_j(), time.perf_counter()
                trainer.step(cfg.microbatches)
                label = "startup" if step < cfg.startup_steps else phase  # the phase this step ran in
                records.append({"step": step, "phase": label, "time_s": time.perf_counter() - t0,
                                "energy_j": gpu.total_energy_j() - e0})
                deployed += label == "deployed"
                rebaselined += label == "baseline again"
                if rebaselined >= cfg.rebaseline_steps or (deployed == 0 and step >= cfg.max_steps):
                    break
                if deployed >= cfg.deployed_steps and phase != "baseline again":
                    # Same model, same padding and simulated GPU, but default clocks and no runtime.
                    summary = handle.summary()
                    for wrapper in wrappers:
                        wrapper.listener = _NoListener()
                    handle.runtime.gpu.reset()
                    phase = "baseline again"
                elif phase != "baseline again":
                    phase = handle.runtime.phase.value  # phase changes take effect from the next step
            if phase != "baseline again":
                summary = handle.summary()
        finally:
            handle.close()
            gpu.close()
    result = {"rank": rank, "steps": records, "summary": summary}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    return result


def phase_table(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: mean iteration time (slowest rank) and mean job energy (sum over ranks) per iteration."""
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
        phase: {"iterations": len(rows), "time_s": fmean(r["time_s"] for r in rows),
                "energy_j": fmean(r["energy_j"] for r in rows)}
        for phase, rows in phases.items()
    }


def format_report(table: dict[str, dict[str, float]]) -> str:
    lines = [f"{'phase':<16}{'iterations':>11}{'time/iter':>12}{'energy/iter':>14}"]
    for phase, row in table.items():
        lines.append(f"{phase:<16}{row['iterations']:>11}{row['time_s'] * 1e3:>10.1f}ms{row['energy_j']:>12.2f} J")
    plan = table.get("deployed")
    # Both ran at default clocks, but warm-up also pays for process start-up (controller processes,
    # first-iteration allocations), so the re-measured baseline is the fair reference.
    name = "baseline again" if "baseline again" in table else "warmup"
    base = table.get(name)
    if base and plan:
        lines.append(
            f"deployed plan vs {name} (default clocks): {100 * (1 - plan['energy_j'] / base['energy_j']):.1f}% "
            f"less energy, iteration time {100 * (plan['time_s'] / base['time_s'] - 1):+.1f}%"
        )
    if not plan:
        lines.append("the plan was not deployed within max_steps; raise --max-steps")
    return "\n".join(lines)


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage) and collect every rank's result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(asdict(cfg)))
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PERSEUS_GPU="sim", PERSEUS_SIM_GPU_DIR=str(out_dir / "sim-gpus"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.stages}",
           "-m", "perseus_megatron.demo", "--worker", str(out_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    results = []
    for rank in range(cfg.stages):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            raise PerseusError(f"demo rank {rank} failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(path.read_text()))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--stages", type=int, default=DemoConfig.stages)
    parser.add_argument("--microbatches", type=int, default=DemoConfig.microbatches)
    parser.add_argument("--max-steps", type=int, default=DemoConfig.max_steps)
    parser.add_argument("--out", help="directory for per-rank results (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.worker:
        out = Path(args.worker)
        cfg = DemoConfig(**json.loads((out / "config.json").read_text()))
        run_rank(cfg, out)
        return
    cfg = DemoConfig(stages=args.stages, microbatches=args.microbatches, max_steps=args.max_steps)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="perseus-megatron-demo-"))
    started = time.perf_counter()
    results = launch(cfg, out)
    print(f"megatron-core tiny GPT, {cfg.stages} pipeline stages x {cfg.microbatches} microbatches, simulated "
          f"{cfg.sim_gpu['preset']} GPUs ({time.perf_counter() - started:.0f} s, results in {out})")
    print(format_report(phase_table(results)))


if __name__ == "__main__":
    main()
