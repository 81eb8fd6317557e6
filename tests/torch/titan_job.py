"""A TorchTitan ``config_registry`` module for the tests: TorchTitan's own llama3 debug model, shrunk to
run on CPU, with a ``perseus`` section (``perseus_torch.torchtitan.with_perseus``).

``--module titan_job --config perseus_debug`` selects it, as a user's own registry would be. The
assets (a word-level tokenizer and a few hundred lines of text in the ``c4_test`` layout) are made by
``write_assets`` into ``$TITAN_ASSETS``; ``$TITAN_DP_REPLICATE`` sets the data-parallel replicas.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

WORDS = [f"w{i}" for i in range(500)]


def write_assets(folder: Path) -> None:
    """A tokenizer TorchTitan's ``HuggingFaceTokenizer`` loads and a local ``c4_test``-style dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = random.Random(0)
    (folder / "c4_test").mkdir(parents=True, exist_ok=True)
    with (folder / "c4_test" / "data.json").open("w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=60))}) + "\n")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer" / "tokenizer.json"))
    (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True}))


def perseus_debug() -> Any:
    """``llama3_debugmodel`` on 2 pipeline stages (1F1B, 4 microbatches of 1), 32-token sequences."""
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from perseus_torch.torchtitan import with_perseus

    config = llama3_debugmodel()
    assets = Path(os.environ["TITAN_ASSETS"])
    config.hf_assets_path = str(assets / "tokenizer")
    config.dataloader.dataset_path = str(assets / "c4_test")
    config.dump_folder = str(assets / "out")
    config.training.seq_len = 32
    config.training.local_batch_size = 4
    config.training.steps = 40
    config.training.disable_cuda_graphs = True
    # partial_dtensor: the default spmd_types backend's fully_shard call needs a newer torch than 2.13
    config.parallelism = ParallelismConfig(
        pipeline_parallel_degree=2, pipeline_parallel_schedule="1F1B", pipeline_parallel_microbatch_size=1,
        data_parallel_replicate_degree=int(os.environ.get("TITAN_DP_REPLICATE", "1")), data_parallel_shard_degree=1,
        spmd_backend="partial_dtensor")
    # FlexAttention has no backward on CPU: SDPA, as TorchTitan's own graph_trainer tests swap it in
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config.checkpoint.enable = False
    config.validator.enable = False
    config.activation_checkpoint = None
    config.metrics.enable_tensorboard = True
    config.metrics.log_freq = 1
    return with_perseus(config, gpu="sim", cache_dir=None, warmup_steps=2, freq_step_mhz=300, iters_per_freq=1,
                        p_blocking_seconds=0.1, probe_every_steps=4, log_every_steps=0)
