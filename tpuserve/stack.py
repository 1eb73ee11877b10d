"""`--stack NAME`: find a deployment from its Pulumi stack outputs, and reach it for the length of one command.

A gcp stack's VM has no external IP, so its endpoint is reached through an IAP tunnel that lives exactly as long
as the `with endpoint_for(...)` block; a local stack's endpoint is already on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from tpuserve.serving import ConfigError

OPTION = "--stack"
TUNNEL_READY_TIMEOUT_S = 30.0
TUNNEL_POLL_S = 0.2
TUNNEL_STOP_TIMEOUT_S = 5.0


class TunnelError(RuntimeError):
    """The IAP tunnel did not come up; the message carries gcloud's own explanation."""


def stack_outputs(stack: str, cwd: Path | None = None) -> dict[str, Any]:
    """`pulumi stack output --json --stack NAME`, run in the Pulumi project directory `cwd`."""
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise ConfigError(OPTION, f"reading stack {stack!r} needs the pulumi CLI on PATH "
                          "(https://www.pulumi.com/docs/install/)")
    result = subprocess.run([pulumi, "stack", "output", "--json", "--stack", stack], cwd=cwd,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ConfigError(OPTION, f"`pulumi stack output --stack {stack}` failed: "
                          f"{result.stderr.strip() or result.stdout.strip()}")
    outputs = json.loads(result.stdout or "{}")
    if not outputs:
        raise ConfigError(OPTION, f"stack {stack!r} has no outputs; deploy it first: pulumi up --stack {stack}")
    return outputs


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tunnel_command(gcloud: str, outputs: Mapping[str, Any], remote_port: int, local_port: int) -> list[str]:
    return [gcloud, "compute", "start-iap-tunnel", outputs["instanceName"], str(remote_port),
            f"--local-host-port=localhost:{local_port}", "--zone", outputs["zone"], "--project", outputs["project"]]


def wait_for_port(process: subprocess.Popen, port: int, stderr: IO[bytes], timeout_s: float) -> None:
    """Return once localhost:port accepts a connection; fail early if gcloud exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr.seek(0)
            raise TunnelError(f"gcloud start-iap-tunnel exited with {process.returncode}: "
                              f"{stderr.read().decode(errors='replace').strip()}")
        try:
            socket.create_connection(("localhost", port), timeout=TUNNEL_POLL_S).close()
            return
        except OSError:
            time.sleep(TUNNEL_POLL_S)
    raise TunnelError(f"IAP tunnel to localhost:{port} did not accept connections within {timeout_s:.0f}s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=TUNNEL_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def iap_tunnel(outputs: Mapping[str, Any], timeout_s: float = TUNNEL_READY_TIMEOUT_S) -> Iterator[str]:
    """Open `gcloud compute start-iap-tunnel` to the VM's vLLM port on a free local port; yield the tunnelled
    endpoint (same path as the stack's `endpoint`); close the tunnel on exit."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise ConfigError(OPTION, f"stack runs on GCP ({outputs['instanceName']}): reaching it needs gcloud on "
                          "PATH for the IAP tunnel")
    endpoint = urlsplit(outputs["endpoint"])
    local_port = free_local_port()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(tunnel_command(gcloud, outputs, endpoint.port, local_port),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for_port(process, local_port, stderr, timeout_s)
            yield endpoint._replace(netloc=f"localhost:{local_port}").geturl()
        finally:
            stop(process)


@contextmanager
def endpoint_for(outputs: Mapping[str, Any]) -> Iterator[str]:
    """Yield an OpenAI base URL (…/v1) that reaches the stack's server from this machine while the block runs."""
    target = outputs.get("target")
    if target == "local":
        yield outputs["endpoint"]
    elif target == "gcp":
        with iap_tunnel(outputs) as endpoint:
            yield endpoint
    else:
        raise ConfigError(OPTION, f"stack outputs have target {target!r}; expected gcp or local (redeploy the "
                          "stack with this version of tpu-serve)")
