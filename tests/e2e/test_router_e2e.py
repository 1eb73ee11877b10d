"""A fleet's routing with the real `litellm` on 127.0.0.1.

- A `litellm.Router` built from the single-server form (`tpuserve litellm --url ... --alias ...`) completes through
  the alias against the fake OpenAI server (tests/fake_openai.py), sending the key by reference from the environment.
- The Python `litellm.Router`, built from the config `tpuserve litellm --replica ...` generates (what the router VM
  loads), in front of the real CPU vLLM server (tiny random Gemma 4, tests/e2e/conftest.py) and a fake replica that
  answers 503 (the OpenAI error body vLLM's server sends): every request ends 200, and the failing replica is
  cooled down. Regenerating the config without it, or with another replica, changes where requests go.
- The real LiteLLM proxy (`litellm --run_gunicorn`, the version the router VM's image pins, one worker per
  container) driven by the router agent (vm/router_agent.py) through a `docker` shim that runs each container as a
  local process: behind real HAProxy (the agent's haproxy_config), a config change while requests are in flight is
  applied in place; every request ends 200, the ones in flight on the old replica finish there, new ones go to the
  new replica, which first answered the agent's pinned completion. One worker cools a failing replica down for
  every request of the next burst; two containers sharing a real redis-server (Debian's, as on the VM) cool it down
  for each other. Fake replicas answer after a delay (recorded vLLM body shape, tests/fake_openai.py) so requests
  are in flight during the reload. About one start in three wedges its worker (vm/router_agent.py's docstring):
  the agent then re-forks it, and the tests still pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner

from tests.e2e.processes import background, find_binary, stop_process_group, wait_for_port
from tests.fake_openai import FAKE_MODEL, FakeOpenAI, completion
from tests.httpfake import FakeServer, Request, Response
from tests.test_router_agent import Metadata
from tpuserve.cli import main
from tpuserve.deploy.litellm_config import ALLOWED_FAILS, COOLDOWN_S, NUM_RETRIES
from tpuserve.deploy.stack import free_local_port
from vm import router_agent

pytestmark = pytest.mark.e2e

# vLLM's OpenAI server answers an overloaded or failing engine with this body shape (vllm/entrypoints/openai
# ErrorResponse: message, type, param, code).
UNAVAILABLE = {"error": {"message": "Service Unavailable", "type": "ServiceUnavailableError", "param": None,
                         "code": 503}}
MASTER_KEY = "sk-e2e-router-5b1f0c9d2e7a4b6c8d0e1f2a3b4c5d6e"


def generated_router(*replicas: str, model: str) -> Any:
    """A litellm.Router from `tpuserve litellm --replica ...`'s file: its model list and router_settings."""
    import litellm

    result = CliRunner().invoke(main, ["litellm", "--model", model,
                                       *(arg for replica in replicas for arg in ("--replica", replica))])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.output)
    return litellm.Router(model_list=config["model_list"], **config["router_settings"])


def run_async(coroutine: Any) -> Any:
    """asyncio.run (which also cancels LiteLLM's background logging tasks before closing its loop), then the thread's
    current loop put back: asyncio.run leaves none, and the Pulumi mocks of later tests ask for it
    (asyncio.get_event_loop)."""
    current = asyncio.get_event_loop_policy().get_event_loop()
    try:
        return asyncio.run(coroutine)
    finally:
        asyncio.set_event_loop(current)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price map from the internet
    monkeypatch.setenv("TPUSERVE_API_KEY", "none")  # vLLM has no key; LiteLLM needs a value


def test_a_failing_replica_is_cooled_down_and_every_request_ends_200(vllm_server, offline) -> None:
    """Concurrent requests (least-busy then picks the failing replica too): each failure is retried on the other
    replica, and the second failure within the minute (allowed_fails 1) cools the failing one down for 30 s."""
    hits: list[str] = []

    def unavailable(request: Request) -> Response:
        hits.append(request.path)
        return Response(503, UNAVAILABLE)

    async def burst(router: Any, count: int) -> list[Any]:
        return await asyncio.gather(*(router.acompletion(
            model=vllm_server.model, messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=4,
            temperature=0) for i in range(count)))

    with FakeServer({("POST", "/v1/chat/completions"): unavailable}) as failing:
        router = generated_router(f"dev-r1={vllm_server.url}", f"dev-r2={failing.url}", model=vllm_server.model)
        first = run_async(burst(router, 12))
        cooled = router.health().cooldowns.get_active_cooldowns(model_ids=["dev-r1", "dev-r2"],
                                                                parent_otel_span=None)
        hits_when_cooled = len(hits)
        later = run_async(burst(router, 8))

    assert all(reply.usage.completion_tokens > 0 for reply in first + later)  # every one answered by the real vLLM
    assert hits_when_cooled >= 2
    assert [(deployment, info["status_code"], info["cooldown_time"]) for deployment, info in cooled] == [
        ("dev-r2", "503", 30)]
    assert len(hits) == hits_when_cooled  # while cooled down, no request reaches it


def test_adding_and_removing_a_replica_in_the_config_changes_where_requests_go(vllm_server, offline) -> None:
    """least-busy sends concurrent requests to the replica with fewer in flight: with a second replica in the
    config both serve; regenerated without it, only vLLM does."""
    served: list[str] = []

    def slow_replica(request: Request) -> Response:
        served.append("dev-r3")
        time.sleep(0.5)
        return Response(200, {**completion("from dev-r3"), "model": vllm_server.model})

    async def burst(router: Any, count: int) -> list[str]:
        replies = await asyncio.gather(*(router.acompletion(
            model=vllm_server.model, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=4,
            temperature=0) for i in range(count)))
        return ["dev-r3" if reply.choices[0].message.content == "from dev-r3" else "dev-r1" for reply in replies]

    with FakeServer({("POST", "/v1/chat/completions"): slow_replica}) as second:
        both = run_async(burst(generated_router(f"dev-r1={vllm_server.url}", f"dev-r3={second.url}",
                                                  model=vllm_server.model), 8))
        alone = run_async(burst(generated_router(f"dev-r1={vllm_server.url}", model=vllm_server.model), 8))

    assert both.count("dev-r3") >= 2 and both.count("dev-r1") >= 2, both
    assert alone == ["dev-r1"] * 8
    assert served.count("dev-r3") == both.count("dev-r3")  # no request reached dev-r3 once it left the config


# --- the proxy itself, as the router VM runs it: the agent, its containers, HAProxy, Redis -----------------------------

DOCKER_SHIM = """#!{python}
# `docker` for vm/router_agent.py on a machine without Docker: `run` starts the proxy (the arguments after the
# image are the litellm CLI's) as a local process, `kill --signal HUP` signals it, `inspect` says whether it runs;
# one pid file per container name.
import os, signal, subprocess, sys
home = os.environ["SHIM_HOME"]
args = sys.argv[1:]
name = args[args.index("--name") + 1] if args[0] == "run" else args[-1]
pid_file = os.path.join(home, name + ".pid")
def alive():
    try:
        os.kill(int(open(pid_file).read()), 0)
        return True
    except (OSError, ValueError):
        return False
if args[0] == "inspect":
    print("true" if alive() else "false")
elif args[0] == "run":
    env_file = args[args.index("--env-file") + 1]
    env = dict(os.environ, **dict(line.split("=", 1) for line in open(env_file).read().splitlines() if line))
    cli = args[args.index(os.environ["SHIM_IMAGE"]) + 1:]
    with open(os.path.join(home, name + ".log"), "ab") as log:
        process = subprocess.Popen([os.environ["SHIM_LITELLM"], *cli], env=env, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    open(pid_file, "w").write(str(process.pid))
    print("c0ffee")
elif args[0] == "kill":
    os.kill(int(open(pid_file).read()), getattr(signal, "SIG" + args[args.index("--signal") + 1]))
"""
IMAGE = "ghcr.io/berriai/litellm:test"


def needed_binary(name: str) -> str:
    try:
        return find_binary(name)
    except FileNotFoundError as missing:
        pytest.fail(str(missing))


def proxy_config(replicas: dict[str, str]) -> str:
    """The router VM's config for these replicas: the generator's output as JSON, as components/router.py ships it."""
    args = [arg for name, url in replicas.items() for arg in ("--replica", f"{name}={url}")]
    result = CliRunner().invoke(main, ["litellm", "--model", "tiny-gemma4", *args])
    assert result.exit_code == 0, result.output
    return json.dumps(yaml.safe_load(result.output), indent=1)


@dataclass
class RouterVm:
    """The agent driving real proxies through the docker shim, with the metadata fake it watches."""

    agent: router_agent.Agent
    metadata: Metadata
    home: Path

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}, last 4000 characters ---\n{log.read_text(errors='replace')[-4000:]}"
                         for log in sorted(self.home.glob("*.log")))

    def chat(self, port: int, text: str, model: str = "tiny-gemma4", timeout_s: float = 60.0) -> requests.Response:
        return requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=timeout_s,
                             headers={"Authorization": f"Bearer {MASTER_KEY}"},
                             json={"model": model, "messages": [{"role": "user", "content": text}]})


@pytest.fixture
def router_vm(litellm_proxy_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """router_vm(replicas, proxies=1, redis_port=None) -> RouterVm: the agent started on that config (proxies on
    free ports, one worker each); every proxy is stopped by its process group afterwards."""
    bin_dir, home, run_dir = (tmp_path / name for name in ("bin", "shim", "run"))
    for folder in (bin_dir, home, run_dir):
        folder.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(DOCKER_SHIM.format(python=sys.executable))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SHIM_HOME", str(home))
    monkeypatch.setenv("SHIM_LITELLM", str(litellm_proxy_bin))
    monkeypatch.setenv("SHIM_IMAGE", IMAGE)
    (run_dir / "master-key").write_text(MASTER_KEY)
    made: list[RouterVm] = []

    with contextlib.ExitStack() as stack:
        def start(replicas: dict[str, str], proxies: int = 1, redis_port: int | None = None) -> RouterVm:
            metadata = Metadata(proxy_config(replicas))
            meta = stack.enter_context(FakeServer(metadata.routes()))
            port = free_local_port()
            while any(not port_free(port + offset) for offset in range(proxies + 1)):
                port = free_local_port()
            agent = router_agent.Agent(IMAGE, str(tmp_path / "etc"), str(run_dir / "master-key"), "tpu-serve",
                                       port=port, proxies=proxies, metadata_url=meta.url, docker=str(shim),
                                       redis_port=redis_port or router_agent.REDIS_PORT, confirm_timeout_s=240.0,
                                       poll_s=0.5)
            vm = RouterVm(agent, metadata, home)
            made.append(vm)
            agent.step(wait=False)  # starts the real proxies on the first config
            assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)
            return vm

        try:
            yield start
        finally:
            for pid_file in home.glob("*.pid"):
                stop_process_group(int(pid_file.read_text()))
            for vm in made:
                print("--- the agent's log ---", *vm.agent.log, sep="\n")  # shown on failure
                print(vm.logs())


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def delayed(name: str, delay_s: float) -> Any:
    def answer(request: Request) -> Response:
        time.sleep(delay_s)
        return Response(200, {**completion(f"from {name}"), "model": "tiny-gemma4"})
    return answer


def test_the_router_applies_a_new_replica_set_without_dropping_a_request(router_vm, tmp_path: Path) -> None:
    """Through HAProxy on the router's port, as clients reach it: a config change while requests are in flight is
    applied in place; every request ends 200, those in flight on the old replica finish there, new ones go to the
    new replica."""
    with FakeServer({("POST", "/v1/chat/completions"): delayed("dev-r1", 3.0)}) as old, \
            FakeServer({("POST", "/v1/chat/completions"): delayed("dev-r2", 0.0)}) as new:
        vm = router_vm({"dev-r1": old.url})
        haproxy = tmp_path / "haproxy.cfg"
        haproxy.write_text(router_agent.haproxy_config(vm.agent.port, [vm.agent.proxy_port(0)]))
        with background([needed_binary("haproxy"), "-db", "-f", str(haproxy)], tmp_path / "haproxy.log"):
            wait_for_port(vm.agent.port)
            results: list[dict[str, Any]] = []

            def ask(index: int) -> None:
                began = time.monotonic()
                try:
                    response = vm.chat(vm.agent.port, f"q{index}")
                except requests.RequestException as err:  # a refused or cut connection is a dropped request
                    results.append({"index": index, "began": began, "status": repr(err), "by": None})
                    return
                body = response.json() if response.ok else {}
                results.append({"index": index, "began": began, "status": response.status_code,
                                "by": (body.get("choices") or [{}])[0].get("message", {}).get("content")})

            ask(-1)  # warm: the first request of a fresh proxy is slow; a router being changed has served many
            assert results.pop()["status"] == 200, vm.logs()
            threads = []
            for index in range(6):  # in flight on dev-r1 (3 s each) when the config changes
                threads.append(threading.Thread(target=ask, args=(index,)))
                threads[-1].start()
                time.sleep(0.2)
            vm.metadata.set(proxy_config({"dev-r2": new.url}))
            vm.agent.step()  # writes the file, SIGHUPs gunicorn, waits until /model/info lists only dev-r2
            applied = time.monotonic()
            for index in range(6, 12):
                threads.append(threading.Thread(target=ask, args=(index,)))
                threads[-1].start()
                time.sleep(0.2)
            for thread in threads:
                thread.join()

    log = vm.logs()
    assert [r["status"] for r in sorted(results, key=lambda r: r["index"])] == [200] * 12, (results, log[-3000:])
    assert {r["by"] for r in results if r["index"] < 6} == {"from dev-r1"}  # finished where they started
    assert {r["by"] for r in results if r["began"] > applied} == {"from dev-r2"}
    assert vm.metadata.attributes["config-hash"] == router_agent.digest(vm.metadata.value)
    assert "Handling signal: hup" in log  # gunicorn's own line: a reload, not a restart
    # Before reporting the new config, a real completion pinned to the new replica went through the proxy.
    assert json.loads(vm.metadata.attributes["answered"]) == {"config": router_agent.digest(vm.metadata.value),
                                                              "deployments": {"dev-r2": "ok"}}
    assert any(b"Say hello." in request.body for request in new.requests)  # the pinned one reached dev-r2


def failing_and_healthy() -> tuple[list[str], dict[str, bool], FakeServer, FakeServer]:
    """A replica that answers (the agent's pinned completion finds it healthy) until `state["failing"]`, then 503
    (the body vLLM's server sends), recording each request it fails; and one that always answers."""
    hits: list[str] = []
    state = {"failing": False}

    def flaky(request: Request) -> Response:
        if not state["failing"]:
            return Response(200, {**completion("from dev-r2"), "model": "tiny-gemma4"})
        hits.append(request.json()["messages"][0]["content"])
        return Response(503, UNAVAILABLE)

    return (hits, state, FakeServer({("POST", "/v1/chat/completions"): flaky}),
            FakeServer({("POST", "/v1/chat/completions"): delayed("dev-r1", 0.05)}))


def burst(vm: RouterVm, port: int, prefix: str, count: int, parallel: int = 4) -> list[requests.Response]:
    """`count` requests, `parallel` at a time (so least-busy, which sends to the replica with fewer in flight, has
    the failing one idle and picks it whenever it may)."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda index: vm.chat(port, f"{prefix}{index}"), range(count)))


def until_cooled(vm: RouterVm, port: int, hits: list[str], prefix: str) -> list[tuple[str, requests.Response]]:
    """Bursts until the failing replica failed more than allowed_fails times (least-busy sends it requests only
    while the healthy one is busy), then a second for LiteLLM's failure callbacks, which set the cooldown in the
    background, to have run. Returns each request's text with its reply."""
    replies: list[tuple[str, requests.Response]] = []
    for round_ in range(10):
        texts = [f"{prefix}{round_}-{index}" for index in range(8)]
        replies += zip(texts, burst(vm, port, f"{prefix}{round_}-", 8))
        if len(hits) > ALLOWED_FAILS:
            time.sleep(1.0)
            return replies
    raise AssertionError(f"the failing replica was asked {len(hits)} times in 80 requests: {vm.logs()[-3000:]}")


def assert_before_the_cooldown(warm: list[tuple[str, requests.Response]], hits: list[str]) -> None:
    """Before the failing replica is cooled down a client may get its 503, and only when every attempt went there:
    LiteLLM 1.108.7 retries a retryable status at once (`Router._time_to_sleep_before_retry` is 0 while another
    deployment is healthy) without skipping the deployment that failed (`_deployment_ids_to_skip_on_retry` skips
    only statuses `litellm.should_retry` refuses), least-busy prefers the idle failing replica, and the cooldown is
    set by a failure callback that may land after the last retry. Every other reply is 200 from the healthy one."""
    for text, reply in warm:
        if reply.status_code == 503:
            assert hits.count(text) == NUM_RETRIES + 1, (text, hits)  # the first try and every retry
        else:
            assert reply.status_code == 200, (text, reply.status_code, reply.text[:300])
            assert reply.json()["choices"][0]["message"]["content"] == "from dev-r1"


def test_one_worker_per_container_cools_a_failing_replica_down_for_every_request(router_vm) -> None:
    """A real proxy of one worker: once the failing replica failed more than allowed_fails times in the minute
    (LiteLLM's cooldown rule), it gets none of the next 40 requests, 4 at a time (least-busy would pick the idle
    failing replica whenever the healthy one is busy), and every one of them ends 200 from the healthy replica.
    Before the cooldown a client may see the failing replica's 503 (assert_before_the_cooldown says when)."""
    hits, state, failing, healthy = failing_and_healthy()
    with failing, healthy:
        vm = router_vm({"dev-r1": healthy.url, "dev-r2": failing.url})
        assert json.loads(vm.metadata.attributes["answered"])["deployments"] == {"dev-r1": "ok", "dev-r2": "ok"}
        state["failing"] = True
        started = time.monotonic()
        warm = until_cooled(vm, vm.agent.proxy_port(0), hits, "warm-")
        replies = burst(vm, vm.agent.proxy_port(0), "q", 40)
        elapsed = time.monotonic() - started
        # A pinned completion reports the failing replica as it is (and never counts a healthy one for it).
        vm.metadata.set(proxy_config({"dev-r1": healthy.url, "dev-r2": failing.url, "dev-r3": healthy.url}))
        vm.agent.step()

    assert elapsed < COOLDOWN_S  # the whole run fell inside one cooldown
    assert_before_the_cooldown(warm, hits)
    assert [reply.status_code for reply in replies] == [200] * 40
    assert {reply.json()["choices"][0]["message"]["content"] for reply in replies} == {"from dev-r1"}
    assert [hit for hit in hits if hit.startswith("q")] == [], hits  # none of the 40 was sent to it
    deployments = json.loads(vm.metadata.attributes["answered"])["deployments"]
    assert deployments["dev-r1"] == deployments["dev-r3"] == "ok"
    assert deployments["dev-r2"].startswith("HTTP 503"), deployments


def test_containers_sharing_redis_cool_a_replica_down_for_each_other(router_vm, tmp_path: Path) -> None:
    """Two containers of one worker each and the local Redis, as on a router VM with two vCPUs: the failures one
    container saw cool the replica down in the other too, which sends it nothing (without Redis each would need
    its own allowed_fails + 1 failures: "What Needs Redis", docs.litellm.ai)."""
    redis_port = free_local_port()
    with background([needed_binary("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no"], tmp_path / "redis.log"):
        wait_for_port(redis_port)
        hits, state, failing, healthy = failing_and_healthy()
        with failing, healthy:
            vm = router_vm({"dev-r1": healthy.url, "dev-r2": failing.url}, proxies=2, redis_port=redis_port)
            state["failing"] = True
            first = until_cooled(vm, vm.agent.proxy_port(0), hits, "first-")
            time.sleep(1.0)  # a sibling re-reads cooldowns from Redis every second (the agent's docstring)
            second = burst(vm, vm.agent.proxy_port(1), "second-", 40)

    assert_before_the_cooldown(first, hits)
    assert [reply.status_code for reply in second] == [200] * 40
    assert len(hits) > ALLOWED_FAILS, hits
    assert [hit for hit in hits if hit.startswith("second-")] == [], hits  # the second container never tried it
    assert json.loads((tmp_path / "etc" / "config.yaml").read_text())["router_settings"]["redis_port"] == redis_port


def test_a_litellm_router_built_from_the_file_completes_through_the_alias(offline, monkeypatch) -> None:
    import litellm

    monkeypatch.setenv("TPUSERVE_API_KEY", "canary-key-for-the-fake")
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(main, ["litellm", "--url", fake.url, "--model", FAKE_MODEL,
                                           "--alias", "gemini-2.0-flash"])
        assert result.exit_code == 0, result.output
        router = litellm.Router(model_list=yaml.safe_load(result.output)["model_list"])
        response = router.completion(model="gemini-2.0-flash", messages=[{"role": "user", "content": "Hi there"}])
    assert response.choices[0].message.content == "Answer to: Hi there"
    sent = fake.requests[-1]
    assert sent.path == "/v1/chat/completions" and sent.json()["model"] == FAKE_MODEL
    assert {k.lower(): v for k, v in sent.headers.items()}["authorization"] == "Bearer canary-key-for-the-fake"
