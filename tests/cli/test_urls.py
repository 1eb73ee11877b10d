"""tpuserve.urls: the one server-address rule, each accepted form and each refusal pinned to its exact words."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tpuserve.urls import SERVER_URL, InvalidUrl, server_root


@pytest.mark.parametrize("given, root", [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("  127.0.0.1:8000\n", "http://127.0.0.1:8000"),  # surrounding whitespace is not part of the address
    ("h:0", "http://h:0"),  # the port range's ends are ports
    ("h:65535", "http://h:65535"),
    ("http://h:8000", "http://h:8000"),
    ("http://h:8000/", "http://h:8000"),
    ("http://h:8000/v1", "http://h:8000"),
    ("http://h:8000/v1/", "http://h:8000"),
    ("https://h", "https://h"),  # a full URL may leave the port to its scheme
    ("HTTPS://h:443/v1", "https://h:443"),  # the scheme's case does not matter
    ("HTTP://Example.com:80", "http://Example.com:80"),  # the host is kept as given
    ("[::1]:8000", "http://[::1]:8000"),
])
def test_accepted_forms_give_the_server_root(given: str, root: str) -> None:
    assert server_root(given) == root


@pytest.mark.parametrize("given, message", [
    ("", "'' is not a server URL (empty)"),
    ("   ", "'   ' is not a server URL (empty)"),
    ("h :8000", "'h :8000' is not a server URL (it contains whitespace)"),
    ("h:80\t00", "'h:80\\t00' is not a server URL (it contains whitespace)"),
    ("ftp://h:21", "'ftp://h:21' is not a server URL (scheme 'ftp')"),
    ("http://user@h:8000", "'http://user@h:8000' is not a server URL (credentials in a URL end up in logs; pass the "
                           "key through --api-key-env)"),
    ("http://:pw@h:8000", "'http://:pw@h:8000' is not a server URL (credentials in a URL end up in logs; pass the "
                          "key through --api-key-env)"),
    ("h:port", "'h:port' is not a server URL (the port is not a number from 0 to 65535)"),
    ("h:65536", "'h:65536' is not a server URL (the port is not a number from 0 to 65535)"),
    ("http://:8000", "'http://:8000' is not a server URL (no host)"),
    ("h", "'h' is not a server URL (no port)"),
    ("h/v1", "'h/v1' is not a server URL (no port)"),
    ("http://h:8000?x=1", "'http://h:8000?x=1' is not a server URL (it has a query or fragment)"),
    ("http://h:8000#top", "'http://h:8000#top' is not a server URL (it has a query or fragment)"),
    ("http://h:8000/v2", "'http://h:8000/v2' is not a server URL (path '/v2': give the server root or its /v1)"),
    ("http://h:8000/v1X", "'http://h:8000/v1X' is not a server URL (path '/v1X': give the server root or its /v1)"),
    ("http://h:8000/v1/chat", "'http://h:8000/v1/chat' is not a server URL (path '/v1/chat': give the server root or "
                              "its /v1)"),
])
def test_refusals_say_why_and_what_to_give(given: str, message: str) -> None:
    with pytest.raises(InvalidUrl) as refused:
        server_root(given)
    assert str(refused.value) == f"{message}; give host:port or http(s)://host:port, with or without /v1"


def test_none_is_refused_as_empty() -> None:
    with pytest.raises(InvalidUrl, match=r"^None is not a server URL \(empty\)"):
        server_root(None)  # type: ignore[arg-type]


@click.command()
@click.option("--url", type=SERVER_URL)
def echo_url(url: str) -> None:
    click.echo(url)


def test_the_click_type_normalises_and_names_the_option_it_refuses() -> None:
    assert SERVER_URL.name == "URL"
    accepted = CliRunner().invoke(echo_url, ["--url", "h:8000/v1"])
    assert (accepted.exit_code, accepted.output) == (0, "http://h:8000\n")
    refused = CliRunner().invoke(echo_url, ["--url", "h"])
    assert refused.exit_code == 2
    assert refused.output.splitlines()[-1] == ("Error: Invalid value for '--url': 'h' is not a server URL (no port); "
                                               "give host:port or http(s)://host:port, with or without /v1")
