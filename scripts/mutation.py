"""Mutation testing of the code that protects users: would the tests notice a small, plausible defect?

Two kinds of mutants, one report (run it as `scripts/mutation.sh`, which installs the tools first):

- Python modules: mutmut (pinned in pyproject's `mutation` extra, configured in its [tool.mutmut] table) plants
  every mutant it can make in the modules `only_mutate` lists and runs, for each, the selected tests that reach the
  mutated function. mutmut only mutates code inside functions, and skips decorated functions (click commands,
  properties), so module-level tables (the redaction patterns, the option tables) are covered by the second kind.
- Hand-written mutants (tests/mutation/handwritten.toml): shell, Jinja templates and module-level tables, which no
  Python mutation tool reaches. Each entry is (file, find, replace, why, tests); `find` must occur exactly once in
  `file`. They are applied one at a time to a scratch copy of the work tree, never to the tree itself.

Score = (killed + timeout) / (killed + timeout + survived + no tests): a mutant that makes the tests time out is
killed, a mutant that no selected test reaches counts as survived. Survivors that are harmless rewrites are listed,
with the reason, in tests/mutation/equivalents.md. Exit 1 when a module's or a file's score is under 90 % or the
run did not judge every mutant; 2 on bad usage. One mutmut worker: the machine's cores are shared.

    scripts/mutation.sh                          # everything
    scripts/mutation.sh tpuserve/observe/logs.py # one module (its mutmut mutants, and its hand-written ones)
    scripts/mutation.sh scripts/install-pulumi.sh
    scripts/mutation.sh --list                   # what would run
    scripts/mutation.sh --show tpuserve/urls.py  # the last run's survivors of a module, as diffs
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANDWRITTEN = Path("tests/mutation/handwritten.toml")
EQUIVALENTS = Path("tests/mutation/equivalents.md")
THRESHOLD = 0.90
SCORE_RULE = ("score = (killed + timeout) / (killed + timeout + survived + no tests): a timeout counts as killed, "
              "a mutant no test reaches ('no tests') counts as survived")

# mutmut 3.8.1's exit codes of a mutant's test run (src/mutmut/stats.py, status_by_exit_code), grouped as scored.
# -9 is the SIGKILL mutmut's CPU-time limit sends one second after SIGXCPU: a timeout too.
KILLED_CODES = {1, 3, -11}
TIMEOUT_CODES = {24, -24, 152, 255, 36, -9}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}
STATUSES = ("killed", "timeout", "survived", "no tests")


def status_of(exit_code: int | None) -> str:
    """killed, timeout, survived, no tests, or 'not judged' (not run, interrupted, skipped, suspicious)."""
    for status, codes in zip(STATUSES, (KILLED_CODES, TIMEOUT_CODES, SURVIVED_CODES, NO_TESTS_CODES)):
        if exit_code in codes:
            return status
    return "not judged"


@dataclass(frozen=True)
class Tally:
    """Mutants of one module or file by status; `survivors` names the survived and no-tests ones."""

    counts: Counter[str]
    survivors: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def killed(self) -> int:
        return self.counts["killed"] + self.counts["timeout"]

    @property
    def judged(self) -> int:
        return sum(self.counts[status] for status in STATUSES)

    @property
    def score(self) -> float | None:
        return self.killed / self.judged if self.judged else None


def tally(statuses: dict[str, str]) -> Tally:
    """Tally {mutant name: status}."""
    survivors = tuple(sorted(name for name, status in statuses.items() if status in ("survived", "no tests")))
    return Tally(Counter(statuses.values()), survivors)


# ---------------------------------------------------------------------------------------------------------------
# Configuration

def mutmut_modules(pyproject: Path) -> list[str]:
    """The modules mutmut mutates: [tool.mutmut] only_mutate, each one file."""
    config = tomllib.loads(pyproject.read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def mutant_glob(module_path: str) -> str:
    """mutmut's names for a module's mutants: 'tpuserve/observe/logs.py' -> 'tpuserve.observe.logs.*'."""
    return module_path.removesuffix(".py").replace("/", ".") + ".*"


@dataclass(frozen=True)
class HandMutant:
    id: str
    file: str
    find: str
    replace: str
    why: str
    tests: tuple[str, ...]


class ConfigProblem(ValueError):
    """A hand-written mutant that cannot be applied as written; the message names it."""


HAND_KEYS = {"id", "file", "find", "replace", "why", "tests"}


def load_hand_mutants(path: Path) -> list[HandMutant]:
    """The [[mutant]] entries of a hand-written list, checked for shape (not yet against the files)."""
    entries = tomllib.loads(path.read_text()).get("mutant", [])
    mutants: list[HandMutant] = []
    for index, entry in enumerate(entries, 1):
        where = f"{path} entry {index} ({entry.get('id', 'no id')})"
        if set(entry) != HAND_KEYS:
            raise ConfigProblem(f"{where}: keys must be exactly {sorted(HAND_KEYS)}, got {sorted(entry)}")
        if not all(isinstance(entry[key], str) and entry[key] for key in HAND_KEYS - {"tests", "replace"}):
            raise ConfigProblem(f"{where}: id, file, find and why must be non-empty strings")
        if not isinstance(entry["replace"], str) or entry["replace"] == entry["find"]:
            raise ConfigProblem(f"{where}: replace must be a string that differs from find")
        tests = entry["tests"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t for t in tests):
            raise ConfigProblem(f"{where}: tests must be a non-empty list of pytest paths or node ids")
        mutants.append(HandMutant(entry["id"], entry["file"], entry["find"], entry["replace"], entry["why"],
                                  tuple(tests)))
    duplicates = sorted(name for name, count in Counter(m.id for m in mutants).items() if count > 1)
    if duplicates:
        raise ConfigProblem(f"{path}: ids used more than once: {', '.join(duplicates)}")
    return mutants


def placement_problems(mutants: Iterable[HandMutant], root: Path) -> list[str]:
    """One line per mutant whose file is missing or whose `find` does not occur exactly once, or whose test file
    is missing; empty when every mutant applies."""
    problems = []
    for mutant in mutants:
        target = root / mutant.file
        if not target.is_file():
            problems.append(f"{mutant.id}: {mutant.file} does not exist")
            continue
        count = target.read_text().count(mutant.find)
        if count != 1:
            problems.append(f"{mutant.id}: `find` occurs {count} times in {mutant.file}, not exactly once")
        problems += [f"{mutant.id}: test file {test.split('::')[0]} does not exist" for test in mutant.tests
                     if not (root / test.split("::")[0]).exists()]
    return problems


def mutated(text: str, mutant: HandMutant) -> str:
    if text.count(mutant.find) != 1:
        raise ConfigProblem(f"{mutant.id}: `find` occurs {text.count(mutant.find)} times in {mutant.file}")
    return text.replace(mutant.find, mutant.replace, 1)


def equivalent_names(path: Path) -> set[str]:
    """Mutant names and hand-written ids the equivalents file lists (each in backticks)."""
    return set(re.findall(r"`([^`\s]+)`", path.read_text())) if path.is_file() else set()


# ---------------------------------------------------------------------------------------------------------------
# Hand-written mutants

def scratch_copy(root: Path, destination: Path) -> Path:
    """The work tree's files as git sees them (tracked and untracked, not ignored) copied to `destination`, itself
    made a git repository holding them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    # A repository of its own: tests that ask git (what is ignored) answer as in the tree.
    subprocess.run(["git", "init", "-q"], cwd=destination, check=True)
    subprocess.run(["git", "add", "-A"], cwd=destination, check=True)
    return destination


def pytest_run(tests: Sequence[str], cwd: Path, timeout_s: float) -> tuple[int | None, float]:
    """(pytest's exit code or None on timeout, seconds). No bytecode is written: a mutant of the same size written
    in the same second as the original could otherwise run from the original's cached bytecode."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=cwd, env=env, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    return done.returncode, time.monotonic() - started


def hand_status(exit_code: int | None) -> str:
    """pytest's exit code under a mutant: 1 (a test failed) or 2 (collection broke) kill it, a timeout too; 0
    survives; 5 (no test ran) is 'no tests'; 3 and 4 (pytest's own error, bad usage) are not judged."""
    if exit_code is None:
        return "timeout"
    return {0: "survived", 1: "killed", 2: "killed", 5: "no tests"}.get(exit_code, "not judged")


def run_hand_mutants(mutants: Sequence[HandMutant], root: Path, say=print) -> dict[str, str]:
    """{id: status}, each mutant applied alone to a scratch copy of `root` and its tests run there. The tests must
    pass unmutated first (else every mutant would look killed)."""
    statuses: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tpuserve-mutation-") as scratch_dir:
        scratch = scratch_copy(root, Path(scratch_dir))
        baseline: dict[tuple[str, ...], float] = {}
        for tests in dict.fromkeys(m.tests for m in mutants):
            code, seconds = pytest_run(tests, scratch, timeout_s=1800)
            if code != 0:
                raise ConfigProblem(f"unmutated, `pytest {' '.join(tests)}` exits {code}: fix the tests or the "
                                    "selection before judging mutants with them")
            baseline[tests] = seconds
        for mutant in mutants:
            target = scratch / mutant.file
            original = target.read_text()
            target.write_text(mutated(original, mutant))
            try:
                code, seconds = pytest_run(mutant.tests, scratch, timeout_s=10 * baseline[mutant.tests] + 60)
            finally:
                target.write_text(original)
            statuses[mutant.id] = hand_status(code)
            say(f"  {statuses[mutant.id]:<10} {mutant.id} ({seconds:.0f} s)")
    return statuses


# ---------------------------------------------------------------------------------------------------------------
# mutmut

def run_mutmut(modules: Sequence[str], everything: bool, root: Path, log: Path) -> None:
    """A fresh `mutmut run` with one worker, of every configured module or only of `modules`."""
    shutil.rmtree(root / "mutants", ignore_errors=True)
    names = [] if everything else [mutant_glob(module) for module in modules]
    mutmut = Path(sys.executable).parent / "mutmut"
    with log.open("w") as out:
        code = subprocess.run([str(mutmut), "run", "--max-children", "1", *names], cwd=root, stdout=out,
                              stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").replace("\r", "\n").splitlines()[-20:])
        raise RuntimeError(f"mutmut run exited {code} (full log: {log}):\n{tail}")


def mutmut_statuses(root: Path, module: str) -> dict[str, str]:
    """{mutant name: status} of one module from mutmut's results file (mutants/<module>.meta)."""
    import json

    meta = root / "mutants" / f"{module}.meta"
    if not meta.is_file():
        return {}
    return {name: status_of(code) for name, code in json.loads(meta.read_text())["exit_code_by_key"].items()}


def show_survivors(root: Path, module: str) -> None:
    """Each survivor of `module` in mutants/ as `# name: status` and the changed lines (mutmut's own diff)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # mutmut 3.8.1 (the `mutation` extra)

    os.chdir(root)
    for name, status in mutmut_statuses(root, module).items():
        if status in ("survived", "no tests"):
            diff = get_diff_for_mutant(name, path=Path(module)).splitlines()
            print(f"# {name}: {status}")
            print("\n".join(line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")))


# ---------------------------------------------------------------------------------------------------------------
# Report

def percent(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"


def table(rows: dict[str, Tally]) -> list[str]:
    width = max([len("module / file"), *map(len, rows)])
    lines = [f"{'module / file':<{width}}  mutants  killed  timeout  survived  no tests  not judged  score"]
    for name, t in rows.items():
        lines.append(f"{name:<{width}}  {t.total:>7}  {t.counts['killed']:>6}  {t.counts['timeout']:>7}  "
                     f"{t.counts['survived']:>8}  {t.counts['no tests']:>8}  {t.counts['not judged']:>10}  "
                     f"{percent(t.score):>6}")
    return lines


def verdict(rows: dict[str, Tally], equivalents: set[str]) -> tuple[list[str], bool]:
    """The report's closing lines and whether the run passes (every score >= 90 %, every mutant judged)."""
    lines = [SCORE_RULE + "."]
    ok = True
    for name, t in rows.items():
        unlisted = [s for s in t.survivors if s not in equivalents]
        listed = [s for s in t.survivors if s in equivalents]
        if listed:
            lines.append(f"{name}: {len(listed)} survivor(s) listed as equivalent in {EQUIVALENTS}")
        if unlisted:
            lines.append(f"{name}: survivors not in {EQUIVALENTS} (kill them, or list them with the reason):")
            lines += [f"    {s}" for s in unlisted]
        if t.counts["not judged"]:
            ok = False
            lines.append(f"{name}: {t.counts['not judged']} mutant(s) not judged (interrupted or not run)")
        if t.score is None or t.score < THRESHOLD:
            ok = False
            lines.append(f"{name}: score {percent(t.score)} is under {THRESHOLD:.0%}")
    lines.append("Inspect a mutant: .venv/bin/mutmut show NAME (or `mutmut browse`); rerun one module: "
                 "scripts/mutation.sh PATH")
    return lines, ok


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="scripts/mutation.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="modules of [tool.mutmut] only_mutate, or files with hand-written "
                        "mutants (default: all)")
    parser.add_argument("--list", action="store_true", help="print what would run, and check the hand-written "
                        "mutants apply, without running anything")
    parser.add_argument("--show", action="store_true", help="print the diff of every survivor of the last mutmut run "
                        "(of the given modules, or all), without running anything")
    args = parser.parse_args(argv)

    modules = mutmut_modules(root / "pyproject.toml")
    try:
        hand = load_hand_mutants(root / HANDWRITTEN)
    except ConfigProblem as err:
        print(f"mutation: {err}", file=sys.stderr)
        return 2
    hand_files = list(dict.fromkeys(m.file for m in hand))
    unknown = [p for p in args.paths if p not in modules and p not in hand_files]
    if unknown:
        print(f"mutation: {', '.join(unknown)}: not a module of [tool.mutmut] only_mutate nor a file with "
              f"hand-written mutants ({HANDWRITTEN}); known: {', '.join(modules + hand_files)}", file=sys.stderr)
        return 2
    chosen_modules = [m for m in modules if not args.paths or m in args.paths]
    chosen_hand = [m for m in hand if not args.paths or m.file in args.paths]
    problems = placement_problems(chosen_hand, root)
    if problems:
        print("mutation: hand-written mutants that do not apply:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.show:
        for module in chosen_modules:
            show_survivors(root, module)
        return 0
    if args.list:
        print("mutmut modules:\n  " + "\n  ".join(chosen_modules))
        print("hand-written mutants:\n  " + "\n  ".join(f"{m.id} ({m.file})" for m in chosen_hand))
        return 0

    started = time.monotonic()
    rows: dict[str, Tally] = {}
    if chosen_modules:
        work = root / ".mutation"
        work.mkdir(exist_ok=True)
        print(f"mutmut: {len(chosen_modules)} module(s), one worker (log: {work / 'mutmut.log'})", flush=True)
        run_mutmut(chosen_modules, everything=not args.paths, root=root, log=work / "mutmut.log")
        rows.update({module: tally(mutmut_statuses(root, module)) for module in chosen_modules})
        print(f"mutmut: done in {time.monotonic() - started:.0f} s", flush=True)
    if chosen_hand:
        print(f"hand-written: {len(chosen_hand)} mutant(s) from {HANDWRITTEN}", flush=True)
        try:
            statuses = run_hand_mutants(chosen_hand, root, say=lambda line: print(line, flush=True))
        except ConfigProblem as err:
            print(f"mutation: {err}", file=sys.stderr)
            return 2
        for file in dict.fromkeys(m.file for m in chosen_hand):
            rows[f"{file} (hand-written)"] = tally({m.id: statuses[m.id] for m in chosen_hand if m.file == file})
    print()
    print("\n".join(table(rows)))
    closing, ok = verdict(rows, equivalent_names(root / EQUIVALENTS))
    print("\n".join(closing))
    print(f"took {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
