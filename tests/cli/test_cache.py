"""tpuserve.deploy.cache, its dynamic providers and `tpuserve cache ls|rm` against a fake Compute API and Cloud
Storage on 127.0.0.1.

Shapes (https://cloud.google.com/compute/docs/reference/rest/v1/disks): a disk has `name`, `sizeGb` (a string),
`zone` and `type` as URLs, `status`, `users` (instance URLs), `labels`, `lastAttachTimestamp`; insert, resize and
delete answer a zonal Operation (`kind: compute#operation`, `status` PENDING/RUNNING/DONE, `error.errors[]`);
`aggregated/disks` maps `zones/Z` to `{"disks": [...]}` or, with no match, to `{"warning": {"code":
"NO_RESULTS_ON_PAGE", ...}}`. Buckets: https://cloud.google.com/storage/docs/json_api/v1/buckets.
"""

from __future__ import annotations

import json

import pytest
import requests
from click.testing import CliRunner

from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve import caches, gce
from tpuserve.caches import DiskSpec, ensure_disk
from tpuserve.deploy import cache
from tpuserve.deploy.cache import CacheDisk, zones_by_warm_cache
from components.cache_provider import CacheDiskProvider
from tpuserve.gce import ZonalDisks

PROJECT = "p-1"
COMPUTE = f"/compute/v1/projects/{PROJECT}"
LABELS = {"app": "tpu-serve", "stack": "dev", "tpu-serve-cache": "dev"}


def disk_json(zone: str, size: int = 100, users: tuple[str, ...] = (), attached: str = "") -> dict:
    return {"kind": "compute#disk", "name": "tpu-serve-dev-cache", "sizeGb": str(size), "status": "READY",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}",
            "type": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/diskTypes/"
                    "hyperdisk-balanced",
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/disks/"
                        "tpu-serve-dev-cache",
            "labels": LABELS, "users": [f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/"
                                        f"instances/{u}" for u in users],
            **({"lastAttachTimestamp": attached} if attached else {})}


def operation(name: str, status: str = "DONE", error: dict | None = None) -> dict:
    return {"kind": "compute#operation", "name": name, "status": status, **({"error": error} if error else {})}


class FakeCompute:
    """Disks by zone; operations finish on their first poll."""

    def __init__(self, disks: dict[str, dict] | None = None):
        self.disks = dict(disks or {})
        self.server = FakeServer(fallback=self.handle)

    def handle(self, request: Request) -> Response:
        path = request.path
        if path == f"{COMPUTE}/aggregated/disks":
            items = {f"zones/{z}": {"disks": [d]} for z, d in self.disks.items()}
            items["zones/europe-west4-a"] = {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no "
                                                         "results for scope 'zones/europe-west4-a' on this page."}}
            return Response(200, {"kind": "compute#diskAggregatedList", "items": items})
        parts = path.removeprefix(f"{COMPUTE}/zones/").split("/")
        zone = parts[0]
        if parts[1] == "operations":
            return Response(200, operation(parts[2]))
        if request.method == "POST" and len(parts) == 2:
            body = request.json()
            self.disks[zone] = {**disk_json(zone, int(body["sizeGb"])), "labels": body["labels"]}
            return Response(200, operation("op-insert", "RUNNING"))
        if request.method == "POST" and parts[-1] == "resize":
            self.disks[zone]["sizeGb"] = request.json()["sizeGb"]
            return Response(200, operation("op-resize", "RUNNING"))
        if zone not in self.disks:
            return Response(404, {"error": {"code": 404, "message": f"The resource '{path}' was not found"}})
        if request.method == "DELETE":
            if self.disks[zone]["users"]:
                return Response(400, {"error": {"code": 400, "message": f"The disk resource '{path}' is already "
                                                "being used by 'tpu-serve-dev'"}})
            del self.disks[zone]
            return Response(200, operation("op-delete"))
        return Response(200, self.disks[zone])


def disks_client(fake: FakeCompute) -> ZonalDisks:
    return ZonalDisks(requests.Session(), fake.server.url, poll_s=0.0)


SPEC = DiskSpec(PROJECT, "us-east5-b", "tpu-serve-dev-cache", 100, LABELS)


def test_a_missing_disk_is_created_as_hyperdisk_balanced_with_the_labels():
    fake = FakeCompute()
    with fake.server:
        disk, adopted = ensure_disk(disks_client(fake), SPEC)
    assert not adopted and disk["sizeGb"] == "100"
    insert = [r for r in fake.server.requests if r.method == "POST"][0]
    assert insert.json()["type"] == "zones/us-east5-b/diskTypes/hyperdisk-balanced"
    assert insert.json()["labels"] == LABELS and insert.json()["sizeGb"] == "100"
    assert any(r.path.endswith("/operations/op-insert") for r in fake.server.requests)  # waited for it


def test_an_existing_disk_is_adopted_and_grown_never_shrunk():
    fake = FakeCompute({"us-east5-b": disk_json("us-east5-b", 50)})
    with fake.server:
        disk, adopted = ensure_disk(disks_client(fake), SPEC)
        assert adopted and disk["sizeGb"] == "100"
        bigger = FakeCompute({"us-east5-b": disk_json("us-east5-b", 500)})
    with bigger.server:
        disk, adopted = ensure_disk(disks_client(bigger), SPEC)
    assert adopted and disk["sizeGb"] == "500"
    assert not [r for r in bigger.server.requests if r.method == "POST"]


def test_an_operation_error_is_an_api_error():
    class Failing(FakeCompute):
        def handle(self, request: Request) -> Response:
            if "/operations/" in request.path:
                return Response(200, operation("op-insert", error={"errors": [
                    {"code": "QUOTA_EXCEEDED", "message": "Quota 'HDB_TOTAL_GB' exceeded. Limit: 0.0 in region "
                                                          "us-east5."}]}))
            return super().handle(request)

    fake = Failing()
    with fake.server, pytest.raises(gce.ComputeApiError, match="HDB_TOTAL_GB"):
        ensure_disk(disks_client(fake), SPEC)


def test_the_provider_adopts_refuses_to_shrink_and_replaces_on_a_zone_change(monkeypatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    fake = FakeCompute({"us-east5-b": disk_json("us-east5-b", 100)})
    props = {"project": PROJECT, "zone": "us-east5-b", "name": "tpu-serve-dev-cache", "sizeGb": 100, "labels": LABELS}
    with fake.server:
        provider = CacheDiskProvider(fake.server.url)
        created = provider.create(props)
        assert created.id == f"projects/{PROJECT}/zones/us-east5-b/disks/tpu-serve-dev-cache"
        assert created.outs["adopted"] is True
        fake.disks.clear()
        assert provider.read(created.id, props).id is None  # deleted outside Pulumi: gone from the state
    assert provider.check(props, {**props, "sizeGb": 50}).failures[0].property == "sizeGb"
    assert provider.check(props, {**props, "sizeGb": 200}).failures == []
    moved = provider.diff(created.id, props, {**props, "zone": "us-east1-d"})
    assert moved.replaces == ["zone"] and moved.changes
    grown = provider.diff(created.id, props, {**props, "sizeGb": 200})
    assert grown.replaces == [] and grown.changes
    assert not provider.diff(created.id, props, dict(props)).changes


def test_zones_with_a_warm_cache_are_tried_first():
    caches = [CacheDisk("us-east1-d", "c", 100, "READY", (), "2026-11-01T10:00:00Z", 8.0),
              CacheDisk("europe-west4-a", "c", 100, "READY", (), "2026-11-20T10:00:00Z", 8.0),
              CacheDisk("us-central1-b", "c", 100, "CREATING", (), "", 8.0),
              CacheDisk("asia-northeast1-b", "c", 100, "READY", (), "2026-11-25T10:00:00Z", 8.0)]  # not a candidate
    candidates = ["us-east5-b", "us-central1-b", "us-east1-d", "europe-west4-a", "us-east5-a"]
    assert zones_by_warm_cache(candidates, caches) == ["europe-west4-a", "us-east1-d", "us-east5-b",
                                                       "us-central1-b", "us-east5-a"]
    assert zones_by_warm_cache(candidates, []) == candidates


def test_a_cache_disk_is_warm_only_once_attached_and_marked_by_the_vm_that_served():
    """A failed zone's disk exists, READY, but no VM ever attached it (no lastAttachTimestamp), or one attached it
    and never served (no marker in the bucket): neither is warm, neither goes first."""
    caches = [CacheDisk("us-east1-d", "c", 100, "READY", (), "", 8.0),  # never attached
              CacheDisk("europe-west4-a", "c", 100, "READY", (), "2026-11-20T10:00:00Z", 8.0),  # attached, no marker
              CacheDisk("us-central1-b", "c", 100, "READY", (), "2026-11-21T10:00:00Z", 8.0)]  # attached and marked
    candidates = ["us-east1-d", "europe-west4-a", "us-central1-b"]
    assert zones_by_warm_cache(candidates, caches, {"us-central1-b/c"}) == [
        "us-central1-b", "us-east1-d", "europe-west4-a"]
    assert zones_by_warm_cache(candidates, caches, None) == [  # markers unreadable: the attach time decides
        "us-central1-b", "europe-west4-a", "us-east1-d"]


class FakeStorage:
    def __init__(self, buckets: dict[str, dict]):
        self.buckets = buckets
        self.objects = {"xla/abc-ct6e-standard-1t/jit_a-cache": b"a", "xla/abc-ct6e-standard-1t/jit_b-cache": b"b"}
        self.server = FakeServer({("GET", "/storage/v1/b"): self.list}, fallback=self.handle)

    def list(self, request: Request) -> Response:
        return Response(200, {"kind": "storage#buckets", "items": list(self.buckets.values())})

    def handle(self, request: Request) -> Response:
        rest = request.path.removeprefix("/storage/v1/b/").split("/")
        if len(rest) == 2 and request.method == "GET":
            return Response(200, {"kind": "storage#objects", "items": [
                {"kind": "storage#object", "name": name, "size": str(len(data))} for name, data in self.objects.items()]})
        if len(rest) == 3 and request.method == "DELETE":
            self.objects.pop(requests.utils.unquote(rest[2]), None)
            return Response(204)
        if len(rest) == 1 and request.method == "DELETE":
            self.buckets.pop(rest[0], None)
            return Response(204)
        return Response(404, {"error": {"code": 404, "message": "Not Found"}})


def run_cache(compute: FakeCompute, storage: FakeStorage, *args: str):
    return CliRunner().invoke(cache.cache, [*args, "--stack", "dev", "--project", PROJECT, "--compute-url",
                                            compute.server.url, "--storage-url", storage.server.url])


BUCKET = {"kind": "storage#bucket", "name": "p-1-tpu-serve-dev-cache", "location": "US-EAST5",
          "labels": {"tpu-serve-cache": "dev"}}
OTHER_BUCKET = {"kind": "storage#bucket", "name": "unrelated", "labels": {"team": "x"}}


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setattr(gce, "adc_session", requests.Session)
    compute = FakeCompute({"us-east5-b": disk_json("us-east5-b", users=("tpu-serve-dev",),
                                                   attached="2026-11-29T02:00:00Z"),
                           "us-east1-d": disk_json("us-east1-d", 200)})
    storage = FakeStorage({"p-1-tpu-serve-dev-cache": BUCKET, "unrelated": OTHER_BUCKET})
    with compute.server, storage.server:
        yield compute, storage


def test_ls_lists_every_zone_with_its_cost_and_the_bucket(fakes):
    compute, storage = fakes
    result = run_cache(compute, storage, "ls", "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert [(d["zone"], d["size_gb"], d["users"], d["monthly_usd"]) for d in listed["disks"]] == [
        ("us-east1-d", 200, [], 16.0), ("us-east5-b", 100, ["tpu-serve-dev"], 8.0)]
    assert listed["bucket"] == {"name": "p-1-tpu-serve-dev-cache", "objects": 2, "keys": ["abc-ct6e-standard-1t"]}
    assert listed["monthly_usd"] == 24.0
    aggregated = [r for r in compute.server.requests if r.path.endswith("/aggregated/disks")][0]
    assert "labels.tpu-serve-cache%3Ddev" in aggregated.query or "labels.tpu-serve-cache=dev" in aggregated.query
    human = run_cache(compute, storage, "ls").output
    assert "attached to tpu-serve-dev" in human and "$16.00/month" in human


def test_rm_refuses_a_disk_in_use_naming_the_vm(fakes):
    compute, storage = fakes
    result = run_cache(compute, storage, "rm", "--yes")
    assert result.exit_code == 2 and "is attached to tpu-serve-dev" in result.output
    assert not [r for r in compute.server.requests if r.method == "DELETE"]


def test_rm_deletes_the_unused_disk_of_a_zone_and_the_bucket_when_asked(fakes):
    compute, storage = fakes
    result = run_cache(compute, storage, "rm", "--zone", "us-east1-d", "--bucket", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["deleted"] == ["disk us-east1-d/tpu-serve-dev-cache (200 GB)",
                                                    "bucket gs://p-1-tpu-serve-dev-cache"]
    assert sorted(compute.disks) == ["us-east5-b"]
    assert storage.objects == {} and "p-1-tpu-serve-dev-cache" not in storage.buckets
    assert "unrelated" in storage.buckets


def test_the_bucket_is_private_and_in_the_vms_region(fakes):
    _, storage = fakes
    spec = caches.BucketSpec(PROJECT, "p-1-tpu-serve-dev-cache", "us-east5", {"tpu-serve-cache": "dev"})
    assert spec.body()["iamConfiguration"] == {"uniformBucketLevelAccess": {"enabled": True},
                                               "publicAccessPrevention": "enforced"}
    assert spec.body()["location"] == "US-EAST5"


def test_names_fit_gcp_limits():
    assert caches.disk_name("tpu-serve-dev") == "tpu-serve-dev-cache"
    long_project = "a-very-long-project-id-of-30ch"
    name = caches.bucket_name(long_project, "tpu-serve-" + "x" * 30)
    assert len(name) <= 63 and name.startswith(long_project)
