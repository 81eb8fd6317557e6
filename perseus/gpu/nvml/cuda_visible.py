"""Map a process's CUDA device index to a physical (NVML) device.

NVML enumerates every GPU on the node and ignores ``CUDA_VISIBLE_DEVICES``; CUDA (and torch) number
only the visible ones. Clocking the wrong physical GPU would silently slow down another job, so
the mapping is done explicitly here, by UUID, as CUDA does it.
"""

from __future__ import annotations

import os

from perseus.gpu.errors import GPUNotFoundError, GPUNotSupportedError


def parse_cuda_visible_devices(value: str | None) -> list[str] | None:
    """Tokens of ``CUDA_VISIBLE_DEVICES``; ``None`` when unset (every device visible).

    Like CUDA, parsing stops at the first malformed token: ``"0,1,x,2"`` makes devices 0 and 1
    visible.
    """
    if value is None:
        return None
    tokens: list[str] = []
    for raw in value.split(","):
        tok = raw.strip()
        if tok.isdigit() or tok.upper().startswith(("GPU-", "MIG-")):
            tokens.append(tok)
        else:
            break
    return tokens


def resolve_physical_index(cuda_index: int, visible: list[str] | None, uuids: list[str]) -> int:
    """Physical NVML index of CUDA device ``cuda_index`` given the visible tokens and all UUIDs.

    ``uuids[i]`` is the UUID of NVML device ``i``. Tokens may be physical indices, full UUIDs, or
    unique UUID prefixes (``GPU-8a7f``). MIG instances are rejected: Perseus locks clocks of the
    whole GPU, which would affect every instance on it.
    """
    if cuda_index < 0:
        raise GPUNotFoundError(f"CUDA device index must be >= 0, got {cuda_index}")
    if visible is None:
        if cuda_index >= len(uuids):
            raise GPUNotFoundError(
                f"CUDA device {cuda_index} does not exist: this node has {len(uuids)} GPU(s)"
            )
        return cuda_index
    if cuda_index >= len(visible):
        raise GPUNotFoundError(
            f"CUDA device {cuda_index} is not visible: CUDA_VISIBLE_DEVICES="
            f"{','.join(visible) or '(empty)'} exposes {len(visible)} device(s)"
        )
    tok = visible[cuda_index]
    if tok.upper().startswith("MIG-"):
        raise GPUNotSupportedError(
            f"CUDA device {cuda_index} is a MIG instance ({tok}). Perseus changes the clock of the "
            "whole GPU, which would affect every MIG instance on it; run on a full GPU "
            "(MIG disabled)."
        )
    if tok.isdigit():
        phys = int(tok)
        if phys >= len(uuids):
            raise GPUNotFoundError(
                f"CUDA_VISIBLE_DEVICES entry {tok} names a GPU that does not exist "
                f"(this node has {len(uuids)} GPU(s))"
            )
        return phys
    matches = [i for i, u in enumerate(uuids) if u.lower().startswith(tok.lower())]
    if not matches:
        raise GPUNotFoundError(
            f"CUDA_VISIBLE_DEVICES entry {tok} matches no GPU on this node; UUIDs: {', '.join(uuids)}"
        )
    if len(matches) > 1:
        raise GPUNotFoundError(
            f"CUDA_VISIBLE_DEVICES entry {tok} is an ambiguous UUID prefix (matches "
            f"{', '.join(uuids[i] for i in matches)}); use a longer prefix"
        )
    return matches[0]


def default_cuda_index() -> int:
    """The CUDA device this process most likely uses when the caller gave none.

    One visible device → 0; otherwise torchrun's ``LOCAL_RANK`` (the usual one-GPU-per-rank
    convention); otherwise 0. Callers that know ``torch.cuda.current_device()`` should pass it.
    """
    visible = parse_cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None and len(visible) == 1:
        return 0
    local_rank = os.environ.get("LOCAL_RANK", "")
    return int(local_rank) if local_rank.isdigit() else 0
