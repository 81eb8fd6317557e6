"""A physically motivated DVFS (frequency → time, power, energy) model for simulated GPUs.

Why these equations: a kernel's runtime has a compute-bound part that scales with 1/f and a
memory-bound part that doesn't; dynamic power is ∝ f·V², and V rises with f above a voltage-floor
"knee" but stays at the floor below it. Together they give the measured A100/A40 shape: energy per
kernel is lowest at a mid frequency, not at the minimum clock (below the knee, slowing down saves
little power but costs static energy for longer).

    t(f)     = t_max · (α · f_max / f + (1 − α))                     α = compute-bound fraction
    V(f)/V_max = max(v_floor, (f / f_max)^((γ − 1) / 2))            v_floor = V at f_knee
    P(f)     = P_static + activity · P_dyn_max · (f / f_max) · (V(f)/V_max)²
             = P_static + activity · P_dyn_max · (f / f_max)^γ       (above the knee)
    E(f)     = P(f) · t(f)
    idle / blocked on communication: P_blocking (constant)

If P(f) exceeds the power limit the GPU throttles to the highest supported clock that fits
(this is why the A40's top clocks all run at the same speed in measured profiles, and why a
real H200 runs a dense bf16 stage at ~1,530 MHz with reason ``sw_power_cap`` while a memory-bound
loop on the same card runs at 1,980 MHz: the sustained clock depends on the work's activity).

``energy_read_s`` / ``power_read_s``: how long one energy-counter / power read takes (a real
H200: 2.4 ms and 10 µs), so code that reads the counter on the training thread pays for it here too.

What real cards add, off in the plain presets and all on in "H200-hostile": a counter that samples
only part of each period, reports late and with noise; a switch latency that depends on the target
clock; an optimizer tail after each step and spinning pipeline waits on the asynchronous stream.

The replay preset (``replay_preset``) is no equation: one stage of measured A100 runs, its time and
power per clock as measured (``perseus.measured.replay``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from perseus.gpu.errors import GPUInvalidArgumentError


@dataclass(frozen=True)
class DVFSModel:
    """Parameters of one simulated GPU model; all fields are plain numbers so it serializes."""

    name: str
    architecture: str
    sm_min_mhz: int
    sm_max_mhz: int
    sm_step_mhz: int
    memory_clock_mhz: int
    tdp_w: float
    power_limit_min_w: float
    p_static_w: float
    p_dyn_max_w: float
    gamma: float
    knee_mhz: int
    p_blocking_w: float
    energy_read_s: float = 0.0
    power_read_s: float = 0.0
    # Host cost of recording a stream event: a newly created one / one recycled from a pool (a
    # real card: torch.cuda.Event creation + record 40-60 µs, a record of an existing event ~5 µs).
    event_new_s: float = 0.0
    event_record_s: float = 0.0
    # What real cards do that the plain model leaves out (all off by default; ``HOSTILE_FIELDS``):
    # the energy counter books (mean power over the sampled part of each period) × period, not the
    # integral: A100/H100 sample power during only ~25 % of each 100 ms period ("part-time power
    # measurements", SC'24, arXiv 2312.02741); 1.0 samples all of it.
    meter_sampled_fraction: float = 1.0
    meter_lag_s: float = 0.0  # each update appears up to this long after its period ends
    meter_noise: float = 0.0  # relative noise of each update and power read unless ``noise=`` is given
    # Clock-switch latency to the lowest / the highest clock, linear in the target between (it depends
    # mostly on the target clock: LATEST, arXiv 2502.20075); 0 and 0: the GPU's constant ``switch_latency_s``.
    switch_latency_low_s: float = 0.0
    switch_latency_high_s: float = 0.0
    # On the asynchronous stream: the optimizer + gradient all-reduce after each step's last
    # instruction (max-clock seconds, its activity and compute-bound share), and the activity a
    # stream waiting for its host draws (a pipeline wait: NCCL's kernel spins; 0: idle, P_blocking).
    step_tail_s: float = 0.0
    step_tail_activity: float = 0.0
    step_tail_compute_fraction: float = 0.0
    spin_activity: float = 0.0
    # The replay preset (``replay_preset``): at each of ``table_clocks_mhz`` the work's slowdown
    # against the max clock and the power while it runs, as one stage of measured runs had them
    # (linear between the clocks), instead of the equations above, whatever the activity; and where
    # each instruction's own time comes from (the runs' directory, the stage, the time scale: the
    # runtime's ``sim_kernels`` draws it). Empty: the equations (``REPLAY_FIELDS``).
    table_clocks_mhz: tuple[int, ...] = ()
    table_slowdown: tuple[float, ...] = ()
    table_power_w: tuple[float, ...] = ()
    replay_dir: str = ""
    replay_stage: int = 0
    replay_time_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("table_clocks_mhz", "table_slowdown", "table_power_w"):  # JSON gives lists
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not len(self.table_clocks_mhz) == len(self.table_slowdown) == len(self.table_power_w):
            raise GPUInvalidArgumentError(f"{self.name}: table_clocks_mhz, table_slowdown and table_power_w "
                                          "must be equally long")
        if not 0 < self.sm_min_mhz <= self.knee_mhz <= self.sm_max_mhz:
            raise GPUInvalidArgumentError(
                f"{self.name}: need 0 < sm_min ({self.sm_min_mhz}) <= knee ({self.knee_mhz}) "
                f"<= sm_max ({self.sm_max_mhz}) MHz"
            )
        if self.sm_step_mhz <= 0 or (self.sm_max_mhz - self.sm_min_mhz) % self.sm_step_mhz:
            raise GPUInvalidArgumentError(
                f"{self.name}: sm_step {self.sm_step_mhz} MHz must divide sm_max − sm_min"
            )
        if self.gamma < 1 or min(self.p_static_w, self.p_dyn_max_w, self.p_blocking_w) < 0:
            raise GPUInvalidArgumentError(f"{self.name}: gamma must be >= 1 and powers >= 0")
        if not 0 < self.power_limit_min_w <= self.tdp_w:
            raise GPUInvalidArgumentError(f"{self.name}: need 0 < power_limit_min <= tdp")
        if not all(0 <= x < 1 for x in (self.energy_read_s, self.power_read_s, self.event_new_s,
                                             self.event_record_s)):
            raise GPUInvalidArgumentError(f"{self.name}: read latencies and event costs are seconds in [0, 1)")
        if not 0 < self.meter_sampled_fraction <= 1 or not 0 <= self.meter_noise < 0.5:
            raise GPUInvalidArgumentError(f"{self.name}: need 0 < meter_sampled_fraction <= 1 and 0 <= meter_noise < 0.5")
        if not all(0 <= x <= 1 for x in (self.meter_lag_s, self.switch_latency_low_s, self.switch_latency_high_s,
                                         self.step_tail_s, self.step_tail_activity,
                                         self.step_tail_compute_fraction, self.spin_activity)):
            raise GPUInvalidArgumentError(f"{self.name}: meter lag, switch latencies (s), the step tail and "
                                          "activities must be in [0, 1]")

    # -- clocks -----------------------------------------------------------------------------
    def supported_sm_clocks(self) -> list[int]:
        """Descending, like NVML reports them."""
        return list(range(self.sm_max_mhz, self.sm_min_mhz - 1, -self.sm_step_mhz))

    def nearest_clock(self, mhz: float) -> int:
        """Snap a requested clock to the supported grid, as the hardware does."""
        k = round((mhz - self.sm_min_mhz) / self.sm_step_mhz)
        k = max(0, min(k, (self.sm_max_mhz - self.sm_min_mhz) // self.sm_step_mhz))
        return self.sm_min_mhz + k * self.sm_step_mhz

    # -- model ------------------------------------------------------------------------------
    def slowdown(self, mhz: float, compute_fraction: float) -> float:
        """t(f) / t_max: compute-bound work scales with 1/f, memory-bound work does not."""
        if self.table_clocks_mhz:
            return float(np.interp(mhz, self.table_clocks_mhz, self.table_slowdown))
        return compute_fraction * self.sm_max_mhz / mhz + (1.0 - compute_fraction)

    def busy_power_w(self, mhz: float, activity: float = 1.0) -> float:
        """Board power while running a kernel at ``mhz`` with the given SM activity (0–1)."""
        if self.table_clocks_mhz:
            return float(np.interp(mhz, self.table_clocks_mhz, self.table_power_w))
        x = mhz / self.sm_max_mhz
        exp = (self.gamma - 1.0) / 2.0
        v = max((self.knee_mhz / self.sm_max_mhz) ** exp, x**exp)
        return self.p_static_w + activity * self.p_dyn_max_w * x * v * v

    def kernel_time_s(self, t_max_s: float, mhz: float, compute_fraction: float = 0.8) -> float:
        return t_max_s * self.slowdown(mhz, compute_fraction)

    def kernel_energy_j(
        self, t_max_s: float, mhz: float, activity: float = 1.0, compute_fraction: float = 0.8
    ) -> float:
        return self.busy_power_w(mhz, activity) * self.kernel_time_s(t_max_s, mhz, compute_fraction)

    def throttled_clock(self, mhz: int, activity: float, power_limit_w: float) -> int:
        """Clock actually run: ``mhz`` unless the power limit forces the GPU lower."""
        return min(mhz, self._max_clock_under(round(activity, 6), round(power_limit_w, 6)))

    @functools.lru_cache(maxsize=256)  # noqa: B019 - instances are frozen, few, long-lived
    def _max_clock_under(self, activity: float, power_limit_w: float) -> int:
        for f in self.supported_sm_clocks():
            if self.busy_power_w(f, activity) <= power_limit_w:
                return f
        return self.sm_min_mhz

    def switch_latency_s(self, target_mhz: int) -> float:
        """Latency of a switch to ``target_mhz``: linear between the lowest and the highest clock."""
        x = (target_mhz - self.sm_min_mhz) / (self.sm_max_mhz - self.sm_min_mhz) if self.sm_max_mhz > self.sm_min_mhz else 1.0
        x = max(0.0, min(1.0, x))
        return self.switch_latency_low_s + x * (self.switch_latency_high_s - self.switch_latency_low_s)

    @property
    def replays(self) -> bool:
        """Whether this is the replay preset: measured runs decide time and power."""
        return bool(self.replay_dir)

    @property
    def hostile(self) -> bool:
        """Whether any real-card behaviour (``HOSTILE_FIELDS``) is on."""
        return any(getattr(self, k) != v for k, v in HOSTILE_FIELDS.items())

    def to_dict(self) -> dict[str, object]:
        """Plain fields; the real-card and replay ones only where on, so the plain presets' record is unchanged."""
        off = {**HOSTILE_FIELDS, **REPLAY_FIELDS}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if k not in off or v != off[k]}


# The real-card behaviours' fields and their "off" values.
HOSTILE_FIELDS: dict[str, float] = {
    "meter_sampled_fraction": 1.0, "meter_lag_s": 0.0, "meter_noise": 0.0, "switch_latency_low_s": 0.0,
    "switch_latency_high_s": 0.0, "step_tail_s": 0.0, "step_tail_activity": 0.0, "step_tail_compute_fraction": 0.0,
    "spin_activity": 0.0,
}
# The replay preset's fields and their "off" values.
REPLAY_FIELDS: dict[str, object] = {"table_clocks_mhz": (), "table_slowdown": (), "table_power_w": (), "replay_dir": "",
                                    "replay_stage": 0, "replay_time_scale": 1.0}


PRESETS: dict[str, DVFSModel] = {
    # Fitted to the shape of the measured GPT-3 stage profiles (Perseus SOSP'24 artifact): energy
    # minimum near 1050 MHz at ~0.73× the max-clock energy; P_blocking is the artifact's value.
    "A100-SXM": DVFSModel(
        name="NVIDIA A100-SXM4-40GB (simulated)", architecture="ampere",
        sm_min_mhz=210, sm_max_mhz=1410, sm_step_mhz=15, memory_clock_mhz=1215,
        tdp_w=400.0, power_limit_min_w=100.0, p_static_w=100.0, p_dyn_max_w=290.0,
        gamma=3.0, knee_mhz=1050, p_blocking_w=83.64,
    ),
    # The A40 at full activity exceeds its 300 W limit at the top clocks and throttles (flat
    # top of the measured curve); P_blocking from the artifact.
    "A40": DVFSModel(
        name="NVIDIA A40 (simulated)", architecture="ampere",
        sm_min_mhz=210, sm_max_mhz=1740, sm_step_mhz=15, memory_clock_mhz=7251,
        tdp_w=300.0, power_limit_min_w=100.0, p_static_w=120.0, p_dyn_max_w=280.0,
        gamma=3.0, knee_mhz=1005, p_blocking_w=70.38,
    ),
    "H100-SXM": DVFSModel(
        name="NVIDIA H100 80GB HBM3 (simulated)", architecture="hopper",
        sm_min_mhz=345, sm_max_mhz=1980, sm_step_mhz=15, memory_clock_mhz=2619,
        tdp_w=700.0, power_limit_min_w=200.0, p_static_w=170.0, p_dyn_max_w=500.0,
        gamma=3.0, knee_mhz=1365, p_blocking_w=110.0,
    ),
    # The measured H200 (docs/field-notes.md): 110 SM clocks 345–1,980 MHz; a dense bf16 stage
    # (activity 1) sits at the 700 W limit at ~1,530 MHz (sw_power_cap), a memory-bound loop
    # (activity ~0.31) runs uncapped at 1,980 MHz near 505 W, tiny kernels near 124 W; idle
    # 80–130 W; energy reads take 2.4 ms, power reads 10 µs; the counter updates every 100 ms.
    "H200": DVFSModel(
        name="NVIDIA H200 (simulated)", architecture="hopper",
        sm_min_mhz=345, sm_max_mhz=1980, sm_step_mhz=15, memory_clock_mhz=3201,
        tdp_w=700.0, power_limit_min_w=200.0, p_static_w=100.0, p_dyn_max_w=1290.0,
        gamma=3.0, knee_mhz=1365, p_blocking_w=110.0, energy_read_s=0.0024, power_read_s=0.00001,
        event_new_s=40e-6, event_record_s=5e-6,
    ),
}

# Activities that reproduce the H200's measured loads under the "H200" preset.
H200_DENSE_ACTIVITY = 1.0
H200_MEMORY_BOUND_ACTIVITY = 0.31

# The measured H200 with what real cards do on top (each number's source in ``DVFSModel``'s fields):
# - the counter samples 25 % of each period (A100/H100, SC'24; not measured on Hopper here), reports
#   up to 10 ms late (assumed, < 1/10 period), 1 % noise per update (assumed: ±5 W at 500 W, the
#   accuracy NVIDIA documented for Fermi-era NVML power readings);
# - a clock switch takes 5 ms to the lowest clock, 15 ms to the highest (assumed: not measured on Hopper
#   here; the target dependence is LATEST's finding, raising being the slower as the voltage must rise first);
# - after each step a 35 ms memory-bound tail at the measured memory-bound activity (~500 W): a CUDA
#   timer on the real H200 read 31.6 ms of optimizer-like work after the last instruction;
# - a stage blocked on a send/recv spins at activity 0.05 (~165 W at the top clock, assumed: NCCL keeps
#   a few SMs polling; above the measured idle 81-130 W and tiny kernels' 124 W, far below the 505 W load).
PRESETS["H200-hostile"] = replace(
    PRESETS["H200"], name="NVIDIA H200 (simulated, real-card meter, switches and waits)",
    meter_sampled_fraction=0.25, meter_lag_s=0.010, meter_noise=0.01,
    switch_latency_low_s=0.005, switch_latency_high_s=0.015,
    step_tail_s=0.035, step_tail_activity=H200_MEMORY_BOUND_ACTIVITY, step_tail_compute_fraction=0.1,
    spin_activity=0.05,
)


def get_preset(name: str) -> DVFSModel:
    """Look up a preset by name (case-insensitive), with a helpful error."""
    for key, model in PRESETS.items():
        if key.lower() == name.lower():
            return model
    raise GPUInvalidArgumentError(f"Unknown simulated GPU preset {name!r}; choose one of {sorted(PRESETS)}")


def replay_preset(replay: str | os.PathLike[str] | Mapping[str, Any], stage: int) -> DVFSModel:
    """The replay preset: the A100-SXM the runs measured, its GPU ``stage`` replaying that stage of them.

    ``replay``: one workload directory of measured runs (``perseus.measured.runs``), or
    ``{"dir": ..., "time_scale": ...}`` (``time_scale`` < 1 shortens every time: a demo's). The GPU
    offers the measured clocks; its slowdown and power per clock are the stage's
    (``perseus.measured.replay``), P_blocking the fitted one. A malformed directory is one
    ``ProfileError`` line."""
    from perseus.measured.replay import load_replay

    spec: dict[str, Any] = dict(replay) if isinstance(replay, Mapping) else {"dir": replay}
    if "dir" not in spec or set(spec) - {"dir", "time_scale"}:
        raise GPUInvalidArgumentError(f"replay is a workload directory or {{\"dir\": ..., \"time_scale\": ...}}, got {replay!r}")
    source = load_replay(spec["dir"], spec.get("time_scale", 1.0))
    if not 0 <= stage < source.stages:
        raise GPUInvalidArgumentError(f"simulated GPU {stage} has no stage to replay: {source.path} measured "
                                      f"{source.stages} stages (GPU i replays stage i)")
    clocks = source.clocks_mhz
    return replace(
        PRESETS["A100-SXM"], name=f"NVIDIA A100-SXM4-40GB (replaying {source.model}, stage {stage})",
        sm_min_mhz=clocks[0], sm_max_mhz=clocks[-1], sm_step_mhz=clocks[1] - clocks[0] if len(clocks) > 1 else 1,
        knee_mhz=clocks[0], p_blocking_w=source.p_blocking_w, table_clocks_mhz=clocks,
        table_slowdown=tuple(float(f"{source.slowdown(stage, c):.6g}") for c in clocks),
        table_power_w=tuple(float(f"{source.power_w(stage, c):.6g}") for c in clocks),
        replay_dir=str(source.path), replay_stage=stage, replay_time_scale=source.time_scale,
    )
