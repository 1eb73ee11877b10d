"""tpuserve.client against the fake OpenAI server (tests/fakes/fake_openai.py: recorded vLLM-shaped responses)."""

from __future__ import annotations

import re

import jsonschema
import pytest

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI, completion
from tests.fakes.httpfake import FakeServer, Response
from tpuserve.client import (ChatClient, ChatReply, EndpointError, OutputTruncated, SchemaNotEnforced, api_base,
                             looks_cut_off, validated_json)
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


def test_served_card_is_the_first_listed() -> None:
    with FakeOpenAI() as fake:
        assert served_card(fake.url, None)["id"] == FAKE_MODEL


@pytest.mark.parametrize("body", [{"choices": []}, {"object": "error"}, "not json"], ids=["no-choices", "no-key",
                                                                                          "text"])
def test_a_200_that_is_no_chat_completion_is_an_endpoint_error(body: object):
    """Recorded-shape fake: a proxy or broken server answering 200 without choices[0].message."""
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, body)}) as fake, \
            pytest.raises(EndpointError, match="without a message") as raised:
        ChatClient(fake.url, "m").chat([{"role": "user", "content": "hi"}])
    assert raised.value.status == 200


# --- issue #12: every verdict's words and attributes pinned; limits from the valid side; timeouts that bite ----------

import json  # noqa: E402
import time  # noqa: E402

import requests  # noqa: E402

from tpuserve.client import (ModelNotServed, NoModelServed, error_message, padding_hint, pick_model,  # noqa: E402
                             served_card)


def stalled(path: str, seconds: float = 0.6) -> FakeServer:
    method = "GET" if path.endswith("models") else "POST"

    def slow(request):
        time.sleep(seconds)
        return Response(200, {"data": [{"id": "m"}]} if method == "GET" else completion("late"))

    return FakeServer({(method, path): slow})


def test_every_request_honours_the_timeout() -> None:
    with stalled("/v1/chat/completions") as fake, pytest.raises(requests.Timeout):
        ChatClient(fake.url, "m", timeout_s=0.2).chat(PROMPT)
    with stalled("/v1/models") as fake, pytest.raises(requests.Timeout):
        ChatClient(fake.url, "m", timeout_s=0.2).model_cards()
    with stalled("/v1/models") as fake, pytest.raises(requests.Timeout):
        served_card(fake.url, None, timeout_s=0.2)


def test_latency_is_measured_for_answers_and_errors() -> None:
    routes = {("POST", "/v1/chat/completions"): lambda request: Response(200, completion("hi"))}
    with FakeServer(routes) as fake:
        reply = ChatClient(fake.url, "m").chat(PROMPT)
    assert 0 <= reply.latency_s < 5
    for status, body in ((500, {"error": {"message": "boom"}}), (200, {"object": "error"})):
        with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(status, body)}) as fake, \
                pytest.raises(EndpointError) as raised:
            ChatClient(fake.url, "m").chat(PROMPT)
        assert raised.value.latency_s is not None and 0 <= raised.value.latency_s < 5


def test_an_explicit_empty_key_sends_no_authorization_even_with_the_environment_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSERVE_API_KEY", "from-env")
    with FakeServer({("GET", "/v1/models"): lambda request: Response(200, {"data": [{"id": "m"}]})}) as fake:
        ChatClient(fake.url, "m", api_key="").model_cards()
        served_card(fake.url, None, api_key="given")
    assert [r.headers.get("Authorization") for r in fake.requests] == [None, "Bearer given"]


def test_the_endpoint_error_carries_status_message_and_latency() -> None:
    err = EndpointError(503, "overloaded", 1.5)
    assert (str(err), err.status, err.message, err.latency_s) == ("HTTP 503: overloaded", 503, "overloaded", 1.5)


@pytest.mark.parametrize("status, body, message", [
    (500, {"error": {"message": "engine dead", "detail": "ignored"}}, "engine dead"),
    (422, {"detail": "field required"}, "field required"),  # FastAPI's validation shape
    (400, {"error": {"code": 400}}, "{'code': 400}"),
    (502, ["upstream", "down"], "['upstream', 'down']"),
    (503, "overloaded", "overloaded"),
])
def test_error_messages_from_each_body_shape(status: int, body: object, message: str) -> None:
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(status, body)}) as fake, \
            pytest.raises(EndpointError) as raised:
        ChatClient(fake.url, "m").chat(PROMPT)
    assert (raised.value.status, raised.value.message) == (status, message)


def test_a_plain_text_error_is_cut_at_500_characters() -> None:
    response = requests.Response()
    response.status_code, response._content = 502, ("  " + "x" * 600).encode()
    assert error_message(response) == "x" * 500


def test_a_200_without_a_message_quotes_200_characters_of_it() -> None:
    body = {"object": "error", "pad": "y" * 400}
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(200, body)}) as fake, \
            pytest.raises(EndpointError) as raised:
        ChatClient(fake.url, "m").chat(PROMPT)
    assert raised.value.message == f"a body without a message: {json.dumps(body)[:200]}"


def test_model_cards_keep_entries_with_an_id_and_refuse_what_is_no_list() -> None:
    entries = [{"id": "a", "root": "/models/a", "max_model_len": 1024}, {"object": "model"}, "b", {"id": 7}]
    with FakeServer({("GET", "/v1/models"): lambda request: Response(200, {"data": entries})}) as fake:
        client = ChatClient(fake.url, "m")
        assert client.model_cards() == [{"id": "a", "root": "/models/a", "max_model_len": 1024}]
    for body in ({"data": {"id": "a"}}, ["a"], "text", {"data": "x" * 300}):
        with FakeServer({("GET", "/v1/models"): lambda request: Response(200, body)}) as fake, \
                pytest.raises(EndpointError) as raised:
            ChatClient(fake.url, "m").model_cards()
        assert (raised.value.status, raised.value.latency_s) == (200, 0.0)
        sent = body if isinstance(body, str) else json.dumps(body)  # tests/httpfake sends a str as it is
        assert raised.value.message == f"{fake.url}/v1/models: not a model list: {sent[:200]}"
    with FakeServer({("GET", "/v1/models"): lambda request: Response(401, {"error": {"message": "bad key"}})}) as fake, \
            pytest.raises(EndpointError) as raised:
        ChatClient(fake.url, "m", api_key="k").model_cards()
    assert (raised.value.status, raised.value.latency_s) == (401, 0.0)
    assert raised.value.message.startswith("bad key; the key in $TPUSERVE_API_KEY was refused")


def test_pick_model_names_what_is_served() -> None:
    assert pick_model(["a", "b"], None, "here") == "a" and pick_model(["a", "b"], "b", "here") == "b"
    with pytest.raises(ModelNotServed) as not_served:
        pick_model(["a", "b"], "c", "http://h/v1/models")
    assert str(not_served.value) == "'c' is not served by http://h/v1/models, which serves a, b"
    with pytest.raises(NoModelServed) as none:
        pick_model([], None, "http://h/v1/models")
    assert str(none.value) == "http://h/v1/models lists no model"


def test_an_empty_answer_is_empty_content() -> None:
    assert ChatReply(completion(None, reasoning="  "), 0.1).answer() == ("content", "")


@pytest.mark.parametrize("text, hint", [
    ("a  b", ""),  # exactly half whitespace is not "mostly"
    ("ab  c", ""),
    ("a   b", "; it is mostly whitespace: serve with --structured-outputs-config '{\"disable_any_whitespace\": true}'"),
])
def test_the_whitespace_hint_needs_more_than_half(text: str, hint: str) -> None:
    assert padding_hint(text) == hint


def test_valid_json_does_not_look_cut_off() -> None:
    assert looks_cut_off('{"a": 1}') is False and looks_cut_off("[]") is False


def test_each_structured_error_in_full_with_what_came_back() -> None:
    reasoning_cut = ChatReply(completion(None, reasoning="thinking...", finish_reason="length"), 0.1)
    with pytest.raises(OutputTruncated) as raised:
        validated_json(reasoning_cut, ANSWER_SCHEMA)
    assert str(raised.value) == ("the reasoning did not end within max_tokens (the schema applies after it): raise "
                                 "max_tokens")
    assert (raised.value.reply, raised.value.field, raised.value.text) == (reasoning_cut, "reasoning_content",
                                                                           "thinking...")
    cut = ChatReply(completion('{"answer": "ye', finish_reason="length"), 0.1)
    with pytest.raises(OutputTruncated) as raised:
        validated_json(cut, ANSWER_SCHEMA)
    assert str(raised.value) == "output hit max_tokens before the JSON closed"
    assert (raised.value.reply, raised.value.field, raised.value.text) == (cut, "content", '{"answer": "ye')
    free = ChatReply(completion(None, reasoning="yes it is"), 0.1)
    with pytest.raises(SchemaNotEnforced) as raised:
        validated_json(free, ANSWER_SCHEMA)
    assert str(raised.value) == ("schema not enforced: the 200 answer is not JSON (Expecting value at char 0) (the "
                                 "answer was in 'reasoning_content': a reasoning parser took it)")
    assert (raised.value.reply, raised.value.field, raised.value.text) == (free, "reasoning_content", "yes it is")
    breaking = ChatReply(completion('{"answer": "maybe", "confident": true}'), 0.1)
    with pytest.raises(SchemaNotEnforced) as raised:
        validated_json(breaking, ANSWER_SCHEMA)
    assert str(raised.value) == ("schema not enforced: the 200 answer is JSON that breaks the schema at answer: "
                                 "'maybe' is not one of ['yes', 'no']")
    assert (raised.value.reply, raised.value.field, raised.value.text) == (
        breaking, "content", '{"answer": "maybe", "confident": true}')


@pytest.mark.parametrize("document, location", [
    ({"z": "x", "a": "y"}, "a"),  # the first error by path, not by the schema's order
    ({"z": 1, "a": 2, "nested": {"inner": "x"}}, "nested/inner"),
    ([], "(root)"),
])
def test_the_first_schema_error_by_path_is_named(document: object, location: str) -> None:
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "integer"},
                                               "nested": {"type": "object", "properties": {"inner": {"type": "integer"}}}}}
    with pytest.raises(SchemaNotEnforced, match=f"breaks the schema at {re.escape(location)}: "):
        validated_json(ChatReply(completion(json.dumps(document)), 0.1), schema)


def test_structured_passes_the_name_and_parameters_and_validates_against_the_schema() -> None:
    with FakeOpenAI(structured="enforced") as fake:
        client = ChatClient(fake.url, FAKE_MODEL)
        client.structured(PROMPT, ANSWER_SCHEMA, name="verdict", max_tokens=9)
        reply = client.structured_reply(PROMPT, None, thinking=True, chat_template_kwargs={"custom": 1})
    first, second = fake.chat_bodies()
    assert first["response_format"]["json_schema"]["name"] == "verdict" and first["max_tokens"] == 9
    assert second["chat_template_kwargs"] == {"custom": 1, "enable_thinking": True}
    assert reply.content == '{"note":"any object"}'
    with FakeServer({("POST", "/v1/chat/completions"): lambda request: Response(
            200, completion('{"answer": "maybe", "confident": true}'))}) as fake, pytest.raises(SchemaNotEnforced):
        ChatClient(fake.url, "m").structured(PROMPT, ANSWER_SCHEMA)
    with FakeOpenAI(structured="enforced") as fake:
        ChatClient(fake.url, FAKE_MODEL).structured_reply(PROMPT, ANSWER_SCHEMA)
    assert fake.chat_bodies()[0]["response_format"]["json_schema"]["name"] == "answer"


# --- issue #12, second run -----------------------------------------------------------------------------------------

def test_an_answer_a_newer_vllm_puts_in_reasoning_is_read() -> None:
    # vLLM renamed the reasoning parsers' field from `reasoning_content` to `reasoning`; both must be read.
    body = {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "reasoning": '{"answer": "yes", "confident": true}'}}]}
    reply = ChatReply(body, 0.1)
    assert reply.answer() == ("reasoning", '{"answer": "yes", "confident": true}')
    assert reply.reasoning == reply.full_text == '{"answer": "yes", "confident": true}'
    assert validated_json(reply, ANSWER_SCHEMA) == {"answer": "yes", "confident": True}


def test_a_model_lookup_gives_up_after_ten_seconds_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []
    original = requests.Session.get

    def get(self: requests.Session, url: str, **kwargs: object) -> requests.Response:
        timeouts.append(kwargs["timeout"])  # type: ignore[arg-type]
        return original(self, url, **kwargs)

    monkeypatch.setattr(requests.Session, "get", get)
    with FakeServer({("GET", "/v1/models"): lambda request: Response(200, {"data": [{"id": "m"}]})}) as fake:
        assert served_card(fake.url, None) == {"id": "m"}
    assert timeouts == [10]


# Issue 34 item 5: answers no vLLM gives are said as such, naming the URL, never printed raw.
@pytest.mark.parametrize("status, body, headers, said", [
    (200, "<!doctype html><html><head><title>Welcome to nginx!</title></head><body>...</body></html>",
     {"Content-Type": "text/html"}, "answered HTTP 200: an HTML page ('Welcome to nginx!'), not a model list: is "
                                    "this a vLLM server?"),
    (404, {"detail": "Not Found"}, {}, "answered HTTP 404: Not Found: vLLM serves /v1/models, so is this a vLLM "
                                       "server?"),  # FastAPI's 404 (another OpenAI-less app)
    (502, "<html><body>Bad gateway</body></html>", {}, "answered HTTP 502: an HTML page, not JSON: is this a vLLM "
                                                       "server?"),
])
def test_a_model_list_no_vllm_would_answer_names_the_url(status, body, headers, said) -> None:
    with FakeServer({("GET", "/v1/models"): lambda request: Response(status, body, headers)}) as fake, \
            pytest.raises(EndpointError) as raised:
        ChatClient(fake.url, "m").model_cards()
    assert str(raised.value) == f"{fake.url}/v1/models {said}"
    assert raised.value.status == status


def test_a_chat_answered_by_a_web_page_names_the_url_and_not_the_page() -> None:
    page = "<!DOCTYPE HTML>\n<html lang=\"en\"><head><title>Error response</title></head><body>" + "x" * 600
    with FakeServer(fallback=lambda request: Response(405, page, {"Content-Type": "text/html"})) as fake, \
            pytest.raises(EndpointError) as raised:
        ChatClient(fake.url, "m").chat(PROMPT)
    assert str(raised.value) == (f"{fake.url}/v1/chat/completions answered HTTP 405: an HTML page ('Error response'), "
                                 "not JSON: is this a vLLM server?")
