"""`tpuserve logs` / `diagnose`: a fake Compute API and a fake diagnosing model (tests/httpfake.FakeServer,
tests/fakes/fake_openai.py), a PATH-shim `gcloud` that records its argv, and the redaction function."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import click
import pytest
import requests
from click.testing import CliRunner

from tests.fakes.fake_openai import FAKE_MODEL, FakeOpenAI
from tests.fakes.httpfake import FakeServer, Request, Response
from tests.fakes.leaks import leaked
from tpuserve.cli import main
from tpuserve.gce import Instance, MissingCredentials
from tpuserve.observe.logs import (REDACTED, diagnosis_messages, docker_logs_argv, instance_options, last_lines_within,
                                   redact, relevant_excerpt)

INSTANCE_PATH = "/compute/v1/projects/proj-1/zones/us-east5-b/instances/tpu-serve-dev"
VM = ["--instance", "tpu-serve-dev", "--zone", "us-east5-b", "--project", "proj-1"]
HF_CANARY = "hf_CanaryTokenAbCdEf0123456789xyz"
OAUTH_CANARY = "ya29.a0AfB_byCanaryAccessToken-0123456789"
KEY_CANARY = "Zq7Kx2Lm9Pw4Rt6Yv8Bn3Cd5Fg1Hj0QsTuVwXy"  # 40 mixed-case alphanumerics, like an API key
SERIAL = "\n".join([f"boot line {i}" for i in range(300)]
                   + ["tpu-serve: stage pulling-image", "docker: Error response from daemon: manifest unknown"])


# Canaries that only their own pattern recognises (one case, or no digit, or runs shorter than 32 characters, so
# the catch-all for long mixed-case strings does not), each with the pattern it stands for.
DEDICATED_CANARIES = {
    "hugging face token": "hf_abcdefghij0123456789klmnopqr",
    "oauth access token": "ya29.a0afb_lowercase.access-token_0123456789",
    "oauth refresh token": "1//0gabcdefghijklmnopqrstuvwxyz-0123",
    "google api key": "AIzaSyabcdefghijklmnopqrstuvwxyz_abcd",
    "openai-style key": "sk-proj-abcdefghijklmnop1234",
    "publishable key": "pk-live_abcdefghijklmnop1234",
    "restricted key": "rk-abcdefghijklmnopqrst",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "long mixed-case key": KEY_CANARY,
    "hf token at the length floor": "hf_abcdefghij",
}
# A PKCS#8 key as `openssl genpkey` prints it, shortened; '+' and '/' keep every run under the catch-all's 32.
PEM_BODY = ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC/BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj+MsYY2n6hpVzyiL2Fy2GmXtf3Jq1zr\n"
            "Kp7Hh2vQ9sLdE1fGm/ZtYx4wQn6Rb8Uc+JpA3kVe0NqTo5Ws7Lz/Ia9Xb2Cd4Ef6Gh8Ij0Kl1Mn3Op5Qr7St9Uv")


@pytest.mark.parametrize("secret", list(DEDICATED_CANARIES.values()), ids=list(DEDICATED_CANARIES))
def test_each_token_format_is_replaced_whole(secret: str) -> None:
    redacted = redact(f"line with {secret} inside")
    assert redacted == f"line with {REDACTED} inside"
    assert leaked(secret, redacted) == []


@pytest.mark.parametrize("kind", ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"])
def test_a_pem_private_key_is_replaced_whole_across_its_lines(kind: str) -> None:
    log = f"writing key\n-----BEGIN {kind}-----\n{PEM_BODY}\n-----END {kind}-----\nkey written"
    redacted = redact(log)
    assert redacted == f"writing key\n{REDACTED}\nkey written"
    assert not any(leaked(line, redacted) for line in PEM_BODY.splitlines())


@pytest.mark.parametrize("line, expected", [
    ("sent Bearer abc.def-ghi_jkl upstream", f"sent Bearer {REDACTED} upstream"),
    ("curl --header basic dXNlcjpwYXNzd29yZA== x", f"curl --header basic {REDACTED} x"),
    ("Bearer abcdefgh", f"Bearer {REDACTED}"),  # the 8-character floor is a credential
    ("Authorization: Bearer abc.def-ghi_jkl", f"Authorization: {REDACTED} {REDACTED}"),
    ("HF_TOKEN=abcdef123 vllm serve", f"HF_TOKEN={REDACTED} vllm serve"),
    ('{"api_key": "plainvalue"}', f'{{"api_key": "{REDACTED}"}}'),
    ("password: hunter2", f"password: {REDACTED}"),
    ("api-key=v1 x", f"api-key={REDACTED} x"),
    ("apikey: v2", f"apikey: {REDACTED}"),
    ("ACCESS_TOKEN=v3;", f"ACCESS_TOKEN={REDACTED};"),
    ("auth-token='v4'", f"auth-token='{REDACTED}'"),
    ("secret=v5,", f"secret={REDACTED},"),
    ("passwd=v6", f"passwd={REDACTED}"),
    ("private_key: v7", f"private_key: {REDACTED}"),
    ("authorization=v8", f"authorization={REDACTED}"),
    ("token = v9", f"token = {REDACTED}"),
])
def test_credentials_by_name_lose_their_value_and_keep_the_rest(line: str, expected: str) -> None:
    assert redact(line) == expected


def test_the_leak_check_catches_a_partial_secret() -> None:
    assert leaked(HF_CANARY, f"token {HF_CANARY[:12]}…") == [HF_CANARY[:12]]
    assert leaked(HF_CANARY, f"tail {HF_CANARY[-13:]}") == [HF_CANARY[-13:-1], HF_CANARY[-12:]]
    assert leaked(HF_CANARY, f"token {HF_CANARY[:11]}") == []
    assert leaked("short", "a short one") == ["short"]


def test_ordinary_log_lines_and_digests_survive() -> None:
    text = ("INFO 11-29 vllm serve google/gemma-4-E2B-it --max-model-len 65536\n"
            "image vllm/vllm-tpu@sha256:0f3c2a9d4b5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8\n"
            "stage fetching-token failed: PERMISSION_DENIED on secret hf-token")
    assert redact(text) == text


def test_excerpt_keeps_the_tail_and_earlier_errors_with_context() -> None:
    lines = [f"line {i}" for i in range(1000)]
    lines[100] = "RuntimeError: TPU not found"
    excerpt = relevant_excerpt("\n".join(lines), tail_lines=10, context=1).splitlines()
    assert excerpt == ["line 99", "RuntimeError: TPU not found", "line 101", "…"] + [f"line {i}" for i in
                                                                                      range(990, 1000)]
    assert relevant_excerpt("x" * 50_000, max_chars=1000) == "…" + "x" * 1000  # one line longer than the cap


def test_the_whole_diagnosis_request_is_redacted() -> None:
    messages = diagnosis_messages(f"token {HF_CANARY}", "failed", f"bad key {KEY_CANARY}")
    assert leaked(HF_CANARY, json.dumps(messages)) == [] and leaked(KEY_CANARY, json.dumps(messages)) == []
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("You diagnose failed deployments")
    assert messages[1] == {"role": "user", "content": f"Readiness gate stage: failed\nGate reason: bad key {REDACTED}"
                                                      f"\n\nLog excerpt:\ntoken {REDACTED}"}
    assert diagnosis_messages("log", None, None)[1]["content"] == ("Readiness gate stage: unknown\nGate reason: none "
                                                                  "given\n\nLog excerpt:\nlog")


def test_diagnose_a_log_file_never_sends_the_canaries(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text(f"{SERIAL}\nexport HF_TOKEN={HF_CANARY}\ncurl -H 'Authorization: Bearer {OAUTH_CANARY}'\n"
                   f"using key {KEY_CANARY}\n")
    with FakeOpenAI(reply_text=lambda prompt: "Cause: the image tag does not exist.") as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--stage", "pulling-image",
                                           "--reason", "docker pull failed", "--url", fake.url])
    assert result.exit_code == 0, result.output
    assert "Cause: the image tag does not exist." in result.output
    sent = b"".join(request.body for request in fake.requests).decode()
    assert sent and not any(leaked(canary, sent) for canary in (HF_CANARY, OAUTH_CANARY, KEY_CANARY))
    user_turn = fake.chat_bodies()[0]["messages"][1]["content"]
    assert "manifest unknown" in user_turn and "Readiness gate stage: pulling-image" in user_turn
    assert fake.chat_bodies()[0]["model"] == FAKE_MODEL and fake.chat_bodies()[0]["temperature"] == 0


def test_dry_run_prints_the_redacted_request_and_sends_nothing(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text(f"token={HF_CANARY}\nfatal: out of memory\n")
    result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--dry-run"])
    assert result.exit_code == 0 and "fatal: out of memory" in result.output and leaked(HF_CANARY, result.output) == []


def test_max_chars_bounds_the_excerpt_for_small_context_models(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("\n".join(f"ERROR line {i}" for i in range(2000)))
    result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--max-chars", "500", "--dry-run"])
    excerpt = result.output.split("Log excerpt:\n", 1)[1].rstrip("\n")
    assert result.exit_code == 0 and 480 < len(excerpt) <= len("…\n") + 500
    shown = excerpt.splitlines()
    assert shown[0] == "…" and shown[1:] == [f"ERROR line {i}" for i in range(2000 - len(shown) + 1, 2000)]


def test_a_token_straddling_the_cut_never_leaks_its_tail(tmp_path: Path) -> None:
    token = "hf_abcdefghij0123456789klmnop"  # one case: only the hf_ prefix marks it as a token
    log = tmp_path / "boot.log"
    log.write_text("\n".join(["boot"] * 5 + [f"auth {token}", "y" * 180]))
    # 200 chars from the end fall inside the token: cut first, and the tail would no longer look like one.
    assert "hf_" not in log.read_text()[-200:] and token[-16:] in log.read_text()[-200:]
    result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--max-chars", "200", "--dry-run"])
    assert result.exit_code == 0 and leaked(token, result.output, size=8) == []
    assert f"auth {REDACTED}" in result.output.splitlines()


def fake_compute(stage: str, reason: str) -> FakeServer:
    def guest_attributes(request: Request) -> Response:
        items = [{"namespace": "tpu-serve", "key": "stage", "value": stage},
                 {"namespace": "tpu-serve", "key": "reason", "value": reason}]
        return Response(200, {"queryPath": "tpu-serve/", "queryValue": {"items": items}})

    return FakeServer({("GET", f"{INSTANCE_PATH}/serialPort"): lambda request: Response(200, {"contents": SERIAL}),
                       ("GET", f"{INSTANCE_PATH}/getGuestAttributes"): guest_attributes})


@pytest.fixture
def no_adc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain sessions instead of application-default credentials (the fakes need no auth)."""
    monkeypatch.setattr("tpuserve.gce.adc_session", requests.Session)


def test_diagnose_a_vm_reads_serial_console_and_gate_stage(no_adc: None) -> None:
    with fake_compute("failed", f"docker pull failed (token {HF_CANARY})") as compute, FakeOpenAI() as model:
        result = CliRunner().invoke(main, ["diagnose", *VM, "--compute-url", compute.url, "--url", model.url])
    assert result.exit_code == 0, result.output
    user_turn = model.chat_bodies()[0]["messages"][1]["content"]
    assert "Readiness gate stage: failed" in user_turn and "manifest unknown" in user_turn
    assert leaked(HF_CANARY, user_turn) == [] and f"(token {REDACTED})" in user_turn
    assert compute.requests[0].query == "queryPath=tpu-serve%2F"


def test_logs_serial_prints_the_last_lines(no_adc: None) -> None:
    with fake_compute("serving", "") as compute:
        result = CliRunner().invoke(main, ["logs", *VM, "--source", "serial", "--tail", "2",
                                                           "--compute-url", compute.url])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == SERIAL.splitlines()[-2:]
    assert compute.requests[0].path == f"{INSTANCE_PATH}/serialPort" and compute.requests[0].query == "port=1"


@pytest.fixture
def gcloud_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `gcloud` first on PATH that records its argv (one per line) and prints a log line."""
    argv_file = tmp_path / "gcloud-argv"
    shim = tmp_path / "bin" / "gcloud"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {argv_file}\necho 'INFO vllm: Uvicorn running'\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    return argv_file


@pytest.mark.parametrize("extra, follow", [([], False), (["--follow"], True)])
def test_logs_docker_runs_docker_logs_over_iap_ssh(gcloud_shim: Path, capfd: pytest.CaptureFixture[str],
                                                   extra: list[str], follow: bool) -> None:
    result = CliRunner().invoke(main, ["logs", *VM, "--source", "docker", "--tail", "50", *extra])
    assert result.exit_code == 0, result.output
    vm = Instance("proj-1", "us-east5-b", "tpu-serve-dev")
    assert gcloud_shim.read_text().splitlines() == docker_logs_argv(vm, 50, follow)[1:]
    assert "Uvicorn running" in capfd.readouterr().out


def test_docker_logs_argv_is_sudo_docker_logs_over_iap_ssh() -> None:
    argv = docker_logs_argv(Instance("p", "z", "vm"), 10, True)
    assert argv[:-1] == ["gcloud", "compute", "ssh", "vm", "--zone", "z", "--project", "p", "--tunnel-through-iap",
                         "--command"]
    assert shlex.split(argv[-1]) == ["sudo", "docker", "logs", "--tail", "10", "--follow", "vllm"]


def test_logs_take_the_vm_from_saved_stack_outputs(gcloud_shim: Path, tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"instanceName": "vm-from-stack", "zone": "europe-west4-a", "project": "p2"}))
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", str(outputs), "--source", "docker"])
    assert result.exit_code == 0, result.output
    assert gcloud_shim.read_text().splitlines()[2:7] == ["vm-from-stack", "--zone", "europe-west4-a", "--project",
                                                         "p2"]


@pytest.mark.parametrize("engines, extra, container", [(4, [], "vllm-0"), (4, ["--engine", "2"], "vllm-2"),
                                                       (1, [], "vllm")])
def test_logs_of_a_vm_of_several_engines_read_the_one_asked_for(gcloud_shim: Path, tmp_path: Path, engines: int,
                                                              extra: list[str], container: str) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"instanceName": "vm", "zone": "z", "project": "p", "engines": engines}))
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", str(outputs), "--source", "docker", *extra])
    assert result.exit_code == 0, result.output
    assert shlex.split(gcloud_shim.read_text().splitlines()[-1])[-1] == container
    too_far = CliRunner().invoke(main, ["logs", "--stack-outputs", str(outputs), "--source", "docker", "--engine",
                                        str(engines)])
    assert too_far.exit_code == 2 and f"the VM runs {engines} engine(s): 0 to {engines - 1}" in too_far.output


def test_logs_without_a_vm_names_the_missing_options() -> None:
    result = CliRunner().invoke(main, ["logs", "--instance", "vm"])
    assert result.exit_code == 2 and "missing --zone, --project" in result.output


def test_without_url_the_deployment_itself_diagnoses(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR: vllm exited with 1\n")
    outputs = tmp_path / "outputs.json"
    with FakeOpenAI(reply_text=lambda prompt: "Cause: vLLM crashed.") as deployment:
        outputs.write_text(json.dumps({"target": "local", "endpoint": f"{deployment.url}/v1"}))
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--stack-outputs", str(outputs)])
    assert result.exit_code == 0, result.output
    assert "Cause: vLLM crashed." in result.output and len(deployment.chat_bodies()) == 1


# --- issue #11, item 10: a local-target stack's logs are its container's --------------------------------------

@pytest.fixture
def docker_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` first on PATH: `ps` finds the container by the config-hash label, `logs` prints two lines."""
    argv_file = tmp_path / "docker-argv"
    shim = tmp_path / "dbin" / "docker"
    shim.parent.mkdir()
    shim.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {argv_file}
case "$1" in
  ps) [ "$4" = "label=tpu-serve.config-hash=abc123" ] && echo tpu-serve-local ;;
  logs) echo 'INFO: Started server process'; echo 'ERROR: CUDA out of memory' ;;
esac
""")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    return argv_file


def local_outputs(tmp_path: Path) -> str:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"target": "local", "endpoint": "http://127.0.0.1:8000/v1", "model": "m",
                                   "configHash": "abc123"}))
    return str(outputs)


def test_logs_of_a_local_stack_are_its_containers(docker_shim: Path, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path), "--tail", "20"])
    assert result.exit_code == 0, result.output
    assert docker_shim.read_text().splitlines() == [
        "ps -a --filter label=tpu-serve.config-hash=abc123 --format {{.Names}}", "logs --tail 20 tpu-serve-local"]
    assert "CUDA out of memory" in capfd.readouterr().out
    as_json = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path), "--json"])
    assert json.loads(as_json.output) == {"target": "local", "serial": None, "cloud": None,
                                          "docker": "INFO: Started server process\nERROR: CUDA out of memory\n"}


def test_a_local_stack_has_no_serial_console(docker_shim: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path), "--source", "serial"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == ("Error: a local-target stack has no serial console: its logs are the "
                                              "container's (--source docker)")


def test_without_docker_the_local_stack_error_says_where_its_logs_are(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path)])
    assert result.exit_code == 1
    assert result.output == ("Error: a local-target stack's logs are `docker logs` of the container labelled "
                             "tpu-serve.config-hash=abc123 on its Docker host, and docker is not on PATH here\n")


def test_diagnose_a_local_stack_reads_its_container_logs(docker_shim: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["diagnose", "--stack-outputs", local_outputs(tmp_path), "--dry-run",
                                       "--json"])
    assert result.exit_code == 0, result.output
    assert "ERROR: CUDA out of memory" in json.loads(result.output)["messages"][1]["content"]


# --- the container's logs from Cloud Logging (shipped by the VM's Ops Agent) -------------------------------------

INSTANCE_ID = "4242424242"
# LogEntry shape (https://cloud.google.com/logging/docs/reference/v2/rest/v2/LogEntry) as the Ops Agent writes a
# Docker json-file line after its parse_json processor: the line's "log" and "stream" fields become jsonPayload.
def shipped_entry(line: str, second: int) -> dict:
    return {"logName": "projects/proj-1/logs/vllm", "insertId": f"id{second}",
            "resource": {"type": "gce_instance", "labels": {"instance_id": INSTANCE_ID, "zone": "europe-west4-a",
                                                             "project_id": "proj-1"}},
            "timestamp": f"2026-11-29T10:00:{second:02d}.123456789Z", "receiveTimestamp": "2026-11-29T10:01:00Z",
            "jsonPayload": {"log": line + "\n", "stream": "stderr"}}


def fake_logging(lines: list[str], page_size_seen: list[int] | None = None, status: int = 200) -> dict:
    """entries.list newest first, two entries a page (a real answer pages too), as the API orders by timestamp desc."""
    newest_first = [shipped_entry(line, second) for second, line in reversed(list(enumerate(lines)))]

    def entries_list(request: Request) -> Response:
        if status != 200:
            return Response(status, {"error": {"code": status, "message": "Cloud Logging API has not been used in "
                                               "project proj-1 before or it is disabled.", "status": "PERMISSION_DENIED"}})
        body = request.json()
        assert body["resourceNames"] == ["projects/proj-1"] and body["orderBy"] == "timestamp desc"
        assert body["filter"] == ('logName="projects/proj-1/logs/vllm" AND resource.type="gce_instance" AND '
                                  f'resource.labels.instance_id="{INSTANCE_ID}"')
        if page_size_seen is not None:
            page_size_seen.append(body["pageSize"])
        start = int(body.get("pageToken", "0"))
        page = newest_first[start:start + min(2, body["pageSize"])]
        answer = {"entries": page}
        if start + len(page) < len(newest_first):
            answer["nextPageToken"] = str(start + len(page))
        return Response(200, answer)

    return {("POST", "/v2/entries:list"): entries_list}


def compute_with_instance(stage: str = "failed", reason: str = "container vllm exited") -> FakeServer:
    server = fake_compute(stage, reason)
    server.routes[("GET", INSTANCE_PATH)] = lambda request: Response(200, {"id": INSTANCE_ID, "name": "tpu-serve-dev",
                                                                           "status": "RUNNING"})
    return server


CONTAINER_LINES = ["INFO 11-29 10:00:00 Starting vLLM API server", "INFO Uvicorn running on http://0.0.0.0:8000",
                   f"ERROR engine core died (HF_TOKEN={HF_CANARY})", "RuntimeError: TPU out of memory"]


def test_logs_cloud_reads_the_containers_last_lines_without_ssh(no_adc: None, gcloud_shim: Path) -> None:
    page_sizes: list[int] = []
    with compute_with_instance() as compute, FakeServer(fake_logging(CONTAINER_LINES, page_sizes)) as logging_api:
        result = CliRunner().invoke(main, ["logs", *VM, "--source", "cloud", "--tail", "3", "--compute-url",
                                           compute.url, "--logging-url", logging_api.url])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == CONTAINER_LINES[-3:]  # oldest first, as a log reads, newlines dropped
    assert page_sizes == [3, 1]  # asks only for what is still missing
    assert not gcloud_shim.exists()  # no ssh


def test_logs_cloud_as_json_and_an_api_error_is_one_line(no_adc: None) -> None:
    with compute_with_instance() as compute, FakeServer(fake_logging(CONTAINER_LINES)) as logging_api:
        as_json = CliRunner().invoke(main, ["logs", *VM, "--source", "cloud", "--json", "--compute-url",
                                            compute.url, "--logging-url", logging_api.url])
    assert json.loads(as_json.stdout) == {"target": "tpu-serve-dev", "serial": None, "docker": None,
                                          "cloud": "\n".join(CONTAINER_LINES)}
    with compute_with_instance() as compute, FakeServer(fake_logging([], status=403)) as logging_api:
        refused = CliRunner().invoke(main, ["logs", *VM, "--source", "cloud", "--compute-url", compute.url,
                                            "--logging-url", logging_api.url])
    assert refused.exit_code == 1
    assert refused.output.splitlines()[-1].startswith("Error: container logs of tpu-serve-dev: Cloud Logging API "
                                                      "HTTP 403: Cloud Logging API has not been used")


def test_diagnose_adds_the_shipped_container_logs_redacted(no_adc: None) -> None:
    with compute_with_instance() as compute, FakeServer(fake_logging(CONTAINER_LINES)) as logging_api:
        result = CliRunner().invoke(main, ["diagnose", *VM, "--compute-url", compute.url, "--logging-url",
                                           logging_api.url, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "== vllm container (Cloud Logging) ==" in result.stdout
    assert "RuntimeError: TPU out of memory" in result.stdout and "manifest unknown" in result.stdout
    assert HF_CANARY[:12] not in result.stdout


def test_diagnose_without_shipped_logs_says_so_and_uses_the_serial_console(no_adc: None) -> None:
    with compute_with_instance() as compute, FakeServer(fake_logging([], status=403)) as logging_api:
        result = CliRunner().invoke(main, ["diagnose", *VM, "--compute-url", compute.url, "--logging-url",
                                           logging_api.url, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "manifest unknown" in result.stdout and "(Cloud Logging)" not in result.stdout
    assert "note: no container logs from Cloud Logging (container logs of tpu-serve-dev: Cloud Logging API HTTP 403" \
        in result.stderr
# --- issue #12: the glue around the redactor, pinned (each literal here is one a mutant changed unnoticed) -------

def test_errors_far_from_the_end_keep_their_context_even_at_the_top() -> None:
    lines = ["boot", "ERROR early", "fine", *[f"line {i}" for i in range(10)]]
    assert relevant_excerpt("\n".join(lines), tail_lines=2, context=1).splitlines() == [
        "boot", "ERROR early", "fine", "…", "line 8", "line 9"]


def test_the_size_cap_keeps_whole_lines_up_to_exactly_the_cap() -> None:
    text = "aaaa\nbbbb\ncccc"  # 14 characters
    assert last_lines_within(text, 14) == text  # at the cap: untouched
    assert last_lines_within(text, 13) == "…\nbbbb\ncccc"  # 'bbbb\n' + 'cccc\n' is 10 ≤ 13
    assert last_lines_within(text, 10) == "…\nbbbb\ncccc"  # exactly the cap still fits
    assert last_lines_within(text, 9) == "…\ncccc"


def test_docker_logs_argv_without_follow() -> None:
    argv = docker_logs_argv(Instance("p", "z", "vm"), 7, False)
    assert argv[:-1] == ["gcloud", "compute", "ssh", "vm", "--zone", "z", "--project", "p", "--tunnel-through-iap",
                         "--command"]
    assert shlex.split(argv[-1]) == ["sudo", "docker", "logs", "--tail", "7", "vllm"]


def test_the_vm_options_as_users_see_them() -> None:
    command = click.command()(instance_options(lambda **kwargs: None))
    assert [(p.opts, p.help, p.show_default) for p in command.params][2:] == [
        (["--instance"], "VM name.", None), (["--zone"], "Zone of the VM.", None),
        (["--project"], "Project of the VM.", None), (["--compute-url"], "Compute API root.", True),
        (["--logging-url"], "Cloud Logging API root.", True)]
    assert [p.default for p in command.params[-2:]] == ["https://compute.googleapis.com",
                                                       "https://logging.googleapis.com"]
    assert [p.opts for p in command.params][:2] == [["--stack"], ["--stack-outputs"]]


def test_logs_as_json_reads_the_serial_console_and_tails_it(no_adc: None) -> None:
    with fake_compute("serving", "") as compute:
        result = CliRunner().invoke(main, ["logs", *VM, "--source", "serial", "--tail", "2", "--json",
                                           "--compute-url", compute.url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"target": "tpu-serve-dev", "serial": "\n".join(SERIAL.splitlines()[-2:]),
                                         "docker": None, "cloud": None}


def refusing_compute(status: int, message: str) -> FakeServer:
    """The Compute API refusing the serial port, with its error body shape (googleapis error JSON)."""
    body = {"error": {"code": status, "message": message, "errors": [{"message": message, "reason": "forbidden"}]}}
    return FakeServer({("GET", f"{INSTANCE_PATH}/serialPort"): lambda request: Response(status, body)})


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_refused_serial_console_is_one_line_naming_the_vm(no_adc: None, json_flag: list[str]) -> None:
    with refusing_compute(403, "Required 'compute.instances.getSerialPortOutput' permission") as compute:
        result = CliRunner().invoke(main, ["logs", *VM, "--source", "serial", *json_flag, "--compute-url",
                                           compute.url])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == ("Error: serial console of tpu-serve-dev: Compute API HTTP 403: Required "
                                              "'compute.instances.getSerialPortOutput' permission")


@pytest.mark.parametrize("source", ["serial", "cloud"])
def test_without_credentials_the_google_sources_say_how_to_log_in(monkeypatch: pytest.MonkeyPatch,
                                                                    source: str) -> None:
    def no_credentials() -> requests.Session:
        raise MissingCredentials("no application-default credentials: run `gcloud auth application-default login`")

    monkeypatch.setattr("tpuserve.gce.adc_session", no_credentials)
    result = CliRunner().invoke(main, ["logs", *VM, "--source", source])
    assert (result.exit_code, result.output) == (1, "Error: no application-default credentials: run `gcloud auth "
                                                    "application-default login`\n")


def test_logs_as_json_over_iap_and_its_failures(gcloud_shim: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(main, ["logs", *VM, "--source", "docker", "--json", "--tail", "3"])
    assert json.loads(result.output) == {"target": "tpu-serve-dev", "serial": None,
                                         "docker": "INFO vllm: Uvicorn running\n", "cloud": None}
    assert gcloud_shim.read_text().splitlines()[-1] == "sudo docker logs --tail 3 vllm"
    failing = tmp_path / "bin" / "gcloud"
    failing.write_text("#!/bin/sh\necho 'ERROR: (gcloud.compute.ssh)   Could not fetch resource:\n  - Not found' >&2\n"
                       "exit 1\n")
    result = CliRunner().invoke(main, ["logs", *VM, "--source", "docker", "--json"])
    why = "`gcloud ...` exited with 1: ERROR: (gcloud.compute.ssh) Could not fetch resource: - Not found"
    assert (result.exit_code, result.stderr) == (1, f"Error: {why}\n")
    assert json.loads(result.stdout) == {"ok": False, "error": why, "exit": 1}  # under --json, the error too
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    result = CliRunner().invoke(main, ["logs", *VM, "--source", "docker", "--json"])
    assert (result.exit_code, result.stderr) == (1, "Error: gcloud not found: it is needed for `docker logs`\n")


def test_the_vm_comes_from_the_named_stack(gcloud_shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def stack_outputs(stack: str) -> dict[str, str]:
        asked.append(stack)
        return {"instanceName": "vm-of-dev", "zone": "us-east5-b", "project": "p3"}

    monkeypatch.setattr("tpuserve.deploy.stack.stack_outputs", stack_outputs)
    result = CliRunner().invoke(main, ["logs", "--stack", "dev", "--source", "docker"])
    assert result.exit_code == 0, result.output
    assert asked == ["dev"] and gcloud_shim.read_text().splitlines()[2:7] == ["vm-of-dev", "--zone", "us-east5-b",
                                                                            "--project", "p3"]


def test_a_vm_named_without_its_name_lists_every_missing_option() -> None:
    result = CliRunner().invoke(main, ["logs"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == ("Error: missing --instance, --zone, --project (or give --stack / "
                                              "--stack-outputs)")


def test_a_local_stack_without_its_config_hash_says_what_is_missing(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"target": "local", "endpoint": "http://127.0.0.1:8000/v1"}))
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", str(outputs)])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: a local-target stack's logs are its container's (`docker logs tpu-serve-<stack>` on the Docker host), "
        "but these stack outputs lack configHash to find it by")


def test_following_a_local_stacks_logs(docker_shim: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path), "--follow"])
    assert result.exit_code == 0, result.output
    assert docker_shim.read_text().splitlines()[-1] == "logs --tail 200 --follow tpu-serve-local"


def docker_answering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ps: str) -> None:
    """A `docker` whose `ps` is the given shell snippet (the container lookup's answer)."""
    shim = tmp_path / "dbin2" / "docker"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\ncase \"$1\" in\n  ps) {ps} ;;\n  logs) echo 'some log' ;;\nesac\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("ps, says", [
    ("exit 0", "no such container (destroyed, or another Docker host?)"),
    ("printf 'Cannot connect to the Docker daemon\\n  at unix:///var/run/docker.sock.\\n' >&2; exit 1",
     "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."),
    ("echo tpu-serve-local; echo 'permission denied' >&2; exit 1", "permission denied"),
], ids=["none-listed", "daemon-down", "failed-with-output"])
def test_a_local_container_that_cannot_be_found_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ps: str,
                                                         says: str) -> None:
    docker_answering(tmp_path, monkeypatch, ps)
    result = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path)])
    assert (result.exit_code, result.output) == (1, "Error: cannot find the container labelled "
                                                    f"tpu-serve.config-hash=abc123: {says}\n")


def test_a_local_containers_failing_logs_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shim = tmp_path / "dbin3" / "docker"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\ncase \"$1\" in\n  ps) echo tpu-serve-local ;;\n"
                    "  logs) echo 'Error response from daemon:  No such container' >&2; exit 1 ;;\nesac\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    as_json = CliRunner().invoke(main, ["logs", "--stack-outputs", local_outputs(tmp_path), "--json"])
    assert (as_json.exit_code, as_json.stderr) == (1, "Error: `docker ...` exited with 1: Error response from daemon: "
                                                      "No such container\n")


def test_diagnose_without_url_or_stack_says_what_to_give(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR\n")
    result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log)])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == ("Error: give --url of the diagnosing endpoint (or --stack to ask the "
                                              "deployment)")


def test_diagnose_asks_the_named_stacks_model_with_the_key_and_a_bounded_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR: vllm exited with 1\n")
    monkeypatch.setenv("DIAG_KEY", "key-123")
    with FakeOpenAI(reply_text=lambda prompt: "  Cause: vLLM crashed.  ") as deployment:
        monkeypatch.setattr("tpuserve.deploy.stack.stack_outputs", lambda stack: {
            "target": "local", "endpoint": f"{deployment.url}/v1", "model": FAKE_MODEL} if stack == "dev" else {})
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--stack", "dev", "--api-key-env",
                                           "DIAG_KEY"])
    assert (result.exit_code, result.output) == (0, "Cause: vLLM crashed.\n")
    assert [r.headers.get("Authorization") for r in deployment.requests] == ["Bearer key-123"] * len(
        deployment.requests) and len(deployment.requests) >= 1
    [body] = deployment.chat_bodies()
    assert (body["model"], body["temperature"], body["max_tokens"]) == (FAKE_MODEL, 0, 300)


def test_diagnose_names_the_model_asked_for_and_a_failing_endpoint(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR\n")
    with FakeOpenAI() as fake:
        named = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url, "--model",
                                          FAKE_MODEL])
        missing = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url, "--model",
                                            "other/model"])
    assert named.exit_code == 0 and fake.chat_bodies()[0]["model"] == FAKE_MODEL
    assert missing.exit_code != 0 and "'other/model' is not served by" in missing.output
    failing = FakeServer({("GET", "/v1/models"): lambda request: Response(200, {"data": [{"id": "m"}]}),
                          ("POST", "/v1/chat/completions"): lambda request: Response(
                              500, {"error": {"message": "engine dead"}})})
    with failing:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", failing.url])
    assert (result.exit_code, result.output) == (1, f"Error: the diagnosing endpoint {failing.url} (m) failed: HTTP "
                                                    "500: engine dead\n")


def test_an_empty_diagnosis_says_so(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR\n")
    with FakeOpenAI(reply_text=lambda prompt: "   ") as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url])
    assert (result.exit_code, result.output) == (0, "(the model returned an empty answer)\n")


def test_diagnose_with_a_url_never_asks_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "boot.log"
    log.write_text("ERROR\n")

    def no_pulumi(stack: str) -> dict[str, str]:
        raise AssertionError("asked pulumi for the stack's outputs although --url was given")

    monkeypatch.setattr("tpuserve.deploy.stack.stack_outputs", no_pulumi)
    with FakeOpenAI() as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url, "--stack", "dev"])
    assert result.exit_code == 0, result.output


# --- issue #12, second run: Cloud Logging's failure paths, and what diagnose adds when nothing was shipped ---------

def test_logs_cloud_of_a_vm_the_compute_api_does_not_know_is_one_line(no_adc: None) -> None:
    # The Compute API's 404 for instances.get (googleapis error JSON; the message as the API words it).
    message = "The resource 'projects/proj-1/zones/us-east5-b/instances/tpu-serve-dev' was not found"
    body = {"error": {"code": 404, "message": message, "errors": [{"message": message, "reason": "notFound"}]}}
    with FakeServer({("GET", INSTANCE_PATH): lambda request: Response(404, body)}) as compute:
        result = CliRunner().invoke(main, ["logs", *VM, "--source", "cloud", "--compute-url", compute.url,
                                           "--logging-url", compute.url])
    assert (result.exit_code, result.output) == (1, f"Error: tpu-serve-dev: Compute API HTTP 404: {message}\n")


def test_diagnose_asks_cloud_logging_for_the_last_thousand_lines(no_adc: None) -> None:
    page_sizes: list[int] = []
    with compute_with_instance() as compute, FakeServer(fake_logging(CONTAINER_LINES, page_sizes)) as logging_api:
        result = CliRunner().invoke(main, ["diagnose", *VM, "--compute-url", compute.url, "--logging-url",
                                           logging_api.url, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert page_sizes[:2] == [1000, 998]  # the fake pages two entries at a time


@pytest.mark.parametrize("status", [200, 403], ids=["nothing-shipped", "logging-refused"])
def test_diagnose_without_shipped_lines_sends_the_serial_console_unchanged(no_adc: None, status: int) -> None:
    with compute_with_instance() as compute, FakeServer(fake_logging([], status=status)) as logging_api:
        result = CliRunner().invoke(main, ["diagnose", *VM, "--compute-url", compute.url, "--logging-url",
                                           logging_api.url, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "(Cloud Logging)" not in result.stdout
    assert result.stdout.splitlines()[-1] == "docker: Error response from daemon: manifest unknown"


# Issue 34 item 8: the excerpt fits the diagnosing model's context.
LONG_LOG = "\n".join([f"(EngineCore pid={i}) ERROR worker {i} failed to allocate its KV cache block table" for i in
                      range(400)] + ["docker: Error response from daemon: manifest unknown"])  # 25,000 characters


class SmallContextVllm(FakeOpenAI):
    """A vLLM serving a model of `max_model_len` tokens: /v1/models says so (ModelCard.max_model_len), POST /tokenize
    counts a chat (TokenizeResponse {count, max_model_len, tokens}; here one token per 2 characters of content plus
    10 for the template, a stand-in for the tokenizer), and a chat too long for the context gets vLLM's 400
    (vllm/renderers/params.py _token_len_check)."""

    def __init__(self, max_model_len: int = 1024, tokenize: bool = True):
        super().__init__(reply_text=lambda prompt: "Cause: the image tag does not exist.")
        self.max_model_len = max_model_len
        self.routes[("POST", "/v1/chat/completions")] = self.chat_within_context
        if tokenize:
            self.routes[("POST", "/tokenize")] = self.tokenize

    def models(self, request: Request) -> Response:
        return Response(200, {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "root": FAKE_MODEL,
                                                          "max_model_len": self.max_model_len}]})

    @staticmethod
    def count(messages: list[dict]) -> int:
        return sum(len(m["content"]) for m in messages) // 2 + 10

    def tokenize(self, request: Request) -> Response:
        count = self.count(request.json()["messages"])
        return Response(200, {"count": count, "max_model_len": self.max_model_len, "tokens": [0] * count})

    def chat_within_context(self, request: Request) -> Response:
        count = self.count(request.json()["messages"])
        if count > self.max_model_len:
            return Response(400, {"error": {"message": f"This model's maximum context length is {self.max_model_len} "
                                                       f"tokens. However, your prompt contains at least "
                                                       f"{self.max_model_len + 1} input tokens, which exceeds this "
                                                       "limit even without any output tokens. Please reduce the "
                                                       "length of the input prompt.",
                                            "type": "BadRequestError", "param": "input_tokens", "code": 400}})
        return self.chat(request)


def test_the_default_excerpt_is_cut_to_the_models_context(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(LONG_LOG)
    with SmallContextVllm(1024) as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Cause: the image tag does not exist.\n"
    [sent] = fake.chat_bodies()
    assert fake.count(sent["messages"]) <= 1024 - 300 and sent["max_tokens"] == 300  # the answer's room is kept
    assert "manifest unknown" in sent["messages"][1]["content"]  # the log's end is what is kept
    assert "takes 1024 tokens (its max_model_len), 300 of them for the answer" in result.stderr


def test_a_max_chars_the_user_chose_is_refused_with_one_that_fits(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(LONG_LOG)
    with SmallContextVllm(1024) as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url, "--max-chars",
                                           "5000"])
    assert result.exit_code == 2
    assert "Invalid value for --max-chars: fake/gemma-4-E2B-it takes 1024 tokens" in result.output
    assert fake.chat_bodies() == []
    fits = int(result.output.split("give at most ")[1].split()[0])
    with SmallContextVllm(1024) as fake:
        again = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url, "--max-chars",
                                          str(fits)])
    assert again.exit_code == 0, again.output


def test_a_server_that_cannot_count_tokens_gets_the_excerpt_and_its_refusal_says_what_to_lower(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(LONG_LOG)
    with SmallContextVllm(1024, tokenize=False) as fake:
        result = CliRunner().invoke(main, ["diagnose", "--log-file", str(log), "--url", fake.url])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].endswith("Please reduce the length of the input prompt.; lower --max-chars")
