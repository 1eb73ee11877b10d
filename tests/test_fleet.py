"""`tpuserve fleet` through its real code path: the fake `pulumi` first on PATH (tests/fake_pulumi.py) holds one stack
per replica plus the router stack, each `up` of a replica gets a VM only while its zone has room (capacity.json, the
provider's stockout text otherwise), and makes the stack's Cloud Routers and NATs in the stateful fake cloud
(tests/fake_cloud.py), which also answers preflight, holds the fleet's bucket and its lease (Cloud Storage with
generation preconditions) and refuses a second all-subnetworks NAT in a region. Its Compute API answers for the
fleet's VMs (which the fake pulumi keeps in its files) with the Instance shape (`creationTimestamp`,
`lastStartTimestamp`, `scheduling.maxRunDuration` as a Duration whose int64 seconds are a JSON string) and guest
attributes. Time is a fake clock; a replica's /metrics (for the drain) is a fake serving vLLM's gauge lines."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from tests.fake_cloud import PROJECT, FakeCloud
from tests.fake_pulumi import FakePulumi, install
from tests.httpfake import FakeServer, Request, Response
from tpuserve.deploy import gce
from tpuserve.ops import fleet as fleet_module

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
PACIFIC = timezone(timedelta(hours=-8))
MAX_RUN_S = 4 * 3600
ZONES = ("europe-west4-a", "us-east1-d", "us-central1-b")
# vLLM 0.32's /metrics lines for the two gauges (prometheus_client exposition: HELP, TYPE, labelled samples).
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="google/gemma-4-E2B-it"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="google/gemma-4-E2B-it"}} {waiting}
"""


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class FleetCompute:
    """The Compute API for the fleet's VMs: each exists while its fake stack's outputs name it in that zone, started
    when first seen (or at `started[stack]`), serving its config."""

    def __init__(self, pulumi: FakePulumi, clock: Clock):
        self.pulumi, self.clock = pulumi, clock
        self.started: dict[str, datetime] = {}
        # The router's agent answers for every replica it routes to (vm/router_agent.py `answered`): "ok" unless
        # set here.
        self.router_answers: dict[str, str] = {}

    def exists(self, stack: str, zone: str) -> bool:
        outputs = self.pulumi.outputs(stack)
        return outputs.get("zone") == zone and outputs.get("instanceName") == f"tpu-serve-{stack}"

    def instance(self, stack: str, zone: str) -> Any:
        def serve(request: Request) -> Response:
            if not self.exists(stack, zone):
                return Response(404, {"error": {"code": 404, "message": f"The resource 'projects/{PROJECT}/zones/"
                                      f"{zone}/instances/tpu-serve-{stack}' was not found", "status": "NOT_FOUND"}})
            started = self.started.setdefault(stack, self.clock.now).astimezone(PACIFIC)
            stamp = started.isoformat(timespec="milliseconds")
            return Response(200, {"kind": "compute#instance", "name": f"tpu-serve-{stack}", "status": "RUNNING",
                                  "creationTimestamp": stamp, "lastStartTimestamp": stamp,
                                  "scheduling": {"provisioningModel": "FLEX_START", "automaticRestart": False,
                                                 "onHostMaintenance": "TERMINATE",
                                                 "instanceTerminationAction": "DELETE",
                                                 "maxRunDuration": {"seconds": str(MAX_RUN_S)}}})
        return serve

    def attributes(self, stack: str, zone: str) -> Any:
        def serve(request: Request) -> Response:
            if not self.exists(stack, zone):
                return Response(404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})
            items = [{"namespace": "tpu-serve", "key": "stage", "value": "serving"},
                     {"namespace": "tpu-serve", "key": "config-hash", "value": "c0ffee"}]
            if stack.endswith("-router"):
                routed = self.pulumi.outputs(stack).get("replicas") or []
                items.append({"namespace": "tpu-serve", "key": "answered", "value": json.dumps({
                    "config": "c0ffee", "deployments": {r: self.router_answers.get(r, "ok") for r in routed}})})
            return Response(200, {"kind": "compute#guestAttributes", "queryPath": "tpu-serve/",
                                  "queryValue": {"items": items}})
        return serve

    def install(self, cloud: FakeCloud) -> None:
        for stack in [f"dev-r{n}" for n in range(1, 10)] + ["dev-router"]:
            for zone in ZONES:
                base = f"/compute/v1/projects/{PROJECT}/zones/{zone}/instances/tpu-serve-{stack}"
                cloud.route("GET", base, self.instance(stack, zone))
                cloud.route("GET", f"{base}/getGuestAttributes", self.attributes(stack, zone))


@pytest.fixture
def cloud(fake_cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> FakeCloud:
    """The fake project: the token secret preflight checks, and the fake pulumi making its NATs here."""
    assert fake_cloud.api("POST", f"/v1/projects/{PROJECT}/secrets", {"replication": {"automatic": {}}},
                          {"secretId": "hf-token"})[0] == 200
    assert fake_cloud.api("POST", f"/v1/projects/{PROJECT}/secrets/hf-token:addVersion",
                          {"payload": {"data": "aGZfdG9rZW4="}})[0] == 200
    monkeypatch.setenv("FAKE_CLOUD_URL", fake_cloud.url)
    return fake_cloud


@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cloud: FakeCloud) -> FakePulumi:
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    monkeypatch.setattr(gce, "adc_session", requests.Session)  # the fakes need no credentials
    fake.set_config(project=PROJECT, zone="europe-west4-a", zones=list(ZONES), hfTokenSecretId="hf-token",
                    routerMasterKeySecretId="litellm-master-key")
    return fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> Iterator[dict[str, Any]]:
    """A replica's /metrics: its in-flight counts drop by one per scrape; each scrape records how many pulumi calls
    had been made by then."""
    state: dict[str, Any] = {"left": [2, 1, 0], "seen_at": [], "pulumi": None}

    def serve(request: Request) -> Response:
        running = state["left"].pop(0) if len(state["left"]) > 1 else state["left"][0]
        state["seen_at"].append(len(state["pulumi"].calls()) if state["pulumi"] else 0)
        return Response(200, METRICS.format(running=float(running), waiting=0.0))

    with FakeServer({("GET", "/metrics"): serve}) as server:
        state["url"] = server.url
        yield state


@pytest.fixture
def run(pulumi: FakePulumi, cloud: FakeCloud, clock: Clock, metrics: dict[str, Any], monkeypatch: pytest.MonkeyPatch):
    """Invoke `tpuserve fleet ...` with the fakes: the fleet's clock, drain endpoint and sleep are swapped in."""
    compute = FleetCompute(pulumi, clock)
    compute.install(cloud)
    metrics["pulumi"] = pulumi
    opened = fleet_module.open_fleet

    def open_with_fakes(*args: Any, **kwargs: Any) -> fleet_module.Session:
        session = opened(*args, **kwargs)
        session.fleet.now = clock
        session.fleet.sleep = lambda seconds: None
        session.fleet.reach = lambda outputs: contextlib.nullcontext(f"{metrics['url']}/v1")
        return session

    monkeypatch.setattr(fleet_module, "open_fleet", open_with_fakes)

    def invoke(*args: str) -> tuple[int, dict[str, Any], str]:
        result = CliRunner().invoke(fleet_module.fleet, [*args, "--stack", "dev", "--json",
                                                         *cloud.endpoint_options()])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        lines = result.stdout.strip().splitlines()
        return result.exit_code, json.loads(lines[-1]) if lines else {}, result.stderr

    invoke.compute = compute  # type: ignore[attr-defined]
    return invoke


def router_replicas(pulumi: FakePulumi) -> list[str]:
    return json.loads(pulumi.stack_config("dev-router")["tpu-serve:routerReplicas"]["value"])


def configured(call: list[str], key: str) -> str | None:
    """The value a pulumi call saves for `key` with `--config key=value`; None if it sets no such key."""
    pairs = [call[index + 1] for index, arg in enumerate(call[:-1]) if arg == "--config"]
    return next((pair.split("=", 1)[1] for pair in pairs if pair.split("=", 1)[0] == key), None)


def test_up_places_replicas_across_zones_and_routes_to_them(pulumi: FakePulumi, run) -> None:
    """Each new replica tries the zones holding the fewest replicas first: three replicas land in three zones
    without a failed attempt. The router stack comes first (with no replica), then grows one replica at a time,
    each after its gate; replicas leave Cloud NAT to the router stack."""
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1, "us-central1-b": 1})
    code, verdict, stderr = run("up", "--replicas", "3")

    assert code == 0, stderr
    assert [(p["replica"], p["zone"]) for p in verdict["placed"]] == [
        ("dev-r1", "europe-west4-a"), ("dev-r2", "us-east1-d"), ("dev-r3", "us-central1-b")]
    assert all(len(p["attempts"]) == 1 for p in verdict["placed"])
    assert verdict["serving"] == ["dev-r1", "dev-r2", "dev-r3"]
    assert pulumi.stacks() == ["dev-r1", "dev-r2", "dev-r3", "dev-router"]
    assert [entry.split("=")[0] for entry in router_replicas(pulumi)] == ["dev-r1", "dev-r2", "dev-r3"]
    assert router_replicas(pulumi)[0] == f"dev-r1={pulumi.outputs('dev-r1')['endpoint']}"
    assert pulumi.stack_config("dev-router")["tpu-serve:target"]["value"] == "router"
    for replica in ("dev-r1", "dev-r2", "dev-r3"):
        config = pulumi.stack_config(replica)
        assert config["tpu-serve:createCloudNat"]["value"] == "false"
        assert config["tpu-serve:hfTokenSecretId"]["value"] == "hf-token"  # copied from the fleet's stack
    assert [(e["event"], e["replica"]) for e in verdict["events"]] == [
        ("created", "dev-r1"), ("gated", "dev-r1"), ("added", "dev-r1"),
        ("created", "dev-r2"), ("gated", "dev-r2"), ("added", "dev-r2"),
        ("created", "dev-r3"), ("gated", "dev-r3"), ("added", "dev-r3")]
    # The router's updates, in order: created empty, then one replica more each time.
    router_sets = [json.loads(entries) for call in pulumi.calls()
                   if (entries := configured(call, "routerReplicas")) is not None]
    assert [[entry.split("=")[0] for entry in s] for s in router_sets] == [
        [], ["dev-r1"], ["dev-r1", "dev-r2"], ["dev-r1", "dev-r2", "dev-r3"]]
    # Each update saves the config it needs itself (`pulumi up --config`): the router's target and replicas, a
    # replica's zone, its Cloud NAT and its fleet (whose firewall tag it carries).
    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert ups[0] == ["up", "--yes", "--skip-preview", "--refresh", "--config", "target=router", "--config",
                      "routerReplicas=[]", "--config", "cloudNatSkipRegions=[]", "--stack", "dev-router",
                      "--non-interactive"]
    assert ups[1] == ["up", "--yes", "--skip-preview", "--refresh", "--config", "createCloudNat=false", "--config",
                      "fleet=dev", "--config", "zone=europe-west4-a", "--stack", "dev-r1", "--non-interactive"]
    assert "3 of 3 replica(s) serve behind dev-router" in stderr


def test_a_zone_without_capacity_fails_over_for_each_replica(pulumi: FakePulumi, run) -> None:
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 0})
    code, verdict, stderr = run("up", "--replicas", "2", "--zones", "us-east1-d,europe-west4-a")

    assert code == 0, stderr
    assert [[(a["zone"], a["class"]) for a in p["attempts"]] for p in verdict["placed"]] == [
        [("us-east1-d", "capacity"), ("europe-west4-a", "created")],
        [("us-east1-d", "capacity"), ("europe-west4-a", "created")]]
    assert pulumi.outputs("dev-r2")["zone"] == "europe-west4-a"
    assert "dev-r1 attempt 1: us-east1-d" in stderr and "does not have enough resources" in stderr


def test_a_replica_that_never_finds_capacity_leaves_the_others_serving(pulumi: FakePulumi, run) -> None:
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1, "us-central1-b": 0})
    code, verdict, stderr = run("up", "--replicas", "3")

    assert code == 3
    assert verdict["serving"] == ["dev-r1", "dev-r2"]
    assert [[a["class"] for a in f["attempts"]] for f in verdict["failures"]] == [["capacity"] * 3]
    assert pulumi.stacks() == ["dev-r1", "dev-r2", "dev-router"]  # dev-r3 destroyed and removed, nothing half-made
    assert ["destroy"] in [[w for w in call if not w.startswith("-") and w != "dev-r3"] for call in pulumi.calls()
                           if "dev-r3" in call]
    assert [entry.split("=")[0] for entry in router_replicas(pulumi)] == ["dev-r1", "dev-r2"]
    assert "2 of 3 replica(s) serve behind dev-router" in stderr
    assert "found no capacity" in stderr

    # Later, with room again, `fleet up` adds only what is missing.
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1, "us-central1-b": 1})
    code, verdict, stderr = run("up", "--replicas", "3")
    assert code == 0 and [(p["replica"], p["zone"]) for p in verdict["placed"]] == [("dev-r3", "us-central1-b")]


def test_renew_replaces_a_replica_40_minutes_from_deletion_in_order(pulumi: FakePulumi, run, clock: Clock,
                                                                   metrics: dict[str, Any]) -> None:
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    # dev-r1 started 3 h 20 min ago: with a 4 h max run it is deleted in 40 minutes; dev-r2 has 3 h 30 min left.
    run.compute.started["dev-r1"] = NOW - timedelta(hours=3, minutes=20)
    run.compute.started["dev-r2"] = NOW - timedelta(minutes=30)
    calls_before = len(pulumi.calls())

    code, verdict, stderr = run("renew")

    assert code == 0, stderr
    assert [(e["event"], e["replica"]) for e in verdict["events"]] == [
        ("created", "dev-r3"), ("gated", "dev-r3"), ("added", "dev-r3"), ("answered", "dev-r3"),
        ("drained", "dev-r1"), ("destroyed", "dev-r1")]
    assert verdict["renewed"] == [{"replica": "dev-r1", "successor": "dev-r3", "zone": "europe-west4-a"}]
    assert "dev-r1 (europe-west4-a) is deleted at 09:40 UTC, in 40 min: renewing it" in stderr
    assert verdict["events"][3]["detail"] == "answered a completion through the router"
    assert "no request in flight" in verdict["events"][4]["detail"]
    assert pulumi.stacks() == ["dev-r2", "dev-r3", "dev-router"]

    # The pulumi calls of the renewal, in order: the successor's up, the router with both, the router without the
    # old one, then the old one's destroy and removal.
    steps = []
    for call in pulumi.calls()[calls_before:]:
        stack = call[call.index("--stack") + 1] if "--stack" in call else None
        if (entries := configured(call, "routerReplicas")) is not None:
            steps.append("route " + ",".join(entry.split("=")[0] for entry in json.loads(entries)))
        if call[0] == "up":
            steps.append(f"up {stack}")
        elif call[0] in ("destroy",) or call[:2] == ["stack", "rm"]:
            steps.append(f"{' '.join(call[:2]) if call[0] == 'stack' else call[0]} {stack}")
    # (us-central1-b, which holds no replica, is tried first and has no room; europe-west4-a has.)
    assert steps == ["up dev-r3", "up dev-r3", "route dev-r1,dev-r2,dev-r3", "up dev-router", "route dev-r2,dev-r3",
                     "up dev-router", "destroy dev-r1", "stack rm dev-r1"]  # the successor joins before dev-r1 leaves

    # The drain scraped /metrics after the router dropped dev-r1 and before dev-r1 was destroyed, until 0.
    calls = pulumi.calls()
    last_route = max(i for i, call in enumerate(calls) if configured(call, "routerReplicas") is not None)
    destroy = next(i for i, call in enumerate(calls) if call[0] == "destroy")
    assert len(metrics["seen_at"]) == 3
    assert all(last_route < seen <= destroy for seen in metrics["seen_at"])


def test_renew_keeps_the_old_replica_when_the_successor_does_not_answer_through_the_router(
        pulumi: FakePulumi, run, clock: Clock) -> None:
    """The successor passed its own gate, but the router's pinned completion to it failed (a wrong key, a firewall
    in the way): it leaves the router and is destroyed, the old replica stays routed and serving, exit 1."""
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    run.compute.started["dev-r1"] = NOW - timedelta(hours=3, minutes=20)
    run.compute.started["dev-r2"] = NOW - timedelta(minutes=30)
    run.compute.router_answers["dev-r3"] = "HTTP 401: Unauthorized"

    code, verdict, stderr = run("renew")

    assert code == 1, stderr
    assert [(e["event"], e["replica"]) for e in verdict["events"]] == [
        ("created", "dev-r3"), ("gated", "dev-r3"), ("added", "dev-r3"), ("drained", "dev-r3"),
        ("destroyed", "dev-r3")]
    assert verdict["renewed"] == [] and verdict["kept"][0]["replica"] == "dev-r1"
    assert "dev-r3 did not answer through the router (HTTP 401: Unauthorized)" in stderr
    assert pulumi.stacks() == ["dev-r1", "dev-r2", "dev-router"]
    assert [entry.split("=")[0] for entry in router_replicas(pulumi)] == ["dev-r1", "dev-r2"]
    assert not any(call[0] == "destroy" and "dev-r1" in call for call in pulumi.calls())


def test_renew_without_capacity_keeps_the_old_replica_and_says_so(pulumi: FakePulumi, run, clock: Clock) -> None:
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    run.compute.started["dev-r1"] = NOW - timedelta(hours=3, minutes=20)
    run.compute.started["dev-r2"] = NOW - timedelta(hours=1)

    code, verdict, stderr = run("renew")

    assert code == 3
    assert verdict["renewed"] == []
    assert [(k["replica"], k["expiry"]) for k in verdict["kept"]] == [("dev-r1", "2026-11-30T09:40:00+00:00")]
    assert ("dev-r1 keeps serving until its deletion (deleted at 09:40 UTC, in 40 min): no successor (no capacity "
            "in any zone tried)") in stderr
    assert pulumi.stacks() == ["dev-r1", "dev-r2", "dev-router"]  # the successor's stack is gone again
    assert [entry.split("=")[0] for entry in router_replicas(pulumi)] == ["dev-r1", "dev-r2"]
    assert not any(call[0] == "destroy" and "dev-r1" in call for call in pulumi.calls())


def test_renew_with_nothing_due_changes_nothing(pulumi: FakePulumi, run) -> None:
    pulumi.capacity({"europe-west4-a": 1})
    assert run("up", "--replicas", "1")[0] == 0
    run.compute.started["dev-r1"] = NOW - timedelta(hours=2)
    calls_before = len(pulumi.calls())
    code, verdict, stderr = run("renew")
    assert code == 0 and verdict["events"] == []
    assert "nothing to renew: the next deletion is dev-r1's at 11:00 UTC (in 2 h 00 min" in stderr
    assert not any(call[0] in ("up", "destroy") for call in pulumi.calls()[calls_before:])


def test_status_lists_every_replica_and_the_router(pulumi: FakePulumi, run) -> None:
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    run.compute.started["dev-r1"] = NOW - timedelta(hours=3)
    code, verdict, stderr = run("status")
    assert code == 0
    assert [(r["replica"], r["zone"], r["stage"], r["inRouter"], r["secondsToExpiry"]) for r in verdict["replicas"]] \
        == [("dev-r1", "europe-west4-a", "serving", True, 3600), ("dev-r2", "us-east1-d", "serving", True, 14400)]
    assert verdict["router"]["replicas"] == ["dev-r1", "dev-r2"]
    assert verdict["router"]["stage"] == "serving"  # the config hash it reports is its stack's routerConfigHash
    # Load comes from each replica's /metrics (the fake's running count drops by one per scrape).
    assert [r["load"] for r in verdict["replicas"]] == [
        {"running": 2.0, "waiting": 0.0, "kvCacheUsage": None}, {"running": 1.0, "waiting": 0.0, "kvCacheUsage": None}]


def test_status_says_load_unknown_when_metrics_cannot_be_read(pulumi: FakePulumi, run, monkeypatch) -> None:
    pulumi.capacity({"europe-west4-a": 1})
    assert run("up", "--replicas", "1")[0] == 0

    opened = fleet_module.open_fleet

    def refusing(*args, **kwargs):
        session = opened(*args, **kwargs)

        def reach(outputs):
            raise fleet_module.TunnelError("gcloud start-iap-tunnel exited 1")
        session.fleet.reach = reach
        return session

    monkeypatch.setattr(fleet_module, "open_fleet", refusing)
    code, verdict, _ = run("status")
    assert code == 0 and [r["load"] for r in verdict["replicas"]] == [None]


def test_bad_usage_is_one_line_and_exit_2(pulumi: FakePulumi, run) -> None:
    pulumi.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token")
    code, _, stderr = run("up", "--replicas", "2")
    assert code == 2 and "routerMasterKeySecretId: not set in stack dev" in stderr and "Traceback" not in stderr
    assert pulumi.stacks() == []
    result = CliRunner().invoke(fleet_module.fleet, ["up", "--stack", "dev", "--replicas", "0"])
    assert result.exit_code == 2 and "--replicas" in result.output
    pulumi.set_config(project=PROJECT, zone="europe-west4-a", zones=list(ZONES), hfTokenSecretId="hf-token",
                      routerMasterKeySecretId="litellm-master-key")
    code, _, stderr = run("up", "--replicas", "1", "--zones", "us-west4-a,europe-west4-a")
    assert code == 2 and "--zones: us-west4-a is outside the regions the fleet's router gives Cloud NAT" in stderr
    assert pulumi.stacks() == []  # refused before anything was created


@pytest.mark.parametrize("instance, expected", [
    ({"creationTimestamp": "2026-11-29T01:58:00.000-08:00", "scheduling": {"maxRunDuration": {"seconds": "14400"}}},
     "2026-11-29T13:58:00+00:00"),
    ({"creationTimestamp": "2026-11-29T01:58:00.000-08:00", "lastStartTimestamp": "2026-11-29T02:10:30.000-08:00",
      "scheduling": {"maxRunDuration": {"seconds": "600"}}}, "2026-11-29T10:20:30+00:00"),
    ({"creationTimestamp": "2026-11-29T01:58:00.000-08:00",
      "scheduling": {"terminationTime": "2026-11-29T12:00:00Z", "maxRunDuration": {"seconds": "14400"}}},
     "2026-11-29T12:00:00+00:00"),
    ({"creationTimestamp": "2026-11-29T01:58:00.000-08:00", "scheduling": {}}, None),
])
def test_the_deletion_time_comes_from_the_instance(instance, expected) -> None:
    expiry = fleet_module.instance_expiry(instance)
    assert (expiry.astimezone(timezone.utc).isoformat() if expiry else None) == expected


def test_in_flight_sums_running_and_waiting_and_knows_when_it_does_not_know() -> None:
    assert fleet_module.in_flight(METRICS.format(running=3.0, waiting=2.0)) == 5.0
    assert fleet_module.in_flight("not prometheus {{{") is None
    # The real CPU vLLM 0.32 scrape the status tests use: an idle server, KV cache gauge present.
    recording = (Path(__file__).resolve().parent / "data" / "vllm-0.32.0-metrics.prom").read_text()
    assert fleet_module.read_load(recording) == fleet_module.Load(0.0, 0.0, 0.0)
    assert fleet_module.in_flight(METRICS.format(running=0.0, waiting=0.0)) == 0.0
    assert fleet_module.in_flight("# HELP something\nprocess_cpu_seconds_total 12.5\n") is None


def test_status_asks_pulumi_each_thing_once(pulumi: FakePulumi, run) -> None:
    """Every pulumi call starts the CLI (≈ 1 s against a cloud backend): status lists the stacks once and reads each
    stack's outputs once, however often the fleet consults them."""
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    before = len(pulumi.calls())
    assert run("status")[0] == 0
    asked = [" ".join(call[:2]) + (f" {call[call.index('--stack') + 1]}" if "--stack" in call else "")
             for call in pulumi.calls()[before:]]
    assert sorted(a for a in asked if a.startswith(("stack ls", "stack output"))) == [
        "stack ls", "stack output dev-r1", "stack output dev-r2", "stack output dev-router"]
