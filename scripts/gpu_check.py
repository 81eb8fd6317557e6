#!/usr/bin/env python
"""Check a GPU (or the simulated one) for Perseus: identity, clocks, privileges, latencies,
energy-counter period, and time/energy/power of a matmul loop at several SM clocks.

    python scripts/gpu_check.py                 # real GPU 0 through NVML
    python scripts/gpu_check.py --index 1 --json gpu1.json
    python scripts/gpu_check.py --sim --quick   # simulated A100, seconds, no GPU needed
    python scripts/gpu_check.py --combined-1f1b # also megatron-core's combined 1F1B on CUDA streams

Clocks are always reset in a ``finally`` block, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perseus.gpu import GPUDevice, GPUError, SimulatedGPU, open_gpu
from perseus.gpu.measurement import EnergyPoller, power_from_updates


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def lock_latency(dev: GPUDevice, clocks: list[int], reps: int) -> dict[str, float]:
    """Wall time of one lock call and one reset call (ms), median and p99 over ``reps``."""
    lock, reset = [], []
    for i in range(reps):
        f = clocks[i % len(clocks)]
        t = time.perf_counter()
        dev.set_locked_sm_clock(f)
        lock.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        dev.reset_locked_sm_clock()
        reset.append((time.perf_counter() - t) * 1e3)
    return {"reps": reps, "lock_median_ms": statistics.median(lock), "lock_p99_ms": _pct(lock, 0.99),
            "reset_median_ms": statistics.median(reset), "reset_p99_ms": _pct(reset, 0.99)}


def counter_period(dev: GPUDevice, updates: int, poll_s: float = 0.0005, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll the energy counter until it has changed ``updates`` times; report the spacing."""
    times: list[float] = []
    last = dev.total_energy_j()
    deadline = time.perf_counter() + timeout_s
    prev_t = time.perf_counter()
    while len(times) < updates + 1 and time.perf_counter() < deadline:
        e = dev.total_energy_j()
        t = time.perf_counter()
        if e != last:
            times.append(0.5 * (prev_t + t))
            last = e
        prev_t = t
        time.sleep(poll_s)
    gaps = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    if not gaps:
        return {"updates": 0, "note": "counter did not change"}
    return {"updates": len(gaps), "median_ms": statistics.median(gaps), "min_ms": min(gaps),
            "max_ms": max(gaps)}


def _matmul_step_sim(dev: SimulatedGPU, kernel_ms: float) -> Callable[[int], None]:
    """A matmul-like kernel of ``kernel_ms`` at the max clock, stretched and powered by the model.

    Not CPU work: a CPU matmul's time depends on what else runs on the machine, and so would the
    time and power this script reports for the simulated GPU.
    """
    def run(iters: int) -> None:
        for _ in range(iters):
            dev.run_for(kernel_ms / 1e3, activity=1.0, compute_fraction=0.9)

    return run


def _matmul_step_cuda(index: int, n: int) -> Callable[[int], None]:
    import torch

    device = torch.device("cuda", index)
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    c = torch.empty_like(a)

    def run(iters: int) -> None:
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(device)

    return run


def matmul_sweep(dev: GPUDevice, run: Callable[[int], None], clocks: list[int], seconds: float,
                 can_lock: bool) -> list[dict[str, Any]]:
    """Time, energy and power per matmul iteration at each clock (energy from counter updates)."""
    rows = []
    run(3)  # warm-up
    t = time.perf_counter()
    run(5)
    per_iter = max((time.perf_counter() - t) / 5, 1e-6)
    for f in clocks:
        if can_lock:
            dev.set_locked_sm_clock(f)
        with EnergyPoller(dev, interval_s=0.001) as poller:
            t0 = time.perf_counter()
            iters = 0
            while time.perf_counter() - t0 < seconds:
                k = max(1, int(0.05 / per_iter))
                run(k)
                iters += k
            t1 = time.perf_counter()
        try:
            p, window, _ = power_from_updates(poller.updates(), t0, t1)
        except GPUError:
            p, window = float("nan"), 0.0
        per_iter = (t1 - t0) / iters
        rows.append({"sm_clock_mhz": f if can_lock else None, "iterations": iters,
                     "time_per_iter_ms": per_iter * 1e3, "power_w": p,
                     "energy_per_iter_j": p * per_iter, "energy_window_s": window})
    return rows


def combined_1f1b_case(index: int, sim: bool, n: int, microbatches: int = 4) -> dict[str, Any]:
    """megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``) with perseus_megatron's hooks.

    Runs megatron-core's own ``combined_1f1b_schedule_for_no_pipelining`` with its real
    ``set_streams`` (CUDA streams: what the CPU tests cannot run) and the hooked
    ``combined_forward_backward_step``; each unit's compute is a stand-in, one matmul per part on
    the current stream, because a real combined 1F1B needs a MoE GPT with expert parallelism over 2+
    GPUs. Checks the hooks report the ``megatron-combined-1f1b`` order with each unit's microbatch
    pair, and times the three kinds of unit. ``sim``: streams stubbed, CPU matmuls (the path only).
    """
    import torch
    from megatron.core.pipeline_parallel import combined_1f1b

    from perseus.runtime.job import RecordingListener
    from perseus.schedules import build_schedule
    from perseus_megatron.hooks import install_hooks
    from perseus_megatron.tracker import StepInfo

    device = torch.device("cpu") if sim else torch.device("cuda", index)
    size = 256 if sim else n
    a = torch.randn(size, size, device=device)
    times: dict[str, list[float]] = {}

    def sync() -> None:
        if not sim:
            torch.cuda.synchronize(device)

    def step(forward_step_func, data_iterator, f_model, num_microbatches, input_tensor, forward_data_store,
             b_model, b_input_tensor, b_output_tensor, b_output_tensor_grad, config, f_model_chunk_id=None,
             pre_forward=None, pre_backward=None, post_forward=None, post_backward=None, collect_non_loss_data=False,
             checkpoint_activations_microbatch=None, is_first_microbatch=False, current_microbatch=None,
             encoder_decoder_xattn=False):
        parts = [p for p in (f_model, b_model) if p is not None]
        kind = "forward_backward" if len(parts) == 2 else "forward" if f_model is not None else "backward"
        t0 = time.perf_counter()
        for _ in parts:
            torch.matmul(a, a)
        sync()
        times.setdefault(kind, []).append(1e3 * (time.perf_counter() - t0))
        return (torch.empty(1, device=device) if f_model is not None else None), 1, None

    saved = combined_1f1b.set_streams, combined_1f1b.combined_forward_backward_step
    combined_1f1b.combined_forward_backward_step = step
    if sim:
        combined_1f1b.set_streams = lambda: None
    listener = RecordingListener()
    handle = install_hooks(listener)
    try:
        with handle.tracker.step(StepInfo("megatron-combined-1f1b", microbatches)):
            combined_1f1b.combined_1f1b_schedule_for_no_pipelining(
                None, None, object(), microbatches, None, None, [], argparse.Namespace(), False, None, False,
                contextlib.nullcontext, 0, lambda first: first)
    finally:
        handle.uninstall()
        combined_1f1b.set_streams, combined_1f1b.combined_forward_backward_step = saved
    want = list(build_schedule("megatron-combined-1f1b", 1, microbatches, 1).stages[0])
    return {"streams": "stubbed (--sim)" if sim else "CUDA", "order_matches": listener.steps == [want],
            "order": [i.short() for i in (listener.steps or [[]])[0]],
            "unit_ms": {kind: statistics.median(ts) for kind, ts in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", action="store_true", help="use the simulated GPU (no hardware needed)")
    ap.add_argument("--preset", default="A100-SXM", help="simulated GPU preset (with --sim)")
    ap.add_argument("--index", type=int, default=0, help="CUDA device index (as this process sees it)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (seconds instead of a minute)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--matrix", type=int, default=8192, help="matmul size on a GPU")
    ap.add_argument("--sim-kernel-ms", type=float, default=5.0,
                    help="with --sim: the simulated matmul's time at the max clock")
    ap.add_argument("--combined-1f1b", action="store_true",
                    help="also run megatron-core's combined 1F1B schedule (CUDA streams) with perseus_megatron's hooks")
    args = ap.parse_args(argv)

    if args.sim:
        state_dir = os.environ.get("PERSEUS_SIM_GPU_DIR") or tempfile.mkdtemp(prefix="perseus-gpu-check-")
        dev: GPUDevice = SimulatedGPU(args.index, preset=args.preset, state_dir=state_dir,
                                      energy_update_period_s=0.1, reset_state=True)
    else:
        dev = open_gpu("nvml", args.index)
    reps = 20 if args.quick else 200
    updates = 5 if args.quick else 50
    seconds = 0.4 if args.quick else 3.0
    out: dict[str, Any] = {"backend": "sim" if args.sim else "nvml"}
    try:
        clocks = dev.supported_sm_clocks_mhz()
        mem = getattr(dev, "supported_memory_clocks_mhz", lambda: [dev.max_memory_clock_mhz()])()
        out["device"] = {"name": dev.name, "uuid": dev.uuid, "architecture": dev.architecture,
                         "index": dev.index}
        out["memory_clocks_mhz"] = mem
        out["sm_clocks_mhz"] = clocks
        lo, hi = dev.power_limit_range_w()
        out["power"] = {"limit_w": dev.power_limit_w(), "limit_range_w": [lo, hi], "now_w": dev.power_w()}
        can_lock = dev.can_set_clocks()
        out["privileges"] = {"can_set_clocks": can_lock}
        test_clocks = [clocks[0]] + [c for c in clocks if c <= clocks[0] * 0.85][:1] + \
                      [c for c in clocks if c <= clocks[0] * 0.7][:1] + [c for c in clocks if c <= clocks[0] * 0.55][:1]
        out["lock_latency"] = lock_latency(dev, test_clocks, reps) if can_lock else None
        out["energy_counter"] = counter_period(dev, updates)
        run = (_matmul_step_sim(dev, args.sim_kernel_ms) if args.sim  # type: ignore[arg-type]
               else _matmul_step_cuda(args.index, args.matrix))
        out["matmul"] = matmul_sweep(dev, run, test_clocks if can_lock else [clocks[0]], seconds, can_lock)
        if args.combined_1f1b:
            out["combined_1f1b"] = combined_1f1b_case(args.index, args.sim, args.matrix)
    finally:
        try:
            dev.reset_locked_sm_clock()
            dev.reset_memory_clock()
        except GPUError as exc:
            print(f"warning: could not reset clocks: {exc}", file=sys.stderr)
        dev.close()

    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def report(out: dict[str, Any]) -> str:
    d = out["device"]
    sm = out["sm_clocks_mhz"]
    lines = [
        f"GPU {d['index']}: {d['name']} ({d['architecture']}), {d['uuid']}  [{out['backend']}]",
        f"  memory clocks (MHz): {out['memory_clocks_mhz']}",
        f"  SM clocks: {len(sm)} from {sm[0]} down to {sm[-1]} MHz",
        f"  power: now {out['power']['now_w']:.1f} W, limit {out['power']['limit_w']:.0f} W "
        f"(range {out['power']['limit_range_w'][0]:.0f}–{out['power']['limit_range_w'][1]:.0f} W)",
        f"  can set clocks: {'yes' if out['privileges']['can_set_clocks'] else 'NO (measure-only mode)'}",
    ]
    lat = out["lock_latency"]
    if lat:
        lines.append(f"  lock latency: median {lat['lock_median_ms']:.3f} ms, p99 {lat['lock_p99_ms']:.3f} ms; "
                     f"reset median {lat['reset_median_ms']:.3f} ms, p99 {lat['reset_p99_ms']:.3f} ms "
                     f"({lat['reps']} reps)")
    ec = out["energy_counter"]
    if ec.get("updates"):
        lines.append(f"  energy counter update period: median {ec['median_ms']:.1f} ms "
                     f"(min {ec['min_ms']:.1f}, max {ec['max_ms']:.1f}; {ec['updates']} updates)")
    else:
        lines.append("  energy counter: did not change")
    lines.append("  matmul loop:")
    lines.append("    SM MHz   ms/iter   J/iter    W")
    for r in out["matmul"]:
        clock = r["sm_clock_mhz"] if r["sm_clock_mhz"] is not None else "default"
        lines.append(f"    {clock!s:>6}  {r['time_per_iter_ms']:8.3f}  {r['energy_per_iter_j']:7.3f}  {r['power_w']:6.1f}")
    combined = out.get("combined_1f1b")
    if combined:
        units = ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in sorted(combined["unit_ms"].items()))
        lines.append(f"  megatron-core combined 1F1B ({combined['streams']} streams): hooks report "
                     f"{' '.join(combined['order'])}: {'matches' if combined['order_matches'] else 'DIFFERS FROM'} "
                     f"megatron-combined-1f1b; units {units}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
