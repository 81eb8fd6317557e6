"""Figures: the time–energy frontier, pipeline timelines colored by frequency, and the figures of
``perseus report`` (a run's iterations; the frontier with the points a run deployed).

Uses matplotlib's Agg backend (no display needed). Figures are written atomically: a failed or
interrupted plot never leaves a truncated image behind.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from perseus.atomic import atomic_output
from perseus.schedules.dag import InstructionDAG
from perseus.errors import PerseusError
from perseus.frontier import Frontier, FrontierPoint
from perseus.output.run_data import Run, Step
from perseus.output.run_stats import comparison
from perseus.output.wording import energy_change
from perseus.profile import Profile
from perseus.profile.unlocked import is_unlocked
from perseus.timeline.simulator import IterationTimeline, max_frequency_plan, simulate_plan

IMAGE_FORMATS = ("png", "pdf", "svg")
PHASE_COLORS = {
    "startup": "#dddddd",
    "warmup": "#c6dbef",
    "profiling": "#fdd0a2",
    "planning": "#fff3b0",
    "deployed": "#c7e9c0",
    "fallback": "#fcbba1",
    "steady": "#e5e5e5",
    "baseline again": "#d9d9f3",
}
EXTRA_COLORS = ["#f2d7ee", "#d4f0f0", "#ffe4c4", "#e0e0c0"]
EVENT_STYLE = {"straggler": "tab:red", "fallback": "black", "point": "tab:purple"}


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
    ax.plot(default.time_s, default.energy_j, "D", color="tab:green", markersize=8, label=f"no-slowdown point ({energy_change(saving)})")
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


def _draw_timeline(ax: Axes, dag: InstructionDAG, timeline: IterationTimeline, freqs: np.ndarray, norm: Normalize,
                   cmap: Colormap, xmax: float) -> None:
    num_stages = dag.schedule.num_stages
    min_label_width = xmax / 70  # skip labels that would not fit in their box
    for v, inst in enumerate(dag.instructions):
        stage = int(dag.node_stage[v])
        start, width = float(timeline.start_s[v]), float(timeline.finish_s[v] - timeline.start_s[v])
        y = num_stages - 1 - stage
        # unlocked (default clocks, planned as clock 0): the top of the scale, hatched, not the bottom
        unlocked = is_unlocked(int(freqs[v]))
        color = cmap(1.0 if unlocked else norm(freqs[v]))
        ax.add_patch(Rectangle((start, y + 0.08), width, 0.84, facecolor=color, edgecolor="black", linewidth=0.4,
                               hatch="//" if unlocked else None))
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
        f"Perseus, {label}: {chosen.time_s:.4g} s ({slowdown:+.1%}), {chosen.energy_j:,.1f} J ({energy_change(saving)})"
    )
    colorbar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=[ax_base, ax_point], pad=0.01)
    colorbar.set_label("SM frequency (MHz)")
    save_figure(fig, out)


# ---------------------------------------------------------------- perseus report


def _phase_color(phase: str, extra: dict[str, str]) -> str:
    base = phase.split(" (")[0]
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    if base in PHASE_COLORS:
        return PHASE_COLORS[base]
    return extra.setdefault(phase, EXTRA_COLORS[len(extra) % len(EXTRA_COLORS)])


def plot_iterations(run: Run, out: Path) -> None:
    """Energy (top) and time (middle) per iteration of one run, phases shaded, events marked; with
    a carbon or power target, the grid's panel below (intensity, the job's power against the cap)."""
    steps = run.steps
    xs = [s.step for s in steps]
    grid = any(s.carbon_intensity is not None or s.power_cap_w is not None for s in steps)
    fig, axes = plt.subplots(3 if grid else 2, 1, figsize=(11, 8.4 if grid else 6.2), sharex=True,
                             layout="constrained", height_ratios=[1, 1, 0.8] if grid else None)
    ax_e, ax_t = axes[0], axes[1]
    if grid:
        _grid_panel(axes[2], steps)
    extra: dict[str, str] = {}
    spans: list[tuple[str, int, int]] = []
    for s in steps:
        if spans and spans[-1][0] == s.phase and s.step == spans[-1][2] + 1:
            spans[-1] = (s.phase, spans[-1][1], s.step)
        else:
            spans.append((s.phase, s.step, s.step))
    for ax in (ax_e, ax_t):
        for phase, a, b in spans:
            ax.axvspan(a - 0.5, b + 0.5, facecolor=_phase_color(phase, extra), alpha=0.9, linewidth=0, zorder=0,
                       hatch="///" if "(" in phase else None, edgecolor="#ffffff")
        ax.grid(alpha=0.3, zorder=1)
    ax_e.plot(xs, [s.energy_j for s in steps], "-o", color="tab:green", markersize=3.5, linewidth=1.2, zorder=3,
              label="energy per iteration")
    ax_t.plot(xs, [s.time_s * 1e3 for s in steps], "-o", color="tab:blue", markersize=3.5, linewidth=1.2, zorder=3,
              label="iteration time")
    planned = [(s.step, s.target_time_s * 1e3) for s in steps if s.target_time_s is not None]
    if planned:
        ax_t.plot(*zip(*planned), "--", color="tab:purple", linewidth=1.2, zorder=3, drawstyle="steps-mid",
                  label="planned time of the deployed point")
    cmp = comparison(steps, run.baseline_phase)
    if cmp is not None:
        ax_e.axhline(cmp["baseline_energy"]["median"], color="tab:red", linestyle=":", linewidth=1.2, zorder=2,
                     label=f"{run.baseline_phase} median")
        ax_e.axhline(cmp["deployed_energy"]["median"], color="tab:green", linestyle=":", linewidth=1.2, zorder=2,
                     label="deployed median")
        ax_t.axhline(cmp["baseline_time"]["median"] * 1e3, color="tab:red", linestyle=":", linewidth=1.2, zorder=2,
                     label=f"{run.baseline_phase} median")
    previous = None
    for s in steps:  # the profiled clock, where it changes
        if s.freq_mhz is not None and s.phase == "profiling" and s.freq_mhz != previous:
            previous = s.freq_mhz
            ax_t.annotate(f"{s.freq_mhz}", (s.step, s.time_s * 1e3), textcoords="offset points", xytext=(0, 5),
                          ha="center", fontsize=6.5, color="#8c4a00", zorder=4)
    seen: set[str] = set()
    for ev in run.events:
        color = EVENT_STYLE.get(ev["event"])
        if color is None or not isinstance(ev.get("step"), (int, float)):
            continue
        for ax in (ax_e, ax_t):
            ax.axvline(ev["step"] - 0.5, color=color, linestyle="-.", linewidth=1, zorder=2,
                       label=f"event: {ev['event']}" if ev["event"] not in seen and ax is ax_e else None)
        if ev["event"] in ("straggler", "fallback"):  # what changed, at the top of the time panel
            text = ev["event"]
            if isinstance(ev.get("data"), (int, float)):
                text = f"straggler x{ev['data']:.2f}" if ev["data"] > 1 else "straggler gone"
            ax_t.annotate(text, (ev["step"] - 0.5, 1), xycoords=("data", "axes fraction"), xytext=(3, -4),
                          textcoords="offset points", rotation=90, ha="left", va="top", fontsize=7.5, color=color,
                          zorder=2.5, bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
        seen.add(ev["event"])
    ax_e.set_ylabel(f"energy / iteration (J)\n{run.energy_scope.split(' (')[0]}")
    ax_t.set_ylabel("time / iteration (ms)")
    axes[-1].set_xlabel("iteration (step)")
    ax_t.set_ylim(bottom=0)
    top = max(s.energy_j for s in steps) * 1.18
    ax_e.set_ylim(0, top)
    for phase, a, b in spans:  # phase names on their shading, where they fit
        if (b - a + 1) >= 0.045 * len(steps) * max(1, len(phase) / 9):
            ax_e.text((a + b) / 2, top * 0.985, phase, ha="center", va="top", fontsize=8.5, color="#333", zorder=4)
    phases_seen = list(dict.fromkeys(p for p, _, _ in spans))
    handles = [Patch(facecolor=_phase_color(p, extra), hatch="///" if "(" in p else None, edgecolor="#ffffff",
                     label=p) for p in phases_seen]
    ax_e.legend(handles=handles + ax_e.get_legend_handles_labels()[0], loc="lower left", fontsize=8,
                ncol=min(5, len(handles) + 3), framealpha=0.9)
    ax_t.legend(loc="lower left", fontsize=8, ncol=3, framealpha=0.9)
    ax_e.set_title("energy and time of every iteration, phases shaded (profiling clocks in MHz)", fontsize=10)
    save_figure(fig, out)


def _grid_panel(ax: Axes, steps: list[Step]) -> None:
    """Carbon intensity (left axis) and the job's planned power against its cap (right axis)."""
    ci = [(s.step, s.carbon_intensity) for s in steps if s.carbon_intensity is not None]
    if ci:
        ax.plot(*zip(*ci), color="#333333", linewidth=1.2, drawstyle="steps-mid", label="carbon intensity")
    ax.set_ylabel("gCO2/kWh")
    ax.grid(alpha=0.3)
    power = ax.twinx()
    job = [(s.step, s.job_power_w / 1000) for s in steps if s.job_power_w is not None]
    cap = [(s.step, s.power_cap_w / 1000) for s in steps if s.power_cap_w is not None]
    if job:
        power.plot(*zip(*job), color="tab:blue", linewidth=1.2, drawstyle="steps-mid", label="job power (planned)")
    if cap:
        power.plot(*zip(*cap), color="tab:red", linestyle="--", linewidth=1.2, drawstyle="steps-mid", label="power cap")
    power.set_ylabel("job power (kW)")
    handles = ax.get_legend_handles_labels()[0] + power.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, loc="lower left", fontsize=8, ncol=3, framealpha=0.9)
    total = sum(s.carbon_g for s in steps if s.carbon_g is not None)
    ax.set_title(f"grid: carbon intensity and power (this GPU's carbon over the run: {total:.3g} g)", fontsize=10)


def plot_frontier_used(fr: Frontier, used: list[tuple[FrontierPoint, int, bool]], out: Path) -> None:
    """The planned frontier with the baseline, the no-slowdown point and the points a run deployed."""
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    if fr.paced_points:
        ax.plot([p.time_s * 1e3 for p in fr.paced_points], [p.energy_j for p in fr.paced_points], ".",
                color="tab:gray", markersize=3, label=f"paced points ({len(fr.paced_points)}, for stragglers)")
    ax.plot([p.time_s * 1e3 for p in fr.points], [p.energy_j for p in fr.points], "-o", color="tab:blue",
            markersize=3, linewidth=1.2, label=f"frontier ({len(fr.points)} points)")
    ax.plot(fr.baseline_time_s * 1e3, fr.baseline_energy_j, "*", color="tab:red", markersize=14,
            label="all max clock (baseline)")
    default = fr.default_point()
    ax.plot(default.time_s * 1e3, default.energy_j, "D", color="tab:green", markersize=7, fillstyle="none",
            markeredgewidth=1.5, label="no-slowdown point")
    times = [p.time_s for p in fr.points + fr.paced_points]
    t_lo, t_hi = min(times), max(times)
    for i, (point, n, paced) in enumerate(used):
        saving = 1 - point.energy_j / fr.baseline_energy_j
        right = t_hi > t_lo and (point.time_s - t_lo) / (t_hi - t_lo) > 0.6  # label to the left, inside the axes
        ax.plot(point.time_s * 1e3, point.energy_j, "o", color="tab:orange", markersize=12, markeredgecolor="black",
                zorder=5, label="deployed by this run" if i == 0 else None)
        ax.annotate(f"{n} iteration{'s' if n != 1 else ''}{' (paced)' if paced else ''}\n"
                    f"x{point.time_s / default.time_s:.3f} time, {energy_change(saving)}",
                    (point.time_s * 1e3, point.energy_j), textcoords="offset points",
                    xytext=(-12 if right else 12, 10 + 22 * i), ha="right" if right else "left",
                    fontsize=8, arrowprops={"arrowstyle": "-", "color": "gray"})
    ax.axvline(fr.baseline_time_s * 1e3, color="tab:red", linestyle=":", linewidth=1)
    ax.set_xlabel("planned iteration time (ms)")
    ax.set_ylabel("planned iteration energy (J, all stages)")
    sched = fr.schedule
    ax.set_title(f"time-energy frontier: {sched.name}, {sched.num_stages} stages x {sched.num_microbatches} "
                 f"microbatches, {fr.gpu_name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    save_figure(fig, out)
