"""``PlannerOptions``: the planner's settings, typed and checked once.

Why one frozen dataclass: the same knobs reach the planner from Python, the runtime's
``planner_options`` config (checked when the config is built, not after a profiling sweep) and
the frontier file's metadata; one definition keeps their names, defaults and limits in step.
Plain dataclasses only: the planner runs anywhere, without pydantic or torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from perseus.errors import PerseusError

_INT_MINIMUMS = {
    "num_anchors": 2,
    "num_deadlines": 1,
    "improve_sweeps": 0,
    "max_block": 1,
    "max_window": 1,
    "search_windows": 0,
    "beam_width": 0,
    "beam_max_width": 0,
    "beam_deadlines": 0,
    "beam_fill": 0,
    "beam_max_nodes": 0,
    "lp_max_nodes": 0,
    "flow_min_nodes": 0,
    "anchor_cells": 1,
    "min_anchors": 2,
    "deadline_cells": 1,
    "min_deadlines": 1,
    "batch_cells": 1,
}
_NON_NEGATIVE_NUMBERS = ("improve_time_s", "search_time_s", "search_gap", "switch_latency_s", "switch_cost_w")


@dataclass(frozen=True)
class PlannerOptions:
    """How hard the planner works; the defaults suit up to ~8 stages × 96 microbatches in seconds.

    - ``num_anchors``: deadlines at which the convex-hull LP is solved exactly (more: closer to
      the LP's guidance between anchors, ~10 ms per anchor at 1,500 instructions).
    - ``num_deadlines``: total deadlines repaired to discrete plans (anchors plus interpolated
      ones); sets how dense the frontier is (capped on large pipelines, see deadline_cells).
    - ``improve_sweeps``: passes of block potential descent on the anchor plans (0 disables):
      its work budget (a plan stops earlier after a pass that changed nothing).
    - ``max_block``: longest run of one stage's instructions shifted together in that descent.
    - ``search_windows``: work budget of the exact window search (small MILPs over bands of at
      most ``max_window`` instructions) on the anchor plans farthest above the LP bound: at most
      this many MILPs in all (80: what the former 1 s budget bought at 1,536 instructions; more
      found nothing more on A100 8 × 96); 0 disables it. Not run on network-simplex pipelines.
    - ``improve_time_s``, ``search_time_s``: wall-clock safety caps on the descent and the window
      search (every plan reached is kept; ``search_time_s=0`` disables the window search). The
      work budgets above decide how much is done: the defaults (60 s) are never reached up to
      16,384 instructions, so a plan does not depend on how busy the machine is.
    - ``search_gap``: only plans more than this fraction above the LP lower bound are improved
      (block descent) or searched (windows); the bound comes free with the LP, so near-optimal
      pipelines pay nothing.
    - ``beam_width``, ``beam_max_width``, ``beam_deadlines``, ``beam_fill``, ``beam_max_nodes``:
      on pipelines of at most ``beam_max_nodes`` instructions, LP-guided beam search
      (``planner.beam``) builds plans at the anchors plus ``beam_deadlines`` deadlines spaced
      evenly in energy, starting at ``beam_width`` states per deadline and doubling up to
      ``beam_max_width`` where wider beams keep finding better plans, then at ``beam_fill``
      deadlines evenly spaced in time at ``beam_width``. ``beam_width=0`` disables it.
    - ``lp_max_nodes``: the hull LP guides the repair on pipelines of at most this many
      instructions; above it, a price sweep does (``planner.prices``: one hull tangent per
      price, no LP, no lower bound, measurably worse: docs/planner.md, "At scale").
    - ``flow_min_nodes``: above this many instructions the hull LP is solved through its dual,
      a min-cost circulation, by network simplex (``planner.flow_lp``): 16 × 128 1F1B in ~2 s
      of CPU for all anchors where HiGHS took 3–20 s per anchor. At or below it HiGHS solves
      it, so small pipelines (the beam's edge prices, the shipped A100 profiles) keep their
      exact results.
    - ``anchor_cells``, ``min_anchors``: the LP is solved at no more than
      ``anchor_cells // instructions`` anchors (never fewer than ``min_anchors``, never more than
      ``num_anchors``): 48 up to 16,384 instructions. With the network simplex the sweep's cost
      is its path from the slowest to the fastest deadline, not the anchor count, and each
      anchor's repair and descent run beside it: at 16 × 4 × 128, 48 anchors instead of 12 cost
      ~1 s more wall time and lower the frontier by 70 J on average over its time range.
    - ``deadline_cells``, ``min_deadlines``: scale-aware density. Repair work grows with
      deadlines × instructions, so at most ``deadline_cells // instructions`` deadlines are
      repaired (never fewer than ``min_deadlines``, never more than ``num_deadlines``): the
      defaults leave every pipeline up to 1,536 instructions (A100 8 × 96) at ``num_deadlines``.
    - ``batch_cells``: deadlines × instructions per numpy batch of repair and simulation; rows
      beyond it are processed in chunks (identical results), which bounds peak memory.
    - ``switch_latency_s``: how long a clock change takes to land on the GPU; plans then change
      no clock on an instruction shorter than that (``planner.latency``). 0: instant switches,
      except in the runtime, where 0 (not configured) takes the latency its profiling sweep
      measured (recorded in the profile) where it can hide it; a value > 0 is used as given
      (``runtime.supply.plan_supply.latency_in_force``; with ``switch_ahead: false`` never a measured one).
    - ``switch_cost_w``: what a clock switch costs, as a power drawn for ``switch_latency_s``: a
      switch down whose saving is smaller keeps the faster clock (``planner.latency.switch_pays_off``).
      0 (default): switches cost no energy, as on the simulated GPU; the profile's P_blocking is
      the conservative value for hardware whose switch cost is unknown.
    """

    num_anchors: int = 48
    num_deadlines: int = 1024
    improve_sweeps: int = 4
    max_block: int = 2
    improve_time_s: float = 60.0
    search_time_s: float = 60.0
    search_windows: int = 80
    search_gap: float = 2e-3
    max_window: int = 10
    beam_width: int = 500
    beam_max_width: int = 8000
    beam_deadlines: int = 64
    beam_fill: int = 192
    beam_max_nodes: int = 48
    lp_max_nodes: int = 16384
    flow_min_nodes: int = 2048
    anchor_cells: int = 786_432
    min_anchors: int = 12
    deadline_cells: int = 1_572_864
    min_deadlines: int = 160
    batch_cells: int = 1_048_576
    switch_latency_s: float = 0.0
    switch_cost_w: float = 0.0

    def __post_init__(self) -> None:
        for name, low in _INT_MINIMUMS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise PerseusError(f"planner option {name} must be an integer >= {low}, got {value!r}")
        for name in _NON_NEGATIVE_NUMBERS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise PerseusError(f"planner option {name} must be a number >= 0, got {value!r}")
        if self.beam_width > self.beam_max_width:
            raise PerseusError(
                f"planner option beam_max_width ({self.beam_max_width}) must be at least beam_width ({self.beam_width})"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | PlannerOptions | None) -> PlannerOptions:
        """Settings from a plain mapping (a config section, parsed JSON); unknown keys are errors."""
        if data is None:
            return cls()
        if isinstance(data, PlannerOptions):
            return data
        if not isinstance(data, Mapping):
            raise PerseusError(f"planner options must be a mapping of settings, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.names()))
        if unknown:
            raise PerseusError(
                f"unknown planner option(s) {', '.join(map(str, unknown))}; valid options are {', '.join(cls.names())}"
            )
        return cls(**data)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def overrides(self) -> dict[str, Any]:
        """Only the settings that differ from the defaults (``{}`` for the defaults)."""
        default = PlannerOptions()
        return {k: v for k, v in self.as_dict().items() if getattr(default, k) != v}

    def as_dict(self) -> dict[str, Any]:
        """Every setting by name, in declaration order (frontier metadata, config dumps)."""
        return asdict(self)

    def beam_runs_on(self, num_instructions: int) -> bool:
        """Whether beam search runs on a pipeline of this many instructions."""
        return self.beam_width > 0 and num_instructions <= self.beam_max_nodes

    def lp_runs_on(self, num_instructions: int) -> bool:
        """Whether the hull LP (rather than the price sweep) guides a pipeline of this size."""
        return num_instructions <= self.lp_max_nodes

    def flow_runs_on(self, num_instructions: int) -> bool:
        """Whether the hull LP is solved by network simplex on its dual (rather than HiGHS)."""
        return self.flow_min_nodes < num_instructions <= self.lp_max_nodes

    def compiled_runs_on(self, num_instructions: int) -> bool:
        """Whether the repair runs compiled (numba, ``planner.compiled_repair``): above
        ``flow_min_nodes``, where numba is loaded for the LP anyway (its first call costs more
        than a small pipeline's whole repair)."""
        return self.flow_min_nodes < num_instructions

    def anchors_for(self, num_instructions: int) -> int:
        """How many LP anchors (or sweep prices) on a pipeline of this size."""
        fitting = self.anchor_cells // max(num_instructions, 1)
        return min(self.num_anchors, max(fitting, self.min_anchors))

    def deadlines_for(self, num_instructions: int) -> int:
        """How many deadlines are repaired on a pipeline of this size (scale-aware density)."""
        fitting = self.deadline_cells // max(num_instructions, 1)
        return min(self.num_deadlines, max(fitting, self.min_deadlines))

    def batch_rows(self, num_instructions: int) -> int:
        """Plans per numpy batch on a pipeline of this size (at least one)."""
        return max(1, self.batch_cells // max(num_instructions, 1))


__all__ = ["PlannerOptions"]
