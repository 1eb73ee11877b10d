"""`tpuserve gate` verdict logic against fake servers (tests/httpfake.FakeServer on 127.0.0.1): a lying OpenAI
server, one that never comes up, and a fake Compute API replaying recorded guest-attribute sequences.
The real-vLLM checks live in tests/e2e/test_gate_e2e.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any
from collections.abc import Iterator

import click
import pytest
import requests
from click.testing import CliRunner

from tpuserve.deploy.stack import free_local_port
from tests.fakes.httpfake import FakeServer, Request, Response, idle_port
from tpuserve.observe import gate as gate_module
from tpuserve import gce
from tpuserve.observe.gate import (BootStatus, ConsoleReporter, boot_timeline, gate, parse_smoke, read_boot, watch_instance,
                           watch_url)
from tpuserve.gce import ComputeClient, Instance
from tpuserve.images import image_data_uri
from tpuserve.urls import server_root

MODEL = "google/gemma-4-E2B-it"
VM = Instance("demo-project", "us-east5-b", "tpu-serve-vm")
VM_PATH = "/compute/v1/projects/demo-project/zones/us-east5-b/instances/tpu-serve-vm"
FAST = {"timeout_s": 3.0, "interval_s": 0.02}
# A timeout to wait out: on VirtualTime only the requests' real time counts, so ten polls take milliseconds yet a
# loaded machine's slow request cannot end the wait early.
WAITED_OUT = {"timeout_s": 30.0, "interval_s": 3.0}

# Recorded from a flex-start boot: (stage, unix seconds it began).
RECORDED_BOOT = [("installing-docker", 1795900000), ("pulling-image", 1795900041), ("fetching-token", 1795900188),
                 ("starting-server", 1795900190), ("loading-model", 1795900197), ("serving", 1795900512)]
FAILED_REASON = "docker pull vllm/vllm-tpu@sha256:0123: manifest unknown"
SERIAL_LINES = [f"startup-script: line {n}" for n in range(1, 51)]



class VirtualTime:
    """The gate's clock in these tests: each pause moves it forward at once instead of sleeping, so a test waiting
    out a 1.5 s timeout polls as often as it would, without the wait. Everything else about time is real: requests
    still take as long as they take (and count against the deadline), a stalled server still stalls."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped

    def sleep(self, seconds: float) -> None:
        self.skipped += seconds
        time.sleep(0)  # let the fake server's threads run, as a real pause would


@pytest.fixture(autouse=True)
def virtual_time(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> VirtualTime | None:
    """Every test here runs the gate on VirtualTime, except those marked real_time: their fake server changes its
    answers on the wall clock (a timer thread, a time of day), which only real pauses reach."""
    if request.node.get_closest_marker("real_time"):
        return None
    clock = VirtualTime()
    monkeypatch.setattr(gate_module, "time", clock)
    return clock


def chat_body(content: str | None) -> dict:
    return {"object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}]}


def openai_routes(completion: Response, models: tuple[str, ...] = (MODEL,)) -> dict:
    return {("GET", "/health"): lambda request: Response(200),
            ("GET", "/v1/models"): lambda request: Response(200, {"object": "list", "data": [
                {"id": name, "object": "model"} for name in models]}),
            ("POST", "/v1/chat/completions"): lambda request: completion}


def stage_snapshots(recorded: list[tuple[str, int]], **final: str) -> list[dict[str, str]]:
    """What the VM's guest attributes look like after each recorded stage (plus `final` keys on the last one)."""
    snapshots, attributes = [], {"config-hash": "abc123"}
    for stage, began in recorded:
        attributes = {**attributes, "stage": stage, f"at-{stage}": str(began)}
        snapshots.append(attributes)
    snapshots[-1] = {**snapshots[-1], **final}
    return snapshots


def replaying_compute(snapshots: list[dict[str, str]], not_yet: int = 1, vm_status: str = "RUNNING") -> FakeServer:
    """A Compute API that answers 404 `not_yet` times (VM booting), then one snapshot per poll, the last forever;
    the instance itself reports `vm_status`."""
    replies: Iterator[dict[str, str]] = iter([{}] * not_yet + snapshots)
    last: list[dict[str, str]] = [{}]

    def guest_attributes(request: Request) -> Response:
        last[0] = next(replies, last[0])
        if not last[0]:
            return Response(404, {"error": {"code": 404, "message": "not found"}})
        return Response(200, {"queryValue": {"items": [
            {"namespace": "tpu-serve", "key": key, "value": value} for key, value in last[0].items()]}})

    return FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): guest_attributes,
                       ("GET", VM_PATH): lambda request: Response(200, instance_body(vm_status)),
                       ("GET", f"{VM_PATH}/serialPort"): lambda request: Response(
                           200, {"contents": "\n".join(SERIAL_LINES) + "\n"})})


def after_calls(count: int, first: Any, then: Any) -> Any:
    """A route that answers with `first` for its first `count` requests, then with `then`: a server that changes
    after the gate has read what it had to, however slowly the machine runs (a timer would race the polls)."""
    seen: list[Request] = []

    def route(request: Request) -> Response:
        seen.append(request)
        return (first if len(seen) <= count else then)(request)

    return route


def instance_body(status: str) -> dict:
    return {"kind": "compute#instance", "name": VM.name, "status": status}


NOT_FOUND = Response(404, {"error": {"code": 404, "message": f"The resource '{VM_PATH}' was not found"}})


class RecordingReporter:
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.waits: list[tuple[str, str]] = []
        self.ends: list[float] = []  # when each wait was to give up

    def stage(self, name: str, at_s: float) -> None:
        self.stages.append(name)

    def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
        self.waits.append((stage, detail))
        self.ends.append(ends_at_s)


# --- URL mode -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_server_root_drops_the_openai_suffix(url: str):
    assert server_root(url) == "http://h:8000"


def test_an_honest_server_is_ready_after_health_models_and_a_completion_in_that_order():
    reporter = RecordingReporter()
    with FakeServer(openai_routes(Response(200, chat_body("Hello")))) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url + "/v1", MODEL, reporter=reporter, **FAST)
    assert verdict.ready and verdict.reason is None
    assert list(verdict.stages) == reporter.stages == ["health", "models", "completion"]
    assert list(verdict.stages.values()) == sorted(verdict.stages.values())
    assert [(r.method, r.path) for r in fake.requests] == [
        ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
    sent = fake.requests[-1].json()
    assert sent["model"] == MODEL and 0 < sent["max_tokens"] <= 16


@pytest.mark.parametrize("completion, why", [
    (Response(500, {"error": {"message": "EngineCore died"}}), "HTTP 500"),
    (Response(200, chat_body("")), "empty content"),
    (Response(200, chat_body(None)), "empty content"),
    (Response(200, {"choices": []}), "without a message"),
], ids=["500", "empty", "null", "no-choices"])
def test_a_server_lying_with_200_on_health_and_models_is_not_ready(completion: Response, why: str):
    with FakeServer(openai_routes(completion)) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, timeout_s=0.5, interval_s=0.05)
    assert not verdict.ready
    assert "stage completion" in verdict.reason and why in verdict.reason
    assert list(verdict.stages) == ["health", "models"]
    assert sum(r.path == "/v1/chat/completions" for r in fake.requests) > 1  # it kept trying until the timeout


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_completion_whose_text_a_reasoning_parser_moved_counts(field: str):
    body = chat_body(None)
    body["choices"][0]["message"][field] = "The user greets me"
    with FakeServer(openai_routes(Response(200, body))) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, **FAST)
    assert verdict.ready and "completion" in verdict.stages


def test_a_model_missing_while_v1_models_lists_others_ends_the_wait_at_once():
    """Issue #11, item 5: a server that lists other models will not start listing this one."""
    with FakeServer(openai_routes(Response(200, chat_body("Hi")), models=("other/model",))) as fake, \
            requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, timeout_s=30, interval_s=0.05)
    assert not verdict.ready and verdict.elapsed_s < 5
    assert verdict.reason == ("stage models: 'google/gemma-4-E2B-it' is not served by /v1/models, which serves "
                              "other/model (waiting cannot change this answer)")
    assert sum(r.path == "/v1/models" for r in fake.requests) == 1


def test_an_empty_model_list_is_waited_out():
    with FakeServer(openai_routes(Response(200, chat_body("Hi")), models=())) as fake, \
            requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, **WAITED_OUT)
    assert not verdict.ready and verdict.reason.startswith("timed out after 30 s in stage models")
    assert sum(r.path == "/v1/models" for r in fake.requests) > 1


def test_without_a_model_the_first_served_one_is_asked():
    with FakeServer(openai_routes(Response(200, chat_body("Hi")), models=("first/model", "second"))) as fake, \
            requests.Session() as http:
        verdict = watch_url(http, fake.url, None, **FAST)
    assert verdict.ready and fake.requests[-1].json()["model"] == "first/model"


# vLLM 0.32's answer to tools without --enable-auto-tool-choice (vllm/renderers/online_renderer.py, a 400).
NO_TOOL_PARSER = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')


@pytest.mark.parametrize("status", [400, 401, 403])
def test_a_permanent_error_on_a_smoke_check_ends_the_wait_at_once(status: int):
    def chat(request: Request) -> Response:
        if request.json().get("tools"):
            return Response(status, {"object": "error", "message": NO_TOOL_PARSER, "type": "BadRequestError",
                                      "param": None, "code": status})
        return Response(200, chat_body("Hi"))

    routes = openai_routes(Response(200))
    routes[("POST", "/v1/chat/completions")] = chat
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=["tools"], timeout_s=30, interval_s=0.05)
    assert not verdict.ready and verdict.elapsed_s < 5
    said = "chat completion" if status == 400 else f"{fake.url}/v1/chat/completions"  # a 401/403 names the URL
    assert verdict.reason.startswith(f"stage smoke-tools: {said} answered HTTP {status}: \"auto\" tool choice")
    assert verdict.reason.endswith("(waiting cannot change this answer)")
    assert sum(bool(r.json().get("tools")) for r in fake.requests if r.method == "POST") == 1


def test_off_a_terminal_the_gate_prints_each_change_and_a_heartbeat():
    """Issue #11, item 5: in CI or `pulumi up` logs the gate shows it is alive at least every 60 s."""
    lines: list[str] = []
    now = [1000.0]

    class Console:
        def print(self, text, **kwargs):
            lines.append(f"{now[0] - 1000:.0f}: {text}")

    reporter = gate_module.ConsoleReporter(Console(), heartbeat_s=30, clock=lambda: now[0])
    for second in range(0, 100, 3):  # a poll every 3 s: the same answer, then a new one at 60 s
        now[0] = 1000.0 + second
        reporter.waiting("health", "no answer (ConnectionError)" if second < 60 else "/health answered HTTP 503",
                         120 if second < 60 else 1500)
    now[0] = 1100.0
    reporter.stage("health", 100.0)
    assert lines == ["0: … health: no answer (ConnectionError) (0 s; gives up at 120 s)",
                     "30: … still in health: no answer (ConnectionError) (30 s; gives up at 120 s)",
                     "60: … health: /health answered HTTP 503 (60 s; gives up at 1500 s)",
                     "90: … still in health: /health answered HTTP 503 (90 s; gives up at 1500 s)",
                     "100: ✓ health             at   100.0 s"]
    assert gate_module.HEARTBEAT_S <= 60


def test_a_server_that_never_comes_up_times_out_naming_the_health_stage():
    started = time.monotonic()
    port = idle_port()
    with requests.Session() as http:
        verdict = watch_url(http, f"http://127.0.0.1:{port}", MODEL, timeout_s=0.5, interval_s=0.05)
    assert not verdict.ready and verdict.stages == {}
    assert verdict.reason == (f"timed out after 0.5 s in stage health: nothing listens on 127.0.0.1:{port}, and no "
                              "process here holds its port yet (vLLM binds it as it starts)")
    assert 0.5 <= verdict.elapsed_s < 1.0  # polls stop at the deadline, not an interval or a request later
    assert time.monotonic() - started < 2


@pytest.mark.real_time
def test_health_turning_200_late_is_followed_promptly():
    turns_healthy_at = time.monotonic() + 0.4
    routes = openai_routes(Response(200, chat_body("Hi")))
    routes[("GET", "/health")] = lambda request: Response(200 if time.monotonic() >= turns_healthy_at else 503)
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, **FAST)
        lag = time.monotonic() - turns_healthy_at
    assert verdict.ready and verdict.stages["health"] >= 0.35
    assert lag < 0.5, f"ready {lag:.3f} s after /health turned 200 (interval {FAST['interval_s']} s)"


def test_smoke_checks_send_tools_and_an_image_after_the_completion():
    with FakeServer(openai_routes(Response(200, chat_body("Hi")))) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=["tools", "vision"], **FAST)
    assert verdict.ready and list(verdict.stages)[-2:] == ["smoke-tools", "smoke-vision"]
    tools_request, vision_request = [r.json() for r in fake.requests[-2:]]
    assert tools_request["tools"][0]["function"]["name"]
    image_parts = [part for part in vision_request["messages"][0]["content"] if part["type"] == "image_url"]
    assert image_parts[0]["image_url"]["url"] == image_data_uri("red-square.png")


def test_a_vision_server_that_keeps_rejecting_images_fails_the_vision_smoke():
    def chat(request: Request) -> Response:
        has_image = isinstance(request.json()["messages"][0]["content"], list)
        return Response(422, {"error": {"message": "bad image"}}) if has_image else Response(200, chat_body("Hi"))

    routes = openai_routes(Response(200))
    routes[("POST", "/v1/chat/completions")] = chat
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=["vision"], timeout_s=0.4, interval_s=0.05)
    assert not verdict.ready and "stage smoke-vision" in verdict.reason and "HTTP 422" in verdict.reason


def test_parse_smoke_names_the_option_on_a_typo():
    assert parse_smoke("tools, vision") == ["tools", "vision"]
    assert parse_smoke("") == []
    with pytest.raises(click.BadParameter, match="unknown check tool") as raised:
        parse_smoke("tool")
    assert raised.value.param_hint == "--smoke"


# --- instance mode: plain functions -----------------------------------------------------------------------------

def test_boot_timeline_orders_stages_by_when_they_began_from_the_first():
    attributes = {"stage": "pulling-image", "at-pulling-image": "1041", "at-installing-docker": "1000",
                  "config-hash": "abc", "at-broken": "12x"}
    assert boot_timeline(attributes) == {"installing-docker": 0.0, "pulling-image": 41.0}


def test_read_boot_names_the_stage_a_failure_happened_in():
    failed = stage_snapshots(RECORDED_BOOT[:2] + [("failed", 1795900100)], reason=FAILED_REASON)[-1]
    assert read_boot(failed) == BootStatus("failed", done=True, detail=f"boot failed during pulling-image: "
                                                                       f"{FAILED_REASON}")
    assert read_boot({}) == BootStatus("booting", done=False, detail="no guest attributes yet")
    assert read_boot({"stage": "loading-model"}).done is False


def test_read_boot_shows_what_a_waiting_vm_says_it_waits_for():
    waiting = {"stage": "fetching-token", "reason": "waiting for the secret grant to propagate (HTTP 403, 3 min)"}
    assert read_boot(waiting) == BootStatus("fetching-token", done=False, detail="in fetching-token: waiting for the "
                                            "secret grant to propagate (HTTP 403, 3 min)")
    assert read_boot({"stage": "fetching-token", "reason": ""}).detail == "in fetching-token"  # cleared at boot


def test_serving_counts_only_with_the_expected_config_hash():
    serving = stage_snapshots(RECORDED_BOOT)[-1]
    assert read_boot(serving).ready
    assert read_boot(serving, expected_config_hash="abc123").ready
    stale = read_boot(serving, expected_config_hash="fff999")
    assert not stale.done and "fff999" in stale.detail


# --- instance mode: replaying a fake Compute API ----------------------------------------------------------------

def test_a_recorded_boot_to_serving_is_ready_with_the_vms_timeline():
    reporter = RecordingReporter()
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, reporter=reporter, **FAST)
    assert verdict.ready and verdict.reason is None
    assert reporter.stages == [stage for stage, _ in RECORDED_BOOT]
    assert verdict.stages == {stage: began - RECORDED_BOOT[0][1] for stage, began in RECORDED_BOOT}
    assert ("booting", "no guest attributes yet") in reporter.waits


def test_a_recorded_boot_ending_in_failed_stops_at_once_with_reason_and_serial_tail():
    snapshots = stage_snapshots(RECORDED_BOOT[:2] + [("failed", 1795900100)], reason=FAILED_REASON)
    with replaying_compute(snapshots) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=60, interval_s=0.02)
    assert not verdict.ready and FAILED_REASON in verdict.reason
    assert verdict.elapsed_s < 5
    assert verdict.serial_tail.splitlines() == SERIAL_LINES[-gate_module.SERIAL_TAIL_LINES:]


def test_a_vm_stuck_loading_times_out_naming_that_stage():
    with replaying_compute(stage_snapshots(RECORDED_BOOT[:5])) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=0.3, interval_s=0.02)
    assert not verdict.ready and verdict.reason.startswith("timed out after 0.3 s in stage loading-model")
    assert verdict.serial_tail.splitlines() == SERIAL_LINES[-30:]  # a timeout shows the console too


@pytest.mark.parametrize("status, message", [
    (403, "Permission 'compute.instances.getGuestAttributes' denied"),
    (401, "Request had invalid authentication credentials"),
    (400, "Invalid value for field 'zone': 'us-east5-z'"),  # a bad zone or project
])
def test_an_api_error_waiting_cannot_fix_fails_at_once_instead_of_waiting_out_the_timeout(status: int, message: str):
    error = Response(status, {"error": {"code": status, "message": message}})
    with FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: error}) as fake, \
            requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=30, interval_s=0.02)
    assert not verdict.ready and verdict.elapsed_s < 1
    assert verdict.reason == f"Compute API HTTP {status}: {message}"


def test_a_transient_api_error_is_waited_out():
    unavailable = Response(503, {"error": {"code": 503, "message": "Backend unavailable"}})
    with FakeServer({("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: unavailable}) as fake, \
            requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=0.3, interval_s=0.02)
    assert not verdict.ready and verdict.reason.startswith("timed out after 0.3 s in stage booting")
    assert "HTTP 503" in verdict.reason and len(fake.requests) > 2


def test_a_deleted_vm_fails_at_once_instead_of_waiting_out_the_timeout():
    routes = {("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: NOT_FOUND,
              ("GET", VM_PATH): lambda request: NOT_FOUND}
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=30, interval_s=0.02)
    assert not verdict.ready and verdict.elapsed_s < 1
    assert verdict.reason == "instance not found: deleted, or flex-start max run ended? (tpu-serve-vm)"
    assert verdict.serial_tail == ""


def test_a_vm_deleted_mid_boot_keeps_its_timeline_and_fails_at_once():
    reporter = RecordingReporter()
    with replaying_compute(stage_snapshots(RECORDED_BOOT[:3])) as fake, requests.Session() as http:
        client = ComputeClient(http, fake.url)
        attributes, instance = ("GET", f"{VM_PATH}/getGuestAttributes"), ("GET", VM_PATH)
        replay, alive = fake.routes[attributes], fake.routes[instance]

        def deleted() -> bool:  # once the gate has read the 404, the three snapshots and the last one three more times
            return sum(r.path.endswith("/getGuestAttributes") for r in fake.requests) > 1 + 3 + 3

        fake.routes[attributes] = lambda request: NOT_FOUND if deleted() else replay(request)
        fake.routes[instance] = lambda request: NOT_FOUND if deleted() else alive(request)
        verdict = watch_instance(client, VM, timeout_s=30, interval_s=0.02, reporter=reporter)
    assert not verdict.ready and "instance not found" in verdict.reason and verdict.elapsed_s < 2
    assert list(verdict.stages) == [stage for stage, _ in RECORDED_BOOT[:3]]


@pytest.mark.parametrize("vm_status", ["STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"])
def test_a_stopped_vm_fails_at_once_naming_its_status(vm_status: str):
    with replaying_compute([], not_yet=1, vm_status=vm_status) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=30, interval_s=0.02)
    assert not verdict.ready and verdict.elapsed_s < 1
    assert verdict.reason == f"instance is {vm_status}: it stopped before serving" and verdict.serial_tail == ""


@pytest.mark.parametrize("vm_status", ["PROVISIONING", "STAGING", "RUNNING"])
def test_a_vm_still_starting_without_attributes_is_waited_for(vm_status: str):
    reporter = RecordingReporter()
    with replaying_compute([], not_yet=1, vm_status=vm_status) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=1.5, interval_s=0.02,
                                 reporter=reporter)
    assert not verdict.ready and verdict.reason.startswith("timed out after 1.5 s in stage booting")
    assert len(reporter.waits) > 2


# --- the command ------------------------------------------------------------------------------------------------

def run_gate(*args: str) -> tuple[int, list[str], str]:
    result = CliRunner().invoke(gate, list(args))
    return result.exit_code, result.stdout.splitlines(), result.stderr


def test_off_a_terminal_the_command_prints_lines_not_a_spinner():
    with FakeServer(openai_routes(Response(200, chat_body("Hello")))) as fake:
        code, stdout, stderr = run_gate("--url", fake.url.removeprefix("http://"), "--interval", "0.05")
    assert code == 0, stderr
    assert [line.split()[1] for line in stderr.splitlines() if line.startswith("✓")] == [
        "health", "models", "completion"]


def test_url_mode_ends_stdout_with_one_json_verdict_and_exits_zero_when_ready():
    with FakeServer(openai_routes(Response(200, chat_body("Hello")))) as fake:
        code, stdout, stderr = run_gate("--url", fake.url, "--model", MODEL, "--interval", "0.05")
    assert code == 0 and len(stdout) == 1
    verdict = json.loads(stdout[-1])
    assert verdict["ready"] is True and verdict["reason"] is None
    assert list(verdict["stages"]) == ["health", "models", "completion"] and verdict["elapsed_s"] >= 0
    assert "boot timeline" in stderr and "completion" in stderr


def test_url_mode_exits_non_zero_on_a_lying_server():
    with FakeServer(openai_routes(Response(500, {"error": {"message": "boom"}}))) as fake:
        code, stdout, _ = run_gate("--url", fake.url, "--model", MODEL, "--timeout", "0.3", "--interval", "0.05")
    assert code == 1 and json.loads(stdout[-1])["ready"] is False


def test_instance_mode_fails_in_under_five_seconds_with_reason_and_serial_tail(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)  # no credentials here; the fake needs none
    snapshots = stage_snapshots(RECORDED_BOOT[:2] + [("failed", 1795900100)], reason=FAILED_REASON)
    started = time.monotonic()
    with replaying_compute(snapshots) as fake:
        code, stdout, stderr = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project,
                                        "--compute-url", fake.url, "--interval", "0.05")
    took = time.monotonic() - started
    print(f"failed boot reported in {took:.2f} s")
    assert code == 1 and took < 5
    verdict = json.loads(stdout[-1])
    assert not verdict["ready"] and FAILED_REASON in verdict["reason"]
    assert list(verdict["stages"]) == ["installing-docker", "pulling-image", "failed"]
    assert SERIAL_LINES[-1] in stderr and SERIAL_LINES[-30] in stderr and SERIAL_LINES[-31] not in stderr


def test_instance_mode_passes_a_recorded_boot_to_serving(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake:
        code, stdout, _ = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project,
                                   "--compute-url", fake.url, "--interval", "0.02", "--config-hash", "abc123")
    assert code == 0
    assert json.loads(stdout[-1])["stages"]["serving"] == RECORDED_BOOT[-1][1] - RECORDED_BOOT[0][1]


@pytest.mark.parametrize("args, message", [
    ([], "exactly one of --url"),
    (["--url", "http://h", "--instance", "vm"], "exactly one of --url"),
    (["--url", "h"], "Invalid value for '--url': 'h' is not a server URL (no port)"),
    (["--url", "ftp://h:21"], "Invalid value for '--url': 'ftp://h:21' is not a server URL (scheme 'ftp')"),
    (["--instance", "vm", "--zone", "z"], "--instance needs --project"),
    (["--instance", "vm", "--zone", "z", "--project", "p", "--smoke", "tools"], "--smoke works with --url only"),
    (["--url", "http://h", "--model", "m", "--smoke", "toolz"], "--smoke"),
    (["--url", "http://h", "--model", "m", "--timeout", "0"], "--timeout"),
    (["--url", "http://h", "--model", "m", "--config-hash", "abc"], "--config-hash works with --instance only"),
])
def test_bad_options_are_usage_errors_naming_the_option(args: list[str], message: str):
    code, _, stderr = run_gate(*args)
    assert code == 2 and message in stderr


@pytest.mark.parametrize("mode, args, expected", [
    ("url", ["--url", "http://h", "--model", "m"], 0.5),  # the 2 s lag target
    # the guest-attribute budget the VM's writes share: 4 reads a minute (facts.GATE_POLL_S)
    ("instance", ["--instance", "vm", "--zone", "z", "--project", "p"], 15.0),
    ("url", ["--url", "http://h", "--model", "m", "--interval", "7"], 7.0),
    ("instance", ["--instance", "vm", "--zone", "z", "--project", "p", "--interval", "7"], 7.0),
])
def test_the_poll_interval_defaults_per_mode_and_interval_overrides(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                                   args: list[str], expected: float):
    intervals: list[float] = []

    def watch(*positional: object) -> gate_module.Verdict:
        intervals.append(positional[5] if mode == "url" else positional[3])
        return gate_module.Verdict(True, 0.0, {})

    monkeypatch.setattr(gate_module, "watch_url" if mode == "url" else "gate_instance", watch)
    code, _, _ = run_gate(*args)
    assert code == 0 and intervals == [expected]


FACTS_CHANGED = """
import inspect, json
import tpuserve.facts
tpuserve.facts.READY_TIMEOUT_S = 99.0
from tpuserve.observe.gate import gate, watch_instance, watch_url
print(json.dumps([next(p.default for p in gate.params if p.name == "timeout_s"),
                  *(inspect.signature(f).parameters["timeout_s"].default for f in (watch_url, watch_instance))]))
"""


def test_the_default_timeout_is_the_stacks_ready_timeout():
    """Changed in tpuserve.facts, every gate timeout default changes with it."""
    completed = subprocess.run([sys.executable, "-c", FACTS_CHANGED], capture_output=True, text=True, check=True)
    assert json.loads(completed.stdout) == [99.0, 99.0, 99.0]


def test_console_reporter_prints_each_stage_as_it_arrives():
    from rich.console import Console

    console = Console(record=True, width=100)
    with console.status("x") as status:
        reporter = ConsoleReporter(console, status)
        reporter.stage("pulling-image", 41.0)
        reporter.waiting("loading-model", "in loading-model", 1500)
        live_line = str(status.status)
    printed = console.export_text()
    assert "pulling-image" in printed and "41.0 s" in printed
    assert live_line.startswith("loading-model: in loading-model")


def test_the_gate_sends_no_api_key_even_when_one_is_in_the_environment(monkeypatch: pytest.MonkeyPatch):
    """Every stage goes the same way: a key on the completion alone would let /v1/models and the chat disagree."""
    monkeypatch.setenv("TPUSERVE_API_KEY", "sk-not-for-the-gate-0123456789")
    with FakeServer(openai_routes(Response(200, chat_body("Hi")))) as fake, requests.Session() as http:
        assert watch_url(http, fake.url, MODEL, **FAST).ready
    assert [r.headers.get("Authorization") for r in fake.requests] == [None] * 3


def test_instance_mode_without_credentials_is_a_verdict_not_a_traceback(monkeypatch: pytest.MonkeyPatch):
    def no_credentials() -> requests.Session:
        raise gce.MissingCredentials("no Google application-default credentials; run `gcloud auth "
                                     "application-default login`")

    monkeypatch.setattr(gce, "adc_session", no_credentials)
    code, stdout, _ = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project)
    assert code == 1 and "application-default login" in json.loads(stdout[-1])["reason"]


# --- in-place reconfiguration: a served-config change on the same VM --------------------------------------------

# After a change from config abc123 to def456: the VM's supervisor writes `since`, then the new stage, then the new
# hash (vm/supervisor.py, Supervisor.begin). Until then the attributes still describe the old config.
OLD_FAILED = {**stage_snapshots(RECORDED_BOOT[:2] + [("failed", 1795900100)], reason=FAILED_REASON)[-1]}
OLD_SERVING = stage_snapshots(RECORDED_BOOT)[-1]


@pytest.mark.parametrize("old", [OLD_SERVING, OLD_FAILED], ids=["serving", "failed"])
def test_a_terminal_stage_of_the_previous_config_does_not_end_the_wait_for_the_new_one(old):
    status = read_boot(old, expected_config_hash="def456")
    assert not status.done
    assert status.detail == f"reports config abc123 ({old['stage']}), waiting for def456"


def test_a_failure_of_the_expected_config_still_ends_the_wait_at_once():
    assert read_boot({**OLD_FAILED, "config-hash": "def456"}, "def456").done


def test_a_reconfiguration_has_a_timeline_of_its_own_from_since():
    changed_at = 1795903000
    attributes = {**OLD_SERVING, "since": str(changed_at), "stage": "serving", "config-hash": "def456",
                  "at-pulling-image": str(changed_at), "at-starting-server": str(changed_at + 4),
                  "at-loading-model": str(changed_at + 5), "at-serving": str(changed_at + 80)}
    # installing-docker and fetching-token happened at boot, before `since`: not part of this run.
    assert boot_timeline(attributes) == {"pulling-image": 0, "starting-server": 4, "loading-model": 5, "serving": 80}
    assert read_boot(attributes, "def456").ready


def test_a_restarting_server_is_waited_for_with_its_reason():
    attributes = {**OLD_SERVING, "stage": "restarting", "reason": "container exited (code 137) after serving"}
    assert read_boot(attributes, "abc123") == BootStatus(
        "restarting", done=False, detail="restarting: container exited (code 137) after serving")


def test_the_verdict_says_where_each_part_came_from(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    warm = {"cache": "disk: warm (61 GB free)", "image": "cached", "weights": "cached",
            "compile-cache": "412 entries before, 415 after"}
    with replaying_compute(stage_snapshots(RECORDED_BOOT, **warm)) as fake:
        code, stdout, stderr = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project,
                                        "--compute-url", fake.url, "--interval", "0.02", "--config-hash", "abc123")
    assert code == 0
    assert json.loads(stdout[-1])["sources"] == warm
    assert "compile cache: 412 entries before, 415 after" in stderr and "image: cached" in stderr


# --- what each stage sends, and through what ------------------------------------------------------------------------

class RecordingSession(requests.Session):
    """A session that notes each request's timeout: every stage must go through the caller's session, with a
    timeout (a request without one could outlive the gate's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[object] = []

    def request(self, method, url, *args, **kwargs):  # type: ignore[override]
        self.timeouts.append(kwargs.get("timeout"))
        return super().request(method, url, *args, **kwargs)


def test_smoke_checks_send_exactly_the_documented_requests_through_the_callers_session():
    with FakeServer(openai_routes(Response(200, chat_body("Hi")))) as fake, RecordingSession() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=["tools", "vision"], timeout_s=3.0, interval_s=0.02)
    assert verdict.ready
    assert len(http.timeouts) == len(fake.requests) == 5
    assert all(isinstance(t, float) and 0 < t <= 3.0 for t in http.timeouts), http.timeouts
    completion, tools, vision = [r.json() for r in fake.requests[2:]]
    assert completion == {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    assert tools == {"model": MODEL, "messages": [{"role": "user", "content": "What time is it in Paris?"}],
                     "max_tokens": 8, "tool_choice": "auto", "tools": [{"type": "function", "function": {
                         "name": "get_time", "description": "Current time in a city.",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                        "required": ["city"]}}}]}
    assert vision == {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_data_uri("red-square.png")}},
        {"type": "text", "text": "What colour is this?"}]}]}


def tool_call_body() -> dict:
    body = chat_body(None)
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]
    return body


@pytest.mark.parametrize("smoke, reply, reason", [
    ("tools", chat_body(""), "request with tools returned neither text nor tool calls"),
    ("vision", chat_body(""), "request with an image returned empty content and no reasoning"),
    ("vision", tool_call_body(), "request with an image returned empty content and no reasoning"),
])
def test_a_smoke_check_answered_with_nothing_is_waited_out_naming_what_was_missing(smoke, reply, reason):
    def chat(request: Request) -> Response:
        first_turn = request.json()["messages"][0]["content"]
        return Response(200, chat_body("Hi") if first_turn == "Say hello." else reply)

    routes = openai_routes(Response(200))
    routes[("POST", "/v1/chat/completions")] = chat
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=[smoke], timeout_s=0.3, interval_s=0.02)
    assert not verdict.ready
    assert verdict.reason == f"timed out after 0.3 s in stage smoke-{smoke}: {reason}"


def test_a_tool_call_without_text_passes_the_tools_smoke():
    def chat(request: Request) -> Response:
        return Response(200, tool_call_body() if request.json().get("tools") else chat_body("Hi"))

    routes = openai_routes(Response(200))
    routes[("POST", "/v1/chat/completions")] = chat
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, smoke=["tools"], **FAST)
    assert verdict.ready and list(verdict.stages) == ["health", "models", "completion", "smoke-tools"]


def test_the_live_status_line_counts_seconds_since_the_gate_started():
    from rich.console import Console

    console = Console(record=True, width=100)
    with console.status("x") as status:
        reporter = ConsoleReporter(console, status)
        reporter.since -= 42.2  # as if the gate had started 42 s ago
        reporter.waiting("loading-model", "in loading-model", 1500)
        assert str(status.status) == "loading-model: in loading-model (42 s; gives up at 1500 s)"


def test_instance_mode_prints_each_stage_and_waits_for_the_config_hash_it_was_given(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake:
        code, stdout, stderr = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project,
                                        "--compute-url", fake.url, "--interval", "0.02", "--timeout", "0.5",
                                        "--config-hash", "a-newer-config")
    assert code == 1
    verdict = json.loads(stdout[-1])
    assert verdict["reason"] == ("timed out after 0.5 s in stage serving: reports config abc123 (serving), waiting "
                                 "for a-newer-config")
    assert [line.split()[1] for line in stderr.splitlines() if line.startswith("✓")] == [
        stage for stage, _ in RECORDED_BOOT]


def test_missing_credentials_is_a_verdict_of_no_time_and_no_stage(monkeypatch: pytest.MonkeyPatch):
    def no_credentials() -> requests.Session:
        raise gce.MissingCredentials("no Google application-default credentials")

    monkeypatch.setattr(gce, "adc_session", no_credentials)
    code, stdout, _ = run_gate("--instance", VM.name, "--zone", VM.zone, "--project", VM.project)
    assert code == 1
    assert json.loads(stdout[-1]) == {"ready": False, "elapsed_s": 0.0, "stages": {},
                                      "reason": "no Google application-default credentials"}


def test_the_json_verdict_rounds_to_milliseconds_and_names_sources_only_when_known():
    verdict = gate_module.Verdict(False, 12.34567, {"health": 0.00049, "models": 1.23456}, "stage models: gone")
    assert verdict.json_line() == ('{"ready": false, "elapsed_s": 12.346, "stages": {"health": 0.0, "models": 1.235}, '
                                   '"reason": "stage models: gone"}')
    with_sources = gate_module.Verdict(True, 1.0, {}, sources={"image": "cached"})
    assert json.loads(with_sources.json_line())["sources"] == {"image": "cached"}


def test_line_output_prints_details_as_they_are():
    """A server's answer may hold [brackets] or numbers: they are printed literally, never styled or eaten as markup."""
    from rich.console import Console

    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    reporter = gate_module.ConsoleReporter(console, clock=lambda: 1000.0)
    reporter.waiting("health", "/health answered [bold]503[/bold] at 10.0.0.7", 60)
    printed = console.export_text(styles=True)
    assert printed == "… health: /health answered [bold]503[/bold] at 10.0.0.7 (0 s; gives up at 60 s)\n"


def timeline_rows(verdict: gate_module.Verdict, url_mode: bool) -> list[str]:
    from rich.console import Console

    console = Console(record=True, width=60)
    gate_module.print_timeline(console, verdict, url_mode)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_url_mode_times_each_stage_from_the_one_before_it():
    """Issue #27, item 8: URL mode records when each stage *passed*; the table took the time to the next stage as
    the stage's own, shifting the 'took' column by one stage (health 'took' the models wait)."""
    assert timeline_rows(gate_module.Verdict(True, 9.0, {"health": 0.25, "models": 1.5, "completion": 8.75}),
                         url_mode=True) == [
        "boot timeline",  # on the left, not centred over the table
        "┏━━━━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━┓",
        "┃ stage      ┃ passed at (s) ┃ took (s) ┃",
        "┡━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━┩",
        "│ health     │           0.2 │      0.2 │",
        "│ models     │           1.5 │      1.2 │",
        "│ completion │           8.8 │      7.2 │",
        "└────────────┴───────────────┴──────────┘"]


def test_instance_mode_times_each_stage_to_the_next_one():
    """The VM reports when each stage *began* (at-<stage>): a stage took until the next began; `serving` goes on."""
    assert timeline_rows(gate_module.Verdict(True, 30.0, {"pulling-image": 0.0, "loading-model": 10.0,
                                                          "serving": 25.0}), url_mode=False)[2:7] == [
        "┃ stage         ┃ began at (s) ┃ took (s) ┃",
        "┡━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━┩",
        "│ pulling-image │          0.0 │     10.0 │",
        "│ loading-model │         10.0 │     15.0 │",
        "│ serving       │         25.0 │          │"]


def test_a_timeline_with_no_stage_says_so():
    from rich.console import Console

    console = Console(record=True, width=60)
    gate_module.print_timeline(console, gate_module.Verdict(False, 1.0, {}, "timed out"), url_mode=True)
    assert console.export_text() == "boot timeline: no stage reached\n"


@pytest.mark.parametrize("mode, message", [
    (dict(url=None, instance=None), "give exactly one of --url (a server) or --instance (a VM)"),
    (dict(url="http://h:8000", instance="vm"), "give exactly one of --url (a server) or --instance (a VM)"),
    (dict(url="http://h:8000", config_hash="abc"),
     "--config-hash works with --instance only (a server's URL does not report it)"),
    (dict(instance="vm"), "--instance needs --zone and --project"),
    (dict(instance="vm", project="p"), "--instance needs --zone"),
    (dict(instance="vm", zone="z"), "--instance needs --project"),
    (dict(instance="vm", zone="z", project="p", smoke="tools"),
     "--smoke works with --url only (the VM runs its own checks)"),
])
def test_each_mode_mistake_is_one_usage_line(mode: dict, message: str):
    options = {"url": None, "model": None, "instance": None, "zone": None, "project": None, "smoke": "",
               "config_hash": None, **mode}
    with pytest.raises(click.UsageError) as raised:
        gate_module.check_mode(**options)
    assert raised.value.message == message


@pytest.mark.parametrize("mode", [dict(url="http://h:8000", smoke="tools"),
                                  dict(instance="vm", zone="z", project="p", config_hash="abc")])
def test_a_complete_mode_passes(mode: dict):
    options = {"url": None, "model": None, "instance": None, "zone": None, "project": None, "smoke": "",
               "config_hash": None, **mode}
    assert gate_module.check_mode(**options) is None


def test_unknown_smoke_checks_are_all_named_with_the_choices():
    with pytest.raises(click.BadParameter) as raised:
        parse_smoke("tool,vision,audio")
    assert raised.value.message == "unknown check tool, audio; choose from tools, vision"


@pytest.mark.parametrize("attributes, expected, status", [
    ({}, None, BootStatus("booting", done=False, detail="no guest attributes yet")),
    ({"stage": ""}, "def456", BootStatus("booting", done=False, detail="no guest attributes yet")),
    ({"stage": "loading-model", "config-hash": "abc123"}, "def456",
     BootStatus("loading-model", done=False, detail="reports config abc123 (in loading-model), waiting for def456")),
    ({"stage": "serving"}, "def456",
     BootStatus("serving", done=False, detail="reports config none (serving), waiting for def456")),
    ({"stage": "serving", "config-hash": "abc123"}, "", BootStatus("serving", done=True, ready=True)),
    ({"stage": "failed", "reason": "no space left on device"}, None,
     BootStatus("failed", done=True, detail="boot failed: no space left on device")),
    ({"stage": "failed", "at-failed": "1795900100", "at-loading-model": "1795900050"}, None,
     BootStatus("failed", done=True, detail="boot failed during loading-model: no reason given")),
    ({"stage": "restarting"}, None, BootStatus("restarting", done=False, detail="restarting: no reason given")),
    ({"stage": "loading-model", "reason": "downloading weights"}, None,
     BootStatus("loading-model", done=False, detail="in loading-model: downloading weights")),
])
def test_what_the_guest_attributes_say(attributes, expected, status):
    assert read_boot(attributes, expected) == status


@pytest.mark.parametrize("attributes, timeline", [
    ({"at-b": "5", "at-a": "0"}, {"a": 0.0, "b": 5.0}),  # no `since`: every stage counts
    ({"since": "soon", "at-b": "5", "at-a": "0"}, {"a": 0.0, "b": 5.0}),  # an unreadable `since` too
    ({"since": "100", "at-old": "99", "at-new": "100", "at-later": "130.5"}, {"new": 0.0, "later": 30.5}),
    ({"since": "100", "at-old": "99"}, {}),
    ({"at-broken": "12x", "at-a": "0", "at-b": "5"}, {"a": 0.0, "b": 5.0}),  # a half-written value is skipped
    ({"stage": "serving", "config-hash": "abc"}, {}),
])
def test_the_timeline_counts_from_the_first_stage_of_the_current_run(attributes, timeline):
    assert boot_timeline(attributes) == timeline
    assert list(boot_timeline(attributes)) == list(timeline)


def test_an_unreachable_compute_api_is_waited_out_in_the_last_known_stage():
    with requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, f"http://127.0.0.1:{idle_port()}"), VM, timeout_s=0.3,
                                 interval_s=0.02)
    assert not verdict.ready
    assert verdict.reason == "timed out after 0.3 s in stage booting: Compute API unreachable (ConnectionError)"
    assert verdict.serial_tail.startswith("(serial console unavailable: ")


def test_a_transient_api_error_mid_boot_keeps_the_stage_it_was_in():
    reporter = RecordingReporter()
    with replaying_compute(stage_snapshots(RECORDED_BOOT[:5])) as fake, requests.Session() as http:
        client = ComputeClient(http, fake.url)
        unavailable = Response(503, {"error": {"code": 503, "message": "Backend unavailable"}})
        route = ("GET", f"{VM_PATH}/getGuestAttributes")
        # the 404, the five snapshots, the last one read three more times; then the API fails until the deadline
        fake.routes[route] = after_calls(1 + 5 + 3, fake.routes[route], lambda request: unavailable)
        verdict = watch_instance(client, VM, timeout_s=0.6, interval_s=0.02, reporter=reporter)
    assert verdict.reason == ("timed out after 0.6 s in stage loading-model: Compute API HTTP 503: Backend "
                              "unavailable")
    assert reporter.stages == [stage for stage, _ in RECORDED_BOOT[:5]]  # each once, however often it is read


def test_an_api_error_on_the_instance_itself_is_the_verdict_when_waiting_cannot_fix_it():
    denied = Response(403, {"error": {"code": 403, "message": "Permission 'compute.instances.get' denied"}})
    routes = {("GET", f"{VM_PATH}/getGuestAttributes"): lambda request: NOT_FOUND,
              ("GET", VM_PATH): lambda request: denied}
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=30, interval_s=0.02)
    assert not verdict.ready and verdict.elapsed_s < 1
    assert verdict.reason == "Compute API HTTP 403: Permission 'compute.instances.get' denied"


def test_a_failed_boot_whose_console_cannot_be_read_says_so():
    snapshots = stage_snapshots(RECORDED_BOOT[:2] + [("failed", 1795900100)], reason=FAILED_REASON)
    with replaying_compute(snapshots) as fake, requests.Session() as http:
        fake.routes[("GET", f"{VM_PATH}/serialPort")] = lambda request: Response(
            503, {"error": {"code": 503, "message": "Backend unavailable"}})
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=30, interval_s=0.02)
    assert verdict.serial_tail == "(serial console unavailable: Compute API HTTP 503: Backend unavailable)"


@pytest.mark.parametrize("models, reason", [
    (Response(401, {"error": "Unauthorized"}),  # vLLM's own 401 (vllm/entrypoints/serve/middleware/authenticate.py)
     "stage models: {url}/v1/models answered HTTP 401: Unauthorized; no API key was sent ($TPUSERVE_API_KEY is not "
     "set): export TPUSERVE_API_KEY=<the key the server was started with> (vLLM's --api-key or VLLM_API_KEY), or "
     "name another variable with --api-key-env (waiting cannot change this answer)"),
    (Response(503, {"error": {"message": "loading"}}),
     "timed out after 30 s in stage models: /v1/models answered HTTP 503"),
    (Response(200, {"object": "list", "data": "gemma"}),
     "timed out after 30 s in stage models: /v1/models lists no model"),
    (Response(200, ["gemma"]), "timed out after 30 s in stage models: /v1/models lists no model"),
])
def test_the_models_stage(models: Response, reason: str):
    routes = openai_routes(Response(200, chat_body("Hi")))
    routes[("GET", "/v1/models")] = lambda request: models
    routes[("GET", "/health")] = lambda request: Response(200)
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, **WAITED_OUT)
    assert verdict.reason == reason.format(url=fake.url) and list(verdict.stages) == ["health"]


def test_an_unhealthy_server_is_waited_out_naming_its_status():
    routes = openai_routes(Response(200, chat_body("Hi")))
    routes[("GET", "/health")] = lambda request: Response(503)
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, **WAITED_OUT)
    assert verdict.reason == "timed out after 30 s in stage health: /health answered HTTP 503"


def test_a_timeout_names_what_the_stage_answered_last():
    routes = openai_routes(Response(200, chat_body("Hi")))
    routes[("GET", "/health")] = after_calls(3, lambda request: Response(503), lambda request: Response(500))
    with FakeServer(routes) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, timeout_s=0.4, interval_s=0.02)
    assert verdict.reason == "timed out after 0.4 s in stage health: /health answered HTTP 500"


def test_a_first_request_cut_by_the_deadline_still_says_what_happened():
    released = threading.Event()

    def stalled(request: Request) -> Response:
        released.wait(5)
        return Response(200)

    with FakeServer({("GET", "/health"): stalled}) as fake, requests.Session() as http:
        try:
            verdict = watch_url(http, fake.url, MODEL, timeout_s=0.3, interval_s=0.02)
        finally:
            released.set()
    assert verdict.reason == "timed out after 0.3 s in stage health: no answer (ReadTimeout)"


def test_an_empty_completion_is_waited_out_naming_what_was_missing():
    with FakeServer(openai_routes(Response(200, chat_body("  ")))) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, MODEL, timeout_s=0.3, interval_s=0.02)
    assert verdict.reason == ("timed out after 0.3 s in stage completion: chat completion returned empty content "
                              "and no reasoning")


def test_url_mode_reports_what_it_waits_for_and_a_fatal_answer_is_a_false_verdict():
    reporter = RecordingReporter()
    with FakeServer(openai_routes(Response(200, chat_body("Hi")), models=("other/model",))) as fake, \
            requests.Session() as http:
        routes_models = fake.routes[("GET", "/v1/models")]
        fake.routes[("GET", "/v1/models")] = lambda request: (
            Response(503) if sum(r.path == "/v1/models" for r in fake.requests) < 2 else routes_models(request))
        verdict = watch_url(http, fake.url, MODEL, timeout_s=30, interval_s=0.02, reporter=reporter)
    assert verdict.ready is False and json.loads(verdict.json_line())["ready"] is False
    assert reporter.waits == [("models", "/v1/models answered HTTP 503")]


def test_a_vm_that_reports_stages_is_not_asked_for_its_status():
    """Each poll is a Compute API call: the instance itself is read only while there are no guest attributes."""
    with replaying_compute(stage_snapshots(RECORDED_BOOT), not_yet=1) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, **FAST)
    assert verdict.ready
    assert sum(r.path == VM_PATH for r in fake.requests) == 1


def test_an_instance_wait_with_no_time_left_says_it_read_nothing():
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, fake.url), VM, timeout_s=0, interval_s=0.02)
    assert verdict.ready is False and json.loads(verdict.json_line())["ready"] is False
    assert verdict.reason == "timed out after 0 s in stage booting: not read yet"
    assert [r.path for r in fake.requests] == [f"{VM_PATH}/serialPort"]


# --- issue #27, item 3: a wrong port, said plainly, and ended by --connect-timeout ----------------------------

def test_a_refused_connection_is_said_plainly_while_waiting():
    port = idle_port()
    with requests.Session() as http:
        seen: list[str] = []

        class Reporter(gate_module.Reporter):
            def waiting(self, stage: str, detail: str, ends_at_s: float) -> None:
                seen.append(f"{stage}: {detail}")

        watch_url(http, f"127.0.0.1:{port}", MODEL, timeout_s=0.2, interval_s=0.05, reporter=Reporter())
    assert set(seen) == {f"health: nothing listens on 127.0.0.1:{port}, and no process here holds its port yet (vLLM "
                         "binds it as it starts)"}


def test_connections_refused_for_the_connect_timeout_end_the_gate_with_that_verdict():
    port = idle_port()
    started = time.monotonic()
    code, stdout, stderr = run_gate("--url", f"127.0.0.1:{port}", "--connect-timeout", "0.3", "--interval", "0.05")
    assert code == 1 and time.monotonic() - started < 3
    verdict = json.loads(stdout[-1])
    assert verdict["ready"] is False
    assert verdict["reason"] == (f"stage health: nothing listens on 127.0.0.1:{port}, and no process here holds its "
                                 "port: connections refused for 0.3 s (--connect-timeout); is the port right?")
    assert f"not ready: {verdict['reason']}" in " ".join(stderr.split())


def test_a_host_that_does_not_resolve_ends_the_wait_at_once():
    """Issue 34 item 4: a name no resolver knows will not come to exist while the gate waits."""
    with requests.Session() as http:
        verdict = watch_url(http, "http://no-such-host.invalid:8000", MODEL, timeout_s=30, interval_s=0.05,
                            connect_timeout_s=20)
    assert verdict.reason.startswith("stage health: no-such-host.invalid does not resolve (")
    assert verdict.reason.endswith("): is the host right? (waiting cannot change this answer)")
    assert verdict.elapsed_s < 5


def test_a_host_that_cannot_be_reached_counts_as_not_connecting_and_says_so(monkeypatch: pytest.MonkeyPatch):
    def unreachable(self, *args, **kwargs):
        raise requests.ConnectionError("HTTPConnectionPool(host='10.9.9.9', port=8000): Max retries exceeded "
                                       "(Caused by NewConnectionError('...: Failed to establish a new connection: "
                                       "[Errno 113] No route to host'))")

    monkeypatch.setattr(requests.Session, "get", unreachable)
    with requests.Session() as http:
        verdict = watch_url(http, "http://10.9.9.9:8000", MODEL, timeout_s=5, interval_s=0.05, connect_timeout_s=0.2)
    assert verdict.reason == ("stage health: cannot connect to 10.9.9.9:8000 (No route to host): no connection for "
                              "0.2 s (--connect-timeout); is the host right?")


@pytest.mark.real_time
def test_a_server_that_opens_its_port_within_the_connect_timeout_passes():
    """vLLM binds its port at start but listens only once its engine is up (vllm/entrypoints/launchers/launcher.py
    create_server_socket: bind, no listen): refusals before that are a boot, not a wrong port."""
    port = free_local_port()
    bound = socket.socket()
    bound.bind(("127.0.0.1", port))  # as vLLM holds it while the engine loads: connections are refused
    servers: list[FakeServer] = []

    def open_port() -> None:
        bound.close()
        servers.append(FakeServer(openai_routes(Response(200, chat_body("Hello"))), port=port).__enter__())

    opener = threading.Timer(0.4, open_port)
    opener.start()
    try:
        with requests.Session() as http:
            verdict = watch_url(http, f"127.0.0.1:{port}", MODEL, timeout_s=30, interval_s=0.05,
                                connect_timeout_s=20)
    finally:
        opener.join()
        for server in servers:
            server.__exit__()
    assert verdict.ready, verdict.reason
    assert verdict.stages["health"] >= 0.4


def test_refusals_are_counted_only_while_they_last():
    refusals = gate_module.Refusals()
    assert [refusals.note(connected, at) for connected, at in [
        (False, 10.0), (False, 12.0), (True, 13.0), (False, 20.0), (False, 23.5), (False, 25.0)]] == [
        0.0, 2.0, None, 0.0, 3.5, 5.0]


def test_connect_timeout_is_url_mode_only_and_positive():
    code, _, stderr = run_gate("--instance", "vm", "--zone", "z", "--project", "p", "--connect-timeout", "5")
    assert code == 2 and "--connect-timeout works with --url only" in stderr
    code, _, stderr = run_gate("--url", "127.0.0.1:9", "--connect-timeout", "0")
    assert code == 2 and "--connect-timeout" in stderr


# --- issue #27, item 6: Ctrl-C still ends with the verdict line the help promises -----------------------------

def test_ctrl_c_ends_the_gate_with_its_verdict_line_and_exit_130():
    port = idle_port()
    gate_process = subprocess.Popen(
        [sys.executable, "-m", "tpuserve", "gate", "--url", f"127.0.0.1:{port}", "--connect-timeout", "600",
         "--interval", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = gate_process.stderr.readline()  # off a terminal: one line per change; the first says it is waiting
    assert f"health: nothing listens on 127.0.0.1:{port}, and no process here holds its port yet" in first
    gate_process.send_signal(signal.SIGINT)
    stdout, stderr = gate_process.communicate(timeout=30)
    assert gate_process.returncode == 130, stderr
    verdict = json.loads(stdout.splitlines()[-1])
    assert verdict["ready"] is False and verdict["stages"] == {}
    assert verdict["reason"].startswith("interrupted (Ctrl-C) after ")
    assert verdict["reason"].endswith(f" s, in stage health: nothing listens on 127.0.0.1:{port}, and no process "
                                      "here holds its port yet (vLLM binds it as it starts)")
    assert f"not ready: {verdict['reason']}" in " ".join(stderr.split())
    assert "Traceback" not in stderr and "Aborted" not in stderr


def test_an_interrupted_wait_keeps_the_stages_it_reached():
    tracker = gate_module.Reporter()
    tracker.stage("health", 1.5)
    assert tracker.interrupted().reason.endswith(", after stage health")
    tracker.waiting("models", "/v1/models answered HTTP 503", 1500)
    verdict = tracker.interrupted()
    assert verdict.stages == {"health": 1.5} and verdict.interrupted and not verdict.ready
    assert verdict.reason.endswith(", in stage models: /v1/models answered HTTP 503")


# --- issue 34, item 4: a server that is not vLLM, told from one still booting ----------------------------------

def web_page(request: Request) -> Response:
    """Python's own http.server for a path it has no file for (http.server DEFAULT_ERROR_MESSAGE)."""
    import http.server

    page = http.server.DEFAULT_ERROR_MESSAGE % {"code": 404, "message": "File not found",
                                                "explain": "Nothing matches the given URI"}
    return Response(404, page.encode(), {"Content-Type": "text/html;charset=utf-8"})


@pytest.mark.parametrize("routes, said", [
    ({}, "/health answered HTTP 404 with an HTML page ('Error response'): every vLLM answers /health"),
    ({("GET", "/health"): lambda request: Response(404, {"detail": "Not Found"})},  # FastAPI's 404
     "/health answered HTTP 404: every vLLM answers /health (200, or 503 while it loads) once it accepts "
     "connections, so is this a vLLM server?"),
    ({("GET", "/health"): lambda request: Response(200),  # a health route, but no OpenAI API
      ("GET", "/v1/models"): lambda request: Response(404, {"detail": "Not Found"})},
     "/v1/models answered HTTP 404: vLLM serves /v1/models, so is this a vLLM server?"),
    ({("GET", "/health"): lambda request: Response(200), ("GET", "/v1/models"): lambda request: Response(
        200, "<html><head><title>Index</title></head></html>", {"Content-Type": "text/html"})},
     "/v1/models answered HTTP 200: an HTML page ('Index'), not JSON: is this a vLLM server?"),
], ids=["web server", "another json app", "no models route", "a page for models"])
def test_a_server_that_is_not_vllm_ends_the_wait_at_once(routes: dict, said: str):
    with FakeServer(routes, fallback=web_page) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url, None, timeout_s=30, interval_s=0.05, connect_timeout_s=20)
    assert not verdict.ready and verdict.elapsed_s < 5
    assert said in verdict.reason and verdict.reason.endswith("(waiting cannot change this answer)")
    assert f"{fake.url}/" in verdict.reason  # the address asked
    assert "<html" not in verdict.reason.lower()


def test_a_booting_vllm_holds_its_port_so_its_refusals_do_not_end_the_wait():
    """vLLM binds its port as it starts and listens once its engine is up (vllm/entrypoints/launchers/launcher.py
    setup_server): on this machine a bound port that refuses is a boot, waited for until --timeout, and said so."""
    port = free_local_port()
    bound = socket.socket()
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's create_server_socket does
    bound.bind(("127.0.0.1", port))
    reporter = RecordingReporter()
    try:
        with requests.Session() as http:
            verdict = watch_url(http, f"127.0.0.1:{port}", MODEL, timeout_s=0.6, interval_s=0.05,
                                connect_timeout_s=0.2, reporter=reporter)
    finally:
        bound.close()
    assert verdict.reason == (f"timed out after 0.6 s in stage health: 127.0.0.1:{port} is bound but not listening "
                              "yet: a vLLM loading (it listens once its engine is up)")
    assert set(reporter.ends) == {0.6}  # the spinner says the --timeout ends it, not the --connect-timeout
    assert "is the port right?" not in " ".join(detail for _, detail in reporter.waits)


def test_the_wait_says_when_refusals_end_it():
    port = idle_port()
    reporter = RecordingReporter()
    with requests.Session() as http:
        verdict = watch_url(http, f"127.0.0.1:{port}", MODEL, timeout_s=30, interval_s=0.05, connect_timeout_s=0.3,
                            reporter=reporter)
    assert verdict.reason.endswith("connections refused for 0.3 s (--connect-timeout); is the port right?")
    assert reporter.ends and all(0.3 <= end < 0.4 for end in reporter.ends)  # the first refusal + 0.3 s


def test_https_to_an_http_server_ends_the_wait_saying_it_speaks_http():
    with FakeServer(openai_routes(Response(200, chat_body("Hi")))) as fake, requests.Session() as http:
        verdict = watch_url(http, fake.url.replace("http://", "https://"), MODEL, timeout_s=30, interval_s=0.05)
    address = fake.url.removeprefix("http://")
    assert verdict.reason == (f"stage health: {address} speaks http, not https: give http://{address} (waiting "
                              "cannot change this answer)")


def test_the_gate_presents_the_key_of_api_key_env_and_names_it_when_refused(monkeypatch: pytest.MonkeyPatch):
    from tests.fakes.fake_openai import require_key

    monkeypatch.setenv("SERVE_KEY", "sk-wrong")
    with require_key(FakeServer(openai_routes(Response(200, chat_body("Hi")))), "sk-serve") as fake:
        code, stdout, _ = run_gate("--url", fake.url, "--api-key-env", "SERVE_KEY", "--timeout", "30")
        assert code == 1
        assert json.loads(stdout[-1])["reason"] == (
            f"stage models: {fake.url}/v1/models answered HTTP 401: Unauthorized; the key in $SERVE_KEY was refused: "
            "set it to the key the server was started with (vLLM's --api-key or VLLM_API_KEY), or name another "
            "variable with --api-key-env (waiting cannot change this answer)")
        monkeypatch.setenv("SERVE_KEY", "sk-serve")
        code, stdout, _ = run_gate("--url", fake.url, "--api-key-env", "SERVE_KEY", "--timeout", "30")
    assert code == 0 and json.loads(stdout[-1])["ready"] is True
