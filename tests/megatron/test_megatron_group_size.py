"""Interleaved 1F1B with ``microbatch_group_size_per_vp_stage`` ≠ pipeline size on real megatron-core.

2 stages × 2 virtual chunks × 6 microbatches in groups of 3 (megatron's default group would be 2:
a different order). The run goes through warm-up → profiling → planning → deployed under
torchrun/gloo with simulated GPUs: every rank executes the group-3 order Perseus planned (the
runtime's plan check would fall back on the first differing instruction), the cache and the
frontier file record the group size, and every dependency edge of the planner's DAG — joint
receives included — held in the real run: an instruction began only after each instruction the
DAG says it waits for had ended on its rank (and so had every instruction the model of megatron's
exchanges in ``megatron_p2p_model`` says it waits for: that model is checked on the real run too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import cached_frontier, check_deployed_demo  # noqa: E402
from megatron_p2p_model import megatron_waits  # noqa: E402

from perseus.schedule import build_schedule  # noqa: E402
from perseus_demo.megatron_demo import DemoConfig, launch  # noqa: E402

pytestmark = pytest.mark.distributed

STAGES, CHUNKS, MICROBATCHES, GROUP = 2, 2, 6, 3


def edges_violated(results: list[dict], schedule, edges) -> list[str]:
    """Cross-stage edges u→v with v begun before u ended, in any iteration every rank recorded."""
    by_stage = {r["stage"]: {rec["step"]: rec for rec in r["steps"]} for r in results}
    steps = set.intersection(*(set(s) for s in by_stage.values()))
    edges = [(u, v) for u, v in edges if u[0] != v[0]]
    bad = []
    for step in sorted(steps):
        times = {s: by_stage[s][step]["instruction_times"] for s in by_stage}
        for (us, ui), (vs, vi) in edges:
            ended, began = times[us][ui][1], times[vs][vi][0]
            if began < ended:
                bad.append(f"step {step}: {schedule.stages[vs][vi].short()} on stage {vs} began "
                           f"{(ended - began) * 1e3:.2f} ms before {schedule.stages[us][ui].short()} on stage {us} ended")
    return bad


def test_group_size_other_than_pipeline_size_is_profiled_planned_and_deployed(tmp_path):
    cfg = DemoConfig(stages=STAGES, chunks=CHUNKS, microbatches=MICROBATCHES, group_size=GROUP, max_steps=60,
                     deployed_steps=6, startup_steps=1, rebaseline_steps=3)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(tmp_path / "cache"))
    results = launch(cfg, tmp_path / "out", timeout_s=600)
    schedule = build_schedule("interleaved", STAGES, MICROBATCHES, CHUNKS, group_size=GROUP)
    assert schedule.stages != build_schedule("interleaved", STAGES, MICROBATCHES, CHUNKS).stages

    # megatron-core ran the group-3 order in every iteration, on every rank
    for result in results:
        want = [[i.kind, i.microbatch, i.chunk] for i in schedule.stages[result["stage"]]]
        for rec in result["steps"]:
            assert [i[:3] for i in rec["instructions"]] == want, (result["rank"], rec["step"])

    # planned for that order, deployed without a plan mismatch, and saving energy on the true model
    accounting = check_deployed_demo(results, cfg, tmp_path / "cache")
    frontier = cached_frontier(tmp_path / "cache")
    assert frontier.schedule == schedule and frontier.schedule.group_size == GROUP
    (entry,) = [p.parent for p in (tmp_path / "cache").glob("*/frontier.json")]
    assert json.loads((entry / "frontier.json").read_text())["group_size"] == GROUP
    assert json.loads((entry / "key.json").read_text())["group_size"] == GROUP

    # the stamps are real: each rank's instructions ran one after another, each taking time
    for result in results:
        for rec in result["steps"]:
            flat = [t for pair in rec["instruction_times"] for t in pair]
            assert all(a < b for a, b in zip(flat, flat[1:])), (result["rank"], rec["step"])

    # the DAG the plan was made on, joint receives included, never claimed a dependency the real
    # run did not have; nor did the model of megatron's exchanges that tests/megatron/test_megatron_dag_edges.py
    # checks the DAG against
    joint = {(s, i) for s, pairs in enumerate(schedule.joint_receives) for i, _ in pairs}
    assert any(v in joint for u, v in schedule.dependencies() if u[0] != v[0]), "joint-receive edges to check"
    assert edges_violated(results, schedule, schedule.dependencies()) == []
    waits = megatron_waits(STAGES, CHUNKS, MICROBATCHES, GROUP)
    assert edges_violated(results, schedule, [(u, v) for v, srcs in waits.items() for u in srcs]) == []
    print(f"\ngroup size {GROUP}: {accounting}")
