"""The tpu-serve policy rules, importable without starting a policy server (the pack is built in __main__.py).

Each rule reads the engine's camelCase resource inputs. A stack opts out of a default only through the policy
config file passed with `--policy-pack-config` (policy/config/<stack>.json), so loosening a rule is a reviewed
change to this directory, never a side effect of stack config. Values still unknown during a preview raise inside
`props` and the engine skips the rule for that resource; it runs again with known values during `up`.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

IAP_SOURCE_RANGE = "35.235.240.0/20"  # Google's Identity-Aware Proxy TCP forwarding range
MIN_BOOT_DISK_GB = 200
DEFAULT_COMPUTE_SA = re.compile(r"-compute@developer\.gserviceaccount\.com$")
BROAD_PROJECT_ROLES = ("roles/owner", "roles/editor")
SECRET_MANAGER_ROLES = "roles/secretmanager."
APP_LABEL = "tpu-serve"

FIREWALL = "gcp:compute/firewall:Firewall"
INSTANCE = "gcp:compute/instance:Instance"
PROJECT_IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
PROJECT_IAM_BINDING = "gcp:projects/iAMBinding:IAMBinding"
PROJECT_IAM_POLICY = "gcp:projects/iAMPolicy:IAMPolicy"
GKE_CLUSTER = "gcp:container/cluster:Cluster"
GKE_NODE_POOL = "gcp:container/nodePool:NodePool"
# Where GKE offers flex-start TPU v6e: the stack's own data file (its source and date inside), read from the
# repository (the pack's environment has pulumi-policy, not the toolkit).
DATA = Path(__file__).resolve().parent.parent / "tpuserve" / "data"
GKE_FLEX_START_V6E_ZONES = tuple(json.loads((DATA / "gke-flex-start-tpu.json").read_text())["zones"]["v6e"])
MAX_FLEX_START_RUN_SECONDS = json.loads((DATA / "flex-start.json").read_text())["maxRunSeconds"]
V6E_MACHINE = re.compile(r"^ct6e-")
STREAMING_IMAGE_TYPE = "COS_CONTAINERD"  # image streaming's node image (GKE's image-streaming page)
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")  # us-east5; a zone has a suffix (us-east5-b)
# GCP types a tpu-serve stack may declare that take `labels` (tests/components/test_policy.py checks this against
# pulumi-gcp).
LABELLED_TYPES = frozenset({
    INSTANCE,
    "gcp:compute/disk:Disk",
    "gcp:compute/address:Address",
    "gcp:compute/instanceTemplate:InstanceTemplate",
    "gcp:secretmanager/secret:Secret",
    "gcp:storage/bucket:Bucket",
    "gcp:tpu/v2Vm:V2Vm",
})

Validator = Callable[[ResourceValidationArgs, ReportViolation], None]


def stack_of(urn: str) -> str:
    """`urn:pulumi:<stack>::<project>::<type>::<name>` -> stack."""
    return urn.partition("::")[0].removeprefix("urn:pulumi:")


def expected_labels(stack: str) -> dict[str, str]:
    """The labels components/deployment.py `stack_labels` puts on every labelled resource of `stack`."""
    return {"app": APP_LABEL, "stack": re.sub(r"[^a-z0-9_-]+", "-", stack.lower())[:63], "managed-by": "pulumi"}


def only(types: frozenset[str] | None, validate: Validator, args: ResourceValidationArgs,
         report: ReportViolation) -> None:
    """Run `validate` for resources of these types only (None: every type). The rules below are plain functions
    that get their types in POLICIES, and this runs at validation time, not when the pack is built: a
    mutation-testing tool (which leaves decorated functions and import-time calls alone) reaches both."""
    if types is None or args.resource_type in types:
        validate(args, report)


def _outside(source: str, allowed: Iterable[str]) -> bool:
    try:
        network = ipaddress.ip_network(source, strict=False)
    except ValueError:
        return True
    return not any(network.version == ipaddress.ip_network(a).version and network.subnet_of(ipaddress.ip_network(a))
                   for a in allowed)


def check_firewall_sources(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.props.get("direction", "INGRESS") != "INGRESS":
        return
    if args.props.get("denies") and not args.props.get("allows"):
        return  # a deny rule admits nothing, whatever its sources
    allowed = args.get_config().get("allowedSourceRanges", [IAP_SOURCE_RANGE])
    sources = args.props.get("sourceRanges") or []
    tags = args.props.get("sourceTags") or []
    if not sources and not tags:
        report("ingress rule without sourceRanges (with no source tags either, GCP admits 0.0.0.0/0); "
               f"set sourceRanges to {IAP_SOURCE_RANGE} (IAP)", None)
    for source in sources:
        if _outside(source, allowed):
            report(f"source range {source} is outside the allowed ranges {', '.join(allowed)}; reach the VM "
                   "through IAP, or list the range in allowedSourceRanges of this stack's policy config", None)
    for tag in tags:
        report(f"sourceTags {tag} admits traffic from other VMs; only the allowed source ranges may reach the VM", None)
    if args.props.get("sourceServiceAccounts"):
        report("sourceServiceAccounts admits traffic from other VMs; only the allowed source ranges may reach the VM",
               None)


def check_no_external_ip(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.get_config().get("allowExternalIp"):
        return
    for index, nic in enumerate(args.props.get("networkInterfaces") or []):
        for key in ("accessConfigs", "ipv6AccessConfigs"):
            if nic.get(key):
                report(f"networkInterfaces[{index}].{key} gives the VM an external IP; use IAP and Cloud NAT, or "
                       "set allowExternalIp in this stack's policy config", None)


def check_flex_start_limits(args: ResourceValidationArgs, report: ReportViolation) -> None:
    scheduling = args.props.get("scheduling") or {}
    if scheduling.get("provisioningModel") != "FLEX_START":
        return
    seconds = (scheduling.get("maxRunDuration") or {}).get("seconds")
    if seconds is None:
        report("FLEX_START VM without scheduling.maxRunDuration: it would run (and bill) until someone deletes it",
               None)
    elif float(seconds) > MAX_FLEX_START_RUN_SECONDS:
        report(f"scheduling.maxRunDuration of {float(seconds):.0f}s exceeds the 7-day limit "
               f"({MAX_FLEX_START_RUN_SECONDS}s)", None)
    if scheduling.get("instanceTerminationAction") != "DELETE":
        report("FLEX_START VM must have scheduling.instanceTerminationAction DELETE, so nothing outlives the run",
               None)
    if scheduling.get("automaticRestart") is not False:
        report("FLEX_START VM must set scheduling.automaticRestart false (GCE defaults it to true)", None)


def check_boot_disk_size(args: ResourceValidationArgs, report: ReportViolation) -> None:
    scheduling = args.props.get("scheduling") or {}
    if not str(args.props.get("machineType")).startswith("ct") and \
            scheduling.get("provisioningModel") != "FLEX_START":
        return  # not a TPU serving VM
    boot_disk = args.props.get("bootDisk") or {}
    if boot_disk.get("source"):
        return  # an existing disk: its size is that disk's own input
    size = (boot_disk.get("initializeParams") or {}).get("size")
    if size is None or float(size) < MIN_BOOT_DISK_GB:
        report(f"bootDisk.initializeParams.size is {size}; the vLLM image and weights need at least "
               f"{MIN_BOOT_DISK_GB} GB", None)


def check_vm_service_account(args: ResourceValidationArgs, report: ReportViolation) -> None:
    account = args.props.get("serviceAccount")
    if account is None:
        return  # no identity at all: nothing to over-grant
    email = account.get("email") or ""
    if not email or email == "default" or DEFAULT_COMPUTE_SA.search(email):
        report(f"serviceAccount.email {email or '(empty: the default)'} is the default compute service account, "
               "which holds Editor in most projects; run the VM as its own service account", None)


def _project_grants(args: ResourceValidationArgs) -> list[str]:
    """The roles a project-level IAM resource grants (the members are not needed to judge them)."""
    if args.resource_type == PROJECT_IAM_POLICY:
        policy = json.loads(args.props.get("policyData") or "{}")
        return [binding.get("role", "") for binding in policy.get("bindings", [])]
    return [args.props.get("role") or ""]


def check_project_iam(args: ResourceValidationArgs, report: ReportViolation) -> None:
    for role in _project_grants(args):
        if role in BROAD_PROJECT_ROLES:
            report(f"project-level {role} is not granted by this stack; grant a narrow role instead", None)
        elif role.startswith(SECRET_MANAGER_ROLES):
            report(f"project-level {role} opens every secret in the project; bind it on the one secret "
                   "(secretmanager.SecretIamMember)", None)


# --- GKE (target gke) --------------------------------------------------------------------------------------------

def _run_seconds(duration: Any) -> float | None:
    """GKE's "<seconds>s" duration ("86400s") as seconds; None when it is not one."""
    text = str(duration or "")
    try:
        return float(text[:-1]) if text.endswith("s") else None
    except ValueError:
        return None


def check_gke_private_nodes(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == GKE_CLUSTER:
        if (args.props.get("privateClusterConfig") or {}).get("enablePrivateNodes") is not True:
            report("privateClusterConfig.enablePrivateNodes is not true: nodes would get external IPs; use private "
                   "nodes and Cloud NAT", None)
    elif (args.props.get("networkConfig") or {}).get("enablePrivateNodes") is not True:
        report("networkConfig.enablePrivateNodes is not true: this pool's nodes could get external IPs (they follow "
               "the cluster's default); set it on the pool", None)


def check_gke_node_service_account(args: ResourceValidationArgs, report: ReportViolation) -> None:
    # A cluster always creates its default pool (even when removeDefaultNodePool deletes it right after), so a
    # cluster's nodeConfig is checked like a pool's.
    email = (args.props.get("nodeConfig") or {}).get("serviceAccount") or ""
    if not email or email == "default" or DEFAULT_COMPUTE_SA.search(email):
        report(f"nodeConfig.serviceAccount {email or '(empty: the default)'} is the default compute service "
               "account, which holds Editor in most projects; run the nodes as their own service account "
               "(roles/container.defaultNodeServiceAccount)", None)


def check_gke_workload_identity(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == GKE_CLUSTER:
        pool = (args.props.get("workloadIdentityConfig") or {}).get("workloadPool")
        expected = f"{args.props.get('project')}.svc.id.goog"
        if pool != expected:
            report(f"workloadIdentityConfig.workloadPool is {pool!r}, not {expected!r}: without Workload Identity "
                   "pods use the node's identity", None)
    mode = ((args.props.get("nodeConfig") or {}).get("workloadMetadataConfig") or {}).get("mode")
    if mode != "GKE_METADATA":
        report(f"nodeConfig.workloadMetadataConfig.mode is {mode!r}, not 'GKE_METADATA': pods could reach the "
               "node's service account through the metadata server", None)


def check_gke_flex_start_pool(args: ResourceValidationArgs, report: ReportViolation) -> None:
    node_config = args.props.get("nodeConfig") or {}
    if node_config.get("flexStart") is not True:
        return
    seconds = _run_seconds(node_config.get("maxRunDuration"))
    if seconds is None:
        report("flex-start node pool without nodeConfig.maxRunDuration (\"<seconds>s\"): nodes would run (and bill) "
               "for the 7-day maximum", None)
    elif seconds > MAX_FLEX_START_RUN_SECONDS:
        report(f"nodeConfig.maxRunDuration of {seconds:.0f}s exceeds the 7-day limit ({MAX_FLEX_START_RUN_SECONDS}s)",
               None)
    if (args.props.get("management") or {}).get("autoRepair") is not False:
        report("flex-start node pool must set management.autoRepair false (flex-start does not work with "
               "auto-repair; GKE defaults it to true)", None)
    affinity = (node_config.get("reservationAffinity") or {}).get("consumeReservationType")
    if affinity != "NO_RESERVATION":
        report(f"flex-start node pool must set nodeConfig.reservationAffinity.consumeReservationType "
               f"NO_RESERVATION, not {affinity!r}", None)


def check_gke_flex_start_zones(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A flex-start TPU v6e pool lies only in zones where GKE offers it, and scales by total limits with location
    policy ANY, so a stockout in one zone does not hold a scale-up the other zones could serve."""
    node_config = args.props.get("nodeConfig") or {}
    if node_config.get("flexStart") is not True or not V6E_MACHINE.match(str(node_config.get("machineType") or "")):
        return
    allowed = (args.get_config() or {}).get("allowedZones") or list(GKE_FLEX_START_V6E_ZONES)
    zones = list(args.props.get("nodeLocations") or [])
    if not zones:
        report("flex-start TPU v6e pool without nodeLocations: it takes the cluster's zones, which GKE may not "
               f"offer flex-start v6e in (only {', '.join(allowed)})", None)
    outside = [zone for zone in zones if zone not in allowed]
    if outside:
        report(f"nodeLocations {', '.join(outside)}: GKE offers flex-start TPU v6e only in {', '.join(allowed)} "
               "(gke-flex-start-tpu.json)", None)
    autoscaling = args.props.get("autoscaling") or {}
    if autoscaling.get("minNodeCount") is not None or autoscaling.get("maxNodeCount") is not None or \
            autoscaling.get("totalMaxNodeCount") is None:
        report("autoscaling must use totalMinNodeCount/totalMaxNodeCount: per-zone limits multiply by the zones "
               "and cap each zone on its own", None)
    if autoscaling.get("locationPolicy") != "ANY":
        report(f"autoscaling.locationPolicy is {autoscaling.get('locationPolicy')!r}, not 'ANY': flex-start takes "
               "capacity wherever it is (GKE supports no other policy for it)", None)


def check_gke_image_streaming(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A flex-start TPU pool streams its image: each of its nodes is new, and a 20-26 GB pull would come first."""
    node_config = args.props.get("nodeConfig") or {}
    if node_config.get("flexStart") is not True or not V6E_MACHINE.match(str(node_config.get("machineType") or "")):
        return
    if (node_config.get("gcfsConfig") or {}).get("enabled") is not True:
        report("flex-start TPU pool without image streaming (nodeConfig.gcfsConfig.enabled): every new node pulls "
               "the whole vLLM image before the pod starts", None)
    if node_config.get("imageType") != STREAMING_IMAGE_TYPE:
        report(f"nodeConfig.imageType is {node_config.get('imageType')!r}, not {STREAMING_IMAGE_TYPE!r}: image "
               "streaming needs Container-Optimized OS with containerd", None)


def check_gke_zonal_cluster(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """GKE's free tier credits one zonal or Autopilot cluster per billing account, never a regional one."""
    if (args.get_config() or {}).get("allowRegionalCluster"):
        return
    location = str(args.props.get("location") or "")
    if REGION.match(location):
        report(f"location {location} makes a regional cluster, whose $0.10/h fee GKE's free tier never covers; "
               "create it in a zone (its node pools may still use the region's other zones)", None)


def _missing_labels(labels: Mapping[str, Any] | None, expected: Mapping[str, str]) -> list[str]:
    labels = labels or {}
    return [f"{key}={value}" for key, value in expected.items() if labels.get(key) != value]


def check_stack_labels(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if not args.resource_type.startswith("gcp:"):
        return
    expected = expected_labels(stack_of(args.urn))
    places: dict[str, Mapping[str, Any] | None] = {}
    if args.resource_type in LABELLED_TYPES or "labels" in args.props:
        places["labels"] = args.props.get("labels")
    initialize_params = (args.props.get("bootDisk") or {}).get("initializeParams")
    if args.resource_type == INSTANCE and initialize_params is not None:
        places["bootDisk.initializeParams.labels"] = initialize_params.get("labels")
    if args.resource_type == GKE_CLUSTER:  # GKE names its GCE labels resourceLabels
        places["resourceLabels"] = args.props.get("resourceLabels")
    if args.resource_type in (GKE_CLUSTER, GKE_NODE_POOL) and args.props.get("nodeConfig") is not None:
        places["nodeConfig.resourceLabels"] = args.props["nodeConfig"].get("resourceLabels")
    for where, labels in places.items():
        missing = _missing_labels(labels, expected)
        if missing:
            report(f"{where} lacks the stack labels {', '.join(missing)}", None)


def _policy(name: str, description: str, types: Iterable[str] | None, validate: Validator,
            config: dict[str, dict[str, Any]] | None = None) -> ResourceValidationPolicy:
    # pragma: no mutate block -- runs once, when POLICIES is built at import (before any mutant is active); the
    # names, levels and schemas it sets are pinned by tests/components/test_policy.py.
    return ResourceValidationPolicy(
        name=name, description=description,
        validate=functools.partial(only, None if types is None else frozenset(types), validate),
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(properties=config) if config else None)


GKE_TYPES = (GKE_CLUSTER, GKE_NODE_POOL)
POLICIES = [
    _policy("firewall-iap-sources-only", "Ingress firewall sources are limited to the IAP range.", [FIREWALL],
            check_firewall_sources,
            {"allowedSourceRanges": {"type": "array", "items": {"type": "string"}, "default": [IAP_SOURCE_RANGE],
                                     "description": "CIDR ranges an ingress rule may admit."}}),
    _policy("no-external-ip", "VMs get no external IP unless the stack opts in.", [INSTANCE], check_no_external_ip,
            {"allowExternalIp": {"type": "boolean", "default": False,
                                 "description": "This stack's VMs may have an external IP."}}),
    _policy("flex-start-run-limits", "FLEX_START VMs run at most 7 days, are deleted at the end, never restart.",
            [INSTANCE], check_flex_start_limits),
    _policy("boot-disk-min-size", f"TPU VM boot disks are at least {MIN_BOOT_DISK_GB} GB.", [INSTANCE],
            check_boot_disk_size),
    _policy("dedicated-vm-service-account", "VMs do not run as the default compute service account.", [INSTANCE],
            check_vm_service_account),
    _policy("no-broad-project-iam", "No project-level owner/editor or Secret Manager grants.",
            [PROJECT_IAM_MEMBER, PROJECT_IAM_BINDING, PROJECT_IAM_POLICY], check_project_iam),
    _policy("stack-labels", "Every labelled GCP resource carries app, stack and managed-by labels.", None,
            check_stack_labels),
    _policy("gke-private-nodes", "GKE clusters and node pools have private nodes only.", GKE_TYPES,
            check_gke_private_nodes),
    _policy("gke-dedicated-node-service-account", "GKE nodes do not run as the default compute service account.",
            GKE_TYPES, check_gke_node_service_account),
    _policy("gke-workload-identity", "GKE clusters have Workload Identity; nodes serve pods GKE_METADATA only.",
            GKE_TYPES, check_gke_workload_identity),
    _policy("gke-flex-start-node-pool", "Flex-start node pools run at most 7 days, without auto-repair or a "
            "reservation.", [GKE_NODE_POOL], check_gke_flex_start_pool),
    _policy("gke-flex-start-zones", "Flex-start TPU v6e pools lie in GKE's flex-start zones and scale by total "
            "limits with location policy ANY.", [GKE_NODE_POOL], check_gke_flex_start_zones,
            {"allowedZones": {"type": "array", "items": {"type": "string"}, "default": list(GKE_FLEX_START_V6E_ZONES),
                              "description": "Zones a flex-start TPU v6e node pool may use (GKE's list: "
                                             "tpuserve/data/gke-flex-start-tpu.json)."}}),
    _policy("gke-image-streaming", "Flex-start TPU v6e pools stream their image (gcfsConfig on COS_CONTAINERD).",
            [GKE_NODE_POOL], check_gke_image_streaming),
    _policy("gke-zonal-cluster", "GKE clusters the stack creates are zonal, the kind GKE's free tier covers.",
            [GKE_CLUSTER], check_gke_zonal_cluster,
            {"allowRegionalCluster": {"type": "boolean", "default": False,
                                      "description": "This stack may create a regional cluster (its fee is never "
                                                     "covered by the free tier)."}}),
]
