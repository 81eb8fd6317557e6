"""Phase machine transitions and the compact frontier encoding used on the gloo group."""

import pickle

import numpy as np
import pytest

from perseus.frontier import Frontier, FrontierPoint
from perseus.frontier.v1 import encode_v1
from perseus.runtime.plane.collective import Collective, decode_frontier, encode_frontier
from perseus.runtime.config import Mode
from perseus.runtime.phases import ALLOWED, Phase, PhaseMachine, after_warmup
from perseus.schedules import build_schedule


def test_phase_history_and_illegal_transition():
    m = PhaseMachine()
    m.enter(Phase.PROFILING, 2)
    m.enter(Phase.PLANNING, 8)
    m.enter(Phase.DEPLOYED, 9)
    m.enter(Phase.FALLBACK, 12)
    assert m.entered_at(Phase.DEPLOYED) == 9 and m.phase is Phase.FALLBACK
    with pytest.raises(RuntimeError, match="illegal phase change"):
        PhaseMachine().enter(Phase.FALLBACK, 1)


@pytest.mark.parametrize("plan, profile, mode, phase, why", [
    (True, False, "run", Phase.DEPLOYED, None),
    (True, True, "plan", Phase.STEADY, "frontier available; mode 'plan' keeps default clocks"),
    (False, True, "run", Phase.PLANNING, None),
    (False, True, "measure-only", Phase.PLANNING, None),
    (False, True, "profile", Phase.STEADY, "nothing to profile"),
    (False, False, "measure-only", Phase.STEADY, "no frequency sweep"),
    (False, False, "run", Phase.PROFILING, None),
    (False, False, "profile", Phase.PROFILING, None),
])
def test_where_warmup_leads(plan, profile, mode, phase, why):
    got, line = after_warmup(plan, profile, Mode(mode))
    assert got is phase and got in ALLOWED[Phase.WARMUP]
    assert (line is None) if why is None else (why in line)


def test_frontier_encoding_roundtrip_is_compact():
    sched = build_schedule("interleaved", 2, 4, 2)
    n = sched.num_instructions
    pts = [FrontierPoint(1.0 + i / 10, 10.0 - i, np.full(n, 1400 - 15 * i)) for i in range(50)]
    paced = [FrontierPoint(7.0, 4.0, np.full(n, 600))]  # more energy than the 5.9 s point, waits less
    front = Frontier(sched, 70.0, 1.0, 10.0, pts, gpu_name="X", metadata={"cache_key": "abc"}, paced_points=paced)
    data = encode_frontier(front)
    back = decode_frontier(pickle.loads(pickle.dumps(data)))
    assert back.schedule == sched and len(back.points) == 50
    # Every rank must see the paced plans: the straggler policy runs on all of them.
    assert len(back.paced_points) == 1 and back.paced_lookup(7.5).time_s == 7.0 == front.paced_lookup(7.5).time_s
    assert back.stage_plan(back.points[7], 1) == front.stage_plan(front.points[7], 1)
    assert back.lookup(1.25).energy_j == front.lookup(1.25).energy_j
    assert len(pickle.dumps(data)) < len(str(encode_v1(front))) / 4


def test_a_version_1_document_decodes_too():
    sched = build_schedule("1f1b", 2, 4)
    n = sched.num_instructions
    front = Frontier(sched, 70.0, 1.0, 10.0, [FrontierPoint(1.0, 10.0, np.arange(n) + 1000)], gpu_name="X")
    back = decode_frontier(pickle.loads(pickle.dumps(encode_v1(front))))
    assert back.schedule == sched and np.array_equal(back.points[0].freqs_mhz, front.points[0].freqs_mhz)


def test_collective_without_torch_distributed_is_local():
    c = Collective()
    assert not c.distributed and c.is_root
    assert c.broadcast_int(3) == 3 and c.all_true(False) is False
    assert c.gather_to_root("x") == ["x"] and c.all_gather_floats([1.0]) == [[1.0]]
