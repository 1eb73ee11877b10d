#!/usr/bin/env bash
# Sets up everything `pulumi up` needs on a fresh machine, then runs it for one stack: .venv, the Pulumi CLI
# (scripts/install-pulumi.sh installs the pinned one into .tools/pulumi/ unless a recent enough one is on PATH), the
# state backend and the stack, and for a gcp stack a Google login and a project. State goes to a local file backend
# (.pulumi-state/) unless PULUMI_BACKEND_URL says otherwise (Pulumi Cloud, gs://bucket, ...).
# Usage: scripts/up.sh [STACK] [tpuserve up options...] [-- pulumi up flags...]   (STACK defaults to dev)
set -euo pipefail
cd "$(dirname "$0")/.."
stack=${1:-dev}
shift || true

# A stack is its Pulumi.<stack>.yaml: a name without one is refused (a typo would become a new, empty stack), naming
# the stacks there are.
if [[ ! -f Pulumi.$stack.yaml ]]; then
  known=()
  for file in Pulumi.*.yaml; do
    [[ -f $file ]] && { name=${file#Pulumi.}; known+=("${name%.yaml}"); }
  done
  list=$(IFS=,; echo "${known[*]:-none}")
  echo "Error: no Pulumi.$stack.yaml, so no stack $stack: the stacks here are ${list//,/, }; a new stack starts as" \
    "a copy of one (cp Pulumi.dev.yaml Pulumi.$stack.yaml)" >&2
  exit 2
fi

scripts/bootstrap.sh stack

# The stack file against the program's own rules, offline: a bad key stops here, before a login check or a download.
.venv/bin/tpuserve check --stack "$stack"

# A gcp or gke stack (gcp is the default target) needs a Google login. It is checked first: the target is read from
# the stack's file (Pulumi.<stack>.yaml holds its config; none yet means gcp) and the check needs no download, so a
# machine that cannot reach the Pulumi releases hears about a missing login before it waits on them.
target=$(sed -nE "s/^[[:space:]]+tpu-serve:target:[[:space:]]*[\"']?([A-Za-z]+).*/\1/p" "Pulumi.$stack.yaml" \
  2>/dev/null | head -n 1) || target=
google=
if [[ ${target:-gcp} != local ]]; then
  google=yes
  .venv/bin/python -m tpuserve.deploy.adc_check
fi

pulumi_dir=$(scripts/install-pulumi.sh)
export PATH="$pulumi_dir:$PATH"

backend_hint=
if [[ -z ${PULUMI_BACKEND_URL:-} ]]; then
  export PULUMI_BACKEND_URL=file://$PWD/.pulumi-state
  backend_hint="PULUMI_BACKEND_URL=$PULUMI_BACKEND_URL "
fi
if [[ $PULUMI_BACKEND_URL == file://* ]]; then
  mkdir -p "${PULUMI_BACKEND_URL#file://}"
fi
pulumi stack select --create "$stack"

# ... and a project: say how to set it before the provider fails.
if [[ -n $google ]]; then
  project=$(pulumi config get project --stack "$stack" 2>/dev/null) || project=
  if [[ -z $project ]]; then
    pulumi_cmd=pulumi
    [[ $pulumi_dir == "$PWD"/.tools/* ]] && pulumi_cmd=${pulumi_dir#"$PWD"/}/pulumi
    echo "Error: stack $stack names no GCP project: run" \
      "\`${backend_hint}${pulumi_cmd} config set -s $stack project YOUR_PROJECT_ID\`" >&2
    exit 1
  fi
fi

# Preflight, then `pulumi up` zone by zone until one has TPU capacity (tpuserve up --help); extra arguments go to
# tpuserve up, e.g. --zones europe-west4-a,us-east1-d --retry-until-up, and after `--` to pulumi up.
.venv/bin/tpuserve up --stack "$stack" "$@"
