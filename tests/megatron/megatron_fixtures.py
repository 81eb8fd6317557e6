"""Fixtures the single-process megatron-core tests share: a one-rank tiny GPT, and no hooks left behind.

Import them into a test module (``from megatron_fixtures import trainer, no_leftover_hooks``);
pytest picks up imported fixtures by name.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from perseus_demo.megatron_cpu import cpu_execution
from perseus_demo.tiny_gpt import TinyGPTShape, TinyGPTTrainer, initialize_parallel
from perseus_megatron import hooks


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A one-stage tiny GPTModel on a one-rank gloo group, inside ``cpu_execution``."""
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        with cpu_execution():
            initialize_parallel(1)
            yield TinyGPTTrainer(TinyGPTShape(num_layers=2), 1)
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_leftover_hooks():
    """Each test leaves megatron-core's schedules as it found them."""
    yield
    handle = hooks.active_handle()
    if handle is not None:
        handle.uninstall()
