"""The VM's two ways into being: the Instance Pulumi creates, and the insert body `tpuserve up` queues itself and the
program then adopts. One builder (components/instance.py insert_body) serves both; here the body the program exports
is held to what the provider would send for the Instance's inputs (tests/fakes/fake_providers.py instance_body, a port of
the provider's expandComputeInstance), and the capacity hint is tried on real error texts (mocks run no hooks)."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from components.instance import capacity_hint
from tests.fakes import provider_errors as errors
from tests.fakes.fake_providers import instance_body
from tests.fakes.pulumi_harness import run_stack, stack_file_config
from tpuserve import flex_start

INSTANCE = "gcp:compute/instance:Instance"


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A body with its metadata as a mapping (the provider builds the items from a map: their order is no fact)."""
    items = body["metadata"]["items"]
    return {**body, "metadata": {item["key"]: item["value"] for item in items}}


VARIANTS = {
    "dev": stack_file_config("dev"),
    "prod": stack_file_config("prod"),
    "external-ip, no cache disk, subnetwork": {**stack_file_config("dev"), "externalIp": "true",
                                               "cacheDiskSizeGb": "0",
                                               "subnetwork": "projects/p/regions/us-east5/subnetworks/s"},
    "slot b, 4 chips, 8 h": {**stack_file_config("dev"), "vmSlot": "b", "machineType": "ct6e-standard-4t",
                             "maxRunDuration": "8h"},
}


@pytest.mark.parametrize("config", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_exported_insert_body_is_what_the_provider_sends_for_the_instance(config, monkeypatch):
    instance = run_stack(config).one(INSTANCE)
    monkeypatch.setenv(flex_start.WITHHOLD_VM_ENV, "1")
    withheld = run_stack(config)
    body = withheld.outputs["vmInsertBody"]
    assert comparable(body) == comparable(instance_body(instance.inputs))
    assert body["name"] == instance.inputs["name"]
    # That run makes everything the VM needs, and neither the VM nor what needs it (the gate, the monitoring).
    types = {resource.type for resource in withheld.resources}
    assert INSTANCE not in types and "command:local:Command" not in types
    assert not {t for t in types if t.startswith("gcp:monitoring/")}
    assert {"gcp:serviceaccount/account:Account", "gcp:compute/firewall:Firewall"} <= types
    assert "instanceName" not in withheld.outputs


def test_the_adopted_vm_is_imported_only_when_it_is_this_stacks(monkeypatch):
    seen: dict[str, Any] = {}

    def options(args: pulumi.ResourceTransformationArgs) -> None:
        if args.type_ == INSTANCE:
            seen["import"], seen["hooks"] = args.opts.import_, args.opts.hooks
        return None

    config = stack_file_config("dev")
    run_stack(config, transformation=options)
    assert seen["import"] is None  # a plain run creates the VM
    assert [hook.name for hook in seen["hooks"].on_error] == ["tpu-serve-dev-capacity-hint"]

    vm = flex_start.instance_id(config["project"], config["zone"], "tpu-serve-dev")
    monkeypatch.setenv(flex_start.ADOPT_VM_ENV, vm)
    run_stack(config, transformation=options)
    assert seen["import"] == vm

    monkeypatch.setenv(flex_start.ADOPT_VM_ENV, vm.replace("tpu-serve-dev", "someone-elses"))
    with pytest.raises(Exception, match=f"{flex_start.ADOPT_VM_ENV}: .*someone-elses is not this stack's VM"):
        run_stack(config)


def hook_args(message: str, operation: str = "create") -> pulumi.ErrorHookArgs:
    return pulumi.ErrorHookArgs(urn="urn:pulumi:dev::tpu-serve::gcp:compute/instance:Instance::tpu-serve-dev",
                                id="", name="tpu-serve-dev", type=INSTANCE, failed_operation=operation,
                                errors=[message])


@pytest.mark.parametrize("message", [errors.STOCKOUT, errors.STOCKOUT_WITH_SUGGESTION, errors.GCLOUD_STOCKOUT],
                         ids=["stockout", "stockout with zones", "gcloud's wrapped lines"])
def test_a_create_out_of_capacity_names_tpuserve_up_and_is_not_retried(message, monkeypatch):
    monkeypatch.delenv(flex_start.DRIVER_ENV, raising=False)
    said: list[str] = []
    assert capacity_hint("prod", said.append)(hook_args(message)) is False
    assert said == [flex_start.queue_hint("prod")]
    assert "`tpuserve up --stack prod` waits in Compute Engine's queue for a chip (up to 2 h)" in said[0]


@pytest.mark.parametrize("message, operation, driver", [
    (errors.PERMISSION_DENIED, "create", ""),  # not a capacity error
    (errors.STOCKOUT, "update", ""),  # not a create
    (errors.STOCKOUT, "create", "tpuserve"),  # under tpuserve, which queues by itself
])
def test_the_hint_stays_quiet_otherwise(message, operation, driver, monkeypatch):
    monkeypatch.setenv(flex_start.DRIVER_ENV, driver) if driver else monkeypatch.delenv(flex_start.DRIVER_ENV,
                                                                                        raising=False)
    said: list[str] = []
    assert capacity_hint("dev", said.append)(hook_args(message, operation)) is False
    assert said == []
