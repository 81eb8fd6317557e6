"""The cache key holds each rank's torch stage submodules (parameter names, shapes, dtypes): a
changed stage model misses the cache, the same one (fresh objects, other weights) hits it.

Real ``PipelineStage``/``Schedule1F1B`` objects in a one-rank gloo world in this process, and the
real runtime (measure-only, simulated GPU) whose cache entry is compared. That rank 0's key also
holds other ranks' stages is checked on DeepSpeed under torchrun
(tests/deepspeed/test_deepspeed_cache_key.py); the gather is the runtime's, the same for every adapter.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import perseus_torch


class Renamed(torch.nn.Module):
    """The base model's shapes under other parameter names."""

    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, hidden, dtype=dtype)
        self.act = torch.nn.ReLU()
        self.down = torch.nn.Linear(hidden, 4, dtype=dtype)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def submodule(hidden: int = 8, dtype: torch.dtype = torch.float32, renamed: bool = False) -> torch.nn.Module:
    if renamed:
        return Renamed(hidden, dtype)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden, dtype=dtype), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 4, dtype=dtype))


CHANGES = {
    "parameter shapes": {"hidden": 16},
    "parameter dtypes": {"dtype": torch.float64},
    "parameter names": {"renamed": True},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def cache_entry(tmp_path, monkeypatch, seed: int = 0, **changes) -> str:
    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    torch.manual_seed(seed)
    stage = PipelineStage(submodule(**changes), 0, 1, torch.device("cpu"))
    schedule = Schedule1F1B(stage, 2, loss_fn=torch.nn.MSELoss())
    handle = perseus_torch.enable(schedule, stage, {"gpu": "sim", "mode": "measure-only", "log_every_steps": 0,
                                                    "sim_gpu": {"energy_update_period_s": 0},
                                                    "cache_dir": str(tmp_path / "cache")})
    try:
        assert handle.job.stage_fingerprint
        return handle.runtime.cache.dir.name
    finally:
        handle.close()


@pytest.fixture(scope="module")
def base_entry(world, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        return cache_entry(tmp_path_factory.mktemp("base"), mp)


def test_the_same_stage_model_hits_the_cache(base_entry, tmp_path, monkeypatch):
    assert cache_entry(tmp_path, monkeypatch, seed=3) == base_entry


@pytest.mark.parametrize("ingredient", list(CHANGES))
def test_a_changed_stage_model_misses_the_cache(ingredient, base_entry, tmp_path, monkeypatch):
    assert cache_entry(tmp_path, monkeypatch, **CHANGES[ingredient]) != base_entry, ingredient
