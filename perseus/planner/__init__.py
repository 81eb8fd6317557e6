"""Frontier planner: profile + schedule → iteration time–energy Pareto frontier."""

from perseus.planner.api import plan_frontier

__all__ = ["plan_frontier"]
