"""P_blocking the Perseus way: one rank blocked in a P2P recv while its peer sleeps (gloo, CPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from perseus.gpu import SimulatedGPU

if importlib.util.find_spec("torch") is None:  # don't import torch in the pytest process (slow)
    pytest.skip("torch is not installed", allow_module_level=True)

RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from perseus.gpu import SimulatedGPU
    from perseus.gpu.meter.energy import measure_blocking_power_p2p
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gpu = SimulatedGPU(rank)
    try:
        r = measure_blocking_power_p2p(gpu, 1 - rank, duration_s=float(os.environ["DURATION_S"]))
        print(json.dumps({"rank": rank, "power_w": r.power_w, "window_s": r.window_s}), flush=True)
    except Exception as exc:
        print(json.dumps({"rank": rank, "error": type(exc).__name__}), flush=True)
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(sim_dir, duration_s: float) -> dict[int, dict]:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PERSEUS_SIM_GPU_DIR": str(sim_dir), "OMP_NUM_THREADS": "1",
               "DURATION_S": str(duration_s)}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = {}
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            r = json.loads(out.strip().splitlines()[-1])
            results[r["rank"]] = r
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.distributed
def test_blocking_power_p2p_two_ranks_gloo(sim_dir):
    SimulatedGPU(0, preset="A100-SXM", energy_update_period_s=0.1, reset_state=True)
    SimulatedGPU(1, preset="A40", energy_update_period_s=0.1, reset_state=True)
    results = run_pair(sim_dir, 0.5)
    assert results[0]["power_w"] == pytest.approx(83.64, rel=0.03)
    assert results[1]["power_w"] == pytest.approx(70.38, rel=0.03)  # each rank measured its own GPU
    assert all(r["window_s"] >= 0.3 for r in results.values())


@pytest.mark.distributed
def test_blocking_power_p2p_window_too_short_fails_on_both_ranks_without_hanging(sim_dir):
    # One counter update per 5 s, 50 ms windows: the lower rank's first round has too few updates.
    # Its error used to end the exchange early and leave the peer blocked in its own round.
    SimulatedGPU(0, preset="A100-SXM", energy_update_period_s=5.0, reset_state=True)
    SimulatedGPU(1, preset="A100-SXM", energy_update_period_s=5.0, reset_state=True)
    results = run_pair(sim_dir, 0.05)
    assert results == {r: {"rank": r, "error": "MeasurementError"} for r in range(2)}
