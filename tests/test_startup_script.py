"""The VM startup script: rendered for dev and prod, linted, and run for real in a sandbox.

The sandbox is a FakeServer on 127.0.0.1 playing the metadata server, Secret Manager, the local vLLM server and
dl.google.com (the Ops Agent's repository script), plus PATH shims for docker, apt-get, dpkg-query and systemctl
(and a recording wrapper around the real curl) that log their argv and whether HF_TOKEN is in their environment.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pytest

from components.ops_agent import render_ops_agent_config
from components.startup_script import render_startup_script, template_environment
from tests.fake_openai import completion
from tests.httpfake import FakeServer, Request, Response
from tpuserve.facts import BOOT_STAGES, FAILED_STAGE
from tpuserve.serving import ServingConfig, config_hash

SECRET = "projects/p-1/secrets/hf-token"
CANARY = "hf_CANARY_d0n0tl3ak_7f3a9c"
ACCESS_TOKEN = "ya29.ACCESS-canary-5be1"
SERVICE_ACCOUNT = "tpu-serve-dev@p-1.iam.gserviceaccount.com"
NO_ANSWER = 0  # a token "status" that makes the fake drop the connection: curl reports no HTTP status at all
MODEL = ServingConfig().model
STAGES_IN_ORDER = list(BOOT_STAGES)
GUEST_KEYS = ["stage", "reason", "config-hash", "ops-agent"] + [f"at-{s}" for s in [*BOOT_STAGES, FAILED_STAGE]]
REPO_SCRIPT_PATH = "/cloudagents/add-google-cloud-ops-agent-repo.sh"
# Stands in for Google's add-google-cloud-ops-agent-repo.sh: with --also-install it adds the repository and runs
# apt-get to install the agent (what the real script does on Debian/Ubuntu).
FAKE_REPO_SCRIPT = """#!/bin/bash
set -e
[[ $1 == --also-install ]] || exit 0
apt-get update -q
apt-get install -y -q google-cloud-ops-agent
"""
VISION = ServingConfig(mm_limits={"image": 4, "audio": 1})

SHIM = r'''#!/usr/bin/env python3
"""Stand-in for docker / apt-get / systemctl / curl: records argv and HF_TOKEN, then behaves just enough."""
import json, os, pathlib, sys

state = pathlib.Path(os.environ["SHIM_STATE"])
name = pathlib.Path(sys.argv[0]).name
args = sys.argv[1:]
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps({"cmd": name, "argv": args, "hf_token": os.environ.get("HF_TOKEN")}) + "\n")

def counter(file):  # a file holding how many more times something fails
    path = state / file
    left = int(path.read_text()) if path.exists() else 0
    if left > 0:
        path.write_text(str(left - 1))
    return left > 0

container = state / "container.json"
agent_installed, agent_active = state / "ops_agent_installed", state / "ops_agent_active"
if name == "curl":
    os.execv(os.environ["REAL_CURL"], ["curl", *args])
elif name == "apt-get" and args[:1] == ["install"] and "docker.io" in args:
    (pathlib.Path(sys.argv[0]).parent / "docker").symlink_to(pathlib.Path(sys.argv[0]).resolve())
elif name == "apt-get" and args[:1] == ["install"] and "google-cloud-ops-agent" in args:
    if counter("agent_install_failures"):
        sys.exit(100)  # apt-get's exit status when a package cannot be fetched
    agent_installed.write_text("")
elif name == "dpkg-query":  # dpkg-query -W -f='${Status}' PACKAGE
    if not agent_installed.exists():
        print("dpkg-query: no packages found matching " + args[-1], file=sys.stderr)
        sys.exit(1)
    print("install ok installed", end="")
elif name == "systemctl" and args[-1] == "google-cloud-ops-agent":
    if args[0] == "is-active":
        sys.exit(0 if agent_active.exists() else 3)
    if args[0] == "restart":
        agent_active.write_text("")
elif name == "docker":
    if args[0] == "pull":
        sys.exit(1 if counter("pull_failures") else 0)
    if args[0] == "inspect":
        if not container.exists():
            sys.exit(1)
        info = json.loads(container.read_text())
        print(json.dumps(info["labels"], separators=(",", ":")) if "Labels" in args[2] else
              str(info["running"]).lower())
    elif args[0] == "run":
        labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
        container.write_text(json.dumps({"labels": labels, "running": not (state / "crash").exists()}))
        print("c0ffee")
    elif args[0] == "rm":
        container.unlink(missing_ok=True)
    elif args[0] == "logs":
        print("RuntimeError: model weights failed to load\nengine core exited")
'''


@dataclass
class Sandbox:
    """What one run of the script did."""

    returncode: int
    output: str
    script: str
    calls: list[dict]
    requests: list[Request]
    home: Path

    def guest_attributes(self) -> list[tuple[str, str]]:
        prefix = "/computeMetadata/v1/instance/guest-attributes/tpu-serve/"
        return [(r.path[len(prefix):], r.body.decode()) for r in self.requests
                if r.method == "PUT" and r.path.startswith(prefix)]

    def stages(self) -> list[str]:
        return [value for key, value in self.guest_attributes() if key == "stage"]

    def calls_of(self, cmd: str, verb: str | None = None) -> list[dict]:
        return [c for c in self.calls if c["cmd"] == cmd and (verb is None or c["argv"][:1] == [verb])]

    def requests_to(self, suffix: str) -> list[Request]:
        return [r for r in self.requests if r.path.endswith(suffix)]


# Secret Manager's error bodies (google.rpc.Status as the REST API returns it; the 403 and 404 messages are the ones
# `gcloud secrets versions access` prints for a missing grant and a missing secret).
SECRET_ERRORS = {
    403: ("PERMISSION_DENIED", "Permission 'secretmanager.versions.access' denied for resource "
                               f"'{SECRET}/versions/latest' (or it may not exist)."),
    404: ("NOT_FOUND", f"Secret [{SECRET}] not found or has no versions."),
}


def secret_response(status: int) -> Response:
    if status == 200:
        return Response(200, {"name": f"{SECRET}/versions/3",
                              "payload": {"data": base64.b64encode(CANARY.encode()).decode()}})
    code, message = SECRET_ERRORS.get(status, ("UNAVAILABLE", "The service is currently unavailable."))
    return Response(status, {"error": {"code": status, "message": message, "status": code}})


def token_response(request: Request, status: int) -> Response:
    """The metadata server's token endpoint (its JSON shape: access_token, expires_in, token_type)."""
    if status == NO_ANSWER:
        raise ConnectionAbortedError("fake: drop the connection without an answer")
    if request.headers.get("Metadata-Flavor") != "Google":
        return Response(403, "missing Metadata-Flavor")
    if status != 200:
        return Response(status, "metadata server error")
    return Response(200, {"access_token": ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"})


@pytest.fixture
def sandbox(tmp_path):
    """Returns run(serving, secret_statuses=[...], ...) -> Sandbox; each knob scripts one failure mode."""

    def run(serving: ServingConfig = ServingConfig(), *, secret_statuses=(200,), token_statuses=(200,),
            pull_failures=0, docker_installed=True, container_crashes=False, health_ok=True,
            completion_content="ready", image_statuses=(200,), existing_container: dict | None = None,
            rerun_in: Path | None = None, trace: bool = False, iam_wait_s: int = 60,
            repo_script_statuses=(200,), agent_install_failures=0) -> Sandbox:
        """`secret_statuses` / `token_statuses` are answered in turn, the last one repeated."""
        home = rerun_in or tmp_path
        state, shims = home / "state", home / "shims"
        if rerun_in is None:
            state.mkdir()
            shims.mkdir()
            (shims / "shim.py").write_text(SHIM)
            (shims / "shim.py").chmod(0o755)
            for cmd in ["apt-get", "dpkg-query", "systemctl", "curl"] + (["docker"] if docker_installed else []):
                (shims / cmd).symlink_to(shims / "shim.py")
        (state / "calls.jsonl").write_text("")
        (state / "pull_failures").write_text(str(pull_failures))
        (state / "agent_install_failures").write_text(str(agent_install_failures))
        if container_crashes:
            (state / "crash").write_text("")
        if existing_container is not None:
            (state / "container.json").write_text(json.dumps(existing_container))

        secret_replies = list(secret_statuses)
        token_replies = list(token_statuses)
        image_replies = list(image_statuses)
        repo_script_replies = list(repo_script_statuses)

        def next_of(replies: list[int]) -> int:
            return replies.pop(0) if len(replies) > 1 else replies[0]

        def chat(request: Request) -> Response:
            content = request.json()["messages"][0]["content"]
            if isinstance(content, list):  # the multimodal warm-up
                status = image_replies.pop(0) if image_replies else 200
                return Response(200, completion("red")) if status == 200 else Response(status, {"error": "warming up"})
            return Response(200, completion(completion_content))

        routes = {
            ("GET", "/computeMetadata/v1/instance/service-accounts/default/token"):
                lambda r: token_response(r, next_of(token_replies)),
            ("GET", "/computeMetadata/v1/instance/service-accounts/default/email"):
                lambda r: Response(200, SERVICE_ACCOUNT) if r.headers.get("Metadata-Flavor") == "Google"
                else Response(403, "missing Metadata-Flavor"),
            ("GET", f"/v1/{SECRET}/versions/latest:access"):
                lambda r: secret_response(next_of(secret_replies))
                if r.headers.get("Authorization") == f"Bearer {ACCESS_TOKEN}" else Response(401, "no bearer"),
            ("GET", "/health"): lambda r: Response(200 if health_ok else 503, ""),
            ("GET", "/v1/models"): lambda r: Response(200, {"object": "list", "data": [{"id": MODEL}]}),
            ("POST", "/v1/chat/completions"): chat,
            ("GET", REPO_SCRIPT_PATH): lambda r: Response(200, FAKE_REPO_SCRIPT)
            if (repo_script_replies.pop(0) if repo_script_replies else 200) == 200 else Response(503, "unavailable"),
        }
        for key in GUEST_KEYS:
            routes[("PUT", f"/computeMetadata/v1/instance/guest-attributes/tpu-serve/{key}")] = \
                lambda r: Response(200, "")
        with FakeServer(routes) as fake:
            script = render_startup_script(serving, SECRET, metadata_url=fake.url, secret_manager_url=fake.url,
                                           server_url=fake.url, ready_timeout_s=3, retry_delay_s=0, poll_s=0,
                                           iam_wait_s=iam_wait_s, iam_poll_s=0.05,
                                           ops_agent_repo_script_url=fake.url + REPO_SCRIPT_PATH,
                                           ops_agent_config_path=str(home / "etc" / "ops-agent" / "config.yaml"))
            (home / "startup.sh").write_text(script)
            env = {"PATH": f"{shims}:{Path(sys.executable).parent}:/usr/bin:/bin", "SHIM_STATE": str(state),
                   "REAL_CURL": shutil.which("curl"), "HOME": str(home), "LANG": "C.UTF-8"}
            done = subprocess.run(["bash", *(["-x"] if trace else []), str(home / "startup.sh")], env=env, capture_output=True, text=True,
                                  timeout=60)
        calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
        return Sandbox(done.returncode, done.stdout + done.stderr, script, calls, fake.requests, home)

    return run


def assert_token_contained(box: Sandbox) -> None:
    """The token reaches `docker run` through its environment and goes nowhere else."""
    assert [c for c in box.calls if c["hf_token"]] == [c for c in box.calls_of("docker", "run")]
    assert all(c["hf_token"] == CANARY for c in box.calls_of("docker", "run"))
    everything_else = json.dumps([c["argv"] for c in box.calls]) + box.output + box.script + json.dumps(
        box.guest_attributes()) + "".join(r.body.decode() + json.dumps(r.headers) for r in box.requests)
    assert CANARY not in everything_else
    assert ACCESS_TOKEN not in json.dumps([c["argv"] for c in box.calls_of("curl")]) + box.output


@pytest.mark.parametrize("serving", [ServingConfig(), VISION], ids=["dev", "prod"])
def test_rendered_script_passes_shellcheck_and_bash_n(tmp_path, serving):
    path = tmp_path / "startup.sh"
    path.write_text(render_startup_script(serving, SECRET))
    subprocess.run(["bash", "-n", str(path)], check=True)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    done = subprocess.run([str(shellcheck), "--severity=style", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_template_refuses_undefined_values():
    with pytest.raises(jinja2.UndefinedError, match="is undefined"):
        template_environment().get_template("startup.sh.j2").render()


def test_boot_reaches_serving_with_the_token_only_in_the_container_env(sandbox):
    box = sandbox()
    assert box.returncode == 0, box.output
    assert box.stages() == STAGES_IN_ORDER
    assert ("config-hash", config_hash(ServingConfig())) in box.guest_attributes()
    at = {k[3:]: int(v) for k, v in box.guest_attributes() if k.startswith("at-")}
    assert list(at) == STAGES_IN_ORDER and sorted(at.values()) == list(at.values())
    [run] = box.calls_of("docker", "run")
    assert run["argv"][run["argv"].index("-e") + 1:][:3] == ["HF_HOME=/dev/shm", "-e", "HF_TOKEN"]
    assert not [c for c in box.calls_of("apt-get", "install") if "docker.io" in c["argv"]]  # docker was there
    assert "could not write guest attribute" not in box.output
    assert_token_contained(box)


def test_transient_failures_are_retried(sandbox):
    box = sandbox(pull_failures=2, secret_statuses=(503, 200))
    assert box.returncode == 0, box.output
    assert len(box.calls_of("docker", "pull")) == 3
    assert len(box.requests_to("latest:access")) == 2
    assert box.stages()[-1] == "serving"
    assert_token_contained(box)


def reasons(box: Sandbox) -> list[str]:
    return [value for key, value in box.guest_attributes() if key == "reason" and value]


def test_a_fresh_grant_refused_three_times_is_waited_out(sandbox):
    """IAM propagation: the grant made in the same `pulumi up` answers 403 for a while, then 200."""
    box = sandbox(secret_statuses=(403, 403, 403, 200))
    assert box.returncode == 0, box.output
    assert len(box.requests_to("latest:access")) == 4
    assert box.stages() == STAGES_IN_ORDER
    waiting = [r for r in reasons(box) if r.startswith("waiting")]
    assert len(waiting) == 3
    assert waiting[0] == "waiting for the secret grant to propagate (HTTP 403, 0 s)"
    # Written while the stage is fetching-token, so the gate shows it there; then replaced by what happened.
    attributes = box.guest_attributes()
    first_wait = attributes.index(("reason", waiting[0]))
    assert [v for k, v in attributes[:first_wait] if k == "stage"][-1] == "fetching-token"
    assert reasons(box)[-1].startswith("the secret grant propagated after")
    assert_token_contained(box)


def test_a_grant_that_never_arrives_fails_after_the_window_naming_role_and_account(sandbox):
    box = sandbox(secret_statuses=(403,), iam_wait_s=2)
    assert box.returncode != 0
    assert box.stages()[-1] == "failed"
    assert len(box.requests_to("latest:access")) >= 2  # it kept asking for the (shortened) window
    reason = reasons(box)[-1]
    assert re.match(f"Secret Manager still refuses {SECRET} with HTTP 403 after [2-9] s: ", reason), reason
    assert "grant roles/secretmanager.secretAccessor on it to " + SERVICE_ACCOUNT in reason
    assert box.calls_of("docker", "run") == []
    assert_token_contained(box)


@pytest.mark.parametrize("status", [404, 400])
def test_a_missing_secret_fails_at_once(sandbox, status):
    box = sandbox(secret_statuses=(status,))
    assert box.returncode != 0
    assert len(box.requests_to("latest:access")) == 1
    assert box.stages()[-1] == "failed"
    [reason] = reasons(box)
    assert reason.startswith(f"Secret Manager refused {SECRET} with HTTP {status}: no such secret")
    assert box.calls_of("docker", "run") == []
    assert_token_contained(box)


@pytest.mark.parametrize("token_status, says", [
    (NO_ANSWER, "no answer after 5 attempts"),
    (503, "HTTP 503 after 5 attempts"),
])
def test_an_unreachable_metadata_server_is_named_and_secret_manager_is_not_blamed(sandbox, token_status, says):
    box = sandbox(token_statuses=(token_status,))
    assert box.returncode != 0
    assert len(box.requests_to("/service-accounts/default/token")) == 5
    assert box.requests_to("latest:access") == []
    [reason] = reasons(box)
    assert reason.startswith("could not get an access token from the metadata server (")
    assert says in reason and reason.endswith("Secret Manager was not asked")


def test_a_metadata_server_that_refuses_the_token_fails_at_once(sandbox):
    box = sandbox(token_statuses=(404,))  # e.g. a VM without a service account
    assert box.returncode != 0
    assert len(box.requests_to("/service-accounts/default/token")) == 1
    [reason] = reasons(box)
    assert reason.startswith("the metadata server refused the access-token request with HTTP 404")


def test_docker_is_installed_only_when_missing(sandbox):
    box = sandbox(docker_installed=False)
    assert box.returncode == 0, box.output
    assert [c["argv"][:1] for c in box.calls_of("apt-get")][:2] == [["update"], ["install"]]
    assert "docker.io" in box.calls_of("apt-get", "install")[0]["argv"]


def test_running_again_keeps_a_container_that_serves_this_config(sandbox, tmp_path):
    first = sandbox()
    assert first.returncode == 0, first.output
    again = sandbox(rerun_in=tmp_path)
    assert again.returncode == 0, again.output
    assert again.calls_of("docker", "pull") == [] and again.calls_of("docker", "run") == []
    assert again.requests_to("latest:access") == []
    assert again.stages() == ["installing-docker", "loading-model", "serving"]


def test_a_container_from_another_config_is_replaced(sandbox):
    box = sandbox(existing_container={"labels": {"tpu-serve.config-hash": "old"}, "running": True})
    assert box.returncode == 0, box.output
    assert len(box.calls_of("docker", "run")) == 1 and box.calls_of("docker", "rm")


def test_a_crashed_container_fails_fast_with_its_last_log_lines(sandbox):
    box = sandbox(container_crashes=True, health_ok=False)
    assert box.returncode != 0
    [reason] = reasons(box)
    assert "exited" in reason and "model weights failed to load" in reason


def test_a_server_that_answers_health_but_not_completions_is_not_serving(sandbox):
    box = sandbox(completion_content="")
    assert box.returncode != 0
    assert box.stages()[-1] == "failed" and "serving" not in box.stages()


def test_vision_warm_up_retries_the_first_422_once(sandbox):
    box = sandbox(VISION, image_statuses=(422, 200))
    assert box.returncode == 0, box.output
    image_posts = [r for r in box.requests_to("/chat/completions") if isinstance(r.json()["messages"][0]["content"],
                                                                                 list)]
    assert len(image_posts) == 2
    url = image_posts[0].json()["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")


def test_vision_warm_up_failing_twice_fails_the_boot(sandbox):
    box = sandbox(VISION, image_statuses=(422, 422))
    assert box.returncode != 0 and "warm-up" in box.output


def test_text_only_sends_no_image(sandbox):
    box = sandbox()
    assert all(isinstance(r.json()["messages"][0]["content"], str) for r in box.requests_to("/chat/completions"))


def test_hostile_values_stay_data(sandbox, tmp_path):
    marker = tmp_path / "pwned"
    hostile = ServingConfig(image=f"img'; touch {marker}; echo '", extra_args=("--seed", f"$(touch {marker})"))
    box = sandbox(hostile)
    assert box.returncode == 0, box.output
    assert not marker.exists()
    [run] = box.calls_of("docker", "run")
    assert run["argv"][-2:] == ["--seed", f"$(touch {marker})"]


def test_a_traced_run_still_never_prints_the_token(sandbox):
    """Someone debugging with `bash -x` sees every expanded command, except while the token is handled."""
    box = sandbox(trace=True)
    assert box.returncode == 0, box.output
    assert "+ stage fetching-token" in box.output  # the trace is really on
    assert_token_contained(box)


# --- the Ops Agent, after `serving` ---------------------------------------------------------------------------

def call_index(box: Sandbox, predicate) -> int:
    return next(i for i, call in enumerate(box.calls) if predicate(call))


def reported_serving(call: dict) -> bool:
    return call["cmd"] == "curl" and "serving" in call["argv"] and call["argv"][-1].endswith("/tpu-serve/stage")


def test_the_ops_agent_is_installed_and_configured_after_serving(sandbox):
    box = sandbox()
    assert box.returncode == 0, box.output
    assert box.stages() == STAGES_IN_ORDER
    serving = call_index(box, reported_serving)
    download = call_index(box, lambda c: c["cmd"] == "curl" and c["argv"][-1].endswith(REPO_SCRIPT_PATH))
    install = call_index(box, lambda c: c["cmd"] == "apt-get" and "google-cloud-ops-agent" in c["argv"])
    restart = call_index(box, lambda c: c["cmd"] == "systemctl" and c["argv"] == ["restart", "google-cloud-ops-agent"])
    assert serving < download < install < restart
    written = (box.home / "etc" / "ops-agent" / "config.yaml").read_text()
    assert written == render_ops_agent_config(8000)
    assert box.guest_attributes()[-1] == ("ops-agent", "running")
    assert_token_contained(box)


@pytest.mark.parametrize("failure", [{"repo_script_statuses": (503,) * 5}, {"agent_install_failures": 5}],
                         ids=["script-unavailable", "apt-fails"])
def test_a_failed_agent_install_is_a_warning_not_a_failed_boot(sandbox, failure):
    box = sandbox(**failure)
    assert box.returncode == 0, box.output
    assert box.stages()[-1] == "serving" and "failed" not in box.stages()
    assert box.guest_attributes()[-1] == ("ops-agent", "failed")
    assert "warning: the Ops Agent is not running" in box.output
    assert len(box.requests_to(REPO_SCRIPT_PATH)) + len(
        [c for c in box.calls_of("apt-get", "install") if "google-cloud-ops-agent" in c["argv"]]) >= 5
    assert box.calls_of("systemctl", "restart") == []
    assert not (box.home / "etc" / "ops-agent" / "config.yaml").exists()


def test_a_transient_download_failure_is_retried(sandbox):
    box = sandbox(repo_script_statuses=(503, 200))
    assert box.returncode == 0, box.output
    assert len(box.requests_to(REPO_SCRIPT_PATH)) == 2
    assert box.guest_attributes()[-1] == ("ops-agent", "running")


def test_running_again_neither_reinstalls_nor_restarts_a_current_agent(sandbox, tmp_path):
    assert sandbox().returncode == 0
    again = sandbox(rerun_in=tmp_path)
    assert again.returncode == 0, again.output
    assert again.requests_to(REPO_SCRIPT_PATH) == [] and again.calls_of("apt-get") == []
    assert again.calls_of("systemctl", "restart") == []
    assert again.guest_attributes()[-1] == ("ops-agent", "running")
