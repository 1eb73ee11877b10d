"""The flex-start TPU v6e VM that runs vLLM, and the instances.insert body that creates it.
Why the create does not wait, what replaces the VM, how one is adopted: docs/design/pulumi-program.md#the-vm."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_gcp import compute

from tpuserve import flex_start
from tpuserve.facts import stop_requiring_paths
from tpuserve.gce import CLOUD_PLATFORM_SCOPE

# No wait time in pulumi-gcp: the create gets the VM now or fails; `tpuserve up` queues it otherwise.
CREATE_TIMEOUT = "10m"
# The provider's create-only attribution label: the queued insert carries it too.
ATTRIBUTION_LABEL = ("goog-pulumi-provisioned", "true")
INSTANCE = "gcp:compute/instance:Instance"
# The family's resolved build never diffs equal to it: ignored; the image rides in metadata (docs/design/boot-image.md).
BOOT_IMAGE_KEY = "tpu-serve-boot-image"
IGNORE_CHANGES = ["bootDisk.initializeParams.image"]
# What the provider could change only on a stopped VM, the attached disks and the boot image replace the VM.
REPLACE_ON_CHANGES = [*stop_requiring_paths(INSTANCE), "attachedDisks", f'metadata["{BOOT_IMAGE_KEY}"]']


@dataclass(frozen=True)
class FlexStartTpuVmArgs:
    project: str
    zone: str
    machine_type: str
    boot_image: str
    boot_disk_gb: int
    boot_disk_type: str
    max_run_seconds: int
    network: str
    subnetwork: str
    external_ip: bool
    service_account_email: pulumi.Input[str]
    # The startup script, the served config and the supervisor (components/startup_script.py): set in place.
    metadata: Mapping[str, pulumi.Input[str]]
    network_tags: tuple[str, ...]  # the IAP rule's target
    labels: Mapping[str, str] = field(default_factory=dict)
    # A data disk (projects/P/zones/Z/disks/NAME) attached as `cache_device_name`, never deleted with the VM.
    cache_disk: pulumi.Input[str] | None = None
    cache_device_name: str = ""
    delete_first: bool = False  # a replacement deletes the old VM before creating its successor
    logical_name: str = ""
    adopt_id: str = ""  # an instance `tpuserve up` inserted from insert_body: imported, not created
    stack: str = ""  # named in the capacity hint


def vm_metadata(args: FlexStartTpuVmArgs) -> dict[str, pulumi.Input[str]]:
    return {"enable-guest-attributes": "TRUE", "enable-oslogin": "TRUE", BOOT_IMAGE_KEY: args.boot_image,
            **args.metadata}


def insert_body(name: str, args: FlexStartTpuVmArgs) -> dict[str, Any]:
    """The body the provider would send for the Instance below (tests/components/test_instance.py holds them together)."""
    project, zone = args.project, args.zone
    disks: list[dict[str, Any]] = [{"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": args.boot_image, "diskSizeGb": str(args.boot_disk_gb),
        "diskType": f"projects/{project}/zones/{zone}/diskTypes/{args.boot_disk_type}", "labels": dict(args.labels)}}]
    if args.cache_disk:
        disks.append({"source": args.cache_disk, "deviceName": args.cache_device_name, "mode": "READ_WRITE",
                      "autoDelete": False})
    network = args.network if "/" in args.network else f"projects/{project}/global/networks/{args.network}"
    nic: dict[str, Any] = {"network": network}
    if args.subnetwork:
        nic["subnetwork"] = args.subnetwork
    if args.external_ip:
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    metadata = vm_metadata(args)
    return {
        "name": name, "machineType": f"projects/{project}/zones/{zone}/machineTypes/{args.machine_type}",
        "disks": disks, "networkInterfaces": [nic],
        "serviceAccounts": [{"email": args.service_account_email, "scopes": [CLOUD_PLATFORM_SCOPE]}],
        "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": str(args.max_run_seconds)},
                       "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
                       "automaticRestart": False, "preemptible": False},
        "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"},
        "metadata": {"items": [{"key": key, "value": value} for key, value in metadata.items()]},
        "tags": {"items": list(args.network_tags)},
        "labels": {**dict(args.labels), ATTRIBUTION_LABEL[0]: ATTRIBUTION_LABEL[1]},
        "canIpForward": False, "deletionProtection": False,
    }


def insert_body_output(name: str, args: FlexStartTpuVmArgs) -> pulumi.Output[dict[str, Any]]:
    """insert_body once the args' outputs are known."""
    keys = list(args.metadata)
    return pulumi.Output.all(args.service_account_email, args.cache_disk, *args.metadata.values()).apply(
        lambda values: insert_body(name, dataclasses.replace(
            args, service_account_email=values[0], cache_disk=values[1], metadata=dict(zip(keys, values[2:])))))


def capacity_hint(stack: str, log: Callable[[str], None] | None = None) -> Callable[[pulumi.ErrorHookArgs], bool]:
    """An error hook: a create short of capacity says what waits for one; no retry (the same empty zone)."""

    def hook(args: pulumi.ErrorHookArgs) -> bool:
        if args.failed_operation == "create" and not os.environ.get(flex_start.DRIVER_ENV) and \
                any(flex_start.CAPACITY.search(" ".join(error.split())) for error in args.errors):
            (log or pulumi.log.error)(flex_start.queue_hint(stack))
        return False

    return hook


def error_hooks(name: str, stack: str) -> pulumi.ResourceHookBinding | None:
    """The capacity hint where the CLI (3.217+) and the SDK run error hooks; an older CLI would fail the program."""
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.settings import monitor_supports_feature

    if not hasattr(pulumi, "ErrorHook") or not monitor_supports_feature(
            resource_pb2.RESOURCE_MONITOR_FEATURE_ERROR_HOOKS):
        return None
    return pulumi.ResourceHookBinding(on_error=[pulumi.ErrorHook(f"{name}-capacity-hint",
                                                                 capacity_hint(stack or pulumi.get_stack()))])


class FlexStartTpuVm(pulumi.ComponentResource):
    """A FLEX_START VM, deleted when its run ends; what it runs is its `metadata`, set in place (never replaced)."""

    name: pulumi.Output[str]
    instance_id: pulumi.Output[str]
    internal_ip: pulumi.Output[str]
    creation_timestamp: pulumi.Output[str]
    instance_urn: pulumi.Output[str]

    def __init__(self, name: str, args: FlexStartTpuVmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:FlexStartTpuVm", args.logical_name or name, None, opts)
        instance = compute.Instance(
            args.logical_name or name, name=name, project=args.project, zone=args.zone,
            machine_type=args.machine_type,
            boot_disk=compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=compute.InstanceBootDiskInitializeParamsArgs(
                    image=args.boot_image, size=args.boot_disk_gb, type=args.boot_disk_type,
                    labels=dict(args.labels))),
            network_interfaces=[compute.InstanceNetworkInterfaceArgs(
                network=args.network, subnetwork=args.subnetwork or None,
                # An empty access config asks for an ephemeral external IP; none means no external IP.
                access_configs=[compute.InstanceNetworkInterfaceAccessConfigArgs()] if args.external_ip else None)],
            service_account=compute.InstanceServiceAccountArgs(email=args.service_account_email,
                                                               scopes=[CLOUD_PLATFORM_SCOPE]),
            scheduling=compute.InstanceSchedulingArgs(
                provisioning_model="FLEX_START", instance_termination_action="DELETE",
                max_run_duration=compute.InstanceSchedulingMaxRunDurationArgs(seconds=args.max_run_seconds),
                on_host_maintenance="TERMINATE", automatic_restart=False),
            reservation_affinity=compute.InstanceReservationAffinityArgs(type="NO_RESERVATION"),
            metadata=vm_metadata(args),
            attached_disks=[compute.InstanceAttachedDiskArgs(
                source=args.cache_disk, device_name=args.cache_device_name, mode="READ_WRITE")]
            if args.cache_disk is not None else None,
            tags=list(args.network_tags), labels=dict(args.labels), deletion_protection=False,
            # delete_before_replace is always explicit: create-first by default, the successor in the other vmSlot.
            opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT),
                                        replace_on_changes=REPLACE_ON_CHANGES, ignore_changes=IGNORE_CHANGES,
                                        delete_before_replace=args.delete_first, import_=args.adopt_id or None,
                                        hooks=error_hooks(args.logical_name or name, args.stack)))

        self.name = instance.name
        self.instance_id = instance.instance_id
        self.internal_ip = instance.network_interfaces.apply(lambda nics: nics[0].network_ip)
        self.creation_timestamp = instance.creation_timestamp
        self.instance_urn = instance.urn  # `pulumi up --replace <urn>` starts a new flex-start run
        self.register_outputs({"name": self.name, "internalIp": self.internal_ip})
