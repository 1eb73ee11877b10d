"""Issue #11, items 6-8: every command registered in tpuserve.cli.SUBCOMMANDS fails the same way.

The tables are built from SUBCOMMANDS, so a command added later (by any branch) is covered without editing this
file: each leaf command must take --json, each --url must refuse a malformed address with one line naming it
(exit 2), and an unreachable server is one line (exit 1), never a traceback. The mechanism itself
(tpuserve.cli.LazyGroup.invoke) is driven with every error type through a planted command.
"""

from __future__ import annotations

import click
import pytest
import requests
from click.testing import CliRunner

from tpuserve import cli
from tpuserve.cli import SUBCOMMANDS, main
from tests.fakes.httpfake import idle_port


def leaf_commands() -> list[tuple[list[str], click.Command]]:
    """(argv path, command) of every runnable command under `tpuserve`."""
    found = []

    def walk(path: list[str], command: click.Command) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk([*path, name], sub)
        else:
            found.append((path, command))

    for name in sorted(SUBCOMMANDS):
        walk([name], main.get_command(click.Context(main), name))
    return found


LEAVES = leaf_commands()
IDS = [" ".join(path) for path, _ in LEAVES]


def url_options(command: click.Command) -> list[str]:
    """The options of `command` that take a server address (typed with the one URL normaliser)."""
    from tpuserve.urls import ServerUrl

    return [param.opts[0] for param in command.params if isinstance(param, click.Option)
            and isinstance(param.type, ServerUrl)]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def assert_one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None)))
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: "), result.output
    for needle in needles:
        assert needle in last, last


def test_the_tables_see_every_command():
    assert {path[0] for path, _ in LEAVES} == set(SUBCOMMANDS)
    assert len(LEAVES) >= 12  # bench sweep/report, cost, diagnose, gate, litellm, logs, plan, probe x5


@pytest.mark.parametrize("path, command", LEAVES, ids=IDS)
def test_every_command_takes_json(path, command):
    """One spelling of machine-readable output everywhere (`--format json` stays as an alias where it was)."""
    flags = {opt for param in command.params for opt in getattr(param, "opts", [])}
    assert "--json" in flags, f"tpuserve {' '.join(path)} has no --json"


def test_commands_that_talk_to_a_server_take_its_url_through_the_one_normaliser():
    with_urls = {" ".join(path): url_options(command) for path, command in LEAVES if url_options(command)}
    assert with_urls == {
        "bench sweep": ["--url"], "diagnose": ["--url"], "gate": ["--url"], "litellm": ["--url"],
        "probe all": ["--url"], "probe kv-compare": ["--a", "--b"], "probe structured": ["--url"],
        "probe refusals": ["--url"], "probe tools": ["--url"], "probe vision": ["--url"], "status": ["--url"]}


URL_CASES = [
    ("127.0.0.1", "(no port)"),
    ("ftp://127.0.0.1:8000", "(scheme 'ftp')"),
    ("http://127.0.0.1:8000/v2/chat", "(path '/v2/chat'"),
    ("http://user:pw@127.0.0.1:8000", "(credentials in a URL"),
    ("127.0.0.1:eighty", "(the port is not a number"),
]
URL_LEAVES = [(path, option) for path, command in LEAVES for option in url_options(command)]


@pytest.mark.parametrize("path, option", URL_LEAVES, ids=[f"{' '.join(p)} {o}" for p, o in URL_LEAVES])
@pytest.mark.parametrize("bad, why", URL_CASES, ids=[bad for bad, _ in URL_CASES])
def test_a_malformed_url_is_refused_at_once_naming_the_option(path, option, bad, why):
    extra = ["--out", "run"] if path == ["bench", "sweep"] else ["--alias", "a"] if path == ["litellm"] else []
    result = invoke(*path, option, bad, *extra)
    assert_one_line_error(result, 2, f"Invalid value for '{option}'", why)


@pytest.mark.parametrize("path, option", [(p, o) for p, o in URL_LEAVES if p[0] != "gate"],
                         ids=[f"{' '.join(p)} {o}" for p, o in URL_LEAVES if p[0] != "gate"])
def test_an_unreachable_server_is_one_line_and_exit_1(path, option, tmp_path):
    """Nothing listens on the port: one line naming the address. (The gate waits for a server by design; its
    own tests cover that.)"""
    port = idle_port()
    from tpuserve.measure.probe import KV_PROMPTS

    for name in KV_PROMPTS:  # the other side of kv-compare: saved outputs
        (tmp_path / f"{name}.txt").write_text("same")
    extra = {"bench": ["--out", str(tmp_path / "run"), "--vllm-bin", "/bin/true"],
             "litellm": ["--alias", "a"], "diagnose": ["--log-file", __file__], "status": [],
             "probe": {"--a": ["--b-dir", str(tmp_path)], "--b": ["--a-dir", str(tmp_path)]}.get(option, [])
             }[path[0]]
    result = invoke(*path, option, f"127.0.0.1:{port}", *extra)
    asked = "/metrics" if path == ["status"] else "/v1/models"  # status reads /metrics only
    assert_one_line_error(result, 1, f"cannot reach http://127.0.0.1:{port}{asked}", "Connection refused")


@pytest.mark.parametrize("path, command", LEAVES, ids=IDS)
def test_an_unknown_option_is_a_usage_error(path, command):
    result = invoke(*path, "--no-such-option")
    assert_one_line_error(result, 2, "No such option '--no-such-option'")


# The mechanism: whatever a command raises is one line, exit 2 for a usage error and 1 for a failure.
def refused_connection() -> requests.ConnectionError:
    request = requests.Request("GET", "http://127.0.0.1:9/v1/models").prepare()
    return requests.ConnectionError("HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
                                    "/v1/models (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
                                    "object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection "
                                    "refused'))", request=request)


def config_error():
    from tpuserve.serving import ConfigError

    return ConfigError("extraArgs", "--hf-token takes a secret")


def endpoint_error():
    from tpuserve.client import EndpointError

    return EndpointError(404, "The model `x` does not exist.", 0.01)


RAISED = [
    (refused_connection, 1, "Error: cannot reach http://127.0.0.1:9/v1/models: Connection refused; is the server "
                            "up and its URL right?"),
    (lambda: requests.ReadTimeout("read timed out", request=requests.Request("GET", "http://h:1/x").prepare()), 1,
     "Error: no answer from http://h:1/x in time (ReadTimeout); is the server overloaded or the URL right?"),
    (config_error, 2, "Error: extraArgs: --hf-token takes a secret"),
    (endpoint_error, 1, "Error: HTTP 404: The model `x` does not exist."),
    (lambda: FileNotFoundError(2, "No such file or directory", "gcloud"), 1,
     "Error: No such file or directory: gcloud"),
    (lambda: KeyError("instanceName"), 1, "Error: unexpected KeyError: 'instanceName' (a bug: TPUSERVE_DEBUG=1 "
                                          "shows the traceback)"),
]


@pytest.mark.parametrize("make, code, line", RAISED, ids=[line.split(":")[1].strip() for _, _, line in RAISED])
def test_the_group_turns_what_any_command_raises_into_one_line(monkeypatch, make, code, line):
    @click.command()
    def planted() -> None:
        raise make()

    monkeypatch.setitem(SUBCOMMANDS, "planted", "tests.cli.test_cli_errors:planted")
    monkeypatch.setattr(main, "get_command", lambda ctx, name: planted if name == "planted" else None)
    result = invoke("planted")
    assert result.exit_code == code
    assert result.output.splitlines() == [line]


def test_debug_shows_the_traceback_of_a_bug(monkeypatch):
    @click.command()
    def planted() -> None:
        raise KeyError("instanceName")

    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    monkeypatch.setattr(main, "get_command", lambda ctx, name: planted)
    result = invoke("planted")
    assert isinstance(result.exception, KeyError)


# Issue 34 items 1 and 5: a server that is no vLLM, a key missing or refused, https for an http server: one line
# naming the URL and what to check, for every command that asks a server its models.
def server_leaves() -> list[tuple[list[str], str]]:
    return [(path, option) for path, option in URL_LEAVES if path[0] not in ("gate", "status")]


def extra_args(path: list[str], option: str, tmp_path) -> list[str]:
    from tpuserve.measure.probe import KV_PROMPTS

    for name in KV_PROMPTS:  # the other side of kv-compare: saved outputs
        (tmp_path / f"{name}.txt").write_text("same")
    return {"bench": ["--out", str(tmp_path / "run"), "--vllm-bin", "/bin/true"],
            "litellm": ["--alias", "a"], "diagnose": ["--log-file", __file__],
            "probe": {"--a": ["--b-dir", str(tmp_path)], "--b": ["--a-dir", str(tmp_path)]}.get(option, [])
            }[path[0]]


def web_page(request):
    """What Python's own http.server answers a path it has no file for (http.server DEFAULT_ERROR_MESSAGE)."""
    import http.server

    from tests.fakes.httpfake import Response

    page = http.server.DEFAULT_ERROR_MESSAGE % {"code": 404, "message": "File not found",
                                                "explain": "Nothing matches the given URI"}
    return Response(404, page.encode(), {"Content-Type": "text/html;charset=utf-8"})


@pytest.mark.parametrize("path, option", server_leaves(), ids=[f"{' '.join(p)} {o}" for p, o in server_leaves()])
def test_a_web_server_that_is_no_vllm_is_one_line_naming_the_url(path, option, tmp_path):
    from tests.fakes.httpfake import FakeServer

    with FakeServer(fallback=web_page) as web:
        result = invoke(*path, option, web.url, *extra_args(path, option, tmp_path))
    assert_one_line_error(result, 1, f"{web.url}/v1/models answered HTTP 404: an HTML page ('Error response'), not "
                                     "JSON: is this a vLLM server?")
    assert "<html" not in result.output.lower()
    assert [r.path for r in web.requests] == ["/v1/models"]  # nothing more is asked of it


@pytest.mark.parametrize("path, option", server_leaves(), ids=[f"{' '.join(p)} {o}" for p, o in server_leaves()])
def test_a_keyed_server_asked_without_its_key_names_the_url_the_variable_and_the_option(path, option, tmp_path,
                                                                                         monkeypatch):
    from tests.fakes.fake_openai import FakeOpenAI, require_key

    monkeypatch.delenv("TPUSERVE_API_KEY", raising=False)
    with require_key(FakeOpenAI(), "sk-serve") as server:
        result = invoke(*path, option, server.url, *extra_args(path, option, tmp_path))
    assert_one_line_error(result, 1, f"{server.url}/v1/models answered HTTP 401: Unauthorized; no API key was sent "
                                     "($TPUSERVE_API_KEY is not set): export TPUSERVE_API_KEY=",
                          "or name another variable with --api-key-env")


@pytest.mark.parametrize("path, option", server_leaves(), ids=[f"{' '.join(p)} {o}" for p, o in server_leaves()])
def test_https_for_a_plain_http_server_says_it_speaks_http(path, option, tmp_path):
    from tests.fakes.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        secure = server.url.replace("http://", "https://")
        result = invoke(*path, option, secure, *extra_args(path, option, tmp_path))
    assert_one_line_error(result, 1, f"cannot reach {secure}/v1/models: this server speaks http, not https: give "
                                     f"{server.url}")
