"""Frontier planner: profile + schedule → iteration time–energy Pareto frontier.

``plan_frontier`` is imported lazily: it pulls in scipy/HiGHS, which code that only needs the
settings (``PlannerOptions``, e.g. the runtime's config check) should not pay for.
"""

from typing import TYPE_CHECKING, Any

from perseus.planner.settings import PlannerOptions

if TYPE_CHECKING:
    from perseus.planner.api import plan_frontier

__all__ = ["PlannerOptions", "plan_frontier"]


def __getattr__(name: str) -> Any:
    if name == "plan_frontier":
        from perseus.planner.api import plan_frontier

        return plan_frontier
    raise AttributeError(f"module 'perseus.planner' has no attribute {name!r}")
