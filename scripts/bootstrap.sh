#!/usr/bin/env bash
# Creates .venv (the virtualenv Pulumi.yaml names) and installs tpu-serve with the given extras.
# Usage: scripts/bootstrap.sh [EXTRAS]   e.g. "stack" for `pulumi up`, "dev" for the tests (default).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-dev}

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if [[ ! -x .venv/bin/uv ]]; then
  .venv/bin/pip install --quiet uv
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python -e ".[${extras}]"
