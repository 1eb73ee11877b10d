"""Every probe's whole report pinned: verdict, reason, evidence and what was sent, for each way a server answers.

The servers are fakes (tests/fakes/fake_openai.py: recorded vLLM shapes; tests/fakes/httpfake.py for errors and stalls). A report
is compared with a golden file in tests/cli/data/probe/ (latencies reduced to "measured" or null, the fake's port to
PORT), so a change to any verdict, reason or evidence field shows up as a diff to review. To accept an intended
change, run `TPUSERVE_UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/cli/test_probe_goldens.py` and review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI, completion, error, tool_call
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.cli import main
from tpuserve.client import ChatClient
from tpuserve.measure.probe import run_structured, run_tools, run_vision

GOLDENS = Path(__file__).parent / "data" / "probe"


def normalised(value: Any, url: str) -> Any:
    """`value` as JSON with the fake's address replaced by PORT and latencies by "measured"/None."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    text = text.replace(url.removeprefix("http://"), "127.0.0.1:PORT")
    text = re.sub(r"port=\d+", "port=PORT", text)
    text = re.sub(r'"latency_s": \d+(\.\d+)?(e-?\d+)?', '"latency_s": "measured"', text)
    return json.loads(text)


def assert_golden(name: str, value: Any) -> None:
    path = GOLDENS / f"{name}.json"
    if os.environ.get("TPUSERVE_UPDATE_GOLDENS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    assert value == json.loads(path.read_text())


def recorded(fake: FakeServer, golden: str, timeout_s: float = 10.0) -> None:
    """Until the fake recorded as many completions as the golden holds (or the time is up, and the comparison then
    says what is missing): a client that timed out has sent a request that the fake's handler thread may not have
    read yet on a busy machine (a flaky tools-stalled run in CI)."""
    expected = len(json.loads((GOLDENS / f"{golden}.json").read_text())["sent"])
    deadline = time.monotonic() + timeout_s
    while sum(r.path == "/v1/chat/completions" for r in fake.requests) < expected and time.monotonic() < deadline:
        time.sleep(0.02)


def report(results: list, fake: FakeServer) -> dict[str, Any]:
    return normalised({"results": [dataclasses.asdict(r) for r in results],
                       "sent": [r.json() for r in fake.requests if r.path == "/v1/chat/completions"]}, fake.url)


def stalling(seconds: float) -> FakeServer:
    def slow(request: Request) -> Response:
        time.sleep(seconds)
        return Response(200, completion("late"))

    return FakeServer({("POST", "/v1/chat/completions"): slow})


def failing(status: int, message: str) -> FakeServer:
    return FakeServer({("POST", "/v1/chat/completions"): lambda request: error(status, message)})


# --- tools ------------------------------------------------------------------------------------------------------

def wrong_tools(request: Request) -> Response:
    """A server whose model calls tools badly: text, the wrong tool, one city of two, an empty text answer."""
    body = request.json()
    text = json.dumps(body["messages"])
    if "weather in Paris and in Tokyo" in text:
        return Response(200, completion(None, tool_calls=[tool_call("get_weather", {"city": " Paris "})]))
    if "weather in Paris right now" in text and body["messages"][-1]["role"] == "user":
        return Response(200, completion(None, tool_calls=[tool_call("convert_currency", {
            "amount": 1, "from_currency": "EUR", "to_currency": "USD"})]))
    if body["messages"][-1]["role"] == "tool":
        return Response(200, completion("It is sunny."))
    if "convert some money" in text:
        return Response(200, completion(None, tool_calls=[tool_call("convert_currency", {"amount": 0})]))
    return Response(200, completion("   "))


@pytest.mark.parametrize("case", ["capable", "disabled", "wrong", "server-error", "stalled"])
def test_tools_report(case: str) -> None:
    servers = {"capable": lambda: FakeOpenAI(), "disabled": lambda: FakeOpenAI(tools=False),
               "wrong": lambda: FakeServer({("POST", "/v1/chat/completions"): wrong_tools}),
               "server-error": lambda: failing(500, "engine is dead"), "stalled": lambda: stalling(0.5)}
    with servers[case]() as fake:
        client = ChatClient(fake.url, FAKE_MODEL, timeout_s=0.2 if case == "stalled" else 10)
        results = run_tools(client, max_tokens=64 if case == "capable" else None)
        recorded(fake, f"tools-{case}")
    assert_golden(f"tools-{case}", report(results, fake))


def test_a_400_that_is_not_about_tools_is_a_fail_per_scenario() -> None:
    with failing(400, "maximum context length is 1024 tokens") as fake:
        results = run_tools(ChatClient(fake.url, FAKE_MODEL))
    assert [(r.verdict, r.reason) for r in results] == [
        ("fail", "server error: HTTP 400: maximum context length is 1024 tokens")] * 5
    assert len(fake.requests) == 5


# --- structured output --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["enforced", "ignored", "reasoning-parser", "thinking-only", "server-error",
                                  "stalled"])
def test_structured_report(case: str) -> None:
    if case in ("server-error", "stalled"):
        server = failing(503, "overloaded") if case == "server-error" else stalling(0.5)
    else:
        server = FakeOpenAI(structured=case)
    with server as fake:
        client = ChatClient(fake.url, FAKE_MODEL, timeout_s=0.2 if case == "stalled" else 10)
        results = run_structured(client, max_tokens=77 if case == "enforced" else None)
        recorded(fake, f"structured-{case}")
    assert_golden(f"structured-{case}", report(results, fake))


def test_a_truncated_structured_answer_is_a_fail_not_a_skipped_schema() -> None:
    body = completion('{"answer": "yes", "confi', finish_reason="length")
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, body)}) as fake:
        results = run_structured(ChatClient(fake.url, FAKE_MODEL))
    assert_golden("structured-truncated", report(results, fake))


# --- vision -------------------------------------------------------------------------------------------------------

def vision_answers(answers: list[str]) -> FakeServer:
    replies = iter(answers)
    return FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, completion(next(replies)))})


@pytest.mark.parametrize("case", ["ok", "422-then-200", "text-only", "wrong", "server-error", "422-twice"])
def test_vision_report(case: str) -> None:
    servers = {"ok": lambda: FakeOpenAI(), "422-then-200": lambda: FakeOpenAI(vision="422-then-200"),
               "text-only": lambda: FakeOpenAI(vision="text-only"),
               "wrong": lambda: vision_answers(["Four.", "There are five squares.", "  Blue\n"]),
               "server-error": lambda: failing(500, "vision encoder crashed"),
               "422-twice": lambda: failing(422, "Failed to load the multimodal processor")}
    with servers[case]() as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL), max_tokens=9 if case == "ok" else None)
    sent = report(results, fake)
    for body in sent["sent"]:  # the image itself is pinned by tests/cli/test_probe_vision.py; keep its kind here
        for message in body["messages"]:
            for part in message["content"]:
                if part.get("type") == "image_url":
                    part["image_url"]["url"] = part["image_url"]["url"][:len("data:image/png;base64,")]
    assert_golden(f"vision-{case}", sent)


def test_a_vision_server_that_stalls_is_no_answer_for_each_image() -> None:
    with stalling(0.5) as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL, timeout_s=0.2))
    assert [(r.probe, r.scenario, r.verdict, r.latency_s, r.evidence["request"]["image"]) for r in results] == [
        ("vision", "count 3 squares", "fail", None, "squares-3.png (data URI)"),
        ("vision", "count 5 squares", "fail", None, "squares-5.png (data URI)"),
        ("vision", "describe color", "fail", None, "red-square.png (data URI)")]
    assert all(r.reason.startswith("no answer: ReadTimeout: ") for r in results) and len(results) == 3


# --- the command line ---------------------------------------------------------------------------------------------

def test_probe_all_as_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table a person reads, colours included (FORCE_COLOR: rich writes the ANSI styles it would on a terminal)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    with FakeOpenAI(structured="thinking-only", vision="text-only") as fake:
        result = CliRunner().invoke(main, ["probe", "all", "--url", fake.url])
    assert result.exit_code == 0, result.output
    text = re.sub(r"\d+\.\d\d s", "N.NN s", result.stdout)  # stdout: the fake server may log to stderr
    golden = GOLDENS / "probe-all.txt"
    if os.environ.get("TPUSERVE_UPDATE_GOLDENS"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("args, code", [([], 0), (["--strict"], 1)])
def test_strict_fails_on_a_failed_scenario_only(args: list[str], code: int) -> None:
    with FakeOpenAI(structured="ignored") as fake:
        result = CliRunner().invoke(main, ["probe", "structured", "--url", fake.url, "--json", *args])
    assert result.exit_code == code
    document = json.loads(result.stdout)
    assert [r["verdict"] for r in document["results"]] == ["schema not enforced"] * 2 + ["schema not enforced"]
    with FakeOpenAI(vision="text-only") as fake:
        skipped = CliRunner().invoke(main, ["probe", "vision", "--url", fake.url, "--json", *args])
    assert skipped.exit_code == 0  # skipped never fails a run


def test_a_probe_that_cannot_run_at_all_is_an_error_naming_the_first() -> None:
    with failing(500, "engine is dead") as fake:
        fake_models = FakeServer({("GET", "/v1/models"): lambda r: Response(200, {"data": [{"id": FAKE_MODEL}]}),
                                  ("POST", "/v1/chat/completions"): lambda r: error(500, "engine is dead")})
        with fake_models:
            result = CliRunner().invoke(main, ["probe", "tools", "--url", fake_models.url])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (f"Error: the probe could not run against {fake_models.url} "
                                              f"({FAKE_MODEL}): every scenario got an error, the first: server "
                                              "error: HTTP 500: engine is dead")


def test_the_endpoint_options_as_users_see_them() -> None:
    import click

    from tpuserve.measure.probe import endpoint_options

    command = click.command()(endpoint_options(lambda **kwargs: None))
    assert [(p.opts, p.help, p.show_default) for p in command.params][4:] == [
        (["--api-key-env"], "Environment variable holding the server's API key (vLLM's --api-key); keys never go on "
                            "the command line.", True),
        (["--timeout"], "Seconds per request.", True),
        (["--max-tokens"], "Token budget per answer (default: tools 200, structured 512, vision 32).", None),
        (["--json"], "Print the result as one JSON document on stdout, errors too (machine-readable).", None),
        (["--strict"], "Exit 1 when any scenario failed or was not enforced.", None)]
    assert [p.opts for p in command.params][:4] == [["--url"], ["--model"], ["--stack"], ["--stack-outputs"]]
    params = {p.name: p for p in command.params}
    assert (params["api_key_env"].default, params["timeout"].default) == ("TPUSERVE_API_KEY", 120.0)
    assert (params["timeout"].type.min, params["max_tokens"].type.min, params["strict"].is_flag) == (1, 1, True)


def test_requests_timeouts_are_requests_exceptions() -> None:
    """The probes catch requests.Timeout: a ReadTimeout is one (so a stall is 'no answer', not a crash)."""
    assert issubclass(requests.ReadTimeout, requests.Timeout)


def test_kv_compare_as_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    with FakeOpenAI() as a, FakeOpenAI(reply_text=lambda p: f"Answer to: {p}".replace("hash", "hush")) as b:
        result = CliRunner().invoke(main, ["probe", "kv-compare", "--a", a.url, "--b", b.url])
    assert result.exit_code == 0, result.output
    golden = GOLDENS / "kv-compare.txt"
    if os.environ.get("TPUSERVE_UPDATE_GOLDENS"):
        golden.write_text(result.stdout)
    assert result.stdout == golden.read_text()


# --- the verdict helpers at their edges -----------------------------------------------------------------------------

from tests.fakes.fake_openai import completion as chat_completion  # noqa: E402
from tpuserve.client import ChatReply  # noqa: E402
from tpuserve.measure.probe import (InvalidToolCall, ScenarioResult, chat_retrying_422, enforcement_summary,  # noqa: E402
                                    judge_text, judge_weather_calls, parse_tool_call, reply_evidence,
                                    structured_hint)

LONG = "word " * 20  # 100 characters: excerpts cut at 80


def test_judges_quote_80_characters_of_the_answer() -> None:
    text = ChatReply(chat_completion(LONG), 0.1)
    assert judge_weather_calls(text, {"paris"}) == ("fail", f"no tool call (answered in text: '{LONG[:80]}… (+20 "
                                                            "chars)')")
    assert judge_text(text, must_contain="?") == ("fail", f"answer lacks '?': '{LONG[:80]}… (+20 chars)'")
    assert judge_text(text) == ("pass", f"answered in text: '{LONG[:80]}… (+20 chars)'")
    nameless = ChatReply(chat_completion(None, tool_calls=[{"id": "call_0", "type": "function"}]), 0.1)
    assert judge_text(nameless) == ("fail", "called [None] where a text answer was expected")


@pytest.mark.parametrize("call, message", [
    ({"id": "x", "type": "function"}, "called unknown tool ''"),
    ({"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
     "get_weather: arguments break the tool schema: 'city' is a required property"),
])
def test_a_call_without_a_name_or_arguments(call: dict, message: str) -> None:
    with pytest.raises(InvalidToolCall) as raised:
        parse_tool_call(call)
    assert str(raised.value) == message


def test_reasoning_only_answers_are_kept_as_evidence() -> None:
    reply = ChatReply(chat_completion(None, reasoning="thinking\x00"), 0.1)
    assert reply_evidence(reply) == {"finish_reason": "stop", "content": "", "reasoning_content": "thinking\\x00"}


def test_no_structured_results_no_summary_and_the_max_tokens_hint_in_full() -> None:
    assert enforcement_summary([ScenarioResult("tools", "simple call", "pass", "ok")]) == ""
    cut = ScenarioResult("structured", "json_schema thinking=on", "fail", "cut", 1.0,
                         {"response": {"finish_reason": "length"}})
    assert structured_hint([cut]) == (
        "hint: with thinking on the grammar starts only after the reasoning, and this answer hit max_tokens first: "
        "raise --max-tokens (on Gemma 4 with the gemma4 reasoning parser the schema was enforced with thinking on "
        "once the reasoning ended)")


def test_a_422_that_says_text_only_skips_and_a_long_422_is_quoted_to_120() -> None:
    with failing(422, "At most 0 image(s) may be provided in one prompt.") as fake:
        results = run_vision(ChatClient(fake.url, FAKE_MODEL))
    assert [r.verdict for r in results] == ["skipped"] * 3 and len(fake.requests) == 2  # the 422 retried once
    message = "m" * 150
    answers = iter([error(422, message), Response(200, chat_completion("3"))])
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: next(answers)}) as fake:
        reply, note = chat_retrying_422(ChatClient(fake.url, FAKE_MODEL), [{"role": "user", "content": "count"}])
    assert (reply.content, note) == ("3", f"first attempt HTTP 422 ({'m' * 120}… (+30 chars)), retried")


def test_probe_json_is_one_document_and_carries_the_summary_and_hint() -> None:
    with FakeOpenAI(structured="thinking-only") as fake:
        result = CliRunner().invoke(main, ["probe", "structured", "--url", fake.url, "--json"])
    assert result.stdout.startswith('{"results": [{"probe": "structured",') and result.stdout.count("\n") == 1
    document = json.loads(result.stdout)
    assert list(document) == ["results", "structured_summary", "structured_hint"]
    assert document["structured_hint"].startswith("hint: as measured on Gemma 4")


def test_scenario_verdict_and_latency_never_wrap_in_a_narrow_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    with FakeOpenAI(structured="ignored") as fake:
        result = CliRunner().invoke(main, ["probe", "structured", "--url", fake.url])
    lines = result.stdout.splitlines()
    for whole in ("json_schema thinking=off", "schema not enforced"):
        assert any(whole in line for line in lines), result.stdout


@pytest.mark.parametrize("columns", ["60", "80", "120"])
def test_no_word_of_a_reason_is_cut_at_any_width(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    """Issue 34 item 9: at 80 columns the structured table cut its own fix ('--structured-out…'). Every word of
    every reason is printed whole, and scenario and verdict stay on one line."""
    from tests.fakes.fake_openai import completion

    monkeypatch.setenv("COLUMNS", columns)
    fake = FakeOpenAI(structured="enforced")

    def chat(request: Request) -> Response:
        body = request.json()
        if body.get("chat_template_kwargs", {}).get("enable_thinking"):  # padded until max_tokens
            return Response(200, completion('{"answer": "yes",' + " " * 200, finish_reason="length"))
        return Response(200, completion("Sure thing, yes"))  # the schema ignored

    fake.routes[("POST", "/v1/chat/completions")] = chat
    with fake:
        result = CliRunner().invoke(main, ["probe", "structured", "--url", fake.url])
    assert result.exit_code == 0, result.output
    words = result.stdout.split()
    assert "…" not in result.stdout
    for needed in ("--structured-outputs-config", "'{\"disable_any_whitespace\":", "true}'"):
        assert needed in words, result.stdout
    lines = result.stdout.splitlines()
    for whole in ("json_schema thinking=off", "schema not enforced"):
        assert any(whole in line for line in lines), result.stdout
