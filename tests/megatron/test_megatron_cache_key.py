"""The cache key is the model: every Megatron argument that changes compute or the schedule,
changed alone, gives another cache entry; the same model gives the same one.

A real megatron-core ``TransformerConfig`` and the adapter's real step and job construction
(``hooks._step_info``, ``job_from_parallel_state``) on a faked 4-stage parallel state, then the
runtime's own key (``sources.cache_key`` with ``sources.stage_models``). Each variant sets one
field on a validly constructed config, so no combination rule of megatron-core's stands between a
field and the key. The model chunk is a torch module: its parameters stand for what the config
does not hold (vocabulary, embeddings).
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

import torch
from megatron.core.transformer import TransformerConfig

from perseus.store.cache import key_hash
from perseus.runtime.plane.collective import Collective
from perseus.runtime.config import PerseusConfig
from perseus.runtime.supply.sources import cache_key, stage_models
from perseus_megatron import hooks
from perseus_megatron.integration import job_from_parallel_state
from test_megatron_enable import fake_parallel_state

# One field changed at a time, on the base config below: shape, dtype, parallelism, recompute, MoE.
CONFIG_CHANGES = {
    "hidden_size": 128, "ffn_hidden_size": 512, "num_layers": 8, "num_attention_heads": 8, "num_query_groups": 2,
    "kv_channels": 32, "params_dtype": torch.bfloat16, "bf16": True, "fp16": True, "fp8": "hybrid",
    "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 8, "virtual_pipeline_model_parallel_size": 2,
    "context_parallel_size": 2, "expert_model_parallel_size": 2, "sequence_parallel": True,
    "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
    "num_moe_experts": 8, "moe_router_topk": 1, "moe_ffn_hidden_size": 128, "moe_grouped_gemm": True,
    "gated_linear_unit": True, "activation_func": torch.nn.functional.silu,
    "num_layers_in_first_pipeline_stage": 1,
}
CALL_CHANGES = {"seq_length": 256, "micro_batch_size": 2}


def base_config() -> TransformerConfig:
    return TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=4,
                             pipeline_dtype=torch.float32)


def entry(monkeypatch, config=None, chunk=None, dp_size=1, **call) -> str:
    """The cache entry (key hash) rank 0 of this job would open."""
    config = config if config is not None else base_config()
    chunk = chunk if chunk is not None else torch.nn.Linear(64, 1000)
    monkeypatch.setattr(hooks, "_model_config", lambda model: config)
    kwargs = {"model": [chunk], "num_microbatches": 8, "seq_length": 128, "micro_batch_size": 1, **call}
    info = hooks._step_info("1f1b", kwargs)
    fake_parallel_state(monkeypatch)
    from megatron.core import parallel_state as ps

    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda: dp_size)
    job = job_from_parallel_state(info)
    key = cache_key(job, job.build_schedule(), "GPU", "1", PerseusConfig(), stage_models(Collective(), job))
    return key_hash(key)


def test_the_same_model_gives_the_same_entry(monkeypatch):
    assert entry(monkeypatch) == entry(monkeypatch)  # new config and chunk objects


@pytest.mark.parametrize("field", list(CONFIG_CHANGES))
def test_each_config_field_changes_the_entry(field, monkeypatch):
    config = base_config()
    assert hasattr(config, field), f"megatron-core has no {field}: update the test and the docs"
    assert getattr(config, field) != CONFIG_CHANGES[field]
    setattr(config, field, CONFIG_CHANGES[field])
    assert entry(monkeypatch, config) != entry(monkeypatch), f"changing {field} reused the cache entry"


@pytest.mark.parametrize("argument", list(CALL_CHANGES))
def test_each_schedule_call_argument_changes_the_entry(argument, monkeypatch):
    assert entry(monkeypatch, **{argument: CALL_CHANGES[argument]}) != entry(monkeypatch)


@pytest.mark.parametrize("chunk", [torch.nn.Linear(64, 32000), torch.nn.Linear(64, 1000, dtype=torch.bfloat16)],
                         ids=["vocabulary shape", "parameter dtype"])
def test_this_ranks_parameters_change_the_entry(chunk, monkeypatch):
    assert entry(monkeypatch, chunk=chunk) != entry(monkeypatch)


def test_the_data_parallel_size_changes_the_entry(monkeypatch):
    assert entry(monkeypatch, dp_size=2) != entry(monkeypatch)


def test_the_stage_fingerprint_is_computed_once_per_chunk(monkeypatch):
    """The job is rebuilt at every step: the chunk's parameters are read once, then remembered."""
    chunk = torch.nn.Linear(64, 1000)
    calls = []
    original = chunk.named_parameters
    monkeypatch.setattr(chunk, "named_parameters", lambda *a, **k: calls.append(1) or original(*a, **k))
    first = entry(monkeypatch, chunk=chunk)
    assert entry(monkeypatch, chunk=chunk) == first and len(calls) == 1
