"""One rank of TorchTitan's own trainer (``torchtitan.train.main``) on CPU, for test_torchtitan.py.

TorchTitan 0.3 targets a newer torch than 2.13 and a GPU; three gaps are bridged here, each as small
as it can be and none in Perseus's path:

- device: ``torchtitan.tools.utils`` takes ``cuda`` when torch finds no accelerator; torch is told
  the device is ``cpu`` before TorchTitan is imported, and ``torch.cpu`` gets the few calls its
  memory monitor and barrier make (device name, properties, memory stats, an index);
- ``PipelineSchedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)``: TorchTitan hands the schedule
  its microbatches; torch 2.13's ``step`` takes a whole batch and splits it, so a step given
  microbatches runs them through the schedule's own ``_step_microbatches``;
- ``torch.distributed.set_timeout`` (TorchTitan shortens the timeouts after the first step): a no-op.

Each rank writes its Perseus summary to ``$TITAN_OUT/rank<N>.json`` when the trainer closes.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

import torch
import torch._utils

torch._utils._get_available_device_type = lambda: "cpu"
for name, value in {"get_device_name": lambda device=None: "cpu",
                    "get_device_properties": lambda device=None: types.SimpleNamespace(
                        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), name="cpu"),
                    "memory_stats": lambda device=None: {}, "reset_peak_memory_stats": lambda device=None: None,
                    "empty_cache": lambda: None}.items():
    if not hasattr(torch.cpu, name):
        setattr(torch.cpu, name, value)
torch.cpu.current_device = lambda: 0  # an index for barrier(device_ids=...); torch.cpu's says "cpu"
if not hasattr(torch.distributed, "set_timeout"):
    torch.distributed.set_timeout = lambda timeout, group=None: None

from torch.distributed.pipelining import schedules


def _microbatch_step(original: Any) -> Any:
    def step(self: Any, *args: Any, arg_mbs: Any = None, kwarg_mbs: Any = None, target_mbs: Any = None,
             losses: Any = None, return_outputs: bool = True, loss_kwargs: Any = None, **kwargs: Any) -> Any:
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return original(self, *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs,
                            **kwargs)
        for stage in getattr(self, "_stages", None) or [self._stage]:  # what step() does before it splits
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)
        return None

    return step


for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
    cls.step = _microbatch_step(cls.step)

from perseus_torch.torchtitan import PerseusTrainer

_close = PerseusTrainer.close


def _close_and_save(self: Any) -> None:
    if self.perseus is not None:
        out = Path(os.environ["TITAN_OUT"]) / f"rank{torch.distributed.get_rank()}.json"
        job = self.perseus.job
        where = {"stage": job.stage, "num_stages": job.num_stages, "dp_rank": job.dp_rank, "dp_size": job.dp_size,
                 "tp_rank": job.tp_rank, "tp_size": job.tp_size, "schedule": job.schedule}
        out.write_text(json.dumps({"summary": self.perseus.summary(), "job": where}, default=str))
    _close(self)


PerseusTrainer.close = _close_and_save

from torchtitan.train import main

main()
