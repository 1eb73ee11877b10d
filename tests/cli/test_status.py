"""`tpuserve status` against fakes on 127.0.0.1 (tests/httpfake.FakeServer): a vLLM /metrics that replays the recorded
real scrape (tests/data/vllm-0.32.0-metrics.prom) and a later one with hand-set values, and a fake Compute API
answering with compute#instance bodies (field names from the Compute API's Instance and Scheduling types:
status, machineType, creationTimestamp, lastStartTimestamp, scheduling.maxRunDuration {seconds, nanos},
scheduling.terminationTime) and guest attributes as the startup script writes them.
The real-server run under `vllm bench serve` is tests/e2e/test_metrics_e2e.py."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fakes import fake_pulumi, fake_tunnel
from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve import gce
from tpuserve.gce import Instance
from tpuserve.flex_start import deletion_at
from tpuserve.observe.status import GONE, Sources, expiry_warning, live_view, reports, status, vm_view
from tpuserve import vllm_metrics

RECORDING = (Path(__file__).resolve().parents[1] / "data" / "vllm-0.32.0-metrics.prom").read_text()
LABELS = '{engine="0",model_name="tiny-gemma4"}'
VM = Instance("demo-project", "us-east5-b", "tpu-serve-dev")
VM_PATH = "/compute/v1/projects/demo-project/zones/us-east5-b/instances/tpu-serve-dev"
VM_URN = ("urn:pulumi:dev::tpu-serve::tpuserve:index:Deployment$tpuserve:gcp:FlexStartTpuVm$"
          "gcp:compute/instance:Instance::tpu-serve-dev")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def set_values(text: str, values: dict[str, float]) -> str:
    """The scrape with some samples' values replaced; keys are sample names with their labels, as exposed."""
    for sample, value in values.items():
        text, count = re.subn(rf"^{re.escape(sample)} .*$", f"{sample} {value}", text, flags=re.MULTILINE)
        assert count == 1, sample
    return text


def ttft(le: str) -> str:
    return f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="tiny-gemma4"}}'


def itl(le: str) -> str:
    return f'vllm:inter_token_latency_seconds_bucket{{engine="0",le="{le}",model_name="tiny-gemma4"}}'


# Five seconds after the recording: 10 requests got a first token (4 in (0.04, 0.06], 4 in (0.06, 0.08], 2 in
# (0.1, 0.25]), 20 inter-token gaps in (0.01, 0.025], 640 prompt and 160 generated tokens, half the prompt tokens
# from the prefix cache, 12 requests finished (10 at length, 2 at stop); 3 run, 2 wait, a quarter of the KV cache used.
LATER = set_values(RECORDING, {
    f"vllm:num_requests_running{LABELS}": 3, f"vllm:num_requests_waiting{LABELS}": 2,
    f"vllm:kv_cache_usage_perc{LABELS}": 0.25,
    f"vllm:prompt_tokens_total{LABELS}": 652, f"vllm:generation_tokens_total{LABELS}": 168,
    f"vllm:prefix_cache_queries_total{LABELS}": 652, f"vllm:prefix_cache_hits_total{LABELS}": 320,
    'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-gemma4"}': 11,
    'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-gemma4"}': 2,
    **{ttft(le): 4 for le in ["0.06"]}, **{ttft(le): 9 for le in ["0.08", "0.1"]},
    **{ttft(le): 11 for le in ["0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0",
                                "160.0", "640.0", "2560.0", "+Inf"]},
    **{itl(le): 26 for le in ["0.025"]},
    **{itl(le): 27 for le in ["0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5",
                               "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]},
})


def test_the_live_view_is_the_window_between_two_reads():
    view = live_view("http://h:8000", vllm_metrics.parse(RECORDING, 100.0), vllm_metrics.parse(LATER, 105.0))
    assert (view.running, view.waiting, view.kv_cache_usage) == (3.0, 2.0, 0.25)
    assert view.ttft_s.p50 == pytest.approx(0.065)  # rank 5 of 10: 1 of the 4 in (0.06, 0.08]
    assert view.ttft_s.p95 == pytest.approx(0.2125)  # rank 9.5: 1.5 of the 2 in (0.1, 0.25]
    assert view.itl_s.p50 == pytest.approx(0.0175) and view.itl_s.p95 == pytest.approx(0.02425)
    assert view.first_tokens == 10.0
    assert (view.prompt_tokens_per_s, view.generation_tokens_per_s) == (128.0, 32.0)
    assert view.prefix_cache_hit_rate == pytest.approx(320 / 640)
    assert view.finished == 12.0 and view.finished_by_reason == {"length": 10.0, "stop": 2.0}
    assert view.preemptions == 0.0 and view.interval_s == 5.0


def test_a_quiet_interval_has_no_quantiles():
    view = live_view("http://h:8000", vllm_metrics.parse(RECORDING, 0.0), vllm_metrics.parse(RECORDING, 5.0))
    assert view.ttft_s.p50 is None and view.itl_s.p95 is None and view.first_tokens == 0.0
    assert view.generation_tokens_per_s == 0.0 and view.prefix_cache_hit_rate is None


# --- the VM ---------------------------------------------------------------------------------------------------

def instance_body(started: datetime, max_run_s: int = 4 * 3600, status: str = "RUNNING", **scheduling) -> dict:
    """A compute#instance as GET returns it for a flex-start TPU VM (the fields status reads)."""
    stamp = started.astimezone(timezone(timedelta(hours=-8))).isoformat(timespec="milliseconds")
    return {"kind": "compute#instance", "name": VM.name, "status": status,
            "machineType": f"https://www.googleapis.com/compute/v1/projects/{VM.project}/zones/{VM.zone}/"
                           "machineTypes/ct6e-standard-4t",
            "creationTimestamp": stamp, "lastStartTimestamp": stamp,
            "scheduling": {"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE",
                           "maxRunDuration": {"seconds": str(max_run_s)}, **scheduling}}


ATTRIBUTES = {"stage": "serving", "config-hash": "7eeea49152716bcb", "ops-agent": "running"}


def test_time_left_and_cost_from_the_instance_resource():
    view = vm_view(VM, instance_body(NOW - timedelta(hours=3, minutes=40)), ATTRIBUTES, NOW, 1.35,
                   "7eeea49152716bcb")
    assert view.left_s == 20 * 60
    assert view.deletion_at == "2026-11-29T04:20:00-08:00"  # started 08:20 UTC + 4 h, in the API's own offset
    assert view.uptime_s == (3 * 60 + 40) * 60
    assert (view.machine_type, view.chips) == ("ct6e-standard-4t", 4)
    assert view.cost_so_far_usd == pytest.approx(round(11 / 3 * 4 * 1.35, 2))
    assert (view.boot_stage, view.config_hash, view.ops_agent) == ("serving", "7eeea49152716bcb", "running")


def test_termination_time_wins_and_nanos_count():
    body = instance_body(NOW, terminationTime="2026-11-29T13:30:00Z")
    assert deletion_at(body) == datetime(2026, 11, 29, 13, 30, tzinfo=timezone.utc)
    body = instance_body(NOW, max_run_s=60)
    body["scheduling"]["maxRunDuration"]["nanos"] = 500_000_000
    assert deletion_at(body) == NOW + timedelta(seconds=60.5)


def test_a_vm_that_never_started_counts_from_its_creation():
    body = instance_body(NOW - timedelta(minutes=5), status="PROVISIONING")
    del body["lastStartTimestamp"]
    view = vm_view(VM, body, {}, NOW, 1.35)
    assert view.left_s == (4 * 60 - 5) * 60 and view.uptime_s is None and view.cost_so_far_usd is None


def test_the_warning_under_30_minutes_names_the_renew_command():
    view = vm_view(VM, instance_body(NOW - timedelta(hours=3, minutes=40)), ATTRIBUTES, NOW, 1.35)
    warning = expiry_warning(view, "dev")
    assert "deleted in 20 min" in warning
    assert warning.endswith("\n  tpuserve renew --stack dev")
    calm = vm_view(VM, instance_body(NOW - timedelta(hours=3, minutes=29)), ATTRIBUTES, NOW, 1.35)
    assert expiry_warning(calm, "dev") is None


# --- the command ----------------------------------------------------------------------------------------------

def metrics_server(*bodies: str) -> FakeServer:
    """/metrics answering each body in turn, the last one forever."""
    replies = iter(bodies)
    last = [bodies[0]]

    def serve(request: Request) -> Response:
        last[0] = next(replies, last[0])
        return Response(200, last[0], {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # /v1/models too, as vLLM serves it (status must not need it: under --api-key it answers 401 without the key)
    models = {"object": "list", "data": [{"id": "tiny-gemma4", "object": "model", "root": "tiny-gemma4"}]}
    return FakeServer({("GET", "/metrics"): serve, ("GET", "/v1/models"): lambda r: Response(200, models)})


def compute_api(body: dict | None, attributes: dict[str, str]) -> FakeServer:
    gone = Response(404, {"error": {"code": 404, "message": f"The resource '{VM_PATH}' was not found"}})
    return FakeServer({
        ("GET", VM_PATH): lambda r: Response(200, body) if body else gone,
        ("GET", f"{VM_PATH}/getGuestAttributes"): lambda r: Response(200, {"queryValue": {"items": [
            {"namespace": "tpu-serve", "key": key, "value": value} for key, value in attributes.items()]}})})


def invoke(*args: str) -> object:
    return CliRunner().invoke(status, list(args), env={"COLUMNS": "200"})


@pytest.mark.parametrize("address", ["{url}", "{url}/v1", "{hostport}"])
def test_status_url_prints_the_live_view_as_json(address):
    with metrics_server(RECORDING, LATER) as fake:
        url = address.format(url=fake.url, hostport=fake.url.removeprefix("http://"))
        result = invoke("--url", url, "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"] is None and report["warnings"] == []
    server = report["server"]
    assert server["url"] == fake.url and (server["running"], server["waiting"]) == (3.0, 2.0)
    assert server["ttft_s"]["p50"] == pytest.approx(0.065) and server["first_tokens"] == 10.0
    assert [r.path for r in fake.requests] == ["/metrics", "/metrics"]


def test_status_url_prints_a_screen():
    with metrics_server(RECORDING, LATER) as fake:
        result = invoke("--url", fake.url, "--interval", "0.5")
    assert result.exit_code == 0, result.output
    assert "running 3 · waiting 2" in result.stdout
    assert "p50 65 ms · p95 212 ms (10 first tokens)" in result.stdout
    assert "25.0 % used" in result.stdout


def test_an_unreachable_server_is_one_line_and_exit_1():
    with FakeServer() as fake:
        url = fake.url
    result = invoke("--url", url, "--json")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: cannot reach {url}/metrics: Connection refused; is the "
                                                  "server up and its URL right?"]


def test_a_server_without_metrics_is_one_line_and_exit_1():
    with FakeServer() as fake:
        result = invoke("--url", fake.url)
    assert result.exit_code == 1 and result.output.strip() == f"Error: {fake.url}/metrics answered HTTP 404"


@pytest.mark.parametrize("args,message", [([], "give --url (any vLLM server) or --stack"),
                                          (["--url", "http://"], "'http://' is not a server URL (no host)"),
                                          (["--url", "x:1", "--interval", "0"], "--interval")])
def test_usage_mistakes_exit_2_with_one_line(args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def outputs_file(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps({"target": "gcp", "instanceName": VM.name, "zone": VM.zone, "project": VM.project,
                                "configHash": "7eeea49152716bcb", "vmUrn": VM_URN, **extra}))
    return path


@pytest.fixture
def no_credentials_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gce, "adc_session", requests.Session)


def test_a_stack_shows_the_expiry_countdown_from_the_compute_api(tmp_path, no_credentials_needed):
    started = datetime.now(timezone.utc) - timedelta(hours=3, minutes=45)
    with compute_api(instance_body(started), ATTRIBUTES) as compute, metrics_server(RECORDING, LATER) as server:
        result = invoke("--stack-outputs", str(outputs_file(tmp_path)), "--url", server.url, "--compute-url",
                        compute.url, "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    vm = report["vm"]
    assert 14 * 60 <= vm["left_s"] <= 15 * 60
    assert vm["cost_so_far_usd"] == pytest.approx(3.75 * 4 * 1.35, abs=0.02)
    assert (vm["status"], vm["boot_stage"], vm["zone"]) == ("RUNNING", "serving", "us-east5-b")
    [warning] = report["warnings"]
    assert "deleted in 14 min" in warning or "deleted in 15 min" in warning
    assert warning.endswith("tpuserve renew --stack dev")  # the stack's name, from the URN
    assert report["server"]["running"] == 3.0
    assert {r.path for r in compute.requests} == {VM_PATH, f"{VM_PATH}/getGuestAttributes"}


def test_the_expiry_warning_is_on_screen(tmp_path, no_credentials_needed):
    started = datetime.now(timezone.utc) - timedelta(hours=3, minutes=45)
    with compute_api(instance_body(started), ATTRIBUTES) as compute, metrics_server(RECORDING, LATER) as server:
        result = invoke("--stack-outputs", str(outputs_file(tmp_path)), "--url", server.url, "--compute-url",
                        compute.url, "--interval", "0.5")
    assert result.exit_code == 0, result.output
    assert "flex-start expiry" in result.stdout and "To keep serving" in result.stdout
    assert "\ntpuserve renew --stack dev\n" in result.stdout
    assert "tpu-serve-dev  us-east5-b  RUNNING  ct6e-standard-4t (4 chips)" in result.stdout


@pytest.fixture
def no_gcloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH without gcloud or kubectl: a gcp stack's server cannot be tunnelled to."""
    (tmp_path / "empty-bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_a_deleted_vm_is_reported_not_an_error(tmp_path, no_credentials_needed, no_gcloud):
    with compute_api(None, {}) as compute:
        result = invoke("--stack-outputs", str(outputs_file(tmp_path)), "--compute-url", compute.url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"]["status"] == GONE and report["warnings"] == []
    assert report["server"]["error"].startswith("server not reachable: --stack: stack runs on GCP (tpu-serve-dev): "
                                                "reaching it needs gcloud on PATH")


def test_a_compute_api_refusal_is_one_line_and_exit_1(tmp_path, no_credentials_needed, no_gcloud):
    denied = Response(403, {"error": {"code": 403, "message": "Required 'compute.instances.get' permission"}})
    with FakeServer({("GET", VM_PATH): lambda r: denied}) as compute:
        result = invoke("--stack-outputs", str(outputs_file(tmp_path)), "--compute-url", compute.url)
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: Compute API: Compute API HTTP 403: Required 'compute.instances.get' "
                                     "permission")


def test_watching_survives_a_server_that_drops_out_and_comes_back():
    bodies = iter([Response(200, RECORDING), Response(200, LATER), Response(503, "restarting"),
                   Response(200, RECORDING), Response(200, LATER)])
    with FakeServer({("GET", "/metrics"): lambda r: next(bodies)}) as fake, requests.Session() as http:
        stream: Iterator = reports(Sources(http=http, root=fake.url), 5.0, watch=True, sleep=lambda s: None)
        seen = [next(stream) for _ in range(4)]
    assert seen[0].server.running == 3.0
    assert seen[1].server is None and seen[1].server_error == f"{fake.url}/metrics answered HTTP 503"
    assert seen[2].server is None and "answers again" in seen[2].server_error
    assert seen[3].server.first_tokens == 10.0


# --- every --stack path, with no --url: the endpoint comes from the stack's outputs ---------------------------

@pytest.fixture
def tunnels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gcloud and kubectl that tunnel to $FAKE_TUNNEL_TARGET (tests/fakes/fake_tunnel.py) first on PATH; their log."""
    fake_tunnel.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TUNNEL_LOG", str(tmp_path / "tunnel.log"))
    return tmp_path / "tunnel.log"


def tunnel_to(monkeypatch: pytest.MonkeyPatch, server: FakeServer) -> None:
    monkeypatch.setenv("FAKE_TUNNEL_TARGET", server.url.removeprefix("http://"))


def test_a_local_stack_is_read_at_its_endpoint(tmp_path):
    with metrics_server(RECORDING, LATER) as server:
        outputs = tmp_path / "outputs.json"
        outputs.write_text(json.dumps({"target": "local", "endpoint": f"{server.url}/v1", "model": "tiny-gemma4"}))
        result = invoke("--stack-outputs", str(outputs), "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"] is None and report["server"]["url"] == server.url and report["server"]["running"] == 3.0
    assert [r.path for r in server.requests] == ["/metrics", "/metrics"]  # /metrics only: it needs no API key


def test_a_stack_named_by_stack_is_read_through_the_pulumi_cli(tmp_path, monkeypatch):
    pulumi = fake_pulumi.install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(pulumi.home))
    with metrics_server(RECORDING, LATER) as server:
        (pulumi.home / "outputs.json").write_text(json.dumps({"target": "local", "endpoint": f"{server.url}/v1"}))
        result = invoke("--stack", "dev", "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["server"]["waiting"] == 2.0
    assert pulumi.calls() == [["stack", "output", "--json", "--stack", "dev", "--non-interactive"]]


def test_a_gcp_stack_shows_the_vm_and_the_server_through_an_iap_tunnel(tmp_path, no_credentials_needed, tunnels,
                                                                       monkeypatch):
    started = datetime.now(timezone.utc) - timedelta(hours=1)
    with compute_api(instance_body(started), ATTRIBUTES) as compute, metrics_server(RECORDING, LATER) as server:
        tunnel_to(monkeypatch, server)
        result = invoke("--stack-outputs", str(outputs_file(tmp_path, endpoint="http://10.150.0.7:8000/v1")),
                        "--compute-url", compute.url, "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"]["status"] == "RUNNING" and report["vm"]["boot_stage"] == "serving"
    assert report["server"]["running"] == 3.0 and report["server"]["url"].startswith("http://localhost:")
    [call] = tunnels.read_text().splitlines()
    port = report["server"]["url"].rsplit(":", 1)[1]
    assert call == (f"gcloud compute start-iap-tunnel tpu-serve-dev 8000 --local-host-port=localhost:{port} "
                    "--zone us-east5-b --project demo-project")
    assert [r.path for r in server.requests] == ["/metrics", "/metrics"]


def test_a_booting_gcp_stack_shows_the_vm_while_its_server_does_not_answer(tmp_path, no_credentials_needed,
                                                                           tunnels, monkeypatch):
    booting = {"stage": "pull-image", "config-hash": "7eeea49152716bcb"}
    with FakeServer() as gone:
        tunnel_to(monkeypatch, gone)  # closed once the block ends: the tunnel's far end refuses
    with compute_api(instance_body(datetime.now(timezone.utc)), booting) as compute:
        result = invoke("--stack-outputs", str(outputs_file(tmp_path, endpoint="http://10.150.0.7:8000/v1")),
                        "--compute-url", compute.url, "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"]["boot_stage"] == "pull-image"
    assert report["server"]["error"].startswith("cannot reach http://localhost:")  # the tunnel's far end is gone


def test_a_gke_stack_is_read_through_a_port_forward(tmp_path, tunnels, monkeypatch):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({
        "target": "gke", "project": "demo-project", "cluster": "tpu-serve-gke", "clusterLocation": "us-east5",
        "namespace": "tpu-serve", "service": "vllm", "port": 8000,
        "endpoint": "http://vllm.tpu-serve.svc.cluster.local:8000/v1", "model": "google/gemma-4-E2B-it"}))
    with metrics_server(RECORDING, LATER) as server:
        tunnel_to(monkeypatch, server)
        result = invoke("--stack-outputs", str(outputs), "--json", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vm"] is None and report["server"]["first_tokens"] == 10.0
    credentials, forward = tunnels.read_text().splitlines()
    port = report["server"]["url"].rsplit(":", 1)[1]
    assert credentials == ("gcloud container clusters get-credentials tpu-serve-gke --location us-east5 --project "
                           "demo-project")
    assert forward == (f"kubectl port-forward --namespace tpu-serve --address 127.0.0.1 service/vllm {port}:8000")


def test_a_stack_of_an_unknown_target_is_one_line_and_exit_1(tmp_path):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"target": "tpu-vm", "endpoint": "http://127.0.0.1:9/v1"}))
    result = invoke("--stack-outputs", str(outputs))
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: --stack: stack outputs have target 'tpu-vm'; expected gcp, gke or local "
                                     "(redeploy the stack with this version of tpu-serve)")
