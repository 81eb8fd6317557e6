"""Faults injected into real multi-process runs (toy pipeline, gloo, simulated GPUs).

Each test checks what docs/reliability.md promises: no rank hangs past a stated timeout, the
survivors continue at default clocks or stop cleanly, one clear log line, clocks end at default,
nothing half-written. Timeouts here are hang guards, never latency limits; the times to recover
that docs/reliability.md states are what these tests print (``pytest -s tests/runtime/test_faults.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from toy_helpers import greedy_frontier, stage_uniform_frontier
from toy_pipeline import ToyConfig, collect, launch, start

from perseus.gpu.sim.device import SimulatedGPU
from perseus.gpu.sim.state import read_sim_state
from perseus.runtime.supply import planning
from perseus.frontier import save_frontier

pytestmark = pytest.mark.distributed
HANG_S = 240  # hang guard per toy run
COLLECTIVE_TIMEOUT_S = 5.0  # the stated timeout the survivors' collectives give up after
FREQS = [1410, 1260, 1110, 960]
SWEEP = {"freq_min_mhz": 900, "freq_step_mhz": 150, "warmup_steps": 2, "iters_per_freq": 2,
         "p_blocking_seconds": 0.1}


def assert_clocks_default(cfg: ToyConfig, world: int) -> None:
    for r in range(world):
        assert read_sim_state(r, cfg.sim_dir).locked == 0, f"rank {r} left a locked clock"


def _slow_planner(schedule, profile, options=None, *, progress=None):
    time.sleep(2.0)  # rank 0 is still planning when the other rank dies
    return greedy_frontier(schedule, profile, options)


@pytest.mark.parametrize("phase", ["profiling", "planning"])
def test_rank_dies_the_other_pipeline_continues_at_default_clocks(tmp_path, monkeypatch, phase):
    """Rank 3 (pipeline 1, last stage) is SIGKILLed at a step end while profiling or planning.
    Pipeline 0 (ranks 0, 1) only meets it in Perseus's collectives: they give up within the
    stated timeout, say so in one line, and train to the end at default clocks. Rank 2, its
    pipeline partner, stops with the training's own P2P error; its clocks are reset too."""
    monkeypatch.setattr(planning, "plan_frontier", _slow_planner)  # forked ranks inherit it
    cfg = ToyConfig(num_stages=2, num_microbatches=4, dp_size=2, steps=16, die_rank=3, die_phase=phase,
                    die_after=2, dist_timeout_s=30.0, planning_grace_steps=0,
                    perseus={**SWEEP, "cache_dir": str(tmp_path / "cache"),
                             "collective_timeout_s": COLLECTIVE_TIMEOUT_S})
    started = time.monotonic()
    results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
    elapsed = time.monotonic() - started
    died_at = float((tmp_path / "run" / "rank3.died").read_text())
    assert results[3]["error"] == "no result file"  # SIGKILLed
    assert results[2]["error"] is not None  # its P2P partner is gone: the training itself stops
    for r in results[:2]:
        assert r["error"] is None, r.get("traceback")
        lines = [w for w in r["warnings"] if "continuing at default clocks without Perseus" in w]
        assert len(lines) == 1, r["warnings"]
        assert "\n" not in lines[0]
        s = r["summary"]
        assert s["phase"] == "steady"
        detached = [step for step, what, _ in s["events"] if what == "detached"]
        assert len(detached) == 1
        assert [p for _, p in s["phase_history"]][-2:] == [phase, "steady"]
        assert len(r["steps"]) == cfg.steps  # trained to the end
        after = [x for x in r["steps"] if x["step"] >= detached[0]]
        assert after and not any(x["clock_locked"] for x in after)
        recovered_at = next(x["wall"] for x in r["steps"] if x["step"] == detached[0] - 1)
        r["recover_s"] = recovered_at - died_at
    assert_clocks_default(cfg, 4)
    # nothing half-written: no temporary file in the cache
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]
    print(f"\nrank died while {phase}: survivors detached after "
          f"{max(r['recover_s'] for r in results[:2]):.2f} s; run {elapsed:.1f} s")


# ---------------------------------------------------------------- NVML fails mid-run (fake pynvml)

GPU_TESTS = Path(__file__).parents[1] / "gpu"
sys.path.insert(0, str(GPU_TESTS))
from clockd_process import clockd_process
from fake_pynvml import read_clock_calls, write_shim

VIA = ["controller", "clockd"]  # who changes the clocks: the rank's own controller process, or perseus clockd
UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000"]


@contextlib.contextmanager
def clock_source(via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *daemon_args: str) -> Iterator[Path | None]:
    """``clockd``: a ``perseus clockd`` process (``daemon_args``) the ranks reach through
    ``PERSEUS_CLOCKD_SOCKET``; yields its log. ``controller``: nothing to start (yields None)."""
    if via == "controller":
        yield None
        return
    sock_dir = Path(tempfile.mkdtemp(prefix="clockd-"))  # AF_UNIX paths are short
    monkeypatch.setenv("PERSEUS_CLOCKD_SOCKET", str(sock_dir / "c.sock"))
    try:
        with clockd_process(sock_dir / "c.sock", *daemon_args, log_path=tmp_path / "clockd.log"):
            yield tmp_path / "clockd.log"
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def install_fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock_error: int | None,
                      devices: list[dict] | None = None) -> tuple[Path, Path]:
    """The fake's shim on PYTHONPATH (controller and daemon processes import it) and in
    sys.modules (the forked ranks inherit it); returns (clock-call log dir, lost marker)."""
    import importlib.util

    shim_dir, log_dir = tmp_path / "shim", tmp_path / "nvml-calls"
    shim_dir.mkdir()
    log_dir.mkdir()
    marker = tmp_path / "gpu-lost"
    env = write_shim(shim_dir, {"lock_error": lock_error, "lost_marker": str(marker), "log_dir": str(log_dir),
                                "devices": devices})
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path / "claims"))  # the fake's UUIDs are every test's
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim_dir), os.environ.get("PYTHONPATH", "")]))
    spec = importlib.util.spec_from_file_location("pynvml", shim_dir / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    spec.loader.exec_module(module)  # replaces itself in sys.modules with the configured fake
    return log_dir, marker


@pytest.mark.parametrize("via", VIA)
@pytest.mark.parametrize("code, what", [(3, "not supported"), (15, "GPU not found")])
def test_nvml_refuses_clocks_mid_run_training_continues_at_default(tmp_path, monkeypatch, code, what, via):
    """Deployed on fake NVML GPUs, locking a lower clock fails (NOT_SUPPORTED, or GPU_IS_LOST after
    which every NVML call fails): each rank says so in one line and falls back to default clocks;
    training runs to the end; the controllers (or the daemon) reset what they could. Through
    ``perseus clockd`` the ranks are the daemon's clients, one GPU each."""
    log_dir, marker = install_fake_nvml(tmp_path, monkeypatch, code, [{"uuid": u} for u in UUIDS])
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=12, target_slowdown=1.2)
    save_frontier(stage_uniform_frontier(cfg, FREQS), tmp_path / "frontier.json")
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "gpu": "nvml", "straggler_period_steps": 2, "metrics_file": str(tmp_path / "m.jsonl"),
                   "probe_every_steps": 0}  # the plan's clocks every deployed step: a refusal lands where it is tested
    # GPU = rank: one Perseus process per GPU (a second one on a claimed GPU would measure only)
    with clock_source(via, tmp_path, monkeypatch, "--gpu", "nvml") as daemon_log:
        results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
    failed_somewhere = False
    for r in results:
        assert r["error"] is None, r.get("traceback")
        assert len(r["steps"]) == cfg.steps
        lines = [w for w in r["warnings"] if "clock control failed" in w and "continuing at default clocks" in w]
        s = r["summary"]
        if lines:
            failed_somewhere = True
            assert len(lines) == 1 and what in lines[0], r["warnings"]
        assert not [w for w in r["warnings"] if "clockd reported an error" in w], "one line, not two"
        assert s["phase"] == "fallback", s["phase_history"]  # every rank: default clocks
    assert failed_somewhere
    per_process = read_clock_calls(log_dir)
    refused = [c for calls in per_process.values() for c in calls
               if c["call"] == "nvmlDeviceSetGpuLockedClocks" and not c["ok"]]
    assert refused and all(c["error"] == code for c in refused)
    for entries in per_process.values():  # every controller/daemon GPU: nothing left locked by a successful call
        for device in {e["device"] for e in entries}:
            last = [e for e in entries if e["device"] == device][-1]
            assert last["locked"] is None or not last["ok"], entries[-3:]
    if daemon_log is not None:
        assert len(per_process) == 1, "only the daemon touched the clocks"
        assert "clock control failed" in daemon_log.read_text()
    assert marker.exists() == (code == 15)
    if code == 15:
        assert any("energy counter stopped answering" in w for r in results for w in r["warnings"])  # a lost GPU
    # the metrics file is whole: every line is JSON
    for line in (tmp_path / "m.jsonl").read_text().splitlines():
        json.loads(line)
    gaps = [dict((p, s) for s, p in r["summary"]["phase_history"]) for r in results]
    print(f"\nNVML error {code} ({via}): fallback {max(g['fallback'] - g['deployed'] for g in gaps)} step(s) "
          "after deploying")


# ---------------------------------------------------------------- clocks reset under us

CLOCK_CHECK_S = 0.2


@pytest.mark.parametrize("via", VIA)
def test_clock_reset_from_outside_is_detected_and_reapplied(tmp_path, monkeypatch, via):
    """At a step boundary every rank resets its own simulated GPU's clocks as an admin's
    ``nvidia-smi -rgc`` would. The controller of a rank holding a lower clock reads it back within
    ``clock_check_s``, re-applies it and the rank says so in one line; clocks end at default.
    Through ``perseus clockd`` the ranks may not change clocks themselves; the daemon does all that."""
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=10, target_slowdown=1.2, admin_reset_at_step=6,
                    sim_dir=str(tmp_path / "sim"))
    save_frontier(stage_uniform_frontier(cfg, FREQS), tmp_path / "frontier.json")
    # every deployed step holds the plan's clock: no default-clock probes (closed_loop.py) in between
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "clock_check_s": CLOCK_CHECK_S, "probe_every_steps": 0}
    if via == "clockd":
        cfg.perseus["sim_gpu"] = {"allow_clock_setting": False}
        for rank in (0, 1):  # the GPUs the daemon manages, as the toy ranks will use them
            SimulatedGPU(rank, preset=cfg.sim_preset, state_dir=cfg.sim_dir,
                         energy_update_period_s=cfg.energy_update_period_s, reset_state=True).close()
    with clock_source(via, tmp_path, monkeypatch, "--gpu", "sim", "--gpus", "0,1", "--sim-dir", cfg.sim_dir) as log:
        results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
    held = [r for r in results if r["admin_reset"]["held_mhz"] not in (None, max(FREQS))]
    assert held, "the slowed plan should hold a lower clock on some rank"
    for r in results:
        assert r["error"] is None, r.get("traceback")
        lines = [w for w in r["warnings"] if "changed outside Perseus" in w]
        if r in held:
            assert r["admin_reset"]["relocked_s"] is not None, "the lock was never re-applied"
            assert len(lines) == 1 and f"held {r['admin_reset']['held_mhz']} MHz" in lines[0], r["warnings"]
            assert "re-applied" in lines[0]
            assert r["summary"]["phase"] == "deployed"
            assert all(s["clock_locked"] for s in r["steps"][6:]), "the plan's clock holds after the re-apply"
        else:
            assert lines == []
    assert_clocks_default(cfg, 2)
    if log is not None:
        assert log.read_text().count("changed outside the daemon") == len(held)
    times = ", ".join(f"{r['admin_reset']['relocked_s']:.2f}" for r in held)
    print(f"\nclock reset from outside ({via}): re-applied after {times} s (check every {CLOCK_CHECK_S} s)")


def test_controller_gives_up_when_the_clock_keeps_being_changed(tmp_path, monkeypatch):
    """More than MAX_OVERRIDES overrides: the controller stops fighting the other tool, resets
    and reports ``failed`` (the runtime then falls back to default clocks)."""
    from perseus.gpu.control.controller import FrequencyController
    from perseus.gpu.control.keeper import MAX_OVERRIDES
    from perseus.gpu.sim.device import SimulatedGPU

    monkeypatch.setenv("PERSEUS_SIM_GPU_DIR", str(tmp_path / "sim"))
    gpu = SimulatedGPU(0, state_dir=tmp_path / "sim", reset_state=True)
    low = gpu.supported_sm_clocks_mhz()[-1]
    notices = []
    with FrequencyController(gpu.spec(), clock_check_s=0.05, install_signal_handlers=False) as ctl:
        ctl.set_frequency(low)
        ctl.flush()
        deadline = time.monotonic() + 60
        while not any(n.kind == "failed" for n in notices):
            assert time.monotonic() < deadline, f"no 'failed' notice: {notices}"
            if gpu.locked_sm_clock_mhz() == low:
                gpu.reset_locked_sm_clock()  # the other tool, again
            time.sleep(0.01)
            notices += ctl.notices()
        assert [n.kind for n in notices] == ["override"] * MAX_OVERRIDES + ["failed"]
        assert "changed outside Perseus" in notices[-1].message
        ctl.set_frequency(low)  # ignored from now on
        ctl.flush()
        assert not gpu.is_clock_locked()
    gpu.close()


# ---------------------------------------------------------------- disk full

def fill_disk(monkeypatch: pytest.MonkeyPatch, full_dir: Path, budget_bytes: int) -> None:
    """Files under ``full_dir`` are on a disk that fills up: ``os.write`` takes ``budget_bytes`` in
    all (the write that crosses the limit lands in part, the next fails with ENOSPC), and fsync
    fails with ENOSPC (what a delayed-allocation file system reports for buffered data). Patched
    in this process, inherited by the forked ranks; no root, no tmpfs."""
    import errno

    real_write, real_fsync = os.write, os.fsync
    left = [budget_bytes]

    def on_full_disk(fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(str(full_dir))
        except OSError:
            return False

    def write(fd, data):
        if not on_full_disk(fd):
            return real_write(fd, data)
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        part = bytes(data)[: left[0]]
        left[0] -= len(part)
        return real_write(fd, part)

    def fsync(fd):
        if on_full_disk(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)


FULL_DIR_ENV = "PERSEUS_TEST_FULL_DIR"


def greedy_frontier_on_a_full_disk(schedule, profile, options=None, *, progress=None):
    """``greedy_frontier`` in a planner process whose disk is full under ``$PERSEUS_TEST_FULL_DIR``:
    the planner process writes the frontier to the cache, so the fault must be there."""
    fill_disk(pytest.MonkeyPatch(), Path(os.environ[FULL_DIR_ENV]), budget_bytes=0)
    return greedy_frontier(schedule, profile, options)


def launch_telling_where_it_hangs(cfg: ToyConfig, out: Path, timeout_s: float) -> list[dict]:
    """``launch``, except that a rank still running after ``timeout_s`` dumps every thread's stack
    (faulthandler on SIGUSR1, inherited by the forked ranks) before it is killed, and the failure
    carries those stacks: a run that hangs fails in bounded time saying where it was stuck."""
    import faulthandler
    import signal

    out.mkdir(parents=True, exist_ok=True)
    cfg.sim_dir = cfg.sim_dir or str(out / "sim-gpus")
    (out / "dist-store").unlink(missing_ok=True)
    stacks = out / "stacks.txt"
    with open(stacks, "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        try:
            procs = start(cfg, out)
        finally:
            faulthandler.unregister(signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.1))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            os.kill(p.pid, signal.SIGUSR1)
        dumped = time.monotonic() + 5.0  # each dump names its process's current thread once
        while hung and stacks.read_text().count("Current thread") < len(hung) and time.monotonic() < dumped:
            time.sleep(0.05)
        for p in hung:
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    if hung:
        raise TimeoutError(f"toy pipeline: ranks {[procs.index(p) for p in hung]} did not finish within "
                           f"{timeout_s:g} s; their stacks:\n{stacks.read_text()[-8000:]}")
    return collect(out, len(procs))


def test_a_rank_that_hangs_fails_the_run_in_bounded_time_with_its_stacks(tmp_path):
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=14, hang_at_step=2, dist_timeout_s=60.0,
                    perseus={**SWEEP, "collective_timeout_s": 60.0})
    started = time.monotonic()
    # 30 s: long enough for the ranks to import torch and reach the hang on a loaded 2-core machine
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish within 30 s; their stacks:") as failed:
        launch_telling_where_it_hangs(cfg, tmp_path / "run", timeout_s=30.0)
    assert time.monotonic() - started < 90.0
    assert "in run_rank" in str(failed.value)  # where the main thread was: the step that sleeps forever


def test_disk_full_while_writing_cache_and_metrics_leaves_nothing_partial(tmp_path, monkeypatch):
    """Profile, frontier and metrics file all on a full disk (the trainers' and the planner
    process's): the run profiles, plans and deploys from memory; one line per file that could not
    be written; the cache holds no file, half or temporary; the metrics file ends at a whole line.

    Bounded everywhere: it takes 15-85 s beside busy processes, and its collectives and P2P give up
    after a minute instead of the defaults' five (a rank stuck there fails an assertion, not the
    hang guard); a rank still running at the guard is killed with its stacks in the failure."""
    monkeypatch.setattr(planning, "plan_frontier", greedy_frontier_on_a_full_disk)
    full = tmp_path / "full"
    full.mkdir()
    monkeypatch.setenv(FULL_DIR_ENV, str(full))  # inherited by the ranks and the planner process
    fill_disk(monkeypatch, full, budget_bytes=2000)
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=14, dist_timeout_s=60.0,
                    perseus={**SWEEP, "cache_dir": str(full / "cache"), "metrics_file": str(full / "m.jsonl"),
                             "collective_timeout_s": 60.0})
    results = launch_telling_where_it_hangs(cfg, tmp_path / "run", timeout_s=180.0)
    for r in results:
        assert r["error"] is None, r.get("traceback")
        assert r["summary"]["phase"] == "deployed"
    warnings = results[0]["warnings"]
    for what in ("profile", "frontier"):
        lines = [w for w in warnings if f"could not save the {what} to the cache" in w]
        assert len(lines) == 1 and "No space left on device" in lines[0], warnings
    assert len([w for w in warnings if "writing the metrics file" in w]) == 1, warnings
    assert [p for p in (full / "cache").rglob("*") if p.is_file()] == []
    text = (full / "m.jsonl").read_text()
    assert 0 < len(text) <= 2000 and text.endswith("\n")
    for line in text.splitlines():
        json.loads(line)
    assert_clocks_default(cfg, 2)


# ---------------------------------------------------------------- elastic restart

def test_torchrun_restart_resumes_from_the_cache_without_reprofiling(tmp_path):
    """``torchrun --max-restarts=1``: in the first attempt rank 1 SIGKILLs itself while rank 0 is
    planning (the profile is already cached); torchrun restarts both ranks, which plan from the
    cached profile and deploy without profiling again. Clocks end at default."""
    import dataclasses
    import subprocess

    out = tmp_path / "run"
    out.mkdir()
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=12, die_rank=1, die_phase="planning", die_after=2,
                    die_on_attempt=0, planning_grace_steps=100_000, sim_dir=str(out / "sim-gpus"),
                    perseus={**SWEEP, "cache_dir": str(tmp_path / "cache"), "collective_timeout_s": COLLECTIVE_TIMEOUT_S})
    (tmp_path / "cfg.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
           # torch 2.13 shares the rendezvous TCPStore across restarts without a per-attempt prefix,
           # so a restarted gloo group can read the dead attempt's addresses; a fresh store per attempt
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           "--monitor-interval=0.2", str(Path(__file__).parent / "toy_torchrun.py"), str(tmp_path / "cfg.json"), str(out)]
    started = time.monotonic()
    with open(tmp_path / "torchrun.log", "w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = "hung"
        log.seek(0)
        output = log.read()
    elapsed = time.monotonic() - started
    assert code == 0, "\n".join(x for x in output.splitlines() if not x.startswith("perseus step"))[-6000:]
    assert (out / "rank1.died").exists()  # the first attempt's death happened
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert (entry / "profile.json").exists() and (entry / "frontier.json").exists()
    for r in range(2):
        result = json.loads((out / f"rank{r}.json").read_text())
        assert result["attempt"] == 1 and result["error"] is None, result.get("traceback")
        phases = [p for _, p in result["summary"]["phase_history"]]
        assert phases == ["warmup", "planning", "deployed"], phases  # no profiling the second time
        assert any(what == "source" and "cached profile" in str(data) for _, what, data in result["summary"]["events"])
        assert len(result["steps"]) >= cfg.steps
    assert_clocks_default(cfg, 2)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]
    died_at = float((out / "rank1.died").read_text())
    first = json.loads((out / "rank0.json").read_text())["steps"]
    deployed = next(x["wall"] for x in first if x["phase"] == "deployed")
    print(f"\ntorchrun restart: death -> first step of the new attempt {first[0]['wall'] - died_at:.1f} s, "
          f"-> plan deployed {deployed - died_at:.1f} s; whole run {elapsed:.1f} s")


# ---------------------------------------------------------------- the controller killed

def test_controller_killed_while_a_plan_holds_a_clock(tmp_path):
    """Deployed with a plan that holds one lower clock per stage (no further requests), every
    rank's controller process is SIGKILLed: the runtime notices at the next step end, says so in
    one line, resets the clock the dead controller left and falls back; training runs to the end."""
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=10, target_slowdown=1.2, kill_controller_at_step=5)
    save_frontier(stage_uniform_frontier(cfg, FREQS), tmp_path / "frontier.json")
    cfg.perseus = {"frontier_path": str(tmp_path / "frontier.json"), "warmup_steps": 2, "cache_dir": None,
                   "straggler_period_steps": 2, "probe_every_steps": 0}  # no default-clock probe at the kill
    results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
    assert any(r["controller_killed"]["was_locked"] for r in results)
    recover = []
    for r in results:
        assert r["error"] is None, r.get("traceback")
        assert len(r["steps"]) == cfg.steps
        lines = [w for w in r["warnings"] if "clock control failed" in w]
        assert len(lines) == 1 and "exited unexpectedly" in lines[0], r["warnings"]
        assert r["summary"]["phase"] == "fallback"
        assert not r["steps"][-1]["clock_locked"]
        if r["controller_killed"]["was_locked"]:
            unlocked = next(s["wall"] for s in r["steps"] if s["step"] >= 5 and not s["clock_locked"])
            recover.append(unlocked - r["controller_killed"]["wall"])
    assert_clocks_default(cfg, 2)
    print(f"\ncontroller killed: clock back at default within {max(recover):.2f} s (at a step end)")


@pytest.mark.parametrize("via", VIA)
def test_nvml_refuses_clocks_while_profiling_the_profile_is_discarded(tmp_path, monkeypatch, via):
    """A sweep whose clocks were refused measured nothing but default clocks: the ranks agree at
    the sweep's end to discard it (nothing cached) and keep default clocks."""
    install_fake_nvml(tmp_path, monkeypatch, 3, [{"uuid": u} for u in UUIDS])  # GPU = rank
    cfg = ToyConfig(num_stages=2, num_microbatches=4, steps=14,
                    perseus={**SWEEP, "p_blocking_w": 60.0, "cache_dir": str(tmp_path / "cache"), "gpu": "nvml"})
    with clock_source(via, tmp_path, monkeypatch, "--gpu", "nvml"):
        results = launch(cfg, tmp_path / "run", timeout_s=HANG_S)
    for r in results:
        assert r["error"] is None, r.get("traceback")
        assert len(r["steps"]) == cfg.steps
        assert [p for _, p in r["summary"]["phase_history"]] == ["warmup", "profiling", "steady"]
        assert len([w for w in r["warnings"] if "clock control failed" in w]) == 1, r["warnings"]
    assert not [p for p in (tmp_path / "cache").rglob("*.json") if p.name != "key.json"]
