"""Helper processes the router e2e tests and benchmarks/router_overhead.py run on 127.0.0.1 (redis-server, HAProxy,
LiteLLM proxies): started in their own process group, stopped with everything they forked."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def stop_process_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL what is left after grace_s: gunicorn waits its graceful timeout for a
    wedged worker, and the e2e tier has no memory to spare for one."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)


def find_binary(name: str) -> str:
    """A Debian binary the router VM installs (scripts/install-litellm-proxy.sh installs it here); Debian puts
    haproxy in /usr/sbin, which a user's PATH may lack."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise FileNotFoundError(f"{name} is not installed: the router VM runs Debian's; apt-get install {name} (or "
                                "run scripts/install-litellm-proxy.sh as root)")
    return path


@contextlib.contextmanager
def background(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """`argv` in its own session, its output appended to `log`; its whole group stopped on exit."""
    with log.open("ab") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        yield process
    finally:
        stop_process_group(process.pid, grace_s=5.0)
        process.wait(timeout=10)


def wait_for_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")
