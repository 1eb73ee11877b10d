"""The fleet router's agent: keeps the LiteLLM proxy on the router VM serving the config in the instance metadata.

`tpuserve fleet` changes which replicas the router balances over by updating the router stack, whose `pulumi up`
rewrites the VM's `litellm-config` metadata attribute in place (components/router.py). This agent, a systemd
service the startup script installs, does three small things (after GoogleCloudPlatform/guest-agent's watcher):
- watch: long-poll that attribute (`?wait_for_change=true&last_etag=...`), backing off on errors;
- act: write a changed config atomically into the directory the proxy container mounts, then start the container
  the first time, or send SIGHUP to its main process afterwards. The container runs the proxy under gunicorn
  (`--run_gunicorn`; its entrypoint `exec`s litellm, BerriAI/litellm docker/prod_entrypoint.sh), and on SIGHUP
  gunicorn boots new workers, which read the config file when they start (litellm/proxy/proxy_server.py loads
  WORKER_CONFIG in the app's lifespan), and stops the old ones gracefully: requests in flight finish, none is
  refused (gunicorn's documented HUP; tests/e2e/test_router_e2e.py shows it on the real proxy);
- report: once the proxy's /model/info lists exactly the new config's deployment ids, write the guest attributes
  `config-hash` (the config's digest) and `stage` = serving, which `tpuserve gate --config-hash` waits for.

A worker can wedge at boot: LiteLLM (1.108.7, litellm/proxy/proxy_cli.py `run_gunicorn_server`) starts its
query-engine reaper thread in the gunicorn master just before gunicorn forks the workers (`preload`), and the thread's
first /proc scan imports the `ascii` codec (`open(..., encoding="ascii")`). A fork that lands inside that import
leaves the module's import lock held in the worker by a thread that does not exist there, and the worker's first
`ascii` lookup (tzlocal, from APScheduler's setup in the proxy's startup) waits forever: py-spy shows it in
`_ModuleLock.acquire` under `proxy_startup_event`. It happened to 8 of 22 starts here; the mechanism is the one
feast-dev/feast#6647 describes. The port then takes connections (the master listens) but nothing answers until
gunicorn's worker timeout (600 s as LiteLLM sets it; a worker notifies only once it serves) kills the worker. The
agent reads that state as wedged workers and sends SIGHUP after WEDGED_AFTER_S: the master, whose reaper finished
that import long ago, forks new workers (they served within a second here) and retires the wedged one.

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
CONTAINER = "tpu-serve-router"
CONFIG_FILE = "config.yaml"
WAIT_S = 300  # one long poll; the metadata server answers earlier when the value changes
CONFIRM_TIMEOUT_S = 600.0  # a first start pulls the image and boots the proxy (about 30 s here, minutes on a VM)
CONFIRM_TIMES = 3  # consecutive /model/info answers with the new ids: old workers may answer right after a HUP
POLL_S = 2.0
WEDGED_AFTER_S = 30.0  # connections taken, none answered, this long: re-fork the workers (see the docstring);
# a worker's own startup takes about a second (the master preloads the app), and a needless HUP is a graceful reload
PROBE_TIMEOUT_S = 10.0  # /model/info answers in milliseconds once a worker serves
STALLED = -1  # _request's status when the server took the connection and sent no answer within the timeout
MAX_BACKOFF_S = 60.0


def digest(config: str) -> str:
    """The config's hash, as components/router.py computes it for the `routerConfigHash` output."""
    return hashlib.sha256(config.encode()).hexdigest()[:16]


def deployment_ids(config: str) -> list[str]:
    """The `model_info.id` of every deployment in the config, sorted."""
    return sorted(str(entry.get("model_info", {}).get("id")) for entry in json.loads(config).get("model_list", []))


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
    port: int = 4000
    workers: int = 2
    metadata_url: str = METADATA_URL
    proxy_url: str = ""  # default http://127.0.0.1:<port>
    docker: str = "docker"
    confirm_timeout_s: float = CONFIRM_TIMEOUT_S
    poll_s: float = POLL_S
    wedged_after_s: float = WEDGED_AFTER_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    etag: str = "0"
    applied: str | None = None  # digest of the config the proxy serves
    log: list[str] = field(default_factory=list)

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
        """Replace the file the container reads in one rename, so no worker ever reads half a config."""
        os.makedirs(self.config_dir, exist_ok=True)
        staging = os.path.join(self.config_dir, f".{CONFIG_FILE}.new")
        with open(staging, "w") as out:
            out.write(config)
        os.replace(staging, os.path.join(self.config_dir, CONFIG_FILE))

    def docker_run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.docker, *args], capture_output=True, text=True, check=False)

    def running(self) -> bool:
        inspect = self.docker_run("inspect", "--format", "{{.State.Running}}", CONTAINER)
        return inspect.returncode == 0 and inspect.stdout.strip() == "true"

    def env_file(self) -> str:
        """The container's environment, owner-readable only: the master key and the replicas' (unused) API key."""
        with open(self.master_key_file) as source:
            key = source.read().strip()
        path = os.path.join(os.path.dirname(self.master_key_file), "proxy.env")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            # vLLM replicas take no key; LiteLLM still wants a value. The cost map ships with the package.
            out.write(f"LITELLM_MASTER_KEY={key}\nTPUSERVE_API_KEY=none\nLITELLM_LOCAL_MODEL_COST_MAP=True\n")
        return path

    def start(self) -> None:
        """Pull (with retries) and run the proxy: host network, the config directory read-only, restart on exit."""
        self.stage("pulling-image")
        for attempt in range(1, 6):
            pulled = self.docker_run("pull", self.image)
            if pulled.returncode == 0:
                break
            self.say(f"docker pull {self.image} failed (attempt {attempt}/5): {pulled.stderr.strip()[-200:]}")
            time.sleep(min(10.0 * 2 ** attempt, MAX_BACKOFF_S))
        else:
            raise RuntimeError(f"could not pull {self.image}")
        self.stage("starting-server")
        self.docker_run("rm", "-f", CONTAINER)
        started = self.docker_run(
            "run", "-d", "--name", CONTAINER, "--restart", "unless-stopped", "--network", "host",
            "--env-file", self.env_file(), "-v", f"{self.config_dir}:{self.config_dir}:ro", self.image,
            "--config", os.path.join(self.config_dir, CONFIG_FILE), "--host", "0.0.0.0", "--port", str(self.port),
            "--run_gunicorn", "--num_workers", str(self.workers))
        if started.returncode != 0:
            raise RuntimeError(f"docker run failed: {started.stderr.strip()[-300:]}")

    def reload(self) -> None:
        """SIGHUP to the gunicorn master: new workers on the new file, old ones drain."""
        hup = self.docker_run("kill", "--signal", "HUP", CONTAINER)
        if hup.returncode != 0:
            raise RuntimeError(f"docker kill --signal HUP failed: {hup.stderr.strip()[-300:]}")

    def served_ids(self) -> tuple[list[str] | None, int]:
        """(the deployment ids the proxy serves now, from /model/info with the master key, or None; the status)."""
        with open(self.master_key_file) as source:
            key = source.read().strip()
        status, body, _ = _request(f"{self.proxy_url or f'http://127.0.0.1:{self.port}'}/model/info",
                                   headers={"Authorization": f"Bearer {key}"}, timeout_s=self.probe_timeout_s)
        if status != 200:
            return None, status
        try:
            return sorted(str(entry.get("model_info", {}).get("id")) for entry in json.loads(body)["data"]), status
        except (ValueError, KeyError, TypeError, AttributeError):
            return None, status

    def confirm(self, config: str) -> bool:
        """Wait until the proxy answers with exactly the config's deployments, CONFIRM_TIMES in a row. Connections
        taken and none answered for wedged_after_s: the workers are wedged (module docstring), re-fork them."""
        expected, streak, stalled_since = deployment_ids(config), 0, None
        deadline = time.monotonic() + self.confirm_timeout_s
        while (asked := time.monotonic()) < deadline:
            ids, status = self.served_ids()
            streak = streak + 1 if ids == expected else 0
            if streak >= CONFIRM_TIMES:
                return True
            now = time.monotonic()
            # unanswered since the first request that got no answer was sent (not since its timeout ran out)
            stalled_since = (asked if stalled_since is None else stalled_since) if status == STALLED else None
            if stalled_since is not None and now - stalled_since >= self.wedged_after_s:
                self.say(f"the proxy took connections and answered none for {now - stalled_since:.0f} s: its "
                         "workers are wedged; re-forking them (SIGHUP)")
                self.reload()
                stalled_since = None
            time.sleep(self.poll_s)
        return False

    def apply(self, config: str) -> None:
        """Serve `config`: write it, start or reload the proxy, confirm, report its digest."""
        wanted = digest(config)
        deployment_ids(config)  # a config that is not JSON fails here, before the running proxy is touched
        self.write_config(config)
        if self.running():
            self.say(f"config {wanted}: reloading the proxy (SIGHUP)")
            self.reload()
        else:
            self.say(f"config {wanted}: starting the proxy")
            self.start()
        if not self.confirm(config):
            raise RuntimeError(f"the proxy did not serve config {wanted} within {self.confirm_timeout_s:.0f} s")
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
    parser = argparse.ArgumentParser(description="Keep the LiteLLM proxy on the config in the VM's metadata.")
    parser.add_argument("--image", required=True)
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--master-key-file", required=True)
    parser.add_argument("--namespace", required=True, help="guest attribute namespace the gate reads")
    parser.add_argument("--port", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--metadata-url", default=METADATA_URL)
    args = parser.parse_args(argv)
    Agent(args.image, args.config_dir, args.master_key_file, args.namespace, args.port, args.workers,
          args.metadata_url).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
