"""Issue #11 on the real CPU vLLM (tiny Gemma 4, the shared session server of tests/e2e/conftest.py): what a new
user hits when something is wrong ends in one line and the right exit code, at once, from every command.

The server is started with max_model_len 1024, text-only, served as `tiny-gemma4` (a name that is not a Hugging
Face id); its /v1/models `root` is the model directory on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import requests

from tests.e2e.cpu_server import RunningServer
from tpuserve.deploy.stack import Served
from tpuserve.measure.bench import run_sweep

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
WRONG = "google/gemma-4-E4B-it"


def tpuserve(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuserve", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def hostport(server: RunningServer) -> str:
    """The address as people type it: no scheme (issue item 6)."""
    return server.url.removeprefix("http://")


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else ""


# (argv after `tpuserve` with {url} for host:port, exit code, a fragment of the one error line)
REFUSED = [
    (["probe", "tools", "--url", "{url}", "--model", WRONG], 2,
     f"Invalid value for --model: '{WRONG}' is not served by http://{{url}}/v1/models, which serves tiny-gemma4"),
    (["bench", "sweep", "--url", "{url}", "--model", WRONG, "--out", "{tmp}/wrong-model"], 2,
     f"Invalid value for --model: '{WRONG}' is not served by"),
    (["bench", "sweep", "--url", "{url}", "--out", "{tmp}/default-lengths"], 2,
     "1024 + 128 = 1152 tokens per request exceed the server's max_model_len 1024 (from /v1/models)"),
    (["diagnose", "--log-file", "{log}", "--url", "{url}", "--model", WRONG], 2,
     f"Invalid value for --model: '{WRONG}' is not served by"),
    (["probe", "structured", "--url", "{url}/v2"], 2, "Invalid value for '--url'"),
]


@pytest.mark.parametrize("argv, code, fragment", REFUSED, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _, _)
                                                                in enumerate(REFUSED)])
def test_a_wrong_model_or_impossible_lengths_are_refused_up_front(vllm_server: RunningServer, tmp_path: Path,
                                                                  argv, code, fragment):
    log = tmp_path / "boot.log"
    log.write_text("ERROR: something failed\n")
    values = {"url": hostport(vllm_server), "tmp": str(tmp_path), "log": str(log)}
    started = time.monotonic()
    done = tpuserve(*[arg.format(**values) for arg in argv])
    took = time.monotonic() - started
    print(f"{' '.join(argv[:2])}: exit {done.returncode} in {took:.1f} s: {last_line(done)}")
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert last_line(done).startswith("Error: ") and fragment.format(**values) in last_line(done)
    assert took < 30  # nothing ran first: no vllm bench, no scenario


def test_gate_ends_at_once_for_a_model_the_real_server_does_not_list(vllm_server: RunningServer):
    started = time.monotonic()
    done = tpuserve("gate", "--url", hostport(vllm_server), "--model", WRONG, "--timeout", "600")
    took = time.monotonic() - started
    [line] = done.stdout.splitlines()  # stdout is the JSON verdict alone
    verdict = json.loads(line)
    assert done.returncode == 1 and took < 30 and verdict["ready"] is False
    assert verdict["reason"] == (f"stage models: '{WRONG}' is not served by /v1/models, which serves tiny-gemma4 "
                                 "(waiting cannot change this answer)")
    assert "not ready" in done.stderr


def test_gate_ends_at_once_when_a_smoke_check_is_refused_for_good(vllm_server: RunningServer):
    """An image sent to the text-only server: vLLM answers with an error that no retry changes."""
    started = time.monotonic()
    done = tpuserve("gate", "--url", hostport(vllm_server), "--smoke", "vision", "--timeout", "600")
    took = time.monotonic() - started
    verdict = json.loads(done.stdout.splitlines()[-1])
    print(f"gate --smoke vision on a text-only server: exit {done.returncode} in {took:.1f} s: {verdict['reason']}")
    assert done.returncode == 1 and took < 60
    assert verdict["reason"].startswith("stage smoke-vision: chat completion answered HTTP 400")
    assert list(verdict["stages"]) == ["health", "models", "completion"]


def test_the_model_defaults_to_the_first_served_everywhere(vllm_server: RunningServer):
    gate = tpuserve("gate", "--url", hostport(vllm_server), "--timeout", "60")
    assert gate.returncode == 0, gate.stderr
    assert json.loads(gate.stdout.splitlines()[-1])["ready"] is True
    # Off a terminal the gate prints a line per stage, not a spinner.
    assert [line.split()[1] for line in gate.stderr.splitlines() if line.startswith("✓")][:3] == [
        "health", "models", "completion"]
    config = tpuserve("litellm", "--url", hostport(vllm_server), "--alias", "gemini-2.0-flash", "--json")
    assert config.returncode == 0, config.stderr
    params = json.loads(config.stdout)["model_list"][0]["litellm_params"]
    assert params == {"model": "openai/tiny-gemma4", "api_base": f"{vllm_server.url}/v1",
                      "api_key": "os.environ/TPUSERVE_API_KEY"}


def test_a_level_where_the_real_vllm_failed_every_request_fails_the_sweep(vllm_server: RunningServer,
                                                                           vllm_bin: Path, tmp_path: Path):
    """What the old sweep saved as a success: 1024 in + 128 out against max_model_len 1024 (the CLI now refuses
    these lengths up front, so the run is started below that check)."""
    card = requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"][0]
    assert (card["max_model_len"], card["root"]) == (1024, str(vllm_server.model_dir))  # what the checks read
    out = tmp_path / "run"
    with pytest.raises(click.ClickException) as raised:
        run_sweep(Served(vllm_server.url, vllm_server.model, card), str(vllm_server.model_dir), [1], 1024, 128, 3,
                  out, str(vllm_bin), None, None)
    print(raised.value.message)
    assert raised.value.message == (f"concurrency 1: all 3 requests failed; vLLM: Bad Request (log: "
                                    f"{out / 'c1.log'})")
    saved = json.loads((out / "c1.json").read_text())
    assert (saved["completed"], saved["failed"]) == (0, 3)
    report = tpuserve("bench", "report", str(out), "--format", "markdown")
    assert report.returncode == 0
    assert "| 1 | all 3 failed |" in report.stdout and "∞" not in report.stdout
    cost = tpuserve("cost", "--report", str(out))
    assert cost.returncode == 1 and last_line(cost) == ("Error: no level of the report completed a request: "
                                                        "nothing to price (see `tpuserve bench report`)")
