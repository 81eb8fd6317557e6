"""The policy of one ``perseus clockd``: who may connect, how fast, and what a claim must prove."""

from __future__ import annotations

from dataclasses import dataclass

from perseus.gpu.clockd import wire
from perseus.gpu.errors import GPUInvalidArgumentError


@dataclass
class DaemonOptions:
    """Policy knobs of one daemon (the CLI flags of ``perseus clockd``)."""

    socket_path: str
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()
    rate_hz: float = 500.0  # sustained clock changes per second per client
    burst: int = 50  # bucket size: changes allowed back to back
    max_clients: int = 64
    socket_mode: int = 0o666  # who may connect() at all; the uid/gid allowlist is the real check
    verify_environ: bool = False  # require CUDA_VISIBLE_DEVICES in HELLO == the peer's /proc environ
    require_open_device: bool = False  # the peer must hold each claimed GPU's /dev/nvidia<N> open
    liveness_s: float = 0.5  # how often peer pids are checked (a leaked socket fd hides a death)
    hello_timeout_s: float = 30.0  # a connection that holds no GPU after this long is closed
    min_clock_check_s: float = 0.05  # a client's read-back period is at least this (one device read each)

    def __post_init__(self) -> None:
        if not self.allow_uids and not self.allow_gids:
            raise GPUInvalidArgumentError("clockd needs at least one --allow-uid or --allow-gid")
        if self.rate_hz <= 0 or self.burst < 1:
            raise GPUInvalidArgumentError("clockd: rate must be > 0 and burst >= 1")
        if not 0 < self.min_clock_check_s <= wire.MAX_CHECK_S:
            raise GPUInvalidArgumentError(f"clockd: the minimum clock-check period must be in (0, {wire.MAX_CHECK_S:g}] s")
