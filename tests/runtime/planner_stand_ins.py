"""Planning functions for the planner-process tests: module level, so the child imports them."""

from __future__ import annotations

import os
import signal
import time

from perseus.planner import plan_frontier


THREAD_SETTINGS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def plan_and_tell_where(schedule, profile, options):
    """The real planner, plus the process, session, priority and thread settings it ran with (in
    the frontier's metadata)."""
    frontier = plan_frontier(schedule, profile, options)
    frontier.metadata.update(pid=os.getpid(), sid=os.getsid(0), nice=os.getpriority(os.PRIO_PROCESS, 0),
                             threads={name: os.environ.get(name) for name in THREAD_SETTINGS})
    print("a planner banner on stdout must not corrupt the reply")
    return frontier


def broken(schedule, profile, options):
    raise ValueError("no luck")


def die(schedule, profile, options):
    os.kill(os.getpid(), signal.SIGKILL)


def hang(schedule, profile, options):
    while True:
        time.sleep(0.1)


def slow(schedule, profile, options):
    """The real planner, seconds late: longer than a few training steps of a test."""
    time.sleep(3.0)
    return plan_frontier(schedule, profile, options)


def not_a_frontier(schedule, profile, options):
    return {"points": []}


WRITE_DIR = "PERSEUS_TEST_WRITE_DIR"


def hang_while_writing(schedule, profile, options):
    """Stops half way through an atomic write of the frontier file into ``$PERSEUS_TEST_WRITE_DIR``
    (the cache entry's directory), as a planner stopped while saving would be."""
    from pathlib import Path

    from perseus.atomic import atomic_output

    directory = Path(os.environ[WRITE_DIR])
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_output(directory / "frontier.json") as f:
        f.write(b'{"points": [')
        f.flush()
        while True:
            time.sleep(0.1)
