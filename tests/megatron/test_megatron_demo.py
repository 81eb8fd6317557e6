"""The Megatron demo on real megatron-core under torchrun: every phase, then default clocks again.

One launch: 4 pipeline stages × 2 virtual chunks × 10 microbatches (megatron-core's interleaved
1F1B) in microbatch groups of 5 (``microbatch_group_size_per_vp_stage``: megatron's default, the
stage count, cannot run 10 microbatches, and two groups make the order cross a group boundary;
one group of all 10 would be a different order). It profiles online, plans, deploys the no-slowdown plan and re-measures default clocks
(A/B/A). The deployed plan follows the instructions the hooks report (a wrong microbatch or chunk
index would show up as a fallback); the checks are on what the run did, not on wall-clock time
(``tests/demo_checks.py``; measured savings are in ``benchmarks/bench_demo.py``):

- the demo checks: every phase, the no-slowdown plan deployed on every rank, executed in order at
  the planned clocks, saving energy on the simulated GPU's own model;
- the group: every rank executed the group-5 order Perseus planned in every iteration, the cache
  and the frontier file record the group size, and every dependency edge of the planner's DAG —
  joint receives included — held in the real run: an instruction began only after each
  instruction the DAG says it waits for had ended on its rank (and so had every instruction the
  model of megatron's exchanges in ``megatron_p2p_model`` says it waits for: that model is checked
  on the real run too);
- ``perseus report`` reads the run (its ``rank*.json``, the metrics JSONL, the cache), guarding the
  formats it reads against drift.

A launch is what costs (every rank imports torch and megatron-core), so these checks share one.
The other real megatron-core runs: 2 stages 1F1B in ``test_megatron_dp_straggler.py`` (the
no-slowdown plan outside the straggler's window, with the same accounting); megatron's default
group in ``test_megatron_lm_pretrain_gpt.py`` (interleaved, 3 stages, deployed without a plan
mismatch); the recorded orders of 1F1B and interleaved (default group) on 2 and 4 stages in
``test_megatron_orders_torchrun.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import median
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import cached_frontier, check_deployed_demo  # noqa: E402
from megatron_p2p_model import megatron_waits  # noqa: E402

from perseus.cli import main  # noqa: E402
from perseus.html_report import load_run, used_points  # noqa: E402
from perseus.errors import ScheduleError  # noqa: E402
from perseus.schedule import build_schedule  # noqa: E402
from perseus_demo.common import format_report, phase_table  # noqa: E402
from perseus_demo.megatron_demo import DemoConfig, launch  # noqa: E402

pytestmark = pytest.mark.distributed

Run = tuple[Path, DemoConfig, list[dict[str, Any]]]
STAGES, CHUNKS, MICROBATCHES, GROUP = 4, 2, 10, 5


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory) -> Run:
    """The one torchrun of the demo (results, cache and rank 0's metrics file), shared by every test here."""
    run = tmp_path_factory.mktemp("interleaved-4x2")
    cfg = DemoConfig(stages=STAGES, chunks=CHUNKS, microbatches=MICROBATCHES, group_size=GROUP, max_steps=1000,
                     deployed_steps=6, startup_steps=1, rebaseline_steps=4)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(run / "cache"),
                       metrics_file=str(run / "metrics.jsonl"))
    return run, cfg, launch(cfg, run, timeout_s=600)


def test_demo_profiles_plans_and_deploys_a_plan_that_saves_energy(interleaved):
    run, cfg, results = interleaved
    for result in results:
        clocks = result["summary"]["profiled_clocks_mhz"]
        assert len(clocks) == 3 and clocks == sorted(clocks, reverse=True)
        assert all(a - b >= 250 for a, b in zip(clocks, clocks[1:]))  # freq_step_mhz reached the runtime
        assert result["summary"]["frontier"]["points"] >= 2
    assert sorted(r["stage"] for r in results) == [0, 1, 2, 3]
    table = phase_table(results)
    assert {"warmup", "profiling", "deployed", "baseline again"} <= set(table), table
    assert table["baseline again"]["iterations"] == cfg.rebaseline_steps
    accounting = check_deployed_demo(results, cfg, run / "cache")
    print(f"\n{cfg.stages} stages x {cfg.chunks} chunks, groups of {cfg.group_size}:\n{format_report(table)}\n{accounting}")


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


def test_group_size_other_than_pipeline_size_is_planned_and_deployed_with_its_waits(interleaved):
    run, cfg, results = interleaved
    schedule = build_schedule("interleaved", STAGES, MICROBATCHES, CHUNKS, group_size=GROUP)
    with pytest.raises(ScheduleError, match="modulo group size"):  # as megatron-core refuses it
        build_schedule("interleaved", STAGES, MICROBATCHES, CHUNKS)
    assert schedule.stages != build_schedule("interleaved", STAGES, MICROBATCHES, CHUNKS, group_size=MICROBATCHES).stages

    # megatron-core ran the group-5 order in every iteration, on every rank
    for result in results:
        want = [[i.kind, i.microbatch, i.chunk] for i in schedule.stages[result["stage"]]]
        for rec in result["steps"]:
            assert [i[:3] for i in rec["instructions"]] == want, (result["rank"], rec["step"])

    # planned for that order (deployed without a plan mismatch: the demo test), recorded in the cache
    frontier = cached_frontier(run / "cache")
    assert frontier.schedule == schedule and frontier.schedule.group_size == GROUP
    (entry,) = [p.parent for p in (run / "cache").glob("*/frontier.json")]
    assert json.loads((entry / "frontier.json").read_text())["group_size"] == GROUP
    assert json.loads((entry / "key.json").read_text())["group_size"] == GROUP

    # the stamps are real: each rank's instructions ran one after another, each taking time
    for result in results:
        for rec in result["steps"]:
            flat = [t for pair in rec["instruction_times"] for t in pair]
            assert all(a < b for a, b in zip(flat, flat[1:])), (result["rank"], rec["step"])

    # the DAG the plan was made on, joint receives included, never claimed a dependency the real
    # run did not have; nor did the model of megatron's exchanges that
    # tests/megatron/test_megatron_dag_edges.py checks the DAG against
    joint = {(s, i) for s, pairs in enumerate(schedule.joint_receives) for i, _ in pairs}
    assert any(v in joint for u, v in schedule.dependencies() if u[0] != v[0]), "joint-receive edges to check"
    assert edges_violated(results, schedule, schedule.dependencies()) == []
    waits = megatron_waits(STAGES, CHUNKS, MICROBATCHES, GROUP)
    assert edges_violated(results, schedule, [(u, v) for v, srcs in waits.items() for u in srcs]) == []


def test_report_of_a_megatron_demo_run_and_of_its_metrics_file(interleaved, tmp_path):
    """The page reads what the demo and the runtime wrote; checked on structure and on numbers
    recomputed from the same files, not on the saving."""
    run, cfg, results = interleaved

    assert main(["report", str(run)]) == 0  # the demo's per-rank results
    page = (run / "report.html").read_text()
    for section in ("saving", "iterations", "frontier", "timeline", "phase-table", "events"):
        assert f"id='{section}'" in page, section
    cells = dict(re.findall(r'data-key="([^"]+)" data-value="([^"]+)"',
                            re.search(r'<table id="comparison">(.*?)</table>', page, re.S).group(1)))
    by_step: dict[int, list[dict]] = {}
    for result in results:
        for rec in result["steps"]:
            by_step.setdefault(rec["step"], []).append(rec)
    energy = {s: sum(r["energy_j"] for r in recs) for s, recs in by_step.items()}
    phase = {s: recs[0]["phase"] for s, recs in by_step.items()}
    base = median(e for s, e in energy.items() if phase[s] == "baseline again")
    plan = median(e for s, e in energy.items() if phase[s] == "deployed")
    assert float(cells["saving_median"]) == pytest.approx(1 - plan / base)
    assert int(float(cells["deployed_iterations"])) == cfg.deployed_steps
    data = load_run(run)
    assert [n for _, n, _ in used_points(data)] == [cfg.deployed_steps]  # the no-slowdown point, every step

    out = tmp_path / "metrics.html"  # rank 0's metrics file: its own phases and baseline (warm-up)
    assert main(["report", str(run), "--metrics", str(run / "metrics.jsonl"), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    cells = dict(re.findall(r'data-key="([^"]+)" data-value="([^"]+)"',
                            re.search(r'<table id="comparison">(.*?)</table>', out.read_text(), re.S).group(1)))
    warm = median(s["energy_j"] for s in steps if s["phase"] == "warmup")
    deployed = median(s["energy_j"] for s in steps if s["phase"] == "deployed")
    assert float(cells["baseline_energy_median_j"]) == pytest.approx(warm)
    assert float(cells["saving_median"]) == pytest.approx(1 - deployed / warm)
