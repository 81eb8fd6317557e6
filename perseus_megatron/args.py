"""``--perseus`` command-line flags for Megatron-LM, and their translation to ``PerseusConfig``.

``add_perseus_args`` has the signature of Megatron-LM's ``extra_args_provider`` (takes the parser,
returns it). Every flag defaults to ``None`` so that ``PerseusConfig`` alone holds the defaults;
``config_from_args`` passes only the flags given, and validation errors name the flag.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perseus.errors import ConfigError
from perseus.runtime import DESIGNS, GPU_BACKENDS, MODES, Mode, PerseusConfig


@dataclass(frozen=True)
class Flag:
    """One ``--perseus-*`` flag and the ``PerseusConfig`` field it sets."""

    option: str
    field: str
    type: Callable[[str], Any]
    help: str
    metavar: str | None = None
    choices: Sequence[str] | None = None

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
    return value


def _on_off(text: str) -> bool:
    """argparse type: on/off (also true/false, 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


FLAGS: tuple[Flag, ...] = (
    Flag("--perseus-mode", "mode", str, "; ".join(f"{m}: {m.description}" for m in Mode), choices=MODES),
    Flag("--perseus-gpu", "gpu", str, "GPU backend: auto (NVML, or $PERSEUS_GPU), nvml, sim", choices=GPU_BACKENDS),
    Flag("--perseus-device-index", "device_index", int, "NVML index of this rank's GPU (default: the current CUDA device)",
         metavar="N"),
    Flag("--perseus-sim-gpu", "sim_gpu", _json_object, "simulated GPU options as JSON, e.g. '{\"preset\": \"A40\"}'",
         metavar="JSON"),
    Flag("--perseus-zeusd-socket", "zeusd_socket", str, "change clocks and read energy through Zeus's zeusd on this "
         "Unix socket (default: $PERSEUS_ZEUSD_SOCKET)", metavar="PATH"),
    Flag("--perseus-freq-max", "freq_max_mhz", int, "highest SM clock to profile (MHz)", metavar="MHZ"),
    Flag("--perseus-freq-min", "freq_min_mhz", int, "lowest SM clock to profile (MHz)", metavar="MHZ"),
    Flag("--perseus-freq-step", "freq_step_mhz", int, "profile clocks this many MHz apart", metavar="MHZ"),
    Flag("--perseus-freq-every-k", "freq_every_k", int, "profile every k-th supported clock", metavar="K"),
    Flag("--perseus-warmup-steps", "warmup_steps", int, "iterations at default clocks before profiling (baseline)",
         metavar="N"),
    Flag("--perseus-iters-per-freq", "iters_per_freq", int, "profiled iterations per clock", metavar="N"),
    Flag("--perseus-early-stop-patience", "early_stop_patience", int,
         "stop lowering clocks after this many coarse clocks in a row where no kind's energy fell (0: never)", metavar="N"),
    Flag("--perseus-coarse-step", "coarse_step_mhz", int, "the sweep's coarse pass: clocks this many MHz apart",
         metavar="MHZ"),
    Flag("--perseus-refine-max-clocks", "refine_max_clocks", int,
         "clocks measured between coarse ones where interpolation is not accurate", metavar="N"),
    Flag("--perseus-remeasure-max", "remeasure_max", int, "re-measurements of clocks whose noise exceeds their effect",
         metavar="N"),
    Flag("--perseus-noise-k", "noise_k", float, "planning times: fitted time + this many standard errors", metavar="K"),
    Flag("--perseus-p-blocking", "p_blocking_w", float, "GPU power while blocked on communication (W); measured if unset",
         metavar="WATTS"),
    Flag("--perseus-profile", "profile_path", str, "use this profile (Zeus CSV or perseus JSON) instead of profiling",
         metavar="PATH"),
    Flag("--perseus-frontier", "frontier_path", str, "deploy this planned frontier instead of profiling and planning",
         metavar="PATH"),
    Flag("--perseus-planner-options", "planner_options", _json_object,
         "planner settings (PlannerOptions) as JSON, e.g. '{\"num_anchors\": 16}'; checked at startup", metavar="JSON"),
    Flag("--perseus-planner-nice", "planner_nice", int,
         "priority (nice 0-19) of rank 0's planner process (its own session; nice counts where it shares a CPU "
         "cgroup with the trainer); 0 for CPU-bound trainers on a busy machine", metavar="N"),
    Flag("--perseus-plan-wait", "plan_wait_s", float,
         "rank 0 waits up to this long at a step end for its planner (0: never); for short fixed-length runs",
         metavar="SECONDS"),
    Flag("--perseus-close-plan-wait", "close_plan_wait_s", float,
         "when training ends while planning, rank 0 waits up to this long for the planner to cache the frontier "
         "(0: stop it at once)", metavar="SECONDS"),
    Flag("--perseus-switch-ahead", "switch_ahead", _on_off,
         "request each instruction's clock when the previous one ends, hiding the switch latency (default: on)",
         metavar="on|off"),
    Flag("--perseus-straggler-period", "straggler_period_steps", int,
         "check for stragglers every N iterations (0: never)", metavar="N"),
    Flag("--perseus-straggler-threshold", "straggler_threshold", float,
         "slow down to match a pipeline this fraction slower than the rest (e.g. 0.05)", metavar="FRACTION"),
    Flag("--perseus-straggler-recover-threshold", "straggler_recover_threshold", float,
         "return to full speed when the slowest pipeline is within this fraction", metavar="FRACTION"),
    Flag("--perseus-straggler-patience", "straggler_patience", int, "consecutive checks before reacting", metavar="N"),
    Flag("--perseus-probe-every", "probe_every_steps", int,
         "run a default-clock probe every N deployed iterations for the same-run A/B and the no-slowdown guard "
         "(0: never)", metavar="N"),
    Flag("--perseus-guard-tolerance", "guard_tolerance", float,
         "move to a faster plan when it is slower than its target by more than this fraction plus the noise",
         metavar="FRACTION"),
    Flag("--perseus-guard-patience", "guard_patience", int, "consecutive slow checks before the guard acts",
         metavar="N"),
    Flag("--perseus-guard-noise-z", "guard_noise_z", float,
         "noise allowance of the guard, in robust standard errors of the A/B", metavar="Z"),
    Flag("--perseus-carbon-source", "carbon_source", str,
         "carbon intensity: a .csv trace, http(s):// JSON, unix:PATH or file:PATH (docs/carbon.md)", metavar="SOURCE"),
    Flag("--perseus-carbon-time-budget", "carbon_time_budget", float,
         "average slowdown the carbon policy may spend (e.g. 0.025)", metavar="FRACTION"),
    Flag("--perseus-carbon-horizon", "carbon_horizon_windows", int, "windows over which the budget is restored",
         metavar="N"),
    Flag("--perseus-carbon-window", "carbon_window_s", float, "one carbon point per window of this many seconds",
         metavar="SECONDS"),
    Flag("--perseus-carbon-stale", "carbon_stale_s", float, "an intensity older than this is not used",
         metavar="SECONDS"),
    Flag("--perseus-carbon-replay-speed", "carbon_replay_speed", float,
         "replay a .csv trace this many times faster than real time", metavar="X"),
    Flag("--perseus-power-cap", "power_cap_w", float, "job-wide power cap (W, all GPUs)", metavar="WATTS"),
    Flag("--perseus-power-cap-source", "power_cap_source", str,
         "read the job power cap while training (demand response): file:PATH, unix:PATH or http(s)://",
         metavar="SOURCE"),
    Flag("--perseus-grid-every", "grid_every_steps", int, "read the grid signals and decide every N iterations",
         metavar="N"),
    Flag("--perseus-grid-timeout", "grid_timeout_s", float, "a grid source slower than this is a failed read",
         metavar="SECONDS"),
    Flag("--perseus-cache-dir", "cache_dir", str, "where profiles and frontiers are cached across runs", metavar="DIR"),
    Flag("--perseus-metrics-file", "metrics_file", str, "rank 0 writes per-iteration time/energy as JSON lines here",
         metavar="PATH"),
    Flag("--perseus-log-every", "log_every_steps", int, "log progress every N iterations (0: never)", metavar="N"),
    Flag("--perseus-prometheus-port", "prometheus_port", int,
         "serve Perseus metrics for Prometheus on 127.0.0.1, one exporter per rank (0: any free port; N: port "
         "N + LOCAL_RANK)", metavar="N"),
    Flag("--perseus-control-plane", "control_plane", str, "the runtime's collectives: hierarchical (along the job's "
         "TP/PP/DP groups, default) or flat (one gloo group over every rank)", choices=DESIGNS),
)


def add_perseus_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the Perseus flag group; usable directly as Megatron-LM's ``extra_args_provider``."""
    group = parser.add_argument_group(title="perseus", description="GPU energy optimization (Perseus)")
    group.add_argument("--perseus", action="store_true", default=False,
                       help="enable Perseus: profile, plan and apply per-instruction GPU clocks")
    for flag in FLAGS:
        group.add_argument(flag.option, dest=flag.dest, type=flag.type, default=None, help=flag.help,
                           metavar=flag.metavar, choices=flag.choices)
    return parser


def compose_providers(*providers: Callable[[argparse.ArgumentParser], Any] | None) -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:
    """One ``extra_args_provider`` that applies several in order (``None`` entries are skipped)."""
    chain = [p for p in providers if p is not None]

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for add in chain:
            result = add(parser)
            parser = result if isinstance(result, argparse.ArgumentParser) else parser
        return parser

    return provider


_PERSEUS_ARGS_MARK = "__perseus_args__"
_PROVIDER = "extra_args_provider"


def with_perseus_args(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``add_perseus_args`` composed into its ``extra_args_provider``.

    ``fn`` is Megatron-LM's ``pretrain`` (core ≤ 0.17) or ``parse_and_validate_args`` (core ≥ 0.18);
    either one hands its provider to Megatron's parser. The ``pretrain_gpt.py`` that
    ``python -m perseus_megatron.patch`` edits wraps one of them, so that its call stays as
    Megatron wrote it and the parser still accepts ``--perseus*``. Idempotent.
    """
    if getattr(fn, _PERSEUS_ARGS_MARK, False):
        return fn
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the provider can only go by keyword
        parameters = []
    names = [p.name for p in parameters]
    if parameters and _PROVIDER not in names and not any(p.kind is p.VAR_KEYWORD for p in parameters):
        raise ConfigError(f"{getattr(fn, '__name__', fn)!s} takes no {_PROVIDER}, so Megatron's parser cannot get "
                          "the --perseus flags; run the script through python -m perseus_megatron.pretrain_gpt instead")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    index = names.index(_PROVIDER) if _PROVIDER in names else None
    by_position = index is not None and all(p.kind in positional for p in parameters[:index + 1])

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if by_position and index is not None and len(args) > index:
            args = (*args[:index], compose_providers(args[index], add_perseus_args), *args[index + 1:])
        else:
            kwargs[_PROVIDER] = compose_providers(kwargs.get(_PROVIDER), add_perseus_args)
        return fn(*args, **kwargs)

    setattr(call, _PERSEUS_ARGS_MARK, True)
    return call


def config_from_args(args: argparse.Namespace) -> PerseusConfig:
    """``PerseusConfig`` from parsed flags; a bad value is a ``ConfigError`` naming the flag."""
    if not hasattr(args, "perseus"):
        raise ConfigError("perseus flags are missing from the parsed arguments; add perseus_megatron.add_perseus_args "
                          "as (or into) the extra_args_provider")
    values: dict[str, Any] = {"enabled": bool(args.perseus)}
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        if value is not None:
            values[flag.field] = value
    try:
        return PerseusConfig.from_dict(values)
    except ConfigError as exc:
        raise ConfigError(_name_flags(str(exc))) from None


def config_from_argv(argv: Sequence[str]) -> PerseusConfig:
    """Parse only the Perseus flags out of a full command line (other flags are left alone)."""
    parser = add_perseus_args(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    args, _ = parser.parse_known_args(list(argv))
    return config_from_args(args)


def _name_flags(message: str) -> str:
    """Say which command-line flag a config field came from: 'mode' → 'mode (--perseus-mode)'."""
    for flag in sorted(FLAGS, key=lambda f: -len(f.field)):
        message = message.replace(f"{flag.field}:", f"{flag.field} ({flag.option}):", 1)
    return message
