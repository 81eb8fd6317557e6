"""This rank's ``PipelineJob`` and ``"perseus"`` config section, read from a DeepSpeed ``PipelineEngine``."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from perseus.errors import ConfigError
from perseus.runtime import PerseusConfig, PipelineJob

SECTION = "perseus"


def raw_config(engine: Any) -> Mapping[str, Any]:
    """The DeepSpeed config as the user wrote it (a dict, file or base64 string, already parsed).

    In DeepSpeed 0.19 ``engine._config._param_dict`` is the parsed top-level dict (unknown keys
    kept); ``engine.config`` is what was handed to the engine, a dict after ``deepspeed.initialize``.
    """
    parsed = getattr(getattr(engine, "_config", None), "_param_dict", None)
    if isinstance(parsed, Mapping):
        return parsed
    given = getattr(engine, "config", None)
    return given if isinstance(given, Mapping) else {}


def perseus_section(engine: Any) -> PerseusConfig:
    """The validated ``"perseus"`` section; absent means Perseus is off (``enabled: false``)."""
    section = raw_config(engine).get(SECTION)
    if section is None:
        return PerseusConfig.from_dict({"enabled": False})
    if not isinstance(section, Mapping):
        raise ConfigError(
            f'the DeepSpeed config\'s "{SECTION}" section must be an object of settings, got {type(section).__name__}'
        )
    return PerseusConfig.from_dict(section)


def model_fingerprint(engine: Any) -> dict[str, Any]:
    """What besides the schedule determines the measured profile (hashed into the runtime's cache key)."""
    module = engine.module
    specs = getattr(module, "_layer_specs", None) or []
    layers = "\n".join(repr(spec) if hasattr(spec, "typename") else type(spec).__name__ for spec in specs)
    return {
        "framework": "deepspeed",
        "micro_batch_size": int(engine.train_micro_batch_size_per_gpu()),
        "layers": len(specs),
        "layers_sha1": hashlib.sha1(layers.encode()).hexdigest()[:16],
        "partition": [int(p) for p in getattr(module, "parts", [])],
        "fp16": bool(engine.fp16_enabled()),
        "bf16": bool(engine.bfloat16_enabled()),
        "activation_checkpoint_interval": int(getattr(module, "activation_checkpoint_interval", 0) or 0),
    }


def job_from_engine(engine: Any, model_config: Mapping[str, Any] | None = None) -> PipelineJob:
    """Stage, pipeline size, microbatches, data- and tensor-(slice-)parallel position from the engine's grid.

    ``model_config`` adds to the automatic fingerprint (e.g. sequence length, which the engine
    cannot see), so a profile is never reused for a differently shaped model.
    """
    grid = engine.grid
    return PipelineJob(
        num_stages=int(engine.num_stages),
        num_microbatches=int(engine.micro_batches),
        stage=int(engine.stage_id),
        schedule="1f1b",
        dp_rank=int(grid.get_data_parallel_rank()),
        dp_size=int(grid.get_data_parallel_world_size()),
        tp_rank=int(grid.get_slice_parallel_rank()),
        tp_size=int(grid.get_slice_parallel_world_size()),
        rank=int(grid.get_global_rank()),
        world_size=int(getattr(grid, "world_size", 1)),
        model_config={**model_fingerprint(engine), **dict(model_config or {})},
    )
