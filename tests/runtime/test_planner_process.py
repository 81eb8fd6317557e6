"""Rank 0's planner runs in a niced child process: its result, its failure, its death, no orphans."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import planner_stand_ins as stand_ins  # noqa: E402

from perseus.planner import PlannerOptions, plan_frontier  # noqa: E402
from perseus.profile import InstructionProfile, uniform_profile  # noqa: E402
from perseus.runtime import planning  # noqa: E402
from perseus.runtime.collective import Collective  # noqa: E402
from perseus.runtime.planner_process import FAILED, PENDING, READY, ProcessPlanner, start_child, stop_child  # noqa: E402
from perseus.schedule import build_schedule  # noqa: E402

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


def test_plans_in_a_lower_priority_child_with_the_same_result():
    planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, stand_ins.plan_and_tell_where)
    assert planner.wait(WAIT_S) and planner.status == READY, planner.error
    got = planner.result
    assert got.metadata["pid"] == planner.pid != os.getpid()
    assert got.metadata["nice"] == min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
    here = plan_frontier(SCHEDULE, PROFILE, OPTIONS)
    assert [(p.time_s, p.energy_j) for p in got.points] == [(p.time_s, p.energy_j) for p in here.points]
    assert all((a.freqs_mhz == b.freqs_mhz).all() for a, b in zip(got.points, here.points))


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
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import planner_stand_ins
        from perseus.planner import PlannerOptions
        from perseus.runtime.planner_process import ProcessPlanner
        from test_planner_process import SCHEDULE, PROFILE, OPTIONS
        from perseus.runtime.planner_process import start_child
        planner = ProcessPlanner(SCHEDULE, PROFILE, OPTIONS, planner_stand_ins.hang)
        idle = start_child()  # started ahead, still waiting for its job
        print(planner.pid, idle.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
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
