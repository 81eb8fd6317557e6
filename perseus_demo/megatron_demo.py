"""End-to-end demo: a real megatron-core GPT pipeline on CPU with Perseus and simulated GPUs.

    python -m perseus_demo.megatron_demo            # 4 pipeline stages under torchrun, prints a table

Each torchrun rank is one pipeline stage of a tiny ``GPTModel`` trained with megatron-core's own
1F1B schedule over gloo. Every forward/backward runs inside a busy section of a simulated GPU
(``PERSEUS_GPU=sim``): its CPU time is the kernel time at the maximum clock, a lower clock
stretches it, and power is integrated, so Perseus's profiling, planning and per-instruction
frequency plan change the measured iteration time and energy as they would on hardware.
Phases: baseline (default clocks) → online profiling → planning → deployed plan.

``num_experts`` > 0 makes every layer a mixture of experts (top-2 routing, megatron-core's
alltoall token dispatcher) with ``expert_parallel`` ranks of each stage's data-parallel group
sharing the experts (``dp_size`` must be a multiple of it), run inside
``megatron_cpu.moe_cpu_execution``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus_demo.common import DemoSettings, SimulatedCompute, demo_main, launch_demo, run_phases, save_rank_result


@dataclass
class DemoConfig(DemoSettings):
    """What the demo runs (see ``DemoSettings``), plus megatron-core's own knobs."""

    chunks: int = 1  # virtual pipeline chunks per stage (> 1: megatron-core's interleaved 1F1B)
    # megatron-core's microbatch_group_size_per_vp_stage (interleaved; None: its default, the stage count)
    group_size: int | None = None
    seq_length: int = 32
    num_experts: int = 0  # > 0: mixture-of-experts layers (alltoall dispatcher)
    expert_parallel: int = 1  # expert-parallel ranks within each stage's data-parallel group


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: baseline, profiling, planning, the deployed plan, baseline again."""
    from megatron.core import parallel_state

    from perseus.gpu.sim.device import SimulatedGPU
    from perseus_demo.megatron_cpu import cpu_execution, moe_cpu_execution
    from perseus_megatron.integration import enable
    from perseus_demo.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel

    rank = int(os.environ["RANK"])
    shape = TinyGPTShape(num_layers=cfg.stages * cfg.chunks, hidden_size=cfg.hidden_size, seq_length=cfg.seq_length,
                         micro_batch_size=cfg.micro_batch_size, num_experts=cfg.num_experts,
                         expert_parallel=cfg.expert_parallel)
    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    virtual = cfg.chunks if cfg.chunks > 1 else None
    with moe_cpu_execution() if cfg.num_experts else cpu_execution():
        initialize_parallel(cfg.stages, virtual, expert_parallel=cfg.expert_parallel)
        trainer = TinyGPTTrainer(shape, cfg.stages, virtual, group_size=cfg.group_size)
        stage, dp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_data_parallel_rank()
        compute: list[SimulatedCompute] = []

        def wrap(runtime: Any) -> SimulatedCompute:
            compute.append(SimulatedCompute(runtime, gpu, cfg.nominal_s(stage)))
            return compute[-1]

        handle = enable({**cfg.perseus, "device_index": rank, "sim_gpu": cfg.sim_gpu}, listener_wrapper=wrap)
        try:
            records, summary = run_phases(lambda: trainer.step(cfg.microbatches), compute, handle, cfg, dp_rank)
        finally:
            handle.close()
            gpu.close()
    return save_rank_result(out_dir, rank, stage, dp_rank, records, summary)


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per stage and replica) and collect every rank's result."""
    return launch_demo("perseus_demo.megatron_demo", cfg, out_dir, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> None:
    demo_main(argv, doc=__doc__ or "", config_cls=DemoConfig, run_rank=run_rank, launch=launch,
              title="megatron-core tiny GPT")


if __name__ == "__main__":
    main()
