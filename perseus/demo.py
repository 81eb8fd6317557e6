"""``perseus demo``: a real framework pipeline on CPU with simulated GPUs, end to end.

Runs the chosen framework's demo (baseline steps → online profiling → planning → deployed plan)
under torchrun, prints measured iteration time and energy per phase, and draws the frontier the
runtime planned and the deployed plan's pipeline timeline from the runtime's cache.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from perseus.errors import PerseusError
from perseus.frontier import load_frontier
from perseus.profile import load_json

FRAMEWORKS = {"megatron": "perseus_megatron.demo", "deepspeed": "perseus_deepspeed.demo"}


def _framework_demo(framework: str):
    try:
        return importlib.import_module(FRAMEWORKS[framework])
    except KeyError:
        raise PerseusError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}") from None
    except ImportError as exc:
        extra = "megatron" if framework == "megatron" else "deepspeed"
        raise PerseusError(
            f"the {framework} demo needs {exc.name}: pip install -e '.[{extra}]' (after pip install torch==2.13.0)"
        ) from None


def draw_pictures(cache_dir: Path, out_dir: Path) -> list[Path]:
    """Frontier and deployed-plan timeline pictures from the runtime's cached frontier and profile."""
    from perseus import plot

    frontiers = sorted(cache_dir.glob("*/frontier.json"))
    if not frontiers:
        return []
    frontier = load_frontier(frontiers[-1])
    profile = load_json(frontiers[-1].with_name("profile.json"))
    written = [out_dir / "frontier.png", out_dir / "timeline.png"]
    plot.plot_frontier(frontier, written[0])
    plot.plot_timeline(frontier, frontier.default_point(), "deployed (no slowdown)", profile, written[1])
    return written


def run_demo(framework: str, stages: int, microbatches: int, max_steps: int, out_dir: Path) -> str:
    """Run the demo and return the printable report."""
    module = _framework_demo(framework)
    cfg = module.DemoConfig(stages=stages, microbatches=microbatches, max_steps=max_steps)
    cfg.perseus = {**cfg.perseus, "cache_dir": str((out_dir / "cache").resolve())}
    started = time.perf_counter()
    results = module.launch(cfg, out_dir)
    lines = [
        f"{framework} pipeline on CPU: {stages} stages x {microbatches} microbatches, simulated "
        f"{cfg.sim_gpu['preset']} GPUs ({time.perf_counter() - started:.0f} s)",
        module.format_report(module.phase_table(results)),
    ]
    pictures = draw_pictures(out_dir / "cache", out_dir)
    if pictures:
        lines.append("pictures: " + ", ".join(str(p) for p in pictures))
    lines.append(f"per-rank results and the runtime cache (profile.json, frontier.json) are in {out_dir}")
    return "\n".join(lines)
