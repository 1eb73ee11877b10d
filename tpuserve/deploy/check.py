"""`tpuserve check --stack S`: Pulumi.<S>.yaml against this checkout's components/config.py rules, offline, without
the Pulumi CLI; keys are handed over as `pulumi up` would (strings, JSON text, a `secure:` value as a stand-in)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from tpuserve import exits
from tpuserve.cli import Failure, echo_json, json_option
from tpuserve.names import PROJECT_NAME
from tpuserve.serving import ConfigError

SECRET_STAND_IN = "[secret]"  # a `secure:` value: the rules see that it is set, never what it is
MAX_PROBLEMS = 20  # a file that far off is named by its first problems


def read_stack_file(path: Path) -> dict[str, Any]:
    """The file's `config:` mapping; a file that is not a stack file is a Failure naming the line or the key."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise Failure(f"{path.name}{where}: not YAML ({problem})", exit_code=exits.USAGE) from err
    config = data.get("config", {}) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise Failure(f"{path.name}: `config:` must be a mapping of namespace:key to value", exit_code=exits.USAGE)
    return config


def settings_of(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(the `tpu-serve:` settings as strings, the problems of keys Pulumi would not read as config keys)."""
    prefix, raw, problems = f"{PROJECT_NAME}:", {}, []
    for key, value in config.items():
        if not isinstance(key, str) or ":" not in key:
            problems.append(f"{key}: a stack file's keys are namespace:name: write {prefix}{key}")
            continue
        if not key.startswith(prefix):
            continue  # another namespace's config (a provider's, e.g. gcp:project): not ours to judge
        if isinstance(value, dict) and set(value) == {"secure"}:
            value = SECRET_STAND_IN
        raw[key[len(prefix):]] = value if isinstance(value, str) else json.dumps(value)
    return raw, problems


def program_problems(directory: Path, raw: dict[str, str]) -> tuple[list[str], list[str]]:
    """(problems, warnings) under components/config.py's rules; a refused key's default stands in for the rest."""
    sys.path.insert(0, str(directory))
    try:
        config = importlib.import_module("components.config")
    finally:
        sys.path.remove(str(directory))
    problems, remaining = [], dict(raw)
    for _ in range(MAX_PROBLEMS):
        try:
            stack = config.build_stack_config(remaining)
        except ConfigError as err:
            problems.append(str(err))
            if err.key not in remaining:  # a rule about the keys together, or a default: nothing more to tell
                break
            del remaining[err.key]
            continue
        return problems, [] if problems else stack.warnings()
    return problems, []


@click.command()
@click.option("--stack", required=True, help="The stack whose Pulumi.<stack>.yaml to check.")
@json_option
def check(stack: str, as_json: bool) -> None:
    """Check a stack's Pulumi.<stack>.yaml against the program's own rules, offline: no Pulumi CLI, no cloud.

    One line per problem, naming the key; exit 2 when the file has any. `scripts/up.sh` runs it first."""
    # the Pulumi project directory: here or the nearest parent holding Pulumi.yaml (as `pulumi` looks)
    here = Path.cwd()
    directory = next((path for path in (here, *here.parents) if (path / "Pulumi.yaml").is_file()), None)
    if directory is None:
        raise click.UsageError(f"no Pulumi.yaml in {here} or above: run `tpuserve check` in the tpu-serve checkout")
    path = directory / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        import difflib

        names = sorted(path.name[len("Pulumi."):-len(".yaml")] for path in directory.glob("Pulumi.*.yaml"))
        close = difflib.get_close_matches(stack, names, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        raise click.BadParameter(f"no {path.name} in {directory}{guess}: the stacks here are "
                                 f"{', '.join(names) or 'none'}; a new stack starts as a copy of one: "
                                 f"cp Pulumi.dev.yaml {path.name}", param_hint="--stack")
    raw, problems = settings_of(read_stack_file(path))
    found, warnings = program_problems(directory, raw)
    problems += found
    if problems:
        if not as_json:
            for problem in problems:
                click.echo(f"{path.name}: {problem}", err=True)
        more = f" (and {len(problems) - 1} more{'' if as_json else ', above'})" if len(problems) > 1 else ""
        raise Failure(f"{path.name}: {problems[0]}{more}", {"stack": stack, "file": str(path), "problems": problems},
                      exit_code=exits.USAGE)
    if as_json:
        echo_json({"ok": True, "stack": stack, "file": str(path), "settings": sorted(raw), "warnings": warnings})
        return
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{path.name}: {len(raw)} setting{'' if len(raw) == 1 else 's'}, all valid under this checkout's "
               "components/config.py")
