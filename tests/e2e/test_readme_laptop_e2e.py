"""The laptop path is a test (issue #11, item 11; issue #27): the README's quick start and the toolkit page's "Try
every command on a laptop". The quick start's `vllm serve` line is the argv the e2e server runs (the dev stack's,
from the one argv builder, with the CPU stand-ins); its gate and its `curl` get a served completion; every `tpuserve`
line of the toolkit page runs as printed against the shared real server, exit 0, only the address, paths and model
name swapped for the test's own."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import cpu_server
from tests.e2e.cpu_server import RunningServer
from tpuserve.serving import vllm_serve_args

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README_ADDRESS, README_MODEL_DIR, README_RUNS, README_LOG = "127.0.0.1:8000", "/tmp/tiny-gemma4", "runs/cpu", "vllm.log"


def bash_blocks(path: Path, heading: str) -> list[str]:
    """The ```bash blocks of one `## heading` section of a markdown file."""
    section = path.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


def quickstart_blocks() -> list[str]:
    return bash_blocks(REPO / "README.md", "Quick start on a laptop")


def toolkit_block() -> str:
    [block] = bash_blocks(REPO / "docs" / "toolkit.md", "Try every command on a laptop")
    return block


def commands(block: str) -> list[list[str]]:
    """Each command of a bash block, continuation lines joined, comments and `&&` chains split."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            found += [shlex.split(part) for part in line.split("&&")]
    return found


def swapped(word: str, swaps: dict[str, str]) -> str:
    """The word with the docs' address and paths (whole, or as a path's start) replaced by the test's."""
    for printed, actual in swaps.items():
        if word == printed or word.startswith(printed + "/"):
            return actual + word[len(printed):]
    return word


def swaps_for(server: RunningServer, tmp_path: Path) -> dict[str, str]:
    return {README_ADDRESS: server.url.removeprefix("http://"), README_MODEL_DIR: str(server.model_dir),
            README_RUNS: str(tmp_path / "runs" / "cpu"), README_LOG: str(server.log_path)}


def test_the_laptop_server_is_the_stacks_argv_with_the_cpu_stand_ins():
    setup, _ = quickstart_blocks()
    [serve] = [argv for argv in commands(setup) if "serve" in argv]
    env = dict(word.split("=", 1) for word in serve[:serve.index(next(w for w in serve if "=" not in w))])
    argv = serve[len(env):]
    assert argv[-4:] == [">", "vllm.log", "2>&1", "&"]
    assert argv[0] == "~/.cache/tpuserve/vllm-venv/bin/vllm" and argv[1] == "serve"
    cfg = cpu_server.cpu_serving_config(Path(README_MODEL_DIR), "unused", 8000)
    assert argv[2:-4] == vllm_serve_args(cfg)
    assert env == {key: cpu_server.SERVER_ENV[key] for key in ("HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE")}
    assert [argv[1] for argv in commands(setup) if argv[0].endswith("/python")] == ["tests/e2e/tiny_gemma4.py"]


def test_the_quick_start_ends_with_a_served_completion(vllm_server: RunningServer, tmp_path: Path):
    """The gate, then the `curl` as printed: its JSON body names the model directory, which the shared server
    serves under a short name."""
    _, ask = quickstart_blocks()
    gate, curl = commands(ask)
    assert gate[:2] == ["tpuserve", "gate"] and curl[0] == "curl"
    swaps = swaps_for(vllm_server, tmp_path)
    done = subprocess.run([sys.executable, "-m", "tpuserve", *[swapped(word, swaps) for word in gate[1:]]],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    body = f'"model": "{README_MODEL_DIR}"'
    argv = [swapped(word, swaps).replace(body, f'"model": "{vllm_server.model}"') for word in curl]
    assert any(f'"model": "{vllm_server.model}"' in word for word in argv), "the curl names no model"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    [choice] = answer["choices"]
    # Random weights: any text, as content or (after a thinking token) as reasoning, is the gate's "real completion".
    assert choice["message"]["role"] == "assistant"
    assert choice["message"].get("content") or choice["message"].get("reasoning")
    assert 0 < answer["usage"]["completion_tokens"] <= 16


def test_every_toolkit_command_runs_as_printed(vllm_server: RunningServer, vllm_venv: Path, tmp_path: Path):
    swaps = swaps_for(vllm_server, tmp_path)
    printed = commands(toolkit_block())
    assert [argv[:2] for argv in printed] == [
        ["tpuserve", "gate"], ["tpuserve", "probe"], ["tpuserve", "bench"], ["tpuserve", "bench"],
        ["tpuserve", "cost"], ["tpuserve", "plan"], ["tpuserve", "litellm"], ["tpuserve", "diagnose"]]
    for argv in printed:
        run = [sys.executable, "-m", "tpuserve", *[swapped(word, swaps) for word in argv[1:]]]
        done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                              env={**os.environ, "TPUSERVE_VLLM_VENV": str(vllm_venv), "HF_HUB_OFFLINE": "1"})
        print(f"$ {shlex.join(argv)}: exit {done.returncode}\n{done.stdout[-600:]}")
        assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stderr[-2000:]}"
