"""The numbers of ``perseus report``: per-phase medians, the deployed plan against the baseline
with its spread, and which frontier points a run deployed.

Medians and quartiles, because one iteration disturbed by something else on the node must not
decide the answer (docs/observability.md, "Saving and its spread").
"""

from __future__ import annotations

from collections import Counter
from statistics import median, quantiles
from typing import Any

from perseus.frontier import FrontierPoint
from perseus.output.run_data import DEPLOYED, Run, RunData, Step, is_deployed, point_times


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method) and range of a non-empty list."""
    if len(values) >= 2:
        q1, _, q3 = quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {"median": median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values), "n": len(values)}


def phase_rows(steps: list[Step]) -> list[dict[str, Any]]:
    """Per phase in order of first appearance: iterations, median time and energy."""
    order: list[str] = []
    for s in steps:
        if s.phase not in order:
            order.append(s.phase)
    rows = []
    for phase in order:
        sel = [s for s in steps if s.phase == phase]
        rows.append({"phase": phase, "iterations": len(sel), "time_s": median(s.time_s for s in sel),
                     "energy_j": median(s.energy_j for s in sel)})
    return rows


def comparison(steps: list[Step], baseline_phase: str) -> dict[str, Any] | None:
    """Deployed plan against the baseline phase (medians), with the spread over deployed iterations.

    Each deployed iteration's saving is ``1 - energy / median baseline energy`` and its time change
    ``time / median baseline time - 1``; the headline numbers are their medians (equal to the
    change of the medians). None when either phase has no iteration.
    """
    base = [s for s in steps if s.phase == baseline_phase]
    plan = [s for s in steps if s.phase == DEPLOYED]
    if not base or not plan:
        return None
    base_t, base_e = median(s.time_s for s in base), median(s.energy_j for s in base)
    return {
        "baseline_phase": baseline_phase,
        "baseline_time": spread([s.time_s for s in base]),
        "baseline_energy": spread([s.energy_j for s in base]),
        "deployed_time": spread([s.time_s for s in plan]),
        "deployed_energy": spread([s.energy_j for s in plan]),
        "saving": spread([1 - s.energy_j / base_e for s in plan]),
        "time_change": spread([s.time_s / base_t - 1 for s in plan]),
    }


def used_points(data: RunData) -> list[tuple[FrontierPoint, int, bool]]:
    """Frontier points the shown runs deployed: (point, deployed iterations, from the paced set).

    Matched by planned iteration time (``target_time_s`` of deployed steps, ``point`` events).
    """
    if data.frontier is None:
        return []
    counts = Counter(s.target_time_s for s in data.steps if is_deployed(s.phase) and s.target_time_s is not None)
    for _, time_s in point_times(data.events):
        counts.setdefault(time_s, 0)
    fr = data.frontier
    candidates = [(p, False) for p in fr.points] + [(p, True) for p in fr.paced_points]
    out: dict[int, list[Any]] = {}
    for target, n in counts.items():
        point, paced = min(candidates, key=lambda c: abs(c[0].time_s - target))
        if abs(point.time_s - target) > 1e-6 * max(abs(target), 1e-9):
            data.notes.append(f"planned time {target:.6g} s of the run matches no point of {data.frontier_path}")
            continue
        entry = out.setdefault(id(point), [point, 0, paced])
        entry[1] += n
    return sorted(((p, n, paced) for p, n, paced in out.values()), key=lambda x: x[0].time_s)


def first_deployed(data: RunData, used: list[tuple[FrontierPoint, int, bool]]) -> tuple[FrontierPoint, int]:
    """The point the shown runs deployed first (before any straggler switch) and its iterations."""
    first = next((s.target_time_s for s in data.steps if is_deployed(s.phase) and s.target_time_s is not None), None)
    if first is None:
        return used[0][0], used[0][1]
    point, n, _ = min(used, key=lambda u: abs(u[0].time_s - first))
    return point, n


def prediction(run: Run) -> dict[str, Any] | None:
    """The run's last ``prediction`` event (one per guard window while a plan is deployed): the
    deployed point's predicted slowdown and energy ratio against the same run's measured ones, both
    relative to the default-clock probes. None when the run wrote none."""
    found = [e["data"] for e in run.events if e["event"] == "prediction" and isinstance(e.get("data"), dict)
             and isinstance(e["data"].get("predicted_slowdown"), (int, float))]
    return found[-1] if found else None
