#!/usr/bin/env python
"""The three clock backends side by side: the own controller process, ``perseus clockd``, zeusd.

    python benchmarks/bench_zeusd.py [--n 2000] [--batches 5] [--switches 200]

One simulated GPU; each daemon runs as its own process (``perseus clockd --gpu sim``, and the fake
zeusd of the tests, ``tests/gpu/fake_zeusd.py``, which serves zeusd's documented routes over a
real Unix socket with Python's http.server). For each backend, in the same run:

- ``set_frequency``: the training thread's cost per request (alternating clocks, none
  deduplicated; per-call mean of each batch, median over batches);
- switch applied: ``set_frequency`` to a new clock then ``flush()``, i.e. until the clock is in
  effect on the (simulated) device (median and p90 over ``--switches``);
- for zeusd also one HTTP ``set_gpu_locked_clocks`` call on its own (what the controller process
  waits for per switch) and one ``get_cumulative_energy`` read (what the energy poller pays per
  poll while profiling).

Ratios are against the own controller process measured in the same run. The fake zeusd is
Python; the real one is Rust (actix-web), so its HTTP share of a switch would be smaller, and on a
real GPU every backend adds the driver's lock time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perseus.gpu import SimulatedGPU
from perseus.gpu.clockd.client import ClockdController
from perseus.gpu.control.controller import FrequencyController
from perseus.gpu.zeusd.client import ZeusdClient


def _wait_for(path: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


def _measure(c, n: int, batches: int, switches: int) -> dict[str, float]:
    means = []
    for _ in range(batches):
        t = time.perf_counter()
        for i in range(n):
            c.set_frequency(1005 if i % 2 else 1200)
        means.append((time.perf_counter() - t) / n * 1e6)
        c.flush(30)
    applied = []
    for i in range(switches):
        t = time.perf_counter()
        c.set_frequency(1005 if i % 2 else 1200)
        c.flush(30)
        applied.append((time.perf_counter() - t) * 1e6)
    applied.sort()
    return {"set": statistics.median(means), "applied": statistics.median(applied),
            "applied_p90": applied[int(0.9 * len(applied)) - 1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per batch")
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--switches", type=int, default=200)
    args = ap.parse_args()
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="zeusd-bench-") as d:
        os.environ["PERSEUS_SIM_GPU_DIR"] = d
        gpu = SimulatedGPU(0, reset_state=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs = []
        try:
            with FrequencyController(gpu.spec(), install_signal_handlers=False) as c:
                rows["own controller process"] = _measure(c, args.n, args.batches, args.switches)

            clockd_sock = f"{d}/clockd.sock"
            procs.append(subprocess.Popen([sys.executable, "-m", "perseus.cli", "clockd", "--socket", clockd_sock,
                                           "--allow-uid", str(os.getuid()), "--gpu", "sim", "--sim-dir", d,
                                           "--rate", "100000", "--burst", "100000"],
                                          env=env, stderr=subprocess.DEVNULL))
            _wait_for(clockd_sock, procs[-1], "perseus clockd")
            with ClockdController(clockd_sock, uuid=gpu.uuid, cuda_visible_devices=None) as c:
                rows["perseus clockd"] = _measure(c, args.n, args.batches, args.switches)

            zeusd_sock = f"{d}/zeusd.sock"
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "gpu" / "fake_zeusd.py"),
                                           "--socket", zeusd_sock, "--sim-dir", d], env=env, stdout=subprocess.DEVNULL))
            _wait_for(zeusd_sock, procs[-1], "the fake zeusd")
            spec = dataclasses.replace(gpu.spec(), zeusd_socket=zeusd_sock)
            with FrequencyController(spec, install_signal_handlers=False) as c:
                rows["zeusd (fake, via the controller process)"] = _measure(c, args.n, args.batches, args.switches)
            client = ZeusdClient(zeusd_sock)
            calls = []
            for i in range(args.switches):
                t = time.perf_counter()
                client.set_gpu_locked_clocks(0, 1005 if i % 2 else 1200)
                calls.append((time.perf_counter() - t) * 1e6)
            client.reset_gpu_locked_clocks(0)
            reads = []
            for _ in range(args.switches):
                t = time.perf_counter()
                client.energy_mj(0)
                reads.append((time.perf_counter() - t) * 1e6)
            client.close()
        finally:
            for p in procs:
                p.terminate()
                p.wait()
            gpu.close()
    ref = rows["own controller process"]
    print(f"{'backend':<44} {'set_frequency µs':>17} {'ratio':>6} {'switch applied µs (p90)':>24} {'ratio':>6}")
    for name, r in rows.items():
        print(f"{name:<44} {r['set']:>17.2f} {r['set'] / ref['set']:>6.2f} "
              f"{r['applied']:>14.0f} ({r['applied_p90']:>6.0f}) {r['applied'] / ref['applied']:>6.2f}")
    calls.sort()
    print(f"one HTTP set_gpu_locked_clocks to the fake zeusd (block=true): median {statistics.median(calls):.0f} µs, "
          f"p90 {calls[int(0.9 * len(calls)) - 1]:.0f} µs")
    reads.sort()
    print(f"one get_cumulative_energy read from the fake zeusd: median {statistics.median(reads):.0f} µs, "
          f"p90 {reads[int(0.9 * len(reads)) - 1]:.0f} µs")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
