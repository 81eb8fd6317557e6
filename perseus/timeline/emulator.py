"""Large-scale data-parallel emulation: many pipelines, one straggler, three energy policies.

A job of N GPUs with tensor parallelism T and S pipeline stages runs D = N / (T·S) identical
pipelines that synchronize gradients at the end of every iteration, so the iteration lasts as
long as the slowest pipeline. One pipeline is a straggler, slowed by a factor F against the
all-max-frequency iteration time T_max: the iteration then takes T_s = F · T_max.

Energy of one pipeline that runs a plan of (time t, energy E) and then waits for the gradient
sync: ``E + S · P_blocking · (T_s − t)`` (per TP rank; the job total multiplies by T).

The straggler's slowdown is modelled as extra time its GPUs spend blocked (at P_blocking) on top
of the compute energy of the plan it runs: all-max in policy (1), Perseus's no-slowdown point in
(2) and (3), since Perseus never slows the straggler down further. Policies for the D − 1 other
pipelines:

1. all max frequency everywhere (no Perseus);
2. intrinsic-only Perseus: the no-slowdown frontier point, then blocked until T_s;
3. Perseus with straggler matching: the plan of least energy when paced to T_s (its energy plus
   blocking power over its wait), among the frontier's plans not slower than T_s.

Savings of (2) and (3) are relative to (1). Energies come from the frontier, i.e. simulated on
measured profile values, never from a fitted model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from perseus.store.cache import RunCache
from perseus.errors import ConfigError, FrontierError
from perseus.frontier import Frontier, FrontierPoint
from perseus.profile import Profile
from perseus.schedules import Schedule


@dataclass(frozen=True)
class DataParallelJob:
    """How many identical pipelines run side by side, and how wide each stage is."""

    num_pipelines: int
    num_stages: int
    tensor_parallel: int

    @classmethod
    def from_gpus(cls, num_gpus: int, tensor_parallel: int, num_stages: int) -> DataParallelJob:
        """Split ``num_gpus`` into pipelines of ``num_stages`` × ``tensor_parallel`` GPUs."""
        for name, value in (("GPU count", num_gpus), ("tensor parallel size", tensor_parallel), ("stages", num_stages)):
            if value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value}")
        per_pipeline = tensor_parallel * num_stages
        if num_gpus % per_pipeline:
            raise ConfigError(
                f"{num_gpus} GPUs do not split into pipelines of {num_stages} stages x TP {tensor_parallel} "
                f"({per_pipeline} GPUs each); use a multiple of {per_pipeline} or pass --dp"
            )
        return cls(num_gpus // per_pipeline, num_stages, tensor_parallel)

    @property
    def num_gpus(self) -> int:
        return self.num_pipelines * self.num_stages * self.tensor_parallel


@dataclass(frozen=True)
class EmulationResult:
    """Per-iteration energy of the whole job under the three policies (joules, all GPUs)."""

    job: DataParallelJob
    straggler_factor: float
    baseline_time_s: float  # all-max iteration time of one pipeline
    iteration_time_s: float  # with the straggler
    all_max_j: float
    intrinsic_j: float
    straggler_matched_j: float
    intrinsic_point: FrontierPoint
    matched_point: FrontierPoint

    @property
    def intrinsic_saving(self) -> float:
        """Fraction of policy (1)'s energy that policy (2) saves."""
        return 1.0 - self.intrinsic_j / self.all_max_j

    @property
    def straggler_matched_saving(self) -> float:
        """Fraction of policy (1)'s energy that policy (3) saves."""
        return 1.0 - self.straggler_matched_j / self.all_max_j


def pipeline_energy_j(plan_time_s: float, plan_energy_j: float, iteration_time_s: float, num_stages: int, p_blocking_w: float) -> float:
    """One pipeline (one TP rank per stage) runs a plan, then all its stages block until the sync."""
    return plan_energy_j + num_stages * p_blocking_w * (iteration_time_s - plan_time_s)


def emulate(frontier: Frontier, job: DataParallelJob, straggler_factor: float) -> EmulationResult:
    """Energy of one iteration of ``job`` with one pipeline slowed by ``straggler_factor``."""
    if not straggler_factor >= 1.0:
        raise ConfigError(f"straggler factor must be >= 1.0 (1.0 = no straggler), got {straggler_factor}")
    if job.num_stages != frontier.schedule.num_stages:
        raise FrontierError(
            f"frontier has {frontier.schedule.num_stages} stages but the job has {job.num_stages}"
        )
    stages, p_b = job.num_stages, frontier.p_blocking_w
    base_t, base_e = frontier.baseline_time_s, frontier.baseline_energy_j
    intrinsic = frontier.default_point()
    straggler_time = straggler_factor * base_t
    matched = frontier.paced_lookup(straggler_time)
    # Nothing finishes before its own plan does (a frontier's fastest point can be marginally
    # slower than the all-max baseline when no plan reaches it exactly).
    iteration = max(straggler_time, intrinsic.time_s, matched.time_s)

    def energy(t: float, e: float) -> float:
        return pipeline_energy_j(t, e, iteration, stages, p_b)

    others = job.num_pipelines - 1
    all_max = energy(base_t, base_e) * job.num_pipelines
    straggler_perseus = energy(intrinsic.time_s, intrinsic.energy_j)
    intrinsic_total = straggler_perseus + others * energy(intrinsic.time_s, intrinsic.energy_j)
    matched_total = straggler_perseus + others * energy(matched.time_s, matched.energy_j)
    tp = job.tensor_parallel
    return EmulationResult(
        job=job,
        straggler_factor=straggler_factor,
        baseline_time_s=base_t,
        iteration_time_s=iteration,
        all_max_j=tp * all_max,
        intrinsic_j=tp * intrinsic_total,
        straggler_matched_j=tp * matched_total,
        intrinsic_point=intrinsic,
        matched_point=matched,
    )


# ---------------------------------------------------------------- sweep


@dataclass(frozen=True)
class SweepRow:
    """Emulation results of one microbatch count over all straggler factors."""

    microbatches: int
    frontier: Frontier
    results: tuple[EmulationResult, ...]


def sweep(
    frontier_for: Callable[[int], Frontier],
    microbatches: Sequence[int],
    straggler_factors: Sequence[float],
    num_gpus: int | None,
    tensor_parallel: int,
    num_stages: int,
    num_pipelines: int | None = None,
) -> list[SweepRow]:
    """Emulate every (microbatch count, straggler factor); one frontier per microbatch count."""
    if num_pipelines is not None:
        job = DataParallelJob.from_gpus(num_pipelines * tensor_parallel * num_stages, tensor_parallel, num_stages)
    elif num_gpus is not None:
        job = DataParallelJob.from_gpus(num_gpus, tensor_parallel, num_stages)
    else:
        raise ConfigError("give the job size: number of GPUs (--gpus) or data-parallel degree (--dp)")
    rows = []
    for m in microbatches:
        frontier = frontier_for(m)
        rows.append(SweepRow(m, frontier, tuple(emulate(frontier, job, f) for f in straggler_factors)))
    return rows


def emulation_cache(cache_dir: Path, schedule: Schedule, profile: Profile) -> RunCache:
    """The cache entry of one schedule planned on one profile (its values and P_blocking).

    The same cache as the runtime's, so an entry planned under an older model of the schedule's
    dependencies is planned again rather than served stale.
    """
    digest = hashlib.sha256(json.dumps(profile.to_json_dict(), sort_keys=True).encode()).hexdigest()
    key = {"use": "perseus emulate", "schedule": schedule.name, "stages": schedule.num_stages,
           "microbatches": schedule.num_microbatches, "chunks": schedule.num_chunks, "profile_sha256": digest}
    key.update(schedule.variant_fields())  # only what is not the default: older entries keep their keys
    return RunCache(cache_dir, key)


def frontier_cache_path(cache_dir: Path, schedule: Schedule, profile: Profile) -> Path:
    """Where ``cached_frontier`` keeps the frontier of ``schedule`` planned on ``profile``."""
    return emulation_cache(cache_dir, schedule, profile).frontier_path


def cached_frontier(
    schedule: Schedule,
    profile: Profile,
    plan: Callable[[Schedule, Profile], Frontier],
    cache_dir: Path | None,
) -> Frontier:
    """Plan, or reuse the frontier a previous run saved for the same schedule and profile."""
    if cache_dir is None:
        return plan(schedule, profile)
    cache = emulation_cache(cache_dir, schedule, profile)
    frontier = cache.load_frontier(schedule)
    if frontier is None:
        frontier = plan(schedule, profile)
        cache.save_frontier(frontier)
    return frontier
