"""Two real CPU vLLM engines of the tiny Gemma 4 behind the VM's real front (Debian's HAProxy with components/front.py's
config): the session's dev server and the spare one (conftest.py), the CPU analogue of a ct6e-standard-4t's engines.
Requests through the front are spread over both, the readiness check passes through it, and /metrics through it is
always one engine's. Then the spare is sent SIGTERM in the middle of a sweep's level (what `docker stop` or a VM's
shutdown sends; issue #27, item 2): the sweep against it ends, keeping the level that finished, instead of hanging on
requests the stopped engine never answers (tests/cli/test_bench_sweep.py holds the same against a fake), and the front
keeps serving every request, at once and after its checks took the engine out."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e import cpu_server
from tests.e2e.conftest import REPO, SERVED_MODEL_NAME
from tests.e2e.cpu_server import RunningServer
from tests.e2e.processes import haproxy_front
from tpuserve import vllm_metrics
from tpuserve.deploy.stack import free_local_port
from vm import readycheck

pytestmark = pytest.mark.e2e

REQUESTS = 16
# The front marks an engine down after two failed checks 2 s apart (components/front.py); until then a refused
# connection is redispatched to the other engine.
DOWN_AFTER_S = 5.0
CONDITION_TIMEOUT_S = 300  # every wait is for a condition; this bounds each on a busy machine
# Once stopped, the sweep notices within its liveness limit (30 s without an answer from /health) and a poll.
ENDS_WITHIN_S = 120


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def front(vllm_server: RunningServer, spare_server: RunningServer, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[tuple[str, list[RunningServer]]]:
    engines = [vllm_server, spare_server]
    with haproxy_front(tmp_path_factory.mktemp("engines"), free_local_port(),
                       [(f"vllm-{i}", port_of(e)) for i, e in enumerate(engines)]) as (url, _):
        yield url, engines


def completion(url: str) -> int:
    """One chat completion through `url`; its HTTP status."""
    return requests.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": SERVED_MODEL_NAME, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]},
    ).status_code


def finished(server: RunningServer) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return vllm_metrics.parse(text, time.time()).total(vllm_metrics.REQUEST_SUCCESS) or 0.0


def running(url: str) -> float:
    try:
        scrape = vllm_metrics.parse(requests.get(f"{url}/metrics", timeout=10).text, 0.0)
    except requests.RequestException:
        return 0.0
    return scrape.total(vllm_metrics.RUNNING) or 0.0


def refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def test_requests_through_the_front_are_spread_over_both_engines(front):
    url, engines = front
    assert readycheck.check(url, SERVED_MODEL_NAME, timeout_s=60) == (True, f"ready: {SERVED_MODEL_NAME} answered at "
                                                                            f"{url}")
    before = [finished(engine) for engine in engines]
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(lambda _: completion(url), range(REQUESTS)))
    served = [finished(engine) - already for engine, already in zip(engines, before, strict=True)]
    assert statuses == [200] * REQUESTS
    assert sum(served) == REQUESTS and min(served) >= REQUESTS // 4, served  # leastconn: both take a share
    # /metrics through the front is the first engine's (balance first), so `tpuserve status` reads one engine
    front_text = requests.get(f"{url}/metrics", timeout=10).text
    assert vllm_metrics.parse(front_text, 0).total(vllm_metrics.REQUEST_SUCCESS) == finished(engines[0])


def test_an_engine_stopped_mid_level_ends_the_sweep_keeping_what_finished_and_the_front_serves_on(
        front, vllm_bin: Path, tmp_path: Path):
    url, (kept, stopped) = front
    out = tmp_path / "run"
    with (tmp_path / "sweep.err").open("w") as err:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "bench", "sweep", "--url", stopped.url, "--model", stopped.model,
             "--tokenizer", str(stopped.model_dir), "--vllm-bin", str(vllm_bin), "--concurrency", "1,4,8",
             "--input-len", "64", "--output-len", "128", "--num-prompts", "16", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + CONDITION_TIMEOUT_S
        while not ((out / "c1.json").exists() and running(stopped.url)):  # level 4's requests are in flight
            assert sweep.poll() is None, (tmp_path / "sweep.err").read_text()
            assert time.monotonic() < deadline, "level 4 never had requests running"
            time.sleep(0.2)
        stopped.process.send_signal(signal.SIGTERM)  # to vLLM's API server, as `docker stop` sends it
        stopped_at = time.monotonic()
        # It closes its listening socket at once and waits for the requests in flight, which its engine never answers
        while not refuses(port_of(stopped)):
            assert time.monotonic() - stopped_at < 60, "the stopped server still accepts connections after 60 s"
            time.sleep(0.1)
        statuses = [completion(url) for _ in range(4)]  # at once: a refused connection is redispatched
        stdout, _ = sweep.communicate(timeout=CONDITION_TIMEOUT_S)
        took = time.monotonic() - stopped_at
    finally:
        if sweep.poll() is None:
            sweep.kill()
    cpu_server.stop_server(stopped)  # and what is left of its process group, as a crashed container takes its engine
    time.sleep(DOWN_AFTER_S)  # once the checks took it out
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses += list(pool.map(lambda _: completion(url), range(8)))
    assert statuses == [200] * 12
    assert readycheck.check(url, SERVED_MODEL_NAME, timeout_s=60)[0]
    assert kept.process.poll() is None

    stderr = (tmp_path / "sweep.err").read_text()
    print(f"\nthe sweep ended {took:.0f} s after SIGTERM:\n{stderr[-1500:]}")
    assert sweep.returncode == 1, stderr
    assert took < ENDS_WITHIN_S
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["finished_at"] is None and manifest["unfinished"]["concurrency"] in (4, 8)
    assert [run["concurrency"] for run in manifest["runs"]][:1] == [1]  # what finished is kept
    assert "the sweep ended early: concurrency 1" in stderr and "sweep.json is marked unfinished" in stderr
    assert "Traceback" not in stderr and stdout == ""
