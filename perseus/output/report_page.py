"""``perseus report``'s page: one self-contained HTML file of a run, for a person to look at.

The page comes from a jinja2 template with autoescaping (``templates/report.html.j2``): every
value from a metrics file (phase names, event data, paths) is escaped by the engine, not by hand,
and a reader can see the page's markup in one file. This module only turns the run's numbers
(``run_stats``) into the template's rows and cells and writes the page atomically. Figures are
PNG files written next to the page and embedded in it as data URIs, so the page alone can be
mailed or attached. matplotlib is imported only when drawing (``perseus.output.plot`` is
imported inside functions).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perseus.errors import ReportError
from perseus.output.run_data import ALL, DEPLOYED, LATEST, Run, RunData, is_deployed, load_run
from perseus.output.run_stats import comparison, first_deployed, phase_rows, prediction, used_points
from perseus.output.wording import energy_change

TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "report.html.j2"


@dataclass(frozen=True)
class Cell:
    """A table cell: the shown text and, for tools and tests, its key and exact value."""

    key: str
    value: str  # repr of the number
    text: str


def _cell(key: str, value: float, text: str) -> Cell:
    return Cell(key, repr(value), text)


@dataclass
class Figure:
    section: str
    file: str
    title: str
    caption: str
    png_base64: str


@dataclass
class RunView:
    """One shown run, as the template needs it."""

    run: Run
    suffix: str  # "" when one run is shown, else "-N": keeps element ids unique
    cards: list[tuple[str, str, str]] = field(default_factory=list)  # (css class, value, label)
    comparison: list[dict[str, Any]] | None = None  # rows of cells
    figure: Figure | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    straggler_phase: bool = False  # the demo's "deployed (straggler)" window, left out of the comparison
    straggler_events: bool = False  # the runtime followed a straggler: its slowed steps are "deployed"
    guard: list[dict[str, Any]] = field(default_factory=list)  # the no-slowdown guard, one row per pipeline
    prediction: list[dict[str, str]] = field(default_factory=list)  # predicted vs measured, time and energy


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _comparison_rows(cmp: dict[str, Any]) -> list[dict[str, Any]]:
    def ms(v: float) -> str:
        return f"{v * 1e3:.1f} ms"

    def joules(v: float) -> str:
        return f"{v:.2f} J"

    rows = []
    for label, key in ((f"baseline ({cmp['baseline_phase']}, default clocks)", "baseline"), ("deployed plan", "deployed")):
        t, e = cmp[f"{key}_time"], cmp[f"{key}_energy"]
        rows.append({"label": label, "head": False, "cells": [
            _cell(key + "_iterations", t["n"], str(t["n"])),
            _cell(key + "_time_median_s", t["median"], ms(t["median"])),
            _cell(key + "_time_range", t["max"] - t["min"], f"{ms(t['min'])} .. {ms(t['max'])}"),
            _cell(key + "_energy_median_j", e["median"], joules(e["median"])),
            _cell(key + "_energy_range", e["max"] - e["min"], f"{joules(e['min'])} .. {joules(e['max'])}"),
        ]})
    s, tc = cmp["saving"], cmp["time_change"]
    rows.append({"label": "change (deployed vs baseline median)", "head": True, "cells": [
        None,
        _cell("time_change_median", tc["median"], _pct(tc["median"])),
        _cell("time_change_iqr", tc["q3"] - tc["q1"], f"IQR {_pct(tc['q1'])} .. {_pct(tc['q3'])}"),
        _cell("saving_median", s["median"], energy_change(s["median"])),
        # the spread as a signed energy change (−: less energy), so no negative saving reads as one
        _cell("saving_iqr", s["q3"] - s["q1"], f"energy IQR {_pct(-s['q3'])} .. {_pct(-s['q1'])}, "
                                                 f"range {_pct(-s['max'])} .. {_pct(-s['min'])}"),
    ]})
    return rows


def _number_and_words(saving: float) -> tuple[str, str]:
    """``("3.9%", "more energy")``: a card's big number and its label, the sign in the words."""
    number, words = energy_change(saving).split(" ", 1)
    return number, words


def _cards(run: Run, cmp: dict[str, Any] | None, data: RunData) -> list[tuple[str, str, str]]:
    cards = []
    if cmp is not None:
        s, tc = cmp["saving"]["median"], cmp["time_change"]["median"]
        number, words = _number_and_words(s)
        cards.append(("good" if s > 0 else "bad", number, f"{words} per iteration (median, vs {cmp['baseline_phase']})"))
        cards.append(("good" if tc <= 0.01 else "bad", _pct(tc), "iteration time change (median)"))
    elif not any(is_deployed(s.phase) for s in run.steps):
        cards.append(("bad", "not deployed", "no iteration ran with a plan"))
    cards.append(("", str(len(run.steps)), "iterations recorded"))
    if data.frontier is not None:
        fr = data.frontier
        number, words = _number_and_words(1 - fr.default_point().energy_j / fr.baseline_energy_j)
        cards.append(("", number, f"{words} planned at the no-slowdown point"))
    cost = next((e["data"] for e in run.events if e["event"] == "profiling_overhead" and isinstance(e["data"], dict)), None)
    if cost is not None and {"iterations", "extra_time_ratio", "extra_energy_ratio"} <= cost.keys():
        cards.append(("", f"{cost['iterations']} iterations", f"of profiling: {_pct(cost['extra_time_ratio'])} time, "
                      f"{_pct(cost['extra_energy_ratio'])} energy against default clocks"
                      + (f" ({cost['note']})" if cost.get("note") else "")))
    return cards


def guard_rows(run: Run) -> list[dict[str, Any]]:
    """The no-slowdown guard per data-parallel pipeline, from the run's ``guard`` events (one per
    probe window; each carries every pipeline's CUSUM statistic, probe share and probe energy):
    windows, the decisions that named it, its last statistic against the threshold, the probes'
    share of deployed steps and their energy over the plan's."""
    windows = [e for e in run.events if e["event"] == "guard" and isinstance(e.get("data"), dict)
               and isinstance(e["data"].get("pipelines"), dict)]
    rows: dict[str, dict[str, Any]] = {}
    for e in windows:
        data = e["data"]
        for dp, p in data["pipelines"].items():
            row = rows.setdefault(dp, {"pipeline": dp, "windows": 0, "decisions": []})
            row["windows"] += 1
            row.update(statistic=f"{p['statistic']:.2f} (alarm at {data['threshold']:g})",
                       probe_share=f"{100 * p['probe_share']:.1f}%", probe_energy=f"{p['probe_extra_energy_j']:+.1f} J")
            if data["action"] != "keep" and int(dp) in data.get("slow_pipelines", []):
                row["decisions"].append(f"{data['action']} at step {e.get('step')}")
        reasons = data.get("clock_reasons")
        if isinstance(reasons, dict) and str(reasons.get("pipeline")) in rows:
            rows[str(reasons["pipeline"])]["clock_reasons"] = probe_reasons_text(reasons)
    for row in rows.values():
        row["decisions"] = ", ".join(row["decisions"]) or "kept (no alarm)"
        row.setdefault("clock_reasons", "not read")
    return [rows[dp] for dp in sorted(rows, key=int)]


def prediction_rows(run: Run) -> list[dict[str, str]]:
    """The deployed plan's predicted ratios to the probes' baseline against the measured ones
    (``run_stats.prediction``), one row for time and one for energy; empty without a check."""
    check = prediction(run)
    if check is None:
        return []

    def row(what: str, p: str, m: str) -> dict[str, str]:
        measured = check.get(m)
        return {"what": what, "predicted": f"x{check[p]:.3f}",
                "measured": "not measured" if measured is None else f"x{measured:.3f}",
                "error": "n/a" if measured is None else f"{100 * (measured - check[p]):+.1f} points"}

    return [row("iteration time (slowdown)", "predicted_slowdown", "measured_slowdown"),
            row("energy per iteration", "predicted_energy_ratio", "measured_energy_ratio")]


def probe_reasons_text(reasons: dict[str, Any]) -> str:
    """The clock-event reasons the card reported during probe steps, against plan steps (a guard
    event's ``clock_reasons``: each reason's share of the steps of each kind)."""
    probe, plan = reasons.get("probe") or {}, reasons.get("plan") or {}
    if not reasons.get("probe_steps"):
        return "no probe step sampled"
    said = [f"{name} {100 * share:.0f}% (plan steps {100 * plan.get(name, 0.0):.0f}%)" for name, share in probe.items()]
    said += [f"{name} in plan steps only ({100 * share:.0f}%)" for name, share in plan.items() if name not in probe]
    return ", ".join(said) or f"none in {reasons['probe_steps']} probe steps"


def _embed(section: str, path: Path, title: str, caption: str) -> Figure:
    return Figure(section, path.name, title, caption, base64.b64encode(path.read_bytes()).decode())


def run_summary(run: Run) -> dict[str, Any]:
    """One row of the page's run table: what a run was, in a few numbers and words."""
    cmp = comparison(run.steps, run.baseline_phase)
    return {
        "position": run.position,
        "label": run.label,
        "iterations": len(run.steps),
        "steps": f"{run.steps[0].step} .. {run.steps[-1].step}" if run.steps else "-",
        "saving": energy_change(cmp["saving"]["median"]) if cmp else "-",
        "time": _pct(cmp["time_change"]["median"]) if cmp else "-",
    }


def shown_text(data: RunData) -> str:
    """What the page shows, in words: which run(s) of how many."""
    total = len([r for r in data.runs if r.steps])
    if len(data.shown) > 1:
        return f"all {len(data.shown)} runs of the metrics file"
    run = data.shown[0]
    if total == 1:
        return f"the one run of the metrics file ({run.label})"
    latest = run is [r for r in data.runs if r.steps][-1]
    return f"run {run.position} of {total} in the metrics file ({run.label}{', the latest' if latest else ''})"


def write_report(data: RunData, out: Path) -> list[Path]:
    """Write the HTML page and its PNG figures (``<stem>-*.png`` next to it); returns every file."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    from perseus.output import plot

    out = Path(out)
    if out.is_dir():
        raise ReportError(f"{out}: is a directory; give a file name for --out")
    if not out.absolute().parent.is_dir():
        raise ReportError(f"{out.absolute().parent}: directory does not exist; create it first")
    stem = out.with_suffix("")
    written: list[Path] = []
    views = []
    for run in data.shown:
        view = RunView(run, "" if len(data.shown) == 1 else f"-{run.position}")
        cmp = comparison(run.steps, run.baseline_phase)
        view.cards = _cards(run, cmp, data)
        view.comparison = _comparison_rows(cmp) if cmp is not None else None
        png = Path(f"{stem}{'-run' + str(run.position) if view.suffix else ''}-iterations.png")
        plot.plot_iterations(run, png)
        written.append(png)
        view.figure = _embed("iterations" + view.suffix, png, "Energy and time per iteration",
                             f"Energy: {run.energy_scope}. Dotted lines: medians of the baseline and deployed phases.")
        view.phases = [{"phase": r["phase"], "cells": [
            _cell("iterations", r["iterations"], str(r["iterations"])),
            _cell("time_s", r["time_s"], "%.1f ms" % (r["time_s"] * 1e3)),
            _cell("energy_j", r["energy_j"], "%.2f J" % r["energy_j"])]} for r in phase_rows(run.steps)]
        view.events = [{"step": str(ev.get("step")), "event": ev["event"], "data": json.dumps(ev.get("data"), default=str)}
                       for ev in run.events]
        view.straggler_phase = any(is_deployed(s.phase) and s.phase != DEPLOYED for s in run.steps)
        view.straggler_events = any(ev["event"] == "straggler" for ev in run.events)
        view.guard = guard_rows(run)
        view.prediction = prediction_rows(run)
        views.append(view)
    shared: list[Figure] = []
    used = used_points(data)
    if data.frontier is not None:
        fr_png = Path(f"{stem}-frontier.png")
        plot.plot_frontier_used(data.frontier, used, fr_png)
        written.append(fr_png)
        shared.append(_embed("frontier", fr_png, "Time-energy frontier and the points deployed",
                             f"Planned by Perseus from the profile (simulated on measured values): {data.frontier_path}."))
        if data.profile is not None:
            if used:
                point, n = first_deployed(data, used)
                label = f"deployed first ({n} iterations)"
            else:
                point, label = data.frontier.default_point(), "no-slowdown point (not deployed in this run)"
            tl_png = Path(f"{stem}-timeline.png")
            plot.plot_timeline(data.frontier, point, label, data.profile, tl_png)
            written.append(tl_png)
            others = "" if len(used) < 2 else (
                f" The run also deployed {len(used) - 1} other point(s), marked on the frontier above.")
            shared.append(_embed("timeline", tl_png, "Per-stage clock timeline of the deployed plan",
                                 "One iteration simulated on the profile: all max clock above, the plan the run "
                                 "deployed first below, each instruction colored by its SM clock." + others))
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"], default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    schedule = None
    if data.frontier is not None:
        s = data.frontier.schedule
        schedule = f"{s.name}, {s.num_stages} stages x {s.num_microbatches} microbatches, {data.frontier.gpu_name}"
    page = env.get_template(TEMPLATE).render(
        data=data, views=views, shared=shared, schedule=schedule, shown=shown_text(data),
        runs=[dict(run_summary(r), shown=r in data.shown) for r in data.runs if r.steps],
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(page)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return [out, *written]


def make_report(run_dir: Path, out: Path | None = None, metrics: Path | None = None,
                cache: Path | None = None, run: str = LATEST) -> tuple[RunData, list[Path]]:
    """Read ``run_dir`` (or a metrics file), choose ``run`` (``latest``, ``all``, an id or a position)
    and write the page (default ``report.html`` in that directory)."""
    run_dir = Path(run_dir)
    data = load_run(run_dir, metrics, cache, run)
    where = run_dir.parent if run_dir.is_file() else run_dir  # given the metrics file itself: next to it
    return data, write_report(data, out if out is not None else where / "report.html")


__all__ = ["ALL", "LATEST", "make_report", "write_report", "run_summary", "shown_text"]
