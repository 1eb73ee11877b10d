"""Issue #27, item 2 on the real CPU vLLM: a server sent SIGTERM in the middle of a sweep's level (what `docker stop`
or a VM's shutdown sends) ends the sweep, keeping the level that finished, instead of hanging on requests the
stopped engine never answers. Its own server (the session's is shared), so it can be stopped; the fast tier's
tests/cli/test_bench_sweep.py covers the same against a fake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import REPO, serve, wait_healthy_or_fail
from tpuserve import vllm_metrics

pytestmark = pytest.mark.e2e

CONDITION_TIMEOUT_S = 300  # every wait is for a condition; this bounds each on a busy machine
# Once stopped, the sweep notices within its liveness limit (30 s without an answer from /health) and a poll.
ENDS_WITHIN_S = 120


def running(url: str) -> float:
    try:
        scrape = vllm_metrics.parse(requests.get(f"{url}/metrics", timeout=10).text, 0.0)
    except requests.RequestException:
        return 0.0
    return scrape.total(vllm_metrics.RUNNING) or 0.0


def test_a_server_stopped_mid_level_ends_the_sweep_keeping_what_finished(vllm_bin: Path, tiny_model_dir: Path,
                                                                         tmp_path: Path):
    out = tmp_path / "run"
    with serve(vllm_bin, tiny_model_dir, tmp_path) as server:
        wait_healthy_or_fail(server)
        with (tmp_path / "sweep.err").open("w") as err:
            sweep = subprocess.Popen(
                [sys.executable, "-m", "tpuserve", "bench", "sweep", "--url", server.url, "--model", server.model,
                 "--tokenizer", str(server.model_dir), "--vllm-bin", str(vllm_bin), "--concurrency", "1,4,8",
                 "--input-len", "64", "--output-len", "128", "--num-prompts", "16", "--out", str(out)],
                stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
        deadline = time.monotonic() + CONDITION_TIMEOUT_S
        while not ((out / "c1.json").exists() and running(server.url)):  # level 4's requests are in flight
            assert sweep.poll() is None, (tmp_path / "sweep.err").read_text()
            assert time.monotonic() < deadline, "level 4 never had requests running"
            time.sleep(0.2)
        server.process.send_signal(signal.SIGTERM)  # to vLLM's API server, as `docker stop` sends it
        stopped_at = time.monotonic()
        stdout, _ = sweep.communicate(timeout=CONDITION_TIMEOUT_S)
        took = time.monotonic() - stopped_at
    stderr = (tmp_path / "sweep.err").read_text()
    print(f"\nthe sweep ended {took:.0f} s after SIGTERM:\n{stderr[-1500:]}")
    assert sweep.returncode == 1, stderr
    assert took < ENDS_WITHIN_S
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["finished_at"] is None and manifest["unfinished"]["concurrency"] in (4, 8)
    assert [run["concurrency"] for run in manifest["runs"]][:1] == [1]  # what finished is kept
    assert "the sweep ended early: concurrency 1" in stderr and "sweep.json is marked unfinished" in stderr
    assert "Traceback" not in stderr and stdout == ""
