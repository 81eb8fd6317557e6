"""``perseus_torch.enable(schedule, stages, config)``: Perseus on a torch.distributed.pipelining job.

One rank is one Perseus pipeline stage (its pipeline-parallel group rank); the torch stages it
holds are its chunks, in ascending torch stage index (docs/torch-pipelining.md). The schedule
object has everything else: the schedule kind (its class), microbatches, pipeline size.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from perseus import versions
from perseus.errors import ConfigError
from perseus.runtime import (Attachment, InstructionListener, PerseusConfig, PipelineJob, entry_point_hooks,
                             stage_fingerprint)
from perseus_torch.compat import schedule_name
from perseus_torch.hooks import install_hooks, resolve_stages

ListenerWrapper = Callable[[InstructionListener], InstructionListener]
RuntimeFactory = Callable[..., Any]


class TorchPerseus(Attachment):
    """Perseus attached to one schedule: the runtime, the hooks that drive it, and shutdown."""


def job_from_schedule(schedule: Any, stages: Any = None, *, dp_rank: int | None = None, dp_size: int | None = None,
                      tp_rank: int = 0, tp_size: int = 1, model_config: Mapping[str, Any] | None = None) -> PipelineJob:
    """This rank's ``PipelineJob``: stage = pipeline rank, chunks = torch stages on this rank.

    Data parallelism is not visible from a pipelining schedule (TorchTitan keeps it in its device
    mesh): pass ``dp_rank``/``dp_size`` when there are several pipelines, and ``tp_rank``/``tp_size``
    when each stage spans several ranks (tensor or context parallel). Left out, there is one
    pipeline, and a world with more ranks than it holds is refused (``data_parallel``).
    """
    name = schedule_name(schedule)
    resolved = resolve_stages(schedule, stages)
    first = resolved[0]
    pp, pp_rank = int(first.group_size), int(first.group_rank)
    rank, world = pp_rank, pp
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - torch is there whenever a schedule is
        pass
    # The job as this rank sees it (rank 0's goes in the cache key). This rank's stage submodules'
    # parameters (names, shapes, dtypes, in torch stage order) are its stage fingerprint, which
    # rank 0 gathers from every rank into the key.
    fingerprint = {
        "framework": "torch.distributed.pipelining",
        "torch_stages": sorted(int(s.stage_index) for s in resolved),
        "num_torch_stages": int(first.num_stages),
    }
    submodules = [s.submod for s in sorted(resolved, key=lambda s: int(s.stage_index))
                  if hasattr(getattr(s, "submod", None), "named_parameters")]
    dp_rank, dp_size = data_parallel(pp, world, dp_rank, dp_size, tp_size)
    return PipelineJob(
        num_stages=pp,
        num_microbatches=int(schedule._n_microbatches),
        stage=pp_rank,
        schedule=name,
        num_chunks=len(resolved),
        dp_rank=dp_rank,
        dp_size=dp_size,
        tp_rank=tp_rank,
        tp_size=tp_size,
        rank=rank,
        world_size=world,
        model_config={**fingerprint, **dict(model_config or {})},
        stage_fingerprint=stage_fingerprint(submodules) if submodules else "",
    )


def data_parallel(pp: int, world: int, dp_rank: int | None, dp_size: int | None, tp_size: int = 1) -> tuple[int, int]:
    """(dp_rank, dp_size) as given, or (0, 1) where one pipeline of ``pp`` stages × ``tp_size`` ranks is
    the whole world: never a silent single pipeline in a world that holds several."""
    if dp_rank is None and dp_size is None:
        if world == pp * tp_size:
            return 0, 1
        raise ConfigError(f"perseus_torch: {world} ranks but one pipeline holds {pp} stages x {tp_size} "
                          "tensor-parallel ranks; pass dp_rank and dp_size (this rank's data-parallel pipeline and how many there are; "
                          "TorchTitan: perseus_torch.torchtitan maps its device mesh)")
    if dp_rank is None or dp_size is None:
        raise ConfigError("perseus_torch: pass dp_rank and dp_size together (this rank's data-parallel pipeline and "
                          "how many there are)")
    if pp * dp_size * tp_size != world:
        raise ConfigError(f"perseus_torch: dp_size {dp_size} x {pp} stages x {tp_size} tensor-parallel ranks is "
                          f"{pp * dp_size * tp_size} ranks, but the world has {world}; give the job's own degrees")
    return dp_rank, dp_size


def _config(config: PerseusConfig | Mapping[str, Any] | None) -> PerseusConfig:
    if config is None:
        return PerseusConfig()
    if isinstance(config, PerseusConfig):
        return config
    if isinstance(config, Mapping):
        return PerseusConfig.from_dict(dict(config))
    raise ConfigError(f"perseus_torch.enable: config must be a PerseusConfig or a mapping, got {type(config).__name__}")


def enable(schedule: Any, stages: Any = None, config: PerseusConfig | Mapping[str, Any] | None = None, *,
           dp_rank: int | None = None, dp_size: int | None = None, tp_rank: int = 0, tp_size: int = 1,
           process_group: Any = None,
           model_config: Mapping[str, Any] | None = None, listener_wrapper: ListenerWrapper | None = None,
           runtime_factory: RuntimeFactory | None = None) -> TorchPerseus:
    """Start Perseus for a pipelining schedule on this rank (call on every rank, after building it).

    Every later ``schedule.step()`` is one Perseus iteration; ``schedule.eval()`` is not reported.
    Returns the handle (``.runtime``, ``.summary()``, ``.close()``); ``close()`` or interpreter
    exit restores default clocks and removes the hooks.
    """
    cfg = _config(config)
    entry_point_hooks(cfg)
    versions.warn_unsupported(versions.TORCH)
    job = job_from_schedule(schedule, stages, dp_rank=dp_rank, dp_size=dp_size, tp_rank=tp_rank, tp_size=tp_size,
                            model_config=model_config)
    if runtime_factory is None:
        from perseus.runtime import PerseusRuntime

        runtime_factory = PerseusRuntime
    runtime = runtime_factory(job, cfg, process_group=process_group)
    handle = TorchPerseus(cfg, job, runtime)
    try:
        listener = listener_wrapper(runtime) if listener_wrapper is not None else runtime
        handle.hooks = install_hooks(schedule, listener, stages)
        handle.on_close(handle.hooks.uninstall)
    except BaseException:
        handle.close()
        raise
    handle.close_at_exit()
    return handle
