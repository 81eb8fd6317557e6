"""Issue 34's acceptance, the part a test may assert, beside a busy loop: the unpadded DeepSpeed
AlexNet pipeline (2 stages under torchrun on CPU, simulated GPUs, a 4-step epoch whose data loader
recreates its iterator every 4 steps) deploys a lying profile (every instruction's time flat
across clocks: the planner takes the lowest clock for free) and the no-slowdown guard catches it:
the run falls back or moves faster and says why, from its own metrics file (``tests/guard_checks.py``);
with the workload's own (honest) profile it never falls back. The guard's decisions follow its
evidence in both (``check_guard_run``).

The "+5 % of a measure-only run" halves are wall-clock ratios, so they are measured, not
asserted: ``benchmarks/bench_guard_e2e.py`` and docs/runtime.md, "Measured end to end".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from guard_checks import GuardVerdict, check_guard_run
from unpadded_workload import lying, run_beside_cpu_hog

PROFILE_STEPS = 12  # 2 warm-up steps, one step per clock at 1410/810/210 MHz, the rest measured
# The profile path deploys after warm-up (step 2); a lie this large scores the highest rank score
# every window, so the CUSUM (reference 0.25, threshold 5) alarms after about 4 windows of 6-7
# steps (measured with threshold 7 and 8-step windows: the fall-back 54 deployed steps in). 100 steps leave room.
STEPS = 100


@pytest.fixture(scope="module")
def honest_profile(tmp_path_factory) -> Path:
    """The workload's own 3-clock profile, measured beside a busy loop (shared by both runs)."""
    out = tmp_path_factory.mktemp("profile")
    profiled = run_beside_cpu_hog(out, PROFILE_STEPS, {"mode": "profile"}, timeout_s=600.0)
    assert profiled.returncode == 0, profiled.log[-4000:]
    found = sorted((out / "cache").rglob("profile.json"))
    assert found, f"no profile written: {profiled.log[-2000:]}"
    return found[0]


def guarded_run(out: Path, profile: Path) -> tuple[GuardVerdict, list[dict]]:
    run = run_beside_cpu_hog(out, STEPS, {"profile_path": str(profile)}, timeout_s=900.0)
    assert run.returncode == 0, run.log[-4000:]
    verdict = check_guard_run(run.records, run.events)
    print(f"\n{out.name} beside a busy loop: {verdict.describe()}")
    for event in run.events:
        if event["event"] in ("loop_period", "fallback"):
            print(f"  {event['event']} at step {event['step']}: {event['data']}")
    return verdict, run.events


@pytest.mark.distributed
def test_a_lying_profile_is_caught_beside_a_busy_loop(tmp_path, honest_profile):
    lie = tmp_path / "lying_profile.json"
    lie.write_text(json.dumps(lying(json.loads(honest_profile.read_text()))))
    verdict, _ = guarded_run(tmp_path / "lying", lie)
    assert verdict.fell_back or verdict.moves > 0, f"a lying plan stayed deployed: {verdict.describe()}"


# A plan slower than its probes by less than this is one the guard must keep (its tolerance is 1 %,
# its detectable slowdown 3 %).
FALSE_ALARM_EXCESS = 0.03


@pytest.mark.distributed
def test_the_honest_profile_stays_deployed_beside_a_busy_loop(tmp_path, honest_profile):
    """Kept. Only stage 0 judges a 1F1B pipeline (``job_guard.judging_stages``). Before that, the
    second stage's own span, 10-15 % longer under the plan (its instructions slowed within their
    slack), made the guard fall back in about one run of four while the job's steps were no slower.
    Since then it was kept in three runs of three, two of them here. A fall-back is still allowed if
    it names a measured excess of at least ``FALSE_ALARM_EXCESS``. The rank CUSUM's false-alarm
    rate is small, not zero: over 16 windows of this machine's heavy-tailed steps (the 4-step
    epoch's rebuild is +50 %), a run of unlucky probes can cross it. A false alarm would name
    about the 1 % tolerance."""
    verdict, events = guarded_run(tmp_path / "honest", honest_profile)
    if verdict.fell_back:
        reasons = [e["data"]["reason"] for e in events if e["event"] == "guard" and e["data"]["action"] == "fallback"]
        excess = [float(x) / 100 for r in reasons for x in re.findall(r"pipeline \d+ \+([\d.]+)%", r)]
        assert excess and min(excess) >= FALSE_ALARM_EXCESS, f"a false alarm on the honest plan: {verdict.describe()}; {reasons}"
