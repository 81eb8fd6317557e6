"""A simulated GPU's parameters: checked, defaulted, and recorded in (or matched against) its state file.

Why: every process that opens the same simulated GPU must simulate the same device (model,
counter period and phase, noise, seed, switch latency), so the parameters live in the shared
state file. The first opener (or one that resets) records them; later ones attach and may only
restate them: an explicit argument that differs from the file is an error, not a silent new GPU.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from perseus.gpu.errors import GPUError, GPUInvalidArgumentError
from perseus.gpu.sim.dvfs import PRESETS, DVFSModel, get_preset
from perseus.gpu.sim.faults import SimFaults
from perseus.gpu.sim.state import SimParams, SimState, SimStateFile

DEFAULT_PRESET = "A100-SXM"
DEFAULT_UPDATE_PERIOD_S = 0.1


def check_params(*, preset: str | None, model: DVFSModel | None, energy_update_period_s: float | None,
                 noise: float | None, switch_latency_s: float | None) -> None:
    """Raise ``GPUInvalidArgumentError`` for a parameter out of its range."""
    if preset is not None and model is not None:
        raise GPUInvalidArgumentError("pass either preset= or model=, not both")
    if energy_update_period_s is not None and energy_update_period_s < 0:
        raise GPUInvalidArgumentError("energy_update_period_s must be >= 0 (0 = continuous counter)")
    if noise is not None and not 0 <= noise < 0.5:
        raise GPUInvalidArgumentError("noise is a relative standard deviation in [0, 0.5)")
    if switch_latency_s is not None and not 0 <= switch_latency_s <= 1.0:
        raise GPUInvalidArgumentError("switch_latency_s is the delay of a clock change in seconds, in [0, 1]")


def explicit_params(*, preset: str | None, model: DVFSModel | None, energy_update_period_s: float | None,
                    noise: float | None, seed: int | None, switch_latency_s: float | None,
                    faults: SimFaults | None = None) -> SimParams:
    """The parameters the caller stated (``None`` ones are left to the file or the defaults)."""
    explicit: SimParams = {}
    if preset is not None or model is not None:
        explicit["model"] = (model or get_preset(preset or DEFAULT_PRESET)).to_dict()
    if energy_update_period_s is not None:
        explicit["energy_update_period_s"] = float(energy_update_period_s)
    if noise is not None:
        explicit["noise"] = float(noise)
    if seed is not None:
        explicit["seed"] = int(seed)
    if switch_latency_s is not None:
        explicit["switch_latency_s"] = float(switch_latency_s)
    if faults is not None:
        explicit["faults"] = faults.to_dict()
    return explicit


def open_state_file(index: int, path: Path, explicit: SimParams, *, reset: bool, now: float) -> SimStateFile:
    """Create (or, with ``reset``, re-create) GPU ``index``'s state file at ``path`` with ``explicit``
    over the defaults, idle since ``now``; or attach to the existing one if ``explicit`` matches it."""
    model = explicit.get("model") or PRESETS[DEFAULT_PRESET].to_dict()
    params: SimParams = {
        "model": model,
        "energy_update_period_s": DEFAULT_UPDATE_PERIOD_S,
        "noise": DVFSModel(**model).meter_noise,  # a real card's meter is noisy unless noise= says otherwise
        "seed": 0,
        "switch_latency_s": 0.0,
        "faults": {},
        **explicit,
        "created_s": now,
    }
    period = float(params["energy_update_period_s"])
    params["counter_phase_s"] = random.Random(int(params["seed"])).uniform(0, period)
    m = DVFSModel(**params["model"])
    init = SimState(power_limit_w=m.tdp_w, t_ref=now, power_w=m.p_blocking_w,
                    counter_k=math.floor((now - params["counter_phase_s"]) / period) if period > 0 else 0)
    foreign = SimFaults.from_dict(params["faults"]).foreign_lock_mhz
    if foreign is not None:  # someone else's lock, in force before this GPU's first user came
        init.locked, init.locked_mhz, init.applied_at = 1, m.nearest_clock(foreign), now
    file = SimStateFile(path, params, reset=reset, init_state=init)
    mismatched = [k for k, v in explicit.items() if file.params.get(k) != v]
    if mismatched:
        file.close()
        raise GPUError(
            f"Simulated GPU {index} at {file.path} already exists with different "
            f"{', '.join(mismatched)}; pass reset_state=True to re-create it, leave those "
            "arguments unset to attach, or use another PERSEUS_SIM_GPU_DIR"
        )
    return file
