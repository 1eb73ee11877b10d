"""The layers a reader can see: the package's floors, core (tpuserve/*.py) < deploy/ < measure/, observe/ < ops/
(no import runs back up); the Pulumi program (components/) on the core alone; the VM's code (vm/) on nothing of
tpuserve, since it runs on the bare image's Python. And no module explains itself in an essay."""

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


PROGRAM = sorted([*(ROOT / "components").glob("*.py"), ROOT / "__main__.py"])


@pytest.mark.parametrize("path", PROGRAM, ids=[path.name for path in PROGRAM])
def test_the_program_depends_on_the_core_alone(path: Path) -> None:
    """What a stack declares never depends on what the CLI does: no deploy, ops, observe, measure, nor the CLI."""
    beyond = sorted(name for name in imported_modules(path)
                    if floor_of(name) != "core" or name.split(".")[:2] == ["tpuserve", "cli"]
                    or name in ("tpuserve.deploy", "tpuserve.measure", "tpuserve.observe", "tpuserve.ops"))
    assert not beyond, f"{path.relative_to(ROOT)} imports the CLI's packages: {beyond}"


PRODUCT = sorted(path for folder in ("tpuserve", "components", "vm", "policy") for path in (ROOT / folder).rglob("*.py"))
MAX_MODULE_DOCSTRING_LINES = 12


@pytest.mark.parametrize("path", PRODUCT, ids=[str(path.relative_to(ROOT)) for path in PRODUCT])
def test_a_module_docstring_is_short(path: Path) -> None:
    """Why in a few lines; the reasoning lives in docs/design/ and the module links it."""
    doc = ast.get_docstring(parse(path), clean=False) or ""
    assert doc.count("\n") < MAX_MODULE_DOCSTRING_LINES, f"{path.relative_to(ROOT)}: move the essay to docs/design"


def test_a_planted_upward_import_is_caught(tmp_path):
    """The checker itself: a deploy module importing the gate is an upward import."""
    planted = tmp_path / "planted.py"
    planted.write_text("from tpuserve.observe.gate import watch_url\nimport tpuserve.serving\n")
    upward = [name for name in imported_modules(planted) if floor_of(name) not in ALLOWED["deploy"]]
    assert sorted(upward) == ["tpuserve.observe.gate", "tpuserve.observe.gate.watch_url"]


def test_the_files_that_run_pulumi_programs_are_the_ones_conftest_schedules_together() -> None:
    """tests/conftest.py runs these files on one xdist worker; a new one left out would import the SDKs again."""
    from tests.conftest import PULUMI_PROGRAM_FILES

    running = {path.name for path in (ROOT / "tests").rglob("test_*.py") if path.name != "test_layout.py"
               and any(call in path.read_text() for call in ("run_stack(", "stack_file_run("))}
    assert running == PULUMI_PROGRAM_FILES


def test_loadfile_gets_one_scope_for_the_pulumi_files_and_a_scope_per_other_file(request, monkeypatch) -> None:
    from tests import conftest

    for option, value in (("dist", "loadfile"), ("numprocesses", 4), ("tx", ["4*popen"])):
        monkeypatch.setattr(request.config.option, option, value, raising=False)
    scope = conftest.pytest_xdist_make_scheduler(request.config, None)._split_scope
    assert scope("tests/components/test_stack.py::test_a[dev]") == scope("tests/components/test_gke_stack.py::test_b") == \
        "tests/[pulumi programs]"
    assert scope("tests/cli/test_gate.py::test_c") == "tests/cli/test_gate.py"
    monkeypatch.setattr(request.config.option, "dist", "load")
    assert conftest.pytest_xdist_make_scheduler(request.config, None) is None  # xdist's own for other modes


def test_tests_sit_with_the_code_they_test_and_share_their_fakes_from_one_folder() -> None:
    """docs/testing.md#layout: tests/components, cli, vm, e2e; helpers outside e2e's own live in tests/fakes."""
    tests = ROOT / "tests"
    strays = sorted(str(path.relative_to(tests)) for path in tests.rglob("*.py")
                    if not path.name.startswith("test_") and path.name not in ("__init__.py", "conftest.py")
                    and path.parent.name not in ("fakes", "e2e"))
    assert not strays, f"helpers outside tests/fakes: {strays}"


def test_the_files_conftest_starts_first_exist() -> None:
    """A file renamed or moved out of tests/conftest.py's LONGEST_FIRST would silently start last again."""
    from tests.conftest import LONGEST_FIRST

    files = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    assert set(LONGEST_FIRST) <= files, sorted(set(LONGEST_FIRST) - files)
