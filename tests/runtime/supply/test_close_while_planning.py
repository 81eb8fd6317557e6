"""A run that ends while planning keeps the work: ``close()`` gives the planner process up to
``close_plan_wait_s`` to write the frontier to the cache, so the next run deploys it without
profiling or planning (docs/runtime.md, "Training that ends while planning")."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
import planner_stand_ins as stand_ins
from local_steps import train

from perseus.gpu.sim.device import SimulatedGPU
from perseus.runtime import PerseusConfig, PerseusRuntime, PipelineJob
from perseus.runtime.supply import planning

JOB = PipelineJob(num_stages=1, num_microbatches=2, stage=0)


def sim(tmp_path):
    return SimulatedGPU(0, state_dir=str(tmp_path / "sim"), energy_update_period_s=0.0, reset_state=True)


def config(tmp_path, **kw):
    return PerseusConfig.from_dict({"gpu": "sim", "device_index": 0, "cache_dir": str(tmp_path / "cache"),
                                    "sim_gpu": {"state_dir": str(tmp_path / "sim")}, "warmup_steps": 2,
                                    "p_blocking_seconds": 0.05, "freq_min_mhz": 1200, "freq_step_mhz": 100,
                                    "iters_per_freq": 1, "remeasure_max": 0,  # exact step counts: no re-measured clock
                                    "planner_options": {"num_anchors": 4, "num_deadlines": 8},
                                    **kw})


def train_until_planning(runtime):
    """Warm-up and the 3-clock sweep, then one step into planning (the planner sleeps 3 s first)."""
    train(runtime, 6)
    assert runtime.phase.value == "planning", runtime.summary()["phase_history"]


def planning_runtime(tmp_path, monkeypatch, stand_in, **kw):
    """A runtime one step into planning with ``stand_in`` as the planner; (runtime, planner pid)."""
    monkeypatch.setattr(planning, "plan_frontier", stand_in)
    sim(tmp_path)
    rt = PerseusRuntime(JOB, config(tmp_path, **kw))
    train_until_planning(rt)
    return rt, rt.supply._planner.pid


def entry(tmp_path) -> Path:
    (only,) = list((tmp_path / "cache").iterdir())
    return only


def test_a_run_closed_while_planning_leaves_the_frontier_and_the_next_run_deploys_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(planning, "plan_frontier", stand_ins.slow)  # 3 s: longer than the run's last steps
    sim(tmp_path)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path, close_plan_wait_s=240.0)) as rt:
            train_until_planning(rt)
            assert not (entry(tmp_path) / "frontier.json").exists()
        # close() waited for the planner process, which wrote the frontier before it was stopped
    assert "training ended while planning; waiting up to 240 s (close_plan_wait_s)" in caplog.text
    assert "after training ended, saved to" in caplog.text
    assert (entry(tmp_path) / "frontier.json").exists() and (entry(tmp_path) / "profile.json").exists()

    monkeypatch.setattr(planning, "plan_frontier", stand_ins.broken)  # a second planning would fail loudly
    with PerseusRuntime(JOB, config(tmp_path, close_plan_wait_s=240.0)) as rt:
        train(rt, 4)
        summary = rt.summary()
    assert [p for _, p in summary["phase_history"]] == ["warmup", "deployed"]
    sources = [data for _, what, data in rt.events if what == "source"]
    assert sources == [f"cached frontier {entry(tmp_path) / 'frontier.json'}"]


def test_without_waiting_the_planner_is_stopped_and_the_next_run_plans_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(planning, "plan_frontier", stand_ins.slow)
    sim(tmp_path)
    with caplog.at_level(logging.INFO, logger="perseus"):
        with PerseusRuntime(JOB, config(tmp_path, close_plan_wait_s=0)) as rt:
            train_until_planning(rt)
            pid = rt.supply._planner.pid
    assert "training ended while planning" not in caplog.text
    assert not (entry(tmp_path) / "frontier.json").exists() and (entry(tmp_path) / "profile.json").exists()
    assert _gone(pid)
    with PerseusRuntime(JOB, config(tmp_path, mode="plan", close_plan_wait_s=0)) as rt:
        train(rt, 3)
        assert [p for _, p in rt.summary()["phase_history"]] == ["warmup", "planning"]


def test_a_planner_that_does_not_finish_in_time_is_stopped_and_says_so(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="perseus"):
        rt, pid = planning_runtime(tmp_path, monkeypatch, stand_ins.hang, close_plan_wait_s=0.5)
        t0 = time.monotonic()
        rt.close()
        took = time.monotonic() - t0
    assert "did not finish within close_plan_wait_s (0.5 s); stopped it" in caplog.text
    assert took >= 0.5  # it did wait (no upper bound asserted: the machine is loaded)
    assert not (entry(tmp_path) / "frontier.json").exists()
    assert _gone(pid)


def test_the_wait_is_a_validated_setting():
    assert PerseusConfig().close_plan_wait_s == 60.0
    with pytest.raises(Exception, match="close_plan_wait_s"):
        PerseusConfig.from_dict({"close_plan_wait_s": -1})


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_close_can_be_told_not_to_wait(tmp_path, monkeypatch, caplog):
    """What a mid-training restart (Megatron's batch-size ramp-up) uses: the planner is stopped at once."""
    with caplog.at_level(logging.INFO, logger="perseus"):
        rt, pid = planning_runtime(tmp_path, monkeypatch, stand_ins.slow, close_plan_wait_s=240.0)
        rt.close(plan_wait_s=0)
    assert "training ended while planning" not in caplog.text
    assert not (entry(tmp_path) / "frontier.json").exists() and _gone(pid)
