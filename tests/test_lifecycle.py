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
