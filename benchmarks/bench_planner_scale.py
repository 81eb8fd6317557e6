"""Planner at production scale: today's planner and this one side by side, in one run, same inputs.

Each planner runs in its own subprocess (wall time, CPU time of that process over the same span,
peak RSS from ``resource.getrusage``), on the same profile file and schedule. The machine is
shared: CPU time is the better guide to a quiet machine's wall time, and the load average is
printed with every row. "Today's" planner is a git
worktree of ``--old-commit`` (default 7d36a8f, the issue's baseline; created under /tmp when
``--old`` is not given), imported through PYTHONPATH; a run past ``--old-timeout`` is stopped
and shown as "> N s". Synthetic 16-stage
H100-like profiles come from ``perseus.examples.synthetic.h100_like_profile`` (seeded).

Quality columns: energy at the all-max-frequency time of each ("E@max"), the largest amount by
which this frontier's ``lookup(t)`` exceeds today's at any of today's points (≤ 0: at or below
today's everywhere; "(+1ppm t)": the same with today's times 1 ppm longer, so that a plan a
few µs slower than today's at an anchor does not count the whole step to the next; both depend on
where each planner's deadlines fall), "mean J": the mean of this frontier's ``lookup(t)`` minus
today's over evenly spaced times of their common range (< 0: lower on average), and the gap of this planner's all-max-time point above the hull-LP lower
bound at that time (solved once through its dual circulation, ``planner.flow_lp``, in its own
subprocess, bounded by ``--lp-timeout``; it walks down from the slowest deadline in steps, as
the planner's sweep does, which is far cheaper for the warm-started simplex than one jump).

    python benchmarks/bench_planner_scale.py                      # the targets table
    python benchmarks/bench_planner_scale.py --old-commit a7d6fcf --only A100 16x128 16x4x128
    python benchmarks/bench_planner_scale.py --curve docs/img/planner_scaling.png   # new planner only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PERSEUS_ARTIFACT_DATA", ROOT.parent / "shared" / "data" / "perseus-sosp24"))
A100 = ("gpt3-175b+a100_sxm_bf16.csv", 83.64)
OLD_COMMIT = "7d36a8f"

# (name, profile source, schedule, stages, microbatches, chunks)
TARGETS = [
    ("A100 8x12", "a100", "1f1b", 8, 12, 1),
    ("A100 8x96", "a100", "1f1b", 8, 96, 1),
    ("H100-like 16x128", "h100", "1f1b", 16, 128, 1),
    ("H100-like 16x4x32 int.", "h100", "interleaved", 16, 32, 4),
    ("H100-like 16x4x128 int.", "h100", "interleaved", 16, 128, 4),
]
CURVE = [(16, m, 1) for m in (2, 4, 8, 16, 32, 64, 128)] + [(16, 64, 4), (16, 128, 4)]


def worker(args: argparse.Namespace) -> None:
    """Child process: plan (or solve the LP bound) and print one JSON line."""
    import numpy as np

    from perseus.profile import load_profile
    from perseus.schedules import build_schedule

    profile = load_profile(args.profile)
    schedule = build_schedule(args.schedule, args.stages, args.microbatches, args.chunks)
    started, cpu_started = time.perf_counter(), time.process_time()
    if args.worker == "lp":
        from perseus.schedules.dag import InstructionDAG
        from perseus.planner.choices import build_node_choices
        from perseus.planner.flow_lp import FlowRelaxation
        from perseus.timeline.simulator import max_frequency_plan, simulate_plan

        # The LP through its dual circulation: its value is a valid lower bound (docs/planner.md).
        dag = InstructionDAG.from_schedule(schedule)
        base = simulate_plan(dag, profile, max_frequency_plan(dag, profile))
        node_choices = build_node_choices(dag, profile, profile.p_blocking_w)
        relaxation = FlowRelaxation(dag, node_choices)
        slowest = dag.levels.finish_times(node_choices.node_times(node_choices.slowest_choice())[None]).max()
        for deadline in np.linspace(slowest, base.time_s, 13)[1:]:
            lp_cost = relaxation.solve(float(deadline))[1]
        out = {"bound_j": lp_cost + profile.p_blocking_w * schedule.num_stages * base.time_s}
    else:
        from perseus.planner import plan_frontier

        frontier = plan_frontier(schedule, profile)
        out = {
            "points": [[p.time_s, p.energy_j] for p in frontier.points],
            "paced": len(frontier.paced_points),
            "default_j": frontier.default_point().energy_j,
            "base_j": frontier.baseline_energy_j,
            "base_s": frontier.baseline_time_s,
            "fastest_s": frontier.fastest.time_s,
            "planner": frontier.metadata.get("planner", "?"),
        }
    out["wall_s"] = time.perf_counter() - started
    out["cpu_s"] = time.process_time() - cpu_started  # on a loaded machine, closer to the quiet wall time
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def run_child(tree: Path, mode: str, profile: Path, case: tuple, timeout: float) -> dict | None:
    _, _, schedule, stages, microbatches, chunks = case
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--profile", str(profile),
               "--schedule", schedule, "--stages", str(stages), "--microbatches", str(microbatches), "--chunks", str(chunks)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:
        sys.exit(f"{mode} run failed on {case[0]} ({tree}):\n{exc.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_file(case: tuple, folder: Path) -> Path:
    """The instance's profile as a file both trees can load (JSON written by this tree)."""
    name, source, _, stages, _, chunks = case
    if source == "a100":
        from perseus.profile import load_profile

        profile = load_profile(DATA / A100[0], A100[1])
        path = folder / f"a100-{stages}.json"
        first = profile.num_stages - stages
        from perseus.profile import Profile

        entries = {(s - first, c, k): v for (s, c, k), v in profile.entries.items() if s >= first}
        profile = Profile(entries, A100[1], "A100-SXM") if first else profile
    else:
        from perseus.examples.synthetic import h100_like_profile

        profile = h100_like_profile(stages, chunks, seed=0)
        path = folder / f"h100-{stages}x{chunks}.json"
    profile.save_json(path)
    return path


def old_tree(given: str | None, commit: str) -> Path:
    if given:
        return Path(given)
    path = Path(tempfile.gettempdir()) / f"perseus-{commit}"
    if not (path / "perseus").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True,
                       capture_output=True)
    return path


def worst_excess(new: list, old: list, slack: float = 0.0) -> float:
    """max over today's points of (this planner's least energy within that time × (1 + slack)
    − today's energy). With a slack of 1e-6 a plan a few µs slower at an anchor (the anchors'
    plans end just at their deadlines) does not count as a loss of the whole step to the next."""
    import numpy as np

    times = np.array([t for t, _ in new])
    least = np.minimum.accumulate(np.array([e for _, e in new]))
    worst = -np.inf
    for t, e in old:
        at = np.searchsorted(times, t * (1 + slack + 1e-12), side="right") - 1
        worst = max(worst, (least[at] if at >= 0 else np.inf) - e)
    return float(worst)


def mean_difference(new: list, old: list, samples: int = 20001) -> float:
    """Mean over evenly spaced times (the range both frontiers cover) of this planner's
    ``lookup(t)`` minus today's: the frontier-wide difference, whatever the deadline grids."""
    import numpy as np

    def lookup(points: list, times: np.ndarray) -> np.ndarray:
        at = np.searchsorted(np.array([t for t, _ in points]), times * (1 + 1e-12), side="right") - 1
        return np.minimum.accumulate(np.array([e for _, e in points]))[at]

    grid = np.linspace(max(new[0][0], old[0][0]), min(new[-1][0], old[-1][0]), samples)
    return float(np.mean(lookup(new, grid) - lookup(old, grid)))


def targets(args: argparse.Namespace) -> None:
    old = old_tree(args.old, args.old_commit)
    header = (f"{'instance':<24} {'instr':>6} {'today s':>8} {'cpu':>6} {'today MB':>8} {'new s':>6} {'cpu':>6} {'new MB':>6} {'speedup':>7} "
              f"{'E@max today':>11} {'E@max new':>10} {'new-today max J':>15} {'(+1ppm t)':>9} {'mean J':>7} {'LP gap':>7} {'#pts t/n':>9} {'load':>9}")
    print(f"today = {old} (commit {args.old or args.old_commit}); new = {ROOT}; load average {os.getloadavg()[0]:.1f}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for case in TARGETS:
            if args.only and not any(o in case[0] for o in args.only):
                continue
            path = profile_file(case, Path(folder))
            n = case[3] * case[4] * case[5] * 2
            load_before = os.getloadavg()[0]
            new = run_child(ROOT, "plan", path, case, args.new_timeout)
            then = run_child(old, "plan", path, case, args.old_timeout)
            lp = run_child(ROOT, "lp", path, case, args.lp_timeout)
            assert new is not None, f"new planner past {args.new_timeout} s on {case[0]}"
            assert new["fastest_s"] <= new["base_s"], "new planner's fastest plan is slower than all-max"
            t_s = f"{then['wall_s']:.1f}" if then else f">{args.old_timeout:.0f}"
            t_cpu = f"{then['cpu_s']:.1f}" if then and "cpu_s" in then else "-"
            t_mb = f"{then['rss_mb']:.0f}" if then else "-"
            speed = f"{then['wall_s'] / new['wall_s']:.1f}x" if then else f">{args.old_timeout / new['wall_s']:.0f}x"
            t_e = f"{then['default_j']:.2f}" if then else "-"
            excess = f"{worst_excess(new['points'], then['points']):+.2f}" if then else "-"
            excess_ppm = f"{worst_excess(new['points'], then['points'], 1e-6):+.2f}" if then else "-"
            mean = f"{mean_difference(new['points'], then['points']):+.2f}" if then else "-"
            gap = f"{100 * (new['default_j'] / lp['bound_j'] - 1):.2f}%" if lp else f"(>{args.lp_timeout:.0f}s)"
            pts = f"{len(then['points']) if then else '-'}/{len(new['points'])}"
            print(f"{case[0]:<24} {n:>6} {t_s:>8} {t_cpu:>6} {t_mb:>8} {new['wall_s']:>6.1f} {new['cpu_s']:>6.1f} {new['rss_mb']:>6.0f} {speed:>7} "
                  f"{t_e:>11} {new['default_j']:>10.2f} {excess:>15} {excess_ppm:>9} {mean:>7} {gap:>7} {pts:>9} {load_before:>4.1f}-{os.getloadavg()[0]:<4.1f}",
                  flush=True)


def curve(args: argparse.Namespace) -> None:
    rows = []
    print(f"{'instance':<16} {'instr':>6} {'planner':<16} {'wall s':>7} {'peak MB':>8} {'#pts':>5}")
    with tempfile.TemporaryDirectory() as folder:
        for stages, mb, chunks in CURVE:
            case = (f"{stages}x{chunks}x{mb}", "h100", "1f1b" if chunks == 1 else "interleaved", stages, mb, chunks)
            r = run_child(ROOT, "plan", profile_file(case, Path(folder)), case, args.new_timeout)
            n = stages * mb * chunks * 2
            rows.append((n, r["wall_s"], r["rss_mb"]))
            print(f"{case[0]:<16} {n:>6} {r['planner']:<16} {r['wall_s']:>7.2f} {r['rss_mb']:>8.0f} {len(r['points']):>5}", flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ns = [r[0] for r in rows]
    ax.loglog(ns, [r[1] for r in rows], "o-", label="wall time (s)")
    ax.loglog(ns, [r[2] / 1024 for r in rows], "s--", label="peak RSS (GB)")
    ax.axvline(2048.5, color="grey", lw=0.8, ls=":")
    ax.text(2200, ax.get_ylim()[0] * 1.5, "network simplex LP →", fontsize=8, color="grey")
    ax.set_xlabel("instructions per iteration (16 stages, H100-like)")
    ax.set_title("perseus plan: full frontier, 2 cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.curve, dpi=90)
    print(f"wrote {args.curve}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", help="checkout of today's planner (default: a git worktree of --old-commit in /tmp)")
    parser.add_argument("--old-commit", default=OLD_COMMIT, help=f"commit of today's planner (default {OLD_COMMIT})")
    parser.add_argument("--old-timeout", type=float, default=600.0)
    parser.add_argument("--new-timeout", type=float, default=600.0)
    parser.add_argument("--lp-timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", help="instances whose name contains one of these")
    parser.add_argument("--curve", help="new planner only: write the scaling curve PNG here")
    parser.add_argument("--worker", choices=["plan", "lp"], help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    parser.add_argument("--schedule", help=argparse.SUPPRESS)
    parser.add_argument("--stages", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--microbatches", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    elif args.curve:
        curve(args)
    else:
        if not (DATA / A100[0]).exists():
            sys.exit(f"A100 profile not found under {DATA}")
        targets(args)


if __name__ == "__main__":
    main()
