"""Shared, crash-safe state of a simulated GPU: one small mmap'd file per simulated device.

Why a file: a real GPU's clock and energy counter are global to the machine. The trainer process
runs instructions on the simulated GPU while the controller process changes its clock, and tests
inspect what a crashed process left behind; all of them must see one state.

Concurrency: writers (clock changes, busy begin/end) take an exclusive ``flock`` and readers a
shared one. Unlike a seqlock, a process SIGKILLed mid-update cannot wedge readers: the kernel
drops its lock (forked children re-open the file so they don't keep a dead parent's lock alive).
A read is two syscalls plus one ``struct.unpack`` (a few microseconds).

Power is piecewise constant between writes, so the file stores (energy at ``t_ref``, power since
``t_ref``) and any process can compute the energy at any later time without writing. Times are
``CLOCK_MONOTONIC`` seconds (``time.monotonic()``), which is system-wide on Linux.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct
import tempfile
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypedDict

from perseus.gpu.errors import GPUError, GPUNotFoundError

MAGIC = b"PSG1"
VERSION = 6
FILE_SIZE = 4096
_HEADER = struct.Struct("<4sI")  # magic, version
_PARAMS_OFFSET = 512  # u32 length + JSON
_PARAMS_MAX = FILE_SIZE - _PARAMS_OFFSET - 4
_DYN_OFFSET = 16


@dataclass
class SimState:
    """Dynamic fields of a simulated GPU (one fixed-size record in the state file)."""

    locked: int = 0  # 1 while an SM clock lock is in effect
    locked_mhz: int = 0  # the locked SM clock (meaningful when locked)
    mem_locked_mhz: int = 0  # 0 = memory clock not locked
    busy: int = 0  # 1 while an instruction is running
    busy_pid: int = 0  # process running it (stale-busy detection)
    _pad: int = 0
    power_limit_w: float = 0.0
    activity: float = 0.0
    compute_fraction: float = 0.0
    energy_j: float = 0.0  # true energy at t_ref
    t_ref: float = 0.0  # CLOCK_MONOTONIC time of the last write
    power_w: float = 0.0  # true power since t_ref
    slow_integral: float = 0.0  # ∫ slowdown dt over the current busy interval, up to t_ref
    busy_start: float = 0.0
    counter_j: float = 0.0  # readable (coarse) counter value at boundary counter_k
    counter_true_j: float = 0.0  # true energy at boundary counter_k
    counter_k: int = 0  # index of the last counter update boundary stored
    n_lock: int = 0  # number of applied clock locks (observability for tests/benchmarks)
    n_reset: int = 0  # number of applied clock resets
    wall_time: float = 0.0  # time.time() of the last write, for humans
    last_busy_start: float = 0.0  # CLOCK_MONOTONIC start of the last finished instruction
    last_busy_s: float = 0.0  # its simulated duration (what a CUDA event pair would have timed)
    pending: int = 0  # 1 while a clock change is on its way (switch latency)
    pending_locked: int = 0  # what it will set: locked (1) at pending_mhz, or default clocks (0)
    pending_mhz: int = 0
    pending_at: float = 0.0  # CLOCK_MONOTONIC time it takes effect
    last_busy_mhz: int = 0  # SM clock set (locked, else the default) when the last instruction ended
    applied_at: float = 0.0  # CLOCK_MONOTONIC time the clock in force took effect
    busy_progress: float = 0.0  # ∫ 1/slowdown dt over the current busy interval (max-clock seconds done)
    last_busy_work_s: float = 0.0  # the last instruction's max-clock time (its work)
    last_busy_applied_at: float = 0.0  # when the clock set at its end took effect
    busy_start_mhz: int = 0  # SM clock set when the current instruction began
    last_busy_start_mhz: int = 0  # ... and when the last finished one began
    counter_prev_j: float = 0.0  # readable counter at boundary counter_k − 1 (read during a reporting lag)
    window_j: float = 0.0  # true energy at min(t_ref, end of the sampled part of the period after counter_k)


_DYN = struct.Struct("<6I" + "10d" + "q2Q" + "3d" + "3I" + "d" + "I" + "4d" + "2I" + "2d")
_NAMES = tuple(f.name for f in fields(SimState))
assert len(_NAMES) == 35 and _DYN_OFFSET + _DYN.size <= _PARAMS_OFFSET


def _values(state: SimState) -> tuple[object, ...]:
    return tuple(getattr(state, n) for n in _NAMES)


def default_state_dir() -> Path:
    """``$PERSEUS_SIM_GPU_DIR`` or a per-user directory under the system temp dir."""
    env = os.environ.get("PERSEUS_SIM_GPU_DIR")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"perseus-sim-gpu-{os.getuid()}"


def state_path(index: int, state_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where simulated GPU ``index`` keeps its state."""
    base = Path(state_dir) if state_dir is not None else default_state_dir()
    return base / f"gpu{index}.state"


class SimParams(TypedDict, total=False):
    """What a simulated GPU's file records about the device (JSON after the state): every process
    that attaches reads the same model, counter period, noise and seed."""

    model: dict[str, Any]  # DVFSModel.to_dict()
    energy_update_period_s: float
    noise: float
    seed: int
    switch_latency_s: float
    counter_phase_s: float
    faults: dict[str, Any]  # SimFaults.to_dict()
    created_s: float  # CLOCK_MONOTONIC time the file was created: the faults' time origin


class SimStateFile:
    """Open (creating or attaching to) the state file of one simulated GPU."""

    def __init__(self, path: Path, params: SimParams | None, *, reset: bool = False,
                 init_state: SimState | None = None) -> None:
        """``params=None`` attaches to an existing file; otherwise the file is created (or, with
        ``reset``, re-initialized) with these parameters and ``init_state``."""
        self.path = Path(path)
        if params is None and not self.path.exists():
            raise GPUNotFoundError(
                f"No simulated GPU state at {self.path}; create the simulated GPU first "
                "(SimulatedGPU(index, preset=...)) or check PERSEUS_SIM_GPU_DIR"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                valid = self._valid()
                if params is not None and (reset or not valid):
                    self._initialize(params, init_state or SimState())
                elif not valid:
                    raise GPUError(f"{self.path} is not a simulated GPU state file (bad magic/version)")
                # Map through a separate open file description: mmap keeps a dup of the fd it is
                # given, and flock locks belong to the description, so mapping ``_fd`` itself
                # would let the mapping's hidden fd hold our locks (see _reopen_in_child).
                map_fd = os.open(self.path, os.O_RDWR)
                try:
                    self._mm = mmap.mmap(map_fd, FILE_SIZE)
                finally:
                    os.close(map_fd)
                self.created = params is not None and (reset or not valid)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(self._fd)
            raise
        ref = weakref.ref(self)

        def reopen_in_child() -> None:
            if (f := ref()) is not None:
                f._reopen_in_child()
        os.register_at_fork(after_in_child=reopen_in_child)
        (n,) = struct.unpack_from("<I", self._mm, _PARAMS_OFFSET)
        self.params: SimParams = json.loads(bytes(self._mm[_PARAMS_OFFSET + 4:_PARAMS_OFFSET + 4 + n]))

    def _reopen_in_child(self) -> None:
        """A forked child must not share our open file description: ``flock`` belongs to the
        description, so a parent SIGKILLed while holding the lock would otherwise stay locked
        for as long as the child (e.g. a DataLoader worker) lives. The mmap itself stays valid."""
        if getattr(self, "_mm", None) is None:
            return
        old = self._fd
        self._fd = os.open(self.path, os.O_RDWR)
        os.close(old)

    def _valid(self) -> bool:
        if os.fstat(self._fd).st_size != FILE_SIZE:
            return False
        magic, version = _HEADER.unpack(os.pread(self._fd, _HEADER.size, 0))
        return magic == MAGIC and version == VERSION

    def _initialize(self, params: SimParams, state: SimState) -> None:
        blob = json.dumps(params, sort_keys=True).encode()
        if len(blob) > _PARAMS_MAX:
            raise GPUError(f"simulated GPU parameters too large ({len(blob)} bytes)")
        # Never shrink the file: another process may have it mmap'd (touching a page past EOF
        # is SIGBUS). Invalidate the magic, rewrite everything, then validate.
        os.pwrite(self._fd, b"\0" * FILE_SIZE, 0)
        os.ftruncate(self._fd, FILE_SIZE)
        os.pwrite(self._fd, _DYN.pack(*_values(state)), _DYN_OFFSET)
        os.pwrite(self._fd, struct.pack("<I", len(blob)) + blob, _PARAMS_OFFSET)
        os.pwrite(self._fd, _HEADER.pack(MAGIC, VERSION), 0)  # magic last: file valid only when complete

    def read(self) -> SimState:
        """Consistent snapshot (shared lock)."""
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        try:
            values = _DYN.unpack_from(self._mm, _DYN_OFFSET)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return SimState(*values)

    @contextmanager
    def update(self) -> Iterator[SimState]:
        """Read-modify-write under the exclusive lock; the yielded state is written back on exit."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            state = SimState(*_DYN.unpack_from(self._mm, _DYN_OFFSET))
            yield state
            state.wall_time = time.time()
            _DYN.pack_into(self._mm, _DYN_OFFSET, *_values(state))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if getattr(self, "_mm", None) is not None:
            self._mm.close()
            del self._mm  # closed: no mapping, as before one was made (the getattr checks)
            os.close(self._fd)


def read_sim_state(index: int, state_dir: str | os.PathLike[str] | None = None) -> SimState:
    """Snapshot of simulated GPU ``index`` from any process (e.g. after a trainer crashed)."""
    f = SimStateFile(state_path(index, state_dir), None)
    try:
        return f.read()
    finally:
        f.close()
