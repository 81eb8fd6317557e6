"""perseus report on a real Megatron demo run: the page reads what the demo and the runtime wrote.

Guards the formats the report reads (``rank*.json``, the metrics JSONL, the cache) against drift:
one small run (2 stages x 4 microbatches under torchrun) with a metrics file, reported both ways.
The checks are on structure and on numbers recomputed from the same files, not on the saving.
"""

from __future__ import annotations

import json
import re
from statistics import median

import pytest

from perseus.cli import main
from perseus.html_report import load_run, used_points
from perseus_demo.megatron_demo import DemoConfig, launch

pytestmark = pytest.mark.distributed


def test_report_of_a_megatron_demo_run_and_of_its_metrics_file(tmp_path):
    run = tmp_path / "run"
    cfg = DemoConfig(stages=2, microbatches=4, max_steps=1000, deployed_steps=4, startup_steps=1, rebaseline_steps=3)
    cfg.perseus.update(warmup_steps=3, freq_step_mhz=250, cache_dir=str(run / "cache"),
                       metrics_file=str(run / "metrics.jsonl"))
    results = launch(cfg, run, timeout_s=600)

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
