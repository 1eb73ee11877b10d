"""The `tpuserve` command line. Subcommands load on first use, so `tpuserve --help` stays fast.

Every subcommand runs inside `LazyGroup.invoke`, the one place that turns what goes wrong into one line and an exit
code: 2 for a usage error (a bad option or setting), 1 for a failure (an unreachable server, a server error, a
missing file or program). No user mistake ends in a Python traceback; TPUSERVE_DEBUG=1 shows one for a bug.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any

import click

# name -> ("module:attribute" of a click command, its short help). The help is repeated here so listing the
# commands imports none of them (tests/test_cli.py keeps it equal to each command's own); each module imports
# heavy libraries inside its commands only.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cache": ("tpuserve.deploy.cache:cache",
              "List or remove a stack's cache disks (one per zone) and compile-cache bucket."),
    "bench": ("tpuserve.measure.bench:bench",
              "Measure an endpoint with `vllm bench serve` and report throughput, latency and $ per million tokens."),
    "cost": ("tpuserve.measure.cost:cost",
             "Breakeven throughput against an API price, the cost of a cold start, and what a session yields."),
    "diagnose": ("tpuserve.observe.logs:diagnose", ("Ask a model why a deployment failed, from its logs and the gate's "
                                            "stage and reason (tokens redacted).")),
    "fleet": ("tpuserve.ops.fleet:fleet",
              "Replicas across zones behind a LiteLLM router, renewed before flex-start deletes them: up, status, "
              "renew, down."),
    "gate": ("tpuserve.observe.gate:gate", "Wait until a deployment really serves; exit 0 only then."),
    "gke": ("tpuserve.ops.gke_renew:gke",
            "A gke stack's TPU nodes: renew each replica's node before flex-start deletes it; status."),
    "litellm": ("tpuserve.deploy.litellm_config:litellm",
                "Print a LiteLLM proxy config mapping the aliases to the deployment (`> litellm_config.yaml`)."),
    "logs": ("tpuserve.observe.logs:logs", "Print the VM's serial console and the vLLM container's logs."),
    "plan": ("tpuserve.measure.plan:plan",
             "KV bytes per token, resident KV tokens and how many full-length contexts fit in HBM."),
    "preflight": ("tpuserve.deploy.preflight:preflight_command",
                  "Check what would stop a deploy: APIs, machine type per zone, TPU quota, token secret, permissions, "
                  "Cloud NAT."),
    "probe": ("tpuserve.measure.probe:probe",
              "Probe a deployment's capabilities: tools, structured output, vision; compare KV-cache settings."),
    "status": ("tpuserve.observe.status:status",
               "The VM (state, time left until flex-start deletes it, cost so far, boot stage) and the server live "
               "from /metrics (running/waiting, KV cache, TTFT and ITL p50/p95, tokens/s)."),
    "up": ("tpuserve.ops.up:up",
           "Deploy a stack: find a zone with TPU capacity (preflight, then `pulumi up` zone by zone), clean up."),
}


DEBUG_ENV = "TPUSERVE_DEBUG"
# The innermost reason of a urllib3/requests connection error: "[Errno 111] Connection refused".
ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def request_failure(err: Exception) -> str:
    """'cannot reach http://h:1/v1/models: Connection refused; ...' from a requests exception, without its repr
    chain."""
    import requests

    request = getattr(err, "request", None)
    url = getattr(request, "url", None) or "the server"
    if isinstance(err, requests.Timeout):
        return f"no answer from {url} in time ({type(err).__name__}); is the server overloaded or the URL right?"
    if isinstance(err, requests.ConnectionError):
        found = ERRNO_REASON.search(str(err))
        reason = found.group(1).strip() if found else type(err).__name__
        return f"cannot reach {url}: {reason}; is the server up and its URL right?"
    return f"request to {url} failed: {type(err).__name__}: {one_line(err)}"


def translate(err: Exception) -> click.ClickException | None:
    """The one-line ClickException for an error a user can meet (None: an unexpected error, a bug). Matched by
    type name where importing the type would import a heavy library into every command."""
    from tpuserve.serving import ConfigError
    from tpuserve.urls import InvalidUrl

    if isinstance(err, (ConfigError, InvalidUrl)):
        return click.UsageError(one_line(err))
    names = {cls.__name__ for cls in type(err).__mro__}
    if "RequestException" in names:
        return click.ClickException(request_failure(err))
    if names & {"EndpointError", "ReportError", "TunnelError", "ComputeApiError", "MissingCredentials",
                "ModelNotServed"}:
        return click.ClickException(one_line(err))
    if isinstance(err, OSError):
        where = f": {err.filename}" if err.filename else ""
        return click.ClickException(f"{err.strerror or one_line(err)}{where}")
    return None


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attribute = SUBCOMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attribute)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; what it raises becomes one line and exit 2 (usage) or 1 (failure)."""
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as err:  # noqa: BLE001 - the one place every command's errors are turned into a line
            if os.environ.get(DEBUG_ENV):
                raise
            translated = translate(err)
            if translated is None:
                translated = click.ClickException(
                    f"unexpected {type(err).__name__}: {one_line(err)} (a bug: {DEBUG_ENV}=1 shows the traceback)")
            raise translated from err

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, from SUBCOMMANDS: click's own would import every command for its help."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        with formatter.section("Commands"):
            formatter.write_dl([(name, click.Command(name, help=SUBCOMMANDS[name][1]).get_short_help_str(limit))
                                for name in names])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tpu-serve")
def main() -> None:
    """Operate a vLLM endpoint on a flex-start Cloud TPU VM: up, gate, bench, cost, plan, probe."""


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--json`: the command's result as JSON on stdout, the same flag on every command."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (machine-readable).")(command)
