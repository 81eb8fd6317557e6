"""Honest energy attribution on a hostile simulated H200: the real runtime's online profile against
what the simulated GPU spent.

``attribution`` drives ``PerseusRuntime`` in ``mode: profile`` on a one-stage 1F1B job (8
microbatches) on the asynchronous simulated "H200-hostile" card: a counter that samples a quarter
of each period, reports late and with noise; a dense backward (20 ms of max-clock work at full
activity) that the 700 W limit caps, a memory-bound forward (10 ms at the memory-bound activity);
and 40 ms of GPU work between steps (the optimizer and gradient all-reduce, the preset's step
tail at 40 ms). The simulated GPU's own record of each kernel (the clock it ran at, its duration)
is the truth.

- ``attr_error_forward`` / ``attr_error_backward``: |profiled − true| / true energy of an
  instruction of that kind at the profile's typical duration (the kind's true mean power at the
  clock, from the card's record of each of its kernels, × that duration), the worst over the
  profiled clocks: attribution's error, not the typical duration's (a host stall stretches a few
  instructions, which the typical duration rightly leaves out);
- ``power_over_limit``: attributed powers (each kind's and the between-steps work's, at each
  clock) above the card's power limit.

    python benchmarks/hostile_attribution.py [--seed N]

prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.gpu.sim import SimulatedGPU
from perseus.gpu.sim.dvfs import H200_DENSE_ACTIVITY, H200_MEMORY_BOUND_ACTIVITY, get_preset
from perseus.runtime.port.sim_kernels import STEP_TAIL_TAG

MICROBATCHES = 8
DEPTH = 6  # kernels the host may run ahead of the simulated GPU
TAIL_S = 0.040  # GPU work between steps (max-clock seconds)
# kind -> (max-clock seconds, activity, compute-bound share)
KINDS = {"forward": (0.010, H200_MEMORY_BOUND_ACTIVITY, 0.2), "backward": (0.020, H200_DENSE_ACTIVITY, 0.8)}
CLOCKS = {"freq_min_mhz": 1305, "freq_max_mhz": 1980, "freq_step_mhz": 225}


def attribution(seed: int = 0, *, iters_per_freq: int = 20, clocks: dict[str, int] | None = None,
                max_steps: int = 200) -> dict[str, Any]:
    """Profile the job on the hostile card (counter noise drawn from ``seed``) and compare each
    kind's profiled energy per instruction with what the card spent (module docstring)."""
    from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
    from perseus.runtime.engine import Phase

    model = replace(get_preset("H200-hostile"), step_tail_s=TAIL_S)
    job = PipelineJob(num_stages=1, num_microbatches=MICROBATCHES, stage=0)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        state = d / "sim"
        SimulatedGPU(0, model=model, state_dir=state, reset_state=True, stream_depth=DEPTH, seed=seed).close()
        cfg = PerseusConfig.from_dict({
            "gpu": "sim", "device_index": 0, "cache_dir": str(d / "cache"), "warmup_steps": 2, "mode": "profile",
            "p_blocking_w": model.p_blocking_w, "log_every_steps": 0, "iters_per_freq": iters_per_freq,
            "remeasure_max": 0, **(clocks or CLOCKS), "sim_gpu": {"state_dir": str(state), "stream_depth": DEPTH}})
        launched: list[tuple[str, bool]] = []  # each instruction kernel's kind, and whether it was profiled
        with PerseusRuntime(job, cfg) as rt:
            gpu, kernels = rt.gpu.sim_device, rt.sim_kernels
            assert gpu is not None and kernels is not None
            order = list(rt.schedule.stages[0])
            began = False
            for _ in range(max_steps):
                profiling = rt.phases.phase is Phase.PROFILING
                began |= profiling
                if began and not profiling:
                    break
                rt.on_step_begin()
                for inst in order:
                    work, kernels.activity, kernels.compute_fraction = KINDS[inst.kind]
                    rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
                    kernels.pad(work)
                    rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
                    launched.append((inst.kind, profiling))
                rt.on_step_end()  # the runtime launches the model's step tail there (``SimulatedKernels.step_end``)
            gpu.stream.synchronize()
            ran = [k for k in gpu.stream.kernels() if k.tag != STEP_TAIL_TAG]
            tails = len(gpu.stream.kernels()) - len(ran)
            assert tails >= len(launched) // len(order), f"{tails} step tails for {len(launched) // len(order)} steps"
            profile = rt.supply.profile
            run = rt.supply.profiling
            assert profile is not None and run is not None, "the sweep did not finish; raise max_steps"
            recorder = run.recorder
            measured = recorder.measurements
            limit = gpu.power_limit_w()
    spent: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (kind, clock) -> each kernel's (J, s)
    for (kind, profiled), k in zip(launched, ran):
        if profiled:
            _, activity, _ = KINDS[kind]
            seconds = k.end_s - k.start_s
            spent.setdefault((kind, k.set_mhz), []).append((model.busy_power_w(k.run_mhz, activity) * seconds, seconds))
    out: dict[str, Any] = {}
    per_clock: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        errors = {}
        for f, point in measured[(0, kind)].items():
            kernels = spent.get((kind, f))
            if kernels:  # the kind's true mean power there, over the profile's typical instruction
                true_w = sum(e for e, _ in kernels) / sum(t for _, t in kernels)
                errors[f] = point.energy_j / (true_w * point.time_s) - 1.0
                per_clock.setdefault(str(f), {})[kind] = round(errors[f], 4)
        out[f"attr_error_{kind}"] = max(abs(v) for v in errors.values())
    powers = [p.energy_j / p.time_s for per_freq in measured.values() for p in per_freq.values() if p.time_s > 0]
    powers += [b.power_w for b in recorder.between_steps.values()]
    out["power_over_limit"] = sum(p > limit for p in powers)
    out["clocks_mhz"] = sorted({f for per_freq in measured.values() for f in per_freq}, reverse=True)
    out["signed_error_per_clock"] = per_clock
    out["counter_window"] = {str(f): w.describe() for f, w in recorder.windows.items()}
    out["kinds_share_one_power"] = {str(f): v for f, v in recorder.shared.items()}
    out["between_steps_w"] = {str(f): round(b.power_w, 1) for f, b in recorder.between_steps.items()}
    out["notes"] = list(recorder.notes)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(attribution(args.seed)))


if __name__ == "__main__":
    main()
