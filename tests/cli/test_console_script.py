"""The installed 'perseus' console script, run as a real subprocess."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("perseus") is None, reason="perseus console script not installed")


def test_help_shows_the_workflow():
    result = subprocess.run(["perseus", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for command in ("plan", "show", "plot", "export", "emulate", "demo"):
        assert command in result.stdout
    assert "perseus plan --example --out frontier.json" in result.stdout


def test_user_error_exit_status_and_single_line(tmp_path):
    out = tmp_path / "f.json"
    argv = ["perseus", "plan", "--profile", str(tmp_path / "missing.csv"), "--stages", "2", "--microbatches", "2",
            "--p-blocking", "80", "--out", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("perseus: error: ")
    assert "cannot read profile" in result.stderr
    assert not out.exists()
