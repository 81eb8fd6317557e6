"""Run an unmodified Megatron-LM ``pretrain_gpt.py`` with ``--perseus`` on a CPU-only machine.

    torchrun --nproc_per_node 2 -m perseus_demo.megatron_lm_cpu --megatron-lm /path/to/Megatron-LM \\
        <pretrain_gpt.py arguments, e.g. CPU_GPT_ARGS> --perseus --perseus-gpu sim

Megatron-LM has no CPU training mode. This runner starts ``perseus_megatron.pretrain_gpt`` (the
same launcher a GPU user runs) after redirecting, in this process only, what stops a real
``pretrain_gpt.py`` without CUDA — each accommodation below names the obstacle it removes. None
of it is imported by ``perseus_megatron``; on a machine with CUDA it refuses to run.

- ``triton`` (imported unconditionally for the batch-invariant kernels): a stand-in for that one
  megatron module (batch-invariant mode refused);
- ``initialize_megatron`` asserts CUDA: called with ``allow_no_cuda=True``;
- model-parallel groups are only created when ``torch.cuda.device_count() > 0``: created after
  Megatron's own distributed set-up, with the same call on the gloo default group;
- the CUDA RNG tracker: megatron-core's inference tracker (exact here: dropout 0);
- the dataset index C++ helper (built with ``make`` and pybind11 at start-up): the installed
  megatron-core wheel's compiled helper when its ``helpers.cpp`` is the same source, else built
  with the running interpreter when pybind11 is installed;
- fused kernels (need nvcc) and the JIT warm-up (CUDA tensors): skipped;
- ``torch.cuda.Stream`` / ``current_stream`` and CUDA devices in torch calls:
  ``perseus_demo.megatron_cpu.cpu_execution`` plus stream stand-ins.

Flags Megatron needs on CPU are in ``CPU_GPT_ARGS`` (gloo, local transformer, no fusions, dropout
0, ``--rerun-mode disabled``, ``--clip-grad 0``, mock data). ``--summary-dir DIR`` writes each
rank's Perseus summary to ``DIR/rank<R>.json`` when Perseus closes (tests read it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any, Iterator, Sequence

# A tiny GPT for CPU runs: add --num-layers, --micro-batch-size, --global-batch-size,
# --train-iters and the parallel sizes.
CPU_GPT_ARGS: tuple[str, ...] = (
    "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings", "32",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
    "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
    "--attention-dropout", "0", "--hidden-dropout", "0",
    "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "constant",
    "--rerun-mode", "disabled", "--clip-grad", "0", "--eval-interval", "1000", "--eval-iters", "0",
    "--log-interval", "1", "--no-save-optim", "--no-save-rng", "--seed", "1234",
)

SUMMARY_FLAG = "--summary-dir"


BATCH_INVARIANT = "megatron.core.transformer.custom_layers.batch_invariant_kernels"


def _stub_batch_invariant_kernels() -> None:
    """Megatron imports its triton batch-invariant kernels at start-up; without triton, a stand-in.

    Only that one module is replaced (a fake ``triton`` would make torch believe triton exists).
    Batch-invariant mode itself (``--batch-invariant-mode``) is refused: it needs triton and CUDA.
    """
    if importlib.util.find_spec("triton") is not None or BATCH_INVARIANT in sys.modules:
        return
    stub = types.ModuleType(BATCH_INVARIANT, "CPU stand-in (perseus_demo.megatron_lm_cpu): no triton here")

    def enable_batch_invariant_mode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("--batch-invariant-mode needs triton and CUDA; perseus_demo.megatron_lm_cpu runs without")

    stub.enable_batch_invariant_mode = enable_batch_invariant_mode  # type: ignore[attr-defined]
    stub.set_batch_invariant_mode = lambda enabled=True: enabled and enable_batch_invariant_mode()  # type: ignore[attr-defined]
    stub.disable_batch_invariant_mode = lambda: None  # type: ignore[attr-defined]
    stub.is_batch_invariant_mode_enabled = lambda: False  # type: ignore[attr-defined]
    sys.modules[BATCH_INVARIANT] = stub


def _wheel_helpers(checkout_cpp: Path) -> Path | None:
    """The installed megatron-core's compiled dataset helper, if built from the same helpers.cpp."""
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = Path(str(dist.locate_file("megatron/core/datasets")))
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built, source = folder / f"helpers_cpp{suffix}", folder / "helpers.cpp"
    if not (built.exists() and source.exists()):
        return None
    same = hashlib.sha256(source.read_bytes()).digest() == hashlib.sha256(checkout_cpp.read_bytes()).digest()
    return built if same else None


def _load_dataset_helpers() -> None:
    """Make ``megatron.core.datasets.helpers_cpp`` importable without Megatron's make/pybind11 step."""
    import megatron.core.datasets as datasets

    folder = Path(datasets.__file__).parent
    with contextlib.suppress(ImportError):
        import megatron.core.datasets.helpers_cpp  # noqa: F401  (already built in the checkout)

        return
    built = _wheel_helpers(folder / "helpers.cpp")
    if built is None:
        try:
            import pybind11
        except ImportError:
            raise RuntimeError(
                "megatron's dataset helper is not built and cannot be: pip install pybind11 (or run "
                f"`make -C {folder}` with this Python)"
            ) from None
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        built = folder / f"helpers_cpp{suffix}"
        include = [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]
        subprocess.run(["c++", "-O2", "-shared", "-std=c++17", "-fPIC", *include, str(folder / "helpers.cpp"),
                        "-o", str(built)], check=True)
    spec = importlib.util.spec_from_file_location("megatron.core.datasets.helpers_cpp", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["megatron.core.datasets.helpers_cpp"] = module
    spec.loader.exec_module(module)


def _patch_initialize() -> None:
    """Megatron's start-up, minus its CUDA-only steps (see the module docstring)."""
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.training import initialize, training

    from perseus_demo.megatron_cpu import init_cpu_rng

    original_init = initialize.initialize_megatron

    @functools.wraps(original_init)
    def initialize_megatron(*args: Any, **kwargs: Any) -> Any:
        kwargs["allow_no_cuda"] = True
        return original_init(*args, **kwargs)

    training.initialize_megatron = initialize.initialize_megatron = initialize_megatron

    original_distributed = initialize._initialize_distributed

    @functools.wraps(original_distributed)
    def initialize_distributed(*args: Any, **kwargs: Any) -> Any:
        # Megatron creates its model-parallel groups only when it sees GPUs; let it see one for
        # that call (set_device is then a no-op: everything runs on the CPU).
        count, set_device = torch.cuda.device_count, torch.cuda.set_device
        torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
        torch.cuda.set_device = lambda device: None  # type: ignore[assignment]
        try:
            return original_distributed(*args, **kwargs)
        finally:
            torch.cuda.device_count, torch.cuda.set_device = count, set_device

    initialize._initialize_distributed = initialize_distributed

    original_seed = initialize._set_random_seed

    @functools.wraps(original_seed)
    def set_random_seed(seed: int, *args: Any, **kwargs: Any) -> Any:
        result = original_seed(seed, *args, **kwargs)
        init_cpu_rng(seed + 100 * mpu.get_pipeline_model_parallel_rank())
        return result

    initialize._set_random_seed = set_random_seed
    initialize._compile_dependencies = _load_dataset_helpers
    initialize._warmup_jit_function = lambda: None


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def synchronize(self) -> None: ...
    def wait_stream(self, other: Any) -> None: ...
    def wait_event(self, event: Any) -> None: ...
    def record_event(self, event: Any = None) -> None: ...
    def __enter__(self) -> _Stream:
        return self
    def __exit__(self, *exc: object) -> None: ...


@contextlib.contextmanager
def _cpu_streams() -> Iterator[None]:
    import torch

    saved = torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream
    torch.cuda.Stream = _Stream  # type: ignore[misc,assignment]
    torch.cuda.current_stream = lambda device=None: _Stream()  # type: ignore[assignment]
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream = saved


def _write_summaries(folder: Path) -> None:
    """Each rank's Perseus summary goes to ``folder/rank<R>.json`` when Perseus closes."""
    from perseus_megatron import integration

    original_enable = integration.enable

    @functools.wraps(original_enable)
    def enable(*args: Any, **kwargs: Any) -> Any:
        handle = original_enable(*args, **kwargs)
        close = handle.close

        def close_and_report() -> None:
            if not handle._closed:
                folder.mkdir(parents=True, exist_ok=True)
                rank = os.environ.get("RANK", "0")
                (folder / f"rank{rank}.json").write_text(json.dumps(handle.summary(), default=str))
            close()

        handle.close = close_and_report  # type: ignore[method-assign]
        return handle

    integration.enable = enable


def split_summary_dir(argv: Sequence[str]) -> tuple[Path | None, list[str]]:
    rest, folder, args = [], None, list(argv)
    i = 0
    while i < len(args):
        if args[i] == SUMMARY_FLAG and i + 1 < len(args):
            folder, i = Path(args[i + 1]), i + 2
            continue
        if args[i].startswith(SUMMARY_FLAG + "="):
            folder = Path(args[i].split("=", 1)[1])
        else:
            rest.append(args[i])
        i += 1
    return folder, rest


def main(argv: Sequence[str] | None = None) -> None:
    import torch

    from perseus.errors import PerseusError
    from perseus_demo.megatron_cpu import cpu_execution
    from perseus_megatron import pretrain_gpt

    if torch.cuda.is_available():
        raise PerseusError("perseus_demo.megatron_lm_cpu is for CPU-only machines; on GPUs run "
                           "python -m perseus_megatron.pretrain_gpt")
    summary_dir, rest = split_summary_dir(sys.argv[1:] if argv is None else argv)
    checkout, _ = pretrain_gpt.split_checkout(rest)
    pretrain_gpt.check_checkout(checkout)
    pretrain_gpt.put_checkout_first(checkout)
    _stub_batch_invariant_kernels()
    _patch_initialize()
    if summary_dir is not None:
        _write_summaries(summary_dir)
    with cpu_execution(), _cpu_streams():
        pretrain_gpt.main(rest)


if __name__ == "__main__":
    main()
