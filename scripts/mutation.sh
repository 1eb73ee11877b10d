#!/usr/bin/env bash
# Mutation testing of the code that protects users (mutmut for the Python modules in pyproject's [tool.mutmut],
# plus the hand-written mutants of tests/mutation/handwritten.toml); prints a score per module. Not run in CI: it
# takes tens of minutes on 2 cores. Usage and scoring: scripts/mutation.py (or scripts/mutation.sh --help).
#   scripts/mutation.sh                           # everything
#   scripts/mutation.sh tpuserve/observe/logs.py  # one module
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev,mutation >&2
exec .venv/bin/python scripts/mutation.py "$@"
