"""The demo's per-rank results (``rank*.json``) as one metrics file of the whole job, for ``perseus report``.

Why here: ``perseus report`` reads one format, the runtime's JSONL metrics file
(``perseus.output.run_data``), and the library never imports the demo. So the demo converts its
own results: after every run, ``launch_ranks`` writes ``job-metrics.jsonl`` next to the rank
files, and ``perseus demo --out DIR && perseus report DIR`` shows the job. Per iteration, time is
the slowest rank's and energy the sum over ranks (``energy_ranks``: all GPUs of the job), as in
the demo's own table; the profiled clock comes from the instructions' clocks, and the events from
rank 0's runtime summary. Older demo directories are converted with
``python -m perseus_demo.job_metrics DIR``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from perseus.atomic import write_atomic
from perseus.errors import PerseusError
from perseus.runtime.observe.metrics_file import RUN_ID_KEY, new_run_id

FILE_NAME = "job-metrics.jsonl"


def job_records(results: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Step and event records of the job, in step order (events before the step they precede)."""
    by_step: dict[int, dict[str, Any]] = {}
    for result in results:
        for rec in result["steps"]:
            row = by_step.setdefault(rec["step"], {RUN_ID_KEY: run_id, "step": rec["step"], "phase": rec["phase"],
                                                   "time_s": 0.0, "energy_j": 0.0, "freq_mhz": None,
                                                   "energy_ranks": 0})
            row["time_s"] = max(row["time_s"], rec["time_s"])
            if rec["energy_j"] is None or row["energy_j"] is None:  # a rank's counter failed: unmeasured
                row["energy_j"] = None
            else:
                row["energy_j"] += rec["energy_j"]
            row["energy_ranks"] += 1
            clocks = [inst[3] for inst in rec.get("instructions") or []
                      if isinstance(inst, list) and len(inst) == 4 and isinstance(inst[3], int)]
            if rec["phase"] == "profiling" and clocks and row["freq_mhz"] is None:
                row["freq_mhz"] = Counter(clocks).most_common(1)[0][0]  # the clock being profiled
    root = next((r for r in results if r.get("rank") == 0), results[0] if results else {})
    events = [{RUN_ID_KEY: run_id, "event": str(e[1]), "step": e[0], "data": e[2]}
              for e in (root.get("summary") or {}).get("events") or [] if isinstance(e, (list, tuple)) and len(e) == 3]
    keyed = [((r["step"], 1), r) for r in by_step.values()]
    keyed += [((e["step"] if isinstance(e["step"], int) else -1, 0), e) for e in events]
    return [r for _, r in sorted(keyed, key=lambda kr: kr[0])]


def read_rank_results(run_dir: Path) -> list[dict[str, Any]]:
    """The ``rank*.json`` files of a demo directory; one that is not a demo result is an error naming it."""
    results = []
    for path in sorted(Path(run_dir).glob("rank*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PerseusError(f"{path}: cannot read per-rank results ({getattr(exc, 'msg', None) or exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or \
                not all(isinstance(s, dict) for s in data["steps"]):
            raise PerseusError(f"{path}: not a per-rank result of 'perseus demo' (no 'steps' list of objects)")
        results.append(data)
    if not results:
        raise PerseusError(f"{run_dir}: no per-rank results (rank*.json of 'perseus demo')")
    return results


def write_job_metrics(out_dir: Path, results: list[dict[str, Any]], run_id: str | None = None) -> Path:
    """Write ``out_dir/job-metrics.jsonl`` (whole, atomically) from the ranks' results; returns its path."""
    path = Path(out_dir) / FILE_NAME
    records = job_records(results, run_id or new_run_id())
    write_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m perseus_demo.job_metrics DIR``: convert a demo directory's rank files."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m perseus_demo.job_metrics DEMO_DIR", file=sys.stderr)
        return 2
    try:
        path = write_job_metrics(Path(args[0]), read_rank_results(Path(args[0])))
    except PerseusError as exc:
        print(f"perseus: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
