"""What the no-slowdown guard decided in one run, checked from its metrics file alone.

Issue 34's promise, as an end-to-end test can check it on a workload nobody padded: at each probe
window's end the job agreed one decision from every pipeline's CUSUM statistic (a ``guard`` event
with every pipeline's statistic, probe share and probe energy); either the plan was kept while no
pipeline's statistic reached the threshold, or the runtime moved to a faster point or fell back
and said why. Wall-clock times on a loaded machine are whatever they are, so nothing here asserts
a speed: the checks are that the runtime's *decisions* follow from the evidence it wrote down.

``check_guard_run`` takes the lines of one run (step lines and event lines, as
``perseus/runtime/observe/metrics_file`` writes them) and asserts, failing with the numbers:

(a) the loop ran: every deployed step is marked ``"clocks"``, each window that ended before a
    fall-back held a block of default-clock steps, and at least one window ended with samples;
(b) the actions follow the evidence: a window whose largest pipeline statistic reached the
    threshold ends in ``faster`` or ``fallback`` naming the slow pipelines; one whose job energy
    statistic reached its threshold (the plan measurably saves no energy) ends in ``fallback``; no
    other window acts; a guard fall-back is followed by a ``fallback`` event that says why and by
    no further deployed steps;
(c) the end state: the run ended kept (every pipeline below the threshold at its last window),
    moved, or fell back; the last window's numbers are the verdict's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MOVES = ("faster", "fallback")


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard did in one run and how the run ended (``describe()`` is the test's output line)."""

    windows: int  # windows that ended with a decision
    moves: int  # faster decisions
    fell_back: bool
    outcome: str  # "kept", "moved" or "fell back"
    first_deployed_step: int
    statistic: dict[str, float]  # per pipeline, at the last window
    probe_share: dict[str, float]

    def describe(self) -> str:
        stats = ", ".join(f"pipeline {dp}: CUSUM {s:.2f}, probes {100 * self.probe_share[dp]:.1f}% of steps"
                          for dp, s in sorted(self.statistic.items()))
        return (f"guard: {self.windows} windows, {self.moves} move(s) faster, "
                f"{'fell back' if self.fell_back else 'no fall-back'}; last window: {stats}; "
                f"ended {self.outcome}; deployed at step {self.first_deployed_step}")


def split_run(lines: Iterable[dict[str, Any]], run_id: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step lines, event lines) of one run of a metrics file; with no ``run_id`` the file must hold one run."""
    lines = list(lines)
    ids = {line.get("run_id") for line in lines}
    if run_id is None:
        assert len(ids) == 1, f"the metrics file holds {len(ids)} runs ({sorted(map(str, ids))}); name one"
        run_id = ids.pop()
    one = [line for line in lines if line.get("run_id") == run_id]
    return [r for r in one if "event" not in r], [r for r in one if "event" in r]


def check_guard_run(steps: list[dict[str, Any]], events: list[dict[str, Any]], threshold: float = 5.0) -> GuardVerdict:
    """Assert (a), (b) and (c) of the module docstring on one run; the verdict for the test's output."""
    steps = sorted(steps, key=lambda r: r["step"])
    deployed = [r for r in steps if r["phase"] == "deployed"]
    assert deployed, f"the run never deployed a plan: phases {[r['phase'] for r in steps]}"
    first = deployed[0]["step"]

    # (a) the file says which steps ran at default clocks; windows ended with decisions
    for r in deployed:
        assert r.get("clocks") in ("plan", "default"), f"deployed step {r['step']} has clocks={r.get('clocks')!r}"
    guard = [e for e in sorted(events, key=lambda e: e["step"]) if e["event"] == "guard"]
    assert guard, f"no probe window ended in {len(deployed)} deployed steps: run longer or probe more often"
    clocks = {r["step"]: r["clocks"] for r in deployed}
    start = first
    for e in guard:
        window = [clocks[s] for s in range(start, e["step"]) if s in clocks]
        assert "default" in window, f"the window ending at step {e['step']} ran no probe block: {window}"
        start = e["step"]

    # (b) actions follow the evidence
    moves = 0
    fell_back_at: int | None = None
    for e in guard:
        data = e["data"]
        assert fell_back_at is None, f"guard window at step {e['step']} after the fall-back at step {fell_back_at}"
        stats = {dp: p["statistic"] for dp, p in data["pipelines"].items()}
        alarmed = [dp for dp, s in stats.items() if s >= data["threshold"]]
        energy = data.get("energy") or {}
        action = data["action"]
        if alarmed:
            assert action in MOVES and sorted(map(int, alarmed)) == sorted(data["slow_pipelines"]), (
                f"step {e['step']}: pipelines {alarmed} reached the threshold {data['threshold']} and the job "
                f"decided {action!r} (slow: {data['slow_pipelines']}): {data['reason']}")
        elif energy and energy["statistic"] >= energy["threshold"]:
            assert action == "fallback", (f"step {e['step']}: the energy statistic reached its threshold "
                                          f"{energy['threshold']} and the job decided {action!r}: {data['reason']}")
        else:
            assert action == "keep", f"step {e['step']}: {action!r} with every statistic below the threshold: {data}"
        if action in MOVES:
            assert data["reason"], f"step {e['step']}: {action!r} without a reason"
            if action == "faster":
                moves += 1
            else:
                fell_back_at = e["step"]
    if fell_back_at is not None:
        said = [e for e in events if e["event"] == "fallback" and e["step"] >= fell_back_at]
        assert said, f"the guard fell back at step {fell_back_at} but no fallback event followed: {events}"
        why = str(said[0]["data"])
        assert "guard" in why and ("slower" in why or "energy" in why), f"the fallback event does not say why: {why!r}"
        late = [r["step"] for r in deployed if r["step"] > fell_back_at + 1]
        assert not late, f"steps {late} still deployed after the guard fell back at step {fell_back_at}"

    # (c) the end state
    last = guard[-1]["data"]
    outcome = "fell back" if fell_back_at is not None else "moved" if last["action"] == "faster" else "kept"
    return GuardVerdict(len(guard), moves, fell_back_at is not None, outcome, first,
                        {dp: p["statistic"] for dp, p in last["pipelines"].items()},
                        {dp: p["probe_share"] for dp, p in last["pipelines"].items()})
