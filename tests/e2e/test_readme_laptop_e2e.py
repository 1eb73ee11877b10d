"""The README's "Try it on a laptop" section is a test (issue #11, item 11): its `vllm serve` line is the argv the
e2e server runs (the dev stack's, from the one argv builder, with the CPU stand-ins), and every `tpuserve` line runs
as printed against the shared real server, exit 0, only the address and paths swapped for the test's own."""

from __future__ import annotations

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


def laptop_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Try it on a laptop", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


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
    """The word with the README's address and paths (whole, or as a path's start) replaced by the test's."""
    for printed, actual in swaps.items():
        if word == printed or word.startswith(printed + "/"):
            return actual + word[len(printed):]
    return word


def test_the_laptop_server_is_the_stacks_argv_with_the_cpu_stand_ins():
    setup, _ = laptop_blocks()
    [serve] = [argv for argv in commands(setup) if "serve" in argv]
    env = dict(word.split("=", 1) for word in serve[:serve.index(next(w for w in serve if "=" not in w))])
    argv = serve[len(env):]
    assert argv[-4:] == [">", "vllm.log", "2>&1", "&"]
    assert argv[0] == "~/.cache/tpuserve/vllm-venv/bin/vllm" and argv[1] == "serve"
    cfg = cpu_server.cpu_serving_config(Path(README_MODEL_DIR), "unused", 8000)
    assert argv[2:-4] == vllm_serve_args(cfg)
    assert env == {key: cpu_server.SERVER_ENV[key] for key in ("HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE")}
    assert [argv[1] for argv in commands(setup) if argv[0].endswith("/python")] == ["tests/e2e/tiny_gemma4.py"]


def test_every_toolkit_command_runs_as_printed(vllm_server: RunningServer, vllm_venv: Path, tmp_path: Path):
    _, toolkit = laptop_blocks()
    swaps = {README_ADDRESS: vllm_server.url.removeprefix("http://"), README_MODEL_DIR: str(vllm_server.model_dir),
             README_RUNS: str(tmp_path / "runs" / "cpu"), README_LOG: str(vllm_server.log_path)}
    printed = commands(toolkit)
    assert [argv[:2] for argv in printed] == [
        ["tpuserve", "gate"], ["tpuserve", "probe"], ["tpuserve", "bench"], ["tpuserve", "bench"],
        ["tpuserve", "cost"], ["tpuserve", "plan"], ["tpuserve", "litellm"], ["tpuserve", "diagnose"]]
    for argv in printed:
        run = [sys.executable, "-m", "tpuserve", *[swapped(word, swaps) for word in argv[1:]]]
        done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                              env={**os.environ, "TPUSERVE_VLLM_VENV": str(vllm_venv), "HF_HUB_OFFLINE": "1"})
        print(f"$ {shlex.join(argv)}: exit {done.returncode}\n{done.stdout[-600:]}")
        assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stderr[-2000:]}"
