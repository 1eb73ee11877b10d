#!/usr/bin/env bash
# Install the LiteLLM proxy (litellm[proxy], the version the fleet's router VM runs) into its own venv, for the
# router tests and benchmarks/router_overhead.py: `litellm --config FILE` on 127.0.0.1. Also Debian's haproxy and
# redis-server, which the router VM runs in front of and beside its proxies (templates/router-startup.sh.j2), when
# missing and apt-get can install them (as root).
#
# Usage: scripts/install-litellm-proxy.sh [VENV_DIR]   (default: $TPUSERVE_LITELLM_VENV or
#        ~/.cache/tpuserve/litellm-proxy-venv)
#
# Idempotent: a stamp file in the venv records the recipe; when it matches, nothing is done. Its own venv because
# the proxy extra pins server packages (gunicorn, uvicorn, fastapi...) the project's .venv does not need.
set -euo pipefail

# One pin for the router VM's image tag and this install: tpuserve/facts.py LITELLM_VERSION.
cd "$(dirname "$0")/.."
LITELLM_VERSION="$(python3 -c 'import ast, sys; tree = ast.parse(open("tpuserve/facts.py").read()); print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "LITELLM_VERSION"))')"
RECIPE="litellm[proxy]==${LITELLM_VERSION}"

venv="${1:-${TPUSERVE_LITELLM_VENV:-$HOME/.cache/tpuserve/litellm-proxy-venv}}"
stamp="$venv/.tpuserve-install-recipe"
base_python="${TPUSERVE_PYTHON:-python3}"

missing=()
for binary in haproxy redis-server; do
  command -v "$binary" > /dev/null 2>&1 || missing+=("$binary")
done
if [[ -n "${missing[*]}" ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get > /dev/null 2>&1; then
    apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" > /dev/null
  else
    echo "warning: the router e2e tests need ${missing[*]} (Debian: sudo apt-get install ${missing[*]})" >&2
  fi
fi

if [[ -f "$stamp" && "$(cat "$stamp")" == "$RECIPE" ]]; then
  echo "litellm proxy ${LITELLM_VERSION} already installed in $venv"
  exit 0
fi

uv_bin="$(command -v uv || true)"
if [[ -z "$uv_bin" ]]; then
  bootstrap="$HOME/.cache/tpuserve/uv-bootstrap"
  [[ -x "$bootstrap/bin/uv" ]] || { "$base_python" -m venv "$bootstrap" && "$bootstrap/bin/pip" install --quiet uv; }
  uv_bin="$bootstrap/bin/uv"
fi

[[ -x "$venv/bin/python" ]] || "$base_python" -m venv "$venv"
"$uv_bin" pip install --python "$venv/bin/python" --compile-bytecode "$RECIPE"
# LITELLM_LOCAL_MODEL_COST_MAP: use the price map the package ships instead of fetching one at import.
LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/litellm" --help > /dev/null
echo "$RECIPE" > "$stamp"
echo "litellm proxy ${LITELLM_VERSION} installed in $venv"
