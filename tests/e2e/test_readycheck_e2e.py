"""Real vLLM: vm/readycheck.py (the gke readiness probe) against the CPU `vllm serve` of the tiny Gemma 4 (the
session's shared server, see conftest.py), run as the kubelet runs it: the file alone with the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cpu_server import RunningServer

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "vm" / "readycheck.py"


def probe(url: str, model: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(SCRIPT), "--url", url, "--model", model, "--timeout", "30"],
                          capture_output=True, text=True, timeout=120, cwd="/")


def test_probe_passes_on_the_real_server(vllm_server: RunningServer) -> None:
    done = probe(vllm_server.url, vllm_server.model)
    assert (done.returncode, done.stdout.strip()) == (0, f"ready: {vllm_server.model} answered at {vllm_server.url}")


def test_probe_fails_for_a_model_the_real_server_does_not_serve(vllm_server: RunningServer) -> None:
    done = probe(f"{vllm_server.url}/v1", "google/gemma-4-E4B-it")
    assert done.returncode == 1
    assert done.stdout.strip() == f"models: /v1/models lists ['{vllm_server.model}'], not 'google/gemma-4-E4B-it'"
