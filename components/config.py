"""Typed stack config, one class per target, read once and validated before any resource is declared.

Each setting is a dataclass field whose metadata holds its key and description; scripts/config_docs.py makes
Pulumi.yaml's `config:` block and the reference (docs/configuration.md) from them. Why: docs/design/config.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

from tpuserve import durations
from tpuserve.facts import (DEFAULT_CACHE_DISK_GB, DEFAULT_CACHE_DISK_IOPS, DEFAULT_CACHE_DISK_MIBPS,
                            HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_FREE_MIBPS, HYPERDISK_BALANCED_MAX_IOPS,
                            HYPERDISK_BALANCED_MAX_MIBPS, PRICE_PER_CHIP_HOUR, READY_TIMEOUT_S, V6E_ZONES,
                            hyperdisk_balanced_monthly_usd)
from tpuserve.flex_start import MAX_RUN_S, MIN_RUN_S
from tpuserve.names import PROJECT_NAME
from tpuserve.registry import DOCKER_HUB, Reference, RegistryError
from tpuserve.serving import (DEFAULT_PORT, TPU_BACKEND, ConfigError, ServingConfig, auto_tensor_parallel_size,
                              parse_mm_limits, setting, untested_modalities)
from tpuserve.zones import REGION_FORMAT, ZONE_FORMAT, region_of

MIN_BOOT_DISK_GB = 200
# One vLLM TPU image, one model's weights and the compile cache, with room (the boot wants 20 GB free: MIN_FREE_GB).
MIN_CACHE_DISK_GB = 50
# v6e takes Hyperdisk Balanced and Hyperdisk ML only, and Hyperdisk ML cannot boot (docs/configuration.md).
V6E_BOOT_DISK_TYPE = "hyperdisk-balanced"
V6E_MACHINE_TYPE = re.compile(r"^ct6e-standard-(1|4|8)t$")
DOCKER_GPUS = re.compile(r"^(all|[1-9][0-9]*|device=[0-9]+(,[0-9]+)*)?$")
# https://cloud.google.com/resource-manager/docs/creating-managing-projects; older ids may have a domain prefix.
PROJECT_ID = re.compile(r"^(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
# A text setting with a non-empty default may be empty only where its description says what empty means.
EMPTY_MEANS_NONE = "empty for none"
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
GKE_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label
GKE_MAX_NODES = 64  # a bound on cost mistakes, not a GKE limit: 64 ct6e-standard-8t nodes are $691/h at $1.35
# GKE's own list of flex-start v6e zones (narrower than Compute Engine's), kept as data with its source.
GKE_FLEX_START = json.loads(resources.files("tpuserve").joinpath("data/gke-flex-start-tpu.json").read_text())
GKE_FLEX_START_V6E_ZONES: tuple[str, ...] = tuple(GKE_FLEX_START["zones"]["v6e"])
GKE_ROUTERS = ("service", "inference-gateway")
# The registries GKE's image streaming reads (https://cloud.google.com/kubernetes-engine/docs/how-to/image-streaming).
ARTIFACT_REGISTRY_HOST = re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev$")
DOCKER_HUB_HOSTS = (DOCKER_HUB, "docker.io", "index.docker.io")
MAX_PROXY_SUBNET_PREFIX = 26  # https://cloud.google.com/load-balancing/docs/proxy-only-subnets: /26 at least
NOTIFICATION_CHANNEL = re.compile(r"^projects/[^/]+/notificationChannels/[0-9]+$")
VM_SLOTS = ("a", "b")
REPLACE_ORDERS = ("create-first", "delete-first")
SECRET_ID = re.compile(r"^(projects/[^/]+/secrets/)?[A-Za-z0-9_-]{1,255}$")
# What a key of another target's is told beyond where it belongs.
ELSEWHERE_HINTS = {"hfTokenSecretId": "target local cannot read Secret Manager: set hfToken (pulumi config set "
                                      "--secret hfToken ...), or nothing for a public model"}


@dataclass(frozen=True)
class StackConfig:
    """Every target: where to serve, the labels, the token and how long `pulumi up` waits for the model."""

    COMPONENT: ClassVar[str] = ""  # the target's component, "module:Class": __main__.py imports only that one
    BACKEND: ClassVar[str] = TPU_BACKEND

    target: str = setting("target", "Where to serve: gcp (a flex-start TPU VM), gke (a flex-start TPU node pool "
                          "on GKE) or local (a Docker host).", "gcp")
    labels: Mapping[str, str] = setting("labels", "Extra labels on every resource that takes labels.", {})
    hf_token: Any = setting("hfToken", "Hugging Face token; gcp and gke store it in a new Secret Manager secret. "
                            "Set with `pulumi config set --secret hfToken`.", None, repr=False)
    readiness_timeout: str = setting("readinessTimeout", "How long `pulumi up` waits for the model to answer.",
                                     f"{READY_TIMEOUT_S // 60}m")
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)

    def __post_init__(self) -> None:
        # The backend follows the target, the chips and tensorParallelSize 0 (auto) the machine.
        serving = self.serving
        object.__setattr__(self, "serving", dataclasses.replace(
            serving, backend=self.BACKEND, chips=self.chips,
            tensor_parallel_size=serving.tensor_parallel_size or self.default_tensor_parallel_size()))

    @property
    def chips(self) -> int:
        return 1

    def default_tensor_parallel_size(self) -> int:
        return self.chips  # one engine on every chip; gcp splits a machine into engines

    @property
    def readiness_timeout_seconds(self) -> int:
        return parse_duration("readinessTimeout", self.readiness_timeout)

    def validate(self) -> StackConfig:
        """Raise ConfigError naming the first bad key; return self."""
        self.check()
        for key, value in self.labels.items():
            if not LABEL_KEY.match(str(key)) or not LABEL_VALUE.match(str(value)):
                raise ConfigError("labels", f"{key}={value!r}: keys and values must be lowercase letters, digits, "
                                  "_ or -, at most 63 chars (keys start with a letter)")
        self.readiness_timeout_seconds  # noqa: B018 - parses, raising ConfigError on a bad value
        self.serving.validate()
        return self

    def check(self) -> None:
        """The target's own keys (each subclass checks its own after its parent's)."""

    def one_engine(self, where: str) -> None:
        """A gke pod and the local container run one engine each; only a gcp VM splits its chips."""
        if self.serving.engines > 1:
            raise ConfigError("tensorParallelSize", f"{self.serving.tensor_parallel_size} would split the chips into "
                              f"{self.serving.engines} engines; {where}")

    def warnings(self) -> list[str]:
        """Advice that does not stop a deploy."""
        return []


@dataclass(frozen=True)
class TpuConfig(StackConfig):
    """Targets gcp and gke: a flex-start TPU v6e in a GCP project."""

    project: str = setting("project", "GCP project id that owns every resource.", "")
    zone: str = setting("zone", "Zone of the TPU VM or node pool; `tpuserve up` writes the zone it found capacity "
                        "in.", V6E_ZONES[0])
    region: str = setting("region", "Region for Cloud NAT; empty = the zone's region, so NAT follows the zone "
                          "`tpuserve up` picks (if set, it must contain the zone).", "")
    machine_type: str = setting("machineType", "TPU v6e machine type (ct6e-standard-1t = one chip; -4t, -8t: 4 or 8 "
                                "chips, chips / tensorParallelSize vLLM engines behind one port).", "ct6e-standard-1t")
    boot_disk_gb: int = setting("bootDiskSizeGb", f"Boot disk size in GB (at least {MIN_BOOT_DISK_GB}).",
                                MIN_BOOT_DISK_GB)
    boot_disk_type: str = setting("bootDiskType", "Boot disk type; a v6e boot disk must be hyperdisk-balanced.",
                                  V6E_BOOT_DISK_TYPE)
    compile_cache_bucket: bool = setting(
        "compileCacheBucket", "Also keep the XLA compile cache in a Cloud Storage bucket of the stack, so a new or "
        "lost cache disk still compiles warm.", True)
    keep_caches: bool = setting(
        "keepCaches", "The cache disk and bucket survive `pulumi destroy` (and a zone change) for the next "
        "deployment; false: they are deleted with the stack (`pulumi up` first, then destroy).", True)
    max_run_duration: str = setting("maxRunDuration", "Flex-start run limit, e.g. 4h or 1d12h (from 10m to 7d); "
                                    "the VM is deleted when it ends.", "4h")
    hf_token_secret_id: str = setting(
        "hfTokenSecretId", "Existing Secret Manager secret holding the Hugging Face token (id or "
        "projects/P/secrets/S). Alternative to hfToken.", "")
    network: str = setting("network", "VPC network name.", "default")
    subnetwork: str = setting("subnetwork", "Subnetwork name; empty = the network's default for the region.", "")
    create_cloud_nat: bool = setting("createCloudNat", "Create a Cloud Router + NAT for egress; turn off when the "
                                     "VPC already has NAT in the region.", True)
    cloud_nat_skip_regions: tuple[str, ...] = setting(
        "cloudNatSkipRegions", "Regions where another stack's Cloud NAT already serves the network, so this stack "
        "makes none there (a network takes one all-subnetworks NAT per region); `tpuserve up` writes it "
        "from the NATs it finds.", ())
    price_per_chip_hour: float = setting("pricePerChipHour", "USD per chip-hour, for cost outputs.",
                                         PRICE_PER_CHIP_HOUR)

    @property
    def chips(self) -> int:
        match = V6E_MACHINE_TYPE.match(self.machine_type)
        return int(match.group(1)) if match else 1  # check() refuses the machine type

    @property
    def effective_region(self) -> str:
        return self.region or region_of(self.zone)

    def makes_nat_in(self, region: str) -> bool:
        """Whether the stack makes a Cloud Router + NAT in `region` when it needs egress there (deploy/nat.py)."""
        return self.create_cloud_nat and region not in self.cloud_nat_skip_regions

    @property
    def max_run_seconds(self) -> int:
        return parse_duration("maxRunDuration", self.max_run_duration)

    def check(self) -> None:
        if not self.project:
            raise ConfigError("project", "is required: pulumi config set project <gcp-project-id>")
        if not PROJECT_ID.match(self.project):
            raise ConfigError("project", f"{self.project!r} is not a GCP project id (6-30 lowercase letters, digits "
                              "or hyphens, starting with a letter, not ending with a hyphen); use the id, not the "
                              "project's name or number")
        if not ZONE_FORMAT.match(self.zone):
            raise ConfigError("zone", f"{self.zone!r} is not a zone name like europe-west4-a")
        if self.region and self.region != region_of(self.zone):
            raise ConfigError("region", f"{self.region!r} does not contain zone {self.zone!r}")
        if not V6E_MACHINE_TYPE.match(self.machine_type):
            raise ConfigError("machineType", f"{self.machine_type!r} is not a TPU v6e machine type "
                              "(ct6e-standard-1t, -4t or -8t)")
        if self.boot_disk_gb < MIN_BOOT_DISK_GB:
            raise ConfigError("bootDiskSizeGb", f"must be at least {MIN_BOOT_DISK_GB}, got {self.boot_disk_gb}")
        if self.boot_disk_type != V6E_BOOT_DISK_TYPE:
            raise ConfigError("bootDiskType", f"{self.boot_disk_type!r}: a TPU v6e boot disk must be "
                              f"{V6E_BOOT_DISK_TYPE} (v6e takes only Hyperdisk Balanced and Hyperdisk ML, and "
                              "Hyperdisk ML cannot boot)")
        if not MIN_RUN_S <= self.max_run_seconds <= MAX_RUN_S:
            raise ConfigError("maxRunDuration", f"{self.max_run_duration!r} is outside flex-start's limits: from "
                              f"{durations.setting(MIN_RUN_S)} to {durations.setting(MAX_RUN_S)}")
        if bool(self.hf_token_secret_id) == (self.hf_token is not None):
            raise ConfigError("hfTokenSecretId", "set exactly one of hfTokenSecretId (an existing secret) or "
                              "hfToken (pulumi config set --secret hfToken ...)")
        check_secret_id("hfTokenSecretId", self.hf_token_secret_id)
        for region in self.cloud_nat_skip_regions:
            if not isinstance(region, str) or not REGION_FORMAT.match(region):
                raise ConfigError("cloudNatSkipRegions", f"{region!r} is not a region name like europe-west4 (it is "
                                  "written by `tpuserve up`; pulumi config rm cloudNatSkipRegions to start over)")
        if self.price_per_chip_hour < 0:
            raise ConfigError("pricePerChipHour", f"must not be negative, got {self.price_per_chip_hour}")

    def warnings(self) -> list[str]:
        untested = untested_modalities(self.serving)
        if not untested:
            return []
        return [f"multimodalLimits: {', '.join(untested)} on modelImpl {self.serving.model_impl} runs vLLM's own "
                "Gemma 4 code through torchax, which tpu-inference does not test "
                "(tpuserve/data/tpu-inference-support.json); send one such request before relying on it"]


@dataclass(frozen=True)
class GcpConfig(TpuConfig):
    """Target gcp: a flex-start TPU VM (`components/deployment.py`), its cache disk and its alerts."""

    COMPONENT: ClassVar[str] = "components.deployment:TpuServeDeployment"

    zones: tuple[str, ...] = setting(
        "zones", "Zones `tpuserve up` tries in order, after the stack's current zone; the default is ordered by "
        "where flex-start v6e capacity was found.", V6E_ZONES)
    boot_image: str = setting(
        "bootImage", "Boot image or image family path.",
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    cache_disk_gb: int = setting(
        "cacheDiskSizeGb", "Size of the Hyperdisk Balanced cache disk in the VM's zone (Docker's image layers, the "
        "Hugging Face cache, the XLA compile cache), kept when the VM goes; 0 = none (every boot cold).",
        DEFAULT_CACHE_DISK_GB)
    cache_disk_throughput_mibps: int = setting(
        "cacheDiskThroughputMibps", f"Provisioned throughput of the cache disk, MiB/s ({HYPERDISK_BALANCED_FREE_MIBPS} "
        f"to {HYPERDISK_BALANCED_MAX_MIBPS}; above {HYPERDISK_BALANCED_FREE_MIBPS} it bills by the month): how fast a "
        "warm boot reads the weights (`tpuserve plan` shows the boot time and the cost).", DEFAULT_CACHE_DISK_MIBPS)
    cache_disk_iops: int = setting(
        "cacheDiskIops", f"Provisioned IOPS of the cache disk ({HYPERDISK_BALANCED_FREE_IOPS} to "
        f"{HYPERDISK_BALANCED_MAX_IOPS}; above {HYPERDISK_BALANCED_FREE_IOPS} it bills by the month).",
        DEFAULT_CACHE_DISK_IOPS)
    vm_slot: str = setting(
        "vmSlot", "Which of the stack's two VM names (and cache disk slots) the VM uses: a = tpu-serve-<stack>, b = "
        "tpu-serve-<stack>-b. `tpuserve up` switches it when a change replaces the VM in its zone, so the old VM "
        "serves until its successor is ready (a name exists once per zone).", "a")
    replace_order: str = setting(
        "replaceOrder", "When a change replaces the VM: create-first (the old VM serves until the new one is ready; "
        "needs quota for both for a moment) or delete-first. `tpuserve up` picks delete-first for one run when the "
        "region's quota has no room for both.", "create-first")
    vllm_api_key_secret_id: str = setting(
        "vllmApiKeySecretId", "Secret Manager secret (id or projects/P/secrets/S) holding the API key vLLM requires on "
        "/v1 (clients send it as TPUSERVE_API_KEY); empty for none.", "")
    external_ip: bool = setting("externalIp", "Give the VM an external IP (then no Cloud NAT is made).", False)
    # The dashboard and alert policies (components/monitoring.py).
    alert_notification_channels: tuple[str, ...] = setting(
        "alertNotificationChannels", "Cloud Monitoring notification channels the alerts notify, as "
        "projects/P/notificationChannels/ID; none by default (alerts then show in the console only).", ())
    alert_down_after: str = setting("alertDownAfter", "Alert when no vLLM metrics have arrived for this long: the "
                                    "server is down or the VM gone (flex-start deletes it at its max run).", "10m")
    alert_ttft_p99_seconds: float = setting("alertTtftP99Seconds", "Alert when the p99 time to first token over 5 "
                                            "minutes stays above this many seconds for 10 minutes.", 5.0)
    alert_queue_depth: int = setting("alertQueueDepth", "Alert when at least this many requests wait and the queue "
                                     "has grown for 10 minutes.", 8)

    def default_tensor_parallel_size(self) -> int:
        return auto_tensor_parallel_size(self.serving.model, self.chips, self.serving.gpu_memory_utilization)

    @property
    def alert_down_after_seconds(self) -> int:
        return parse_duration("alertDownAfter", self.alert_down_after)

    @property
    def cache_disk_monthly_usd(self) -> float:
        """What the cache disk costs per month while it exists, VM or not (reference Hyperdisk Balanced prices)."""
        return round(hyperdisk_balanced_monthly_usd(self.cache_disk_gb, self.cache_disk_iops,
                                                    self.cache_disk_throughput_mibps), 2) if self.cache_disk_gb else 0.0

    @property
    def worst_case_cost_usd(self) -> float:
        """What one full flex-start run costs if nobody destroys the stack earlier."""
        return round(self.max_run_seconds / 3600 * self.chips * self.price_per_chip_hour, 2)

    def check(self) -> None:
        super().check()
        if not self.zones:
            raise ConfigError("zones", "must list at least one zone (or leave it unset for the default order)")
        check_zones("zones", self.zones, "europe-west4-a")
        if self.vm_slot not in VM_SLOTS:
            raise ConfigError("vmSlot", f"{self.vm_slot!r} is not one of {', '.join(VM_SLOTS)}")
        if self.replace_order not in REPLACE_ORDERS:
            raise ConfigError("replaceOrder", f"{self.replace_order!r} is not one of {', '.join(REPLACE_ORDERS)}")
        if self.cache_disk_gb != 0 and self.cache_disk_gb < MIN_CACHE_DISK_GB:
            raise ConfigError("cacheDiskSizeGb", f"must be 0 (no cache disk) or at least {MIN_CACHE_DISK_GB}, got "
                              f"{self.cache_disk_gb}")
        if not HYPERDISK_BALANCED_FREE_MIBPS <= self.cache_disk_throughput_mibps <= HYPERDISK_BALANCED_MAX_MIBPS:
            raise ConfigError("cacheDiskThroughputMibps", f"must be from {HYPERDISK_BALANCED_FREE_MIBPS} (included "
                              f"free) to {HYPERDISK_BALANCED_MAX_MIBPS} MiB/s (Hyperdisk Balanced's range), got "
                              f"{self.cache_disk_throughput_mibps}")
        if not HYPERDISK_BALANCED_FREE_IOPS <= self.cache_disk_iops <= HYPERDISK_BALANCED_MAX_IOPS:
            raise ConfigError("cacheDiskIops", f"must be from {HYPERDISK_BALANCED_FREE_IOPS} (included free) to "
                              f"{HYPERDISK_BALANCED_MAX_IOPS} (Hyperdisk Balanced's range), got {self.cache_disk_iops}")
        check_secret_id("vllmApiKeySecretId", self.vllm_api_key_secret_id)
        for channel in self.alert_notification_channels:
            if not NOTIFICATION_CHANNEL.match(str(channel)):
                raise ConfigError("alertNotificationChannels", f"{channel!r} is not a notification channel name like "
                                  "projects/my-project/notificationChannels/1234567890 (gcloud beta monitoring "
                                  "channels list --format='value(name)')")
        if self.alert_down_after_seconds < 120:
            raise ConfigError("alertDownAfter", f"{self.alert_down_after!r} is shorter than 2m: metrics arrive every "
                              "15 s and a short gap is not an outage")
        if self.alert_ttft_p99_seconds <= 0:
            raise ConfigError("alertTtftP99Seconds", f"must be above zero, got {self.alert_ttft_p99_seconds}")
        if self.alert_queue_depth < 1:
            raise ConfigError("alertQueueDepth", f"must be at least 1, got {self.alert_queue_depth}")

    def warnings(self) -> list[str]:
        # Which zones offer v6e is Compute Engine's to say (`tpuserve preflight` asks it): the list only flags a typo.
        unknown = [zone for zone in dict.fromkeys((self.zone, *self.zones)) if zone not in V6E_ZONES]
        found = [f"zone/zones: {', '.join(unknown)} not among the zones known to offer TPU v6e "
                 f"({', '.join(V6E_ZONES)}); `tpuserve preflight` checks them live"] if unknown else []
        return found + super().warnings()


@dataclass(frozen=True)
class GkeConfig(TpuConfig):
    """Target gke: a flex-start TPU node pool on GKE (`components/gke.py`)."""

    COMPONENT: ClassVar[str] = "components.gke_deployment:GkeTpuServe"

    gke_cluster: str = setting("gkeCluster", "Name of an existing GKE Standard cluster (Workload Identity on) to add "
                               "the TPU node pool to; empty = create a zonal cluster tpu-serve-<stack> in the zone "
                               "(GKE's free tier covers one zonal cluster's fee).", "")
    gke_cluster_location: str = setting("gkeClusterLocation", "Location (region or zone) of gkeCluster; empty = the "
                                        "zone's region.", "")
    gke_max_nodes: int = setting("gkeMaxNodes", "Most vLLM replicas (one flex-start TPU node each) the autoscaler "
                                 "scales to; the node pool may add the surge node (gkeSurgeNode).", 2)
    gke_min_replicas: int = setting("gkeMinReplicas", "Fewest vLLM replicas the autoscaler keeps; 0 parks the "
                                    "deployment so the TPU node pool scales to zero.", 1)
    gke_namespace: str = setting("gkeNamespace", "Kubernetes namespace of the deployment.", "tpu-serve")
    gke_zones: tuple[str, ...] = setting(
        "gkeZones", "Zones of the TPU node pool, all in the zone's region; empty = every zone of that region where "
        "GKE offers flex-start TPU v6e, so a stockout in one zone does not stop scale-up.", ())
    gke_surge_node: bool = setting(
        "gkeSurgeNode", "The TPU node pool may grow one node past gkeMaxNodes, so a rollout or a renewal starts each "
        "new pod before the one it replaces stops (maxSurge 1); false = no extra node: a rollout stops a pod first "
        "(maxSurge 0, maxUnavailable 1) and a lone replica is down while its successor boots.", True)
    gke_router: str = setting(
        "gkeRouter", "What routes requests to the replicas: service (a ClusterIP Service, round robin) or "
        "inference-gateway (GKE Inference Gateway: an internal Gateway and an InferencePool whose endpoint picker "
        "routes by each replica's queue, KV cache and prefix cache).", GKE_ROUTERS[0])
    gke_proxy_subnet_range: str = setting(
        "gkeProxySubnetRange", "With gkeRouter inference-gateway: CIDR of the proxy-only subnet the stack creates for "
        "the regional internal load balancer; empty for none (the network already has one in the region).",
        "10.129.0.0/23")

    @property
    def gke_pool_zones(self) -> tuple[str, ...]:
        """gkeZones, else GKE's flex-start v6e zones of the zone's region (a zonal cluster's pools may span it)."""
        if self.gke_zones:
            return tuple(self.gke_zones)
        return tuple(zone for zone in GKE_FLEX_START_V6E_ZONES if region_of(zone) == region_of(self.zone))

    @property
    def gke_pool_max_nodes(self) -> int:
        """One node per replica the HPA may ask for, plus the surge node."""
        return self.gke_max_nodes + (1 if self.gke_surge_node else 0)

    def check(self) -> None:
        super().check()
        region = region_of(self.zone)
        if self.gke_cluster and not GKE_CLUSTER_NAME.match(self.gke_cluster):
            raise ConfigError("gkeCluster", f"{self.gke_cluster!r} is not a GKE cluster name (lowercase letters, "
                              "digits and -, at most 40 characters, starting with a letter)")
        if self.gke_cluster_location and self.gke_cluster_location not in (region, self.zone):
            raise ConfigError("gkeClusterLocation", f"{self.gke_cluster_location!r}: the TPU nodes run in zone "
                              f"{self.zone!r}, so the cluster must be regional in {region} or zonal in {self.zone}")
        if self.gke_cluster_location and not self.gke_cluster:
            raise ConfigError("gkeClusterLocation", "applies to an existing cluster only; set gkeCluster too, or "
                              "leave it empty (a new cluster is zonal, in the zone)")
        if not 1 <= self.gke_max_nodes <= GKE_MAX_NODES:
            raise ConfigError("gkeMaxNodes", f"must be between 1 and {GKE_MAX_NODES}, got {self.gke_max_nodes}")
        if not 0 <= self.gke_min_replicas <= self.gke_max_nodes:
            raise ConfigError("gkeMinReplicas", f"must be between 0 and gkeMaxNodes ({self.gke_max_nodes}), got "
                              f"{self.gke_min_replicas}")
        if not K8S_NAME.match(self.gke_namespace):
            raise ConfigError("gkeNamespace", f"{self.gke_namespace!r} is not a Kubernetes namespace name "
                              "(lowercase letters, digits and -, at most 63 characters)")
        if self.readiness_timeout_seconds < READY_TIMEOUT_S:
            raise ConfigError("readinessTimeout", f"{self.readiness_timeout!r}: on gke it is the pods' startup "
                              f"probe budget and must cover a cold compile: at least {READY_TIMEOUT_S // 60}m")
        if self.max_run_seconds <= self.readiness_timeout_seconds:
            raise ConfigError("maxRunDuration", f"{self.max_run_duration!r} is not longer than readinessTimeout "
                              f"({self.readiness_timeout}): a node could be deleted before its pod's startup budget "
                              "ends, and a rollout would wait for a pod that never serves; set maxRunDuration to "
                              "several hours")
        offered = f"GKE offers flex-start TPU v6e only in {', '.join(GKE_FLEX_START_V6E_ZONES)} " \
                  f"({GKE_FLEX_START['source'].split()[0]})"
        if self.zone not in GKE_FLEX_START_V6E_ZONES:
            raise ConfigError("zone", f"{self.zone!r}: {offered}; pulumi config set zone {GKE_FLEX_START_V6E_ZONES[-1]}")
        check_zones("gkeZones", self.gke_zones, "us-east5-a")
        for zone in self.gke_zones:
            if zone not in GKE_FLEX_START_V6E_ZONES:
                raise ConfigError("gkeZones", f"{zone!r}: {offered}")
            if region_of(zone) != region:
                raise ConfigError("gkeZones", f"{zone!r} is not in {region}, the region of zone {self.zone!r} and "
                                  "of the cluster; a node pool spans one region")
        if self.gke_router not in GKE_ROUTERS:
            raise ConfigError("gkeRouter", f"{self.gke_router!r} is not one of {', '.join(GKE_ROUTERS)}")
        if self.gke_router == "inference-gateway" and self.gke_proxy_subnet_range:
            try:
                network = ipaddress.ip_network(self.gke_proxy_subnet_range)
            except ValueError:
                network = None
            if network is None or network.version != 4 or network.prefixlen > MAX_PROXY_SUBNET_PREFIX:
                raise ConfigError("gkeProxySubnetRange", f"{self.gke_proxy_subnet_range!r} is not an IPv4 CIDR of "
                                  f"/{MAX_PROXY_SUBNET_PREFIX} or larger (e.g. 10.129.0.0/23), or empty when the "
                                  "network already has a proxy-only subnet in the region")
        self.one_engine(f"a gke pod is one engine on its node's {self.chips} chip(s): leave it 0, or use machineType "
                        "ct6e-standard-1t for one chip per replica")

    def warnings(self) -> list[str]:
        found = []
        if not self.gke_surge_node and self.gke_min_replicas == 1:
            found.append("gkeSurgeNode: false with gkeMinReplicas 1: every rollout and every node renewal stops the "
                         "only replica before its successor serves (a pod start, 5-10 min, of no service)")
        try:
            registry = Reference.parse(self.serving.image).registry
        except RegistryError:
            registry = DOCKER_HUB  # the image check says what is wrong with it
        if registry not in DOCKER_HUB_HOSTS and not ARTIFACT_REGISTRY_HOST.match(registry):
            found.append(f"containerImage: {registry} is not Artifact Registry or Docker Hub, the registries GKE's "
                         "image streaming reads: each new TPU node pulls the whole image (20-26 GB) before vLLM "
                         "starts; mirror it into Artifact Registry in the node region")
        if "@sha256:" not in self.serving.image:
            found.append(f"containerImage: {self.serving.image!r} is a tag: each new node pulls what it names at that "
                         "moment, so replicas may run different builds, and the compile cache is keyed by the tag "
                         "instead of the build; pin a digest (image@sha256:...)")
        return found + super().warnings()


@dataclass(frozen=True)
class LocalConfig(StackConfig):
    """Target local: the vLLM OpenAI image on a Docker host (`components/local.py`)."""

    COMPONENT: ClassVar[str] = "components.local:LocalVllm"
    BACKEND: ClassVar[str] = "gpu"  # upstream vLLM (the vllm/vllm-openai image)

    local_gpus: str = setting("localGpus", "GPUs for the container, as docker --gpus takes them (all, 2, "
                              "device=0,1); empty for none. A count or device list also sets --tensor-parallel-size; "
                              "all serves on one GPU.", "all")
    local_model_cache: str = setting("localModelCache", "Host Hugging Face cache mounted into the container, so "
                                     "weights download once.", "~/.cache/huggingface")
    local_port: int = setting("localPort", "Port on 127.0.0.1 that publishes vLLM.", DEFAULT_PORT)

    @property
    def chips(self) -> int:
        """The GPUs localGpus names; 1 for all or none."""
        if self.local_gpus.isdigit():
            return int(self.local_gpus)
        if self.local_gpus.startswith("device="):
            return len(self.local_gpus[len("device="):].split(","))
        return 1

    @property
    def local_model_cache_path(self) -> str:
        return os.path.expanduser(self.local_model_cache)

    def check(self) -> None:
        if "vllm-tpu" in self.serving.image:
            raise ConfigError("containerImage", f"{self.serving.image!r} needs a TPU host; target local runs the vLLM "
                              "OpenAI image, e.g. vllm/vllm-openai:v0.32.0")
        if not DOCKER_GPUS.match(self.local_gpus):
            raise ConfigError("localGpus", f"{self.local_gpus!r} is not a docker --gpus value (all, 2, device=0,1) "
                              "or empty")
        if not 1 <= self.local_port <= 65535:
            raise ConfigError("localPort", f"must be a TCP port (1-65535), got {self.local_port}")
        if not os.path.isabs(self.local_model_cache_path):
            raise ConfigError("localModelCache", f"{self.local_model_cache!r} must be an absolute path or start "
                              "with ~")
        self.one_engine(f"the local container is one engine on the {self.chips} GPU(s) localGpus names: leave it 0")


TARGETS: dict[str, type[StackConfig]] = {"gcp": GcpConfig, "local": LocalConfig, "gke": GkeConfig}


def check_zones(key: str, zones: tuple[str, ...], example: str) -> None:
    for zone in zones:
        if not isinstance(zone, str) or not ZONE_FORMAT.match(zone):
            raise ConfigError(key, f"{zone!r} is not a zone name like {example}")
        if zones.count(zone) > 1:
            raise ConfigError(key, f"{zone!r} is listed twice")


def check_secret_id(key: str, secret: str) -> None:
    if secret and not SECRET_ID.match(secret):
        raise ConfigError(key, f"{secret!r} is not a secret id or projects/P/secrets/S")


def parse_duration(key: str, text: str) -> int:
    """'4h' -> 14400, '1d12h' -> 129600; the error names the key."""
    try:
        return durations.parse(text)
    except ValueError as err:
        raise ConfigError(key, str(err)) from None


def field_default(f: dataclasses.Field) -> Any:
    """The field's default value, or dataclasses.MISSING."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def settings(cls: type) -> dict[str, dataclasses.Field]:
    """key -> field of every setting of a config class, inherited ones first."""
    return {f.metadata["key"]: f for f in dataclasses.fields(cls) if "key" in f.metadata}


def all_settings() -> dict[str, dataclasses.Field]:
    return {key: f for cls in (*TARGETS.values(), ServingConfig) for key, f in settings(cls).items()}


def targets_of(key: str) -> list[str]:
    return [target for target, cls in TARGETS.items() if key in settings(cls) | settings(ServingConfig)]


def parse(f: dataclasses.Field, raw: Any) -> Any:
    """A raw value read by the type of its field's default, so a new setting needs no parser of its own."""
    key, default = f.metadata["key"], field_default(f)
    if key == "multimodalLimits":
        return parse_mm_limits(raw)
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise ConfigError(key, f"expected true or false, got {raw!r}")
        return raw.lower() == "true"
    if isinstance(default, (int, float)):
        try:
            value = type(default)(raw)
        except ValueError:
            raise ConfigError(key, f"expected {'an integer' if isinstance(default, int) else 'a number'}, got "
                              f"{raw!r}") from None
        if not math.isfinite(value):  # float() reads 'nan' and 'inf', which no setting means
            raise ConfigError(key, f"expected a finite number, got {raw!r}")
        return value
    if isinstance(default, (tuple, Mapping)):
        kind = list if isinstance(default, tuple) else dict
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(key, f"expected a JSON {kind.__name__}, got {raw!r}") from None
        if not isinstance(value, kind):
            raise ConfigError(key, f"expected a {kind.__name__}, got {value!r}")
        return tuple(value) if kind is list else value
    # Text as given (hfToken may be a secret Output); empty only where that means something.
    if default and EMPTY_MEANS_NONE not in f.metadata["doc"] and not str(raw).strip():
        raise ConfigError(key, f"must not be empty (default: {default})")
    return raw


def build_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Raw config values -> the target's valid config; another target's key only at its default (Pulumi.yaml's)."""
    known = all_settings()
    target = "gcp" if raw.get("target") is None else parse(known["target"], raw["target"])
    if target not in TARGETS:
        raise ConfigError("target", f"{target!r} is not one of {', '.join(TARGETS)}")
    cls = TARGETS[target]
    own, serving = settings(cls), settings(ServingConfig)
    values: dict[str, Any] = {}
    serving_values: dict[str, Any] = {}
    for key, text in raw.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(key, f"unknown setting{f' (did you mean {close[0]}?)' if close else ''}; "
                              "Pulumi.yaml lists every setting with its description")
        if text is None:
            continue
        if key in own or key in serving:
            (values if key in own else serving_values)[known[key].name] = parse(known[key], text)
        elif not holds_default(known[key], text):
            owners = targets_of(key)
            hint = f"; {ELSEWHERE_HINTS[key]}" if key in ELSEWHERE_HINTS else ""
            raise ConfigError(key, f"applies to target{'s' if len(owners) > 1 else ''} {' and '.join(owners)}, not "
                              f"{target}{hint}")
    return cls(**values, serving=ServingConfig(**serving_values)).validate()


def holds_default(f: dataclasses.Field, text: Any) -> bool:
    try:
        return parse(f, text) == field_default(f)
    except ConfigError:
        return False


def load_stack_config() -> StackConfig:
    """Read the `tpu-serve:` namespace of the current stack's config."""
    import pulumi

    config = pulumi.Config(PROJECT_NAME)
    raw: dict[str, Any] = {key: config.get(key) for key in _configured_keys() if key != "hfToken"}
    token = config.get_secret("hfToken")
    if token is not None:
        raw["hfToken"] = token
    cfg = build_stack_config(raw)
    for warning in cfg.warnings():
        pulumi.log.warn(warning)
    return cfg


def _configured_keys() -> list[str]:
    """Keys set under our namespace, typos included; the SDK lists none publicly, so its two sources are read."""
    from pulumi.runtime import config as runtime_config

    prefix = f"{PROJECT_NAME}:"
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    return sorted(key[len(prefix):] for key in keys if key.startswith(prefix))
