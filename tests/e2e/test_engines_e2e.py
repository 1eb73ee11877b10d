"""Two real CPU vLLM engines of the tiny Gemma 4 behind the VM's real front (Debian's HAProxy with components/front.py's
config): the CPU analogue of a ct6e-standard-4t's engines, each bound to one core (VLLM_CPU_OMP_THREADS_BIND) as
each TPU engine to its chip. Requests through the front are spread over both, the readiness check passes through it,
/metrics through it is always one engine's, and killing one engine leaves the front serving every request."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from tests.e2e import cpu_server
from tests.e2e.conftest import SERVED_MODEL_NAME, wait_healthy_or_fail
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


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def front(vllm_bin: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[tuple[str, list[RunningServer]]]:
    log_dir = tmp_path_factory.mktemp("engines")
    cores = sorted(os.sched_getaffinity(0))
    with ExitStack() as running:
        engines = []
        for index in range(2):
            cfg = cpu_server.cpu_serving_config(tiny_model_dir, SERVED_MODEL_NAME, free_local_port())
            engine = cpu_server.start_server(vllm_bin, cfg, SERVED_MODEL_NAME, log_dir / f"vllm-{index}.log",
                                             env={"VLLM_CPU_OMP_THREADS_BIND": str(cores[index % len(cores)])})
            running.callback(cpu_server.stop_server, engine)
            engines.append(engine)
        for engine in engines:
            wait_healthy_or_fail(engine)
        url, _ = running.enter_context(haproxy_front(log_dir, free_local_port(),
                                                     [(f"vllm-{i}", port_of(e)) for i, e in enumerate(engines)]))
        yield url, engines


def completion(url: str) -> int:
    """One chat completion through `url`; its HTTP status."""
    return requests.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": SERVED_MODEL_NAME, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]},
    ).status_code


def finished(server: RunningServer) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return vllm_metrics.parse(text, time.time()).total(vllm_metrics.REQUEST_SUCCESS) or 0.0


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


def test_killing_one_engine_leaves_the_front_serving(front):
    url, engines = front
    cpu_server.stop_server(engines[1])  # its whole process group, as a crashed container takes its engine
    assert engines[1].process.poll() is not None
    statuses = [completion(url) for _ in range(4)]  # at once: a refused connection is redispatched
    time.sleep(DOWN_AFTER_S)  # and once the checks took it out
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses += list(pool.map(lambda _: completion(url), range(8)))
    assert statuses == [200] * 12
    assert readycheck.check(url, SERVED_MODEL_NAME, timeout_s=60)[0]
    assert engines[0].process.poll() is None
