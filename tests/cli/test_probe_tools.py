"""Tool-calling probe against the fake OpenAI server (tests/fakes/fake_openai.py: recorded vLLM-shaped tool calls)."""

from __future__ import annotations

import json

import pytest

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI, completion, tool_call
from tpuserve.client import ChatClient, ChatReply
from tpuserve.measure.probe import FAIL, PASS, SKIPPED, InvalidToolCall, judge_weather_calls, parse_tool_call, run_tools


def verdicts(results: list) -> dict[str, str]:
    return {r.scenario: r.verdict for r in results}


def test_a_capable_server_passes_every_tool_scenario() -> None:
    with FakeOpenAI() as fake:
        results = run_tools(ChatClient(fake.url, FAKE_MODEL))
    assert verdicts(results) == {"simple call": PASS, "result synthesis": PASS, "no-tool restraint": PASS,
                                 "parallel calls": PASS, "underspecified": PASS}
    sent = fake.chat_bodies()
    assert all(body["temperature"] == 0 and [t["function"]["name"] for t in body["tools"]]
               == ["get_weather", "convert_currency"] for body in sent)
    synthesis = sent[1]["messages"]
    assert synthesis[-1]["role"] == "tool" and synthesis[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    parallel = next(r for r in results if r.scenario == "parallel calls")
    assert [call["name"] for call in parallel.evidence["response"]["tool_calls"]] == ["get_weather", "get_weather"]
    assert all(r.latency_s is not None and r.latency_s >= 0 for r in results)


def test_a_server_without_auto_tool_choice_skips_with_the_server_reason() -> None:
    with FakeOpenAI(tools=False) as fake:
        results = run_tools(ChatClient(fake.url, FAKE_MODEL))
    assert set(verdicts(results).values()) == {SKIPPED}
    assert len(results) == 5 and "enable-auto-tool-choice" in results[0].reason
    assert len(fake.chat_bodies()) == 1  # one refusal is enough to know


def test_text_instead_of_a_call_is_an_honest_fail() -> None:
    reply = ChatReply(completion("I think it is sunny."), 0.1)
    verdict, reason = judge_weather_calls(reply, {"paris"})
    assert verdict == FAIL and "no tool call" in reason


def test_one_call_where_two_were_needed_fails() -> None:
    reply = ChatReply(completion(None, tool_calls=[tool_call("get_weather", {"city": "Paris"})]), 0.1)
    verdict, reason = judge_weather_calls(reply, {"paris", "tokyo"})
    assert verdict == FAIL and "expected ['paris', 'tokyo']" in reason


@pytest.mark.parametrize("call, message", [
    (tool_call("get_weather", {"town": "Paris"}), "Additional properties"),
    (tool_call("get_weather", {}), "'city' is a required property"),
    (tool_call("convert_currency", {"amount": 5, "from_currency": "euro", "to_currency": "USD"}), "does not match"),
    (tool_call("book_flight", {}), "unknown tool 'book_flight'"),
    ({"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{city: Paris"}}, "not JSON"),
])
def test_arguments_are_validated_against_the_tool_schema(call: dict, message: str) -> None:
    with pytest.raises(InvalidToolCall, match=message):
        parse_tool_call(call)


def test_valid_arguments_are_returned_parsed() -> None:
    call = tool_call("convert_currency", {"amount": 12.5, "from_currency": "EUR", "to_currency": "JPY"})
    assert parse_tool_call(call) == ("convert_currency", json.loads(call["function"]["arguments"]))
