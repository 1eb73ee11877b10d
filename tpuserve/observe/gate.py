"""`tpuserve gate`: wait until a deployment really serves, and say where the boot time went.

Ready means every stage passed: /health, /v1/models, a short chat completion (URL mode), or the VM's guest attributes
saying `serving` (instance mode). stdout gets one JSON line, the verdict; the rest goes to stderr.
Why and how: docs/design/gate-and-status.md.
"""
from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import requests

from tpuserve.cli import json_option, json_text
from tpuserve.client import (API_KEY_ENV, NOT_VLLM, ChatClient, ChatReply, EndpointError, ModelNotServed, html_page,
                             json_or_none, pick_model, response_error)
from tpuserve.facts import (BOOT_STAGES, FAILED_STAGE, GATE_POLL_S, GUEST_ATTRIBUTE_NAMESPACE, READY_TIMEOUT_S,
                            RESTARTING_STAGE)
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ComputeClient, Instance
from tpuserve.images import image_messages
from tpuserve.deploy.stack import api_key_option, model_option, read_outputs, stack_options, url_option
from tpuserve.urls import server_root

SERVING, BOOTING = BOOT_STAGES[-1], "booting"
URL_INTERVAL_S = 0.5  # a stage passed shows up within the 2 s lag target
INSTANCE_INTERVAL_S = GATE_POLL_S  # each poll is a Compute API call (the budget: facts.py)
REQUEST_TIMEOUT_S = 60.0
SERIAL_TAIL_LINES = 30
COMPLETION_MAX_TOKENS = 8
FATAL_API_STATUSES = (400, 401, 403)  # answers no wait changes (docs/design/gate-and-status.md#fatal-answers)
HEARTBEAT_S = 30.0  # off a terminal: a line at least this often
CONNECT_TIMEOUT_S = 120.0  # URL mode (docs/design/gate-and-status.md#the-connect-timeout)
NOT_VLLM_HEALTH = "every vLLM answers /health (200, or 503 while it loads) once it accepts connections"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
STOPPED_STATUSES = frozenset({"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"})


@dataclass(frozen=True)
class Check:
    """One look at a stage; `fatal`: waiting cannot change it; `value`: the model the later stages ask."""

    ok: bool
    detail: str = ""
    fatal: bool = False
    value: str = ""
    connected: bool = True  # False: no connection, and no sign of a vLLM starting (what --connect-timeout counts)


@dataclass(frozen=True)
class Verdict:
    """`stages`: each stage reached -> seconds since the gate began (URL mode) or the VM's first stage."""

    ready: bool
    elapsed_s: float
    stages: dict[str, float]
    reason: str | None = None
    serial_tail: str = ""  # a failed VM's last console lines: for people, not part of the JSON line
    sources: dict[str, str] = field(default_factory=dict)  # instance mode: where each part came from
    interrupted: bool = False  # ended by Ctrl-C (exit INTERRUPTED_EXIT)
    warnings: list[str] = field(default_factory=list)  # instance mode: what the VM found wrong yet serves with

    def json_line(self) -> str:
        return json_text({"ready": self.ready, "elapsed_s": round(self.elapsed_s, 3),
                           "stages": {name: round(at, 3) for name, at in self.stages.items()},
                           "reason": self.reason, **({"sources": self.sources} if self.sources else {}),
                           **({"warnings": self.warnings} if self.warnings else {})})


class Reporter:
    """Hears of each stage reached and each look that waits; prints nothing, keeps where the wait is (for Ctrl-C)."""

    def __init__(self) -> None:
        self.started, self.where = time.monotonic(), "before the first stage"
        self.stages: dict[str, float] = {}

    def stage(self, name: str, at_s: float) -> None:
        self.stages[name], self.where = at_s, f"after stage {name}"

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        """Still in `stage`; `detail`: the last look; the wait gives up `ends_at_s` into it unless the stage passes."""
        self.where = f"in stage {stage}: {detail}"

    def interrupted(self) -> Verdict:
        elapsed = time.monotonic() - self.started
        return Verdict(False, elapsed, dict(self.stages), f"interrupted (Ctrl-C) after {elapsed:.0f} s, {self.where}",
                       interrupted=True)


@dataclass
class Deadline:
    timeout_s: float
    started: float = field(default_factory=lambda: time.monotonic())  # looked up when made (tests/cli/test_gate.py)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.timeout_s - self.elapsed()

    def pause(self, interval_s: float) -> None:
        time.sleep(max(0.0, min(interval_s, self.remaining())))


# --- URL mode -------------------------------------------------------------------------------------------------

def has_text(reply: ChatReply) -> bool:
    """Content, or the reasoning a reasoning parser moved it to (the VM's startup script's rule too)."""
    return bool(reply.content.strip() or reply.reasoning)


def check_health(client: ChatClient) -> Check:
    root = client.base.removesuffix("/v1")
    response = client.session.get(f"{root}/health", timeout=client.timeout_s)
    page = html_page(response)
    if page or 400 <= response.status_code < 500:
        what = f" with {page}" if page else ""
        return Check(False, f"{root}/health answered HTTP {response.status_code}{what}: {NOT_VLLM_HEALTH}, so "
                            f"{NOT_VLLM}", fatal=True)
    return Check(response.status_code == 200, f"/health answered HTTP {response.status_code}")


def check_models(client: ChatClient) -> Check:
    """The model is listed (none given: the first listed); a server listing other models ends the wait at once."""
    response = client.session.get(f"{client.base}/models", timeout=client.timeout_s)
    if response.status_code != 200 or html_page(response):
        err = response_error(response, 0.0, client.key_env)
        if err.url or response.status_code == 404:  # a refused key, a web page, or no /v1/models: no vLLM's way
            detail = str(err) if err.url else f"{response.url} answered HTTP 404: vLLM serves /v1/models, so {NOT_VLLM}"
            return Check(False, detail, fatal=True)
        return Check(False, f"/v1/models answered HTTP {response.status_code}",
                     fatal=response.status_code in FATAL_API_STATUSES)
    body = json_or_none(response)
    entries = body.get("data") if isinstance(body, dict) else None
    listed = [entry.get("id") for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
    try:
        return Check(True, value=pick_model(listed, client.model or None, "/v1/models"))
    except ModelNotServed as err:
        return Check(False, str(err), fatal=bool(listed))


def check_completion(client: ChatClient) -> Check:
    reply = client.chat([{"role": "user", "content": "Say hello."}], max_tokens=COMPLETION_MAX_TOKENS)
    return Check(has_text(reply), "chat completion returned empty content and no reasoning")


def check_tools(client: ChatClient) -> Check:
    tool = {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    reply = client.chat([{"role": "user", "content": "What time is it in Paris?"}], tools=[tool],
                        tool_choice="auto", max_tokens=COMPLETION_MAX_TOKENS)
    return Check(has_text(reply) or bool(reply.tool_calls),
                 "request with tools returned neither text nor tool calls")


def check_vision(client: ChatClient) -> Check:
    reply = client.chat(image_messages("red-square.png", "What colour is this?"), max_tokens=COMPLETION_MAX_TOKENS)
    return Check(has_text(reply), "request with an image returned empty content and no reasoning")


UrlCheck = Callable[[ChatClient], Check]
URL_CHECKS: dict[str, UrlCheck] = {"health": check_health, "models": check_models, "completion": check_completion}
SMOKE_CHECKS: dict[str, UrlCheck] = {"tools": check_tools, "vision": check_vision}


def parse_smoke(value: str) -> list[str]:
    """'tools,vision' -> ['tools', 'vision']; an unknown name raises naming --smoke."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SMOKE_CHECKS]
    if unknown:
        raise click.BadParameter(f"unknown check {', '.join(unknown)}; choose from {', '.join(SMOKE_CHECKS)}",
                                 param_hint="--smoke")
    return names


def url_stages(smoke: Sequence[str]) -> list[tuple[str, UrlCheck]]:
    return [*URL_CHECKS.items(), *((f"smoke-{name}", SMOKE_CHECKS[name]) for name in smoke)]


def port_held(root: str) -> bool | None:
    """Whether a process here holds a loopback `root`'s port (vLLM binds before it listens); None elsewhere."""
    parts = urlsplit(root)
    try:
        address = ipaddress.ip_address("127.0.0.1" if parts.hostname == "localhost" else parts.hostname or "")
    except ValueError:
        return None
    if not address.is_loopback or parts.port is None:
        return None
    with socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), parts.port))
        except OSError as err:
            return True if err.errno == errno.EADDRINUSE else None
    return False


def unanswered(err: requests.RequestException, root: str) -> Check:
    """A request that got no answer, said plainly: refused (and whether a vLLM holds the port), unreachable, a
    name that does not resolve, https to an http server, or too slow."""
    from tpuserve.cli import PLAIN_HTTP_REPLY, connection_reason

    address = urlsplit(root).netloc
    if isinstance(err, requests.exceptions.SSLError) and PLAIN_HTTP_REPLY.search(str(err)):
        return Check(False, f"{address} speaks http, not https: give http://{address}", fatal=True)
    if isinstance(err, requests.ConnectionError):  # ConnectTimeout too: a SYN nobody answered
        reason = connection_reason(err)
        if "name or service not known" in reason.lower() or "nodename nor servname" in reason.lower():
            return Check(False, f"{urlsplit(root).hostname} does not resolve ({reason}): is the host right?",
                         fatal=True)
        if "refused" not in reason.lower():
            return Check(False, f"cannot connect to {address} ({reason})", connected=False)
        held = port_held(root)
        if held:
            return Check(False, f"{address} is bound but not listening yet: a vLLM loading (it listens once its "
                                "engine is up)")
        if held is False:
            return Check(False, f"nothing listens on {address}, and no process here holds its port yet (vLLM binds "
                                "it as it starts)", connected=False)
        return Check(False, f"nothing listens on {address} yet", connected=False)
    return Check(False, f"no answer ({type(err).__name__})")


def run_check(check: UrlCheck, client: ChatClient, timeout_s: float) -> Check:
    client.timeout_s = timeout_s
    try:
        return check(client)
    except EndpointError as err:  # a chat completion's; one naming its URL is a refused key or a web page
        return Check(False, str(err) if err.url else f"chat completion answered {err}",
                     fatal=err.status in FATAL_API_STATUSES or bool(err.url))
    except requests.RequestException as err:
        return unanswered(err, client.base.removesuffix("/v1"))


@dataclass
class Refusals:
    """`note` each look at `at` s: None once one connected, else the seconds connections have failed in a row."""

    since: float | None = None

    def note(self, connected: bool, at: float) -> float | None:
        if connected:
            self.since = None
            return None
        if self.since is None:
            self.since = at
        return at - self.since


def watch_url(http: requests.Session, url: str, model: str | None, smoke: Sequence[str] = (),
              timeout_s: float = READY_TIMEOUT_S, interval_s: float = URL_INTERVAL_S,
              reporter: Reporter | None = None, connect_timeout_s: float | None = None, api_key: str = "",
              key_env: str = API_KEY_ENV) -> Verdict:
    """Pass each stage in order, polling every `interval_s`; a fatal answer, or no connection for
    `connect_timeout_s` in a row (None: no limit), ends the wait at once. `model` None: the first listed. Every
    request presents `api_key` (vLLM's --api-key guards /v1); a refused one's error names `key_env`."""
    deadline, stages, refusals = Deadline(timeout_s), {}, Refusals()
    client = ChatClient(url, model or "", api_key=api_key, session=http, key_env=key_env)
    reporter = reporter or Reporter()
    for name, check in url_stages(smoke):
        detail, ends_at = "not tried", timeout_s
        while True:
            if deadline.remaining() <= 0:
                return Verdict(False, deadline.elapsed(), stages,
                               f"timed out after {timeout_s:g} s in stage {name}: {detail}")
            tried_at = deadline.elapsed()
            result = run_check(check, client, min(deadline.remaining(), REQUEST_TIMEOUT_S))
            if result.fatal:
                return Verdict(False, deadline.elapsed(), stages,
                               f"stage {name}: {result.detail} (waiting cannot change this answer)")
            failing_for = refusals.note(result.connected, tried_at)
            if connect_timeout_s is not None and failing_for is not None and failing_for >= connect_timeout_s:
                detail = result.detail.split(" yet", 1)[0]
                refused = detail.startswith("nothing listens")
                return Verdict(False, deadline.elapsed(), stages, f"stage {name}: {detail}: "
                               f"{'connections refused' if refused else 'no connection'} for {connect_timeout_s:g} s "
                               f"(--connect-timeout); is the {'port' if refused else 'host'} right?")
            ends_at = timeout_s if connect_timeout_s is None or refusals.since is None else \
                min(timeout_s, refusals.since + connect_timeout_s)
            if result.ok:
                client.model = result.value or client.model
                stages[name] = deadline.elapsed()
                reporter.stage(name, stages[name])
                break
            if deadline.remaining() > 0 or detail == "not tried":  # a request cut by the deadline tells nothing
                detail = result.detail
            reporter.waiting(name, detail, ends_at)
            deadline.pause(interval_s)
    return Verdict(True, deadline.elapsed(), stages)


# --- instance mode --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BootStatus:
    """One look at the guest attributes: the stage, whether the wait is over, and why."""

    stage: str
    done: bool
    ready: bool = False
    detail: str = ""
    warnings: tuple[str, ...] = ()


SOURCE_ATTRIBUTES = ("cache", "image", "weights", "compile-cache")


def boot_timeline(attributes: Mapping[str, str]) -> dict[str, float]:
    """stage -> seconds since the first stage began, in boot order, from `at-<stage>`; stages before `since` (the
    current run's start) are left out."""
    def seconds(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None  # a half-written value; the next poll reads it whole

    since = seconds(attributes.get("since") or "0") or 0.0
    began = {key[len("at-"):]: at for key, value in attributes.items()
             if key.startswith("at-") and (at := seconds(value)) is not None and at >= since}
    if not began:
        return {}
    first = min(began.values())
    # Stages begun in the same (whole) second keep their boot order.
    order = {stage: index for index, stage in enumerate((*BOOT_STAGES, RESTARTING_STAGE, FAILED_STAGE))}
    return {stage: at - first for stage, at in sorted(began.items(),
                                                      key=lambda item: (item[1], order.get(item[0], len(order))))}


def read_boot(attributes: Mapping[str, str], expected_config_hash: str | None = None) -> BootStatus:
    """What the guest attributes say; with an expected config hash, a stage left by another config is waited past."""
    stage = attributes.get("stage") or BOOTING
    reported = attributes.get("config-hash")
    if expected_config_hash and stage != BOOTING and reported != expected_config_hash:
        earlier = f" ({stage})" if stage in (SERVING, FAILED_STAGE) else f" (in {stage})"
        return BootStatus(stage, done=False, detail=f"reports config {reported or 'none'}{earlier}, waiting for "
                                                    f"{expected_config_hash}")
    if stage == FAILED_STAGE:
        before = [name for name in boot_timeline(attributes) if name != FAILED_STAGE]
        where = f" during {before[-1]}" if before else ""
        reason = attributes.get("reason") or "no reason given"
        return BootStatus(stage, done=True, detail=f"boot failed{where}: {reason}")
    if stage == SERVING:  # a warning does not stop serving
        return BootStatus(stage, done=True, ready=True,
                          warnings=(attributes["warning"],) if attributes.get("warning") else ())
    if stage == RESTARTING_STAGE:  # the server crashed after serving; the VM restarts it and says why
        return BootStatus(stage, done=False, detail=f"restarting: {attributes.get('reason') or 'no reason given'}")
    waiting = f": {attributes['reason']}" if attributes.get("reason") else ""
    return BootStatus(stage, done=False,
                      detail="no guest attributes yet" if stage == BOOTING else f"in {stage}{waiting}")


def serial_tail(compute: ComputeClient, instance: Instance, lines: int = SERIAL_TAIL_LINES) -> str:
    try:
        return "\n".join(compute.serial_output(instance).splitlines()[-lines:])
    except (ComputeApiError, requests.RequestException) as err:
        return f"(serial console unavailable: {err})"


def look(compute: ComputeClient, instance: Instance, last: BootStatus,
         expected_config_hash: str | None) -> tuple[dict[str, str], BootStatus]:
    """One poll: the guest attributes and what they mean; without any, the instance says whether to wait on (a VM
    deleted or stopped will never report `serving`)."""
    try:
        attributes = compute.guest_attributes(instance, GUEST_ATTRIBUTE_NAMESPACE)
        found = {} if attributes else compute.get_or_none(f"{compute.base_url}{instance.path}")
    except ComputeApiError as err:
        return {}, BootStatus(last.stage, done=err.status in FATAL_API_STATUSES, detail=str(err))
    except requests.RequestException as err:
        return {}, BootStatus(last.stage, done=False, detail=f"Compute API unreachable ({type(err).__name__})")
    if found is None:
        return attributes, BootStatus(last.stage, done=True, detail=f"instance not found: deleted, or flex-start max "
                                                                    f"run ended? ({instance.name})")
    if found.get("status") in STOPPED_STATUSES:
        return attributes, BootStatus(last.stage, done=True,
                                      detail=f"instance is {found['status']}: it stopped before serving")
    return attributes, read_boot(attributes, expected_config_hash)


def watch_instance(compute: ComputeClient, instance: Instance, timeout_s: float = READY_TIMEOUT_S,
                   interval_s: float = INSTANCE_INTERVAL_S, expected_config_hash: str | None = None,
                   reporter: Reporter | None = None) -> Verdict:
    """Follow the VM's stages until `serving`, `failed` (with the console tail), a VM gone or stopped, a fatal API
    error, or the timeout."""
    deadline, status, timeline = Deadline(timeout_s), BootStatus(BOOTING, done=False, detail="not read yet"), {}
    reporter = reporter or Reporter()
    while deadline.remaining() > 0:
        attributes, status = look(compute, instance, status, expected_config_hash)
        for name, at in boot_timeline(attributes).items():
            if name not in timeline:
                timeline[name] = at
                reporter.stage(name, at)
        if status.done:
            tail = serial_tail(compute, instance) if status.stage == FAILED_STAGE else ""
            return Verdict(status.ready, deadline.elapsed(), timeline, status.detail or None, tail,
                           {key: attributes[key] for key in SOURCE_ATTRIBUTES if attributes.get(key)},
                           warnings=list(status.warnings))
        reporter.waiting(status.stage, status.detail, timeout_s)
        deadline.pause(interval_s)
    return Verdict(False, deadline.elapsed(), timeline,
                   f"timed out after {timeout_s:g} s in stage {status.stage}: {status.detail}",
                   serial_tail(compute, instance))


# --- command --------------------------------------------------------------------------------------------------

class ConsoleReporter(Reporter):
    """Each stage as a line; what it waits for in a live status line on a terminal (`status`), else (CI logs,
    `pulumi up`) as a line whenever it changes and at least every `heartbeat_s`."""

    def __init__(self, console: Any, status: Any = None, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.console, self.status, self.heartbeat_s, self.clock = console, status, heartbeat_s, clock
        self.since = self.last_line = clock()
        self.last_state: tuple[str, str] | None = None

    def say(self, text: Any) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)  # one line each, however long
        self.last_line = self.clock()

    def stage(self, name: str, at_s: float) -> None:
        from rich.text import Text

        super().stage(name, at_s)
        self.say(Text.assemble(("✓", "green"), f" {name:<18} at {at_s:7.1f} s"))

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        super().waiting(stage, detail, ends_at_s)
        now = self.clock()
        line = f"{stage}: {detail} ({now - self.since:.0f} s; gives up at {ends_at_s:.0f} s)"
        if self.status is not None:
            self.status.update(line)
        elif (stage, detail) != self.last_state:
            self.last_state = (stage, detail)
            self.say(f"… {line}")
        elif now - self.last_line >= self.heartbeat_s:
            self.say(f"… still in {line}")


def print_timeline(console: Any, verdict: Verdict, url_mode: bool) -> None:
    """Each stage and how long it took: URL mode times when each passed, the VM when each began."""
    from rich.table import Table

    if not verdict.stages:
        console.print("boot timeline: no stage reached")
        return
    table = Table(title="boot timeline", title_justify="left")
    table.add_column("stage")
    table.add_column("passed at (s)" if url_mode else "began at (s)", justify="right")
    table.add_column("took (s)", justify="right")
    entries = list(verdict.stages.items())
    for index, (name, at) in enumerate(entries):
        if url_mode:
            took = f"{at - (entries[index - 1][1] if index else 0.0):.1f}"
        else:
            took = f"{entries[index + 1][1] - at:.1f}" if index + 1 < len(entries) else ""
        table.add_row(name, f"{at:.1f}", took)
    console.print(table)


def check_mode(url: str | None, model: str | None, instance: str | None, zone: str | None,
               project: str | None, smoke: str, config_hash: str | None, connect_timeout_s: float | None = None
               ) -> None:
    """Exactly one of --url / --instance, with the options that mode needs."""
    if bool(url) == bool(instance):
        raise click.UsageError("give exactly one of --url (a server) or --instance (a VM)")
    if url and config_hash:
        raise click.UsageError("--config-hash works with --instance only (a server's URL does not report it)")
    if instance and connect_timeout_s is not None:
        raise click.UsageError("--connect-timeout works with --url only (a VM is followed through the Compute API)")
    if instance:
        missing = [option for option, value in (("--zone", zone), ("--project", project)) if not value]
        if missing:
            raise click.UsageError(f"--instance needs {' and '.join(missing)}")
        if smoke:
            raise click.UsageError("--smoke works with --url only (the VM runs its own checks)")


@click.command()
@url_option("Server URL: host:port or http(s)://host:port, with or without /v1 (URL mode).")
@model_option("Served model name the server must list and complete with (URL mode); default: the stack's model, "
              "else the first one the server lists.")
@click.option("--smoke", default="", help="Extra checks after the completion, comma-separated: tools,vision.")
@click.option("--instance", help="VM name whose guest attributes to follow (instance mode).")
@click.option("--zone", help="Zone of --instance.")
@click.option("--project", help="Project of --instance.")
@click.option("--config-hash", help="Instance mode: accept `serving` only with this serving-config hash.")
@click.option("--compute-url", default=COMPUTE_URL, show_default=True, help="Compute API root (tests use a fake).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=READY_TIMEOUT_S,
              show_default=True, help="Seconds to wait in all.")
@click.option("--connect-timeout", "connect_timeout_s", type=click.FloatRange(min=0, min_open=True),
              help=f"URL mode: seconds of failed connections in a row (refused, unknown host) that end the wait "
              f"[default: {CONNECT_TIMEOUT_S:g}]. A server that already runs answers at once, so two minutes of "
              "refusals mean a wrong address; vLLM refuses connections until its engine is up, so to watch a boot "
              "from its start give the same value as --timeout.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0, min_open=True),
              help=f"Seconds between polls [default: {URL_INTERVAL_S:g} with --url, {INSTANCE_INTERVAL_S:g} with "
              "--instance (each poll is a Compute API call)].")
@api_key_option()
@stack_options
@json_option
def gate(url: str | None, model: str | None, smoke: str, instance: str | None, zone: str | None,
         project: str | None, config_hash: str | None, compute_url: str, timeout_s: float,
         connect_timeout_s: float | None, interval_s: float | None, api_key_env: str, stack: str | None,
         stack_outputs: Path | None, as_json: bool) -> None:
    """Wait until a deployment really serves; exit 0 only then. The last stdout line is the JSON verdict
    (always, Ctrl-C too, which exits 130: --json is accepted for symmetry with the other commands; progress goes
    to stderr).

    With --stack, a gcp stack is followed through its VM's guest attributes (no tunnel needed) and a local
    stack through its URL. Answers no wait can fix end the wait at once: a server listing other models, a 400,
    401 or 403, a VM that failed, is gone or stopped."""
    from rich.console import Console

    outputs = read_outputs(stack, stack_outputs)
    if outputs is not None and not (url or instance):
        if outputs.get("target") == "local":
            url, model = server_root(str(outputs.get("endpoint"))), model or outputs.get("model")
        elif outputs.get("target") == "gke":  # `pulumi up` awaited the Deployment; re-check through a port-forward
            raise click.UsageError(f"stack runs on GKE, whose readiness is its pods' probe: run "
                                   f"`{outputs.get('portForwardCommand')}`, then gate --url http://localhost:"
                                   f"{outputs.get('port')} --model {outputs.get('model')}")
        else:
            instance, zone, project = outputs.get("instanceName"), outputs.get("zone"), outputs.get("project")
            config_hash = config_hash or outputs.get("configHash")
    check_mode(url, model, instance, zone, project, smoke, config_hash, connect_timeout_s)
    smoke_checks = parse_smoke(smoke)
    console = Console(stderr=True)
    reporter = Reporter()
    try:
        with console.status("starting") if console.is_terminal else contextlib.nullcontext() as status:
            reporter = ConsoleReporter(console, status)
            if url:
                with requests.Session() as http:
                    verdict = watch_url(http, url, model, smoke_checks, timeout_s, interval_s or URL_INTERVAL_S,
                                        reporter, connect_timeout_s or CONNECT_TIMEOUT_S,
                                        os.environ.get(api_key_env, ""), api_key_env)
            else:
                verdict = gate_instance(Instance(str(project), str(zone), str(instance)), compute_url, timeout_s,
                                        interval_s or INSTANCE_INTERVAL_S, config_hash, reporter)
    except KeyboardInterrupt:  # Ctrl-C still ends with the verdict line the help promises
        verdict = reporter.interrupted()
    print_timeline(console, verdict, url_mode=bool(url))
    for key, value in verdict.sources.items():
        console.print(f"{key.replace('-', ' ')}: {value}", markup=False, highlight=False)
    if verdict.serial_tail:
        console.print(f"serial console, last {SERIAL_TAIL_LINES} lines:", style="bold")
        console.print(verdict.serial_tail, markup=False, highlight=False)
    for warning in verdict.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    console.print("[green]ready[/]" if verdict.ready else f"[red]not ready:[/] {verdict.reason}")
    click.echo(verdict.json_line())
    raise SystemExit(0 if verdict.ready else INTERRUPTED_EXIT if verdict.interrupted else 1)


def gate_instance(instance: Instance, compute_url: str, timeout_s: float, interval_s: float,
                  config_hash: str | None, reporter: Reporter) -> Verdict:
    """Instance mode with application-default credentials; missing credentials are a verdict, not a traceback."""
    from tpuserve.gce import MissingCredentials, adc_session

    try:
        session = adc_session()
    except MissingCredentials as err:
        return Verdict(False, 0.0, {}, str(err))
    with session:
        return watch_instance(ComputeClient(session, compute_url), instance, timeout_s, interval_s, config_hash,
                              reporter)
