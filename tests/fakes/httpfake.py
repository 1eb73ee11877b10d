"""A small HTTP server on 127.0.0.1 for tests: routes map (method, path) to handlers; every request is recorded."""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def idle_port() -> int:
    """A free loopback port below the kernel's ephemeral range, for a test that needs nothing listening there: a port
    from bind(0) (free_local_port) can be handed to another worker's server once it is released (seen in CI)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for port in random.sample(range(20000, low), min(200, low - 20000)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Response:
    status: int = 200
    body: bytes | str | dict | list = b""
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> tuple[bytes, str]:
        if isinstance(self.body, (dict, list)):
            return json.dumps(self.body).encode(), "application/json"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain; charset=utf-8"
        return self.body, "application/octet-stream"


Handler = Callable[[Request], Response]


class _QuietServer(ThreadingHTTPServer):
    """A client that gave up (a timeout under test, a closed keep-alive) is part of the scenario, not an error: no
    BrokenPipe traceback on stderr, where it would land in whatever test captures stderr next."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeServer:
    """Use as a context manager; `routes[(METHOD, path)] = handler`. Unrouted requests get 404."""

    def __init__(self, routes: dict[tuple[str, str], Handler] | None = None, fallback: Handler | None = None,
                 port: int = 0):
        self.routes: dict[tuple[str, str], Handler] = dict(routes or {})
        # Called for requests no route matches (paths with ids in them); None answers 404.
        self.fallback = fallback
        self.requests: list[Request] = []
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(self.command, parts.path, parts.query, dict(self.headers.items()),
                                  self.rfile.read(length) if length else b"")
                fake.requests.append(request)
                handler = fake.routes.get((self.command, parts.path)) or fake.fallback
                response = handler(request) if handler else Response(404, {"error": f"no route {parts.path}"})
                body, content_type = response.encoded()
                self.send_response(response.status)
                self.send_header("Content-Type", response.headers.get("Content-Type", content_type))
                for name, value in response.headers.items():
                    if name != "Content-Type":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has the headers of a GET and no body (RFC 9110 9.3.2)
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

        self._server = _QuietServer(("127.0.0.1", port), _Handler)  # port 0: any free one
        # A short poll interval: shutdown() waits for it, and tests start hundreds of these.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
