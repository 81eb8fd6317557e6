"""``open_gpu`` / ``open_spec``: the single place that maps a GPU kind to its backend class.

Why here and not on ``GPUSpec``: the backends import the spec (to describe themselves), so the
spec must not import them; this module is the only one that imports the backends, lazily, so
opening an NVML GPU never loads the simulator and vice versa.
"""

from __future__ import annotations

import os
from typing import Any

from perseus.gpu.device import GPUDevice
from perseus.gpu.errors import GPUInvalidArgumentError, GPULibraryMissingError
from perseus.gpu.spec import GPUSpec

KINDS = ("auto", "nvml", "sim")
ENV_KIND = "PERSEUS_GPU"


def resolve_kind(kind: str = "auto") -> str:
    """"auto" defers to ``$PERSEUS_GPU`` (sim|nvml) and otherwise means NVML; explicit kinds win."""
    if kind not in KINDS:
        raise GPUInvalidArgumentError(f"Unknown GPU kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "auto":
        env = os.environ.get(ENV_KIND, "").strip().lower()
        if env and env not in KINDS:
            raise GPUInvalidArgumentError(f"{ENV_KIND}={env!r} is invalid; use one of {', '.join(KINDS)}")
        kind = env if env in ("sim", "nvml") else "auto"
    return kind


def open_gpu(kind: str = "auto", index: int | None = None, *, zeusd_socket: str | None = None,
             **sim_kwargs: Any) -> GPUDevice:
    """Open one GPU.

    ``kind``: "nvml" (real GPU; ``index`` is the CUDA device index of this process, mapped through
    ``CUDA_VISIBLE_DEVICES``), "sim" (``index`` selects the simulated GPU's shared state file;
    ``sim_kwargs`` go to ``SimulatedGPU``), or "auto" (``$PERSEUS_GPU`` if set, else NVML, and a
    clear ``GPULibraryMissingError`` if NVML is unavailable).

    ``zeusd_socket``: wrap that device in ``ZeusdGPU``, so clock locks, power limits and energy go
    through Zeus's daemon on that socket; ``None`` means ``$PERSEUS_ZEUSD_SOCKET`` (unset: no
    zeusd), ``""`` means no zeusd whatever the environment says.
    """
    from perseus.gpu.zeusd.client import zeusd_socket_from_env

    socket_path = zeusd_socket_from_env() if zeusd_socket is None else zeusd_socket.strip()
    device = _open_base(kind, index, **sim_kwargs)
    if not socket_path:
        return device
    from perseus.gpu.zeusd.device import ZeusdGPU

    try:
        return ZeusdGPU(device, socket_path)
    except BaseException:
        device.close()
        raise


def _open_base(kind: str, index: int | None, **sim_kwargs: Any) -> GPUDevice:
    resolved = resolve_kind(kind)
    if resolved == "sim":
        from perseus.gpu.sim.device import SimulatedGPU

        return SimulatedGPU(0 if index is None else index, **sim_kwargs)
    if sim_kwargs:
        raise GPUInvalidArgumentError(
            f"Simulated-GPU settings {sorted(sim_kwargs)} were given for an NVML GPU; "
            "use kind='sim' (or PERSEUS_GPU=sim)"
        )
    from perseus.gpu.nvml.device import NVMLGPU

    try:
        return NVMLGPU(index)
    except GPULibraryMissingError as exc:
        if resolved == "auto":
            raise GPULibraryMissingError(
                f"No NVIDIA GPU could be opened automatically ({exc.what})"
            ) from exc
        raise


def open_spec(spec: GPUSpec) -> GPUDevice:
    """Open the device a spec describes (attaching, for a simulated GPU): the controller process
    and the clock reset after a controller death open their own handle this way."""
    return open_gpu(spec.kind, spec.index, zeusd_socket=spec.zeusd_socket, **spec.sim)
