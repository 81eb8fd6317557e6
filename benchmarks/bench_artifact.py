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
than the all-max baseline (the mean of the all-max runs' medians); and ``planned_saving``, the
project's own plan (``plan_frontier`` on the model fitted on every run) at the measured all-max
time against the all-max plan, both predicted. Nothing is specific to a workload: everything
comes from the files. ``--json`` prints one object ``{"workloads": [...]}``; otherwise a table.
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
    extract_archive,
    find_workload_dirs,
    leave_one_out,
    measured_best_saving,
    planned_saving,
    read_workload,
)

ERRORS = ("time_error_median", "time_error_max", "energy_error_median", "energy_error_max")
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
        "baseline_schedules": [workload.runs[i].index for i in workload.all_max],
        "p_blocking_w": None,
        "non_compute_s": None,
        "stalled_iterations": sum(r.stalled_iterations() for r in workload.runs),
        "iterations": sum(len(r.iteration_times_s) - 1 for r in workload.runs),
    }
    try:
        best = measured_best_saving(workload, 0.005)
        entry["measured_best_saving_0p5"] = None if best is None else round(best, 6)
        check = leave_one_out(workload)
        planned = planned_saving(check.model, workload).saving if plan else None
    except ProfileError as exc:
        entry["why"] = [f"no model: {exc}"]
        return entry
    entry.update(describable=check.describable, why=list(check.reasons),
                 planned_saving=None if planned is None else round(planned, 6),
                 p_blocking_w=round(check.model.p_blocking_w, 2), non_compute_s=round(check.model.overhead_s, 4),
                 stalled_instance_share=round(check.model.table.stalled_share(), 6))
    if check.describable:
        entry.update({key: round(getattr(check, key), 6) for key in ERRORS})
    return entry


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
             "best ≤0.5 %", "planned", "P_block", "non-compute")]
    for w in result["workloads"]:
        rows.append((w["model"], f"{w['stages']}×{w['microbatches']}", str(w["schedules"]), "yes" if w["describable"] else "no",
                     f"{_pct(w['time_error_median'])} / {_pct(w['time_error_max'])}",
                     f"{_pct(w['energy_error_median'])} / {_pct(w['energy_error_max'])}",
                     _pct(w["measured_best_saving_0p5"]), _pct(w["planned_saving"]), _unit(w["p_blocking_w"], "W"),
                     _unit(w["non_compute_s"], "s")))
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
