"""Perseus in TorchTitan's own trainer: a ``perseus`` section in its job config and the call site.

TorchTitan (0.3) configures a job with a ``Trainer.Config`` that a ``config_registry`` function
returns (``--module M --config F``), overridden on the command line as ``--<section>.<field>``; its
extension mechanism is a ``Trainer`` subclass whose nested ``Config`` adds fields, built by
``config.build()``. ``PerseusTrainer`` is that subclass: its ``Config`` adds the ``perseus``
section (``titan_section.PerseusSection``: every ``PerseusConfig`` setting, ``--perseus.<field>``),
and its ``__init__`` calls ``attach`` once ``Trainer.__init__`` has built the pipeline schedule
(``pp_schedule``), which is where ``perseus_torch.enable`` goes: after the schedule exists, before
the first ``train_step``. ``close`` restores default clocks before TorchTitan closes its own parts.

Two ways to a job config with the section:

- ``--module perseus_torch.torchtitan --config <any shipped config function>`` (e.g.
  ``llama3_debugmodel``): the shipped function's config with a ``perseus`` section added;
- a ``config_registry`` function of one's own returning ``with_perseus(llama3_8b(), mode="run", ...)``.

The rank's place (stage, data-parallel pipeline, tensor-parallel group) comes from TorchTitan's
parallel degrees (``titan_mesh.py``); a layout Perseus cannot follow is refused in one line. A
custom ``Trainer`` subclass (an experiment's) adds a ``perseus: PerseusSection`` field to its own
``Config`` and calls ``attach(self)`` at the end of its ``__init__``.

Importing this module imports TorchTitan (and torch).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.distributed as dist
from torchtitan.trainer import Trainer

from perseus.errors import ConfigError
from perseus.runtime import WandbSink
from perseus_torch.integration import TorchPerseus, enable
from perseus_torch.titan_mesh import TitanDegrees, mesh_position
from perseus_torch.titan_section import PerseusSection, section_config

__all__ = ["PerseusSection", "PerseusTrainer", "attach", "with_perseus"]


class PerseusTrainer(Trainer):
    """TorchTitan's ``Trainer`` with Perseus attached to its pipeline schedule."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        perseus: PerseusSection = field(default_factory=PerseusSection)  # type: ignore[valid-type]  # made at import
        """Perseus's settings (``--perseus.<field>``; docs/torch-pipelining.md)"""

    def __init__(self, config: Config) -> None:
        self.perseus: TorchPerseus | None = None
        super().__init__(config)
        self.perseus = attach(self)

    def close(self) -> None:
        perseus, self.perseus = self.perseus, None
        try:
            if perseus is not None:
                perseus.close()
        finally:
            super().close()


def attach(trainer: Any, section: Any = None) -> TorchPerseus | None:
    """Start Perseus on ``trainer``'s pipeline schedule (every rank, after ``Trainer.__init__``);
    None when the section disables it. ``section``: default ``trainer.config.perseus``."""
    config = section_config(section if section is not None else trainer.config.perseus)
    if not config.enabled:
        return None
    mode = trainer.config.comm.mode
    if mode in ("fake_backend", "local_tensor"):
        raise ConfigError(f"perseus_torch.torchtitan: comm mode {mode!r} runs no real ranks; Perseus needs a real "
                          "training run (--perseus.enabled False for dry runs)")
    rank = dist.get_rank() if dist.is_initialized() else 0
    where = mesh_position(rank, TitanDegrees.of(trainer.parallel_dims))
    training, parallelism = trainer.config.training, trainer.config.parallelism
    spec = trainer.config.model_spec
    model = {"torchtitan": getattr(spec, "name", None), "flavor": getattr(spec, "flavor", None),
             "seq_len": training.seq_len, "local_batch_size": training.local_batch_size,
             "microbatch_size": parallelism.pipeline_parallel_microbatch_size, "dtype": training.dtype,
             "degrees": dataclasses.asdict(TitanDegrees.of(trainer.parallel_dims))}
    handle = enable(trainer.pp_schedule, None, config, dp_rank=where.dp_rank, dp_size=where.dp_size,
                    tp_rank=where.tp_rank, tp_size=where.tp_size, model_config=model)
    stage = handle.job.stage if handle.job is not None else where.stage
    if stage != where.stage:
        handle.close()
        raise ConfigError(f"perseus_torch.torchtitan: the device mesh puts rank {rank} in stage {where.stage} but its "
                          f"pipeline schedule runs stage {stage}; TorchTitan's mesh layout changed")
    loggers = getattr(trainer.metrics_processor.logger, "number_of_loggers", 0)
    if loggers and handle.runtime is not None and getattr(handle.runtime, "enabled", False):
        # TorchTitan's TensorBoard / W&B loggers (on its metrics rank) at its own step numbers
        handle.runtime.add_metrics_sink(WandbSink(trainer.metrics_processor.logger, lambda _: trainer.step))
    return handle


def with_perseus(base: Any, **settings: Any) -> Any:
    """``base`` (a ``Trainer.Config``) as a ``PerseusTrainer.Config`` with ``settings`` in its
    ``perseus`` section (``PerseusConfig`` field names)."""
    if type(base) is not Trainer.Config:
        raise ConfigError(f"with_perseus: {type(base).__qualname__} belongs to a custom trainer; add a "
                          "`perseus: PerseusSection` field to its Config and call "
                          "perseus_torch.torchtitan.attach(self) at the end of its __init__")
    try:
        section = PerseusSection(**settings)
    except TypeError:
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(PerseusSection)})
        raise ConfigError(f"with_perseus: unknown setting(s) {', '.join(unknown)}; the names are PerseusConfig's "
                          "fields (docs/reference/config.md)") from None
    section_config(section)  # a bad value fails here, where the config is written
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return PerseusTrainer.Config(**values, perseus=section)


def _shipped(name: str) -> Callable[[], Any] | None:
    """The config function ``name`` of a model TorchTitan ships (its name begins with the model's)."""
    from torchtitan.models import _supported_models

    for model in sorted(_supported_models, key=len, reverse=True):
        if name.startswith(model + "_") or name == model:
            fn = getattr(importlib.import_module(f"torchtitan.models.{model}.config_registry"), name, None)
            return fn if callable(fn) else None
    return None


def __getattr__(name: str) -> Callable[[], Any]:
    """``--module perseus_torch.torchtitan --config llama3_debugmodel``: a shipped config function's
    config with a ``perseus`` section (set it with ``--perseus.<field>``)."""
    fn = None if name.startswith("_") else _shipped(name)
    if fn is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    shipped = fn

    def config() -> Any:
        return with_perseus(shipped())

    config.__name__ = config.__qualname__ = name
    config.__doc__ = f"TorchTitan's {name} with a perseus section."
    return config
