"""Issue 34 item 1 against the real CPU vLLM started with an API key (the session's plain server, conftest.py): one
variable, $TPUSERVE_API_KEY (or the one --api-key-env names), opens it to every command, `vllm bench serve`
included; without it, or with a wrong one, each command says the URL, the variable and the option in one line.
The sweep here also finds vllm, the model and the tokenizer by itself (issue #11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cpu_server import RunningServer

pytestmark = pytest.mark.e2e


def tpuserve(*args: str, key: str | None = None, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("TPUSERVE_API_KEY", "OPENAI_API_KEY")}
    environment.update(env, HF_HUB_OFFLINE="1", **({"TPUSERVE_API_KEY": key} if key else {}))
    return subprocess.run([sys.executable, "-m", "tpuserve", *args], capture_output=True, text=True, timeout=600,
                          env=environment, cwd=cwd)


def the_commands(server: RunningServer, tmp_path: Path, log: Path) -> dict[str, list[str]]:
    url = server.url
    return {
        "probe": ["probe", "tools", "--url", url, "--max-tokens", "16"],
        # no --model, --tokenizer or --vllm-bin, host:port without a scheme: the sweep finds them by itself
        "bench": ["bench", "sweep", "--url", url.removeprefix("http://"), "--input-len", "16", "--output-len", "4",
                  "--num-prompts", "4", "--concurrency", "2", "--out", str(tmp_path / "run"), "--json"],
        "litellm": ["litellm", "--url", url, "--alias", "gemini-2.0-flash"],
        "diagnose": ["diagnose", "--log-file", str(log), "--url", url],
    }


def test_without_the_key_every_command_names_the_url_the_variable_and_the_option(vllm_server_plain: RunningServer,
                                                                                  tmp_path: Path):
    log = tmp_path / "vllm.log"
    log.write_text(vllm_server_plain.log_path.read_text(errors="replace"))
    for name, argv in the_commands(vllm_server_plain, tmp_path, log).items():
        done = tpuserve(*argv)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1, f"{name}: {done.stderr}"
        assert last == (f"Error: {vllm_server_plain.url}/v1/models answered HTTP 401: Unauthorized; no API key was "
                        "sent ($TPUSERVE_API_KEY is not set): export TPUSERVE_API_KEY=<the key the server was started "
                        "with> (vLLM's --api-key or VLLM_API_KEY), or name another variable with --api-key-env"), name
    assert not (tmp_path / "run").exists()
    gate = tpuserve("gate", "--url", vllm_server_plain.url, "--timeout", "60")
    assert gate.returncode == 1
    assert json.loads(gate.stdout.splitlines()[-1])["reason"].startswith(
        f"stage models: {vllm_server_plain.url}/v1/models answered HTTP 401: Unauthorized; no API key was sent")


def test_a_wrong_key_is_said_to_be_refused(vllm_server_plain: RunningServer):
    done = tpuserve("probe", "structured", "--url", vllm_server_plain.url, "--api-key-env", "SERVE_KEY",
                    SERVE_KEY="sk-wrong")
    assert done.returncode == 1
    assert ("answered HTTP 401: Unauthorized; the key in $SERVE_KEY was refused"
            in done.stderr.strip().splitlines()[-1])


def test_with_the_key_every_command_runs(vllm_server_plain: RunningServer, vllm_venv: Path, tmp_path: Path):
    """The sweep also finds the first served model, the server's root (the model directory) as its tokenizer and
    the project's CPU venv's vllm; per-level counts on stderr, the --json summary on stdout."""
    log = tmp_path / "vllm.log"
    log.write_text(vllm_server_plain.log_path.read_text(errors="replace"))
    done = {}
    for name, argv in the_commands(vllm_server_plain, tmp_path, log).items():
        done[name] = tpuserve(*argv, key=vllm_server_plain.api_key, cwd=tmp_path, TPUSERVE_VLLM_VENV=str(vllm_venv))
        assert done[name].returncode == 0, f"{name}: {done[name].stderr[-2000:]}"
    manifest = json.loads(done["bench"].stdout)
    [level] = manifest["runs"]
    assert (level["completed"], level["failed"]) == (4, 0)  # `vllm bench serve` sent the key: none refused
    assert "concurrency 2: 4 completed, 0 failed" in done["bench"].stderr
    command = level["command"]
    assert command[0] == str(vllm_venv / "bin" / "vllm")
    assert command[command.index("--model") + 1] == vllm_server_plain.model
    assert command[command.index("--tokenizer") + 1] == str(vllm_server_plain.model_dir)
    assert vllm_server_plain.api_key not in (tmp_path / "run" / "sweep.json").read_text() + (
        tmp_path / "run" / "c2.log").read_text()
    report = tpuserve("bench", "report", str(tmp_path / "run"), COLUMNS="80")
    print(report.stdout)
    assert report.returncode == 0 and "…" not in report.stdout
    gate = tpuserve("gate", "--url", vllm_server_plain.url, "--timeout", "120", key=vllm_server_plain.api_key)
    assert gate.returncode == 0, gate.stderr
