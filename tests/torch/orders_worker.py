"""torchrun worker: real pipelining schedules over gloo, hooked by perseus_torch, record what ran.

``orders_worker.py OUT_DIR CASES [DEMOS]``: CASES is a JSON object, case name -> DemoConfig fields;
the cases run one after another in this one process group (start-up, not the tiny model, is what a
launch costs). Writes ``rankN.json``, per case: each reported step's instructions, how many events
``eval()`` and an unhooked step reported, and whether uninstall restored every hooked attribute.
DEMOS, a JSON list of folders, each with a demo's ``config.json``: then, in the same process group,
each runs the torch demo's rank body (``perseus_demo.torch_demo.train_rank``) and writes its own
``rankN.json`` there, as a launch of the demo would.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out_dir: str, cases: str, demos: str = "[]") -> None:
    import torch.distributed as dist

    from perseus_demo.torch_demo import DemoConfig, train_rank

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    results = {name: run_case(DemoConfig(**config), rank) for name, config in json.loads(cases).items()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    for folder in map(Path, json.loads(demos)):
        train_rank(DemoConfig(**json.loads((folder / "config.json").read_text())), folder, rank)
    dist.destroy_process_group()


def run_case(cfg, rank: int) -> dict:
    """Two hooked steps, eval(), uninstall, one unhooked step; what perseus_torch reported."""
    import torch

    from perseus.runtime import RecordingListener
    from perseus_demo.torch_demo import build_pipeline, train_step_fn
    from perseus_torch import install_hooks

    schedule, stages, _ = build_pipeline(cfg, rank)
    step = train_step_fn(cfg, schedule, stages)
    listener = RecordingListener()
    handle = install_hooks(schedule, listener)
    step()
    step()
    trained = len(listener.steps)
    indices = {int(s.stage_index) for s in stages}
    x = torch.randn(cfg.micro_batch_size * cfg.microbatches, cfg.hidden_size)
    last = int(stages[0].num_stages) - 1
    # torch 2.13's ZBV and DualPipeV eval() fail on their own (get_local_bwd_output asserts without backward)
    with torch.no_grad():
        if cfg.schedule not in ("zbv", "dualpipev"):
            schedule.eval(*((x,) if 0 in indices else ()), **({"target": x} if last in indices else {}))
    after_eval = len(listener.steps)
    handle.uninstall()
    restored = all(m not in s.__dict__ for s in stages for m in ("forward_one_chunk", "backward_one_chunk",
                                                                 "backward_weight_one_chunk"))
    restored = restored and "step" not in schedule.__dict__ and "eval" not in schedule.__dict__
    step()
    return {"rank": rank, "steps": [[[i.kind, i.microbatch, i.chunk, *(i.backward_pair() or ())] for i in s]
                                    for s in listener.steps],
            "trained_steps": trained, "after_eval": after_eval, "after_uninstall": len(listener.steps),
            "restored": restored, "torch_stages": sorted(indices)}


if __name__ == "__main__":
    main(*sys.argv[1:])
