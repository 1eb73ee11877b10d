"""The flex-start TPU v6e VM that runs vLLM, and the instances.insert body that creates it."""

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

# A flex-start create without a wait time is immediate-or-fail: pulumi-gcp 10.2 cannot set the request's wait time
# (the Compute API's `Instance.params.requestValidForDuration`; `InstanceParamsArgs` has only resource_manager_tags),
# and without it Compute Engine "only allocates resources if they are immediately available" (flex-start docs). The
# insert operation therefore ends within minutes with the VM or an error such as ZONE_RESOURCE_POOL_EXHAUSTED. So
# `tpuserve up` tries zones now, then inserts `insert_body` itself with a wait time and has this resource adopt the VM
# (docs/getting-a-tpu.md). 10 min covers a slow but successful create (Terraform's default for this resource is
# 20 min) and frees the sweep from a stuck one; a VM that appears after the timeout is not in the state, and `tpuserve
# up`'s orphan sweep finds it by the stack's labels.
CREATE_TIMEOUT = "10m"
# pulumi-gcp labels what it creates (its patch 0006 renames the Terraform provider's attribution key; the provider adds
# it at create, CREATION_ONLY: tpgresource/labels.go): the queued insert carries it too, as if Pulumi had made the VM.
ATTRIBUTION_LABEL = ("goog-pulumi-provisioned", "true")
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
INSTANCE = "gcp:compute/instance:Instance"
# What must never reach a running VM as an update: the provider's update sends setMetadata (the new served config)
# first and only then finds that machine type, service account, network or max run need a stopped instance, which it
# refuses on a RUNNING one without allow_stopping_for_update (resourceComputeInstanceUpdate; paths and lines in
# tpuserve/data/provider-facts.json). A change to any of them replaces the VM instead (create-first under the
# stack's other VM name, or delete-first when asked: see the options below). So does a change of the attached disks:
# the provider would hot-detach a mounted cache disk (`cacheDiskSizeGb: 0`), which Google warns may corrupt it.
REPLACE_ON_CHANGES = [*stop_requiring_paths(INSTANCE), "attachedDisks"]
# Read records the dated build a family resolved to, which the provider's DiskImageDiffSuppress does not equate with
# an "-amd64-" family (so every later update would replace the VM): the image is ignored after create, and the
# configured one rides in metadata, whose change replaces the VM (docs/design/boot-image.md).
BOOT_IMAGE_KEY = "tpu-serve-boot-image"
IGNORE_CHANGES = ["bootDisk.initializeParams.image"]
REPLACE_ON_CHANGES.append(f'metadata["{BOOT_IMAGE_KEY}"]')


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
    # Instance metadata beside enable-guest-attributes and enable-oslogin: `startup-script`, the served config and
    # the supervisor (components/startup_script.py). All of it updates in place (setMetadata).
    metadata: Mapping[str, pulumi.Input[str]]
    network_tags: tuple[str, ...]  # the IAP rule's target
    labels: Mapping[str, str] = field(default_factory=dict)
    # A data disk to attach (projects/P/zones/Z/disks/NAME) under `cache_device_name`; never deleted with the VM.
    cache_disk: pulumi.Input[str] | None = None
    cache_device_name: str = ""
    # A replacement deletes the old VM before creating its successor (True) or creates the successor first (False).
    delete_first: bool = False
    # The resource's logical name (its URN); the VM's own name is the component's name. Kept apart so the VM can
    # change name (tpu-serve-<stack> <-> tpu-serve-<stack>-b) as a replacement of the same resource.
    logical_name: str = ""
    # An instance `tpuserve up` created from insert_body: the resource adopts it (import_) instead of creating one.
    adopt_id: str = ""
    stack: str = ""  # named in the capacity hint


def network_link(project: str, network: str) -> str:
    return network if "/" in network else f"projects/{project}/global/networks/{network}"


def vm_metadata(args: FlexStartTpuVmArgs) -> dict[str, pulumi.Input[str]]:
    return {"enable-guest-attributes": "TRUE", "enable-oslogin": "TRUE", BOOT_IMAGE_KEY: args.boot_image,
            **args.metadata}


def insert_body(name: str, args: FlexStartTpuVmArgs) -> dict[str, Any]:
    """The instances.insert body the provider sends for this VM, from args whose inputs are resolved (terraform-
    provider-google-beta v7.45.0 resource_compute_instance.go expandComputeInstance: relative links for machine type,
    disk type, network and disks; compute_instance_helpers.go expandScheduling). One builder for both paths: the
    Instance below takes the same args, and tests/test_instance.py holds the two to each other."""
    project, zone = args.project, args.zone
    disks: list[dict[str, Any]] = [{"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": args.boot_image, "diskSizeGb": str(args.boot_disk_gb),
        "diskType": f"projects/{project}/zones/{zone}/diskTypes/{args.boot_disk_type}", "labels": dict(args.labels)}}]
    if args.cache_disk:
        disks.append({"source": args.cache_disk, "deviceName": args.cache_device_name, "mode": "READ_WRITE",
                      "autoDelete": False})
    nic: dict[str, Any] = {"network": network_link(project, args.network)}
    if args.subnetwork:
        nic["subnetwork"] = args.subnetwork
    if args.external_ip:
        nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    metadata = vm_metadata(args)
    return {
        "name": name, "machineType": f"projects/{project}/zones/{zone}/machineTypes/{args.machine_type}",
        "disks": disks, "networkInterfaces": [nic],
        "serviceAccounts": [{"email": args.service_account_email, "scopes": list(SCOPES)}],
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
    """insert_body once the args' outputs (the service account, the metadata, the cache disk) are known."""
    keys = list(args.metadata)
    return pulumi.Output.all(args.service_account_email, args.cache_disk, *args.metadata.values()).apply(
        lambda values: insert_body(name, dataclasses.replace(
            args, service_account_email=values[0], cache_disk=values[1], metadata=dict(zip(keys, values[2:])))))


def capacity_hint(stack: str, log: Callable[[str], None] | None = None) -> Callable[[pulumi.ErrorHookArgs], bool]:
    """An error hook for the Instance: a create that failed for want of capacity says what waits for one. Never a
    retry (True would have the engine retry the create at once, into the same empty zone: pulumi/pulumi
    pkg/resource/deploy/step.go, withRetries)."""

    def hook(args: pulumi.ErrorHookArgs) -> bool:
        if args.failed_operation == "create" and not os.environ.get(flex_start.DRIVER_ENV) and \
                any(flex_start.CAPACITY.search(" ".join(error.split())) for error in args.errors):
            (log or pulumi.log.error)(flex_start.queue_hint(stack))
        return False

    return hook


def error_hooks(name: str, stack: str) -> pulumi.ResourceHookBinding | None:
    """The capacity hint, where the CLI runs error hooks (pulumi >= 3.217; the SDK would fail the program on an older
    one: pulumi/runtime/resource.py register_error_hook) and the SDK has them: the floor is pulumi 3.200."""
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.settings import monitor_supports_feature

    if not hasattr(pulumi, "ErrorHook") or not monitor_supports_feature(
            resource_pb2.RESOURCE_MONITOR_FEATURE_ERROR_HOOKS):
        return None
    return pulumi.ResourceHookBinding(on_error=[pulumi.ErrorHook(f"{name}-capacity-hint",
                                                                 capacity_hint(stack or pulumi.get_stack()))])


class FlexStartTpuVm(pulumi.ComponentResource):
    """A FLEX_START Compute Engine VM: deleted when its max run duration ends, never restarted, no reservation.

    Everything the VM runs comes through `metadata` (never `metadata_startup_script`, which pulumi-gcp and the
    Terraform provider mark ForceNew): a serving change is a setMetadata on the running VM, which its supervisor
    applies. Zone, boot image and disk type, max run replace it (ForceNew); machine type, service account and network,
    which the provider could only change on a stopped VM after pushing the new metadata, replace it too
    (REPLACE_ON_CHANGES). The cache disk is
    attached with auto-delete off. The create does not wait for capacity: it gets the VM in this zone now or fails
    (see CREATE_TIMEOUT); `tpuserve up` tries other zones, then queues the VM itself and this resource adopts it
    (`adopt_id`)."""

    name: pulumi.Output[str]
    instance_id: pulumi.Output[str]
    internal_ip: pulumi.Output[str]
    creation_timestamp: pulumi.Output[str]
    instance_urn: pulumi.Output[str]

    def __init__(self, name: str, args: FlexStartTpuVmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gcp:FlexStartTpuVm", args.logical_name or name, None, opts)
        instance = compute.Instance(
            args.logical_name or name,
            name=name,
            project=args.project,
            zone=args.zone,
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
            service_account=compute.InstanceServiceAccountArgs(email=args.service_account_email, scopes=SCOPES),
            scheduling=compute.InstanceSchedulingArgs(
                provisioning_model="FLEX_START",
                max_run_duration=compute.InstanceSchedulingMaxRunDurationArgs(seconds=args.max_run_seconds),
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False),
            reservation_affinity=compute.InstanceReservationAffinityArgs(type="NO_RESERVATION"),
            metadata=vm_metadata(args),
            attached_disks=[compute.InstanceAttachedDiskArgs(
                source=args.cache_disk, device_name=args.cache_device_name, mode="READ_WRITE")]
            if args.cache_disk is not None else None,
            tags=list(args.network_tags),
            labels=dict(args.labels),
            deletion_protection=False,
            # The name is explicit, so the bridge would replace delete-first whenever the provider plans the
            # replacement (pulumi-terraform-bridge pkg/tfbridge/schema.go nameRequiresDeleteBeforeReplace), and
            # create-first when only replaceOnChanges asks for it. Saying it here decides both: False (the default)
            # keeps the old VM serving until its successor exists (pkg/resource/deploy/step_generator.go: the
            # user's deleteBeforeReplace overrides the provider's); the successor then needs a name of its own in the
            # zone (vmSlot, tpuserve/names.py vm_name), which `tpuserve up` gives it. A bare `pulumi up` of such a
            # change fails on the name the old VM still holds and changes nothing.
            # An adopted VM must match these inputs in every field that replaces it: the engine imports, then
            # updates in place, and refuses to replace an imported resource (pkg/resource/deploy/step_generator.go:
            # "previously-imported resources that still specify an ID may not be replaced").
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
