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
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perseus.demo import (
    DEFAULT_PERSEUS,
    DEFAULT_SIM_GPU,
    SimulatedCompute,
    Straggler,
    format_report,
    launch_ranks,
    phase_table,
    run_phases,
)


@dataclass
class DemoConfig:
    """What the demo runs; every rank receives it as JSON."""

    stages: int = 4
    microbatches: int = 8
    chunks: int = 1  # virtual pipeline chunks per stage (> 1: megatron-core's interleaved 1F1B)
    dp_size: int = 1  # data-parallel pipelines (torchrun starts stages × dp_size ranks)
    straggler: dict[str, Any] | None = None  # perseus.demo.Straggler fields: one slow replica for a while
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
    sim_gpu: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SIM_GPU))
    perseus: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PERSEUS))


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: baseline, profiling, planning, the deployed plan, baseline again."""
    from perseus.gpu.simulated import SimulatedGPU
    from perseus_megatron.cpu import cpu_execution
    from perseus_megatron.integration import enable
    from perseus_megatron.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel

    from megatron.core import parallel_state

    rank = int(os.environ["RANK"])
    shape = TinyGPTShape(num_layers=cfg.stages * cfg.chunks, hidden_size=cfg.hidden_size, seq_length=cfg.seq_length,
                         micro_batch_size=cfg.micro_batch_size)
    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    virtual = cfg.chunks if cfg.chunks > 1 else None
    with cpu_execution():
        initialize_parallel(cfg.stages, virtual)
        trainer = TinyGPTTrainer(shape, cfg.stages, virtual)
        stage, dp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_data_parallel_rank()
        weight = cfg.last_stage_weight if stage == cfg.stages - 1 else 1.0
        nominal = {"forward": weight * cfg.forward_ms / 1e3, "backward": weight * cfg.backward_ms / 1e3}
        compute: list[SimulatedCompute] = []

        def wrap(runtime: Any) -> SimulatedCompute:
            compute.append(SimulatedCompute(runtime, gpu, nominal))
            return compute[-1]

        handle = enable({**cfg.perseus, "device_index": rank, "sim_gpu": cfg.sim_gpu}, listener_wrapper=wrap)
        try:
            records, summary = run_phases(
                lambda: trainer.step(cfg.microbatches), compute, handle, max_steps=cfg.max_steps,
                deployed_steps=cfg.deployed_steps, rebaseline_steps=cfg.rebaseline_steps,
                startup_steps=cfg.startup_steps,
                straggler=Straggler(**cfg.straggler) if cfg.straggler else None, dp_rank=dp_rank,
            )
        finally:
            handle.close()
            gpu.close()
    result = {"rank": rank, "stage": stage, "dp_rank": dp_rank, "steps": records, "summary": summary}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    return result


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage and replica) and collect every rank's result."""
    return launch_ranks("perseus_megatron.demo", cfg.stages * cfg.dp_size, out_dir, asdict(cfg), {}, timeout_s)


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
