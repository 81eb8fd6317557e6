"""megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``) order, derived from its own
code in the 0.16.1, 0.17.1, 0.18.2 and 0.19.0 release archives, equals ``megatron-combined-1f1b``.

The interleaved schedule runs it: ``get_pp_rank_microbatches(..., overlap_moe_expert_parallel_comm=
True)`` (executed from the archive) gives the warm-up count with its extra forward, ``get_schedule_
table`` and ``convert_schedule_table_to_order`` (executed too) the forward/backward order, and the
steady loop (checked in the source text) hands forward ``k + warm-up`` and backward ``k`` to one
``forward_backward_helper_wrapper`` call, which with the flag set is one
``combined_1f1b_schedule_for_interleaved_pipelining``: one fused unit. Warm-up and cool-down call
it with a forward or a backward alone. One stage runs ``combined_1f1b_schedule_for_no_pipelining``
(its loop checked in the text). Running the schedule itself needs CUDA streams (``set_streams``),
so this is the order as the code defines it, not one recorded from a run.
"""

from __future__ import annotations

import re
import tarfile

import pytest

from megatron_lm_archive import clients_dir, load_functions
from perseus.errors import ScheduleError
from perseus.schedules import FUSED, Instruction, build_schedule
from perseus.schedules.dag import InstructionDAG

VERSIONS = ("0.16.1", "0.17.1", "0.18.2", "0.19.0")


def _read(version: str, relative: str) -> str:
    path = clients_dir() / f"megatron-lm-core_v{version}.tar.gz"
    if not path.is_file():
        pytest.skip(f"Megatron-LM {version} archive not found at {path}")
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.split("/", 1)[-1] == relative:
                data = tar.extractfile(member)
                assert data is not None
                return data.read().decode()
    raise FileNotFoundError(f"{relative} is not in the {version} archive")


class _Oracle:
    def __init__(self, version: str) -> None:
        from types import SimpleNamespace

        self.state = SimpleNamespace(pp=1, rank=0, vp=None)
        state = self.state
        parallel_state = SimpleNamespace(
            get_pipeline_model_parallel_world_size=lambda: state.pp,
            get_pipeline_model_parallel_rank=lambda: state.rank,
            get_virtual_pipeline_model_parallel_world_size=lambda: state.vp,
        )
        self.schedules = load_functions(_read(version, "megatron/core/pipeline_parallel/schedules.py"),
                                        {"get_schedule_table", "get_pp_rank_microbatches"},
                                        {"parallel_state": parallel_state})
        self.convert = load_functions(_read(version, "megatron/core/transformer/cuda_graphs.py"),
                                      {"convert_schedule_table_to_order"})["convert_schedule_table_to_order"]

    def combined_order(self, pp: int, stage: int, vp: int, microbatches: int, group: int) -> list[Instruction]:
        self.state.pp, self.state.rank, self.state.vp = pp, stage, vp
        _, _, warmup, remaining = self.schedules["get_pp_rank_microbatches"](
            microbatches, vp, group, False, overlap_moe_expert_parallel_comm=True)
        table = self.schedules["get_schedule_table"](microbatches, vp, group)
        order = self.convert(warmup, vp, table)
        by_chunk = {c: [m for m, tc in table if tc == c] for c in range(vp)}
        seen: dict[int, int] = {}
        plain = []
        for o in order:
            n = seen.get(o, 0)
            seen[o] = n + 1
            if o > 0:
                plain.append(Instruction("forward", by_chunk[o - 1][n], o - 1))
            else:
                plain.append(Instruction("backward", by_chunk[vp + o][n], -o - 1))
        # the steady loop: forward k + warm-up and backward k in one combined call
        out = plain[:warmup]
        steady = plain[warmup:warmup + 2 * remaining]
        for f, b in zip(steady[0::2], steady[1::2]):
            assert (f.kind, b.kind) == ("forward", "backward")
            out.append(Instruction.fused(f.microbatch, f.chunk, b.microbatch, b.chunk))
        return out + plain[warmup + 2 * remaining:]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_steady_loop_fuses_forward_k_plus_warmup_with_backward_k(version):
    source = _read(version, "megatron/core/pipeline_parallel/schedules.py")
    assert "if config.overlap_moe_expert_parallel_comm and not forward_only:  # Combined 1F1B path" in source
    assert re.search(r"return combined_1f1b_schedule_for_interleaved_pipelining\(", source)
    assert re.search(r"if overlap_moe_expert_parallel_comm:\s+num_warmup_microbatches = num_warmup_microbatches \+ 1",
                     source)
    assert "forward_k = k + num_warmup_microbatches" in source
    # both steady branches (with and without overlap_p2p_comm): one call with both ids
    calls = re.findall(r"forward_backward_helper_wrapper\(\s*f_virtual_microbatch_id=forward_k,\s*"
                       r"b_virtual_microbatch_id=backward_k,", source)
    assert len(calls) == 2 and source.count("backward_k = k\n") == 2
    # warm-up: forwards alone; cool-down: backwards alone
    assert re.search(r"forward_backward_helper_wrapper\(\s*f_virtual_microbatch_id=k,\s*checkpoint_activations", source)
    assert "forward_backward_helper_wrapper(b_virtual_microbatch_id=k)" in source
    # no pipelining: F0 alone, then F(i+1) with B(i), then the last backward alone
    combined = _read(version, "megatron/core/pipeline_parallel/combined_1f1b.py")
    assert re.search(r"for i in range\(num_microbatches - 1\):.*?current_microbatch=\(i \+ 1\)", combined, re.S)


@pytest.mark.parametrize("version", VERSIONS)
def test_perseus_combined_order_equals_megatron_code(version):
    oracle = _Oracle(version)
    compared = 0
    for pp in (2, 3, 4):
        for vp in (1, 2, 3):
            for microbatches in (pp, 2 * pp, 3 * pp, 4 * pp + pp // 2):
                for group in sorted({pp, pp + 1, microbatches}):
                    try:
                        schedule = build_schedule("megatron-combined-1f1b", pp, microbatches, vp,
                                                  group_size=None if group == pp else group)
                    except ScheduleError:
                        continue
                    for stage in range(pp):
                        assert list(schedule.stages[stage]) == oracle.combined_order(pp, stage, vp, microbatches, group), \
                            (pp, vp, microbatches, group, stage)
                        compared += 1
                    InstructionDAG.from_schedule(schedule)  # acyclic
    assert compared > 150


def test_one_stage_is_megatrons_no_pipelining_combined_order():
    schedule = build_schedule("megatron-combined-1f1b", 1, 4, 1)
    assert [i.short() for i in schedule.stages[0]] == ["F0", "F1+B0", "F2+B1", "F3+B2", "B3"]
    with pytest.raises(ScheduleError, match="one stage runs without virtual chunks"):
        build_schedule("megatron-combined-1f1b", 1, 4, 2)


def test_fused_units_take_megatrons_exchanges_as_one_node():
    """A steady unit's forward output leaves after the unit, and the unit waits for both its inputs:
    the interleaved schedule's pair rules with the pair as one node."""
    plain = build_schedule("interleaved", 2, 4, 2)
    combined = build_schedule("megatron-combined-1f1b", 2, 4, 2)
    assert combined.joint_receives == () and combined.megatron_exchanges
    dag = InstructionDAG.from_schedule(combined)
    for v, inst in enumerate(dag.instructions):
        if inst.kind != FUSED or dag.node_stage[v] != 1:
            continue
        forward, backward = inst.parts()
        sources = {dag.instructions[u] for u in dag.predecessors[v] if dag.node_stage[u] == 0}
        # stage 1's forward input comes from stage 0's forward of the same virtual microbatch
        assert any(forward.microbatch == s.microbatch and "forward" in (s.kind, *[p.kind for p in s.parts()])
                   for s in sources), inst
    assert InstructionDAG.from_schedule(plain).num_nodes == dag.num_nodes + sum(
        1 for order in combined.stages for i in order if i.kind == FUSED)
