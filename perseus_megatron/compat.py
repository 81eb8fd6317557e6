"""Which megatron-core versions and features the schedule hooks support, checked loudly.

The hooks rely on a handful of names and signatures inside
``megatron.core.pipeline_parallel.schedules``. A version that moved them must fail at install
time with the version and the missing pieces named, never run silently unhooked (the runtime
would then profile and plan nothing).
"""

from __future__ import annotations

import ast
import inspect
import warnings
from types import ModuleType
from typing import Any

from perseus import versions
from perseus.errors import PerseusError

# Release lines whose schedules.py was checked against the hook points below (perseus/versions.py,
# the one table). Other versions run when the hook-point check passes, with a warning.
SUPPORTED_VERSIONS = versions.supported("megatron-core").lines_text
TESTED_VERSIONS = SUPPORTED_VERSIONS

SCHEDULE_FUNCTIONS: dict[str, str] = {
    "forward_backward_no_pipelining": "1f1b",
    "forward_backward_pipelining_without_interleaving": "1f1b",
    "forward_backward_pipelining_with_interleaving": "interleaved",
}
# The schedule functions that run megatron-core's combined 1F1B when overlap_moe_expert_parallel_comm
# is on (without interleaving, a pipeline cannot have it: TransformerConfig asks for virtual stages).
COMBINED_SCHEDULE_FUNCTIONS = ("forward_backward_no_pipelining", "forward_backward_pipelining_with_interleaving")
STEP_FUNCTIONS = ("forward_step", "backward_step")
HOOK_POINTS = (*STEP_FUNCTIONS, *SCHEDULE_FUNCTIONS)

# Exactly what the wrappers in hooks.py read, and nothing else: forward_step's microbatch and chunk
# keywords; backward_step's output tensor as its second positional argument (the tracker matches
# it to its forward; core 0.17 dropped ``model_type`` after it, which the wrapper never used);
# the schedule functions' keywords that give the step's shape.
_REQUIRED_PARAMETERS: dict[str, tuple[str, ...]] = {
    "forward_step": ("current_microbatch", "vp_stage"),
    "backward_step": ("output_tensor",),
    **{name: ("model", "num_microbatches", "forward_only") for name in SCHEDULE_FUNCTIONS},
}
# Parameters that must sit at a fixed position because the wrapper reads them positionally.
_POSITIONAL: dict[str, dict[str, int]] = {"backward_step": {"output_tensor": 1}}

# megatron-core's combined 1F1B (overlap_moe_expert_parallel_comm) runs every unit, warm-up
# forwards and cool-down backwards included, through combined_1f1b.combined_forward_backward_step,
# never forward_step/backward_step. The wrapper reads the forward's and the backward's models and
# the backward's output tensor (to find its forward, as backward_step's) at these positions, and
# the forward's microbatch and chunk by keyword. Checked the same way as the schedule hook points.
COMBINED_STEP = "combined_forward_backward_step"
COMBINED_POSITIONAL = {"f_model": 2, "b_model": 6, "b_output_tensor": 8}
COMBINED_KEYWORDS = ("f_model_chunk_id", "current_microbatch")


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


def _missing(name: str, params: tuple[str, ...] | None) -> str | None:
    if params is None:
        return f"function schedules.{name}"
    absent = [p for p in _REQUIRED_PARAMETERS[name] if p not in params]
    if absent:
        return f"parameter(s) {', '.join(absent)} of schedules.{name}"
    for param, index in _POSITIONAL.get(name, {}).items():
        if params.index(param) != index:
            return f"parameter {param} of schedules.{name} at position {index + 1} (found at {params.index(param) + 1})"
    return None


def combined_step_problem(fn: Any) -> str | None:
    """Why ``combined_forward_backward_step`` cannot be hooked (absent, or parameters moved), or None."""
    if not callable(fn):
        return f"function combined_1f1b.{COMBINED_STEP}"
    params = _parameters(fn)
    for name, index in COMBINED_POSITIONAL.items():
        if name not in params or params.index(name) != index:
            return f"parameter {name} of combined_1f1b.{COMBINED_STEP} at position {index + 1}"
    absent = [name for name in COMBINED_KEYWORDS if name not in params]
    return f"parameter(s) {', '.join(absent)} of combined_1f1b.{COMBINED_STEP}" if absent else None


def load_combined_module() -> tuple[ModuleType | None, str | None]:
    """megatron-core's ``combined_1f1b`` module and why its step cannot be hooked (None: it can)."""
    try:
        from megatron.core.pipeline_parallel import combined_1f1b
    except ImportError as exc:
        return None, f"megatron.core.pipeline_parallel.combined_1f1b is not importable ({exc})"
    return combined_1f1b, combined_step_problem(getattr(combined_1f1b, COMBINED_STEP, None))


def missing_hook_points(schedules: ModuleType) -> list[str]:
    """Hook points absent from ``schedules`` or with an unexpected signature, as readable phrases.

    This check, not the version number, decides whether the hooks install: a release outside
    the supported lines (upstream main, say) runs when it passes, with a warning.
    """
    missing: list[str] = []
    for name in HOOK_POINTS:
        fn = getattr(schedules, name, None)
        problem = _missing(name, _parameters(fn) if callable(fn) else None)
        if problem:
            missing.append(problem)
    return missing


def missing_hook_points_in_source(source: str) -> list[str]:
    """The same check on the text of a ``schedules.py`` (read, not imported: no torch needed)."""
    tree = ast.parse(source)
    functions = {node.name: node.args for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing: list[str] = []
    for name in HOOK_POINTS:
        args = functions.get(name)
        params = None if args is None else tuple(
            a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
        )
        problem = _missing(name, params)
        if problem:
            missing.append(problem)
    return missing


def is_supported_version(version: str) -> bool:
    """True for the release lines Perseus supports (``SUPPORTED_VERSIONS``)."""
    return versions.problem("megatron-core", version) is None


def load_schedules_module() -> ModuleType:
    """Import megatron-core's schedules module and check every hook point; raise if any is missing."""
    version = megatron_core_version()
    try:
        from megatron.core.pipeline_parallel import schedules
    except ImportError as exc:
        raise MegatronVersionError(
            f"megatron-core {version}: cannot import megatron.core.pipeline_parallel.schedules ({exc}); "
            f"Perseus supports megatron-core {SUPPORTED_VERSIONS}"
        ) from None
    missing = missing_hook_points(schedules)
    if missing:
        raise MegatronVersionError(
            f"megatron-core {version} is not supported by the Perseus schedule hooks (supported: {SUPPORTED_VERSIONS}); "
            f"missing: {'; '.join(missing)}. Install megatron-core {SUPPORTED_VERSIONS} or report this version"
        )
    if not is_supported_version(version):
        warnings.warn(
            f"megatron-core {version} has the hook points Perseus needs but is outside the supported releases "
            f"({SUPPORTED_VERSIONS}); "
            "check the recorded instruction order with perseus_megatron's tests before relying on it",
            stacklevel=3,
        )
    return schedules


def check_call_supported(kwargs: dict[str, Any]) -> None:
    """Refuse schedule calls whose steps bypass ``forward_step``/``backward_step`` (core 0.19+)."""
    collection = kwargs.get("pg_collection")
    if type(collection).__name__ == "MultiModuleProcessGroupCollection":
        raise UnsupportedMegatronFeature(
            "multi-module pipelines (MultiModuleProcessGroupCollection) run backward_step_multimodule, which "
            "the Perseus hooks do not observe; run without Perseus"
        )


def check_step_supported(config: Any, forward_only: bool, combined_problem: str | None = None) -> None:
    """Refuse configurations whose compute the forward/backward hooks would not see.

    Called at the beginning of every training forward-backward call (the config can change).
    ``combined_problem``: why the combined 1F1B step could not be hooked (None: it is).
    """
    if forward_only:
        return
    if getattr(config, "overlap_moe_expert_parallel_comm", False) and combined_problem is not None:
        raise UnsupportedMegatronFeature(
            "overlap_moe_expert_parallel_comm (MoE combined 1F1B schedule) runs its units through "
            f"combined_forward_backward_step, which this megatron-core lacks as Perseus expects ({combined_problem}); "
            "disable it or run without Perseus"
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
