"""The one validated Perseus configuration, shared by Megatron flags and DeepSpeed's ``"perseus"`` section.

Every value is checked before training starts: a typo or an impossible combination is a
``ConfigError`` naming the field, the problem and what to do, never a failure hours into a run.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError, model_validator

from perseus.errors import ConfigError, PerseusError
from perseus.planner.settings import PlannerOptions

Mode = Literal["profile", "plan", "run", "measure-only"]
GPUBackend = Literal["auto", "nvml", "sim"]
ControlPlaneDesign = Literal["hierarchical", "flat"]

MODES: tuple[str, ...] = ("profile", "plan", "run", "measure-only")
# The smallest probe period that keeps one counted plan step between default-clock probe blocks
# (guard/probes.py: ProbeSchedule.min_every with its one settle step; a test keeps them equal).
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


class PerseusConfig(BaseModel):
    """Runtime settings; see docs/runtime.md for the reference table."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    enabled: bool = True
    mode: Mode = "run"
    gpu: GPUBackend = "auto"
    device_index: int | None = Field(default=None, ge=0)
    sim_gpu: dict[str, Any] = Field(default_factory=dict)
    # Clocks and energy through Zeus's zeusd on this Unix socket (None: $PERSEUS_ZEUSD_SOCKET, if set).
    zeusd_socket: str | None = None

    # Online profiling: which SM clocks to sweep, and how long.
    freq_max_mhz: int | None = Field(default=None, gt=0)
    freq_min_mhz: int | None = Field(default=None, gt=0)
    freq_step_mhz: int | None = Field(default=None, gt=0)
    freq_every_k: int = Field(default=1, ge=1)
    warmup_steps: int = Field(default=2, ge=1)
    # Iterations per clock: the first after a clock change is dropped when it is systematically
    # slow, so 3 leaves at least two to know the noise (docs/runtime.md, "Online profiling").
    iters_per_freq: int = Field(default=3, ge=1)
    # Energy-counter intervals each profiled clock should span (the attributed power's standard
    # error shrinks as 1/sqrt(intervals)); a clock is measured longer for it, up to 3 x iters_per_freq.
    attribution_intervals: int = Field(default=30, ge=0)
    # Two clocks in a row: one clock made noisy by the node must not end the sweep early.
    early_stop_patience: int = Field(default=2, ge=0)
    # Coarse pass: clocks at least this far apart (null: every candidate clock); refinement
    # measures at most refine_max_clocks more where interpolation does not predict the
    # measured clocks; the rest of the candidates are interpolated.
    coarse_step_mhz: int | None = Field(default=90, gt=0)
    refine_max_clocks: int = Field(default=2, ge=0)
    # A clock whose noise is larger than its effect is measured again (at most this many times per sweep).
    remeasure_max: int = Field(default=2, ge=0)
    # The planner's times: fitted time + noise_k standard errors (0: the fitted time itself).
    noise_k: float = Field(default=2.0, ge=0)
    p_blocking_w: float | None = Field(default=None, gt=0)
    p_blocking_seconds: float = Field(default=1.0, gt=0)
    energy_poll_s: float = Field(default=0.002, gt=0)

    # Planning.
    profile_path: str | None = None
    frontier_path: str | None = None
    planner_options: PlannerOptionsField = Field(default_factory=PlannerOptions)
    # Priority of rank 0's planner process (os.nice): 10 yields the CPU to a trainer whose Python
    # thread must wake up promptly; 0 for CPU-bound trainers on a busy machine (the CPU demos),
    # where a niced planner would be starved.
    planner_nice: int = Field(default=10, ge=0, le=19)
    # At each step end while planning, rank 0 waits up to this long for its planner before the
    # ranks learn the outcome (0: never; training goes on at default clocks meanwhile). For runs
    # with a fixed, short iteration budget (benchmarks, CI) that must reach the deployed plan
    # however busy the machine is: the step that waits lasts as long as planning.
    plan_wait_s: float = Field(default=0.0, ge=0)
    # When training ends (``close()``) while rank 0 is still planning, it waits up to this long for
    # the planner process to finish and write the frontier to the cache, so the next run deploys it
    # instead of planning again; then it stops the planner (0: stop it at once, the work is lost).
    close_plan_wait_s: float = Field(default=60.0, ge=0)

    # Stragglers and external targets.
    # Request each instruction's clock when the previous one ends, so the switch latency overlaps
    # the wait between them (off: at the instruction's own start, as the plan assumes).
    switch_ahead: bool = True
    # Record per instruction when its clock was requested and took effect, hook time, the
    # simulated kernel's stretch and wake-up (perseus/runtime/port/clock_trace.py); for diagnosis.
    trace_clocks: bool = False
    straggler_period_steps: int = Field(default=10, ge=0)
    straggler_threshold: float = Field(default=0.05, gt=0)
    straggler_recover_threshold: float = Field(default=0.02, ge=0)
    straggler_patience: int = Field(default=2, ge=1)

    # The no-slowdown guard (docs/runtime.md, "No slowdown, checked while training"): every N
    # deployed steps a default-clock probe (one settle step, one counted step) gives the same-run
    # A/B; the plan moves to a faster point after ``guard_patience`` checks in a row slower than its
    # target by more than ``guard_tolerance`` + ``guard_noise_z`` robust standard errors, and falls
    # back to default clocks when even the fastest point is. 0 turns probes and the guard off.
    probe_every_steps: int = Field(default=50, ge=0)
    guard_tolerance: float = Field(default=0.01, ge=0, lt=0.5)
    guard_patience: int = Field(default=3, ge=1)
    guard_noise_z: float = Field(default=2.0, ge=0)

    # Faults. Every collective with the other ranks gives up after this long (a rank died or
    # hung): the survivors continue at default clocks. The controller reads the applied clock back
    # this often and re-applies it when something else changed it (0: never).
    collective_timeout_s: float = Field(default=300.0, gt=0)
    # The runtime's collectives: along the job's grid (tensor-parallel ranks, a pipeline's stages,
    # a stage's replicas; no rank connects to the whole job), or one gloo group over every rank
    # (``flat``, the design before 0.x; fine for a few dozen ranks). docs/runtime.md, Control plane.
    control_plane: ControlPlaneDesign = "hierarchical"
    clock_check_s: float = Field(default=1.0, ge=0)

    # Carbon and power targets (docs/carbon.md). A source is a .csv trace, http(s)://... (JSON),
    # unix:PATH, file:PATH or a plain path (an operator file). Rank 0 reads them every
    # grid_every_steps deployed steps; every rank switches at the same step. A carbon source that
    # fails runs the no-slowdown point; a cap keeps its last value.
    carbon_source: str | None = None
    carbon_time_budget: float = Field(default=0.025, ge=0, le=1)  # average slowdown allowed (fraction)
    carbon_horizon_windows: int = Field(default=168, ge=1)  # the budget is restored over this many windows
    carbon_window_s: float = Field(default=3600.0, gt=0)  # one point per window
    carbon_stale_s: float = Field(default=7200.0, gt=0)  # an intensity older than this is not used
    # A .csv trace replayed this many times faster than real time from its first row (the demo).
    carbon_replay_speed: float | None = Field(default=None, gt=0)
    power_cap_w: float | None = Field(default=None, gt=0)  # job-wide cap, watts (all GPUs)
    power_cap_source: str | None = None  # where the cap is read at runtime (demand response)
    grid_every_steps: int = Field(default=10, ge=1)
    grid_timeout_s: float = Field(default=5.0, gt=0)

    # Cache and reports.
    cache_dir: str | None = "perseus-cache"
    metrics_file: str | None = None
    log_every_steps: int = Field(default=1, ge=0)
    # Prometheus exporter on 127.0.0.1, one per rank: 0 = any free port; N = port N + LOCAL_RANK.
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)

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
        if 0 < self.probe_every_steps < MIN_PROBE_EVERY_STEPS:
            raise ValueError(
                f"probe_every_steps ({self.probe_every_steps}) leaves no counted plan step between default-clock "
                f"probes; use 0 (off) or at least {MIN_PROBE_EVERY_STEPS}"
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


def _one_line(exc: ValidationError) -> str:
    """Pydantic's multi-line report → one line per problem, joined, naming each field."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown setting; valid settings are {', '.join(PerseusConfig.model_fields)}"
        elif err["type"] == "literal_error" and field == "mode":
            msg = f"must be one of {', '.join(MODES)}"
        got = err.get("input")
        shown = "" if err["type"] in ("extra_forbidden", "value_error") else f" (got {got!r})"
        problems.append(f"{field}: {msg}{shown}")
    return "invalid perseus config: " + "; ".join(problems)
