"""``perseus report``: one self-contained HTML page of a run, for a person to look at.

Input is a run directory holding either

- a metrics file (JSONL written by ``perseus.runtime.report``: one line per training iteration
  with ``step``, ``phase``, ``time_s``, ``energy_j``, ``freq_mhz``, ``target_time_s``,
  ``slowdown``, and event lines ``{"event": ..., "step": ..., "data": ...}``), or
- the per-rank results of ``perseus demo`` (``rank*.json``: ``{"rank", "stage", "dp_rank",
  "steps": [...], "summary": {...}}``), read directly (the library never imports the demo),

and optionally the runtime cache (``*/frontier.json`` and ``*/profile.json``). The page shows
energy and time per iteration over the run with the phases shaded, the frontier with the points
the run actually deployed, the per-stage clock timeline of the deployed plan and a
baseline-vs-deployed table with the saving and its spread. Figures are PNG files written next to
the page and embedded in it as data URIs, so the page alone can be mailed or attached.

matplotlib is imported only when drawing (``perseus.output.plot`` is imported inside functions).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median, quantiles
from typing import Any

from perseus.errors import FrontierError, PerseusError, ProfileError
from perseus.frontier import Frontier, FrontierPoint, load_frontier
from perseus.profile import Profile, load_json

DEPLOYED = "deployed"
PHASE_COLORS = {
    "startup": "#dddddd",
    "warmup": "#c6dbef",
    "profiling": "#fdd0a2",
    "planning": "#fff3b0",
    "deployed": "#c7e9c0",
    "fallback": "#fcbba1",
    "steady": "#e5e5e5",
    "baseline again": "#d9d9f3",
}
EXTRA_COLORS = ["#f2d7ee", "#d4f0f0", "#ffe4c4", "#e0e0c0"]
EVENT_STYLE = {"straggler": "tab:red", "fallback": "black", "point": "tab:purple"}


class ReportError(PerseusError):
    """The run directory has nothing to report or one of its files cannot be read."""


@dataclass(frozen=True)
class Step:
    """One training iteration: the job's time and energy (or rank 0's, see ``RunData.energy_scope``)."""

    step: int
    phase: str
    time_s: float
    energy_j: float
    freq_mhz: int | None = None
    target_time_s: float | None = None
    slowdown: float = 1.0


@dataclass
class RunData:
    """Everything the page shows, read from a run directory."""

    source: str  # "metrics" or "demo"
    path: Path  # the metrics file or the run directory
    steps: list[Step]
    events: list[dict[str, Any]]  # {"step", "event", "data"}
    energy_scope: str
    baseline_phase: str
    ranks: int = 1
    frontier: Frontier | None = None
    frontier_path: Path | None = None
    profile: Profile | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportError(f"{where}: {what} must be a finite number, got {value!r}")
    return float(value)


def _step_from(row: dict[str, Any], where: str) -> Step:
    for key in ("step", "phase", "time_s", "energy_j"):
        if key not in row:
            raise ReportError(f"{where}: step line has no {key!r}")
    if not isinstance(row["phase"], str):
        raise ReportError(f"{where}: phase must be a string, got {row['phase']!r}")
    target = row.get("target_time_s")
    freq = row.get("freq_mhz")
    return Step(
        step=int(_number(row["step"], "step", where)),
        phase=row["phase"],
        time_s=_number(row["time_s"], "time_s", where),
        energy_j=_number(row["energy_j"], "energy_j", where),
        freq_mhz=int(_number(freq, "freq_mhz", where)) if freq is not None else None,
        target_time_s=_number(target, "target_time_s", where) if target is not None else None,
        slowdown=_number(row.get("slowdown", 1.0), "slowdown", where),
    )


def read_metrics(path: Path) -> tuple[list[Step], list[dict[str, Any]]]:
    """Step records and events of a JSONL metrics file; a malformed line is an error naming it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    steps: list[Step] = []
    events: list[dict[str, Any]] = []
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
        if "event" in row:
            events.append({"step": row.get("step"), "event": str(row["event"]), "data": row.get("data")})
        else:
            steps.append(_step_from(row, where))
    return steps, events


def read_demo(run_dir: Path) -> tuple[list[Step], list[dict[str, Any]], int]:
    """Per-iteration job numbers of a ``perseus demo`` run: time of the slowest rank, energy summed.

    Events come from rank 0's runtime summary. Returns (steps, events, number of ranks).
    """
    results = []
    for path in sorted(run_dir.glob("rank*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ReportError(f"{path}: cannot read per-rank results ({getattr(exc, 'msg', None) or exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ReportError(f"{path}: not a per-rank result of 'perseus demo' (no 'steps' list)")
        results.append((path, data))
    by_step: dict[int, dict[str, Any]] = {}
    for path, data in results:
        for i, rec in enumerate(data["steps"]):
            if not isinstance(rec, dict):
                raise ReportError(f"{path}: step {i} is not an object")
            step = _step_from(rec, f"{path} step {i}")
            row = by_step.setdefault(step.step, {"phase": step.phase, "time_s": 0.0, "energy_j": 0.0, "clock": None})
            row["time_s"] = max(row["time_s"], step.time_s)
            row["energy_j"] += step.energy_j
            clocks = [inst[3] for inst in rec.get("instructions") or []
                      if isinstance(inst, list) and len(inst) == 4 and isinstance(inst[3], int)]
            if step.phase == "profiling" and clocks and row["clock"] is None:
                row["clock"] = Counter(clocks).most_common(1)[0][0]  # the clock being profiled
    steps = [Step(s, row["phase"], row["time_s"], row["energy_j"], row["clock"]) for s, row in sorted(by_step.items())]
    events: list[dict[str, Any]] = []
    root = next((d for _, d in results if d.get("rank") == 0), results[0][1] if results else {})
    for item in (root.get("summary") or {}).get("events") or []:
        if isinstance(item, (list, tuple)) and len(item) == 3:
            events.append({"step": item[0], "event": str(item[1]), "data": item[2]})
    return steps, events, len(results)


def is_deployed(phase: str) -> bool:
    """A phase with a plan deployed: ``deployed``, or the demo's ``deployed (straggler)``."""
    return phase == DEPLOYED or phase.startswith(DEPLOYED + " (")


def demo_planned_times(steps: list[Step], events: list[dict[str, Any]], first_time_s: float | None) -> list[Step]:
    """The demo's steps carry no planned time: the point in force at each deployed step.

    That is the latest ``point`` event (the runtime writes one when it switches points) or, before
    any, ``first_time_s`` (the point deployed first: the frontier's no-slowdown point).
    """
    changes = sorted((ev["step"], float(ev["data"]["time_s"])) for ev in events
                     if ev["event"] == "point" and isinstance(ev.get("step"), int) and isinstance(ev.get("data"), dict)
                     and isinstance(ev["data"].get("time_s"), (int, float)))
    out = []
    for s in steps:
        current = first_time_s
        for step, time_s in changes:
            if step <= s.step:
                current = time_s
        out.append(Step(s.step, s.phase, s.time_s, s.energy_j, s.freq_mhz, current) if is_deployed(s.phase) else s)
    return out


def find_frontiers(cache_dir: Path) -> list[Path]:
    """``frontier.json`` files of a runtime cache directory (or the directory itself), newest first."""
    found = [p for p in [cache_dir / "frontier.json", *cache_dir.glob("*/frontier.json")] if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _planned_times(data: RunData) -> set[float]:
    """Planned iteration times the run reports (deployed steps, point events)."""
    times = {s.target_time_s for s in data.steps if s.target_time_s is not None}
    times |= {float(ev["data"]["time_s"]) for ev in data.events if ev["event"] == "point"
              and isinstance(ev.get("data"), dict) and isinstance(ev["data"].get("time_s"), (int, float))}
    return times


def _holds(frontier: Frontier, times: set[float]) -> bool:
    planned = [p.time_s for p in frontier.points + frontier.paced_points]
    return all(any(abs(t - x) <= 1e-6 * max(abs(t), 1e-9) for x in planned) for t in times)


def choose_frontier(data: RunData, candidates: list[Path]) -> tuple[Path, Frontier] | None:
    """The newest frontier holding every planned time of the run (a shared cache has many jobs).

    A run that reports no planned time (a demo, or no plan deployed) gets the newest one. A
    frontier file that does not load is an error naming it.
    """
    times = _planned_times(data)
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


def load_run(run_dir: Path, metrics: Path | None = None, cache: Path | None = None) -> RunData:
    """Read a run directory (metrics JSONL or ``perseus demo`` output) and its cache."""
    if run_dir.is_file() and metrics is None:  # the metrics file itself: its directory is the run's
        run_dir, metrics = run_dir.parent, run_dir
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such directory")
    if metrics is None and not list(run_dir.glob("rank*.json")):
        candidates = sorted(run_dir.glob("*.jsonl"))
        if not candidates:
            raise ReportError(f"{run_dir}: no metrics file (*.jsonl, set metrics_file in the Perseus config) and "
                              "no per-rank results (rank*.json of 'perseus demo')")
        named = [p for p in candidates if p.name == "metrics.jsonl"]
        if len(candidates) > 1 and not named:
            raise ReportError(f"{run_dir}: several *.jsonl files; pick one with --metrics")
        metrics = (named or candidates)[0]
    if metrics is not None:
        if not metrics.is_file():
            raise ReportError(f"{metrics}: no such file")
        steps, events = read_metrics(metrics)
        data = RunData("metrics", metrics, steps, events, "rank 0's GPU (the metrics file is written by rank 0)",
                       "warmup")
    else:
        steps, events, ranks = read_demo(run_dir)
        phases = {s.phase for s in steps}
        data = RunData("demo", run_dir, steps, events, f"all GPUs (sum over {ranks} ranks)",
                       "baseline again" if "baseline again" in phases else "warmup", ranks=ranks)
    if not data.steps:
        raise ReportError(f"{data.path}: no iterations recorded")
    cache_dir = cache if cache is not None else run_dir / "cache"
    if cache is not None and not cache.is_dir():
        raise ReportError(f"{cache}: no such directory")
    candidates = find_frontiers(cache_dir) if cache_dir.is_dir() else []
    chosen = choose_frontier(data, candidates or find_frontiers(run_dir))
    if chosen is None:
        data.notes.append(f"no frontier.json in {cache_dir}: the frontier and the clock timeline are left out")
        return data
    data.frontier_path, data.frontier = chosen
    if data.source == "demo":
        data.steps = demo_planned_times(data.steps, data.events, data.frontier.default_point().time_s)
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


# ---------------------------------------------------------------- numbers


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
    """Frontier points the run deployed: (point, deployed iterations, from the paced set).

    Matched by planned iteration time (``target_time_s`` of deployed steps, ``point`` events).
    """
    if data.frontier is None:
        return []
    counts = Counter(s.target_time_s for s in data.steps if is_deployed(s.phase) and s.target_time_s is not None)
    for ev in data.events:
        if ev["event"] == "point" and isinstance(ev["data"], dict) and isinstance(ev["data"].get("time_s"), (int, float)):
            counts.setdefault(float(ev["data"]["time_s"]), 0)
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
    """The point the run deployed first (its plan before any straggler switch) and its iterations."""
    first = next((s.target_time_s for s in data.steps if is_deployed(s.phase) and s.target_time_s is not None), None)
    if first is None:
        return used[0][0], used[0][1]
    point, n, _ = min(used, key=lambda u: abs(u[0].time_s - first))
    return point, n


# ---------------------------------------------------------------- figures


def _phase_color(phase: str, extra: dict[str, str]) -> str:
    base = phase.split(" (")[0]
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    if base in PHASE_COLORS:
        return PHASE_COLORS[base]
    return extra.setdefault(phase, EXTRA_COLORS[len(extra) % len(EXTRA_COLORS)])


def plot_iterations(data: RunData, out: Path) -> None:
    """Energy (top) and time (bottom) per iteration, phases shaded, events marked."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from perseus.output.plot import save_figure

    steps = data.steps
    xs = [s.step for s in steps]
    fig, (ax_e, ax_t) = plt.subplots(2, 1, figsize=(11, 6.2), sharex=True, layout="constrained")
    extra: dict[str, str] = {}
    spans: list[tuple[str, int, int]] = []
    for s in steps:
        if spans and spans[-1][0] == s.phase and s.step == spans[-1][2] + 1:
            spans[-1] = (s.phase, spans[-1][1], s.step)
        else:
            spans.append((s.phase, s.step, s.step))
    for ax in (ax_e, ax_t):
        for phase, a, b in spans:
            ax.axvspan(a - 0.5, b + 0.5, facecolor=_phase_color(phase, extra), alpha=0.9, linewidth=0, zorder=0,
                       hatch="///" if "(" in phase else None, edgecolor="#ffffff")
        ax.grid(alpha=0.3, zorder=1)
    ax_e.plot(xs, [s.energy_j for s in steps], "-o", color="tab:green", markersize=3.5, linewidth=1.2, zorder=3,
              label="energy per iteration")
    ax_t.plot(xs, [s.time_s * 1e3 for s in steps], "-o", color="tab:blue", markersize=3.5, linewidth=1.2, zorder=3,
              label="iteration time")
    planned = [(s.step, s.target_time_s * 1e3) for s in steps if s.target_time_s is not None]
    if planned:
        ax_t.plot(*zip(*planned), "--", color="tab:purple", linewidth=1.2, zorder=3, drawstyle="steps-mid",
                  label="planned time of the deployed point")
    cmp = comparison(steps, data.baseline_phase)
    if cmp is not None:
        ax_e.axhline(cmp["baseline_energy"]["median"], color="tab:red", linestyle=":", linewidth=1.2, zorder=2,
                     label=f"{data.baseline_phase} median")
        ax_e.axhline(cmp["deployed_energy"]["median"], color="tab:green", linestyle=":", linewidth=1.2, zorder=2,
                     label="deployed median")
        ax_t.axhline(cmp["baseline_time"]["median"] * 1e3, color="tab:red", linestyle=":", linewidth=1.2, zorder=2,
                     label=f"{data.baseline_phase} median")
    previous = None
    for s in steps:  # the profiled clock, where it changes
        if s.freq_mhz is not None and s.phase == "profiling" and s.freq_mhz != previous:
            previous = s.freq_mhz
            ax_t.annotate(f"{s.freq_mhz}", (s.step, s.time_s * 1e3), textcoords="offset points", xytext=(0, 5),
                          ha="center", fontsize=6.5, color="#8c4a00", zorder=4)
    seen: set[str] = set()
    for ev in data.events:
        color = EVENT_STYLE.get(ev["event"])
        if color is None or not isinstance(ev.get("step"), (int, float)):
            continue
        for ax in (ax_e, ax_t):
            ax.axvline(ev["step"] - 0.5, color=color, linestyle="-.", linewidth=1, zorder=2,
                       label=f"event: {ev['event']}" if ev["event"] not in seen and ax is ax_e else None)
        if ev["event"] in ("straggler", "fallback"):  # what changed, at the top of the time panel
            text = ev["event"]
            if isinstance(ev.get("data"), (int, float)):
                text = f"straggler x{ev['data']:.2f}" if ev["data"] > 1 else "straggler gone"
            ax_t.annotate(text, (ev["step"] - 0.5, 1), xycoords=("data", "axes fraction"), xytext=(3, -4),
                          textcoords="offset points", rotation=90, ha="left", va="top", fontsize=7.5, color=color,
                          zorder=2.5, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
        seen.add(ev["event"])
    ax_e.set_ylabel(f"energy / iteration (J)\n{data.energy_scope.split(' (')[0]}")
    ax_t.set_ylabel("time / iteration (ms)")
    ax_t.set_xlabel("iteration (step)")
    ax_t.set_ylim(bottom=0)
    top = max(s.energy_j for s in steps) * 1.18
    ax_e.set_ylim(0, top)
    for phase, a, b in spans:  # phase names on their shading, where they fit
        if (b - a + 1) >= 0.045 * len(steps) * max(1, len(phase) / 9):
            ax_e.text((a + b) / 2, top * 0.985, phase, ha="center", va="top", fontsize=8.5, color="#333", zorder=4)
    phases_seen = list(dict.fromkeys(p for p, _, _ in spans))
    handles = [Patch(facecolor=_phase_color(p, extra), hatch="///" if "(" in p else None, edgecolor="#ffffff",
                     label=p) for p in phases_seen]
    ax_e.legend(handles=handles + ax_e.get_legend_handles_labels()[0], loc="lower left", fontsize=8,
                ncol=min(5, len(handles) + 3), framealpha=0.9)
    ax_t.legend(loc="lower left", fontsize=8, ncol=3, framealpha=0.9)
    ax_e.set_title("energy and time of every iteration, phases shaded (profiling clocks in MHz)", fontsize=10)
    save_figure(fig, out)


def plot_frontier_used(data: RunData, used: list[tuple[FrontierPoint, int, bool]], out: Path) -> None:
    """The planned frontier with the baseline, the no-slowdown point and the points the run deployed."""
    import matplotlib.pyplot as plt

    from perseus.output.plot import save_figure

    fr = data.frontier
    assert fr is not None
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    if fr.paced_points:
        ax.plot([p.time_s * 1e3 for p in fr.paced_points], [p.energy_j for p in fr.paced_points], ".",
                color="tab:gray", markersize=3, label=f"paced points ({len(fr.paced_points)}, for stragglers)")
    ax.plot([p.time_s * 1e3 for p in fr.points], [p.energy_j for p in fr.points], "-o", color="tab:blue",
            markersize=3, linewidth=1.2, label=f"frontier ({len(fr.points)} points)")
    ax.plot(fr.baseline_time_s * 1e3, fr.baseline_energy_j, "*", color="tab:red", markersize=14,
            label="all max clock (baseline)")
    default = fr.default_point()
    ax.plot(default.time_s * 1e3, default.energy_j, "D", color="tab:green", markersize=7, fillstyle="none",
            markeredgewidth=1.5, label="no-slowdown point")
    times = [p.time_s for p in fr.points + fr.paced_points]
    t_lo, t_hi = min(times), max(times)
    for i, (point, n, paced) in enumerate(used):
        saving = 1 - point.energy_j / fr.baseline_energy_j
        right = t_hi > t_lo and (point.time_s - t_lo) / (t_hi - t_lo) > 0.6  # label to the left, inside the axes
        ax.plot(point.time_s * 1e3, point.energy_j, "o", color="tab:orange", markersize=12, markeredgecolor="black",
                zorder=5, label="deployed by this run" if i == 0 else None)
        ax.annotate(f"{n} iteration{'s' if n != 1 else ''}{' (paced)' if paced else ''}\n"
                    f"x{point.time_s / default.time_s:.3f} time, {saving:.1%} less energy",
                    (point.time_s * 1e3, point.energy_j), textcoords="offset points",
                    xytext=(-12 if right else 12, 10 + 22 * i), ha="right" if right else "left",
                    fontsize=8, arrowprops={"arrowstyle": "-", "color": "gray"})
    ax.axvline(fr.baseline_time_s * 1e3, color="tab:red", linestyle=":", linewidth=1)
    ax.set_xlabel("planned iteration time (ms)")
    ax.set_ylabel("planned iteration energy (J, all stages)")
    sched = fr.schedule
    ax.set_title(f"time-energy frontier: {sched.name}, {sched.num_stages} stages x {sched.num_microbatches} "
                 f"microbatches, {fr.gpu_name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    save_figure(fig, out)


# ---------------------------------------------------------------- page

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1240px;color:#222;
 padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px} .cards{display:flex;gap:14px;flex-wrap:wrap;margin:18px 0}
.card{border:1px solid #ddd;border-radius:8px;padding:12px 16px;min-width:200px;background:#fafafa}
.card .v{font-size:26px;font-weight:600} .card .l{font-size:12px;color:#666}
.good{color:#1a7f37} .bad{color:#b42318}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:5px 10px;text-align:right} th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left} img{max-width:100%;border:1px solid #eee}
.note{background:#fff8e1;border-left:4px solid #f0c000;padding:6px 10px;font-size:13px;margin:6px 0}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
"""


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _cell(key: str, value: float, text: str) -> str:
    return f'<td data-key="{key}" data-value="{value!r}">{html.escape(text)}</td>'


def _spread_text(sp: dict[str, float], fmt: Any) -> str:
    return f"{fmt(sp['median'])} (IQR {fmt(sp['q1'])} .. {fmt(sp['q3'])}, range {fmt(sp['min'])} .. {fmt(sp['max'])})"


def _img(name: str, png: bytes, alt: str) -> str:
    return (f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{html.escape(alt)}" '
            f'data-file="{html.escape(name)}">')


def _comparison_html(cmp: dict[str, Any] | None, data: RunData) -> str:
    if cmp is None:
        return ('<div class="note">No comparison: the run has no iteration in phase '
                f'<code>{html.escape(data.baseline_phase)}</code> or none with the plan deployed.</div>')
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    joules = lambda v: f"{v:.2f} J"  # noqa: E731
    rows = []
    for label, key in ((f"baseline ({cmp['baseline_phase']}, default clocks)", "baseline"), ("deployed plan", "deployed")):
        t, e = cmp[f"{key}_time"], cmp[f"{key}_energy"]
        t_range = f"{ms(t['min'])} .. {ms(t['max'])}"
        e_range = f"{joules(e['min'])} .. {joules(e['max'])}"
        rows.append(
            f"<tr><td>{html.escape(label)}</td>{_cell(key + '_iterations', t['n'], str(t['n']))}"
            f"{_cell(key + '_time_median_s', t['median'], ms(t['median']))}"
            f"{_cell(key + '_time_range', t['max'] - t['min'], t_range)}"
            f"{_cell(key + '_energy_median_j', e['median'], joules(e['median']))}"
            f"{_cell(key + '_energy_range', e['max'] - e['min'], e_range)}</tr>"
        )
    s, tc = cmp["saving"], cmp["time_change"]
    tc_iqr = f"IQR {_pct(tc['q1'])} .. {_pct(tc['q3'])}"
    s_text = f"{100 * s['median']:.1f}% less energy"
    s_spread = (f"IQR {100 * s['q1']:.1f} .. {100 * s['q3']:.1f}%, "
                f"range {100 * s['min']:.1f} .. {100 * s['max']:.1f}%")
    rows.append(
        f"<tr><th>change (deployed vs baseline median)</th><td></td>"
        f"{_cell('time_change_median', tc['median'], _pct(tc['median']))}"
        f"{_cell('time_change_iqr', tc['q3'] - tc['q1'], tc_iqr)}"
        f"{_cell('saving_median', s['median'], s_text)}"
        f"{_cell('saving_iqr', s['q3'] - s['q1'], s_spread)}</tr>"
    )
    head = ("<tr><th></th><th>iterations</th><th>time / iter (median)</th><th>time min .. max</th>"
            "<th>energy / iter (median)</th><th>energy spread</th></tr>")
    return f'<table id="comparison">{head}{"".join(rows)}</table>'


def _phase_table_html(steps: list[Step]) -> str:
    rows = []
    for r in phase_rows(steps):
        rows.append(
            f"<tr><td>{html.escape(r['phase'])}</td>{_cell('iterations', r['iterations'], str(r['iterations']))}"
            f"{_cell('time_s', r['time_s'], '%.1f ms' % (r['time_s'] * 1e3))}"
            f"{_cell('energy_j', r['energy_j'], '%.2f J' % r['energy_j'])}</tr>"
        )
    return ('<table id="phases"><tr><th>phase</th><th>iterations</th><th>time / iter (median)</th>'
            f"<th>energy / iter (median)</th></tr>{''.join(rows)}</table>")


def _events_html(events: list[dict[str, Any]]) -> str:
    if not events:
        return "<p class='sub'>no events recorded</p>"
    rows = "".join(
        f"<tr><td>{html.escape(str(ev.get('step')))}</td><td>{html.escape(ev['event'])}</td>"
        f"<td style='text-align:left'>{html.escape(json.dumps(ev.get('data'), default=str))}</td></tr>"
        for ev in events
    )
    return f'<table id="events"><tr><th>step</th><th>event</th><th>data</th></tr>{rows}</table>'


def _cards(cmp: dict[str, Any] | None, data: RunData) -> str:
    cards = []
    if cmp is not None:
        s, tc = cmp["saving"]["median"], cmp["time_change"]["median"]
        cards.append(("good" if s > 0 else "bad", f"{100 * s:.1f}%",
                      f"less energy per iteration (median, vs {cmp['baseline_phase']})"))
        cards.append(("good" if tc <= 0.01 else "bad", _pct(tc), "iteration time change (median)"))
    elif not any(is_deployed(s.phase) for s in data.steps):
        cards.append(("bad", "not deployed", "no iteration ran with a plan"))
    cards.append(("", str(len(data.steps)), "iterations recorded"))
    if data.frontier is not None:
        fr = data.frontier
        cards.append(("", f"{1 - fr.default_point().energy_j / fr.baseline_energy_j:.1%}",
                      "planned saving of the no-slowdown point"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v {cls}">{html.escape(v)}</div><div class="l">{html.escape(label)}</div></div>'
        for cls, v, label in cards) + "</div>"


def write_report(data: RunData, out: Path) -> list[Path]:
    """Write the HTML page and its PNG figures (``<stem>-*.png`` next to it); returns every file."""
    from perseus.output import plot

    out = Path(out)
    if out.is_dir():
        raise ReportError(f"{out}: is a directory; give a file name for --out")
    if not out.absolute().parent.is_dir():
        raise ReportError(f"{out.absolute().parent}: directory does not exist; create it first")
    stem = out.with_suffix("")
    figures: list[tuple[str, Path, str, str]] = []  # (section id, file, title, caption)
    it_png = Path(f"{stem}-iterations.png")
    plot_iterations(data, it_png)
    figures.append(("iterations", it_png, "Energy and time per iteration",
                    f"Energy: {data.energy_scope}. Dotted lines: medians of the baseline and deployed phases."))
    used = used_points(data)
    if data.frontier is not None:
        fr_png = Path(f"{stem}-frontier.png")
        plot_frontier_used(data, used, fr_png)
        figures.append(("frontier", fr_png, "Time-energy frontier and the points deployed",
                        f"Planned by Perseus from the profile (simulated on measured values): {data.frontier_path}."))
        if data.profile is not None:
            if used:
                point, n = first_deployed(data, used)
                label = f"deployed first ({n} iterations)"
            else:
                point, label = data.frontier.default_point(), "no-slowdown point (not deployed in this run)"
            tl_png = Path(f"{stem}-timeline.png")
            plot.plot_timeline(data.frontier, point, label, data.profile, tl_png)
            others = "" if len(used) < 2 else (
                f" The run also deployed {len(used) - 1} other point(s), marked on the frontier above.")
            figures.append(("timeline", tl_png, "Per-stage clock timeline of the deployed plan",
                            "One iteration simulated on the profile: all max clock above, the plan the run deployed "
                            "first below, each instruction colored by its SM clock." + others))
    cmp = comparison(data.steps, data.baseline_phase)
    title = f"Perseus run report: {data.path}"
    sched = ""
    if data.frontier is not None:
        s = data.frontier.schedule
        sched = (f" &middot; {html.escape(s.name)}, {s.num_stages} stages x {s.num_microbatches} microbatches"
                 f" &middot; {html.escape(data.frontier.gpu_name)}")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>Perseus run report</h1><div class='sub'>{html.escape(str(data.path))} &middot; "
        f"{'perseus demo per-rank results' if data.source == 'demo' else 'runtime metrics file'}{sched}</div>",
        "".join(f"<div class='note'>{html.escape(n)}</div>" for n in data.notes),
        _cards(cmp, data),
        f"<h2 id='saving'>Baseline vs deployed plan</h2>{_comparison_html(cmp, data)}",
        "<p class='sub'>Medians over iterations; spread over the deployed iterations, each against the baseline "
        f"median (IQR: middle half, range: all). Energy: {html.escape(data.energy_scope)}. Iterations the demo "
        "labels <code>deployed (straggler)</code> ran under a disturbance and are listed per phase below.</p>"
        if any(is_deployed(s.phase) and s.phase != DEPLOYED for s in data.steps) else
        "<p class='sub'>Medians over iterations; spread over the deployed iterations, each against the baseline "
        f"median (IQR: middle half, range: all). Energy: {html.escape(data.energy_scope)}."
        + (" Deployed iterations include those slowed down for a straggler.</p>" if data.source == "metrics" else "</p>"),
    ]
    for section, path, heading, caption in figures:
        parts.append(f"<h2 id='{section}'>{html.escape(heading)}</h2>{_img(path.name, path.read_bytes(), heading)}"
                     f"<p class='sub'>{html.escape(caption)}</p>")
    parts.append(f"<h2 id='phase-table'>Per phase</h2>{_phase_table_html(data.steps)}")
    parts.append(f"<h2 id='events'>Events</h2>{_events_html(data.events)}")
    parts.append("</body></html>")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text("\n".join(parts))
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return [out, *(p for _, p, _, _ in figures)]


def make_report(run_dir: Path, out: Path | None = None, metrics: Path | None = None,
                cache: Path | None = None) -> tuple[RunData, list[Path]]:
    """Read ``run_dir`` (or a metrics file) and write the page (default ``report.html`` in that directory)."""
    run_dir = Path(run_dir)
    data = load_run(run_dir, metrics, cache)
    where = run_dir.parent if run_dir.is_file() else run_dir  # given the metrics file itself: next to it
    return data, write_report(data, out if out is not None else where / "report.html")
