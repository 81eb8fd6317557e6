"""Figures: the time–energy frontier, and pipeline timelines colored by frequency.

Uses matplotlib's Agg backend (no display needed). Figures are written atomically: a failed or
interrupted plot never leaves a truncated image behind.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from perseus.store.atomic import atomic_output  # noqa: E402
from perseus.schedules.dag import InstructionDAG  # noqa: E402
from perseus.errors import PerseusError  # noqa: E402
from perseus.frontier import Frontier, FrontierPoint  # noqa: E402
from perseus.profile import Profile  # noqa: E402
from perseus.timeline.simulator import IterationTimeline, max_frequency_plan, simulate_plan  # noqa: E402

IMAGE_FORMATS = ("png", "pdf", "svg")


def image_format(path: Path) -> str:
    """Format from the file suffix; raises a ``PerseusError`` for unsupported ones."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in IMAGE_FORMATS:
        raise PerseusError(f"{path}: cannot tell the image format; end the name with .{', .'.join(IMAGE_FORMATS)}")
    return fmt


def save_figure(fig: Figure, path: Path) -> None:
    """Render to a temporary file next to ``path``, then rename over it."""
    try:
        with atomic_output(path) as f:
            fig.savefig(f, format=image_format(path), dpi=120)
    except OSError as exc:
        raise PerseusError(f"{path}: cannot write figure ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def plot_frontier(frontier: Frontier, out: Path) -> None:
    """Iteration time vs energy of every frontier point, with the all-max baseline marked."""
    times = [p.time_s for p in frontier.points]
    energies = [p.energy_j for p in frontier.points]
    default = frontier.default_point()
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    ax.plot(times, energies, "-o", color="tab:blue", markersize=3, linewidth=1.2, label=f"Perseus frontier ({len(times)} points)")
    ax.plot(frontier.baseline_time_s, frontier.baseline_energy_j, "*", color="tab:red", markersize=14, label="all max frequency (baseline)")
    saving = 1 - default.energy_j / frontier.baseline_energy_j
    ax.plot(default.time_s, default.energy_j, "D", color="tab:green", markersize=8, label=f"no-slowdown point ({saving:.1%} less energy)")
    ax.axvline(frontier.baseline_time_s, color="tab:red", linestyle=":", linewidth=1)
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("iteration energy (J)")
    sched = frontier.schedule
    ax.set_title(
        f"{sched.name}, {sched.num_stages} stages x {sched.num_microbatches} microbatches\n"
        f"{frontier.gpu_name}, P_blocking {frontier.p_blocking_w:.4g} W",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    save_figure(fig, out)


def _draw_timeline(ax, dag: InstructionDAG, timeline: IterationTimeline, freqs, norm: Normalize, cmap, xmax: float) -> None:
    num_stages = dag.schedule.num_stages
    min_label_width = xmax / 70  # skip labels that would not fit in their box
    for v, inst in enumerate(dag.instructions):
        stage = int(dag.node_stage[v])
        start, width = float(timeline.start_s[v]), float(timeline.finish_s[v] - timeline.start_s[v])
        y = num_stages - 1 - stage
        ax.add_patch(Rectangle((start, y + 0.08), width, 0.84, facecolor=cmap(norm(freqs[v])), edgecolor="black", linewidth=0.4))
        if width >= min_label_width:
            ax.text(start + width / 2, y + 0.5, inst.short(), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, num_stages)
    ax.set_yticks([num_stages - 1 - s + 0.5 for s in range(num_stages)], [f"stage {s}" for s in range(num_stages)])
    ax.set_xlabel("time (s)")


def plot_timeline(frontier: Frontier, point: FrontierPoint, label: str, profile: Profile, out: Path) -> None:
    """Pipeline timelines of the all-max baseline (top) and ``point`` (bottom), colored by clock.

    Durations come from simulating each plan on ``profile`` (with the frontier's P_blocking).
    """
    profile.check_matches(frontier.schedule)
    profile = profile.with_p_blocking(frontier.p_blocking_w)
    dag = InstructionDAG.from_schedule(frontier.schedule)
    base_freqs = max_frequency_plan(dag, profile)
    base = simulate_plan(dag, profile, base_freqs)
    chosen = simulate_plan(dag, profile, point.freqs_mhz)
    all_freqs = [f for p in profile.entries.values() for f in p.freqs_mhz]
    norm = Normalize(vmin=min(all_freqs), vmax=max(all_freqs))
    cmap = plt.get_cmap("coolwarm")
    xmax = max(base.time_s, chosen.time_s) * 1.01
    per_stage = max(len(s) for s in frontier.schedule.stages)
    width = min(30.0, max(9.0, 0.35 * per_stage))
    height = 1.6 + 0.55 * frontier.schedule.num_stages * 2
    fig, (ax_base, ax_point) = plt.subplots(2, 1, figsize=(width, height), sharex=True, layout="constrained")
    _draw_timeline(ax_base, dag, base, base_freqs, norm, cmap, xmax)
    _draw_timeline(ax_point, dag, chosen, point.freqs_mhz, norm, cmap, xmax)
    ax_base.set_title(f"all max frequency (baseline): {base.time_s:.4g} s, {base.energy_j:,.1f} J")
    slowdown = chosen.time_s / base.time_s - 1
    saving = 1 - chosen.energy_j / base.energy_j
    ax_point.set_title(
        f"Perseus, {label}: {chosen.time_s:.4g} s ({slowdown:+.1%}), {chosen.energy_j:,.1f} J ({saving:.1%} less energy)"
    )
    colorbar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=[ax_base, ax_point], pad=0.01)
    colorbar.set_label("SM frequency (MHz)")
    save_figure(fig, out)
