"""`bench sweep` command assembly against fakes: a recording fake `vllm` executable, a PATH-shim `gcloud` and a
FakeServer for GET /version. No real vLLM here (tests/e2e/test_bench_e2e.py runs the real one)."""

from __future__ import annotations

import json
import shlex
import stat
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.httpfake import FakeServer, Response
from tpuserve.cli import main
from tpuserve.measure.bench import bench, parse_levels
from tpuserve.measure.benchreport import report_rows

# Records its argv, then writes a result file the way `vllm bench serve --save-result` does.
FAKE_VLLM = """
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
if os.environ.get("FAKE_FAIL_AT") == args[args.index("--max-concurrency") + 1]:
    print("Traceback: the server went away")
    sys.exit(3)
value = lambda flag: args[args.index(flag) + 1]
concurrency = int(value("--max-concurrency"))
os.makedirs(value("--result-dir"), exist_ok=True)
with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as out:
    json.dump({"max_concurrency": concurrency, "completed": int(value("--num-prompts")), "failed": 0,
               "request_throughput": concurrency / 10,
               "output_throughput": 16.0 * concurrency, "total_token_throughput": 80.0 * concurrency,
               "median_ttft_ms": 100.0, "p99_ttft_ms": 150.0, "median_tpot_ms": 20.0}, out)
"""

# gcloud shim: records argv; like the VM, refuses docker without sudo (OS Login users are not in the docker group);
# answers the version probe and `cat` of a result, accepts `bench serve`.
FAKE_GCLOUD = """
import json, os, re, shlex, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
inner = shlex.split(sys.argv[sys.argv.index("--command") + 1])
if inner[:2] != ["sudo", "docker"]:
    sys.exit("permission denied while trying to connect to the Docker daemon socket")
inner = inner[1:]
if "importlib.metadata" in inner[-1]:
    print("0.32.0+tpu")
elif inner[3:5] == ["cat", inner[4]]:
    concurrency = int(re.search(r"c(\\d+)\\.json$", inner[4]).group(1))
    print(json.dumps({"max_concurrency": concurrency, "completed": 100, "failed": 0, "request_throughput": 1.0,
                      "output_throughput": 50.0,
                      "total_token_throughput": 90.0, "median_ttft_ms": 30.0, "p99_ttft_ms": 45.0,
                      "median_tpot_ms": 8.0}))
elif inner[3:6] != ["vllm", "bench", "serve"]:
    sys.exit(f"unexpected remote command {inner}")
"""


def model_card(model: str = "tiny", root: str | None = None, max_model_len: int = 1024) -> dict:
    """One /v1/models entry as vLLM 0.32 serves it (ModelCard in vllm/entrypoints/serve/engine/protocol.py)."""
    return {"id": model, "object": "model", "created": 1764412345, "owned_by": "vllm", "root": root or model,
            "parent": None, "max_model_len": max_model_len, "permission": []}


def vllm_routes(*cards: dict) -> dict:
    """GET /version and /v1/models of a vLLM server (a sweep's pre-checks read both)."""
    models = {"object": "list", "data": list(cards or (model_card(root="/models/tiny"),))}
    return {("GET", "/version"): lambda request: Response(body={"version": "0.32.0+cpu"}),
            ("GET", "/v1/models"): lambda request: Response(body=models)}


def install(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def recorded(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install(bin_dir, "vllm", FAKE_VLLM)
    install(bin_dir, "gcloud", FAKE_GCLOUD)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    return log


def test_local_sweep_runs_one_bench_per_level_and_records_it(fake_env: Path, tmp_path: Path):
    stack = tmp_path / "stack.json"
    stack.write_text(json.dumps({"vmName": "tpu-serve-dev", "zone": "us-east5-b"}))
    out = tmp_path / "run"
    with FakeServer(vllm_routes()) as server:
        result = CliRunner().invoke(bench, [
            "sweep", "--url", f"{server.url}/v1/", "--model", "tiny", "--tokenizer", "/models/tiny",
            "--concurrency", "2,1", "--input-len", "64", "--output-len", "16", "--num-prompts", "6",
            "--out", str(out), "--stack-outputs", str(stack)])
    assert result.exit_code == 0, result.output
    commands = recorded(fake_env)
    assert [Path(argv[0]).name for argv in commands] == ["vllm", "vllm"]
    assert commands[0][1:] == [
        "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
        "--base-url", server.url,  # the /v1/ suffix is stripped: vLLM appends the endpoint
        "--model", "tiny", "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "16",
        "--ignore-eos", "--num-prompts", "6", "--max-concurrency", "2",
        "--save-result", "--result-dir", str(out), "--result-filename", "c2.json", "--tokenizer", "/models/tiny"]
    assert commands[1][commands[1].index("--max-concurrency") + 1] == "1"

    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["mode"] == "local" and manifest["vllm_version"] == "0.32.0+cpu"
    assert manifest["model"] == "tiny"
    assert manifest["parameters"]["concurrency"] == [2, 1]
    assert manifest["stack_outputs"] == {"vmName": "tpu-serve-dev", "zone": "us-east5-b"}
    assert [run["command"][1:] for run in manifest["runs"]] == [argv[1:] for argv in commands]
    assert all(run["wall_s"] > 0 and run["started_at"] for run in manifest["runs"])
    assert manifest["finished_at"] >= manifest["started_at"]
    assert (out / "c2.log").read_text().splitlines()[0] == shlex.join(commands[0])
    # The saved files are what `bench report` reads.
    assert [row.output_tok_s for row in report_rows(out, 1.35)] == [16.0, 32.0]


def test_failed_level_stops_the_sweep_with_the_log_tail(fake_env: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_FAIL_AT", "8")
    out = tmp_path / "run"
    with FakeServer({("GET", "/v1/models"): vllm_routes()[("GET", "/v1/models")]}) as server:
        result = CliRunner().invoke(main, ["bench", "sweep", "--url", server.url, "--model", "tiny",
                                           "--tokenizer", "/models/tiny", "--input-len", "64", "--output-len", "16", "--concurrency", "1,8,32",
                                           "--out", str(out)])
    assert result.exit_code == 1
    assert ("Error: concurrency 8: `vllm bench serve` exited with 3: Traceback: the server went away (log: "
            f"{out / 'c8.log'})") in result.output
    manifest = json.loads((out / "sweep.json").read_text())
    assert [run["concurrency"] for run in manifest["runs"]] == [1]  # what ran is on record
    assert manifest["vllm_version"] is None  # this server does not answer /version
    assert len(recorded(fake_env)) == 2  # 32 never started


def test_sweep_refuses_a_directory_that_holds_a_sweep(fake_env: Path, tmp_path: Path):
    out = tmp_path / "run"
    with FakeServer(vllm_routes()) as server:
        args = ["sweep", "--url", server.url, "--model", "tiny", "--tokenizer", "/t", "--input-len", "64",
                "--concurrency", "1",
                "--out", str(out)]
        assert CliRunner().invoke(bench, args).exit_code == 0
        again = CliRunner().invoke(bench, args)
    assert again.exit_code == 2 and "--out" in again.output and "already holds a sweep" in again.output


def test_remote_sweep_runs_inside_the_container_over_iap_and_copies_results_back(fake_env: Path, tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(bench, [
        "sweep", "--remote", "tpu-serve-dev", "--zone", "us-east5-b", "--project", "proj", "--model",
        "google/gemma-4-E2B-it", "--concurrency", "1,4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    calls = recorded(fake_env)
    assert all(argv[1:9] == ["compute", "ssh", "tpu-serve-dev", "--zone", "us-east5-b", "--project", "proj",
                             "--tunnel-through-iap"] and argv[9] == "--command" for argv in calls)
    inner = [shlex.split(argv[10]) for argv in calls]
    # docker runs under sudo: on the VM, OS Login users are not in the docker group
    assert inner[0][:5] == ["sudo", "docker", "exec", "vllm", "python3"]  # version probe
    bench_1, fetch_1, bench_4, fetch_4 = inner[1:]
    assert bench_1[:7] == ["sudo", "docker", "exec", "vllm", "vllm", "bench", "serve"]
    assert bench_1[bench_1.index("--base-url") + 1] == "http://127.0.0.1:8000"  # the container's own server
    remote_dir = bench_1[bench_1.index("--result-dir") + 1]
    assert remote_dir.startswith("/tmp/tpuserve-bench/")
    assert fetch_1 == ["sudo", "docker", "exec", "vllm", "cat", f"{remote_dir}/c1.json"]
    assert bench_4[bench_4.index("--max-concurrency") + 1] == "4"
    assert fetch_4[-1] == f"{remote_dir}/c4.json"

    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["mode"] == "remote" and manifest["vllm_version"] == "0.32.0+tpu"
    assert manifest["remote"] == {"vm": "tpu-serve-dev", "zone": "us-east5-b", "project": "proj",
                                  "container": "vllm"}
    assert manifest["runs"][0]["command"][0] == "gcloud"
    assert [row.concurrency for row in report_rows(out, 1.35)] == [1, 4]


def test_missing_vllm_names_the_option(fake_env: Path, tmp_path: Path):
    result = CliRunner().invoke(bench, ["sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--out",
                                        str(tmp_path / "x"), "--vllm-bin", "no-such-vllm"])
    assert result.exit_code == 2 and "--vllm-bin" in result.output


def test_url_is_required_without_remote(tmp_path: Path):
    result = CliRunner().invoke(bench, ["sweep", "--model", "m", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--url" in result.output


@pytest.mark.parametrize("text", ["", "1,x", "0,8", "8,8"])
def test_bad_concurrency_names_the_option(text: str):
    with pytest.raises(click.BadParameter) as raised:
        parse_levels(text)
    assert raised.value.param_hint == "--concurrency"
