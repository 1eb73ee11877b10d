"""tpu-serve supervisor: serve what the instance metadata says, and keep it serving.

The systemd unit `tpu-serve-supervisor`: watch (long-poll the metadata), decide (a pure function), act (pull,
restore the compile cache, fetch the token, start the engines and the front, wait until they serve, report).
Standard library only; imports nothing from tpuserve. Why: docs/design/supervisor.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cache_disk  # noqa: E402 - siblings, installed beside this file
import compile_cache  # noqa: E402
import guest_state  # noqa: E402
import hf_token  # noqa: E402
import readycheck  # noqa: E402

FACTS = guest_state.FACTS  # vm/facts.json, from tpuserve/facts.py
SERVED_CONFIG_KEY, SUPERVISOR_KEY = FACTS["SERVED_CONFIG_KEY"], FACTS["SUPERVISOR_KEY"]
CACHE_ROOT, RUN_DIR, INSTALL_DIR = FACTS["CACHE_ROOT"], FACTS["VM_RUN_DIR"], FACTS["VM_INSTALL_DIR"]
MAX_RESTARTS, PULL_FREE_GB = FACTS["SUPERVISOR_MAX_RESTARTS"], FACTS["IMAGE_PULL_FREE_GB"]
HASH_LABEL = FACTS["CONTAINER_HASH_LABEL"]
# The front of more than one engine: Debian's HAProxy, its config written where the package's unit reads it.
HAPROXY = "/usr/sbin/haproxy"
FRONT_CONFIG = "/etc/haproxy/haproxy.cfg"
FRONT_UNIT = "haproxy"
FRONT_READY_S = 60.0  # the front's checks see a new engine within 2 s (components/front.py)
OPS_AGENT_INSTALLER = "ops-agent-install.sh"  # run once serving; a failure is a warning, never a failed serve
OPS_AGENT_TIMEOUT_S = 1800
ATTEMPTS = 5  # of a pull or an apt-get install, with backoff


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} tpu-serve-supervisor: {message}", flush=True)


@dataclass(frozen=True)
class Settings:
    """Where things are and how fast to go; tests point the URLs at fakes on 127.0.0.1 and shrink the delays."""

    metadata_url: str = hf_token.METADATA_URL
    secret_manager_url: str = hf_token.SECRET_MANAGER_URL
    storage_url: str = compile_cache.STORAGE_URL
    root: str = ""  # prefix of every host path (tests run in a sandbox directory)
    watch_timeout_s: int = 60  # guest agent's timeout_sec; the HTTP timeout is 10 s longer
    check_s: float = 10.0  # how often the container is looked at between metadata changes
    poll_s: float = 5.0  # readiness polling while the model loads
    retry_delay_s: float = 10.0  # first backoff of pulls, Secret Manager and the metadata server
    max_backoff_s: float = 300.0
    restart_delay_s: float = 10.0  # first backoff of a crashed container's restarts (doubles each time)
    stable_s: float = 600.0  # serving this long resets the restart count
    iam_wait_s: float = FACTS["IAM_PROPAGATION_WAIT_S"]
    iam_poll_s: float = 15.0
    ops_agent_repo_script_url: str = ""  # "": vm/ops-agent-install.sh's own defaults
    ops_agent_config_path: str = ""
    guest_write_interval_s: float = guest_state.INTERVAL_S
    guest_reassert_s: float = guest_state.REASSERT_S
    release_wait_s: float = 120.0  # for a removed container and its TPU devices to go
    disk_check_s: float = 30.0  # how often the cache disk is looked at: grown, or gone
    docker_timeout_scale: float = 1.0  # every command's timeout × this (tests shrink them)

    def path(self, absolute: str) -> Path:
        return Path(self.root + absolute)


# --- watch ---------------------------------------------------------------------------------------------------

class MetadataError(RuntimeError):
    pass


class Metadata:
    """The few metadata-server calls the supervisor makes."""

    def __init__(self, url: str):
        self.url = url.rstrip("/") + "/computeMetadata/v1/"

    def _get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes, str]:
        request = urllib.request.Request(self.url + path, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - the metadata server
                return response.status, response.read(), response.headers.get("ETag", "")
        except urllib.error.HTTPError as err:
            return err.code, err.read(), ""
        except OSError as err:
            raise MetadataError(f"no answer ({type(getattr(err, 'reason', err)).__name__})") from err

    def attributes(self, last_etag: str, timeout_sec: int) -> tuple[dict[str, str], str]:
        """The instance attributes once they differ from `last_etag` (or after `timeout_sec`, unchanged)."""
        path = (f"instance/attributes/?recursive=true&alt=json&wait_for_change=true&timeout_sec={timeout_sec}"
                f"&last_etag={urllib.parse.quote(last_etag)}")
        status, body, etag = self._get(path, timeout_s=timeout_sec + 10)
        if status != 200:
            raise MetadataError(f"HTTP {status}")
        try:
            values = json.loads(body or b"{}")
        except ValueError as err:
            raise MetadataError("an unreadable attributes document") from err
        return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}, etag

    def email(self) -> str:
        try:
            status, body, _ = self._get("instance/service-accounts/default/email", timeout_s=5)
        except MetadataError:
            status = 0
        return body.decode().strip() if status == 200 else "the VM's service account"


def watch(metadata: Metadata, last_etag: str, settings: Settings,
          sleep: Any = time.sleep) -> tuple[dict[str, str], str]:
    """Block until the ETag differs from `last_etag` or the poll times out; errors retried with backoff."""
    delay = settings.retry_delay_s
    while True:
        try:
            return metadata.attributes(last_etag, settings.watch_timeout_s)
        except MetadataError as err:
            log(f"the metadata server answered {err}; retrying in {delay:g} s")
            sleep(delay)
            delay = min(delay * 2, settings.max_backoff_s)


class Latest:
    """The newest attributes the watcher saw; `wait` returns early when they change."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.attributes: dict[str, str] | None = None
        self.version = 0

    def publish(self, attributes: dict[str, str]) -> None:
        with self._changed:
            self.attributes, self.version = attributes, self.version + 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout_s: float) -> tuple[dict[str, str] | None, int]:
        with self._changed:
            self._changed.wait_for(lambda: self.version != seen, timeout=timeout_s)
            return self.attributes, self.version


def watcher(metadata: Metadata, latest: Latest, settings: Settings) -> None:
    etag = "NONE"  # the guest agent's first last_etag: any real ETag differs, so the first poll answers at once
    while True:
        attributes, new_etag = watch(metadata, etag, settings)
        if new_etag != etag or not new_etag:
            latest.publish(attributes)
            etag = new_etag


# --- decide --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Engine:
    """One vLLM server of the config: its container, where it answers, its `docker run` argv."""

    name: str
    url: str
    docker_run_args: tuple[str, ...]


@dataclass(frozen=True)
class ServedConfig:
    """What `tpu-serve-config` asks for (rendered by the stack, components/startup_script.py)."""

    config_hash: str
    model: str
    image: str
    engines: tuple[Engine, ...]
    machine_type: str
    hf_token_secret: str
    server_url: str = "http://127.0.0.1:8000"  # where clients are served: the front, or the lone engine
    front: str = ""  # the front's HAProxy config when there is more than one engine
    warmup_image: str = ""
    compile_cache_bucket: str = ""
    ready_timeout_s: float = 3600.0
    # (variable, secret name) fetched into the container's environment; `api_key_env` is the readiness checks' key
    secret_env: tuple[tuple[str, str], ...] = ()
    api_key_env: str = ""
    # modality -> a chat content part carrying it, for each modality not served: each should answer 4xx
    refusal_parts: dict[str, Any] = field(default_factory=dict)
    cache_disk: str = ""  # "<zone>/<name>" of the VM's cache disk, marked warm in the bucket once it served

    @classmethod
    def parse(cls, text: str | None) -> ServedConfig:
        if not text:
            raise ValueError(f"the {SERVED_CONFIG_KEY} metadata key is missing")
        try:
            raw = json.loads(text)
            engines = tuple(Engine(e["name"], e["url"], tuple(e["docker_run_args"])) for e in raw["engines"])
            if not engines:
                raise ValueError("no engine")
            simple = {f.name for f in fields(cls)} - {"engines", "secret_env"}
            return cls(**{key: value for key, value in raw.items() if key in simple}, engines=engines,
                       secret_env=tuple(sorted(raw.get("secret_env", {}).items())))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"the {SERVED_CONFIG_KEY} metadata key is unreadable ({type(err).__name__}: {err})") \
                from None

    @property
    def pinned_digest(self) -> str:
        return compile_cache.pinned_digest(self.image)

    def what(self, engine: Engine) -> str:
        """How reasons name an engine: "container" alone, "engine vllm-2" beside others."""
        return "container" if len(self.engines) == 1 else f"engine {engine.name}"


@dataclass(frozen=True)
class Container:
    config_hash: str
    running: bool
    exit_code: int = 0
    id: str = ""  # docker's container id, which its processes' cgroup names


@dataclass
class State:
    """What the supervisor knows beyond the metadata: set by act, read by decide."""

    applied_hash: str = ""  # the config it last acted on
    phase: str = ""  # "" (nothing known), "serving", "restarting", "failed"
    restarts: int = 0
    serving_since: float = 0.0
    invalid: str = ""  # the unreadable config it already reported
    boot_hash: str = ""  # what the startup script announced this boot
    disk_lost: str = ""  # the cache disk went away: nothing is served again until the VM boots again


# Actions
WAIT, APPLY, ADOPT, RESTART, GIVE_UP, INVALID, UPDATE_SELF = (
    "wait", "apply", "adopt", "restart", "give-up", "invalid", "update-self")


def decide(attributes: dict[str, str], containers: dict[str, Container | None], state: State, own_version: str) -> str:
    """One action for what the metadata asks and what runs (`containers`: name -> docker's view, or None). Pure."""
    bundle_version = bundle_version_of(attributes.get(SUPERVISOR_KEY))
    if bundle_version and bundle_version != own_version:
        return UPDATE_SELF
    try:
        wanted = ServedConfig.parse(attributes.get(SERVED_CONFIG_KEY))
    except ValueError as err:
        return WAIT if state.invalid == str(err) else INVALID
    same_config = state.applied_hash == wanted.config_hash
    found = [containers.get(engine.name) for engine in wanted.engines]
    if any(container is None or container.config_hash != wanted.config_hash for container in found):
        # A config that failed stays failed until it changes: no retry loop on a bad image or a refused secret.
        return WAIT if same_config and state.phase == "failed" else APPLY
    if all(container.running for container in found if container):
        return WAIT if same_config and state.phase in ("serving", "failed") else ADOPT
    if same_config and state.phase in ("serving", "restarting"):
        return RESTART if state.restarts < MAX_RESTARTS else GIVE_UP
    if same_config and state.phase == "failed":
        return WAIT
    return APPLY  # a stopped container of this config that this supervisor never saw serve: start afresh


def bundle_version_of(text: str | None) -> str:
    try:
        return str(json.loads(text)["version"]) if text else ""
    except (ValueError, KeyError, TypeError):
        return ""


# --- act -----------------------------------------------------------------------------------------------------

class Failed(RuntimeError):
    """The current config cannot be served; the message is the reason reported."""


class Superseded(RuntimeError):
    """A newer served config arrived while acting on this one."""


class DockerUnavailable(RuntimeError):
    """docker did not answer in time: what runs is unknown, so nothing is decided on it."""


TIMED_OUT = 124  # a command out of time answers like a failed one (as timeout(1)), never raises
TIMEOUT_SCALE = 1.0  # --docker-timeout-scale (tests)
# tpu-inference #926: a start fails while the previous process holds the TPU's VFIO group; once it is gone, it succeeds.
VFIO_BUSY = re.compile(r"open\(/dev/vfio/\d+\): Device or resource busy|Couldn't open iommu group /dev/vfio/\d+")
VFIO_BUSY_ATTEMPTS = 3
# vLLM's weight loader logs this after a download (vllm/model_executor/model_loader/weight_utils.py).
DOWNLOAD_LINE = re.compile(r"Time spent downloading weights for \S+: ([0-9.]+) seconds")
# vLLM's cache config info gauge names the KV block count it allocated (vllm/v1/metrics: vllm:cache_config_info).
CACHE_CONFIG_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*\bnum_gpu_blocks="(\d+)"', re.MULTILINE)
BLOCK_OVERRIDE = "--num-gpu-blocks-override"
HBM_EXHAUSTED = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|\bOOM\b")  # in XLA's and tpu-inference's words


def command(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    timeout = timeout_s * TIMEOUT_SCALE
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        log(f"warning: {' '.join(argv[:2])} did not finish within {timeout:g} s")
        return subprocess.CompletedProcess(argv, TIMED_OUT, "", f"{' '.join(argv[:3])}: timed out after {timeout:g} s")


def docker(*args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return command(["docker", *args], timeout_s, env)


def systemctl(*args: str) -> subprocess.CompletedProcess:
    return command(["systemctl", *args], 120)


def apt(*args: str) -> subprocess.CompletedProcess:
    return command(["apt-get", *args], 1800, {**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def said(done: subprocess.CompletedProcess, limit: int = 600) -> str:
    """A command's output as one line, its end kept."""
    return " ".join((done.stdout + done.stderr).split())[-limit:]


def inspect_container(name: str) -> Container | None:
    """The named container, or None when there is none; DockerUnavailable when docker does not say."""
    done = docker("inspect", name, timeout_s=30)
    if done.returncode == TIMED_OUT:
        raise DockerUnavailable(done.stderr)
    if done.returncode != 0:
        return None
    try:
        info = json.loads(done.stdout)[0]
        labels = info.get("Config", {}).get("Labels") or {}
        state = info.get("State", {})
        return Container(str(labels.get(HASH_LABEL, "")), bool(state.get("Running")), int(state.get("ExitCode") or 0),
                         str(info.get("Id") or ""))
    except (ValueError, IndexError, KeyError, TypeError):
        return None


def inspect_or(name: str, unknown: Container | None) -> Container | None:
    try:
        return inspect_container(name)
    except DockerUnavailable:
        return unknown


UP = Container("", True)  # what a container docker does not say about is taken for: not known to be gone


def managed_containers() -> list[str]:
    """Every container this supervisor started (by its label), running or not; DockerUnavailable if unknown."""
    done = docker("ps", "--all", "--filter", f"label={HASH_LABEL}", "--format", "{{.Names}}", timeout_s=30)
    if done.returncode != 0:
        raise DockerUnavailable(done.stderr or f"docker ps exited {done.returncode}")
    return done.stdout.split()


def container_logs(name: str) -> str:
    return said(docker("logs", "--tail", "15", name, timeout_s=30), 1200)


def image_digest(image: str) -> str:
    """The local image's registry digest (sha256:...), or '' when it is not there."""
    done = docker("image", "inspect", "--format", "{{json .RepoDigests}}", image, timeout_s=60)
    if done.returncode != 0:
        return ""
    try:
        digests = json.loads(done.stdout or "[]") or []
    except ValueError:
        return ""
    return digests[0].partition("@")[2] if digests else ""


def free_gb(path: Path) -> int | None:
    """Free GB on the filesystem holding `path` (df, as the startup script measures it), None when df fails."""
    try:
        done = command(["df", "--output=avail", "-BG", str(path)], 30)
    except OSError:
        return None
    digits = "".join(ch for ch in (done.stdout.strip().splitlines() or [""])[-1] if ch.isdigit())
    return int(digits) if done.returncode == 0 and digits else None


def prune_images() -> str:
    """`docker image prune --all --force`: every image no container (running or stopped) uses; what it reclaimed."""
    done = docker("image", "prune", "--all", "--force", timeout_s=1800)
    found = re.search(r"Total reclaimed space: (\S+)", done.stdout)
    reclaimed = found.group(1) if done.returncode == 0 and found else ""
    return "" if re.fullmatch(r"0(\.0+)?[kMGT]?B", reclaimed) else reclaimed


def vfio_holders(proc: Path, besides: tuple[str, ...] = ()) -> list[str]:
    """'pid: /dev/vfio/N' per process holding a TPU open, but those of the containers `besides` names by id."""
    held = []
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            targets = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:  # the process ended, or a kernel thread without fds
            continue
        if besides and any(container_id in read_text(fd_dir.parent / "cgroup") for container_id in besides):
            continue
        held += [f"{fd_dir.parent.name}: {target}" for target in targets if target.startswith("/dev/vfio/")
                 and target != "/dev/vfio/vfio"]  # the container file is shared; the group files are exclusive
    return held


def sets_block_count(argv: tuple[str, ...] | list[str]) -> bool:
    """Whether the served argv already sets the KV block count (extraArgs): then it is the user's, not learned."""
    return any(arg.replace("_", "-").split("=", 1)[0] == BLOCK_OVERRIDE for arg in argv)


def fetch(url: str, timeout_s: float) -> tuple[int, str]:
    """(status, body); (0, '') when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - our server
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError:
        return 0, ""


def healthy(url: str) -> bool:
    return fetch(f"{url}/health", 5)[0] == 200


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def weights_cached(hf_home: Path, model: str) -> bool:
    """Whether the Hugging Face cache already holds a snapshot of `model` (huggingface_hub's cache layout)."""
    snapshots = hf_home / "hub" / f"models--{model.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(path.is_file() for path in snapshots.rglob("*"))


class Supervisor:
    def __init__(self, settings: Settings, metadata: Metadata, latest: Latest, own_version: str):
        self.settings = settings
        self.metadata, self.latest, self.own_version = metadata, latest, own_version
        self.guest = guest_state.GuestState(settings.metadata_url, settings.path(RUN_DIR),
                                            settings.guest_write_interval_s, settings.guest_reassert_s)
        # the config hash the startup script booted with: the first run continues that boot's timeline
        self.state = State(boot_hash=read_text(settings.path(FACTS["BOOT_HASH_FILE"])).strip())
        self.seen = 0
        # Run at each `serving` (after a restart too): idempotent, never failing it.
        self.post_serving_hooks = [self.push_compile_cache, self.mark_cache_disk, self.prune_caches,
                                   self.install_ops_agent]
        self.ops_agent: threading.Thread | None = None
        self.current: ServedConfig | None = None
        self.xla_key = self.restore_error = ""
        self.api_key = ""  # vLLM's API key when the config sets one: every readiness check presents it
        self.compile_before = self.compile_after = self.compile_restored = 0
        self.kv_blocks: int | None = None  # the pinned KV block count this start runs with
        self.kv_learned: int | None = None  # what this boot's allocator chose, when nothing was pinned

    @property
    def xla_dir(self) -> Path:
        return self.settings.path(f"{CACHE_ROOT}/xla/{self.xla_key}")

    @staticmethod
    def cache_key(config: ServedConfig) -> str:
        local = config.pinned_digest or image_digest(config.image)  # no docker call for a pinned image
        return compile_cache.xla_cache_key(config.image, config.machine_type, local)

    # reporting: every change goes into the one state attribute; the journal has each reason as it was given
    def report(self, key: str, value: str) -> None:
        self.change({key: value})

    def change(self, fields: dict[str, str | None], new_timeline: bool = False) -> None:
        if fields.get("reason"):
            log(f"reason: {fields['reason']}")
        self.guest.update(fields, new_timeline)

    def stage(self, name: str, **more: str) -> None:
        """Enter a stage; `more` fields go into the same change (config_hash= for config-hash)."""
        self.change({"stage": name, f"at-{name}": str(int(time.time())),
                     **{key.replace("_", "-"): value for key, value in more.items()}})
        log(f"stage {name}")

    def fail(self, reason: str) -> None:
        log(f"FAILED: {reason}")
        self.stage("failed", reason=reason)
        self.state.phase = "failed"

    # the loop
    def run_forever(self) -> None:
        disk_checked = 0.0
        while True:
            try:
                if time.monotonic() - disk_checked >= self.settings.disk_check_s and not self.state.disk_lost:
                    disk_checked = time.monotonic()
                    if problem := self.disk_problem():
                        self.fail(self.stop_for_lost_disk(problem))
                attributes = None
                while attributes is None:  # nothing read yet
                    attributes, self.seen = self.latest.wait(self.seen, self.settings.check_s)
                self.step(attributes)
            except DockerUnavailable as err:  # look again at the next check
                log(f"warning: {err}; looking again in {self.settings.check_s:g} s")

    def step(self, attributes: dict[str, str]) -> str:
        if self.state.disk_lost:  # failed for good this boot: nothing to serve from
            return WAIT
        try:
            config, invalid = ServedConfig.parse(attributes.get(SERVED_CONFIG_KEY)), ""
        except ValueError as err:
            config, invalid = None, str(err)
        containers = {engine.name: inspect_container(engine.name) for engine in config.engines} if config else {}
        action = decide(attributes, containers, self.state, self.own_version)
        if action != WAIT:
            log(f"action: {action}")
        if action == UPDATE_SELF:  # install the bundle, re-execute: the new supervisor adopts the containers
            version = bundle_version_of(attributes[SUPERVISOR_KEY])
            install_bundle(json.loads(attributes[SUPERVISOR_KEY]), self.settings.path(INSTALL_DIR))
            log(f"installed supervisor {version} (was {self.own_version}); re-executing")
            self.report("supervisor", version)
            os.execv(sys.executable, [sys.executable, *sys.argv])
        elif action == INVALID:
            self.state.invalid = invalid
            self.fail(invalid)
        elif action == WAIT:
            if self.state.phase == "serving" and config:
                if time.monotonic() - self.state.serving_since > self.settings.stable_s:
                    self.state.restarts = 0
                self.sync_front(config)
        elif config:
            try:
                {APPLY: self.apply, ADOPT: self.adopt, RESTART: self.restart, GIVE_UP: self.give_up}[action](config)
            except Superseded:
                log("a newer served config arrived; switching to it")
            except Failed as err:
                self.fail(str(err))
        return action

    def pause(self, config: ServedConfig, seconds: float) -> None:
        """Sleep, waking early (Superseded) when a newer config arrives."""
        deadline, seen = time.monotonic() + seconds, self.seen
        while time.monotonic() < deadline:
            _, version = self.latest.wait(seen, deadline - time.monotonic())
            if version != seen:
                try:
                    newer = ServedConfig.parse((self.latest.attributes or {}).get(SERVED_CONFIG_KEY)).config_hash
                except ValueError:
                    newer = config.config_hash
                if newer != config.config_hash:
                    raise Superseded()
            seen = version

    def retry(self, config: ServedConfig, what: str,
              once: Callable[[], subprocess.CompletedProcess]) -> subprocess.CompletedProcess | None:
        """Run `once` until it exits 0, ATTEMPTS times at most with doubling pauses: None, or the last failure."""
        delay = self.settings.retry_delay_s
        for attempt in range(1, ATTEMPTS + 1):
            done = once()
            if done.returncode == 0:
                return None
            if attempt < ATTEMPTS:
                log(f"attempt {attempt}/{ATTEMPTS} of {what} failed; retrying in {delay:g}s")
                self.pause(config, delay)
                delay *= 2
        return done

    # actions
    def begin(self, config: ServedConfig) -> None:
        """Announce a run of `config`: stage and hash in one change (an old stage never shows with the new hash)."""
        self.state = replace(self.state, applied_hash=config.config_hash, phase="", restarts=0, invalid="")
        self.current = config
        new_timeline = config.config_hash != self.state.boot_hash  # a reconfiguration, not this boot's first run
        now = str(int(time.time()))
        self.change({**({"since": now} if new_timeline else {}), "stage": "pulling-image", "at-pulling-image": now,
                     "config-hash": config.config_hash, "reason": "", "image": "", "weights": "", "compile-cache": "",
                     "restarts": "0", "warning": None, "engines": None}, new_timeline=new_timeline)
        log("stage pulling-image")
        self.state.boot_hash = ""  # only the first run after boot continues the boot's timeline

    # the cache disk
    def disk_problem(self) -> str:
        """Grow the cache disk's filesystem if the disk grew; why it can no longer be served from, or ''."""
        device = read_text(self.settings.path(FACTS["CACHE_DEVICE_FILE"])).strip()  # what the startup script mounted
        if not device:
            return ""  # no cache disk this boot: the caches are on the boot disk
        if problem := cache_disk.lost(device, self.settings.path(CACHE_ROOT)):
            return problem
        try:
            grown = cache_disk.grow(device)
        except cache_disk.DiskError as err:
            log(f"warning: could not grow the cache disk's filesystem ({err}); it serves at its old size")
            return ""
        if grown:
            free = free_gb(self.settings.path(CACHE_ROOT))
            log(f"cache disk {device}: {grown}")
            self.report("cache", f"disk: {grown}" + (f" ({free} GB free)" if free is not None else ""))
        return ""

    def stop_for_lost_disk(self, problem: str) -> str:
        """Stop serving from a cache disk that went away; never unmount or detach. The reason to report."""
        self.state.disk_lost = problem
        log(f"{problem}: stopping the server")
        try:
            names = managed_containers()
        except DockerUnavailable:
            names = [engine.name for engine in self.current.engines] if self.current else []
        for name in names:
            docker("stop", "--time", "30", name, timeout_s=60)
            docker("rm", "-f", name, timeout_s=60)
        if self.current and self.current.front:
            systemctl("stop", FRONT_UNIT)
        return (f"{problem}: serving stopped rather than serve from a disk that went away (Docker's data root and the "
                "caches are on it); nothing was unmounted or detached. Reattach the disk and reboot the VM, or "
                "replace the VM")

    def apply(self, config: ServedConfig) -> None:
        log(f"serving config {config.config_hash}: model {config.model}, image {config.image}")
        self.begin(config)
        if problem := self.disk_problem():  # reported as this config's failure: the gate waiting for it gets it
            raise Failed(self.stop_for_lost_disk(problem))
        image = self.pull(config)
        self.xla_key = self.cache_key(config)
        self.xla_dir.mkdir(parents=True, exist_ok=True)
        self.compile_restored = self.restore_compile_cache(config)
        self.compile_before = compile_cache.entries(self.xla_dir)
        self.kv_learned = None
        self.kv_blocks = None if sets_block_count(config.engines[0].docker_run_args) else compile_cache.read_pin(
            self.xla_dir, config.config_hash)
        if self.kv_blocks:
            log(f"KV blocks pinned at {self.kv_blocks} (the count this config's first boot allocated)")
        hf_home = self.settings.path(f"{CACHE_ROOT}/huggingface")
        hf_home.mkdir(parents=True, exist_ok=True)
        weights = "cached" if weights_cached(hf_home, config.model) else "downloaded"
        self.stage("fetching-token")
        token = self.read_secret(config.hf_token_secret)
        secrets = self.fetch_secret_env(config)
        self.stage("starting-server")
        try:
            self.start_engines(config, token, secrets)
        except Failed as err:
            if not (self.kv_blocks and HBM_EXHAUSTED.search(str(err))):
                raise
            # The pinned count no longer fits (the HBM left after the weights shrank): learn it again.
            self.report("reason", f"the pinned {self.kv_blocks} KV blocks did not fit; starting once more without "
                                  "the pin")
            compile_cache.drop_pin(self.xla_dir, config.config_hash)
            self.kv_blocks = None
            self.start_engines(config, token, secrets)
        token, secrets = "", {}
        self.report("image", image)
        if weights == "downloaded":
            logged = docker("logs", config.engines[0].name, timeout_s=60)
            if found := DOWNLOAD_LINE.findall(logged.stdout + logged.stderr):
                weights += f" in {float(found[-1]):.0f} s"
        self.report("weights", weights)
        self.check_refusals(config)
        self.serving(config)

    def start_engines(self, config: ServedConfig, token: str, secrets: dict[str, str]) -> None:
        """Remove what a config of this VM left, start the front, the first engine, then (it compiled) the others."""
        # the config's own names too: a container of such a name that is not ours would refuse the run
        names = dict.fromkeys([*managed_containers(), *(engine.name for engine in config.engines)])
        self.remove(config, list(names), besides=())
        self.start_front(config)
        first, *others = config.engines
        for group in ([first], others) if others else ([first],):
            self.start_and_wait(config, group, lambda engine: self.run_engine(config, engine, token, secrets))
        if config.front:
            self.wait_for_front(config)

    def pull(self, config: ServedConfig) -> str:
        """Pull the image unless a digest-pinned copy is already local; 'cached' or 'pulled in N s'."""
        before = image_digest(config.image)
        if config.pinned_digest and before:
            return "cached"
        if not before:
            self.check_space_for_pull(config)
        started = time.monotonic()
        if self.retry(config, f"docker pull {config.image}",
                      lambda: docker("pull", "--quiet", config.image, timeout_s=3600)):
            raise Failed(f"could not pull {config.image} after {ATTEMPTS} attempts")
        after = image_digest(config.image)
        return "cached" if before and before == after else f"pulled in {time.monotonic() - started:.0f} s"

    def check_space_for_pull(self, config: ServedConfig) -> None:
        """Fail with the numbers before a pull that cannot fit, not with ENOSPC halfway (after a prune)."""
        free = free_gb(self.settings.path(CACHE_ROOT))
        if free is None or free >= PULL_FREE_GB:
            return
        pruned = prune_images()
        log(f"{free} GB free for a pull that needs {PULL_FREE_GB} GB; pruned unused images "
            f"({pruned or 'there were none'})")
        free = free_gb(self.settings.path(CACHE_ROOT)) or free
        if free < PULL_FREE_GB:
            raise Failed(f"not enough space to pull {config.image}: {free} GB free under {CACHE_ROOT} (Docker's data "
                         f"root), {PULL_FREE_GB} GB needed; grow cacheDiskSizeGb (the filesystem grows "
                         "online) or start the disk afresh with `tpuserve cache rm`")

    def prune_caches(self, config: ServedConfig) -> None:
        """Post-serving: drop unused images, and the compile caches of other images or machine types."""
        reclaimed = prune_images()
        xla_root = self.settings.path(f"{CACHE_ROOT}/xla")
        stale = [d for d in xla_root.iterdir() if d.is_dir() and d.name != self.xla_key
                 and compile_cache.KEY_PATTERN.match(d.name)] if xla_root.is_dir() and self.xla_key else []
        for directory in stale:
            shutil.rmtree(directory, ignore_errors=True)
        if reclaimed or stale:
            pruned = (f"unused images ({reclaimed or 'none'}), {len(stale)} compile-cache "
                      f"director{'y' if len(stale) == 1 else 'ies'}")
            log(f"pruned {pruned} of other images")
            self.report("pruned", pruned)

    def restore_compile_cache(self, config: ServedConfig) -> int:
        self.restore_error = ""
        if not config.compile_cache_bucket:
            return 0
        self.stage("restoring-compile-cache")
        try:
            restored = compile_cache.restore(config.compile_cache_bucket, self.xla_key, self.xla_dir, self.access_token,
                                             self.settings.storage_url)
            log(f"restored {restored} compile-cache entries from gs://{config.compile_cache_bucket}")
            return restored
        except (compile_cache.CacheError, OSError, ValueError) as err:
            log(f"warning: could not restore the compile cache ({err}); compiling cold")
            self.restore_error = str(err)[:200]
            return 0

    def access_token(self) -> str:
        status, bearer = hf_token.access_token(self.settings.metadata_url)
        if bearer is None:
            raise compile_cache.CacheError(f"the metadata server gave no access token (HTTP {status})")
        return bearer

    def read_secret(self, secret: str, what: str = "") -> str:
        """A secret's latest version as the VM's account, waiting out a fresh grant; Failed names `what` it is."""
        grant = (f"grant {FACTS['SECRET_ACCESSOR_ROLE']} on it to {self.metadata.email()} (a new grant takes 2-7 min "
                 "to propagate)")
        try:
            return hf_token.read_secret(
                secret, self.settings.metadata_url, self.settings.secret_manager_url,
                retry_delay_s=self.settings.retry_delay_s, iam_wait_s=self.settings.iam_wait_s,
                iam_poll_s=self.settings.iam_poll_s, on_wait=lambda why: self.report("reason", why),
                grant_hint=grant, token_hint="Secret Manager was not asked")
        except hf_token.TokenError as err:
            raise Failed(f"{what}: {err}" if what else str(err)) from None

    def fetch_secret_env(self, config: ServedConfig) -> dict[str, str]:
        """The config's `secret_env`, each read like the token; keeps vLLM's API key for the readiness checks."""
        values = {name: self.read_secret(secret, name) for name, secret in config.secret_env}
        self.api_key = values.get(config.api_key_env, "") if config.api_key_env else ""
        return values

    def docker_run_args(self, config: ServedConfig, engine: Engine) -> list[str]:
        args = [arg.replace(FACTS["XLA_CACHE_KEY_PLACEHOLDER"], self.xla_key) for arg in engine.docker_run_args]
        # Appended to `vllm serve`'s arguments (they end the argv): the served config and its hash stay the user's.
        return args + ([BLOCK_OVERRIDE, str(self.kv_blocks)] if self.kv_blocks else [])

    def remove(self, config: ServedConfig, names: list[str], besides: tuple[str, ...]) -> None:
        """`docker rm -f` `names`, then wait (bounded) until they and their hold on the TPU are gone (but `besides`)."""
        for name in names:
            docker("rm", "-f", name, timeout_s=120)
        deadline = time.monotonic() + self.settings.release_wait_s
        while True:
            left = [name for name in names if inspect_or(name, UP) is not None]
            holders = [] if left else vfio_holders(self.settings.path("/proc"), besides)
            if not left and not holders:
                return
            if time.monotonic() >= deadline:
                log(f"warning: after {self.settings.release_wait_s:g} s " + (
                    f"the TPU is still held ({', '.join(holders)})" if not left else
                    f"container {', '.join(left)} is still there") + "; starting anyway")
                return
            self.pause(config, self.settings.poll_s)

    def others_serving(self, config: ServedConfig, engines: list[Engine]) -> tuple[str, ...]:
        """The ids of the config's other engines that run: their processes hold their own chips."""
        found = [inspect_or(engine.name, None) for engine in config.engines if engine not in engines]
        return tuple(container.id for container in found if container and container.running and container.id)

    def run_engine(self, config: ServedConfig, engine: Engine, token: str, secrets: dict[str, str]) -> None:
        if inspect_container(engine.name) is not None:  # a start retried after a busy TPU left it exited
            self.remove(config, [engine.name], self.others_serving(config, [engine]))
        # The token and the secrets go to this one `docker run` through its environment; the argv names them only.
        env = {**os.environ, "HF_TOKEN": token, **secrets}
        done = docker(*self.docker_run_args(config, engine), env=env, timeout_s=600)
        if done.returncode != 0:
            raise Failed(f"docker run of {config.image} failed: {' '.join(done.stderr.split())[-600:]}")

    def start_and_wait(self, config: ServedConfig, engines: list[Engine], start: Callable[[Engine], None]) -> None:
        """Start `engines`, wait until each serves; a start the previous container's TPU hold failed is retried."""
        for engine in engines:
            start(engine)
        self.stage("loading-model")
        for engine in engines:
            for attempt in range(1, VFIO_BUSY_ATTEMPTS + 1):
                try:
                    self.wait_until_serving(config, engine)
                    break
                except Failed as err:
                    if not VFIO_BUSY.search(str(err)) or attempt == VFIO_BUSY_ATTEMPTS:
                        raise
                    held = "the previous container" if len(config.engines) == 1 else "a previous container"
                    self.report("reason", f"the TPU was still held by {held} (tpu-inference #926); starting "
                                f"{'' if len(config.engines) == 1 else engine.name + ' '}again once it is free "
                                f"(attempt {attempt + 1}/{VFIO_BUSY_ATTEMPTS})")
                    self.remove(config, [], self.others_serving(config, [engine]))  # until the TPU is free
                    start(engine)
            self.count_serving(config)

    def count_serving(self, config: ServedConfig, note: str = "") -> None:
        """Beside other engines, the state says how many serve (`engines`: "3 of 4 serving; ...")."""
        if len(config.engines) == 1:
            return
        up = sum(healthy(engine.url) for engine in config.engines)
        engines = f"{up} of {len(config.engines)} serving" + (f"; {note}" if note else "")
        log(f"engines: {engines}")
        self.report("engines", engines)

    def wait_until_serving(self, config: ServedConfig, engine: Engine) -> None:
        """/health, then the model listed and a real completion (readycheck's rules), then the warm-up."""
        deadline = time.monotonic() + config.ready_timeout_s
        while not healthy(engine.url):
            container = inspect_or(engine.name, UP)
            if container is None or not container.running:
                raise Failed(f"container {engine.name} exited: {container_logs(engine.name)}")
            if time.monotonic() >= deadline:
                raise Failed(f"vLLM{'' if len(config.engines) == 1 else ' ' + engine.name} did not report healthy "
                             f"within {config.ready_timeout_s:g}s")
            self.pause(config, self.settings.poll_s)
        log(f"{engine.name}: /health is 200")
        ready, detail = readycheck.check(engine.url, config.model, timeout_s=300, api_key=self.api_key)
        if not ready:
            raise Failed(f"the server is up but not serving: {detail}" if len(config.engines) == 1 else
                         f"engine {engine.name} is up but not serving: {detail}")
        log(f"{engine.name}: first completion answered")
        if config.warmup_image:
            self.warm_up(config, engine)

    def wait_for_front(self, config: ServedConfig) -> None:
        """The front answers as the engines do: its checks have seen them (2 s apart, components/front.py)."""
        deadline = time.monotonic() + FRONT_READY_S
        while True:
            ready, detail = readycheck.check(config.server_url, config.model, timeout_s=30, api_key=self.api_key)
            if ready:
                log(f"the front serves at {config.server_url}")
                return
            if time.monotonic() >= deadline:
                raise Failed(f"every engine serves, but the front (HAProxy on {config.server_url}) does not: {detail}")
            self.pause(config, self.settings.poll_s)

    def check_refusals(self, config: ServedConfig) -> None:
        """One request per modality not served: 4xx expected, another answer a `warning`, an engine down fails."""
        if not config.refusal_parts:
            return
        result = readycheck.refusals(config.engines[0].url, config.model, config.refusal_parts, timeout_s=60,
                                     api_key=self.api_key)
        if not result.serving:
            raise Failed(f"disabled-modality check: {result.detail}")
        log(f"disabled modalities: {result.detail}")
        if result.warnings:
            warning = " | ".join(result.warnings)
            log(f"warning: {warning}")
            self.report("warning", warning)

    def warm_up(self, config: ServedConfig, engine: Engine) -> None:
        body = {"model": config.model, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": config.warmup_image}},
            {"type": "text", "text": "What color is this?"}]}]}
        for attempt in (1, 2):  # the first multimodal request after boot can answer 422; one retry should pass
            try:
                answer = f"HTTP {readycheck.request(f'{engine.url}/v1/chat/completions', 300, body, self.api_key)[0]}"
            except OSError as err:
                answer = str(err)
            if answer == "HTTP 200":
                log(f"{engine.name}: multimodal warm-up answered")
                return
            log(f"{engine.name}: multimodal warm-up attempt {attempt} failed ({answer})")
        raise Failed("the multimodal warm-up request failed twice" if len(config.engines) == 1 else
                     f"the multimodal warm-up request to {engine.name} failed twice")

    def serving(self, config: ServedConfig) -> None:
        self.compile_after = compile_cache.entries(self.xla_dir)
        self.learn_block_count(config)
        text = compile_cache.verdict(self.compile_before, self.compile_after, self.kv_blocks, self.kv_learned,
                                     self.restore_error)
        restored = f" ({self.compile_restored} from the bucket)" if self.compile_restored else ""
        self.report("compile-cache", text.replace(" entries before,", f" entries before{restored},"))
        self.state.phase, self.state.serving_since = "serving", time.monotonic()
        self.stage("serving", config_hash=config.config_hash)
        for hook in self.post_serving_hooks:
            try:
                hook(config)
            except Exception as err:  # noqa: BLE001 - a hook never ends the serving
                log(f"warning: post-serving {getattr(hook, '__name__', hook)} failed ({err})")

    def learn_block_count(self, config: ServedConfig) -> None:
        """First boot of a config: store the KV block count vLLM allocated, which the next boots pin."""
        if self.kv_blocks or sets_block_count(config.engines[0].docker_run_args) or not self.xla_key:
            return
        # every engine has the same chips: the same count
        found = CACHE_CONFIG_INFO.search(fetch(f"{config.engines[0].url}/metrics", 10)[1])
        if found is None:
            log("warning: /metrics did not say the KV block count; the next boot is not pinned either")
            return
        blocks = int(found.group(1))
        compile_cache.write_pin(self.xla_dir, config.config_hash, blocks,
                                "vllm:cache_config_info num_gpu_blocks of the config's first boot")
        self.kv_learned = blocks
        log(f"KV block count {blocks} stored: the next boots of this config pin it")

    def push_compile_cache(self, config: ServedConfig) -> None:
        """Post-serving (never after a failed run: half-written entries): copy new entries to the bucket."""
        if not config.compile_cache_bucket or not self.xla_key:
            return
        pushed = compile_cache.push(config.compile_cache_bucket, self.xla_key, self.xla_dir, self.access_token,
                                    self.settings.storage_url)
        log(f"pushed {pushed} compile-cache entries to gs://{config.compile_cache_bucket}")

    def mark_cache_disk(self, config: ServedConfig) -> None:
        """Post-serving, when this boot mounted the cache disk: mark it warm in the bucket (`tpuserve inventory`)."""
        mounted = read_text(self.settings.path(FACTS["CACHE_DEVICE_FILE"])).strip()
        if not (config.cache_disk and config.compile_cache_bucket and mounted):
            return
        compile_cache.mark_disk(config.compile_cache_bucket, config.cache_disk, {
            "config_hash": config.config_hash, "xla_key": self.xla_key, "entries": self.compile_after,
            "served_at": int(time.time())}, self.access_token, self.settings.storage_url)
        log(f"marked cache disk {config.cache_disk} warm in gs://{config.compile_cache_bucket}")

    def install_ops_agent(self, config: ServedConfig) -> None:
        """Post-serving, once per process, in the background (the installer skips a current agent)."""
        if self.ops_agent is None:
            self.ops_agent = threading.Thread(target=self.run_ops_agent_installer, daemon=True, name="ops-agent")
            self.ops_agent.start()

    def run_ops_agent_installer(self) -> None:
        directory = self.settings.path(INSTALL_DIR)
        # whole seconds: the installer doubles its delay with shell arithmetic
        env = {**os.environ, "OPS_AGENT_RETRY_DELAY_S": str(int(self.settings.retry_delay_s))}
        if self.settings.ops_agent_repo_script_url:
            env["OPS_AGENT_REPO_SCRIPT_URL"] = self.settings.ops_agent_repo_script_url
        if self.settings.ops_agent_config_path:
            env["OPS_AGENT_CONFIG_PATH"] = str(self.settings.path(self.settings.ops_agent_config_path))
        try:
            agent_config = (directory / FACTS["OPS_AGENT_CONFIG_FILE"]).read_text()
            done = subprocess.run(["bash", str(directory / OPS_AGENT_INSTALLER), agent_config], env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=OPS_AGENT_TIMEOUT_S, check=False)
            for line in (done.stdout + done.stderr).splitlines():
                log(line)
            ok = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as err:
            log(f"ops-agent: {err}")
            ok = False
        if not ok:
            log("warning: the Ops Agent is not running: no metrics or container logs leave the VM (serving goes on)")
        self.report("ops-agent", "running" if ok else "failed")

    def adopt(self, config: ServedConfig) -> None:
        """The config's containers already run (the supervisor was restarted or updated): keep them."""
        log(f"container {', '.join(engine.name for engine in config.engines)} already runs config "
            f"{config.config_hash}; keeping it")
        self.state = replace(self.state, applied_hash=config.config_hash, phase="", invalid="")
        self.current = config
        self.xla_key = self.xla_key or self.cache_key(config)
        if config.secret_env:
            self.fetch_secret_env(config)  # the running server's key, for the readiness checks
        loading = [engine for engine in config.engines
                   if not readycheck.check(engine.url, config.model, timeout_s=30, api_key=self.api_key)[0]]
        if loading:
            self.stage("loading-model")
            for engine in loading:
                self.wait_until_serving(config, engine)
        if config.front and not readycheck.check(config.server_url, config.model, timeout_s=30,
                                                 api_key=self.api_key)[0]:
            self.start_front(config)  # HAProxy is a unit of its own: only a front that does not answer is touched
            self.wait_for_front(config)
        self.sync_front(config)
        self.count_serving(config)
        self.state.phase, self.state.serving_since = "serving", time.monotonic()
        # at-serving: the rerun's timeline ends where this run began serving
        self.change({"config-hash": config.config_hash, "at-serving": str(int(time.time())), "stage": "serving"})
        log("stage serving (adopted)")
        self.install_ops_agent(config)  # a new bundle may carry a new agent configuration

    def exited(self, config: ServedConfig) -> list[tuple[Engine, str]]:
        """The config's engines whose container does not run, each with its exit code."""
        found = [(engine, inspect_or(engine.name, UP)) for engine in config.engines]
        return [(engine, str(container.exit_code if container else 0)) for engine, container in found
                if not (container and container.running)]

    def restart(self, config: ServedConfig) -> None:
        """Engines exited after serving: start them again after a backoff; the others serve on through the front."""
        self.state.restarts += 1
        attempt = self.state.restarts
        delay = min(self.settings.restart_delay_s * 2 ** (attempt - 1), self.settings.max_backoff_s)
        down = self.exited(config) or [(config.engines[0], "unknown")]
        engines = [engine for engine, _ in down]
        reason = "; ".join(f"{config.what(engine)} exited (code {code}) after serving" for engine, code in down) + (
            f"; restart {attempt}/{MAX_RESTARTS} in {delay:g} s. Last log lines: "
            + " | ".join(container_logs(engine.name) for engine in engines))
        self.state.phase = "restarting"
        self.stage("restarting", restarts=str(attempt), reason=reason)
        self.count_serving(config, f"{', '.join(engine.name for engine in engines)} restarting")
        self.pause(config, delay)
        self.remove(config, [], self.others_serving(config, engines))  # until no process they left holds the TPU

        def start(engine: Engine) -> None:
            done = docker("start", engine.name, timeout_s=120)
            if done.returncode != 0:
                raise Failed(f"docker start {engine.name} failed: {' '.join(done.stderr.split())[-600:]}")

        try:
            self.start_and_wait(config, engines, start)
        except Failed as err:
            log(f"restart {attempt} did not come up: {err}")
            return  # still `restarting`: decide restarts again, or gives up
        self.report("reason", f"restarted after the {' and '.join(config.what(engine) for engine in engines)} "
                              f"exited (restart {attempt})")
        self.serving(config)

    def give_up(self, config: ServedConfig) -> None:
        down = [engine for engine, _ in self.exited(config)] or [config.engines[0]]
        others = "" if len(config.engines) == 1 else "; the other engines serve on through the front"
        raise Failed(f"the {' and '.join(config.what(engine) for engine in down)} exited {self.state.restarts} times "
                     f"in a row after serving; giving up until the served config changes{others}. Last log lines: "
                     + " | ".join(container_logs(engine.name) for engine in down))

    # the front of more than one engine
    def start_front(self, config: ServedConfig) -> None:
        """HAProxy with the config's front (installed when missing), or stopped for a lone engine."""
        if not config.front:
            if self.settings.path(HAPROXY).exists():
                systemctl("stop", FRONT_UNIT)
            return
        if not self.settings.path(HAPROXY).exists():
            lock = f"DPkg::Lock::Timeout={FACTS['APT_LOCK_TIMEOUT_S']}"

            def install() -> subprocess.CompletedProcess:
                apt("update", "-q", "-o", lock)
                return apt("install", "-y", "-q", "-o", lock, "haproxy")

            if failed := self.retry(config, "apt-get install haproxy", install):
                raise Failed(f"could not install haproxy, the front of {len(config.engines)} engines, after "
                             f"{ATTEMPTS} attempts: {' '.join(failed.stderr.split())[-400:]}")
            log("front: installed haproxy")
        compile_cache.write_atomic(self.settings.path(FRONT_CONFIG), config.front)
        done = systemctl("restart", FRONT_UNIT)
        if done.returncode != 0:
            raise Failed(f"the front did not start (systemctl restart {FRONT_UNIT}: {said(done)})")
        log(f"front: HAProxy restarted with {FRONT_CONFIG}")

    def sync_front(self, config: ServedConfig) -> None:
        """A front config changed without the served hash: written and reloaded in place, engines untouched."""
        path = self.settings.path(FRONT_CONFIG)
        if not config.front or read_text(path) == config.front:
            return
        compile_cache.write_atomic(path, config.front)
        done = systemctl("reload", FRONT_UNIT)
        log("front: HAProxy reloaded with a new config" if done.returncode == 0 else
            f"warning: systemctl reload {FRONT_UNIT} failed: {said(done, 300)}")


def install_bundle(bundle: dict[str, Any], directory: Path) -> None:
    """Write each file of a supervisor bundle ({"version", "files": {name: text}}) atomically into `directory`."""
    for name, text in bundle["files"].items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad file name in the supervisor bundle: {name!r}")
        compile_cache.write_atomic(directory / name, text)
    compile_cache.write_atomic(directory / "VERSION", str(bundle["version"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the tpu-serve-config metadata key with vLLM; keep it up.")
    for setting in fields(Settings):  # --metadata-url, --check-s, ...: the tests' seams
        parser.add_argument("--" + setting.name.replace("_", "-"), default=setting.default,
                            type={"float": float, "int": int}.get(str(setting.type), str))
    settings = Settings(**vars(parser.parse_args(argv)))
    global TIMEOUT_SCALE
    TIMEOUT_SCALE = settings.docker_timeout_scale
    metadata = Metadata(settings.metadata_url)
    latest = Latest()
    version = read_text(Path(__file__).resolve().parent / "VERSION").strip()
    sup = Supervisor(settings, metadata, latest, version)
    sup.guest.start().update({"supervisor": version})  # first sends what the startup script left unsent
    threading.Thread(target=watcher, args=(metadata, latest, settings), daemon=True, name="watch").start()
    log(f"supervisor {version or '(unversioned)'} watching {SERVED_CONFIG_KEY}")
    sup.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
