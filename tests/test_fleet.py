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
import os
import subprocess
import sys
import threading
import time
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
from tests.test_nat import make_router, token_secret
from tpuserve.deploy import gce
from tpuserve.deploy.cache import BucketSpec, ensure_bucket
from tpuserve.deploy.gcs import Buckets
from tpuserve.deploy.lease import Holder, Lease, LeaseStore
from tpuserve.observe.gate import SERVING
from tpuserve.ops import fleet as fleet_module
from tpuserve.ops import up as up_module

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
        self.gone: set[str] = set()  # stacks whose VM flex-start deleted

    def exists(self, stack: str, zone: str) -> bool:
        outputs = self.pulumi.outputs(stack)
        return outputs.get("zone") == zone and outputs.get("instanceName") == f"tpu-serve-{stack}" and \
            stack not in self.gone

    def instance(self, stack: str, zone: str) -> Any:
        def serve(request: Request) -> Response:
            if not self.exists(stack, zone):
                return Response(404, {"error": {"code": 404, "message": f"The resource 'projects/{PROJECT}/zones/"
                                      f"{zone}/instances/tpu-serve-{stack}' was not found", "status": "NOT_FOUND"}})
            started = self.started.setdefault(stack, self.clock.now).astimezone(PACIFIC)
            stamp = started.isoformat(timespec="milliseconds")
            # The stack's own maxRunDuration (a staggered one), else the fleet's.
            configured = self.pulumi.stack_config(stack).get("tpu-serve:maxRunDuration", {}).get("value")
            max_run = fleet_module.run_seconds(configured) if configured else MAX_RUN_S
            return Response(200, {"kind": "compute#instance", "name": f"tpu-serve-{stack}", "status": "RUNNING",
                                  "creationTimestamp": stamp, "lastStartTimestamp": stamp,
                                  "scheduling": {"provisioningModel": "FLEX_START", "automaticRestart": False,
                                                 "onHostMaintenance": "TERMINATE",
                                                 "instanceTerminationAction": "DELETE",
                                                 "maxRunDuration": {"seconds": str(max_run)}}})
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
    token_secret(fake_cloud)
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
    # replica's zone, its Cloud NAT, its fleet (whose firewall tag it carries) and the fleet's caches it uses (the
    # fleet's bucket and a disk of the fleet's pool in that zone).
    ups = [call for call in pulumi.calls() if call[0] == "up"]
    assert ups[0] == ["up", "--yes", "--skip-preview", "--refresh", "--config", "target=router", "--config",
                      "routerReplicas=[]", "--config", "cloudNatSkipRegions=[]", "--stack", "dev-router",
                      "--non-interactive"]
    assert ups[1] == ["up", "--yes", "--skip-preview", "--refresh", "--config", "createCloudNat=false", "--config",
                      "fleet=dev", "--config", "cacheOwner=dev", "--config", "cacheDiskName=tpu-serve-dev-cache-1",
                      "--config", "zone=europe-west4-a", "--stack", "dev-r1", "--non-interactive"]
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
    # dev-r2, placed right after dev-r1, got half the max run (2 h: staggered), so the two are never deleted together.
    assert [(r["replica"], r["zone"], r["stage"], r["inRouter"], r["secondsToExpiry"], r["maxRunSeconds"])
            for r in verdict["replicas"]] == [("dev-r1", "europe-west4-a", "serving", True, 3600, 14400),
                                              ("dev-r2", "us-east1-d", "serving", True, 7200, 7200)]
    assert (verdict["stagger"]["minGapSeconds"], verdict["stagger"]["targetGapSeconds"]) == (3600, 7200)
    assert verdict["lease"] is None  # no fleet command runs now
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


@pytest.mark.parametrize("args, message", [
    (["--lead", "0"], "Invalid value for --lead: must be longer than zero"),
    (["--lead", "soon"], "Invalid value for --lead: 'soon' is not a duration like 90m, 2h or 1h30m"),
    (["--deadline", "0"], "Invalid value for --deadline: must be longer than zero"),
    (["--lease-wait", "soon"], "Invalid value for --lease-wait: 'soon' is not a duration like 90m, 2h or 1h30m"),
])
def test_a_bad_duration_names_its_own_option(args: list[str], message: str) -> None:
    result = CliRunner().invoke(fleet_module.fleet, ["renew", "--stack", "dev", *args])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == f"Error: {message}"


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


# --- several replicas due at once: renewed in parallel, the router updated from one thread -------------------------

def router_sets(pulumi: FakePulumi, since: int = 0) -> list[list[str]]:
    """The replica set of each router update, in order."""
    return [[entry.split("=")[0] for entry in json.loads(entries)] for call in pulumi.calls()[since:]
            if (entries := configured(call, "routerReplicas")) is not None]


def max_run(pulumi: FakePulumi, stack: str) -> str | None:
    return pulumi.stack_config(stack).get("tpu-serve:maxRunDuration", {}).get("value")


def make_due(run, pulumi: FakePulumi, stacks: list[str], left: timedelta = timedelta(minutes=40)) -> None:
    """Each of `stacks` started one max run (its own) minus `left` ago."""
    for stack in stacks:
        seconds = fleet_module.run_seconds(max_run(pulumi, stack) or "4h")
        run.compute.started[stack] = NOW - timedelta(seconds=seconds) + left


@pytest.mark.parametrize("start, others, replicas, expected", [
    (NOW, [], 3, 4 * 3600),  # nobody else: the full run
    (NOW, [NOW + timedelta(hours=4)], 2, 2 * 3600),  # opposite the other on the 4 h cycle
    (NOW, [NOW + timedelta(hours=1)], 2, 3 * 3600),  # the full run ends 1 h from it cyclically; 3 h: the target 2 h
    (NOW, [NOW + timedelta(hours=2)], 2, 4 * 3600),  # the full run is the target 2 h from it already
    (NOW, [NOW + timedelta(hours=4)], 8, 4 * 3600 - 30 * 60),  # never cut more than max run / replicas
])
def test_the_staggered_run_falls_between_the_other_deletions(start, others, replicas, expected) -> None:
    assert fleet_module.staggered_run(start, others, 4 * 3600, replicas, 45 * 60) == expected


def test_stagger_never_cuts_below_twice_the_lead_or_flex_starts_minimum() -> None:
    # 1 h runs with a 45 min lead: any cut would renew the replica at once.
    assert fleet_module.staggered_run(NOW, [NOW + timedelta(hours=1)], 3600, 2, 45 * 60) == 3600
    assert fleet_module.run_text(9600) == "2h40m" and fleet_module.run_seconds("1d12h") == 129600
    assert fleet_module.run_seconds("4 hours") is None


def test_three_replicas_due_together_are_renewed_in_parallel(pulumi: FakePulumi, run) -> None:
    """Three replicas placed one after another would be deleted within minutes of each other (and renewed, and lost
    to a stockout, together): each new one's max run is cut, by at most max run / 3, to fall between the others'
    deletions, and `fleet status` says how far apart they are against the target.

    When they are due together anyway: three successors in flight at once (the fake's barrier lets none of their
    `pulumi up`s finish until all three run, so a sequential renewal would fail), each gated; every successor serves
    in the router before its predecessor leaves, no old replica is destroyed while routed, and the router took at most
    four updates (six, one add and one removal per replica, before). Successors placed together get staggered runs
    again."""
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 2, "us-central1-b": 2})
    code, _, stderr = run("up", "--replicas", "3")
    assert code == 0, stderr
    assert [max_run(pulumi, s) for s in ("dev-r1", "dev-r2", "dev-r3")] == [None, "2h40m", "3h20m"]
    assert "dev-r2: max run 2h40m (not 4h), so that its deletion falls between the other replicas'" in stderr
    code, verdict, stderr = run("status")
    assert [r["secondsToExpiry"] for r in verdict["replicas"]] == [4 * 3600, 2 * 3600 + 40 * 60, 3 * 3600 + 20 * 60]
    assert verdict["stagger"]["minGapSeconds"] == 40 * 60 and verdict["stagger"]["targetGapSeconds"] == 80 * 60
    assert verdict["stagger"]["line"].startswith(
        "deletions at least 40 min apart (target 1 h 20 min: maxRunDuration 4h / 3 replicas")

    make_due(run, pulumi, ["dev-r1", "dev-r2", "dev-r3"])
    pulumi.barrier(["dev-r4", "dev-r5", "dev-r6"], count=3)
    before = len(pulumi.calls())

    code, verdict, stderr = run("renew", "--parallel", "3")

    assert code == 0, stderr
    assert sorted((r["replica"], r["successor"]) for r in verdict["renewed"]) == [
        ("dev-r1", "dev-r4"), ("dev-r2", "dev-r5"), ("dev-r3", "dev-r6")]
    assert pulumi.stacks() == ["dev-r4", "dev-r5", "dev-r6", "dev-router"]
    sets = router_sets(pulumi, before)
    assert 2 <= len(sets) <= 4 and sets[-1] == ["dev-r4", "dev-r5", "dev-r6"]
    calls = pulumi.calls()[before:]
    routes = [i for i, call in enumerate(calls) if configured(call, "routerReplicas") is not None]
    for old, new in (("dev-r1", "dev-r4"), ("dev-r2", "dev-r5"), ("dev-r3", "dev-r6")):
        joined = next(n for n, members in enumerate(sets) if new in members)
        left = next(n for n, members in enumerate(sets) if old not in members)
        assert joined < left, (old, new, sets)  # in before the predecessor is out
        destroyed = next(i for i, call in enumerate(calls) if call[0] == "destroy" and old in call)
        assert destroyed > routes[left]  # destroyed only once no router update routes to it
    assert sorted(max_run(pulumi, s) or "4h" for s in ("dev-r4", "dev-r5", "dev-r6")) == ["2h40m", "3h20m", "4h"]


class ScriptedFleet(fleet_module.Fleet):
    """A fleet whose placements, router updates and destroys the test scripts: dev-r4 is ready at once, dev-r5 and
    dev-r6 once the first router update has started; that update returns only when both are ready."""

    def __init__(self, renewal_box: list) -> None:
        super().__init__("dev", None, None, PROJECT)  # type: ignore[arg-type]
        self.now = lambda: NOW
        self.box, self.routes, self.retired, self.release = renewal_box, [], [], threading.Event()

    def grow(self, name, zones, deadline_s, settings=None, retry_until_up=False):
        if name != "dev-r4":
            assert self.release.wait(10)
        return fleet_module.Replica(name, {"zone": "us-east1-d"}, SERVING), fleet_module.SweepResult("us-east1-d"), ""

    def route(self, members) -> None:
        self.routes.append(list(members))
        if len(self.routes) == 1:
            self.release.set()
            deadline = time.monotonic() + 10
            while self.box[0].results.qsize() < 2:  # both placements have ended: the next update takes them
                assert time.monotonic() < deadline
                time.sleep(0.005)

    def drain(self, replica) -> str:
        return "no request in flight"

    def answered(self, name: str) -> tuple[bool, str]:
        return True, "answered a completion through the router"

    def retire(self, name: str) -> bool:
        self.retired.append((name, len(self.routes)))
        return True


def test_ready_changes_go_into_one_router_update() -> None:
    """The router stack takes one update at a time: successors that became ready while an update ran join together
    in the next one, which also takes out the predecessor of the successor the first update added."""
    box: list = []
    fleet_ = ScriptedFleet(box)
    olds = [fleet_module.Replica(f"dev-r{n}", {"zone": "europe-west4-a"}, SERVING, NOW + timedelta(minutes=30),
                                 in_router=True) for n in (1, 2, 3)]
    renewal = fleet_module.Renewal(fleet_, [r.name for r in olds], list(olds), list(ZONES), 600.0, time.monotonic())
    box.append(renewal)
    renewal.run(renewal.plan(olds, []))
    assert fleet_.routes == [["dev-r1", "dev-r2", "dev-r3", "dev-r4"],
                             ["dev-r2", "dev-r3", "dev-r4", "dev-r5", "dev-r6"],
                             ["dev-r4", "dev-r5", "dev-r6"]]
    assert sorted(fleet_.retired) == [("dev-r1", 2), ("dev-r2", 3), ("dev-r3", 3)]
    assert renewal.code == 0 and len(renewal.renewed) == 3


def test_a_replica_already_gone_leaves_the_router_in_the_first_update(pulumi: FakePulumi, run) -> None:
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 2})
    assert run("up", "--replicas", "2")[0] == 0
    run.compute.gone.add("dev-r1")  # flex-start deleted its VM: the API answers 404
    before = len(pulumi.calls())
    code, verdict, stderr = run("renew")
    assert code == 0, stderr
    assert router_sets(pulumi, before)[0] == ["dev-r2"]  # out at once: nothing serves there
    assert verdict["renewed"] == [{"replica": "dev-r1", "successor": "dev-r3", "zone": "europe-west4-a"}]


# --- the lease: one fleet command at a time -------------------------------------------------------------------------

BUCKET = f"{PROJECT}-tpu-serve-dev-cache"  # the name dev's compile-cache bucket would have: the fleet's bucket


def lease_store(cloud: FakeCloud) -> LeaseStore:
    session = requests.Session()
    ensure_bucket(Buckets(session, cloud.url), BucketSpec(PROJECT, BUCKET, "europe-west4", {}))
    return LeaseStore(session, BUCKET, base_url=cloud.url)


def test_a_held_lease_stops_renew_at_once_naming_the_holder(pulumi: FakePulumi, cloud: FakeCloud, run) -> None:
    """A command takes the lease in the fleet's bucket (made private, uniform, labelled like the stack's cache
    bucket) with ifGenerationMatch=0 and deletes it at the end, only if it is still the generation it wrote. The
    schedule's renewal while someone runs `fleet up`: one line saying who holds it and until when, exit 6, and
    nothing read or changed (the only pulumi call is the fleet stack's config)."""
    pulumi.capacity({"europe-west4-a": 1})
    assert run("up", "--replicas", "1")[0] == 0
    bucket = cloud.buckets[BUCKET]
    assert bucket["labels"] == {"app": "tpu-serve", "stack": "dev", "managed-by": "pulumi", "tpu-serve-cache": "dev"}
    assert bucket["iamConfiguration"] == {"uniformBucketLevelAccess": {"enabled": True},
                                          "publicAccessPrevention": "enforced"}
    uploads = cloud.calls_to("POST", f"/upload/storage/v1/b/{BUCKET}/o")
    assert [(c.query["name"], c.query["ifGenerationMatch"], c.status) for c in uploads] == [
        (["leases/fleet.json"], ["0"], 200)]
    deletes = cloud.calls_to("DELETE", f"/storage/v1/b/{BUCKET}/o/")
    assert [(c.status, int(c.query["ifGenerationMatch"][0]) > 0) for c in deletes] == [(204, True)]
    assert (BUCKET, "leases/fleet.json") not in cloud.objects

    lease_store(cloud).write(Holder("ana@laptop", 4242, "fleet up", "dev", NOW - timedelta(minutes=3),
                                    NOW + timedelta(minutes=7)), 0)
    before = len(pulumi.calls())
    code, verdict, stderr = run("renew")
    assert code == 6
    assert "fleet dev is held by ana@laptop (pid 4242, fleet up) since 08:57 UTC, until 09:07 UTC" in stderr
    assert (verdict["reason"], verdict["lease"]["holder"], verdict["lease"]["pid"]) == ("lease held", "ana@laptop",
                                                                                       4242)
    assert [call[:2] for call in pulumi.calls()[before:]] == [["config", "--json"]]
    code, verdict, _ = run("status")  # status takes no lease: it says who holds it
    assert code == 0 and verdict["lease"]["line"].startswith("fleet dev is held by ana@laptop (pid 4242, fleet up)")


def test_a_lost_lease_stops_the_renewal_before_its_next_change(pulumi: FakePulumi, cloud: FakeCloud, run,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Another command took the lease while the successor booted: the renewal stops at the next safe point (the
    router update) instead of acting beside it, keeps the old replica routed and serving, destroys nothing. The next
    run, once it holds the lease, routes the ready successor it finds outside the router instead of placing one."""
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 2})
    assert run("up", "--replicas", "2")[0] == 0
    make_due(run, pulumi, ["dev-r1"])
    run.compute.started["dev-r2"] = NOW
    leases: list[Lease] = []
    acquire = Lease.acquire
    monkeypatch.setattr(Lease, "acquire", lambda self, *a, **k: (leases.append(self), acquire(self, *a, **k))[1])
    gate = fleet_module.Fleet.gate

    def gate_then_lose_the_lease(self, name):
        found = leases[0].store.read()
        leases[0].store.write(Holder("ana@laptop", 9, "fleet up", "dev", NOW, NOW + timedelta(minutes=10)), found[1])
        leases[0].renew_once()  # the renewal thread's next round finds the lease someone else's
        return gate(self, name)

    monkeypatch.setattr(fleet_module.Fleet, "gate", gate_then_lose_the_lease)
    before = len(pulumi.calls())
    code, verdict, stderr = run("renew")
    assert code == 1
    assert "Error: the lease of fleet dev was lost (another command wrote the lease: fleet dev is held by ana@laptop" \
        in stderr
    assert router_sets(pulumi, before) == []  # no router update after the loss
    assert not any(call[0] == "destroy" for call in pulumi.calls()[before:])
    assert router_replicas(pulumi)[0].startswith("dev-r1=") and pulumi.stacks() == ["dev-r1", "dev-r2", "dev-r3",
                                                                                     "dev-router"]
    assert json.loads(cloud.objects[(BUCKET, "leases/fleet.json")]["data"])["holder"] == "ana@laptop"

    monkeypatch.setattr(fleet_module.Fleet, "gate", gate)
    lease_store(cloud).delete(int(cloud.objects[(BUCKET, "leases/fleet.json")]["meta"]["generation"]))  # released
    code, verdict, stderr = run("renew")
    assert code == 0, stderr
    assert verdict["renewed"] == [{"replica": "dev-r1", "successor": "dev-r3", "zone": "europe-west4-a"}]
    assert "renewing it with dev-r3, which serves outside the router" in stderr
    assert pulumi.stacks() == ["dev-r2", "dev-r3", "dev-router"]  # no fourth replica placed


def test_a_waiting_renewal_reads_the_fleet_once_it_holds_the_lease(pulumi: FakePulumi, cloud: FakeCloud, run,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`--lease-wait`: while it waits, the holder renews dev-r1 (dev-r3 in, dev-r1 out and gone) and releases the
    lease. The waiting renewal then reads the replicas and the router's members afresh: nothing is due. Had it read
    them before taking the lease, it would renew dev-r1 a second time."""
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 2})
    assert run("up", "--replicas", "2")[0] == 0
    make_due(run, pulumi, ["dev-r1"])
    run.compute.started["dev-r2"] = NOW
    store = lease_store(cloud)
    held = store.write(Holder("ci@runner", 4242, "fleet renew", "dev", NOW, NOW + timedelta(minutes=10)), 0)
    pauses: list[float] = []

    def the_holder_finishes(seconds: float) -> None:  # what the holder did meanwhile, as its commands would
        pauses.append(seconds)
        if len(pauses) == 2:
            assert run("renew", "--lease-wait", "0")[0] == 6  # still held
            store.delete(held)
            assert run("renew")[0] == 0  # the holder's renewal: dev-r1 -> dev-r3
            store.write(Holder("ci@runner", 4242, "fleet renew", "dev", NOW, NOW + timedelta(minutes=10)), 0)
            store.delete(int(cloud.objects[(BUCKET, "leases/fleet.json")]["meta"]["generation"]))

    class Waiting(Lease):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "sleep": the_holder_finishes})

    monkeypatch.setattr(fleet_module, "Lease", Waiting)
    code, verdict, stderr = run("renew", "--lease-wait", "1m", "--lease-poll", "15")
    assert code == 0, stderr
    assert "waiting up to 1 min for the lease: fleet dev is held by ci@runner (pid 4242, fleet renew)" in stderr
    assert verdict["renewed"] == [] and "nothing to renew: the next deletion is dev-r2's" in stderr
    assert pauses == [15, 15] and pulumi.stacks() == ["dev-r2", "dev-r3", "dev-router"]


def spawn(cloud: FakeCloud, tmp_path: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """`tpuserve fleet renew` in a process of its own (the wall clock, real application-default credentials that
    only the fake cloud accepts); its stderr in a file the test reads while it runs."""
    env = {**os.environ, **cloud.env(tmp_path / "adc")}
    err = tmp_path / f"{name}.stderr"
    with err.open("w") as stderr:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "fleet", "renew", "--stack", "dev", "--json", "--skip-preflight",
             "--cwd", str(tmp_path), *args, *cloud.endpoint_options()], env=env, stdout=subprocess.PIPE,
            stderr=stderr, text=True)
    return process, err


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_two_renewals_started_together_one_acts(pulumi: FakePulumi, cloud: FakeCloud, run, clock: Clock,
                                                tmp_path: Path) -> None:
    """Issue #26: two `fleet renew` processes against the same fleet. Whichever creates the lease first renews dev-r1;
    its successor's `pulumi up` is held at a barrier until the other process has met the lease and exited 6 saying
    who holds it, so the two really overlap. Exactly one successor is placed, and dev-r2, routed and serving, is
    never retired."""
    clock.now = datetime.now(timezone.utc).replace(microsecond=0)  # the processes read the wall clock
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 2})
    assert run("up", "--replicas", "2")[0] == 0
    run.compute.started["dev-r1"] = clock.now - timedelta(hours=4) + timedelta(minutes=40)
    run.compute.started["dev-r2"] = clock.now
    pulumi.barrier(["dev-r3", "released"], count=2, timeout_s=90)
    before = len(pulumi.calls())

    first, first_err = spawn(cloud, tmp_path, "a")
    second, second_err = spawn(cloud, tmp_path, "b")
    outcomes = {}
    try:
        wait_for(lambda: "is held by" in first_err.read_text() + second_err.read_text(), "one to meet the lease")
        (pulumi.home / "barrier").mkdir(exist_ok=True)
        (pulumi.home / "barrier" / "released").touch()  # now the holder's successor may finish
        for process, err in ((first, first_err), (second, second_err)):
            out, _ = process.communicate(timeout=120)
            outcomes[process.pid] = (process.returncode, json.loads(out.strip().splitlines()[-1]), err.read_text())
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.communicate()
    actor = next(pid for pid, (_, verdict, _) in outcomes.items() if verdict.get("renewed"))
    (code, verdict, stderr), (other_code, other, other_stderr) = outcomes.pop(actor), outcomes.popitem()[1]

    assert code == 0, stderr
    assert verdict["renewed"] == [{"replica": "dev-r1", "successor": "dev-r3", "zone": "europe-west4-a"}]
    assert other_code == 6 and other["lease"]["pid"] == actor, other_stderr
    assert f"(pid {actor}, fleet renew) since " in other_stderr and "fleet dev is held by" in other_stderr
    calls = pulumi.calls()[before:]
    assert [call[call.index("--stack") + 1] for call in calls if call[:2] == ["stack", "init"]] == ["dev-r3"]
    assert [call[call.index("--stack") + 1] for call in calls if call[0] == "destroy"] == ["dev-r1"]
    assert all("dev-r2" in members for members in router_sets(pulumi, before))
    assert pulumi.stacks() == ["dev-r2", "dev-r3", "dev-router"]
    assert (BUCKET, "leases/fleet.json") not in cloud.objects  # both released what they held


# --- Cloud NAT: one owner per network and region ---------------------------------------------------------------

def nats(cloud: FakeCloud) -> list[tuple[str, str]]:
    return sorted((r.location, r.name) for r in cloud.inventory() if r.kind == "nat")


def test_fleet_up_after_up_dev_makes_no_second_nat(pulumi: FakePulumi, cloud: FakeCloud, run) -> None:
    """Issue #26: CI deploys dev (its NAT in europe-west4), then a fleet of dev comes up in the same project. The
    router stack makes NAT only in the fleet's other regions, says whose NAT serves europe-west4, and nothing fails
    (without the skip the fake cloud refuses the router's second NAT there, as the API does). When dev goes away, the
    next renewal finds europe-west4 unserved and the router stack makes its NAT there."""
    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 1, "us-central1-b": 1})
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--zones", "europe-west4-a",
                                               *cloud.endpoint_options()])
    assert result.exit_code == 0, result.stderr
    assert nats(cloud) == [("europe-west4", "tpu-serve-dev-nat")]

    code, verdict, stderr = run("up", "--replicas", "2")
    assert code == 0, stderr
    assert ("Cloud NAT in europe-west4: tpu-serve-dev-router/tpu-serve-dev-nat (stack dev) serves it; dev-router "
            "makes none there") in stderr
    assert nats(cloud) == [("europe-west4", "tpu-serve-dev-nat"),
                           ("us-central1", "tpu-serve-dev-router-us-central1-nat"),
                           ("us-east1", "tpu-serve-dev-router-us-east1-nat")]
    assert pulumi.stack_config("dev-router")["tpu-serve:cloudNatSkipRegions"]["value"] == '["europe-west4"]'
    assert {zone for zone in (pulumi.outputs(f"dev-r{n}")["zone"] for n in (1, 2))} <= set(ZONES)

    subprocess.run(["pulumi", "destroy", "--yes", "--stack", "dev"], check=True, capture_output=True)
    assert ("europe-west4", "tpu-serve-dev-nat") not in nats(cloud)
    code, verdict, stderr = run("renew")
    assert code == 0, stderr
    assert "Cloud NAT in europe-west4: none yet; dev-router makes one" in stderr
    assert "Cloud NAT changed in the fleet's regions: the router stack follows" in stderr
    assert nats(cloud) == [("europe-west4", "tpu-serve-dev-router-europe-west4-nat"),
                           ("us-central1", "tpu-serve-dev-router-us-central1-nat"),
                           ("us-east1", "tpu-serve-dev-router-us-east1-nat")]


def test_destroying_the_stack_whose_nat_a_fleet_uses_is_refused_until_asked_for(pulumi: FakePulumi,
                                                                                cloud: FakeCloud, run) -> None:
    """The seam `pulumi destroy -s dev` leaves (above): `tpuserve destroy --stack dev` names the fleet's VMs that
    reach the internet through dev's NAT and destroys nothing (exit 2, with --yes too, which is about orphans);
    --despite-nat-users destroys dev, its NAT with it."""
    from tpuserve.cli import main as cli_main
    from tpuserve.ops import destroy as destroy_module

    pulumi.capacity({"europe-west4-a": 2, "us-east1-d": 1, "us-central1-b": 1})
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--zones", "europe-west4-a",
                                               *cloud.endpoint_options()])
    assert result.exit_code == 0, result.stderr
    assert run("up", "--replicas", "2")[0] == 0
    # a replica VM in dev's region, without an external IP, as fleet placement leaves one (the fleet's own VMs here
    # live in FleetCompute, not in the fake Compute API's instance list that nat.list_vms reads)
    status, _ = cloud.api("POST", f"/compute/v1/projects/{PROJECT}/zones/europe-west4-a/instances", {
        "name": "tpu-serve-dev-r9", "machineType": "zones/europe-west4-a/machineTypes/ct6e-standard-1t",
        "networkInterfaces": [{"network": "global/networks/default"}], "labels": {"stack": "dev-r9"},
        "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "100"}}]})
    assert status == 200
    before = len(pulumi.calls())

    refused = CliRunner().invoke(cli_main, ["destroy", "--stack", "dev", "--yes", "--json",
                                             *cloud.endpoint_options()])  # the CLI writes the error document
    assert refused.exit_code == 2, refused.stderr
    assert ("warning: tpu-serve-dev-router/tpu-serve-dev-nat in europe-west4 (stack dev) also serves "
            in refused.stderr) and "tpu-serve-dev-r9" in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "Error: nothing destroyed: VMs of other stacks use dev's Cloud NAT (above); destroy those stacks first "
        "(tpuserve fleet down for a fleet), or run again with --despite-nat-users")
    verdict = json.loads(refused.stdout.strip().splitlines()[-1])
    assert verdict == {"ok": False, "exit": 2, "error": refused.stderr.strip().splitlines()[-1].removeprefix("Error: "),
                       "stack": "dev", "natUsers": [line.removeprefix("warning: ") for line in
                                                    refused.stderr.splitlines() if "also serves" in line]}
    assert len(verdict["natUsers"]) == 1
    assert not any(call[0] == "destroy" for call in pulumi.calls()[before:])
    assert ("europe-west4", "tpu-serve-dev-nat") in nats(cloud)

    forced = CliRunner().invoke(destroy_module.destroy, ["--stack", "dev", "--yes", "--despite-nat-users",
                                                          *cloud.endpoint_options()])
    assert forced.exit_code in (0, 5), forced.stderr
    assert [call[call.index("--stack") + 1] for call in pulumi.calls()[before:] if call[0] == "destroy"] == ["dev"]
    assert ("europe-west4", "tpu-serve-dev-nat") not in nats(cloud)


def dev_vm(cloud: FakeCloud) -> None:
    """dev's VM as a deploy leaves it, without an external IP, in a region whose NAT another stack owns."""
    status, _ = cloud.api("POST", f"/compute/v1/projects/{PROJECT}/zones/europe-west4-a/instances", {
        "name": "tpu-serve-dev", "machineType": "zones/europe-west4-a/machineTypes/e2-standard-2",
        "networkInterfaces": [{"network": "global/networks/default"}], "labels": {"stack": "dev"},
        "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "10"}}]})
    assert status == 200


def test_fleet_down_destroys_the_router_first_then_every_replica(pulumi: FakePulumi, cloud: FakeCloud,
                                                                  run) -> None:
    """Without --yes and no terminal it says what it would destroy and destroys nothing; it warns that the router's
    NAT serves dev's VM. With --yes: the router first (no request reaches a replica through it after), then the
    replicas, under the lease; their stacks, VMs' NATs and the lease are gone, the fleet's bucket is kept."""
    pulumi.capacity({"europe-west4-a": 1, "us-east1-d": 1})
    assert run("up", "--replicas", "2")[0] == 0
    dev_vm(cloud)
    before = len(pulumi.calls())
    code, verdict, stderr = run("down")
    assert code == 2 and verdict["destroyed"] == []
    assert "fleet down would destroy dev-router, dev-r1, dev-r2 (the router first); nothing done: run it again with " \
           "--yes" in stderr
    assert ("warning: tpu-serve-dev-router-europe-west4-router/tpu-serve-dev-router-europe-west4-nat in europe-west4 "
            "(stack dev-router) also serves 1 VM(s) of dev (tpu-serve-dev)") in stderr
    assert not any(call[0] == "destroy" for call in pulumi.calls()[before:])

    code, verdict, stderr = run("down", "--yes")
    assert code == 0, stderr
    assert verdict["destroyed"] == ["dev-router", "dev-r1", "dev-r2"]
    assert [call[call.index("--stack") + 1] for call in pulumi.calls()[before:] if call[0] == "destroy"] == [
        "dev-router", "dev-r1", "dev-r2"]
    assert pulumi.stacks() == [] and nats(cloud) == []
    assert BUCKET in cloud.buckets and (BUCKET, "leases/fleet.json") not in cloud.objects
    code, verdict, stderr = run("down", "--yes")
    assert code == 0 and "nothing to do" in stderr
