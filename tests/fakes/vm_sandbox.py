"""A VM in a directory: the startup script and the supervisor run for real against fakes on 127.0.0.1.

- FakeServer plays the metadata server (instance attributes with real long-poll semantics: `wait_for_change`,
  `last_etag`, `timeout_sec`, an `ETag` header that changes exactly when the attributes do; guest attributes, every
  write recorded with its time and dropped, as Compute Engine may, when it goes over Google's documented budget of 10
  a minute and 3 a second, on a clock the sandbox runs 60 times fast unless a test asks for real time;
  the access token and service-account email), Secret Manager, Cloud Storage (objects list / media download /
  media upload with `ifGenerationMatch=0`) and the local vLLM server, or for a config of several engines the front
  (HAProxy: it answers once `systemctl restart haproxy` started it, as the first engine that runs) with each engine
  on a FakeEngine of its own. The vLLM routes follow the docker shim's
  container: nothing answers while it is stopped or gone (the connection is dropped, as nothing listens on the port),
  `/v1/models` lists the name the running container was started with (from `docker run`'s recorded argv: the
  `--served-model-name`, else the model after `vllm serve`), and a chat request for another model gets vLLM's 404.
  Tests choose what the chat route answers (Knobs.answer): content, a reasoning-only message (content null, the text in
  `reasoning`, the field vLLM 0.32's ChatMessage has: vllm/entrypoints/openai/chat_completion/protocol.py), an empty
  message or an error status.
- PATH shims stand in for docker, apt-get, dpkg-query, systemctl and the disk tools (blkid, mkfs.ext4, fsck.ext4,
  mount, mountpoint, umount, df): each is a real executable (a few lines of bash) run with the real argv and
  environment, which hands its name, argv and HF_TOKEN (whether it is in its environment, and its value) to the
  sandbox's Machine in the test process; the Machine records the call, plays the command on the state files and
  answers what it prints and its exit status. `systemctl restart tpu-serve-supervisor.service` starts the unit's
  ExecStart for real (the supervisor, as a process of its own), as systemd would; `apt-get install docker.io` puts
  `docker` on PATH. curl is the real one (its requests reach the fakes, which record them).
- Every host path is under `root` (the startup script's and supervisor's ROOT prefix).

Fixture shapes (sources): the metadata token body `{"access_token", "expires_in", "token_type"}` and the
`recursive=true&alt=json` attributes document (a JSON object of key -> string) from
https://cloud.google.com/compute/docs/metadata/querying-metadata; Secret Manager's `versions/latest:access` body
`{"name", "payload": {"data": base64}}` and Google's JSON errors; Cloud Storage's objects list
`{"kind": "storage#objects", "items": [{"name", "size", ...}], "nextPageToken"}`, a 412 for a failed
`ifGenerationMatch` (https://cloud.google.com/storage/docs/json_api/v1/objects); `docker inspect` prints a JSON array
of container documents (`Config.Labels`, `State.Running`, `State.ExitCode`), and "Error: No such object: NAME"
with exit 1 when there is none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.startup_script import render_startup_script, served_config, supervisor_bundle
from tests.fakes.fake_openai import completion
from tests.fakes.httpfake import FakeServer, Request, Response
from tests.fakes.leaks import leaked
from tpuserve.facts import (GUEST_ATTRIBUTE_BURST_PER_SECOND, GUEST_ATTRIBUTE_QUERIES_PER_MINUTE, GUEST_REASSERT_S,
                            GUEST_WRITE_INTERVAL_S, VLLM_TPU_IMAGE)
from tpuserve.guest_state import expand
from tpuserve.serving import ServingConfig, engine_addresses

SECRET = "projects/p-1/secrets/hf-token"
CANARY = "hf_CANARY_d0n0tl3ak_7f3a9c"
ACCESS_TOKEN = "ya29.ACCESS-canary-5be1"
SERVICE_ACCOUNT = "tpu-serve-dev@p-1.iam.gserviceaccount.com"
BUCKET = "p-1-tpu-serve-dev-cache"
MACHINE_TYPE = "ct6e-standard-1t"
# The image digest the sandbox's registry gives a tag, and the default image's (tpuserve/facts.py) pinned one.
IMAGE_DIGEST = VLLM_TPU_IMAGE.partition("@")[2]
XLA_KEY = f"{IMAGE_DIGEST.partition(':')[2][:16]}-{MACHINE_TYPE}"  # vm/compile_cache.py xla_cache_key
NO_ANSWER = 0  # a status that makes the fake drop the connection: curl reports no HTTP status at all
MODEL = ServingConfig().model
METADATA = "/computeMetadata/v1/"
VM_PYTHON = "/usr/bin/python3"  # what the VM image has; the supervisor must run on it without our virtualenv

# Every shimmed command is this script (a symlink to it named like the command): it sends its name, HF_TOKEN (set or
# not, and its value) and argv to the sandbox's Machine on 127.0.0.1:@PORT@, which records the call and answers the
# command's exit status, stdout and stderr, NUL-separated. Two milliseconds of bash, where a Python shim took 45 ms of
# CPU to start (the supervisor runs `docker inspect` at every check).
SHIM = r'''#!/bin/bash
exec 3<>/dev/tcp/127.0.0.1/@PORT@ || exit 125
printf '%s\0' "$#" "${0##*/}" "${HF_TOKEN+set}" "${HF_TOKEN-}" "$@" >&3
if ! { IFS= read -r -d '' -u 3 status && IFS= read -r -d '' -u 3 out && IFS= read -r -d '' -u 3 err; }; then
  echo "${0##*/} (sandbox shim): no answer from the sandbox on port @PORT@" >&2
  exit 125
fi
exec 3<&-
printf '%s' "$out"
printf '%s' "$err" >&2
exit "$status"
'''

REPO_SCRIPT_PATH = "/cloudagents/add-google-cloud-ops-agent-repo.sh"
# Stands in for Google's add-google-cloud-ops-agent-repo.sh: with --also-install it adds the repository and runs
# apt-get to install the agent (what the real script does on Debian/Ubuntu).
FAKE_REPO_SCRIPT = """#!/bin/bash
set -e
[[ $1 == --also-install ]] || exit 0
apt-get update -q
apt-get install -y -q google-cloud-ops-agent
"""
OPS_AGENT_CONFIG_PATH = "/etc/google-cloud-ops-agent/config.yaml"

# The sandbox's XLA: the model programs take the KV cache arrays as arguments, so each block count has its own; the
# sampler does not depend on it (tpu-inference runner/compilation_manager.py precompiles both kinds).
BOOT_DISK_AVAIL_GB = 150  # a 200 GB boot disk with the OS on it
GIB = 2**30
NATURAL_BLOCKS = 8713  # the allocator's count on v6e-1 for Gemma 4 E2B (tpuserve/data/model-presets.json)
MODEL_PROGRAMS = 3


def compiled_programs(blocks: int) -> list[str]:
    return [f"jit_model_step_{blocks}_{n}-cache" for n in range(MODEL_PROGRAMS)] + ["jit_sampler-cache"]


# What a container that could not open the TPU logs (tpu-inference #926; the same text in gvisor #11545).
VFIO_BUSY_LOG = ("RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: "
                 "open(/dev/vfio/0): Device or resource busy: Device or resource busy; Couldn't open iommu group "
                 "/dev/vfio/0 (set JAX_PLATFORMS='' to automatically choose an available backend)\n")
# The chat content part types of each modality (OpenAI's and vLLM's: image_url, input_audio, video_url).
PART_MODALITY = {"image_url": "image", "input_audio": "audio", "audio_url": "audio", "video_url": "video"}
SHIMMED = ["apt-get", "dpkg-query", "systemctl", "blkid", "mkfs.ext4", "fsck.ext4", "mount", "mountpoint", "umount", "df",
           "blockdev", "tune2fs", "resize2fs"]


@dataclass
class GuestWrite:
    key: str
    value: str
    at: float
    applied: bool = True

    def state(self) -> dict[str, str]:
        """The flat fields this write carries (the state attribute expanded as the Compute API's readers do)."""
        return expand({self.key: self.value})


# Google's budget for guest attributes (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes): 10
# queries a minute and bursts of 3 a second per VM, beyond which writes may be removed.
GUEST_PER_MINUTE, GUEST_BURST = GUEST_ATTRIBUTE_QUERIES_PER_MINUTE, GUEST_ATTRIBUTE_BURST_PER_SECOND
# The sandbox runs the VM's clock fast: write interval, re-assertion and the fake's budget windows all × this.
SANDBOX_GUEST_SCALE = 1 / 60


@dataclass
class Knobs:
    """Failure modes, changeable while the VM runs."""

    secret_statuses: list[int] = field(default_factory=lambda: [200])  # answered in turn, the last one repeated
    token_statuses: list[int] = field(default_factory=lambda: [200])
    attribute_errors: int = 0  # how many attribute reads answer 503 first
    key_errors: int = 0  # how many reads of one attribute (instance/attributes/KEY) answer 503 first
    page_size: int = 1000  # objects per page of a Cloud Storage listing (the API's default and maximum)
    health_ok: bool = True  # False: the running server's /health answers 503 (an engine that died)
    unhealthy: set[str] = field(default_factory=set)  # engines of several whose /health answers 503
    listed_models: list[str] | None = None  # what /v1/models lists; None: the running container's served name
    answer: str = "content"  # the chat answer: "content", "reasoning-only", "empty"
    answer_status: int = 200  # another status: the chat route answers vLLM's error body with it
    image_statuses: list[int] = field(default_factory=lambda: [200])  # the multimodal warm-up's answers
    repo_script_statuses: list[int] = field(default_factory=lambda: [200])  # dl.google.com's Ops Agent repo script
    # modality -> the status a request of it gets instead of vLLM's 400 for a 0 limit (500: the engine dies)
    refusal_answers: dict[str, int] = field(default_factory=dict)
    refusal_kills: bool = True  # whether such a 5xx kills the engine (its container exits) or leaves it serving
    guest_scale: float = SANDBOX_GUEST_SCALE  # 1: the real budget, in real time
    drop_guest_write: Callable[[GuestWrite], bool] | None = None  # writes Compute Engine "arbitrarily removes"


class VllmRoutes:
    """vLLM's /health, /v1/models, /metrics and chat, following one container of the docker shim (container_path):
    nothing listens while it is stopped; `state` and `knobs` come from the class it is mixed into."""

    state: Path
    knobs: Knobs

    def container_path(self) -> Path:
        raise NotImplementedError

    def vllm_routes(self) -> dict[tuple[str, str], Callable[[Request], Response]]:
        return {("GET", "/health"): self.health, ("GET", "/v1/models"): self.models, ("GET", "/metrics"): self.metrics,
                ("POST", "/v1/chat/completions"): self.chat}

    def served_names(self) -> list[str]:
        """The names the running container serves under (vLLM lists --served-model-name, else the model path)."""
        argv = self.container().get("argv", [])
        if "--served-model-name" in argv:
            return [argv[argv.index("--served-model-name") + 1]]
        return [argv[argv.index("serve") + 1]] if "serve" in argv else []

    def vllm_listening(self) -> None:
        if not self.container_running():
            raise ConnectionAbortedError("fake: the vllm container is not running; nothing listens on its port")

    def health(self, request: Request) -> Response:
        self.vllm_listening()
        healthy = self.knobs.health_ok and json.loads(self.container_path().read_text()).get("name") not in \
            self.knobs.unhealthy
        return Response(200 if healthy else 503)

    def metrics(self, request: Request) -> Response:
        """vLLM's cache config info gauge (labels as vLLM 0.32 exports them: tests/data/vllm-0.32.0-metrics.prom)."""
        self.vllm_listening()
        blocks = self.container().get("blocks", NATURAL_BLOCKS)
        return Response(200, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                             "# TYPE vllm:cache_config_info gauge\n"
                             f'vllm:cache_config_info{{block_size="128",cache_dtype="auto",engine="0",'
                             f'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="{blocks}",'
                             f'num_gpu_blocks_override="None"}} 1.0\n')

    def models(self, request: Request) -> Response:
        self.vllm_listening()
        names = self.served_names() if self.knobs.listed_models is None else self.knobs.listed_models
        return Response(200, {"object": "list", "data": [
            {"id": name, "object": "model", "created": 1780000000, "owned_by": "vllm", "root": name,
             "parent": None, "max_model_len": 16384} for name in names]})

    def chat(self, request: Request) -> Response:
        self.vllm_listening()
        body = request.json()
        if body.get("model") not in self.served_names():  # vllm/entrypoints/openai/models/serving.py, check_model
            return vllm_error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        content = body["messages"][0]["content"]
        if isinstance(content, list):
            modality = next(PART_MODALITY[part["type"]] for part in content if part["type"] in PART_MODALITY)
            limit = self.mm_limits().get(modality, 999)  # vLLM's default for a modality the argv does not name
            if modality in self.knobs.refusal_answers:  # a server that does not refuse what it cannot serve
                return self.engine_answer(self.knobs.refusal_answers[modality], modality)
            if limit == 0:  # vllm/multimodal/processing/context.py validate_num_items
                return vllm_error(400, f"At most 0 {modality}(s) may be provided in one prompt.", "BadRequestError",
                                  modality)
            # the multimodal warm-up
            status = self.knobs.image_statuses.pop(0) if self.knobs.image_statuses else 200
            return Response(200, completion("red")) if status == 200 else Response(status, {"error": "warming up"})
        if self.knobs.answer_status != 200:
            return vllm_error(self.knobs.answer_status, "EngineCore encountered an issue. See stack trace (above) "
                              "for the root cause.", "InternalServerError")
        message = {"content": {"content": "ready"}, "reasoning-only": {"content": None, "reasoning": "Greet the user"},
                   "empty": {"content": ""}}[self.knobs.answer]
        return Response(200, vllm_completion(body["model"], **message))

    def mm_limits(self) -> dict[str, int]:
        argv = self.container().get("argv", [])
        return json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) if "--limit-mm-per-prompt" in argv else {}

    def engine_answer(self, status: int, modality: str) -> Response:
        """What a server that let the request through answers: 200, or a 500 from an engine the request killed
        (the container exits: tpu-inference's JAX Gemma 4 fails an audio or video input inside EngineCore) or, with
        Knobs.refusal_kills off, one that failed the request and serves on (vLLM's error body either way)."""
        if status == 200:
            return Response(200, vllm_completion("m", "a sound"))
        if self.knobs.refusal_kills:
            info = self.container()
            self.container_path().write_text(json.dumps({**info, "running": False, "exit_code": 1}))
        return vllm_error(status, f"EngineCore encountered an issue ({modality}: NotImplementedError)",
                          "InternalServerError")

    def container(self) -> dict[str, Any]:
        path = self.container_path()
        return json.loads(path.read_text()) if path.exists() else {}

    def container_running(self) -> bool:
        return bool(self.container().get("running"))



class FakeEngine(VllmRoutes):
    """One engine of several on a port of its own: it follows its container (container-<name>.json)."""

    def __init__(self, state: Path, knobs: Knobs, name: str):
        self.state, self.knobs, self.name = state, knobs, name
        self.server = FakeServer(self.vllm_routes())

    def container_path(self) -> Path:
        return container_file(self.state, self.name)


CONTAINER = "vllm"


def container_file(state: Path, name: str) -> Path:
    """The docker shim's record of container `name` (the lone engine's keeps its old name, container.json)."""
    return state / ("container.json" if name == CONTAINER else f"container-{name}.json")


class FakeGoogle(VllmRoutes):
    """Metadata server, Secret Manager, Cloud Storage and vLLM (or the front of several engines) on one FakeServer."""

    def __init__(self, state: Path, knobs: Knobs):
        self.state = state
        self.knobs = knobs
        self.attributes: dict[str, str] = {}
        self.changed = threading.Condition()
        self.guest: list[GuestWrite] = []  # every guest-attribute PUT, in the order received
        self.objects: dict[str, bytes] = {}  # gs://BUCKET/<name>
        routes = {
            ("GET", f"{METADATA}instance/service-accounts/default/token"): self.token,
            ("GET", f"{METADATA}instance/service-accounts/default/email"): self.email,
            ("GET", f"/v1/{SECRET}/versions/latest:access"): self.secret,
            **self.vllm_routes(),
            ("GET", f"/storage/v1/b/{BUCKET}/o"): self.list_objects,
            ("POST", f"/upload/storage/v1/b/{BUCKET}/o"): self.upload,
            ("GET", REPO_SCRIPT_PATH): self.repo_script,
        }
        self.server = FakeServer(routes, fallback=self.other)

    # metadata
    def etag(self) -> str:
        return hashlib.sha256(json.dumps(self.attributes, sort_keys=True).encode()).hexdigest()[:16]

    def set_attributes(self, **changes: str) -> None:
        with self.changed:
            self.attributes.update(changes)
            self.changed.notify_all()

    def attributes_response(self, request: Request) -> Response:
        query = urllib.parse.parse_qs(request.query)
        if request.headers.get("Metadata-Flavor") != "Google":
            return Response(403, "Missing Metadata-Flavor:Google header.")
        if self.knobs.attribute_errors > 0:
            self.knobs.attribute_errors -= 1
            return Response(503, "metadata server unavailable")
        if query.get("wait_for_change") == ["true"]:
            last = query.get("last_etag", [""])[0]
            timeout = float(query.get("timeout_sec", ["60"])[0])
            with self.changed:
                self.changed.wait_for(lambda: self.etag() != last, timeout=timeout)
        return Response(200, dict(self.attributes), {"ETag": self.etag()})

    def other(self, request: Request) -> Response:
        prefix_attr, prefix_guest = f"{METADATA}instance/attributes/", f"{METADATA}instance/guest-attributes/tpu-serve/"
        if request.method == "GET" and request.path == prefix_attr:
            return self.attributes_response(request)
        if request.method == "GET" and request.path.startswith(prefix_attr):
            key = request.path[len(prefix_attr):]
            if request.headers.get("Metadata-Flavor") != "Google":
                return Response(403, "Missing Metadata-Flavor:Google header.")
            if self.knobs.key_errors > 0:
                self.knobs.key_errors -= 1
                return Response(503, "metadata server unavailable")
            return Response(200, self.attributes[key]) if key in self.attributes else Response(404, "not found")
        if request.method == "PUT" and request.path.startswith(prefix_guest):
            return self.put_guest(request.path[len(prefix_guest):], request.body.decode())
        bucket_objects = f"/storage/v1/b/{BUCKET}/o/"
        if request.method == "GET" and request.path.startswith(bucket_objects):
            name = urllib.parse.unquote(request.path[len(bucket_objects):])
            if name not in self.objects:
                return Response(404, {"error": {"code": 404, "message": "No such object"}})
            return Response(200, self.objects[name])
        return Response(404, {"error": f"no route {request.path}"})

    def put_guest(self, key: str, value: str) -> Response:
        """Record the write; like Compute Engine, drop it (answered 200 all the same: the writer cannot tell) when it
        goes over the documented budget (GUEST_PER_MINUTE in any minute, GUEST_BURST in any second, on the sandbox's
        clock: Knobs.guest_scale), or when Knobs.drop_guest_write picks it."""
        now, scale = time.time(), self.knobs.guest_scale
        recent = [w.at for w in self.guest]
        over = (sum(at > now - 60 * scale for at in recent) >= GUEST_PER_MINUTE
                or sum(at > now - scale for at in recent) >= GUEST_BURST)
        write = GuestWrite(key, value, now, applied=not over)
        if write.applied and self.knobs.drop_guest_write and self.knobs.drop_guest_write(write):
            write.applied = False
        self.guest.append(write)
        return Response(200, "")

    def token(self, request: Request) -> Response:
        status = next_of(self.knobs.token_statuses)
        if status == NO_ANSWER:
            raise ConnectionAbortedError("fake: drop the connection without an answer")
        if request.headers.get("Metadata-Flavor") != "Google":
            return Response(403, "Missing Metadata-Flavor:Google header.")
        if status != 200:
            return Response(status, "metadata server error")
        return Response(200, {"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"})

    def email(self, request: Request) -> Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return Response(403, "Missing Metadata-Flavor:Google header.")
        return Response(200, SERVICE_ACCOUNT)

    def secret(self, request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return Response(401, {"error": {"code": 401, "message": "Request had invalid authentication "
                                            "credentials.", "status": "UNAUTHENTICATED"}})
        status = next_of(self.knobs.secret_statuses)
        if status == 200:
            return Response(200, {"name": f"{SECRET}/versions/3",
                                  "payload": {"data": base64.b64encode(CANARY.encode()).decode()}})
        code, message = SECRET_ERRORS.get(status, ("UNAVAILABLE", "The service is currently unavailable."))
        return Response(status, {"error": {"code": status, "message": message, "status": code}})

    # vLLM (VllmRoutes): the lone engine's container, or as the front the first engine that runs
    def container_path(self) -> Path:
        lone = container_file(self.state, CONTAINER)
        if lone.exists() or not (self.state / "front_active").exists():
            return lone
        engines = sorted(self.state.glob("container-vllm-*.json"))
        running = [path for path in engines if json.loads(path.read_text()).get("running")]
        return (running or engines or [lone])[0]

    def repo_script(self, request: Request) -> Response:
        status = next_of(self.knobs.repo_script_statuses)
        return Response(200, FAKE_REPO_SCRIPT) if status == 200 else Response(status, "unavailable")
    # Cloud Storage
    def list_objects(self, request: Request) -> Response:
        if request.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return Response(401, {"error": {"code": 401, "message": "Anonymous caller"}})
        query = urllib.parse.parse_qs(request.query)
        prefix = query.get("prefix", [""])[0]
        items = [{"kind": "storage#object", "name": name, "bucket": BUCKET, "size": str(len(data))}
                 for name, data in sorted(self.objects.items()) if name.startswith(prefix)]
        start = int(query.get("pageToken", ["0"])[0])  # an opaque token for the client; an offset here
        page = items[start:start + self.knobs.page_size]
        body: dict[str, Any] = {"kind": "storage#objects", **({"items": page} if page else {})}
        if start + self.knobs.page_size < len(items):
            body["nextPageToken"] = str(start + self.knobs.page_size)
        return Response(200, body)

    def upload(self, request: Request) -> Response:
        query = urllib.parse.parse_qs(request.query)
        name = query["name"][0]
        if query.get("ifGenerationMatch") == ["0"] and name in self.objects:
            return Response(412, {"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                            "specified did not hold.", "errors": [{"reason": "conditionNotMet"}]}})
        self.objects[name] = request.body
        return Response(200, {"kind": "storage#object", "name": name, "bucket": BUCKET,
                              "size": str(len(request.body)), "generation": "1"})


# Secret Manager's error bodies (google.rpc.Status as the REST API returns it; the 403 and 404 messages are the ones
# `gcloud secrets versions access` prints for a missing grant and a missing secret).
SECRET_ERRORS = {
    403: ("PERMISSION_DENIED", "Permission 'secretmanager.versions.access' denied for resource "
                               f"'{SECRET}/versions/latest' (or it may not exist)."),
    404: ("NOT_FOUND", f"Secret [{SECRET}] not found or has no versions."),
}


def vllm_completion(model: str, content: str | None, reasoning: str | None = None) -> dict[str, Any]:
    """A chat completion as vLLM 0.32 serializes it: ChatMessage has `reasoning` (no `reasoning_content`) and drops an
    empty `tool_calls` (vllm/entrypoints/openai/chat_completion/protocol.py)."""
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": reasoning}
    return {"id": "chatcmpl-sandbox", "object": "chat.completion", "created": 1780000000, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "length",
                         "stop_reason": None}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}}


def vllm_error(status: int, message: str, kind: str, param: str | None = None) -> Response:
    """vLLM's ErrorResponse body (vllm/entrypoints/serve/engine/protocol.py: error.message, type, param, code)."""
    return Response(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})


def next_of(replies: list[int]) -> int:
    return replies.pop(0) if len(replies) > 1 else replies[0]


Answer = tuple[int, str, str]  # a shimmed command's exit status, stdout and stderr


class Machine:
    """What the shimmed commands do (the SHIM script asks over a socket on 127.0.0.1): docker, apt-get, dpkg-query,
    systemctl, the disk tools. Their state is in files under `state`, which tests read and set (container.json,
    images.json, disk.json, mounted, the *_failures counters...). Every call is recorded, in the order it arrived."""

    def __init__(self, root: Path, state: Path, shims: Path, env: dict[str, str]):
        self.root, self.state, self.shims, self.env = root, state, shims, env
        self.calls: list[dict[str, Any]] = []
        self.unit: subprocess.Popen | None = None  # the tpu-serve unit's main process (the supervisor)
        self.lock = threading.RLock()  # one command (or unit start/stop) at a time
        machine = self

        class _Call(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while True:  # count NAME TOKEN_SET TOKEN ARGV... (each NUL-terminated)
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                    fields = data.split(b"\0")[:-1]
                    if fields and len(fields) >= 4 + int(fields[0]):
                        break
                name, token_set, token, *argv = (os.fsdecode(f) for f in fields[1:])
                with machine.lock:
                    delay = machine.hang(name, argv)
                time.sleep(delay)  # a daemon slow to answer (outside the lock: other commands go on)
                status, out, err = machine.call(name, argv, token if token_set else None)
                self.request.sendall(b"\0".join(os.fsencode(s) for s in (str(status), out, err)) + b"\0")

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A shim killed with its supervisor while it waited for the answer is part of the scenario.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self.server = _Server(("127.0.0.1", 0), _Call)
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def install(self, commands: list[str]) -> None:
        shim = self.shims / "shim"
        shim.write_text(SHIM.replace("@PORT@", str(self.port)))
        shim.chmod(0o755)
        for command in commands:
            (self.shims / command).symlink_to(shim)

    def __enter__(self) -> Machine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_unit()
        self.server.shutdown()
        self.server.server_close()

    def call(self, name: str, argv: list[str], hf_token: str | None) -> Answer:
        with self.lock:
            self.calls.append({"cmd": name, "argv": argv, "hf_token": hf_token, "at": time.time()})
            try:
                behave = {"docker": self.docker, "apt-get": self.apt_get, "dpkg-query": self.dpkg_query,
                          "systemctl": self.systemctl}.get(name, self.disk_tool)
                return behave(name, argv)
            except Exception:  # a bug of the sandbox: say so where the test will look
                return 125, "", f"sandbox shim {name} {argv}: {traceback.format_exc()}"

    # state files
    def load(self, file: str, default: Any) -> Any:
        path = self.state / file
        return json.loads(path.read_text()) if path.exists() else default

    def save(self, file: str, value: Any) -> None:
        (self.state / file).write_text(json.dumps(value))

    def counter(self, file: str) -> bool:
        """A file holding how many more times something fails: True (and one less) while it is positive."""
        left = self.load(file, 0)
        if left > 0:
            self.save(file, left - 1)
        return left > 0

    def flag(self, file: str) -> bool:
        return (self.state / file).exists()

    def set_flag(self, file: str, text: str = "") -> None:
        (self.state / file).write_text(text)

    # commands
    def apt_get(self, name: str, args: list[str]) -> Answer:
        if args[:1] == ["install"] and "google-cloud-ops-agent" in args:
            if self.counter("agent_install_failures"):
                return 100, "", "E: Unable to locate package google-cloud-ops-agent\n"
            self.set_flag("ops_agent_installed")
        elif args[:1] == ["update"]:
            if self.counter("apt_update_failures"):
                return 100, "", ("E: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/jammy/InRelease  Temporary "
                                 "failure resolving 'archive.ubuntu.com'\n")
        elif args[:1] == ["install"]:
            # dpkg's lock, held by unattended-upgrades for `dpkg_lock_held_s` more seconds: apt waits for it up to
            # DPkg::Lock::Timeout (0 without the option: it fails at once), apt-pkg/deb/debsystem.cc
            held = self.load("dpkg_lock_held_s", 0)
            wait = next((float(a.split("=", 1)[1]) for a in args if a.startswith("DPkg::Lock::Timeout=")), 0.0)
            if self.counter("apt_install_failures") or held > wait:
                return 100, "", ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1234 "
                                 "(unattended-upgr)\n")
            if held:
                self.save("dpkg_lock_waited_s", held)
                self.save("dpkg_lock_held_s", 0)
            if not (self.shims / "docker").is_symlink():  # docker.io puts docker on PATH
                (self.shims / "docker").symlink_to(self.shims / "shim")
            if "haproxy" in args:  # Debian's package: /usr/sbin/haproxy and its unit
                if self.counter("haproxy_install_failures"):
                    return 100, "", "E: Unable to locate package haproxy\n"
                (self.root / "usr/sbin").mkdir(parents=True, exist_ok=True)
                (self.root / "usr/sbin/haproxy").write_text("")
        return 0, "", ""

    def dpkg_query(self, name: str, args: list[str]) -> Answer:  # dpkg-query -W -f='${Status}' PACKAGE
        if not self.flag("ops_agent_installed"):
            return 1, "", f"dpkg-query: no packages found matching {args[-1]}\n"
        return 0, "install ok installed", ""

    def systemctl(self, name: str, args: list[str]) -> Answer:
        unit = args[-1]
        if unit == "haproxy":  # the front answers (as FakeGoogle's vLLM routes) once started with a config
            if args[0] == "reload" and not self.flag("front_active"):
                return 1, "", "haproxy.service is not active, cannot reload.\n"
            if args[0] in ("restart", "reload"):
                if not (self.root / "usr/sbin/haproxy").exists():
                    return 5, "", "Failed to restart haproxy.service: Unit haproxy.service not found.\n"
                self.set_flag("front_active", (self.root / "etc/haproxy/haproxy.cfg").read_text())
            elif args[0] == "stop":
                (self.state / "front_active").unlink(missing_ok=True)
        elif unit == "google-cloud-ops-agent":
            if args[0] == "is-active":
                return (0 if self.flag("ops_agent_active") else 3), "", ""
            if args[0] == "restart":
                self.set_flag("ops_agent_active")
        elif args[0] in ("restart", "start") and unit.startswith("tpu-serve"):
            if args[0] == "start" and self.unit is not None and self.unit.poll() is None:
                return 0, "", ""  # systemd: starting an active unit does nothing
            unit_file = self.root / "etc/systemd/system" / unit
            exec_start = [line.split("=", 1)[1] for line in unit_file.read_text().splitlines()
                          if line.startswith("ExecStart=")][0]
            self.start_unit(shlex.split(exec_start))
        return 0, "", ""

    def start_unit(self, argv: list[str]) -> None:
        """Start the tpu-serve unit's process as systemd would: a process of its own, in its own session (a running
        one is killed first, as `systemctl restart` does)."""
        with self.lock:
            self.stop_unit()
            with open(self.state / "supervisor.log", "ab") as out:
                self.unit = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, env=self.env)

    def stop_unit(self) -> None:
        with self.lock:
            if self.unit is not None:
                try:
                    os.killpg(self.unit.pid, signal.SIGKILL)  # the supervisor and whatever it started
                except ProcessLookupError:
                    pass
                self.unit.wait()
                self.unit = None

    def disk_tool(self, name: str, args: list[str]) -> Answer:
        disk = self.load("disk.json", {})
        if name == "blkid":
            return (0, f"{disk['fs']}\n", "") if disk.get("fs") else (2, "", "")
        # The block device (cacheDiskSizeGb) and the ext4 filesystem on it, both 100 GB unless a test says otherwise.
        size_gb, fs_gb = disk.get("size_gb", 100), disk.get("fs_gb", 100)
        if name == "mkfs.ext4":
            self.save("disk.json", {**disk, "fs": "ext4", "fs_gb": size_gb})
        elif name == "blockdev":  # --getsize64
            return 0, f"{size_gb * GIB}\n", ""
        elif name == "tune2fs":  # -l: the superblock, as tune2fs prints it (Block count in 4 KiB blocks)
            return 0, (f"tune2fs 1.46.5 (30-Dec-2021)\nFilesystem volume name:   tpu-serve-cache\n"
                       f"Block count:              {fs_gb * GIB // 4096}\n"
                       "Block size:               4096\n"), ""
        elif name == "resize2fs":  # online: the mounted filesystem takes the whole device
            grown = size_gb - fs_gb
            self.save("disk.json", {**disk, "fs_gb": size_gb, "avail_gb": disk.get("avail_gb", 80) + grown})
            mounted = (self.state / "mounted").read_text() if self.flag("mounted") else "?"
            return 0, (f"resize2fs 1.46.5 (30-Dec-2021)\nFilesystem at {args[-1]} is mounted on {mounted}; on-line "
                       "resizing required\n"), ""
        elif name == "fsck.ext4":
            return disk.get("fsck_exit", 0), "", ""
        elif name == "mount":
            if disk.get("mount_fails"):
                return 32, "", f"mount: wrong fs type, bad option, bad superblock on {args[-2]}\n"
            self.set_flag("mounted", args[-1])
        elif name == "mountpoint":
            mounted = self.flag("mounted") and (self.state / "mounted").read_text() == args[-1]
            return (0 if mounted else 1), "", ""
        elif name == "umount":
            (self.state / "mounted").unlink(missing_ok=True)
        elif name == "df":  # the cache disk's free space where it is mounted, else the boot disk's
            mounted = self.flag("mounted") and args[-1].startswith((self.state / "mounted").read_text())
            free = disk.get("avail_gb", 80) if mounted else self.load("boot_avail_gb", BOOT_DISK_AVAIL_GB)
            return 0, f"Avail\n {free}G\n", ""
        return 0, "", ""

    def engine_holds(self, info: dict[str, Any]) -> None:
        """An engine of several holds its chip while its container runs: a process (pid 5000 + N) with
        /dev/vfio/N open, in the container's cgroup (cgroup v2: /system.slice/docker-<id>.scope)."""
        if not info["name"].startswith(f"{CONTAINER}-"):
            return
        index = int(info["name"].rsplit("-", 1)[1])
        process = self.root / "proc" / str(5000 + index)
        shutil.rmtree(process, ignore_errors=True)
        if info.get("running"):
            (process / "fd").mkdir(parents=True)
            (process / "fd" / "3").symlink_to(f"/dev/vfio/{index}")
            (process / "cgroup").write_text(f"0::/system.slice/docker-{info['id']}.scope\n")

    def hold_vfio(self, seconds: float) -> None:
        """A process holding /dev/vfio/0 (its /proc/PID/fd link, under the sandbox root, which the supervisor scans)
        for `seconds`; the release time goes to state/vfio_released_at."""
        link = self.root / "proc" / "4242" / "fd" / "7"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/vfio/0")

        def release() -> None:
            link.unlink(missing_ok=True)
            self.save("vfio_released_at", time.time())
        threading.Timer(seconds, release).start()

    def hang(self, name: str, argv: list[str]) -> float:
        """Seconds a command takes before it answers (state/hangs.json: {"docker inspect": [1.0, ...]}, one each)."""
        hangs = self.load("hangs.json", {})
        queue = hangs.get(f"{name} {argv[0] if argv else ''}") or []
        if not queue:
            return 0.0
        hangs[f"{name} {argv[0]}"] = queue[1:]
        self.save("hangs.json", hangs)
        return float(queue[0])

    def docker(self, name: str, args: list[str]) -> Answer:
        images = self.load("images.json", {})
        target = args[-1] if args else ""
        if args[0] == "pull":
            if self.counter("pull_failures"):
                return 1, "", ("Error response from daemon: Get https://registry-1.docker.io/v2/: net/http: TLS "
                               "handshake timeout\n")
            reference = args[-1]
            images[reference] = reference.partition("@")[2] or self.load("registry.json", {}).get(reference,
                                                                                                   IMAGE_DIGEST)
            self.save("images.json", images)
        elif args[:2] == ["image", "prune"]:  # --all: every image no container (running or stopped) uses
            used = [arg for path in self.containers() for arg in json.loads(path.read_text())["argv"]]
            unused = [ref for ref in images if ref not in used]
            for ref in unused:
                del images[ref]
            self.save("images.json", images)
            disk = self.load("disk.json", {})
            if disk and unused:  # each vllm-tpu image is ~25 GB on Docker's data root
                self.save("disk.json", {**disk, "avail_gb": disk.get("avail_gb", 80) + 25 * len(unused)})
            self.save("pruned_images.json", self.load("pruned_images.json", []) + unused)
            return 0, "".join(f"untagged: {ref}\n" for ref in unused) + (
                f"Total reclaimed space: {25 * len(unused)}GB\n"), ""
        elif args[:2] == ["image", "inspect"]:
            if args[-1] not in images:
                return 1, "", f"Error: No such image: {args[-1]}\n"
            return 0, json.dumps([args[-1].split("@")[0].rsplit(":", 1)[0] + "@" + images[args[-1]]]) + "\n", ""
        elif args[0] == "ps":  # --all --filter label=KEY --format '{{.Names}}'
            key = next(a.split("=", 1)[1] for a in args if a.startswith("label="))
            return 0, "".join(f"{info['name']}\n" for info in map(lambda p: json.loads(p.read_text()),
                                                                   self.containers()) if key in info["labels"]), ""
        elif args[0] == "inspect":
            container = container_file(self.state, target)
            if not container.exists():
                return 1, "", f"Error: No such object: {target}\n"
            info = json.loads(container.read_text())
            if info.get("removing"):  # `docker rm -f` returned; the daemon still tears it down for a few looks
                if info["removing"] == 1:
                    container.unlink()
                else:
                    container.write_text(json.dumps({**info, "removing": info["removing"] - 1}))
            document = {"Id": info.get("id", ""), "Name": f"/{target}", "Config": {"Labels": info["labels"]},
                        "State": {"Running": info["running"], "ExitCode": info.get("exit_code", 0)}}
            return 0, json.dumps([document]) + "\n", ""
        elif args[0] == "run":
            labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
            mounts = dict(args[i + 1].rsplit(":", 1)[::-1] for i, a in enumerate(args) if a == "-v")
            container_name = args[args.index("--name") + 1]
            container = container_file(self.state, container_name)
            if container.exists():  # docker refuses a second container of one name
                return 125, "", ("docker: Error response from daemon: Conflict. The container name "
                                 f'"/{container_name}" is already in use.\n')
            # The KV block count: --num-gpu-blocks-override when given (tpu-inference allocates what vLLM's KV cache
            # config says), else what HBM leaves after the weights, which may move by a block from boot to boot.
            natural = next_of(self.load("hbm_blocks.json", [NATURAL_BLOCKS]))
            override = [args[i + 1] for i, a in enumerate(args) if a == "--num-gpu-blocks-override"]
            blocks = int(override[-1]) if override else natural
            if "/cache/xla" in mounts:  # what the XLA cache held when the server started; then it compiles what lacks
                xla = Path(str(self.root) + mounts["/cache/xla"])  # the host is the sandbox root
                self.save("xla_at_run.json", sorted(p.name for p in xla.iterdir()) if xla.is_dir() else None)
                if xla.is_dir():
                    for program in compiled_programs(blocks):
                        if not (xla / program).exists():
                            (xla / program).write_text("compiled")
            runs = self.load("runs", 0) + 1
            self.save("runs", runs)
            base = {"name": container_name, "id": hashlib.sha256(f"{container_name}-{runs}".encode()).hexdigest(),
                    "labels": labels, "argv": args}
            if self.counter("vfio_busy_runs"):  # the previous container still held the TPU: this one exits at once
                info = {**base, "running": False, "exit_code": 1, "logs": VFIO_BUSY_LOG}
            elif blocks > self.load("hbm_capacity_blocks", 10**9):  # a pinned count that no longer fits in HBM
                info = {**base, "running": False, "exit_code": 1,
                        "logs": f"jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: "
                                f"the KV cache of {blocks} blocks\n"}
            else:
                crash = self.flag("crash") or container_name in self.load("crash_names", [])
                info = {**base, "running": not crash, "blocks": blocks}
            container.write_text(json.dumps(info))
            self.engine_holds(info)
            return 0, "c0ffee\n", ""
        elif args[0] == "start":
            container = container_file(self.state, target)
            info = json.loads(container.read_text())
            info.update(running=not self.flag("crash"), exit_code=0)
            container.write_text(json.dumps(info))
            self.engine_holds(info)
            return 0, f"{target}\n", ""
        elif args[0] == "stop":
            container = container_file(self.state, target)
            if container.exists():
                info = {**json.loads(container.read_text()), "running": False}
                container.write_text(json.dumps(info))
                self.engine_holds(info)
        elif args[0] == "rm":
            container = container_file(self.state, target)
            if container.exists():
                self.engine_holds({**json.loads(container.read_text()), "running": False})
            lingers = self.load("rm_lingers", 0)
            if container.exists() and lingers:
                container.write_text(json.dumps({**json.loads(container.read_text()), "running": False,
                                                 "removing": lingers}))
            else:
                container.unlink(missing_ok=True)
            held_s = self.load("vfio_held_s", 0)
            if held_s:  # the removed container's engine still holds the TPU's VFIO group for a while
                self.hold_vfio(held_s)
        elif args[0] == "logs":
            container = container_file(self.state, target)
            logs = json.loads(container.read_text()).get("logs") if container.exists() else None
            return 0, logs or ("INFO Time spent downloading weights for google/gemma-4-E2B-it: 41.250000 seconds\n"
                               "RuntimeError: model weights failed to load\nengine core exited\n"), ""
        return 0, "", ""

    def containers(self) -> list[Path]:
        return sorted([*self.state.glob("container.json"), *self.state.glob("container-*.json")])


@dataclass
class Vm:
    """One sandboxed VM: its directory, fakes and what ran."""

    home: Path
    google: FakeGoogle
    knobs: Knobs
    root: Path = field(init=False)
    state: Path = field(init=False)
    shims: Path = field(init=False)
    machine: Machine = field(init=False)  # what the shimmed commands do; it runs the supervisor unit
    script_output: str = ""
    script_returncode: int | None = None
    extra_supervisor_args: tuple[str, ...] = ()
    engines: dict[str, FakeEngine] = field(default_factory=dict)  # engines of several, each on its own port

    def __post_init__(self) -> None:
        self.root, self.state, self.shims = self.home / "vmroot", self.home / "state", self.home / "shims"
        self.machine = Machine(self.root, self.state, self.shims, self.env())

    def __enter__(self) -> Vm:
        """Start the fakes (the Google services and vLLM, and the machine the shims ask)."""
        self.google.server.__enter__()
        self.machine.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.machine.__exit__(*exc)  # the supervisor first: it talks to the fakes
        for engine in self.engines.values():
            engine.server.__exit__(*exc)
        self.google.server.__exit__(*exc)

    def engine(self, name: str) -> FakeEngine:
        """The fake of engine `name` (vllm-0, ...), started on first use."""
        if name not in self.engines:
            self.engines[name] = FakeEngine(self.state, self.knobs, name)
            self.engines[name].server.__enter__()
        return self.engines[name]

    @property
    def url(self) -> str:
        return self.google.server.url

    @property
    def cache_root(self) -> Path:
        return self.root / "var/lib/tpu-serve/cache"

    @property
    def device(self) -> Path:
        return self.home / "dev" / "google-tpu-serve-cache"

    def env(self) -> dict[str, str]:
        # The VM's python3 (standard library only), not the project's virtualenv.
        return {"PATH": f"{self.shims}:/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"}

    def supervisor_args(self, iam_wait_s: float = 60) -> tuple[str, ...]:
        # --disk-check-s 0.5: each look at the disk is three shimmed commands; at 0.1 s they were a third of a
        # serving sandbox's CPU, and no test needs the lost disk noticed sooner.
        scale = self.knobs.guest_scale
        return ("--metadata-url", self.url, "--secret-manager-url", self.url, "--storage-url", self.url,
                "--root", str(self.root), "--watch-timeout-s", "1", "--check-s", "0.1", "--poll-s", "0.05",
                "--retry-delay-s", "0.05", "--max-backoff-s", "1", "--restart-delay-s", "0.05",
                "--iam-wait-s", str(iam_wait_s), "--iam-poll-s", "0.05",
                "--ops-agent-repo-script-url", self.url + REPO_SCRIPT_PATH,
                "--ops-agent-config-path", OPS_AGENT_CONFIG_PATH,
                "--guest-write-interval-s", f"{GUEST_WRITE_INTERVAL_S * scale:g}",
                "--guest-reassert-s", f"{GUEST_REASSERT_S * scale:g}", "--release-wait-s", "5", "--disk-check-s", "0.5",
                *self.extra_supervisor_args)

    def startup_script(self, cache_disk: bool = True, iam_wait_s: float = 60) -> str:
        return render_startup_script(cache_disk=cache_disk, metadata_url=self.url, root=str(self.root),
                                     cache_device=str(self.device), python=VM_PYTHON,
                                     supervisor_args=self.supervisor_args(iam_wait_s), retry_delay_s=0,
                                     device_wait_s=0,
                                     guest_write_interval_s=GUEST_WRITE_INTERVAL_S * self.knobs.guest_scale)

    def serve(self, serving: ServingConfig, bucket: str = BUCKET, cache_disk: str = "", **changes: str) -> str:
        """Put `serving` in the metadata (as the stack renders it); returns its config hash. The fakes stand where
        the server is: the front (or the lone engine) on the sandbox's URL, each engine of several on its own."""
        urls = None if serving.engines == 1 else [self.engine(name).server.url for name, _ in engine_addresses(serving)]
        text = served_config(serving, SECRET, machine_type=MACHINE_TYPE if serving.engines == 1 else
                             f"ct6e-standard-{serving.chips}t", compile_cache_bucket=bucket, ready_timeout_s=5,
                             server_url=self.url, cache_disk=cache_disk, engine_urls=urls)
        self.google.set_attributes(**{"tpu-serve-config": text}, **changes)
        return json.loads(text)["config_hash"]

    # running
    def boot(self, cache_disk: bool = True, trace: bool = False, iam_wait_s: float = 60) -> int:
        """Run the startup script as the VM would at boot (it starts the supervisor through systemctl)."""
        script = self.startup_script(cache_disk, iam_wait_s)
        self.google.set_attributes(**{"startup-script": script})
        (self.home / "startup.sh").write_text(script)
        done = subprocess.run(["bash", *(["-x"] if trace else []), str(self.home / "startup.sh")], env=self.env(),
                              capture_output=True, text=True, timeout=60)
        self.script_output += done.stdout + done.stderr
        self.script_returncode = done.returncode
        return done.returncode

    def start_supervisor(self, iam_wait_s: float = 60) -> None:
        """Install the supervisor bundle from the metadata and start it, as the startup script's unit would (a
        supervisor already running is killed first, as `systemctl restart` does)."""
        from vm.supervisor import install_bundle

        install_dir = self.root / "opt/tpu-serve"
        install_bundle(json.loads(self.google.attributes["tpu-serve-supervisor"]), install_dir)
        self.machine.start_unit([VM_PYTHON, str(install_dir / "supervisor.py"), *self.supervisor_args(iam_wait_s)])

    def stop(self) -> None:
        """Kill the supervisor (and what it started)."""
        self.machine.stop_unit()

    def reboot(self, **boot: Any) -> int:
        """The VM stops and starts again: the supervisor dies, the container is left exited (no restart policy),
        /run (a tmpfs) and the mount are gone; the disk and Docker's images stay. Then the startup script runs."""
        self.stop()
        for path in self.machine.containers():
            self.kill_container(json.loads(path.read_text())["name"], exit_code=0)
        shutil.rmtree(self.root / "run", ignore_errors=True)
        (self.root / "run").mkdir()
        (self.state / "mounted").unlink(missing_ok=True)
        return self.boot(**boot)

    # what happened
    def calls(self) -> list[dict[str, Any]]:
        """Every shimmed command run, in order: {"cmd", "argv", "hf_token" (None when not in its environment)}."""
        return list(self.machine.calls)

    def calls_of(self, cmd: str, verb: str | None = None) -> list[dict[str, Any]]:
        return [c for c in self.calls() if c["cmd"] == cmd and (verb is None or c["argv"][:1] == [verb])]

    def guest(self) -> list[dict[str, str]]:
        """The state each applied guest-attribute write carried, in order (tpuserve/guest_state.py's fields)."""
        return [write.state() for write in self.google.guest if write.applied]

    def attributes(self) -> dict[str, str]:
        """The guest attributes as the Compute API's readers see them now: the last applied write's state."""
        written = self.guest()
        return written[-1] if written else {}

    def held(self) -> dict[str, str]:
        """The state the VM holds now (its state file), sent or not yet."""
        path = self.root / "run/tpu-serve/state.json"
        return {key: str(value) for key, value in json.loads(path.read_text()).items()} if path.exists() else {}

    def stages(self) -> list[str]:
        """The stages the writes carried, a stage held across several writes counted once."""
        return collapse(state.get("stage", "") for state in self.guest())

    def reasons(self) -> list[str]:
        return [reason for reason in collapse(state.get("reason", "") for state in self.guest()) if reason]

    def writes_within(self, seconds: float) -> int:
        """The most guest-attribute writes sent in any `seconds` (a window starting at a write)."""
        times = [write.at for write in self.google.guest]
        return max((sum(start <= at < start + seconds for at in times) for start in times), default=0)

    def log(self) -> str:
        path = self.state / "supervisor.log"
        return self.script_output + (path.read_text(errors="replace") if path.exists() else "")

    def container(self, name: str = CONTAINER) -> dict[str, Any]:
        return json.loads(container_file(self.state, name).read_text())

    def kill_container(self, name: str = CONTAINER, exit_code: int = 137) -> None:
        info = self.container(name)
        info.update(running=False, exit_code=exit_code)
        container_file(self.state, name).write_text(json.dumps(info))
        self.machine.engine_holds(info)  # its process is gone, and its hold on the chip with it

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; stages {self.stages()}; log:\n{self.log()[-3000:]}")

    def wait_for_stage(self, stage: str, config_hash: str | None = None, timeout_s: float = 20) -> None:
        def reached() -> bool:
            attributes = self.attributes()
            return attributes.get("stage") == stage and (config_hash is None
                                                         or attributes.get("config-hash") == config_hash)
        self.wait_for(reached, f"stage {stage} (config {config_hash})", timeout_s)


def collapse(values: Any) -> list[str]:
    out: list[str] = []
    for value in values:
        if not out or out[-1] != value:
            out.append(value)
    return out


def make_vm(home: Path, knobs: Knobs | None = None, *, docker_installed: bool = True,
            disk: dict[str, Any] | None = None, pull_failures: int = 0, agent_install_failures: int = 0) -> Vm:
    """A sandbox VM with shims installed; `disk` None means no cache disk device at all."""
    knobs = knobs or Knobs()
    state = home / "state"
    state.mkdir(parents=True)
    google = FakeGoogle(state, knobs)
    vm = Vm(home, google, knobs)
    vm.shims.mkdir()
    vm.machine.install(SHIMMED + (["docker"] if docker_installed else []))
    (vm.root / "run").mkdir(parents=True)
    if disk is not None:
        vm.device.parent.mkdir(parents=True)
        vm.device.write_text("")
        (state / "disk.json").write_text(json.dumps(disk))
    (state / "pull_failures").write_text(str(pull_failures))
    (state / "agent_install_failures").write_text(str(agent_install_failures))
    google.set_attributes(**{"enable-oslogin": "TRUE", "tpu-serve-supervisor": supervisor_bundle()})
    return vm


def token_contained(vm: Vm) -> list[str]:
    """Where the canary token showed up other than `docker run`'s environment (empty = contained)."""
    leaks = []
    runs = vm.calls_of("docker", "run")
    if [c for c in vm.calls() if c["hf_token"]] != runs:
        leaks.append("a command other than docker run got HF_TOKEN")
    if not all(c["hf_token"] == CANARY for c in runs):
        leaks.append("docker run did not get the token")
    places = {"argv": json.dumps([c["argv"] for c in vm.calls()]), "logs": vm.log(),
              "guest attributes": json.dumps(vm.guest()), "metadata": json.dumps(vm.google.attributes),
              "requests": "".join(r.body.decode(errors="replace") + json.dumps(r.headers) + r.query
                                  for r in vm.google.server.requests if "latest:access" not in r.path
                                  or r.method != "GET")}
    # Any 8 characters of it leak it (a "fingerprint" of the token's first characters in a log line too).
    leaks += [f"token in {where}" for where, text in places.items() if leaked(CANARY, text, size=8)]
    # The supervisor's access token: in no command's argv (which `ps` shows every user) and no log.
    if leaked(ACCESS_TOKEN, places["argv"] + vm.log(), size=8):
        leaks.append("access token in an argv or a log")
    return leaks


@pytest.fixture
def vms(tmp_path):
    """make(...) -> a sandbox VM whose fakes run for the test; supervisors are stopped at the end."""
    made: list[Vm] = []

    def make(**kwargs) -> Vm:
        vm = make_vm(tmp_path / f"vm{len(made)}", **kwargs).__enter__()
        made.append(vm)
        return vm

    yield make
    for vm in made:
        vm.__exit__(None, None, None)
