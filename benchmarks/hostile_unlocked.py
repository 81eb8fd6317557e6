"""The fastest plan against the unlocked card, on a simulated H200 whose kinds sustain different clocks.

Why: an unlocked card does not run every kind of work at one clock. The measured H200 ran dense
GEMMs at 1,530 MHz under its 700 W cap and memory-bound work at 1,980 MHz. A profile whose clocks
above one sustained clock per stage copy that clock's point, and a deployment that never leaves a
locked clock, can make the fastest plan slower than simply not locking the card at all.

``fastest_vs_unlocked`` drives the real runtime (``PerseusRuntime``, ``gpu: "sim"``) on the
simulated H200 through a one-stage 1F1B job whose forward is memory-bound (the preset's
``H200_MEMORY_BOUND_ACTIVITY``, mostly clock-independent) and whose backward is dense (activity 1:
held near 1,530 MHz by the power cap): warm-up, profiling, planning, then the frontier's fastest
point deployed for ``steps`` steps, then ``PerseusRuntime.stop`` (default clocks, the unlocked card)
for as many. Each step's time is the simulated GPU's own: the sum of its kernels' durations
(``SimulatedGPU.last_busy_interval``), so a busy host does not move it. The result is the deployed
steps' mean over the unlocked steps' mean; at most 1.01 is the target.

    python benchmarks/hostile_unlocked.py        # prints {"fastest_plan_vs_unlocked": ...} as JSON
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.dvfs import H200_DENSE_ACTIVITY, H200_MEMORY_BOUND_ACTIVITY
from perseus.profile import Profile
from perseus.profile.unlocked import clock_name
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob

PRESET = "H200"
JOB = PipelineJob(num_stages=1, num_microbatches=4, stage=0)
# (max-clock seconds, SM activity, compute-bound share) per kind: a memory-bound forward, a dense backward
KINDS: dict[str, tuple[float, float, float]] = {
    "forward": (0.012, H200_MEMORY_BOUND_ACTIVITY, 0.3),
    "backward": (0.024, H200_DENSE_ACTIVITY, 0.9),
}
PLAN_TIMEOUT_S = 240.0  # hang guard: the planner process starts slowly on a loaded machine


def config(folder: Path) -> PerseusConfig:
    """Profile and plan (no cache), the guard off: the fastest point runs every deployed step."""
    return PerseusConfig.from_dict({
        "gpu": "sim", "device_index": 0, "sim_gpu": {"state_dir": str(folder)}, "mode": "run",
        "cache_dir": None, "warmup_steps": 2, "iters_per_freq": 2, "coarse_step_mhz": 150,
        "freq_min_mhz": 1200, "remeasure_max": 0, "p_blocking_w": 110.0, "probe_every_steps": 0,
        "straggler_period_steps": 0, "log_every_steps": 0, "plan_wait_s": PLAN_TIMEOUT_S,
    })


def one_step(rt: PerseusRuntime) -> float:
    """One training step; the simulated GPU's own time of it (the sum of its kernels' durations)."""
    kernels = rt.sim_kernels
    assert kernels is not None
    total = 0.0
    rt.on_step_begin()
    for inst in rt.schedule.stages[0]:
        work, activity, compute = KINDS[inst.kind]
        kernels.activity, kernels.compute_fraction = activity, compute
        rt.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
        kernels.pad(work)
        rt.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        total += kernels.device.last_busy_interval()[1]
    rt.on_step_end()
    return total


@dataclass(frozen=True)
class Run:
    """One run: the simulated GPU's mean step time with the fastest point deployed and unlocked,
    the point's clocks of the stage, and the profile the runtime planned on."""

    fastest_s: float
    unlocked_s: float
    clocks_mhz: list[int]
    profile: Profile

    def facts(self) -> dict[str, Any]:
        """What the run decided, for the reader: each kind's sustained clock, the fastest clocks."""
        kinds = {kind: self.profile.get(0, kind).unlocked for kind in KINDS}
        return {"fastest_step_s": self.fastest_s, "unlocked_step_s": self.unlocked_s,
                "fastest_clocks": [clock_name(f) for f in self.clocks_mhz],
                "kind_sustained_mhz": {k: u.sustained_mhz if u is not None else None for k, u in kinds.items()}}


def run(seed: int = 0, steps: int = 6) -> Run:
    """Profile, plan and deploy the fastest point on a fresh simulated H200, then the unlocked card."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        SimulatedGPU(0, preset=PRESET, state_dir=folder, reset_state=True, seed=seed).close()
        with PerseusRuntime(JOB, config(folder)) as rt:
            deadline = time.monotonic() + PLAN_TIMEOUT_S
            while rt.phase.value != "deployed" and time.monotonic() < deadline:
                one_step(rt)
            if rt.phase.value != "deployed" or rt.supply.profile is None:
                raise RuntimeError(f"the runtime did not deploy a plan (phase {rt.phase.value!r}); see its log")
            rt.set_target_time(1e-9)  # no point is that fast: the fastest
            one_step(rt)  # the step that switches to it
            fastest = fmean(one_step(rt) for _ in range(steps))
            clocks = rt.stage_clocks() or []
            rt.stop()  # default clocks from now on: the unlocked card
            unlocked = fmean(one_step(rt) for _ in range(steps))
            return Run(fastest, unlocked, clocks, rt.supply.profile)


def fastest_vs_unlocked(seed: int = 0, steps: int = 6) -> dict[str, Any]:
    """The fastest frontier point's step time over the unlocked card's (target <= 1.01), both
    measured on one simulated H200 by the real runtime; with what the run decided."""
    found = run(seed, steps)
    return {"fastest_plan_vs_unlocked": found.fastest_s / found.unlocked_s, **found.facts()}


if __name__ == "__main__":
    print(json.dumps(fastest_vs_unlocked()))
