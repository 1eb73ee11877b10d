"""`tpuserve gate`: wait until a deployment really serves, and say where the boot time went.

Ready means every stage passed in order: `/health`, `/v1/models`, one short chat completion (URL mode), or the
VM's guest attributes saying `serving` (instance mode); a `failed` stage or a gone VM ends the wait at once.
Human output goes to stderr; stdout gets exactly one JSON line, the verdict, which the stack's readiness gate parses.
The stages and guest attributes: docs/design/gate-and-status.md.
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
from typing import Any, Protocol
from urllib.parse import urlsplit

import click
import requests

from tpuserve.cli import json_option, json_text
from tpuserve.client import (API_KEY_ENV, NOT_VLLM, ChatClient, ChatReply, EndpointError, ModelNotServed, html_page,
                             json_or_none, pick_model, response_error, server_root)
from tpuserve.facts import (BOOT_STAGES, FAILED_STAGE, GATE_POLL_S, GUEST_ATTRIBUTE_NAMESPACE, READY_TIMEOUT_S,
                            RESTARTING_STAGE)
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ComputeClient, Instance
from tpuserve.images import image_messages
from tpuserve.deploy.stack import api_key_option, model_option, read_outputs, stack_options, url_option

SERVING, BOOTING = BOOT_STAGES[-1], "booting"
URL_INTERVAL_S = 0.5  # a stage passed shows up within the 2 s lag target
# Each poll is a Compute API call that reads the guest attributes, whose budget the VM's writes share (facts.py).
INSTANCE_INTERVAL_S = GATE_POLL_S
REQUEST_TIMEOUT_S = 60.0
SERIAL_TAIL_LINES = 30
COMPLETION_MAX_TOKENS = 8
# Compute API answers no amount of waiting changes: a bad zone/project, missing credentials or permission. The
# same statuses from the server itself end a URL-mode wait too: a 400 to a smoke check (no tool parser, images on
# a text-only server) or a 401/403 (an API key the gate does not send) answers the same on every retry.
FATAL_API_STATUSES = (400, 401, 403)
# Off a terminal (CI, `pulumi up`), progress is printed as lines: one per stage change and a heartbeat this often.
HEARTBEAT_S = 30.0
# URL mode: how long connections may fail (refused, no route) before the gate stops waiting for a server that is
# supposed to run already. One that runs answers at once, and two minutes of refusals mean a wrong address far more
# often than a server about to listen. vLLM binds its port as it starts but listens only once its engine is up
# (vllm/entrypoints/launchers/launcher.py setup_server: create_server_socket binds, uvicorn listens later), so on
# this machine a port that is bound and refuses is a vLLM booting: those refusals count toward --timeout only.
CONNECT_TIMEOUT_S = 120.0
# Any HTTP answer means vLLM's app is up, and from then on every vLLM (the API server, and the health apps of
# `vllm preload` and the DP supervisor) answers /health: 200, or 503 while its engine is dead or still loading. A
# 4xx there, or a web page anywhere, is a server that is not vLLM, and waiting will not make it one.
NOT_VLLM_HEALTH = "every vLLM answers /health (200, or 503 while it loads) once it accepts connections"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
# Instance statuses from which the VM will not reach `serving` by itself.
STOPPED_STATUSES = frozenset({"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"})


@dataclass(frozen=True)
class Check:
    """One look at a stage: passed or not, what was found, whether waiting could change it (`fatal`: no), and
    `value` (the models stage: the model the later stages ask)."""

    ok: bool
    detail: str = ""
    fatal: bool = False
    value: str = ""
    # False: no connection could be made, and nothing here says a vLLM is starting (what --connect-timeout counts)
    connected: bool = True


@dataclass(frozen=True)
class Verdict:
    """`stages` maps each stage reached to seconds since the timeline began (URL mode: the gate's start; instance
    mode: the VM's first reported stage)."""

    ready: bool
    elapsed_s: float
    stages: dict[str, float]
    reason: str | None = None
    serial_tail: str = ""  # a failed VM's last console lines: for people, not part of the JSON line
    # Instance mode: where each part came from (cache, image, weights, compile cache), as the VM reported it.
    sources: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False  # ended by Ctrl-C (exit INTERRUPTED_EXIT)
    # Instance mode: what the VM found wrong without failing the boot (its state's `warning`).
    warnings: list[str] = field(default_factory=list)

    def json_line(self) -> str:
        return json_text({"ready": self.ready, "elapsed_s": round(self.elapsed_s, 3),
                           "stages": {name: round(at, 3) for name, at in self.stages.items()},
                           "reason": self.reason, **({"sources": self.sources} if self.sources else {}),
                           **({"warnings": self.warnings} if self.warnings else {})})


class Reporter(Protocol):
    def stage(self, name: str, at_s: float) -> None:
        """A stage was reached `at_s` seconds into the timeline."""

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        """Still in `stage`; `detail` says what the last look found; the wait gives up `ends_at_s` into it unless
        the stage passes (the --timeout, or sooner the --connect-timeout while connections fail)."""


class SilentReporter:
    def stage(self, name: str, at_s: float) -> None:
        pass

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        pass


SILENT = SilentReporter()


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

class NotReady(Exception):
    """The current stage's check failed; the message says what the server answered. `fatal`: it will answer the
    same however long the gate waits."""

    def __init__(self, message: str, fatal: bool):
        super().__init__(message)
        self.fatal = fatal


def ask(http: requests.Session, root: str, model: str, timeout_s: float, messages: list[dict[str, Any]],
        **params: Any) -> ChatReply:
    """One short chat completion; NotReady unless the server answers 200 with a message (fatal for a status in
    FATAL_API_STATUSES). Like /health and /v1/models, it presents the session's API key, if any (the command sets
    $TPUSERVE_API_KEY on the session)."""
    client = ChatClient(root, model, api_key="", timeout_s=timeout_s, session=http, key_env=key_env_of(http))
    try:
        return client.chat(messages, max_tokens=COMPLETION_MAX_TOKENS, **params)
    except EndpointError as err:
        said = str(err) if err.url else f"chat completion answered {err}"
        raise NotReady(said, fatal=err.status in FATAL_API_STATUSES or bool(err.url)) from err


def key_env_of(http: requests.Session) -> str:
    """The variable the session's key came from (the command sets it), for what a refused key's error says."""
    return getattr(http, "key_env", API_KEY_ENV)


def has_text(reply: ChatReply) -> bool:
    """Whether the model generated anything: content, or the reasoning field a reasoning parser moved it to
    (the rule the VM's startup script applies too)."""
    return bool(reply.content.strip() or reply.reasoning)


def check_health(http: requests.Session, root: str, model: str, timeout_s: float) -> Check:
    response = http.get(f"{root}/health", timeout=timeout_s)
    page = html_page(response)
    if page or 400 <= response.status_code < 500:
        what = f" with {page}" if page else ""
        return Check(False, f"{root}/health answered HTTP {response.status_code}{what}: {NOT_VLLM_HEALTH}, so "
                            f"{NOT_VLLM}", fatal=True)
    return Check(response.status_code == 200, f"/health answered HTTP {response.status_code}")


def check_models(http: requests.Session, root: str, model: str | None, timeout_s: float) -> Check:
    """The model is listed (None: any model, the first listed is then asked). A server that lists other models
    will not start listing this one: that ends the wait at once."""
    response = http.get(f"{root}/v1/models", timeout=timeout_s)
    if response.status_code != 200 or html_page(response):
        err = response_error(response, 0.0, key_env_of(http))
        if err.url or response.status_code == 404:  # a refused key, a web page, or no /v1/models: no vLLM's way
            detail = str(err) if err.url else f"{response.url} answered HTTP 404: vLLM serves /v1/models, so {NOT_VLLM}"
            return Check(False, detail, fatal=True)
        return Check(False, f"/v1/models answered HTTP {response.status_code}",
                     fatal=response.status_code in FATAL_API_STATUSES)
    body = json_or_none(response)
    entries = body.get("data") if isinstance(body, dict) else None
    listed = [entry.get("id") for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
    try:
        return Check(True, value=pick_model(listed, model, "/v1/models"))
    except ModelNotServed as err:
        return Check(False, str(err), fatal=bool(listed))


def check_completion(http: requests.Session, root: str, model: str, timeout_s: float) -> Check:
    reply = ask(http, root, model, timeout_s, [{"role": "user", "content": "Say hello."}])
    return Check(has_text(reply), "chat completion returned empty content and no reasoning")


def check_tools(http: requests.Session, root: str, model: str, timeout_s: float) -> Check:
    tool = {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    reply = ask(http, root, model, timeout_s, [{"role": "user", "content": "What time is it in Paris?"}],
                tools=[tool], tool_choice="auto")
    return Check(has_text(reply) or bool(reply.tool_calls),
                 "request with tools returned neither text nor tool calls")


def check_vision(http: requests.Session, root: str, model: str, timeout_s: float) -> Check:
    reply = ask(http, root, model, timeout_s, image_messages("red-square.png", "What colour is this?"))
    return Check(has_text(reply), "request with an image returned empty content and no reasoning")


UrlCheck = Callable[[requests.Session, str, Any, float], Check]
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
    """Whether a process on this machine holds the port of a loopback `root` (as vLLM does from its start, before
    it listens); None for a host elsewhere, which cannot be told. The probe binds without SO_REUSEADDR, so any
    holder makes it fail, and lets go at once."""
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
    """A request that got no answer, said plainly: nothing listening (refused: on this machine, whether a vLLM
    holds the port while it boots), a host that cannot be reached (no connection: counted by --connect-timeout),
    https to a server that speaks http, or a server too slow to answer."""
    from tpuserve.cli import ERRNO_REASON, PLAIN_HTTP_REPLY

    address = urlsplit(root).netloc
    if isinstance(err, requests.exceptions.SSLError) and PLAIN_HTTP_REPLY.search(str(err)):
        return Check(False, f"{address} speaks http, not https: give http://{address}", fatal=True)
    if isinstance(err, requests.ConnectionError):  # ConnectTimeout too: a SYN nobody answered
        found = ERRNO_REASON.search(str(err))
        reason = found.group(1).strip() if found else type(err).__name__
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


def run_check(check: UrlCheck, http: requests.Session, root: str, model: str | None, timeout_s: float) -> Check:
    try:
        return check(http, root, model, timeout_s)
    except NotReady as err:
        return Check(False, str(err), fatal=err.fatal)
    except requests.RequestException as err:
        return unanswered(err, root)


@dataclass
class Refusals:
    """How long connections have failed in a row: `note` each look's outcome at `at` seconds; None once one
    connected, else the seconds since the first failure of the current run."""

    since: float | None = None

    def note(self, connected: bool, at: float) -> float | None:
        if connected:
            self.since = None
            return None
        if self.since is None:
            self.since = at
        return at - self.since


def never_connected(result: Check, stage: str, for_s: float) -> str:
    """The verdict once connections failed for --connect-timeout: what failed and what to check."""
    detail = result.detail.split(" yet", 1)[0]
    what = "connections refused" if detail.startswith("nothing listens") else "no connection"
    hint = "is the port right?" if what == "connections refused" else "is the host right?"
    return f"stage {stage}: {detail}: {what} for {for_s:g} s (--connect-timeout); {hint}"


def watch_url(http: requests.Session, url: str, model: str | None, smoke: Sequence[str] = (),
              timeout_s: float = READY_TIMEOUT_S, interval_s: float = URL_INTERVAL_S,
              reporter: Reporter = SILENT, connect_timeout_s: float | None = None) -> Verdict:
    """Pass each stage in order, polling the current one every `interval_s`; ready when the last one passes. An
    answer no wait can fix (Check.fatal), or no connection for `connect_timeout_s` in a row (None: no limit but
    the timeout), ends the wait at once. `model` None: the first model listed."""
    deadline, root, stages, refusals = Deadline(timeout_s), server_root(url), {}, Refusals()
    for name, check in url_stages(smoke):
        detail, ends_at = "not tried", timeout_s
        while True:
            if deadline.remaining() <= 0:
                return Verdict(False, deadline.elapsed(), stages,
                               f"timed out after {timeout_s:g} s in stage {name}: {detail}")
            tried_at = deadline.elapsed()
            result = run_check(check, http, root, model, min(deadline.remaining(), REQUEST_TIMEOUT_S))
            if result.fatal:
                return Verdict(False, deadline.elapsed(), stages,
                               f"stage {name}: {result.detail} (waiting cannot change this answer)")
            failing_for = refusals.note(result.connected, tried_at)
            if connect_timeout_s is not None and failing_for is not None and failing_for >= connect_timeout_s:
                return Verdict(False, deadline.elapsed(), stages, never_connected(result, name, connect_timeout_s))
            ends_at = timeout_s if connect_timeout_s is None or refusals.since is None else \
                min(timeout_s, refusals.since + connect_timeout_s)
            if result.ok:
                model = result.value or model
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
    """One look at the guest attributes: the stage, whether the wait is over, and why (not) ready."""

    stage: str
    done: bool
    ready: bool = False
    detail: str = ""
    warnings: tuple[str, ...] = ()


# What the VM says each part of its boot came from (vm/supervisor.py, templates/startup.sh.j2), in display order.
SOURCE_ATTRIBUTES = ("cache", "image", "weights", "compile-cache")


def boot_sources(attributes: Mapping[str, str]) -> dict[str, str]:
    return {key: attributes[key] for key in SOURCE_ATTRIBUTES if attributes.get(key)}


def boot_timeline(attributes: Mapping[str, str]) -> dict[str, float]:
    """stage -> seconds since the first stage began, in boot order, from the `at-<stage>` attributes. Stages that
    began before `since` (when the VM started its current run: a boot, or a served-config change) belong to an
    earlier run and are left out."""
    began = {}
    try:
        since = float(attributes.get("since") or 0)
    except ValueError:
        since = 0.0
    for key, value in attributes.items():
        if key.startswith("at-"):
            try:
                at = float(value)
            except ValueError:
                continue  # a half-written value; the next poll reads it whole
            if at >= since:
                began[key[len("at-"):]] = at
    if not began:
        return {}
    first = min(began.values())
    # Stages begun in the same (whole) second keep their boot order; the state's fields come in key order.
    order = {stage: index for index, stage in enumerate((*BOOT_STAGES, RESTARTING_STAGE, FAILED_STAGE))}
    return {stage: at - first for stage, at in sorted(began.items(),
                                                      key=lambda item: (item[1], order.get(item[0], len(order))))}


def read_boot(attributes: Mapping[str, str], expected_config_hash: str | None = None) -> BootStatus:
    """What the guest attributes say. With an expected config hash, only a stage reported for that config ends the
    wait: a `serving` or `failed` left by the previous config (before the VM's supervisor picked up the new one)
    is waited past, not believed."""
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
    if stage == SERVING:  # a warning (e.g. a disabled modality answered other than 4xx) does not stop serving
        return BootStatus(stage, done=True, ready=True,
                          warnings=(attributes["warning"],) if attributes.get("warning") else ())
    if stage == RESTARTING_STAGE:  # the server crashed after serving; the VM restarts it and says why
        return BootStatus(stage, done=False, detail=f"restarting: {attributes.get('reason') or 'no reason given'}")
    # While it waits (e.g. for a fresh secret grant to propagate) the VM says why in `reason`.
    waiting = f": {attributes['reason']}" if attributes.get("reason") else ""
    return BootStatus(stage, done=False,
                      detail="no guest attributes yet" if stage == BOOTING else f"in {stage}{waiting}")


def serial_tail(compute: ComputeClient, instance: Instance, lines: int = SERIAL_TAIL_LINES) -> str:
    try:
        return "\n".join(compute.serial_output(instance).splitlines()[-lines:])
    except (ComputeApiError, requests.RequestException) as err:
        return f"(serial console unavailable: {err})"


def vm_stopped(compute: ComputeClient, instance: Instance) -> str | None:
    """Why the VM will never report `serving` (deleted or stopped), or None while it exists and runs."""
    try:
        status = compute.instance_status(instance)
    except ComputeApiError as err:
        if err.status == 404:
            return f"instance not found: deleted, or flex-start max run ended? ({instance.name})"
        raise
    return f"instance is {status}: it stopped before serving" if status in STOPPED_STATUSES else None


def look(compute: ComputeClient, instance: Instance, last: BootStatus,
         expected_config_hash: str | None) -> tuple[dict[str, str], BootStatus]:
    """One poll: the guest attributes and what they mean. Without attributes (the API answers 404 both before the
    first stage and once the VM is gone) the instance itself says whether to keep waiting."""
    try:
        attributes = compute.guest_attributes(instance, GUEST_ATTRIBUTE_NAMESPACE)
        stopped = None if attributes else vm_stopped(compute, instance)
    except ComputeApiError as err:
        return {}, BootStatus(last.stage, done=err.status in FATAL_API_STATUSES, detail=str(err))
    except requests.RequestException as err:
        return {}, BootStatus(last.stage, done=False, detail=f"Compute API unreachable ({type(err).__name__})")
    if stopped:
        return attributes, BootStatus(last.stage, done=True, detail=stopped)
    return attributes, read_boot(attributes, expected_config_hash)


def watch_instance(compute: ComputeClient, instance: Instance, timeout_s: float = READY_TIMEOUT_S,
                   interval_s: float = INSTANCE_INTERVAL_S, expected_config_hash: str | None = None,
                   reporter: Reporter = SILENT) -> Verdict:
    """Follow the VM's reported stages until `serving` (ready), `failed` (at once, with the console tail), a VM
    that is gone or stopped, an API error waiting cannot fix (both at once), or the timeout (naming the stage)."""
    deadline, status, timeline = Deadline(timeout_s), BootStatus(BOOTING, done=False, detail="not read yet"), {}
    while deadline.remaining() > 0:
        attributes, status = look(compute, instance, status, expected_config_hash)
        for name, at in boot_timeline(attributes).items():
            if name not in timeline:
                timeline[name] = at
                reporter.stage(name, at)
        if status.done:
            tail = serial_tail(compute, instance) if status.stage == FAILED_STAGE else ""
            return Verdict(status.ready, deadline.elapsed(), timeline, status.detail or None, tail,
                           boot_sources(attributes), warnings=list(status.warnings))
        reporter.waiting(status.stage, status.detail, timeout_s)
        deadline.pause(interval_s)
    return Verdict(False, deadline.elapsed(), timeline,
                   f"timed out after {timeout_s:g} s in stage {status.stage}: {status.detail}",
                   serial_tail(compute, instance))


# --- command --------------------------------------------------------------------------------------------------

def gives_up(ends_at_s: float) -> str:
    return f"gives up at {ends_at_s:.0f} s"


class ConsoleReporter:
    """Prints each stage as it arrives and keeps one live status line (rich) for the stage being waited in."""

    def __init__(self, console: Any, status: Any):
        self.console = console
        self.status = status
        self.started = time.monotonic()

    def stage(self, name: str, at_s: float) -> None:
        self.console.print(f"[green]✓[/] {name:<18} at {at_s:7.1f} s")

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        self.status.update(f"{stage}: {detail} ({time.monotonic() - self.started:.0f} s; {gives_up(ends_at_s)})")


class LineReporter:
    """Off a terminal (CI logs, `pulumi up`): a line per stage reached, a line whenever the stage waited in or what
    it found changes, and a heartbeat at least every HEARTBEAT_S, so a log shows the gate is alive."""

    def __init__(self, console: Any, heartbeat_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.started = clock()
        self.last_line = self.started
        self.last_state: tuple[str, str] | None = None

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)  # one line each, however long
        self.last_line = self.clock()

    def stage(self, name: str, at_s: float) -> None:
        self.say(f"✓ {name:<18} at {at_s:7.1f} s")

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        now = self.clock()
        if (stage, detail) != self.last_state:
            self.last_state = (stage, detail)
            self.say(f"… {stage}: {detail} ({now - self.started:.0f} s; {gives_up(ends_at_s)})")
        elif now - self.last_line >= self.heartbeat_s:
            self.say(f"… still in {stage}: {detail} ({now - self.started:.0f} s; {gives_up(ends_at_s)})")


class Tracker:
    """Passes each report on to `reporter` and keeps what it said (the stages reached, the stage waited in), so a
    wait cut short by Ctrl-C still ends with a verdict naming where it was."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}
        self.where = "before the first stage"

    def stage(self, name: str, at_s: float) -> None:
        self.stages[name] = at_s
        self.where = f"after stage {name}"
        self.reporter.stage(name, at_s)

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        self.where = f"in stage {stage}: {detail}"
        self.reporter.waiting(stage, detail, ends_at_s)

    def interrupted(self) -> Verdict:
        elapsed = time.monotonic() - self.started
        return Verdict(False, elapsed, dict(self.stages), f"interrupted (Ctrl-C) after {elapsed:.0f} s, {self.where}",
                       interrupted=True)


def print_timeline(console: Any, verdict: Verdict, url_mode: bool) -> None:
    """Each stage and how long it took. URL mode times when a stage passed (it took since the one before it
    passed, the first since the gate began); the VM reports when each began (it took until the next began)."""
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
    tracker = None
    try:
        with console.status("starting") if console.is_terminal else contextlib.nullcontext() as status:
            tracker = Tracker(ConsoleReporter(console, status) if console.is_terminal else LineReporter(console))
            if url:
                with requests.Session() as http:
                    # A server with an API key (vLLM's --api-key / VLLM_API_KEY) answers /v1 only with it: the gate
                    # presents $TPUSERVE_API_KEY (or --api-key-env's) on every request, as the other commands do.
                    http.key_env = api_key_env  # type: ignore[attr-defined]  # what a refused key's error names
                    if os.environ.get(api_key_env):
                        http.headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
                    verdict = watch_url(http, url, model, smoke_checks, timeout_s, interval_s or URL_INTERVAL_S,
                                        tracker, connect_timeout_s or CONNECT_TIMEOUT_S)
            else:
                verdict = gate_instance(Instance(str(project), str(zone), str(instance)), compute_url, timeout_s,
                                        interval_s or INSTANCE_INTERVAL_S, config_hash, tracker)
    except KeyboardInterrupt:  # Ctrl-C still ends with the verdict line the help promises
        verdict = (tracker or Tracker(SILENT)).interrupted()
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
