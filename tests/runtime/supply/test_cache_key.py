"""The runtime's cache key: its layout version, entries of the old layout, and descriptions that
are equal across processes (no memory address), so the same model hits its cache entry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from perseus.store.cache import RunCache, key_hash
from perseus.gpu.sim.device import SimulatedGPU
from perseus.profile import load_json
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob, describe_value, value_digest
from perseus.runtime.supply.fingerprint import KEY_VERSION

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0, model_config={"hidden": 8}, stage_fingerprint="abc")


def config(tmp_path, **kw):
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                    "p_blocking_seconds": 0.05, "freq_min_mhz": 1200, "freq_step_mhz": 100,
                                    "iters_per_freq": 1, "remeasure_max": 0, **kw})  # exact step counts


def train(runtime, steps):
    for _ in range(steps):
        runtime.on_step_begin()
        for inst in runtime.schedule.stages[0]:
            runtime.on_instruction_begin(inst.kind, inst.microbatch, inst.chunk)
            time.sleep(0.001)
            runtime.on_instruction_end(inst.kind, inst.microbatch, inst.chunk)
        runtime.on_step_end()


def test_the_key_holds_its_version_the_model_and_every_stage(tmp_path):
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    with PerseusRuntime(JOB, config(tmp_path, mode="measure-only")) as rt:
        key = rt.cache.key
    assert key["key_version"] == KEY_VERSION
    assert key["model"] == {"hidden": 8} and key["stage_models"] == {"0": "abc"} and key["dp_size"] == 1


def test_an_entry_of_the_old_key_layout_is_never_read_and_breaks_nothing(tmp_path):
    """After an upgrade the cache holds entries keyed the old way (no version, no stage models): the
    first run profiles again into a new entry and leaves the old one alone."""
    SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)
    with PerseusRuntime(JOB, config(tmp_path, mode="profile")) as rt:
        train(rt, 6)
        new_key, new_dir = rt.cache.key, rt.cache.dir
    old_key = {k: v for k, v in new_key.items() if k not in ("key_version", "stage_models", "dp_size")}
    old = RunCache(tmp_path / "cache", old_key)
    old.save_profile(load_json(new_dir / "profile.json"))
    shutil.rmtree(new_dir)
    assert old.dir != new_dir and old.load_profile() is not None
    with PerseusRuntime(JOB, config(tmp_path, mode="profile")) as rt:
        train(rt, 6)
        assert [p for _, p in rt.summary()["phase_history"]] == ["warmup", "profiling", "steady"]
        assert not [d for _, what, d in rt.events if what == "source"]
    assert (new_dir / "profile.json").exists() and (old.dir / "profile.json").exists()
    assert json.loads((old.dir / "key.json").read_text()) == json.loads(json.dumps(old_key, sort_keys=True))


class Opaque:
    """An argument with the default repr, which holds a memory address."""


def test_descriptions_hold_no_address_and_are_equal_across_processes():
    described = describe_value({"arg": Opaque(), "fn": test_descriptions_hold_no_address_and_are_equal_across_processes})
    assert "0x" not in json.dumps(described)
    code = ("import sys; sys.path.insert(0, {here!r}); import test_cache_key as t; "
            "from perseus.runtime import value_digest; "
            "print(value_digest({{'arg': t.Opaque(), 'fn': t.test_descriptions_hold_no_address_and_are_equal_across_processes}}))")
    here = os.path.dirname(__file__)
    other = subprocess.run([sys.executable, "-c", code.format(here=here)], capture_output=True, text=True, check=True)
    import test_cache_key as same  # the module as the child imports it
    mine = value_digest({"arg": same.Opaque(), "fn": same.test_descriptions_hold_no_address_and_are_equal_across_processes})
    assert other.stdout.strip() == mine
    assert key_hash({"a": mine}) == key_hash({"a": other.stdout.strip()})
