"""What the runtime's control plane costs a job of a given shape: exact counts, both designs.

The hierarchical plane (``perseus.runtime.plane.hierarchy``) connects a rank to its tensor-parallel
ranks, its pipeline's stages and its stage's replicas; the flat one (one gloo group) to every
rank. gloo connects every pair of a group, so connections and descriptors follow the peer count.
Measured times per check and set-up are in docs/runtime.md (benchmarks/bench_control_plane.py);
``perseus emulate`` prints these counts beside its energy figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControlPlaneCost:
    """Counts for ``pipelines`` × ``stages`` × ``tp`` ranks, hierarchical against flat."""

    pipelines: int
    stages: int
    tp: int

    @property
    def ranks(self) -> int:
        return self.pipelines * self.stages * self.tp

    @property
    def peers(self) -> int:
        """Ranks one rank connects to (hierarchical)."""
        return (self.tp - 1) + (self.stages - 1) + (self.pipelines - 1)

    @property
    def flat_peers(self) -> int:
        return self.ranks - 1

    @property
    def connections(self) -> int:
        """Connections across the job (each pair once), hierarchical."""
        return self.ranks * self.peers // 2

    @property
    def flat_connections(self) -> int:
        return self.ranks * self.flat_peers // 2

    @property
    def root_plan_copies(self) -> int:
        """Stage slices rank 0 sends: one per other stage, and its own stage's to its replicas
        and tensor-parallel ranks (flat: one per other rank)."""
        return (self.stages - 1) + (self.pipelines - 1) + (self.tp - 1)

    @property
    def check_members(self) -> int:
        """Ranks in the job check's widest collective: the replicas (hierarchical, on the control
        thread) against the whole job (flat, on the training thread)."""
        return self.pipelines


def describe(cost: ControlPlaneCost) -> str:
    """Two lines for ``perseus emulate``."""
    return (f"  control plane: {cost.peers} peers per rank, {cost.connections:,} connections in the job "
            f"(one world gloo group: {cost.flat_peers:,} and {cost.flat_connections:,}); rank 0 sends "
            f"{cost.root_plan_copies} stage slices (flat: {cost.flat_peers:,})\n"
            f"  job check: reductions within each pipeline, then an all-gather across {cost.check_members} replicas "
            f"on the control thread, its answer used one check later (flat: {cost.ranks:,} ranks, on the training "
            "thread); measured times: docs/runtime.md, Control plane")
