#!/usr/bin/env bash
# Megatron-LM GPT pretraining on one node with Perseus (8 GPUs: TP 2 x PP 4).
# Usage: MEGATRON_LM=/path/to/Megatron-LM DATA=/path/to/data_text_document bash scripts/megatron_torchrun.sh
set -euo pipefail
: "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (core_v0.16 to core_v0.19)}"
: "${DATA:?set DATA to a preprocessed dataset prefix (or use --mock-data below)}"
CACHE=${PERSEUS_CACHE:-$HOME/.cache/perseus}

torchrun --nproc_per_node 8 --nnodes 1 --standalone \
  -m perseus_megatron.pretrain_gpt --megatron-lm "$MEGATRON_LM" \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 \
  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 64 \
  --train-iters 2000 --lr 1.5e-4 --bf16 \
  --data-path "$DATA" --split 949,50,1 --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$MEGATRON_LM/gpt2-vocab.json" --merge-file "$MEGATRON_LM/gpt2-merges.txt" \
  --perseus --perseus-mode run --perseus-cache-dir "$CACHE" \
  --perseus-metrics-file perseus-metrics.jsonl --perseus-straggler-period 20
