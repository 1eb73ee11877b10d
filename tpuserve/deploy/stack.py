"""`--stack NAME`: find a deployment from its Pulumi stack outputs, and reach it for the length of one command
(a gcp stack's VM through an IAP tunnel, a gke stack's Service through kubectl port-forward)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from tpuserve.client import API_KEY_ENV, DEFAULT_TIMEOUT_S, ChatClient, ModelNotServed, NoModelServed, served_card
from tpuserve.serving import ConfigError
from tpuserve.urls import SERVER_URL, server_root

OPTION = "--stack"
TUNNEL_READY_TIMEOUT_S = 30.0
TUNNEL_POLL_S = 0.2
TUNNEL_STOP_TIMEOUT_S = 5.0


class TunnelError(RuntimeError):
    """The IAP tunnel did not come up; the message carries gcloud's own explanation."""


def stack_outputs(stack: str, cwd: Path | None = None) -> dict[str, Any]:
    """`pulumi stack output --json --stack NAME`, run in the Pulumi project directory `cwd`."""
    from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError

    try:
        outputs = json.loads(PulumiCli(stack, cwd).run("stack", "output", "--json") or "{}")
    except PulumiError as err:
        raise ConfigError(OPTION, f"reading stack {stack!r}: {err}") from err
    if not outputs:
        raise ConfigError(OPTION, f"stack {stack!r} has no outputs; deploy it first: pulumi up --stack {stack}")
    return outputs


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def forwarding(argv: list[str], port: int, what: str, env: Mapping[str, str] | None = None) -> Iterator[None]:
    """A port forward while the block runs, entered once localhost:`port` accepts; else a TunnelError with stderr."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + TUNNEL_READY_TIMEOUT_S
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("localhost", port), timeout=TUNNEL_POLL_S).close()
                    break
                except OSError:
                    time.sleep(TUNNEL_POLL_S)
            else:
                stderr.seek(0)
                why = (f"exited with {process.returncode}" if process.returncode is not None
                       else f"did not accept connections on localhost:{port} within {TUNNEL_READY_TIMEOUT_S:.0f}s")
                raise TunnelError(f"{what} {why}: {stderr.read().decode(errors='replace').strip()}")
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=TUNNEL_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def gke_credentials(outputs: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    """An environment whose throwaway KUBECONFIG reaches a gke stack's cluster, with the kubectl under "KUBECTL"."""
    gcloud, kubectl = shutil.which("gcloud"), shutil.which("kubectl")
    if gcloud is None or kubectl is None:
        raise ConfigError(OPTION, f"stack runs on GKE (cluster {outputs['cluster']}): reaching it needs gcloud and "
                          "kubectl (with gke-gcloud-auth-plugin) on PATH")
    with tempfile.TemporaryDirectory(prefix="tpuserve-kube-") as home:
        env = {**os.environ, "KUBECONFIG": os.path.join(home, "kubeconfig")}
        credentials = subprocess.run(
            [gcloud, "container", "clusters", "get-credentials", outputs["cluster"], "--location",
             outputs["clusterLocation"], "--project", outputs["project"]],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if credentials.returncode != 0:
            raise TunnelError(f"gcloud container clusters get-credentials exited with {credentials.returncode}: "
                              f"{credentials.stderr.strip()}")
        yield {**env, "KUBECTL": kubectl}


@contextmanager
def endpoint_for(outputs: Mapping[str, Any]) -> Iterator[str]:
    """Yield an OpenAI base URL (…/v1) that reaches the stack's server from this machine while the block runs: a gcp
    stack's VM through `gcloud compute start-iap-tunnel`, a gke stack's Service through `kubectl port-forward`, each
    on a free local port."""
    target = outputs.get("target")
    if target == "local":
        yield outputs["endpoint"]
    elif target == "gcp":
        gcloud = shutil.which("gcloud")
        if gcloud is None:
            raise ConfigError(OPTION, f"stack runs on GCP ({outputs['instanceName']}): reaching it needs gcloud on "
                              "PATH for the IAP tunnel")
        endpoint, port = urlsplit(outputs["endpoint"]), free_local_port()
        with forwarding([gcloud, "compute", "start-iap-tunnel", outputs["instanceName"], str(endpoint.port),
                         f"--local-host-port=localhost:{port}", "--zone", outputs["zone"], "--project",
                         outputs["project"]], port, "gcloud start-iap-tunnel"):
            yield endpoint._replace(netloc=f"localhost:{port}").geturl()
    elif target == "gke":
        port = free_local_port()
        with gke_credentials(outputs) as env, forwarding(
                [env["KUBECTL"], "port-forward", "--namespace", outputs["namespace"], "--address", "127.0.0.1",
                 f"service/{outputs['service']}", f"{port}:{outputs['port']}"], port,
                f"kubectl port-forward to service/{outputs['service']}", env):
            yield f"http://localhost:{port}/v1"
    else:
        raise ConfigError(OPTION, f"stack outputs have target {target!r}; expected gcp, gke or local (redeploy the "
                          "stack with this version of tpu-serve)")


def stack_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--stack NAME` and `--stack-outputs FILE`: name the deployment by its Pulumi stack instead of its address."""
    command = click.option("--stack-outputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                           help="`pulumi stack output --json` saved to a file, instead of --stack.")(command)
    return click.option("--stack", help="Pulumi stack of the deployment (runs `pulumi stack output --json` "
                        "in the current directory).")(command)


def read_outputs(stack: str | None, outputs_file: Path | None) -> dict[str, Any] | None:
    """The outputs named by --stack or --stack-outputs; None when neither was given."""
    if stack and outputs_file:
        raise click.UsageError("give --stack or --stack-outputs, not both")
    if outputs_file is not None:
        try:
            outputs = json.loads(outputs_file.read_text())
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"{outputs_file}: not JSON ({err.msg})", param_hint="--stack-outputs") from err
        if not isinstance(outputs, dict):
            raise click.BadParameter(f"{outputs_file}: a JSON object of stack outputs expected",
                                     param_hint="--stack-outputs")
        return outputs
    if stack:
        try:
            return stack_outputs(stack)
        except ConfigError as err:
            raise click.ClickException(str(err)) from err
    return None


def url_option(help_text: str = "Server URL: host:port, or http(s)://host:port with or without /v1 (or give "
               "--stack).", *names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--url` (or `names`) in the one accepted form, normalised to the server root before the command runs."""
    return click.option(*(names or ("--url",)), type=SERVER_URL, help=help_text)


def api_key_option(help_text: str = "Environment variable holding the server's API key (vLLM's --api-key); keys "
                   "never go on the command line.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--api-key-env`: the variable the server's key is read from, $TPUSERVE_API_KEY unless it names another."""
    return click.option("--api-key-env", default=API_KEY_ENV, show_default=True, help=help_text)


def model_option(help_text: str = "Served model name; default: the stack's model, else the first one the server "
                 "lists.") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--model", help=help_text)


@dataclass(frozen=True)
class Served:
    """A server reached from here and its model: `card` is its /v1/models entry (vLLM's ModelCard); the key, read
    from $`key_env`, is never shown."""

    url: str
    model: str
    card: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    key_env: str = API_KEY_ENV

    def client(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> ChatClient:
        return ChatClient(self.url, self.model, api_key=self.api_key, timeout_s=timeout_s, key_env=self.key_env)


def resolve_model(url: str, model: str | None, key_env: str = API_KEY_ENV, option: str = "--model") -> Served:
    """The one rule for the model of every command that talks to a server: `model` if the server lists it (an
    unlisted one is a usage error naming what it serves), else the first one it lists; the key from $`key_env`."""
    api_key = os.environ.get(key_env)
    try:
        card = served_card(url, model, api_key, key_env=key_env)
    except NoModelServed as err:
        raise click.ClickException(str(err)) from err
    except ModelNotServed as err:
        raise click.BadParameter(str(err), param_hint=option) from err
    return Served(server_root(url), card["id"], card, api_key, key_env)


def require_endpoint(url: str | None, outputs: Mapping[str, Any] | None) -> None:
    """No --url and no stack is a usage error, said before anything else is looked for."""
    if url is None and outputs is None:
        raise click.UsageError("give --url, or --stack / --stack-outputs")


@contextmanager
def served_endpoint(url: str | None, model: str | None, outputs: Mapping[str, Any] | None,
                    key_env: str = API_KEY_ENV) -> Iterator[Served]:
    """The server to talk to while the block runs: --url as given, else the stack's endpoint (through an IAP
    tunnel for a gcp stack), with the model resolved by `resolve_model` (default: the stack's model, else the first
    served). No --url and no stack is a usage error."""
    require_endpoint(url, outputs)
    with ExitStack() as exits:
        if url is None:
            try:
                url = exits.enter_context(endpoint_for(outputs))
            except (ConfigError, TunnelError) as err:
                raise click.ClickException(str(err)) from err
            model = model or outputs.get("model")
        yield resolve_model(url, model, key_env)
