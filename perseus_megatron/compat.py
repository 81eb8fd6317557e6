"""Which megatron-core versions and features the schedule hooks support, checked loudly.

The hooks rely on a handful of names and signatures inside
``megatron.core.pipeline_parallel.schedules``. A version that moved them must fail at install
time with the version and the missing pieces named, never run silently unhooked (the runtime
would then profile and plan nothing).
"""

from __future__ import annotations

import inspect
import warnings
from types import ModuleType
from typing import Any

from perseus.errors import PerseusError

TESTED_VERSIONS = "0.16.x"
_TESTED_PREFIX = "0.16."

SCHEDULE_FUNCTIONS: dict[str, str] = {
    "forward_backward_no_pipelining": "1f1b",
    "forward_backward_pipelining_without_interleaving": "1f1b",
    "forward_backward_pipelining_with_interleaving": "interleaved",
}
STEP_FUNCTIONS = ("forward_step", "backward_step")
HOOK_POINTS = (*STEP_FUNCTIONS, *SCHEDULE_FUNCTIONS)

_REQUIRED_PARAMETERS: dict[str, tuple[str, ...]] = {
    "forward_step": ("current_microbatch", "vp_stage"),
    "backward_step": ("input_tensor", "output_tensor", "output_tensor_grad", "model_type", "config"),
    **{name: ("model", "num_microbatches", "forward_only") for name in SCHEDULE_FUNCTIONS},
}


class MegatronVersionError(PerseusError):
    """The installed megatron-core lacks what the Perseus hooks need."""


class UnsupportedMegatronFeature(PerseusError):
    """The training configuration uses a Megatron feature the hooks cannot observe."""


def megatron_core_version() -> str:
    """Installed megatron-core version, or a clear error if it is not installed."""
    try:
        import megatron.core
    except ImportError as exc:
        raise MegatronVersionError(
            f"megatron-core is not importable ({exc}); install it with: pip install 'perseus-energy[megatron]'"
        ) from None
    return str(getattr(megatron.core, "__version__", "unknown"))


def _parameters(fn: Any) -> tuple[str, ...]:
    target = getattr(fn, "__wrapped__", fn)
    try:
        return tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return ()


def missing_hook_points(schedules: ModuleType) -> list[str]:
    """Hook points absent from ``schedules`` or with an unexpected signature, as readable phrases."""
    missing: list[str] = []
    for name in HOOK_POINTS:
        fn = getattr(schedules, name, None)
        if not callable(fn):
            missing.append(f"function schedules.{name}")
            continue
        params = _parameters(fn)
        absent = [p for p in _REQUIRED_PARAMETERS[name] if p not in params]
        if absent:
            missing.append(f"parameter(s) {', '.join(absent)} of schedules.{name}")
    return missing


def load_schedules_module() -> ModuleType:
    """Import megatron-core's schedules module and check every hook point; raise if any is missing."""
    version = megatron_core_version()
    try:
        from megatron.core.pipeline_parallel import schedules
    except ImportError as exc:
        raise MegatronVersionError(
            f"megatron-core {version}: cannot import megatron.core.pipeline_parallel.schedules ({exc}); "
            f"Perseus supports megatron-core {TESTED_VERSIONS}"
        ) from None
    missing = missing_hook_points(schedules)
    if missing:
        raise MegatronVersionError(
            f"megatron-core {version} is not supported by the Perseus schedule hooks (tested: {TESTED_VERSIONS}); "
            f"missing: {'; '.join(missing)}. Install megatron-core {TESTED_VERSIONS} or report this version"
        )
    if not version.startswith(_TESTED_PREFIX):
        warnings.warn(
            f"megatron-core {version} has the hook points Perseus needs but is untested (tested: {TESTED_VERSIONS}); "
            "check the recorded instruction order with perseus_megatron's tests before relying on it",
            stacklevel=3,
        )
    return schedules


def check_step_supported(config: Any, forward_only: bool) -> None:
    """Refuse configurations whose compute the forward/backward hooks would not see.

    Called at the beginning of every training forward-backward call (the config can change).
    """
    if forward_only:
        return
    if getattr(config, "overlap_moe_expert_parallel_comm", False):
        raise UnsupportedMegatronFeature(
            "overlap_moe_expert_parallel_comm (MoE combined 1F1B schedule) fuses forward and backward of "
            "different microbatches into one step that Perseus cannot time separately; disable it "
            "(--overlap-moe-expert-parallel-comm off) or run without Perseus"
        )
    if getattr(config, "hybrid_context_parallel", False):
        raise UnsupportedMegatronFeature(
            "hybrid_context_parallel reorders sub-samples outside the pipeline schedule Perseus plans; "
            "disable it or run without Perseus"
        )
    if getattr(config, "cuda_graph_impl", "none") == "local":
        scopes = getattr(config, "cuda_graph_scope", None) or []
        if any(getattr(scope, "name", scope) == "full_iteration" for scope in scopes):
            raise UnsupportedMegatronFeature(
                "full-iteration CUDA graphs (cuda_graph_scope=full_iteration) replay the whole iteration "
                "without running Python, so per-instruction frequency changes cannot happen; use per-layer "
                "CUDA graphs or none"
            )
