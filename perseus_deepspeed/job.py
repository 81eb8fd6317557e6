"""This rank's ``PipelineJob`` and ``"perseus"`` config section, read from a DeepSpeed ``PipelineEngine``."""

from __future__ import annotations

from typing import Any, Mapping

from perseus.errors import ConfigError
from perseus.runtime import PerseusConfig, PipelineJob, describe_value, stage_fingerprint, value_digest

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


def layer_specs(module: Any) -> list[Any]:
    """Every layer of a ``PipelineModule``, all stages' (every rank holds the whole list), as the
    cache key sees it: a ``LayerSpec``/``TiedLayerSpec`` by its class and arguments (and its tie), a
    module instance by its class and its parameters' names, shapes and dtypes, a function by its
    qualified name (``perseus.runtime.describe_value``). So ``AlexNet(num_classes=10)`` and
    ``AlexNet(num_classes=1000)`` differ, given as specs or as instances."""
    out: list[Any] = []
    for spec in getattr(module, "_layer_specs", None) or []:
        if hasattr(spec, "typename"):  # LayerSpec and TiedLayerSpec
            entry = {"spec": type(spec).__name__, "typename": describe_value(spec.typename),
                     "args": describe_value(list(getattr(spec, "module_args", ()))),
                     "kwargs": describe_value(dict(getattr(spec, "module_kwargs", {})))}
            if hasattr(spec, "key"):
                entry.update(tied=str(spec.key), forward_fn=describe_value(getattr(spec, "forward_fn", None)),
                             tied_weight_attr=describe_value(getattr(spec, "tied_weight_attr", None)))
            out.append(entry)
        else:
            out.append(describe_value(spec))
    return out


def model_fingerprint(engine: Any) -> dict[str, Any]:
    """What besides the schedule determines the measured profile (hashed into the runtime's cache
    key; docs/deepspeed.md lists it). The same on every rank; this stage's own parameters are
    ``stage_fingerprint``'s."""
    module = engine.module
    specs = layer_specs(module)
    return {
        "framework": "deepspeed",
        "micro_batch_size": int(engine.train_micro_batch_size_per_gpu()),
        "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
        "layers": len(specs),
        "layer_specs": value_digest(specs),
        "partition": [int(p) for p in getattr(module, "parts", [])],
        "fp16": bool(engine.fp16_enabled()),
        "bf16": bool(engine.bfloat16_enabled()),
        "activation_checkpoint_interval": int(getattr(module, "activation_checkpoint_interval", 0) or 0),
        "loss_fn": value_digest(getattr(module, "loss_fn", None)),
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
        stage_fingerprint=stage_fingerprint([engine.module]),
    )
