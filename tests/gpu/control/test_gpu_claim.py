"""The GPU's claim (``perseus.gpu.control.claim``): one Perseus process changes a GPU's clocks; the
claim lasts as long as something may still change them (the controller process inherits it) and
never longer (the kernel drops it with its last holder); a lock someone else holds is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perseus.gpu import SimulatedGPU
from perseus.gpu.clock_service import NoClockAccess, open_clock_service
from perseus.gpu.control.controller import FrequencyController
from perseus.gpu.control.claim import (
    DEFAULT_CLAIM_DIR,
    ClaimHeld,
    GPUClaim,
    claim_clocks,
    claim_dir,
    claim_path,
    try_claim,
)
from perseus.gpu.sim.faults import SimFaults


@pytest.fixture(autouse=True)
def _local_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSEUS_CLOCKD_SOCKET", raising=False)
    monkeypatch.delenv("PERSEUS_ZEUSD_SOCKET", raising=False)


def test_one_holder_at_a_time_named_by_pid_and_a_clean_release_leaves_nothing(tmp_path):
    path = tmp_path / "claims" / "GPU-x.claim"
    first = try_claim(path)
    assert isinstance(first, GPUClaim) and first.left_by is None
    assert try_claim(path) == ClaimHeld(path, os.getpid())  # a second open of the file: held
    first.release()
    first.release()  # idempotent
    again = try_claim(path)
    assert isinstance(again, GPUClaim) and again.left_by is None, "released cleanly"
    again.forget()  # as a holder that died: the kernel drops the lock, the pid stays
    after = try_claim(path)
    assert isinstance(after, GPUClaim) and after.left_by == os.getpid()
    after.release()
    assert os.stat(path.parent).st_mode & 0o1777 == 0o1777, "shared like /tmp"


def test_where_claims_live(sim_dir, monkeypatch, tmp_path):
    g = SimulatedGPU(0, reset_state=True)
    assert claim_path(g) == g.state_path.with_suffix(".claim"), "a simulated GPU is its state file"
    g.close()
    monkeypatch.delenv("PERSEUS_CLAIM_DIR", raising=False)
    assert claim_dir() == DEFAULT_CLAIM_DIR == Path("/tmp/perseus-gpu-claims"), "one path for every user"
    monkeypatch.setenv("PERSEUS_CLAIM_DIR", str(tmp_path))
    assert claim_dir() == tmp_path


def test_a_second_clock_service_on_the_gpu_is_refused_until_the_first_closes(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    first = open_clock_service("sim", 0, {}, control=True)
    try:
        with pytest.raises(NoClockAccess, match=f"claimed by another Perseus process \\(pid {os.getpid()}"):
            open_clock_service("sim", 0, {}, control=True)
        measuring = open_clock_service("sim", 0, {}, control=False)  # measuring needs no claim
        measuring.controller.close()
        measuring.device.close()
    finally:
        first.controller.close()
        first.device.close()
    second = open_clock_service("sim", 0, {}, control=True)
    second.controller.close()
    second.device.close()
    g.close()


def test_a_forked_child_leaves_its_parents_claim_in_force(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    service = open_clock_service("sim", 0, {}, control=True)
    try:
        child = os.fork()
        if child == 0:  # a DataLoader worker: forgets the parent's controller (and claim), then exits
            service.controller.close()
            os._exit(0)
        os.waitpid(child, 0)
        assert try_claim(claim_path(g)) == ClaimHeld(claim_path(g), os.getpid())
    finally:
        service.controller.close()
        service.device.close()
    g.close()


def test_the_controller_process_holds_the_claim_until_it_has_reset_the_clocks(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    claim = try_claim(claim_path(g))
    assert isinstance(claim, GPUClaim)
    c = FrequencyController(g.spec(), install_signal_handlers=False, claim=claim).start()
    try:
        c.set_frequency(g.supported_sm_clocks_mhz()[4])
        c.flush()
        claim.forget()  # the trainer's descriptor is gone (as when it is SIGKILLed): its controller still holds it
        assert isinstance(try_claim(claim_path(g)), ClaimHeld)
    finally:
        c.close()
    after = try_claim(claim_path(g))
    assert isinstance(after, GPUClaim) and not g.is_clock_locked()
    after.release()
    g.close()


TRAINER = """
import sys, time
from perseus.gpu.clock_service import open_clock_service
service = open_clock_service("sim", 0, {}, control=True)
service.controller.set_frequency(int(sys.argv[1]))
service.controller.flush()
print(service.controller.pid, flush=True)
time.sleep(120)
"""


def test_a_sigkilled_trainer_leaves_no_stale_claim_and_no_lock(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    low = g.supported_sm_clocks_mhz()[5]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    p = subprocess.Popen([sys.executable, "-c", TRAINER, str(low)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None and int(p.stdout.readline())
        assert g.locked_sm_clock_mhz() == low
        held = try_claim(claim_path(g))
        assert held == ClaimHeld(claim_path(g), p.pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 20
        found = try_claim(claim_path(g))
        while isinstance(found, ClaimHeld) and time.monotonic() < deadline:  # its controller resets, then exits
            time.sleep(0.05)
            found = try_claim(claim_path(g))
        assert isinstance(found, GPUClaim), "the claim outlived every holder"
        assert found.left_by == p.pid, "the trainer died without releasing it"
        assert not g.is_clock_locked(), "the controller reset the clocks before it let go of the claim"
        found.release()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    g.close()


def test_a_lock_left_by_a_perseus_process_that_died_is_reset_but_a_foreign_one_is_not(sim_dir):
    g = SimulatedGPU(0, reset_state=True)
    g.set_locked_sm_clock(g.supported_sm_clocks_mhz()[3])
    dead = try_claim(claim_path(g))
    assert isinstance(dead, GPUClaim)
    dead.forget()  # it held the claim and the lock, and died with both
    claim, denied = claim_clocks(g)
    assert denied is None and isinstance(claim, GPUClaim) and claim.left_by == os.getpid()
    claim.release()
    g.close()
    foreign = SimulatedGPU(0, reset_state=True, faults=SimFaults(foreign_lock_mhz=1100))
    claim, denied = claim_clocks(foreign)
    assert claim is None and denied is not None and "already locked" in denied
    free = try_claim(claim_path(foreign))
    assert isinstance(free, GPUClaim), "refused: the claim was let go at once"
    free.release()
    assert foreign.is_clock_locked(), "someone else's lock stays"
    foreign.close()
