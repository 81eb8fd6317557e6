"""Frontier planner: profile + schedule → iteration time–energy Pareto frontier."""

from perseus.planner.api import plan_frontier
from perseus.planner.settings import PlannerOptions

__all__ = ["PlannerOptions", "plan_frontier"]
