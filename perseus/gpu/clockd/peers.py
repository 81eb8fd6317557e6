"""Who a ``perseus clockd`` peer is: what the kernel and ``/proc`` say, never what the peer claims.

The kernel gives a connection's pid, uid and gid (``SO_PEERCRED``); ``/proc/<pid>`` tells a live
peer from a reused pid, what CUDA_VISIBLE_DEVICES it was started with and which device files it
holds open. The daemon checks a HELLO against these (``--verify-environ``,
``--require-open-device``) before it lets the peer claim a GPU.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

from perseus.gpu.clockd import wire
from perseus.gpu.clockd.managed_gpu import ManagedGPU

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of ``sock``, from the kernel (``OSError``
    when the peer is already gone)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


def proc_start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/PID/stat): tells a live peer from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.rsplit(b")", 1)[-1].split()[19].decode()


def open_char_devices(pid: int, device_prefix: str = "/dev/") -> set[int] | None:
    """``st_rdev`` of every character device ``pid`` holds open; None if its fds can't be read.

    Holding ``/dev/nvidia<N>`` open proves the job was given that GPU: the scheduler's device
    cgroup (Kubernetes device plugin, SLURM ConstrainDevices) decides who may open it.
    """
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return None
    found: set[int] = set()
    for name in names:
        try:
            # Only stat device nodes: stat on a hostile FUSE file could block the daemon's loop.
            if not os.readlink(f"{base}/{name}").startswith(device_prefix):
                continue
            st = os.stat(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        if stat.S_ISCHR(st.st_mode):
            found.add(st.st_rdev)
    return found


def proc_environ_cvd(pid: int) -> tuple[bool, str | None]:
    """(readable, CUDA_VISIBLE_DEVICES) of the peer's exec-time environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False, None
    for entry in entries:
        if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
            return True, entry.split(b"=", 1)[1].decode(errors="replace")
    return True, None


def verify_environ(pid: int, cuda_visible_devices: str | None) -> None:
    """The CUDA_VISIBLE_DEVICES a HELLO sent is the one ``pid`` was started with (else ``forbidden``)."""
    readable, cvd = proc_environ_cvd(pid) if pid > 0 else (False, None)
    if not readable:
        raise wire.ProtocolError(f"cannot read the environment of pid {pid} to verify "
                                 "CUDA_VISIBLE_DEVICES (is the daemon in the host pid namespace?)",
                                 wire.E_FORBIDDEN)
    if cvd != cuda_visible_devices:
        raise wire.ProtocolError(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} differs from "
                                 f"the process environment ({cvd!r})", wire.E_FORBIDDEN)


def verify_open_devices(pid: int, gpus: list[ManagedGPU]) -> None:
    """``pid`` holds each GPU's ``/dev/nvidia<N>`` open (else ``forbidden``)."""
    held = open_char_devices(pid) if pid > 0 else None
    if held is None:
        raise wire.ProtocolError(f"cannot inspect the open files of pid {pid} (the daemon needs "
                                 "the host pid namespace and CAP_SYS_PTRACE)", wire.E_FORBIDDEN)
    for g in gpus:
        if g.rdev is None:
            raise wire.ProtocolError(f"GPU {g.index} has no known device file; cannot verify the claim",
                                     wire.E_FORBIDDEN)
        if g.rdev not in held:
            raise wire.ProtocolError(
                f"pid {pid} does not hold GPU {g.index}'s device file "
                f"(/dev/nvidia{os.minor(g.rdev)}) open: initialize CUDA on it before asking for clocks, "
                "or the GPU is not assigned to this job", wire.E_FORBIDDEN)
