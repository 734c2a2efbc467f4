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
echo "test: cdk synth (both compute modes, CDK CLI from npm)"
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1
out=$(mktemp -d)
for mode in ecs sagemaker; do
  npx --no-install cdk synth -q -c compute=$mode -o "$out/$mode" >/dev/null
  echo "  compute=$mode: $(ls "$out/$mode"/*.template.json | wc -l) template(s)"
done
rm -rf "$out"
echo "test: pytest"
exec .venv/bin/pytest -q -p no:cacheprovider --durations=30 "$@"
