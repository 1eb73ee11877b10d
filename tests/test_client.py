"""tpuserve.client against the fake OpenAI server (tests/fake_openai.py: recorded vLLM-shaped responses)."""

from __future__ import annotations

import jsonschema
import pytest

from tests.fake_openai import FAKE_MODEL, FakeOpenAI, completion
from tests.httpfake import FakeServer, Response
from tpuserve.client import (ChatClient, ChatReply, EndpointError, OutputTruncated, SchemaNotEnforced, api_base,
                             looks_cut_off, served_model, validated_json)
from tpuserve.measure.probe import ANSWER_SCHEMA

PROMPT = [{"role": "user", "content": "Is the sky blue?"}]


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_api_base_accepts_urls_with_and_without_v1(url: str) -> None:
    assert api_base(url) == "http://h:8000/v1"


def test_structured_returns_the_validated_document_and_sends_json_schema_mode() -> None:
    with FakeOpenAI(structured="enforced") as fake:
        document = ChatClient(fake.url, FAKE_MODEL).structured(PROMPT, ANSWER_SCHEMA, thinking=False)
    assert document == {"answer": "yes", "confident": True}
    sent = fake.chat_bodies()[0]
    assert sent["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}


def test_structured_without_schema_uses_json_object_mode() -> None:
    with FakeOpenAI(structured="enforced") as fake:
        document = ChatClient(fake.url, FAKE_MODEL).structured(PROMPT, None)
    assert isinstance(document, dict)
    assert fake.chat_bodies()[0]["response_format"] == {"type": "json_object"}
    assert "chat_template_kwargs" not in fake.chat_bodies()[0]


def test_a_200_with_free_text_raises_schema_not_enforced() -> None:
    with FakeOpenAI(structured="ignored") as fake, pytest.raises(SchemaNotEnforced, match="not JSON") as caught:
        ChatClient(fake.url, FAKE_MODEL).structured(PROMPT, ANSWER_SCHEMA)
    assert caught.value.text.startswith("Sure!")


def test_the_silent_skip_of_a_reasoning_parser_server_raises_schema_not_enforced() -> None:
    with FakeOpenAI(structured="reasoning-parser") as fake, pytest.raises(SchemaNotEnforced, match="not JSON"):
        ChatClient(fake.url, FAKE_MODEL).structured(PROMPT, ANSWER_SCHEMA, thinking=True)


def test_free_text_left_in_reasoning_content_is_named_in_the_error() -> None:
    reply = ChatReply(completion(None, reasoning="let me think: yes"), 0.1)
    with pytest.raises(SchemaNotEnforced, match="'reasoning_content'") as caught:
        validated_json(reply, ANSWER_SCHEMA)
    assert caught.value.field == "reasoning_content"


def test_reasoning_cut_by_max_tokens_asks_for_a_bigger_budget() -> None:
    reply = ChatReply(completion(None, reasoning="still thinking", finish_reason="length"), 0.1)
    with pytest.raises(OutputTruncated, match="raise max_tokens"):
        validated_json(reply, ANSWER_SCHEMA)


def test_json_that_breaks_the_schema_names_the_field() -> None:
    reply = ChatReply(completion('{"answer": "maybe", "confident": true}'), 0.1)
    with pytest.raises(SchemaNotEnforced, match="answer: 'maybe' is not one of"):
        validated_json(reply, ANSWER_SCHEMA)


def test_a_json_prefix_cut_by_max_tokens_is_truncation_not_a_skipped_schema() -> None:
    reply = ChatReply(completion('{"answer": "yes", "confi', finish_reason="length"), 0.1)
    with pytest.raises(OutputTruncated, match="max_tokens"):
        validated_json(reply, ANSWER_SCHEMA)


def test_whitespace_padding_points_at_disable_any_whitespace() -> None:
    reply = ChatReply(completion('{"answer":  \t\t\r\r\r\r\r\r\r\r\r\r\r\r\t ', finish_reason="length"), 0.1)
    with pytest.raises(OutputTruncated, match="mostly whitespace.*disable_any_whitespace"):
        validated_json(reply, ANSWER_SCHEMA)


@pytest.mark.parametrize("text, cut", [('{"a": [1, 2', True), ('{"a": "unterminated', True), ("{", True),
                                       ("hello", False), ('{"a" x}', False), ('{"a": 1} trailing', False)])
def test_looks_cut_off(text: str, cut: bool) -> None:
    assert looks_cut_off(text) is cut


def test_a_reasoning_answer_that_validates_is_accepted() -> None:
    reply = ChatReply(completion(None, reasoning='{"answer": "no", "confident": false}'), 0.1)
    assert validated_json(reply, ANSWER_SCHEMA) == {"answer": "no", "confident": False}


def test_http_errors_raise_endpoint_error_with_the_server_message() -> None:
    with FakeOpenAI() as fake, pytest.raises(EndpointError) as caught:
        ChatClient(fake.url, "no-such-model").chat(PROMPT)
    assert caught.value.status == 404
    assert "no-such-model" in caught.value.message


def test_an_invalid_schema_is_rejected_before_sending() -> None:
    with FakeOpenAI() as fake, pytest.raises(jsonschema.SchemaError):
        ChatClient(fake.url, FAKE_MODEL).structured(PROMPT, {"type": "no-such-type"})
    assert fake.requests == []


def test_api_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSERVE_API_KEY", "secret-123")
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, completion("hi"))}) as fake:
        assert ChatClient(fake.url, "m").chat(PROMPT).content == "hi"
    assert fake.requests[0].headers["Authorization"] == "Bearer secret-123"


def test_served_model_is_the_first_listed() -> None:
    with FakeOpenAI() as fake:
        assert served_model(fake.url) == FAKE_MODEL


@pytest.mark.parametrize("body", [{"choices": []}, {"object": "error"}, "not json"], ids=["no-choices", "no-key",
                                                                                          "text"])
def test_a_200_that_is_no_chat_completion_is_an_endpoint_error(body: object):
    """Recorded-shape fake: a proxy or broken server answering 200 without choices[0].message."""
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, body)}) as fake, \
            pytest.raises(EndpointError, match="without a message") as raised:
        ChatClient(fake.url, "m").chat([{"role": "user", "content": "hi"}])
    assert raised.value.status == 200
