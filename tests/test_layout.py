"""The package's floors: a module imports only its own floor and the ones below it (no import runs back up).

core (tpuserve/*.py) < deploy/ < measure/, observe/ < ops/ (orchestrators that call both deploy and the gate).
Code that runs on the VM (vm/) imports nothing from tpuserve: it runs on the bare image's Python.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tpuserve"
# floor -> floors it may import from (itself included)
ALLOWED = {
    "core": {"core"},
    "deploy": {"core", "deploy"},
    "measure": {"core", "deploy", "measure"},
    "observe": {"core", "deploy", "observe"},
    "ops": {"core", "deploy", "measure", "observe", "ops"},
}


def floor_of(module: str) -> str:
    """'tpuserve.gce' -> 'deploy'; 'tpuserve.serving' -> 'core'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ALLOWED else "core"


def parse(path: Path) -> ast.Module:
    """ast.parse, again after CPython 3.11's spurious "AST constructor recursion depth mismatch" SystemError: the
    counter it checks is shared by every thread (python/cpython#106905), and in a pytest-xdist worker a thread an
    earlier test left behind can be building an AST at the same moment (seen once in CI)."""
    for _ in range(2):
        with contextlib.suppress(SystemError):
            return ast.parse(path.read_text())
    return ast.parse(path.read_text())


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] == "tpuserve"}


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        found.append((".".join(relative.parts).removesuffix(".__init__"), path))
    return found


def test_the_floors_are_the_package_folders():
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders <= set(ALLOWED) - {"core"}, f"a package folder without a floor: {folders - set(ALLOWED)}"


@pytest.mark.parametrize("module,path", modules(), ids=[name for name, _ in modules()])
def test_imports_stay_on_or_below_the_floor(module, path):
    floor = floor_of(module)
    upward = sorted(name for name in imported_modules(path)
                    if floor_of(name) not in ALLOWED[floor] and name not in ("tpuserve.deploy", "tpuserve.measure",
                                                                              "tpuserve.observe", "tpuserve.ops"))
    assert not upward, f"{module} ({floor}) imports from a higher floor: {upward}"


def test_vm_code_imports_nothing_from_tpuserve():
    vm = ROOT / "vm"
    for path in sorted(vm.rglob("*.py")) if vm.exists() else []:
        assert not imported_modules(path), f"{path} imports tpuserve: it must run on the bare VM image"


def test_a_planted_upward_import_is_caught(tmp_path):
    """The checker itself: a deploy module importing the gate is an upward import."""
    planted = tmp_path / "planted.py"
    planted.write_text("from tpuserve.observe.gate import watch_url\nimport tpuserve.serving\n")
    upward = [name for name in imported_modules(planted) if floor_of(name) not in ALLOWED["deploy"]]
    assert sorted(upward) == ["tpuserve.observe.gate", "tpuserve.observe.gate.watch_url"]


def test_the_files_that_run_pulumi_programs_are_the_ones_conftest_schedules_together() -> None:
    """tests/conftest.py runs these files on one xdist worker; a new one left out would import the SDKs again."""
    from tests.conftest import PULUMI_PROGRAM_FILES

    running = {path.name for path in (ROOT / "tests").glob("test_*.py")
               if path.name != "test_layout.py" and "run_stack(" in path.read_text()}
    assert running == PULUMI_PROGRAM_FILES


def test_loadfile_gets_one_scope_for_the_pulumi_files_and_a_scope_per_other_file(request, monkeypatch) -> None:
    from tests import conftest

    for option, value in (("dist", "loadfile"), ("numprocesses", 4), ("tx", ["4*popen"])):
        monkeypatch.setattr(request.config.option, option, value, raising=False)
    scope = conftest.pytest_xdist_make_scheduler(request.config, None)._split_scope
    assert scope("tests/test_stack.py::test_a[dev]") == scope("tests/test_gke_stack.py::test_b") == \
        "tests/[pulumi programs]"
    assert scope("tests/test_gate.py::test_c") == "tests/test_gate.py"
    monkeypatch.setattr(request.config.option, "dist", "load")
    assert conftest.pytest_xdist_make_scheduler(request.config, None) is None  # xdist's own for other modes
