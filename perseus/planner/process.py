"""Rank 0's planner in a child process at lower priority, so planning does not slow training.

Why a process and not a thread: the planner's Python-level work holds the GIL, and a trainer's
Python thread, which spends a step mostly blocked on the GPU, waits for the GIL at every wake-up
(benchmarks/bench_planning_interference.py measures it; docs/runtime.md has the numbers). A
child process only competes for a CPU core, and at ``nice`` 10 it yields to the trainer.

Why its own session: Linux's autogroup scheduling (on by default in common distributions' kernels)
shares the CPU fairly between sessions first, and only within a session by nice. A planner in
the trainer's session spends the trainer's session's share, so the trainer waits longer for a CPU
at every wake-up however niced the planner is; in a session of its own it spends its own share.
It runs single-threaded (OpenBLAS/MKL/OpenMP threads = 1): it is meant to take at most one core.

How: ``subprocess`` runs ``python -c`` that lowers its priority before importing anything and
then calls ``child_main`` of this file (no ``multiprocessing`` spawn: that would re-import the trainer's
``__main__`` script). The parent writes one pickled request to the child's stdin (the planner
function by reference, schedule, profile, options, the cache entry to write, whether the slices
carry planned timelines, the parent's ``sys.path``). The child plans, then does all the work on
the whole frontier itself: it encodes every stage's slice (``stage_plan.encode_stage``, with each
point's simulated timeline when a switch latency is hidden) and writes the frontier to the cache (atomically,
``perseus.store.cache``). It writes one pickled reply on a private copy of its stdout (stdout itself goes
to stderr, so a solver's banner never corrupts the reply): ``("ok", hand-over)`` or ``("error", line)``,
the hand-over being each stage's bytes ready to send, a few numbers and the cache file's fate
(``PlannedStages``). So rank 0's training thread never holds or decodes the whole frontier: it
unpickles bytes and sends them. A reader thread in the parent blocks on that pipe (no GIL held
while waiting), so the engine's per-step ``status`` check costs nothing. A child that dies
without a reply is a planning error naming its exit status. The child exits on its own when its
parent disappears (it checks its parent id every ``_WATCH_S``), so killing the trainer leaves no
orphan planner; a child stopped mid-write (``close``, a kill, its trainer gone) leaves no
temporary file in the cache (``atomic.remove_temporaries``).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from perseus.atomic import remove_temporaries
from perseus.store.cache import RunCache
from perseus.errors import FrontierError
from perseus.frontier import NO_NON_COMPUTE, Frontier, NonCompute
from perseus.planner import PlannerOptions
from perseus.planner.handoff import calibrate_handoff, sending_keys, with_handoff
from perseus.profile import Profile
from perseus.schedules import Schedule

# Planning status broadcast from rank 0 every step while a plan is pending.
PENDING, READY, FAILED = 0, 1, 2
NICE = 10
_WATCH_S = 0.2
_writes_in: Path | None = None  # in the child: the cache directory it writes the frontier into
# Math libraries' thread pools in the planner process: one thread each (it takes at most one core
# beside the trainer; a trainer's own setting, e.g. OMP_NUM_THREADS, is for the trainer).
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# The child is this module run with ``python -m``: its top-level imports are light (numpy, the data
# core), so it lowers its priority (``--nice``) before the planner's own imports (scipy, numba), which
# come with the unpickled request.
PlanFunction = Callable[[Schedule, Profile, PlannerOptions], Frontier]
StageEncoder = Callable[[Frontier, int], bytes]


def start_child(nice: int = NICE, own_session: bool = True) -> subprocess.Popen[bytes]:
    """Start a planner process that imports the planner and waits for its job on stdin.

    Started ahead (while profiling), its start-up (Python, numpy, scipy: seconds on a busy machine)
    is over by the time the profile is ready. ``own_session``: in a new session, so its own
    autogroup (module docstring); False only to measure what that buys (benchmarks)."""
    env = {**os.environ, **SINGLE_THREADED}
    root = str(Path(__file__).resolve().parents[2])  # the perseus this process runs, first
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen(
        [sys.executable, "-m", "perseus.planner.process", "--nice", str(int(nice)), "--parent", str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, start_new_session=own_session,
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


@dataclass(frozen=True)
class PlannedStages:
    """What the planner process hands rank 0 instead of the frontier: every stage's plan, encoded
    and ready to send (``stage_plan.encode_stage``), and a few numbers about the whole frontier.

    ``saved_to``: the cache file the planner process wrote; ``save_error``: why it could not
    (e.g. "No space left on device"); both None without a cache."""

    stage_bytes: tuple[bytes, ...]
    num_points: int
    num_paced_points: int
    solve_time_s: float
    metadata: dict[str, Any] = field(default_factory=dict)
    saved_to: str | None = None
    save_error: str | None = None

    def bytes_of(self, stage: int) -> bytes:
        """The encoded plan of ``stage`` (what ``stage_plan.distribute`` sends its ranks)."""
        if not 0 <= stage < len(self.stage_bytes):
            raise FrontierError(f"stage {stage} is not in this {len(self.stage_bytes)}-stage frontier")
        return self.stage_bytes[stage]


def hand_over(frontier: Frontier, cache: RunCache | None, encode_stage: StageEncoder) -> dict[str, Any]:
    """The planner process's work on a finished frontier, so rank 0 has none: every stage's bytes,
    and the frontier written to the cache. Plain values, so the reply unpickles anywhere."""
    if not isinstance(frontier, Frontier):
        raise TypeError(f"the planner returned {type(frontier).__name__}, not a Frontier")
    stages = [encode_stage(frontier, s) for s in range(frontier.schedule.num_stages)]
    saved_to = save_error = None
    if cache is not None:
        try:
            saved_to = str(cache.save_frontier(frontier))  # atomic: the old file or none stays
        except OSError as exc:
            save_error = exc.strerror or str(exc)
    return {"stages": stages, "points": len(frontier.points), "paced_points": len(frontier.paced_points),
            "solve_time_s": float(frontier.solve_time_s), "metadata": dict(frontier.metadata),
            "saved_to": saved_to, "save_error": save_error}


def planned_stages(body: dict[str, Any]) -> PlannedStages:
    """Rank 0's side of ``hand_over``: O(bytes), no decoding of any plan."""
    return PlannedStages(tuple(body["stages"]), int(body["points"]), int(body["paced_points"]),
                         float(body["solve_time_s"]), dict(body["metadata"]), body["saved_to"], body["save_error"])


class ProcessPlanner:
    """One planning run in a niced child process; its hand-over (``PlannedStages``) or its error.

    ``started``: a child from ``start_child`` to run it in (started fresh if absent or dead).
    ``cache``: where the child writes the frontier (rank 0's cache entry), None for nowhere.
    ``timelines``: each stage's bytes carry every point's planned timeline (``stage_plan.frontier_timing``).
    ``measured_s``: the all-max step as the job ran it; the child plans with the hand-off that makes
    the profile's all-max makespan that long (``handoff.calibrate_handoff``; None: none).
    ``non_compute``: each iteration's time outside the instructions, measured on the same steps;
    the frontier carries it (``perseus.frontier.non_compute``)."""

    def __init__(self, schedule: Schedule, profile: Profile, options: PlannerOptions, plan: PlanFunction,
                 nice: int = NICE, started: subprocess.Popen[bytes] | None = None,
                 cache: RunCache | None = None, timelines: bool = False, measured_s: float | None = None,
                 non_compute: NonCompute = NO_NON_COMPUTE) -> None:
        self.result: PlannedStages | None = None
        self.error: str | None = None
        self._done = threading.Event()
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._writes_in = cache.dir if cache is not None else None  # the child's files go there
        try:  # two pickles: the path first, so the child can import the planner function's module
            job = (plan, schedule, profile, options, cache, timelines, measured_s, non_compute)
            request = pickle.dumps(list(sys.path)) + pickle.dumps(job, pickle.HIGHEST_PROTOCOL)
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
            if self._writes_in is not None:  # a child stopped by a signal (close(), the OOM killer) mid-write
                remove_temporaries(self._writes_in, proc.pid)
            if not reply:
                self.error = f"planner process ended without a result ({_exit_status(code)})"
                return
            kind, body = pickle.loads(reply)
            if kind == "ok":
                self.result = planned_stages(body)
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
    if _writes_in is not None:  # os._exit runs no cleanup: a write the main thread was making stays
        remove_temporaries(_writes_in, os.getpid())
    os._exit(3)


def child_main(parent: int) -> None:
    """Entry point of the planner process: one request on stdin, one reply on the reply pipe."""
    global _writes_in  # the watcher thread's: where to clean up if the trainer goes
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed (a solver's banner) goes to stderr, never into the reply
    try:
        plan, schedule, profile, options, cache, timelines, measured_s, non_compute = _read_request()
        _writes_in = cache.dir if cache is not None else None
        handoff_s = calibrate_handoff(schedule, profile, measured_s) if measured_s is not None else 0.0
        frontier = plan(schedule, with_handoff(profile, handoff_s, sending_keys(schedule)), options)
        if isinstance(frontier, Frontier) and (handoff_s > 0 or non_compute):
            metadata = {**frontier.metadata, "handoff_s": handoff_s} if handoff_s > 0 else frontier.metadata
            frontier = replace(frontier, metadata=metadata, non_compute=non_compute or frontier.non_compute)
        from perseus.planner import stage_plan as slices
        # the instructions' own durations: the runtime times each clock request by them, not by the hand-off
        timing = slices.frontier_timing(frontier, profile) if timelines and isinstance(frontier, Frontier) else None
        message: tuple[str, Any] = ("ok", hand_over(frontier, cache, partial(slices.encode_stage, timing=timing)))
    except BaseException as exc:  # noqa: BLE001 - every failure is one line for the trainer's log
        message = ("error", f"{type(exc).__name__}: {exc}")
    try:
        reply.write(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        reply.close()
    except BrokenPipeError:  # the trainer stopped listening (it closed the run, or died): nobody to tell
        os._exit(0)


def _read_request() -> tuple[PlanFunction, Schedule, Profile, PlannerOptions, RunCache | None, bool, float | None,
                             NonCompute]:
    stream = sys.stdin.buffer
    path = pickle.load(stream)
    sys.path[:] = path + [p for p in sys.path if p not in path]  # the planner function's module imports
    return pickle.load(stream)


def _main(argv: list[str] | None = None) -> None:
    """``python -m perseus.planner.process --nice N --parent PID``: what ``start_child`` runs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m perseus.planner.process")
    parser.add_argument("--nice", type=int, default=NICE)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    os.nice(args.nice)
    child_main(args.parent)


if __name__ == "__main__":
    _main()
