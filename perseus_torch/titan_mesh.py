"""Where a TorchTitan rank sits in Perseus's job: its pipeline stage, data-parallel pipeline and
tensor-parallel group, from TorchTitan's parallel degrees.

Why arithmetic rather than the device meshes: TorchTitan builds every mesh by unflattening one
world mesh whose dimensions are, outermost first, ``pp``, ``batch`` (``dp_replicate`` ×
``dp_shard``), ``cp``, ``tp`` (``ParallelDims.build_mesh``), so a rank's coordinates follow from
its rank and the degrees, the same on every rank, without a collective or a mesh object.

The mapping:

- pipeline stage = the ``pp`` coordinate, ``pp`` stages;
- data-parallel pipelines = the ``batch`` coordinate: every DDP replica and every FSDP shard reads
  its own data and runs the whole pipeline schedule, so each is a pipeline of its own
  (``dp_size = dp_replicate × dp_shard``); FSDP's all-gathers and reduce-scatters run inside the
  instructions and between steps, as a replica's gradient all-reduce does;
- tensor-parallel group = ``cp × tp``: context-parallel and tensor-parallel ranks run the same
  instructions on parts of one microbatch, in lock-step with collectives inside each, which is
  what Perseus's tensor-parallel ranks are (``tp_rank = cp_rank × tp + tp_rank``);
- expert parallelism borrows ranks from ``dp_shard × cp × tp``: its all-to-alls run inside the
  instructions and it adds no dimension.

Refused, one line each: no pipeline parallelism (Perseus clocks TorchTitan's pipeline schedule, and
without ``pp`` there is none) and degrees that do not multiply to the world size.
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus.errors import ConfigError


@dataclass(frozen=True)
class TitanDegrees:
    """TorchTitan's parallel degrees as ``ParallelDims`` resolved them (``dp_shard`` no longer -1)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    world_size: int

    @classmethod
    def of(cls, parallel_dims: object) -> TitanDegrees:
        """From TorchTitan's ``ParallelDims`` (read by attribute: nothing of TorchTitan is imported)."""
        def degree(name: str) -> int:
            return int(getattr(parallel_dims, name))

        return cls(degree("pp"), degree("dp_replicate"), degree("dp_shard"), degree("cp"), degree("tp"),
                   degree("world_size"))


@dataclass(frozen=True)
class MeshPosition:
    """This rank's place in Perseus's job (``PipelineJob``'s fields of the same names)."""

    stage: int
    num_stages: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int


def mesh_position(rank: int, degrees: TitanDegrees) -> MeshPosition:
    """``rank``'s stage, data-parallel pipeline and tensor-parallel index (module docstring), or a
    one-line ``ConfigError`` where Perseus cannot follow the job."""
    d = degrees
    if d.pp < 2:
        raise ConfigError("perseus_torch.torchtitan: pipeline_parallel_degree is 1, so TorchTitan runs no pipeline "
                          "schedule for Perseus to clock; set --parallelism.pipeline_parallel_degree 2 or more, or "
                          "leave Perseus out (--perseus.enabled False)")
    batch, group = d.dp_replicate * d.dp_shard, d.cp * d.tp
    if min(d.dp_replicate, d.dp_shard, d.cp, d.tp) < 1 or d.pp * batch * group != d.world_size:
        raise ConfigError(f"perseus_torch.torchtitan: pp {d.pp} × dp_replicate {d.dp_replicate} × dp_shard "
                          f"{d.dp_shard} × cp {d.cp} × tp {d.tp} is not the world size {d.world_size}; give "
                          "TorchTitan's resolved degrees (ParallelDims after its checks)")
    if not 0 <= rank < d.world_size:
        raise ConfigError(f"perseus_torch.torchtitan: rank {rank} is outside the world of {d.world_size} ranks")
    stage, rest = divmod(rank, batch * group)
    dp_rank, tp_rank = divmod(rest, group)
    return MeshPosition(stage, d.pp, dp_rank, batch, tp_rank, group)
