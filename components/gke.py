"""The gke target's cluster side: a zonal GKE Standard cluster (new, or an existing one named in config), a
flex-start TPU v6e node pool that scales from zero, the nodes' own least-privilege service account, and the Workload
Identity binding that lets the serving pods act as their Google service account.

A new cluster is zonal, in the stack's zone: GKE's free tier covers one zonal cluster's fee, never a regional one's
(https://cloud.google.com/kubernetes-engine/pricing#cluster_management_fee_and_free_tier). Its pools may still use
the region's other zones (terraform-provider-google container_node_pool.html.markdown, `node_locations`).

Flex-start node pool, following Google's "Run a small batch workload with TPUs and flex-start provisioning mode"
(https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training-tpu: `--flex-start
--reservation-affinity=none --enable-autoscaling --num-nodes 0 --min-nodes=0`) and the Cluster Toolkit's flex-start
consumption option (GoogleCloudPlatform/cluster-toolkit blueprints: `enable_flex_start: true`, `auto_repair: false`,
`reservation_affinity: NO_RESERVATION`). Field names are pulumi-gcp 10.2's (`container.NodePoolNodeConfigArgs.
flex_start`, `max_run_duration` as "<seconds>s", `reservation_affinity.consume_reservation_type`,
`NodePoolManagementArgs.auto_repair`, `NodePoolNetworkConfigArgs.enable_private_nodes`). Flex-start TPUs on GKE need
GKE 1.33.0-gke.1712000 or later (https://cloud.google.com/kubernetes-engine/docs/concepts/dws).

The TPU pool spans every zone of the region where GKE offers flex-start v6e (`node_locations`; the zones are data,
tpuserve/data/gke-flex-start-tpu.json), with total (not per-zone) autoscaling limits and `location_policy: ANY`, so
the autoscaler takes a node wherever there is capacity; changing the zones updates the pool in place
(terraform-provider-google `resource_container_node_pool.go`: `node_locations` is not ForceNew). Its maximum is
`pool_max_nodes`: the HPA's maximum plus, with gkeSurgeNode, one node for the pod a rollout or renewal starts
before the one it replaces stops.

The TPU pool streams the 20-26 GB image instead of pulling it first (image streaming: `gcfs_config` on COS with
containerd; why not secondary boot disks: docs/gke.md).

Warm pods need the Cloud Storage FUSE CSI driver (the compile cache and the weights live in a bucket), and the
inference-gateway router needs GKE's Gateway API (CHANNEL_STANDARD) and a proxy-only subnet for the regional internal
load balancer (https://cloud.google.com/kubernetes-engine/docs/how-to/deploy-gke-inference-gateway). A new cluster
gets both; an existing one is checked and refused with the command that enables what it lacks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_gcp import compute, container, projects, serviceaccount

from tpuserve.names import router_description

# Single-host TPU v6e slices: chips per node -> the topology GKE labels the node with
# (cloud.google.com/gke-tpu-topology; https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
V6E_TOPOLOGY = {1: "1x1", 4: "2x2", 8: "2x4"}
V6E_ACCELERATOR = "tpu-v6e-slice"  # cloud.google.com/gke-tpu-accelerator
GKE_MIN_VERSION = "1.33"  # flex-start TPU node pools need 1.33.0-gke.1712000+; REGULAR picks the patch
RELEASE_CHANNEL = "REGULAR"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# GKE's least-privilege role for a node service account (logs, metrics, resource metadata): nodes never run as the
# default compute service account, which holds Editor in most projects. Image streaming asks a custom node account
# for Service Usage Consumer in the project that hosts the image (the image-streaming page's requirements): this
# one, for an image mirrored into its Artifact Registry.
NODE_ROLES = ("roles/container.defaultNodeServiceAccount", "roles/serviceusage.serviceUsageConsumer")
WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
# The cluster's non-TPU workloads (kube-dns, Managed Prometheus collectors, the custom metrics adapter, the renewal
# CronJob) need a node that is not tainted for TPUs; one small VM in the stack's zone.
SYSTEM_MACHINE_TYPE = "e2-standard-4"
# With the inference gateway it also runs the endpoint picker, whose chart asks for 8 CPUs
# (components/inference_gateway.py EPP_RESOURCES): more than an 8-vCPU node can give one pod, since GKE keeps part of
# every node for itself ("Node allocatable resources", https://cloud.google.com/kubernetes-engine/docs/concepts/
# plan-node-sizes), so the next E2 size.
GATEWAY_SYSTEM_MACHINE_TYPE = "e2-standard-16"
# Image streaming: Container-Optimized OS with containerd, the image type it needs (and GKE's default for TPU pools).
STREAMING_IMAGE_TYPE = "COS_CONTAINERD"
SYSTEM_DISK_GB = 50
# Creating an empty flex-start pool is quick; capacity is waited for when a pod needs a node, not here.
NODE_POOL_TIMEOUT = "30m"
CLUSTER_TIMEOUT = "45m"


def workload_pool(project: str) -> str:
    return f"{project}.svc.id.goog"


def kubeconfig(name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig for pulumi-kubernetes: the cluster's public endpoint and CA, credentials from
    gke-gcloud-auth-plugin (the user's gcloud login or CI's workload identity; nothing secret is stored)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": f"https://{endpoint}",
                                                "certificate-authority-data": ca_certificate}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gke-gcloud-auth-plugin",
            "provideClusterInfo": True,
            "installHint": "gcloud components install gke-gcloud-auth-plugin (or apt-get install "
                           "google-cloud-cli-gke-gcloud-auth-plugin)"}}}],
    }, separators=(",", ":"))


def node_pool_name(base: str) -> str:
    """`<base>-tpu`, within GKE's 40-character node pool names; unique per stack on a shared cluster."""
    return f"{base[:36].rstrip('-')}-tpu"


GATEWAY_API_CHANNEL = "CHANNEL_STANDARD"
PROXY_SUBNET_PURPOSE = "REGIONAL_MANAGED_PROXY"  # the proxy-only subnet of regional Envoy-based load balancers


def _first(items: Any) -> Any:
    return items[0] if items else None


def check_existing_cluster(cluster: Any, project: str, location: str, gateway: bool) -> str:
    """An existing cluster must have Workload Identity (the pods read the token secret and the cache bucket as
    their own account), the Cloud Storage FUSE CSI driver (the caches' volumes) and, for the inference-gateway
    router, the Gateway API. Returns its name."""
    name = cluster.name
    update = f"gcloud container clusters update {name} --location {location}"
    identity = _first(cluster.workload_identity_configs)
    pool = identity.workload_pool if identity else None
    if pool != workload_pool(project):
        raise pulumi.RunError(f"gkeCluster: cluster {name!r} has no Workload Identity pool {workload_pool(project)!r} "
                              f"(found {pool!r}); enable it: {update} --workload-pool={workload_pool(project)}")
    addons = _first(cluster.addons_configs)
    fuse = _first(addons.gcs_fuse_csi_driver_configs) if addons else None
    if not (fuse and fuse.enabled):
        raise pulumi.RunError(f"gkeCluster: cluster {name!r} has no Cloud Storage FUSE CSI driver, which mounts the "
                              f"pods' compile cache and weights; enable it: {update} "
                              "--update-addons GcsFuseCsiDriver=ENABLED")
    channel = getattr(_first(cluster.gateway_api_configs), "channel", None)
    if gateway and channel != GATEWAY_API_CHANNEL:
        raise pulumi.RunError(f"gkeRouter: inference-gateway needs the Gateway API on cluster {name!r} (found "
                              f"{channel or 'none'}); enable it: {update} --gateway-api=standard, or set gkeRouter "
                              "service")
    return name


@dataclass(frozen=True)
class GkeTpuClusterArgs:
    project: str
    zone: str  # the system pool's zone; the TPU pool spans `zones`
    region: str
    zones: tuple[str, ...]
    machine_type: str
    chips: int
    max_nodes: int  # the TPU pool's maximum: the HPA's plus the surge node
    max_run_seconds: int
    boot_disk_gb: int
    boot_disk_type: str
    network: str
    subnetwork: str
    create_nat: bool
    # The Kubernetes service account (namespace, name) the serving pods run as, and the Google service account
    # (email) it acts as through Workload Identity.
    workload_ksa: tuple[str, str]
    workload_gsa_email: pulumi.Input[str]
    existing_cluster: str = ""  # empty: create a zonal cluster in `zone`
    existing_location: str = ""
    gateway: bool = False  # the inference-gateway router: Gateway API on, a proxy-only subnet
    proxy_subnet_range: str = ""  # empty: the network already has a proxy-only subnet in the region
    labels: Mapping[str, str] = field(default_factory=dict)


class GkeTpuCluster(pulumi.ComponentResource):
    """Cluster (created or looked up), the flex-start TPU v6e node pool and its identity. `kubeconfig` reaches the
    cluster; `node_pool` is the pool the serving pods land on."""

    cluster_name: pulumi.Output[str]
    location: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, args: GkeTpuClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gke:GkeTpuCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        node_account = serviceaccount.Account(
            f"{name}-nodes", project=args.project, account_id=f"{name[:24].rstrip('-')}-node",
            display_name="tpu-serve GKE nodes", description="Runs the tpu-serve GKE nodes; logs and metrics only.",
            opts=child)
        node_member = node_account.email.apply(lambda email: f"serviceAccount:{email}")
        node_grants = [projects.IAMMember(f"{name}-nodes-{role.split('.')[-1]}", project=args.project, role=role,
                                          member=node_member, opts=child) for role in NODE_ROLES]
        node_identity = dict(service_account=node_account.email, oauth_scopes=[CLOUD_PLATFORM_SCOPE])
        gke_metadata = dict(mode="GKE_METADATA")  # pods see their Workload Identity, never the node's account

        if args.existing_cluster:
            location = args.existing_location or args.region
            found = container.get_cluster_output(name=args.existing_cluster, location=location,
                                                 project=args.project, opts=pulumi.InvokeOutputOptions(parent=self))
            endpoint = found.endpoint
            ca_certificate = found.master_auths.apply(lambda auths: auths[0].cluster_ca_certificate)
            self.cluster_name = found.apply(lambda c: check_existing_cluster(c, args.project, location,
                                                                              args.gateway))
            self.location = pulumi.Output.from_input(location)
            cluster_ready: list[pulumi.Resource] = []
        else:
            if args.create_nat:  # private nodes reach Docker Hub and Hugging Face through Cloud NAT
                router = compute.Router(f"{name}-router", project=args.project, region=args.region,
                                        network=args.network, description=router_description(pulumi.get_stack()),
                                        opts=child)
                compute.RouterNat(
                    f"{name}-nat", project=args.project, region=args.region, router=router.name,
                    nat_ip_allocate_option="AUTO_ONLY",
                    source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                    log_config=compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"), opts=child)
            cluster = container.Cluster(
                name, name=name, project=args.project, location=args.zone, network=args.network, subnetwork=args.subnetwork or None,
                # The default pool is removed at once; while it exists it runs as the nodes' own account too.
                remove_default_node_pool=True, initial_node_count=1,
                node_config=container.ClusterNodeConfigArgs(
                    **node_identity, workload_metadata_config=container.ClusterNodeConfigWorkloadMetadataConfigArgs(
                        **gke_metadata), resource_labels=dict(args.labels)),
                networking_mode="VPC_NATIVE", ip_allocation_policy=container.ClusterIpAllocationPolicyArgs(),
                private_cluster_config=container.ClusterPrivateClusterConfigArgs(
                    enable_private_nodes=True, enable_private_endpoint=False),
                workload_identity_config=container.ClusterWorkloadIdentityConfigArgs(
                    workload_pool=workload_pool(args.project)),
                release_channel=container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
                min_master_version=GKE_MIN_VERSION,
                monitoring_config=container.ClusterMonitoringConfigArgs(
                    enable_components=["SYSTEM_COMPONENTS"],
                    managed_prometheus=container.ClusterMonitoringConfigManagedPrometheusArgs(enabled=True)),
                addons_config=container.ClusterAddonsConfigArgs(
                    gcs_fuse_csi_driver_config=container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(enabled=True)),
                gateway_api_config=container.ClusterGatewayApiConfigArgs(channel=GATEWAY_API_CHANNEL)
                if args.gateway else None,
                resource_labels=dict(args.labels), deletion_protection=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=node_grants,
                                            custom_timeouts=pulumi.CustomTimeouts(create=CLUSTER_TIMEOUT)))
            container.NodePool(
                f"{name}-system", name="system", project=args.project, cluster=cluster.name, location=args.zone,
                node_locations=[args.zone], node_count=1,
                node_config=container.NodePoolNodeConfigArgs(
                    machine_type=GATEWAY_SYSTEM_MACHINE_TYPE if args.gateway else SYSTEM_MACHINE_TYPE,
                    disk_size_gb=SYSTEM_DISK_GB, **node_identity,
                    workload_metadata_config=container.NodePoolNodeConfigWorkloadMetadataConfigArgs(**gke_metadata),
                    resource_labels=dict(args.labels)),
                management=container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
                network_config=container.NodePoolNetworkConfigArgs(enable_private_nodes=True), opts=child)
            endpoint = cluster.endpoint
            ca_certificate = cluster.master_auth.apply(lambda auth: auth.cluster_ca_certificate)
            self.cluster_name, self.location = cluster.name, cluster.location
            cluster_ready = [cluster]

        topology = V6E_TOPOLOGY[args.chips]
        pool_name = node_pool_name(name)
        self.node_pool = container.NodePool(
            f"{name}-tpu", name=pool_name, project=args.project, cluster=self.cluster_name,
            location=self.location, node_locations=list(args.zones), initial_node_count=0,
            # Total limits over all zones (per-zone min/max would multiply by the zones); ANY: the autoscaler
            # takes a node in whichever zone has capacity (flex-start supports no other policy).
            autoscaling=container.NodePoolAutoscalingArgs(total_min_node_count=0, total_max_node_count=args.max_nodes,
                                                          location_policy="ANY"),
            # Flex-start nodes are deleted at their max run duration and do not work with auto-repair; release
            # channels keep auto-upgrade on.
            management=container.NodePoolManagementArgs(auto_repair=False, auto_upgrade=True),
            network_config=container.NodePoolNetworkConfigArgs(enable_private_nodes=True),
            node_config=container.NodePoolNodeConfigArgs(
                machine_type=args.machine_type, flex_start=True, max_run_duration=f"{args.max_run_seconds}s",
                reservation_affinity=container.NodePoolNodeConfigReservationAffinityArgs(
                    consume_reservation_type="NO_RESERVATION"),
                disk_size_gb=args.boot_disk_gb, disk_type=args.boot_disk_type, **node_identity,
                image_type=STREAMING_IMAGE_TYPE, gcfs_config=container.NodePoolNodeConfigGcfsConfigArgs(enabled=True),
                workload_metadata_config=container.NodePoolNodeConfigWorkloadMetadataConfigArgs(**gke_metadata),
                resource_labels=dict(args.labels)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster_ready + node_grants,
                                        custom_timeouts=pulumi.CustomTimeouts(create=NODE_POOL_TIMEOUT)))

        # The regional internal Application Load Balancer behind the inference gateway runs its proxies in the
        # region's proxy-only subnet; one per network and region (so an existing one is used as it is).
        self.proxy_subnet: list[pulumi.Resource] = []
        if args.gateway and args.proxy_subnet_range:
            self.proxy_subnet.append(compute.Subnetwork(
                f"{name}-proxy-only", name=f"{name[:50]}-proxy-only", project=args.project, region=args.region,
                network=args.network, ip_cidr_range=args.proxy_subnet_range, purpose=PROXY_SUBNET_PURPOSE,
                role="ACTIVE", opts=child))

        namespace, ksa = args.workload_ksa
        serviceaccount.IAMMember(
            f"{name}-workload-identity", role=WORKLOAD_IDENTITY_USER,
            service_account_id=pulumi.Output.concat("projects/", args.project, "/serviceAccounts/",
                                                    args.workload_gsa_email),
            member=f"serviceAccount:{workload_pool(args.project)}[{namespace}/{ksa}]",
            # The identity pool exists once the cluster does.
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster_ready))

        # What the serving pods select: a flex-start v6e node of the right shape, and of this stack's own pool (so
        # two stacks sharing a cluster never take each other's nodes).
        self.node_labels = {"cloud.google.com/gke-tpu-accelerator": V6E_ACCELERATOR,
                            "cloud.google.com/gke-tpu-topology": topology,
                            "cloud.google.com/gke-flex-start": "true",
                            "cloud.google.com/gke-nodepool": pool_name}
        self.kubeconfig = pulumi.Output.all(self.cluster_name, endpoint, ca_certificate).apply(
            lambda values: kubeconfig(*values))
        self.register_outputs({"clusterName": self.cluster_name, "location": self.location,
                               "nodePool": self.node_pool.name})
