"""vm/router_agent.py against a fake metadata server (attribute values with an ETag, guest attribute PUTs, the
shapes of https://cloud.google.com/compute/docs/metadata/querying-metadata and .../guest-attributes), a fake
`docker` on PATH and a fake proxy whose /model/info (LiteLLM's `{"data": [{"model_name", "model_info": {"id"}}]}`,
behind the master key) serves what the container loaded: the config file as it was at `docker run` or at the last
SIGHUP. The reload mechanism itself (gunicorn's HUP on the real proxy) is tests/e2e/test_router_e2e.py's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fake_openai import completion
from tests.httpfake import FakeServer, Request, Response
from vm import router_agent

MASTER_KEY = "sk-router-canary-0123456789abcdef"
REPLICA_KEY = "sk-replica-canary-fedcba9876543210"
IMAGE = "ghcr.io/berriai/litellm:v1.108.7"
DOCKER = """#!{python} -S
import json, os, shutil, sys
home = os.environ["FAKE_DOCKER_HOME"]
args = sys.argv[1:]
with open(os.path.join(home, "calls.jsonl"), "a") as log:
    log.write(json.dumps(args) + "\\n")
name = args[args.index("--name") + 1] if args[0] == "run" else args[-1]
state = os.path.join(home, "running-" + name)
config = os.path.join(os.environ["FAKE_CONFIG_DIR"], "config.yaml")
loaded = os.path.join(home, "loaded-" + name + ".json")
wedged = os.path.join(home, "wedged-" + name)
if args[0] == "inspect":
    print("true" if os.path.exists(state) else "")
    sys.exit(0 if os.path.exists(state) else 1)
if args[0] == "run":
    open(state, "w").close()
    shutil.copy(config, loaded)
    if name in os.environ.get("FAKE_DOCKER_WEDGES", "").split(","):  # its worker wedges at boot (the agent's docstring)
        open(wedged, "w").close()
    print("4f1c0ffee")
if args[0] == "kill" and os.environ.get("FAKE_DOCKER_RELOADS", "1") == "1":
    shutil.copy(config, loaded)
    if os.path.exists(wedged):  # gunicorn's HUP forks a new worker
        os.remove(wedged)
"""
ONE = "tpu-serve-router-1"


def config(*replicas: str) -> str:
    return json.dumps({"model_list": [
        {"model_name": "m", "litellm_params": {"model": "hosted_vllm/m", "api_base": f"http://10.0.0.{i}:8000/v1",
                                               "api_key": "os.environ/TPUSERVE_API_KEY"}, "model_info": {"id": name}}
        for i, name in enumerate(replicas, 11)], "router_settings": {"routing_strategy": "least-busy"}}, indent=1)


class Metadata:
    """The `litellm-config` attribute (its ETag changes with the value) and the guest attributes written."""

    def __init__(self, value: str) -> None:
        self.value, self.etag, self.attributes, self.queries, self.written = value, "etag-1", {}, [], []

    def set(self, value: str) -> None:
        self.value, self.etag = value, f"etag-{int(self.etag.split('-')[1]) + 1}"

    def routes(self) -> dict[tuple[str, str], Any]:
        def attribute(request: Request) -> Response:
            if request.headers.get("Metadata-Flavor") != "Google":
                return Response(403, "Missing Metadata-Flavor:Google header.")
            self.queries.append(request.query)
            return Response(200, self.value, {"ETag": self.etag, "Content-Type": "application/text"})

        def put(key: str) -> Any:
            def serve(request: Request) -> Response:
                self.attributes[key] = request.body.decode()
                self.written.append(key)
                return Response(200, "")
            return serve

        routes = {("GET", "/computeMetadata/v1/instance/attributes/litellm-config"): attribute}
        for key in ("stage", "config-hash", "reason", "answered", *(f"at-{s}" for s in ("pulling-image", "starting-server",
                                                                             "serving", "failed"))):
            routes[("PUT", f"/computeMetadata/v1/instance/guest-attributes/tpu-serve/{key}")] = put(key)
        return routes


def proxy_routes(docker_home: Path, container: str) -> dict[tuple[str, str], Any]:
    """One fake proxy container: /model/info lists what it loaded, behind the master key (wedged: no answer); a chat
    completion whose model is a loaded deployment's id is answered by that deployment (LiteLLM's
    `x-litellm-model-id` header), with a 503 (vLLM's error body) for the ids in FAKE_FAILING."""
    def loaded_ids() -> list[str]:
        loaded = docker_home / f"loaded-{container}.json"
        return [e["model_info"]["id"] for e in json.loads(loaded.read_text())["model_list"]] if loaded.exists() else []

    def chat(request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {MASTER_KEY}":
            return Response(401, {"error": {"message": "Authentication Error"}})
        model = request.json()["model"]
        if model not in loaded_ids():
            return Response(400, {"error": {"message": f"Invalid model name passed in model={model}"}})
        if model in os.environ.get("FAKE_FAILING", "").split(","):
            return Response(503, {"error": {"message": "litellm.ServiceUnavailableError: Service Unavailable",
                                            "type": None, "param": None, "code": "503"}})
        return Response(200, {**completion("Hello!"), "model": model}, {"x-litellm-model-id": model})

    def model_info(request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {MASTER_KEY}":
            return Response(401, {"error": {"message": "Authentication Error"}})
        if (docker_home / f"wedged-{container}").exists():
            # The real wedge (py-spy, vm/router_agent.py's docstring): gunicorn's master took the connection and no
            # worker ever answers. Every probe here times out (probe_timeout_s <= 0.4) before this late 504.
            time.sleep(0.5)
            return Response(504, "")
        loaded = docker_home / f"loaded-{container}.json"
        entries = json.loads(loaded.read_text())["model_list"] if loaded.exists() else []
        return Response(200, {"data": [{"model_name": e["model_name"], "model_info": e["model_info"]}
                                       for e in entries]})
    return {("GET", "/model/info"): model_info, ("POST", "/v1/chat/completions"): chat}


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    proxies = getattr(request, "param", 1)
    bin_dir, docker_home, config_dir, run_dir = (tmp_path / name for name in ("bin", "docker", "etc", "run"))
    for folder in (bin_dir, docker_home, run_dir):
        folder.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(DOCKER.format(python=sys.executable))
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_DOCKER_HOME", str(docker_home))
    monkeypatch.setenv("FAKE_CONFIG_DIR", str(config_dir))
    (run_dir / "master-key").write_text(MASTER_KEY + "\n")
    (run_dir / "replica-api-key").write_text(REPLICA_KEY + "\n")
    metadata = Metadata(config("dev-r1"))

    with contextlib.ExitStack() as stack:
        meta = stack.enter_context(FakeServer(metadata.routes()))
        fakes = [stack.enter_context(FakeServer(proxy_routes(docker_home, f"tpu-serve-router-{index}")))
                 for index in range(1, proxies + 1)]
        agent = router_agent.Agent(IMAGE, str(config_dir), str(run_dir / "master-key"), "tpu-serve",
                                   proxies=proxies, metadata_url=meta.url,
                                   replica_key_file=str(run_dir / "replica-api-key"),
                                   proxy_urls=[f.url for f in fakes],
                                   docker=str(docker), confirm_timeout_s=3.0, poll_s=0.01, wedged_after_s=0.5,
                                   probe_timeout_s=0.1, answer_timeout_s=2.0, answer_retry_s=0.01)

        def calls() -> list[list[str]]:
            log = docker_home / "calls.jsonl"
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        yield agent, metadata, calls, config_dir, run_dir


def test_the_first_config_starts_the_proxy_and_reports_its_hash(rig) -> None:
    agent, metadata, calls, config_dir, run_dir = rig
    agent.step(wait=False)

    assert (config_dir / "config.yaml").read_text() == metadata.value
    run = next(call for call in calls() if call[0] == "run")
    assert [call[0] for call in calls()] == ["inspect", "pull", "rm", "run"]
    assert run[run.index("--name") + 1] == ONE
    assert run[run.index("--network") + 1] == "host" and run[run.index("--restart") + 1] == "unless-stopped"
    assert f"{config_dir}:{config_dir}:ro" in run and IMAGE in run
    # One worker, on 127.0.0.1 behind HAProxy (which takes the router's port, 4000): the state it routes on is
    # its own, and exact (no Redis named in the file it loads).
    assert run[run.index(IMAGE) + 1:] == ["--config", f"{config_dir}/config.yaml", "--host", "127.0.0.1", "--port",
                                          "4001", "--run_gunicorn", "--num_workers", "1"]
    assert (config_dir / "config.yaml").read_text() == metadata.value
    # The keys reach the container through an env file only (the config names os.environ/TPUSERVE_API_KEY).
    assert MASTER_KEY not in json.dumps(calls()) and REPLICA_KEY not in json.dumps(calls())
    assert REPLICA_KEY not in (config_dir / "config.yaml").read_text()
    env_file = Path(run[run.index("--env-file") + 1])
    assert env_file.read_text().splitlines() == [f"LITELLM_MASTER_KEY={MASTER_KEY}", f"TPUSERVE_API_KEY={REPLICA_KEY}",
                                                 "LITELLM_LOCAL_MODEL_COST_MAP=True"]
    assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)
    assert metadata.attributes["stage"] == "serving"
    assert {"at-pulling-image", "at-starting-server", "at-serving"} <= set(metadata.attributes)


def test_a_changed_config_is_written_then_reloaded_in_place(rig) -> None:
    agent, metadata, calls, config_dir, _ = rig
    agent.step(wait=False)
    first_hash = metadata.attributes["config-hash"]
    metadata.set(config("dev-r1", "dev-r2"))
    before = len(calls())

    agent.step()

    assert metadata.queries[-1] == "wait_for_change=true&last_etag=etag-1&timeout_sec=300"
    assert calls()[before:] == [["inspect", "--format", "{{.State.Running}}", ONE],
                                ["kill", "--signal", "HUP", ONE]]  # no new container
    assert json.loads((config_dir / "config.yaml").read_text())["model_list"][1]["model_info"]["id"] == "dev-r2"
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value) != first_hash

    before = len(calls())
    agent.step()  # same value (the long poll timed out): nothing to do
    assert calls()[before:] == []


def test_a_proxy_that_does_not_pick_up_the_config_is_not_reported_as_serving_it(rig, monkeypatch) -> None:
    agent, metadata, calls, _, _ = rig
    agent.step(wait=False)
    old_hash = metadata.attributes["config-hash"]
    monkeypatch.setenv("FAKE_DOCKER_RELOADS", "0")
    metadata.set(config("dev-r2"))
    agent.confirm_timeout_s = 0.6
    with pytest.raises(RuntimeError, match="did not serve config"):
        agent.step()
    assert metadata.attributes["config-hash"] == old_hash  # the gate keeps waiting; the fleet does not move on


def test_a_config_that_is_not_json_never_touches_the_running_proxy(rig) -> None:
    agent, metadata, calls, config_dir, _ = rig
    agent.step(wait=False)
    written = (config_dir / "config.yaml").read_text()
    metadata.set("model_list: [oops")
    before = len(calls())
    with pytest.raises(ValueError):
        agent.step()
    assert calls()[before:] == [] and (config_dir / "config.yaml").read_text() == written


def test_workers_wedged_at_boot_are_reforked_once_and_the_config_served(rig, monkeypatch) -> None:
    """Connections taken and none answered for wedged_after_s (0.5 s here): one SIGHUP, then the new worker serves."""
    agent, metadata, calls, _, _ = rig
    monkeypatch.setenv("FAKE_DOCKER_WEDGES", ONE)
    agent.step(wait=False)

    assert [call[0] for call in calls()] == ["inspect", "pull", "rm", "run", "kill"]
    assert calls()[-1] == ["kill", "--signal", "HUP", ONE]
    assert any("answered none" in line and "re-forking it (SIGHUP)" in line for line in agent.log)
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)
    assert metadata.attributes["stage"] == "serving"


@pytest.mark.parametrize("proxy", ["refuses connections", "answers 503", "stalls less than wedged_after_s"])
def test_a_proxy_that_is_down_failing_or_briefly_slow_is_not_reforked(rig, proxy) -> None:
    """Refused connections (the master still loading, or gone) and error answers are not wedged workers, nor is a
    stall shorter than wedged_after_s: none of them gets a SIGHUP."""
    agent, metadata, calls, _, _ = rig
    agent.confirm_timeout_s = 0.6
    # Only the status matters to the agent; the body is never read.
    with FakeServer({("GET", "/model/info"): lambda request: Response(503, {"error": "starting"})}) as failing:
        if proxy == "refuses connections":
            agent.proxy_urls = ["http://127.0.0.1:9"]  # the discard port: nothing listens on it here
        elif proxy == "answers 503":
            agent.proxy_urls = [failing.url]
        else:
            agent.wedged_after_s = 60.0
            (Path(os.environ["FAKE_DOCKER_HOME"]) / f"wedged-{ONE}").touch()
        with pytest.raises(RuntimeError, match="did not serve config"):
            agent.step(wait=False)
    assert [call[0] for call in calls()] == ["inspect", "pull", "rm", "run"]  # no kill
    assert not any("wedged" in line for line in agent.log)


def test_workers_that_stay_wedged_are_reforked_once_per_wedged_after_s_not_at_every_poll(rig, monkeypatch) -> None:
    agent, metadata, calls, _, _ = rig
    monkeypatch.setenv("FAKE_DOCKER_WEDGES", ONE)
    monkeypatch.setenv("FAKE_DOCKER_RELOADS", "0")  # the HUP changes nothing
    agent.confirm_timeout_s, agent.wedged_after_s = 1.0, 0.4
    with pytest.raises(RuntimeError, match="did not serve config"):
        agent.step(wait=False)
    hups = [call for call in calls() if call[0] == "kill"]
    assert 1 <= len(hups) <= 3  # about 0.4 s apart; polls come every 0.1 s (the probe's timeout)
    assert "config-hash" not in metadata.attributes


def test_the_wedge_is_timed_from_the_first_unanswered_request_not_from_its_timeout(rig, monkeypatch) -> None:
    """A probe that waits 0.4 s for no answer is already a 0.4 s stall: with wedged_after_s 0.35 the HUP follows the
    first such probe, not a second one (counted, so a busy machine's slowness cannot pass or fail it)."""
    agent, metadata, calls, _, _ = rig
    monkeypatch.setenv("FAKE_DOCKER_WEDGES", ONE)
    agent.probe_timeout_s, agent.wedged_after_s, agent.confirm_timeout_s = 0.4, 0.35, 10.0
    probes, probes_at_hup = [], []
    served_ids, reload = agent.served_ids, agent.reload
    monkeypatch.setattr(agent, "served_ids", lambda index: (probes.append(index), served_ids(index))[1])
    monkeypatch.setattr(agent, "reload", lambda index: (probes_at_hup.append(len(probes)), reload(index))[1])
    agent.step(wait=False)
    assert probes_at_hup == [1]  # one HUP, right after the first unanswered probe
    assert [call[0] for call in calls()][-1] == "kill" and metadata.attributes["stage"] == "serving"


@pytest.mark.parametrize("rig", [3], indirect=True)
def test_more_containers_share_redis_and_each_is_started_reloaded_and_reforked_on_its_own(rig, monkeypatch) -> None:
    """Three proxies: each on its own port with one worker, the file they load naming the local Redis (their shared
    routing state); a change HUPs each; a wedge in one container gets that container alone re-forked."""
    agent, metadata, calls, config_dir, _ = rig
    monkeypatch.setenv("FAKE_DOCKER_WEDGES", "tpu-serve-router-3")
    agent.step(wait=False)

    runs = [call for call in calls() if call[0] == "run"]
    assert [run[run.index("--name") + 1] for run in runs] == ["tpu-serve-router-1", "tpu-serve-router-2",
                                                               "tpu-serve-router-3"]
    assert [run[run.index("--port") + 1] for run in runs] == ["4001", "4002", "4003"]
    assert all(run[-2:] == ["--num_workers", "1"] for run in runs)
    assert [call[0] for call in calls()].count("pull") == 1
    assert [call for call in calls() if call[0] == "kill"] == [["kill", "--signal", "HUP", "tpu-serve-router-3"]]
    loaded = json.loads((config_dir / "config.yaml").read_text())
    assert loaded["router_settings"] == {"routing_strategy": "least-busy", "redis_host": "127.0.0.1",
                                         "redis_port": 6379}
    assert loaded["model_list"] == json.loads(metadata.value)["model_list"]
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)  # the metadata's digest

    metadata.set(config("dev-r1", "dev-r2"))
    before = len(calls())
    agent.step()
    assert [call for call in calls()[before:] if call[0] == "kill"] == [
        ["kill", "--signal", "HUP", f"tpu-serve-router-{index}"] for index in (1, 2, 3)]
    assert metadata.attributes["config-hash"] == router_agent.digest(metadata.value)


def test_haproxy_spreads_connections_over_the_containers_by_least_connections() -> None:
    text = router_agent.haproxy_config(4000, [4001, 4002])
    lines = [line.strip() for line in text.splitlines()]
    assert "bind :4000" in lines and "mode tcp" in lines and "balance leastconn" in lines
    assert [line for line in lines if line.startswith("server ")] == [
        "server proxy1 127.0.0.1:4001 check inter 2s fall 3 rise 1",
        "server proxy2 127.0.0.1:4002 check inter 2s fall 3 rise 1"]
    assert "option httpchk GET /health/liveliness" in lines  # LiteLLM's unauthenticated liveness route
    assert "timeout server 30m" in lines  # longer than any answer (gunicorn's worker timeout is 600 s)
    printed = subprocess.run([sys.executable, str(Path(router_agent.__file__)), "--print-haproxy-config", "--port",
                              "4000", "--proxies", "2"], capture_output=True, text=True, check=True).stdout
    assert printed == text
    if shutil.which("haproxy"):  # Debian's haproxy, as the router VM installs it: the file is valid
        checked = Path(tempfile.mkdtemp()) / "haproxy.cfg"
        checked.write_text(text)
        subprocess.run(["haproxy", "-c", "-f", str(checked)], check=True, capture_output=True)


def test_every_deployment_answers_a_pinned_completion_before_the_config_is_reported(rig, monkeypatch) -> None:
    """After the proxies serve a config, one completion through the proxy pinned to each deployment (its id as the
    model name); what each answered is written before config-hash, which the gate passes on. A replica that fails
    is reported, not dropped: the config is served, and `tpuserve fleet` decides."""
    agent, metadata, calls, _, _ = rig
    agent.step(wait=False)
    answered = json.loads(metadata.attributes["answered"])
    assert answered == {"config": router_agent.digest(metadata.value), "deployments": {"dev-r1": "ok"}}
    assert metadata.written.index("answered") < metadata.written.index("config-hash")

    monkeypatch.setenv("FAKE_FAILING", "dev-r2")
    metadata.set(config("dev-r1", "dev-r2"))
    agent.step()
    answered = json.loads(metadata.attributes["answered"])
    assert answered["config"] == router_agent.digest(metadata.value) == metadata.attributes["config-hash"]
    assert answered["deployments"] == {
        "dev-r1": "ok", "dev-r2": "HTTP 503: litellm.ServiceUnavailableError: Service Unavailable"}
    assert metadata.attributes["stage"] == "serving"


def test_a_pinned_answer_counts_only_from_the_deployment_asked_and_with_text() -> None:
    def answering(by: str, content: str | None = "Hello!") -> Any:
        return lambda request: Response(200, completion(content), {"x-litellm-model-id": by})

    for handler, expected in ((answering("dev-r2"), (True, "ok")),
                              (answering("dev-r1"), (False, "answered by deployment 'dev-r1', not 'dev-r2'")),
                              (answering("dev-r2", ""), (False, "HTTP 200 with an empty message")),
                              (lambda request: Response(200, {**completion(None), "choices": [{"message": {
                                  "content": None, "reasoning_content": "Thinking"}}]},
                                  {"x-litellm-model-id": "dev-r2"}), (True, "ok"))):
        with FakeServer({("POST", "/v1/chat/completions"): handler}) as proxy:
            assert router_agent.answer_through(proxy.url, MASTER_KEY, "dev-r2") == expected
            sent = proxy.requests[-1]
        assert sent.json()["model"] == "dev-r2" and sent.headers["Authorization"] == f"Bearer {MASTER_KEY}"
    assert router_agent.answer_through("http://127.0.0.1:9", MASTER_KEY, "dev-r2") == (False, "no answer from the "
                                                                                         "proxy")
