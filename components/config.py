"""Typed stack configuration: read once, validated before any resource is declared.

Every setting is a dataclass field whose metadata holds its stack config key and description; `Pulumi.yaml`'s
`config:` block is generated from these fields (`python -m components.config`), so defaults live only here and in
`tpuserve.serving.ServingConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from tpuserve.facts import (DEFAULT_CACHE_DISK_GB, DEFAULT_CACHE_DISK_IOPS, DEFAULT_CACHE_DISK_MIBPS,
                            HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_FREE_MIBPS, HYPERDISK_BALANCED_MAX_IOPS,
                            HYPERDISK_BALANCED_MAX_MIBPS, PRICE_PER_CHIP_HOUR, READY_TIMEOUT_S,
                            V6E_ZONES, hyperdisk_balanced_monthly_usd)
from tpuserve import durations
from tpuserve.names import PROJECT_NAME
from tpuserve.registry import DOCKER_HUB, Reference, RegistryError
from tpuserve.serving import (DEFAULT_PORT, TEXT_ONLY, ConfigError, ServingConfig, auto_tensor_parallel_size,
                              parse_mm_limits, setting, untested_modalities)

# target -> the component that deploys it, as "module:Class": __main__.py imports only the one a stack names (the
# others bring provider SDKs it does not use: pulumi_kubernetes, pulumi_docker).
TARGETS = {"gcp": "components.deployment:TpuServeDeployment", "local": "components.local:LocalVllm",
           "gke": "components.gke_deployment:GkeTpuServe"}
TPU_TARGETS = ("gcp", "gke")  # targets that run vLLM on TPU v6e and share the gcp settings and rules
MIN_BOOT_DISK_GB = 200
# A cache disk must hold one vLLM TPU image, one model's weights and the compile cache with room to spare (the boot
# falls back to a cold start below 20 GB free: components/startup_script.py MIN_FREE_GB).
MIN_CACHE_DISK_GB = 50
# Flex-start's run limits: at least 10 minutes, at most 7 days
# (https://cloud.google.com/compute/docs/instances/flex-start-vms).
MIN_RUN_SECONDS = 10 * 60
MAX_RUN_SECONDS = 7 * 24 * 3600
# TPU v6e supports Hyperdisk Balanced and Hyperdisk ML only (https://cloud.google.com/tpu/docs/storage-options), and
# Hyperdisk ML cannot be a boot disk (https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-ml): one type
# is left for the boot disk.
V6E_BOOT_DISK_TYPES = ("hyperdisk-balanced",)
V6E_MACHINE_TYPE = re.compile(r"^ct6e-standard-(1|4|8)t$")
DOCKER_GPUS = re.compile(r"^(all|[1-9][0-9]*|device=[0-9]+(,[0-9]+)*)?$")
LOCAL_BACKEND = "gpu"  # the local target runs upstream vLLM (the vllm/vllm-openai image)
ZONE_FORMAT = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$")
REGION_FORMAT = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
# GCP project ids: 6-30 lowercase letters, digits or hyphens, starting with a letter, not ending with a hyphen
# (https://cloud.google.com/resource-manager/docs/creating-managing-projects); older ones may carry a domain prefix
# ("example.com:my-project").
PROJECT_ID = re.compile(r"^(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
# A string setting with a non-empty default may be set empty only where its description says what empty means.
EMPTY_MEANS_NONE = "empty for none"
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
GKE_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label
GKE_MAX_NODES = 64  # a bound on cost mistakes, not a GKE limit: 64 ct6e-standard-8t nodes are $691/h at $1.35
# Where GKE offers flex-start TPU v6e node pools: GKE's own list (narrower than Compute Engine's V6E_ZONES), kept as
# data with its source and the date it was read.
GKE_FLEX_START = json.loads(resources.files("tpuserve").joinpath("data/gke-flex-start-tpu.json").read_text())
GKE_FLEX_START_V6E_ZONES: tuple[str, ...] = tuple(GKE_FLEX_START["zones"]["v6e"])
GKE_ROUTERS = ("service", "inference-gateway")
# Where GKE's image streaming reads images: Artifact Registry (standard or remote repositories) or Docker Hub's public
# registry (https://cloud.google.com/kubernetes-engine/docs/how-to/image-streaming, requirements).
ARTIFACT_REGISTRY_HOST = re.compile(r"^[a-z0-9-]+-docker\.pkg\.dev$")
DOCKER_HUB_HOSTS = (DOCKER_HUB, "docker.io", "index.docker.io")  # the names docker normalises to Docker Hub
# A proxy-only subnet for a regional Envoy-based load balancer: /23 recommended, /26 at least
# (https://cloud.google.com/load-balancing/docs/proxy-only-subnets).
MAX_PROXY_SUBNET_PREFIX = 26
NOTIFICATION_CHANNEL = re.compile(r"^projects/[^/]+/notificationChannels/[0-9]+$")
VM_SLOTS = ("a", "b")
REPLACE_ORDERS = ("create-first", "delete-first")
SECRET_ID = re.compile(r"^(projects/[^/]+/secrets/)?[A-Za-z0-9_-]{1,255}$")


def streamed_registry(image: str) -> str:
    """'' when GKE's image streaming can serve `image`, else its registry host."""
    try:
        registry = Reference.parse(image).registry
    except RegistryError:
        return ""  # the image check elsewhere says what is wrong with it
    return "" if registry in DOCKER_HUB_HOSTS or ARTIFACT_REGISTRY_HOST.match(registry) else registry


@dataclass(frozen=True)
class StackConfig:
    """One environment's settings. `hf_token` is the only secret and never leaves Pulumi's secret handling."""

    target: str = setting("target", "Where to serve: gcp (a flex-start TPU VM), gke (a flex-start TPU node pool "
                          "on GKE) or local (a Docker host).", "gcp")
    project: str = setting("project", "GCP project id that owns every resource (target gcp).", "")
    zone: str = setting("zone", "Zone of the TPU VM; `tpuserve up` writes the zone it found capacity in.",
                        V6E_ZONES[0])
    zones: tuple[str, ...] = setting(
        "zones", "Zones `tpuserve up` tries in order, after the stack's current zone; the default is ordered by "
        "where flex-start v6e capacity was found.", V6E_ZONES)
    region: str = setting("region", "Region for Cloud NAT; empty = the zone's region, so NAT follows the zone "
                          "`tpuserve up` picks (if set, it must contain the zone).", "")
    machine_type: str = setting("machineType", "TPU v6e machine type (ct6e-standard-1t = one chip; -4t, -8t: 4 or 8 "
                                "chips, chips / tensorParallelSize vLLM engines behind one port).", "ct6e-standard-1t")
    boot_image: str = setting(
        "bootImage", "Boot image or image family path.",
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    boot_disk_gb: int = setting("bootDiskSizeGb", f"Boot disk size in GB (at least {MIN_BOOT_DISK_GB}).",
                                MIN_BOOT_DISK_GB)
    boot_disk_type: str = setting("bootDiskType", "Boot disk type; a v6e boot disk must be hyperdisk-balanced.",
                                  "hyperdisk-balanced")
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
    compile_cache_bucket: bool = setting(
        "compileCacheBucket", "Also keep the XLA compile cache in a Cloud Storage bucket of the stack, so a new or "
        "lost cache disk still compiles warm.", True)
    keep_caches: bool = setting(
        "keepCaches", "The cache disk and bucket survive `pulumi destroy` (and a zone change) for the next "
        "deployment; false: they are deleted with the stack (`pulumi up` first, then destroy).", True)
    vm_slot: str = setting(
        "vmSlot", "Which of the stack's two VM names (and cache disk slots) the VM uses: a = tpu-serve-<stack>, b = "
        "tpu-serve-<stack>-b. `tpuserve up` switches it when a change replaces the VM in its zone, so the old VM "
        "serves until its successor is ready (a name exists once per zone).", "a")
    replace_order: str = setting(
        "replaceOrder", "When a change replaces the VM: create-first (the old VM serves until the new one is ready; "
        "needs quota for both for a moment) or delete-first. `tpuserve up` picks delete-first for one run when the "
        "region's quota has no room for both.", "create-first")
    max_run_duration: str = setting("maxRunDuration", "Flex-start run limit, e.g. 4h or 1d12h (from 10m to 7d); "
                                    "the VM is deleted when it ends.", "4h")
    hf_token_secret_id: str = setting(
        "hfTokenSecretId", "Existing Secret Manager secret holding the Hugging Face token (id or "
        "projects/P/secrets/S). Alternative to hfToken.", "")
    hf_token: Any = setting("hfToken", "Hugging Face token; the stack stores it in a new Secret Manager secret. "
                            "Set with `pulumi config set --secret hfToken`.", None, repr=False)
    vllm_api_key_secret_id: str = setting(
        "vllmApiKeySecretId", "Secret Manager secret (id or projects/P/secrets/S) holding the API key vLLM requires on "
        "/v1 (clients send it as TPUSERVE_API_KEY); empty for none.", "")
    network: str = setting("network", "VPC network name.", "default")
    subnetwork: str = setting("subnetwork", "Subnetwork name; empty = the network's default for the region.", "")
    external_ip: bool = setting("externalIp", "Give the VM an external IP (then no Cloud NAT is made).", False)
    create_cloud_nat: bool = setting("createCloudNat", "Create a Cloud Router + NAT for egress; turn off when the "
                                     "VPC already has NAT in the region.", True)
    cloud_nat_skip_regions: tuple[str, ...] = setting(
        "cloudNatSkipRegions", "Regions where another stack's Cloud NAT already serves the network, so this stack "
        "makes none there (a network takes one all-subnetworks NAT per region); `tpuserve up` writes it "
        "from the NATs it finds.", ())
    labels: Mapping[str, str] = setting("labels", "Extra labels on every resource that takes labels.", {})
    price_per_chip_hour: float = setting("pricePerChipHour", "USD per chip-hour, for cost outputs.",
                                         PRICE_PER_CHIP_HOUR)
    readiness_timeout: str = setting("readinessTimeout", "How long `pulumi up` waits for the model to answer.",
                                     f"{READY_TIMEOUT_S // 60}m")
    # Monitoring (components/monitoring.py): the dashboard and alert policies of a gcp stack.
    alert_notification_channels: tuple[str, ...] = setting(
        "alertNotificationChannels", "Cloud Monitoring notification channels the alerts notify, as "
        "projects/P/notificationChannels/ID; none by default (alerts then show in the console only).", ())
    alert_down_after: str = setting("alertDownAfter", "Alert when no vLLM metrics have arrived for this long: the "
                                    "server is down or the VM gone (flex-start deletes it at its max run).", "10m")
    alert_ttft_p99_seconds: float = setting("alertTtftP99Seconds", "Alert when the p99 time to first token over 5 "
                                            "minutes stays above this many seconds for 10 minutes.", 5.0)
    alert_queue_depth: int = setting("alertQueueDepth", "Alert when at least this many requests wait and the queue "
                                     "has grown for 10 minutes.", 8)
    local_gpus: str = setting("localGpus", "Target local: GPUs for the container, as docker --gpus takes them "
                              "(all, 2, device=0,1); empty for none. A count or device list also sets "
                              "--tensor-parallel-size; all serves on one GPU.", "all")
    local_model_cache: str = setting("localModelCache", "Target local: host Hugging Face cache mounted into the "
                                     "container, so weights download once.", "~/.cache/huggingface")
    local_port: int = setting("localPort", "Target local: port on 127.0.0.1 that publishes vLLM.", DEFAULT_PORT)
    # Target gke (components/gke.py, components/k8s_serving.py); zone, machineType, maxRunDuration, bootDisk*,
    # network, hfToken* and labels mean the same as for gcp, applied to the TPU node pool and the pods.
    gke_cluster: str = setting("gkeCluster", "Target gke: name of an existing GKE Standard cluster (Workload Identity "
                               "on) to add the TPU node pool to; empty = create a zonal cluster tpu-serve-<stack> in "
                               "the zone (GKE's free tier covers one zonal cluster's fee).", "")
    gke_cluster_location: str = setting("gkeClusterLocation", "Target gke: location (region or zone) of gkeCluster; "
                                        "empty = the zone's region.", "")
    gke_max_nodes: int = setting("gkeMaxNodes", "Target gke: most vLLM replicas (one flex-start TPU node each) the "
                                 "autoscaler scales to; the node pool may add the surge node (gkeSurgeNode).", 2)
    gke_min_replicas: int = setting("gkeMinReplicas", "Target gke: fewest vLLM replicas the autoscaler keeps; 0 parks "
                                    "the deployment so the TPU node pool scales to zero.", 1)
    gke_namespace: str = setting("gkeNamespace", "Target gke: Kubernetes namespace of the deployment.", "tpu-serve")
    gke_zones: tuple[str, ...] = setting(
        "gkeZones", "Target gke: zones of the TPU node pool, all in the zone's region; empty = every zone of that "
        "region where GKE offers flex-start TPU v6e, so a stockout in one zone does not stop scale-up.", ())
    gke_surge_node: bool = setting(
        "gkeSurgeNode", "Target gke: the TPU node pool may grow one node past gkeMaxNodes, so a rollout or a renewal "
        "starts each new pod before the one it replaces stops (maxSurge 1); false = no extra node: a rollout stops a "
        "pod first (maxSurge 0, maxUnavailable 1) and a lone replica is down while its successor boots.", True)
    gke_router: str = setting(
        "gkeRouter", "Target gke: what routes requests to the replicas: service (a ClusterIP Service, round robin) "
        "or inference-gateway (GKE Inference Gateway: an internal Gateway and an InferencePool whose endpoint "
        "picker routes by each replica's queue, KV cache and prefix cache).", GKE_ROUTERS[0])
    gke_proxy_subnet_range: str = setting(
        "gkeProxySubnetRange", "Target gke, gkeRouter inference-gateway: CIDR of the proxy-only subnet the stack "
        "creates for the regional internal load balancer; empty for none (the network already has one in the "
        "region).", "10.129.0.0/23")
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)

    def __post_init__(self) -> None:
        # What is served follows where: the backend from the target, the chips from the machine, and
        # tensorParallelSize 0 (auto) resolved for the target, so no stack leaves a chip unused
        # (tpuserve.serving.vllm_serve_args and the engine layout read all three).
        serving = self.serving
        auto = (auto_tensor_parallel_size(serving.model, self.machine_chips, serving.gpu_memory_utilization)
                if self.target == "gcp" else self.machine_chips)
        object.__setattr__(self, "serving", dataclasses.replace(
            serving, backend="tpu" if self.target in TPU_TARGETS else LOCAL_BACKEND, chips=self.machine_chips,
            tensor_parallel_size=serving.tensor_parallel_size or auto))

    @property
    def machine_chips(self) -> int:
        """Chips of the machine type (gcp, gke) or GPUs named by localGpus (local); 1 when neither says."""
        if self.target in TPU_TARGETS:
            match = V6E_MACHINE_TYPE.match(self.machine_type)
            return int(match.group(1)) if match else 1
        if self.local_gpus.isdigit():
            return int(self.local_gpus)
        if self.local_gpus.startswith("device="):
            return len(self.local_gpus[len("device="):].split(","))
        return 1

    @property
    def effective_region(self) -> str:
        return self.region or self.zone.rsplit("-", 1)[0]

    def makes_nat_in(self, region: str) -> bool:
        """Whether the stack makes a Cloud Router + NAT in `region` when it needs egress there: not when
        createCloudNat is off, nor where another stack's NAT serves the network (tpuserve/deploy/nat.py)."""
        return self.create_cloud_nat and region not in self.cloud_nat_skip_regions

    @property
    def gke_pool_zones(self) -> tuple[str, ...]:
        """The TPU node pool's zones: gkeZones, else GKE's flex-start v6e zones of the zone's region. A zonal
        cluster's pools may also span its region (terraform-provider-google `node_locations`)."""
        if self.gke_zones:
            return tuple(self.gke_zones)
        region = self.zone.rsplit("-", 1)[0]
        return tuple(zone for zone in GKE_FLEX_START_V6E_ZONES if zone.rsplit("-", 1)[0] == region)

    @property
    def gke_pool_max_nodes(self) -> int:
        """Nodes the TPU pool may reach: one per replica the HPA may ask for, plus the surge node."""
        return self.gke_max_nodes + (1 if self.gke_surge_node else 0)

    @property
    def chips(self) -> int:
        return int(V6E_MACHINE_TYPE.match(self.machine_type).group(1))

    @property
    def max_run_seconds(self) -> int:
        return parse_duration("maxRunDuration", self.max_run_duration)

    @property
    def readiness_timeout_seconds(self) -> int:
        return parse_duration("readinessTimeout", self.readiness_timeout)

    @property
    def local_model_cache_path(self) -> str:
        return os.path.expanduser(self.local_model_cache)

    @property
    def cache_disk_monthly_usd(self) -> float:
        """What the cache disk costs per month while it exists, VM or not (reference Hyperdisk Balanced prices)."""
        if not self.cache_disk_gb:
            return 0.0
        return round(hyperdisk_balanced_monthly_usd(self.cache_disk_gb, self.cache_disk_iops,
                                                    self.cache_disk_throughput_mibps), 2)

    @property
    def worst_case_cost_usd(self) -> float:
        """What one full flex-start run costs if nobody destroys the stack earlier."""
        return round(self.max_run_seconds / 3600 * self.chips * self.price_per_chip_hour, 2)

    def validate(self) -> StackConfig:
        if self.target not in TARGETS:
            raise ConfigError("target", f"{self.target!r} is not one of {', '.join(TARGETS)}")
        if self.target in TPU_TARGETS:
            self._validate_gcp()
            self._validate_monitoring()
        else:
            self._validate_local()
        if self.target == "gke":
            self._validate_gke()
        for key, value in self.labels.items():
            if not LABEL_KEY.match(str(key)) or not LABEL_VALUE.match(str(value)):
                raise ConfigError("labels", f"{key}={value!r}: keys and values must be lowercase letters, digits, "
                                  "_ or -, at most 63 chars (keys start with a letter)")
        if self.vllm_api_key_secret_id and self.target != "gcp":
            raise ConfigError("vllmApiKeySecretId", f"applies to target gcp, not {self.target}")
        if self.vllm_api_key_secret_id and not SECRET_ID.match(self.vllm_api_key_secret_id):
            raise ConfigError("vllmApiKeySecretId", f"{self.vllm_api_key_secret_id!r} is not a secret id or "
                              "projects/P/secrets/S")
        for region in self.cloud_nat_skip_regions:
            if not isinstance(region, str) or not REGION_FORMAT.match(region):
                raise ConfigError("cloudNatSkipRegions", f"{region!r} is not a region name like europe-west4 (it is "
                                  "written by `tpuserve up`; pulumi config rm cloudNatSkipRegions to start over)")
        if self.price_per_chip_hour < 0:
            raise ConfigError("pricePerChipHour", f"must not be negative, got {self.price_per_chip_hour}")
        self._validate_engines()
        self.readiness_timeout_seconds  # noqa: B018 - parses, raising ConfigError on a bad value
        self.serving.validate()  # its backend follows the target (__post_init__)
        return self

    def _validate_gcp(self) -> None:
        if not self.project:
            raise ConfigError("project", "is required: pulumi config set project <gcp-project-id>")
        if not PROJECT_ID.match(self.project):
            raise ConfigError("project", f"{self.project!r} is not a GCP project id (6-30 lowercase letters, digits "
                              "or hyphens, starting with a letter, not ending with a hyphen); use the id, not the "
                              "project's name or number")
        if not ZONE_FORMAT.match(self.zone):
            raise ConfigError("zone", f"{self.zone!r} is not a zone name like europe-west4-a")
        self._validate_zones()
        if self.region and self.region != self.zone.rsplit("-", 1)[0]:
            raise ConfigError("region", f"{self.region!r} does not contain zone {self.zone!r}")
        if not V6E_MACHINE_TYPE.match(self.machine_type):
            raise ConfigError("machineType", f"{self.machine_type!r} is not a TPU v6e machine type "
                              "(ct6e-standard-1t, -4t or -8t)")
        if self.vm_slot not in VM_SLOTS:
            raise ConfigError("vmSlot", f"{self.vm_slot!r} is not one of {', '.join(VM_SLOTS)}")
        if self.replace_order not in REPLACE_ORDERS:
            raise ConfigError("replaceOrder", f"{self.replace_order!r} is not one of {', '.join(REPLACE_ORDERS)}")
        if self.boot_disk_gb < MIN_BOOT_DISK_GB:
            raise ConfigError("bootDiskSizeGb", f"must be at least {MIN_BOOT_DISK_GB}, got {self.boot_disk_gb}")
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
        if self.boot_disk_type not in V6E_BOOT_DISK_TYPES:
            raise ConfigError("bootDiskType", f"{self.boot_disk_type!r}: a TPU v6e boot disk must be "
                              f"{' or '.join(V6E_BOOT_DISK_TYPES)} (v6e takes only Hyperdisk Balanced and Hyperdisk "
                              "ML, and Hyperdisk ML cannot boot)")
        if not MIN_RUN_SECONDS <= self.max_run_seconds <= MAX_RUN_SECONDS:
            raise ConfigError("maxRunDuration", f"{self.max_run_duration!r} is outside flex-start's limits: from 10m "
                              "to 7d")
        if bool(self.hf_token_secret_id) == (self.hf_token is not None):
            raise ConfigError("hfTokenSecretId", "set exactly one of hfTokenSecretId (an existing secret) or "
                              "hfToken (pulumi config set --secret hfToken ...)")
        if self.hf_token_secret_id and not SECRET_ID.match(self.hf_token_secret_id):
            raise ConfigError("hfTokenSecretId", f"{self.hf_token_secret_id!r} is not a secret id or "
                              "projects/P/secrets/S")

    def _validate_engines(self) -> None:
        """More than one engine runs only on a gcp VM, whose supervisor starts one container per engine behind the
        front; a gke pod and the local container are one engine each."""
        if self.serving.engines == 1 or self.target == "gcp":
            return
        where = (f"a gke pod is one engine on its node's {self.machine_chips} chip(s): leave it 0, or use machineType "
                 "ct6e-standard-1t for one chip per replica" if self.target == "gke"
                 else f"the local container is one engine on the {self.machine_chips} GPU(s) localGpus names: leave "
                 "it 0")
        raise ConfigError("tensorParallelSize", f"{self.serving.tensor_parallel_size} would split the chips into "
                          f"{self.serving.engines} engines; {where}")

    def _validate_gke(self) -> None:
        if self.gke_cluster and not GKE_CLUSTER_NAME.match(self.gke_cluster):
            raise ConfigError("gkeCluster", f"{self.gke_cluster!r} is not a GKE cluster name (lowercase letters, "
                              "digits and -, at most 40 characters, starting with a letter)")
        region = self.zone.rsplit("-", 1)[0]
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
        self._validate_gke_zones()
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

    def _validate_gke_zones(self) -> None:
        offered = ", ".join(GKE_FLEX_START_V6E_ZONES)
        where = f"GKE offers flex-start TPU v6e only in {offered} ({GKE_FLEX_START['source'].split()[0]})"
        if self.zone not in GKE_FLEX_START_V6E_ZONES:
            raise ConfigError("zone", f"{self.zone!r}: {where}; pulumi config set zone {GKE_FLEX_START_V6E_ZONES[-1]}")
        region = self.zone.rsplit("-", 1)[0]
        for zone in self.gke_zones:
            if not isinstance(zone, str) or not ZONE_FORMAT.match(zone):
                raise ConfigError("gkeZones", f"{zone!r} is not a zone name like us-east5-a")
            if self.gke_zones.count(zone) > 1:
                raise ConfigError("gkeZones", f"{zone!r} is listed twice")
            if zone not in GKE_FLEX_START_V6E_ZONES:
                raise ConfigError("gkeZones", f"{zone!r}: {where}")
            if zone.rsplit("-", 1)[0] != region:
                raise ConfigError("gkeZones", f"{zone!r} is not in {region}, the region of zone {self.zone!r} and "
                                  "of the cluster; a node pool spans one region")

    def _validate_zones(self) -> None:
        if not self.zones:
            raise ConfigError("zones", "must list at least one zone (or leave it unset for the default order)")
        for zone in self.zones:
            if not isinstance(zone, str) or not ZONE_FORMAT.match(zone):
                raise ConfigError("zones", f"{zone!r} is not a zone name like europe-west4-a")
            if self.zones.count(zone) > 1:
                raise ConfigError("zones", f"{zone!r} is listed twice")

    def warnings(self) -> list[str]:
        """Advice that does not stop a deploy. Which zones offer v6e is Compute Engine's to say (`tpuserve
        preflight` asks it); the built-in list only flags a likely typo, offline."""
        if self.target not in TPU_TARGETS:
            return []
        warnings = self._gke_warnings() if self.target == "gke" else []
        unknown = [zone for zone in dict.fromkeys((self.zone, *self.zones)) if zone not in V6E_ZONES]
        if unknown and self.target != "gke":
            warnings.append(f"zone/zones: {', '.join(unknown)} not among the zones known to offer TPU v6e "
                            f"({', '.join(V6E_ZONES)}); `tpuserve preflight` checks them live")
        untested = untested_modalities(self.serving)
        if untested:
            warnings.append(f"multimodalLimits: {', '.join(untested)} on modelImpl {self.serving.model_impl} runs "
                            "vLLM's own Gemma 4 code through torchax, which tpu-inference does not test "
                            "(tpuserve/data/tpu-inference-support.json); send one such request before relying on it")
        return warnings

    def _gke_warnings(self) -> list[str]:
        found = []
        if not self.gke_surge_node and self.gke_min_replicas == 1:
            found.append("gkeSurgeNode: false with gkeMinReplicas 1: every rollout and every node renewal stops the "
                         "only replica before its successor serves (a pod start, 5-10 min, of no service)")
        registry = streamed_registry(self.serving.image)
        if registry:
            found.append(f"containerImage: {registry} is not Artifact Registry or Docker Hub, the registries GKE's "
                         "image streaming reads: each new TPU node pulls the whole image (20-26 GB) before vLLM "
                         "starts; mirror it into Artifact Registry in the node region")
        if "@sha256:" not in self.serving.image:
            found.append(f"containerImage: {self.serving.image!r} is a tag: each new node pulls what it names at that "
                         "moment, so replicas may run different builds, and the compile cache is keyed by the tag "
                         "instead of the build; pin a digest (image@sha256:...)")
        return found

    @property
    def alert_down_after_seconds(self) -> int:
        return parse_duration("alertDownAfter", self.alert_down_after)

    def _validate_monitoring(self) -> None:
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

    def _validate_local(self) -> None:
        if self.hf_token_secret_id:
            raise ConfigError("hfTokenSecretId", "target local cannot read Secret Manager; set hfToken (pulumi "
                              "config set --secret hfToken ...) or nothing for a public model")
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


def parse_duration(key: str, text: str) -> int:
    """'4h' -> 14400, '1d12h' -> 129600; the error names the key."""
    try:
        return durations.parse(text)
    except ValueError as err:
        raise ConfigError(key, str(err)) from None


def _parse_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(key, f"expected an integer, got {raw!r}") from None


def _parse_float(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(key, f"expected a number, got {raw!r}") from None
    if not math.isfinite(value):  # float() reads 'nan' and 'inf', which no setting means
        raise ConfigError(key, f"expected a finite number, got {raw!r}")
    return value


def _parse_text(f: dataclasses.Field) -> Callable[[str, str], str]:
    """A string setting as given; empty only where its default is empty or its description says what empty means
    (an empty containerImage or zone would reach the VM broken)."""
    default = field_default(f)
    empty_ok = not default or EMPTY_MEANS_NONE in f.metadata["doc"]

    def parse(key: str, raw: str) -> str:
        if not empty_ok and not str(raw).strip():
            raise ConfigError(key, f"must not be empty (default: {default})")
        return raw
    return parse


def _parse_bool(key: str, raw: str) -> bool:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ConfigError(key, f"expected true or false, got {raw!r}")


def _parse_json(expected: type) -> Callable[[str, str], Any]:
    def parse(key: str, raw: str) -> Any:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(key, f"expected a JSON {expected.__name__}, got {raw!r}") from None
        if not isinstance(value, expected):
            raise ConfigError(key, f"expected a {expected.__name__}, got {value!r}")
        return tuple(value) if expected is list else value
    return parse


def field_default(f: dataclasses.Field) -> Any:
    """The field's default value, or dataclasses.MISSING for a required setting."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _parser_for(f: dataclasses.Field) -> Callable[[str, str], Any]:
    """Pick the parser from the field's default, so adding a setting needs no parser table."""
    if f.metadata["key"] == "multimodalLimits":
        return lambda key, raw: parse_mm_limits(raw)
    default = field_default(f)
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return _parse_int
    if isinstance(default, float):
        return _parse_float
    if isinstance(default, tuple):
        return _parse_json(list)
    if isinstance(default, Mapping):
        return _parse_json(dict)
    return _parse_text(f)


def _settings(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "key" in f.metadata]


def all_settings() -> list[dataclasses.Field]:
    return _settings(StackConfig) + _settings(ServingConfig)


def build_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Turn raw config values (strings as Pulumi returns them; the token may be an Output) into a valid StackConfig."""
    known = {f.metadata["key"] for f in all_settings()}
    unknown = sorted(set(raw) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise ConfigError(unknown[0], f"unknown setting{f' (did you mean {close[0]}?)' if close else ''}; "
                          "Pulumi.yaml lists every setting with its description")

    def values(cls: type) -> dict[str, Any]:
        out = {}
        for f in _settings(cls):
            value = raw.get(f.metadata["key"])
            if value is None:
                continue
            # hfToken (default None) is read as text, which hands it on unchanged: it may be a secret Output.
            out[f.name] = _parser_for(f)(f.metadata["key"], value)
        return out

    return StackConfig(**values(StackConfig), serving=ServingConfig(**values(ServingConfig))).validate()


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
    """Keys set under our namespace, unknown ones included, so a typo is an error instead of a silent default.
    The SDK exposes no public listing; these are the two places it reads config from."""
    from pulumi.runtime import config as runtime_config

    prefix = f"{PROJECT_NAME}:"
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    return sorted(key[len(prefix):] for key in keys if key.startswith(prefix))


def pulumi_yaml_config() -> dict[str, dict[str, Any]]:
    """The `config:` block of Pulumi.yaml, derived from the settings (Pulumi's schema knows only
    string/integer/boolean/array: decimals are declared as strings, objects are documented but not typed)."""
    block: dict[str, dict[str, Any]] = {}
    for f in all_settings():
        key, doc = f.metadata["key"], f.metadata["doc"]
        default = field_default(f)
        if key in ("labels", "hfToken"):
            continue  # an object, and an optional secret: the schema can declare neither (see PULUMI_YAML_HEAD)
        entry: dict[str, Any]
        if key == "multimodalLimits":
            entry = {"type": "string", "default": TEXT_ONLY}
        elif isinstance(default, bool):
            entry = {"type": "boolean", "default": default}
        elif isinstance(default, int):
            entry = {"type": "integer", "default": default}
        elif isinstance(default, float):
            entry = {"type": "string", "default": str(default)}
        elif isinstance(default, tuple):
            entry = {"type": "array", "items": {"type": "string"}, "default": list(default)}
        else:
            entry = {"type": "string"} | ({} if default is dataclasses.MISSING else {"default": default})
        block[key] = {**entry, "description": doc}
    return block


PULUMI_YAML_HEAD = f"""\
# Generated by `python -m components.config > Pulumi.yaml` from components/config.py and tpuserve/serving.py;
# edit those, not this file (tests/test_config.py fails when it is stale).
# Also read, but not declarable in Pulumi's schema: `hfToken` (an optional secret: pulumi config set --secret
# hfToken hf_...) and `labels` (an object: pulumi config set --path 'labels.team' ml-platform).
name: {PROJECT_NAME}
description: vLLM on a flex-start Cloud TPU v6e VM, gated on the model really answering.
runtime:
  name: python
  options:
    toolchain: pip
    virtualenv: .venv
"""


def render_pulumi_yaml() -> str:
    import yaml

    class IndentedLists(yaml.SafeDumper):
        """Indents a list under its key (the `zones` default), as yamllint expects."""

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            return super().increase_indent(flow, False)

    return PULUMI_YAML_HEAD + yaml.dump({"config": pulumi_yaml_config()}, Dumper=IndentedLists, sort_keys=False,
                                        width=120)


# What a change of each key does to a running deployment: the last column of the configuration reference
# (docs/configuration.md). Derived, never written by hand: tests/config_changes.py runs each target's stack under mocks
# with its defaults and with the key changed, classifies every resource's change by the providers' own rules
# (tests/changes.py over tpuserve/data/provider-facts.json) and writes the words to
# tpuserve/data/config-changes.json; tests/test_config_changes.py fails when that file is stale.
CHANGE_EFFECTS_FILE = "config-changes.json"


class _ChangeEffects(Mapping[str, str]):
    """key -> effect, read from the data file on first use (a stack's program never needs it)."""

    @functools.cached_property
    def _effects(self) -> dict[str, str]:
        from importlib import resources

        path = resources.files("tpuserve").joinpath(f"data/{CHANGE_EFFECTS_FILE}")
        if not path.is_file():
            return {}
        return {key: entry["effect"] for key, entry in json.loads(path.read_text())["keys"].items()}

    def __getitem__(self, key: str) -> str:
        return self._effects[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._effects)

    def __len__(self) -> int:
        return len(self._effects)


CHANGE_EFFECTS: Mapping[str, str] = _ChangeEffects()

CONFIG_PAGE = "docs/configuration.md"
DOCS_BEGIN = ("<!-- BEGIN generated by `python -m components.config --docs` from components/config.py and "
              "tpuserve/serving.py: edit those, not this block -->")
DOCS_END = "<!-- END generated -->"
# The reference's sections, by key prefix (first match wins); the serving keys are ServingConfig's fields.
DOCS_SECTIONS = (("Stack and VM", "Every target that runs on GCP; gke stacks read them too.", ""),
                 ("Monitoring", "The dashboard and alert policies of a gcp stack.", "alert"),
                 ("Target local", "A Docker host (`components/local.py`).", "local"),
                 ("Target gke", "A flex-start TPU node pool on GKE (`components/gke.py`).", "gke"))
SERVING_SECTION = ("Serving", "What vLLM serves and how: the same `vllm serve` argv on every target "
                   "(`tpuserve/serving.py`).")


def _docs_default(f: dataclasses.Field) -> str:
    """A setting's default as the reference shows it (Pulumi.yaml's spelling: true/false, JSON lists)."""
    default = field_default(f)
    if f.metadata["key"] == "multimodalLimits":
        default = TEXT_ONLY
    if default is dataclasses.MISSING or default is None:
        return "—"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, (tuple, Mapping)) and not default:
        return "`[]`" if isinstance(default, tuple) else "`{}`"
    if isinstance(default, tuple):
        return ", ".join(f"`{item}`" for item in default)
    if default == "":
        return "empty"
    return f"`{default}`"


def _docs_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _docs_table(fields: list[dataclasses.Field]) -> list[str]:
    rows = ["| key | default | what it is | a change |", "| --- | --- | --- | --- |"]
    for f in fields:
        key = f.metadata["key"]
        # The span gives every key an anchor of its own: configuration.md#keepCaches.
        rows.append(f'| <span id="{key}"></span>`{key}` | {_docs_default(f)} | {_docs_cell(f.metadata["doc"])} | '
                    f"{_docs_cell(CHANGE_EFFECTS[key])} |")
    return rows


def render_config_reference() -> str:
    """The generated block of docs/configuration.md: one table per section, every setting once, in declaration
    order, with the same key, default and description as Pulumi.yaml, and what a change does (CHANGE_EFFECTS)."""
    missing = [f.metadata["key"] for f in all_settings() if f.metadata["key"] not in CHANGE_EFFECTS]
    if missing:
        raise KeyError(f"CHANGE_EFFECTS has no entry for {', '.join(missing)}")
    sections: dict[str, list[dataclasses.Field]] = {title: [] for title, _, _ in DOCS_SECTIONS}
    for f in _settings(StackConfig):
        title = next(title for title, _, prefix in reversed(DOCS_SECTIONS) if f.metadata["key"].startswith(prefix))
        sections[title].append(f)
    blurbs = {title: blurb for title, blurb, _ in DOCS_SECTIONS}
    order = [DOCS_SECTIONS[0][0], SERVING_SECTION[0], *[title for title, _, _ in DOCS_SECTIONS[1:]]]
    sections[SERVING_SECTION[0]] = _settings(ServingConfig)
    blurbs[SERVING_SECTION[0]] = SERVING_SECTION[1]
    lines = [DOCS_BEGIN]
    for title in order:
        lines += ["", f"## {title}", "", blurbs[title], "", *_docs_table(sections[title])]
    return "\n".join([*lines, "", DOCS_END])


def update_config_page(page: str) -> str:
    """The page with its generated block replaced by the current one (the prose around it is kept)."""
    head, begin, rest = page.partition(DOCS_BEGIN)
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"{CONFIG_PAGE} lacks the generated block's markers ({DOCS_BEGIN!r} ... {DOCS_END!r})")
    return head + render_config_reference() + tail


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if sys.argv[1:] == ["--docs"]:
        page = Path(__file__).resolve().parent.parent / CONFIG_PAGE
        page.write_text(update_config_page(page.read_text()))
    elif sys.argv[1:]:
        sys.exit("usage: python -m components.config [--docs]   (Pulumi.yaml to stdout, or rewrite " + CONFIG_PAGE + ")")
    else:
        print(render_pulumi_yaml(), end="")
