"""A real two-rank run (toy pipeline, gloo, simulated GPUs) whose clocks go through zeusd.

The ranks' controller processes lock each stage's planned clock through a fake zeusd on a real
Unix socket (``PERSEUS_ZEUSD_SOCKET``) and read energy from it; at the end every GPU is back at
default clocks, reset through zeusd.
"""

from __future__ import annotations

import sys
import tempfile
import shutil
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[2] / "gpu"))
from fake_zeusd import FakeZeusd
from toy_helpers import stage_uniform_frontier
from toy_pipeline import ToyConfig, launch

from perseus.frontier import save_frontier
from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.state import read_sim_state

pytestmark = pytest.mark.distributed
HANG_S = 240  # hang guard per toy run
FREQS = [1410, 1260, 1110, 960]


def test_a_deployed_plan_runs_through_zeusd_and_ends_at_default_clocks(tmp_path, monkeypatch):
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=6, target_slowdown=1.2, sim_dir=str(tmp_path / "sim"))
    save_frontier(stage_uniform_frontier(cfg, FREQS), tmp_path / "frontier.json")
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "probe_every_steps": 0}
    for rank in (0, 1):  # the GPUs zeusd serves, as the toy ranks will use them
        SimulatedGPU(rank, preset=cfg.sim_preset, state_dir=cfg.sim_dir,
                     energy_update_period_s=cfg.energy_update_period_s, reset_state=True).close()
    sock_dir = Path(tempfile.mkdtemp(prefix="zeusd-"))  # AF_UNIX paths are short
    try:
        with FakeZeusd(sock_dir / "zeusd.sock", sim_dir=cfg.sim_dir, gpus=(0, 1)) as zeusd:
            monkeypatch.setenv("PERSEUS_ZEUSD_SOCKET", zeusd.socket_path)
            results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
            locks = zeusd.calls("/gpu/set_gpu_locked_clocks")
            resets = zeusd.calls("/gpu/reset_gpu_locked_clocks")
            energy = zeusd.calls("/gpu/get_cumulative_energy")
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    for r in results:
        assert r["error"] is None, r.get("traceback")
        assert r["summary"]["phase"] == "deployed"
    held = {int(p["max_clock_mhz"]) for p in locks}
    assert held and held <= set(FREQS), "the plan's clocks were locked through zeusd"
    assert {p["gpu_ids"] for p in locks} <= {"0", "1"} and {p["gpu_ids"] for p in resets} == {"0", "1"}
    assert energy, "energy came from zeusd's counter"
    for rank in (0, 1):
        assert read_sim_state(rank, cfg.sim_dir).locked == 0, f"rank {rank} left a locked clock"
