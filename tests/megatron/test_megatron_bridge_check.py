"""``scripts/megatron_bridge_check.py``, the GPU session's Megatron-Bridge check, as far as it runs here.

Megatron-Bridge does not install on this CPU machine (docs/megatron.md, "Megatron-Bridge"), so the
training run itself is for a GPU session; here: its Perseus settings are a valid config, a machine
without Bridge gets one line saying what to install, and the summary tells a run that reached the
deployed plan from one that did not.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.runtime.config import PerseusConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "megatron_bridge_check.py"
spec = importlib.util.spec_from_file_location("megatron_bridge_check", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_its_perseus_settings_are_a_valid_config(tmp_path):
    settings = check.perseus_settings(check.parse(["--out", str(tmp_path)]))
    config = PerseusConfig.from_dict(settings)
    assert config.mode == "run" and config.plan_wait_s > 0 and config.metrics_file.endswith("perseus-metrics.jsonl")


@pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is not None, reason="megatron-bridge is installed here")
def test_without_megatron_bridge_it_says_what_is_missing_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "megatron-bridge is not importable" in proc.stderr
    assert 'docs/megatron.md, "Megatron-Bridge"' in proc.stderr


def _metrics(path: Path, phases: list[str]) -> Path:
    path.write_text("".join(json.dumps({"step": i, "phase": p, "time_s": 0.5, "energy_j": 100.0}) + "\n"
                            for i, p in enumerate(phases)))
    return path


def test_the_summary_passes_only_a_run_that_deployed_its_plan(tmp_path, capsys):
    assert check.summarize(_metrics(tmp_path / "ok.jsonl", ["warmup"] * 3 + ["profiling"] * 4 + ["deployed"] * 2)) == 0
    out = capsys.readouterr().out
    assert "deployed: 2 steps, median 500.0 ms, 100.0 J per step" in out
    assert check.summarize(_metrics(tmp_path / "stuck.jsonl", ["warmup"] * 3 + ["profiling"] * 4)) == 1
