"""Run one function on N local gloo processes (forked), each with its own ``PipelineJob`` of a
dp × pp × tp grid, and collect what each returned (the control-plane tests' driver)."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from perseus.runtime.job import PipelineJob


def grid_job(rank: int, dp: int, pp: int, tp: int, order: str = "pp-tp-dp") -> PipelineJob:
    """This rank's job; ``order`` names the axes from fastest-varying to slowest, as a rank order."""
    sizes = {"dp": dp, "pp": pp, "tp": tp}
    coords, rest = {}, rank
    for axis in order.split("-"):
        coords[axis], rest = rest % sizes[axis], rest // sizes[axis]
    return PipelineJob(num_stages=pp, num_microbatches=4, stage=coords["pp"], dp_rank=coords["dp"], dp_size=dp,
                       tp_rank=coords["tp"], tp_size=tp, rank=rank, world_size=dp * pp * tp)


def _child(fn: Callable[..., Any], rank: int, world: int, store_path: str, out: str, args: tuple) -> None:
    import torch.distributed as dist

    try:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        result: Any = {"ok": fn(rank, world, *args)}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(out, f"{rank}.json").write_text(json.dumps(result, default=repr))
    os._exit(0)  # no atexit or teardown of the forked copy of the parent


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """``fn(rank, world, *args)`` on ``world`` forked processes; each result (JSON) or its error."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_child, args=(fn, r, world, os.path.join(tmp, "store"), tmp, args))
                 for r in range(world)]
        gc.collect()
        gc.freeze()  # the forked ranks never collect the parent's objects (toy_pipeline.start says why)
        try:
            for p in procs:
                p.start()
        finally:
            gc.unfreeze()
        for p in procs:
            p.join(timeout_s)
        for p in procs:
            if p.is_alive():
                p.kill()
        out = []
        for r in range(world):
            path = Path(tmp, f"{r}.json")
            out.append(json.loads(path.read_text()) if path.exists() else {"error": "no result (hung or crashed)"})
        return out
