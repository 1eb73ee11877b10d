"""A stack's life against the stateful fake cloud: `tpuserve up` (and `pulumi up`, `destroy`) run their real code,
the fake engine applies the real program to the cloud, and each scenario ends with what the cloud holds and bills."""

from __future__ import annotations

import json

from tests.fakes.cloud_world import World, world  # noqa: F401 - the fixture
from tpuserve.ops import up as up_module


def test_a_first_up_creates_the_stack_in_the_zone_with_capacity(world: World):
    world.cloud.capacity[("us-east5-a", "ct6e-standard-1t")] = 1
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--zones", "us-east5-a")
    assert code == 0, stderr
    assert ("instance", "us-east5-a", "tpu-serve-dev") in world.kinds("instance")
    print(world.kinds())


ZONE_STACK = {("instance", "tpu-serve-dev"), ("disk", "tpu-serve-dev"), ("disk", "tpu-serve-dev-cache")}


def held(world: World, zone: str) -> set[tuple[str, str]]:
    return {(kind, name) for kind, location, name in world.kinds() if location == zone}


def test_a_sweep_through_two_failing_zones_leaves_only_the_stack_in_the_third(world: World):
    """Each failed zone made a cache disk before its VM create failed (the VM depends on it); before this, the next
    zone's update dropped that disk from the state (retainOnDelete) and it billed on, blank, passing for warm."""
    world.cloud.capacity.update({("us-east5-a", "ct6e-standard-1t"): 0, ("us-central1-b", "ct6e-standard-1t"): 1,
                                 ("europe-west4-a", "ct6e-standard-1t"): 1})
    world.cloud.quota["us-central1"] = 0  # preflight reads 1536 elsewhere; here the create's operation refuses
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight",
                                           "--zones", "us-central1-b,us-east5-a,europe-west4-a")
    assert code == 0, stderr
    assert [(a["zone"], a["class"]) for a in verdict["attempts"]] == [
        ("us-central1-b", "quota"), ("us-east5-a", "capacity"), ("europe-west4-a", "created")]
    assert held(world, "europe-west4-a") == ZONE_STACK
    assert held(world, "us-east5-a") == held(world, "us-central1-b") == set()
    assert {kind for kind, location, _ in world.kinds() if location in ("us-east5", "us-central1")} == set()
    assert [(o["zone"], o["name"], o["deleted"]) for o in verdict["orphans"]] == [
        ("us-central1-b", "tpu-serve-dev-cache", True), ("us-east5-a", "tpu-serve-dev-cache", True)]
    assert "deleted cache disk tpu-serve-dev-cache in us-east5-a: no VM ever attached it" in stderr
    stock = verdict["inventory"]
    assert stock["billingOrphans"] == 0
    assert {(i["kind"], i["location"], i["status"]) for i in stock["items"]} >= {
        ("instance", "europe-west4-a", "in state"), ("disk", "europe-west4-a", "in state")}
    assert "orphaned" in stderr and "$0.00/month orphaned" in stderr


def test_a_create_that_times_out_and_appears_later_is_reported_and_billed_until_removed(world: World):
    """us-east5-a's insert outlives the provider's wait (the VM is not in the state); europe-west4-a works. Nobody
    may confirm (no --yes, no terminal): the VM that then appears is named with the command that removes it, and
    `up` exits 5 instead of reporting success over a TPU that bills."""
    world.cloud.capacity.update({("us-east5-a", "ct6e-standard-1t"): 1, ("europe-west4-a", "ct6e-standard-1t"): 1})
    world.cloud.create_delay_s["us-east5-a"] = 900
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json",
                                           "--zones", "us-east5-a,europe-west4-a")
    assert [(a["zone"], a["class"]) for a in verdict["attempts"]] == [("us-east5-a", "timeout"),
                                                                      ("europe-west4-a", "created")]
    assert "timeout while waiting for state to become 'DONE'" in verdict["attempts"][0]["reason"]
    assert code == 5, stderr
    orphan = [i for i in verdict["inventory"]["items"] if i["status"] == "orphan"]
    # the VM, its boot disk, and the cache disk it holds (the next zone's update dropped that from the state)
    assert {(i["kind"], i["location"], i["name"]) for i in orphan} == {
        ("instance", "us-east5-a", "tpu-serve-dev"), ("disk", "us-east5-a", "tpu-serve-dev"),
        ("disk", "us-east5-a", "tpu-serve-dev-cache")}
    assert "remove it: gcloud compute instances delete tpu-serve-dev --zone us-east5-a" in stderr
    world.cloud.clock.advance(900)  # the create finishes: the orphan runs and bills
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a")["status"] == "RUNNING"
    world.cloud.clock.advance(3600)
    assert world.cloud.bill().usd("instance", "tpu-serve-dev") > 1.35  # two VMs of that name, an hour each

    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--yes", "--skip-preflight")
    assert code == 0, stderr
    assert held(world, "us-east5-a") == set()
    assert held(world, "europe-west4-a") == ZONE_STACK
    assert verdict["inventory"]["billingOrphans"] == 0


def test_destroy_with_keep_caches_false_leaves_nothing_that_bills(world: World):
    from tpuserve.ops import destroy as destroy_module

    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            keepCaches="false")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--zones", "us-east5-a",
                                           "--skip-preflight")
    assert code == 0, stderr
    world.cloud.clock.advance(3600)
    code, verdict, stderr = world.tpuserve(destroy_module.destroy, "--stack", "dev", "--json")
    assert code == 0, stderr
    assert world.kinds("instance", "disk", "bucket", "router", "nat", "firewall", "serviceAccount") == []
    assert verdict["inventory"]["items"] == []
    def stack_bill() -> float:  # the user's own token secret is not the stack's
        bill = world.cloud.bill()
        return round(bill.total - bill.usd("secret", "hf-token"), 6)

    spent = stack_bill()
    assert 1.35 < spent < 1.5  # the VM's hour, its disks' hour
    world.cloud.clock.advance(30 * 24 * 3600)
    assert stack_bill() == spent  # nothing bills any more


def first_up(world: World, zone: str = "us-east5-a", **settings: str) -> None:
    world.cloud.capacity.update({(zone, "ct6e-standard-1t"): 1, (zone, "ct6e-standard-4t"): 4})
    world.pulumi.set_config(project="my-ml-sandbox", zone=zone, hfTokenSecretId="hf-token", **settings)
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 0, stderr


def vm_calls(world: World, since: int, name: str = "tpu-serve-dev") -> list[str]:
    """What was asked of instance `name` since call number `since`: 'POST insert', 'POST setMetadata', 'DELETE'."""
    out = []
    for call in world.cloud.calls[since:]:
        path = call.path
        if call.method == "POST" and path.endswith("/instances") and (call.body or {}).get("name") == name:
            out.append("insert")
        elif f"/instances/{name}" in path and call.method != "GET" and path.split(f"/instances/{name}")[1] in (
                "", "/setMetadata", "/setMachineType", "/detachDisk", "/attachDisk", "/setLabels"):
            out.append(f"{call.method} {path.split(f'/instances/{name}')[1] or ''}".strip())
    return out


def test_a_machine_type_change_is_refused_then_replaces_the_vm_create_first(world: World):
    """Issue #22: `-1t` -> `-4t` must never reach the running VM as an update (the provider would push the TP-4 argv
    with setMetadata, then refuse the resize). `tpuserve up` previews it, stops (exit 4) until told, then creates the
    successor under the other name while the old VM serves, and deletes the old one after."""
    first_up(world)
    calls, commands = len(world.cloud.calls), len(world.pulumi.calls())
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            machineType="ct6e-standard-4t")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 4, stderr
    assert verdict["replace"]["keys"] == ["machineType"]
    assert vm_calls(world, calls) == []  # nothing reached the VM
    assert [call[0] for call in world.pulumi.calls()[commands:] if call[0] in ("up", "preview")] == ["preview"]

    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight",
                                           "--replace-vm")
    assert code == 0, stderr
    assert vm_calls(world, calls) == ["DELETE"]  # the old VM: never updated, deleted once its successor served
    assert vm_calls(world, calls, "tpu-serve-dev-b") == ["insert"]
    order = [c.method for c in world.cloud.calls[calls:] if "/instances" in c.path and c.method != "GET"]
    assert order.index("POST") < order.index("DELETE")  # create-first
    successor = world.cloud.instance("tpu-serve-dev-b", "us-east5-a")
    assert successor["machineType"].endswith("ct6e-standard-4t")
    assert world.pulumi.outputs()["instanceName"] == "tpu-serve-dev-b"
    assert held(world, "us-east5-a") >= {("instance", "tpu-serve-dev-b"), ("disk", "tpu-serve-dev-b"),
                                         ("disk", "tpu-serve-dev-cache-b")}
    assert ("instance", "tpu-serve-dev") not in held(world, "us-east5-a")
    kept = {(i["kind"], i["name"]) for i in verdict["inventory"]["items"] if i["status"] == "kept"}
    assert ("disk", "tpu-serve-dev-cache") in kept  # slot a's disk: warm, the next replacement's


def test_a_bare_pulumi_up_of_a_machine_type_change_leaves_the_serving_vm_alone(world: World):
    """Without `tpuserve up` to switch the name, the create-first successor cannot be created beside the old VM (a
    name exists once per zone): the update fails and the old VM still serves its old config."""
    first_up(world)
    calls = len(world.cloud.calls)
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            machineType="ct6e-standard-4t")
    before = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    run = world.run_pulumi("up", "--yes", "--skip-preview", "--stack", "dev")
    assert run.returncode == 255
    assert "already exists" in run.stdout
    assert vm_calls(world, calls) == ["insert"]  # the successor's create, refused: the old VM got no call
    after = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    assert (after["status"], after["id"], after["metadata"]) == ("RUNNING", before["id"], before["metadata"])


def test_an_in_place_change_updates_the_served_config_and_keeps_the_vm(world: World):
    first_up(world)
    before = world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"]
    calls = len(world.cloud.calls)
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            maxModelLen="32768")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 0, stderr
    assert "in place: the VM keeps serving, the supervisor restarts vLLM with the new config" in stderr
    assert vm_calls(world, calls) == ["POST /setMetadata"]
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"] == before
    served = [i["value"] for i in world.cloud.instance("tpu-serve-dev", "us-east5-a")["metadata"]["items"]
              if i["key"] == "tpu-serve-config"][0]
    assert "32768" in served


def test_a_new_build_of_the_image_family_never_replaces_the_vm_and_a_new_boot_image_does(world: World):
    """The disk records the dated build its family resolved to; the provider does not equate it with an '-amd64-'
    family (docs/design/boot-image.md). A refresh after a new build ships changes nothing; a bootImage change replaces
    the VM (create-first, in the other slot)."""
    first_up(world)
    vm = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    boot = world.cloud.disks[("my-ml-sandbox", "us-east5-a", vm["disks"][0]["source"].rsplit("/", 1)[1])]
    assert boot["sourceImage"].endswith("/images/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20261125")
    world.cloud.image_build = "v20261202"
    calls = len(world.cloud.calls)
    code, _, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 0, stderr
    assert vm_calls(world, calls) == [] and world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"] == vm["id"]
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            bootImage="projects/ubuntu-os-accelerator-images/global/images/ubuntu-accel-2204-amd64-tpu-"
                                      "v5e-v5p-v6e-v20261125")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight",
                                           "--replace-vm")
    assert code == 0, stderr
    assert "bootImage" in stderr and world.cloud.instance("tpu-serve-dev", "us-east5-a") is None
    assert world.cloud.instance("tpu-serve-dev-b", verdict["zone"]) is not None  # its successor, created first


def test_removing_the_cache_disk_replaces_the_vm_instead_of_detaching_a_mounted_disk(world: World):
    first_up(world)
    calls = len(world.cloud.calls)
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            cacheDiskSizeGb="0")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 4, stderr
    assert "cacheDiskSizeGb" in verdict["replace"]["keys"]
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight",
                                           "--replace-vm")
    assert code in (0, 5), stderr
    assert not any("detachDisk" in c.path for c in world.cloud.calls[calls:])


def test_growing_the_cache_disk_resizes_it_in_place(world: World):
    first_up(world)
    before = world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"]
    world.pulumi.set_config(project="my-ml-sandbox", zone="us-east5-a", hfTokenSecretId="hf-token",
                            cacheDiskSizeGb="200")
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 0, stderr
    assert world.cloud.disk("tpu-serve-dev-cache", "us-east5-a")["sizeGb"] == "200"
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"] == before


def test_destroy_with_keep_caches_true_keeps_the_warm_disk_and_bucket_and_says_what_they_cost(world: World):
    from tpuserve.ops import destroy as destroy_module

    first_up(world)
    code, verdict, stderr = world.tpuserve(destroy_module.destroy, "--stack", "dev", "--json")
    assert code == 0, stderr
    assert world.kinds("instance", "router", "nat", "firewall", "serviceAccount") == []
    assert world.kinds("disk", "bucket") == [("bucket", "US-EAST5", "my-ml-sandbox-tpu-serve-dev-cache"),
                                             ("disk", "us-east5-a", "tpu-serve-dev-cache")]
    kept = {(i["kind"], i["name"]): i for i in verdict["inventory"]["items"]}
    assert {key: item["status"] for key, item in kept.items()} == {
        ("disk", "tpu-serve-dev-cache"): "kept", ("bucket", "my-ml-sandbox-tpu-serve-dev-cache"): "kept"}
    assert kept[("disk", "tpu-serve-dev-cache")]["perMonthUsd"] == 8.0  # 100 GB at the free throughput and IOPS
    assert "tpuserve cache rm --stack dev --project my-ml-sandbox --bucket" in stderr
    world.cloud.clock.advance(24 * 3600)
    assert {line.kind for line in world.cloud.bill().lines if line.usd} >= {"disk"}  # what is kept bills on



# --- the queue: no zone has a TPU free now, so `tpuserve up` waits in Compute Engine's queue --------------------------

def queued_world(world: World, monkeypatch) -> None:
    """The toolkit's waits on the cloud's clock, and no TPU free in us-east5-a."""
    from tpuserve.deploy import queue as queues
    from tpuserve.ops import renew as renew_module

    world.on_the_clock(monkeypatch, up_module, queues, renew_module)
    world.cloud.capacity[("us-east5-a", "ct6e-standard-1t")] = 0


def queued_insert(world: World) -> dict:
    inserts = [c for c in world.cloud.calls if c.method == "POST" and c.path.endswith("/instances")
               and (c.body or {}).get("params")]
    assert len(inserts) == 1, inserts
    return inserts[0].body


def test_a_vm_granted_from_the_queue_ends_adopted_serving_and_never_replaced(world: World, monkeypatch):
    """No chip now: after the immediate try, the VM waits PENDING (billing nothing) until a chip frees 40 minutes
    later, boots, and the next update adopts it (import, no create): it serves, the state holds it, and the next
    `tpuserve up` leaves it as it is."""
    queued_world(world, monkeypatch)
    world.cloud.schedule_capacity("us-east5-a", "ct6e-standard-1t", 1, after_s=40 * 60)
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--zones", "us-east5-a",
                                           "--skip-preflight")
    assert code == 0, stderr
    assert verdict["queue"] == [{"zone": "us-east5-a", "name": "tpu-serve-dev", "outcome": "running",
                                 "waitedSeconds": 2400, "reason": None}]
    assert [(a["zone"], a["class"]) for a in verdict["attempts"]] == [("us-east5-a", "capacity"),
                                                                      ("us-east5-a", "created")]
    assert "queued in us-east5-a for 12 min, 1h 48m left" in stderr  # a line per poll
    assert "granted in us-east5-a after 40 min: tpu-serve-dev runs" in stderr
    body = queued_insert(world)
    assert body["params"] == {"requestValidForDuration": {"seconds": "7200"}}  # the deadline's 2 h, Google's most
    vm = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    assert vm["status"] == "RUNNING" and vm["lastStartTimestamp"] > vm["creationTimestamp"]  # started when granted
    outputs = world.pulumi.outputs()
    assert outputs["instanceName"] == "tpu-serve-dev" and outputs["vmSlot"] == "a" and "vmInsertBody" not in outputs
    assert outputs["bootTimeline"]  # the readiness gate passed on the adopted VM
    assert "TPUSERVE" not in json.dumps(world.pulumi.config())  # one run's environment, never the stack's config
    assert verdict["inventory"]["billingOrphans"] == 0
    assert world.cloud.bill().usd("instance", "tpu-serve-dev") < 0.01  # PENDING for 40 min billed nothing

    calls = len(world.cloud.calls)
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--skip-preflight")
    assert code == 0, stderr
    assert "the TPU VM is not changed by this update" in stderr
    assert vm_calls(world, calls) == []
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a")["id"] == vm["id"]


def test_a_queue_that_ends_without_a_chip_leaves_nothing_that_bills_but_the_kept_caches(world: World, monkeypatch):
    """Compute Engine deletes the PENDING VM when its wait ends (its operation ends in an error); `up` exits 3 and
    the stack holds its network and caches, no VM."""
    queued_world(world, monkeypatch)
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--zones", "us-east5-a",
                                           "--skip-preflight", "--deadline", "1h")
    assert code == 3, stderr
    assert [q["outcome"] for q in verdict["queue"]] == ["no-capacity"]
    assert "does not have enough resources available" in verdict["queue"][0]["reason"]  # the operation's error
    assert queued_insert(world)["params"]["requestValidForDuration"] == {"seconds": "3600"}
    assert "none granted in us-east5-a's queue within 1h 00m" in stderr
    assert world.kinds("instance") == []
    # The queued run made the cache disk again; never attached, it held nothing and is deleted like a failed zone's.
    assert [(o["name"], o["deleted"]) for o in verdict["orphans"]] == [("tpu-serve-dev-cache", True)] * 2
    items = verdict["inventory"]["items"]
    assert {(i["kind"], i["status"]) for i in items} == {
        ("bucket", "in state"), ("firewall", "in state"), ("nat", "in state"), ("router", "in state"),
        ("service-account", "in state")}
    assert [i for i in items if i["bills"]] == [] and verdict["inventory"]["perMonthUsd"]["total"] == 0
    assert world.kinds("instance", "disk") == []
    def stack_bill() -> float:  # the user's own token secret is not the stack's
        bill = world.cloud.bill()
        return round(bill.total - bill.usd("secret", "hf-token"), 6)

    spent = stack_bill()
    assert spent < 0.02  # the cache disk's hour beside the queued VM; the PENDING VM billed nothing
    world.cloud.clock.advance(30 * 24 * 3600)
    assert stack_bill() == spent  # nothing bills: no VM, no disk, an empty bucket, an idle NAT


def test_a_granted_vm_that_differs_in_a_field_that_replaces_it_is_never_adopted_and_is_deleted(world: World,
                                                                                               monkeypatch):
    """Pulumi refuses to replace a resource declared with `import_`: a queued VM whose max run differs from the
    program's fails the adopting update, and the orphan sweep deletes it (--yes) instead of leaving it billing."""
    from tpuserve.deploy import queue as queues

    queued_world(world, monkeypatch)
    world.cloud.schedule_capacity("us-east5-a", "ct6e-standard-1t", 1, after_s=10 * 60)
    real = queues.with_wait
    monkeypatch.setattr(queues, "with_wait", lambda body, seconds: {**real(body, seconds), "scheduling": {
        **body["scheduling"], "maxRunDuration": {"seconds": "3600"}}})
    code, verdict, stderr = world.tpuserve(up_module.up, "--stack", "dev", "--json", "--zones", "us-east5-a",
                                           "--skip-preflight", "--yes")
    assert code == 1, stderr
    assert "previously-imported resources that still specify an ID may not be replaced" in verdict["reason"]
    assert ("us-east5-a", "tpu-serve-dev", True) in [(o["zone"], o["name"], o["deleted"]) for o in verdict["orphans"]]
    assert world.kinds("instance") == []
    assert "instanceName" not in world.pulumi.outputs()


def test_a_plain_pulumi_up_without_capacity_declares_the_vm_and_creates_none(world: World, monkeypatch):
    """A bare `pulumi up` declares the VM (never withheld: that is one run's environment) and fails on capacity."""
    queued_world(world, monkeypatch)
    run = world.run_pulumi("up", "--yes", "--skip-preview", "--stack", "dev")
    assert run.returncode == 255
    assert "does not have enough resources available" in run.stdout
    assert all(not env for env in world.engine.environments)  # no TPUSERVE_* reached that program
    assert world.kinds("instance") == []


# --- renewal: the successor serves before flex-start deletes the VM -------------------------------------------------

def renewal_world(world: World, monkeypatch, chips: int) -> None:
    """A deployed stack (slot a, a 4 h run from now) whose zone has `chips` v6e chips, on the cloud's clock."""
    queued_world(world, monkeypatch)
    first_up(world)
    world.cloud.capacity[("us-east5-a", "ct6e-standard-1t")] = chips


def renew(world: World, *args: str) -> tuple[int, dict, str]:
    from tpuserve.ops import renew as renew_module

    return world.tpuserve(renew_module.renew, "--stack", "dev", "--json", "--zones", "us-east5-a", *args)


def test_renew_creates_the_successor_in_the_other_slot_and_deletes_the_old_vm_once_it_serves(world: World,
                                                                                              monkeypatch):
    renewal_world(world, monkeypatch, chips=2)
    old = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    code, verdict, stderr = renew(world)
    assert code == 0 and verdict["action"] == "not-due", stderr  # 4 h away: more than the 45 min lead
    world.cloud.clock.advance(3 * 3600 + 20 * 60)
    calls = len(world.cloud.calls)
    code, verdict, stderr = renew(world)
    assert code == 0, stderr
    assert verdict["action"] == "renewed" and verdict["vm"]["leftSeconds"] == 40 * 60
    assert verdict["successor"] == {"name": "tpu-serve-dev-b", "zone": "us-east5-a"}
    assert vm_calls(world, calls) == ["DELETE"]  # the old VM: never updated, deleted once
    assert vm_calls(world, calls, "tpu-serve-dev-b") == ["insert"]
    paths = [(c.method, c.path) for c in world.cloud.calls[calls:]]
    gate = max(i for i, (m, p) in enumerate(paths) if p.endswith("/instances/tpu-serve-dev-b/getGuestAttributes"))
    delete = paths.index(("DELETE", f"/compute/v1/projects/my-ml-sandbox/zones/us-east5-a/instances/tpu-serve-dev"))
    assert gate < delete  # the old VM served until its successor's gate saw it serve
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a") is None
    successor = world.cloud.instance("tpu-serve-dev-b", "us-east5-a")
    assert successor["status"] == "RUNNING" and successor["id"] != old["id"]
    outputs = world.pulumi.outputs()
    assert (outputs["instanceName"], outputs["vmSlot"]) == ("tpu-serve-dev-b", "b")
    assert world.pulumi.config()["tpu-serve:vmSlot"]["value"] == "b"
    assert verdict["inventory"]["billingOrphans"] == 0
    kept = {(i["kind"], i["name"]) for i in verdict["inventory"]["items"] if i["status"] == "kept"}
    assert ("disk", "tpu-serve-dev-cache") in kept  # slot a's disk, warm for the next renewal
    assert {name for kind, _, name in world.kinds("instance")} == {"tpu-serve-dev-b"}

    code, verdict, stderr = renew(world)  # its own run has just begun
    assert code == 0 and verdict["action"] == "not-due", stderr


def test_renew_without_capacity_leaves_the_old_vm_serving_until_its_deletion_and_exits_3(world: World, monkeypatch):
    renewal_world(world, monkeypatch, chips=1)
    old = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    world.cloud.clock.advance(3 * 3600 + 50 * 60)
    calls = len(world.cloud.calls)
    code, verdict, stderr = renew(world)
    assert code == 3, stderr
    assert verdict["action"] == "kept"
    assert {a["class"] for a in verdict["attempts"]} == {"capacity"} and len(verdict["attempts"]) > 1
    assert "tpu-serve-dev served until flex-start deleted it at 2026-11-29 06:00 UTC" in stderr  # tried to the end
    assert vm_calls(world, calls) == []  # never touched; flex-start deleted it at the end of its run
    assert [c for c in world.cloud.calls[calls:] if c.method == "POST" and "tpu-serve-dev-b" in json.dumps(c.body)]
    assert world.kinds("instance") == [] and old["status"] == "RUNNING"
    assert world.pulumi.config()["tpu-serve:vmSlot"]["value"] == "a"  # the slot of the VM the state held
    assert ("disk", "us-east5-a", "tpu-serve-dev-cache-b") not in world.kinds("disk")  # blank successor disks went
    assert verdict["inventory"]["billingOrphans"] == 0


def test_renew_before_the_deletion_leaves_the_old_vm_running_when_no_successor_comes(world: World, monkeypatch):
    """Checked at the moment the renewal gives up early (a stop, not a deadline): the old VM is as it was."""
    renewal_world(world, monkeypatch, chips=1)
    world.cloud.quota["us-east5"] = 1  # a second VM would exceed the region's quota: a lasting failure
    before = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    world.cloud.clock.advance(3 * 3600 + 30 * 60)
    calls = len(world.cloud.calls)
    code, verdict, stderr = renew(world)
    assert code == 3, stderr
    assert [a["class"] for a in verdict["attempts"]] == ["quota"]
    assert "tpu-serve-dev keeps serving until flex-start deletes it at 2026-11-29 06:00 UTC (in 30 min)" in stderr
    after = world.cloud.instance("tpu-serve-dev", "us-east5-a")
    assert (after["status"], after["id"], after["metadata"]) == ("RUNNING", before["id"], before["metadata"])
    assert vm_calls(world, calls) == []
    assert world.pulumi.outputs()["instanceName"] == "tpu-serve-dev"


def test_a_renewal_that_meets_the_stack_locked_waits_for_it(world: World, monkeypatch):
    renewal_world(world, monkeypatch, chips=2)
    world.cloud.clock.advance(3 * 3600 + 20 * 60)
    world.engine.locked_for = 2  # a deploy holds the stack for the first two tries
    code, verdict, stderr = renew(world)
    assert code == 0, stderr
    assert stderr.count("the stack is locked by another update") == 2
    assert world.pulumi.outputs()["instanceName"] == "tpu-serve-dev-b"


def test_renew_after_flex_start_deleted_the_vm_deploys_the_stack_again(world: World, monkeypatch):
    renewal_world(world, monkeypatch, chips=1)
    world.cloud.clock.advance(4 * 3600 + 60)
    assert world.kinds("instance") == []
    code, verdict, stderr = renew(world)
    assert code == 0, stderr
    assert "tpu-serve-dev is gone (flex-start deleted it): deploying the stack" in stderr
    assert world.cloud.instance("tpu-serve-dev", "us-east5-a")["status"] == "RUNNING"
    assert verdict["zone"] == "us-east5-a" and verdict["inventory"]["billingOrphans"] == 0  # up's own document
