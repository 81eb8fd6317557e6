"""Where the plan comes from: a provided frontier or profile, else the cache, else profiling.

Rank 0 resolves the sources (it alone reads files and owns the cache); every rank learns the
outcome, so all of them take the same path after warm-up. A frontier found there reaches each
rank as its own stage's slice only (``stage_plan.distribute``); rank 0 keeps only its own slice
too once it has sent the others theirs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from perseus.errors import ConfigError, PerseusError
from perseus.frontier import Frontier, load_frontier
from perseus.profile import Profile, load_profile
from perseus.profile.model import SwitchLatency
from perseus.store.cache import RunCache
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import PerseusConfig
from perseus.runtime.job import PipelineJob
from perseus.runtime.supply.fingerprint import KEY_VERSION
from perseus.planner.stage_plan import StagePlan, distribute, slices_of
from perseus.schedules import Schedule

if TYPE_CHECKING:
    from perseus.runtime.port.gpu_port import GPUPort

log = logging.getLogger("perseus.runtime")


def stage_models(collective: Collective, job: PipelineJob) -> dict[str, str] | None:
    """Collective: every stage's model fingerprint (``PipelineJob.stage_fingerprint``) on rank 0,
    ``{"<stage>": digest}``; None on the other ranks. The ranks of one stage (tensor-, context-,
    data-parallel) normally agree; if they do not, the stage's entry covers all of theirs."""
    gathered = collective.gather_to_root((int(job.stage), str(job.stage_fingerprint)))
    if gathered is None:
        return None
    per_stage: dict[int, set[str]] = {}
    for stage, fingerprint in gathered:
        if fingerprint:
            per_stage.setdefault(stage, set()).add(fingerprint)
    return {str(stage): "+".join(sorted(fps)) for stage, fps in sorted(per_stage.items())}


def stage_gpus(collective: Collective, job: PipelineJob, gpu: GPUPort) -> dict[str, list[dict[str, Any]]] | None:
    """Collective: every stage's GPU settings (``GPUPort.key_settings``: name, power limit, memory
    clock) on rank 0, ``{"<stage>": [settings, ...]}`` (the distinct ones of its ranks); None on
    the other ranks. Every rank's, not rank 0's only: a power limit lowered on one node slows that
    stage alone, and its profile with it."""
    gathered = collective.gather_to_root((int(job.stage), gpu.key_settings()))
    if gathered is None:
        return None
    per_stage: dict[int, dict[str, dict[str, Any]]] = {}
    for stage, settings in gathered:
        per_stage.setdefault(stage, {})[json.dumps(settings, sort_keys=True)] = dict(settings)
    return {str(stage): [found[k] for k in sorted(found)] for stage, found in sorted(per_stage.items())}


def software_versions() -> dict[str, str | None]:
    """The torch, CUDA and NCCL versions the job runs on (new kernels and collectives change an
    instruction's time). CUDA's and NCCL's only where CUDA is available; None where absent. Rank
    0's: the ranks of one job run one software stack (their collectives assume it)."""
    versions: dict[str, str | None] = {"torch_version": None, "cuda_version": None, "nccl_version": None}
    try:
        import torch  # already imported by the runtime's collectives: no start-up cost
    except ImportError:
        return versions
    versions["torch_version"] = str(getattr(torch, "__version__", None) or "unknown")
    try:
        if not torch.cuda.is_available():
            return versions
        cuda = torch.version.cuda
        versions["cuda_version"] = None if cuda is None else str(cuda)
        nccl: Any = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a torch that cannot tell costs a key field, not the run
        return versions
    versions["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, (tuple, list)) else str(nccl)
    return versions


def cache_key(job: PipelineJob, schedule: Schedule, gpu_name: str, driver_version: str,
              config: PerseusConfig, stages: Mapping[str, str] | None = None,
              gpus: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything that determines a profile and its frontier (docs/runtime.md, Cache): the model
    (``job.model_config`` and every stage's parameters, ``stages`` from ``stage_models``), the
    schedule, the GPU (rank 0's name and driver; every stage's power limit and memory clock,
    ``gpus`` from ``stage_gpus``), the software (``software_versions``) and the swept clocks.
    ``key_version`` is the layout's (``fingerprint.KEY_VERSION``)."""
    c = config
    key = {
        "key_version": KEY_VERSION,
        "model": dict(job.model_config),
        "schedule": schedule.name,
        "stages": schedule.num_stages,
        "microbatches": schedule.num_microbatches,
        "chunks": schedule.num_chunks,
        "tp_size": job.tp_size,
        "dp_size": job.dp_size,  # data-parallel gradient reduction overlaps the last backwards
        "gpu_name": gpu_name,
        "driver_version": driver_version,
        **software_versions(),
        "sweep": [c.freq_min_mhz, c.freq_max_mhz, c.freq_step_mhz, c.freq_every_k],
    }
    if stages:
        key["stage_models"] = dict(stages)
    if gpus:
        key["stage_gpus"] = {str(k): v for k, v in gpus.items()}
    key.update(schedule.variant_fields())  # only what is not the default: existing caches keep their keys
    return key


def save_quietly(what: str, save: Callable[[Any], Any], obj: Any) -> None:
    """Cache writes are atomic (the old file or none stays); a full disk costs the cache, not the run."""
    try:
        log_saved(what, save(obj), None)
    except OSError as exc:
        log_saved(what, None, exc.strerror or str(exc))


def log_saved(what: str, path: object, error: str | None) -> None:
    """One line for a cache write, by the trainer (profile) or the planner process (frontier)."""
    if error is None:
        log.info("perseus: %s saved to %s", what, path)
    else:
        log.warning("perseus: could not save the %s to the cache (%s); training continues, the next run %s again",
                    what, error, "profiles" if what == "profile" else "plans")


def open_cache(config: PerseusConfig, key: dict[str, Any]) -> RunCache | None:
    return RunCache(config.cache_dir, key) if config.cache_dir else None


@dataclass(frozen=True)
class Sources:
    """What this rank starts from. ``profile`` is rank 0's only; ``have_profile`` is everyone's;
    ``plan`` is this rank's stage of a provided or cached frontier; ``switch_latency`` the
    profile's measured one, everyone's (each rank's GPU timeline leads by it)."""

    plan: StagePlan | None = None
    profile: Profile | None = None
    have_profile: bool = False
    origin: str | None = None
    received_bytes: int = 0
    switch_latency: SwitchLatency | None = None


def share_sources(
    collective: Collective, config: PerseusConfig, schedule: Schedule, stage: int, cache: RunCache | None,
    timing: bool = False,
) -> Sources:
    """Collective: rank 0 finds a provided or cached frontier/profile; every rank learns the
    outcome and receives its stage's plan. A bad provided file is a ``ConfigError`` on every rank.
    ``timing``: the plan carries its planned timeline when rank 0 has the profile (switch latency hiding)."""
    status: dict[str, Any] = {"error": None, "frontier": False, "profile": False, "origin": None}
    profile: Profile | None = None
    frontier: Frontier | None = None
    if collective.is_root:
        try:
            found, frontier, profile = _root_sources(config, schedule, cache)
            status.update(found, frontier=frontier is not None,
                          switch_latency=profile.switch_latency if profile is not None else None)
        except PerseusError as exc:
            status["error"] = str(exc)
    status = collective.broadcast_object(status)
    if status["error"]:
        raise ConfigError(status["error"])
    latency = status.get("switch_latency")
    if not status["frontier"]:
        return Sources(None, profile, status["profile"], status["origin"], switch_latency=latency)
    delivered = distribute(collective, slices_of(frontier, profile if timing else None) if frontier is not None else None,
                           schedule, stage)
    del frontier  # rank 0 keeps its own stage's slice only
    return Sources(delivered.plan, profile, status["profile"], status["origin"], delivered.received_bytes, latency)


def _root_sources(
    config: PerseusConfig, schedule: Schedule, cache: RunCache | None
) -> tuple[dict[str, Any], Frontier | None, Profile | None]:
    c = config
    if c.frontier_path:
        given = load_frontier(c.frontier_path)
        if given.schedule != schedule:
            raise ConfigError(
                f"{c.frontier_path}: frontier is for {given.schedule.describe()}, but this job runs "
                f"{schedule.describe()}; plan for this job"
            )
        # with a profile given too, the plan carries its planned timeline (GPU-time requests)
        profile = load_profile(c.profile_path, c.p_blocking_w) if c.profile_path else None
        return {"origin": f"frontier {c.frontier_path}"}, given, profile
    if c.profile_path:
        profile = load_profile(c.profile_path, c.p_blocking_w)
        profile.check_matches(schedule)
        return {"profile": True, "origin": f"profile {c.profile_path}"}, None, profile
    if cache is None:
        return {}, None, None
    out: dict[str, Any] = {}
    frontier: Frontier | None = None
    if c.mode.plans:
        frontier = cache.load_frontier(schedule)
        if frontier is not None:
            out["origin"] = f"cached frontier {cache.frontier_path}"
    profile = cache.load_profile()
    if profile is not None:
        out["profile"] = True
        out.setdefault("origin", f"cached profile {cache.profile_path}")
    return out, frontier, profile
