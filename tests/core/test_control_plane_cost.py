"""``perseus emulate``'s control-plane counts are the hierarchy's, counted on the grid itself."""

from __future__ import annotations

import itertools

import pytest

from perseus.runtime.plane.layout import AXES, AxisPeers, Coordinates, GridShape
from perseus.timeline.control_plane_cost import ControlPlaneCost


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (2, 2, 2), (4, 3, 1), (3, 1, 4), (5, 4, 2)])
def test_counts_match_the_grid(dp, pp, tp):
    shape = GridShape(dp, pp, tp)
    rank_of = {c: i for i, c in enumerate(Coordinates(d, s, t) for d, s, t in itertools.product(range(dp), range(pp), range(tp)))}
    pairs = set()
    for me, r in rank_of.items():
        peers = AxisPeers(shape, me, {axis: tuple(rank_of[c] for c in shape.along(axis, me)) for axis in AXES})
        cost = ControlPlaneCost(dp, pp, tp)
        assert peers.peer_count() == cost.peers
        pairs |= {frozenset((r, p)) for axis in AXES for p in peers.ranks[axis] if p != r}
    assert len(pairs) == cost.connections
    assert cost.flat_connections == len(list(itertools.combinations(range(dp * pp * tp), 2)))
    # rank 0 sends one slice to each other stage's leader and its own stage's to its replicas and TP ranks
    assert cost.root_plan_copies == (pp - 1) + (dp - 1) + (tp - 1)


def test_at_8192_gpus_a_rank_talks_to_dozens_not_thousands():
    cost = ControlPlaneCost(64, 16, 8)
    assert cost.ranks == 8192 and cost.peers == 85 and cost.flat_peers == 8191
