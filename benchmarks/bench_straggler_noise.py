#!/usr/bin/env python
"""False straggler switches on recorded iteration-time noise (no straggler in the run).

    python benchmarks/bench_straggler_noise.py                # replay tests/data/straggler_noise.json
    python benchmarks/bench_straggler_noise.py --record PATH  # record a new trace (toy run, ~1 min)

Recording runs the toy pipeline (2 data-parallel pipelines × 2 stages, gloo, simulated GPUs)
deployed at its frontier's default point with straggler checks off, and keeps every rank's
iteration times: the noise of this machine, nothing else. The replay feeds the periodic job
check's numbers to ``StragglerPolicy`` (``tests/runtime/noise_trace.py``) for the default
settings and for settings without hysteresis; every switch is false. The table is what
docs/reliability.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

from noise_trace import TRACE, load_trace, replay
from perseus.frontier import save_frontier

SETTINGS = [  # (name, threshold, recover, patience)
    ("default (5 % / 2 %, patience 2)", 0.05, 0.02, 2),
    ("no patience (5 % / 2 %, patience 1)", 0.05, 0.02, 1),
    ("no hysteresis (5 % / 4.9 %, patience 1)", 0.05, 0.049, 1),
    ("tight (2 % / 1 %, patience 1)", 0.02, 0.01, 1),
]


def record(path: Path, steps: int) -> None:
    from toy_helpers import stage_uniform_frontier
    from toy_pipeline import ToyConfig, launch

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ToyConfig(num_stages=2, num_microbatches=4, dp_size=2, steps=steps)
        frontier = Path(tmp) / "frontier.json"
        save_frontier(stage_uniform_frontier(cfg, [1410, 1260, 1110, 960]), frontier)
        cfg.perseus = {"frontier_path": str(frontier), "warmup_steps": 2, "cache_dir": None,
                       "straggler_period_steps": 0, "log_every_steps": 0}
        results = launch(cfg, Path(tmp) / "run", timeout_s=900)
    for r in results:
        if r["error"]:
            raise SystemExit(f"rank {r['rank']}: {r['error']}")
    trace = {
        "what": "per-rank iteration times (ms) of the toy pipeline, 2 DP x 2 stages, deployed default point, "
                "no straggler; recorded on the shared 2-core CPU machine",
        "load_average_at_record": os.getloadavg()[0],
        "num_stages": 2, "dp_size": 2,
        "step_ms": {str(r["rank"]): [round(s["time_s"] * 1e3, 2) for s in r["steps"][cfg.perseus["warmup_steps"]:]]
                    for r in results},
    }
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes, load average {trace['load_average_at_record']:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", type=Path, help="record a new trace to this file instead of replaying")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--trace", type=Path, default=TRACE)
    args = ap.parse_args()
    if args.record:
        record(args.record, args.steps)
        return
    trace = load_trace(args.trace)
    steps = min(len(t) for t in trace["step_ms"].values())
    print(f"trace {args.trace.name}: {steps} steps x {len(trace['step_ms'])} ranks, "
          f"load average {trace['load_average_at_record']:.1f} when recorded")
    print(f"{'settings':42} {'K':>3} {'checks':>6} {'false switches':>15} {'per check':>9}")
    for k in (5, 10, 20):
        for name, thr, rec, pat in SETTINGS:
            rp = replay(trace, k, thr, rec, pat)
            total = sum(rp.switches.values())
            print(f"{name:42} {k:>3} {rp.checks:>6} {total:>15} {rp.rate:>9.3f}")


if __name__ == "__main__":
    main()
