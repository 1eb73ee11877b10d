"""tests/fakes/fake_cloud.py: state across calls, operations that finish, the errors Google answers, flex-start expiry, the
bill; and the project's own clients (tpuserve.gce, gcs, cache, orphans, preflight, `tpuserve cache`) run
against it unmodified, over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from tests.fakes import provider_errors
from tests.fakes.fake_cloud import (HOURS_PER_MONTH, PRICES, TOKEN, FakeClock, FakeCloud, machine_price_per_hour,
                              parse_filter, provider_error_text)
from tpuserve import gce
from tpuserve.caches import BucketSpec, DiskSpec, ensure_bucket, ensure_disk
from tpuserve.deploy import cache, orphans
from tpuserve.gce import ComputeApiError, ComputeClient, Instance, ZonalDisks, label_filter
from tpuserve.gcs import Buckets
from tpuserve.names import stack_labels
from tpuserve.facts import CACHE_LABEL, GUEST_ATTRIBUTE_NAMESPACE, HYPERDISK_BALANCED_USD_PER_GB_MONTH, \
    PRICE_PER_CHIP_HOUR

PROJECT = provider_errors.PROJECT
ZONE = "europe-west4-a"
STACK_LABELS = stack_labels("dev")
HOUR = 3600.0


@pytest.fixture
def cloud(fake_cloud: FakeCloud) -> FakeCloud:
    return fake_cloud


@pytest.fixture
def session() -> requests.Session:
    return requests.Session()


def compute_url(cloud: FakeCloud, path: str, project: str = PROJECT) -> str:
    return f"{cloud.url}/compute/v1/projects/{project}/{path}"


def flex_vm(name: str = "tpu-serve-dev", zone: str = ZONE, machine_type: str = "ct6e-standard-1t",
            max_run_s: int = 4 * 3600, cache_disk: str | None = None, **extra: Any) -> dict[str, Any]:
    """An instances.insert body as the stack's Instance sends it (components/instance.py: FLEX_START, max run,
    DELETE, a Hyperdisk Balanced boot disk deleted with the VM, the cache disk kept)."""
    disks: list[dict[str, Any]] = [{"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu",
        "diskSizeGb": "100", "diskType": f"zones/{zone}/diskTypes/hyperdisk-balanced", "labels": STACK_LABELS}}]
    if cache_disk:
        disks.append({"source": f"projects/{PROJECT}/zones/{zone}/disks/{cache_disk}", "deviceName": "tpu-serve-cache",
                      "mode": "READ_WRITE", "autoDelete": False})
    return {"name": name, "machineType": f"zones/{zone}/machineTypes/{machine_type}", "disks": disks,
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": str(max_run_s)},
                           "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
                           "automaticRestart": False},
            "metadata": {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]},
            "labels": STACK_LABELS, **extra}


def insert(session: requests.Session, cloud: FakeCloud, body: dict[str, Any], zone: str = ZONE) -> dict[str, Any]:
    response = session.post(compute_url(cloud, f"zones/{zone}/instances"), json=body)
    assert response.status_code == 200, response.text
    return response.json()


def poll(session: requests.Session, cloud: FakeCloud, operation: dict[str, Any], times: int = 5) -> dict[str, Any]:
    """Poll a zonal operation up to `times` times (what a client with a deadline does)."""
    zone = operation["zone"].rsplit("/", 1)[-1]
    for _ in range(times):
        operation = session.get(compute_url(cloud, f"zones/{zone}/operations/{operation['name']}")).json()
        if operation["status"] == "DONE":
            break
    return operation


def kinds(cloud: FakeCloud) -> list[tuple[str, str]]:
    return [(r.kind, r.name) for r in cloud.inventory()]


def cache_spec(zone: str = ZONE, size: int = 100) -> DiskSpec:
    return DiskSpec(PROJECT, zone, "tpu-serve-dev-cache", size, {**STACK_LABELS, CACHE_LABEL: "dev"})


# --- Compute: an instance's life -----------------------------------------------------------------------------------

def test_an_instance_lives_and_dies_through_the_real_client(cloud: FakeCloud, session: requests.Session):
    client = ComputeClient(session, cloud.url)
    assert client.labelled(PROJECT, ZONE, "instances", STACK_LABELS) == []
    listing = session.get(compute_url(cloud, f"zones/{ZONE}/instances")).json()
    assert "items" not in listing and listing["kind"] == "compute#instanceList"

    operation = insert(session, cloud, flex_vm())
    assert (operation["kind"], operation["status"], operation["operationType"]) == ("compute#operation", "RUNNING",
                                                                                    "insert")
    assert poll(session, cloud, operation)["status"] == "DONE"
    [found] = client.labelled(PROJECT, ZONE, "instances", STACK_LABELS)
    assert found["status"] == "RUNNING" and found["machineType"].endswith("/machineTypes/ct6e-standard-1t")
    assert client.instance(Instance(PROJECT, ZONE, "tpu-serve-dev"))["status"] == "RUNNING"
    assert [(r.kind, r.name, r.attached_to) for r in cloud.inventory()] == [
        ("disk", "tpu-serve-dev", ("tpu-serve-dev",)), ("instance", "tpu-serve-dev", ("tpu-serve-dev",))]

    # setMetadata with the current fingerprint is applied; a stale one is refused with 412 and changes nothing.
    url = compute_url(cloud, f"zones/{ZONE}/instances/tpu-serve-dev/setMetadata")
    stale = found["metadata"]["fingerprint"]
    items = [{"key": "tpu-serve-config", "value": "v2"}]
    assert poll(session, cloud, session.post(url, json={"fingerprint": stale, "items": items}).json())["status"] == \
        "DONE"
    refused = session.post(url, json={"fingerprint": stale, "items": [{"key": "tpu-serve-config", "value": "v3"}]})
    assert refused.status_code == 412
    assert refused.json()["error"]["errors"][0]["reason"] == "conditionNotMet"
    assert refused.json()["error"]["message"] == "Supplied fingerprint does not match current metadata fingerprint."
    assert cloud.instance("tpu-serve-dev", ZONE)["metadata"]["items"] == items

    assert client.delete(PROJECT, ZONE, "instances", "tpu-serve-dev").startswith("operation-")
    assert client.labelled(PROJECT, ZONE, "instances", STACK_LABELS) == []
    assert cloud.inventory() == []  # the boot disk (autoDelete) went with it
    assert client.delete(PROJECT, ZONE, "instances", "tpu-serve-dev") == ""  # 404: already gone
    with pytest.raises(ComputeApiError, match="was not found") as raised:
        client.instance(Instance(PROJECT, ZONE, "tpu-serve-dev"))
    assert raised.value.status == 404


def test_an_operation_is_done_after_its_polls_or_its_virtual_seconds(session: requests.Session):
    with FakeCloud(operation_polls=3) as cloud:
        operation = insert(session, cloud, flex_vm())
        assert [poll(session, cloud, operation, 1)["status"] for _ in range(3)] == ["RUNNING", "RUNNING", "DONE"]
        assert cloud.instance("tpu-serve-dev", ZONE)["status"] == "RUNNING"  # the effect did not wait for polls

    with FakeCloud(operation_seconds=30) as cloud:
        disks = ZonalDisks(session, cloud.url, poll_s=0)
        operation = session.post(compute_url(cloud, f"zones/{ZONE}/disks"), json=cache_spec().body()).json()
        waited = session.post(compute_url(cloud, f"zones/{ZONE}/operations/{operation['name']}/wait")).json()
        assert waited["status"] == "RUNNING" and disks.get(PROJECT, ZONE, "tpu-serve-dev-cache")["status"] == \
            "CREATING"
        cloud.clock.advance(30)
        assert poll(session, cloud, operation, 1)["status"] == "DONE"
        assert disks.get(PROJECT, ZONE, "tpu-serve-dev-cache")["status"] == "READY"

    with FakeCloud(operation_polls=0) as cloud:  # what is finished says so at once
        assert insert(session, cloud, flex_vm())["status"] == "DONE"


def test_names_and_duplicates_are_refused_with_the_apis_words(cloud: FakeCloud, session: requests.Session):
    poll(session, cloud, insert(session, cloud, flex_vm()))
    again = session.post(compute_url(cloud, f"zones/{ZONE}/instances"), json=flex_vm())
    assert again.status_code == 409
    assert again.json()["error"]["message"] == \
        f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/tpu-serve-dev' already exists"
    bad = session.post(compute_url(cloud, f"zones/{ZONE}/instances"), json=flex_vm(name="Uprep-1to3"))
    assert bad.status_code == 400 and "Must be a match of regex" in bad.json()["error"]["message"]
    nowhere = session.post(compute_url(cloud, "zones/europe-west8-a/instances"), json=flex_vm(zone="europe-west8-a"))
    assert nowhere.status_code == 400
    assert nowhere.json()["error"]["message"].endswith(
        "Machine type with name 'ct6e-standard-1t' does not exist in zone 'europe-west8-a'.")
    assert ComputeClient(session, cloud.url).machine_type(PROJECT, "europe-west8-a", "ct6e-standard-1t") is None
    assert ComputeClient(session, cloud.url).machine_type(PROJECT, ZONE, "ct6e-standard-1t")["guestCpus"] == 44


# --- list filters ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression, expected", [
    ('labels.stack=dev', ["a", "b"]),
    ('labels.stack = "dev"', ["a", "b"]),
    (label_filter({"app": "tpu-serve", "stack": "dev"}), ["a"]),
    ('labels.app = "tpu-serve" AND labels.stack = "dev"', ["a"]),
    ('(labels.app = "tpu-serve") AND (labels.stack = "prod")', []),
    ('labels.tpu-serve-cache:*', ["b"]),
    ('labels.app != "tpu-serve"', ["b", "c"]),
    ('name = "c"', ["c"]),
])
def test_list_filters_take_the_forms_the_toolkit_writes(expression: str, expected: list[str]):
    items = [{"name": "a", "labels": {"app": "tpu-serve", "stack": "dev"}},
             {"name": "b", "labels": {"stack": "dev", "tpu-serve-cache": "dev"}}, {"name": "c"}]
    assert [i["name"] for i in items if parse_filter(expression)(i)] == expected


def test_an_unparsable_filter_is_refused_not_guessed(cloud: FakeCloud, session: requests.Session):
    response = session.get(compute_url(cloud, f"zones/{ZONE}/disks"), params={"filter": "labels.a = x OR b = y"})
    assert response.status_code == 400 and "Invalid list filter expression" in response.json()["error"]["message"]
    garbled = session.post(compute_url(cloud, f"zones/{ZONE}/disks"), data=b"{name: x",
                           headers={"Content-Type": "application/json"})
    assert garbled.status_code == 400 and garbled.json()["error"]["message"] == "Invalid JSON payload received."


def test_aggregated_lists_are_keyed_by_zone_with_warnings_for_empty_ones(cloud: FakeCloud, session: requests.Session):
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    for zone in (ZONE, "us-east5-b"):
        ensure_disk(disks, cache_spec(zone))
    body = session.get(compute_url(cloud, "aggregated/disks"), params={"filter": f"labels.{CACHE_LABEL}=dev"}).json()
    assert body["kind"] == "compute#diskAggregatedList"
    assert [d["name"] for d in body["items"][f"zones/{ZONE}"]["disks"]] == ["tpu-serve-dev-cache"]
    assert body["items"]["zones/us-east1-d"]["warning"]["code"] == "NO_RESULTS_ON_PAGE"
    assert [d.zone for d in cache.cache_disks(disks, PROJECT, "dev")] == [ZONE, "us-east5-b"]
    assert cache.cache_disks(disks, PROJECT, "prod") == []


# --- capacity, quota, slow creates ---------------------------------------------------------------------------

def test_a_stockout_arrives_on_the_operation_and_leaves_nothing(cloud: FakeCloud, session: requests.Session):
    """The text is provider_errors.STOCKOUT_WITH_SUGGESTION's once the provider renders it: one copy of it."""
    cloud.capacity.update({("us-east5-b", "ct6e-standard-1t"): 0, (ZONE, "ct6e-standard-1t"): 1,
                           ("us-central1-b", "ct6e-standard-1t"): 8})
    operation = poll(session, cloud, insert(session, cloud, flex_vm(zone="us-east5-b"), "us-east5-b"))
    assert operation["status"] == "DONE" and operation["httpErrorStatusCode"] == 503
    [error] = operation["error"]["errors"]
    assert error["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    assert "Error waiting for instance to create: " + provider_error_text(operation["error"]) == \
        provider_errors.STOCKOUT_WITH_SUGGESTION
    assert cloud.inventory() == []  # no VM and no boot disk: a failed create leaves nothing
    with pytest.raises(ComputeApiError, match="does not have enough resources") as raised:
        ZonalDisks(session, cloud.url, poll_s=0).wait(PROJECT, "us-east5-b", operation)
    assert raised.value.status == 503

    # The one chip of europe-west4-a is taken by the first VM; with no other zone left, the plain stockout.
    cloud.capacity[("us-central1-b", "ct6e-standard-1t")] = 0
    poll(session, cloud, insert(session, cloud, flex_vm()))
    failed = poll(session, cloud, insert(session, cloud, flex_vm(name="second")))
    assert failed["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert failed["error"]["errors"][0]["message"] == provider_errors.STOCKOUT.removeprefix(
        "Error waiting for instance to create: ").replace("us-east5-a", ZONE)
    assert kinds(cloud) == [("disk", "tpu-serve-dev"), ("instance", "tpu-serve-dev")]


def test_the_regions_tpu_quota_refuses_on_the_operation_in_the_providers_words(cloud: FakeCloud,
                                                                               session: requests.Session):
    cloud.quota["us-east5"] = 0
    operation = poll(session, cloud, insert(session, cloud, flex_vm(zone="us-east5-a"), "us-east5-a"))
    assert operation["error"]["errors"][0]["code"] == "QUOTA_EXCEEDED"
    assert "Error waiting for instance to create: " + provider_error_text(operation["error"]) == \
        provider_errors.TPU_FAMILY_QUOTA
    cloud.quota["us-east5"] = 4  # four chips: one 4t VM, and nothing more in the region
    assert "error" not in poll(session, cloud, insert(session, cloud, flex_vm(machine_type="ct6e-standard-4t",
                                                                             zone="us-east5-a"), "us-east5-a"))
    again = poll(session, cloud, insert(session, cloud, flex_vm(name="other", zone="us-east5-b"), "us-east5-b"))
    assert "Limit: 4.0 in region us-east5." in again["error"]["errors"][0]["message"]
    assert "\tlimit = 4\n" in provider_error_text(again["error"])


def test_a_create_that_times_out_appears_later(cloud: FakeCloud, session: requests.Session):
    """The client gives up while the operation runs; the VM is there (PROVISIONING, not billed) and runs later."""
    cloud.create_delay_s[ZONE] = 900
    operation = poll(session, cloud, insert(session, cloud, flex_vm()), times=20)
    assert operation["status"] == "RUNNING"
    assert [(r.kind, r.status, r.billing) for r in cloud.inventory() if r.kind == "instance"] == [
        ("instance", "PROVISIONING", False)]
    cloud.clock.advance(900)
    assert poll(session, cloud, operation)["status"] == "DONE"
    vm = cloud.instance("tpu-serve-dev", ZONE)
    assert vm["status"] == "RUNNING" and vm["lastStartTimestamp"] > vm["creationTimestamp"]
    cloud.clock.advance(HOUR)
    assert cloud.bill().usd("instance", "tpu-serve-dev") == pytest.approx(PRICE_PER_CHIP_HOUR)


# --- flex-start ---------------------------------------------------------------------------------------------------

def test_flex_start_deletes_the_vm_at_its_end_and_keeps_the_cache_disk(cloud: FakeCloud, session: requests.Session):
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    ensure_disk(disks, cache_spec())
    poll(session, cloud, insert(session, cloud, flex_vm(max_run_s=2 * 3600, cache_disk="tpu-serve-dev-cache")))
    vm = cloud.instance("tpu-serve-dev", ZONE)
    assert vm["resourceStatus"]["scheduling"]["terminationTimestamp"] == "2026-11-28T20:00:00.000-08:00"  # +2 h
    attached = disks.get(PROJECT, ZONE, "tpu-serve-dev-cache")
    assert attached["users"] == [vm["selfLink"]] and attached["lastAttachTimestamp"] == vm["lastStartTimestamp"]
    with pytest.raises(ComputeApiError, match="is already being used by") as refused:
        disks.delete(PROJECT, ZONE, "tpu-serve-dev-cache")  # 400 resourceInUseByAnotherResource
    assert refused.value.status == 400

    cloud.clock.advance(2 * HOUR - 1)
    assert cloud.instance("tpu-serve-dev", ZONE) is not None
    cloud.clock.advance(1)
    assert cloud.instance("tpu-serve-dev", ZONE) is None
    [kept] = cloud.inventory()
    assert (kept.kind, kept.name, kept.attached_to, kept.billing) == ("disk", "tpu-serve-dev-cache", (), True)
    left = disks.get(PROJECT, ZONE, "tpu-serve-dev-cache")
    assert "users" not in left and left["lastDetachTimestamp"] == "2026-11-28T20:00:00.000-08:00"
    warm = cache.cache_disks(disks, PROJECT, "dev")
    assert warm[0].last_attached == attached["lastAttachTimestamp"] and warm[0].users == ()


def test_a_termination_time_before_the_max_run_ends_the_vm_then(cloud: FakeCloud, session: requests.Session):
    body = flex_vm(max_run_s=4 * 3600)
    body["scheduling"]["terminationTime"] = "2026-11-29T03:00:00Z"
    poll(session, cloud, insert(session, cloud, body))
    assert cloud.instance("tpu-serve-dev", ZONE)["resourceStatus"]["scheduling"]["terminationTimestamp"] == \
        "2026-11-28T19:00:00.000-08:00"
    cloud.clock.advance(HOUR)
    assert cloud.inventory() == []
    assert cloud.bill().usd("instance") == pytest.approx(PRICE_PER_CHIP_HOUR)


def test_the_bill_of_a_known_timeline(cloud: FakeCloud, session: requests.Session):
    """A 100 GB cache disk for 5 h; a flex-start v6e-4t VM (its 100 GB boot disk with it) for its 3 h max run;
    an e2-standard-4 VM for 1 h behind a Cloud NAT; a bucket holding 1 MiB for 2 h."""
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    ensure_disk(disks, cache_spec())
    poll(session, cloud, insert(session, cloud, flex_vm(machine_type="ct6e-standard-4t", max_run_s=3 * 3600,
                                                        cache_disk="tpu-serve-dev-cache")))
    session.post(compute_url(cloud, "regions/europe-west4/routers"), json={
        "name": "router", "network": "global/networks/default", "nats": [
            {"name": "nat", "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
             "natIpAllocateOption": "AUTO_ONLY"}]})
    proxy = {"name": "proxy", "machineType": f"zones/{ZONE}/machineTypes/e2-standard-4",
             "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "20", "diskType": "pd-balanced"}}]}
    poll(session, cloud, insert(session, cloud, proxy))
    bucket = ensure_bucket(Buckets(session, cloud.url), BucketSpec(PROJECT, "b-dev", "europe-west4", {}))[0]
    session.post(f"{cloud.url}/upload/storage/v1/b/{bucket['name']}/o", params={"uploadType": "media", "name": "x"},
                 data=b"\0" * 2**20)
    nat = next(r for r in cloud.inventory() if r.kind == "nat")
    assert nat.detail["vms"] == ("proxy", "tpu-serve-dev") and nat.billing
    cloud.clock.advance(HOUR)
    poll(session, cloud, session.delete(compute_url(cloud, f"zones/{ZONE}/instances/proxy")).json())
    cloud.clock.advance(HOUR)
    Buckets(session, cloud.url).delete(bucket["name"])
    cloud.clock.advance(3 * HOUR)  # the TPU VM ran out at 3 h

    bill = cloud.bill()
    hyperdisk = HYPERDISK_BALANCED_USD_PER_GB_MONTH / HOURS_PER_MONTH
    e2_standard_4 = 4 * PRICES["e2-vcpu"].usd + 16 * PRICES["e2-memory"].usd
    expected = {("disk", "tpu-serve-dev-cache"): 100 * hyperdisk * 5, ("disk", "tpu-serve-dev"): 100 * hyperdisk * 3,
                ("instance", "tpu-serve-dev"): 4 * PRICE_PER_CHIP_HOUR * 3, ("instance", "proxy"): e2_standard_4,
                ("disk", "proxy"): 20 * PRICES["pd-balanced"].usd / HOURS_PER_MONTH,
                ("nat", "nat"): 2 * PRICES["nat-vm"].usd + PRICES["nat-ip"].usd  # 2 VMs for 1 h,
                + 2 * (PRICES["nat-vm"].usd + PRICES["nat-ip"].usd),  # then the TPU VM alone for 2 h
                ("bucket", "b-dev"): 2**-10 * PRICES["gcs-standard"].usd / HOURS_PER_MONTH * 2}
    assert {(line.kind, line.name): line.usd for line in bill.lines} == pytest.approx(expected, abs=1e-6)
    assert bill.total == pytest.approx(sum(expected.values()), abs=1e-5)
    assert bill.until == "2026-11-29T07:00:00.000Z" and bill.unpriced == ()
    assert kinds(cloud) == [("disk", "tpu-serve-dev-cache"), ("nat", "nat"), ("router", "router")]
    assert {r.name: r.billing for r in cloud.inventory()} == {"tpu-serve-dev-cache": True, "nat": False,
                                                              "router": False}


def test_prices_name_their_source():
    assert all(price.source and price.checked for price in PRICES.values())
    assert machine_price_per_hour("ct6e-standard-8t", "FLEX_START") == (8 * PRICE_PER_CHIP_HOUR,
                                                                        "tpu-v6e-flex-start")
    assert machine_price_per_hour("ct6e-standard-1t", "STANDARD")[0] is None  # not guessed


# --- disks and machine types ---------------------------------------------------------------------------------

def test_disks_grow_only_and_the_cache_client_adopts_what_exists(cloud: FakeCloud, session: requests.Session):
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    created, adopted = ensure_disk(disks, cache_spec(size=100))
    assert not adopted and (created["sizeGb"], created["provisionedIops"], created["provisionedThroughput"]) == (
        "100", "3000", "140")
    grown, adopted = ensure_disk(disks, cache_spec(size=150))
    assert adopted and grown["sizeGb"] == "150"
    with pytest.raises(ComputeApiError, match="New disk size '120' GiB must be larger than existing size '150' GiB"):
        disks.resize(PROJECT, ZONE, "tpu-serve-dev-cache", 120)
    explicit = session.post(compute_url(cloud, f"zones/{ZONE}/disks"), json={
        "name": "fast", "sizeGb": "200", "type": f"zones/{ZONE}/diskTypes/hyperdisk-balanced",
        "provisionedIops": "6000", "provisionedThroughput": "290"}).json()
    poll(session, cloud, explicit)
    assert disks.get(PROJECT, ZONE, "fast")["provisionedIops"] == "6000"
    disks.delete(PROJECT, ZONE, "tpu-serve-dev-cache")
    assert [r.name for r in cloud.inventory()] == ["fast"]


def test_attach_detach_and_a_disk_in_use_elsewhere(cloud: FakeCloud, session: requests.Session):
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    ensure_disk(disks, cache_spec())
    for name in ("one", "two"):
        poll(session, cloud, insert(session, cloud, flex_vm(name=name)))
    attach = {"source": f"projects/{PROJECT}/zones/{ZONE}/disks/tpu-serve-dev-cache", "deviceName": "tpu-serve-cache"}
    assert "error" not in poll(session, cloud, session.post(
        compute_url(cloud, f"zones/{ZONE}/instances/one/attachDisk"), json=attach).json())
    busy = poll(session, cloud, session.post(compute_url(cloud, f"zones/{ZONE}/instances/two/attachDisk"),
                                             json=attach).json())
    assert busy["error"]["errors"][0]["code"] == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"
    assert busy["error"]["errors"][0]["message"] == (f"The disk resource 'projects/{PROJECT}/zones/{ZONE}/disks/"
                                                     f"tpu-serve-dev-cache' is already being used by 'projects/"
                                                     f"{PROJECT}/zones/{ZONE}/instances/one'")
    cloud.clock.advance(60)
    poll(session, cloud, session.post(compute_url(cloud, f"zones/{ZONE}/instances/one/detachDisk"),
                                      params={"deviceName": "tpu-serve-cache"}).json())
    disk = disks.get(PROJECT, ZONE, "tpu-serve-dev-cache")
    assert "users" not in disk and disk["lastDetachTimestamp"] > disk["lastAttachTimestamp"]
    assert [d["deviceName"] for d in cloud.instance("one", ZONE)["disks"]] == ["persistent-disk-0"]


def test_a_running_vm_keeps_its_machine_type_and_a_stopped_one_changes_it(cloud: FakeCloud,
                                                                          session: requests.Session):
    cloud.capacity[(ZONE, "ct6e-standard-4t")] = 4
    poll(session, cloud, insert(session, cloud, flex_vm()))
    url = compute_url(cloud, f"zones/{ZONE}/instances/tpu-serve-dev")
    change = {"machineType": f"zones/{ZONE}/machineTypes/ct6e-standard-4t"}
    refused = session.post(f"{url}/setMachineType", json=change)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == "Instance is starting or running."
    poll(session, cloud, session.post(f"{url}/stop").json())
    vm = cloud.instance("tpu-serve-dev", ZONE)
    assert vm["status"] == "TERMINATED" and "resourceStatus" not in vm  # the planned end is cleared
    poll(session, cloud, session.post(f"{url}/setMachineType", json=change).json())
    assert "error" not in poll(session, cloud, session.post(f"{url}/start").json())
    vm = cloud.instance("tpu-serve-dev", ZONE)
    assert vm["status"] == "RUNNING" and vm["machineType"].endswith("ct6e-standard-4t")
    assert next(r for r in cloud.inventory() if r.kind == "instance").usd_per_hour == 4 * PRICE_PER_CHIP_HOUR


def test_labels_change_under_their_fingerprint(cloud: FakeCloud, session: requests.Session):
    poll(session, cloud, insert(session, cloud, flex_vm()))
    url = compute_url(cloud, f"zones/{ZONE}/instances/tpu-serve-dev/setLabels")
    current = cloud.instance("tpu-serve-dev", ZONE)["labelFingerprint"]
    poll(session, cloud, session.post(url, json={"labels": {"stack": "prod"}, "labelFingerprint": current}).json())
    stale = session.post(url, json={"labels": {"stack": "x"}, "labelFingerprint": current})
    assert stale.status_code == 412 and stale.json()["error"]["message"] == \
        "Labels fingerprint either invalid or resource labels have changed"
    assert [r.labels for r in cloud.inventory() if r.kind == "instance"] == [{"stack": "prod"}]


def test_guest_attributes_and_serial_output_set_from_python(cloud: FakeCloud, session: requests.Session):
    poll(session, cloud, insert(session, cloud, flex_vm()))
    client, vm = ComputeClient(session, cloud.url), Instance(PROJECT, ZONE, "tpu-serve-dev")
    assert client.guest_attributes(vm, GUEST_ATTRIBUTE_NAMESPACE) == {}  # 404 until the VM writes one
    cloud.set_guest_attributes("tpu-serve-dev", ZONE, {"stage": "serving", "config-hash": "5e1f"},
                               namespace=GUEST_ATTRIBUTE_NAMESPACE)
    assert client.guest_attributes(vm, GUEST_ATTRIBUTE_NAMESPACE) == {"config-hash": "5e1f", "stage": "serving"}
    cloud.append_serial_output("tpu-serve-dev", ZONE, "boot\nready\n")
    assert client.serial_output(vm) == "boot\nready\n"


# --- routers, NAT, firewalls -------------------------------------------------------------------------------------

def test_a_network_takes_one_all_subnetworks_nat_per_region(cloud: FakeCloud, session: requests.Session):
    nat = {"name": "nat", "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
           "natIpAllocateOption": "AUTO_ONLY"}
    routers = compute_url(cloud, "regions/europe-west4/routers")

    def poll_region(operation: dict[str, Any]) -> dict[str, Any]:
        return session.get(compute_url(cloud, f"regions/europe-west4/operations/{operation['name']}")).json()

    assert poll_region(session.post(routers, json={"name": "dev-router", "network": "global/networks/default",
                                                   "nats": [nat]}).json())["status"] == "DONE"
    second = session.post(routers, json={"name": "prod-router", "network": "global/networks/default",
                                         "nats": [{**nat, "name": "prod-nat"}]})
    assert second.status_code == 400
    assert second.json()["error"]["message"] == (
        "Invalid value for field 'resource.nats[0].sourceSubnetworkIpRangesToNat': 'ALL_SUBNETWORKS_ALL_IP_RANGES'. "
        "Can not create new Nats since a Nat with option ALL_SUBNETWORKS_ALL_IP_RANGES exists.")
    # The provider's RouterNat is a PATCH of the router: a router without NAT takes none either.
    poll_region(session.post(routers, json={"name": "bare", "network": "global/networks/default"}).json())
    patched = session.patch(f"{routers}/bare", json={"nats": [{**nat, "name": "prod-nat"}]})
    assert patched.status_code == 400
    # Re-sending the NAT a router already holds is no new NAT; another region is another story.
    assert session.patch(f"{routers}/dev-router", json={"nats": [{**nat, "logConfig": {"enable": True}}]}).ok
    assert session.post(compute_url(cloud, "regions/us-east5/routers"), json={
        "name": "prod-router", "network": "global/networks/default", "nats": [nat]}).ok
    body = session.get(compute_url(cloud, "aggregated/routers")).json()["items"]
    assert [r["name"] for r in body["regions/europe-west4"]["routers"]] == ["bare", "dev-router"]
    assert [(r.kind, r.name, r.location, r.attached_to) for r in cloud.inventory() if r.kind == "nat"] == [
        ("nat", "nat", "europe-west4", ("dev-router",)), ("nat", "nat", "us-east5", ("prod-router",))]


def test_firewalls_are_global(cloud: FakeCloud, session: requests.Session):
    url = compute_url(cloud, "global/firewalls")
    rule = {"name": "tpu-serve-dev-iap", "network": "global/networks/default", "sourceRanges": ["35.235.240.0/20"],
            "targetTags": ["tpu-serve-dev"], "allowed": [{"IPProtocol": "tcp", "ports": ["22", "8000"]}]}
    operation = session.post(url, json=rule).json()
    assert session.get(compute_url(cloud, f"global/operations/{operation['name']}")).json()["status"] == "DONE"
    assert session.post(url, json=rule).status_code == 409
    assert session.get(f"{url}/tpu-serve-dev-iap").json()["network"].endswith("/global/networks/default")
    assert kinds(cloud) == [("firewall", "tpu-serve-dev-iap")]
    session.delete(f"{url}/tpu-serve-dev-iap")
    assert "items" not in session.get(url).json()


# --- Cloud Storage ------------------------------------------------------------------------------------------------

def upload(session: requests.Session, cloud: FakeCloud, bucket: str, name: str, data: bytes,
           **preconditions: int) -> requests.Response:
    return session.post(f"{cloud.url}/upload/storage/v1/b/{bucket}/o", data=data,
                        params={"uploadType": "media", "name": name, **preconditions})


def test_object_generations_and_preconditions(cloud: FakeCloud, session: requests.Session):
    """Create-only uploads (ifGenerationMatch=0, as vm/compile_cache.py writes), and writes against a generation."""
    ensure_bucket(Buckets(session, cloud.url), BucketSpec(PROJECT, "cache", "europe-west4", {}))
    first = upload(session, cloud, "cache", "xla/entry", b"holder-a", ifGenerationMatch=0)
    assert first.status_code == 200
    taken = upload(session, cloud, "cache", "xla/entry", b"holder-b", ifGenerationMatch=0)
    assert taken.status_code == 412 and taken.json()["error"]["errors"][0]["reason"] == "conditionNotMet"
    generation = int(first.json()["generation"])
    cloud.clock.advance(1)
    renewed = upload(session, cloud, "cache", "xla/entry", b"holder-a", ifGenerationMatch=generation)
    assert int(renewed.json()["generation"]) > generation and renewed.json()["metageneration"] == "1"
    assert upload(session, cloud, "cache", "xla/entry", b"x", ifGenerationMatch=generation).status_code == 412

    url = f"{cloud.url}/storage/v1/b/cache/o/{requests.utils.quote('xla/entry', safe='')}"
    patched = session.patch(url, params={"ifMetagenerationMatch": 1}, json={"metadata": {"expires": "T+60"}})
    assert patched.json()["metageneration"] == "2"
    assert session.patch(url, params={"ifMetagenerationMatch": 1}, json={}).status_code == 412
    media = session.get(url, params={"alt": "media"})
    assert media.content == b"holder-a" and media.headers["x-goog-generation"] == renewed.json()["generation"]
    assert session.delete(url, params={"ifGenerationMatch": generation}).status_code == 412
    assert session.delete(url, params={"ifGenerationMatch": renewed.json()["generation"]}).status_code == 204
    missing = session.get(url)
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "No such object: cache/xla/entry"


def test_one_create_only_upload_wins_a_race(cloud: FakeCloud):
    """Requests are served concurrently and the state is locked: of eight creates with ifGenerationMatch=0, one."""
    from concurrent.futures import ThreadPoolExecutor

    ensure_bucket(Buckets(requests.Session(), cloud.url), BucketSpec(PROJECT, "cache", "US", {}))
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: upload(requests.Session(), cloud, "cache", "xla/entry", str(i).encode(),
                                               ifGenerationMatch=0).status_code, range(8)))
    assert sorted(codes) == [200] + [412] * 7


def test_buckets_are_global_and_refuse_deletion_while_not_empty(cloud: FakeCloud, session: requests.Session):
    buckets = Buckets(session, cloud.url)
    spec = BucketSpec(PROJECT, f"{PROJECT}-tpu-serve-dev-cache", "europe-west4", {CACHE_LABEL: "dev"})
    created, adopted = ensure_bucket(buckets, spec)
    assert not adopted and (created["location"], created["locationType"]) == ("EUROPE-WEST4", "region")
    assert ensure_bucket(buckets, spec) == (created, True)
    mine = session.post(f"{cloud.url}/storage/v1/b", params={"project": PROJECT}, json={"name": spec.name})
    assert mine.status_code == 409 and "you already own it" in mine.json()["error"]["message"]
    theirs = session.post(f"{cloud.url}/storage/v1/b", params={"project": "someone-else"}, json={"name": spec.name})
    assert theirs.status_code == 409 and theirs.json()["error"]["message"].startswith(
        "The requested bucket name is not available.")
    assert buckets.list("someone-else") == [] and [b["name"] for b in buckets.list(PROJECT)] == [spec.name]

    upload(session, cloud, spec.name, "xla/key/entry", b"compiled")
    refused = session.delete(f"{cloud.url}/storage/v1/b/{spec.name}")
    assert refused.status_code == 409 and refused.json()["error"]["message"] == \
        "The bucket you tried to delete was not empty."
    assert [o["name"] for o in buckets.objects(spec.name, "xla/")] == ["xla/key/entry"]
    buckets.delete(spec.name)  # objects first, then the bucket
    assert buckets.get(spec.name) is None and cloud.inventory() == []


def test_object_listing_pages_and_delimits(cloud: FakeCloud, session: requests.Session):
    ensure_bucket(Buckets(session, cloud.url), BucketSpec(PROJECT, "many", "US", {}))
    for name in ("a/1", "a/2", "b/1", "top"):
        upload(session, cloud, "many", name, b"")
    url = f"{cloud.url}/storage/v1/b/many/o"
    delimited = session.get(url, params={"delimiter": "/"}).json()
    assert delimited["prefixes"] == ["a/", "b/"] and [o["name"] for o in delimited["items"]] == ["top"]
    first = session.get(url, params={"maxResults": 3}).json()
    rest = session.get(url, params={"maxResults": 3, "pageToken": first["nextPageToken"]}).json()
    assert [o["name"] for o in first["items"] + rest["items"]] == ["a/1", "a/2", "b/1", "top"]
    assert "nextPageToken" not in rest and len(Buckets(session, cloud.url).objects("many")) == 4


def test_storage_write_rate_limits_when_switched_on(cloud: FakeCloud, session: requests.Session):
    cloud.rate_limits.gcs_object_write_interval_s = 1.0
    ensure_bucket(Buckets(session, cloud.url), BucketSpec(PROJECT, "cache", "US", {}))
    assert upload(session, cloud, "cache", "xla/entry", b"1").ok
    throttled = upload(session, cloud, "cache", "xla/entry", b"2")
    assert throttled.status_code == 429
    assert throttled.json()["error"]["message"].startswith("The object cache/xla/entry exceeded the rate limit for object "
                                                           "mutation operations")
    assert upload(session, cloud, "cache", "other", b"2").ok  # another object name is another limit
    cloud.clock.advance(1)
    assert upload(session, cloud, "cache", "xla/entry", b"2").ok


def test_compute_rate_quota_when_switched_on(cloud: FakeCloud, session: requests.Session):
    cloud.rate_limits.compute_per_minute = {"read": 2}
    url = compute_url(cloud, f"zones/{ZONE}/machineTypes/ct6e-standard-1t")
    assert [session.get(url).status_code for _ in range(3)] == [200, 200, 403]
    error = session.get(url).json()["error"]
    assert error["errors"][0]["reason"] == "rateLimitExceeded"
    assert error["message"].startswith("Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
                                       "minute' of service 'compute.googleapis.com'")
    assert session.get(compute_url(cloud, f"zones/{ZONE}/instances")).ok  # lists are another group
    cloud.clock.advance(60)
    assert session.get(url).ok


# --- IAM, Secret Manager, Monitoring --------------------------------------------------------------------------

def test_service_accounts(cloud: FakeCloud, session: requests.Session):
    url = f"{cloud.url}/v1/projects/{PROJECT}/serviceAccounts"
    assert session.get(url).json() == {}
    too_long = session.post(url, json={"accountId": "gemma4-serving-prod-r1-extra-long"})
    assert too_long.status_code == 400 and too_long.json()["error"]["message"] == \
        'The account ID "gemma4-serving-prod-r1-extra-long" does not have a length between 6 and 30.'
    created = session.post(url, json={"accountId": "tpu-serve-dev", "serviceAccount": {"displayName": "dev"}}).json()
    assert created["email"] == f"tpu-serve-dev@{PROJECT}.iam.gserviceaccount.com"
    duplicate = session.post(url, json={"accountId": "tpu-serve-dev"})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["status"] == "ALREADY_EXISTS"
    assert duplicate.json()["error"]["message"] == \
        f"Service account tpu-serve-dev already exists within project projects/{PROJECT}."
    assert session.get(f"{url}/{created['email']}").json() == created
    assert session.get(f"{url}/{created['uniqueId']}").json() == created
    assert kinds(cloud) == [("serviceAccount", created["email"])]
    session.delete(f"{url}/{created['email']}")
    assert session.get(f"{url}/{created['email']}").status_code == 404 and cloud.inventory() == []


def test_secrets_and_their_versions(cloud: FakeCloud, session: requests.Session):
    url = f"{cloud.url}/v1/projects/{PROJECT}/secrets"
    secret = session.post(url, params={"secretId": "hf-token"}, json={"replication": {"automatic": {}}}).json()
    assert secret["name"].startswith("projects/") and secret["name"].endswith("/secrets/hf-token")
    assert session.post(url, params={"secretId": "hf-token"}, json={}).status_code == 409
    version = session.post(f"{url}/hf-token:addVersion", json={"payload": {"data": "aGZfeHl6"}}).json()
    assert version["state"] == "ENABLED" and version["name"].endswith("/versions/1")
    assert session.get(f"{url}/hf-token/versions/latest:access").json()["payload"]["data"] == "aGZfeHl6"
    assert session.get(f"{cloud.url}/v1/{version['name']}:access").ok  # by the number in its name
    [record] = cloud.inventory()
    assert (record.kind, record.billing, record.usd_per_month) == ("secret", True, PRICES["secret-version"].usd)
    session.delete(f"{url}/hf-token")
    assert session.get(f"{url}/hf-token").status_code == 404 and cloud.inventory() == []


def test_dashboards_and_alert_policies_are_inventoried(cloud: FakeCloud, session: requests.Session):
    dashboard = session.post(f"{cloud.url}/v1/projects/{PROJECT}/dashboards",
                             json={"displayName": "tpu-serve dev", "mosaicLayout": {"tiles": []}}).json()
    policy = session.post(f"{cloud.url}/v3/projects/{PROJECT}/alertPolicies",
                          json={"displayName": "tpu-serve dev: not serving", "conditions": []}).json()
    assert kinds(cloud) == [("alertPolicy", "tpu-serve dev: not serving"), ("dashboard", "tpu-serve dev")]
    assert dashboard["name"].split("/")[1].isdigit()  # the project number, which paths take as well
    session.delete(f"{cloud.url}/v1/{dashboard['name']}")
    session.delete(f"{cloud.url}/v3/{policy['name']}")
    assert cloud.inventory() == []


# --- the toolkit's own commands and clients ---------------------------------------------------------------------

def test_orphans_are_found_and_deleted_and_the_inventory_says_so(cloud: FakeCloud, session: requests.Session):
    """A VM the state does not hold and an unattached stack disk are orphans; the cache disk is kept on purpose."""
    compute = ComputeClient(session, cloud.url)
    disks = ZonalDisks(session, cloud.url, poll_s=0)
    ensure_disk(disks, cache_spec())
    poll(session, cloud, insert(session, cloud, flex_vm()))
    poll(session, cloud, session.post(compute_url(cloud, f"zones/{ZONE}/disks"),
                                      json={"name": "leftover", "sizeGb": "10", "labels": STACK_LABELS}).json())
    found = orphans.find_orphans(compute, PROJECT, [ZONE, "us-east5-a"], STACK_LABELS, managed=set())
    assert [(o.kind, o.name) for o in found] == [("instance", "tpu-serve-dev"), ("disk", "leftover")]
    assert all(name.startswith("operation-") for name in orphans.delete_orphans(compute, PROJECT, found))
    assert kinds(cloud) == [("disk", "tpu-serve-dev-cache")]  # Compute Engine finished the deletes
    assert orphans.find_orphans(compute, PROJECT, [ZONE], STACK_LABELS, managed=set()) == []


def test_the_cache_command_runs_with_real_credentials_against_the_fake(fake_cloud_env: FakeCloud,
                                                                       session: requests.Session):
    """`tpuserve cache ls|rm` unmodified: gce.adc_session() reads the ADC file FakeCloud.env wrote and sends its
    token; nothing leaves 127.0.0.1."""
    cloud = fake_cloud_env
    cloud.require_auth = True
    cloud.operation_polls = 0  # ZonalDisks.wait sleeps 2 s before polling an operation that is not DONE
    assert session.get(compute_url(cloud, f"zones/{ZONE}/disks")).status_code == 401  # no credentials: refused
    authorized = gce.adc_session()
    ensure_disk(ZonalDisks(authorized, cloud.url, poll_s=0), cache_spec())
    options = ["--stack", "dev", "--project", PROJECT, "--compute-url", cloud.url, "--storage-url", cloud.url]
    listed = CliRunner().invoke(cache.cache, ["ls", "--json", *options])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output)["disks"][0]["name"] == "tpu-serve-dev-cache"
    removed = CliRunner().invoke(cache.cache, ["rm", "--yes", *options])
    assert removed.exit_code == 0, removed.output
    assert cloud.inventory() == []
    assert cloud.calls[1:] and all(call.authorized for call in cloud.calls[1:])
    assert cloud.calls[0].authorized is False and authorized.credentials.token == TOKEN


def test_preflight_reads_the_same_quota_the_creates_draw_from(cloud: FakeCloud, session: requests.Session):
    from tpuserve.deploy.preflight import Endpoints, Target, preflight

    session.post(f"{cloud.url}/v1/projects/{PROJECT}/secrets", params={"secretId": "hf-token"}, json={})
    session.post(f"{cloud.url}/v1/projects/{PROJECT}/secrets/hf-token:addVersion", json={"payload": {"data": "eA=="}})
    cloud.quota["us-east5"] = 0
    endpoints = Endpoints.parse(option for option in cloud.endpoint_options() if option != "--endpoint")
    report = preflight(session, Target(PROJECT, (ZONE, "us-east5-b", "europe-west8-a"), secret="hf-token"), endpoints)
    assert not report.failed, report.as_dict()
    assert report.usable_zones == [ZONE]
    assert set(report.skipped) == {"us-east5-b", "europe-west8-a"}


def test_the_python_api_serves_without_http_and_reset_forgets(cloud: FakeCloud):
    status, operation = cloud.api("POST", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", flex_vm())
    assert status == 200 and operation["status"] == "RUNNING"
    status, found = cloud.api("GET", f"/compute/beta/projects/{PROJECT}/zones/{ZONE}/instances/tpu-serve-dev")
    assert found["selfLink"].startswith("https://www.googleapis.com/compute/beta/projects/")  # links name the version
    assert [c.method for c in cloud.calls] == ["POST", "GET"] and cloud.bill().lines == ()
    cloud.clock.advance(HOUR)
    assert cloud.bill().total > 0
    cloud.reset()
    assert cloud.inventory() == [] and cloud.calls == [] and cloud.bill().lines == ()


def test_a_shared_clock_can_follow_wall_time(session: requests.Session):
    clock = FakeClock(real_time=True)
    with FakeCloud(clock) as cloud:
        before = clock.now()
        clock.advance(10)
        assert clock.now() - before >= 10
        assert cloud.url.startswith("http://127.0.0.1:")
