#!/usr/bin/env python
"""Cost of frequency requests through ``perseus clockd`` on the training thread, and flush latency.

    python benchmarks/bench_clockd.py [--n 2000] [--batches 7]

Starts ``perseus clockd --gpu sim`` as a separate process over a temporary simulated GPU and
times ``ClockdController.set_frequency`` (alternating clocks, so none is deduplicated) and
``flush()`` round trips. On a real GPU the training-thread cost is the same; the daemon's
applier threads add the driver's lock time to the applied latency.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per batch")
    ap.add_argument("--batches", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clockd-bench-") as d:
        os.environ["PERSEUS_SIM_GPU_DIR"] = d
        SimulatedGPU(0, reset_state=True).close()
        sock = f"{d}/clockd.sock"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        daemon = subprocess.Popen([sys.executable, "-m", "perseus.cli", "clockd", "--socket", sock,
                                   "--allow-uid", str(os.getuid()), "--gpu", "sim", "--sim-dir", d],
                                  env=env, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(sock):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("perseus clockd did not start")
                time.sleep(0.05)
            with ClockdController(sock, uuid=SimulatedGPU(0).uuid, cuda_visible_devices=None) as c:
                means = []
                for _ in range(args.batches):
                    t = time.perf_counter()
                    for i in range(args.n):
                        c.set_frequency(1005 if i % 2 else 1200)
                    means.append((time.perf_counter() - t) / args.n * 1e6)
                    c.flush(30)
                rts = []
                for _ in range(300):
                    t = time.perf_counter()
                    c.flush()
                    rts.append((time.perf_counter() - t) * 1e6)
        finally:
            daemon.terminate()
            daemon.wait()
    rts.sort()
    print(f"set_frequency: per-call mean of each batch (µs): {', '.join(f'{m:.2f}' for m in means)}; "
          f"median {statistics.median(means):.2f}, best {min(means):.2f}")
    print(f"flush round trip: median {statistics.median(rts):.0f} µs, p99 {rts[int(0.99 * len(rts)) - 1]:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
