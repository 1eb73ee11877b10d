"""vm/readycheck.py (the gke readiness probe) against fake servers: the same verdicts as `tpuserve gate --url` on
the same servers, stage by stage. Fake server: tests/fake_openai.FakeOpenAI (vLLM-shaped bodies) plus routes for
the lying cases; the real-vLLM run is in tests/e2e/test_readycheck_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI, completion, error
from tests.fakes.httpfake import FakeServer, Response
from tests.fakes.httpfake import idle_port
from tpuserve.client import ChatClient
from tpuserve.observe.gate import run_check, url_stages
from vm import readycheck

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "vm" / "readycheck.py"


def with_health(fake: FakeServer, status: int = 200) -> FakeServer:
    fake.routes[("GET", "/health")] = lambda request: Response(status)
    return fake


def honest() -> FakeServer:
    return with_health(FakeOpenAI())


def answering(body_or_response) -> FakeServer:
    fake = honest()
    response = body_or_response if isinstance(body_or_response, Response) else Response(200, body_or_response)
    fake.routes[("POST", "/v1/chat/completions")] = lambda request: response
    return fake


# name -> (server factory, expected failing stage or None when ready)
SERVERS = {
    "honest": (honest, None),
    "reasoning parser took the tokens": (lambda: answering(completion(None, reasoning="Thinking about hello")), None),
    "health 503 while loading": (lambda: with_health(FakeOpenAI(), 503), "health"),
    "no /health route": (FakeOpenAI, "health"),
    "another model loaded": (lambda: with_health(FakeServer({("GET", "/v1/models"): lambda request: Response(
        200, {"object": "list", "data": [{"id": "google/gemma-4-E4B-it", "object": "model"}]})})), "models"),
    "models 500": (lambda: with_health(FakeServer({("GET", "/v1/models"): lambda request: Response(500, "boom")})),
                   "models"),
    "completion 500": (lambda: answering(error(500, "EngineCore died")), "completion"),
    "empty content": (lambda: answering(completion("   ")), "completion"),
    "200 without choices": (lambda: answering({"object": "chat.completion", "choices": []}), "completion"),
    "200 that is not JSON": (lambda: answering(Response(200, "<html>proxy</html>")), "completion"),
}


def gate_verdict(url: str, model: str) -> tuple[bool, str | None]:
    """What the gate's URL mode decides in one pass: (ready, first failing stage)."""
    with requests.Session() as http:
        client = ChatClient(url, model, api_key="", session=http)
        for name, check in url_stages([]):
            if not run_check(check, client, 5.0).ok:
                return False, name
    return True, None


@pytest.mark.parametrize("case", sorted(SERVERS))
def test_same_verdict_as_the_gate(case: str) -> None:
    factory, failing_stage = SERVERS[case]
    with factory() as fake:
        ok, detail = readycheck.check(fake.url, FAKE_MODEL, timeout_s=5)
        assert (ok, None if ok else detail.split(":", 1)[0]) == (failing_stage is None, failing_stage), detail
        assert gate_verdict(fake.url, FAKE_MODEL) == (failing_stage is None, failing_stage)


def test_completion_is_a_real_request_for_the_model() -> None:
    with honest() as fake:
        assert readycheck.check(f"{fake.url}/v1/", FAKE_MODEL, timeout_s=5) == (
            True, f"ready: {FAKE_MODEL} answered at {fake.url}")
        paths = [(r.method, r.path) for r in fake.requests]
        assert paths == [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")]
        body = fake.chat_bodies()[0]
        assert body["model"] == FAKE_MODEL and body["max_tokens"] == 8
        assert body["messages"] == [{"role": "user", "content": "Say hello."}]


def test_details_say_what_the_server_answered() -> None:
    with answering(error(500, "EngineCore died")) as fake:
        assert readycheck.check(fake.url, FAKE_MODEL, 5) == (
            False, "completion: chat completion answered HTTP 500: EngineCore died")
    with with_health(FakeOpenAI()) as fake:
        assert readycheck.check(fake.url, "other/model", 5) == (
            False, f"models: /v1/models lists ['{FAKE_MODEL}'], not 'other/model'")


def test_nothing_listening_is_not_ready() -> None:
    ok, detail = readycheck.check(f"http://127.0.0.1:{idle_port()}", FAKE_MODEL, 2)
    assert not ok and detail == "health: no answer (ConnectionRefusedError)"


def run_probe(*args: str) -> subprocess.CompletedProcess:
    """As the kubelet runs it: the file alone, with the interpreter's standard library only (-I: no site, no cwd)."""
    return subprocess.run([sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          cwd="/")


def test_probe_exits_0_when_ready_and_1_with_the_reason() -> None:
    with honest() as fake:
        done = run_probe("--url", fake.url, "--model", FAKE_MODEL, "--timeout", "5")
        assert (done.returncode, done.stdout.strip()) == (0, f"ready: {FAKE_MODEL} answered at {fake.url}")
    with answering(completion("")) as fake:
        done = run_probe("--url", fake.url, "--model", FAKE_MODEL)
        assert (done.returncode, done.stdout.strip()) == (
            1, "completion: chat completion returned empty content and no reasoning")


def test_probe_usage_error_exits_2() -> None:
    done = run_probe("--url", "http://127.0.0.1:1")
    assert done.returncode == 2 and "--model" in done.stderr


def keyed(key: str) -> FakeServer:
    """vLLM with an API key: /v1 answers 401 `{"error": "Unauthorized"}` without `Bearer <key>`, /health is open
    (vllm/entrypoints/serve/middleware/authenticate.py, vLLM 0.32)."""
    fake = honest()
    for route, handler in list(fake.routes.items()):
        if route[1].startswith("/v1"):
            fake.routes[route] = (lambda inner: lambda request: inner(request) if request.headers.get(
                "Authorization") == f"Bearer {key}" else Response(401, {"error": "Unauthorized"}))(handler)
    return fake


def test_a_keyed_server_is_ready_only_for_a_check_that_presents_its_key(monkeypatch) -> None:
    with keyed("sk-replica-key") as fake:
        assert readycheck.check(fake.url, FAKE_MODEL) == (False, "models: /v1/models answered HTTP 401")
        assert readycheck.check(fake.url, FAKE_MODEL, api_key="wrong")[0] is False
        assert readycheck.check(fake.url, FAKE_MODEL, api_key="sk-replica-key")[0] is True
        monkeypatch.setenv("REPLICA_KEY", "sk-replica-key")
        probe = subprocess.run([sys.executable, str(SCRIPT), "--url", fake.url, "--model", FAKE_MODEL,
                                "--api-key-env", "REPLICA_KEY"], capture_output=True, text=True)
        assert probe.returncode == 0, probe.stdout
        # The gate's URL mode presents $TPUSERVE_API_KEY the same way.
        from click.testing import CliRunner

        from tpuserve.observe.gate import gate
        monkeypatch.setenv("TPUSERVE_API_KEY", "sk-replica-key")
        before = len(fake.requests)
        result = CliRunner().invoke(gate, ["--url", fake.url, "--model", FAKE_MODEL, "--timeout", "20"])
        assert result.exit_code == 0, result.output
        assert all(request.headers.get("Authorization") == "Bearer sk-replica-key"
                   for request in fake.requests[before:] if request.path.startswith("/v1"))
