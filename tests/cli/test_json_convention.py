"""The one `--json` convention (docs/toolkit.md#--json), checked on every command the CLI has: exactly one
JSON document on one line of stdout, errors included ({"ok": false, "error", "exit"} with that exit code), the human
`Error:` line on stderr. Commands are found by walking the CLI, so a new command is covered without a new test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tpuserve.cli import SUBCOMMANDS, main, wants_json
from tests.fakes.httpfake import idle_port


def commands_with_json() -> Iterator[list[str]]:
    """The argv (after `tpuserve`) of every command that takes --json, subcommands of groups included."""
    ctx = click.Context(main)

    def walk(command: click.Command, path: list[str]) -> Iterator[list[str]]:
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, [*path, name])
        elif any("--json" in param.opts for param in command.params):
            yield path

    for name in sorted(SUBCOMMANDS):
        yield from walk(main.get_command(ctx, name), [name])


EVERY = list(commands_with_json())


def one_document(result) -> dict:
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_every_command_is_found():
    assert {" ".join(path) for path in EVERY} >= {
        "bench report", "bench sweep", "cache ls", "cache rm", "cost", "diagnose", "gate", "gke renew", "gke status",
        "litellm", "logs", "plan", "preflight", "probe all", "probe kv-compare", "status", "up"}


@pytest.mark.parametrize("path", EVERY, ids=[" ".join(path) for path in EVERY])
def test_a_usage_error_under_json_is_one_json_document_and_the_error_line(path: list[str]):
    result = CliRunner().invoke(main, [*path, "--no-such-option", "--json"])
    assert result.exit_code == 2
    document = one_document(result)
    assert list(document) == ["ok", "error", "exit"] and (document["ok"], document["exit"]) == (False, 2)
    assert "No such option" in document["error"] and "--no-such-option" in document["error"]
    assert f"Error: {document['error']}" in result.stderr and "Traceback" not in result.output


def closed_port() -> str:
    return f"127.0.0.1:{idle_port()}"


def empty_dir(tmp_path: Path) -> str:
    (tmp_path / "empty").mkdir()
    return str(tmp_path / "empty")


# A mistake each command finds itself (after click parsed its options), the exit code, and a fragment of the line.
BAD_INPUTS = [
    (lambda tmp: ["status", "--url", closed_port()], 1, "/metrics: Connection refused"),
    (lambda tmp: ["probe", "tools", "--url", closed_port()], 1, "cannot reach"),
    (lambda tmp: ["bench", "report", empty_dir(tmp)], 1, "no `vllm bench serve` result JSON"),
    (lambda tmp: ["bench", "sweep", "--url", closed_port(), "--model", "m", "--out", str(tmp / "o"),
                  "--vllm-bin", "no-such-vllm"], 2, "Invalid value for --vllm-bin"),
    (lambda tmp: ["cost", "--concurrency", "8"], 2, "Invalid value for --concurrency: needs --report"),
    (lambda tmp: ["litellm", "--url", "h"], 2, "is not a server URL (no port)"),
    (lambda tmp: ["plan", "--config", str(tmp / "missing.json")], 2, "does not exist"),
    (lambda tmp: ["gke", "renew", "--stack", "dev", "--lead", "0"], 2, "Invalid value for --lead"),
    (lambda tmp: ["up", "--stack", "dev", "--deadline", "soon"], 2, "Invalid value for --deadline"),
    (lambda tmp: ["logs"], 2, "missing --instance, --zone, --project"),
    (lambda tmp: ["gate", "--url", "h"], 2, "is not a server URL (no port)"),
]


@pytest.mark.parametrize("argv, code, fragment", BAD_INPUTS, ids=[f"{i}" for i in range(len(BAD_INPUTS))])
def test_a_bad_input_under_json_is_one_json_document_with_the_same_line_and_exit(tmp_path: Path, argv, code,
                                                                                  fragment):
    args = argv(tmp_path)
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == code, result.output
    document = one_document(result)
    assert document["ok"] is False and document["exit"] == code and fragment in document["error"]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert line == f"Error: {document['error']}"


def test_success_is_one_line_too(tmp_path: Path):
    results = {
        "cost": CliRunner().invoke(main, ["cost", "--output-tok-s", "400", "--json"]),
        "plan": CliRunner().invoke(main, ["plan", "--json"]),
        "litellm": CliRunner().invoke(main, ["litellm", "--url", "127.0.0.1:9", "--model", "m", "--alias", "a",
                                             "--json"]),
    }
    for name, result in results.items():
        assert result.exit_code == 0, (name, result.output)
        assert isinstance(one_document(result), dict), name


def test_a_gate_that_fails_prints_its_verdict_as_the_one_document():
    result = CliRunner().invoke(main, ["gate", "--url", closed_port(), "--connect-timeout", "0.2", "--interval",
                                       "0.05", "--json"])
    assert result.exit_code == 1
    assert one_document(result)["ready"] is False


def test_a_watch_stream_is_json_lines():
    """status --watch --json: one document per refresh, each on its own line as it happens, until Ctrl-C."""
    from tests.cli.test_status import LATER, RECORDING, metrics_server

    with metrics_server(RECORDING, LATER) as server:
        watch = subprocess.Popen([sys.executable, "-m", "tpuserve", "status", "--url", server.url, "--watch",
                                  "--json", "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        refreshes = [json.loads(watch.stdout.readline()) for _ in range(2)]
        watch.send_signal(signal.SIGINT)
        rest, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0
    assert [refresh["server"]["url"] for refresh in refreshes] == [server.url, server.url]
    assert all(json.loads(line) for line in rest.splitlines())


@pytest.mark.parametrize("args, expected", [
    (["status", "--json"], True), (["bench", "report", "d", "--format", "json"], True),
    (["bench", "report", "d", "--format=json"], True), (["up", "--stack", "dev", "--", "--json"], False),
    (["cost"], False)])
def test_json_is_asked_for_by_the_command_not_by_what_it_passes_on(args: list[str], expected: bool):
    assert wants_json(args) is expected
