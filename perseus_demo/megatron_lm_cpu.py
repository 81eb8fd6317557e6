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
0, ``--rerun-mode disabled``, ``--clip-grad 0``, mock data). Runner options: ``--summary-dir DIR``
writes each rank's Perseus summary (and its per-step records, ``step_records``) to
``DIR/rank<R>.json`` when Perseus closes (tests read it).
On the simulated GPU the runtime makes every forward/backward one of its kernels: the CPU time
is its max-clock time, stretched by the clock in force, so clocks change measured time and
energy and the profile, plan and saving mean something. ``--simulate-compute`` also pads each
kernel to a nominal time at the max clock (as ``perseus demo`` does), so the clocks' effect
stands out of CPU noise on a shared machine. :func:`launch` runs it all under torchrun
(``perseus demo --megatron-lm PATH``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
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
SIMULATE_FLAG = "--simulate-compute"


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

    def set_batch_invariant_mode(enabled: bool = True) -> bool:
        if enabled:
            enable_batch_invariant_mode()
        return enabled

    def disable_batch_invariant_mode() -> None:
        pass

    def is_batch_invariant_mode_enabled() -> bool:
        return False

    for function in (enable_batch_invariant_mode, set_batch_invariant_mode, disable_batch_invariant_mode,
                     is_batch_invariant_mode_enabled):
        setattr(stub, function.__name__, function)
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
        torch.cuda.device_count = lambda: 1
        torch.cuda.set_device = lambda device: None
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
    initialize._warmup_jit_function = lambda *args, **kwargs: None  # 0.19 passes tp_size=


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

    from perseus_demo.megatron_cpu import patched_attributes

    with patched_attributes(torch.cuda, Stream=_Stream, current_stream=lambda device=None: _Stream(),
                            stream=lambda stream=None: contextlib.nullcontext()):
        yield


# Nominal kernel time at the max clock per instruction kind (as perseus_demo.megatron_demo).
NOMINAL_S = {"forward": 0.010, "backward": 0.020}


def _instrument_enable(summary_dir: Path | None, simulate_compute: bool) -> None:
    """Wrap ``perseus_megatron.integration.enable`` (which the launcher calls) for CPU runs.

    ``summary_dir``: each rank's Perseus summary goes to ``summary_dir/rank<R>.json`` when Perseus
    closes. ``simulate_compute``: every forward/backward kernel of this rank's simulated GPU (the
    runtime makes each instruction one) is padded to ``NOMINAL_S`` at the max clock
    (``perseus_demo.common.SimulatedCompute``), so the clocks' effect stands out of CPU noise.
    """
    from perseus_megatron import integration

    original_enable = integration.enable

    @functools.wraps(original_enable)
    def enable(config: Any = None, **kwargs: Any) -> Any:
        rank = int(os.environ.get("RANK", "0"))
        gpus: list[Any] = []
        if simulate_compute:
            from perseus.gpu.sim.device import SimulatedGPU
            from perseus_demo.common import SimulatedCompute

            resolved = integration.resolve_config(config, {})
            gpu = SimulatedGPU(rank, reset_state=True, **resolved.sim_gpu)
            gpus.append(gpu)
            kwargs["listener_wrapper"] = lambda runtime: SimulatedCompute(runtime, gpu, NOMINAL_S)
        handle = original_enable(config, **kwargs)
        close = handle.close

        def close_and_report() -> None:
            if summary_dir is not None and not handle.closed:
                summary_dir.mkdir(parents=True, exist_ok=True)
                hooks = handle.hooks
                summary = {**handle.summary(), "hooks_from_patched_source": hooks.patched_source if hooks else None}
                runtime = handle.runtime
                if runtime is not None and getattr(runtime, "enabled", False):  # every step, for tests
                    summary["step_records"] = [r.file_row() for r in runtime.reporter.records]
                (summary_dir / f"rank{rank}.json").write_text(json.dumps(summary, default=str))
            try:
                close()
            finally:
                for gpu in gpus:
                    gpu.close()

        handle.close = close_and_report  # type: ignore[method-assign]  # this handle reports when closed
        return handle

    integration.enable = enable


def split_runner_args(argv: Sequence[str]) -> tuple[Path | None, bool, list[str]]:
    """Take the runner's own ``--summary-dir DIR`` and ``--simulate-compute`` out of the command line."""
    rest: list[str] = []
    folder: Path | None = None
    simulate = False
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] == SUMMARY_FLAG and i + 1 < len(args):
            folder, i = Path(args[i + 1]), i + 2
            continue
        if args[i].startswith(SUMMARY_FLAG + "="):
            folder = Path(args[i].split("=", 1)[1])
        elif args[i] == SIMULATE_FLAG:
            simulate = True
        else:
            rest.append(args[i])
        i += 1
    return folder, simulate, rest


def checkout_core_version(checkout: Path) -> tuple[int, int] | None:
    """(major, minor) of the checkout's in-tree megatron-core (``megatron/core/package_info.py``)."""
    try:
        text = (checkout / "megatron" / "core" / "package_info.py").read_text()
    except OSError:
        return None
    major, minor = (re.search(rf"^{name}\s*=\s*(\d+)", text, re.MULTILINE) for name in ("MAJOR", "MINOR"))
    return None if major is None or minor is None else (int(major.group(1)), int(minor.group(1)))


def overlap_p2p_args(checkout: Path) -> list[str]:
    """Interleaved runs keep Megatron-LM's default, ``overlap_p2p_comm`` on, where the checkout's
    megatron-core waits for each ``isend`` before freeing its buffer (0.19); older ones free it
    while gloo may still be reading it, and the next stage computes on garbage (NaN losses from
    the fourth iteration with core_v0.16.1), so those run with ``--no-overlap-p2p-communication``."""
    version = checkout_core_version(checkout)
    return [] if version is not None and version >= (0, 19) else ["--no-overlap-p2p-communication"]


def launch(checkout: Path, out_dir: Path, *, stages: int = 2, chunks: int = 1, microbatches: int = 4,
           train_iters: int = 14, simulate_compute: bool = True, extra_args: Sequence[str] = (),
           timeout_s: float = 600) -> list[dict[str, Any]]:
    """Run ``pretrain_gpt.py`` of ``checkout`` under torchrun (one rank per stage); each rank's summary.

    A tiny GPT (one layer per stage and chunk) on mock data, simulated GPUs, few profiled clocks.
    ``extra_args`` go last (Megatron and Perseus flags; later ones win).
    """
    from perseus.errors import PerseusError
    from perseus_demo.common import DEFAULT_SIM_GPU
    from perseus_megatron.pretrain_gpt import check_checkout

    check_checkout(Path(checkout))  # one line now, not a traceback from every torchrun rank later
    check_requirements(Path(checkout))
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = out_dir / "summaries"
    for stale in summaries.glob("rank*.json"):
        stale.unlink()
    shape = ["--num-layers", str(stages * chunks), "--pipeline-model-parallel-size", str(stages),
             "--micro-batch-size", "1", "--global-batch-size", str(microbatches), "--train-iters", str(train_iters)]
    if chunks > 1:
        shape += ["--num-layers-per-virtual-pipeline-stage", "1", *overlap_p2p_args(Path(checkout))]
    perseus = ["--perseus", "--perseus-gpu", "sim", "--perseus-warmup-steps", "2", "--perseus-iters-per-freq", "1",
               "--perseus-freq-min", "1000", "--perseus-freq-step", "200", "--perseus-early-stop-patience", "0",
               "--perseus-straggler-period", "0", "--perseus-cache-dir", str(out_dir / "cache"),
               # CPU training: the trainer is CPU-bound itself, so a niced planner would be starved
               "--perseus-planner-nice", "0",
               # a fixed iteration budget: rank 0 waits for its planner rather than running out of
               # iterations on a busy machine (the wait is one long step)
               "--perseus-plan-wait", "240",
               "--perseus-sim-gpu", json.dumps(DEFAULT_SIM_GPU)]
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PERSEUS_SIM_GPU_DIR=str(out_dir / "sim-gpus"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={stages}",
           "-m", "perseus_demo.megatron_lm_cpu", SUMMARY_FLAG, str(summaries), "--megatron-lm", str(checkout),
           *([SIMULATE_FLAG] if simulate_compute else []), *CPU_GPT_ARGS, *shape, *perseus, *extra_args]
    log = out_dir / "pretrain_gpt.log"
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=out_dir)
    except subprocess.TimeoutExpired as exc:
        log.write_text(_text(exc.stdout) + _text(exc.stderr))
        raise PerseusError(f"Megatron-LM pretrain_gpt.py did not finish within {timeout_s:.0f} s; full log: {log}") from None
    log.write_text(proc.stdout + proc.stderr)
    results = []
    for rank in range(stages):
        path = summaries / f"rank{rank}.json"
        if proc.returncode != 0 or not path.exists():
            cause = failure_line(proc.stdout + proc.stderr) or f"rank {rank} wrote no summary"
            raise PerseusError(f"Megatron-LM pretrain_gpt.py failed (exit {proc.returncode}): {cause}; full log: {log}")
        results.append(json.loads(path.read_text()))
    return results


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


# An exception's last line ("ModuleNotFoundError: No module named 'six'"), or a launcher's own
# "prog: error: ..." line; torchrun may put "[rank0]:" in front of a rank's lines.
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)?\d*\]:\s?")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s*\S.*)?$")
_ERROR_LINE = re.compile(r"^\S+: error: \S")
_WRAPPERS = ("ChildFailedError",)  # torchrun's summary of the ranks' failure, not its cause


def failure_line(log: str) -> str | None:
    """The line of a failed run's output that says what went wrong: the last exception raised by
    a rank, or a launcher's one-line error; ``None`` when there is none."""
    found = None
    for raw in log.splitlines():
        line = _RANK_PREFIX.sub("", raw).strip()
        if _ERROR_LINE.match(line) or (_EXCEPTION_LINE.match(line) and not line.split(":")[0].endswith(_WRAPPERS)):
            found = line
    return found


# What Megatron-LM's training code (megatron/training, its tokenizers and config loading) imports
# unconditionally, and the megatron-core wheel does not bring: import name -> what to pip install.
TRAINING_REQUIREMENTS: dict[str, str] = {"torch": "torch", "megatron.core": "megatron-core", "six": "six",
                                         "regex": "regex", "yaml": "pyyaml"}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _dataset_helper_available(checkout: Path) -> bool:
    """The checkout's dataset helper is built, or the installed wheel's is the same source."""
    folder = checkout / "megatron" / "core" / "datasets"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    if (folder / f"helpers_cpp{suffix}").exists():
        return True
    return (folder / "helpers.cpp").exists() and _wheel_helpers(folder / "helpers.cpp") is not None


def missing_requirements(checkout: Path) -> list[str]:
    """What to pip install before this checkout's ``pretrain_gpt.py`` can start here (empty: nothing)."""
    missing = [package for module, package in TRAINING_REQUIREMENTS.items() if not _importable(module)]
    if not _dataset_helper_available(checkout) and not _importable("pybind11"):
        missing.append("pybind11")  # to build megatron's dataset helper
    return missing


def check_requirements(checkout: Path) -> None:
    """One line naming what to pip install, before anything is launched."""
    from perseus.errors import PerseusError

    missing = missing_requirements(checkout)
    if missing:
        raise PerseusError(f"Megatron-LM's pretrain_gpt.py needs Python packages that are not installed: "
                           f"{', '.join(missing)}; run: pip install {' '.join(missing)} "
                           "(pip install -e '.[megatron]' brings all but pybind11)")


def format_summaries(summaries: list[dict[str, Any]]) -> str:
    """Per phase: iterations, mean iteration time (slowest rank), mean energy (all GPUs)."""
    lines = [f"{'phase':<12}{'iterations':>11}{'time/iter':>12}{'energy/iter':>14}   (means; energy: all GPUs)"]
    phases = summaries[0].get("phases", {})
    for phase in ("warmup", "profiling", "planning", "steady", "deployed"):
        rows = [s["phases"][phase] for s in summaries if phase in s.get("phases", {})]
        if phase in phases and rows:
            lines.append(f"{phase:<12}{phases[phase]['steps']:>11}{max(r['time_s'] for r in rows) * 1e3:>10.1f}ms"
                         + (f"{sum(r['energy_j'] for r in rows):>12.2f} J"
                            if all(r["energy_j"] is not None for r in rows) else f"{'unmeasured':>14}"))
    history = " -> ".join(f"{phase}@{step}" for step, phase in summaries[0].get("phase_history", []))
    lines.append(f"phases (rank 0): {history}")
    fallbacks = [s["fallback"] for s in summaries if s.get("fallback")]
    if fallbacks:
        lines.append(f"plan mismatch: {fallbacks[0]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    import torch

    from perseus.errors import PerseusError
    from perseus_demo.megatron_cpu import cpu_execution
    from perseus_megatron import pretrain_gpt

    if torch.cuda.is_available():
        raise PerseusError("perseus_demo.megatron_lm_cpu is for CPU-only machines; on GPUs run "
                           "python -m perseus_megatron.pretrain_gpt")
    summary_dir, simulate_compute, rest = split_runner_args(sys.argv[1:] if argv is None else argv)
    checkout, _ = pretrain_gpt.split_checkout(rest)
    pretrain_gpt.check_checkout(checkout)
    check_requirements(checkout)
    pretrain_gpt.put_checkout_first(checkout)
    _stub_batch_invariant_kernels()
    _patch_initialize()
    if summary_dir is not None or simulate_compute:
        _instrument_enable(summary_dir, simulate_compute)
    with cpu_execution(), _cpu_streams():
        pretrain_gpt.main(rest)


if __name__ == "__main__":
    main()
