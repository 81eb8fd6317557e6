#!/usr/bin/env python
"""Cost of frequency requests on the training thread, and request→applied latency.

    python benchmarks/bench_controller.py [--n 20000]

Runs against the simulated GPU (no hardware needed); on a real GPU the training-thread cost is
the same (the controller process does the NVML work), while the applied latency adds the
driver's lock time (see scripts/gpu_check.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.gpu import SimulatedGPU
from perseus.gpu.control.controller import FrequencyController, NullController


def _per_call_us(fn, n: int) -> tuple[float, float]:
    """(median over 10 batches of the mean per-call cost, p99 of individually timed calls), µs."""
    batch = max(1, n // 10)
    means = []
    for _ in range(10):
        t = time.perf_counter()
        for i in range(batch):
            fn(i)
        means.append((time.perf_counter() - t) / batch * 1e6)
    single = []
    for i in range(min(n, 5000)):
        t = time.perf_counter()
        fn(i)
        single.append((time.perf_counter() - t) * 1e6)
    single.sort()
    return statistics.median(means), single[int(0.99 * (len(single) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    gpu = SimulatedGPU(0, state_dir=tempfile.mkdtemp(prefix="perseus-bench-"), reset_state=True)
    rows = []
    with FrequencyController(gpu.spec(), install_signal_handlers=False) as c:
        clocks = [1410, 1200, 1005, 900]
        rows.append(("set_frequency, clock changes every call", *_per_call_us(lambda i: c.set_frequency(clocks[i % 4]), args.n)))
        c.flush()
        rows.append(("set_frequency, same clock (deduplicated)", *_per_call_us(lambda i: c.set_frequency(900), args.n)))
        null = NullController()
        rows.append(("NullController.set_frequency (measure-only)", *_per_call_us(lambda i: null.set_frequency(900), args.n)))
        lat = []
        prev = 900
        for i in range(300):
            target = clocks[i % 4] if clocks[i % 4] != prev else 705
            prev = target
            t = time.perf_counter()
            c.set_frequency(target)
            while gpu.locked_sm_clock_mhz() != target:
                pass
            lat.append((time.perf_counter() - t) * 1e6)
        lat.sort()
        rows.append(("request → applied on the (simulated) GPU", statistics.median(lat), lat[int(0.99 * (len(lat) - 1))]))
        fl = []
        for _ in range(200):
            t = time.perf_counter()
            c.flush()
            fl.append((time.perf_counter() - t) * 1e6)
        fl.sort()
        rows.append(("flush() round trip", statistics.median(fl), fl[int(0.99 * (len(fl) - 1))]))
        stats = c.flush()
    print(f"{'operation':48s} {'median µs':>10s} {'p99 µs':>10s}")
    for name, med, p99 in rows:
        print(f"{name:48s} {med:10.2f} {p99:10.2f}")
    if stats is not None:
        print(f"(controller applied {stats.applied} changes, skipped {stats.skipped}, errors {stats.errors})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
