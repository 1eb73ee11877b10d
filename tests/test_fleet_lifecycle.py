"""A fleet's life on the stateful fake cloud: `tpuserve fleet up` and five `fleet renew`s run their real code, every
replica and the router are the real program applied by the fake engine (tests/cloud_world.py), and the cloud is
asserted after: what the fleet holds, and that renewals reuse its caches instead of adding one a run."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from datetime import datetime, timezone

from tests.cloud_world import World, world  # noqa: F401 - the fixture
from tests.httpfake import FakeServer, Request, Response
from tpuserve.ops import fleet as fleet_module

ZONES = ["europe-west4-a", "us-east1-d"]
IDLE = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 0.0\n'
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 0.0\n')


def fleet_world(world: World, monkeypatch) -> tuple[FakeServer, callable]:
    for zone in ZONES:
        world.cloud.capacity[(zone, "ct6e-standard-1t")] = 2  # a replica and its successor at once
    for secret in ("litellm-master-key", "vllm-api-key"):
        world.cloud.api("POST", f"/v1/projects/my-ml-sandbox/secrets", {"replication": {"automatic": {}}},
                        {"secretId": secret})
    world.pulumi.set_config(project="my-ml-sandbox", zone=ZONES[0], zones=ZONES, hfTokenSecretId="hf-token",
                            routerMasterKeySecretId="litellm-master-key", vllmApiKeySecretId="vllm-api-key")
    metrics = FakeServer({("GET", "/metrics"): lambda request: Response(200, IDLE)})

    opened = fleet_module.open_fleet

    def open_with_fakes(*args, **kwargs):
        session = opened(*args, **kwargs)
        session.fleet.now = lambda: datetime.fromtimestamp(world.cloud.clock.now(), tz=timezone.utc)
        session.fleet.sleep = lambda seconds: None
        session.fleet.gate_interval_s = 0.01
        session.fleet.reach = lambda outputs: contextlib.nullcontext(f"{metrics.url}/v1")
        return session

    monkeypatch.setattr(fleet_module, "open_fleet", open_with_fakes)

    def fleet(*args: str) -> tuple[int, dict, str]:
        return world.tpuserve(fleet_module.fleet, *args, "--stack", "dev", "--json", "--skip-preflight")

    return metrics, fleet


def soonest_deletion(world: World) -> float:
    """When flex-start deletes the first of the fleet's replicas, in the cloud clock's seconds."""
    ends = [fleet_module.instance_expiry(world.cloud.instance(r.name, r.location)).timestamp()
            for r in world.cloud.inventory() if r.kind == "instance" and "-r" in r.name
            and not r.name.endswith("-router")]
    return min(ends)


def test_five_renewals_reuse_the_fleets_caches_and_leave_no_unready_vm(world: World, monkeypatch):
    """Each run comes 40 minutes before the next flex-start deletion (the schedule's 15-minute runs inside the
    45-minute lead), until every replica was renewed five times on average. Every replica is replaced before its
    deletion, each zone keeps its replicas' cache disks and at most one spare, the fleet one bucket."""
    metrics, fleet = fleet_world(world, monkeypatch)
    renewed, runs = [], 0
    with metrics:
        code, verdict, stderr = fleet("up", "--replicas", "2")
        assert code == 0, stderr
        while len(renewed) < 10:
            runs += 1
            assert runs <= 20, renewed
            world.cloud.clock.advance(soonest_deletion(world) - 40 * 60 - world.cloud.clock.now())
            code, verdict, stderr = fleet("renew", "--yes")
            assert code == 0, stderr
            assert verdict["renewed"], stderr
            renewed += verdict["renewed"]
            drained = [e for e in verdict["events"] if e["event"] == "drained"]
            assert drained and all(e["detail"].startswith("no request in flight") for e in drained), stderr
    instances = [(r.location, r.name) for r in world.cloud.inventory() if r.kind == "instance"]
    replicas = [name for _, name in instances if "-r" in name and not name.endswith("-router")]
    assert len(replicas) == 2 and len(instances) == 3  # two replicas and the router, nothing unready
    assert all(world.cloud.instance(name, zone)["status"] == "RUNNING" for zone, name in instances)
    pool = Counter(r.location for r in world.cloud.inventory() if r.kind == "disk" and "-cache-" in r.name)
    assert all(count <= 2 for count in pool.values()), pool  # its replica's, and at most one spare
    made = {(c.path.split("/zones/")[1].split("/")[0], c.body["name"]) for c in world.cloud.calls
            if c.method == "POST" and c.path.endswith("/disks")}
    assert len(made) <= 4, made  # renewals reused the pool: no new disk per run
    assert [r.name for r in world.cloud.inventory() if r.kind == "bucket"] == ["my-ml-sandbox-tpu-serve-dev-cache"]
    assert verdict["inventory"]["billingOrphans"] == 0


def test_successors_that_never_serve_leave_at_most_one_vm_for_diagnosis(world: World, monkeypatch):
    """Every successor boots and fails (say, a model that does not load): each scheduled run would add a TPU VM that
    bills and serves nothing. One is kept for `tpuserve diagnose`; the next run's destroys the one before."""
    metrics, fleet = fleet_world(world, monkeypatch)
    with metrics:
        code, verdict, stderr = fleet("up", "--replicas", "1")
        assert code == 0, stderr
        world.boots.update({zone: "vLLM exited: out of HBM" for zone in ZONES})
        world.cloud.clock.advance(soonest_deletion(world) - 40 * 60 - world.cloud.clock.now())
        for run in range(3):
            code, verdict, stderr = fleet("renew", "--yes")
            assert code == 1, stderr
            assert "kept for diagnosis (tpuserve diagnose --stack" in stderr
            world.cloud.clock.advance(5 * 60)
    names = sorted(r.name for r in world.cloud.inventory() if r.kind == "instance")
    assert names == ["tpu-serve-dev-r1", "tpu-serve-dev-r4", "tpu-serve-dev-router"]  # serving, newest unready
    assert world.pulumi.stacks() == ["dev-r1", "dev-r4", "dev-router"]
