"""End-to-end demo: torch.distributed.pipelining (TorchTitan's pipeline engine) on CPU with Perseus.

    python -m perseus_demo.torch_demo                 # 2 ranks, 1F1B, prints a table
    perseus demo --framework torch --schedule zbv     # the same, plus frontier and timeline pictures

Each torchrun rank is one pipeline rank holding one torch ``PipelineStage`` (1F1B, GPipe) or
several (``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``: ``chunks`` per rank,
the V placement for ZBV) of a small model of Linear layers, trained with ``schedule.step()`` over
gloo. ``perseus_torch.enable`` hooks the stages; every F/B/I/W runs inside a busy section of a
simulated GPU (``PERSEUS_GPU=sim``), so profiling, planning and the deployed per-instruction clock
plan change measured time and energy as on hardware. Phases: baseline → online profiling →
planning → deployed plan → default clocks again.

Nominal kernel times: F = ``forward_ms``, B = ``backward_ms``; zero-bubble's split backward takes
I = W = B / 2 (the zero-bubble paper's T_F = T_B = T_W when B = 2F); DualPipeV's fused F+B unit
takes F + B (torch 2.13 runs its forward and its backward one after the other).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus_demo.common import DemoSettings, SimulatedCompute, demo_main, launch_demo, run_phases, save_rank_result

# Perseus schedule name -> torch.distributed.pipelining class name
TORCH_CLASSES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "torch-interleaved": "ScheduleInterleaved1F1B",
                 "zb-interleaved": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                 "dualpipev": "ScheduleDualPipeV"}
V_SCHEDULES = ("zbv", "dualpipev")  # two torch stages per rank, in a V


@dataclass
class DemoConfig(DemoSettings):
    """What the demo runs (see ``DemoSettings``); the model is Linear layers, one per torch stage."""

    stages: int = 2
    microbatches: int = 4
    max_steps: int = 200  # the planner runs in the background while training; ZBV takes it longer
    schedule: str = "1f1b"  # a key of TORCH_CLASSES
    chunks: int = 1  # torch stages per rank (2 for zbv; >= 2 for torch-interleaved)

    def nominal_s(self, stage: int) -> dict[str, float]:
        kinds = super().nominal_s(stage)
        kinds["backward_input"] = kinds["backward_weight"] = kinds["backward"] / 2
        kinds["forward_backward"] = kinds["forward"] + kinds["backward"]
        return kinds

    def torch_stage_indices(self, rank: int) -> list[int]:
        """Torch stage indices on a rank: interleaved ``c*S + rank``; ZBV's and DualPipeV's V ``rank, 2S-1-rank``."""
        if self.schedule in V_SCHEDULES:
            return [rank, 2 * self.stages - 1 - rank]
        return [c * self.stages + rank for c in range(self.chunks)]


def build_pipeline(cfg: DemoConfig, rank: int, device: Any = None) -> tuple[Any, list[Any], Any]:
    """This rank's torch stages, the schedule over them, and its loss function (needs torch.distributed up)."""
    import torch
    from torch.distributed.pipelining import PipelineStage, schedules

    device = device or torch.device("cpu")
    num_torch_stages = cfg.stages * (cfg.chunks if cfg.schedule not in V_SCHEDULES else 2)
    stages = []
    for index in cfg.torch_stage_indices(rank):
        torch.manual_seed(index)
        layer = torch.nn.Sequential(torch.nn.Linear(cfg.hidden_size, cfg.hidden_size), torch.nn.Tanh())
        stages.append(PipelineStage(layer, index, num_torch_stages, device))
    loss_fn = torch.nn.MSELoss()
    cls = getattr(schedules, TORCH_CLASSES[cfg.schedule])
    schedule = cls(stages[0] if len(stages) == 1 and cfg.schedule in ("1f1b", "gpipe") else stages,
                   cfg.microbatches, loss_fn=loss_fn)
    return schedule, stages, loss_fn


def train_step_fn(cfg: DemoConfig, schedule: Any, stages: list[Any]) -> Any:
    """One ``schedule.step()`` with inputs where torch stage 0 is and targets where the last one is."""
    import torch

    indices = {int(s.stage_index) for s in stages}
    last = int(stages[0].num_stages) - 1
    generator = torch.Generator().manual_seed(0)
    batch = cfg.micro_batch_size * cfg.microbatches
    x = torch.randn(batch, cfg.hidden_size, generator=generator)
    y = torch.randn(batch, cfg.hidden_size, generator=generator)

    def step() -> None:
        args = (x,) if 0 in indices else ()
        kwargs = {"target": y} if last in indices else {}
        schedule.step(*args, **kwargs)

    return step


def run_rank(cfg: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Body of one torchrun rank: train until the plan has run ``deployed_steps`` iterations."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        return train_rank(cfg, out_dir, int(os.environ["RANK"]))
    finally:
        dist.destroy_process_group()


def train_rank(cfg: DemoConfig, out_dir: Path, rank: int) -> dict[str, Any]:
    """``run_rank`` in a process group that is already up (tests run several demos in one launch)."""
    from perseus.gpu.sim.device import SimulatedGPU
    from perseus_torch import enable

    gpu = SimulatedGPU(rank, reset_state=True, **cfg.sim_gpu)
    schedule, stages, _ = build_pipeline(cfg, rank)
    compute: list[SimulatedCompute] = []

    def wrap(runtime: Any) -> SimulatedCompute:
        compute.append(SimulatedCompute(runtime, gpu, cfg.nominal_s(rank)))
        return compute[-1]

    section = {**cfg.perseus, "gpu": "sim", "device_index": rank, "sim_gpu": cfg.sim_gpu}
    handle = enable(schedule, stages, section, model_config={"demo": "tiny-linear", "hidden": cfg.hidden_size},
                    listener_wrapper=wrap)
    try:
        records, summary = run_phases(train_step_fn(cfg, schedule, stages), compute, handle, cfg)
    finally:
        handle.close()
        gpu.close()
    return save_rank_result(out_dir, rank, rank, 0, records, summary)


def launch(cfg: DemoConfig, out_dir: Path, timeout_s: float = 900) -> list[dict[str, Any]]:
    """Run the demo under torchrun (one process per pipeline rank) and collect every rank's result."""
    return launch_demo("perseus_demo.torch_demo", cfg, out_dir, {}, timeout_s)


def main(argv: list[str] | None = None) -> None:
    demo_main(argv, doc=__doc__ or "", config_cls=DemoConfig, run_rank=run_rank, launch=launch,
              title="torch.distributed.pipelining Schedule1F1B")


if __name__ == "__main__":
    main()
