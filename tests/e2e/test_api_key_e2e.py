"""Issue 34 item 1 against the real CPU vLLM started with an API key (VLLM_API_KEY, as the stack's VM gives it): one
variable, $TPUSERVE_API_KEY (or the one --api-key-env names), opens it to every command, `vllm bench serve`
included; without it, or with a wrong one, each command says the URL, the variable and the option in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import serve, wait_healthy_or_fail
from tests.e2e.cpu_server import RunningServer

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-serve-key"


@pytest.fixture(scope="module")
def keyed_server(vllm_bin: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[RunningServer]:
    with serve(vllm_bin, tiny_model_dir, tmp_path_factory.mktemp("keyed-vllm"), env={"VLLM_API_KEY": KEY}) as server:
        wait_healthy_or_fail(server)
        yield server


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
        "bench": ["bench", "sweep", "--url", url, "--input-len", "16", "--output-len", "4", "--num-prompts", "4",
                  "--concurrency", "2", "--out", str(tmp_path / "run")],
        "litellm": ["litellm", "--url", url, "--alias", "gemini-2.0-flash"],
        "diagnose": ["diagnose", "--log-file", str(log), "--url", url],
    }


def test_without_the_key_every_command_names_the_url_the_variable_and_the_option(keyed_server: RunningServer,
                                                                                  tmp_path: Path):
    log = tmp_path / "vllm.log"
    log.write_text(keyed_server.log_path.read_text(errors="replace"))
    for name, argv in the_commands(keyed_server, tmp_path, log).items():
        done = tpuserve(*argv)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 1, f"{name}: {done.stderr}"
        assert last == (f"Error: {keyed_server.url}/v1/models answered HTTP 401: Unauthorized; no API key was sent "
                        "($TPUSERVE_API_KEY is not set): export TPUSERVE_API_KEY=<the key the server was started "
                        "with> (vLLM's --api-key or VLLM_API_KEY), or name another variable with --api-key-env"), name
    assert not (tmp_path / "run").exists()
    gate = tpuserve("gate", "--url", keyed_server.url, "--timeout", "60")
    assert gate.returncode == 1
    assert json.loads(gate.stdout.splitlines()[-1])["reason"].startswith(
        f"stage models: {keyed_server.url}/v1/models answered HTTP 401: Unauthorized; no API key was sent")


def test_a_wrong_key_is_said_to_be_refused(keyed_server: RunningServer):
    done = tpuserve("probe", "structured", "--url", keyed_server.url, "--api-key-env", "SERVE_KEY",
                    SERVE_KEY="sk-wrong")
    assert done.returncode == 1
    assert ("answered HTTP 401: Unauthorized; the key in $SERVE_KEY was refused"
            in done.stderr.strip().splitlines()[-1])


def test_with_the_key_every_command_runs(keyed_server: RunningServer, tmp_path: Path):
    log = tmp_path / "vllm.log"
    log.write_text(keyed_server.log_path.read_text(errors="replace"))
    for name, argv in the_commands(keyed_server, tmp_path, log).items():
        done = tpuserve(*argv, key=KEY, cwd=tmp_path)
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    manifest = json.loads((tmp_path / "run" / "sweep.json").read_text())
    [level] = manifest["runs"]
    assert (level["completed"], level["failed"]) == (4, 0)  # `vllm bench serve` sent the key: none refused
    assert KEY not in (tmp_path / "run" / "sweep.json").read_text() + (tmp_path / "run" / "c2.log").read_text()
    gate = tpuserve("gate", "--url", keyed_server.url, "--timeout", "120", key=KEY)
    assert gate.returncode == 0, gate.stderr
