"""The model against real measured runs: the Perseus artifact's A100 runs at many clock schedules.

    python benchmarks/bench_artifact.py --runs DIR [--json] [--no-plan]

DIR holds workload directories in the artifact's naming (``merak+<model>+...+dp1+pp<S>+tp1+mbs<b>
+nmb<M>+PointSolution``), or is one, or is the artifact's ``measured-a100.tar.xz`` or its unpacked
root (then Perseus's runs are read, not EnvPipe's; a tarball is unpacked to a temporary directory).
Default: ``measured-a100.tar.xz`` in ``$PERSEUS_ARTIFACT_DATA`` (``../shared/data/perseus-sosp24``).

Per workload (``perseus.measured``): every schedule predicted leave-one-schedule-out with the
project's timeline code; whether the model describes the workload (``perseus.measured.check``
says which bounds and why); the errors (absolute fractions: median and max over its schedules;
null where it is not describable); the best measured saving among schedules at most 0.5 % slower
than the all-max baseline (the mean of the all-max runs' medians); ``planned_saving`` and
``planned_saving_0p5``, the project's own plan (``plan_frontier`` on the model fitted on every
run, with its non-compute time: ``measured.model_frontier``) at no slowdown and at the job's
+0.5 % (``Frontier.lookup_slowdown``), against the all-max plan, both predicted (``..._by_slowdown``:
measured and planned at +0.5, +1 and +5 %; ``planned_saving_instructions``: the no-slowdown plan
on the instructions' energy alone, without the non-compute energy); and
``default_run``, the fastest plan the artifact ran (the one Perseus deploys by default), its
slowdown and saving as measured and as predicted by a model that never saw it. Nothing is specific
to a workload: everything comes from the files. ``--json`` prints one object ``{"workloads":
[...]}``; otherwise a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.errors import PerseusError, ProfileError
from perseus.measured import (
    Workload,
    WorkloadCheck,
    extract_archive,
    find_workload_dirs,
    leave_one_out,
    measured_baseline,
    measured_best_saving,
    model_frontier,
    planned_saving,
    read_workload,
)

ERRORS = ("time_error_median", "time_error_max", "energy_error_median", "energy_error_max")
SLOWDOWNS = (0.005, 0.01, 0.05)  # the targets the savings are also given at, measured and planned
DEFAULT_RUNS = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"
                                   / "perseus-sosp24")) / "measured-a100.tar.xz"


def workload_entry(directory: Path, plan: bool = True) -> dict[str, Any]:
    """The bench's JSON entry for one workload directory. A malformed file stops the bench (one
    line); runs too few to fit the model make the workload not describable, saying why."""
    workload = read_workload(directory)
    entry: dict[str, Any] = {
        "name": workload.name,
        "model": workload.shape.model,
        "stages": workload.stages,
        "microbatches": workload.microbatches,
        "schedules": len(workload.runs),
        "describable": False,
        "why": [],
        **{key: None for key in ERRORS},
        "measured_best_saving_0p5": None,
        "planned_saving": None,
        "planned_saving_0p5": None,
        "planned_saving_instructions": None,  # the no-slowdown plan's saving on the instructions' energy alone
        "measured_best_saving_by_slowdown": None,
        "planned_saving_by_slowdown": None,
        "default_run": None,
        "baseline_schedules": [workload.runs[i].index for i in workload.all_max],
        "p_blocking_w": None,
        "non_compute_s": None,
        "non_compute_share": None,  # of the measured all-max iteration
        "stalled_iterations": sum(r.stalled_iterations() for r in workload.runs),
        "iterations": sum(len(r.iteration_times_s) - 1 for r in workload.runs),
    }
    try:
        best = {str(x): measured_best_saving(workload, x) for x in SLOWDOWNS}
        entry["measured_best_saving_by_slowdown"] = {x: None if b is None else round(b, 6) for x, b in best.items()}
        entry["measured_best_saving_0p5"] = entry["measured_best_saving_by_slowdown"]["0.005"]
        check = leave_one_out(workload)
        frontier = model_frontier(check.model) if plan else None
        planned = [round(planned_saving(check.model, workload, max_slowdown=x, frontier=frontier).saving, 6)
                   if frontier is not None else None for x in (0.0, *SLOWDOWNS)]
        default = default_run(workload, check)
    except ProfileError as exc:
        entry["why"] = [f"no model: {exc}"]
        return entry
    entry.update(describable=check.describable, why=list(check.reasons), default_run=default,
                 planned_saving=planned[0], planned_saving_0p5=planned[1],
                 planned_saving_instructions=None if frontier is None else round(
                     1 - frontier.default_point().energy_j / frontier.baseline_energy_j, 6),
                 planned_saving_by_slowdown=None if not plan else dict(zip(map(str, SLOWDOWNS), planned[1:])),
                 p_blocking_w=round(check.model.p_blocking_w, 2), non_compute_s=round(check.model.overhead_s, 4),
                 non_compute_share=round(check.model.overhead_s / measured_baseline(workload).time_s, 6),
                 stalled_instance_share=round(check.model.table.stalled_share(), 6))
    if check.describable:
        entry.update({key: round(getattr(check, key), 6) for key in ERRORS})
    return entry


def default_run(workload: Workload, check: WorkloadCheck) -> dict[str, Any] | None:
    """The fastest planned run against the all-max baseline: measured, and predicted leave-one-out."""
    if not any(not c.all_max for c in check.schedules):
        return None
    run = check.schedules[check.default]
    base = measured_baseline(workload)
    return {"schedule": run.index,
            "measured_slowdown": round(run.measured_time_s / base.time_s - 1, 6),
            "predicted_slowdown": round(run.predicted.time_s / base.time_s - 1, 6),
            "measured_saving": round(1 - run.measured_energy_j / base.energy_j, 6),
            "predicted_saving": round(1 - run.predicted.energy_j / base.energy_j, 6)}


def run(runs: Path, plan: bool = True) -> dict[str, Any]:
    """Every workload under ``runs`` (a directory or a tarball of them)."""
    if runs.is_file():
        with tempfile.TemporaryDirectory(prefix="perseus-measured-") as tmp:
            return run(extract_archive(runs, tmp), plan)
    dirs = find_workload_dirs(runs)
    if not dirs:
        raise PerseusError(f"{runs}: no workload directories (merak+...+pp<S>+...+nmb<M>+... holding N.sched.json)")
    return {"workloads": [workload_entry(d, plan) for d in dirs]}


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f} %"


def _unit(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:.3g} {unit}"


def table(result: dict[str, Any]) -> str:
    rows = [("workload", "S×M", "runs", "describable", "time err med/max", "energy err med/max",
             "best ≤0.5 %", "planned +0/+0.5 %", "default run slowdown/saving meas (pred)", "P_block", "non-compute")]
    for w in result["workloads"]:
        d = w["default_run"]
        rows.append((w["model"], f"{w['stages']}×{w['microbatches']}", str(w["schedules"]), "yes" if w["describable"] else "no",
                     f"{_pct(w['time_error_median'])} / {_pct(w['time_error_max'])}",
                     f"{_pct(w['energy_error_median'])} / {_pct(w['energy_error_max'])}",
                     _pct(w["measured_best_saving_0p5"]), f"{_pct(w['planned_saving'])} / {_pct(w['planned_saving_0p5'])}",
                     "—" if d is None else (f"{_pct(d['measured_slowdown'])} ({_pct(d['predicted_slowdown'])}) / "
                                            f"{_pct(d['measured_saving'])} ({_pct(d['predicted_saving'])})"),
                     _unit(w["p_blocking_w"], "W"), _unit(w["non_compute_s"], "s")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    for w in result["workloads"]:
        lines.append(f"{w['model']}: " + "; ".join(w["why"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS,
                        help="workload directories, one of them, the artifact's .tar.xz or its root")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-plan", action="store_true", help="skip the planner (planned_saving null)")
    args = parser.parse_args(argv)
    if not args.runs.exists():
        print(f"{args.runs}: not found (set --runs or PERSEUS_ARTIFACT_DATA)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        result = run(args.runs, plan=not args.no_plan)
    except PerseusError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(table(result))
        print(f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
