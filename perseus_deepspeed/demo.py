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
    """What the demo runs; every rank reads it from ``config.json`` in the output directory."""

    stages: int = 4
    microbatches: int = 8
    dp_size: int = 1  # data-parallel pipelines (torchrun starts stages × dp_size ranks)
    straggler: dict[str, Any] | None = None  # perseus.demo.Straggler fields: one slow replica for a while
    max_steps: int = 60
    deployed_steps: int = 8  # iterations with the plan deployed
    rebaseline_steps: int = 6  # then default clocks again (A/B/A), so drifting machine load fakes nothing
    startup_steps: int = 2  # first iterations (allocator, lazy init) are slow: left out of the baseline
    # Kernel time at the max clock per instruction: the real CPU work is padded up to it so that
    # CPU noise on a shared machine does not drown the clock's effect.
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    last_stage_weight: float = 1.3  # the loss layer makes the last stage heavier, as on real pipelines
    hidden_size: int = 64
    micro_batch_size: int = 4
    sim_gpu: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SIM_GPU))
    perseus: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PERSEUS))


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
    section = {**cfg.perseus, "gpu": "sim", "device_index": rank, "sim_gpu": cfg.sim_gpu}
    model = build_pipeline(cfg.stages, shape)
    stage, dp_rank = model.stage_id, model._grid.get_data_parallel_rank()
    weight = cfg.last_stage_weight if stage == cfg.stages - 1 else 1.0
    nominal = {"forward": weight * cfg.forward_ms / 1e3, "backward": weight * cfg.backward_ms / 1e3}
    compute: list[SimulatedCompute] = []

    def wrap(runtime: Any) -> SimulatedCompute:
        compute.append(SimulatedCompute(runtime, gpu, nominal))
        return compute[-1]

    engine, *_ = initialize(
        model=model, optimizer=client_optimizer(model), config=deepspeed_config(cfg.microbatches, shape, section, cfg.dp_size),
        model_config={"demo": "tiny-linear"}, listener_wrapper=wrap,
    )
    handle = get_handle(engine)
    assert handle is not None
    data = data_iterator(shape)
    try:
        records, summary = run_phases(
            lambda: engine.train_batch(data), compute, handle, max_steps=cfg.max_steps,
            deployed_steps=cfg.deployed_steps, rebaseline_steps=cfg.rebaseline_steps, startup_steps=cfg.startup_steps,
            straggler=Straggler(**cfg.straggler) if cfg.straggler else None, dp_rank=dp_rank,
        )
    finally:
        engine.destroy()  # closes Perseus first: default clocks
        gpu.close()
    result = {"rank": rank, "stage": stage, "dp_rank": dp_rank, "steps": records, "summary": summary}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    return result


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage and replica) and collect every rank's result."""
    return launch_ranks("perseus_deepspeed.demo", cfg.stages * cfg.dp_size, out_dir, asdict(cfg), {"DS_ACCELERATOR": "cpu"}, timeout_s)


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
