"""A GPU ``perseus clockd`` manages, and the applier thread that owns its device while serving.

A driver call takes milliseconds, and eight GPUs must not queue behind each other, so each GPU has
its own applier thread; the daemon's loop hands it targets (``request``) and collects what it did
(``results``). A target the applier has not taken yet is replaced by the next one (coalescing).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from perseus.gpu.control.keeper import ClockKeeper
from perseus.gpu.device import GPUDevice

log = logging.getLogger("perseus.clockd")

NVIDIA_MAJOR = 195


class Holder(Protocol):
    """A client that may hold a GPU: its notices go to it; ``who`` names it in messages."""

    @property
    def who(self) -> str: ...


@dataclass(frozen=True)
class Claim:
    """Who holds a GPU, as its applier sees it: notices go to ``holder``; ``check_s`` > 0 reads a
    held lock back that often (the client's ``clock_check_s``, at least the daemon's minimum)."""

    holder: Holder | None
    check_s: float


class ManagedGPU:
    """A managed GPU: its device, its holder and the clock the daemon last set (None = default)."""

    def __init__(self, device: GPUDevice) -> None:
        self.device = device
        self.index = device.index
        self.uuid = device.uuid
        self.name = device.name
        self.clocks = list(device.supported_sm_clocks_mhz())
        self.clockset = frozenset(self.clocks)
        self.default_mhz = int(device.default_sm_clock_mhz())
        self.holder: Holder | None = None
        self.requested: int | None = None  # loop-owned: the latest target handed to the applier
        # The applier thread (one per GPU) owns the device while serving: a driver call takes
        # milliseconds, and GPUs must not wait for each other. Its ``keeper`` applies targets,
        # gives up when the device refuses one and reads a held lock back, exactly as the local
        # controller process does. Shared with the loop under ``cond``:
        self.cond = threading.Condition()
        self.want: int | None = None
        self.want_tag: object = None
        self.want_force = False
        self.want_claim: Claim | None = None  # a new holder for the keeper, handed over with a request
        self.want_seq = 0  # bumped per request; requests not yet taken are coalesced to the latest
        self.done_seq = 0  # want_seq of the last request the applier finished
        self.results: list[tuple[object, str, int | None, dict[str, Any]]] = []  # (tag, kind, target, info)
        self.stopping = False
        self.keeper = ClockKeeper(device, self._keeper_event)  # applier-owned
        self.claim = Claim(None, 0.0)  # applier-owned: whose notices these are, how often to read back
        self.thread: threading.Thread | None = None
        minor = device.minor_number()
        # st_rdev of /dev/nvidia<minor> (NVIDIA's character-device major is 195); None: unknown
        self.rdev: int | None = os.makedev(NVIDIA_MAJOR, minor) if minor is not None else None

    @property
    def current(self) -> int | None:
        """The clock the applier last set (None = default)."""
        return self.keeper.current

    def request(self, target: int | None, tag: object, *, force: bool = False, claim: Claim | None = None) -> int:
        """Hand ``target`` to the applier (replacing one it has not taken yet); returns its seq.
        ``claim``: the GPU changes hands (HELLO, release) before ``target`` is applied."""
        with self.cond:
            self.want, self.want_tag = target, tag
            self.want_force = force or self.want_force
            self.want_claim = claim if claim is not None else self.want_claim
            self.want_seq += 1
            self.cond.notify()
            return self.want_seq

    def _keeper_event(self, event: dict[str, Any]) -> None:
        """A keeper notice (``failed``, ``override``): for the holder of the claim it came from."""
        with self.cond:
            self.results.append((self.claim.holder, event["event"], None, event))

    def run_applier(self, wake: Callable[[], None]) -> None:
        while True:
            with self.cond:
                while self.done_seq == self.want_seq and not self.stopping:
                    dues = [d for d in (self.keeper.next_check_in(self.claim.check_s), self.keeper.retry_in())
                            if d is not None]
                    due = min(dues) if dues else None
                    if due is not None and due <= 0:
                        break
                    self.cond.wait(due)
                if self.done_seq == self.want_seq:
                    if self.stopping:
                        return  # stopping, and nothing left to apply
                    request = None  # a read-back or the retry of a refused call is due
                else:
                    request = (self.want, self.want_tag, self.want_seq, self.want_force, self.want_claim)
                    self.want_force, self.want_claim = False, None
            if request is None:
                retried = self.keeper.maybe_retry()
                if retried is not None and retried[0] != "retrying":  # for the holder, as its request's result
                    with self.cond:
                        self.results.append((self.claim.holder, retried[0], retried[1],
                                             {"message": self.keeper.last_error}))
                self.keeper.maybe_check(self.claim.check_s)
                wake()
                continue
            target, tag, seq, force, claim = request
            if claim is not None:
                self.claim = claim
                self.keeper.restart()
            outcome = self.keeper.apply(target, force=force)
            if outcome == "retrying" and claim is not None:  # the GPU changes hands: its reset settles first
                outcome = self.keeper.settle() or outcome
            with self.cond:
                self.done_seq = seq
                if outcome != "retrying":  # a retried call's result comes when it is made (above)
                    self.results.append((tag, outcome, target, {"message": self.keeper.last_error}))
            wake()

    def reset(self) -> bool:
        """Reset the clocks here, on the calling thread (the applier is stopped); False if refused."""
        if not self.keeper.reset_now():  # a refusal is retried first (``ClockKeeper.reset_now``)
            log.error("perseus clockd: resetting GPU %d failed: %s", self.index, self.keeper.last_error)
            return False
        return True

    def describe(self, slot: int) -> dict[str, Any]:
        """This GPU as a HELLO reply lists it, at its ``slot`` in the client's claim."""
        return {"slot": slot, "uuid": self.uuid, "name": self.name, "index": self.index,
                "clocks": self.clocks, "default_mhz": self.default_mhz}
