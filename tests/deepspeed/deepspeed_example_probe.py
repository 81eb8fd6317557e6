"""Runs a user example script unchanged under the ``deepspeed`` launcher and records what the tests check.

The launcher starts this file as the user script; ``$PERSEUS_PROBE_SCRIPT`` names the example,
which runs with this process's arguments (``--local_rank`` and the example's own options).
``$PERSEUS_PROBE_DIR/rank{N}.json`` gets, per rank:

- what ``perseus_deepspeed.initialize`` returned: the optimizer and LR scheduler classes, and
  whether they are the engine's;
- how many micro-batches the engine's own training loader yielded: the ``RepeatingLoader`` that
  ``PipelineEngine`` builds from ``training_data`` is created as a counting subclass;
- Perseus's summary, taken when the script calls ``engine.destroy()`` (just before Perseus closes);
- after ``engine.destroy()``, before interpreter exit: whether Perseus closed and the simulated
  GPU's clock lock.

Nothing of the script or of Perseus changes: "enough steps" for the background planner come
from the config's ``plan_wait_s``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

def main() -> None:
    script = os.environ["PERSEUS_PROBE_SCRIPT"]
    out = Path(os.environ["PERSEUS_PROBE_DIR"])
    record: dict = {"batches_read": 0}

    import perseus_deepspeed

    original_initialize = perseus_deepspeed.initialize

    def initialize(*args, **kwargs):
        import deepspeed.runtime.pipe.engine as pipe_engine

        base = pipe_engine.RepeatingLoader

        class CountingLoader(base):
            def __next__(self):
                batch = super().__next__()
                record["batches_read"] += 1
                return batch

        pipe_engine.RepeatingLoader = CountingLoader
        try:
            result = original_initialize(*args, **kwargs)
        finally:
            pipe_engine.RepeatingLoader = base
        engine, optimizer, _, lr_scheduler = result
        handle = perseus_deepspeed.get_handle(engine)
        record.update(
            rank=engine.global_rank, stage=engine.stage_id, num_stages=engine.num_stages,
            first_or_last_stage=engine.is_first_stage() or engine.is_last_stage(),
            micro_batches=engine.micro_batches,
            optimizer=type(optimizer).__name__, optimizer_is_engines=optimizer is engine.optimizer,
            basic_optimizer=type(engine.basic_optimizer).__name__,
            client_optimizer=engine.client_optimizer is not None,
            lr_scheduler=type(lr_scheduler).__name__ if lr_scheduler is not None else None,
            lr_scheduler_is_engines=lr_scheduler is engine.lr_scheduler,
            perseus=handle is not None,
        )
        record["engine"] = engine
        record["handle"] = handle
        if handle is not None:
            _watch(engine, handle, record)
        return result

    perseus_deepspeed.initialize = initialize
    sys.argv = [script, *sys.argv[1:]]
    runpy.run_path(script, run_name="__main__")

    engine = record.pop("engine")
    handle = record.pop("handle")
    record.update(
        global_steps=engine.global_steps,
        loader_is_engines=isinstance(engine.training_dataloader, _counting_base())
        and engine.data_iterator is engine.training_dataloader,
        lr=engine.get_lr()[0],
    )
    if handle is not None:
        record.update(closed=handle.closed, locked_after_destroy=_locked(engine))
    (out / f"rank{record['rank']}.json").write_text(json.dumps(record, indent=1, default=str))


def _counting_base() -> type:
    from deepspeed.runtime.dataloader import RepeatingLoader

    return RepeatingLoader


def _watch(engine, handle, record) -> None:
    """Summary and clock lock at ``engine.destroy()``, just before Perseus closes."""
    perseus_destroy = engine.destroy

    def destroy(*args, **kwargs):
        record["summary"] = handle.summary()
        record["locked_before_destroy"] = _locked(engine)
        return perseus_destroy(*args, **kwargs)

    engine.__dict__["destroy"] = destroy


def _locked(engine) -> int:
    """The SM clock lock of this rank's simulated GPU (its index is the global rank)."""
    from perseus.gpu.sim.state import read_sim_state

    return read_sim_state(engine.global_rank, os.environ.get("PERSEUS_SIM_GPU_DIR")).locked


if __name__ == "__main__":
    main()
