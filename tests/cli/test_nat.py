"""Who serves Cloud NAT where (tpuserve/deploy/nat.py), against the stateful fake Compute API (tests/fakes/fake_cloud.py:
routers with their `nats[]`, routers.aggregatedList keyed `regions/R`, the second all-subnetworks NAT refused with the
API's text, instances.aggregatedList)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from tests.fakes.fake_cloud import PROJECT, FakeCloud
from tests.fakes.fake_pulumi import FakePulumi, install
from tpuserve import gce
from tpuserve.deploy import nat
from tpuserve.names import router_description
from tpuserve.ops import up as up_module

NETWORK = f"projects/{PROJECT}/global/networks/default"


def make_router(cloud: FakeCloud, region: str, name: str, stack: str | None, nat_name: str,
                ranges: str = "ALL_SUBNETWORKS_ALL_IP_RANGES", subnetworks: tuple[str, ...] = (),
                network: str = NETWORK) -> tuple[int, dict]:
    """What a stack's `pulumi up` leaves: a Router (described with its stack, as the components set it) holding a NAT
    (the provider's RouterNat resource patches `nats[]`)."""
    body = {"name": name, "network": network, "description": router_description(stack) if stack else ""}
    status, _ = cloud.api("POST", f"/compute/v1/projects/{PROJECT}/regions/{region}/routers", body)
    assert status == 200
    section = {"name": nat_name, "sourceSubnetworkIpRangesToNat": ranges, "natIpAllocateOption": "AUTO_ONLY"}
    if subnetworks:
        section["subnetworks"] = [{"name": f"projects/{PROJECT}/regions/{region}/subnetworks/{s}",
                                   "sourceIpRangesToNat": ["ALL_IP_RANGES"]} for s in subnetworks]
    return cloud.api("PATCH", f"/compute/v1/projects/{PROJECT}/regions/{region}/routers/{name}", {"nats": [section]})


def dev_state(region: str = "europe-west4") -> dict:
    """`pulumi stack export` of dev: its RouterNat's id is {project}/{region}/{router}/{nat}."""
    return {"version": 3, "deployment": {"resources": [
        {"type": "gcp:compute/router:Router",
         "id": f"projects/{PROJECT}/regions/{region}/routers/tpu-serve-dev-router"},
        {"type": nat.NAT_TYPE, "id": f"{PROJECT}/{region}/tpu-serve-dev-router/tpu-serve-dev-nat"},
        {"type": "gcp:compute/instance:Instance", "id": f"projects/{PROJECT}/zones/{region}-a/instances/tpu-serve-dev"},
    ]}}


@pytest.fixture
def listed(fake_cloud: FakeCloud) -> list[nat.Nat]:
    assert make_router(fake_cloud, "europe-west4", "tpu-serve-dev-router", "dev", "tpu-serve-dev-nat")[0] == 200
    return nat.list_nats(requests.Session(), PROJECT, fake_cloud.url)


def test_the_api_refuses_a_second_all_subnetworks_nat(fake_cloud: FakeCloud, listed: list[nat.Nat]) -> None:
    """Why a stack must not make one where another's serves: the fake answers as the API does."""
    status, body = make_router(fake_cloud, "europe-west4", "tpu-serve-prod-router", "prod", "tpu-serve-prod-nat")
    assert status == 400 and "Can not create new Nats since a Nat with option ALL_SUBNETWORKS_ALL_IP_RANGES exists" \
        in body["error"]["message"]


def test_a_region_another_stacks_nat_serves_is_skipped_and_its_owner_named(listed: list[nat.Nat]) -> None:
    assert listed == [nat.Nat("europe-west4", "tpu-serve-dev-router", "tpu-serve-dev-nat", "default",
                              "ALL_SUBNETWORKS_ALL_IP_RANGES", owner="dev")]
    plan = nat.plan(listed, "prod", ["europe-west4", "us-east1"], "default")
    assert plan.skip_regions() == ["europe-west4"]
    assert plan.settings() == {"cloudNatSkipRegions": json.dumps(["europe-west4"])}
    assert plan.lines() == [
        "Cloud NAT in europe-west4: tpu-serve-dev-router/tpu-serve-dev-nat (stack dev) serves it; prod makes none "
        "there",
        "Cloud NAT in us-east1: none yet; prod makes one"]


def test_a_stacks_own_nat_is_never_skipped(listed: list[nat.Nat]) -> None:
    """Read from the stack's state, not its name: dev keeps (and never deletes) the NAT it owns."""
    own = nat.own_nats(dev_state())
    assert own == {("europe-west4", "tpu-serve-dev-router", "tpu-serve-dev-nat")}
    plan = nat.plan(listed, "dev", ["europe-west4"], "default", own=own)
    assert plan.skip_regions() == [] and plan.region("europe-west4").own
    assert plan.lines() == ["Cloud NAT in europe-west4: tpu-serve-dev-router/tpu-serve-dev-nat (this stack, dev) "
                            "serves it"]


def test_nats_of_other_networks_and_private_nats_do_not_serve(fake_cloud: FakeCloud) -> None:
    make_router(fake_cloud, "us-east1", "other-net-router", None, "other-nat",
                network=f"projects/{PROJECT}/global/networks/ml-vpc")
    found = nat.list_nats(requests.Session(), PROJECT, fake_cloud.url)
    assert [n.owned_by() for n in found] == ["no tpu-serve stack named on its router"]
    assert nat.plan(found, "dev", ["us-east1"], "default").skip_regions() == []
    private = nat.Nat("us-east1", "r", "n", "default", "LIST_OF_SUBNETWORKS", ("default",), private=True)
    assert not private.serves("default")


def test_a_nat_for_a_list_of_subnetworks_serves_those_and_blocks_the_rest(fake_cloud: FakeCloud) -> None:
    make_router(fake_cloud, "us-east1", "team-router", None, "team-nat", "LIST_OF_SUBNETWORKS", ("ml-east",))
    found = nat.list_nats(requests.Session(), PROJECT, fake_cloud.url)
    assert nat.plan(found, "dev", ["us-east1"], "default", "ml-east").skip_regions() == ["us-east1"]
    blocked = nat.plan(found, "dev", ["us-east1"], "default").region("us-east1")
    assert blocked.blocked and not blocked.skip
    assert blocked.describe("dev") == (
        "Cloud NAT in us-east1: none serves the VMs' subnetwork, and team-router/team-nat (no tpu-serve stack named "
        "on its router, LIST_OF_SUBNETWORKS ml-east) rules out another; add the subnetwork to it, or use another "
        "region")


def test_the_vms_that_rely_on_a_stacks_nat_are_named(fake_cloud: FakeCloud, listed: list[nat.Nat]) -> None:
    """prod's VM in europe-west4 without an external IP uses dev's NAT: destroying dev takes its egress."""
    for name, stack, external in (("tpu-serve-dev", "dev", False), ("tpu-serve-prod", "prod", False),
                                  ("bastion", "", True)):
        nic = {"network": "global/networks/default", **({"accessConfigs": [{}]} if external else {})}
        status, _ = fake_cloud.api("POST", f"/compute/v1/projects/{PROJECT}/zones/europe-west4-a/instances", {
            "name": name, "machineType": "zones/europe-west4-a/machineTypes/e2-standard-2",
            "networkInterfaces": [nic], "labels": {"stack": stack} if stack else {},
            "disks": [{"boot": True, "initializeParams": {"diskSizeGb": "10"}}]})
        assert status == 200
    vms = nat.list_vms(requests.Session(), PROJECT, fake_cloud.url)
    assert sorted((v.name, v.stack, v.external_ip, v.subnetwork) for v in vms) == [
        ("bastion", "", True, "default"), ("tpu-serve-dev", "dev", False, "default"),
        ("tpu-serve-prod", "prod", False, "default")]
    found = nat.reliance(nat.own_nats(dev_state()), listed, vms, ["dev"])
    assert found.lines("dev") == [
        "tpu-serve-dev-router/tpu-serve-dev-nat in europe-west4 (stack dev) also serves 1 VM(s) of prod "
        "(tpu-serve-prod): destroying dev, or moving it out of europe-west4, takes their internet egress until "
        "another stack makes a NAT there"]
    assert nat.reliance(set(), listed, vms, ["dev"]).lines("dev") == []  # not dev's own: nothing to say


# --- `tpuserve up` never makes a second NAT ------------------------------------------------------------------------

def token_secret(cloud: FakeCloud) -> None:
    """The Hugging Face token secret preflight checks, with an enabled version."""
    assert cloud.api("POST", f"/v1/projects/{PROJECT}/secrets", {"replication": {"automatic": {}}},
                     {"secretId": "hf-token"})[0] == 200
    assert cloud.api("POST", f"/v1/projects/{PROJECT}/secrets/hf-token:addVersion",
                     {"payload": {"data": "aGZfdG9rZW4="}})[0] == 200


@pytest.fixture
def project(fake_cloud: FakeCloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCloud, FakePulumi]:
    """One fake project: the fake cloud, and the fake pulumi making each stack's Routers and NATs in it."""
    token_secret(fake_cloud)
    fake = install(tmp_path / "bin", tmp_path / "pulumi-home")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_PULUMI_HOME", str(fake.home))
    monkeypatch.setenv("FAKE_CLOUD_URL", fake_cloud.url)
    monkeypatch.setattr(gce, "adc_session", requests.Session)  # the fake needs no credentials
    fake.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token")
    return fake_cloud, fake


def run_up(cloud: FakeCloud, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--zones", "europe-west4-a",
                                               *cloud.endpoint_options(), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stderr


def nats(cloud: FakeCloud) -> list[tuple[str, str]]:
    return [(r.location, r.name) for r in cloud.inventory() if r.kind == "nat"]


def skips(pulumi: FakePulumi) -> list[str | None]:
    """The cloudNatSkipRegions each `pulumi up` was given."""
    return [next((arg.split("=", 1)[1] for arg in call if arg.startswith(f"{nat.SKIP_KEY}=")), None)
            for call in pulumi.calls() if call[0] == "up"]


def test_up_makes_no_nat_where_another_stacks_serves(project: tuple[FakeCloud, FakePulumi]) -> None:
    """Stack prod made the NAT of europe-west4 first: `tpuserve up dev` there says whose it is and
    deploys dev without one (without the skip the fake cloud would refuse dev's, and the update fail)."""
    cloud, pulumi = project
    make_router(cloud, "europe-west4", "tpu-serve-prod-router", "prod", "tpu-serve-prod-nat")
    code, stderr = run_up(cloud)
    assert code == 0, stderr
    assert ("Cloud NAT in europe-west4: tpu-serve-prod-router/tpu-serve-prod-nat (stack prod) serves it; dev makes "
            "none there") in stderr.replace("\n", " ")
    assert skips(pulumi) == ['["europe-west4"]']
    assert nats(cloud) == [("europe-west4", "tpu-serve-prod-nat")]


def test_up_keeps_the_nat_it_owns(project: tuple[FakeCloud, FakePulumi]) -> None:
    """First in the region, dev makes the NAT; the next `tpuserve up` finds it in dev's state and keeps it."""
    cloud, pulumi = project
    assert run_up(cloud)[0] == 0
    assert nats(cloud) == [("europe-west4", "tpu-serve-dev-nat")]
    code, stderr = run_up(cloud, "--skip-preflight")
    assert code == 0, stderr
    assert "Cloud NAT in europe-west4: tpu-serve-dev-router/tpu-serve-dev-nat (this stack, dev) serves it" in stderr
    assert skips(pulumi) == ["[]", "[]"] and nats(cloud) == [("europe-west4", "tpu-serve-dev-nat")]


def test_without_the_skip_the_second_nat_fails_the_update(project: tuple[FakeCloud, FakePulumi]) -> None:
    """What the skip prevents, with the provider's error as the fake pulumi prints it: createCloudNat is the user's
    switch, and a stack told nothing about the other NAT makes its own and fails."""
    cloud, pulumi = project
    make_router(cloud, "europe-west4", "team-router", None, "team-nat")
    pulumi.set_config(project=PROJECT, zone="europe-west4-a", hfTokenSecretId="hf-token")
    result = CliRunner().invoke(up_module.up, ["--stack", "dev", "--zones", "europe-west4-a", "--skip-preflight",
                                               "--endpoint", "compute=http://127.0.0.1:9", "--endpoint",
                                               f"secretmanager={cloud.url}"])
    assert result.exit_code == 1
    assert "Can not create new Nats since a Nat with option ALL_SUBNETWORKS_ALL_IP_RANGES exists" in result.stderr
    assert nats(cloud) == [("europe-west4", "team-nat")]


def add_prod_vm(cloud: FakeCloud, machine_type: str, disk_gb: int) -> None:
    """Another stack's VM (prod) in europe-west4-a, on the default network: dev's NAT serves it."""
    status, _ = cloud.api("POST", f"/compute/v1/projects/{PROJECT}/zones/europe-west4-a/instances", {
        "name": "tpu-serve-prod", "machineType": f"zones/europe-west4-a/machineTypes/{machine_type}",
        "networkInterfaces": [{"network": "global/networks/default"}], "labels": {"stack": "prod"},
        "disks": [{"boot": True, "initializeParams": {"diskSizeGb": str(disk_gb)}}]})
    assert status == 200


def test_preflight_names_the_vms_that_rely_on_the_stacks_nat_and_skips_blocked_regions(
        project: tuple[FakeCloud, FakePulumi]) -> None:
    """`tpuserve preflight --stack dev` after dev made its NAT: prod's VM in europe-west4 uses it (a warning:
    destroying dev takes its egress); us-east1's only NAT serves another subnetwork, so its zones are skipped."""
    from tpuserve.deploy.preflight import preflight_command

    cloud, pulumi = project
    assert run_up(cloud)[0] == 0
    add_prod_vm(cloud, "e2-standard-2", 10)
    make_router(cloud, "us-east1", "team-router", None, "team-nat", "LIST_OF_SUBNETWORKS", ("ml-east",))
    result = CliRunner().invoke(preflight_command, ["--stack", "dev", "--zones", "europe-west4-a,us-east1-d",
                                                    "--json", *cloud.endpoint_options()])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    checks = {check["check"]: check for check in report["checks"]}
    assert checks["Cloud NAT"]["status"] == "warning"
    assert checks["Cloud NAT"]["detail"].startswith(
        "Cloud NAT in europe-west4: tpu-serve-dev-router/tpu-serve-dev-nat (this stack, dev) serves it; Cloud NAT in "
        "us-east1: none serves the VMs' subnetwork, and team-router/team-nat")
    assert checks["Cloud NAT users"]["status"] == "warning" and "also serves 1 VM(s) of prod (tpu-serve-prod)" \
        in checks["Cloud NAT users"]["detail"]
    assert report["zones"] == ["europe-west4-a"] and "team-router/team-nat" in report["skipped"]["us-east1-d"]


def test_destroying_the_stack_whose_nat_another_stack_uses_is_refused_until_asked_for(
        project: tuple[FakeCloud, FakePulumi]) -> None:
    """`tpuserve destroy --stack dev` names prod's VM that reaches the internet through dev's NAT and destroys
    nothing (exit 6, with --yes too, which is about orphans); --despite-nat-users destroys dev, its NAT with it."""
    from tpuserve.cli import main as cli_main
    from tpuserve.ops import destroy as destroy_module

    cloud, pulumi = project
    assert run_up(cloud)[0] == 0
    add_prod_vm(cloud, "ct6e-standard-1t", 100)
    before = len(pulumi.calls())

    refused = CliRunner().invoke(cli_main, ["destroy", "--stack", "dev", "--yes", "--json",
                                             *cloud.endpoint_options()])  # the CLI writes the error document
    assert refused.exit_code == 6, refused.stderr
    assert "tpu-serve-dev-router/tpu-serve-dev-nat in europe-west4 (stack dev) also serves" in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "Error: nothing destroyed: VMs of other stacks use dev's Cloud NAT (above); destroy those stacks first, or "
        "run again with --despite-nat-users")
    verdict = json.loads(refused.stdout.strip().splitlines()[-1])
    assert verdict == {"ok": False, "exit": 6, "error": refused.stderr.strip().splitlines()[-1].removeprefix("Error: "),
                       "stack": "dev", "natUsers": [line.removeprefix("warning: ") for line in
                                                    refused.stderr.splitlines() if "also serves" in line]}
    assert not any(call[0] == "destroy" for call in pulumi.calls()[before:])
    assert ("europe-west4", "tpu-serve-dev-nat") in nats(cloud)

    forced = CliRunner().invoke(destroy_module.destroy, ["--stack", "dev", "--yes", "--despite-nat-users",
                                                          *cloud.endpoint_options()])
    assert forced.exit_code in (0, 5), forced.stderr
    assert [call[0] for call in pulumi.calls()[before:] if call[0] == "destroy"] == ["destroy"]
    assert ("europe-west4", "tpu-serve-dev-nat") not in nats(cloud)
