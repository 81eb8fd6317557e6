"""The data ``perseus report`` shows: the runs of a JSONL metrics file, and the cache beside them.

A metrics file is appended, so it may hold several runs (restarts, reruns with the same config).
Records carry the run id of the runtime that wrote them (``run_id``, see
``perseus.runtime.observe.metrics_file``); records of older files without one are split where a run
starts again: a step number that does not go forward, or an event about an earlier step than the
last one recorded. One run (the latest by default) or every run is then chosen for the page.

Step records may carry ``energy_ranks`` (N): their energy is the sum over N ranks' GPUs (the job),
as in the file ``perseus_demo`` writes from its per-rank results; without it, energy is rank 0's
GPU (the runtime's own file is written by rank 0). The library reads only this format: the demo
converts its own files to it, and the library never imports the demo.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perseus.errors import FrontierError, ProfileError, ReportError
from perseus.frontier import Frontier, load_frontier
from perseus.profile import Profile, load_json

DEPLOYED = "deployed"
# Deployed steps the runtime ran at default clocks (its no-slowdown probes: ``"clocks": "default"``).
PROBE = "default-clock probe"
# Steps after a clock change that the same-run A/B leaves out (metrics file ``"counted": false``).
SETTLE = " (settling)"
GRID_KEYS = ("carbon_intensity", "carbon_g", "job_power_w", "power_cap_w")
RUN_ID_KEY = "run_id"
LATEST = "latest"
ALL = "all"


@dataclass(frozen=True)
class Step:
    """One training iteration: time and energy (whose energy: ``Run.energy_scope``)."""

    step: int
    phase: str
    time_s: float
    energy_j: float
    freq_mhz: int | None = None
    target_time_s: float | None = None
    slowdown: float = 1.0
    energy_ranks: int = 1
    # carbon and power targets (docs/carbon.md): the intensity in force, the step's carbon, the
    # job's planned power at the point run and the cap
    carbon_intensity: float | None = None
    carbon_g: float | None = None
    job_power_w: float | None = None
    power_cap_w: float | None = None


@dataclass
class Run:
    """The records of one runtime instance: its steps and events, in file order."""

    run_id: str | None  # None: a file written before run ids (the run is named by its position)
    position: int  # 1-based, in file order
    steps: list[Step] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # {"step", "event", "data"}

    @property
    def label(self) -> str:
        return self.run_id if self.run_id is not None else "no run id"

    @property
    def energy_scope(self) -> str:
        ranks = max((s.energy_ranks for s in self.steps), default=1)
        if ranks > 1:
            return f"all GPUs (sum over {ranks} ranks)"
        return "rank 0's GPU (the metrics file is written by rank 0)"

    @property
    def baseline_phase(self) -> str:
        """The same run's default-clock probes when it has them, else default clocks re-measured
        after the plan (A/B/A), else warm-up."""
        for phase in (PROBE, "baseline again"):
            if any(s.phase == phase for s in self.steps):
                return phase
        return "warmup"


@dataclass
class RunData:
    """Everything the page shows: the chosen run(s) of a metrics file, with the cache's frontier."""

    path: Path  # the metrics file
    runs: list[Run]  # every run in the file, in file order
    shown: list[Run]  # the ones the page shows
    frontier: Frontier | None = None
    frontier_path: Path | None = None
    profile: Profile | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        """Steps of the shown runs (of the one run, when one is shown)."""
        return [s for run in self.shown for s in run.steps]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for run in self.shown for e in run.events]


# ---------------------------------------------------------------- reading


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(f"{where}: {what} must be a finite number, got {value!r}")
    return float(value)


def step_from(row: dict[str, Any], where: str) -> Step:
    """A step record as a ``Step``; a missing or malformed field is an error naming ``where``."""
    for key in ("step", "phase", "time_s", "energy_j"):
        if key not in row:
            raise ReportError(f"{where}: step line has no {key!r}")
    if not isinstance(row["phase"], str):
        raise ReportError(f"{where}: phase must be a string, got {row['phase']!r}")
    target = row.get("target_time_s")
    freq = row.get("freq_mhz")
    phase = row["phase"]
    if phase == DEPLOYED and row.get("clocks") == "default":
        phase = PROBE
    if phase in (DEPLOYED, PROBE) and row.get("counted") is False:
        phase += SETTLE  # in neither side of the A/B, as in the runtime's own
    return Step(
        step=int(_number(row["step"], "step", where)),
        phase=phase,
        time_s=_number(row["time_s"], "time_s", where),
        energy_j=_number(row["energy_j"], "energy_j", where),
        freq_mhz=int(_number(freq, "freq_mhz", where)) if freq is not None else None,
        target_time_s=_number(target, "target_time_s", where) if target is not None else None,
        slowdown=_number(row.get("slowdown", 1.0), "slowdown", where),
        energy_ranks=int(_number(row.get("energy_ranks", 1), "energy_ranks", where)),
        **{key: _number(row[key], key, where) for key in GRID_KEYS if row.get(key) is not None},
    )


def _starts_again(run: Run, step: Any, is_event: bool) -> bool:
    """A record of a file without run ids that belongs to a new run (module docstring)."""
    if not run.steps or not isinstance(step, (int, float)) or isinstance(step, bool):
        return False
    last = run.steps[-1].step
    return step < last if is_event else step <= last


def read_runs(path: Path) -> list[Run]:
    """The runs of a JSONL metrics file, in file order; a malformed line is an error naming it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    runs: list[Run] = []
    by_id: dict[str, Run] = {}
    unnamed: Run | None = None  # the current run of records without an id
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{where}: not a JSON line ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ReportError(f"{where}: expected a JSON object")
        is_event = "event" in row
        run_id = row.get(RUN_ID_KEY)
        if run_id is not None:
            run = by_id.get(str(run_id))
            if run is None:
                run = by_id[str(run_id)] = Run(str(run_id), len(runs) + 1)
                runs.append(run)
        else:
            if unnamed is None or _starts_again(unnamed, row.get("step"), is_event):
                unnamed = Run(None, len(runs) + 1)
                runs.append(unnamed)
            run = unnamed
        if is_event:
            run.events.append({"step": row.get("step"), "event": str(row["event"]), "data": row.get("data")})
        else:
            run.steps.append(step_from(row, where))
    return [r for r in runs if r.steps or r.events]


def choose_runs(runs: list[Run], which: str, path: Path) -> list[Run]:
    """``latest`` (default): the last run with a step; ``all``; a run id; or a run's position (1, 2, ...)."""
    with_steps = [r for r in runs if r.steps]
    if not with_steps:
        raise ReportError(f"{path}: no iterations recorded")
    if which == LATEST:
        return [with_steps[-1]]
    if which == ALL:
        return with_steps
    for run in runs:
        if run.run_id == which or (which.isdigit() and int(which) == run.position):
            if not run.steps:
                raise ReportError(f"{path}: run {which} recorded no iteration")
            return [run]
    names = ", ".join(r.run_id or str(r.position) for r in with_steps)
    raise ReportError(f"{path}: no run {which!r}; the file holds {len(with_steps)} run(s): {names} "
                      f"(give --run with one of them, a position 1..{len(runs)}, 'latest' or 'all')")


def is_deployed(phase: str) -> bool:
    """A phase with a plan deployed: ``deployed``, or the demo's ``deployed (straggler)``."""
    return phase == DEPLOYED or phase.startswith(DEPLOYED + " (")


def point_times(events: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, planned iteration time) of every ``point`` event, in step order."""
    return sorted((ev["step"], float(ev["data"]["time_s"])) for ev in events
                  if ev["event"] == "point" and isinstance(ev.get("step"), int) and isinstance(ev.get("data"), dict)
                  and isinstance(ev["data"].get("time_s"), (int, float)))


def fill_planned_times(run: Run, first_time_s: float | None) -> None:
    """Deployed steps that carry no planned time get the point in force (the demo's steps).

    That is the latest ``point`` event at or before the step or, before any, ``first_time_s``
    (the point deployed first: the frontier's no-slowdown point). Steps with a time keep it.
    """
    changes = point_times(run.events)
    out = []
    for s in run.steps:
        if is_deployed(s.phase) and s.target_time_s is None:
            current = first_time_s
            for step, time_s in changes:
                if step <= s.step:
                    current = time_s
            s = Step(s.step, s.phase, s.time_s, s.energy_j, s.freq_mhz, current, s.slowdown, s.energy_ranks)
        out.append(s)
    run.steps = out


def find_frontiers(cache_dir: Path) -> list[Path]:
    """``frontier.json`` files of a runtime cache directory (or the directory itself), newest first."""
    found = [p for p in [cache_dir / "frontier.json", *cache_dir.glob("*/frontier.json")] if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def planned_times(data: RunData) -> set[float]:
    """Planned iteration times the shown runs report (deployed steps, point events)."""
    times = {s.target_time_s for s in data.steps if s.target_time_s is not None}
    times |= {t for _, t in point_times(data.events)}
    return times


def _holds(frontier: Frontier, times: set[float]) -> bool:
    planned = [p.time_s for p in frontier.points + frontier.paced_points]
    return all(any(abs(t - x) <= 1e-6 * max(abs(t), 1e-9) for x in planned) for t in times)


def choose_frontier(data: RunData, candidates: list[Path]) -> tuple[Path, Frontier] | None:
    """The newest frontier holding every planned time of the shown runs (a shared cache has many jobs).

    Runs that report no planned time (a demo, or no plan deployed) get the newest one. A
    frontier file that does not load is an error naming it.
    """
    times = planned_times(data)
    loaded = []
    for path in candidates:
        try:
            frontier = load_frontier(path)
        except FrontierError as exc:
            raise ReportError(str(exc)) from None
        if not times or _holds(frontier, times):
            return path, frontier
        loaded.append((path, frontier))
    if loaded:
        data.notes.append(f"no frontier in the cache holds the planned times of this run; showing the newest, "
                          f"{loaded[0][0]}")
        return loaded[0]
    return None


def find_metrics(run_dir: Path) -> Path:
    """The metrics file of a run directory: its one ``*.jsonl``, or ``metrics.jsonl`` among several."""
    candidates = sorted(run_dir.glob("*.jsonl"))
    if not candidates:
        hint = (" It holds per-rank results of 'perseus demo' (rank*.json): convert them with "
                f"'python -m perseus_demo.job_metrics {run_dir}'." if list(run_dir.glob("rank*.json")) else "")
        raise ReportError(f"{run_dir}: no metrics file (*.jsonl; set metrics_file in the Perseus config).{hint}")
    named = [p for p in candidates if p.name == "metrics.jsonl"]
    if len(candidates) > 1 and not named:
        raise ReportError(f"{run_dir}: several *.jsonl files; pick one with --metrics")
    return (named or candidates)[0]


def load_run(run_dir: Path, metrics: Path | None = None, cache: Path | None = None, run: str = LATEST) -> RunData:
    """Read a run directory's metrics file (or the file itself), choose ``run``, and read the cache."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and metrics is None:  # the metrics file itself: its directory is the run's
        run_dir, metrics = run_dir.parent, run_dir
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such directory")
    if metrics is None:
        metrics = find_metrics(run_dir)
    if not metrics.is_file():
        raise ReportError(f"{metrics}: no such file")
    runs = read_runs(metrics)
    data = RunData(metrics, runs, choose_runs(runs, run, metrics))
    cache_dir = cache if cache is not None else run_dir / "cache"
    if cache is not None and not cache.is_dir():
        raise ReportError(f"{cache}: no such directory")
    candidates = find_frontiers(cache_dir) if cache_dir.is_dir() else []
    chosen = choose_frontier(data, candidates or find_frontiers(run_dir))
    if chosen is None:
        data.notes.append(f"no frontier.json in {cache_dir}: the frontier and the clock timeline are left out")
        return data
    data.frontier_path, data.frontier = chosen
    for shown in data.shown:
        fill_planned_times(shown, data.frontier.default_point().time_s)
    profile_path = data.frontier_path.with_name("profile.json")
    if profile_path.is_file():
        try:
            data.profile = load_json(profile_path)
            data.profile.check_matches(data.frontier.schedule)
        except ProfileError as exc:
            raise ReportError(str(exc)) from None
    else:
        data.notes.append(f"no profile.json next to {data.frontier_path}: the clock timeline is left out")
    return data
