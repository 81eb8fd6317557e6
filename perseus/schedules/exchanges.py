"""What megatron-core's interleaved 1F1B really makes each instruction wait for.

Models ``forward_backward_pipelining_with_interleaving`` as written in megatron-core 0.16.1
through 0.19.0 ``pipeline_parallel/schedules.py`` (unchanged there), with and without
``overlap_p2p_comm``.

Without p2p overlap (megatron-core's default) every stage alternates compute with one blocking
exchange: before its first forward, after each warm-up forward, after each steady forward/backward
pair (``send_forward_backward_recv_forward_backward``) and after each cool-down backward. The
data flow alone misses two of the waits this creates, and a plan that uses that slack runs slower
than planned:

- an output leaves its stage only at the exchange after it: a steady forward's activation is sent
  after the backward paired with it, so its consumer waits for that backward too;
- an exchange receives the inputs of the instructions up to the next exchange (the next forward
  and, at a pair, its backward: the "joint receives").

With ``overlap_p2p_comm`` (Megatron-LM's default for interleaved runs) warm-up and cool-down keep
their blocking exchanges, but in the steady state each forward and each backward posts its send
(and the receive for the next instruction of its kind) right after it runs, and the next forward
(backward) waits for its own receive just before it runs: an output leaves right after its
instruction and nothing waits for another instruction's input. The warm-up's last exchange then
receives only the next forward's input; the first backward's gradient is a posted receive. A
posted ring-wrap receive (below) is waited for by the first instruction of its kind that pops
megatron's receive queue, which with a microbatch group larger than the pipeline can be later than
the instruction after it that this model waits at: stricter than megatron there, never looser
(tests/megatron/test_megatron_dag_edges.py checks both directions against a model of the exchanges).

Either way the first (last) stage receives the activations (gradients) coming round from the other
end of the ring ``pipeline size`` virtual microbatches after the sender's own index (megatron's
``recv_tensor_from_previous_stage``), which is earlier than the instruction that needs them when
the microbatch group is larger than the pipeline.

megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``) runs the same exchanges around
fused units: a steady step is one forward+backward unit, so the exchange after it sends both its
outputs and the one before it receives both its inputs, which is the pair and joint-receive rule
with the pair as one node (no ``joint_receives``; a fused unit counts as a forward and a backward).

Everything is read off the schedule data: per-stage orders, the steady pairs
(``Schedule.joint_receives``) and ``Schedule.overlap_p2p``. Tensors are identified by their place
in the order (the j-th forward of every stage runs the same virtual microbatch); on each link they
arrive in the order sent, as NCCL/gloo point-to-point delivers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus.schedules.model import Schedule

Node = tuple[int, int]  # (stage, index in the stage's order)


def megatron_interleaved_waits(schedule: Schedule) -> list[tuple[Node, Node]]:
    """Cross-stage edges ``(release, waiter)``: ``waiter`` cannot start before ``release`` ends.

    ``release`` is the instruction whose end the sender's exchange follows; ``waiter`` is the
    first instruction after the receiver's exchange. Program order is not included.
    """
    pp = schedule.num_stages
    # Overlapped exchanges pair nothing: each output is sent, and each input waited for, at its own instruction.
    paired = bool(schedule.joint_receives) and not schedule.overlap_p2p
    pairs = [dict(p) for p in schedule.joint_receives] if paired else [{} for _ in range(pp)]
    # (index, chunk) of every forward and every backward, a fused unit's parts included
    forwards = [[(i, p.chunk) for i, inst in enumerate(order) for p in inst.parts() if p.kind == "forward"]
                for order in schedule.stages]
    backwards = [[(i, p.chunk) for i, inst in enumerate(order) for p in inst.parts() if p.kind == "backward"]
                 for order in schedule.stages]
    paired_backward = [{j for j in p.values()} for p in pairs]

    def release(stage: int, index: int) -> Node:
        """The instruction after which the exchange sending ``index``'s output runs."""
        return stage, pairs[stage].get(index, index)

    def after_exchange(stage: int, index: int) -> Node:
        """First instruction after the exchange that receives ``index``'s input."""
        return stage, index - 1 if index in paired_backward[stage] else index

    edges: list[tuple[Node, Node]] = []
    for r in range(pp):
        for j, (q, _) in enumerate(forwards[r]):
            if r > 0:
                edges.append((release(r - 1, forwards[r - 1][j][0]), after_exchange(r, q)))
            elif j >= pp:  # the first stage: what the last stage sent pp virtual microbatches earlier
                p, chunk = forwards[pp - 1][j - pp]
                if chunk < schedule.num_chunks - 1:
                    edges.append((release(pp - 1, p), after_exchange(r, q)))
        for j, (q, _) in enumerate(backwards[r]):
            if r < pp - 1:
                edges.append((release(r + 1, backwards[r + 1][j][0]), after_exchange(r, q)))
            elif j >= pp:  # the last stage: what the first stage sent pp virtual microbatches earlier
                p, chunk = backwards[0][j - pp]
                if chunk > 0:
                    edges.append((release(0, p), after_exchange(r, q)))
    return list(dict.fromkeys(edges))  # a pair's exchange can carry two tensors between the same two
