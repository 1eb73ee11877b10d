"""Probes against the real CPU vLLM servers (tiny random-weight Gemma 4; fixtures in tests/e2e/conftest.py).

Random weights fail every semantic check, so these tests pin the plumbing: each scenario gets an honest verdict
(no crash), and the structured probe tells the silent skip from enforcement. The structured budget is 64 tokens:
within it the tiny model never ends its reasoning (measured: free text in `content`, finish_reason "length"); with
larger budgets it eventually emits the end-of-reasoning token and vLLM 0.32 answers 500 ("grammar rejected
tokens"), which the probe reports as a server error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuserve.client import ChatClient
from tpuserve.images import modality_part
from tpuserve.measure.probe import FAIL, NOT_ENFORCED, PASS, SKIPPED, ScenarioResult, run_refusals, run_structured
from vm import readycheck

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STRUCTURED_BUDGET = 64
OFF, ON, OBJECT = "json_schema thinking=off", "json_schema thinking=on", "json_object"


def verdicts(results: list[ScenarioResult]) -> dict[str, str]:
    for r in results:
        print(f"{r.probe:10} {r.scenario:26} {r.verdict:20} {r.latency_s or 0:5.2f} s  {r.reason[:110]}")
    return {r.scenario: r.verdict for r in results}


def tpuserve(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuserve", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={**os.environ, **({"TPUSERVE_API_KEY": key} if key else {})})


@pytest.fixture(scope="module")
def probe_all(vllm_server) -> dict[str, list[ScenarioResult]]:
    """One `tpuserve probe all --json --strict` on the dev server, its results by probe: `probe all` runs the same
    run_tools, run_structured, run_vision and run_refusals the tests below would call. Its table is pinned against a
    fake (tests/cli/test_probe_goldens.py) and runs as printed on the real server in test_readme_laptop_e2e.py."""
    report = tpuserve("probe", "all", "--url", f"{vllm_server.url}/v1", "--json", "--strict",
                      "--max-tokens", str(STRUCTURED_BUDGET))
    assert report.returncode == 1, report.stderr  # --strict: random weights fail scenarios
    results = [ScenarioResult(**r) for r in json.loads(report.stdout)["results"]]
    verdicts(results)
    return {probe: [r for r in results if r.probe == probe] for probe in dict.fromkeys(r.probe for r in results)}


def test_reasoning_parser_with_thinking_on_is_reported_as_schema_not_enforced(probe_all) -> None:
    results = probe_all["structured"]
    assert verdicts(results)[ON] == NOT_ENFORCED
    thinking = next(r for r in results if r.scenario == ON)
    assert thinking.evidence["response"]["finish_reason"] == "length"
    assert "not JSON" in thinking.reason


def test_the_plain_server_enforces_the_schema_with_thinking_off_and_on(vllm_server_plain) -> None:
    results = run_structured(ChatClient(vllm_server_plain.url, vllm_server_plain.model,
                                        api_key=vllm_server_plain.api_key), max_tokens=STRUCTURED_BUDGET)
    found = verdicts(results)
    assert (found[OFF], found[ON]) == (PASS, PASS)
    documents = [json.loads(r.evidence["response"]["content"]) for r in results if r.scenario in (OFF, ON)]
    assert all(set(document) == {"answer", "confident"} for document in documents)


def test_tool_scenarios_end_in_honest_verdicts_not_crashes(probe_all) -> None:
    results = probe_all["tools"]
    found = verdicts(results)
    assert len(found) == 5 and set(found.values()) <= {PASS, FAIL}
    assert (found["simple call"], found["parallel calls"]) == (FAIL, FAIL)  # random weights cannot call get_weather
    assert all(r.latency_s is not None and "finish_reason" in r.evidence["response"] for r in results)


def test_vision_is_skipped_on_the_text_only_server(probe_all) -> None:
    results = probe_all["vision"]
    assert set(verdicts(results).values()) == {SKIPPED}
    assert all(r.reason.startswith("server is text-only:") and "multimodal" in r.reason for r in results)


def test_probe_all_runs_every_probe_refusals_included(probe_all) -> None:
    assert [(probe, len(results)) for probe, results in probe_all.items()] == [
        ("tools", 5), ("structured", 3), ("vision", 3), ("refusals", 2)]
    assert {r.verdict for r in probe_all["refusals"]} == {PASS}  # issue 34: all runs them too


def test_kv_compare_of_a_server_with_itself_is_byte_identical(vllm_server, vllm_server_plain,
                                                              tmp_path: Path) -> None:
    same = tpuserve("probe", "kv-compare", "--a", vllm_server.url, "--b", vllm_server.url, "--json",
                    "--save", str(tmp_path))
    assert same.returncode == 0, same.stderr
    assert (json.loads(same.stdout)["identical"], json.loads(same.stdout)["total"]) == (6, 6)
    assert sorted(p.name for p in (tmp_path / "a").iterdir())[-1] == "translation.txt"
    # Same weights and KV cache, different parsers: a measurement for the report, not a requirement.
    cross = tpuserve("probe", "kv-compare", "--a-dir", str(tmp_path / "a"), "--b", vllm_server_plain.url,
                     key=vllm_server_plain.api_key)
    assert cross.returncode == 0, cross.stderr
    print(cross.stdout)


@pytest.mark.parametrize("server", ["vllm_server", "vllm_server_plain"])
def test_every_disabled_modality_is_refused_with_a_4xx_and_the_engine_still_serves(server, request) -> None:
    """The dev server (text-only: every limit 0) and the plain one (prod's flags: image 4, audio 0, video 0). The tiny
    model is text-only (a multimodal one cannot be built here), so vLLM 0.32 refuses each part before any limit with
    400 "<model> is not a multimodal model" (measured); on the TPU's multimodal Gemma 4 the refusal is the limit's
    "At most 0 audio(s) may be provided in one prompt." Either way the request never reaches the engine."""
    served = request.getfixturevalue(server)
    results = run_refusals(ChatClient(served.url, served.model, api_key=served.api_key), ("image", "audio", "video"))
    verdicts(results)
    assert [r.verdict for r in results] == [PASS] * 3
    assert all(r.evidence["status"] == 400 and r.reason == f"HTTP 400: {served.model} is not a multimodal model; "
               "still serving" for r in results)
    result = readycheck.refusals(served.url, served.model, {m: modality_part(m) for m in ("audio", "video")},
                                 timeout_s=60, api_key=served.api_key or "")
    assert result.serving and result.warnings == [], result.detail
    assert served.process.poll() is None  # the engine lives
