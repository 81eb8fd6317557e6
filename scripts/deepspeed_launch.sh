#!/usr/bin/env bash
# Launch the DeepSpeed pipeline example with Perseus on one node.
#   scripts/deepspeed_launch.sh             # 4 GPUs, 4 pipeline stages
#   GPUS=2 STAGES=2 EXTRA=--cpu scripts/deepspeed_launch.sh   # CPU only: gloo + simulated GPUs
# Multi-node: add --hostfile (see DeepSpeed's launcher docs); every rank reads the same
# "perseus" section from the config file.
set -euo pipefail
cd "$(dirname "$0")/.."
GPUS=${GPUS:-4}
STAGES=${STAGES:-4}
STEPS=${STEPS:-200}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec deepspeed --num_gpus "$GPUS" scripts/deepspeed_train_example.py \
    --deepspeed_config scripts/deepspeed_config_example.json \
    --stages "$STAGES" --steps "$STEPS" ${EXTRA:-}
