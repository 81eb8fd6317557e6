"""Demand response for real: 4 gloo processes (2 pipelines × 2 stages) on simulated GPUs, a job
power cap served on a Unix socket that changes while they train. Rank 0 reads it every few
steps; every rank switches to the same point at the same step, and the metrics file says the
planned job power is under the cap in force."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from toy_helpers import stage_uniform_frontier
from toy_pipeline import ToyConfig, launch

from perseus.frontier import save_frontier

pytestmark = pytest.mark.distributed
FREQS = [1410, 1260, 1110, 960]
EVERY = 3


class CapServer:
    """Answers each connection with the next cap of ``caps`` (the last one from then on)."""

    def __init__(self, path: Path, caps: list[float]) -> None:
        self.caps, self.served = caps, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                cap = self.caps[min(self.served, len(self.caps) - 1)]
                self.served += 1
                conn.sendall(f"{cap}\n".encode())

    def close(self) -> None:
        self.sock.close()


def test_a_cap_changed_at_runtime_moves_every_rank_at_the_same_step(tmp_path):
    cfg = ToyConfig(num_stages=2, dp_size=2, steps=26)
    frontier = stage_uniform_frontier(cfg, FREQS)
    save_frontier(frontier, tmp_path / "frontier.json")
    scale = 4 / 2  # 4 GPUs, 2 stages: job power = 2 x pipeline power
    power = [scale * p.energy_j / p.time_s for p in frontier.points]
    # a cap between the default point's power and a slower point's: the fastest point under it
    default = frontier.default_point()
    slower = min((i for i, w in enumerate(power) if w < scale * default.energy_j / default.time_s * 0.97),
                 default=None)
    assert slower is not None, "the toy frontier needs a point with 3 % less power"
    cap = power[slower] * 1.0001
    expected = min((p for p, w in zip(frontier.points, power) if w <= cap), key=lambda p: p.time_s)
    server = CapServer(tmp_path / "cap.sock", [1e9, 1e9, cap, cap, 1e9])
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "probe_every_steps": 0, "straggler_period_steps": 0, "grid_every_steps": EVERY,
                   "power_cap_source": f"unix:{tmp_path / 'cap.sock'}", "grid_timeout_s": 10.0,
                   "metrics_file": str(tmp_path / "metrics.jsonl")}
    try:
        results = launch(cfg, tmp_path / "run", timeout_s=300)
    finally:
        server.close()
    for r in results:
        assert r["error"] is None, f"rank {r['rank']}: {r['error']}\n{r.get('traceback', '')}"
    switches = [[(step, round(data["time_s"], 9)) for step, what, data in r["summary"]["events"] if what == "point"]
                for r in results]
    assert all(s == switches[0] for s in switches), switches  # same steps, same points, every rank
    assert [t for _, t in switches[0]] == [round(expected.time_s, 9), round(default.time_s, 9)]
    deployed = next(s for s, p in results[0]["summary"]["phase_history"] if p == "deployed")
    # decisions at deployed steps 1, 4, 7, 10, 13: the cap read at the third takes effect at the next step
    (down, _), (up, _) = switches[0]
    assert down == deployed + 2 * EVERY + 1 and up == deployed + 4 * EVERY + 1
    assert server.served >= 5
    for r in results:  # every rank's summary counts the grid's decisions (one every EVERY deployed steps)
        grid = r["summary"]["grid"]
        assert grid["every_steps"] == EVERY and grid["decisions"] >= 5 and grid["errors"] == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    capped = [row for row in rows if row.get("power_cap_w") is not None and row["power_cap_w"] < 1e8]
    assert capped and all(row["job_power_w"] <= row["power_cap_w"] for row in capped)
