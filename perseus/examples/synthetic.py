"""A physically shaped synthetic GPU profile, for the shipped example and for tests.

Why a model and not measurements: the example must be small, redistributable and reproducible.
The shape follows how GPU kernels respond to the SM clock:

- time(f)  = t_max · (α · f_max / f + (1 − α)): the compute-bound fraction α slows down with the
  clock, the memory/communication-bound rest does not;
- power(f) = P_static + P_dynamic · (f / f_max)^2.7: dynamic power grows faster than linearly with
  the clock (voltage scales with it), static power does not;
- energy = power · time.

So lowering the clock saves energy at a modest time cost, and more on memory-bound work.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from perseus.profile import Profile

CSV_HEADER = ("rank", "dp_rank", "pp_rank", "tp_rank", "stage", "instruction", "frequency", "time", "energy")


@dataclass(frozen=True)
class InstructionModel:
    """Time/power model of one (stage, kind) instruction."""

    time_at_max_s: float
    compute_bound_fraction: float  # α
    dynamic_power_w: float  # at the highest clock

    def time_s(self, freq_mhz: int, max_freq_mhz: int) -> float:
        alpha = self.compute_bound_fraction
        return self.time_at_max_s * (alpha * max_freq_mhz / freq_mhz + (1.0 - alpha))

    def power_w(self, freq_mhz: int, max_freq_mhz: int, static_power_w: float) -> float:
        return static_power_w + self.dynamic_power_w * (freq_mhz / max_freq_mhz) ** 2.7


def synthetic_rows(
    stages: Sequence[dict[str, InstructionModel]],
    freqs_mhz: Sequence[int],
    static_power_w: float,
) -> list[tuple[int, int, int, int, int, str, int, float, float]]:
    """Rows in Zeus's profile CSV layout (see ``CSV_HEADER``), one pipeline rank per stage.

    Values are rounded (1 µs, 0.1 mJ) so the written file is byte-for-byte reproducible.
    """
    max_freq = max(freqs_mhz)
    rows = []
    for stage, models in enumerate(stages):
        for kind in ("forward", "backward"):
            model = models[kind]
            for f in sorted(freqs_mhz, reverse=True):
                t = model.time_s(f, max_freq)
                e = t * model.power_w(f, max_freq, static_power_w)
                rows.append((stage, 0, stage, 0, stage, kind, int(f), round(t, 6), round(e, 4)))
    return rows


def example_models(num_stages: int = 4) -> list[dict[str, InstructionModel]]:
    """Stage models of a small GPT-like pipeline: the last stage (LM head + loss) is heavier."""
    models = []
    for stage in range(num_stages):
        last = stage == num_stages - 1
        forward_s = 0.038 if last else (0.030 if stage == 0 else 0.029)
        models.append(
            {
                "forward": InstructionModel(forward_s, 0.80, 215.0),
                "backward": InstructionModel(2.08 * forward_s, 0.85, 235.0),
            }
        )
    return models


EXAMPLE_FREQS_MHZ: tuple[int, ...] = tuple(range(1410, 839, -30))  # 20 clocks, A100-like range
EXAMPLE_STATIC_POWER_W = 75.0


def example_csv_text() -> str:
    """The shipped example profile's CSV text (4 stages, 20 clocks), deterministic."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows(synthetic_rows(example_models(4), EXAMPLE_FREQS_MHZ, EXAMPLE_STATIC_POWER_W))
    return buffer.getvalue()


H100_FREQS_MHZ: tuple[int, ...] = tuple(range(1980, 1004, -15))  # 66 clocks, H100 SXM's upper range
H100_STATIC_POWER_W = 110.0
H100_P_BLOCKING_W = 95.0


def h100_like_profile(num_stages: int, num_chunks: int = 1, seed: int = 0, noise: float = 0.005) -> Profile:
    """A seeded synthetic H100-like ``Profile`` of any size, for planner scale benchmarks and tests.

    Why seeded noise: real sweeps are not smooth (some clocks are dominated, the time–energy curve
    is not convex), and a planner tuned on a smooth model would look better than it is. The same
    arguments always give the same profile, so the benchmark compares planners on equal inputs.
    """
    import numpy as np

    from perseus.profile import InstructionProfile, Profile

    rng = np.random.default_rng(seed)
    freqs = np.asarray(H100_FREQS_MHZ, dtype=float)
    entries = {}
    for stage in range(num_stages):
        heavier = 1.25 if stage == num_stages - 1 else 1.0  # LM head + loss
        for chunk in range(num_chunks):
            forward_s = heavier * rng.uniform(0.009, 0.011) / num_chunks
            for kind, scale, alpha, dynamic in (("forward", 1.0, 0.78, 480.0), ("backward", rng.uniform(1.9, 2.1), 0.84, 520.0)):
                model = InstructionModel(forward_s * scale, alpha + rng.uniform(-0.04, 0.04), dynamic * rng.uniform(0.95, 1.05))
                times = np.array([model.time_s(int(f), int(freqs[0])) for f in freqs])
                power = np.array([model.power_w(int(f), int(freqs[0]), H100_STATIC_POWER_W) for f in freqs])
                times = times * (1 + noise * rng.standard_normal(len(freqs)))
                energies = power * times * (1 + noise * rng.standard_normal(len(freqs)))
                entries[(stage, chunk, kind)] = InstructionProfile(
                    tuple(int(f) for f in freqs), tuple(np.round(times, 9).tolist()), tuple(np.round(energies, 6).tolist())
                )
    return Profile(entries, H100_P_BLOCKING_W, "synthetic H100-like", {"seed": seed}, f"h100-like(seed={seed})")
