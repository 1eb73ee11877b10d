"""kv-compare and the probe CLI against fake OpenAI servers (tests/fake_openai.py) and saved output dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fake_openai import FAKE_MODEL, FakeOpenAI
from tests.httpfake import FakeServer, Response
from tpuserve.cli import main
from tpuserve.measure.probe import KV_PROMPTS, compare_outputs, first_difference, load_outputs, save_outputs


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
