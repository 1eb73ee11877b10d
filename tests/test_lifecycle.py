"""A stack's life against the stateful fake cloud: `tpuserve up` (and `pulumi up`, `destroy`) run their real code,
the fake engine applies the real program to the cloud, and each scenario ends with what the cloud holds and bills."""

from __future__ import annotations

from tests.cloud_world import World, world  # noqa: F401 - the fixture
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
