#!/usr/bin/env bash
# Sets up .venv and runs `pulumi up` for one stack. State goes to a local file backend (.pulumi-state/) unless
# PULUMI_BACKEND_URL says otherwise (Pulumi Cloud, gs://bucket, ...).
# Usage: scripts/up.sh [STACK] [pulumi up flags...]   (STACK defaults to dev)
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:-dev}
shift || true

command -v pulumi >/dev/null || { echo "pulumi CLI not found: https://www.pulumi.com/docs/install/" >&2; exit 1; }
scripts/bootstrap.sh stack

export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file://$PWD/.pulumi-state}
if [[ $PULUMI_BACKEND_URL == file://* ]]; then
  mkdir -p "${PULUMI_BACKEND_URL#file://}"
fi
pulumi stack select --create "$stack"
# Preflight, then `pulumi up` zone by zone until one has TPU capacity (tpuserve up --help); extra arguments go to
# tpuserve up, e.g. --zones europe-west4-a,us-east1-d --retry-until-up, and after `--` to pulumi up.
.venv/bin/tpuserve up --stack "$stack" "$@"
