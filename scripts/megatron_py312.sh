#!/usr/bin/env bash
# The Megatron tests on the other Python line: megatron-core 0.17+ need Python >= 3.12, so
# tests/megatron run on a Python 3.12 venv with megatron-core 0.19.x. scripts/test_all.sh (the
# project's test command, and .ci/run) runs it after the 3.11 suite. torch for 3.12 comes from PyPI,
# where only its CUDA build is (4.7 GB installed with its nvidia-* libraries; measured install times:
# docs/megatron.md, "Two Python lines in CI"). The venv lives in a temporary folder and is removed
# afterwards, whatever happens.
#   scripts/megatron_py312.sh [pytest args]      (default: -m "not megatron_line_independent" tests/megatron)
# By default the modules whose checks do not depend on the installed megatron-core are left out:
# they ran on the suite's line already (tests/megatron/megatron_lines.py lists them, each with its reason).
# Skips (one line, exit 0) when there is no Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."

py312=""
if command -v pyenv >/dev/null 2>&1 && prefix=$(pyenv prefix 3.12 2>/dev/null) && [ -x "$prefix/bin/python3.12" ]; then
    py312="$prefix/bin/python3.12"
elif command -v python3.12 >/dev/null 2>&1 && python3.12 -c '' 2>/dev/null; then
    py312=$(command -v python3.12)
fi
if [ -z "$py312" ]; then
    echo "megatron_py312: skipped: no python3.12 (pyenv 3.12 or python3.12 on PATH) on this machine"
    exit 0
fi

venv=$(mktemp -d "${TMPDIR:-/tmp}/perseus-ci-py312.XXXXXX")
trap 'rm -rf "$venv"' EXIT
"$py312" -m venv "$venv"
started=$(date +%s)
# -c constraints.txt: the same torch as the 3.11 line; megatron-core 0.19.x is the newest line supported.
"$venv/bin/python" -m pip install -q -c constraints.txt torch==2.13.0
"$venv/bin/python" -m pip install -q -c constraints.txt -e ".[megatron]" "megatron-core>=0.19,<0.20" \
    "pytest>=8" "pytest-xdist>=3.5" "tensorboard>=2.14" "prometheus-client>=0.20" six regex pyyaml  # Megatron-LM's megatron.training imports these
echo "megatron_py312: venv ready in $(( $(date +%s) - started )) s: $("$venv/bin/python" -c \
    'import sys, torch, megatron.core as m; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, megatron-core {m.__version__}")' 2>/dev/null)"
if [ $# -eq 0 ]; then
    set -- -m "not megatron_line_independent" tests/megatron
fi
"$venv/bin/python" -m pytest -q "$@"
