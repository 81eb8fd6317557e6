"""What megatron-core's interleaved 1F1B waits for, read off its point-to-point exchanges.

A model of ``forward_backward_pipelining_with_interleaving``, written from megatron-core 0.19's
``schedules.py`` (0.16.1's exchanges are the same), with and without ``overlap_p2p_comm``.
Without overlap every stage alternates compute with blocking exchanges (``send_forward_recv_forward``,
``send_forward_backward_recv_forward_backward``, ``send_backward_recv_backward``). With overlap
the warm-up and cool-down exchanges stay blocking (the warm-up's last one receives only the next
forward's input and posts the first backward's receive), and in the steady state the schedule
posts a send and a receive after each forward and each backward (``pp_post_forward``,
``pp_post_backward``) and waits for the oldest posted receive of a kind just before computing one
of that kind (``pp_pre_forward``, ``pp_pre_backward``). Which tensors are sent and received
follows megatron's own rules (``recv_tensor_from_previous_stage``: the first stage's forward
receives, and the last stage's backward receives, are aligned with the other end of the ring,
``pipeline size - 1`` virtual microbatches behind; nothing is sent past the first or last virtual
stage). Tensors on each directed link are matched first-in first-out, as NCCL/gloo point-to-point
is; sends are taken to complete without waiting for the receiver.

From that: the compute after an exchange (or after a wait on a posted receive) waits for every
instruction whose output it receives, and an output leaves its stage at the exchange or post after
it, that is after every instruction computed before it. The test compares these waits with the
planner's DAG.
"""

from __future__ import annotations

from typing import Callable

from perseus.schedules.orders import _interleaved_table, interleaved_warmup

Node = tuple[int, int]  # (stage, index in the stage's order)


def megatron_waits(pp: int, chunks: int, microbatches: int, group: int, overlap: bool = False) -> dict[Node, set[Node]]:
    """For every instruction that follows an exchange: the instructions (on other stages) it waits for."""
    table = _interleaved_table(microbatches, chunks, group)
    total = microbatches * chunks

    def chunk_of(k: int, forward: bool) -> int:
        c = table[k % total][1]
        return c if forward else chunks - 1 - c

    def receives(stage: int, k: int, forward: bool) -> bool:
        """megatron's ``recv_tensor_from_previous_stage(k, forward)``."""
        if stage != (0 if forward else pp - 1):
            return True
        if k < pp - 1:
            return False
        return chunk_of(k - (pp - 1), forward) != (chunks - 1 if forward else 0)

    # Per stage: ("compute", index); ("exchange", sends, receives): blocking; ("post", sends,
    # receives): non-blocking, its receives queued per link; ("wait", link): the oldest queued
    # receive of that link, if any. Links: "f" (activations) and "b" (gradients).
    programs = []
    for r in range(pp):
        def first_virtual(c: int, r: int = r) -> bool:
            return r == 0 and c == 0

        def last_virtual(c: int, r: int = r) -> bool:
            return r == pp - 1 and c == chunks - 1

        warmup = interleaved_warmup(r, pp, chunks, group)
        all_warmup = warmup >= total
        warmup = min(warmup, total)
        steady = total - warmup
        prog: list[tuple] = [("exchange", [], [] if r == 0 else ["f"])]
        index = 0
        for k in range(warmup):
            prog.append(("compute", index))
            index += 1
            recv = ["f"] if receives(r, k, True) and k != total - 1 else []
            sends = [] if last_virtual(chunk_of(k, True)) else ["f"]
            last_warmup = k == warmup - 1 and not all_warmup
            if last_warmup and not overlap and r != pp - 1:
                recv.append("b")
            prog.append(("exchange", sends, recv))
            if last_warmup and overlap:
                prog.append(("post", [], [] if r == pp - 1 else ["b"]))
        for k in range(steady):
            f_sends = [] if last_virtual(chunk_of(k + warmup, True)) else ["f"]
            f_recv = ["f"] if receives(r, k + warmup, True) and k != steady - 1 else []
            b_sends = [] if first_virtual(chunk_of(k, False)) else ["b"]
            b_recv = ["b"] if receives(r, k, False) else []
            if overlap:
                if not first_virtual(chunk_of(k + warmup, True)):
                    prog.append(("wait", "f"))
                prog += [("compute", index), ("post", f_sends, f_recv)]
                if not last_virtual(chunk_of(k, False)):
                    prog.append(("wait", "b"))
                prog += [("compute", index + 1), ("post", b_sends, b_recv)]
            else:
                prog += [("compute", index), ("compute", index + 1), ("exchange", f_sends + b_sends, f_recv + b_recv)]
            index += 2
        if all_warmup:
            prog.append(("exchange", [], [] if r == pp - 1 else ["b"]))
        for k in range(steady, total):
            if overlap and not last_virtual(chunk_of(k, False)) and k != 0:
                prog.append(("wait", "b"))
            prog.append(("compute", index))
            index += 1
            recv = ["b"] if receives(r, k, False) and k != total - 1 else []
            prog.append(("exchange", [] if first_virtual(chunk_of(k, False)) else ["b"], recv))
        programs.append(prog)

    def peer(stage: int, link: str, sending: bool) -> int:
        return (stage + (1 if (link == "f") == sending else -1)) % pp

    sent: dict[tuple[int, int, str], list[Node]] = {}
    for r, prog in enumerate(programs):
        last: Node | None = None
        for op in prog:
            if op[0] == "compute":
                last = (r, op[1])
            elif op[0] in ("exchange", "post"):
                for link in op[1]:
                    assert last is not None
                    sent.setdefault((r, peer(r, link, True), link), []).append(last)
    waits: dict[Node, set[Node]] = {}
    taken: dict[tuple[int, int, str], int] = {}
    for r, prog in enumerate(programs):
        pending: set[Node] = set()
        posted: dict[str, list[Node]] = {"f": [], "b": []}
        for op in prog:
            if op[0] in ("exchange", "post"):
                for link in op[2]:
                    channel = (peer(r, link, False), r, link)
                    n = taken.get(channel, 0)
                    taken[channel] = n + 1
                    (pending.add if op[0] == "exchange" else posted[link].append)(sent[channel][n])
            elif op[0] == "wait":
                if posted[op[1]]:
                    pending.add(posted[op[1]].pop(0))
            else:
                if pending:
                    waits.setdefault((r, op[1]), set()).update(pending)
                pending = set()
        assert not pending, f"stage {r} receives after its last instruction"
        assert not any(posted.values()), f"stage {r} posts a receive it never waits for"
    assert taken == {c: len(v) for c, v in sent.items()}, "every tensor sent is received exactly once"
    return waits


def reaches(stage_sizes: list[int], edges) -> Callable[[Node, Node], bool]:
    """``reaches(u, v)``: a path of ``edges`` leads from node u to node v (or u is v)."""
    offsets = [0]
    for n in stage_sizes:
        offsets.append(offsets[-1] + n)
    preds: dict[int, list[int]] = {}
    for (us, ui), (vs, vi) in edges:
        preds.setdefault(offsets[vs] + vi, []).append(offsets[us] + ui)
    memo: dict[int, int] = {}  # node -> bitset of its ancestors, itself included

    def ancestors(x: int) -> int:
        stack = [x]
        while stack:  # iterative post-order: long pipelines would overflow recursion
            y = stack[-1]
            todo = [p for p in preds.get(y, ()) if p not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            mask = 1 << y
            for p in preds.get(y, ()):
                mask |= memo[p]
            memo[y] = mask
        return memo[x]

    return lambda u, v: bool(ancestors(offsets[v[0]] + v[1]) >> (offsets[u[0]] + u[1]) & 1)
