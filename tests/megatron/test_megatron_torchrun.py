"""Real megatron-core under torchrun (CPU, gloo, simulated GPUs): one 4-rank launch for everything.

A launch is what costs (every rank imports torch and megatron-core), so one torchrun of 4 ranks
(``record_orders_worker.py``) runs, one after another, megatron-core's parallel state set up again
for each:

1. **Recorded orders equal the core's schedules**: 4 stages — 1F1B with 8 and 2 microbatches,
   interleaved 2 chunks with 4; 2 stages × 2 data-parallel replicas — 1F1B with 4 and 1
   microbatches (an evaluation call in between must not be reported), interleaved 2 chunks with 4
   and 6 microbatches (both replicas must report their stage's order); and ``enable()`` with the
   real runtime (the job it builds from megatron-core's parallel state).
   **Overlapped p2p**: 4 stages × 2 chunks × 8 microbatches with ``overlap_p2p_comm`` on (Megatron-LM's
   default for interleaved runs), instructions padded and timed: every wait of the overlapped DAG
   held, and the run really overlapped (some waits of the blocking DAG did not hold).
2. **The Megatron demo** (``perseus_demo.megatron_demo``'s rank body): 4 stages × 2 chunks × 10
   microbatches (interleaved 1F1B) in microbatch groups of 5 (``microbatch_group_size_per_vp_stage``:
   megatron's default, the stage count, cannot run 10 microbatches, and two groups make the order
   cross a group boundary; one group of all 10 would be a different order). It profiles online,
   plans, deploys the no-slowdown plan and re-measures default clocks (A/B/A). The checks are on
   what the run did, not on wall-clock time (``tests/demo_checks.py``; measured savings are in
   ``benchmarks/bench_demo.py``):

   - the demo checks: every phase, the no-slowdown plan deployed on every rank, executed in order
     at the planned clocks (a wrong microbatch or chunk index would show up as a fallback), saving
     energy on the simulated GPU's own model;
   - the group: every rank executed the group-5 order Perseus planned in every iteration, the
     cache and the frontier file record the group size, and every dependency edge of the
     planner's DAG — joint receives included — held in the real run: an instruction began only
     after each instruction the DAG says it waits for had ended on its rank (and so had every
     instruction the model of megatron's exchanges in ``megatron_p2p_model`` says it waits for:
     that model is checked on the real run too);
   - ``perseus report`` reads the run (the job-level metrics file the demo writes from its
     ``rank*.json``, rank 0's metrics JSONL, the cache), guarding the formats it reads against drift.

The other real megatron-core runs: 2 stages 1F1B in ``test_megatron_dp_straggler.py`` (the
no-slowdown plan outside the straggler's window, with the same accounting); megatron's default
group deployed in ``test_megatron_lm_pretrain_gpt.py`` (interleaved, 3 stages, no plan mismatch).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from statistics import median
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from demo_checks import cached_frontier, check_deployed_demo
from megatron_p2p_model import megatron_waits

from perseus.cli import main
from perseus.output.run_data import load_run
from perseus.output.run_stats import used_points
from perseus.errors import ScheduleError
from perseus.schedules import build_schedule
from perseus_demo.common import PROBE_PHASE, format_report, phase_table
from perseus_demo.job_metrics import write_job_metrics
from perseus_demo.megatron_demo import DemoConfig
from perseus.schedules import dependencies

pytestmark = pytest.mark.distributed

pytest.importorskip("megatron.core")

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("record_orders_worker.py")
RANKS = 4

# recorded orders: name -> (schedule, stages, chunks, microbatches, extra)
CASES = {
    "f8": ("1f1b", 4, 1, 8, ""),
    "f2": ("1f1b", 4, 1, 2, ""),
    "i4-pp4": ("interleaved", 4, 2, 4, ""),
    "f4": ("1f1b", 2, 1, 4, "eval"),
    "f1": ("1f1b", 2, 1, 1, ""),
    "i4": ("interleaved", 2, 2, 4, ""),
    "i6": ("interleaved", 2, 2, 6, ""),
    "i8-overlap": ("interleaved", 4, 2, 8, "overlap"),
}
ENABLE_STAGES = 2
# the demo
STAGES, CHUNKS, MICROBATCHES, GROUP = 4, 2, 10, 5

Run = tuple[Path, DemoConfig, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[list[dict[str, Any]], Run]:
    """The one torchrun: each rank's recorded orders, and the demo run (folder, config, each rank's result)."""
    out = tmp_path_factory.mktemp("torchrun")
    run = out / "demo"  # the demo's results, cache and rank 0's metrics file
    run.mkdir()
    cfg = DemoConfig(stages=STAGES, chunks=CHUNKS, microbatches=MICROBATCHES, group_size=GROUP, max_steps=1000,
                     deployed_steps=6, startup_steps=1, rebaseline_steps=4)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(run / "cache"),
                       metrics_file=str(run / "metrics.jsonl"))
    assert cfg.stages * cfg.dp_size == RANKS
    (run / "config.json").write_text(json.dumps(asdict(cfg)))
    specs = [f"{name}:{s}:{p}:{c}:{m}" + (f":{x}" if x else "") for name, (s, p, c, m, x) in CASES.items()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               PERSEUS_GPU="sim", PERSEUS_SIM_GPU_DIR=str(out / "sim-gpus"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
           str(WORKER), str(out), *specs, f"enable:{ENABLE_STAGES}", f"demo:{run}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)  # a hang guard
    orders, demo = [], []
    for rank in range(RANKS):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        result = json.loads(path.read_text())
        assert "error" not in result, result["error"]
        orders.append(result)
        path = run / f"rank{rank}.json"
        assert path.exists(), f"the demo's rank {rank} wrote no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        demo.append(json.loads(path.read_text()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    write_job_metrics(run, demo)  # as the demo's launcher does after every run: the job, for perseus report
    return orders, (run, cfg, demo)


@pytest.fixture(scope="module")
def interleaved(launch) -> Run:
    return launch[1]


def check_orders(results: list[dict[str, Any]], stages: int) -> None:
    cases = {name: case for name, case in CASES.items() if case[1] == stages}
    assert cases
    for name, (schedule, _, chunks, microbatches, _) in cases.items():
        expected = build_schedule(schedule, stages, microbatches, chunks)
        seen = set()
        for result in results:
            case = result[name]
            stage = case["stage"]
            seen.add((stage, case["dp_rank"]))
            want = [[i.kind, i.microbatch, i.chunk] for i in expected.stages[stage]]
            assert len(case["steps"]) == 2, f"{name}: expected 2 reported training steps, got {len(case['steps'])}"
            for step in case["steps"]:
                assert step == want, f"{name} stage {stage}: recorded order differs from build_schedule"
        replicas = RANKS // stages
        assert seen == {(s, d) for s in range(stages) for d in range(replicas)}, seen


def test_two_stage_orders_match_core_schedules(launch):
    check_orders(launch[0], 2)


def test_four_stage_orders_match_core_schedules(launch):
    check_orders(launch[0], 4)


def test_overlapped_p2p_runs_the_same_order_with_the_overlapped_dags_waits(launch):
    """megatron-core with overlap_p2p_comm: the order Perseus plans, every edge of the overlapped
    DAG (and of the model of megatron's overlapped exchanges) a real wait, and evidence that the
    run overlapped: some edge only the blocking exchanges have did not hold, so planning this run
    on the blocking DAG would have assumed waits it does not have."""
    orders, _ = launch
    _, stages, chunks, microbatches, _ = CASES["i8-overlap"]
    overlapped = build_schedule("interleaved", stages, microbatches, chunks, overlap_p2p=True)
    blocking = build_schedule("interleaved", stages, microbatches, chunks)
    results = []
    for result in orders:
        case = result["i8-overlap"]
        want = [[i.kind, i.microbatch, i.chunk] for i in overlapped.stages[case["stage"]]]
        assert case["steps"] == [want, want], case["stage"]
        results.append({"stage": case["stage"],
                        "steps": [{"step": n, "instruction_times": t} for n, t in enumerate(case["times"])]})
    (last,) = [result["i8-overlap"] for result in orders if result["i8-overlap"]["stage"] == stages - 1]
    assert last["losses"] == 2 * microbatches and last["finite_losses"]
    assert edges_violated(results, overlapped, dependencies(overlapped)) == []
    waits = megatron_waits(stages, chunks, microbatches, stages, overlap=True)
    assert edges_violated(results, overlapped, [(u, v) for v, srcs in waits.items() for u in srcs]) == []
    blocking_only = set(dependencies(blocking)) - set(dependencies(overlapped))
    assert edges_violated(results, blocking, blocking_only) != []


def test_enable_builds_the_job_from_parallel_state_and_drives_the_runtime(launch):
    grid = set()
    for rank, result in enumerate(launch[0]):
        enable = result["enable"]
        job = enable["job"]
        stage, dp_rank = enable["parallel_state"]["stage"], enable["parallel_state"]["dp_rank"]
        grid.add((stage, dp_rank))
        # The last step ran 6 microbatches: enable() rebuilt the runtime for the new job shape.
        assert job == {"num_stages": ENABLE_STAGES, "num_microbatches": 6, "stage": stage, "schedule": "interleaved",
                       "num_chunks": 2, "group_size": None, "overlap_p2p": False, "dp_rank": dp_rank,
                       "dp_size": RANKS // ENABLE_STAGES,
                       "tp_rank": 0, "tp_size": 1, "rank": rank, "world_size": RANKS}
        assert enable["model_config"]["hidden_size"] == 32 and enable["model_config"]["seq_length"] == 16
        assert enable["stage_fingerprint"]  # this rank's model chunks' parameters, for rank 0's cache key
        assert enable["runtimes_created"] == 2
        assert enable["steps_per_listener"] == [2, 1]  # the forward-only call was not a step
        want = [[i.kind, i.microbatch, i.chunk] for i in build_schedule("interleaved", ENABLE_STAGES, 6, 2).stages[stage]]
        assert enable["last_steps"] == [want]
        assert enable["summary_steps"] == 1  # the runtime counted the step it saw
        assert enable["hooks_removed"]
    assert grid == {(s, d) for s in range(ENABLE_STAGES) for d in range(RANKS // ENABLE_STAGES)}


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
    assert any(v in joint for u, v in dependencies(schedule) if u[0] != v[0]), "joint-receive edges to check"
    assert edges_violated(results, schedule, dependencies(schedule)) == []
    waits = megatron_waits(STAGES, CHUNKS, MICROBATCHES, GROUP)
    assert edges_violated(results, schedule, [(u, v) for v, srcs in waits.items() for u in srcs]) == []


def test_report_of_a_megatron_demo_run_and_of_its_metrics_file(interleaved, tmp_path):
    """The page reads what the demo and the runtime wrote; checked on structure and on numbers
    recomputed from the same files, not on the saving."""
    run, cfg, results = interleaved

    job = run / "job-metrics.jsonl"  # the demo's per-rank results, as one job-level metrics file
    assert main(["report", str(job)]) == 0
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
    plan_steps = [s for s in energy if phase[s] == "deployed"]  # the runtime's default-clock probes apart
    plan = median(energy[s] for s in plan_steps)
    assert float(cells["saving_median"]) == pytest.approx(1 - plan / base)
    assert int(float(cells["deployed_iterations"])) == len(plan_steps)
    assert len(plan_steps) + sum(p == PROBE_PHASE for p in phase.values()) == cfg.deployed_steps
    data = load_run(job)
    assert [n for _, n, _ in used_points(data)] == [len(plan_steps)]  # the no-slowdown point, every plan step

    out = tmp_path / "metrics.html"  # rank 0's metrics file: its own phases and baseline (its probes, else warm-up)
    assert main(["report", str(run), "--metrics", str(run / "metrics.jsonl"), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "event" not in line]
    cells = dict(re.findall(r'data-key="([^"]+)" data-value="([^"]+)"',
                            re.search(r'<table id="comparison">(.*?)</table>', out.read_text(), re.S).group(1)))
    # the baseline: the same run's counted default-clock probes where there are any, else warm-up
    probes = [s["energy_j"] for s in steps if s["phase"] == "deployed" and s["clocks"] == "default" and s["counted"]]
    base = median(probes) if probes else median(s["energy_j"] for s in steps if s["phase"] == "warmup")
    # the plan's counted steps: not the runtime's default-clock probes, nor a settle step after a clock change
    deployed = median(s["energy_j"] for s in steps
                      if s["phase"] == "deployed" and s["clocks"] == "plan" and s["counted"])
    assert float(cells["baseline_energy_median_j"]) == pytest.approx(base)
    assert float(cells["saving_median"]) == pytest.approx(1 - deployed / base)
