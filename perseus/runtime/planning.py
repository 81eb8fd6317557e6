"""Background planning: rank 0 plans in a thread while training goes on at default clocks.

Every rank asks at every step end (``share_outcome``), so all ranks learn at the same step that
the plan is ready (or failed) and switch together; only rank 0 has a planner.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from perseus.frontier import Frontier
from perseus.planner import PlannerOptions, plan_frontier
from perseus.profile import Profile
from perseus.runtime.collective import Collective, decode_frontier, encode_frontier
from perseus.schedule import Schedule

# Planning status broadcast from rank 0 every step while a plan is pending.
PENDING, READY, FAILED = 0, 1, 2


class BackgroundPlanner:
    """One ``plan_frontier`` call in a daemon thread; its result or its error, once done."""

    def __init__(self, schedule: Schedule, profile: Profile, options: PlannerOptions) -> None:
        self.result: Frontier | None = None
        self.error: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(schedule, profile, options), name="perseus-planner", daemon=True
        )
        self._thread.start()

    def _run(self, schedule: Schedule, profile: Profile, options: PlannerOptions) -> None:
        try:
            self.result = plan_frontier(schedule, profile, options)
        except Exception as exc:  # noqa: BLE001 - reported to every rank as a warning
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()

    @property
    def status(self) -> int:
        if not self._done.is_set():
            return PENDING
        return READY if self.result is not None else FAILED


@dataclass(frozen=True)
class PlanOutcome:
    """What every rank learns once rank 0's planning is over: the frontier, or why there is none.

    ``planned`` is rank 0's own frontier object (with its solve time), for logging and the cache.
    """

    frontier: Frontier | None
    error: str | None = None
    planned: Frontier | None = None


def share_outcome(collective: Collective, planner: BackgroundPlanner | None) -> PlanOutcome | None:
    """Collective, every rank at the same step: ``None`` while rank 0 is still planning."""
    status = planner.status if collective.is_root and planner is not None else PENDING
    status = collective.broadcast_int(status)
    if status == PENDING:
        return None
    if status == FAILED:
        message = collective.broadcast_object(planner.error if planner is not None else None)
        return PlanOutcome(None, message)
    planned = planner.result if collective.is_root and planner is not None else None
    encoded = collective.broadcast_object(encode_frontier(planned) if planned is not None else None)
    return PlanOutcome(decode_frontier(encoded), planned=planned)
