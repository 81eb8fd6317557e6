"""Perseus: remove energy bloat from pipeline-parallel training with per-instruction GPU frequencies.

The names a user types are here, loaded on first use (so ``import perseus`` stays cheap and pulls
in neither numba nor torch): profiles, schedules, the planner and frontier files. Training hooks
live in the adapters (``perseus_megatron``, ``perseus_deepspeed``, ``perseus_torch``) and the
runtime they drive (``perseus.runtime``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "Profile": "perseus.profile",
    "load_profile": "perseus.profile",
    "Schedule": "perseus.schedules",
    "build_schedule": "perseus.schedules",
    "SCHEDULES": "perseus.schedules",
    "PlannerOptions": "perseus.planner",
    "plan_frontier": "perseus.planner",
    "Frontier": "perseus.frontier",
    "load_frontier": "perseus.frontier",
    "save_frontier": "perseus.frontier",
    "PerseusError": "perseus.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from perseus.errors import PerseusError as PerseusError
    from perseus.frontier import Frontier as Frontier, load_frontier as load_frontier, save_frontier as save_frontier
    from perseus.planner import PlannerOptions as PlannerOptions, plan_frontier as plan_frontier
    from perseus.profile import Profile as Profile, load_profile as load_profile
    from perseus.schedules import SCHEDULES as SCHEDULES, Schedule as Schedule, build_schedule as build_schedule


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perseus' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
