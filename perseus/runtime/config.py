"""The one validated Perseus configuration, shared by Megatron flags and DeepSpeed's ``"perseus"`` section.

Every value is checked before training starts: a typo or an impossible combination is a
``ConfigError`` naming the field, the problem and what to do, never a failure hours into a run.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError,
                      model_validator)

from perseus.errors import ConfigError, PerseusError
from perseus.planner.settings import PlannerOptions



class Choice(str, enum.Enum):
    """A setting with a fixed set of string values: the config parses the string to the member, and
    the member prints (and serializes) as that string, so metrics and summaries keep the same text."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(str(member.value) for member in cls)


class Mode(Choice):
    """What a run does with the clocks. The code asks the properties, never the name."""

    PROFILE = "profile"
    PLAN = "plan"
    RUN = "run"
    MEASURE_ONLY = "measure-only"

    @property
    def controls_clocks(self) -> bool:
        """Whether the rank's controller may change clocks (measure-only opens the NullController)."""
        return self is not Mode.MEASURE_ONLY

    @property
    def profiles(self) -> bool:
        """Whether a missing profile is measured by sweeping clocks (needs clock control)."""
        return self.controls_clocks

    @property
    def plans(self) -> bool:
        """Whether a profile is turned into a frontier (and a cached frontier is loaded)."""
        return self is not Mode.PROFILE

    @property
    def deploys(self) -> bool:
        """Whether a plan is run at its planned clocks; the other modes keep default clocks."""
        return self is Mode.RUN

    @property
    def description(self) -> str:
        return _MODE_DESCRIPTIONS[self]


_MODE_DESCRIPTIONS: dict[Mode, str] = {
    Mode.PROFILE: "sweep clocks and save the profile",
    Mode.PLAN: "also plan, keep default clocks",
    Mode.RUN: "profile, plan and deploy (default)",
    Mode.MEASURE_ONLY: "no clock control, report time/energy",
}


class ControlPlaneDesign(Choice):
    """How the runtime's collectives connect the ranks (docs/runtime.md, Control plane)."""

    HIERARCHICAL = "hierarchical"  # along the job's grid: TP ranks, a pipeline's stages, a stage's replicas
    FLAT = "flat"  # one gloo group over every rank


class WithoutClockAccess(Choice):
    """What a run that should change clocks does where a rank may not (no privilege, MIG, another
    Perseus process's claim on the GPU, someone else's lock on it): decided for the whole job."""

    FAIL = "fail"  # stop before training, one line for the job
    MEASURE_ONLY = "measure-only"  # every rank trains on without changing a clock, measuring; rank 0 says why

    @property
    def measures(self) -> bool:
        return self is WithoutClockAccess.MEASURE_ONLY


# Also perseus.gpu.factory.KINDS (which this module does not import: it loads the GPU layer); a test keeps them equal.
GPUBackend = Literal["auto", "nvml", "sim"]

MODES: tuple[str, ...] = Mode.values()
_MODE_HELP = "; ".join(f"{mode}: {mode.description}" for mode in Mode)
DESIGNS: tuple[str, ...] = ControlPlaneDesign.values()
GPU_BACKENDS: tuple[str, ...] = get_args(GPUBackend)
# The shortest probe window with one counted probe step: its settle step, the probe, the plan's settle
# step and one counted plan step (guard/placement.py: ProbePlacement.shortest; a test keeps them equal).
MIN_PROBE_EVERY_STEPS = 4


def _planner_options(value: Any) -> PlannerOptions:
    """A mapping (or ``PlannerOptions``) → checked ``PlannerOptions``, so a misspelt key fails now,
    not as "planning failed" after warm-up and a whole profiling sweep."""
    try:
        return PlannerOptions.from_mapping(value)
    except PerseusError as exc:
        raise ValueError(str(exc)) from None


# Checked by the planner's own dataclass (no pydantic coercion: "48" stays an error); dumped as a dict.
PlannerOptionsField = Annotated[
    PlannerOptions, PlainValidator(_planner_options), PlainSerializer(lambda o: o.as_dict(), return_type=dict)
]


def default_cache_dir() -> str:
    """The cache directory when the config names none: ``$PERSEUS_CACHE_DIR``, else the user's cache
    directory (``$XDG_CACHE_HOME/perseus``, else ``~/.cache/perseus``); absolute, so every rank and
    launcher finds the same one whatever its working directory."""
    chosen = os.environ.get("PERSEUS_CACHE_DIR")
    if not chosen:
        xdg = os.environ.get("XDG_CACHE_HOME")
        chosen = os.path.join(xdg if xdg and os.path.isabs(xdg) else os.path.join("~", ".cache"), "perseus")
    return os.path.abspath(os.path.expanduser(chosen))


def _expand_cache_dir(value: Any) -> Any:
    """``~`` in a configured cache directory is the user's home, as in a shell."""
    return os.path.expanduser(value) if isinstance(value, str) else value


_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")


def _prometheus_addr(value: Any) -> str:
    """An IP address or a host name to listen on, without a port."""
    if isinstance(value, str) and (_HOST_NAME.fullmatch(value) or _is_ip_address(value)):
        return value
    raise ValueError(f"must be an IP address or a host name without a port (the port is prometheus_port), "
                     f"e.g. 127.0.0.1 or 0.0.0.0 (got {value!r})")


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
PrometheusAddr = Annotated[str, PlainValidator(_prometheus_addr)]
CacheDir = Annotated[str | None, BeforeValidator(_expand_cache_dir)]


class PerseusConfig(BaseModel):
    """Runtime settings; docs/reference/config.md lists every field (scripts/gen_reference.py writes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    enabled: bool = Field(
        default=True,
        description="turn Perseus on (Megatron: --perseus; a DeepSpeed config without the section: off)",
    )
    mode: Mode = Field(default=Mode.RUN, description=_MODE_HELP)
    # measure-only by default: Perseus never stalls a training job, and the loss of savings is not
    # silent (rank 0's one line at start-up names the ranks, the reason and the fix; the run's mode
    # reads measure-only). "fail" where a run without savings is not worth running (an energy benchmark).
    without_clock_access: WithoutClockAccess = Field(
        default=WithoutClockAccess.MEASURE_ONLY,
        description=("where a rank may not change its GPU's clocks (no privilege, MIG, a GPU another Perseus "
                     "process claimed, a lock someone else holds): measure-only (default: the whole job trains "
                     "on without changing a clock, measuring, and rank 0 says why) or fail (stop before training)"),
    )
    gpu: GPUBackend = Field(default="auto", description="GPU backend: auto (NVML, or $PERSEUS_GPU), nvml, sim")
    device_index: int | None = Field(
        default=None, ge=0,
        description="NVML index of this rank's GPU (default: the current CUDA device)",
    )
    sim_gpu: dict[str, Any] = Field(
        default_factory=dict,
        description='simulated GPU options as JSON, e.g. \'{"preset": "A40"}\'',
    )
    # Clocks and energy through Zeus's zeusd on this Unix socket (None: $PERSEUS_ZEUSD_SOCKET, if set).
    zeusd_socket: str | None = Field(
        default=None,
        description=("change clocks and read energy through Zeus's zeusd on this Unix socket (default: "
                     "$PERSEUS_ZEUSD_SOCKET)"),
    )

    # Online profiling: which SM clocks to sweep, and how long.
    freq_max_mhz: int | None = Field(default=None, gt=0, description="highest SM clock to profile (MHz)")
    freq_min_mhz: int | None = Field(default=None, gt=0, description="lowest SM clock to profile (MHz)")
    freq_step_mhz: int | None = Field(default=None, gt=0, description="profile clocks this many MHz apart")
    freq_every_k: int = Field(default=1, ge=1, description="profile every k-th supported clock")
    warmup_steps: int = Field(default=2, ge=1, description="iterations at default clocks before profiling (baseline)")
    # Iterations per clock: the first after a clock change is dropped when it is systematically
    # slow, so 3 leaves at least two to know the noise (docs/runtime.md, "Online profiling").
    iters_per_freq: int = Field(default=3, ge=1, description="profiled iterations per clock")
    # Energy-counter intervals each profiled clock should span (the attributed power's standard
    # error shrinks as 1/sqrt(intervals)); a clock is measured longer for it, up to 3 x iters_per_freq.
    # 10 intervals (1 s at a 100 ms counter) leave steps of 0.35 s and longer at iters_per_freq.
    attribution_intervals: int = Field(
        default=10, ge=0,
        description="energy-counter intervals each profiled clock should span (measured longer for it, up to 3x)",
    )
    # Two clocks in a row: one clock made noisy by the node must not end the sweep early.
    early_stop_patience: int = Field(
        default=2, ge=0,
        description=("stop lowering clocks after this many coarse clocks in a row where no kind's energy fell "
                     "(0: never)"),
    )
    # Coarse pass: clocks at least this far apart (null: every candidate clock); refinement
    # measures at most refine_max_clocks more where interpolation does not predict the
    # measured clocks; the rest of the candidates are interpolated.
    coarse_step_mhz: int | None = Field(
        default=90, gt=0,
        description="the sweep's coarse pass: clocks this many MHz apart",
    )
    refine_max_clocks: int = Field(
        default=2, ge=0,
        description="clocks measured between coarse ones where interpolation is not accurate",
    )
    # A clock whose noise is larger than its effect is measured again (at most this many times per sweep).
    remeasure_max: int = Field(
        default=2, ge=0,
        description="re-measurements of clocks whose noise exceeds their effect",
    )
    # The planner's times: fitted time + noise_k standard errors (0: the fitted time itself).
    noise_k: float = Field(default=2.0, ge=0, description="planning times: fitted time + this many standard errors")
    # ... + spread_k times the per-instance spread (robust σ) a clock adds over the max clock's: a
    # step waits for its slowest chain, so per-run variance costs slack a mean does not show. Off by
    # default: a profile taken on a loaded machine has spreads of whole instructions (docs/runtime.md).
    spread_k: float = Field(default=0.0, ge=0, description="planning times: + this many times the per-instance "
                            "spread a clock adds over the max clock's (0: the mean's noise only)")
    p_blocking_w: float | None = Field(
        default=None, gt=0,
        description="GPU power while blocked on communication (W); measured if unset",
    )
    p_blocking_seconds: float = Field(
        default=1.0, gt=0,
        description="how long P_blocking is measured at start-up when p_blocking_w is not given",
    )
    energy_poll_s: float = Field(
        default=0.002, gt=0,
        description="how often the profiling run's poller reads the GPU's energy counter",
    )

    # Planning.
    profile_path: str | None = Field(
        default=None,
        description="use this profile (Zeus CSV or perseus JSON) instead of profiling",
    )
    frontier_path: str | None = Field(
        default=None,
        description="deploy this planned frontier instead of profiling and planning",
    )
    planner_options: PlannerOptionsField = Field(
        default_factory=PlannerOptions,
        description='planner settings (PlannerOptions) as JSON, e.g. \'{"num_anchors": 16}\'; checked at startup',
    )
    # Priority of rank 0's planner process (os.nice): 10 yields the CPU to a trainer whose Python
    # thread must wake up promptly; 0 for CPU-bound trainers on a busy machine (the CPU demos),
    # where a niced planner would be starved.
    planner_nice: int = Field(
        default=10, ge=0, le=19,
        description=("priority (nice 0-19) of rank 0's planner process (its own session; nice counts where it "
                     "shares a CPU cgroup with the trainer); 0 for CPU-bound trainers on a busy machine"),
    )
    # At each step end while planning, rank 0 waits up to this long for its planner before the
    # ranks learn the outcome (0: never; training goes on at default clocks meanwhile). For runs
    # with a fixed, short iteration budget (benchmarks, CI) that must reach the deployed plan
    # however busy the machine is: the step that waits lasts as long as planning.
    plan_wait_s: float = Field(
        default=0.0, ge=0,
        description=("rank 0 waits up to this long at a step end for its planner (0: never); for short "
                     "fixed-length runs"),
    )
    # When training ends (``close()``) while rank 0 is still planning, it waits up to this long for
    # the planner process to finish and write the frontier to the cache, so the next run deploys it
    # instead of planning again; then it stops the planner (0: stop it at once, the work is lost).
    close_plan_wait_s: float = Field(
        default=60.0, ge=0,
        description=("when training ends while planning, rank 0 waits up to this long for the planner to cache "
                     "the frontier (0: stop it at once)"),
    )

    # Stragglers and external targets.
    # Request each instruction's clock when the previous one ends, so the switch latency overlaps
    # the wait between them (off: at the instruction's own start, as the plan assumes).
    switch_ahead: bool = Field(
        default=True,
        description=("request each instruction's clock when the previous one ends, hiding the switch latency "
                     "(default: on)"),
    )
    # Record per instruction when its clock was requested and took effect, hook time, the
    # simulated kernel's stretch and wake-up (perseus/runtime/port/clock_trace.py); for diagnosis.
    trace_clocks: bool = Field(
        default=False,
        description="record per instruction when its clock was requested and took effect (diagnosis)",
    )
    straggler_period_steps: int = Field(
        default=10, ge=0,
        description="check for stragglers every N iterations (0: never)",
    )
    straggler_threshold: float = Field(
        default=0.05, gt=0,
        description="slow down to match a pipeline this fraction slower than the rest (e.g. 0.05)",
    )
    straggler_recover_threshold: float = Field(
        default=0.02, ge=0,
        description="return to full speed when the slowest pipeline is within this fraction",
    )
    straggler_patience: int = Field(default=2, ge=1, description="consecutive checks before reacting")

    # The no-slowdown guard (docs/runtime.md, "No slowdown, checked while training"): deployed steps
    # are cut into windows, each with one probe block (one settle step, ``probe_block_steps``
    # counted steps at default clocks) at a seeded random offset; the first windows are
    # ``probe_every_steps`` long, growing to ``probe_longest_steps`` once the test is confident.
    # At each window's end every pipeline's CUSUM of rank scores is gathered; at ``guard_threshold``
    # the job moves to a faster point (or falls back at the fastest). A plan within
    # ``guard_tolerance`` of its target is not slow. 0 turns probes and the guard off.
    probe_every_steps: int = Field(
        default=6, ge=0,
        description=("length of the guard's first probe windows in deployed iterations, each with one "
                     "default-clock probe block at a random offset (0: no probes, no guard)"),
    )
    probe_longest_steps: int = Field(
        default=200, ge=1,
        description="longest probe window, reached as the guard's test grows confident (1 probe block per window)",
    )
    probe_block_steps: int = Field(
        default=1, ge=1,
        description="counted default-clock steps per probe block (more for GPUs slow to reach their sustained clock)",
    )
    guard_tolerance: float = Field(
        default=0.01, ge=0, lt=0.5,
        description="a plan within this fraction of its target time is not slow",
    )
    guard_threshold: float = Field(
        default=5.0, gt=0,
        description="CUSUM threshold of the guard's sequential test (higher: fewer false alarms, later detection)",
    )
    # The first design's patience and noise allowance: accepted so older configs load, unused since
    # the CUSUM (its threshold is ``guard_threshold``).
    guard_patience: int = Field(default=3, ge=1, description="unused since the sequential guard (accepted for old configs)")
    guard_noise_z: float = Field(default=2.0, ge=0, description="unused since the sequential guard (accepted for old configs)")

    # Faults. Every collective with the other ranks gives up after this long (a rank died or
    # hung): the survivors continue at default clocks. The controller reads the applied clock back
    # this often and re-applies it when something else changed it (0: never).
    collective_timeout_s: float = Field(
        default=300.0, gt=0,
        description=("a collective with the other ranks gives up after this long (a rank died or hung); the "
                     "survivors continue at default clocks"),
    )
    # The runtime's collectives: along the job's grid (tensor-parallel ranks, a pipeline's stages,
    # a stage's replicas; no rank connects to the whole job), or one gloo group over every rank
    # (``flat``, the design before 0.x; fine for a few dozen ranks). docs/runtime.md, Control plane.
    control_plane: ControlPlaneDesign = Field(
        default=ControlPlaneDesign.HIERARCHICAL,
        description=("the runtime's collectives: hierarchical (along the job's TP/PP/DP groups, default) or "
                     "flat (one gloo group over every rank)"),
    )
    # The process's atexit, SIGTERM and sys.excepthook belong to its entry point: the adapters'
    # (perseus_megatron.enable, perseus_deepspeed.initialize, perseus_torch.enable) install
    # perseus.runtime.install_process_hooks unless this is off, for a trainer that owns its signal
    # handlers; its clocks are still reset on every exit by the clock controller (docs/gpu.md).
    process_hooks: bool = Field(
        default=True,
        description=("the adapter installs Perseus's atexit, SIGTERM and one-line-error hooks (off: the trainer "
                     "owns them; the clock controller still resets the clocks at exit)"),
    )
    clock_check_s: float = Field(
        default=1.0, ge=0,
        description=("how often the controller reads the applied clock back and re-applies it when something "
                     "else changed it (0: never)"),
    )

    # Carbon and power targets (docs/carbon.md). A source is a .csv trace, http(s)://... (JSON),
    # unix:PATH, file:PATH or a plain path (an operator file). Rank 0 reads them every
    # grid_every_steps deployed steps; every rank switches at the same step. A carbon source that
    # fails runs the no-slowdown point; a cap keeps its last value.
    carbon_source: str | None = Field(
        default=None,
        description="carbon intensity: a .csv trace, http(s):// JSON, unix:PATH or file:PATH (docs/carbon.md)",
    )
    carbon_time_budget: float = Field(
        default=0.025, ge=0, le=1,
        description="average slowdown the carbon policy may spend (e.g. 0.025)",
    )
    carbon_horizon_windows: int = Field(default=168, ge=1, description="windows over which the budget is restored")
    carbon_window_s: float = Field(default=3600.0, gt=0, description="one carbon point per window of this many seconds")
    carbon_stale_s: float = Field(default=7200.0, gt=0, description="an intensity older than this is not used")
    # A .csv trace replayed this many times faster than real time from its first row (the demo).
    carbon_replay_speed: float | None = Field(
        default=None, gt=0,
        description="replay a .csv trace this many times faster than real time",
    )
    power_cap_w: float | None = Field(default=None, gt=0, description="job-wide power cap (W, all GPUs)")
    power_cap_source: str | None = Field(
        default=None,
        description=("read the job power cap while training (demand response): file:PATH, unix:PATH or "
                     "http(s)://"),
    )
    grid_every_steps: int = Field(default=10, ge=1, description="read the grid signals and decide every N iterations")
    grid_timeout_s: float = Field(default=5.0, gt=0, description="a grid source slower than this is a failed read")

    # Cache and reports.
    cache_dir: CacheDir = Field(
        default_factory=default_cache_dir,
        description=("where profiles and frontiers are cached across runs (default: $PERSEUS_CACHE_DIR, else "
                     "$XDG_CACHE_HOME/perseus, else ~/.cache/perseus; null: no cache)"),
    )
    metrics_file: str | None = Field(
        default=None,
        description="rank 0 writes per-iteration time/energy as JSON lines here",
    )
    log_every_steps: int = Field(default=1, ge=0, description="log progress every N iterations (0: never)")
    # Prometheus exporter, one per rank: 0 = any free port; N = port N + LOCAL_RANK.
    prometheus_port: int | None = Field(
        default=None, ge=0, le=65535,
        description=("serve Perseus metrics for Prometheus on prometheus_addr, one exporter per rank (0: any free "
                     "port; N: port N + LOCAL_RANK)"),
    )
    # Loopback by default: the exporter has no authentication, so reaching it from other hosts is a choice.
    prometheus_addr: PrometheusAddr = Field(
        default="127.0.0.1",
        description=("address the Prometheus exporters listen on (127.0.0.1: this host only; 0.0.0.0 or the "
                     "node's address: a cluster's Prometheus can scrape them)"),
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> PerseusConfig:
        if self.freq_min_mhz is not None and self.freq_max_mhz is not None and self.freq_min_mhz > self.freq_max_mhz:
            raise ValueError(
                f"freq_min_mhz ({self.freq_min_mhz}) is above freq_max_mhz ({self.freq_max_mhz}); swap them"
            )
        if self.freq_step_mhz is not None and self.freq_every_k != 1:
            raise ValueError("set either freq_step_mhz or freq_every_k, not both")
        if self.straggler_recover_threshold >= self.straggler_threshold:
            raise ValueError(
                f"straggler_recover_threshold ({self.straggler_recover_threshold}) must be below "
                f"straggler_threshold ({self.straggler_threshold}) so the policy has a hysteresis band"
            )
        shortest = MIN_PROBE_EVERY_STEPS + self.probe_block_steps - 1
        if 0 < self.probe_every_steps < shortest:
            raise ValueError(
                f"probe_every_steps ({self.probe_every_steps}) leaves no counted plan step between default-clock "
                f"probes; use 0 (off) or at least {shortest}"
            )
        if self.plan_wait_s >= self.collective_timeout_s:
            raise ValueError(
                f"plan_wait_s ({self.plan_wait_s:g}) must be below collective_timeout_s ({self.collective_timeout_s:g}): "
                "the other ranks wait for rank 0's planning in a collective"
            )
        if self.power_cap_w is not None and self.power_cap_source is not None:
            raise ValueError("give power_cap_w (a fixed cap) or power_cap_source (read at runtime), not both")
        if self.carbon_replay_speed is not None and not str(self.carbon_source or "").lower().endswith(".csv"):
            raise ValueError("carbon_replay_speed replays a .csv trace; set carbon_source to one")
        if self.profile_path is not None and self.frontier_path is not None:
            raise ValueError("give profile_path or frontier_path, not both (a frontier already holds the plan)")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PerseusConfig:
        """Validate a plain mapping (DeepSpeed section, parsed flags); raises ``ConfigError``."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"perseus config must be a mapping of settings, got {type(data).__name__}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    def replace(self, **changes: Any) -> PerseusConfig:
        """Validated copy with some fields changed."""
        return PerseusConfig.from_dict({**self.model_dump(), **changes})


def choices(field: str) -> tuple[str, ...]:
    """The values a field accepts when they are a fixed set (an enum or a ``Literal``), else ``()``:
    the one list that flags, validation messages and docs all read."""
    annotation = PerseusConfig.model_fields[field].annotation
    if isinstance(annotation, type) and issubclass(annotation, Choice):
        return annotation.values()
    return tuple(str(a) for a in get_args(annotation)) if getattr(annotation, "__origin__", None) is Literal else ()


def _one_line(exc: ValidationError) -> str:
    """Pydantic's multi-line report → one line per problem, joined, naming each field."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown setting; valid settings are {', '.join(PerseusConfig.model_fields)}"
        elif err["type"] in ("enum", "literal_error") and field in PerseusConfig.model_fields:
            msg = f"must be one of {', '.join(choices(field))}"
        got = err.get("input")
        shown = "" if err["type"] in ("extra_forbidden", "value_error") else f" (got {got!r})"
        problems.append(f"{field}: {msg}{shown}")
    return "invalid perseus config: " + "; ".join(problems)
