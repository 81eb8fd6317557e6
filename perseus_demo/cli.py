"""``perseus demo``: added to the ``perseus`` command through the ``perseus.commands`` entry point."""

from __future__ import annotations

import argparse
import importlib
import time
from types import ModuleType
from pathlib import Path

from perseus.errors import PerseusError
from perseus.frontier import load_frontier
from perseus.gpu.sim.stream import DEFAULT_DEPTH
from perseus.profile import load_json
from perseus_demo.common import format_report, phase_table, true_energy_line
from perseus_demo.replay import TIME_SCALE as REPLAY_TIME_SCALE
from perseus_demo.replay import predicted_line, replay_lines, replay_settings, replay_source

FRAMEWORKS = {"megatron": "perseus_demo.megatron_demo", "deepspeed": "perseus_demo.deepspeed_demo",
              "torch": "perseus_demo.torch_demo"}
# torch.distributed.pipelining schedules the torch demo runs, and their torch stages per rank
TORCH_SCHEDULES = {"1f1b": 1, "gpipe": 1, "torch-interleaved": 2, "zb-interleaved": 2, "zbv": 2, "dualpipev": 2}


def _framework_demo(framework: str) -> ModuleType:
    try:
        return importlib.import_module(FRAMEWORKS[framework])
    except KeyError:
        raise PerseusError(f"unknown framework {framework!r}; choose one of {', '.join(FRAMEWORKS)}") from None
    except ImportError as exc:
        extra = framework
        raise PerseusError(
            f"the {framework} demo needs {exc.name}: pip install -e '.[{extra}]' (after pip install torch==2.13.0)"
        ) from None


def draw_pictures(cache_dir: Path, out_dir: Path) -> list[Path]:
    """Frontier and deployed-plan timeline pictures from the runtime's cached frontier and profile."""
    from perseus.output import plot

    frontiers = sorted(cache_dir.glob("*/frontier.json"))
    if not frontiers:
        return []
    frontier = load_frontier(frontiers[-1])
    profile = load_json(frontiers[-1].with_name("profile.json"))
    written = [out_dir / "frontier.png", out_dir / "timeline.png"]
    plot.plot_frontier(frontier, written[0])
    plot.plot_timeline(frontier, frontier.default_point(), "deployed (no slowdown)", profile, written[1])
    return written


# --carbon-trace: a trace hour every CARBON_SECONDS_PER_HOUR seconds of the run, a decision every step
CARBON_SECONDS_PER_HOUR = 1.5
CARBON_DEPLOYED_STEPS = 36


def carbon_settings(trace: Path) -> dict:
    """The runtime's settings that replay ``trace`` with a compressed clock (checked now: one line)."""
    from perseus.carbon.signals import load_trace

    load_trace(trace)
    return {"carbon_source": str(trace.resolve()), "carbon_replay_speed": 3600.0 / CARBON_SECONDS_PER_HOUR,
            "carbon_time_budget": 0.05, "carbon_horizon_windows": 12, "grid_every_steps": 1}


def carbon_lines(metrics: Path) -> list[str]:
    """What the grid did, from rank 0's metrics file: each change of intensity or point."""
    import json

    if not metrics.exists():
        return ["carbon: no metrics file (the plan was not deployed)"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("carbon_intensity") is not None]
    if not rows:
        return ["carbon: no step ran with an intensity (the plan was not deployed long enough)"]
    lines = ["carbon (trace replayed, an hour every "
             f"{CARBON_SECONDS_PER_HOUR:g} s): step, intensity gCO2/kWh, planned slowdown of the point run"]
    last = None
    for r in rows:
        key = (round(r["carbon_intensity"], 1), round(r.get("slowdown", 1.0), 4))
        if key != last:
            lines.append(f"  step {r['step']:>4}  {r['carbon_intensity']:7.1f}  x{r.get('slowdown', 1.0):.4f}")
            last = key
    total = sum(r.get("carbon_g", 0.0) for r in rows)
    points = len({round(r.get("slowdown", 1.0), 6) for r in rows})
    lines.append(f"  {len(rows)} steps with an intensity, {points} frontier points run, rank 0's GPU: {total:.3g} g CO2")
    return lines


# --moe: the megatron demo's mixture of experts (4 experts, top-2, alltoall dispatch) over 2 expert-parallel
# ranks, so 2 data-parallel pipelines. Its CPU work per instruction (routing, two all-to-alls over gloo)
# is several times a dense layer's, so the simulated kernels are longer, to stay above it.
# --async-gpu: kernels the host may run ahead of each simulated GPU (its asynchronous mode,
# perseus/gpu/sim/stream.py; docs/gpu.md, "The demos on the asynchronous mode"). Not the default:
# the synchronous mode's kernel runs inside its hook, which a demo run on a loaded machine keeps
# easier to read.
ASYNC_STREAM_DEPTH = DEFAULT_DEPTH
# --hostile-gpu: asynchronous simulated GPUs of the "H200-hostile" preset (perseus/gpu/sim/dvfs.py),
# what real cards do on top of the measured H200: a part-time, late, noisy energy meter on the real
# 100 ms period, target-dependent switch latency, an optimizer tail after each step, spinning waits.
HOSTILE_SIM_GPU = {"preset": "H200-hostile"}

MOE = {"num_experts": 4, "expert_parallel": 2, "dp_size": 2, "forward_ms": 30.0, "backward_ms": 60.0}


def run_demo(framework: str, stages: int, microbatches: int, max_steps: int | None, out_dir: Path,
             schedule: str | None = None, carbon_trace: Path | None = None, moe: bool = False,
             stream_depth: int = 0, hostile: bool = False, replay: Path | None = None) -> str:
    """Run the demo and return the printable report (``schedule``: the torch demo's schedule;
    ``carbon_trace``: replay it with a compressed clock, one frontier point per trace hour;
    ``moe``: the megatron demo with expert-parallel MoE layers; ``stream_depth``: how many kernels
    the host may run ahead of each simulated GPU, 0 for a synchronous one; ``hostile``: GPUs that
    behave as real cards do, ``HOSTILE_SIM_GPU``, asynchronous; ``replay``: GPUs replaying that
    workload directory's measured runs, ``perseus_demo.replay``)."""
    module = _framework_demo(framework)
    source = None
    if replay is not None:
        for flag, given in (("--hostile-gpu", hostile), ("--moe", moe), ("--schedule", schedule is not None)):
            if given:
                raise PerseusError(f"--gpu-replay replays a 1F1B pipeline's forwards and backwards on its own GPUs; "
                                   f"leave out {flag}")
        source = replay_source(replay, stages)
    grid = carbon_settings(carbon_trace) if carbon_trace is not None else None
    if schedule is not None and framework != "torch":
        raise PerseusError(f"--schedule picks a torch.distributed.pipelining schedule; the {framework} demo runs 1F1B")
    if moe and framework != "megatron":
        raise PerseusError(f"--moe runs megatron-core's mixture of experts; the {framework} demo has none")
    extra: dict = {"schedule": schedule, "chunks": TORCH_SCHEDULES[schedule]} if schedule is not None else {}
    if moe:
        extra.update(MOE)
    if max_steps is not None:
        extra["max_steps"] = max_steps
    if grid is not None:
        extra["deployed_steps"] = CARBON_DEPLOYED_STEPS
    cfg = module.DemoConfig(stages=stages, microbatches=microbatches, **extra)
    if hostile:
        stream_depth = stream_depth or ASYNC_STREAM_DEPTH
        cfg.sim_gpu = dict(HOSTILE_SIM_GPU)  # the real counter period too, not the demo's fast one
    if source is not None:
        sim_gpu, settings, runtime = replay_settings(source)
        cfg.sim_gpu, cfg.perseus = sim_gpu, {**cfg.perseus, **runtime}
        for name, value in settings.items():
            setattr(cfg, name, value)
    cfg.sim_gpu = {**cfg.sim_gpu, "stream_depth": stream_depth}
    cfg.perseus = {**cfg.perseus, "cache_dir": str((out_dir / "cache").resolve())}
    if grid is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        metrics = (out_dir / "carbon-metrics.jsonl").resolve()
        metrics.unlink(missing_ok=True)
        cfg.perseus = {**cfg.perseus, **grid, "metrics_file": str(metrics)}
    started = time.perf_counter()
    results = module.launch(cfg, out_dir)
    name = f"{framework} ({schedule})" if schedule else f"{framework} (MoE, EP {MOE['expert_parallel']})" if moe else framework
    preset = f"A100 replaying {source.model}" if source is not None else cfg.sim_gpu["preset"]
    gpus = (f"asynchronous simulated {preset} GPUs (host up to {stream_depth} kernels ahead; "
            "times in GPU time)" if stream_depth else f"simulated {preset} GPUs")
    lines = [
        f"{name} pipeline on CPU: {stages} stages x {microbatches} microbatches, {gpus} "
        f"({time.perf_counter() - started:.0f} s)",
        *(replay_lines(source, microbatches) if source is not None else []),
        format_report(phase_table(results)),
    ]
    if source is not None:
        lines.append(predicted_line(out_dir / "cache"))
    if hostile and (exact := true_energy_line(results)) is not None:
        lines.append(exact)
    pictures = draw_pictures(out_dir / "cache", out_dir)
    if pictures:
        lines.append("pictures: " + ", ".join(str(p) for p in pictures))
    if grid is not None:
        lines.extend(carbon_lines(out_dir / "carbon-metrics.jsonl"))
    lines.append(f"per-rank results and the runtime cache (profile.json, frontier.json) are in {out_dir}")
    return "\n".join(lines)


MEGATRON_LM_ITERATIONS = 24  # real pretrain_gpt.py iterations: warm-up, a few clocks, planning, deployed


def run_megatron_lm_demo(checkout: Path, stages: int, microbatches: int, max_steps: int | None, out_dir: Path,
                         chunks: int = 1) -> str:
    """A real Megatron-LM checkout's ``pretrain_gpt.py`` on CPU with Perseus; the printable report."""
    from perseus_demo import megatron_lm_cpu

    started = time.perf_counter()
    summaries = megatron_lm_cpu.launch(checkout, out_dir, stages=stages, chunks=chunks, microbatches=microbatches,
                                       train_iters=min(max_steps or MEGATRON_LM_ITERATIONS, MEGATRON_LM_ITERATIONS),
                                       extra_args=["--perseus-warmup-steps", "4"])
    schedule = f"interleaved ({chunks} chunks)" if chunks > 1 else "1F1B"
    lines = [
        f"Megatron-LM pretrain_gpt.py ({checkout}) on CPU, {schedule}: {stages} stages x {microbatches} "
        f"microbatches, simulated GPUs ({time.perf_counter() - started:.0f} s)",
        megatron_lm_cpu.format_summaries(summaries),
    ]
    pictures = draw_pictures(out_dir / "cache", out_dir)
    if pictures:
        lines.append("pictures: " + ", ".join(str(p) for p in pictures))
    lines.append("(means over few iterations on a shared CPU, first iterations included; for a measured saving "
                 "against default clocks re-measured after the plan, run perseus demo without --megatron-lm)")
    lines.append(f"Megatron's log, per-rank summaries and the runtime cache are in {out_dir}")
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.megatron_lm:
        if args.framework != "megatron":
            raise PerseusError("--megatron-lm runs Megatron-LM; leave --framework at megatron")
        if args.carbon_trace:
            raise PerseusError("--carbon-trace runs with the tiny demo loop; leave out --megatron-lm")
        if args.hostile_gpu:
            raise PerseusError("--hostile-gpu runs with the tiny demo loop; leave out --megatron-lm")
        if args.gpu_replay:
            raise PerseusError("--gpu-replay runs with the tiny demo loop; leave out --megatron-lm")
        print(run_megatron_lm_demo(Path(args.megatron_lm).expanduser().resolve(), args.stages, args.microbatches,
                                   args.max_steps, Path(args.out), args.chunks))
        return 0
    print(run_demo(args.framework, args.stages, args.microbatches, args.max_steps, Path(args.out), args.schedule,
                   Path(args.carbon_trace) if args.carbon_trace else None, args.moe,
                   ASYNC_STREAM_DEPTH if args.async_gpu or args.hostile_gpu else 0, args.hostile_gpu,
                   Path(args.gpu_replay) if args.gpu_replay else None))
    return 0


def add_demo_command(sub: argparse._SubParsersAction) -> None:
    """Register ``demo`` on the ``perseus`` command's subparsers."""
    p = sub.add_parser(
        "demo",
        help="end-to-end demo: a real Megatron (DeepSpeed, torch pipelining) pipeline on CPU with simulated GPUs",
        description="Train a tiny model with a real framework pipeline on CPU (torchrun, gloo), one "
        "simulated GPU per stage: baseline steps, online profiling, planning, deployed plan. Prints "
        "iteration time and energy per phase and draws frontier.png and timeline.png.",
    )
    p.add_argument("--framework", choices=list(FRAMEWORKS), default="megatron")
    p.add_argument("--schedule", choices=list(TORCH_SCHEDULES), default=None,
                   help="--framework torch: the torch.distributed.pipelining schedule (default: 1f1b)")
    p.add_argument("--moe", action="store_true",
                   help="--framework megatron: mixture-of-experts layers (4 experts, top-2, alltoall) over 2 "
                        "expert-parallel ranks, as 2 data-parallel pipelines (2 x stages processes)")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages = processes (default: 4)")
    p.add_argument("--microbatches", type=int, default=8, help="microbatches per iteration (default: 8)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="give up if the plan is not deployed by then; steps spent waiting for the planner do not "
                        "count (default: 60; torch: 200)")
    p.add_argument("--async-gpu", action="store_true",
                   help=f"asynchronous simulated GPUs: the host runs up to {ASYNC_STREAM_DEPTH} kernels ahead of each "
                        "GPU's stream, as on a real GPU, and iterations are timed in GPU time (default: synchronous, "
                        "each instruction's kernel runs inside its hook)")
    p.add_argument("--hostile-gpu", action="store_true",
                   help="simulated GPUs that behave as real ones do (implies --async-gpu): an H200 whose energy "
                        "meter samples a quarter of each 100 ms period and reports late, clock switches of "
                        "5-15 ms by target clock, an optimizer tail after each step and spinning pipeline waits")
    p.add_argument("--gpu-replay", metavar="DIR",
                   help="simulated GPUs that replay one workload directory of measured A100 runs (the Perseus "
                        "artifact's layout, e.g. .../perseus/A100/dp1+pp4+tp1/merak+gpt3-xl+...): GPU i replays "
                        f"stage i, instruction times x{REPLAY_TIME_SCALE:g}, power and P_blocking as fitted "
                        "(--stages must be the runs' stage count)")
    p.add_argument("--out", default="perseus-demo", help="output directory (default: perseus-demo)")
    p.add_argument("--megatron-lm", metavar="PATH",
                   help="run this Megatron-LM checkout's own pretrain_gpt.py (unmodified; tiny GPT, mock data) "
                   f"instead of the tiny megatron-core loop; at most {MEGATRON_LM_ITERATIONS} iterations")
    p.add_argument("--chunks", type=int, default=1,
                   help="with --megatron-lm: virtual chunks per stage (> 1: interleaved 1F1B, needs stages > 2)")
    p.add_argument("--carbon-trace", metavar="CSV",
                   help="replay this hourly carbon-intensity trace with a compressed clock (an hour every "
                        f"{CARBON_SECONDS_PER_HOUR:g} s) and show the frontier points changing with it (docs/carbon.md)")
    p.set_defaults(handler=cmd_demo)
