"""`--stack` / `--stack-outputs` on the commands that talk to a deployment: each finds it from the stack's outputs.
Fake servers throughout (tests/httpfake, tests/fake_openai); the IAP tunnel itself is tested in
tests/cli/test_stack_resolution.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI
from tests.fakes.httpfake import FakeServer, Response
from tests.cli.test_bench_sweep import fake_env  # noqa: F401 - a fixture: the recording fake vllm and gcloud
from tests.cli.test_bench_sweep import recorded, vllm_routes
from tests.cli.test_gate import RECORDED_BOOT, VM, chat_body, openai_routes, replaying_compute, stage_snapshots
from tpuserve import gce
from tpuserve.cli import main


def outputs_file(tmp_path: Path, **outputs: object) -> str:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_gate_follows_a_gcp_stack_through_its_vm_with_the_stack_config_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    stack = outputs_file(tmp_path, target="gcp", instanceName=VM.name, zone=VM.zone, project=VM.project,
                         configHash="abc123", endpoint="http://10.0.0.7:8000/v1", model=FAKE_MODEL)
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake:
        result = invoke("gate", "--stack-outputs", stack, "--compute-url", fake.url, "--interval", "0.02")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["ready"] is True
    assert {r.path for r in fake.requests} >= {f"/compute/v1/projects/{VM.project}/zones/{VM.zone}/instances/"
                                               f"{VM.name}/getGuestAttributes"}


def test_gate_refuses_serving_from_another_config(tmp_path, monkeypatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    stack = outputs_file(tmp_path, target="gcp", instanceName=VM.name, zone=VM.zone, project=VM.project,
                         configHash="a-newer-config")
    with replaying_compute(stage_snapshots(RECORDED_BOOT)) as fake:
        result = invoke("gate", "--stack-outputs", stack, "--compute-url", fake.url, "--interval", "0.02",
                        "--timeout", "1")
    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[-1])["ready"] is False


def test_gate_polls_a_local_stack_by_url(tmp_path):
    with FakeServer(openai_routes(Response(200, chat_body("Hello")), models=(FAKE_MODEL,))) as fake:
        stack = outputs_file(tmp_path, target="local", endpoint=f"{fake.url}/v1", model=FAKE_MODEL)
        result = invoke("gate", "--stack-outputs", stack, "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert [r.path for r in fake.requests][:3] == ["/health", "/v1/models", "/v1/chat/completions"]


def test_probe_takes_endpoint_and_model_from_the_stack(tmp_path):
    with FakeOpenAI(structured="enforced") as fake:
        stack = outputs_file(tmp_path, target="local", endpoint=f"{fake.url}/v1", model=FAKE_MODEL)
        result = invoke("probe", "structured", "--stack-outputs", stack, "--json")
    assert result.exit_code == 0, result.output
    assert {body["model"] for body in fake.chat_bodies()} == {FAKE_MODEL}
    assert all(r["verdict"] == "pass" for r in json.loads(result.stdout)["results"] if "schema" in r["scenario"])


def test_bench_sweep_records_the_stack_and_reaches_its_endpoint(tmp_path, fake_env):  # noqa: F811
    with FakeServer(vllm_routes()) as server:
        stack = outputs_file(tmp_path, target="local", endpoint=f"{server.url}/v1", model="tiny")
        result = invoke("bench", "sweep", "--stack-outputs", stack, "--concurrency", "1", "--tokenizer", "/m",
                        "--input-len", "64", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    [argv] = recorded(fake_env)
    assert argv[argv.index("--base-url") + 1] == server.url and argv[argv.index("--model") + 1] == "tiny"
    manifest = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert manifest["stack_outputs"]["endpoint"] == f"{server.url}/v1"


def test_bench_remote_takes_zone_and_project_from_the_stack(tmp_path, fake_env):  # noqa: F811
    stack = outputs_file(tmp_path, target="gcp", instanceName="tpu-serve-dev", zone="us-east5-b", project="proj",
                         model="google/gemma-4-E2B-it", endpoint="http://10.0.0.7:8000/v1")
    result = invoke("bench", "sweep", "--stack-outputs", stack, "--remote", "tpu-serve-dev", "--concurrency", "1",
                    "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    first = recorded(fake_env)[0]
    assert first[1:8] == ["compute", "ssh", "tpu-serve-dev", "--zone", "us-east5-b", "--project", "proj"]


@pytest.mark.parametrize("command", [["gate"], ["probe", "tools"], ["bench", "sweep", "--out", "x"], ["logs"],
                                     ["litellm", "--alias", "a"]])
def test_stack_and_stack_outputs_together_are_a_usage_error(tmp_path, command):
    result = invoke(*command, "--stack", "dev", "--stack-outputs", outputs_file(tmp_path, target="local"))
    assert result.exit_code == 2 and "--stack or --stack-outputs, not both" in result.output


def test_unreadable_outputs_file_names_the_option(tmp_path):
    bad = tmp_path / "outputs.json"
    bad.write_text("{not json")
    result = invoke("probe", "tools", "--stack-outputs", str(bad))
    assert result.exit_code == 2 and "--stack-outputs" in result.output and "not JSON" in result.output
