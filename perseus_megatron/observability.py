"""Perseus's per-step metrics in Megatron-LM's own views: its TensorBoard/wandb writers and its iteration log line.

Megatron-LM (``megatron.training``) keeps one TensorBoard ``SummaryWriter`` and one wandb writer
in ``megatron.training.global_vars``, created by ``initialize_megatron`` on the last rank when
``--tensorboard-dir`` / ``--wandb-project`` are given. ``MegatronWritersSink`` looks them up at
every step end and writes the ``perseus/*`` scalars (perseus/runtime/observe/metrics.py) at Megatron's
iteration number, so they sit next to Megatron's own curves. With megatron-core alone there is no
``megatron.training``: nothing is imported and the sink does nothing.

``add_to_iteration_log`` appends Perseus's numbers to the line ``training_log`` prints every
``--log-interval`` iterations::

    ... | number of nan iterations:   0 | perseus phase: deployed | perseus energy this GPU (J/iter): 41.2 |
    perseus power this GPU (W): 310.5 | perseus saved this GPU (J): 523.0 |

It wraps ``megatron.training.training.training_log`` and, only while that runs, the module's
``print_rank_last``: the line is extended as it is printed, and nothing else Megatron prints
changes. The rank that prints is the last one, but the line is not that rank's alone: besides its
own GPU's mean energy per iteration and power since the previous line and the energy it saved
against the warm-up baseline, it has the whole job's energy per iteration when a periodic job
check has run, and the whole job's saving against its default-clock probes (all ranks, all
pipelines, with its 95 % interval) once a probe window ended. The writers get every stage's energy
and the job's saving too (``perseus/stage<S>_energy_j``, ``perseus/job_saving_ratio``: every rank
learns them from the guard's rows, so the last rank's writers show the whole job).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable

from perseus.runtime import Phase, StepMetrics

log = logging.getLogger("perseus.megatron")

GLOBAL_VARS = "megatron.training.global_vars"
TRAINING = "megatron.training.training"
_MARK = "__perseus_iteration_log__"


def _loaded(name: str) -> Any:
    """A Megatron-LM module only if the training script already imported it (never imported here)."""
    return sys.modules.get(name)


def megatron_iteration(global_vars: Any, default: int) -> int:
    """The iteration number ``training_log`` will report for the step running now
    (``args.curr_iteration + 1``), or ``default`` when Megatron-LM's arguments are not set."""
    args = getattr(global_vars, "_GLOBAL_ARGS", None)
    current = getattr(args, "curr_iteration", None)
    return current + 1 if isinstance(current, int) else default


class MegatronWritersSink:
    """Per-step metrics to Megatron-LM's TensorBoard and wandb writers, when they exist."""

    def __init__(self, global_vars: Any = None) -> None:
        self._global_vars = global_vars

    def _module(self) -> Any:
        return self._global_vars if self._global_vars is not None else _loaded(GLOBAL_VARS)

    def _writers(self) -> tuple[Any, Any]:
        gv = self._module()
        if gv is None:
            return None, None
        tensorboard = getattr(gv, "get_tensorboard_writer", lambda: None)()
        wandb = getattr(gv, "get_wandb_writer", lambda: None)()
        return tensorboard, wandb

    def write(self, step: int, metrics: StepMetrics) -> None:
        tensorboard, wandb = self._writers()
        if tensorboard is None and wandb is None:
            return
        x = megatron_iteration(self._module(), step)
        scalars = metrics.scalars()
        if tensorboard is not None:
            for name, value in scalars.items():
                tensorboard.add_scalar(name, value, x)
        if wandb is not None:
            wandb.log(scalars, x)

    def close(self) -> None:
        tensorboard, _ = self._writers()
        if tensorboard is not None and callable(getattr(tensorboard, "flush", None)):
            tensorboard.flush()


class IterationLogText:
    """What Perseus adds to one iteration log line, from the handle's runtime; '' before any step."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._runtime: Any = None
        self._seen = 0
        self._job: Any = None  # the last job saving figure seen (observe/job_saving.py)

    def __call__(self) -> str:
        runtime = getattr(self.handle, "runtime", None)
        if runtime is None or not getattr(runtime, "enabled", False):
            return ""
        if runtime is not self._runtime:  # restarted for a new job shape
            self._runtime, self._seen, self._job = runtime, 0, None
        records = runtime.reporter.records
        new, self._seen = records[self._seen:], len(records)
        if not new:
            return ""
        self._job = next((r.job_saving for r in reversed(new) if r.job_saving is not None), self._job)
        measured = [r for r in new if r.energy_j is not None]  # a counter outage leaves steps unmeasured
        text = f" perseus phase: {new[-1].phase.value} |"
        if measured:
            energy = sum(r.energy_j for r in measured)
            seconds = sum(r.time_s for r in measured)
            text += (f" perseus energy this GPU (J/iter): {energy / len(measured):.1f} |"
                     f" perseus power this GPU (W): {energy / seconds if seconds > 0 else 0.0:.1f} |")
        baseline = runtime.reporter.baseline_energy_j
        if baseline:
            saved = sum(baseline - r.energy_j for r in records if r.phase is not Phase.WARMUP and r.energy_j is not None)
            text += f" perseus saved this GPU (J): {saved:.1f} |"
        job = getattr(runtime, "job_numbers", {}) or {}
        if job.get("energy_per_iteration_j") is not None:
            text += f" perseus job energy all GPUs (J/iter, at step {job.get('step')}): {job['energy_per_iteration_j']:.1f} |"
        if self._job is not None:
            f = self._job
            text += (f" perseus job saving all GPUs vs default clocks: {100 * f.saving:.1f}% (95 % interval "
                     f"{100 * f.saving_low:.1f}..{100 * f.saving_high:.1f}%) |")
        return text


def add_to_iteration_log(handle: Any, training: Any = None) -> Callable[[], None] | None:
    """Append Perseus's numbers to Megatron-LM's iteration log line; returns an undo function.

    ``training`` is ``megatron.training.training`` (default: the already imported module). Returns
    ``None`` (and changes nothing) when Megatron-LM's training loop is not loaded or has no
    ``training_log``/``print_rank_last``; Perseus's own rank-0 log line is there either way.
    """
    module = training if training is not None else _loaded(TRAINING)
    if module is None:
        return None
    original_log = getattr(module, "training_log", None)
    original_print = getattr(module, "print_rank_last", None)
    if not callable(original_log) or not callable(original_print):
        log.warning("perseus: megatron.training.training has no training_log/print_rank_last; Perseus's numbers "
                    "are not added to Megatron's iteration log line (its own log line and the writers still get them)")
        return None
    if getattr(original_log, _MARK, False):
        return None
    text = IterationLogText(handle)
    active = [False]

    @functools.wraps(original_log)
    def training_log(*args: Any, **kwargs: Any) -> Any:
        active[0] = True
        try:
            return original_log(*args, **kwargs)
        finally:
            active[0] = False

    @functools.wraps(original_print)
    def print_rank_last(message: Any, *args: Any, **kwargs: Any) -> Any:
        if active[0] and isinstance(message, str) and " iteration " in message:
            active[0] = False  # one line per training_log call
            message += text()
        return original_print(message, *args, **kwargs)

    setattr(training_log, _MARK, True)
    module.training_log, module.print_rank_last = training_log, print_rank_last

    def undo() -> None:
        if module.training_log is training_log:
            module.training_log = original_log
        if module.print_rank_last is print_rank_last:
            module.print_rank_last = original_print

    return undo
