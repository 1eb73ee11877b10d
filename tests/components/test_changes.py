"""tests/fakes/changes.py (what a change of inputs does to a resource, from tpuserve/data/provider-facts.json)
and the facts file itself: its shape, and that it covers every resource type the stacks declare."""

from __future__ import annotations

import json
import re

import pytest

from tests.fakes.config_changes import declared_resource_types
from tests.fakes.pulumi_harness import stack_file_run
from tests.fakes import changes
from tpuserve.facts import stop_requiring_paths
from tests.fakes.changes import PropertyDiff, UnknownResourceType, format_path, parse_path, plan_change

# --- The facts file ---------------------------------------------------------------------------------------------------

INSTANCE = "gcp:compute/instance:Instance"
FACTS = changes.facts()


def test_every_resource_type_the_stacks_declare_has_its_providers_facts():
    missing = declared_resource_types() - set(FACTS["resources"])
    assert not missing, f"rerun scripts/provider_facts.py: no facts for {sorted(missing)}"


def test_each_source_is_pinned_to_a_commit_and_each_fact_to_a_line():
    for key, source in FACTS["sources"].items():
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), key
        assert source["repo"].count("/") == 1 and source["tag"].startswith("v"), key
    assert FACTS["sources"]["google-beta"] == {**FACTS["sources"]["google-beta"],
                                               "repo": "hashicorp/terraform-provider-google-beta", "tag": "v7.45.0",
                                               "commit": "3dc173a397749158369ea839a2890d89f8c9c370"}
    for token, info in FACTS["resources"].items():
        assert info["provider"] in ("google-beta", "docker", "pulumi-kubernetes", "pulumi-kubernetes-provider",
                                    "pulumi-command", "dynamic"), token
        for entry in info.get("force_new", []):
            assert entry["path"] is None or parse_path(entry["path"]), (token, entry)
            if info["provider"] in ("google-beta", "docker"):
                assert entry["line"] > 0 and entry["kind"] in (
                    "block", "list", "set", "map", "string", "int", "bool", "float"), (token, entry)
        for rule in info.get("customize_diff", []):
            assert rule["line"] > 0 and (not rule["force_new"] or rule["function"] in changes.CUSTOMIZE_DIFF), \
                f"{token}: {rule['function']} forces a replacement and tests/fakes/changes.py has no rule for it"


def test_the_instance_facts_say_what_the_issue_says_at_the_beta_providers_lines():
    """Issue #22 cites terraform-provider-google; pulumi-gcp 10.2 bridges the beta provider, where the same code sits
    at other lines."""
    info = FACTS["resources"][INSTANCE]
    force_new = {e["path"]: e for e in info["force_new"]}
    assert {"scheduling.maxRunDuration", "scheduling.maxRunDuration.seconds", "bootDisk.initializeParams.image",
            "bootDisk.initializeParams.type", "zone", "name"} <= set(force_new)
    assert "machineType" not in force_new and "bootDisk.initializeParams.size" not in force_new
    assert force_new["scheduling.maxRunDuration"]["line"] == 1219
    update = info["update"]
    set_metadata = next(step for step in update["order"] if step["calls"] == ["setMetadata"])
    stop = update["stop_check"]
    assert set_metadata["line"] == 2742 < stop["line"] == 3773 < update["refusal"]["line"] == 3849
    assert "requires stopping it" in update["refusal"]["text"]
    stop_paths = {e["path"] for e in update["needs_stop"]}
    assert {"machineType", "serviceAccount.email", "serviceAccount.scopes", "networkInterfaces[*].network",
            "networkInterfaces[*].subnetwork", "scheduling.maxRunDuration", "minCpuPlatform"} <= stop_paths
    assert info["delete_before_replace"] == {**info["delete_before_replace"], "explicit": False, "autonamed": ["name"]}


# --- plan_change ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dev() -> dict[tuple[str, str], dict]:
    return {(r.type, r.name): r.inputs for r in stack_file_run("dev").resources if r.custom}


def vm(dev: dict, **changes_: object) -> tuple[dict, dict]:
    """The dev VM's inputs, and a copy with `changes_` (path__to__key=value; None deletes the key)."""
    old = json.loads(json.dumps(dev[(INSTANCE, "tpu-serve-dev")]))
    new = json.loads(json.dumps(old))
    for path, value in changes_.items():
        target = new
        *parents, leaf = parse_path(path.replace("__", "."))
        for key in parents:
            target = target[key]
        if value is None:
            del target[leaf]
        else:
            target[leaf] = value
    return old, new


def test_property_paths_print_as_pulumi_prints_them():
    assert format_path(("metadata", "tpu-serve-config")) == 'metadata["tpu-serve-config"]'
    assert format_path(("attachedDisks", 0, "source")) == "attachedDisks[0].source"
    assert format_path(("scheduling", "maxRunDuration", "seconds")) == "scheduling.maxRunDuration.seconds"
    assert format_path(("labels", 'say "hi"')) == 'labels["say \\"hi\\""]'
    assert format_path(("key.with.dots",)) == '["key.with.dots"]'
    for text in ('metadata["tpu-serve-config"]', "a.b[0].c", '["x y"][2]', 'a["q\\"q"]'):
        assert format_path(parse_path(text)) == text
    assert parse_path("triggers[*]") == ("triggers", "*")


def test_replace_on_changes_matches_as_the_engine_does():
    """properties_path.go Contains: a prefix, element by element, `*` for any one key or index."""
    assert changes.contains(parse_path("scheduling"), parse_path("scheduling.maxRunDuration.seconds"))
    assert changes.contains(parse_path("networkInterfaces[*].network"), parse_path("networkInterfaces[0].network"))
    assert not changes.contains(parse_path("networkInterfaces[*].network"), parse_path("networkInterfaces[0]"))
    assert not changes.contains(parse_path("machineType"), parse_path("machineTypes"))
    assert changes.contains(parse_path("*"), parse_path("anything[3].at.all"))


def test_a_served_config_change_is_an_in_place_metadata_update(dev):
    old, new = vm(dev)
    new["metadata"] = {**new["metadata"], "tpu-serve-config": '{"model": "other"}'}
    change = plan_change(INSTANCE, old, new)
    assert (change.op, change.diff_reasons, change.replace_reasons) == ("update", ("metadata",), ())
    assert change.detailed_diff == {'metadata["tpu-serve-config"]': PropertyDiff("update")}
    assert change.needs_stop == () and not change.delete_before_replace


def test_a_max_run_change_replaces_the_named_vm_old_one_first(dev):
    old, new = vm(dev, scheduling__maxRunDuration__seconds=28800.0)
    change = plan_change(INSTANCE, old, new)
    assert (change.op, change.replace_reasons) == ("replace", ("scheduling",))
    assert change.detailed_diff == {"scheduling.maxRunDuration.seconds": PropertyDiff("update-replace")}
    # The name is set explicitly: the bridge deletes first (nameRequiresDeleteBeforeReplace).
    assert change.delete_before_replace and change.provider_replaces and not change.create_conflicts
    unnamed = plan_change(INSTANCE, {k: v for k, v in old.items() if k != "name"},
                          {k: v for k, v in new.items() if k != "name"})
    assert unnamed.op == "replace" and not unnamed.delete_before_replace


def test_a_machine_type_change_is_an_update_that_needs_a_stopped_vm_unless_replace_on_changes_says_so(dev):
    old, new = vm(dev, machineType="ct6e-standard-4t")
    new["metadata"] = {**new["metadata"], "tpu-serve-config": '{"tp": 4}'}
    change = plan_change(INSTANCE, old, new)
    assert change.op == "update" and change.needs_stop == ("machineType",)
    assert change.detailed_diff["machineType"] == PropertyDiff("update")
    forced = plan_change(INSTANCE, old, new, replace_on_changes=["machineType"])
    assert (forced.op, forced.replace_reasons) == ("replace", ("machineType",))
    assert forced.detailed_diff["machineType"] == PropertyDiff("update-replace")
    assert forced.detailed_diff['metadata["tpu-serve-config"]'] == PropertyDiff("update")
    # replaceOnChanges alone: the bridge answers no delete-before-replace, so the engine would create a second VM
    # under the name the first still holds.
    assert not forced.provider_replaces and not forced.delete_before_replace and forced.create_conflicts
    chosen = plan_change(INSTANCE, old, new, replace_on_changes=["machineType"], delete_before_replace=True)
    assert chosen.delete_before_replace and not chosen.create_conflicts


def test_nested_replace_on_changes_paths_replace_without_a_top_level_reason(dev):
    """applyReplaceOnChanges adds to replaceReasons only the changed top-level keys a path contains."""
    old, new = vm(dev)
    new["networkInterfaces"] = [{"network": "ml-vpc"}]
    change = plan_change(INSTANCE, old, new, replace_on_changes=["networkInterfaces[*].network"])
    assert change.op == "replace" and change.replace_reasons == ()
    assert change.detailed_diff == {"networkInterfaces[0].network": PropertyDiff("update-replace")}
    assert change.needs_stop == ("networkInterfaces[0].network",)


def test_a_boot_disk_grows_in_place_and_a_new_image_replaces(dev):
    grown = plan_change(INSTANCE, *vm(dev, bootDisk__initializeParams__size=300.0))
    assert grown.op == "update"
    assert grown.detailed_diff == {"bootDisk.initializeParams.size": PropertyDiff("update")}
    imaged = plan_change(INSTANCE, *vm(dev, bootDisk__initializeParams__image="projects/p/global/images/i"))
    assert (imaged.op, imaged.replace_reasons) == ("replace", ("bootDisk",))
    assert imaged.detailed_diff == {"bootDisk.initializeParams.image": PropertyDiff("update-replace")}


def test_an_optional_computed_input_left_out_keeps_its_value(dev):
    old, new = vm(dev)
    old["networkInterfaces"] = [{"network": "default", "subnetwork": "default"}]
    assert plan_change(INSTANCE, old, new).op == "same"
    # A zone removed from the inputs is no diff either (ForceNew, but Computed: the provider keeps it).
    assert plan_change(INSTANCE, *vm(dev, zone=None)).op == "same"


def test_a_set_element_change_is_an_update_at_its_index(dev):
    old, new = vm(dev)
    scopes = ["https://www.googleapis.com/auth/devstorage.read_only"]
    new["serviceAccount"] = {**new["serviceAccount"], "scopes": scopes}
    change = plan_change(INSTANCE, old, new)
    assert change.detailed_diff == {"serviceAccount.scopes[0]": PropertyDiff("update")}
    assert change.needs_stop == ("serviceAccount.scopes[0]",)


def test_a_block_that_appears_with_a_force_new_field_replaces(dev):
    old, new = vm(dev, scheduling__maxRunDuration=None)
    change = plan_change(INSTANCE, new, old)
    assert change.op == "replace"
    assert change.detailed_diff == {"scheduling.maxRunDuration": PropertyDiff("add-replace")}


def test_a_customize_diff_replacement_shows_as_meta(dev):
    """forceNewIfNetworkIPNotUpdatable: the schema does not mark networkIp ForceNew, so the bridge's detailed diff
    shows an update and adds `__meta` for the replacement Terraform plans."""
    old, new = vm(dev)
    old["networkInterfaces"] = [{"network": "default", "networkIp": "10.0.0.2"}]
    new["networkInterfaces"] = [{"network": "default", "networkIp": "10.0.0.3"}]
    change = plan_change(INSTANCE, old, new)
    assert change.op == "replace" and change.replace_reasons == ("__meta",)
    assert change.detailed_diff["networkInterfaces[0].networkIp"] == PropertyDiff("update")
    assert change.forced_by == ("networkInterfaces",)
    new["networkInterfaces"][0]["subnetwork"] = "other"
    assert plan_change(INSTANCE, old, new).op == "update"  # a new subnetwork may bring its own address


def test_unchanged_inputs_are_the_same_and_secrets_are_compared_by_value(dev):
    old, new = vm(dev)
    assert plan_change(INSTANCE, old, new) == changes.ResourceChange("same", (), (), {}, (), False)
    secret = {changes.SIG_KEY: changes.SECRET_SIG, "value": "s3cret"}
    token = "gcp:secretmanager/secretVersion:SecretVersion"
    assert plan_change(token, {"secret": "s", "secretData": secret}, {"secret": "s", "secretData": "s3cret"}).op == \
        "same"
    with pytest.raises(UnknownResourceType, match="provider_facts"):
        plan_change("gcp:compute/disk:Disk", {}, {"size": 1})


def test_the_cache_resources_answer_with_their_own_diff(dev):
    key = ("pulumi-python:dynamic:Resource", "tpu-serve-dev-cache-disk")
    disk = dict(dev[key])
    grown = plan_change(key[0], disk, {**disk, "sizeGb": 200.0})
    # The Python dynamic provider host sends no detailed diff and no changed keys (pulumi/dynamic/__main__.py Diff).
    assert (grown.op, grown.diff_reasons, grown.detailed_diff) == ("update", (), {})
    moved = plan_change(key[0], disk, {**disk, "zone": "us-east5-a"})
    assert (moved.op, moved.replace_reasons, moved.delete_before_replace) == ("replace", ("zone",), False)


def test_the_readiness_gate_reruns_on_its_triggers_and_updates_on_its_command(dev):
    key = ("command:local:Command", "tpu-serve-dev-ready")
    gate = dict(dev[key])
    rerun = plan_change(key[0], gate, {**gate, "triggers": [gate["triggers"][0], "new-hash"]})
    assert (rerun.op, rerun.replace_reasons) == ("replace", ("triggers",))
    assert rerun.detailed_diff == {"triggers[1]": PropertyDiff("update-replace")}
    assert plan_change(key[0], gate, {**gate, "create": gate["create"] + " --verbose"}).op == "update"


def test_kubernetes_objects_follow_the_providers_force_new_paths():
    deployment = "kubernetes:apps/v1:Deployment"
    old = {"metadata": {"name": "vllm", "namespace": "tpu-serve"},
           "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "replicas": 1}}
    scaled = plan_change(deployment, old, {**old, "spec": {**old["spec"], "replicas": 2}})
    assert scaled.op == "update" and scaled.detailed_diff == {"spec.replicas": PropertyDiff("update")}
    reselected = plan_change(deployment, old, {**old, "spec": {**old["spec"], "selector": {"matchLabels": {
        "app": "other"}}}})
    assert reselected.op == "replace" and reselected.delete_before_replace  # same explicit name: delete first
    assert reselected.detailed_diff == {"spec.selector.matchLabels.app": PropertyDiff("update-replace")}
    renamed = plan_change(deployment, old, {**old, "metadata": {"name": "vllm-2", "namespace": "tpu-serve"}})
    assert renamed.op == "replace" and not renamed.delete_before_replace
    config_map = "kubernetes:core/v1:ConfigMap"
    cm = {"metadata": {"name": "c", "namespace": "n"}, "data": {"tpu-serve.json": "{}"}}
    change = plan_change(config_map, cm, {**cm, "data": {"tpu-serve.json": "{\"a\": 1}"}})
    assert change.op == "replace" and list(change.detailed_diff) == ['data["tpu-serve.json"]']


def test_stop_requiring_paths_are_the_update_functions_unconditional_stop_list():
    paths = stop_requiring_paths(INSTANCE)
    assert "machineType" in paths and "scheduling.gracefulShutdown" not in paths  # only with allowStoppingForUpdate
    assert all(parse_path(p) for p in paths)


def test_a_kubernetes_object_that_appears_whole_is_matched_below_its_path():
    deployment = "kubernetes:apps/v1:Deployment"
    old = {"metadata": {"name": "vllm", "namespace": "tpu-serve"}}
    new = {**old, "spec": {"selector": {"matchLabels": {"app": "vllm"}}}}
    change = plan_change(deployment, old, new)
    assert change.detailed_diff == {"spec": PropertyDiff("add-replace")}


def test_a_subnetwork_range_grows_in_place_and_is_replaced_otherwise():
    """google_compute_subnetwork: customdiff.ForceNewIfChange("ip_cidr_range", IsShrinkageIpCidr)."""
    subnet = "gcp:compute/subnetwork:Subnetwork"
    old = {"name": "proxy", "region": "us-east5", "network": "default", "ipCidrRange": "10.129.0.0/23"}
    grown = plan_change(subnet, old, {**old, "ipCidrRange": "10.129.0.0/22"})
    assert grown.op == "update" and grown.detailed_diff == {"ipCidrRange": PropertyDiff("update")}
    moved = plan_change(subnet, old, {**old, "ipCidrRange": "10.130.0.0/23"})
    assert (moved.op, moved.replace_reasons, moved.forced_by) == ("replace", ("__meta",), ("ipCidrRange",))
    assert moved.delete_before_replace  # an explicit name


def test_the_facts_generator_names_what_to_fetch_when_a_source_is_missing(tmp_path) -> None:
    """scripts/provider_facts.py reads nothing from a fixed path: without --sources it says how to get each pin."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "scripts/provider_facts.py", "--sources", str(tmp_path), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"google-beta: no source at {tmp_path}/terraform-provider-google-beta; pass "
                                  "--sources DIR (see --fetch) or --google-beta <clone of "
                                  "hashicorp/terraform-provider-google-beta holding 3dc173a3")


# --- DiskImageDiffSuppress: the provider's own cases (resource_compute_disk_test.go TestDiskImageDiffSuppress) ----

LINK = "https://www.googleapis.com/compute/v1/projects/"


@pytest.mark.parametrize("read_back, configured, same", [
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", LINK + "debian-cloud/global/images/family/debian-8",
     True),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", "projects/debian-cloud/global/images/family/debian-8",
     True),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", "global/images/family/debian-8", True),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", "family/debian-7", False),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", "projects/other-cloud/global/images/family/debian-8",
     False),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213", "global/images/debian-8-jessie-v20171213", True),
    (LINK + "debian-cloud/global/images/debian-8-jessie-v20171213",
     "projects/debian-cloud/global/images/debian-7-jessie-v20171213", False),
    # the default boot image's family: -amd64 in the middle of the family name, so never equal to one of its builds
    (LINK + "ubuntu-os-accelerator-images/global/images/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20260803",
     "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e", False),
])
def test_a_read_back_image_is_compared_as_the_provider_does(read_back: str, configured: str, same: bool) -> None:
    assert changes.disk_image_diff_suppress(read_back, configured) is same


def test_the_boot_image_read_back_replaces_the_vm_unless_ignored() -> None:
    family = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
    inputs = {"bootDisk": {"initializeParams": {"image": family}}, "metadata": {"a": "1"}}
    state = {"bootDisk": {"initializeParams": {"image": LINK + "ubuntu-os-accelerator-images/global/images/"
                                                              "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20260803"}}}
    changed = {**inputs, "metadata": {"a": "2"}}
    assert plan_change(INSTANCE, inputs, changed, old_state=state).op == "replace"
    ignored = plan_change(INSTANCE, inputs, changed, old_state=state,
                          ignore_changes=["bootDisk.initializeParams.image"])
    assert ignored.op == "update" and list(ignored.detailed_diff) == ["metadata.a"]
