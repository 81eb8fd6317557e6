"""End-to-end demo: a real DeepSpeed ``PipelineEngine`` on CPU with Perseus and simulated GPUs.

    python -m perseus_demo.deepspeed_demo            # 4 pipeline stages under torchrun, prints a table
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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perseus_demo.common import DemoSettings, SimulatedCompute, demo_main, launch_demo, run_phases, save_rank_result


@dataclass
class DemoConfig(DemoSettings):
    """What the demo runs (see ``DemoSettings``); the model is Linear layers, two per stage."""

    # More DeepSpeed config entries, e.g. {"csv_monitor": {"enabled": true, ...}}: monitors get Perseus's metrics.
    deepspeed: dict[str, Any] = field(default_factory=dict)


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: train until the plan has run ``deployed_steps`` iterations."""
    from perseus.gpu.sim.device import SimulatedGPU
    from perseus_demo.deepspeed_cpu import init_cpu_distributed
    from perseus_deepspeed.integration import get_handle, initialize
    from perseus_demo.tiny_pipe import TinyPipeShape, build_pipeline, client_optimizer, data_iterator, deepspeed_config

    rank = int(os.environ["RANK"])
    init_cpu_distributed()
    shape = TinyPipeShape(hidden_size=cfg.hidden_size, layers_per_stage=2, micro_batch_size=cfg.micro_batch_size)
    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    section = {**cfg.perseus, "gpu": "sim", "device_index": rank, "sim_gpu": cfg.sim_gpu}
    model = build_pipeline(cfg.stages, shape)
    stage, dp_rank = model.stage_id, model._grid.get_data_parallel_rank()
    compute: list[SimulatedCompute] = []

    def wrap(runtime: Any) -> SimulatedCompute:
        compute.append(SimulatedCompute(runtime, gpu, cfg.nominal_s(stage)))
        return compute[-1]

    config = {**deepspeed_config(cfg.microbatches, shape, section, cfg.dp_size), **cfg.deepspeed}
    engine, *_ = initialize(
        model=model, optimizer=client_optimizer(model), config=config,
        model_config={"demo": "tiny-linear"}, listener_wrapper=wrap,
    )
    handle = get_handle(engine)
    assert handle is not None
    data = data_iterator(shape)
    try:
        records, summary = run_phases(lambda: engine.train_batch(data), compute, handle, cfg, dp_rank)
    finally:
        engine.destroy()  # closes Perseus first: default clocks
        gpu.close()
    return save_rank_result(out_dir, rank, stage, dp_rank, records, summary)


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage and replica) and collect every rank's result."""
    return launch_demo("perseus_demo.deepspeed_demo", cfg, out_dir, {"DS_ACCELERATOR": "cpu"}, timeout_s)


def main(argv: list[str] | None = None) -> None:
    demo_main(argv, doc=__doc__ or "", config_cls=DemoConfig, run_rank=run_rank, launch=launch,
              title="DeepSpeed PipelineEngine")


if __name__ == "__main__":
    main()
