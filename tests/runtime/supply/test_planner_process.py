"""Rank 0's planner runs in a niced child process: its result, its failure, its death, no orphans."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
import planner_stand_ins as stand_ins

from perseus.store.cache import RunCache
from perseus.errors import FrontierError
from perseus.planner import PlannerOptions, plan_frontier
from perseus.profile import InstructionProfile, uniform_profile
from perseus.planner import stage_plan
from perseus.runtime.supply import planning
from perseus.runtime.plane.collective import Collective
from perseus.planner.process import (FAILED, PENDING, READY, ProcessPlanner, hand_over,
                                             planned_stages, start_child, stop_child)
from perseus.planner.stage_plan import encode_stage
from perseus.schedules import build_schedule

SCHEDULE = build_schedule("1f1b", 2, 4)
PROFILE = uniform_profile(2, {"forward": InstructionProfile((1400, 1000), (0.01, 0.012), (3.0, 2.5)),
                              "backward": InstructionProfile((1400, 1000), (0.02, 0.024), (6.0, 5.0))}, 50.0)
OPTIONS = PlannerOptions(num_anchors=4, num_deadlines=8)
WAIT_S = 120  # hang guard: a child's start (imports) is slow on a loaded machine


def _gone(pid: int) -> bool:
    """The process exited (a zombie nobody reaps in a container counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_plans_in_a_lower_priority_child_of_its_own_session_with_the_same_result(monkeypatch):
    """The child hands over every stage's bytes as rank 0 would have encoded them from the same
    frontier; it runs at lower priority, in a session of its own, single-threaded math libraries."""
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the trainer's setting is not the planner's
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    got = planner.result
    assert got.metadata["pid"] == planner.pid != os.getpid()
    assert got.metadata["nice"] == min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
    assert got.metadata["sid"] == planner.pid != os.getsid(0)  # its own session, so its own autogroup
    assert got.metadata["threads"] == dict.fromkeys(stand_ins.THREAD_SETTINGS, "1")
    here = plan_frontier(SCHEDULE, PROFILE, OPTIONS)
    assert (got.num_points, got.num_paced_points) == (len(here.points), len(here.paced_points))
    assert got.solve_time_s > 0 and got.saved_to is None and got.save_error is None  # no cache given
    assert [_but_solve_time(b) for b in got.stage_bytes] == [_but_solve_time(encode_stage(here, s))
                                                             for s in range(SCHEDULE.num_stages)]


def _but_solve_time(stage_bytes: bytes) -> dict:
    """A stage plan's wire document without the solve's wall time (the only field that varies)."""
    return {k: v for k, v in pickle.loads(stage_bytes).items() if k != "solve_time_s"}


def test_an_old_style_child_shares_the_trainers_session():
    """What the benchmark compares against: ``own_session=False`` is the child as it was."""
    child = start_child(own_session=False)
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, started=child)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    assert planner.result.metadata["sid"] == os.getsid(0)


def test_the_child_writes_the_cache_rank_0_only_passes_bytes_on(tmp_path, monkeypatch):
    """Rank 0 neither encodes a stage nor writes the frontier file: the planner process did both."""
    cache = RunCache(tmp_path / "cache", {"job": "test"})
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, cache=cache)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    got = planner.result
    assert got.saved_to == str(cache.frontier_path) and got.save_error is None
    saved = cache.load_frontier(SCHEDULE)  # stamped with this key and the dependency model: usable
    assert saved is not None and saved.metadata["pid"] == planner.pid
    assert got.stage_bytes == tuple(encode_stage(saved, s) for s in range(SCHEDULE.num_stages))

    def no_encoding_here(frontier, stage):
        raise AssertionError("rank 0 encoded a stage plan")

    monkeypatch.setattr(stage_plan, "encode_stage", no_encoding_here)
    outcome = planning.share_outcome(Collective(), planner, SCHEDULE, 1)
    assert outcome.planned is got and outcome.plan.stage == 1
    assert outcome.plan.stage_plan(outcome.plan.default_point(), 1) == saved.stage_plan(saved.default_point(), 1)


def test_with_timelines_the_child_encodes_every_stages_planned_timeline(tmp_path):
    """A hidden switch latency needs each point's timeline in the stage plans: the planner process
    simulates them (``frontier_timing``), as rank 0 would from the same frontier and profile."""
    cache = RunCache(tmp_path / "cache", {"job": "test"})
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, cache=cache, timelines=True)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    saved = cache.load_frontier(SCHEDULE)
    timing = stage_plan.frontier_timing(saved, PROFILE)
    assert planner.result.stage_bytes == tuple(encode_stage(saved, s, timing) for s in range(SCHEDULE.num_stages))
    plan = planning.share_outcome(Collective(), planner, SCHEDULE, 1).plan
    assert plan.timeline(plan.default_point()) is not None


def test_a_cache_the_child_cannot_write_is_reported_and_planning_goes_on(tmp_path):
    (tmp_path / "not_a_dir").write_text("")
    cache = RunCache(tmp_path / "not_a_dir", {"job": "test"})
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, cache=cache)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    assert planner.result.saved_to is None and planner.result.save_error == "Not a directory"
    assert len(planner.result.stage_bytes) == SCHEDULE.num_stages


def test_the_hand_over_in_one_process():
    """``hand_over`` (the child's side) and ``planned_stages`` (rank 0's side) without a child."""
    here = plan_frontier(SCHEDULE, PROFILE, OPTIONS)
    body = pickle.loads(pickle.dumps(hand_over(here, None, encode_stage)))
    got = planned_stages(body)
    assert got.bytes_of(1) == encode_stage(here, 1) and got.num_points == len(here.points)
    with pytest.raises(FrontierError, match="stage 2 is not in this 2-stage frontier"):
        got.bytes_of(2)
    with pytest.raises(TypeError, match="the planner returned dict, not a Frontier"):
        hand_over({"points": []}, None, encode_stage)
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.not_a_frontier)
    assert planner.wait(WAIT_S) and planner.error == "TypeError: the planner returned dict, not a Frontier"


def test_a_planner_error_is_one_line():
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.broken)
    assert planner.wait(WAIT_S) and planner.status == FAILED
    assert planner.error == "ValueError: no luck"


def test_a_dead_planner_is_a_planning_error_every_rank_learns(monkeypatch):
    monkeypatch.setattr(planning, "plan_frontier", stand_ins.die)
    planner = planning.BackgroundPlanner(SCHEDULE, PROFILE, OPTIONS)
    assert planner.wait(WAIT_S)
    outcome = planning.share_outcome(Collective(), planner, SCHEDULE, 0)
    assert outcome is not None and outcome.plan is None
    assert outcome.error == "planner process ended without a result (killed by SIGKILL)"


def test_close_stops_a_planning_run_nobody_waits_for():
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.hang)
    time.sleep(0.5)
    assert planner.status == PENDING
    planner.close()
    assert planner.wait(WAIT_S) and planner.status == FAILED and _gone(planner.pid)


def test_the_planner_exits_when_its_trainer_is_killed(tmp_path):
    """A trainer killed with SIGKILL (no atexit, no close) leaves no planner behind."""
    trainer = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        import planner_stand_ins
        from perseus.planner import PlannerOptions
        from perseus.planner.process import ProcessPlanner
        from test_planner_process import SCHEDULE, PROFILE, OPTIONS
        from perseus.planner.process import start_child
        planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, planner_stand_ins.hang)
        idle = start_child()  # started ahead, still waiting for its job
        print(planner.pid, idle.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True, env=env)
    try:
        children = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(children) == 2 and not any(_gone(c) for c in children)
        time.sleep(1.0)  # one child is planning (hanging) now, the other waits for a job
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        for child in children:
            while not _gone(child):
                assert time.monotonic() < deadline, f"planner {child} outlived its killed trainer"
                time.sleep(0.1)
    finally:
        proc.kill()


def _temporaries(directory: Path) -> list[Path]:
    return sorted(directory.glob(".*.tmp")) if directory.exists() else []


def _await_temporary(directory: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not _temporaries(directory):
        assert time.monotonic() < deadline, "the planner never began its write"
        time.sleep(0.05)


def test_a_planning_run_closed_mid_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """``close`` stops the child with SIGTERM, whose default runs no cleanup: the half-written
    frontier's temporary file stayed in the cache (a loaded suite's fault test found one)."""
    cache = RunCache(tmp_path / "cache", {"job": "test"})
    monkeypatch.setenv(stand_ins.WRITE_DIR, str(cache.dir))
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.hang_while_writing, cache=cache)
    _await_temporary(cache.dir)
    planner.close()
    assert planner.wait(WAIT_S) and planner.status == FAILED and _gone(planner.pid)
    assert _temporaries(cache.dir) == []
    assert not (cache.dir / "frontier.json").exists()  # nothing half-written in its place either


def test_a_planner_whose_trainer_is_killed_mid_write_leaves_no_temporary_file(tmp_path):
    """The child ends itself with ``os._exit`` when its trainer is gone (no cleanup runs): it
    removes its own temporary files first."""
    cache_dir = tmp_path / "cache"
    trainer = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        import planner_stand_ins
        from perseus.planner.process import ProcessPlanner
        from perseus.store.cache import RunCache
        from test_planner_process import SCHEDULE, PROFILE, OPTIONS
        cache = RunCache({str(cache_dir)!r}, {{"job": "test"}})
        planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, planner_stand_ins.hang_while_writing, cache=cache)
        print(planner.pid, cache.dir, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]), os.environ.get("PYTHONPATH", "")])}
    probe = RunCache(cache_dir, {"job": "test"})  # the trainer's entry: the same key, the same directory
    env[stand_ins.WRITE_DIR] = str(probe.dir)
    proc = subprocess.Popen([sys.executable, "-c", trainer], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid_text, where = proc.stdout.readline().split()
        assert Path(where) == probe.dir
        _await_temporary(probe.dir)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while not _gone(int(pid_text)):
            assert time.monotonic() < deadline, "the planner outlived its killed trainer"
            time.sleep(0.1)
        assert _temporaries(probe.dir) == []
    finally:
        proc.kill()


def test_a_planner_function_the_child_cannot_import_is_a_planning_error():
    def local(schedule, profile, options):
        return plan_frontier(schedule, profile, options)

    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, local)
    assert planner.status == FAILED and planner.pid is None
    assert planner.error.startswith("cannot hand the planning job to a planner process (AttributeError")


def test_no_python_to_run_the_planner_is_a_planning_error(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.broken)
    assert planner.status == FAILED and planner.pid is None
    assert planner.error.startswith("cannot hand the planning job to a planner process (FileNotFoundError")


def test_a_child_started_ahead_runs_the_job_and_a_dead_one_is_replaced():
    child = start_child()
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, started=child)
    assert planner.pid == child.pid
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    assert planner.result.metadata["pid"] == child.pid
    dead = start_child()
    stop_child(dead)
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, started=dead)
    assert planner.pid != dead.pid
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error


def test_the_planner_priority_is_a_setting():
    from perseus.errors import ConfigError
    from perseus.runtime import PerseusConfig

    assert PerseusConfig().planner_nice == 10
    assert PerseusConfig.from_dict({"planner_nice": 0}).planner_nice == 0
    with pytest.raises(ConfigError, match="planner_nice"):
        PerseusConfig.from_dict({"planner_nice": 25})
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, nice=3)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    assert planner.result.metadata["nice"] == min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19)


def test_a_measured_step_longer_than_the_profile_plans_with_the_hand_off_and_times_requests_without(tmp_path):
    """``measured_s``: the child calibrates the hand-off between stages on it (``planner.handoff``),
    plans with it (the frontier's all-max time is the measured step, the hand-off in its metadata),
    and the stages' planned timelines keep the instructions' own durations: the runtime hangs each
    clock request on them."""
    from perseus.planner.handoff import sending_keys, with_handoff

    truth = with_handoff(PROFILE, 0.002, sending_keys(SCHEDULE))
    measured = plan_frontier(SCHEDULE, truth, OPTIONS).baseline_time_s
    cache = RunCache(tmp_path / "cache", {"job": "test"})
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where, cache=cache, timelines=True,
                             measured_s=measured)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    assert planner.result.metadata["handoff_s"] == pytest.approx(0.002, abs=1e-6)
    saved = cache.load_frontier(SCHEDULE)
    assert saved.baseline_time_s == pytest.approx(measured, rel=1e-6)
    plan = planning.share_outcome(Collective(), planner, SCHEDULE, 0).plan
    begin, end = plan.timeline(plan.default_point())
    for inst, duration in zip(SCHEDULE.stages[0], np.subtract(end, begin)):  # a measured time, no hand-off in it
        assert min(abs(duration - t) for t in PROFILE.get(0, inst.kind).times_s) < 1e-6, (inst, duration)
