"""Structured-output probe against the fake OpenAI server (tests/fakes/fake_openai.py): enforced, ignored, and a
reasoning parser that keeps a thinking answer in reasoning_content."""

from __future__ import annotations

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI
from tests.fakes.httpfake import FakeServer, Response
from tpuserve.client import ChatClient
from tpuserve.measure.probe import FAIL, NOT_ENFORCED, PASS, enforcement_summary, run_structured, structured_hint

OFF, ON, OBJECT = "json_schema thinking=off", "json_schema thinking=on", "json_object"


def probe(structured: str) -> tuple[dict[str, str], list, FakeOpenAI]:
    with FakeOpenAI(structured=structured) as fake:
        results = run_structured(ChatClient(fake.url, FAKE_MODEL))
    return {r.scenario: r.verdict for r in results}, results, fake


def test_an_enforcing_server_passes_all_three() -> None:
    verdicts, results, fake = probe("enforced")
    assert verdicts == {OFF: PASS, ON: PASS, OBJECT: PASS}
    bodies = fake.chat_bodies()
    assert [b["chat_template_kwargs"]["enable_thinking"] for b in bodies] == [False, True, False]
    assert [b["response_format"]["type"] for b in bodies] == ["json_schema", "json_schema", "json_object"]
    assert enforcement_summary(results) == (f"schema enforced with: {OFF}, {ON}, {OBJECT}; not enforced with: none")


def test_a_server_that_ignores_response_format_is_not_enforced_not_an_error() -> None:
    verdicts, results, _ = probe("ignored")
    assert verdicts == {OFF: NOT_ENFORCED, ON: NOT_ENFORCED, OBJECT: NOT_ENFORCED}
    assert all("Sure!" in r.evidence["response"]["content"] for r in results)


def test_reasoning_parser_with_thinking_on_is_the_silent_skip() -> None:
    verdicts, results, _ = probe("reasoning-parser")
    assert verdicts == {OFF: PASS, ON: NOT_ENFORCED, OBJECT: PASS}
    thinking = next(r for r in results if r.scenario == ON)
    assert thinking.reason.startswith("schema not enforced: the 200 answer is not JSON")
    assert thinking.evidence["response"]["finish_reason"] == "length"
    assert enforcement_summary(results) == f"schema enforced with: {OFF}, {OBJECT}; not enforced with: {ON}"
    assert structured_hint(results).startswith("hint: with thinking on the grammar starts only after the reasoning, "
                                               "and this answer hit max_tokens first: raise --max-tokens")


def test_the_real_gemma4_behaviour_enforced_with_thinking_on_only_gets_its_hint() -> None:
    verdicts, results, _ = probe("thinking-only")
    assert verdicts == {OFF: NOT_ENFORCED, ON: PASS, OBJECT: NOT_ENFORCED}
    assert "enforced with enable_thinking on and ignored with it off" in structured_hint(results)


def test_no_hint_when_the_schema_is_enforced_or_plainly_ignored() -> None:
    assert structured_hint(probe("enforced")[1]) == ""
    assert structured_hint(probe("ignored")[1]) == ""


def test_a_server_error_is_a_fail_distinct_from_not_enforced() -> None:
    routes = {("POST", "/v1/chat/completions"):
              lambda request: Response(500, {"error": {"message": "EngineCore died", "code": 500}})}
    with FakeServer(routes) as fake:
        results = run_structured(ChatClient(fake.url, "m"))
    assert {r.verdict for r in results} == {FAIL}
    assert all("HTTP 500: EngineCore died" in r.reason for r in results)
    # Issue #11: the summary never says "not enforced with: none" while hiding the scenarios that failed.
    assert enforcement_summary(results) == (f"schema enforced with: none; not enforced with: none; not judged "
                                            f"(failed or skipped): {OFF}, {ON}, {OBJECT}")


# --- issue #12, second run -----------------------------------------------------------------------------------------

def test_json_that_breaks_the_schema_is_not_enforced_and_a_passing_document_is_quoted_to_80_characters() -> None:
    # A server that honours json_object but not json_schema: every answer is some JSON object, never the schema's.
    document = '{"note": "any object will do when only json_object mode is honoured by this server"}'  # 84 chars
    fake = FakeOpenAI()
    fake.routes[("POST", "/v1/chat/completions")] = lambda request: Response(200, {
        "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": document}}]})
    with fake:
        results = run_structured(ChatClient(fake.url, FAKE_MODEL))
    broken = ("schema not enforced: the 200 answer is JSON that breaks the schema at (root): Additional properties are "
              "not allowed ('note' was unexpected)")
    assert [(r.scenario, r.verdict, r.reason) for r in results] == [
        ("json_schema thinking=off", NOT_ENFORCED, broken), ("json_schema thinking=on", NOT_ENFORCED, broken),
        ("json_object", PASS, 'enforced: {"note": "any object will do when only json_object mode is honoured by '
                              'this serv')]
