"""One Perseus process changes a GPU's clocks at a time: its claim on the physical GPU.

Why: two trainers on one GPU (two jobs given the same card, a run started twice) would each lock
the clock the other's work runs at, and each would count the whole GPU's energy as its own. The
first to claim the GPU controls its clocks; another one measures only and says why (``claim_clocks``).

A claim is an ``flock`` on a file named by the GPU's UUID in the claim directory:
``$PERSEUS_CLAIM_DIR``, by default ``/tmp/perseus-gpu-claims``. A fixed path, not ``$TMPDIR`` or
``/run/user/<uid>``: every process on the machine must find the same file, whoever runs it, so the
directory is made like ``/tmp`` itself (anyone may add a file, only its owner remove it) and a
claim file another user made is locked read-only. Containers that share a GPU have a ``/tmp`` each:
mount one host directory into every one of them and point ``$PERSEUS_CLAIM_DIR`` at it, or they
will not see each other's claims. A simulated GPU's claim lies beside its state file (its identity
is that file; its UUID repeats in every state directory). The kernel drops the lock when the last
process holding it exits, so a claim never outlives its holder; the controller process inherits
it, so it lasts until the clocks are reset.

The file holds its holder's pid while held and is emptied on a clean release: a second process
names the first, and a new holder knows that the previous one exited without releasing, so a
lock in force then is that process's leftover (reset as usual) rather than someone else's.

A lock someone else holds at start-up (another job, an administrator) is left alone: ``claim_clocks``
reports it and the clocks are not touched. That is seen where the backend can tell (``LockReader``):
the simulated GPU exactly, NVML best effort (``NVMLGPU.is_clock_locked``).

With perseus clockd none of this runs here: the daemon holds the GPUs and claims them per client.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from perseus.gpu.device import GPUDevice

log = logging.getLogger(__name__)

ENV_CLAIM_DIR = "PERSEUS_CLAIM_DIR"
DEFAULT_CLAIM_DIR = Path("/tmp/perseus-gpu-claims")


@runtime_checkable
class LockReader(Protocol):
    """A backend that can tell whether the GPU's SM clock is locked right now."""

    def is_clock_locked(self) -> bool: ...


class ClaimHeld(NamedTuple):
    """Another process holds the claim: its pid as it wrote it (None where unreadable)."""

    path: Path
    pid: int | None


class GPUClaim:
    """This process's claim (an open, locked file): ``release`` ends it; a forked child ``forget``s
    its copy, which leaves the parent's claim in force."""

    def __init__(self, fd: int, path: Path, left_by: int | None) -> None:
        self.fd = fd
        self.path = path
        self.left_by = left_by  # the previous holder's pid, where it exited without releasing

    def release(self) -> None:
        """Mark the claim released cleanly (an empty file) and drop it. Idempotent."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass  # a read-only copy of another user's file: nothing to mark
        self.forget()

    def forget(self) -> None:
        """Close this process's descriptor only (the lock stays while another process holds it)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def claim_dir() -> Path:
    return Path(os.environ.get(ENV_CLAIM_DIR) or DEFAULT_CLAIM_DIR)


def claim_path(device: GPUDevice) -> Path:
    """Where ``device``'s claim lives (the module docstring says why there). A simulated GPU's from
    its spec (its state directory and index: ``gpu<index>.state`` there), not the simulator itself."""
    spec = device.underlying.spec()
    if device.simulated and spec.sim.get("state_dir") is not None:
        return Path(spec.sim["state_dir"]) / f"gpu{spec.index}.claim"
    return claim_dir() / f"{device.uuid}.claim"


def _make_dir(path: Path) -> None:
    if path.is_dir():
        return
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(path, 0o1777)  # like /tmp: shared by every user, files removable by their owner only
    except OSError:
        pass  # made by another user a moment ago


def try_claim(path: Path) -> GPUClaim | ClaimHeld:
    """Claim the GPU whose claim file is ``path``, or name who holds it. Raises ``OSError`` where
    no claim file can be made (a read-only directory)."""
    _make_dir(path.parent)
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    writable = True
    try:
        fd = os.open(path, os.O_RDWR | flags, 0o666)
    except PermissionError:
        fd, writable = os.open(path, os.O_RDONLY | flags), False  # another user's file: flock needs no write access
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _pid(fd)
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return ClaimHeld(path, holder)
        raise
    if not writable:  # the claim holds; a second process cannot name us, nor could we mark a release
        return GPUClaim(fd, path, None)
    left_by = _pid(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the claim holds all the same
    return GPUClaim(fd, path, left_by)


def _pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def foreign_lock_mhz(device: GPUDevice) -> int | None:
    """The clock a lock in force holds the GPU at (0 where unknown), or None when the backend sees
    no lock or cannot tell."""
    reader = device.underlying
    if not isinstance(reader, LockReader) or not reader.is_clock_locked():
        return None
    return device.locked_sm_clock_mhz() or 0


def claim_clocks(device: GPUDevice) -> tuple[GPUClaim | None, str | None]:
    """Claim ``device`` for this process's clock changes before anything touches its clocks: the
    claim (None where no claim file can be made: nobody is kept out, and the failure is logged) or
    one line saying why this process must not change its clocks (another Perseus process holds it,
    or someone else's lock is in force), naming what its measurements then mean."""
    gpu = f"{'simulated ' if device.simulated else ''}GPU {device.index} ({device.name})"
    path = claim_path(device)
    try:
        found = try_claim(path)
    except OSError as exc:
        log.warning("perseus: could not claim %s at %s (%s); another Perseus process changing its clocks "
                    "would not be noticed", gpu, path, exc)
        found = None
    if isinstance(found, ClaimHeld):
        who = f"pid {found.pid}" if found.pid is not None else "pid unknown"
        return None, (f"perseus: {gpu} is claimed by another Perseus process ({who}; claim file {path}), which changes "
                      "its clocks: this one changes none, and the energy it reports is the whole GPU's, the other "
                      "process's work included; give each Perseus process a GPU of its own")
    try:
        locked = foreign_lock_mhz(device)
    except BaseException:
        if found is not None:
            found.release()
        raise
    if locked is None:
        return found, None
    if found is not None and found.left_by is not None:
        log.warning("perseus: %s: a clock lock left by a Perseus process (pid %d) that exited without releasing "
                    "it; resetting it", gpu, found.left_by)
        return found, None
    if found is not None:
        found.release()
    at = f" at {locked} MHz" if locked else ""
    return None, (f"perseus: the SM clock of {gpu} is already locked{at} by someone else (another job, an "
                  "administrator, a tool): Perseus leaves it alone and changes no clock, so what it measures runs "
                  f"at that clock; if the lock is stale, `sudo nvidia-smi -i {device.index} -rgc` resets it")
