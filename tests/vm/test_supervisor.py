"""vm/supervisor.py: decide() for every case, watch() against a long-polling fake metadata server, and the real
supervisor process in the sandbox (tests/fakes/vm_sandbox.py): in-place reconfiguration, crash restarts, the token's
path and the IAM wait, the compile cache's bucket copy, and its own update."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from tests.fakes.httpfake import FakeServer, Request, Response
from tests.fakes.vm_sandbox import (BUCKET, IMAGE_DIGEST, SECRET, SERVICE_ACCOUNT, XLA_KEY, FakeGoogle, GuestWrite, Knobs,
                              NO_ANSWER, Vm, collapse, make_vm, token_contained)
from tests.fakes.vm_sandbox import vms  # noqa: F401 - the sandbox VM fixture
from tpuserve import facts
from tpuserve.gce import ComputeClient, Instance
from tpuserve.guest_state import expand
from tpuserve.observe.gate import INSTANCE_INTERVAL_S, boot_timeline, read_boot, watch_instance
from tpuserve.observe.status import Report, render, vm_view
from tpuserve.serving import ServingConfig, tpu_container_run_args
from vm import compile_cache, guest_state, readycheck, supervisor
from vm.supervisor import (ADOPT, APPLY, GIVE_UP, INVALID, RESTART, UPDATE_SELF, WAIT, Container, Metadata,
                           Settings, State, decide, watch)

RECONFIG_STAGES = ["pulling-image", "restoring-compile-cache", "fetching-token", "starting-server", "loading-model",
                   "serving"]


def test_the_vm_reads_its_facts_from_the_generated_file():
    """vm/ cannot import tpuserve/facts.py: scripts/vm_facts.py writes what it reads into vm/facts.json."""
    done = subprocess.run([sys.executable, "scripts/vm_facts.py", "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The VM's writes and the gate's reads together stay inside Google's documented per-minute budget.
    assert 60 / facts.GUEST_WRITE_INTERVAL_S + 60 / facts.GATE_POLL_S < facts.GUEST_ATTRIBUTE_QUERIES_PER_MINUTE
    assert INSTANCE_INTERVAL_S == facts.GATE_POLL_S and facts.GUEST_REASSERT_S <= 60


def test_a_stale_facts_file_is_named_with_the_command_that_rewrites_it(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "vm").mkdir()
    script = tmp_path / "scripts" / "vm_facts.py"
    script.write_text(Path("scripts/vm_facts.py").read_text())
    (tmp_path / "tpuserve").symlink_to(Path("tpuserve").resolve())
    (tmp_path / "vm" / "facts.json").write_text(Path("vm/facts.json").read_text().replace("tpu-serve-config", "x"))
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "vm/facts.json is stale: run `.venv/bin/python scripts/vm_facts.py`"


def test_the_writer_refuses_a_field_the_format_does_not_define(tmp_path):
    store = guest_state.Store(tmp_path / "run")
    with pytest.raises(ValueError, match="not a boot-state field .*: stge"):
        store.update({"stge": "serving"})
    assert store.update({"stage": "serving", "at-serving": "1"})["stage"] == "serving"
    assert not set(store.state()) - set(facts.GUEST_STATE_FIELDS) - {"at-serving", "seq"}


# --- decide -----------------------------------------------------------------------------------------------------

def attributes(config_hash: str = "h1", bundle: str = "v1", engines: tuple[str, ...] = ("vllm",)) -> dict[str, str]:
    config = {"config_hash": config_hash, "model": "m", "image": "i", "machine_type": "ct6e-standard-1t",
              "engines": [{"name": name, "url": f"http://127.0.0.1:{8100 + i}", "docker_run_args": ["run"]}
                          for i, name in enumerate(engines)], "hf_token_secret": SECRET}
    return {"tpu-serve-config": json.dumps(config), "tpu-serve-supervisor": json.dumps({"version": bundle}),
            "enable-oslogin": "TRUE"}


@pytest.mark.parametrize("container, state, expected", [
    (None, State(), APPLY),  # first boot
    (Container("h0", True), State(applied_hash="h0", phase="serving"), APPLY),  # a served-config change
    (Container("h1", True), State(applied_hash="h1", phase="serving"), WAIT),  # nothing changed
    (Container("h1", True), State(), ADOPT),  # the supervisor restarted; the container serves this config
    (Container("h1", False, 137), State(applied_hash="h1", phase="serving"), RESTART),  # crashed after serving
    (Container("h1", False), State(applied_hash="h1", phase="restarting", restarts=2), RESTART),
    (Container("h1", False), State(applied_hash="h1", phase="restarting", restarts=4), RESTART),  # the 5th restart
    (Container("h1", False), State(applied_hash="h1", phase="restarting", restarts=5), GIVE_UP),
    (Container("h1", False), State(applied_hash="h1", phase="failed"), WAIT),  # given up until the config changes
    (None, State(applied_hash="h1", phase="failed"), WAIT),  # a failed apply is not retried in a loop
    (Container("h1", False), State(), APPLY),  # stopped, never seen serving by this supervisor: start afresh
], ids=["boot", "change", "steady", "adopt", "crash", "crash-again", "last-restart", "give-up", "given-up", "failed", "stopped"])
def test_decide(container, state, expected):
    assert decide(attributes(), {"vllm": container}, state, own_version="v1") == expected


FOUR = ("vllm-0", "vllm-1", "vllm-2", "vllm-3")
UP, DOWN = Container("h1", True), Container("h1", False, 137)


@pytest.mark.parametrize("containers, state, expected", [
    ({name: UP for name in FOUR}, State(applied_hash="h1", phase="serving"), WAIT),
    ({name: UP for name in FOUR}, State(), ADOPT),
    ({**{name: UP for name in FOUR}, "vllm-2": DOWN}, State(applied_hash="h1", phase="serving"), RESTART),
    ({**{name: UP for name in FOUR}, "vllm-2": DOWN}, State(applied_hash="h1", phase="restarting", restarts=5),
     GIVE_UP),
    ({**{name: UP for name in FOUR}, "vllm-2": DOWN}, State(applied_hash="h1", phase="failed"), WAIT),
    ({**{name: UP for name in FOUR}, "vllm-3": None}, State(applied_hash="h1", phase="serving"), APPLY),
    ({**{name: UP for name in FOUR}, "vllm-1": Container("h0", True)}, State(applied_hash="h1", phase="serving"),
     APPLY),
    ({"vllm": Container("h1", True)}, State(applied_hash="h1", phase="serving"), APPLY),  # one engine became four
], ids=["steady", "adopt", "one-crashed", "one-given-up", "given-up", "one-missing", "one-of-another-config",
        "was-one"])
def test_decide_for_four_engines_restarts_only_what_exited_and_applies_anything_else(containers, state, expected):
    assert decide(attributes(engines=FOUR), containers, state, own_version="v1") == expected


def test_decide_updates_itself_first_and_reports_an_unreadable_config_once():
    assert decide(attributes(bundle="v2"), {"vllm": Container("h1", True)}, State(phase="serving", applied_hash="h1"),
                  "v1") == UPDATE_SELF
    broken = {**attributes(), "tpu-serve-config": "{not json"}
    assert decide(broken, {}, State(), "v1") == INVALID
    reported = "the tpu-serve-config metadata key is unreadable (JSONDecodeError: Expecting property name " \
               "enclosed in double quotes: line 1 column 2 (char 1))"
    assert decide(broken, {}, State(invalid=reported), "v1") == WAIT


# --- watch ------------------------------------------------------------------------------------------------------

def test_watch_follows_the_etag_protocol_of_the_metadata_server(tmp_path):
    google = FakeGoogle(tmp_path, Knobs())
    google.set_attributes(**{"tpu-serve-config": "a"})
    settings = Settings(watch_timeout_s=1, retry_delay_s=0.01)
    with google.server:
        metadata = Metadata(google.server.url)
        first, etag = watch(metadata, "NONE", settings)  # the guest agent's first last_etag: answered at once
        assert first["tpu-serve-config"] == "a"
        started = time.monotonic()
        same, same_etag = watch(metadata, etag, settings)  # nothing changed: held for timeout_sec, same ETag
        assert same_etag == etag and time.monotonic() - started >= 0.9
        threading.Timer(0.2, lambda: google.set_attributes(**{"tpu-serve-config": "b"})).start()
        changed, new_etag = watch(metadata, etag, settings)
        assert changed["tpu-serve-config"] == "b" and new_etag != etag
    query = google.server.requests[-1].query
    assert "wait_for_change=true" in query and f"last_etag={etag}" in query and "timeout_sec=1" in query
    assert all(r.headers.get("Metadata-Flavor") == "Google" for r in google.server.requests)


def test_watch_retries_a_503_with_exponential_backoff(tmp_path, capsys):
    google = FakeGoogle(tmp_path, Knobs(attribute_errors=3))
    sleeps: list[float] = []
    with google.server:
        found, _ = watch(Metadata(google.server.url), "NONE", Settings(retry_delay_s=0.5, max_backoff_s=1.5),
                         sleep=sleeps.append)
    assert sleeps == [0.5, 1.0, 1.5] and found == {}
    assert "the metadata server answered HTTP 503; retrying in 0.5 s" in capsys.readouterr().out


# --- the supervisor process in the sandbox ----------------------------------------------------------------------

@pytest.fixture
def vm(tmp_path):
    with make_vm(tmp_path / "vm", disk={"fs": "ext4"}) as made:
        yield made


def prunes(vm: Vm) -> int:
    return sum(1 for c in vm.calls() if c["cmd"] == "docker" and c["argv"][:2] == ["image", "prune"])


def serving_vm(vm: Vm, serving: ServingConfig = ServingConfig(), iam_wait_s: float = 60) -> str:
    """The supervisor serving `serving`, and past its post-serving hooks' docker calls: `serving` is reported before
    the hooks run (vm/supervisor.py), and their last docker call, `docker image prune`, would otherwise land in
    whatever a test counts next on a slow machine."""
    digest = vm.serve(serving)
    before = prunes(vm)
    vm.start_supervisor(iam_wait_s)
    vm.wait_for_stage("serving", digest)
    vm.wait_for(lambda: prunes(vm) > before, "the post-serving hooks to prune images")
    return digest


def mounts(run: dict) -> list[str]:
    return [run["argv"][i + 1] for i, arg in enumerate(run["argv"]) if arg in ("-v", "-e")]


def test_a_served_config_change_restarts_the_container_once_with_the_new_argv_and_the_same_mounts(vm):
    first = serving_vm(vm)
    writes = len(vm.guest())
    changed = ServingConfig(max_model_len=32768, mm_limits={"image": 4})
    second = vm.serve(changed)
    vm.wait_for_stage("serving", second)
    old_run, new_run = vm.calls_of("docker", "run")
    assert new_run["argv"] == [a.replace("{xla_cache_key}", XLA_KEY) for a in tpu_container_run_args(changed, second)]
    assert mounts(new_run) == mounts(old_run)  # the same cache mounts and variables
    assert len(vm.calls_of("docker", "rm")) == 2  # one before each run
    after = vm.guest()[writes:]
    status = vm.attributes()
    # One write carries stage, hash and timeline together: the gate never reads the old `serving` with the new hash
    # (every write of the new hash belongs to the new run's timeline, every write of the old one to the old).
    assert all((state["config-hash"] == second) == (state["since"] == status["since"]) for state in after)
    assert all(state["stage"] in RECONFIG_STAGES for state in after if state["config-hash"] == second)
    assert read_boot(status, second).ready and not read_boot(status, first).done
    assert list(boot_timeline(status)) == RECONFIG_STAGES
    assert token_contained(vm) == []


def test_an_unrelated_metadata_change_restarts_nothing(vm):
    serving_vm(vm)
    before = len(vm.calls())
    polls = len([r for r in vm.google.server.requests if "wait_for_change" in r.query])
    vm.google.set_attributes(**{"enable-oslogin": "FALSE", "startup-script": "#!/bin/bash\necho changed"})
    vm.wait_for(lambda: len([r for r in vm.google.server.requests if "wait_for_change" in r.query]) >= polls + 2,
                "the supervisor to see the change and poll again")
    time.sleep(0.5)
    docker_verbs = [c["argv"][0] for c in vm.calls()[before:] if c["cmd"] == "docker"]
    assert set(docker_verbs) <= {"inspect"}, docker_verbs  # it looked, and changed nothing
    assert vm.stages()[-1] == "serving"


def test_a_503ing_metadata_server_is_retried_with_backoff(vm):
    vm.knobs.attribute_errors = 3
    serving_vm(vm)
    delays = re.findall(r"the metadata server answered HTTP 503; retrying in ([0-9.]+) s", vm.log())
    assert [float(d) for d in delays] == [0.05, 0.1, 0.2]


def test_a_container_killed_after_serving_is_restarted_and_reported(vm):
    digest = serving_vm(vm)
    vm.kill_container(exit_code=137)
    vm.wait_for(lambda: vm.attributes().get("restarts") == "1" and vm.attributes()["stage"] == "serving",
                "serving again")
    assert len(vm.calls_of("docker", "start")) == 1 and len(vm.calls_of("docker", "run")) == 1
    # The journal has each reason; the state (coalesced within the write budget) ends with the last one.
    crash = re.search(r"reason: (container exited .*)", vm.log()).group(1)
    assert crash.startswith("container exited (code 137) after serving; restart 1/5 in 0.05 s. Last log lines: ")
    assert "model weights failed to load" in crash
    assert vm.attributes()["reason"] == "restarted after the container exited (restart 1)"
    assert "restarting" in boot_timeline(vm.attributes()) and read_boot(vm.attributes(), digest).ready
    assert token_contained(vm) == []


def test_a_container_that_keeps_crashing_is_given_up_as_failed(vm):
    digest = serving_vm(vm)
    (vm.state / "crash").write_text("")  # every start exits at once
    vm.kill_container()
    vm.wait_for_stage("failed", digest)
    assert len(vm.calls_of("docker", "start")) == 5
    reason = vm.reasons()[-1]
    assert reason.startswith("the container exited 5 times in a row after serving; giving up until the served config "
                             "changes. Last log lines: ")
    delays = re.findall(r"after serving; restart (\d)/5 in ([0-9.]+) s", " ".join(vm.reasons()))
    assert delays == [("1", "0.05"), ("2", "0.1"), ("3", "0.2"), ("4", "0.4"), ("5", "0.8")]  # doubling
    status = read_boot(vm.attributes(), digest)
    assert status.done and not status.ready
    time.sleep(0.5)
    assert len(vm.calls_of("docker", "start")) == 5  # no more attempts


def test_a_config_that_failed_is_not_retried_until_it_changes(vm):
    (vm.state / "pull_failures").write_text("99")
    first = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", first)
    assert vm.reasons()[-1] == f"could not pull {ServingConfig().image} after 5 attempts"
    time.sleep(0.5)
    assert len(vm.calls_of("docker", "pull")) == 5
    (vm.state / "pull_failures").write_text("0")
    second = vm.serve(ServingConfig(max_model_len=8192))
    vm.wait_for_stage("serving", second)
    assert vm.attributes()["reason"] == ""  # the old config's failure is not this one's


def test_the_compile_cache_is_restored_before_the_server_starts_and_pushed_after_serving(vm):
    vm.google.objects = {f"xla/{XLA_KEY}/jit_a-cache": b"compiled a", f"xla/{XLA_KEY}/jit_b-cache": b"compiled b",
                         "xla/other-key/jit_c-cache": b"another image's"}
    digest = serving_vm(vm)
    assert json.loads((vm.state / "xla_at_run.json").read_text()) == ["jit_a-cache", "jit_b-cache"]
    assert vm.attributes()["compile-cache"] == (
        "cold (4 programs compiled: the KV block count was not pinned yet, so it may differ from the cache's; 2 "
        "entries before (2 from the bucket), 6 after; KV blocks pinned at 8,713 from now on)")
    pin = f"xla/{XLA_KEY}/tpu-serve-kv-blocks-{digest}.json"
    vm.wait_for(lambda: pin in vm.google.objects, "the push after serving")
    uploads = [r for r in vm.google.server.requests if r.path.startswith("/upload/")]
    assert len(uploads) == 5  # the 4 new entries and the pinned count: nothing overwritten, nothing sent twice
    assert all("ifGenerationMatch=0" in upload.query for upload in uploads)
    stages = list(boot_timeline(vm.attributes()))
    assert stages.index("restoring-compile-cache") < stages.index("starting-server")


def test_a_digest_pinned_image_already_on_the_disk_is_not_pulled_again(vm):
    image = f"vllm/vllm-tpu@{IMAGE_DIGEST}"
    (vm.state / "images.json").write_text(json.dumps({image: IMAGE_DIGEST}))
    serving_vm(vm, ServingConfig(image=image))
    assert vm.calls_of("docker", "pull") == [] and vm.attributes()["image"] == "cached"
    [run] = vm.calls_of("docker", "run")
    assert f"/var/lib/tpu-serve/cache/xla/{XLA_KEY}:/cache/xla" in run["argv"]  # keyed by the pinned digest


def test_a_tag_already_on_the_disk_is_pulled_again_and_reported_by_what_the_pull_found(vm):
    """A tag moves: its local copy may be stale, so it is pulled at every apply (`tpuserve up` pins a tag to a digest,
    but a served config may still name one); the report says "cached" when the pull found the image it had, and
    "pulled" when the tag had moved."""
    tag = "vllm/vllm-tpu:nightly"
    (vm.state / "images.json").write_text(json.dumps({tag: IMAGE_DIGEST}))
    (vm.state / "registry.json").write_text(json.dumps({tag: IMAGE_DIGEST}))  # the tag still names that image
    digest = serving_vm(vm, ServingConfig(image=tag))
    assert [c["argv"][-1] for c in vm.calls_of("docker", "pull")] == [tag] and vm.attributes()["image"] == "cached"
    moved = "sha256:" + "7" * 64
    (vm.state / "registry.json").write_text(json.dumps({tag: moved}))  # the tag moved on
    second = vm.serve(ServingConfig(image=tag, max_model_len=8192))
    vm.wait_for_stage("serving", second)
    assert len(vm.calls_of("docker", "pull")) == 2 and vm.attributes()["image"].startswith("pulled in ")
    assert read_boot(vm.attributes(), second).ready and not read_boot(vm.attributes(), digest).done


def test_a_new_supervisor_in_the_metadata_replaces_the_running_one_and_keeps_the_container(vm):
    serving_vm(vm)
    bundle = json.loads(vm.google.attributes["tpu-serve-supervisor"])
    bundle["files"]["supervisor.py"] += "\n# a newer supervisor\n"
    bundle["version"] = "0123456789ab"
    vm.google.set_attributes(**{"tpu-serve-supervisor": json.dumps(bundle)})
    vm.wait_for(lambda: vm.attributes().get("supervisor") == "0123456789ab" and "keeping it" in vm.log(),
                "the new supervisor to adopt the container")
    assert (vm.root / "opt/tpu-serve/supervisor.py").read_text().endswith("# a newer supervisor\n")
    assert len(vm.calls_of("docker", "run")) == 1 and vm.calls_of("docker", "rm") == vm.calls_of("docker", "rm")[:1]
    assert vm.stages()[-1] == "serving"


# --- ported from the startup script: the token and its failures ---------------------------------------------------

def test_transient_failures_are_retried(vm):
    (vm.state / "pull_failures").write_text("2")
    vm.knobs.secret_statuses = [503, 200]
    serving_vm(vm)
    assert len(vm.calls_of("docker", "pull")) == 3
    assert re.findall(r"of docker pull \S+ failed; retrying in ([0-9.]+)s", vm.log()) == ["0.05", "0.1"]
    assert len([r for r in vm.google.server.requests if r.path.endswith("latest:access")]) == 2
    assert token_contained(vm) == []


def test_a_fresh_grant_refused_again_and_again_is_waited_out(vm):
    # Six refusals 0.05 s apart outlast the sandbox's 0.2 s between state writes: one write must fall in the wait.
    vm.knobs.secret_statuses = [403] * 6 + [200]
    serving_vm(vm)
    waiting = re.findall(r"reason: (waiting for the secret grant to propagate .*)", vm.log())
    assert len(waiting) == 6 and waiting[0] == "waiting for the secret grant to propagate (HTTP 403, 0 s)"
    # What the gate saw (writes coalesced within the budget): a wait, shown in stage fetching-token.
    shown = [state for state in vm.guest() if state.get("reason", "").startswith("waiting")]
    assert shown and all(state["stage"] == "fetching-token" for state in shown)
    assert re.search(r"reason: the secret grant propagated after", vm.log())
    assert token_contained(vm) == []


def test_a_grant_that_never_arrives_fails_after_the_window_naming_role_and_account(vm):
    vm.knobs.secret_statuses = [403]
    digest = vm.serve(ServingConfig())
    vm.start_supervisor(iam_wait_s=1)
    vm.wait_for_stage("failed", digest)
    reason = vm.reasons()[-1]
    assert re.match(f"Secret Manager still refuses {SECRET} with HTTP 403 after [1-9] s: ", reason), reason
    assert f"grant roles/secretmanager.secretAccessor on it to {SERVICE_ACCOUNT}" in reason
    assert vm.calls_of("docker", "run") == []
    assert token_contained(vm) == []


@pytest.mark.parametrize("status", [404, 400])
def test_a_missing_secret_fails_at_once(vm, status):
    vm.knobs.secret_statuses = [status]
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert len([r for r in vm.google.server.requests if r.path.endswith("latest:access")]) == 1
    assert vm.reasons()[-1].startswith(f"Secret Manager refused {SECRET} with HTTP {status} (no such secret")


@pytest.mark.parametrize("token_status, says", [(NO_ANSWER, "no answer after 5 attempts"),
                                                (503, "HTTP 503 after 5 attempts")])
def test_an_unreachable_metadata_token_is_named_and_secret_manager_is_not_blamed(vm, token_status, says):
    vm.knobs.token_statuses = [token_status]
    digest = vm.serve(ServingConfig(), bucket="")
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    reason = vm.reasons()[-1]
    assert reason.startswith("could not get an access token from the metadata server (")
    assert says in reason and reason.endswith("Secret Manager was not asked")
    assert [r for r in vm.google.server.requests if r.path.endswith("latest:access")] == []


def test_a_metadata_server_that_refuses_the_token_fails_at_once(vm):
    vm.knobs.token_statuses = [404]  # e.g. a VM without a service account
    digest = vm.serve(ServingConfig(), bucket="")
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert vm.reasons()[-1].startswith("the metadata server refused an access token with HTTP 404")
    assert len([r for r in vm.google.server.requests if r.path.endswith("/default/token")]) == 1


def test_a_crashed_container_during_loading_fails_fast_with_its_last_log_lines(vm):
    (vm.state / "crash").write_text("")
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    reason = vm.reasons()[-1]
    assert reason.startswith("container vllm exited: ") and "model weights failed to load" in reason


@pytest.mark.parametrize("knobs, reason", [
    ({"answer": "empty"}, "completion: chat completion returned empty content and no reasoning"),
    ({"answer_status": 500}, "completion: chat completion answered HTTP 500: EngineCore encountered an issue. See "
                             "stack trace (above) for the root cause."),
    ({"listed_models": ["google/gemma-4-E4B-it"]},
     "models: /v1/models lists ['google/gemma-4-E4B-it'], not 'google/gemma-4-E2B-it'"),
], ids=["empty-answer", "answer-500", "model-not-listed"])
def test_a_server_that_answers_health_but_does_not_serve_the_model_fails_naming_why(vm, knobs, reason):
    for name, value in knobs.items():
        setattr(vm.knobs, name, value)
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert "serving" not in vm.stages()
    assert vm.reasons()[-1] == f"the server is up but not serving: {reason}"


def test_a_reasoning_only_answer_counts_as_serving(vm):
    """readycheck's documented rule: a reasoning parser may take every one of the first tokens, leaving content null
    and the text in `reasoning` (vLLM 0.32's field); the server answered."""
    vm.knobs.answer = "reasoning-only"
    serving_vm(vm, ServingConfig(reasoning_parser="gemma4"))
    chats = [r.json() for r in vm.google.server.requests if r.path == "/v1/chat/completions"
             and isinstance(r.json()["messages"][0]["content"], str)]
    assert [c["model"] for c in chats] == ["google/gemma-4-E2B-it"] * 2  # the check, and again after the refusals


def test_a_supervisor_restarted_while_the_model_loads_waits_for_it_before_serving(vm):
    """Adoption checks the container really serves: one that still loads goes through loading-model first."""
    digest = serving_vm(vm)
    writes = len(vm.guest())
    vm.knobs.health_ok = False  # the engine answers 503 for now
    vm.start_supervisor()  # a second supervisor process: what a supervisor restart by systemd leaves
    vm.wait_for(lambda: "keeping it" in vm.log() and "loading-model" in [state["stage"] for state in
                                                                        vm.guest()[writes:]], "adoption while loading")
    vm.knobs.health_ok = True
    # (the first supervisor's last writes may come first: it was still sending its state when it was replaced)
    vm.wait_for(lambda: collapse(state["stage"] for state in vm.guest()[writes:])[-2:] == ["loading-model", "serving"],
                "serving after loading")
    assert read_boot(vm.attributes(), digest).ready and len(vm.calls_of("docker", "run")) == 1


# --- the readiness check against the sandbox's vLLM, which follows the container shim -----------------------------

def run_container(state, argv_tail: list[str], running: bool = True) -> None:
    """What the docker shim records for a `docker run ... IMAGE vllm serve ARGV_TAIL`."""
    argv = ["run", "--detach", "--name", "vllm", "--label", "tpu-serve.config-hash=h1", "img", "vllm", "serve",
            *argv_tail]
    (state / "container.json").write_text(json.dumps({"labels": {"tpu-serve.config-hash": "h1"}, "running": running,
                                                      "argv": argv}))


E2B, E4B = "google/gemma-4-E2B-it", "google/gemma-4-E4B-it"


@pytest.mark.parametrize("container, knobs, model, verdict", [
    (None, {}, E2B, "health: no answer (RemoteDisconnected)"),
    ({"running": False}, {}, E2B, "health: no answer (RemoteDisconnected)"),
    ({}, {}, E2B, None),
    ({}, {}, E4B, f"models: /v1/models lists ['{E2B}'], not '{E4B}'"),
    ({}, {"listed_models": [E4B]}, E2B, f"models: /v1/models lists ['{E4B}'], not '{E2B}'"),
    ({}, {"listed_models": []}, E2B, f"models: /v1/models lists nothing, not '{E2B}'"),
    ({"tail": [E2B, "--served-model-name", "gemma"]}, {}, E2B, f"models: /v1/models lists ['gemma'], not '{E2B}'"),
    ({"tail": [E2B, "--served-model-name", "gemma"]}, {}, "gemma", None),
    ({"tail": [E4B]}, {"listed_models": [E2B]}, E2B,
     f"completion: chat completion answered HTTP 404: The model `{E2B}` does not exist."),
    ({}, {"answer": "reasoning-only"}, E2B, None),
    ({}, {"answer": "empty"}, E2B, "completion: chat completion returned empty content and no reasoning"),
    ({}, {"answer_status": 503}, E2B, "completion: chat completion answered HTTP 503: EngineCore encountered an "
                                      "issue. See stack trace (above) for the root cause."),
    ({}, {"health_ok": False}, E2B, "health: /health answered HTTP 503"),
], ids=["no-container", "stopped", "ready", "another-model-asked", "another-model-listed", "nothing-listed",
        "served-name", "served-name-asked", "chat-for-another-model", "reasoning-only", "empty", "answer-503",
        "health-503"])
def test_the_readiness_check_follows_the_container(tmp_path, container, knobs, model, verdict):
    google = FakeGoogle(tmp_path, Knobs(**knobs))
    if container is not None:
        run_container(tmp_path, container.get("tail", [E2B, "--port", "8000"]), container.get("running", True))
    with google.server:
        found = readycheck.check(google.server.url, model, timeout_s=5)
    assert found == ((True, f"ready: {model} answered at {google.server.url}") if verdict is None else (False, verdict))


def test_vision_warm_up_retries_the_first_422_once(vm):
    vm.knobs.image_statuses = [422, 200]
    serving_vm(vm, ServingConfig(mm_limits={"image": 4}))
    image_posts = [r for r in vm.google.server.requests if r.path.endswith("/chat/completions")
                   and isinstance(r.json()["messages"][0]["content"], list)
                   and r.json()["messages"][0]["content"][0]["type"] == "image_url"]
    assert len(image_posts) == 2
    assert image_posts[0].json()["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_vision_warm_up_failing_twice_fails(vm):
    vm.knobs.image_statuses = [422, 422]
    digest = vm.serve(ServingConfig(mm_limits={"image": 4}))
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert vm.reasons()[-1] == "the multimodal warm-up request failed twice"


def multimodal_posts(vm: Vm) -> list[list[str]]:
    """The part types of each chat request that carried more than text, in order."""
    return [[part["type"] for part in r.json()["messages"][0]["content"] if part["type"] != "text"]
            for r in vm.google.server.requests if r.path.endswith("/chat/completions")
            and isinstance(r.json()["messages"][0]["content"], list)]


def test_text_only_sends_no_warm_up_only_one_request_of_each_modality_it_must_refuse(vm):
    serving_vm(vm)
    assert multimodal_posts(vm) == [["input_audio"], ["image_url"], ["video_url"]]  # each answered 400
    assert re.search(r"disabled modalities: audio refused with HTTP 400 \(At most 0 audio\(s\) may be provided in "
                     r"one prompt.\); image refused with HTTP 400 .*; video refused .*; still serving", vm.log())


def test_a_vision_config_warms_up_with_an_image_and_checks_only_audio_and_video(vm):
    serving_vm(vm, ServingConfig(mm_limits={"image": 4}))
    assert multimodal_posts(vm) == [["image_url"], ["input_audio"], ["video_url"]]  # the warm-up, then refusals
    sent = json.loads(vm.google.attributes["tpu-serve-config"])["refusal_parts"]
    assert sorted(sent) == ["audio", "video"]
    assert sent["video"]["video_url"]["url"].startswith("data:video/jpeg;base64,")  # vLLM's frame-list video


@pytest.mark.parametrize("status, says", [
    (200, "a audio request, which this deployment cannot serve, answered HTTP 200 instead of a 4xx"),
    (500, "a audio request, which this deployment cannot serve, answered HTTP 500 (EngineCore encountered an issue "
          "(audio: NotImplementedError)) instead of a 4xx"),
], ids=["accepted", "engine-error"])
def test_a_modality_answered_other_than_4xx_by_an_engine_that_serves_on_is_a_warning_not_a_failed_boot(vm, status,
                                                                                                       says):
    """Real Gemma 4 on the pinned TPU image was only seen refusing images with a 400: a 2xx or 5xx for audio that
    leaves the engine serving must not fail the boot of a model that answers."""
    vm.knobs.refusal_answers, vm.knobs.refusal_kills = {"audio": status}, False
    digest = serving_vm(vm)
    warning = f"{says}; the server still serves"
    assert vm.attributes()["warning"] == warning and vm.container()["running"]
    with FakeCompute(vm) as compute, requests.Session() as http:  # the gate: ready, and it says so
        verdict = watch_instance(ComputeClient(http, compute.url), Instance("p-1", "europe-west4-a", "tpu-serve-vm"),
                                 timeout_s=30, interval_s=0.05, expected_config_hash=digest)
    assert verdict.ready and verdict.warnings == [warning]
    assert json.loads(verdict.json_line())["warnings"] == [warning]
    view = vm_view(Instance("p-1", "europe-west4-a", "tpu-serve-vm"), {"status": "RUNNING"}, vm.attributes(),
                   datetime.now(timezone.utc), 1.35, digest)
    assert view.warning == warning
    assert f"warning {warning}" in " ".join(render_text(Report(vm=view)).split())
    # a new config starts without the old one's warning
    vm.knobs.refusal_answers = {}
    second = vm.serve(ServingConfig(max_model_len=8192))
    vm.wait_for_stage("serving", second)
    assert "warning" not in vm.attributes()


def test_an_engine_that_dies_after_a_disabled_modality_request_fails_the_boot(vm):
    vm.knobs.refusal_answers = {"audio": 500}  # and the engine dies of it (refusal_kills, the default)
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert vm.reasons()[-1] == (
        "disabled-modality check: a audio request, which this deployment cannot serve, answered HTTP 500 (EngineCore "
        "encountered an issue (audio: NotImplementedError)) instead of a 4xx, and then the server no longer served "
        "(health: no answer (RemoteDisconnected)): one such request can take the engine down")
    assert "serving" not in vm.stages() and not vm.container()["running"]


def test_weights_count_as_cached_only_when_a_snapshot_holds_a_file(tmp_path):
    snapshots = tmp_path / "hub/models--google--gemma-4-E2B-it/snapshots"
    assert not supervisor.weights_cached(tmp_path, "google/gemma-4-E2B-it")
    (snapshots / "0f1e").mkdir(parents=True)  # a download that was interrupted before its first file
    assert not supervisor.weights_cached(tmp_path, "google/gemma-4-E2B-it")
    (snapshots / "0f1e" / "config.json").write_text("{}")
    assert supervisor.weights_cached(tmp_path, "google/gemma-4-E2B-it")
    assert not supervisor.weights_cached(tmp_path, "google/gemma-4-E4B-it")


def test_the_bucket_is_the_stacks(vm):
    assert json.loads(vm.google.attributes.get("tpu-serve-config", "{}") or "{}") == {}
    vm.serve(ServingConfig())
    assert json.loads(vm.google.attributes["tpu-serve-config"])["compile_cache_bucket"] == BUCKET


# --- the guest-attribute budget (vm/guest_state.py, tpuserve/guest_state.py) -------------------------------------

def test_a_boot_in_real_time_stays_within_googles_guest_attribute_budget(vms):
    """The real intervals (no sandbox time scale): the startup script and the supervisor, from the first stage to
    `serving`, send one state attribute at most every 12 s; Google allows 10 a minute and 3 a second. The whole
    sandbox boot fits in one interval, so its second write is the one that says `serving`, 12 s in."""
    vm = vms(knobs=Knobs(guest_scale=1), disk={"fs": "ext4"})
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()
    vm.wait_for_stage("serving", digest, timeout_s=30)
    writes = vm.google.guest
    assert {write.key for write in writes} == {"state"}  # one key: nothing else is written
    assert all(write.applied for write in writes)  # nothing went over the budget (the fake drops what does)
    assert vm.writes_within(60) <= 60 / facts.GUEST_WRITE_INTERVAL_S <= facts.GUEST_ATTRIBUTE_QUERIES_PER_MINUTE
    assert vm.writes_within(1) == 1 < facts.GUEST_ATTRIBUTE_BURST_PER_SECOND
    gaps = [b.at - a.at for a, b in zip(writes, writes[1:])]
    assert gaps and min(gaps) >= facts.GUEST_WRITE_INTERVAL_S - 0.25, gaps  # as received: request latency varies
    assert list(boot_timeline(vm.attributes())) == [*facts.BOOT_STAGES]  # coalesced, and every stage is there


def test_writes_over_googles_budget_would_be_lost_and_the_sandbox_drops_them(tmp_path):
    """The fake enforces the documented limits (so a writer that went over would lose state in these tests)."""
    google = FakeGoogle(tmp_path, Knobs(guest_scale=1))
    with google.server:
        for n in range(5):
            google.put_guest("state", json.dumps({"seq": n}))
    assert [write.applied for write in google.guest] == [True, True, True, False, False]  # the 4th within 1 s


class FakeCompute(FakeServer):
    """The Compute API's getGuestAttributes (compute#guestAttributes: queryValue.items of namespace/key/value) and
    instances.get, serving what the sandbox VM's applied writes left."""

    def __init__(self, vm: Vm):
        path = "/compute/v1/projects/p-1/zones/europe-west4-a/instances/tpu-serve-vm"
        super().__init__({("GET", f"{path}/getGuestAttributes"): self.attributes,
                          ("GET", path): lambda request: Response(200, {"status": "RUNNING"})})
        self.vm = vm

    def attributes(self, request: Request) -> Response:
        applied = [write for write in self.vm.google.guest if write.applied]
        if not applied:
            return Response(404, {"error": {"code": 404, "message": "The resource was not found"}})
        return Response(200, {"kind": "compute#guestAttributes", "queryPath": "tpu-serve/", "queryValue": {"items": [
            {"namespace": "tpu-serve", "key": applied[-1].key, "value": applied[-1].value}]}})


def test_a_lost_serving_write_is_reasserted_and_the_gate_sees_it_within_a_minute(vm):
    """Compute Engine may drop a write (above the budget, or by chance); the supervisor writes its state again every
    re-assertion interval, so the gate, polling the Compute API, ends its wait without waiting out its timeout.
    Every `serving` state is dropped the first time it is sent (the post-serving hooks' changes too), so only a
    re-assertion, the same state sent again, gets through."""
    lost: list[GuestWrite] = []

    def drop_each_serving_state_once(write: GuestWrite) -> bool:
        if write.state().get("stage") != "serving" or str(write.state()["seq"]) in {
                str(w.state()["seq"]) for w in lost}:
            return False
        lost.append(write)
        return True

    vm.knobs.drop_guest_write = drop_each_serving_state_once
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    reassert_s = facts.GUEST_REASSERT_S * vm.knobs.guest_scale
    with FakeCompute(vm) as compute, requests.Session() as http:
        started = time.monotonic()
        verdict = watch_instance(ComputeClient(http, compute.url),
                                 Instance("p-1", "europe-west4-a", "tpu-serve-vm"), timeout_s=30, interval_s=0.05,
                                 expected_config_hash=digest)
    assert verdict.ready, verdict.reason
    assert lost and time.monotonic() - started < 10 * reassert_s  # not the gate's 30 s timeout
    again = [w for w in vm.google.guest if w.applied and w.state().get("stage") == "serving"][0]
    first = [w for w in lost if str(w.state()["seq"]) == str(again.state()["seq"])][0]
    assert again.state() | {"written": ""} == first.state() | {"written": ""}  # the dropped state, sent again
    assert again.at - first.at <= reassert_s + facts.GUEST_WRITE_INTERVAL_S * vm.knobs.guest_scale + 0.5


def test_the_state_store_coalesces_changes_and_reasserts(tmp_path):
    google = FakeGoogle(tmp_path, Knobs(guest_scale=1))
    with google.server:
        store = guest_state.Store(tmp_path / "run")
        now = [1000.0]
        store.update({"stage": "preparing-disk", "at-preparing-disk": "1000"})
        assert store.publish(google.server.url, 12, clock=lambda: now[0]) == "written"
        store.update({"stage": "installing-docker"})
        store.update({"cache": "disk: warm"})
        assert store.publish(google.server.url, 12, clock=lambda: now[0] + 3) == "wait:9.000"
        now[0] += 12
        assert store.publish(google.server.url, 12, clock=lambda: now[0]) == "written"
        assert store.publish(google.server.url, 12, clock=lambda: now[0] + 20) == "unchanged"
        assert store.publish(google.server.url, 12, clock=lambda: now[0] + 20, force=True) == "written"
        store.update({"stage": "pulling-image", "at-pulling-image": "1030"}, new_timeline=True)
    states = [write.state() for write in google.guest]
    assert [s["stage"] for s in states] == ["preparing-disk", "installing-docker", "installing-docker"]
    assert states[1]["cache"] == "disk: warm" and states[1]["seq"] == "3"  # two changes, one write
    assert store.state() == {"stage": "pulling-image", "at-pulling-image": "1030", "cache": "disk: warm", "seq": 4}


def test_a_failed_state_write_spends_the_budget_and_is_retried(tmp_path):
    store = guest_state.Store(tmp_path / "run")
    store.update({"stage": "serving"})
    assert store.publish("http://127.0.0.1:9", 12, clock=lambda: 1000.0) == "failed"  # nothing listens
    assert store.publish("http://127.0.0.1:9", 12, clock=lambda: 1005.0) == "wait:7.000"
    assert store.stamp() == {"at": 1000.0, "seq": -1}  # the next allowed write sends it again


def test_readers_get_the_states_fields_as_keys_and_flat_keys_still_count():
    state = json.dumps({"stage": "serving", "config-hash": "h2", "at-serving": "20", "seq": 9})
    assert expand({"state": state}) == {"stage": "serving", "config-hash": "h2", "at-serving": "20", "seq": "9"}
    # An older supervisor wrote flat keys. The state wins over them.
    assert expand({"stage": "loading-model", "config-hash": "h1", "reason": "x", "state": state})["stage"] == "serving"
    assert expand({"stage": "booting", "state": '{"stage": "serv'}) == {"stage": "booting"}  # half-written: ignored


# --- between containers: the TPU's release, a busy device, a docker call that does not answer -----------------------

def test_a_config_change_waits_until_the_old_container_is_gone_and_the_tpu_free_before_the_next_run(vm):
    serving_vm(vm)
    (vm.state / "rm_lingers").write_text("3")  # `docker rm -f` returns; inspect still shows it three more times
    (vm.state / "vfio_held_s").write_text("0.6")  # then its engine process holds /dev/vfio/0 for 0.6 s
    second = vm.serve(ServingConfig(max_model_len=8192))
    vm.wait_for_stage("serving", second)
    rm, run = vm.calls_of("docker", "rm")[-1], vm.calls_of("docker", "run")[-1]
    looks = [c for c in vm.calls() if c["cmd"] == "docker" and c["argv"][0] == "inspect" and rm["at"] <= c["at"] <=
             run["at"]]
    assert len(looks) >= 4  # three that still saw it, one that did not
    assert run["at"] >= json.loads((vm.state / "vfio_released_at").read_text())  # only once the TPU was free
    assert len(vm.calls_of("docker", "run")) == 2  # the first run of the new config worked: nothing to retry


def test_a_busy_tpu_at_start_is_retried_once_it_is_free_not_failed(vm):
    """tpu-inference #926: the new container exits with "open(/dev/vfio/0): Device or resource busy"."""
    (vm.state / "vfio_busy_runs").write_text("1")
    digest = serving_vm(vm)
    assert len(vm.calls_of("docker", "run")) == 2
    assert re.search(r"reason: the TPU was still held by the previous container \(tpu-inference #926\); starting "
                     r"again once it is free \(attempt 2/3\)", vm.log())
    assert read_boot(vm.attributes(), digest).ready


def test_a_tpu_that_stays_busy_fails_after_three_starts_with_the_devices_words(vm):
    (vm.state / "vfio_busy_runs").write_text("99")
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert len(vm.calls_of("docker", "run")) == supervisor.VFIO_BUSY_ATTEMPTS == 3
    assert "open(/dev/vfio/0): Device or resource busy" in vm.attributes()["reason"]


def test_a_docker_call_that_times_out_does_not_kill_the_supervisor(vm):
    """docker inspect hangs (a daemon busy extracting a 20 GB image): subprocess.TimeoutExpired used to escape and
    systemd restarted the supervisor without its restart count. Now the call answers like a failed command and the
    supervisor looks again at its next check."""
    vm.extra_supervisor_args = ("--docker-timeout-scale", "0.01")  # inspect's 30 s -> 0.3 s
    digest = serving_vm(vm)
    vm.kill_container()
    vm.wait_for(lambda: vm.attributes().get("restarts") == "1" and vm.attributes()["stage"] == "serving",
                "the first restart")
    pid = vm.machine.unit.pid
    (vm.state / "hangs.json").write_text(json.dumps({"docker inspect": [1.0, 1.0, 1.0]}))
    vm.wait_for(lambda: vm.log().count("did not finish within 0.3 s") >= 3, "three timed-out inspects")
    vm.kill_container()  # it still watches, and still counts: this is restart 2, not a fresh 1
    vm.wait_for(lambda: vm.attributes().get("restarts") == "2" and vm.attributes()["stage"] == "serving",
                "the second restart")
    assert vm.machine.unit.pid == pid and vm.machine.unit.poll() is None
    assert "Traceback" not in vm.log() and read_boot(vm.attributes(), digest).ready


def test_docker_turns_a_timeout_into_a_failed_command(monkeypatch):
    def hangs(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(supervisor.subprocess, "run", hangs)
    done = supervisor.docker("pull", "--quiet", "vllm/vllm-tpu:nightly", timeout_s=3600)
    assert (done.returncode, done.stdout) == (supervisor.TIMED_OUT, "")
    assert done.stderr == "docker pull --quiet: timed out after 3600 s"
    with pytest.raises(supervisor.DockerUnavailable):
        supervisor.inspect_container("vllm")


def test_vfio_holders_are_read_from_proc(tmp_path):
    for pid, fd, target in [("100", "3", "/dev/vfio/0"), ("100", "4", "/dev/null"), ("200", "5", "/dev/vfio/vfio")]:
        (tmp_path / pid / "fd").mkdir(parents=True, exist_ok=True)
        (tmp_path / pid / "fd" / fd).symlink_to(target)
    (tmp_path / "self").mkdir()  # not a pid
    assert supervisor.vfio_holders(tmp_path) == ["100: /dev/vfio/0"]  # the shared container file is not a hold


# --- the compile cache hits: the KV block count pinned from the first boot ----------------------------------------

def test_a_second_boot_of_one_config_pins_the_first_boots_block_count_and_compiles_nothing(vms):
    """The first boot allocates 8,713 KV blocks (the allocator's count) and stores it beside the compile cache; the
    next boot's HBM would leave a block less (8,712: a count one block different misses every model program), but
    it runs with --num-gpu-blocks-override 8713 and finds every program cached."""
    vm = vms(disk={"fs": "ext4"})
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0, vm.log()
    vm.wait_for_stage("serving", digest)
    first = vm.attributes()["compile-cache"]
    assert first.startswith("cold (nothing cached yet") and first.endswith("KV blocks pinned at 8,713 from now on)")
    assert "--num-gpu-blocks-override" not in vm.calls_of("docker", "run")[0]["argv"]
    (vm.state / "hbm_blocks.json").write_text("[8712]")
    assert vm.reboot() == 0, vm.log()
    vm.wait_for(lambda: len(vm.calls_of("docker", "run")) == 2 and vm.attributes().get("stage") == "serving"
                and vm.attributes().get("compile-cache", "").startswith("warm"), "the second boot, warm")
    assert vm.attributes()["compile-cache"] == "warm (4 hits; 4 entries before, 4 after; KV blocks pinned at 8,713)"
    assert vm.calls_of("docker", "run")[1]["argv"][-2:] == ["--num-gpu-blocks-override", "8713"]
    assert vm.container()["blocks"] == 8713


def test_without_the_pin_the_moved_block_count_misses_every_model_program(vms):
    """The control: the same reboot with the stored count removed compiles the model's programs again."""
    vm = vms(disk={"fs": "ext4"})
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0
    vm.wait_for_stage("serving", digest)
    vm.wait_for(lambda: f"xla/{XLA_KEY}/tpu-serve-kv-blocks-{digest}.json" in vm.google.objects, "the push")
    (vm.cache_root / "xla" / XLA_KEY / f"tpu-serve-kv-blocks-{digest}.json").unlink()
    del vm.google.objects[f"xla/{XLA_KEY}/tpu-serve-kv-blocks-{digest}.json"]  # the bucket's copy too
    (vm.state / "hbm_blocks.json").write_text("[8712]")
    assert vm.reboot() == 0
    vm.wait_for(lambda: len(vm.calls_of("docker", "run")) == 2 and vm.attributes().get("stage") == "serving"
                and "8,712" in vm.attributes().get("compile-cache", ""), "the second boot")
    assert vm.attributes()["compile-cache"].startswith("cold (3 programs compiled: the KV block count was not pinned")


def test_a_new_disk_restores_the_pinned_count_with_the_cache_from_the_bucket(vms):
    first = vms(disk={"fs": "ext4"})
    digest = serving_vm(first)
    pin = f"xla/{XLA_KEY}/tpu-serve-kv-blocks-{digest}.json"
    first.wait_for(lambda: pin in first.google.objects and len(first.google.objects) == 5, "the push")
    second = vms(disk={"fs": ""})  # another VM, a blank disk, the same bucket
    second.google.objects = dict(first.google.objects)
    (second.state / "hbm_blocks.json").write_text("[8714]")
    serving_vm(second)
    assert second.attributes()["compile-cache"] == ("warm (4 hits; 4 entries before (5 from the bucket), 4 after; "
                                                    "KV blocks pinned at 8,713)")


def test_a_pinned_count_that_no_longer_fits_is_dropped_and_learned_again(vms):
    vm = vms(disk={"fs": "ext4"})
    xla = vm.cache_root / "xla" / XLA_KEY
    xla.mkdir(parents=True)
    digest = vm.serve(ServingConfig())
    (xla / f"tpu-serve-kv-blocks-{digest}.json").write_text(json.dumps({"blocks": 9000}))
    (vm.state / "hbm_capacity_blocks").write_text("8800")
    vm.start_supervisor()
    vm.wait_for_stage("serving", digest)
    first, second = vm.calls_of("docker", "run")
    assert first["argv"][-2:] == ["--num-gpu-blocks-override", "9000"]
    assert "--num-gpu-blocks-override" not in second["argv"]
    assert re.search(r"reason: the pinned 9000 KV blocks did not fit; starting once more without the pin", vm.log())
    assert compile_cache.read_pin(xla, digest) == 8713


def test_a_user_set_block_count_is_left_alone(vm):
    digest = serving_vm(vm, ServingConfig(extra_args=("--num-gpu-blocks-override", "4096")))
    [run] = vm.calls_of("docker", "run")
    assert run["argv"].count("--num-gpu-blocks-override") == 1 and vm.container()["blocks"] == 4096
    assert compile_cache.read_pin(vm.cache_root / "xla" / XLA_KEY, digest) is None


@pytest.mark.parametrize("before, after, pinned, learned, error, expected", [
    (0, 4, None, 8713, "", "cold (nothing cached yet for this image and machine type; 0 entries before, 4 after; KV "
                           "blocks pinned at 8,713 from now on)"),
    (0, 4, None, 8713, "HTTP 403", "cold (nothing cached, the bucket could not be read: HTTP 403; 0 entries before, "
                                   "4 after; KV blocks pinned at 8,713 from now on)"),
    (312, 312, 8713, None, "", "warm (312 hits; 312 entries before, 312 after; KV blocks pinned at 8,713)"),
    (312, 318, 8713, None, "", "warm (312 hits; 312 entries before, 318 after; KV blocks pinned at 8,713)"),  # 2 %
    (312, 319, 8713, None, "", "cold (7 programs compiled though 312 were cached: this config's programs were not "
                               "among them; 312 entries before, 319 after; KV blocks pinned at 8,713)"),
    (4, 5, 8713, None, "", "warm (4 hits; 4 entries before, 5 after; KV blocks pinned at 8,713)"),  # one at least
], ids=["first", "bucket-unreadable", "warm", "warm-2pc", "cold-past-2pc", "one-new"])
def test_the_compile_cache_verdict(before, after, pinned, learned, error, expected):
    assert compile_cache.verdict(before, after, pinned, learned, error) == expected


def test_the_gate_and_status_say_warm_or_cold(vms):
    vm = vms(disk={"fs": "ext4"})
    digest = vm.serve(ServingConfig())
    vm.start_supervisor()
    with FakeCompute(vm) as compute, requests.Session() as http:
        verdict = watch_instance(ComputeClient(http, compute.url), Instance("p-1", "europe-west4-a", "tpu-serve-vm"),
                                 timeout_s=30, interval_s=0.05, expected_config_hash=digest)
    assert verdict.ready and verdict.sources["compile-cache"].startswith("cold (nothing cached yet")
    view = vm_view(Instance("p-1", "europe-west4-a", "tpu-serve-vm"), {"status": "RUNNING"}, vm.attributes(),
                   datetime.now(timezone.utc), 1.35, digest)
    assert view.compile_cache == vm.attributes()["compile-cache"]
    assert re.search(r"compile cache +cold \(nothing cached yet", render_text(Report(vm=view)))


def render_text(report: Report) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    console.print(render(report))
    return console.file.getvalue()


# --- the image: free space before a pull, pruning after serving ----------------------------------------------------

OLD_IMAGE = "vllm/vllm-tpu@sha256:" + "0d" * 32


def test_a_pull_that_cannot_fit_fails_with_the_numbers_before_pulling(vms):
    vm = vms(disk={"fs": "ext4", "avail_gb": 30})
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0
    vm.wait_for_stage("failed", digest)
    assert vm.attributes()["reason"] == (
        f"not enough space to pull {ServingConfig().image}: 30 GB free under /var/lib/tpu-serve/cache (Docker's data "
        "root), 40 GB needed; grow cacheDiskSizeGb (the filesystem grows online) or start the disk afresh with "
        "`tpuserve cache rm`")
    assert vm.calls_of("docker", "pull") == []  # no ENOSPC halfway through 20 GB
    assert vm.calls_of("docker", "image")[-1]["argv"] == ["image", "prune", "--all", "--force"]  # tried first


def test_unused_images_are_pruned_to_make_room_for_a_pull(vms):
    vm = vms(disk={"fs": "ext4", "avail_gb": 30})
    (vm.state / "images.json").write_text(json.dumps({OLD_IMAGE: OLD_IMAGE.partition("@")[2]}))
    digest = vm.serve(ServingConfig())
    assert vm.boot() == 0
    vm.wait_for_stage("serving", digest)
    calls = [c["argv"][:2] for c in vm.calls() if c["cmd"] == "docker"]
    assert calls.index(["image", "prune"]) < calls.index(["pull", "--quiet"])
    assert json.loads((vm.state / "pruned_images.json").read_text()) == [OLD_IMAGE]


def test_after_serving_the_images_and_compile_caches_no_config_uses_are_pruned(vm):
    """A served-config change to another image: once it serves, the old image (no container uses it now) and the old
    image's compile cache directory go; the bucket keeps its copy, restored should that image come back."""
    first = serving_vm(vm, ServingConfig(image=OLD_IMAGE))
    old_key = compile_cache.xla_cache_key(OLD_IMAGE, "ct6e-standard-1t")
    assert (vm.cache_root / "xla" / old_key).is_dir()
    vm.wait_for(lambda: any(name.startswith(f"xla/{old_key}/") for name in vm.google.objects), "the first push")
    second = vm.serve(ServingConfig())
    vm.wait_for_stage("serving", second)
    vm.wait_for(lambda: vm.attributes().get("pruned", "").startswith("unused images (25GB)"), "the prune")
    assert vm.attributes()["pruned"] == "unused images (25GB), 1 compile-cache directory"
    assert json.loads((vm.state / "pruned_images.json").read_text()) == [OLD_IMAGE]
    assert sorted(p.name for p in (vm.cache_root / "xla").iterdir()) == [XLA_KEY]
    assert any(name.startswith(f"xla/{old_key}/") for name in vm.google.objects)  # the bucket is never pruned
    assert read_boot(vm.attributes(), second).ready and first != second


# --- more than one engine: four on a ct6e-standard-4t, behind the front ----------------------------------------------

FOUR_ENGINES = ServingConfig(chips=4, tensor_parallel_size=1)


def engine_runs(vm: Vm) -> dict[str, list[str]]:
    """Each container's last `docker run` argv, by name."""
    return {run["argv"][run["argv"].index("--name") + 1]: run["argv"] for run in vm.calls_of("docker", "run")}


def env_of(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "-e" and "=" in argv[i + 1])


def test_four_engines_each_on_its_chip_serve_behind_the_front_installed_from_debian(vm):
    digest = serving_vm(vm, FOUR_ENGINES)
    runs = engine_runs(vm)
    assert sorted(runs) == list(FOUR)
    for index, name in enumerate(FOUR):
        argv = runs[name]
        assert argv == [a.replace("{xla_cache_key}", f"{IMAGE_DIGEST.partition(':')[2][:16]}-ct6e-standard-4t")
                        for a in tpu_container_run_args(FOUR_ENGINES, digest, engine=index)]
        # tpu-inference's per-rank pinning (tpu_worker.py _setup_dp_chip_isolation), one chip each
        assert {k: v for k, v in env_of(argv).items() if k.startswith(("TPU_", "CLOUD_TPU"))} == {
            "TPU_VISIBLE_CHIPS": str(index), "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_PORT": str(5000 + index), "TPU_PROCESS_ADDRESSES": f"localhost:{5000 + index}",
            "CLOUD_TPU_TASK_ID": "0"}
        assert argv[argv.index("--port") + 1] == str(8100 + index) and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert vm.container(name)["running"]
    # engine 0 first, alone: the others start once it serves, with its compile cache written
    first_run = vm.calls_of("docker", "run")[0]
    assert first_run["argv"][first_run["argv"].index("--name") + 1] == "vllm-0"
    answered = next(r for r in vm.engine("vllm-0").server.requests if r.path == "/v1/chat/completions")
    assert all(run["at"] > answered.at for run in vm.calls_of("docker", "run")[1:])
    # the front: Debian's haproxy installed, its config the served one, the unit restarted; it serves
    assert [c["argv"][-1] for c in vm.calls_of("apt-get", "install")][0] == "haproxy"  # (then the Ops Agent's)
    served_front = json.loads(vm.google.attributes["tpu-serve-config"])["front"]
    assert (vm.root / "etc/haproxy/haproxy.cfg").read_text() == served_front == (vm.state / "front_active").read_text()
    assert [c["argv"] for c in vm.calls_of("systemctl") if "haproxy" in c["argv"]] == [["restart", "haproxy"]]
    assert readycheck.check(vm.url, "google/gemma-4-E2B-it")[0]
    assert vm.attributes()["engines"] == "4 of 4 serving" and read_boot(vm.attributes(), digest).ready
    assert token_contained(vm) == []


def test_one_engine_that_exits_is_restarted_without_stopping_the_others(vm):
    digest = serving_vm(vm, FOUR_ENGINES)
    before = len(vm.calls())
    vm.kill_container("vllm-2")
    vm.wait_for(lambda: vm.attributes().get("restarts") == "1" and vm.attributes()["stage"] == "serving",
                "serving again")
    docker = [c["argv"] for c in vm.calls()[before:] if c["cmd"] == "docker" and c["argv"][0] != "inspect"]
    assert [argv for argv in docker if argv[0] in ("start", "run", "rm", "stop")] == [["start", "vllm-2"]]
    assert all(vm.container(name)["running"] for name in FOUR)
    assert [r for r in vm.calls_of("docker") if r["argv"][0] == "run"] == vm.calls_of("docker", "run")[:4]
    # the journal has each change; the state (coalesced within the write budget) ends with the last one
    crash = re.search(r"reason: (engine vllm-2 exited .*)", vm.log()).group(1)
    assert crash.startswith("engine vllm-2 exited (code 137) after serving; restart 1/5 in 0.05 s. Last log lines: ")
    assert "engines: 3 of 4 serving; vllm-2 restarting" in vm.log()
    assert vm.attributes()["reason"] == "restarted after the engine vllm-2 exited (restart 1)"
    assert vm.attributes()["engines"] == "4 of 4 serving" and read_boot(vm.attributes(), digest).ready
    # the other engines hold their chips all along: that is not waited out as the TPU still being held
    assert "the TPU is still held" not in vm.log()
    assert not [c for c in vm.calls()[before:] if "haproxy" in c["argv"]]  # the front was left alone


def test_serving_is_reported_only_once_every_engine_serves_and_an_engine_that_never_does_is_named(vm):
    vm.knobs.unhealthy = {"vllm-3"}
    digest = vm.serve(FOUR_ENGINES)
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert "serving" not in vm.stages()
    assert vm.reasons()[-1] == "vLLM vllm-3 did not report healthy within 5s"
    assert "engines: 3 of 4 serving" in vm.log()


def test_an_engine_that_exits_while_loading_fails_the_boot_naming_it(vm):
    (vm.state / "crash_names").write_text(json.dumps(["vllm-1"]))
    digest = vm.serve(FOUR_ENGINES)
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert vm.reasons()[-1].startswith("container vllm-1 exited: ")


def test_from_four_engines_to_one_the_front_stops_and_the_lone_engine_takes_the_port(vm):
    serving_vm(vm, FOUR_ENGINES)
    one = vm.serve(ServingConfig())
    vm.wait_for_stage("serving", one)
    assert sorted(c["argv"][-1] for c in vm.calls_of("docker", "rm")[-5:]) == sorted([*FOUR, "vllm"])
    assert [c["argv"] for c in vm.calls_of("systemctl") if "haproxy" in c["argv"]][-1] == ["stop", "haproxy"]
    assert not (vm.state / "front_active").exists()
    assert [path.name for path in vm.machine.containers()] == ["container.json"]
    run = vm.calls_of("docker", "run")[-1]["argv"]
    assert run[run.index("--name") + 1] == "vllm" and run[run.index("--port") + 1] == "8000"
    assert "engines" not in vm.attributes()


def test_a_restarted_supervisor_keeps_four_serving_engines_and_their_front(vm):
    digest = serving_vm(vm, FOUR_ENGINES)
    runs = len(vm.calls_of("docker", "run"))
    front = len([c for c in vm.calls_of("systemctl") if "haproxy" in c["argv"]])
    writes = len(vm.guest())
    vm.start_supervisor()
    vm.wait_for(lambda: "keeping it" in vm.log() and any(state["stage"] == "serving" and "at-serving" in state
                                                         for state in vm.guest()[writes:]), "adoption")
    assert len(vm.calls_of("docker", "run")) == runs
    assert len([c for c in vm.calls_of("systemctl") if "haproxy" in c["argv"]]) == front
    assert read_boot(vm.attributes(), digest).ready


def test_a_new_front_config_of_the_same_served_config_is_reloaded_in_place(vm):
    """A tpu-serve release may change HAProxy's settings without the served hash (image and argv): the front is
    reloaded with them, and no engine restarts."""
    digest = serving_vm(vm, FOUR_ENGINES)
    runs = len(vm.calls_of("docker", "run"))
    served = json.loads(vm.google.attributes["tpu-serve-config"])
    served["front"] += "# a later release's settings\n"
    vm.google.set_attributes(**{"tpu-serve-config": json.dumps(served)})
    vm.wait_for(lambda: (vm.state / "front_active").read_text() == served["front"], "the front reloaded")
    assert [c["argv"] for c in vm.calls_of("systemctl") if "haproxy" in c["argv"]][-1] == ["reload", "haproxy"]
    assert (vm.root / "etc/haproxy/haproxy.cfg").read_text() == served["front"]
    assert len(vm.calls_of("docker", "run")) == runs and read_boot(vm.attributes(), digest).ready


def test_a_front_that_cannot_be_installed_fails_the_boot_naming_it(vm):
    (vm.state / "haproxy_install_failures").write_text("99")
    digest = vm.serve(FOUR_ENGINES)
    vm.start_supervisor()
    vm.wait_for_stage("failed", digest)
    assert vm.reasons()[-1].startswith("could not install haproxy, the front of 4 engines, after 5 attempts: E: "
                                       "Unable to locate package haproxy")
    assert not vm.calls_of("docker", "run")


def test_vfio_holders_of_engines_serving_on_other_chips_do_not_count(tmp_path):
    for pid, device, cgroup in [("100", "/dev/vfio/0", "0::/system.slice/docker-aaaa.scope\n"),
                                ("200", "/dev/vfio/1", "0::/system.slice/docker-bbbb.scope\n"),
                                ("300", "/dev/vfio/2", None)]:  # a process of no container: counts
        (tmp_path / pid / "fd").mkdir(parents=True)
        (tmp_path / pid / "fd" / "3").symlink_to(device)
        if cgroup:
            (tmp_path / pid / "cgroup").write_text(cgroup)
    assert sorted(supervisor.vfio_holders(tmp_path, besides=("aaaa",))) == ["200: /dev/vfio/1", "300: /dev/vfio/2"]
    assert len(supervisor.vfio_holders(tmp_path)) == 3
