"""A fleet's routing with the real `litellm` on 127.0.0.1.

- A `litellm.Router` built from the single-server form (`tpuserve litellm --url ... --alias ...`) completes through
  the alias against the fake OpenAI server (tests/fake_openai.py), sending the key by reference from the environment.
- The Python `litellm.Router`, built from the config `tpuserve litellm --replica ...` generates (what the router VM
  loads), in front of the real CPU vLLM server (tiny random Gemma 4, tests/e2e/conftest.py) and a fake replica that
  answers 503 (the OpenAI error body vLLM's server sends): every request ends 200, and the failing replica is
  cooled down. Regenerating the config without it, or with another replica, changes where requests go.
- The real LiteLLM proxy (`litellm --run_gunicorn`, the version the router VM's image pins) driven by the router
  agent (vm/router_agent.py) through a `docker` shim that runs the proxy as a local process: a config change while
  requests are in flight is applied in place; every request ends 200, the ones in flight on the old replica
  finish there, and new ones go to the new replica. Fake replicas there answer after a delay (recorded vLLM body
  shape, tests/fake_openai.py) so requests are in flight during the reload. About one start in three wedges its
  worker (vm/router_agent.py's docstring): the agent then re-forks it, and the test still passes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner

from tests.fake_openai import FAKE_MODEL, FakeOpenAI, completion
from tests.httpfake import FakeServer, Request, Response
from tests.test_router_agent import Metadata
from tpuserve.cli import main
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


# --- the proxy itself, reloaded in place by the agent -----------------------------------------------------------------

DOCKER_SHIM = """#!{python}
# `docker` for vm/router_agent.py on a machine without Docker: `run` starts the proxy (the arguments after the
# image are the litellm CLI's) as a local process on 127.0.0.1, `kill --signal HUP` signals it, `inspect` says
# whether it runs.
import os, signal, subprocess, sys
home = os.environ["SHIM_HOME"]
pid_file = os.path.join(home, "proxy.pid")
args = sys.argv[1:]
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
    cli[cli.index("--host") + 1] = "127.0.0.1"
    with open(os.path.join(home, "proxy.log"), "ab") as log:
        process = subprocess.Popen([os.environ["SHIM_LITELLM"], *cli], env=env, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    open(pid_file, "w").write(str(process.pid))
    print("c0ffee")
elif args[0] == "kill":
    os.kill(int(open(pid_file).read()), getattr(signal, "SIG" + args[args.index("--signal") + 1]))
"""


def stop_process_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the proxy's process group, SIGKILL what is left after grace_s: gunicorn waits its graceful timeout for
    a wedged worker, and the e2e tier has no memory to spare for one."""
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)


def proxy_config(replicas: dict[str, str]) -> str:
    """The router VM's config for these replicas: the generator's output as JSON, as components/router.py ships it."""
    args = [arg for name, url in replicas.items() for arg in ("--replica", f"{name}={url}")]
    result = CliRunner().invoke(main, ["litellm", "--model", "tiny-gemma4", *args])
    assert result.exit_code == 0, result.output
    return json.dumps(yaml.safe_load(result.output), indent=1)


def test_the_router_applies_a_new_replica_set_without_dropping_a_request(litellm_proxy_bin: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, shim_home, config_dir, run_dir = (tmp_path / name for name in ("bin", "shim", "etc", "run"))
    for folder in (bin_dir, shim_home, run_dir):
        folder.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(DOCKER_SHIM.format(python=sys.executable))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SHIM_HOME", str(shim_home))
    monkeypatch.setenv("SHIM_LITELLM", str(litellm_proxy_bin))
    monkeypatch.setenv("SHIM_IMAGE", "ghcr.io/berriai/litellm:test")
    (run_dir / "master-key").write_text(MASTER_KEY)

    def replica(name: str, delay_s: float) -> Any:
        def answer(request: Request) -> Response:
            time.sleep(delay_s)
            return Response(200, {**completion(f"from {name}"), "model": "tiny-gemma4"})
        return answer

    with FakeServer({("POST", "/v1/chat/completions"): replica("dev-r1", 3.0)}) as old, \
            FakeServer({("POST", "/v1/chat/completions"): replica("dev-r2", 0.0)}) as new:
        metadata = Metadata(proxy_config({"dev-r1": old.url}))
        port = free_local_port()
        with FakeServer(metadata.routes()) as meta:
            agent = router_agent.Agent("ghcr.io/berriai/litellm:test", str(config_dir), str(run_dir / "master-key"),
                                       "tpu-serve", port=port, workers=1, metadata_url=meta.url, docker=str(shim),
                                       confirm_timeout_s=240.0, poll_s=0.5)
            try:
                agent.step(wait=False)  # starts the real proxy on the first config
                assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)
                results: list[dict[str, Any]] = []

                def ask(index: int) -> None:
                    began = time.monotonic()
                    try:
                        response = requests.post(
                            f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                            headers={"Authorization": f"Bearer {MASTER_KEY}"},
                            json={"model": "tiny-gemma4", "messages": [{"role": "user", "content": f"q{index}"}]})
                    except requests.RequestException as err:  # a refused or cut connection is a dropped request
                        results.append({"index": index, "began": began, "status": repr(err), "by": None})
                        return
                    body = response.json() if response.ok else {}
                    results.append({"index": index, "began": began, "status": response.status_code,
                                    "by": (body.get("choices") or [{}])[0].get("message", {}).get("content")})

                ask(-1)  # warm: the first request of a fresh proxy is slow; a router being changed has served many
                assert results.pop()["status"] == 200
                threads = []
                for index in range(6):  # in flight on dev-r1 (3 s each) when the config changes
                    threads.append(threading.Thread(target=ask, args=(index,)))
                    threads[-1].start()
                    time.sleep(0.2)
                metadata.set(proxy_config({"dev-r2": new.url}))
                agent.step()  # writes the file, SIGHUPs gunicorn, waits until /model/info lists only dev-r2
                applied = time.monotonic()
                for index in range(6, 12):
                    threads.append(threading.Thread(target=ask, args=(index,)))
                    threads[-1].start()
                    time.sleep(0.2)
                for thread in threads:
                    thread.join()
            finally:
                pid = int((shim_home / "proxy.pid").read_text()) if (shim_home / "proxy.pid").exists() else None
                if pid:
                    stop_process_group(pid)
                proxy_log = shim_home / "proxy.log"
                log = proxy_log.read_text(errors="replace") if proxy_log.exists() else ""
                print("--- the agent's log ---", *agent.log, sep="\n")  # shown on failure
                print(f"--- the proxy's log (pid {pid}), last 6000 characters ---\n{log[-6000:]}")

    assert [r["status"] for r in sorted(results, key=lambda r: r["index"])] == [200] * 12, (results, log[-3000:])
    assert {r["by"] for r in results if r["index"] < 6} == {"from dev-r1"}  # finished where they started
    assert {r["by"] for r in results if r["began"] > applied} == {"from dev-r2"}
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)
    assert "Handling signal: hup" in log  # gunicorn's own line: a reload, not a restart


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
