"""Issue 34's acceptance on the unpadded DeepSpeed workload: a lying profile is caught, an honest
one is kept, and either way the run's last steps are within +5 % of a measure-only run.

The workload is ``tests/deepspeed/alexnet_pipe_train.py`` (2 stages under torchrun on CPU,
simulated GPUs whose instructions are kernels stretched by the clock), with a 4-step epoch (the
data loader recreates its iterator every 4 steps: a periodic host event of period 4). Steps:

1. profile once (``mode: profile``, 3 clocks) and keep the cache's ``profile.json``: the honest one;
2. write the lying profile: every instruction's time at every clock set to its time at the top
   clock (flat across clocks), energies kept, so the planner believes the lowest clocks cost no
   time;
3. three runs of ``--steps`` steps from the same script: ``measure-only``; ``profile_path`` =
   the lying profile; ``profile_path`` = the honest one.

Reported per run: the step it deployed at, the guard's decisions (from the metrics file), the
last window's CUSUM statistic and probe share per pipeline, the probes' extra energy, and the
median of the last ``--tail`` step times over the measure-only run's (the acceptance is <= 1.05).

Usage: ``python benchmarks/bench_guard_e2e.py [--steps 140] [--tail 30] [--hog] [--out DIR [--reuse]
[--runs 'lying profile']]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests", ROOT / "tests" / "deepspeed"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from unpadded_workload import SHORT_RUN, WorkloadRun, lying, read_metrics, run_beside_cpu_hog


def summarize(name: str, run: WorkloadRun, tail: int, reference_s: float | None) -> dict[str, Any]:
    if run.returncode != 0:
        return {"run": name, "error": run.log[-1500:]}
    times = [r["time_s"] for r in run.records]
    phases = [r["phase"] for r in run.records]
    guard = [e for e in run.events if e["event"] == "guard"]
    last = guard[-1]["data"] if guard else {}
    pipelines = last.get("pipelines", {})
    tail_s = median(times[-tail:])
    return {
        "run": name, "deployed_at": phases.index("deployed") if "deployed" in phases else None,
        "end_phase": phases[-1], "windows": len(guard),
        "actions": [f"{e['data']['action']}@{e['step']}" for e in guard if e["data"]["action"] != "keep"],
        "statistic": {dp: round(p["statistic"], 2) for dp, p in pipelines.items()},
        "probe_share": {dp: round(p["probe_share"], 3) for dp, p in pipelines.items()},
        "probe_extra_energy_j": {dp: round(p["probe_extra_energy_j"], 1) for dp, p in pipelines.items()},
        "tail_median_s": tail_s, "tail_vs_measure_only": None if reference_s is None else tail_s / reference_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=140)
    parser.add_argument("--tail", type=int, default=30)
    parser.add_argument("--hog", action="store_true", help="a busy loop beside the runs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true", help="keep --out's profile and runs that finished")
    parser.add_argument("--runs", default="measure-only,lying profile,honest profile")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_guard_e2e_"))
    timeout = 1800.0

    found = sorted((out / "profile" / "cache").rglob("profile.json")) if args.reuse else []
    if not found:
        profiled = run_beside_cpu_hog(out / "profile", 12, {"mode": "profile"}, hog=args.hog, timeout_s=timeout)
        found = sorted((out / "profile" / "cache").rglob("profile.json"))
        if profiled.returncode != 0 or not found:
            raise SystemExit(f"profiling run failed (rc {profiled.returncode}):\n{profiled.log[-3000:]}")
    honest = found[0]
    lie = out / "lying_profile.json"
    lie.write_text(json.dumps(lying(json.loads(honest.read_text()))))

    wanted = args.runs.split(",")
    sections = {"measure-only": {"mode": "measure-only"}, "lying profile": {"profile_path": str(lie)},
                "honest profile": {"profile_path": str(honest)}}
    runs: list[dict[str, Any]] = []
    reference = None
    for name, section in sections.items():
        where = out / name.replace(" ", "_").replace("-", "_")
        if name in wanted or not (args.reuse and (where / "metrics.jsonl").exists()):
            (where / "metrics.jsonl").unlink(missing_ok=True)  # a new run, not appended to an old one
            run = run_beside_cpu_hog(where, args.steps, {**section, "iters_per_freq": SHORT_RUN["iters_per_freq"]},
                                     hog=args.hog, timeout_s=timeout)
        else:
            records, events = read_metrics(where / "metrics.jsonl")
            latest = records[-1]["run_id"] if records else None  # an appended file: its last run
            run = WorkloadRun(0, [r for r in records if r.get("run_id") == latest],
                              [e for e in events if e.get("run_id") == latest], "")
        runs.append(summarize(name, run, args.tail, reference))
        if name == "measure-only":
            reference = runs[-1].get("tail_median_s")
    print(f"\nunpadded AlexNet, 2 stages, 4-step epoch, {args.steps} steps, last {args.tail} compared"
          f"{', beside a busy loop' if args.hog else ''}; files under {out}")
    for row in runs:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
