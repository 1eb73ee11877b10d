"""One way to take a server's address, for every command and `ChatClient` (docs/design/core.md#server-addresses)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import click

SCHEMES = ("http", "https")
ACCEPTED = "give host:port or http(s)://host:port, with or without /v1"


class InvalidUrl(ValueError):
    """A server address none of the accepted forms matches; the message says why and what to give instead."""


def server_root(value: str) -> str:
    """The server root, `scheme://host[:port]` without /v1: '127.0.0.1:8000' -> 'http://127.0.0.1:8000',
    'http://h:8000/v1/' -> 'http://h:8000'. Raises InvalidUrl for anything else."""
    text = (value or "").strip()

    def refuse(why: str) -> InvalidUrl:
        return InvalidUrl(f"{value!r} is not a server URL ({why}); {ACCEPTED}")

    if not text:
        raise refuse("empty")
    if any(ch.isspace() for ch in text):
        raise refuse("it contains whitespace")
    bare = "://" not in text
    parts = urlsplit(f"http://{text}" if bare else text)
    if parts.scheme.lower() not in SCHEMES:
        raise refuse(f"scheme {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise refuse("credentials in a URL end up in logs; pass the key through --api-key-env")
    try:
        port = parts.port
    except ValueError:
        raise refuse("the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise refuse("no host")
    if bare and port is None:
        raise refuse("no port")
    if parts.query or parts.fragment:
        raise refuse("it has a query or fragment")
    if parts.path.rstrip("/") not in ("", "/v1"):
        raise refuse(f"path {parts.path!r}: give the server root or its /v1")
    return f"{parts.scheme.lower()}://{parts.netloc}"


class ServerUrl(click.ParamType):
    """A click option type: the value normalised to the server root; click names the option in the error."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return server_root(value)
        except InvalidUrl as err:
            self.fail(str(err), param, ctx)


SERVER_URL = ServerUrl()
