"""The providers behind tests/fakes/fake_engine.py: each resource type's create, read, update and delete, as REST calls on
the fake cloud (tests/fakes/fake_cloud.py) in the order the real provider makes them.

- pulumi-gcp 10.2 bridges terraform-provider-google-beta v7.45.0 (commit 3dc173a397): its
  google-beta/services/compute/resource_compute_instance.go creates an instance with one instances.insert and waits
  for the operation (a wait that times out clears the id: the VM is not in the state, though Compute Engine may
  still make it), and updates a running one metadata first (setMetadata), labels, then the machine type, which on a
  RUNNING instance without allow_stopping_for_update is an error; a change the schema marks ForceNew is a
  replacement (tests/fakes/changes.py reads that from the provider's source: tpuserve/data/provider-facts.json).
  google_compute_router_nat is a patch of its router's `nats` (resource_compute_router_nat.go).
- The dynamic cache resources are this repository's own providers (components/cache_provider.py), run here as
  the CLI's Python host would run them, against the fake cloud.
- pulumi-command's local.Command (the readiness gate) replaces on a change of `create` or `triggers`; here it reads
  the VM's guest attributes as `tpuserve gate --instance` does and fails the way pulumi-command reports a failed
  command.
- google_monitoring_alert_policy (resource_monitoring_alert_policy.go): alertPolicies.create, patch, get, delete;
  Cloud Monitoring refuses a policy on a metric never written (tests/fakes/fake_cloud.py).
Resources nothing bills and no test inspects in the cloud (IAM bindings, dashboards, Kubernetes objects) are held in
the state only: `Virtual`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from tests.fakes import changes
from tests.fakes.changes import ResourceChange

BRIDGED = "sdk-v2/provider2.go:572: sdk.helper_schema: "  # how pulumi prints a bridged provider's error
OPERATION_POLLS = 60  # polls of an operation before the provider's wait times out (the fake finishes sooner)


class ProviderError(Exception):
    """The provider's error text, as `pulumi up` prints it after `error:`."""


def error_prefix(type_: str) -> str:
    return BRIDGED if type_.startswith("gcp:") else ""


def plain(value: Any) -> Any:
    """Mock inputs as the state holds them: JSON values (integers arrive as floats; nothing else changes)."""
    return json.loads(json.dumps(value, default=str))


@dataclass
class Cloud:
    """Where the providers send their calls, and what a VM does once it boots (the test decides: the hook gets the
    instance resource and returns the guest attributes it reports)."""

    url: str
    session: requests.Session = field(default_factory=requests.Session)
    boot: Callable[[dict[str, Any]], Mapping[str, str]] | None = None
    operation_polls: int = OPERATION_POLLS

    def local(self, link: str) -> str:
        """A resource link (https://www.googleapis.com/compute/v1/...) as a URL of the fake: nothing leaves
        127.0.0.1."""
        if not link:
            return ""
        path = link.split("://", 1)[-1].split("/", 1)[-1]
        return f"{self.url}/{path}"

    def compute(self, path: str) -> str:
        return f"{self.url}/compute/v1/{path.lstrip('/')}"

    def call(self, method: str, url: str, what: str, **kwargs: Any) -> dict[str, Any]:
        response = self.session.request(method, url, timeout=30, **kwargs)
        if not response.ok:
            raise ProviderError(f"{what}: googleapi: Error {response.status_code}: {google_message(response)}")
        return response.json() if response.content else {}

    def get(self, url: str) -> dict[str, Any] | None:
        response = self.session.get(url, timeout=30)
        if response.status_code == 404:
            return None
        if not response.ok:
            raise ProviderError(f"Error reading {url}: googleapi: Error {response.status_code}: "
                                f"{google_message(response)}")
        return response.json()

    def wait(self, operation: dict[str, Any], what: str, timeout_text: str = "10m0s") -> None:
        """Poll an operation as the provider's ComputeOperationWaiter does; its `error` is the provider's message
        (compute_operation.go writeOperationError: the first error's message, then its localized message and help
        link or the quota's metric)."""
        link = self.local(operation.get("selfLink") or "")
        for _ in range(self.operation_polls):
            if operation.get("status") == "DONE":
                break
            operation = self.call("GET", link, what) if link else operation
        else:
            raise ProviderError(f"{what}: timeout while waiting for state to become 'DONE' (last state: "
                                f"'{operation.get('status', 'RUNNING')}', timeout: {timeout_text})")
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            raise ProviderError(f"{what}: {operation_message(operation)}")


def google_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
    except ValueError:
        return response.text
    reason = ((error.get("errors") or [{}])[0]).get("reason", "")
    return f"{error.get('message', response.text)}{f', {reason}' if reason else ''}"


def operation_message(operation: dict[str, Any]) -> str:
    """writeOperationError (terraform-provider-google compute_operation.go), as tests/fakes/fake_cloud.py ports it."""
    from tests.fakes.fake_cloud import provider_error_text

    return provider_error_text(operation["error"]).rstrip("\n")


class Provider:
    """One resource type. `diff` plans the step (the provider's schema, through tests.fakes.changes)."""

    def __init__(self, cloud: Cloud, type_: str) -> None:
        self.cloud, self.type = cloud, type_

    def diff(self, old: Mapping[str, Any], reg: Any) -> ResourceChange:
        return changes.plan_change(self.type, old.get("inputs") or {}, reg.inputs,
                                   replace_on_changes=reg.replace_on_changes,
                                   delete_before_replace=reg.delete_before_replace, old_state=old.get("outputs"),
                                   ignore_changes=reg.ignore_changes)

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        return dict(entry.get("outputs") or {})

    def update(self, old: Mapping[str, Any], reg: Any, change: ResourceChange) -> tuple[str, dict[str, Any]]:
        return str(old["id"]), {**(old.get("outputs") or {}), **reg.inputs}

    def delete(self, entry: Mapping[str, Any]) -> None:
        return None

    def import_(self, id_: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(inputs, outputs) of the resource `id_` names, None when there is none (the engine's `import_`)."""
        raise ProviderError(f"provider does not support importing resources ({self.type})")


class Virtual(Provider):
    """Held in the state only: its id and outputs are what the real provider would compute from the inputs."""

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        outputs = dict(reg.inputs)
        if self.type == "gcp:secretmanager/secret:Secret":
            outputs["name"] = f"projects/{reg.inputs.get('project')}/secrets/{reg.inputs.get('secretId')}"
        if self.type == "gcp:monitoring/dashboard:Dashboard":
            outputs["id"] = f"projects/{reg.inputs.get('project')}/dashboards/{reg.name}"
        return f"{reg.name}-id", outputs


# --- Compute Engine ---------------------------------------------------------------------------------------------

def zonal(project: str, zone: str, collection: str, name: str = "") -> str:
    return f"projects/{project}/zones/{zone}/{collection}" + (f"/{name}" if name else "")


# pulumi-gcp's attribution label, which the provider adds to a resource it creates (pulumi/pulumi-gcp patch 0006;
# terraform-provider-google tpgresource/labels.go, strategy CREATION_ONLY).
ATTRIBUTION = {"goog-pulumi-provisioned": "true"}


def instance_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """instances.insert's body from the Instance's inputs (resource_compute_instance.go expandComputeInstance:
    relative links for the machine type, disk type and network; compute_instance_helpers.go expandScheduling sends
    `preemptible`; the effective labels carry the attribution label)."""
    project, zone = inputs["project"], inputs["zone"]
    boot = inputs.get("bootDisk") or {}
    params = boot.get("initializeParams") or {}
    disks = [{"boot": True, "autoDelete": boot.get("autoDelete", True), "initializeParams": {
        "sourceImage": params.get("image"), "diskSizeGb": str(int(float(params.get("size", 10)))),
        "diskType": f"projects/{project}/zones/{zone}/diskTypes/{params.get('type', 'pd-balanced')}",
        "labels": params.get("labels") or {}}}]
    for attached in inputs.get("attachedDisks") or []:
        disks.append({"source": attached["source"], "deviceName": attached.get("deviceName"),
                      "mode": attached.get("mode", "READ_WRITE"), "autoDelete": False})
    nics = []
    for nic in inputs.get("networkInterfaces") or []:
        entry = {"network": nic.get("network") if "/" in str(nic.get("network")) else
                 f"projects/{project}/global/networks/{nic.get('network', 'default')}"}
        if nic.get("subnetwork"):
            entry["subnetwork"] = nic["subnetwork"]
        if nic.get("accessConfigs"):
            entry["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
        nics.append(entry)
    account = inputs.get("serviceAccount") or {}
    scheduling = {"preemptible": False, **(inputs.get("scheduling") or {})}
    if "maxRunDuration" in scheduling:
        scheduling["maxRunDuration"] = {"seconds": str(int(float(scheduling["maxRunDuration"]["seconds"])))}
    return {
        "name": inputs["name"], "machineType": f"projects/{project}/zones/{zone}/machineTypes/{inputs['machineType']}",
        "disks": disks, "networkInterfaces": nics,
        "serviceAccounts": [{"email": account.get("email"), "scopes": account.get("scopes", [])}] if account else [],
        "scheduling": scheduling,
        "reservationAffinity": {"consumeReservationType": (inputs.get("reservationAffinity") or {}).get(
            "type", "ANY_RESERVATION")},
        "metadata": {"items": [{"key": k, "value": v} for k, v in (inputs.get("metadata") or {}).items()]},
        "tags": {"items": inputs.get("tags") or []}, "labels": {**(inputs.get("labels") or {}), **ATTRIBUTION},
        "canIpForward": bool(inputs.get("canIpForward", False)),
        "deletionProtection": bool(inputs.get("deletionProtection", False)),
    }


def relative(link: str) -> str:
    """A resource link without its host and API version: projects/P/zones/Z/disks/D."""
    return "projects/" + link.split("/projects/", 1)[1] if "/projects/" in link else link


def last(link: str) -> str:
    return str(link).rsplit("/", 1)[-1]


# Scheduling fields the program sets; the others are read back at the schema's defaults, which no diff sees.
SCHEDULING_INPUTS = ("provisioningModel", "maxRunDuration", "instanceTerminationAction", "onHostMaintenance",
                     "automaticRestart")


def instance_inputs(instance: Mapping[str, Any], boot_disk: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs an import of `instance` records, as the provider's Read and diff see them (resourceComputeInstance
    Read; flattenBootDisk takes image, size, type and labels from the boot disk itself: the image is the dated build
    a family resolved to). Where the API answers a link and a DiffSuppressFunc equates it with a name (network:
    CompareSelfLinkOrResourceName), the name is given. Labels drop the attribution label: the provider keeps it in
    effective_labels, not in `labels`."""
    project = instance["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
    boot = next(disk for disk in instance["disks"] if disk.get("boot"))
    scheduling = {key: value for key, value in (instance.get("scheduling") or {}).items() if key in SCHEDULING_INPUTS}
    if "maxRunDuration" in scheduling:
        scheduling["maxRunDuration"] = {"seconds": float(scheduling["maxRunDuration"]["seconds"])}
    nics = []
    for nic in instance.get("networkInterfaces") or []:
        entry: dict[str, Any] = {"network": last(nic["network"])}
        if nic.get("accessConfigs"):
            entry["accessConfigs"] = [{} for _ in nic["accessConfigs"]]
        nics.append(entry)
    accounts = instance.get("serviceAccounts") or []
    inputs: dict[str, Any] = {
        "bootDisk": {"autoDelete": bool(boot.get("autoDelete")), "initializeParams": {
            "image": boot_disk.get("sourceImage"), "labels": dict(boot_disk.get("labels") or {}),
            "size": float(boot_disk["sizeGb"]), "type": last(boot_disk["type"])}},
        "deletionProtection": bool(instance.get("deletionProtection")),
        "labels": {k: v for k, v in (instance.get("labels") or {}).items() if k not in ATTRIBUTION},
        "machineType": last(instance["machineType"]),
        "metadata": {item["key"]: item.get("value", "") for item in (instance.get("metadata") or {}).get("items", [])},
        "name": instance["name"], "networkInterfaces": nics, "project": project,
        "reservationAffinity": {"type": (instance.get("reservationAffinity") or {}).get("consumeReservationType")},
        "scheduling": scheduling, "tags": list((instance.get("tags") or {}).get("items") or []),
        "zone": last(instance["zone"]),
    }
    if accounts:
        inputs["serviceAccount"] = {"email": accounts[0].get("email"), "scopes": list(accounts[0].get("scopes", []))}
    attached = [{"deviceName": disk.get("deviceName"), "mode": disk.get("mode"), "source": relative(disk["source"])}
                for disk in instance["disks"] if not disk.get("boot")]
    if attached:
        inputs["attachedDisks"] = attached
    return inputs


class InstanceProvider(Provider):
    def _url(self, inputs: Mapping[str, Any], suffix: str = "") -> str:
        return self.cloud.compute(zonal(inputs["project"], inputs["zone"], "instances", inputs["name"]) + suffix)

    def _outputs(self, inputs: Mapping[str, Any], instance: Mapping[str, Any]) -> dict[str, Any]:
        nics = [{**nic_in, "networkIp": nic.get("networkIP", "")}
                for nic_in, nic in zip(inputs.get("networkInterfaces") or [], instance.get("networkInterfaces") or [])]
        boot = next((disk for disk in instance.get("disks") or [] if disk.get("boot")), None)
        image = (self.cloud.get(self.cloud.local(boot["source"])) or {}).get("sourceImage") if boot else None
        if image:  # Read records the boot disk's own sourceImage (flattenBootDisk), not the configured family
            params = {**inputs["bootDisk"].get("initializeParams", {}), "image": image}
            inputs = {**inputs, "bootDisk": {**inputs["bootDisk"], "initializeParams": params}}
        return {**inputs, "instanceId": str(instance.get("id", "")), "selfLink": instance.get("selfLink", ""),
                "creationTimestamp": instance.get("creationTimestamp", ""), "networkInterfaces": nics,
                "metadataFingerprint": (instance.get("metadata") or {}).get("fingerprint", ""),
                "currentStatus": instance.get("status", "")}

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        inputs = reg.applied
        operation = self.cloud.call("POST", self.cloud.compute(zonal(inputs["project"], inputs["zone"], "instances")),
                                    "Error creating instance", json=instance_body(inputs))
        timeout = reg.timeouts.get("create") or "20m"
        self.cloud.wait(operation, "Error waiting for instance to create", go_duration(timeout))
        instance = self.cloud.get(self._url(inputs)) or {}
        self._boot(instance)
        return zonal(inputs["project"], inputs["zone"], "instances", inputs["name"]), self._outputs(inputs, instance)

    def import_(self, id_: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        instance = self.cloud.get(self.cloud.compute(id_))
        if instance is None:
            return None
        boot = next(disk for disk in instance["disks"] if disk.get("boot"))
        inputs = instance_inputs(instance, self.cloud.get(self.cloud.local(boot["source"])) or {})
        return inputs, self._outputs(inputs, instance)

    def _boot(self, instance: Mapping[str, Any]) -> None:
        if self.cloud.boot is not None and instance:
            self.cloud.boot(dict(instance))

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        inputs = entry.get("outputs") or entry.get("inputs") or {}
        instance = self.cloud.get(self._url(inputs))
        return None if instance is None else self._outputs(entry.get("inputs") or inputs, instance)

    def update(self, old: Mapping[str, Any], reg: Any, change: ResourceChange) -> tuple[str, dict[str, Any]]:
        """resource_compute_instance.go resourceComputeInstanceUpdate, in its order: metadata (setMetadata with
        the current fingerprint), labels, then the fields that need a stopped instance, refused while it runs."""
        inputs, url = reg.applied, self._url(reg.applied)
        instance = self.cloud.get(url) or {}
        old_inputs = old.get("inputs") or {}
        if inputs.get("metadata") != old_inputs.get("metadata"):
            operation = self.cloud.call("POST", f"{url}/setMetadata", "Error updating metadata", json={
                "fingerprint": (instance.get("metadata") or {}).get("fingerprint", ""),
                "items": [{"key": k, "value": v} for k, v in (inputs.get("metadata") or {}).items()]})
            self.cloud.wait(operation, "Error updating metadata")
            self._boot(self.cloud.get(url) or {})
        if inputs.get("labels") != old_inputs.get("labels"):
            operation = self.cloud.call("POST", f"{url}/setLabels", "Error updating labels", json={
                "labelFingerprint": instance.get("labelFingerprint", ""), "labels": inputs.get("labels") or {}})
            self.cloud.wait(operation, "Error updating labels")
        if change.needs_stop and (self.cloud.get(url) or {}).get("status") == "RUNNING":
            raise ProviderError(STOP_REQUIRED)
        return str(old["id"]), self._outputs(inputs, self.cloud.get(url) or {})

    def delete(self, entry: Mapping[str, Any]) -> None:
        inputs = entry.get("inputs") or {}
        response = self.cloud.session.delete(self._url(inputs), timeout=30)
        if response.status_code == 404:
            return
        if not response.ok:
            raise ProviderError(f"Error deleting instance: googleapi: Error {response.status_code}: "
                                f"{google_message(response)}")
        self.cloud.wait(response.json(), "Error waiting for instance to delete")


# resource_compute_instance.go, the update's check before changing a field that needs a stopped instance.
STOP_REQUIRED = ("Changing the machine_type, min_cpu_platform, service_account, enable_display, "
                 "shielded_instance_config, scheduling.node_affinities or network_interface.[#d].(network/subnetwork/"
                 "subnetwork_project) or advanced_machine_features on a started instance requires stopping it. To "
                 "acknowledge this, please set allow_stopping_for_update = true in your config. You can also stop it "
                 "by setting desired_status = \"TERMINATED\", but the instance will not update until you set "
                 "desired_status = \"RUNNING\".")


def go_duration(text: str) -> str:
    """'10m' -> '10m0s' (how the provider's timeout error prints a duration)."""
    match = re.fullmatch(r"(\d+)m", text or "")
    return f"{match.group(1)}m0s" if match else text


class GlobalProvider(Provider):
    """A global or regional Compute resource created by one insert of its inputs (firewalls, routers)."""

    def __init__(self, cloud: Cloud, type_: str, collection: str, body: Callable[[Mapping[str, Any]], dict],
                 what: str) -> None:
        super().__init__(cloud, type_)
        self.collection, self.body, self.what = collection, body, what

    def _base(self, inputs: Mapping[str, Any]) -> str:
        region = inputs.get("region")
        scope = f"regions/{region}" if region else "global"
        return self.cloud.compute(f"projects/{inputs['project']}/{scope}/{self.collection}")

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        operation = self.cloud.call("POST", self._base(reg.applied), f"Error creating {self.what}",
                                    json=self.body(reg.applied))
        self.cloud.wait(operation, f"Error waiting to create {self.what}")
        return self._id(reg.applied), dict(reg.applied)

    def _id(self, inputs: Mapping[str, Any]) -> str:
        region = inputs.get("region")
        scope = f"regions/{region}" if region else "global"
        return f"projects/{inputs['project']}/{scope}/{self.collection}/{inputs['name']}"

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        inputs = entry.get("outputs") or {}
        return None if self.cloud.get(f"{self._base(inputs)}/{inputs['name']}") is None else dict(entry["outputs"])

    def update(self, old: Mapping[str, Any], reg: Any, change: ResourceChange) -> tuple[str, dict[str, Any]]:
        operation = self.cloud.call("PATCH", f"{self._base(reg.applied)}/{reg.applied['name']}",
                                    f"Error updating {self.what}", json=self.body(reg.applied))
        self.cloud.wait(operation, f"Error waiting to update {self.what}")
        return str(old["id"]), dict(reg.applied)

    def delete(self, entry: Mapping[str, Any]) -> None:
        inputs = entry.get("outputs") or {}
        response = self.cloud.session.delete(f"{self._base(inputs)}/{inputs['name']}", timeout=30)
        if response.status_code == 404:
            return
        if not response.ok:
            raise ProviderError(f"Error deleting {self.what}: googleapi: Error {response.status_code}: "
                                f"{google_message(response)}")
        self.cloud.wait(response.json(), f"Error waiting to delete {self.what}")


def firewall_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    network = inputs.get("network", "default")
    return {"name": inputs["name"], "network": network if "/" in network else
            f"projects/{inputs['project']}/global/networks/{network}",
            "direction": inputs.get("direction", "INGRESS"), "priority": int(float(inputs.get("priority", 1000))),
            "allowed": [{"IPProtocol": rule.get("protocol"), "ports": rule.get("ports", [])}
                        for rule in inputs.get("allows") or []],
            "denied": [{"IPProtocol": rule.get("protocol"), "ports": rule.get("ports", [])}
                       for rule in inputs.get("denies") or []],
            "sourceRanges": inputs.get("sourceRanges") or [], "sourceTags": inputs.get("sourceTags") or [],
            "sourceServiceAccounts": inputs.get("sourceServiceAccounts") or [],
            "targetTags": inputs.get("targetTags") or [],
            "targetServiceAccounts": inputs.get("targetServiceAccounts") or []}


def router_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    network = inputs.get("network", "default")
    return {"name": inputs["name"], "region": inputs.get("region"),
            "network": network if "/" in network else f"projects/{inputs['project']}/global/networks/{network}"}


class RouterNatProvider(Provider):
    """google_compute_router_nat: a NAT is an entry of its router's `nats`, added and removed by routers.patch of
    the whole list (resource_compute_router_nat.go: it reads the router, edits `nats`, patches)."""

    def _router(self, inputs: Mapping[str, Any]) -> str:
        return self.cloud.compute(f"projects/{inputs['project']}/regions/{inputs['region']}/routers/"
                                  f"{inputs['router']}")

    @staticmethod
    def nat(inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"name": inputs["name"], "natIpAllocateOption": inputs.get("natIpAllocateOption", "AUTO_ONLY"),
                "sourceSubnetworkIpRangesToNat": inputs.get("sourceSubnetworkIpRangesToNat"),
                "logConfig": inputs.get("logConfig") or {}}

    def _patch(self, inputs: Mapping[str, Any], edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
               what: str) -> None:
        router = self.cloud.get(self._router(inputs))
        if router is None:
            raise ProviderError(f"{what}: googleapi: Error 404: The resource 'projects/{inputs['project']}/regions/"
                                f"{inputs['region']}/routers/{inputs['router']}' was not found, notFound")
        operation = self.cloud.call("PATCH", self._router(inputs), what, json={"nats": edit(router.get("nats", []))})
        self.cloud.wait(operation, what)

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        inputs = reg.applied
        self._patch(inputs, lambda nats: [*nats, self.nat(inputs)], "Error patching router "
                    f"{inputs['region']}/{inputs['router']}")
        return f"{inputs['project']}/{inputs['region']}/{inputs['router']}/{inputs['name']}", dict(inputs)

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        inputs = entry.get("outputs") or {}
        router = self.cloud.get(self._router(inputs))
        if router is None or not any(nat.get("name") == inputs["name"] for nat in router.get("nats", [])):
            return None
        return dict(entry["outputs"])

    def delete(self, entry: Mapping[str, Any]) -> None:
        inputs = entry.get("outputs") or {}
        if self.cloud.get(self._router(inputs)) is None:
            return
        self._patch(inputs, lambda nats: [nat for nat in nats if nat.get("name") != inputs["name"]],
                    f"Error patching router {inputs['region']}/{inputs['router']}")


class ServiceAccountProvider(Provider):
    """google_service_account: projects.serviceAccounts.create with the account id (a 409 is the provider's
    error: it never adopts an existing account)."""

    def _email(self, inputs: Mapping[str, Any]) -> str:
        return f"{inputs['accountId']}@{inputs['project']}.iam.gserviceaccount.com"

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        inputs = reg.inputs
        account = self.cloud.call("POST", f"{self.cloud.url}/v1/projects/{inputs['project']}/serviceAccounts",
                                  "Error creating service account", json={
                                      "accountId": inputs["accountId"],
                                      "serviceAccount": {"displayName": inputs.get("displayName", ""),
                                                         "description": inputs.get("description", "")}})
        email = account.get("email") or self._email(inputs)
        return f"projects/{inputs['project']}/serviceAccounts/{email}", {
            **inputs, "email": email, "uniqueId": account.get("uniqueId", ""),
            "member": f"serviceAccount:{email}", "name": account.get("name", "")}

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        inputs = entry.get("inputs") or {}
        found = self.cloud.get(f"{self.cloud.url}/v1/projects/{inputs['project']}/serviceAccounts/"
                               f"{self._email(inputs)}")
        return None if found is None else dict(entry["outputs"])

    def delete(self, entry: Mapping[str, Any]) -> None:
        inputs = entry.get("inputs") or {}
        response = self.cloud.session.delete(f"{self.cloud.url}/v1/projects/{inputs['project']}/serviceAccounts/"
                                             f"{self._email(inputs)}", timeout=30)
        if response.status_code not in (200, 204, 404):
            raise ProviderError(f"Error deleting service account: googleapi: Error {response.status_code}: "
                                f"{google_message(response)}")


class AlertPolicyProvider(Provider):
    """The policy's id is its name, projects/P/alertPolicies/ID, which Cloud Monitoring chooses."""

    FIELDS = ("displayName", "combiner", "conditions", "documentation", "alertStrategy", "notificationChannels",
              "userLabels", "severity", "enabled")

    def _body(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {key: inputs[key] for key in self.FIELDS if key in inputs}

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        policy = self.cloud.call("POST", f"{self.cloud.url}/v3/projects/{reg.inputs['project']}/alertPolicies",
                                 "Error creating AlertPolicy", json=self._body(reg.inputs))
        return policy["name"], {**reg.inputs, "name": policy["name"]}

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        return None if self.cloud.get(f"{self.cloud.url}/v3/{entry['id']}") is None else dict(entry["outputs"])

    def update(self, old: Mapping[str, Any], reg: Any, change: ResourceChange) -> tuple[str, dict[str, Any]]:
        self.cloud.call("PATCH", f"{self.cloud.url}/v3/{old['id']}", f"Error updating AlertPolicy {old['id']!r}",
                        params={"updateMask": ",".join(self.FIELDS)}, json=self._body(reg.inputs))
        return str(old["id"]), {**reg.inputs, "name": old["id"]}

    def delete(self, entry: Mapping[str, Any]) -> None:
        response = self.cloud.session.delete(f"{self.cloud.url}/v3/{entry['id']}", timeout=30)
        if not response.ok and response.status_code != 404:
            raise ProviderError(f"Error deleting AlertPolicy: googleapi: Error {response.status_code}: "
                                f"{google_message(response)}")


# --- the dynamic resources: this repository's own providers ------------------------------------------------------

class DynamicProvider(Provider):
    """components.cache_provider's CacheDiskProvider or CacheBucketProvider, or tpuserve.alert_metrics'
    MetricsWrittenProvider, pointed at the fake cloud."""

    def __init__(self, cloud: Cloud, type_: str, urn: str) -> None:
        super().__init__(cloud, type_)
        from tpuserve import alert_metrics
        from components import cache_provider

        self.impl = alert_metrics.MetricsWrittenProvider(cloud.url) if urn.endswith("-metrics") else \
            cache_provider.CacheDiskProvider(cloud.url) if urn.endswith("-disk") else \
            cache_provider.CacheBucketProvider(cloud.url)

    @staticmethod
    def props(inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in inputs.items() if not key.startswith("__")}

    def diff(self, old: Mapping[str, Any], reg: Any) -> ResourceChange:
        olds, news = self.props(old.get("outputs") or {}), self.props(reg.inputs)
        check = self.impl.check(olds, news) if hasattr(self.impl, "check") else None
        if check is not None and check.failures:
            raise ProviderError("; ".join(failure.reason for failure in check.failures))
        result = self.impl.diff(str(old.get("id")), olds, news)
        replaces = tuple(result.replaces or ())
        changed = tuple(key for key in sorted(set(olds) | set(news)) if key != "adopted"
                        and olds.get(key) != news.get(key))
        if not result.changes:
            return ResourceChange("same", (), (), {}, (), False)
        return ResourceChange("replace" if replaces else "update", changed, replaces,
                              {key: changes.PropertyDiff("update-replace" if key in replaces else "update")
                               for key in changed}, (), bool(result.delete_before_replace))

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        result = self._call(lambda: self.impl.create(self.props(reg.inputs)))
        return str(result.id), {**reg.inputs, **(result.outs or {})}

    def read(self, entry: Mapping[str, Any]) -> dict[str, Any] | None:
        result = self._call(lambda: self.impl.read(str(entry.get("id")), self.props(entry.get("outputs") or {})))
        return None if result.id is None else {**(entry.get("outputs") or {}), **(result.outs or {})}

    def update(self, old: Mapping[str, Any], reg: Any, change: ResourceChange) -> tuple[str, dict[str, Any]]:
        result = self._call(lambda: self.impl.update(str(old["id"]), self.props(old.get("outputs") or {}),
                                                     self.props(reg.inputs)))
        return str(old["id"]), {**reg.inputs, **(result.outs or {})}

    def delete(self, entry: Mapping[str, Any]) -> None:
        self._call(lambda: self.impl.delete(str(entry.get("id")), self.props(entry.get("outputs") or {})))

    @staticmethod
    def _call(action: Callable[[], Any]) -> Any:
        from tpuserve.gce import ComputeApiError

        try:
            return action()
        except (ComputeApiError, requests.RequestException) as err:
            raise ProviderError(f"Exception: {err}") from err


# --- the readiness gate ---------------------------------------------------------------------------------------

class GateProvider(Provider):
    """command:local:Command running `tpuserve gate --instance ...`: it passes when the VM's guest attributes say
    `serving` for the config hash it was given, and fails as pulumi-command reports a failed command
    (`exit status 1: running "<command>":` and the command's output) when they say `failed`."""

    def diff(self, old: Mapping[str, Any], reg: Any) -> ResourceChange:
        olds = old.get("inputs") or {}
        changed = tuple(key for key in ("create", "triggers") if olds.get(key) != reg.inputs.get(key))
        if not changed:
            return ResourceChange("same", (), (), {}, (), False)
        return ResourceChange("replace", changed, changed,
                              {key: changes.PropertyDiff("update-replace") for key in changed}, (), False)

    def create(self, reg: Any) -> tuple[str, dict[str, Any]]:
        command = str(reg.inputs.get("create", ""))
        words = shlex.split(command.replace('"${TPUSERVE_PYTHON:-.venv/bin/python}"', "python"))
        args = {word: words[index + 1] for index, word in enumerate(words[:-1]) if word.startswith("--")}
        if "--instance" not in args:  # url mode (the local target): nothing to read in the cloud
            return f"{reg.name}-gate", {**reg.inputs, "stdout": json.dumps({"ready": True, "stages": {}}) + "\n"}
        url = self.cloud.compute(zonal(args["--project"], args["--zone"], "instances", args["--instance"]))
        response = self.cloud.session.get(f"{url}/getGuestAttributes", params={"queryPath": "tpu-serve/"},
                                          timeout=30)
        attributes = {item["key"]: item.get("value", "") for item in
                      (response.json().get("queryValue", {}).get("items", []) if response.ok else [])}
        stage = attributes.get("stage", "")
        if stage == "serving" and attributes.get("config-hash") == args.get("--config-hash"):
            verdict = {"ready": True, "elapsed_s": 1.0, "stages": {"serving": 1.0}, "reason": None}
            return f"{reg.name}-gate", {**reg.inputs, "stdout": json.dumps(verdict) + "\n"}
        reason = attributes.get("reason") or (f"the VM reports {stage!r}" if stage else "no boot stage reported")
        verdict = {"ready": False, "elapsed_s": 1.0, "stages": {}, "reason": reason}
        raise ProviderError(f'exit status 1: running "{command}":\nnot ready: {reason}\n{json.dumps(verdict)}')


# --- which provider serves which type --------------------------------------------------------------------------

def for_resource(type_: str, urn: str, cloud: Cloud) -> Provider:
    if type_ == "gcp:compute/instance:Instance":
        return InstanceProvider(cloud, type_)
    if type_ == "gcp:compute/firewall:Firewall":
        return GlobalProvider(cloud, type_, "firewalls", firewall_body, "Firewall")
    if type_ == "gcp:compute/router:Router":
        return GlobalProvider(cloud, type_, "routers", router_body, "Router")
    if type_ == "gcp:compute/routerNat:RouterNat":
        return RouterNatProvider(cloud, type_)
    if type_ == "gcp:serviceaccount/account:Account":
        return ServiceAccountProvider(cloud, type_)
    if type_ == "gcp:monitoring/alertPolicy:AlertPolicy":
        return AlertPolicyProvider(cloud, type_)
    if type_ == "pulumi-python:dynamic:Resource":
        return DynamicProvider(cloud, type_, urn)
    if type_ == "command:local:Command":
        return GateProvider(cloud, type_)
    return Virtual(cloud, type_)


def preview_outputs(reg: Any) -> dict[str, Any]:
    """What a preview knows of a resource it would create: its inputs (computed outputs are unknown)."""
    outputs = dict(reg.inputs)
    if reg.type == "gcp:serviceaccount/account:Account":
        outputs["email"] = f"{reg.inputs.get('accountId')}@{reg.inputs.get('project')}.iam.gserviceaccount.com"
    if reg.type == "gcp:compute/instance:Instance":
        outputs["networkInterfaces"] = [{**nic, "networkIp": "10.0.0.0"}
                                        for nic in reg.inputs.get("networkInterfaces") or []]
    return outputs


def invoke(token: str, args: Mapping[str, Any], cloud: Cloud) -> dict[str, Any]:
    return {}
