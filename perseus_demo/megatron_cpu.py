"""Run real megatron-core pipeline schedules on CPU (gloo), for tests and the demo.

megatron-core's schedules and p2p code assume CUDA in three places: receive buffers are
allocated on ``torch.cuda.current_device()``, batched p2p ends with ``torch.cuda.synchronize()``,
and a few bookkeeping tensors are created with ``device="cuda"``. Inside :func:`cpu_execution`
those are redirected to the CPU, so the very same schedule code (and its exact instruction
order) runs on a machine without a GPU. Nothing here is used on GPU machines.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

from perseus.errors import PerseusError

_CPU = torch.device("cpu")


def _is_cuda_device(device: Any) -> bool:
    """True for anything torch would read as a CUDA device: "cuda", "cuda:0", cuda devices, ints."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # a bare index means a CUDA device (what torch.cuda.current_device() returns)
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA devices in torch calls to the CPU (``device=`` keywords, ``.cuda()``, ``.to()``)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def patched_attributes(owner: object, **values: object) -> Iterator[None]:
    """``owner``'s attributes set to ``values`` for the block, the old ones put back after it.

    The stand-ins (a lambda for ``torch.cuda.current_device``, a class for ``torch.cuda.Stream``)
    do not have the types torch's stubs declare; they need only work for the calls megatron-core makes.
    """
    saved = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def cpu_execution() -> Iterator[None]:
    """Let CUDA-assuming megatron-core code run on the CPU for the duration of the block.

    Refuses to run where CUDA is available: there the redirection would silently move real
    training off the GPU.
    """
    if torch.cuda.is_available():
        raise PerseusError("perseus_demo.megatron_cpu.cpu_execution is for CPU-only machines; CUDA is available here")
    # device 0 is mapped to the CPU by the mode
    stand_ins = patched_attributes(torch.cuda, current_device=lambda: 0, synchronize=lambda device=None: None)
    with stand_ins, CudaToCpuMode():
        yield


def init_cpu_distributed() -> None:
    """Initialise the default process group with gloo from torchrun's environment variables."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")


def init_cpu_rng(seed: int = 1234) -> None:
    """Make megatron-core's RNG tracker usable without CUDA.

    The tracker's ``fork()`` swaps CUDA RNG states; the inference tracker makes it a no-op, which
    is exact here because CPU runs use dropout 0.
    """
    from megatron.core.tensor_parallel import random as mcore_random

    torch.manual_seed(seed)
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


class _NoStream:
    """One stand-in CUDA stream (and its events): on the CPU every op is already ordered."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _NoStream:
        return self

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


@contextlib.contextmanager
def moe_cpu_execution() -> Iterator[None]:
    """:func:`cpu_execution` plus what megatron-core's MoE layers (expert parallelism, the
    ``alltoall`` token dispatcher) assume beyond it, measured on 0.16.1:

    - the dispatcher copies routing counts to the host on a side CUDA stream
      (``torch.cuda.Stream``, ``torch.cuda.stream``, ``current_stream``): one stand-in stream, so
      the copy runs in line and no ``record_stream`` happens;
    - gradients of the expert-parallel gather allocate on ``torch.cuda.current_device()`` inside
      autograd's backward, where the device-rewriting mode is not active: it returns "cpu" here;
    - ``moe_utils.router_gating_linear`` reads ``te_general_gemm``, which is undefined without
      Transformer Engine (a NameError on CPU): set to None, megatron's own fallback;
    - the dispatcher passes its split sizes as numpy arrays, which gloo's ``all_to_all_single``
      binding does not take: converted to lists.
    """
    import torch.distributed as dist
    from megatron.core.transformer.moe import moe_utils

    stream = _NoStream()
    with cpu_execution():
        had_gemm = hasattr(moe_utils, "te_general_gemm")
        original_a2a = dist.all_to_all_single

        def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                              group: Any = None, async_op: bool = False) -> Any:
            def as_list(sizes: Any) -> Any:
                return None if sizes is None else [int(v) for v in sizes]

            return original_a2a(output, input, as_list(output_split_sizes), as_list(input_split_sizes), group=group,
                                async_op=async_op)

        cuda = patched_attributes(torch.cuda, current_device=lambda: "cpu", Stream=lambda *args, **kwargs: stream,
                                  current_stream=lambda device=None: stream,
                                  stream=lambda s=None: contextlib.nullcontext())
        if not had_gemm:
            moe_utils.te_general_gemm = None
        try:
            with cuda, patched_attributes(dist, all_to_all_single=all_to_all_single):
                yield
        finally:
            if not had_gemm:
                del moe_utils.te_general_gemm
