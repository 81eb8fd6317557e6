"""The carbon replay's figure: a week of carbon intensity (actual and forecast), the point chosen
each hour (its slowdown against all-max clocks) and the job's power.

Why a figure: the saving is a single number, but whether the policy does what it says (slower
where the grid is dirty, faster where it is clean, within the budget) shows only hour by hour.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perseus.carbon.replay import CarbonReplay
from perseus.output.plot import image_format, plt, save_figure


def carbon_week_figure(replay: CarbonReplay, path: Path, start_hour: int = 0, hours: int = 168) -> None:
    """Write hours ``start_hour`` .. + ``hours`` of ``replay`` as a three-panel figure."""
    image_format(path)  # a bad suffix fails before drawing
    end = min(start_hour + hours, len(replay.ci))
    x = np.arange(start_hour, end)
    m = replay.menu
    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    axes[0].plot(x, replay.ci[start_hour:end], label="actual", color="#333333")
    axes[0].plot(x, replay.forecast[start_hour:end], label="forecast", color="#e6550d", linewidth=0.8)
    axes[0].set_ylabel("gCO2/kWh")
    axes[0].legend(loc="upper right")
    slowdown = 100 * (m.times_s / m.baseline_time_s - 1)
    axes[1].step(x, slowdown[replay.chosen[start_hour:end]], where="post", label="forecast-driven", color="#31a354")
    axes[1].step(x, slowdown[replay.hindsight[start_hour:end]], where="post", label="hindsight", color="#756bb1",
                 linewidth=0.8, linestyle="--")
    axes[1].set_ylabel("slowdown (%)")
    axes[1].legend(loc="upper right")
    power_kw = replay.scale * m.powers_w / 1000
    axes[2].step(x, power_kw[replay.chosen[start_hour:end]], where="post", color="#3182bd")
    axes[2].axhline(replay.scale * m.baseline_energy_j / m.baseline_time_s / 1000, color="#999999", linestyle=":",
                    label="all-max clocks")
    axes[2].set_ylabel("job power (kW)")
    axes[2].set_xlabel("hour of the trace")
    axes[2].legend(loc="upper right")
    axes[0].set_title(f"carbon-aware points, +{100 * replay.budget:g} % time budget")
    fig.tight_layout()
    save_figure(fig, path)
