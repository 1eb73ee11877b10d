"""Helper processes the engines' e2e test and benchmarks/engine_front.py run on 127.0.0.1 (HAProxy, the front of a
VM's engines): started in their own process group, stopped with everything they forked."""

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
    """SIGTERM the process group, SIGKILL what is left after grace_s: the e2e tier has no memory to spare for a
    process that lingers."""
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
    """A Debian binary the VM installs (scripts/install-haproxy.sh installs it here); Debian puts haproxy in
    /usr/sbin, which a user's PATH may lack."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise FileNotFoundError(f"{name} is not installed: the VM runs Debian's; apt-get install {name} (or run "
                                "scripts/install-haproxy.sh as root)")
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


@contextlib.contextmanager
def haproxy_front(workdir: Path, port: int, engines: list[tuple[str, int]]) -> Iterator[tuple[str, int]]:
    """The VM's front (components/front.py's config, run as the calling user) on 127.0.0.1:`port` in front of
    `engines` ((name, port)); yields its URL and process id."""
    from components.front import render_haproxy_config

    config = workdir / "haproxy.cfg"
    config.write_text(render_haproxy_config(port, engines, run_as=None, host="127.0.0.1"))
    with background([find_binary("haproxy"), "-db", "-f", str(config)], workdir / "haproxy.log") as process:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}", process.pid


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, from /proc/<pid>/stat (fields 14 and 15, proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")
