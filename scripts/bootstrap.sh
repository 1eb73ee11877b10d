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
# --compile-bytecode: uv writes no .pyc by default, so every run of the program (each `pulumi preview`/`up`) would
# compile pulumi_gcp's modules again: importing the stack's modules took 3.6-4.4 s without them, 0.7 s with them.
.venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python -e ".[${extras}]"
# The project itself is installed editable, so uv compiled none of its modules. Where PYTHONDONTWRITEBYTECODE is set
# (this machine, many CI images) every process would compile them again: each `pulumi preview`, each of the tests'
# workers and the processes they start (0.6 s here, against 3.6 s more for a fresh clone's fast tier).
.venv/bin/python -m compileall -q -j 0 components tpuserve vm policy tests > /dev/null ||
  echo "bootstrap: some modules did not compile (python -m compileall components tpuserve vm policy tests)" >&2
