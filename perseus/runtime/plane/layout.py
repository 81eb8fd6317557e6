"""Where a rank's control-plane peers are: the job's own grid, found through the job's own store.

A job is a grid of ranks: ``dp_size`` data-parallel replicas × ``num_stages`` pipeline stages ×
``tp_size`` tensor-parallel ranks (megatron-core folds context parallelism into the last). The
adapters already know each rank's coordinates (``PipelineJob``). The hierarchical control plane
(``perseus.runtime.plane.hierarchy``) talks only along the grid's three axes, so a rank needs the global
ranks of just ``tp_size + num_stages + dp_size`` peers, never a table of the whole job.

Each rank publishes its global rank under its coordinates in the store every torch.distributed
job already has (its rendezvous store), then reads the keys of its own axes: O(tp + stages + dp)
store reads per rank, whatever the framework's rank order is (megatron-core's ``tp-cp-ep-dp-pp``,
DeepSpeed's topology, a device mesh).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from perseus.errors import ConfigError

AXES = ("tp", "pp", "dp")  # the order every rank reduces and fans out in


@dataclass(frozen=True)
class Coordinates:
    """A rank's place in the grid."""

    dp: int
    stage: int
    tp: int

    def key(self) -> str:
        return f"{self.dp}/{self.stage}/{self.tp}"


@dataclass(frozen=True)
class GridShape:
    dp: int
    pp: int
    tp: int

    @property
    def ranks(self) -> int:
        return self.dp * self.pp * self.tp

    def along(self, axis: str, me: Coordinates) -> list[Coordinates]:
        """The coordinates of ``me``'s peers along ``axis``, ordered by that axis (``me`` included)."""
        if axis == "tp":
            return [Coordinates(me.dp, me.stage, t) for t in range(self.tp)]
        if axis == "pp":
            return [Coordinates(me.dp, s, me.tp) for s in range(self.pp)]
        if axis == "dp":
            return [Coordinates(d, me.stage, me.tp) for d in range(self.dp)]
        raise ValueError(f"unknown axis {axis!r}")

    def index(self, axis: str, me: Coordinates) -> int:
        return {"tp": me.tp, "pp": me.stage, "dp": me.dp}[axis]


@dataclass(frozen=True)
class AxisPeers:
    """The global ranks along each axis (ordered by the axis coordinate) and this rank's index."""

    shape: GridShape
    me: Coordinates
    ranks: dict[str, tuple[int, ...]]

    def index(self, axis: str) -> int:
        return self.shape.index(axis, self.me)

    def peer_count(self) -> int:
        """Distinct other ranks this rank talks to."""
        mine = self.ranks["tp"][self.index("tp")]
        return len({r for axis in AXES for r in self.ranks[axis]} - {mine})


def exchange_peers(store: Any, shape: GridShape, me: Coordinates, global_rank: int, timeout_s: float) -> AxisPeers:
    """Publish ``global_rank`` under ``me`` and read the axis peers' (every rank of the job calls
    this with a store no earlier run of this exchange used: the caller's prefix). Two ranks that
    claim the same coordinates are a ``ConfigError``: the adapter's job description is wrong."""
    claimed = store.compare_set(f"at/{me.key()}", "", str(global_rank))
    claimed = claimed.decode() if isinstance(claimed, bytes) else str(claimed)
    if claimed != str(global_rank):
        raise ConfigError(
            f"perseus: ranks {claimed} and {global_rank} both say they are data-parallel replica {me.dp}, stage "
            f"{me.stage}, tensor-parallel rank {me.tp}; the job description (PipelineJob dp_rank/stage/tp_rank) "
            "is wrong: set control_plane='flat' or fix the adapter's job")
    ranks: dict[str, tuple[int, ...]] = {}
    wanted = {axis: shape.along(axis, me) for axis in AXES}
    keys = sorted({f"at/{c.key()}" for coords in wanted.values() for c in coords})
    store.wait(keys, timedelta(seconds=timeout_s))
    found = {k: int(_text(store.get(k))) for k in keys}
    for axis, coords in wanted.items():
        ranks[axis] = tuple(found[f"at/{c.key()}"] for c in coords)
    return AxisPeers(shape, me, ranks)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
