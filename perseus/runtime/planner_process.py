"""Rank 0's planner in a child process at lower priority, so planning does not slow training.

Why a process and not a thread: the planner's Python-level work holds the GIL, and a trainer's
Python thread, which spends a step mostly blocked on the GPU, waits for the GIL at every wake-up
(benchmarks/bench_planning_interference.py measures it; docs/runtime.md has the numbers). A
child process only competes for a CPU core, and at ``nice`` 10 it yields to the trainer.

How: ``subprocess`` runs ``python -c`` that lowers its priority before importing anything and
then calls ``child_main`` of this file (no ``multiprocessing`` spawn: that would re-import the trainer's
``__main__`` script). The parent writes one pickled request to the child's stdin (the planner
function by reference, schedule, profile, options, the parent's ``sys.path``); the child writes
one pickled reply on a private copy of its stdout (stdout itself goes to stderr, so a solver's
banner never corrupts the reply): ``("ok", version 2 frontier document)`` or ``("error", line)``.
A reader thread in the parent blocks on that pipe (no GIL held while waiting), so the engine's
per-step ``status`` check costs nothing. A child that dies without a reply is a planning error
naming its exit status. The child exits on its own when its parent disappears (it checks its
parent id every ``_WATCH_S``), so killing the trainer leaves no orphan planner.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from perseus.frontier import Frontier, frontier_from_json_dict
from perseus.planner import PlannerOptions
from perseus.profile import Profile
from perseus.schedule import Schedule

# Planning status broadcast from rank 0 every step while a plan is pending.
PENDING, READY, FAILED = 0, 1, 2
NICE = 10
_WATCH_S = 0.2
# The child lowers its priority first, then loads this file by path: importing it as
# perseus.runtime.planner_process would first import perseus.runtime (pydantic, the config), about
# as long as the planner's own imports, for nothing.
_CHILD = (
    "import os; os.nice({nice}); import importlib.util as u; "
    "s = u.spec_from_file_location('perseus_planner_child', {path!r}); m = u.module_from_spec(s); "
    "s.loader.exec_module(m); m.child_main({parent})"
)

PlanFunction = Callable[[Schedule, Profile, PlannerOptions], Frontier]


def start_child(nice: int = NICE) -> subprocess.Popen[bytes]:
    """Start a planner process that imports the planner and waits for its job on stdin.

    Started ahead (while profiling), its start-up (Python, numpy, scipy: seconds on a busy machine)
    is over by the time the profile is ready."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the perseus this process runs, first
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(nice=int(nice), path=__file__, parent=os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
    )


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a planner process (a planning run or a started child nobody needs any more)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ProcessPlanner:
    """One planning run in a niced child process; its frontier or its error, once done.

    ``started``: a child from ``start_child`` to run it in (started fresh if absent or dead)."""

    def __init__(self, schedule: Schedule, profile: Profile, options: PlannerOptions, plan: PlanFunction,
                 nice: int = NICE, started: subprocess.Popen[bytes] | None = None) -> None:
        self.result: Frontier | None = None
        self.error: str | None = None
        self._done = threading.Event()
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        try:  # two pickles: the path first, so the child can import the planner function's module
            request = pickle.dumps(list(sys.path)) + pickle.dumps((plan, schedule, profile, options), pickle.HIGHEST_PROTOCOL)
            self._proc = started if started is not None and started.poll() is None else start_child(nice)
        except Exception as exc:  # noqa: BLE001 - a planner function defined inside another, no python to run
            if started is not None:
                stop_child(started)
            self.error = f"cannot hand the planning job to a planner process ({type(exc).__name__}: {exc})"
            self._done.set()
            return
        self.pid = self._proc.pid
        self._thread = threading.Thread(target=self._talk, args=(request,), name="perseus-planner", daemon=True)
        self._thread.start()

    def _talk(self, request: bytes) -> None:
        proc = self._proc
        assert proc is not None
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(request)
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass  # the child is gone already: its exit status says why
            reply = proc.stdout.read()  # blocks without the GIL until the child answers or dies
            code = proc.wait()
            if not reply:
                self.error = f"planner process ended without a result ({_exit_status(code)})"
                return
            kind, body = pickle.loads(reply)
            if kind == "ok":
                self.result = frontier_from_json_dict(body, "frontier from the planner process")
            else:
                self.error = str(body)
        except Exception as exc:  # noqa: BLE001 - reported to every rank as a warning
            self.error = f"planner process: {type(exc).__name__}: {exc}"
        finally:
            self._done.set()

    @property
    def status(self) -> int:
        if not self._done.is_set():
            return PENDING
        return READY if self.result is not None else FAILED

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the planning run is over (tests and shutdown)."""
        return self._done.wait(timeout_s)

    def close(self) -> None:
        """Stop a planning run nobody waits for any more (training ended first)."""
        if self._proc is not None:
            stop_child(self._proc)


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# ---------------------------------------------------------------- the child


def _watch_parent(parent: int) -> None:
    """Exit as soon as the process that started us is gone (we were re-parented)."""
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(3)


def child_main(parent: int) -> None:
    """Entry point of the planner process: one request on stdin, one reply on the reply pipe."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (a solver's banner) goes to stderr, never into the reply
    try:
        plan, schedule, profile, options = _read_request()
        frontier = plan(schedule, profile, options)
        message: tuple[str, Any] = ("ok", frontier.to_json_dict())
    except BaseException as exc:  # noqa: BLE001 - every failure is one line for the trainer's log
        message = ("error", f"{type(exc).__name__}: {exc}")
    reply.write(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    reply.close()


def _read_request() -> tuple[PlanFunction, Schedule, Profile, PlannerOptions]:
    stream = sys.stdin.buffer
    path = pickle.load(stream)
    sys.path[:] = path + [p for p in sys.path if p not in path]  # the planner function's module imports
    return pickle.load(stream)
