"""A DeepSpeed job that cannot open its GPUs says so in one line per rank, not in tracebacks.

``scripts/deepspeed_dataset_example.py`` under the real ``deepspeed`` launcher, 2 ranks on CPU,
with ``PERSEUS_GPU=nvml`` on a machine without NVML (the example's ``--cpu`` would otherwise pick
the simulated GPU): before, each rank printed about 50 lines of chained tracebacks whose last line
named ``PERSEUS_GPU=sim`` only. Now rank 0 prints one line for the job, naming both fixes (the
environment variable and the config key), and the other rank one line that points at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.gpu.errors import SIM_FIX

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "deepspeed_dataset_example.py"
CONFIG = REPO / "scripts" / "deepspeed_config_dataset_example.json"


def _nvml_loads() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any failure means: no NVML here
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("deepspeed") is None, reason="needs the deepspeed launcher")
@pytest.mark.skipif(_nvml_loads(), reason="needs a machine without NVML")
def test_without_nvml_every_rank_prints_one_line_and_rank_0_names_both_fixes(tmp_path, master_port):
    pytest.importorskip("deepspeed")
    env = dict(os.environ, PERSEUS_GPU="nvml", OMP_NUM_THREADS="1", PERSEUS_SIM_GPU_DIR=str(tmp_path / "sim"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PERSEUS_TRACEBACK", None)
    cmd = [shutil.which("deepspeed"), "--num_gpus", "2", "--master_port", master_port, str(SCRIPT),
           "--deepspeed_config", str(CONFIG), "-p", "2", "--steps", "3", "--hidden-size", "32", "--layers", "4",
           "--samples", "64", "--cpu"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("perseus: ")]
    roots = [line for line in lines if line.startswith("perseus: all 2 ranks: ")]
    assert len(roots) == 1, out[-3000:]
    assert "NVML is unavailable" in roots[0] and SIM_FIX in roots[0]
    assert 'PERSEUS_GPU=sim' in roots[0] and '"gpu": "sim"' in roots[0] and "--perseus-gpu sim" in roots[0]
    # Rank 1 prints its line at the same moment; the launcher kills the ranks left once one exits,
    # so on a loaded machine it may be gone first. At most one line, and if there, this one:
    others = [line for line in lines if line not in roots]
    assert len(others) <= 1, out[-3000:]
    for other in others:
        assert other.startswith("perseus: rank 1: ") and "rank 0 reports for the job" in other and SIM_FIX in other


HOOKED = """
import os, sys
from perseus.runtime.lifecycle import one_line_errors
from perseus.gpu.errors import GPULibraryMissingError
one_line_errors()
if sys.argv[1] == "perseus":
    try:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    except OSError as exc:
        raise GPULibraryMissingError("Initializing NVML: NVML is unavailable") from exc
raise ValueError("not ours")
"""


@pytest.mark.parametrize("kind, traceback", [("perseus", None), ("perseus", "1"), ("other", None)])
def test_an_uncaught_perseus_error_is_one_line_unless_asked_for_the_traceback(kind, traceback):
    env = dict(os.environ, RANK="3", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("PERSEUS_TRACEBACK", None)
    if traceback:
        env["PERSEUS_TRACEBACK"] = traceback
    proc = subprocess.run([sys.executable, "-c", HOOKED, kind], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    if kind == "perseus" and not traceback:
        assert proc.stderr.splitlines() == [
            f"perseus: rank 3: Initializing NVML: NVML is unavailable. Install the NVIDIA driver and `pip install "
            f"nvidia-ml-py`, or use the simulated GPU: {SIM_FIX}. (PERSEUS_TRACEBACK=1 shows the traceback)"]
    else:  # Python's own report, chain and all; other exceptions are not ours to shorten
        assert "Traceback (most recent call last)" in proc.stderr
        assert ("libnvidia-ml.so.1" in proc.stderr) == (kind == "perseus")
