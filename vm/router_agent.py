"""The fleet router's agent: keeps the LiteLLM proxy on the router VM serving the config in the instance metadata.

`tpuserve fleet` changes which replicas the router balances over by updating the router stack, whose `pulumi up`
rewrites the VM's `litellm-config` metadata attribute in place (components/router.py). This agent, a systemd
service the startup script installs, does three small things (after GoogleCloudPlatform/guest-agent's watcher):
- watch: long-poll that attribute (`?wait_for_change=true&last_etag=...`), backing off on errors;
- act: write a changed config atomically into the directory the proxy containers mount, then start the containers
  the first time, or send SIGHUP to each one's main process afterwards. A container runs the proxy under gunicorn
  (`--run_gunicorn`; its entrypoint `exec`s litellm, BerriAI/litellm docker/prod_entrypoint.sh), and on SIGHUP
  gunicorn boots a new worker, which reads the config file when it starts (litellm/proxy/proxy_server.py loads
  WORKER_CONFIG in the app's lifespan), and stops the old one gracefully: requests in flight finish, none is
  refused (gunicorn's documented HUP; tests/e2e/test_router_e2e.py shows it on the real proxy);
- report: once every container's /model/info lists exactly the new config's deployment ids, send one real chat
  completion through the proxy pinned to each deployment (its `model_info.id` as the model name), write what each
  answered as the guest attribute `answered`, then `config-hash` (the config's digest) and `stage` = serving, which
  `tpuserve gate --config-hash` waits for; `tpuserve fleet` reads `answered` before it drains a replica's
  predecessor.

One gunicorn worker per container, one container per vCPU (`--proxies`), each on its own port on 127.0.0.1 behind
HAProxy on the router's port (`haproxy_config`: least connections, a backend that stops answering its liveness
check taken out). A LiteLLM worker keeps its routing state in memory: requests in flight per deployment (which
least-busy routing picks by), failures per minute (`allowed_fails`) and cooldowns. Several workers without Redis
each route on their own view: a failing replica is cooled down only in the worker that saw it fail, and a busy one
looks idle to the others ("What Needs Redis", "Shared state across proxy workers", docs.litellm.ai). With one
container the state is exact; with more, the agent adds the local Redis (`redis_host`/`redis_port` in
`router_settings`, Router.__init__) to the config the containers load: in-flight counts are read from Redis
(litellm/router_strategy/least_busy.py), fail counts are incremented there (router_utils/cooldown_handlers.py
`_increment_allowed_fails`) and a sibling sees a cooldown within DEFAULT_COOLDOWN_REDIS_READ_INTERVAL_SECONDS (1 s;
router_utils/cooldown_cache.py). Why this shape and not N workers in one container: each container answers the
agent on its own port, so a config is confirmed, and a wedged worker re-forked, per process instead of by sampling
whichever worker answers.

A worker can wedge at boot: LiteLLM (1.108.7, litellm/proxy/proxy_cli.py `run_gunicorn_server`) starts its
query-engine reaper thread in the gunicorn master just before gunicorn forks the workers (`preload`), and the thread's
first /proc scan imports the `ascii` codec (`open(..., encoding="ascii")`). A fork that lands inside that import
leaves the module's import lock held in the worker by a thread that does not exist there, and the worker's first
`ascii` lookup (tzlocal, from APScheduler's setup in the proxy's startup) waits forever: py-spy shows it in
`_ModuleLock.acquire` under `proxy_startup_event`. It happened to 8 of 22 starts here; the mechanism is the one
feast-dev/feast#6647 describes. The port then takes connections (the master listens) but nothing answers until
gunicorn's worker timeout (600 s as LiteLLM sets it; a worker notifies only once it serves) kills the worker. The
agent reads that state as a wedged worker and sends that container SIGHUP after WEDGED_AFTER_S: the master, whose
reaper finished that import long ago, forks a new worker (it served within a second here) and retires the wedged one.

Standard library only; imports nothing from tpuserve. The config is JSON (YAML's subset, which LiteLLM loads).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

METADATA_URL = "http://metadata.google.internal"
ATTRIBUTE = "litellm-config"
CONTAINER = "tpu-serve-router"  # the containers are tpu-serve-router-1, -2, ...
CONFIG_FILE = "config.yaml"
WAIT_S = 300  # one long poll; the metadata server answers earlier when the value changes
CONFIRM_TIMEOUT_S = 600.0  # a first start pulls the image and boots the proxy (about 30 s here, minutes on a VM)
CONFIRM_TIMES = 3  # consecutive /model/info answers with the new ids: the old worker may answer right after a HUP
POLL_S = 2.0
WEDGED_AFTER_S = 30.0  # connections taken, none answered, this long: re-fork the worker (see the docstring);
# a worker's own startup takes about a second (the master preloads the app), and a needless HUP is a graceful reload
PROBE_TIMEOUT_S = 10.0  # /model/info answers in milliseconds once a worker serves
STALLED = -1  # _request's status when the server took the connection and sent no answer within the timeout
MAX_BACKOFF_S = 60.0
# The completion pinned to each deployment after a config is served (`answer`): vm/readycheck.py's request.
ANSWER_PROMPT = "Say hello."
ANSWER_MAX_TOKENS = 8
ANSWER_TIMEOUT_S = 60.0  # a replica that passed its own gate answers 8 tokens in well under a second
ANSWER_ATTEMPTS = 3
ANSWER_RETRY_S = 5.0
ANSWERED = "answered"  # the guest attribute: {"config": digest, "deployments": {id: "ok" or why not}}
MODEL_ID_HEADER = "x-litellm-model-id"  # the deployment that answered (litellm/proxy/common_request_processing.py)
REASONING_FIELDS = ("reasoning_content", "reasoning")  # where vLLM's reasoning parsers put the first tokens
REDIS_HOST = "127.0.0.1"  # the router VM's own Redis (templates/router-startup.sh.j2), for more than one container
REDIS_PORT = 6379
# HAProxy in front of the containers: TCP, so streamed answers pass byte for byte; idle limits above the longest
# request (gunicorn's worker timeout is 600 s as LiteLLM sets it; a long non-streamed completion stays silent).
HAPROXY_TIMEOUT = "30m"


def digest(config: str) -> str:
    """The config's hash, as components/router.py computes it for the `routerConfigHash` output."""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def deployment_ids(config: str) -> list[str]:
    """The `model_info.id` of every deployment in the config, sorted."""
    return sorted(str(entry.get("model_info", {}).get("id")) for entry in json.loads(config).get("model_list", []))


def with_shared_state(config: str, redis_host: str, redis_port: int) -> str:
    """The config with the Redis the containers share their routing state through (module docstring)."""
    loaded = json.loads(config)
    loaded.setdefault("router_settings", {}).update({"redis_host": redis_host, "redis_port": redis_port})
    return json.dumps(loaded, indent=1)


def haproxy_config(port: int, proxy_ports: list[int]) -> str:
    """HAProxy on `port` (all addresses) in front of the proxy containers on 127.0.0.1: the next connection goes to
    the container with the fewest open ones (each is one CPU-bound worker), and one whose /health/liveliness
    (LiteLLM's unauthenticated liveness route) stops answering is skipped until it answers again."""
    servers = "\n".join(f"  server proxy{index} 127.0.0.1:{proxy_port} check inter 2s fall 3 rise 1"
                        for index, proxy_port in enumerate(proxy_ports, 1))
    return f"""# Written by tpu-serve's router agent (vm/router_agent.py haproxy_config) at every boot.
global
  maxconn 8192

defaults
  mode tcp
  timeout connect 5s
  timeout client {HAPROXY_TIMEOUT}
  timeout server {HAPROXY_TIMEOUT}
  timeout check 5s

frontend litellm
  bind :{port}
  default_backend proxies

backend proxies
  balance leastconn
  option httpchk GET /health/liveliness
  http-check expect status 200
{servers}
"""


def answer_through(proxy_url: str, master_key: str, deployment: str,
                   timeout_s: float = ANSWER_TIMEOUT_S) -> tuple[bool, str]:
    """One real chat completion through the proxy, pinned to one deployment: LiteLLM's router takes a deployment's
    `model_info.id` as the model name and sends the request to that deployment alone (litellm/router.py
    `_common_checks_available_deployment`: a model that is no model group but a deployment id; the proxy admits it,
    proxy/route_llm_request.py via `Router.is_recognized_model`). (answered, "ok" or what went wrong)."""
    body = json.dumps({"model": deployment, "max_tokens": ANSWER_MAX_TOKENS,
                       "messages": [{"role": "user", "content": ANSWER_PROMPT}]}).encode()
    status, raw, headers = _request(f"{proxy_url}/v1/chat/completions", method="POST", data=body, headers={
        "Authorization": f"Bearer {master_key}", "Content-Type": "application/json"}, timeout_s=timeout_s)
    if status <= 0:
        return False, "no answer from the proxy" if status == 0 else f"no answer within {timeout_s:.0f} s"
    try:
        reply = json.loads(raw)
    except ValueError:
        reply = None
    if status != 200:
        error = reply.get("error") if isinstance(reply, dict) else None
        message = (error.get("message") if isinstance(error, dict) else error) or raw[:200].decode(errors="replace")
        return False, f"HTTP {status}: {' '.join(str(message).split())[:200]}"
    answered_by = {key.lower(): value for key, value in headers.items()}.get(MODEL_ID_HEADER)
    if answered_by != deployment:
        return False, f"answered by deployment {answered_by!r}, not {deployment!r}"
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return False, "HTTP 200 without a message"
    if not any(str(message.get(key) or "").strip() for key in ("content", *REASONING_FIELDS)):
        return False, "HTTP 200 with an empty message"
    return True, "ok"


def _request(url: str, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None,
             timeout_s: float = 30.0) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers); status 0 when nothing took the connection or it failed, STALLED when the server took
    it and did not answer within the timeout (urllib raises a read timeout bare, a connect failure as URLError)."""
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            return response.status, response.read(), dict(response.headers.items())
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers.items())
    except TimeoutError:
        return STALLED, b"", {}
    except OSError:
        return 0, b"", {}


@dataclass
class Agent:
    image: str
    config_dir: str
    master_key_file: str
    namespace: str
    port: int = 4000  # HAProxy's; container i (from 1) listens on 127.0.0.1:port+i
    proxies: int = 1
    metadata_url: str = METADATA_URL
    proxy_urls: list[str] = field(default_factory=list)  # default http://127.0.0.1:<port+i>
    docker: str = "docker"
    replica_key_file: str = ""  # vLLM's API key of the replicas (the config names it os.environ/TPUSERVE_API_KEY)
    redis_host: str = REDIS_HOST
    redis_port: int = REDIS_PORT
    confirm_timeout_s: float = CONFIRM_TIMEOUT_S
    poll_s: float = POLL_S
    wedged_after_s: float = WEDGED_AFTER_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    answer_timeout_s: float = ANSWER_TIMEOUT_S
    answer_retry_s: float = ANSWER_RETRY_S
    etag: str = "0"
    applied: str | None = None  # digest of the config the proxies serve
    log: list[str] = field(default_factory=list)

    @property
    def containers(self) -> list[str]:
        return [f"{CONTAINER}-{index}" for index in range(1, self.proxies + 1)]

    def proxy_port(self, index: int) -> int:
        return self.port + 1 + index

    def proxy_url(self, index: int) -> str:
        return self.proxy_urls[index] if self.proxy_urls else f"http://127.0.0.1:{self.proxy_port(index)}"

    # --- watch --------------------------------------------------------------------------------------------------

    def watch(self, wait: bool = True) -> tuple[str | None, bool]:
        """(the attribute's value or None when unset, whether the metadata server answered)."""
        query = f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={WAIT_S}" if wait else ""
        status, body, headers = _request(
            f"{self.metadata_url}/computeMetadata/v1/instance/attributes/{ATTRIBUTE}{query}",
            headers={"Metadata-Flavor": "Google"}, timeout_s=WAIT_S + 30)
        if status <= 0 or status >= 500:
            return None, False
        self.etag = headers.get("ETag", headers.get("Etag", self.etag))
        return (body.decode() if status == 200 else None), True

    # --- act ----------------------------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        self.log.append(line)
        print(f"tpu-serve-router: {line}", flush=True)

    def report(self, key: str, value: str) -> None:
        _request(f"{self.metadata_url}/computeMetadata/v1/instance/guest-attributes/{self.namespace}/{key}",
                 method="PUT", data=value.encode(), headers={"Metadata-Flavor": "Google"})

    def stage(self, name: str) -> None:
        self.report("stage", name)
        self.report(f"at-{name}", str(int(time.time())))

    def write_config(self, config: str) -> None:
        """Replace the file the containers read in one rename, so no worker ever reads half a config. With more
        than one container it names the shared Redis (module docstring)."""
        if self.proxies > 1:
            config = with_shared_state(config, self.redis_host, self.redis_port)
        os.makedirs(self.config_dir, exist_ok=True)
        staging = os.path.join(self.config_dir, f".{CONFIG_FILE}.new")
        with open(staging, "w") as out:
            out.write(config)
        os.replace(staging, os.path.join(self.config_dir, CONFIG_FILE))

    def docker_run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.docker, *args], capture_output=True, text=True, check=False)

    def running(self, container: str) -> bool:
        inspect = self.docker_run("inspect", "--format", "{{.State.Running}}", container)
        return inspect.returncode == 0 and inspect.stdout.strip() == "true"

    def env_file(self) -> str:
        """The containers' environment, owner-readable only: the master key and the replicas' API key (a replica
        without one ignores it; LiteLLM still wants a value). The cost map ships with the package."""
        replica_key = "none"
        if self.replica_key_file:
            with open(self.replica_key_file) as source:
                replica_key = source.read().strip()
        path = os.path.join(os.path.dirname(self.master_key_file), "proxy.env")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"LITELLM_MASTER_KEY={self.master_key()}\nTPUSERVE_API_KEY={replica_key}\n"
                      "LITELLM_LOCAL_MODEL_COST_MAP=True\n")
        return path

    def pull(self) -> None:
        self.stage("pulling-image")
        for attempt in range(1, 6):
            pulled = self.docker_run("pull", self.image)
            if pulled.returncode == 0:
                return
            self.say(f"docker pull {self.image} failed (attempt {attempt}/5): {pulled.stderr.strip()[-200:]}")
            time.sleep(min(10.0 * 2 ** attempt, MAX_BACKOFF_S))
        raise RuntimeError(f"could not pull {self.image}")

    def start(self, index: int) -> None:
        """Run proxy container `index`: host network on 127.0.0.1 (HAProxy is the way in), the config directory
        read-only, one gunicorn worker, restarted on exit."""
        container = self.containers[index]
        self.docker_run("rm", "-f", container)
        started = self.docker_run(
            "run", "-d", "--name", container, "--restart", "unless-stopped", "--network", "host",
            "--env-file", self.env_file(), "-v", f"{self.config_dir}:{self.config_dir}:ro", self.image,
            "--config", os.path.join(self.config_dir, CONFIG_FILE), "--host", "127.0.0.1",
            "--port", str(self.proxy_port(index)), "--run_gunicorn", "--num_workers", "1")
        if started.returncode != 0:
            raise RuntimeError(f"docker run of {container} failed: {started.stderr.strip()[-300:]}")

    def reload(self, index: int) -> None:
        """SIGHUP to the container's gunicorn master: a new worker on the new file, the old one drains."""
        hup = self.docker_run("kill", "--signal", "HUP", self.containers[index])
        if hup.returncode != 0:
            raise RuntimeError(f"docker kill --signal HUP {self.containers[index]} failed: "
                               f"{hup.stderr.strip()[-300:]}")

    def master_key(self) -> str:
        with open(self.master_key_file) as source:
            return source.read().strip()

    def served_ids(self, index: int) -> tuple[list[str] | None, int]:
        """(the deployment ids container `index` serves now, from /model/info with the master key, or None; the
        status)."""
        status, body, _ = _request(f"{self.proxy_url(index)}/model/info",
                                   headers={"Authorization": f"Bearer {self.master_key()}"},
                                   timeout_s=self.probe_timeout_s)
        if status != 200:
            return None, status
        try:
            return sorted(str(entry.get("model_info", {}).get("id")) for entry in json.loads(body)["data"]), status
        except (ValueError, KeyError, TypeError, AttributeError):
            return None, status

    def confirm(self, config: str) -> bool:
        """Wait until every container answers with exactly the config's deployments, CONFIRM_TIMES in a row. A
        container that took connections and answered none for wedged_after_s is wedged (module docstring): re-fork
        its worker."""
        expected = deployment_ids(config)
        streak = dict.fromkeys(range(self.proxies), 0)
        stalled_since: dict[int, float | None] = dict.fromkeys(range(self.proxies))
        deadline = time.monotonic() + self.confirm_timeout_s
        while time.monotonic() < deadline:
            for index in [index for index, count in streak.items() if count < CONFIRM_TIMES]:
                asked = time.monotonic()
                ids, status = self.served_ids(index)
                streak[index] = streak[index] + 1 if ids == expected else 0
                now = time.monotonic()
                # unanswered since the first request that got no answer was sent (not since its timeout ran out)
                since = stalled_since[index]
                stalled_since[index] = (asked if since is None else since) if status == STALLED else None
                since = stalled_since[index]
                if since is not None and now - since >= self.wedged_after_s:
                    self.say(f"{self.containers[index]} took connections and answered none for {now - since:.0f} "
                             "s: its worker is wedged; re-forking it (SIGHUP)")
                    self.reload(index)
                    stalled_since[index] = None
            if all(count >= CONFIRM_TIMES for count in streak.values()):
                return True
            time.sleep(self.poll_s)
        return False

    def answer_all(self, config: str) -> dict[str, str]:
        """Each deployment of `config` answers one completion through the proxy (`answer_through`), retried
        ANSWER_ATTEMPTS times: {deployment id: "ok" or why not}. A replica that fails here is still served (LiteLLM
        cools it down); `tpuserve fleet` reads the result before it drains the replica a new one replaces."""
        results = {}
        for deployment in deployment_ids(config):
            for attempt in range(1, ANSWER_ATTEMPTS + 1):
                ok, why = answer_through(self.proxy_url(0), self.master_key(), deployment, self.answer_timeout_s)
                if ok or attempt == ANSWER_ATTEMPTS:
                    break
                time.sleep(self.answer_retry_s)
            results[deployment] = why
            self.say(f"{deployment}: {'answered a completion through the proxy' if ok else f'no answer: {why}'}")
        return results

    def apply(self, config: str) -> None:
        """Serve `config`: write it, start or reload every container, confirm, have every deployment answer through
        the proxy, report what answered and the config's digest (in that order: the gate passes on the digest)."""
        wanted = digest(config)
        deployment_ids(config)  # a config that is not JSON fails here, before the running proxies are touched
        self.write_config(config)
        pulled = False
        for index, container in enumerate(self.containers):
            if self.running(container):
                self.say(f"config {wanted}: reloading {container} (SIGHUP)")
                self.reload(index)
                continue
            if not pulled:
                self.pull()
                self.stage("starting-server")
                pulled = True
            self.say(f"config {wanted}: starting {container}")
            self.start(index)
        if not self.confirm(config):
            raise RuntimeError(f"the proxy did not serve config {wanted} within {self.confirm_timeout_s:.0f} s")
        self.report(ANSWERED, json.dumps({"config": wanted, "deployments": self.answer_all(config)},
                                         sort_keys=True))
        self.applied = wanted
        self.report("config-hash", wanted)
        self.report("reason", "")
        self.stage("serving")
        self.say(f"config {wanted}: serving {', '.join(deployment_ids(config)) or 'no replica'}")

    # --- loop ---------------------------------------------------------------------------------------------------

    def step(self, wait: bool = True) -> None:
        """One watch and, if the config changed, one apply."""
        config, answered = self.watch(wait)
        if not answered:
            raise ConnectionError("the metadata server did not answer")
        if config is None or digest(config) == self.applied:
            return
        self.apply(config)

    def run(self) -> None:
        backoff, first = 1.0, True
        while True:
            try:
                self.step(wait=not first)
                first, backoff = False, 1.0
            except (ConnectionError, RuntimeError, ValueError, OSError) as err:
                first = True  # read the value again at once: it may be the one that failed to apply
                self.say(f"error: {err}; retrying in {backoff:.0f} s")
                self.report("reason", str(err)[:300])
                if self.applied is None:
                    self.stage("failed")
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Keep the LiteLLM proxies on the config in the VM's metadata.")
    parser.add_argument("--print-haproxy-config", action="store_true",
                        help="print HAProxy's configuration for --port and --proxies, and exit")
    parser.add_argument("--image")
    parser.add_argument("--config-dir")
    parser.add_argument("--master-key-file")
    parser.add_argument("--namespace", help="guest attribute namespace the gate reads")
    parser.add_argument("--port", type=int, default=4000, help="HAProxy's port; the proxies listen on the next ones")
    parser.add_argument("--proxies", type=int, default=1, help="proxy containers, one gunicorn worker each")
    parser.add_argument("--replica-key-file", default="", help="file holding the replicas' vLLM API key")
    parser.add_argument("--redis-port", type=int, default=REDIS_PORT)
    parser.add_argument("--metadata-url", default=METADATA_URL)
    args = parser.parse_args(argv)
    if args.proxies < 1:
        parser.error("--proxies must be at least 1")
    agent_ports = [args.port + 1 + index for index in range(args.proxies)]
    if args.print_haproxy_config:
        print(haproxy_config(args.port, agent_ports), end="")
        return 0
    missing = [name for name in ("image", "config_dir", "master_key_file", "namespace") if not getattr(args, name)]
    if missing:
        parser.error(f"--{missing[0].replace('_', '-')} is required")
    Agent(args.image, args.config_dir, args.master_key_file, args.namespace, args.port, args.proxies,
          args.metadata_url, replica_key_file=args.replica_key_file, redis_port=args.redis_port).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
