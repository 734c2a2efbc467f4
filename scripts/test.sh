#!/usr/bin/env bash
# Runs every check CI runs: ruff, mypy, and the whole pytest suite (unit, integration, CDK
# assertion and end-to-end tests). Run scripts/setup.sh --dev first.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test: ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "test: mypy"
.venv/bin/mypy
echo "test: pytest"
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
