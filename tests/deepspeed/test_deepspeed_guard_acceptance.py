"""Issue 34's acceptance, the part a test may assert, beside a busy loop: the unpadded DeepSpeed
AlexNet pipeline (2 stages under torchrun on CPU, simulated GPUs, a 4-step epoch whose data loader
recreates its iterator every 4 steps) deploys a lying profile (every instruction's time flat
across clocks: the planner takes the lowest clock for free) and the no-slowdown guard catches it:
the run falls back or moves faster and says why, from its own metrics file (``tests/guard_checks.py``).

The honest half (the same workload's own profile kept deployed, no false alarm) is
``test_deepspeed_unpadded.py``'s minimal-section run. The "+5 % of a measure-only run" half is
a wall-clock ratio, so it is measured, not asserted: ``benchmarks/bench_guard_e2e.py`` and
docs/runtime.md, "Measured end to end".
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("deepspeed")

from guard_checks import check_guard_run
from unpadded_workload import lying, run_beside_cpu_hog

PROFILE_STEPS = 12  # 2 warm-up steps, one step per clock at 1410/810/210 MHz, the rest measured
# The profile path deploys after warm-up (step 2); a lie this large scores the highest rank score
# every window, so the CUSUM (reference 0.25, threshold 7) alarms after about 6 windows of 8-9
# steps (measured: the fall-back 54 deployed steps in, without a busy loop). 100 steps leave room.
STEPS = 100


@pytest.mark.distributed
def test_a_lying_profile_is_caught_beside_a_busy_loop(tmp_path):
    profiled = run_beside_cpu_hog(tmp_path / "profile", PROFILE_STEPS, {"mode": "profile"}, timeout_s=600.0)
    assert profiled.returncode == 0, profiled.log[-4000:]
    found = sorted((tmp_path / "profile" / "cache").rglob("profile.json"))
    assert found, f"no profile written: {profiled.log[-2000:]}"
    lie = tmp_path / "lying_profile.json"
    lie.write_text(json.dumps(lying(json.loads(found[0].read_text()))))

    run = run_beside_cpu_hog(tmp_path / "lying", STEPS, {"profile_path": str(lie)}, timeout_s=900.0)
    assert run.returncode == 0, run.log[-4000:]
    verdict = check_guard_run(run.records, run.events)
    print(f"\nlying profile beside a busy loop: {verdict.describe()}")
    for event in run.events:
        if event["event"] == "loop_period":
            print(f"the loop's own period, reported at step {event['step']}: {event['data']}")
    assert verdict.fell_back or verdict.moves > 0, f"a lying plan stayed deployed: {verdict.describe()}"
    guard = [e for e in run.events if e["event"] == "guard" and e["data"]["action"] != "keep"]
    assert guard and "measurably slower" in guard[0]["data"]["reason"]
