"""Every config key's effect on a running deployment, derived from the stacks and the providers' rules
(tests/fakes/config_changes.py): the committed words (tpuserve/data/config-changes.json, the "a change" column of
docs/configuration.md) are what the derivation says today, and the effects that decide whether a TPU is lost are
pinned here by what they are, not by their wording."""

from __future__ import annotations

import json

import pulumi
import pytest

from components.config import all_settings
from components.instance import REPLACE_ON_CHANGES
from scripts.config_docs import change_effects
from tests.fakes import config_changes
from tests.fakes.pulumi_harness import run_stack, stack_file_config
from tests.fakes.changes import plan_change
from tpuserve.facts import stop_requiring_paths
from tpuserve.facts import SERVED_CONFIG_KEY

INSTANCE = "gcp:compute/instance:Instance"


@pytest.fixture(scope="module")
def derived() -> dict:
    return config_changes.derive()


def test_every_key_has_a_changed_value_or_says_why_it_has_none():
    assert set(config_changes.CHANGES) == set(all_settings())
    for key, cases in config_changes.CHANGES.items():
        assert cases and all(case.value is not None or case.why for case in cases), key


def test_the_committed_effects_are_the_derived_ones(derived):
    committed = json.loads(config_changes.OUT.read_text())["keys"]
    stale = sorted(key for key in derived if derived[key] != committed.get(key))
    assert not stale and set(committed) == set(derived), (
        f"tpuserve/data/config-changes.json is stale for {stale}: run `python -m tests.fakes.config_changes`, then "
        "`python scripts/config_docs.py`")
    assert change_effects() == {key: entry["effect"] for key, entry in derived.items()}


def resources(derived: dict, key: str, case: int = 0) -> dict[str, dict]:
    return {r["name"]: r for r in derived[key]["cases"][case]["resources"]}


def test_what_loses_the_tpu(derived):
    """The VM is replaced by these keys and by no serving key."""
    vm = "tpu-serve-dev"
    for key in ("project", "zone", "machineType", "bootImage", "maxRunDuration", "network", "subnetwork"):
        assert resources(derived, key)[vm]["op"] == "replace", key
        # the old VM serves until the new one exists (components/instance.py): create-first
        assert resources(derived, key)[vm]["delete_before_replace"] is False, key
    for key in ("machineType", "maxRunDuration", "bootImage", "network"):  # the same zone: the name must change
        assert resources(derived, key)[vm]["create_conflicts"] is True, key
        assert "creates the new VM under the other vmSlot name" in derived[key]["effect"], key
    assert resources(derived, "zone")[vm]["create_conflicts"] is False  # a name exists once per zone
    assert resources(derived, "vmSlot")[vm]["create_conflicts"] is False  # the other name
    assert derived["replaceOrder"]["effect"] == "nothing on the stack"  # the order of the next replacement only
    for key in ("bootDiskSizeGb", "labels", "externalIp", "readinessTimeout", "hfTokenSecretId", "compileCacheBucket",
                "model", "containerImage", "maxModelLen", "multimodalLimits", "kvCacheDtype", "extraArgs"):
        assert resources(derived, key)[vm]["op"] == "update", key
    assert resources(derived, "maxRunDuration")[vm]["replace_reasons"] == ["scheduling"]
    assert resources(derived, "machineType")[vm]["replace_reasons"] == ["machineType"]
    assert resources(derived, "machineType")[vm]["needs_stop"] == ["machineType"]


def test_a_serving_change_reaches_the_vm_only_through_its_served_config(derived):
    for key in ("model", "containerImage", "maxModelLen", "gpuMemoryUtilization", "maxNumBatchedTokens",
                "enableAutoToolChoice", "toolCallParser", "reasoningParser", "multimodalLimits", "kvCacheDtype",
                "extraArgs"):
        assert resources(derived, key)["tpu-serve-dev"]["paths"] == [f'metadata["{SERVED_CONFIG_KEY}"]'], key


def test_only_what_is_served_restarts_vllm(derived):
    """vm/supervisor.py restarts the container when the served config's hash (image and argv) changes; a new secret
    name, bucket or deadline reaches the VM without one."""
    vm = (INSTANCE, "tpu-serve-dev")
    base = config_changes.run("dev").resources[vm]
    for key, restarts in (("model", True), ("extraArgs", True), ("readinessTimeout", False),
                          ("hfTokenSecretId", False), ("compileCacheBucket", False)):
        case = config_changes.CHANGES[key][0]
        new = config_changes.run("dev", {**case.also, key: case.value}).resources[vm]
        assert new["metadata"][SERVED_CONFIG_KEY] != base["metadata"][SERVED_CONFIG_KEY], key
        assert (config_changes.served_hash(new) != config_changes.served_hash(base)) is restarts, key
        assert ("restarts vLLM" in derived[key]["effect"]) is restarts, key


def test_keys_of_other_targets_are_derived_on_their_own_stacks(derived):
    assert {r["op"] for r in resources(derived, "gkeNamespace").values()} == {"replace"}
    assert resources(derived, "localPort")["tpu-serve-local"]["replace_reasons"] == ["ports"]  # docker: ForceNew


def instance_run(config: dict[str, str]) -> tuple[dict, pulumi.ResourceOptions]:
    """The VM's inputs and resource options (mocks see only inputs; a stack transformation sees the options)."""
    options: dict[str, pulumi.ResourceOptions] = {}
    recording = [True]

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        if recording[0] and args.type_ == INSTANCE:  # it stays registered after this run
            options["vm"] = args.opts

    run = run_stack(config, "dev", transformation=record)
    recording[0] = False
    return run.one(INSTANCE).inputs, options["vm"]


def test_a_machine_type_change_never_changes_the_served_config_in_place():
    """Issue #22: the provider would setMetadata the new served config (tensor parallel 4) on the one-chip VM and then
    refuse to resize it. The VM is replaced instead (create-first, under the other slot's name when `tpuserve up`
    runs it): nothing is pushed to the old VM."""
    base = stack_file_config("dev")
    old, _ = instance_run(base)
    new, opts = instance_run({**base, "machineType": "ct6e-standard-4t"})
    assert old["metadata"][SERVED_CONFIG_KEY] != new["metadata"][SERVED_CONFIG_KEY]  # TP 1 -> 4
    assert opts.replace_on_changes == [*stop_requiring_paths(INSTANCE), "attachedDisks",
                                       'metadata["tpu-serve-boot-image"]'] == REPLACE_ON_CHANGES
    assert opts.delete_before_replace is False
    change = plan_change(INSTANCE, old, new, replace_on_changes=opts.replace_on_changes,
                         delete_before_replace=opts.delete_before_replace)
    assert (change.op, change.replace_reasons) == ("replace", ("machineType",))
    # create-first under the same name would fail (a bare `pulumi up`: nothing changes); `tpuserve up` switches the
    # slot, and the successor's other name can exist beside the old VM
    assert not change.delete_before_replace and change.create_conflicts
    flipped, _ = instance_run({**base, "machineType": "ct6e-standard-4t", "vmSlot": "b"})
    assert flipped["name"] == "tpu-serve-dev-b"
    successor = plan_change(INSTANCE, old, flipped, replace_on_changes=opts.replace_on_changes,
                            delete_before_replace=opts.delete_before_replace)
    assert successor.op == "replace" and not successor.delete_before_replace and not successor.create_conflicts
    # Without the options the same inputs are the in-place update the issue warns of.
    bare = plan_change(INSTANCE, old, new)
    assert bare.op == "update" and bare.needs_stop == ("machineType",)
    assert f'metadata["{SERVED_CONFIG_KEY}"]' in bare.detailed_diff
