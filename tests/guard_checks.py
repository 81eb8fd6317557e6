"""What the no-slowdown guard decided in one run, checked from its metrics file alone.

Issue 24's promise, as an end-to-end test can check it on a workload nobody padded: either the
deployed plan's same-run A/B time is within tolerance, or the runtime moved to a faster point or
fell back and said why; it never stays deployed while measurably slower. Wall-clock times on a
loaded machine are whatever they are, so nothing here asserts a speed: the checks are that the
runtime's *decisions* follow from the evidence it wrote down, and that the evidence, recomputed
from the file's own step lines, does not contradict where the run ended.

``check_guard_run`` takes the lines of one run (step lines and event lines, as
``perseus/runtime/metrics_file`` writes them) and asserts, failing with the numbers:

(a) the loop ran: every deployed step is marked ``"clocks"`` as the probe schedule says, and at
    least ``patience`` guard checks had samples to compare;
(b) the actions follow the evidence: ``patience`` slow checks in a row (excess > margin, the
    check's own numbers; checks without samples neither count nor break the run, as in
    ``TimeGuard``) end in a ``faster`` or ``fallback`` decision, and every such decision ends
    such a run; a guard fall-back is followed by a ``fallback`` event that says why and by no
    further plan steps;
(c) the end state: the A/B of the final point (its counted plan steps after the last move, the
    first ``settle`` dropped as the guard drops them, against the counted probes of that window
    and at least the guard's last ``probe_window``; medians and robust spread, ``ab.median_ratio``)
    is within ``tolerance + noise_z × stderr``, or the run fell back, or the guard is still
    collecting evidence (fewer than ``patience`` slow checks since the last move).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from perseus.runtime.guard.ab import Ratio, median_ratio
from perseus.runtime.guard.probes import ProbeSchedule, StepRole
from perseus.runtime.guard.time_guard import GuardSettings

MOVES = ("faster", "fallback")


@dataclass(frozen=True)
class FinalAB:
    """The recomputed A/B of the point the run ended on."""

    ratio: Ratio | None  # None: nothing to compare (no plan steps after the last move, or no probes)
    excess: float | None
    margin: float | None

    def describe(self) -> str:
        if self.ratio is None or self.excess is None:
            return "final point: too few samples to compare"
        return (f"final point: median of {self.ratio.n_plan} plan steps vs {self.ratio.n_probe} probes "
                f"{100 * self.excess:+.1f}% (margin {100 * self.margin:.1f}%)")


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard did in one run and how the run ended (``describe()`` is the test's output line)."""

    checks: int  # guard checks with samples
    slow_checks: int
    moves: int  # faster decisions
    fell_back: bool
    outcome: str  # "within", "fell back" or "collecting"
    first_deployed_step: int
    final: FinalAB

    def describe(self) -> str:
        return (f"guard: {self.checks} checks ({self.slow_checks} slow), {self.moves} move(s) faster, "
                f"{'fell back' if self.fell_back else 'no fall-back'}; {self.final.describe()}; "
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


def _is_slow(data: dict[str, Any]) -> bool | None:
    """A check's verdict from its own numbers; None when it had no samples to compare."""
    if data.get("excess") is None or data.get("margin") is None:
        return None
    return data["excess"] > data["margin"]


def check_guard_run(steps: list[dict[str, Any]], events: list[dict[str, Any]], settings: GuardSettings,
                    probe_every: int, *, target_ratio: float = 1.0) -> GuardVerdict:
    """Assert (a), (b) and (c) of the module docstring on one run; the verdict for the test's output."""
    schedule = ProbeSchedule(every=probe_every)
    assert schedule.enabled, "probes are off (probe_every_steps 0): the guard cannot have run"
    steps = sorted(steps, key=lambda r: r["step"])
    deployed = [r for r in steps if r["phase"] == "deployed"]
    assert deployed, f"the run never deployed a plan: phases {[r['phase'] for r in steps]}"
    first = deployed[0]["step"]

    # (a) the file says which steps ran at default clocks, as the schedule does; the guard checked
    for r in deployed:
        expected = "default" if schedule.role(r["step"] - first).default_clocks else "plan"
        assert r.get("clocks") == expected, (
            f"deployed step {r['step']} (deployed step {r['step'] - first}) is marked clocks={r.get('clocks')!r}, "
            f"the probe schedule (every {probe_every}) says {expected!r}")
    guard = [e for e in sorted(events, key=lambda e: e["step"]) if e["event"] == "guard"]
    sampled = [e for e in guard if _is_slow(e["data"]) is not None]
    assert len(sampled) >= settings.patience, (
        f"only {len(sampled)} guard check(s) with samples (of {len(guard)}), need at least patience="
        f"{settings.patience}: run longer or probe more often; checks: {[e['data'] for e in guard]}")

    # (b) actions follow the evidence
    in_a_row = slow_total = moves = 0
    last_move_step = first - 1
    since_move: list[bool] = []
    fell_back_at: int | None = None
    for e in guard:
        data, slow = e["data"], _is_slow(e["data"])
        assert fell_back_at is None, f"guard check at step {e['step']} after the fall-back at step {fell_back_at}"
        action = data["action"]
        if slow is not None:
            since_move.append(slow)
            slow_total += slow
            in_a_row = in_a_row + 1 if slow else 0
        if in_a_row >= settings.patience:
            assert action in MOVES, (
                f"step {e['step']}: {in_a_row} slow checks in a row (patience {settings.patience}) and the guard "
                f"kept the plan: excess {data['excess']:+.4f} > margin {data['margin']:.4f}; {data['reason']}")
        if action in MOVES:
            assert slow and in_a_row == settings.patience, (
                f"step {e['step']}: guard decided {action!r} after {in_a_row} slow check(s) in a row "
                f"(patience {settings.patience}): {data}")
            assert data["reason"], f"step {e['step']}: {action!r} without a reason"
            in_a_row, since_move, last_move_step = 0, [], e["step"]
            if action == "faster":
                moves += 1
            else:
                fell_back_at = e["step"]
        else:
            assert action == "keep", f"step {e['step']}: unknown guard action {action!r}"
    if fell_back_at is not None:
        said = [e for e in events if e["event"] == "fallback" and e["step"] >= fell_back_at]
        assert said, f"the guard fell back at step {fell_back_at} but no fallback event followed: {events}"
        why = str(said[0]["data"])
        assert "guard" in why and "slower" in why, f"the fallback event does not say why: {why!r}"
        late = [r["step"] for r in deployed if r["step"] > fell_back_at + 1]
        assert not late, f"steps {late} still deployed after the guard fell back at step {fell_back_at}"

    # (c) the end state, recomputed from the step lines
    final = _final_ab(steps, first, last_move_step, schedule, settings, target_ratio) if fell_back_at is None \
        else FinalAB(None, None, None)
    if fell_back_at is not None:
        outcome = "fell back"
    elif final.excess is not None and final.excess <= final.margin:
        outcome = "within"
    else:
        slow_since = sum(since_move)
        assert slow_since < settings.patience, (
            f"the run ended deployed and measurably slower: {final.describe()}, with {slow_since} slow check(s) "
            f"since the last move (patience {settings.patience}) and no move or fall-back")
        outcome = "collecting"
    return GuardVerdict(len(sampled), slow_total, moves, fell_back_at is not None, outcome, first, final)


def _final_ab(steps: list[dict[str, Any]], first: int, last_move_step: int, schedule: ProbeSchedule,
              settings: GuardSettings, target_ratio: float) -> FinalAB:
    """The final point's plan steps (after the last move, ``settle`` dropped) against the probes of
    that window, widened back to the guard's ``probe_window`` most recent."""
    roles = {r["step"]: schedule.role(r["step"] - first) for r in steps if r["step"] >= first and r["phase"] == "deployed"}
    times = {r["step"]: r["time_s"] for r in steps}
    plan = [times[s] for s, role in sorted(roles.items()) if role is StepRole.PLAN and s > last_move_step]
    plan = plan[settings.settle:] if last_move_step >= first else plan
    probes = [(s, times[s]) for s, role in sorted(roles.items()) if role is StepRole.PROBE]
    window = [t for s, t in probes if s >= last_move_step]
    if len(window) < settings.probe_window:
        window = [t for _, t in probes[-settings.probe_window:]]
    if not plan or not window:
        return FinalAB(None, None, None)
    ratio = median_ratio(plan, window)
    if ratio.stderr is None:
        return FinalAB(ratio, None, None)
    excess = ratio.value / target_ratio - 1.0
    return FinalAB(ratio, excess, settings.tolerance + settings.noise_z * ratio.stderr / target_ratio)
