"""Which DeepSpeed versions the pipeline hooks support, checked loudly.

The hooks rely on a few names inside ``deepspeed.runtime.pipe``: the engine's instruction map,
``_exec_schedule``, ``train_batch`` and ``TrainSchedule._step_to_micro_batch``. A version that
renamed any of them must fail at install time with the version and the missing pieces named,
never train silently unhooked (the runtime would then profile and plan nothing).
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

from perseus import versions
from perseus.errors import PerseusError

# The release lines the hooks were tested on (perseus/versions.py, the one table).
TESTED_VERSIONS = versions.supported("deepspeed").lines_text

ENGINE_METHODS = ("_exec_schedule", "train_batch", "eval_batch", "_exec_forward_pass", "_exec_backward_pass")
ENGINE_ATTRIBUTES = ("stage_id", "num_stages", "micro_batches", "grid")
SCHEDULE_METHODS = ("_step_to_micro_batch", "_buffer_idx", "_valid_micro_batch", "num_pipe_buffers")
GRID_METHODS = (
    "get_data_parallel_rank", "get_data_parallel_world_size", "get_slice_parallel_rank",
    "get_slice_parallel_world_size", "get_global_rank",
)


class DeepSpeedVersionError(PerseusError):
    """The installed DeepSpeed lacks what the Perseus hooks need."""


class UnsupportedDeepSpeedFeature(PerseusError):
    """The engine runs something the hooks cannot observe (not a TrainSchedule pipeline)."""


def deepspeed_version() -> str:
    """Installed DeepSpeed version, or a clear error if it is not installed."""
    try:
        import deepspeed
    except ImportError as exc:
        raise DeepSpeedVersionError(
            f"deepspeed is not importable ({exc}); install it with: pip install 'perseus-energy[deepspeed]'"
        ) from None
    return str(getattr(deepspeed, "__version__", "unknown"))


def missing_hook_points(engine_module: ModuleType, schedule_module: ModuleType) -> list[str]:
    """Hook points absent from DeepSpeed's pipe engine and schedule modules, as readable phrases."""
    missing: list[str] = []
    engine_cls = getattr(engine_module, "PipelineEngine", None)
    if engine_cls is None:
        return ["class deepspeed.runtime.pipe.engine.PipelineEngine"]
    for name in ENGINE_METHODS:
        if not callable(getattr(engine_cls, name, None)):
            missing.append(f"method PipelineEngine.{name}")
    instruction_map = getattr(engine_cls, "_INSTRUCTION_MAP", None)
    if not isinstance(instruction_map, dict):
        missing.append("dict PipelineEngine._INSTRUCTION_MAP")
    for name in ("ForwardPass", "BackwardPass", "TrainSchedule", "PipeSchedule"):
        cls = getattr(schedule_module, name, None)
        if cls is None:
            missing.append(f"class deepspeed.runtime.pipe.schedule.{name}")
        elif name in ("ForwardPass", "BackwardPass") and isinstance(instruction_map, dict) and cls not in instruction_map:
            missing.append(f"PipelineEngine._INSTRUCTION_MAP entry for {name}")
    train_schedule = getattr(schedule_module, "TrainSchedule", None)
    if train_schedule is not None:
        missing.extend(
            f"method TrainSchedule.{name}" for name in SCHEDULE_METHODS if not callable(getattr(train_schedule, name, None))
        )
    return missing


def load_pipe_modules() -> tuple[ModuleType, ModuleType]:
    """DeepSpeed's pipe ``engine`` and ``schedule`` modules, after checking every hook point."""
    version = deepspeed_version()
    try:
        from deepspeed.runtime.pipe import engine as engine_module
        from deepspeed.runtime.pipe import schedule as schedule_module
    except ImportError as exc:
        raise DeepSpeedVersionError(
            f"deepspeed {version}: cannot import deepspeed.runtime.pipe ({exc}); Perseus supports deepspeed {TESTED_VERSIONS}"
        ) from None
    missing = missing_hook_points(engine_module, schedule_module)
    if missing:
        raise DeepSpeedVersionError(
            f"deepspeed {version} is not supported by the Perseus pipeline hooks (tested: {TESTED_VERSIONS}); "
            f"missing: {'; '.join(missing)}. Install deepspeed {TESTED_VERSIONS} or report this version"
        )
    if versions.problem("deepspeed", version) is not None:
        warnings.warn(
            f"deepspeed {version} has the hook points Perseus needs but is untested (tested: {TESTED_VERSIONS}); "
            "check the recorded instruction order with tests/deepspeed before relying on it",
            stacklevel=3,
        )
    return engine_module, schedule_module


def check_engine(engine: Any, engine_module: ModuleType) -> None:
    """Refuse engines whose compute the hooks would not see: non-pipeline engines, DualPipeV."""
    version = deepspeed_version()
    if not isinstance(engine, engine_module.PipelineEngine):
        raise UnsupportedDeepSpeedFeature(
            f"{type(engine).__name__} is not a DeepSpeed PipelineEngine; Perseus plans pipeline-parallel training "
            "only: pass a deepspeed.pipe.PipelineModule to deepspeed.initialize"
        )
    dualpipe = _dualpipev_engine_class()
    if dualpipe is not None and isinstance(engine, dualpipe):
        raise UnsupportedDeepSpeedFeature(
            "DualPipeV overlaps forward and backward of different microbatches in one step, which Perseus cannot "
            "time or plan separately; use a plain PipelineModule (TrainSchedule)"
        )
    absent = [name for name in ENGINE_ATTRIBUTES if not hasattr(engine, name)]
    grid = getattr(engine, "grid", None)
    absent += [f"grid.{name}()" for name in GRID_METHODS if grid is not None and not callable(getattr(grid, name, None))]
    if absent:
        raise DeepSpeedVersionError(
            f"deepspeed {version}: the PipelineEngine lacks {', '.join(absent)} that Perseus reads "
            f"(tested: {TESTED_VERSIONS}); install deepspeed {TESTED_VERSIONS} or report this version"
        )


def _dualpipev_engine_class() -> type | None:
    try:
        from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine
    except ImportError:
        return None
    return DualPipeVEngine
