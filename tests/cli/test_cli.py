"""The lazy `tpuserve` group: `--help` lists every command without importing one (a subprocess, no server)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import click
import pytest

from tpuserve.cli import SUBCOMMANDS, command_help, main

HEAVY = ("requests", "jsonschema", "rich", "matplotlib", "google", "yaml", "jinja2")


def imported_modules(*args: str) -> set[str]:
    """Every module `python -m tpuserve ARGS` imports, from `-X importtime`'s report on stderr."""
    completed = subprocess.run([sys.executable, "-X", "importtime", "-m", "tpuserve", *args], capture_output=True,
                               text=True, check=True)
    return {match.group(1) for match in re.finditer(r"^import time:.*\|\s*(\S+)$", completed.stderr, re.MULTILINE)}


def test_help_lists_every_command_and_imports_no_command_module_nor_heavy_library():
    modules = imported_modules("--help")
    assert "click" in modules  # the report was parsed
    assert sorted(name for name in modules if name.split(".")[0] in HEAVY) == []
    assert sorted(name for name in modules if name.startswith("tpuserve.")) == ["tpuserve.cli", "tpuserve.exits"]


def test_help_shows_each_commands_short_help_cut_to_the_width():
    help_text = subprocess.run([sys.executable, "-m", "tpuserve", "--help"], capture_output=True, text=True,
                               check=True).stdout
    listed = dict(re.findall(r"^  (\w+)\s+(.+)$", help_text.split("Commands:")[1], re.MULTILINE))
    assert sorted(listed) == sorted(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        short_help = click.Command(name, help=command_help(name)).get_short_help_str(limit=1000)
        assert short_help.startswith(listed[name].removesuffix("...")), name


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_listed_help_is_the_commands_own_short_help(name: str):
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.name == name
    assert command_help(name) == inspect.cleandoc(command.help or "")


@pytest.mark.parametrize("typed, meant", [("gat", "gate"), ("stauts", "status"), ("benhc", "bench"),
                                          ("diagnsoe", "diagnose")])
def test_a_mistyped_command_gets_the_one_it_was_probably_meant_to_be(typed: str, meant: str):
    """Issue 34 item 9: click suggests from the commands it has loaded, which the lazy group has not."""
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [typed, "--url", "127.0.0.1:8000"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: No such command '{typed}'. Did you mean '{meant}'?"


def test_a_command_like_none_is_refused_without_a_guess():
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["frobnicate"])
    assert (result.exit_code, result.output.splitlines()[-1]) == (2, "Error: No such command 'frobnicate'.")
