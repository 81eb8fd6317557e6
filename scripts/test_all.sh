#!/usr/bin/env bash
# The project's test command: the suite on this Python (3.11, megatron-core 0.16.x), then the
# Megatron tests on the other supported line (Python 3.12, megatron-core 0.19.x) in a temporary
# venv (scripts/megatron_py312.sh; one line and no failure where there is no Python 3.12).
#   scripts/test_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q
scripts/megatron_py312.sh
