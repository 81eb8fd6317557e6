"""The job's saving on a real 2-pipeline run: 2 stages x 2 data-parallel pipelines of the toy trainer
(gloo, simulated GPUs), a slowed plan that saves energy, the guard's default-clock probes on.

Every rank ends with the same job-level saving (all ranks, all pipelines), the summary line and the
rank's Prometheus endpoint carry it, and it is the stages' savings weighted by their baseline energy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from toy_helpers import stage_uniform_frontier
from toy_pipeline import ToyConfig, launch

from perseus.frontier import save_frontier
from perseus.runtime.observe.report import summary_line

pytestmark = pytest.mark.distributed
prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

FREQS = [1410, 1260, 1110, 960]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_two_pipelines_report_one_job_saving_weighted_by_stage_energy(tmp_path):
    # 10 ms forwards: long against a loaded machine's scheduling jitter; the guard only measures here
    cfg = ToyConfig(num_stages=2, num_microbatches=4, dp_size=2, steps=26, forward_s=0.01, target_slowdown=1.2)
    save_frontier(stage_uniform_frontier(cfg, FREQS), tmp_path / "frontier.json")
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "probe_every_steps": 4, "guard_threshold": 1e6, "prometheus_port": 0,
                   "metrics_file": str(tmp_path / "m.jsonl")}
    results = launch(cfg, tmp_path / "run", timeout_s=300)
    for r in results:
        assert r["error"] is None, f"rank {r['rank']}: {r['error']}\n{r.get('traceback', '')}"
    jobs = [r["summary"]["job_saving"] for r in results]
    job = jobs[0]
    assert job is not None and job["windows"] >= 2, results[0]["summary"]["events"]
    assert all(j == job for j in jobs), "every rank computes the same job figure from the same rows"
    stages = job["stages"]
    assert set(stages) == {"0", "1"} and all(s["ranks"] == 2 for s in stages.values())  # both pipelines
    weighted = sum(s["baseline_energy_j"] / job["baseline_energy_j"] * s["saving"] for s in stages.values())
    assert job["saving"] == pytest.approx(weighted, abs=1e-12)
    assert job["energy_j"] == pytest.approx(sum(s["energy_j"] for s in stages.values()))
    assert job["saving_low"] <= job["saving"] <= job["saving_high"]
    assert job["saving"] > 0, job  # the slowed point runs lower clocks on the simulated GPUs

    line = summary_line(results[0]["summary"])  # what rank 0 logs at close
    assert f"job (all GPUs) {job['energy_j']:.2f} J/iteration" in line and f"saves {100 * job['saving']:.1f}%" in line
    assert "default-clock probe steps" in line, line  # this rank's baseline: the probes, not the warm-up
    for r in results:  # each rank's own saving: its plan steps against its probes, with an interval
        s = r["summary"]
        assert s["baseline"]["basis"] == "default-clock probes" and s["saving"] == s["closed_loop"]["ab"]["saving"]
        assert s["saving_interval"][0] <= s["saving"] <= s["saving_interval"][1]

    for r in results:
        seen = _samples(r["prometheus"])
        assert seen[("perseus_job_energy_saving_ratio", ())] == pytest.approx(job["saving"])
        assert seen[("perseus_job_energy_saving_high_ratio", ())] == pytest.approx(job["saving_high"])
        for stage, s in stages.items():
            assert seen[("perseus_stage_energy_saving_ratio", (("stage", stage),))] == pytest.approx(s["saving"])
            assert seen[("perseus_stage_energy_joules", (("stage", stage),))] == pytest.approx(s["energy_j"])
    events = (tmp_path / "m.jsonl").read_text()
    assert events.count('"event": "job_saving"') == job["windows"]  # the metrics file has every window's figure
