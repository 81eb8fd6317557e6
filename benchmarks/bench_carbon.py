#!/usr/bin/env python
"""Carbon- and power-aware points on the GPT-3 175B A100 8×12 frontier, a year of two US grids.

    python benchmarks/bench_carbon.py [--budget 2.5] [--gpus 1024 --tp 8] [--json]

What it measures (docs/carbon.md quotes the table):

1. The frontier is planned from the public Perseus artifact's A100 profile (../shared/data/
   perseus-sosp24, Apache-2.0), 8 stages × 12 microbatches, 1F1B, P_blocking 83.64 W.
2. Each hourly 2022 trace (../shared/data/carbon: EIA-930 generation, public domain; intensity as
   published by HewlettPackard/dc-rl, MIT) is replayed through the real policy and the real
   forecaster (``perseus.carbon.replay``), every hour's point chosen from the forecast made from
   the hours before it. Carbon is per unit of work against all-max clocks, all in the same run:
   no-slowdown point, uniform point at the budget, forecast-driven, hindsight (one price, the
   whole year known). The gap to hindsight is in points of saving. Rows for the online policy's
   two horizons (the budget restored over 24 h, or over a week).
3. Forecast error: the ridge forecaster against persistence on the same hours (MAE, gCO2/kWh).
4. Demand response: a job cap of 90 % of the all-max job power, shed to 80 % in each day's four
   most carbon-intense hours as forecast (a utility's peak event); the fastest point under the
   cap each hour. Windows over the cap, and the throughput loss against all-max clocks beside the
   fractional bound (two points mixed within the hour to sit exactly at the cap).

Time is emulated (the frontier's planned iteration times), not measured on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"
PROFILE = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", SHARED / "perseus-sosp24")) / "gpt3-175b+a100_sxm_bf16.csv"
TRACES = Path(os.environ.get("PERSEUS_CARBON_DATA", SHARED / "carbon"))


def frontier_a100():
    from perseus.planner import plan_frontier
    from perseus.profile import load_csv
    from perseus.schedules import build_schedule

    return plan_frontier(build_schedule("1f1b", 8, 12), load_csv(PROFILE, 83.64))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=2.5, help="time budget, percent (default 2.5)")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for path in (PROFILE, TRACES / "CISO.csv"):
        if not path.exists():
            print(f"bench_carbon: {path} is missing (the shared data beside the checkout)", file=sys.stderr)
            return 2

    from perseus.carbon.forecast import HourlyForecaster, rolling_forecast
    from perseus.carbon.policy import PointMenu
    from perseus.carbon.replay import replay_carbon, replay_power_cap
    from perseus.carbon.signals import load_trace

    frontier = frontier_a100()
    menu = PointMenu.from_frontier(frontier)
    scale = args.gpus / frontier.schedule.num_stages
    budget = args.budget / 100
    rows, caps_rows = [], []
    for region in ("CISO", "ERCO"):
        trace = load_trace(TRACES / f"{region}.csv")
        ci = trace.hourly()
        hour0 = int((trace.times[0] // 3600) % 24)
        for horizon in (24, 168):
            s = replay_carbon(menu, ci, hour0, budget, scale, horizon=horizon).summary()
            s.update(region=region, horizon_h=horizon, gap_points=100 * (s["hindsight_carbon_saving"] - s["carbon_saving"]))
            rows.append(s)
        forecast = rolling_forecast(ci, hour0, HourlyForecaster())
        all_max_w = scale * frontier.baseline_energy_j / frontier.baseline_time_s
        caps = np.full(len(ci), 0.9 * all_max_w)
        for day in range(0, len(ci), 24):
            peak = day + np.argsort(forecast[day:day + 24])[-4:]
            caps[peak] = 0.8 * all_max_w
        p = replay_power_cap(menu, caps, scale).summary()
        p.update(region=region)
        caps_rows.append(p)

    if args.json:
        print(json.dumps({"carbon": rows, "power_cap": caps_rows}, indent=2))
        return 0
    print(f"GPT-3 175B A100 8x12 frontier ({len(frontier.points)} points), {args.gpus} GPUs (TP {args.tp}), "
          f"time budget +{args.budget:g} %, hourly 2022 traces")
    head = (f"{'grid':<5}{'horizon':>8}{'no-slowdown':>12}{'uniform':>9}{'forecast':>9}{'hindsight':>10}"
            f"{'gap (pts)':>10}{'time':>8}{'<= budget+0.1%':>15}{'MAE':>6}{'persist.':>9}")
    print(head)
    for r in rows:
        within = r["time_change"] <= budget + 0.001
        print(f"{r['region']:<5}{r['horizon_h']:>7}h{100 * r['no_slowdown_carbon_saving']:>11.2f}%"
              f"{100 * r['uniform_carbon_saving']:>8.2f}%{100 * r['carbon_saving']:>8.2f}%"
              f"{100 * r['hindsight_carbon_saving']:>9.2f}%{r['gap_points']:>10.2f}{100 * r['time_change']:>+7.2f}%"
              f"{'yes' if within else 'NO':>15}{r['forecast_mae']:>6.1f}{r['persistence_mae']:>9.1f}")
    print("\ndemand response: cap 90 % of all-max job power, 80 % in each day's 4 highest-forecast hours")
    print(f"{'grid':<5}{'all-max W':>11}{'cap W (min-max)':>20}{'max W run':>11}{'windows over cap':>18}"
          f"{'throughput loss':>16}{'bound':>7}")
    for p in caps_rows:
        print(f"{p['region']:<5}{p['all_max_power_w']:>11.0f}{p['cap_w_min']:>10.0f}-{p['cap_w_max']:<9.0f}"
              f"{p['max_power_w']:>11.0f}{p['windows_over_cap']:>12}/{p['windows']:<5}"
              f"{100 * p['throughput_loss']:>15.2f}%{100 * p['hindsight_throughput_loss']:>6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
