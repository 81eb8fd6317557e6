"""Plain-text summaries and tables that the CLI prints (pure functions: data in, text out)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from perseus.timeline.control_plane_cost import ControlPlaneCost
from perseus.timeline.control_plane_cost import describe as describe_control_plane

if TYPE_CHECKING:  # types only: `perseus show` should not load the emulator
    from perseus.timeline.emulator import EmulationResult, SweepRow
    from perseus.frontier import Frontier


def format_energy(joules: float) -> str:
    """Energy with an SI prefix: ``812.4 J``, ``1.234 MJ``."""
    for scale, unit in ((1e9, "GJ"), (1e6, "MJ"), (1e3, "kJ")):
        if abs(joules) >= scale:
            return f"{joules / scale:.4g} {unit}"
    return f"{joules:.4g} J"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left_first: bool = False) -> str:
    """Right-aligned columns separated by two spaces (optionally the first left-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0]) if left_first else cells[0].rjust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]).rstrip()

    return "\n".join([line(headers)] + [line(row) for row in rows])


def describe_job(frontier: Frontier) -> str:
    s = frontier.schedule
    chunks = f" x {s.num_chunks} chunks" if s.num_chunks > 1 else ""
    return (
        f"{s.name}, {s.num_stages} stages x {s.num_microbatches} microbatches{chunks} "
        f"({s.num_instructions} instructions), GPU {frontier.gpu_name}, P_blocking {frontier.p_blocking_w:g} W"
    )


def _point_row(label: str, frontier: Frontier, time_s: float, energy_j: float, index: int) -> list[str]:
    return [
        f"{label} [{index}]",
        f"{time_s:.4f}",
        f"{time_s / frontier.baseline_time_s - 1:+.2%}",
        f"{energy_j:.2f}",
        f"{1 - energy_j / frontier.baseline_energy_j:.2%}",
    ]


def plan_summary(frontier: Frontier, profile_source: str, out: str, written_points: int) -> str:
    """One screen after ``perseus plan``: baseline, savings at the key points, size, solve time."""
    default = frontier.default_point()
    rows = [
        ["all max frequency (baseline)", f"{frontier.baseline_time_s:.4f}", "-", f"{frontier.baseline_energy_j:.2f}", "-"],
        _point_row("no slowdown (default)", frontier, default.time_s, default.energy_j, frontier.points.index(default)),
        _point_row("fastest", frontier, frontier.fastest.time_s, frontier.fastest.energy_j, 0),
        _point_row("slowest", frontier, frontier.slowest.time_s, frontier.slowest.energy_j, len(frontier.points) - 1),
    ]
    lines = [
        f"perseus plan: {describe_job(frontier)}",
        f"profile: {profile_source}",
        render_table(["point [index]", "time (s)", "slowdown", "energy (J)", "saving"], rows, left_first=True),
        f"frontier: {len(frontier.points)} points, solved in {frontier.solve_time_s:.2f} s; "
        f"wrote {out} ({written_points} points)",
    ]
    return "\n".join(lines)


def show_indices(frontier: Frontier, max_rows: int | None) -> list[int]:
    """Point indices to show: all, or about ``max_rows`` (ends and the default point always kept).

    Half are spread evenly in time (the whole curve), half evenly by index (where points are
    dense, usually near the baseline, where the interesting trade-offs are).
    """
    n = len(frontier.points)
    if max_rows is None or n <= max_rows:
        return list(range(n))
    times = np.array([p.time_s for p in frontier.points])
    must = {0, n - 1, frontier.points.index(frontier.default_point())}
    picked: set[int] = set(must)
    for k in range(max(2, max_rows // 2), n + 1):
        by_time = {int(np.searchsorted(times, t, side="right") - 1) for t in np.linspace(times[0], times[-1], k)}
        by_index = {int(round(i)) for i in np.linspace(0, n - 1, k)}
        candidate = must | by_time | by_index
        if len(candidate) > max_rows:
            break
        picked = candidate
    return sorted(picked)


def frontier_table(frontier: Frontier, max_rows: int | None = 20) -> str:
    """Readable frontier: index, time, slowdown and saving against the all-max baseline."""
    default = frontier.points.index(frontier.default_point())
    indices = show_indices(frontier, max_rows)
    rows = []
    for i in indices:
        p = frontier.points[i]
        rows.append(
            [
                f"{i}{'*' if i == default else ' '}",
                f"{p.time_s:.4f}",
                f"{p.time_s / frontier.baseline_time_s - 1:+.2%}",
                f"{p.energy_j:.2f}",
                f"{1 - p.energy_j / frontier.baseline_energy_j:.2%}",
            ]
        )
    head = [
        f"frontier: {describe_job(frontier)}",
        f"baseline (all max frequency): {frontier.baseline_time_s:.4f} s, {frontier.baseline_energy_j:.2f} J; "
        f"{len(frontier.points)} points, solved in {frontier.solve_time_s:.2f} s",
    ]
    table = render_table(["point", "time (s)", "slowdown", "energy (J)", "saving"], rows)
    foot = ["* = no-slowdown point (the default plan)"]
    if len(indices) < len(frontier.points):
        foot.append(f"showing {len(indices)} of {len(frontier.points)} points; --all shows every point")
    return "\n".join(head + [table] + foot)


def emulation_table(result: EmulationResult, frontier: Frontier) -> str:
    """Energy of the three policies for one straggler factor."""
    job = result.job
    s = frontier.schedule
    rows = [
        ["(1) all max frequency", format_energy(result.all_max_j), "-"],
        ["(2) Perseus, intrinsic only", format_energy(result.intrinsic_j), f"{result.intrinsic_saving:.2%}"],
        ["(3) Perseus, straggler-matched", format_energy(result.straggler_matched_j), f"{result.straggler_matched_saving:.2%}"],
    ]
    lines = [
        f"perseus emulate: {job.num_gpus} GPUs = {job.num_pipelines} pipelines x {job.num_stages} stages x TP {job.tensor_parallel}; "
        f"{s.name}, {s.num_microbatches} microbatches, P_blocking {frontier.p_blocking_w:g} W",
        f"  one straggler pipeline at {result.straggler_factor:g}x: iteration time {result.iteration_time_s:.4f} s "
        f"(all-max pipeline {result.baseline_time_s:.4f} s)",
        render_table(["policy", "energy / iteration", "saving"], rows, left_first=True),
        f"  non-straggler plans: intrinsic point {result.intrinsic_point.time_s:.4f} s, "
        f"straggler-matched point {result.matched_point.time_s:.4f} s (frontier of {len(frontier.points)} points)",
        describe_control_plane(ControlPlaneCost(job.num_pipelines, job.num_stages, job.tensor_parallel)),
    ]
    return "\n".join(lines)


def sweep_report(rows: Sequence[SweepRow]) -> str:
    """Two tables over microbatches x straggler factor: intrinsic-only and straggler-matched savings."""
    if not rows:
        return "no sweep rows"
    factors = [r.straggler_factor for r in rows[0].results]
    job = rows[0].results[0].job
    headers = ["microbatches", "points", "solve (s)"] + [f"{f:.1f}x" if round(f, 1) == f else f"{f:g}x" for f in factors]
    blocks = [
        f"perseus emulate --sweep: {job.num_gpus} GPUs = {job.num_pipelines} pipelines x {job.num_stages} stages "
        f"x TP {job.tensor_parallel}; energy saving vs all max frequency, by straggler factor"
    ]
    for title, attr in (
        ("(2) Perseus, intrinsic only", "intrinsic_saving"),
        ("(3) Perseus, straggler-matched (intrinsic + extrinsic)", "straggler_matched_saving"),
    ):
        table_rows = [
            [str(r.microbatches), str(len(r.frontier.points)), f"{r.frontier.solve_time_s:.1f}"]
            + [f"{getattr(res, attr):.2%}" for res in r.results]
            for r in rows
        ]
        blocks.append(title)
        blocks.append(render_table(headers, table_rows))
    blocks.append(describe_control_plane(ControlPlaneCost(job.num_pipelines, job.num_stages, job.tensor_parallel)))
    return "\n".join(blocks)
