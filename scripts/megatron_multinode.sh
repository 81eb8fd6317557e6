#!/usr/bin/env bash
# Megatron-LM with Perseus on several nodes; run this script once on every node.
# Usage: NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0 host> MEGATRON_LM=... DATA=... bash scripts/megatron_multinode.sh
set -euo pipefail
: "${MEGATRON_LM:?set MEGATRON_LM}" "${DATA:?set DATA}" "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
MASTER_PORT=${MASTER_PORT:-29500}
# The cache directory should be on storage shared by the nodes (rank 0 writes profile and frontier).
CACHE=${PERSEUS_CACHE:-/shared/perseus-cache}

torchrun --nproc_per_node 8 --nnodes "$NNODES" --node_rank "$NODE_RANK" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  -m perseus_megatron.pretrain_gpt --megatron-lm "$MEGATRON_LM" \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size "$NNODES" \
  --num-layers 48 --hidden-size 6144 --num-attention-heads 48 --seq-length 2048 \
  --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 256 \
  --train-iters 10000 --lr 1.0e-4 --bf16 \
  --data-path "$DATA" --split 949,50,1 --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$MEGATRON_LM/gpt2-vocab.json" --merge-file "$MEGATRON_LM/gpt2-merges.txt" \
  --perseus --perseus-cache-dir "$CACHE" --perseus-straggler-period 20 --perseus-straggler-threshold 0.05
