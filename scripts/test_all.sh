#!/usr/bin/env bash
# The project's test command: ruff and mypy (configured in ruff.toml and mypy.ini; docs/development.md),
# then the documentation site (mkdocs build --strict), the suite on this Python (3.11, megatron-core 0.16.x), then the
# Megatron tests on the other supported line (Python 3.12, megatron-core 0.19.x) in a temporary
# venv (scripts/megatron_py312.sh; one line and no failure where there is no Python 3.12).
#   scripts/test_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check
python -m mypy
site=$(mktemp -d) && NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet -d "$site" && rm -rf "$site"  # the docs site (mkdocs.yml)
python -m pytest -q
scripts/megatron_py312.sh
