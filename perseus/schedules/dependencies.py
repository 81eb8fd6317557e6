"""The dependency edges of a schedule: program order, cross-stage data flow, and megatron-core's
exchanges where they wait for more (``exchanges``). The DAG (``dag``) is built from them.
"""

from __future__ import annotations

from perseus.schedules.exchanges import megatron_interleaved_waits
from perseus.schedules.model import Instruction, Schedule

# Bumped whenever the dependency rules change (2: interleaved joint receives; 3: none on a stage
# whose microbatches are all in warm-up; 4: zero-bubble kinds and placements; 5: megatron-core's
# interleaved exchanges in full, perseus/schedules/exchanges.py; 6: fused forward+backward units), so
# that plans made under older rules are not reused from a cache.
DAG_MODEL_VERSION = 6

# Kinds whose output (an activation gradient) flows to the previous virtual stage.
_GRAD_SENDING = ("backward", "backward_input")
# ((stage, index), (stage, index)): the second instruction waits for the first.
Edge = tuple[tuple[int, int], tuple[int, int]]


def dependencies(schedule: Schedule) -> list[Edge]:
    """Edges ``((stage, index), (stage, index))``: program order plus cross-stage data flow.

    Forward of a microbatch on virtual stage v feeds virtual stage v+1 and backward (or the
    input-gradient part I of a split backward) flows the other way. A weight-gradient part W
    needs its own I. The last virtual stage's backward needing its own forward is implied by
    that stage's program order. An edge between two virtual stages on one rank (ZBV's turn)
    is an ordinary edge within that stage. With joint receives (megatron-core's interleaved
    exchanges) the cross-stage edges are the exchanges' waits instead, which imply the data
    flow (``perseus.schedules.exchanges.megatron_interleaved_waits``).

    A fused unit (``forward_backward``) is one node doing both its parts: it waits for what its
    forward and its backward wait for, and what either part feeds waits for the whole unit (its
    outputs exist when the unit ends). Data flow inside one unit is no edge.
    """
    position: dict[tuple[int, Instruction], int] = {}
    for s, stage in enumerate(schedule.stages):
        for i, inst in enumerate(stage):
            for part in inst.parts():
                position[(s, part)] = i
    edges: list[Edge] = []
    for s, stage in enumerate(schedule.stages):
        for i in range(1, len(stage)):
            edges.append(((s, i - 1), (s, i)))
    if (schedule.joint_receives or schedule.megatron_exchanges) and schedule.num_stages > 1:
        # megatron-core's blocking exchanges: they imply the data flow and add the waits it misses
        return edges + megatron_interleaved_waits(schedule)
    num_virtual = schedule.num_stages * schedule.num_chunks

    def gradient_step(stage: int, microbatch: int, chunk: int) -> int:
        found = position.get((stage, Instruction("backward", microbatch, chunk)))
        return position[(stage, Instruction("backward_input", microbatch, chunk))] if found is None else found

    flow: list[Edge] = []
    for s, stage in enumerate(schedule.stages):
        for i, unit in enumerate(stage):
            for inst in unit.parts():
                v = schedule.virtual_stage(s, inst.chunk)
                if inst.kind == "forward" and v + 1 < num_virtual:
                    ns, nc = schedule.locate(v + 1)
                    j = position[(ns, Instruction("forward", inst.microbatch, nc))]
                    flow.append(((s, i), (ns, j)))
                elif inst.kind in _GRAD_SENDING and v > 0:
                    ps, pc = schedule.locate(v - 1)
                    flow.append(((s, i), (ps, gradient_step(ps, inst.microbatch, pc))))
                elif inst.kind == "backward_weight":
                    j = position[(s, Instruction("backward_input", inst.microbatch, inst.chunk))]
                    flow.append(((s, j), (s, i)))
    return edges + [edge for edge in dict.fromkeys(flow) if edge[0] != edge[1]]
