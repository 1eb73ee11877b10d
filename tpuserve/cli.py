"""The `tpuserve` command line: subcommands load on first use, and every error ends as one line and an exit code
(`LazyGroup.invoke`; why: docs/design/core.md#the-command-line)."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from tpuserve import exits

# name -> ("module:attribute", short help): listing the commands imports none of them (tests/cli/test_cli.py keeps each
# help equal to the command's own).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cache": ("tpuserve.deploy.cache:cache",
              "List or remove a stack's cache disks (one per zone) and compile-cache bucket."),
    "bench": ("tpuserve.measure.bench:bench",
              "Measure an endpoint with `vllm bench serve` and report throughput, latency and $ per million tokens."),
    "check": ("tpuserve.deploy.check:check",
              "Check a stack's Pulumi.<stack>.yaml against the program's own rules, offline: no Pulumi CLI, no cloud."),
    "cost": ("tpuserve.measure.cost:cost",
             "Breakeven throughput against an API price, the cost of a cold start, and what a session yields."),
    "destroy": ("tpuserve.ops.destroy:destroy",
                ("`pulumi destroy` a stack, then list what is left of it in the project (kept caches, orphans) and "
                 "what it bills.")),
    "diagnose": ("tpuserve.observe.logs:diagnose", ("Ask a model why a deployment failed, from its logs and the gate's "
                                            "stage and reason (tokens redacted).")),
    "gate": ("tpuserve.observe.gate:gate", "Wait until a deployment really serves; exit 0 only then."),
    "gke": ("tpuserve.ops.gke_renew:gke",
            "A gke stack's TPU nodes: renew each replica's node before flex-start deletes it; status."),
    "images": ("tpuserve.deploy.image_check:images",
               "The vLLM TPU image: whether the pinned digest (or a stack's containerImage) still resolves."),
    "inventory": ("tpuserve.deploy.inventory:inventory",
                  ("Everything a stack owns in the project, across zones and regions: in its state, kept on purpose, "
                   "or orphaned, with prices.")),
    "litellm": ("tpuserve.deploy.litellm_config:litellm",
                "Print a LiteLLM proxy config mapping the aliases to the deployment (`> litellm_config.yaml`)."),
    "logs": ("tpuserve.observe.logs:logs", "Print the VM's serial console and the vLLM container's logs."),
    "plan": ("tpuserve.measure.plan:plan",
             "KV bytes per token, resident KV tokens and how many full-length contexts fit in HBM, per engine and "
             "for the machine's engines; what the cache disk's throughput buys a warm boot, and what it costs."),
    "preflight": ("tpuserve.deploy.preflight:preflight_command",
                  "Check what would stop a deploy: APIs, machine type per zone, TPU quota, token secret, permissions, "
                  "Cloud NAT."),
    "probe": ("tpuserve.measure.probe:probe",
              "Probe a deployment's capabilities: tools, structured output, vision, refused modalities; compare KV-cache "
              "settings."),
    "renew": ("tpuserve.ops.renew:renew",
              "Replace the stack's VM before flex-start deletes it: successor first (other slot, gated), then the old "
              "VM."),
    "status": ("tpuserve.observe.status:status",
               "The VM (state, time left until flex-start deletes it, cost so far, boot stage) and the server live "
               "from /metrics (running/waiting, KV cache, TTFT and ITL p50/p95, tokens/s)."),
    "up": ("tpuserve.ops.up:up",
           "Deploy a stack: find a zone with TPU capacity (preflight, `pulumi up` zone by zone, then Compute Engine's "
           "queue), clean up."),
}


RAW_ARGS = "tpuserve.args"  # ctx.meta key: the command line after `tpuserve`, for wants_json


def finite(value: Any) -> Any:
    """The document with every non-finite float as None and tuples as lists: what strict JSON can hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_text(document: Any) -> str:
    """The one way a document is written (docs/toolkit.md#--json): one line, strict."""
    return json.dumps(finite(document), allow_nan=False)


def finish(code: int, stack: str, summary: dict[str, Any], as_json: bool) -> NoReturn:
    """How a command that reports an outcome ends: under --json its one document, then its exit code."""
    if as_json:
        echo_json({"ok": code == exits.OK, "stack": stack, "exit": code, **summary})
    raise click.exceptions.Exit(code)


def echo_json(document: Any) -> None:
    """Print a document on stdout as its own line, at once (a pipe reading a --watch stream sees each refresh)."""
    click.echo(json_text(document))
    sys.stdout.flush()


def wants_json(args: list[str]) -> bool:
    """Whether a command line asks for JSON: --json (or bench report's --format json) before any `--`."""
    own = args[:args.index("--")] if "--" in args else args
    return "--json" in own or "--format=json" in own or any(
        flag == "--format" and value == "json" for flag, value in zip(own, own[1:]))


class Failure(click.ClickException):
    """A failure whose error document carries `json_fields` too, e.g. what a sweep kept before it failed."""

    def __init__(self, message: str, json_fields: dict[str, Any] | None = None, exit_code: int = 1):
        super().__init__(message)
        self.json_fields = json_fields or {}
        self.exit_code = exit_code


def error_document(err: BaseException) -> dict[str, Any]:
    """{"ok": false, "error", "exit"} for what ended a command, plus the fields it carries (`json_fields`)."""
    if isinstance(err, click.ClickException):
        message, code = err.format_message(), err.exit_code
    else:  # click.Abort, KeyboardInterrupt: Ctrl-C
        message, code = "interrupted (Ctrl-C)", 1
    return {"ok": False, "error": one_line(message), "exit": code, **getattr(err, "json_fields", {})}


DEBUG_ENV = "TPUSERVE_DEBUG"
# The innermost reason of a urllib3/requests connection error: "[Errno 111] Connection refused".
ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
# What OpenSSL says when the answer to its hello is not TLS at all: an https:// URL for a plain-http server.
PLAIN_HTTP_REPLY = re.compile(r"WRONG_VERSION_NUMBER|record layer failure|packet length too long|unknown protocol",
                              re.IGNORECASE)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def request_failure(err: Exception) -> str:
    """'cannot reach http://h:1/v1/models: Connection refused; ...' from a requests exception, without its reprs."""
    import requests

    request = getattr(err, "request", None)
    url = getattr(request, "url", None) or "the server"
    if isinstance(err, requests.exceptions.SSLError) and PLAIN_HTTP_REPLY.search(str(err)):
        from urllib.parse import urlsplit

        return f"cannot reach {url}: this server speaks http, not https: give http://{urlsplit(url).netloc}"
    if isinstance(err, requests.Timeout):
        return f"no answer from {url} in time ({type(err).__name__}); is the server overloaded or the URL right?"
    if isinstance(err, requests.ConnectionError):
        found = ERRNO_REASON.search(str(err))
        reason = found.group(1).strip() if found else type(err).__name__
        return f"cannot reach {url}: {reason}; is the server up and its URL right?"
    return f"request to {url} failed: {type(err).__name__}: {one_line(err)}"


def translate(err: Exception) -> click.ClickException | None:
    """The one-line ClickException for an error a user can meet; None for a bug. By type name: no heavy imports."""
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

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[RAW_ARGS] = list(args)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                              list[str]]:
        """click's, suggesting a close name for a command that does not exist (click's own knows only loaded ones)."""
        import difflib

        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, sorted(SUBCOMMANDS), n=1)
            ctx.fail(f"No such command {name!r}.{f' Did you mean {close[0]!r}?' if close else ''}")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; what it raises becomes one line, an exit code and, under --json, the error document."""
        try:
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
                        f"unexpected {type(err).__name__}: {one_line(err)} (a bug: {DEBUG_ENV}=1 shows the "
                        "traceback)")
                raise translated from err
        except (click.ClickException, click.Abort, KeyboardInterrupt) as err:
            if wants_json(ctx.meta.get(RAW_ARGS, [])):
                echo_json(error_document(err))
            raise

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


class Duration(click.ParamType):
    """An option holding a duration ('2h', '90m', '1h30m', '600'), converted to seconds (tpuserve.durations)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from tpuserve import durations

        try:
            return value if isinstance(value, int) else durations.parse(value)
        except ValueError as err:  # "Invalid value for --deadline: ...", as the other options' errors read
            raise click.BadParameter(str(err), ctx, param, param_hint=param.opts[0] if param else None) from None


DURATION = Duration()


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--json`, the same flag on every command (docs/toolkit.md#--json)."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document on stdout, "
                        "errors too (machine-readable).")(command)
