"""Each policy rule on small literal resources: both sides of every limit and the exact message a reviewer reads.
tests/components/test_policy.py runs the rules on what the real program declares; here the inputs are written out, so a rule's
boundary (7 days is allowed, 7 days and a second is not; a 200 GB disk is enough) and its wording are pinned
independently of the program. Expected values are literals, not the rules module's constants.

The report callback takes (message, urn) like pulumi_policy's ReportViolation type; `violations` calls every
policy of the pack, so a rule that fires on a type it should not see shows up too.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pulumi_policy import PolicyCustomTimeouts, PolicyResourceOptions, ResourceValidationArgs

from policy import rules

FIREWALL = "gcp:compute/firewall:Firewall"
INSTANCE = "gcp:compute/instance:Instance"
DISK = "gcp:compute/disk:Disk"
IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
IAM_BINDING = "gcp:projects/iAMBinding:IAMBinding"
IAM_POLICY = "gcp:projects/iAMPolicy:IAMPolicy"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"

DEV_LABELS = {"app": "tpu-serve", "stack": "dev", "managed-by": "pulumi"}
IAP = "35.235.240.0/20"
MISSING_LABELS = "app=tpu-serve, stack=dev, managed-by=pulumi"


def violations(type_token: str, props: dict[str, Any], config: dict[str, dict[str, Any]] | None = None,
               stack: str = "dev") -> dict[str, list[str]]:
    """Every policy's messages for one resource, keyed by policy name; `config` maps policy name to its config."""
    found: dict[str, list[str]] = {}
    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    for policy in rules.POLICIES:
        def report(message: str, urn: str | None, name: str = policy.name) -> None:
            assert urn is None, urn  # the resource under validation itself
            found.setdefault(name, []).append(message)

        args = ResourceValidationArgs(type_token, props, f"urn:pulumi:{stack}::tpu-serve::{type_token}::res",
                                      "res", opts, None, (config or {}).get(policy.name, {}))
        policy.validate(args, report)
    return found


def changed(base: dict[str, Any], **paths: Any) -> dict[str, Any]:
    """A deep copy of `base` with dotted paths set (a value of DELETE removes the key)."""
    props = copy.deepcopy(base)
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node = props
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[int(leaf) if isinstance(node, list) else leaf] = value
    return props


DELETE = object()

# --- firewall ---------------------------------------------------------------------------------------------------

OUTSIDE = ("source range {} is outside the allowed ranges {}; reach the VM through IAP, or list the range in "
           "allowedSourceRanges of this stack's policy config")
NO_SOURCES = ("ingress rule without sourceRanges (with no source tags either, GCP admits 0.0.0.0/0); set sourceRanges "
              "to 35.235.240.0/20 (IAP)")
TAGS = "sourceTags {} admits traffic from other VMs; only the allowed source ranges may reach the VM"
ACCOUNTS = "sourceServiceAccounts admits traffic from other VMs; only the allowed source ranges may reach the VM"


@pytest.mark.parametrize("props, config, expected", [
    ({"direction": "INGRESS", "sourceRanges": [IAP]}, None, []),
    ({"sourceRanges": [IAP]}, None, []),  # direction left to GCP's default, INGRESS
    ({"sourceRanges": ["35.235.241.0/24"]}, None, []),  # inside the IAP range
    ({"sourceRanges": ["35.235.240.7/20"]}, None, []),  # host bits set: GCP takes it as the network
    ({"direction": "EGRESS", "sourceRanges": ["0.0.0.0/0"]}, None, []),  # egress rules are not ingress
    ({"sourceRanges": ["0.0.0.0/0"]}, None, [OUTSIDE.format("0.0.0.0/0", IAP)]),
    ({"sourceRanges": ["35.235.224.0/19"]}, None, [OUTSIDE.format("35.235.224.0/19", IAP)]),  # wider than IAP
    ({"sourceRanges": ["::/0"]}, None, [OUTSIDE.format("::/0", IAP)]),
    ({"sourceRanges": ["everywhere"]}, None, [OUTSIDE.format("everywhere", IAP)]),
    ({"sourceRanges": [IAP, "10.0.0.0/8"]}, None, [OUTSIDE.format("10.0.0.0/8", IAP)]),
    ({"sourceRanges": ["10.1.0.0/16"]}, {"allowedSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]}, []),
    ({"sourceRanges": [IAP]}, {"allowedSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]},
     [OUTSIDE.format(IAP, "10.0.0.0/8, 192.168.0.0/16")]),  # the config replaces the default, it does not add
    ({}, None, [NO_SOURCES]),
    ({"sourceRanges": [], "sourceTags": []}, None, [NO_SOURCES]),
    ({"sourceTags": ["bastion"]}, None, [TAGS.format("bastion")]),
    ({"sourceRanges": [IAP], "sourceTags": ["bastion"]}, None, [TAGS.format("bastion")]),
    ({"sourceRanges": [IAP], "sourceServiceAccounts": ["router@p.iam.gserviceaccount.com"]}, None, [ACCOUNTS]),
    ({"sourceRanges": [IAP], "sourceServiceAccounts": []}, None, []),
])
def test_firewall_sources(props: dict[str, Any], config: dict[str, Any] | None, expected: list[str]) -> None:
    found = violations(FIREWALL, props, {"firewall-iap-sources-only": config} if config else None)
    assert found == ({"firewall-iap-sources-only": expected} if expected else {})


# --- instance ---------------------------------------------------------------------------------------------------

VM = {
    "machineType": "ct6e-standard-1t",
    "labels": DEV_LABELS,
    "networkInterfaces": [{"network": "default"}, {"network": "other", "accessConfigs": []}],
    "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": 14400},
                   "instanceTerminationAction": "DELETE", "automaticRestart": False},
    "bootDisk": {"initializeParams": {"size": 200, "labels": DEV_LABELS}},
    "serviceAccount": {"email": "tpu-serve-dev@proj-1.iam.gserviceaccount.com"},
}
NO_RUN_LIMIT = "FLEX_START VM without scheduling.maxRunDuration: it would run (and bill) until someone deletes it"
NOT_DELETED = "FLEX_START VM must have scheduling.instanceTerminationAction DELETE, so nothing outlives the run"
RESTARTS = "FLEX_START VM must set scheduling.automaticRestart false (GCE defaults it to true)"
SMALL_DISK = "bootDisk.initializeParams.size is {}; the vLLM image and weights need at least 200 GB"
DEFAULT_SA = ("serviceAccount.email {} is the default compute service account, which holds Editor in most projects; "
              "run the VM as its own service account")


@pytest.mark.parametrize("paths, expected", [
    ({}, {}),
    ({"scheduling__maxRunDuration__seconds": 604800}, {}),  # exactly 7 days is allowed
    ({"scheduling__maxRunDuration__seconds": "604800"}, {}),
    ({"scheduling__maxRunDuration__seconds": 604801},
     {"flex-start-run-limits": ["scheduling.maxRunDuration of 604801s exceeds the 7-day limit (604800s)"]}),
    ({"scheduling__maxRunDuration__seconds": 604800.4},
     {"flex-start-run-limits": ["scheduling.maxRunDuration of 604800s exceeds the 7-day limit (604800s)"]}),
    ({"scheduling__maxRunDuration": DELETE}, {"flex-start-run-limits": [NO_RUN_LIMIT]}),
    ({"scheduling__maxRunDuration": {}}, {"flex-start-run-limits": [NO_RUN_LIMIT]}),
    ({"scheduling__maxRunDuration": None}, {"flex-start-run-limits": [NO_RUN_LIMIT]}),
    ({"scheduling__instanceTerminationAction": "STOP"}, {"flex-start-run-limits": [NOT_DELETED]}),
    ({"scheduling__automaticRestart": True}, {"flex-start-run-limits": [RESTARTS]}),
    ({"scheduling__automaticRestart": DELETE}, {"flex-start-run-limits": [RESTARTS]}),
    ({"scheduling": {"provisioningModel": "FLEX_START"}},
     {"flex-start-run-limits": [NO_RUN_LIMIT, NOT_DELETED, RESTARTS]}),
    # Not flex-start: none of its limits apply.
    ({"scheduling": {"provisioningModel": "STANDARD", "automaticRestart": True}}, {}),
    ({"scheduling": None}, {}),
    ({"bootDisk__initializeParams__size": 199},
     {"boot-disk-min-size": [SMALL_DISK.format(199)]}),
    ({"bootDisk__initializeParams__size": 199.5}, {"boot-disk-min-size": [SMALL_DISK.format(199.5)]}),
    ({"bootDisk__initializeParams__size": "200"}, {}),
    ({"bootDisk__initializeParams__size": DELETE}, {"boot-disk-min-size": [SMALL_DISK.format(None)]}),
    ({"bootDisk": {"source": "projects/p/zones/z/disks/d"}}, {}),  # an existing disk: its own size
    ({"serviceAccount": DELETE}, {}),  # no identity at all
    ({"serviceAccount__email": ""}, {"dedicated-vm-service-account": [DEFAULT_SA.format("(empty: the default)")]}),
    ({"serviceAccount__email": DELETE},
     {"dedicated-vm-service-account": [DEFAULT_SA.format("(empty: the default)")]}),
    ({"serviceAccount__email": "default"}, {"dedicated-vm-service-account": [DEFAULT_SA.format("default")]}),
    ({"serviceAccount__email": "123456789012-compute@developer.gserviceaccount.com"},
     {"dedicated-vm-service-account": [DEFAULT_SA.format("123456789012-compute@developer.gserviceaccount.com")]}),
    ({"networkInterfaces__1__accessConfigs": [{}]},
     {"no-external-ip": ["networkInterfaces[1].accessConfigs gives the VM an external IP; use IAP and Cloud NAT, or "
                         "set allowExternalIp in this stack's policy config"]}),
    ({"networkInterfaces__0__ipv6AccessConfigs": [{"networkTier": "PREMIUM"}]},
     {"no-external-ip": ["networkInterfaces[0].ipv6AccessConfigs gives the VM an external IP; use IAP and Cloud NAT, "
                         "or set allowExternalIp in this stack's policy config"]}),
    ({"networkInterfaces": None}, {}),
])
def test_tpu_vm_limits(paths: dict[str, Any], expected: dict[str, list[str]]) -> None:
    assert violations(INSTANCE, changed(VM, **paths)) == expected


def test_an_external_ip_passes_only_with_the_stacks_opt_in() -> None:
    props = changed(VM, networkInterfaces__0__accessConfigs=[{}])
    assert violations(INSTANCE, props, {"no-external-ip": {"allowExternalIp": True}}) == {}
    assert list(violations(INSTANCE, props, {"no-external-ip": {"allowExternalIp": False}})) == ["no-external-ip"]


@pytest.mark.parametrize("machine_type, model, held", [
    ("ct6e-standard-4t", "STANDARD", True),  # a TPU machine type, flex-start or not
    ("e2-standard-4", "FLEX_START", True),
    ("e2-standard-4", "STANDARD", False),  # not a TPU VM: a small disk is fine
])
def test_the_boot_disk_minimum_holds_for_tpu_or_flex_start_vms(machine_type: str, model: str, held: bool) -> None:
    props = changed(VM, machineType=machine_type, bootDisk__initializeParams__size=20,
                    scheduling={"provisioningModel": model, "maxRunDuration": {"seconds": 3600},
                                "instanceTerminationAction": "DELETE", "automaticRestart": False})
    expected = {"boot-disk-min-size": [SMALL_DISK.format(20)]} if held else {}
    assert violations(INSTANCE, props) == expected


# --- project IAM --------------------------------------------------------------------------------------------------

BROAD = "project-level {} is not granted by this stack; grant a narrow role instead"
SECRETS = ("project-level {} opens every secret in the project; bind it on the one secret "
           "(secretmanager.SecretIamMember)")


@pytest.mark.parametrize("type_token, props, expected", [
    (IAM_MEMBER, {"role": "roles/logging.logWriter"}, []),
    (IAM_MEMBER, {"role": "roles/owner"}, [BROAD.format("roles/owner")]),
    (IAM_BINDING, {"role": "roles/editor"}, [BROAD.format("roles/editor")]),
    (IAM_MEMBER, {"role": "roles/secretmanager.secretAccessor"},
     [SECRETS.format("roles/secretmanager.secretAccessor")]),
    (IAM_MEMBER, {"role": "roles/secretmanagerx.viewer"}, []),
    (IAM_MEMBER, {"role": "roles/viewer"}, []),
    (IAM_MEMBER, {}, []),
    (IAM_POLICY, {"policyData": json.dumps({"bindings": [
        {"role": "roles/viewer"}, {"role": "roles/owner"}, {"members": ["user:a@example.com"]},
        {"role": "roles/secretmanager.admin"}]})},
     [BROAD.format("roles/owner"), SECRETS.format("roles/secretmanager.admin")]),
    (IAM_POLICY, {"policyData": json.dumps({"etag": "BwX"})}, []),
    (IAM_POLICY, {}, []),
    (IAM_POLICY, {"role": "roles/owner", "policyData": "{}"}, []),  # a policy is judged by its bindings
])
def test_project_iam(type_token: str, props: dict[str, Any], expected: list[str]) -> None:
    assert violations(type_token, props) == ({"no-broad-project-iam": expected} if expected else {})


def test_iam_rules_see_only_project_level_iam_types() -> None:
    assert violations("gcp:secretmanager/secretIamMember:SecretIamMember",
                      {"role": "roles/secretmanager.secretAccessor"}) == {}


# --- stack labels -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_token, props, stack, expected", [
    (DISK, {"labels": DEV_LABELS}, "dev", {}),
    (DISK, {"labels": {**DEV_LABELS, "team": "ml"}}, "dev", {}),
    (DISK, {}, "dev", {"stack-labels": [f"labels lacks the stack labels {MISSING_LABELS}"]}),
    (DISK, {"labels": {**DEV_LABELS, "stack": "prod"}}, "dev", {"stack-labels": ["labels lacks the stack labels "
                                                                                 "stack=dev"]}),
    (DISK, {"labels": {"app": "tpu-serve", "stack": "feature-long_branch-name", "managed-by": "pulumi"}},
     "Feature/Long_Branch.Name", {}),
    # A type outside the table that has labels anyway is checked; one without is not.
    ("gcp:compute/router:Router", {"labels": {}}, "dev",
     {"stack-labels": [f"labels lacks the stack labels {MISSING_LABELS}"]}),
    ("gcp:compute/router:Router", {"name": "nat"}, "dev", {}),
    ("kubernetes:apps/v1:Deployment", {"labels": {}}, "dev", {}),  # not a GCP resource
    (INSTANCE, {"labels": DEV_LABELS, "bootDisk": {"initializeParams": {"size": 200}}}, "dev",
     {"stack-labels": [f"bootDisk.initializeParams.labels lacks the stack labels {MISSING_LABELS}"]}),
    (INSTANCE, {"labels": DEV_LABELS, "bootDisk": {"source": "d"}}, "dev", {}),
    (CLUSTER, {"resourceLabels": DEV_LABELS}, "dev", {}),
    (CLUSTER, {"labels": DEV_LABELS}, "dev",
     {"stack-labels": [f"resourceLabels lacks the stack labels {MISSING_LABELS}"]}),
    (NODE_POOL, {"nodeConfig": {"resourceLabels": {"app": "tpu-serve"}}}, "dev",
     {"stack-labels": ["nodeConfig.resourceLabels lacks the stack labels stack=dev, managed-by=pulumi"]}),
    (NODE_POOL, {}, "dev", {}),
])
def test_stack_labels(type_token: str, props: dict[str, Any], stack: str, expected: dict[str, list[str]]) -> None:
    found = violations(type_token, props, stack=stack)
    assert {k: v for k, v in found.items() if k == "stack-labels"} == expected


@pytest.mark.parametrize("stack, label", [("dev", "dev"), ("Feature/Long_Branch.Name", "feature-long_branch-name"),
                                          ("a" * 70, "a" * 63), ("prod--eu", "prod--eu")])
def test_expected_labels_of_a_stack(stack: str, label: str) -> None:
    assert rules.expected_labels(stack) == {"app": "tpu-serve", "stack": label, "managed-by": "pulumi"}
    assert rules.stack_of(f"urn:pulumi:{stack}::tpu-serve::gcp:compute/disk:Disk::cache") == stack


# --- GKE ----------------------------------------------------------------------------------------------------------

GKE_LABELS = {"app": "tpu-serve", "stack": "gke", "managed-by": "pulumi"}
NODE_SA = "tpu-serve-gke-nodes@p.iam.gserviceaccount.com"
CLUSTER_PROPS = {"project": "p", "resourceLabels": GKE_LABELS,
                 "privateClusterConfig": {"enablePrivateNodes": True},
                 "workloadIdentityConfig": {"workloadPool": "p.svc.id.goog"},
                 "nodeConfig": {"serviceAccount": NODE_SA, "workloadMetadataConfig": {"mode": "GKE_METADATA"},
                                "resourceLabels": GKE_LABELS}}
POOL = {"networkConfig": {"enablePrivateNodes": True}, "management": {"autoRepair": False},
        "nodeConfig": {"serviceAccount": NODE_SA, "workloadMetadataConfig": {"mode": "GKE_METADATA"},
                       "resourceLabels": GKE_LABELS, "flexStart": True, "maxRunDuration": "86400s",
                       "reservationAffinity": {"consumeReservationType": "NO_RESERVATION"}}}
CLUSTER_PUBLIC = ("privateClusterConfig.enablePrivateNodes is not true: nodes would get external IPs; use private "
                  "nodes and Cloud NAT")
POOL_PUBLIC = ("networkConfig.enablePrivateNodes is not true: this pool's nodes could get external IPs (they follow "
               "the cluster's default); set it on the pool")
NODE_DEFAULT_SA = ("nodeConfig.serviceAccount {} is the default compute service account, which holds Editor in most "
                   "projects; run the nodes as their own service account (roles/container.defaultNodeServiceAccount)")
METADATA = ("nodeConfig.workloadMetadataConfig.mode is {}, not 'GKE_METADATA': pods could reach the node's service "
            "account through the metadata server")
NO_POOL_LIMIT = ("flex-start node pool without nodeConfig.maxRunDuration (\"<seconds>s\"): nodes would run (and bill) "
                 "for the 7-day maximum")
AUTO_REPAIR = ("flex-start node pool must set management.autoRepair false (flex-start does not work with auto-repair; "
               "GKE defaults it to true)")
RESERVATION = ("flex-start node pool must set nodeConfig.reservationAffinity.consumeReservationType NO_RESERVATION, "
               "not {}")


@pytest.mark.parametrize("paths, expected", [
    ({}, {}),
    ({"privateClusterConfig__enablePrivateNodes": False}, {"gke-private-nodes": [CLUSTER_PUBLIC]}),
    ({"privateClusterConfig": DELETE}, {"gke-private-nodes": [CLUSTER_PUBLIC]}),
    ({"nodeConfig__serviceAccount": DELETE},
     {"gke-dedicated-node-service-account": [NODE_DEFAULT_SA.format("(empty: the default)")]}),
    ({"nodeConfig__serviceAccount": "default"}, {"gke-dedicated-node-service-account": [NODE_DEFAULT_SA.format(
        "default")]}),
    ({"workloadIdentityConfig__workloadPool": "other.svc.id.goog"},
     {"gke-workload-identity": ["workloadIdentityConfig.workloadPool is 'other.svc.id.goog', not 'p.svc.id.goog': "
                                "without Workload Identity pods use the node's identity"]}),
    ({"workloadIdentityConfig": DELETE},
     {"gke-workload-identity": ["workloadIdentityConfig.workloadPool is None, not 'p.svc.id.goog': without Workload "
                                "Identity pods use the node's identity"]}),
    ({"nodeConfig__workloadMetadataConfig": DELETE}, {"gke-workload-identity": [METADATA.format("None")]}),
    # Flex-start limits are a node pool's: a cluster's default pool is not held to them.
    ({"nodeConfig__flexStart": True, "management": {"autoRepair": True}}, {}),
])
def test_gke_cluster(paths: dict[str, Any], expected: dict[str, list[str]]) -> None:
    found = violations(CLUSTER, changed(CLUSTER_PROPS, **paths), stack="gke")
    assert found == expected


@pytest.mark.parametrize("paths, expected", [
    ({}, {}),
    ({"nodeConfig__maxRunDuration": "604800s"}, {}),  # exactly 7 days is allowed
    ({"nodeConfig__maxRunDuration": "604801s"},
     {"gke-flex-start-node-pool": ["nodeConfig.maxRunDuration of 604801s exceeds the 7-day limit (604800s)"]}),
    ({"nodeConfig__maxRunDuration": "7d"}, {"gke-flex-start-node-pool": [NO_POOL_LIMIT]}),  # not GKE's format
    ({"nodeConfig__maxRunDuration": "longs"}, {"gke-flex-start-node-pool": [NO_POOL_LIMIT]}),
    ({"nodeConfig__maxRunDuration": DELETE}, {"gke-flex-start-node-pool": [NO_POOL_LIMIT]}),
    ({"management__autoRepair": True}, {"gke-flex-start-node-pool": [AUTO_REPAIR]}),
    ({"management": DELETE}, {"gke-flex-start-node-pool": [AUTO_REPAIR]}),
    ({"nodeConfig__reservationAffinity__consumeReservationType": "ANY_RESERVATION"},
     {"gke-flex-start-node-pool": [RESERVATION.format("'ANY_RESERVATION'")]}),
    ({"nodeConfig__reservationAffinity": DELETE}, {"gke-flex-start-node-pool": [RESERVATION.format("None")]}),
    # Not flex-start: its limits do not apply.
    ({"nodeConfig__flexStart": DELETE, "management__autoRepair": True, "nodeConfig__maxRunDuration": DELETE}, {}),
    ({"nodeConfig__flexStart": "true", "management__autoRepair": True}, {}),
    ({"networkConfig": DELETE}, {"gke-private-nodes": [POOL_PUBLIC]}),
    ({"networkConfig__enablePrivateNodes": "true"}, {"gke-private-nodes": [POOL_PUBLIC]}),
    ({"nodeConfig__serviceAccount": "1234-compute@developer.gserviceaccount.com"},
     {"gke-dedicated-node-service-account": [NODE_DEFAULT_SA.format("1234-compute@developer.gserviceaccount.com")]}),
    ({"nodeConfig__serviceAccount": ""},
     {"gke-dedicated-node-service-account": [NODE_DEFAULT_SA.format("(empty: the default)")]}),
    ({"nodeConfig__workloadMetadataConfig__mode": "GCE_METADATA"},
     {"gke-workload-identity": [METADATA.format("'GCE_METADATA'")]}),
])
def test_gke_node_pool(paths: dict[str, Any], expected: dict[str, list[str]]) -> None:
    assert violations(NODE_POOL, changed(POOL, **paths), stack="gke") == expected


def test_a_pool_without_node_config_is_held_to_every_node_rule() -> None:
    assert violations(NODE_POOL, {"networkConfig": {"enablePrivateNodes": True}}, stack="gke") == {
        "gke-dedicated-node-service-account": [NODE_DEFAULT_SA.format("(empty: the default)")],
        "gke-workload-identity": [METADATA.format("None")]}


def test_every_rule_sees_only_its_types() -> None:
    """An instance's, a firewall's and a cluster's unsafe inputs on a type no rule reads report nothing."""
    unsafe = {**changed(VM, serviceAccount__email="default", bootDisk__initializeParams__size=1),
              "sourceRanges": ["0.0.0.0/0"], "role": "roles/owner", "nodeConfig": {"flexStart": True},
              "privateClusterConfig": {"enablePrivateNodes": False}}
    assert violations("gcp:storage/bucket:Bucket", {**unsafe, "labels": DEV_LABELS}) == {}
