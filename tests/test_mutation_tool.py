"""scripts/mutation.py, the mutation-testing driver: its hand-written mutant list applies, its scoring is the one
docs/testing.md states, and a hand-written mutant runs against a scratch copy (a toy repository here; no mutmut
run)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.mutation import (
    EQUIVALENTS, HANDWRITTEN, ConfigProblem, HandMutant, Tally, equivalent_names, hand_status, load_hand_mutants,
    main, mutant_glob, mutated, mutmut_modules, mutmut_statuses, placement_problems, run_hand_mutants, status_of,
    tally, verdict,
)

ROOT = Path(__file__).resolve().parent.parent


def test_every_hand_written_mutant_applies_exactly_once_and_names_existing_tests():
    mutants = load_hand_mutants(ROOT / HANDWRITTEN)
    assert len(mutants) >= 30
    assert placement_problems(mutants, ROOT) == []
    for mutant in mutants:
        text = (ROOT / mutant.file).read_text()
        assert mutated(text, mutant) != text


def test_the_modules_mutmut_mutates_are_the_ones_the_docs_score():
    modules = mutmut_modules(ROOT / "pyproject.toml")
    assert modules == ["tpuserve/observe/logs.py", "tpuserve/measure/benchreport.py", "tpuserve/measure/cost.py",
                       "tpuserve/client.py", "tpuserve/measure/probe.py", "tpuserve/serving.py", "tpuserve/urls.py",
                       "tpuserve/observe/gate.py", "components/config.py", "policy/rules.py"]
    scores = (ROOT / "docs" / "testing.md").read_text()
    for module in modules:
        assert f"\n| `{module}` |" in scores


def test_every_equivalent_names_a_reason():
    """Each listed survivor is one bullet: `name`: what the mutant changes and why that is harmless."""
    bullets = [line for line in (ROOT / EQUIVALENTS).read_text().splitlines() if line.startswith("- `")]
    assert bullets
    for bullet in bullets:
        name, _, reason = bullet[3:].partition("`: ")
        assert name and len(reason) > 30, bullet
    assert len(equivalent_names(ROOT / EQUIVALENTS)) >= len(bullets)


@pytest.mark.parametrize("code, status", [
    (1, "killed"), (3, "killed"), (-11, "killed"),
    (24, "timeout"), (-24, "timeout"), (152, "timeout"), (255, "timeout"), (36, "timeout"), (-9, "timeout"),
    (0, "survived"), (5, "no tests"), (33, "no tests"),
    (None, "not judged"), (2, "not judged"), (34, "not judged"), (35, "not judged"), (37, "not judged"),
])
def test_mutmut_exit_codes_are_scored_as_the_docs_say(code, status):
    assert status_of(code) == status


@pytest.mark.parametrize("code, status", [(None, "timeout"), (0, "survived"), (1, "killed"), (2, "killed"),
                                          (5, "no tests"), (3, "not judged"), (4, "not judged")])
def test_a_hand_written_mutants_pytest_exit_code(code, status):
    assert hand_status(code) == status


def test_timeouts_count_as_killed_and_no_tests_as_survived():
    t = tally({"a": "killed", "b": "timeout", "c": "survived", "d": "no tests", "e": "killed", "f": "not judged"})
    assert (t.total, t.killed, t.judged) == (6, 3, 5)
    assert t.score == pytest.approx(0.6)
    assert t.survivors == ("c", "d")
    assert tally({}).score is None


def scored(killed: int, survived: int, survivors: tuple[str, ...] = ()) -> Tally:
    statuses = {f"k{i}": "killed" for i in range(killed)} | {f"s{i}": "survived" for i in range(survived)}
    t = tally(statuses)
    return Tally(t.counts, survivors or t.survivors)


def test_ninety_percent_passes_and_less_fails():
    lines, ok = verdict({"m.py": scored(9, 1)}, equivalents={"s0"})
    assert ok and "m.py: 1 survivor(s) listed as equivalent in tests/mutation/equivalents.md" in lines
    lines, ok = verdict({"m.py": scored(8, 1)}, equivalents={"s0"})
    assert not ok and "m.py: score 88.9% is under 90%" in lines


def test_unlisted_survivors_are_named_and_unjudged_mutants_fail_the_run():
    lines, ok = verdict({"m.py": scored(19, 1)}, equivalents=set())
    assert ok and lines[1:3] == ["m.py: survivors not in tests/mutation/equivalents.md (kill them, or list them "
                                 "with the reason):", "    s0"]
    unjudged = tally({"a": "killed", "b": "not judged"})
    lines, ok = verdict({"m.py": unjudged}, equivalents=set())
    assert not ok and "m.py: 1 mutant(s) not judged (interrupted or not run)" in lines
    assert verdict({"m.py": tally({})}, set())[1] is False  # nothing judged is no score


def test_mutant_names_of_a_module():
    assert mutant_glob("tpuserve/observe/logs.py") == "tpuserve.observe.logs.*"
    assert mutant_glob("tpuserve/urls.py") == "tpuserve.urls.*"


def test_mutmut_results_are_read_from_its_meta_file(tmp_path: Path):
    meta = tmp_path / "mutants" / "tpuserve" / "urls.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"tpuserve.urls.x_f__mutmut_1": 1, "tpuserve.urls.x_f__mutmut_2": 0,
                                                     "tpuserve.urls.x_f__mutmut_3": 33}}))
    assert mutmut_statuses(tmp_path, "tpuserve/urls.py") == {
        "tpuserve.urls.x_f__mutmut_1": "killed", "tpuserve.urls.x_f__mutmut_2": "survived",
        "tpuserve.urls.x_f__mutmut_3": "no tests"}
    assert mutmut_statuses(tmp_path, "tpuserve/cost.py") == {}


ENTRY = """[[mutant]]
id = "{id}"
file = "toy.py"
find = '{find}'
replace = '{replace}'
why = "a defect"
tests = ["test_toy.py"]
"""


def write_list(path: Path, *entries: str) -> Path:
    path.write_text("\n".join(entries))
    return path


@pytest.mark.parametrize("entries, says", [
    ([ENTRY.format(id="a", find="x", replace="y") + 'extra = "1"\n'], "entry 1 (a): keys must be exactly"),
    ([ENTRY.format(id="a", find="x", replace="x")], "entry 1 (a): replace must be a string that differs from find"),
    ([ENTRY.format(id="a", find="", replace="y")], "entry 1 (a): id, file, find and why must be non-empty strings"),
    ([ENTRY.format(id="a", find="x", replace="y").replace('["test_toy.py"]', "[]")],
     "entry 1 (a): tests must be a non-empty list"),
    ([ENTRY.format(id="a", find="x", replace="y"), ENTRY.format(id="a", find="z", replace="y")],
     "ids used more than once: a"),
])
def test_a_malformed_entry_is_refused_naming_it(tmp_path: Path, entries: list[str], says: str):
    with pytest.raises(ConfigProblem, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_hand_mutants(write_list(tmp_path / "list.toml", *entries))


def toy_repository(root: Path) -> Path:
    """A git work tree with one function, its boundary pinned by a test."""
    (root / "toy.py").write_text("def within(x):\n    return x <= 3\n")
    (root / "test_toy.py").write_text("from toy import within\n\n\ndef test_the_limit_is_inclusive():\n"
                                      "    assert within(3) and not within(4)\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    return root


def test_find_must_occur_exactly_once(tmp_path: Path):
    root = toy_repository(tmp_path)
    mutants = [HandMutant("nowhere", "toy.py", "x >= 3", "x", "w", ("test_toy.py",)),
               HandMutant("twice", "toy.py", "x", "y", "w", ("test_toy.py",)),
               HandMutant("no-file", "gone.py", "x", "y", "w", ("test_toy.py",)),
               HandMutant("no-test", "toy.py", "<=", "<", "w", ("test_gone.py::test_x",))]
    assert placement_problems(mutants, root) == [
        "nowhere: `find` occurs 0 times in toy.py, not exactly once",
        "twice: `find` occurs 2 times in toy.py, not exactly once",
        "no-file: gone.py does not exist",
        "no-test: test file test_gone.py does not exist"]
    with pytest.raises(ConfigProblem, match="twice: `find` occurs 2 times in toy.py"):
        mutated((root / "toy.py").read_text(), mutants[1])


def test_hand_written_mutants_run_one_at_a_time_on_a_scratch_copy(tmp_path: Path):
    root = toy_repository(tmp_path)
    mutants = [HandMutant("exclusive-limit", "toy.py", "x <= 3", "x < 3", "off by one", ("test_toy.py",)),
               HandMutant("same-limit", "toy.py", "x <= 3", "not x > 3", "a rewrite", ("test_toy.py",))]
    said: list[str] = []
    statuses = run_hand_mutants(mutants, root, say=said.append)
    assert statuses == {"exclusive-limit": "killed", "same-limit": "survived"}
    assert [line.split()[:2] for line in said] == [["killed", "exclusive-limit"], ["survived", "same-limit"]]
    assert (root / "toy.py").read_text() == "def within(x):\n    return x <= 3\n"  # the tree itself is never touched


def test_tests_that_fail_unmutated_judge_nothing(tmp_path: Path):
    root = toy_repository(tmp_path)
    (root / "test_toy.py").write_text("def test_broken():\n    assert False\n")
    with pytest.raises(ConfigProblem, match="unmutated, `pytest test_toy.py` exits 1"):
        run_hand_mutants([HandMutant("m", "toy.py", "<=", "<", "w", ("test_toy.py",))], root, say=lambda line: None)


def test_an_unknown_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]):
    assert main(["tpuserve/cli.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mutation: tpuserve/cli.py: not a module of [tool.mutmut] only_mutate nor a file with "
                          "hand-written mutants (tests/mutation/handwritten.toml); known: tpuserve/observe/logs.py, ")


def test_list_names_what_would_run(capsys: pytest.CaptureFixture[str]):
    assert main(["--list", "scripts/up.sh"]) == 0
    assert capsys.readouterr().out == ("mutmut modules:\n  \nhand-written mutants:\n"
                                       "  up-default-target-is-local (scripts/up.sh)\n"
                                       "  up-missing-project-not-fatal (scripts/up.sh)\n"
                                       "  up-extra-arguments-dropped (scripts/up.sh)\n"
                                       "  up-no-credential-check (scripts/up.sh)\n"
                                       "  up-installed-cli-not-on-path (scripts/up.sh)\n"
                                       "  up-project-hint-without-backend (scripts/up.sh)\n")
