#!/usr/bin/env python
"""Perseus under Megatron-Bridge on GPUs: a tiny pipeline-parallel GPT recipe, warm-up → profiling
→ planning → deployed, then a check of what the metrics file says.

    # Python 3.12, on a node with >= 2 GPUs and clock privileges (or PERSEUS_CLOCKD_SOCKET /
    # PERSEUS_ZEUSD_SOCKET); megatron-bridge 0.6.x and its CUDA dependencies installed:
    torchrun --nproc-per-node 2 scripts/megatron_bridge_check.py --pp 2 --out /tmp/bridge-check

Not run in this repository's sessions: megatron-bridge 0.6.2 does not install or import on a
machine without CUDA (docs/megatron.md, "Megatron-Bridge"). What it does:

- builds Bridge's own minimal recipe (``vanilla_gpt_pretrain_config``: bare ``GPTModelProvider``,
  ``NullTokenizer``) with Bridge's ``MockGPTDatasetConfig`` (synthetic tokens), shrunk to ``--layers`` layers of ``--hidden``, pipeline size
  ``--pp``, ``--microbatches`` microbatches per iteration, no checkpoints, no evaluation;
- installs Perseus the way docs/megatron.md describes for Bridge: ``PerseusCallback`` calls
  ``perseus_megatron.enable`` when it is constructed, before ``pretrain``, because Bridge's
  ``train()`` fetches the schedule (``get_forward_backward_func``) once before its first callback;
  the runtime itself is built at the first training step, after Bridge's model-parallel init;
  ``on_train_end`` closes it (default clocks);
- rank 0 then reads the metrics file and prints one line per phase (steps, median time and
  energy per step) and exits non-zero unless the run reached the deployed plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pp", type=int, default=2, help="pipeline-parallel size (default 2)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--microbatches", type=int, default=8, help="microbatches per iteration per data-parallel rank")
    ap.add_argument("--iters", type=int, default=120, help="training iterations")
    ap.add_argument("--out", type=Path, default=Path("bridge-check"))
    ap.add_argument("--gpu", default="auto", choices=("auto", "nvml", "sim"), help="Perseus's GPU backend")
    ap.add_argument("--plan-wait-s", type=float, default=240.0,
                    help="rank 0 waits this long for its planner at the first planning step")
    return ap.parse_args(argv)


def _bridge() -> Any:
    try:
        from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config
        from megatron.bridge.training.callbacks import Callback
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.pretrain import pretrain
    except ImportError as exc:
        raise SystemExit(f"megatron_bridge_check: megatron-bridge is not importable ({exc}); it needs Python 3.12, "
                         "`pip install megatron-bridge==0.6.*` and its CUDA dependencies (transformer-engine, ...): "
                         "docs/megatron.md, \"Megatron-Bridge\"") from None
    return vanilla_gpt_pretrain_config, Callback, forward_step, pretrain


def perseus_settings(args: argparse.Namespace) -> dict[str, Any]:
    """A short but complete Perseus run: 3 warm-up steps, a coarse sweep, a bounded planner."""
    return {"gpu": args.gpu, "mode": "run", "warmup_steps": 3, "iters_per_freq": 2, "coarse_step_mhz": 180,
            "cache_dir": str(args.out / "perseus-cache"), "metrics_file": str(args.out / "perseus-metrics.jsonl"),
            "plan_wait_s": args.plan_wait_s, "log_every_steps": 1}


def recipe(args: argparse.Namespace, vanilla_gpt_pretrain_config: Any) -> Any:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % args.pp:
        raise SystemExit(f"megatron_bridge_check: {world} processes do not split into pipelines of {args.pp}")
    cfg = vanilla_gpt_pretrain_config()
    cfg.model.num_layers = args.layers
    cfg.model.hidden_size = args.hidden
    cfg.model.ffn_hidden_size = 4 * args.hidden
    cfg.model.num_attention_heads = max(1, args.hidden // 128)
    cfg.model.seq_length = args.seq
    cfg.model.pipeline_model_parallel_size = args.pp
    cfg.model.tensor_model_parallel_size = 1
    from megatron.bridge.training.config import MockGPTDatasetConfig

    cfg.dataset = MockGPTDatasetConfig(seq_length=args.seq, random_seed=1234, split="9999,8,2",
                                       dataloader_type="single", reset_position_ids=False,
                                       reset_attention_mask=False, eod_mask_loss=False)
    cfg.train.train_iters = args.iters
    cfg.train.micro_batch_size = 1
    cfg.train.global_batch_size = args.microbatches * (world // args.pp)
    cfg.validation.eval_interval = None
    cfg.validation.eval_iters = 0
    cfg.checkpoint.save = None
    cfg.checkpoint.save_interval = None
    cfg.logger.log_interval = 1
    cfg.logger.tensorboard_dir = str(args.out / "tb")
    cfg.scheduler.lr_warmup_iters = 0
    return cfg


def summarize(metrics_file: Path) -> int:
    """One line per phase from the metrics file; 0 if the deployed plan ran."""
    steps: dict[str, list[dict[str, Any]]] = {}
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        if "phase" in record and "step" in record:
            steps.setdefault(str(record["phase"]), []).append(record)
    for phase, records in steps.items():
        times = [r["time_s"] for r in records if isinstance(r.get("time_s"), (int, float))]
        energies = [r["energy_j"] for r in records if isinstance(r.get("energy_j"), (int, float))]
        print(f"{phase:>10}: {len(records)} steps, median {statistics.median(times) * 1e3 if times else float('nan'):.1f} ms, "
              f"{statistics.median(energies) if energies else float('nan'):.1f} J per step (this rank's GPU)")
    if "deployed" not in steps:
        print("megatron_bridge_check: the run never reached the deployed plan; see the log above", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    vanilla_gpt_pretrain_config, Callback, forward_step, pretrain = _bridge()
    import perseus_megatron

    class PerseusCallback(Callback):  # type: ignore[misc, valid-type]  # Bridge's class, imported by _bridge()
        """Perseus's hooks for one Bridge run: installed at construction (before ``pretrain``), closed
        at ``on_train_end``; the settings are this callback's, since Bridge's ConfigContainer has no
        field for a third party's."""

        def __init__(self, **settings: Any) -> None:
            self.handle = perseus_megatron.enable(**settings)

        def on_train_end(self, context: Any) -> None:
            self.handle.close()

    args.out.mkdir(parents=True, exist_ok=True)
    callback = PerseusCallback(**perseus_settings(args))
    pretrain(recipe(args, vanilla_gpt_pretrain_config), forward_step, callbacks=[callback])
    callback.handle.close()  # idempotent: also when on_train_end did not run
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    return summarize(args.out / "perseus-metrics.jsonl")


if __name__ == "__main__":
    sys.exit(main())
