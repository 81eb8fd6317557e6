"""perseus_megatron on megatron-core's combined 1F1B (``overlap_moe_expert_parallel_comm``), without CUDA.

The combined schedule needs CUDA streams (``set_streams``) and a GPT model's fine-grained schedule
plan, so it cannot run on this CPU-only machine (scripts/gpu_check.py runs it on a GPU). What runs
here: megatron-core's own ``combined_1f1b_schedule_for_no_pipelining`` and
``combined_1f1b_schedule_for_interleaved_pipelining`` (the installed 0.16.1), with ``set_streams``
made a no-op and the unit's compute (``combined_forward_backward_step``, which the hooks wrap)
replaced by a stand-in with its signature that returns a fresh output. The hooks must report what
megatron-core hands that step: a forward alone, a backward alone (found by its forward's output, as
for ``backward_step``) or both as one fused unit, equal to the ``megatron-combined-1f1b`` data.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

from megatron.core.pipeline_parallel import combined_1f1b
from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches, get_schedule_table

from perseus.runtime.job import RecordingListener
from perseus.runtime import HookStateError
from perseus.schedules import build_schedule
from perseus_megatron import compat, hooks
from perseus_megatron.compat import UnsupportedMegatronFeature, check_step_supported
from perseus_megatron.hooks import install_hooks
from perseus_megatron.tracker import StepInfo
from megatron_fixtures import no_leftover_hooks  # noqa: F401 - pytest fixtures, found by their names


def stand_in_step(forward_step_func, data_iterator, f_model, num_microbatches, input_tensor, forward_data_store,
                  b_model, b_input_tensor, b_output_tensor, b_output_tensor_grad, config, f_model_chunk_id=None,
                  pre_forward=None, pre_backward=None, post_forward=None, post_backward=None,
                  collect_non_loss_data=False, checkpoint_activations_microbatch=None, is_first_microbatch=False,
                  current_microbatch=None, encoder_decoder_xattn=False, **later_releases):
    """combined_forward_backward_step's signature (0.19 adds keywords such as ``fsdp_wrapper``); a
    fresh output object per forward, no compute."""
    output = SimpleNamespace(microbatch=current_microbatch) if f_model is not None else None
    return output, 1, None


# The schedule's config: megatron-core 0.19 passes this flag to ``set_streams`` (stubbed above).
CONFIG = SimpleNamespace(high_priority_a2a_comm_stream=False)


@pytest.fixture
def hooked(monkeypatch):
    monkeypatch.setattr(combined_1f1b, "set_streams", lambda *args, **kwargs: None)
    monkeypatch.setattr(combined_1f1b, "combined_forward_backward_step", stand_in_step)
    listener = RecordingListener()
    handle = install_hooks(listener)
    assert hooks.is_hooked(combined_1f1b.combined_forward_backward_step, "combined_forward_backward_step")
    yield handle, listener
    handle.uninstall()
    assert combined_1f1b.combined_forward_backward_step is stand_in_step


def test_no_pipelining_reports_megatrons_combined_units(hooked):
    handle, listener = hooked
    with handle.tracker.step(StepInfo("megatron-combined-1f1b", 4)):
        combined_1f1b.combined_1f1b_schedule_for_no_pipelining(
            None, None, object(), 4, None, None, [], CONFIG, False, None, False,
            contextlib.nullcontext, 0, lambda first: first)
    assert listener.steps == [list(build_schedule("megatron-combined-1f1b", 1, 4, 1).stages[0])]


@pytest.mark.parametrize("stages,rank,chunks,microbatches", [(2, 0, 2, 4), (2, 1, 2, 4), (4, 1, 2, 8), (2, 1, 3, 6)])
def test_interleaved_pipelining_reports_megatrons_combined_units(hooked, stages, rank, chunks, microbatches):
    """One stage of a pipeline, driven as ``forward_backward_pipelining_with_interleaving`` drives it:
    its own warm-up count, then forward ``k + warm-up`` with backward ``k``, then the cool-down."""
    handle, listener = hooked
    p2p = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: stages, rank=lambda: rank),
                          virtual_pipeline_model_parallel_size=chunks)
    total, _, warmup, _ = get_pp_rank_microbatches(microbatches, chunks, stages, False,
                                                   overlap_moe_expert_parallel_comm=True, p2p_communicator=p2p)
    table = get_schedule_table(microbatches, chunks, stages)
    outputs: list[list] = [[] for _ in range(chunks)]
    model = [object() for _ in range(chunks)]

    def chunk_of(vid, forward):
        return table[vid][1] if forward else chunks - 1 - table[vid][1]

    def unit(f=None, b=None):
        combined_1f1b.combined_1f1b_schedule_for_interleaved_pipelining(
            CONFIG, None, [None] * chunks, model, microbatches, [],
            lambda vid, chunk, mb: None,                                   # forward_step_helper_preprocess
            lambda chunk, output, tokens: outputs[chunk].append(output),    # forward_step_helper_postprocess
            lambda vid, chunk: (None, outputs[chunk].pop(0), None),         # backward_step_helper_preprocess
            lambda vid: None,                                               # backward_step_helper_postprocess
            lambda vid, forward: table[vid][0], chunk_of, lambda first: first, lambda vid: False, False,
            f_virtual_microbatch_id=f, b_virtual_microbatch_id=b)

    with handle.tracker.step(StepInfo("megatron-combined-1f1b", microbatches, chunks)):
        for k in range(warmup):
            unit(f=k)
        for k in range(total - warmup):
            unit(f=k + warmup, b=k)
        for k in range(total - warmup, total):
            unit(b=k)
    assert listener.steps == [list(build_schedule("megatron-combined-1f1b", stages, microbatches, chunks).stages[rank])]


def test_a_backward_of_an_unknown_output_is_a_hook_state_error(hooked):
    handle, _ = hooked
    with pytest.raises(HookStateError, match="combined 1F1B ran a backward of an output no forward"):
        with handle.tracker.step(StepInfo("megatron-combined-1f1b", 2)):
            combined_1f1b.combined_forward_backward_step(None, None, None, 2, None, [], object(), None, object(),
                                                         None, SimpleNamespace())


def test_the_step_names_the_combined_schedule_and_a_missing_hook_point_refuses_it(monkeypatch):
    from megatron.core import ModelParallelConfig

    import torch

    config = ModelParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                 pipeline_dtype=torch.float32)
    config.overlap_moe_expert_parallel_comm = True
    monkeypatch.setattr(hooks, "_model_config", lambda model: config)
    install_hooks(RecordingListener())
    info = hooks._step_info("interleaved", {"model": [object()] * 2, "num_microbatches": 8})
    assert (info.schedule, info.num_chunks) == ("megatron-combined-1f1b", 2)
    assert hooks._step_info("1f1b", {"model": [object()], "num_microbatches": 8}, runs_combined=False).schedule == "1f1b"
    with pytest.raises(UnsupportedMegatronFeature, match="combined_forward_backward_step, which this megatron-core lacks"):
        check_step_supported(config, False, "function combined_1f1b.combined_forward_backward_step")

    def moved(f_model, forward_step_func, data_iterator, num_microbatches, input_tensor, forward_data_store,
              b_model, b_input_tensor, b_output_tensor, config, f_model_chunk_id=None, current_microbatch=None):
        return None

    assert "parameter f_model" in compat.combined_step_problem(moved)
    assert compat.combined_step_problem(stand_in_step) is None
