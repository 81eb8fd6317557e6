"""Run DeepSpeed pipelines on CPU (gloo) without its two-minute JIT compile, for tests and the demo.

With ``DS_ACCELERATOR=cpu``, ``deepspeed.comm.torch.TorchBackend.__init__`` calls
``build_shm_op()``, which JIT-compiles the ``deepspeed_shm_comm`` C++ extension with ninja
(about two minutes on two cores) and, before that, probes every DeepSpeed op builder. The op
serves one purpose: ``inference_all_reduce`` (tensor-parallel inference kernels) uses it when
``torch.ops.deepspeed.inference_all_reduce_`` exists and falls back to
``torch.distributed.all_reduce`` otherwise. Pipeline training over gloo never calls it, so
:func:`skip_shm_comm_op` replaces ``build_shm_op`` with "no op available" — the very value
DeepSpeed itself uses on platforms where the op is incompatible — before the backend is created.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from perseus.errors import PerseusError

_SKIP_MARK = "__perseus_skips_shm__"


def _comm_torch_module() -> Any:
    # ``import deepspeed.comm.torch as m`` yields the torch package (deepspeed.comm re-exports it).
    return importlib.import_module("deepspeed.comm.torch")


def _no_shm_op() -> None:
    """Stands in for ``build_shm_op``: no shared-memory op, so gloo's all_reduce is used."""
    return None


setattr(_no_shm_op, _SKIP_MARK, True)


def skip_shm_comm_op() -> None:
    """Keep DeepSpeed's CPU backend from compiling its shared-memory comm op; call before init_distributed.

    Idempotent. Refuses when DeepSpeed's backend already exists (too late to matter).
    """
    module = _comm_torch_module()
    if getattr(module.build_shm_op, _SKIP_MARK, False):
        return
    import deepspeed.comm.comm as ds_comm

    if getattr(ds_comm, "cdb", None) is not None:
        raise PerseusError(
            "skip_shm_comm_op() must run before deepspeed.init_distributed(); DeepSpeed's comm backend already exists"
        )
    module.build_shm_op = _no_shm_op


def shm_comm_op_skipped() -> bool:
    """True when :func:`skip_shm_comm_op` is in effect."""
    return bool(getattr(_comm_torch_module().build_shm_op, _SKIP_MARK, False))


def init_cpu_distributed(timeout_s: float = 120.0) -> None:
    """``DS_ACCELERATOR=cpu``, no shm op, ``deepspeed.init_distributed("gloo")`` from torchrun's env."""
    from datetime import timedelta

    accelerator = os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if accelerator != "cpu":
        raise PerseusError(f"init_cpu_distributed needs DS_ACCELERATOR=cpu, but it is {accelerator!r}")
    skip_shm_comm_op()
    import deepspeed

    deepspeed.init_distributed("gloo", timeout=timedelta(seconds=timeout_s))
