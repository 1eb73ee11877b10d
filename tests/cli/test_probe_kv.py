"""kv-compare and the probe CLI against fake OpenAI servers (tests/fakes/fake_openai.py) and saved output dirs."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI
from tests.fakes.httpfake import FakeServer, Response
from tpuserve.cli import main
from tpuserve.measure.probe import (KV_PROMPTS, ScenarioResult, compare_outputs, context_after, could_not_run, excerpt,
                                    failed, first_difference, load_outputs, save_outputs)


@pytest.mark.parametrize("a, b, offset", [(b"same", b"same", None), (b"abcd", b"abXd", 2), (b"abc", b"abcdef", 3),
                                          ("café".encode(), b"cafe", 3)])
def test_first_difference_is_a_byte_offset(a: bytes, b: bytes, offset: int | None) -> None:
    assert first_difference(a, b) == offset


def test_compare_counts_identical_outputs_and_shows_where_they_part() -> None:
    a = {name: f"answer {name}" for name in KV_PROMPTS}
    b = {**a, "code": "answer cXde"}
    comparisons = compare_outputs(a, b)
    assert sum(c.identical for c in comparisons) == len(KV_PROMPTS) - 1
    code = next(c for c in comparisons if c.prompt == "code")
    assert (code.first_difference, code.context_a, code.context_b) == (8, "ode", "Xde")


def test_saved_outputs_round_trip_and_a_missing_prompt_is_named(tmp_path: Path) -> None:
    outputs = {name: f"out {name} ü" for name in KV_PROMPTS}
    save_outputs(tmp_path, outputs, {"url": "u"})
    assert load_outputs(tmp_path) == outputs
    assert json.loads((tmp_path / "run.json").read_text())["prompts"] == KV_PROMPTS
    (tmp_path / "code.txt").unlink()
    with pytest.raises(Exception, match="lacks code.txt"):
        load_outputs(tmp_path)


def test_kv_compare_cli_between_two_servers_and_a_saved_run(tmp_path: Path) -> None:
    def mangled(prompt: str) -> str:
        return f"Answer to: {prompt}".replace("Fibonacci", "Fibonacco")

    runner = CliRunner()
    with FakeOpenAI() as a, FakeOpenAI(reply_text=mangled) as b:
        result = runner.invoke(main, ["probe", "kv-compare", "--a", a.url, "--b", f"{b.url}/v1", "--json",
                                      "--save", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["identical"], report["total"]) == (5, 6)
    code = next(c for c in report["comparisons"] if c["prompt"] == "code")
    assert code["first_difference"] == len("Answer to: Write a Python function that returns the n-th Fibonacc")
    assert all(body["temperature"] == 0 and body["model"] == FAKE_MODEL for body in a.chat_bodies())

    saved = runner.invoke(main, ["probe", "kv-compare", "--a-dir", str(tmp_path / "a"), "--b-dir",
                                 str(tmp_path / "b"), "--strict"])
    assert saved.exit_code == 1
    assert "byte-identical: 5/6" in saved.output


def test_kv_compare_needs_exactly_one_source_per_side(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["probe", "kv-compare", "--a-dir", str(tmp_path)])
    assert result.exit_code == 2 and "exactly one of --b URL or --b-dir DIR" in result.output


def test_probe_all_json_and_strict_exit_codes() -> None:
    runner = CliRunner()
    with FakeOpenAI(structured="reasoning-parser", vision="text-only") as fake:
        relaxed = runner.invoke(main, ["probe", "all", "--url", fake.url, "--json"])
        strict = runner.invoke(main, ["probe", "structured", "--url", fake.url, "--model", FAKE_MODEL, "--strict"])
    assert relaxed.exit_code == 0, relaxed.output
    report = json.loads(relaxed.output)
    verdicts = {(r["probe"], r["scenario"]): r["verdict"] for r in report["results"]}
    assert verdicts[("structured", "json_schema thinking=on")] == "schema not enforced"
    assert verdicts[("tools", "simple call")] == "pass"
    assert verdicts[("vision", "count 3 squares")] == "skipped"
    assert "not enforced with: json_schema thinking=on" in report["structured_summary"]
    assert strict.exit_code == 1
    assert "not enforced with:" in strict.output


def test_an_unreachable_server_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["probe", "tools", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert result.output == ("Error: cannot reach http://127.0.0.1:9/v1/models: Connection refused; is the server up "
                             "and its URL right?\n")


def test_a_model_the_server_does_not_serve_is_refused_before_any_scenario() -> None:
    """Issue #11, item 4: five identical 404 rows and exit 0 used to be the answer."""
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(main, ["probe", "tools", "--url", fake.url, "--model", "google/gemma-4-E4B-it"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: Invalid value for --model: 'google/gemma-4-E4B-it' is not "
                                              f"served by {fake.url}/v1/models, which serves {FAKE_MODEL}")
    assert fake.chat_bodies() == []


def test_a_probe_whose_every_scenario_got_an_error_could_not_run() -> None:
    routes = {("GET", "/v1/models"): lambda request: Response(body={"object": "list", "data": [{"id": "m"}]}),
              ("POST", "/v1/chat/completions"):
              lambda request: Response(500, {"error": {"message": "EngineCore encountered an issue", "code": 500}})}
    with FakeServer(routes) as fake:
        result = CliRunner().invoke(main, ["probe", "structured", "--url", fake.url, "--json"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Error: the probe could not run against {fake.url} (m): every scenario got an error, the first: server "
        "error: HTTP 500: EngineCore encountered an issue"]
    assert len(json.loads(result.stdout)["results"]) == 3  # the evidence is still printed


# --- issue #12: what kv-compare sends, saves and reports, pinned; the small helpers at their limits -------------------

def test_kv_compare_sends_greedy_seeded_requests_and_saves_them_where_asked(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_KEY", "kv-secret")
    save = tmp_path / "new" / "runs"  # parents are created
    with FakeOpenAI() as a, FakeOpenAI(reply_text=lambda prompt: "é" if "months" in prompt else "same") as b:
        result = CliRunner().invoke(main, ["probe", "kv-compare", "--a", a.url, "--b", b.url, "--model", FAKE_MODEL,
                                           "--max-tokens", "5", "--api-key-env", "KV_KEY", "--save", str(save),
                                           "--json"])
        sent_a = a.chat_bodies()
        auth = {r.headers.get("Authorization") for r in a.requests + b.requests}
    assert result.exit_code == 0, result.output
    assert auth == {"Bearer kv-secret"}
    assert [(body["model"], body["temperature"], body["seed"], body["max_tokens"]) for body in sent_a] == [
        (FAKE_MODEL, 0, 0, 5)] * 6
    run = (save / "a" / "run.json").read_text()
    assert run.startswith('{\n  "url": ') and run.endswith("}\n")
    saved = json.loads(run)
    assert {key: saved[key] for key in ("url", "model", "max_tokens", "temperature", "seed")} == {
        "url": a.url, "model": FAKE_MODEL, "max_tokens": 5, "temperature": 0, "seed": 0}
    assert list(saved["prompts"]) == ["explanation", "code", "listing", "translation", "arithmetic", "summarization"]
    assert (save / "b" / "listing.txt").read_bytes() == "é".encode()
    report = json.loads(result.output)
    explanation = "Answer to: Explain in three sentences how a hash table finds a value."
    assert report["comparisons"][0] == {"prompt": "explanation", "identical": False, "first_difference": 0,
                                        "bytes_a": len(explanation), "bytes_b": 4, "context_a": explanation[:24],
                                        "context_b": "same"}
    assert report["comparisons"][2]["context_b"] == "é" and report["comparisons"][2]["bytes_b"] == 2


def test_identical_outputs_are_reported_with_their_sizes() -> None:
    outputs = {name: "ü" * 3 for name in KV_PROMPTS}
    assert [dataclasses.astuple(c) for c in compare_outputs(outputs, dict(outputs))][:2] == [
        ("explanation", True, None, 6, 6, "", ""), ("code", True, None, 6, 6, "", "")]


def test_the_context_after_a_difference_survives_a_cut_character() -> None:
    assert context_after("aé".encode(), 1, 1) == "\ufffd"  # half of é: replaced, never an exception
    assert context_after(b"abcdef", 2) == "cdef"


@pytest.mark.parametrize("text, limit, shown", [
    ("abc", 3, "abc"), ("abcd", 3, "abc… (+1 chars)"), ("a\x00b\n", 10, "a\\x00b\\n"), ("", 5, ""),
])
def test_excerpt(text: str, limit: int, shown: str) -> None:
    assert excerpt(text, limit) == shown


def test_failed_means_a_fail_or_a_schema_not_enforced() -> None:
    def result(verdict: str) -> ScenarioResult:
        return ScenarioResult("p", "s", verdict, "r")

    assert not failed([result("pass"), result("skipped")])
    assert failed([result("pass"), result("fail")]) and failed([result("schema not enforced")])


def test_could_not_run_only_when_every_judged_scenario_got_an_error() -> None:
    first = ScenarioResult("p", "a", "fail", "server error: " + "x" * 250)
    second = ScenarioResult("p", "b", "fail", "no answer: ReadTimeout")
    judged_fail = ScenarioResult("p", "c", "fail", "empty text answer")
    assert could_not_run([first, second]) == ("every scenario got an error, the first: server error: " + "x" * 186
                                              + "… (+64 chars)")
    assert could_not_run([first, judged_fail]) is None
    assert could_not_run([judged_fail]) is None
    assert could_not_run([ScenarioResult("p", "s", "skipped", "off")]) is None


def test_a_side_that_errors_or_stalls_is_named(tmp_path: Path) -> None:
    broken = FakeServer({("GET", "/v1/models"): lambda r: Response(200, {"data": [{"id": FAKE_MODEL}]}),
                         ("POST", "/v1/chat/completions"): lambda r: Response(500, {"error": {"message": "boom"}})})
    with FakeOpenAI() as a, broken:
        result = CliRunner().invoke(main, ["probe", "kv-compare", "--a", a.url, "--b", broken.url])
    assert (result.exit_code, result.output.splitlines()[-1]) == (1, f"Error: --b {broken.url}: HTTP 500: boom")

    def slow(request):
        time.sleep(2)
        return Response(200, {"choices": [{"message": {"content": "late"}}]})

    stalled = FakeServer({("GET", "/v1/models"): lambda r: Response(200, {"data": [{"id": FAKE_MODEL}]}),
                          ("POST", "/v1/chat/completions"): slow})
    with FakeOpenAI() as a, stalled:
        result = CliRunner().invoke(main, ["probe", "kv-compare", "--a", a.url, "--b", stalled.url, "--timeout", "1"])
    assert result.exit_code == 1 and "in time" in result.output


def test_a_model_neither_side_serves_names_the_option(tmp_path: Path) -> None:
    with FakeOpenAI() as a:
        result = CliRunner().invoke(main, ["probe", "kv-compare", "--a", a.url, "--b-dir", str(tmp_path),
                                           "--model", "other/model"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (f"Error: Invalid value for --model: 'other/model' is not served by "
                                              f"{a.url}/v1/models, which serves {FAKE_MODEL}")


def test_load_names_every_missing_output(tmp_path: Path) -> None:
    with pytest.raises(click.BadParameter) as missing:
        load_outputs(tmp_path)
    assert missing.value.message == (f"{tmp_path} lacks explanation.txt, code.txt, listing.txt, translation.txt, "
                                     "arithmetic.txt, summarization.txt")
