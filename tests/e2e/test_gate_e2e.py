"""Real vLLM: `tpuserve gate --url` against the CPU `vllm serve` of the tiny Gemma 4 (see conftest.py).
The lying-server, never-up and guest-attribute cases run against fakes in tests/cli/test_gate.py; a model the real server
does not serve, in test_failures_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cpu_server import BootWatch, RunningServer

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
READY_LAG_LIMIT_S = 2.0  # issue #3: ready within 2 s of /health first answering 200


def run_gate(*args: str) -> tuple[int, dict[str, Any], str]:
    """Run `python -m tpuserve gate ARGS`; exit code, the JSON verdict (the only stdout line), stderr."""
    done = subprocess.run([sys.executable, "-m", "tpuserve", "gate", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be exactly the JSON verdict, got {done.stdout!r}"
    return done.returncode, json.loads(lines[0]), done.stderr


def test_gate_started_with_the_server_reports_ready_within_2_s_of_health(vllm_boot_watch: BootWatch):
    watch = vllm_boot_watch
    deadline = time.monotonic() + 120
    while watch.gate_exited_at is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watch.gate_exited_at is not None, "the gate did not finish within 120 s of /health turning 200"
    verdict = json.loads(watch.gate_stdout.read_text().splitlines()[-1])
    assert watch.gate.returncode == 0 and verdict["ready"] is True and verdict["reason"] is None
    assert list(verdict["stages"]) == ["health", "models", "completion"]
    lag = watch.gate_exited_at - watch.healthy_at
    print(f"\n/health 200 after {verdict['stages']['health']:.1f} s of boot; gate exited ready {lag:.2f} s after "
          f"/health first answered 200 (limit {READY_LAG_LIMIT_S} s, ratio {lag / READY_LAG_LIMIT_S:.2f})")
    assert lag < READY_LAG_LIMIT_S
    # vLLM binds its port as it starts and listens once its engine is up: the gate saw the bound port refuse, which
    # is what tells a vLLM loading from a wrong port (issue 34 item 4)
    waited = watch.gate_stdout.with_name("gate.err").read_text()
    assert f"{watch.server.url.removeprefix('http://')} is bound but not listening yet: a vLLM loading" in waited
    assert "is the port right?" not in waited


def test_gate_with_the_tools_smoke_passes_on_the_real_server(vllm_server: RunningServer):
    code, verdict, _ = run_gate("--url", f"{vllm_server.url}/v1", "--model", vllm_server.model,
                                "--smoke", "tools", "--timeout", "60")
    assert code == 0 and verdict["ready"] is True
    assert list(verdict["stages"]) == ["health", "models", "completion", "smoke-tools"]
