"""The gke target's cluster side: a zonal GKE Standard cluster (or an existing one, checked), a flex-start TPU v6e node
pool that scales from zero over the region's flex-start zones, the nodes' own service account and the pods' Workload
Identity binding. What each setting does and costs: docs/gke.md; the sources: docs/design/pulumi-program.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi_gcp import compute, container, projects, serviceaccount

from components.config import GkeConfig
from components.network import cloud_nat
from tpuserve.gce import CLOUD_PLATFORM_SCOPE
from tpuserve.gke_renewer import POOL_LABEL

# Single-host TPU v6e slices: chips per node -> the node's cloud.google.com/gke-tpu-topology label.
V6E_TOPOLOGY = {1: "1x1", 4: "2x2", 8: "2x4"}
V6E_ACCELERATOR = "tpu-v6e-slice"  # cloud.google.com/gke-tpu-accelerator
GKE_MIN_VERSION = "1.33"  # flex-start TPU node pools need 1.33.0-gke.1712000+; REGULAR picks the patch
RELEASE_CHANNEL = "REGULAR"
# GKE's least-privilege node role (never the default compute account), and what image streaming asks of a custom one.
NODE_ROLES = ("roles/container.defaultNodeServiceAccount", "roles/serviceusage.serviceUsageConsumer")
WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
SYSTEM_MACHINE_TYPE = "e2-standard-4"  # one untainted node for kube-dns, the collectors, the adapter, the renewer
GATEWAY_SYSTEM_MACHINE_TYPE = "e2-standard-16"  # the endpoint picker asks for 8 CPUs, more than an 8-vCPU node gives
STREAMING_IMAGE_TYPE = "COS_CONTAINERD"  # what image streaming needs (and GKE's default for TPU pools)
SYSTEM_DISK_GB = 50
# An empty flex-start pool is quick to create; capacity is waited for when a pod needs a node.
NODE_POOL_TIMEOUT = "30m"
CLUSTER_TIMEOUT = "45m"
GATEWAY_API_CHANNEL = "CHANNEL_STANDARD"
PROXY_SUBNET_PURPOSE = "REGIONAL_MANAGED_PROXY"  # the proxy-only subnet of regional Envoy-based load balancers


def workload_pool(project: str) -> str:
    return f"{project}.svc.id.goog"


def kubeconfig(name: str, endpoint: str, ca_certificate: str) -> str:
    """For pulumi-kubernetes: credentials come from gke-gcloud-auth-plugin, so nothing secret is stored."""
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


def _first(items: Any) -> Any:
    return items[0] if items else None


def check_existing_cluster(cluster: Any, project: str, location: str, gateway: bool) -> str:
    """The existing cluster's name, once it has Workload Identity, the Cloud Storage FUSE CSI driver and, for the
    inference gateway, the Gateway API; else the command that enables what it lacks."""
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


class GkeTpuCluster(pulumi.ComponentResource):
    """`kubeconfig` reaches the cluster (created or looked up); `node_pool` is the pool the serving pods land on."""

    cluster_name: pulumi.Output[str]
    location: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, cfg: GkeConfig, workload_ksa: tuple[str, str], gsa_email: pulumi.Input[str],
                 labels: Mapping[str, str], opts: pulumi.ResourceOptions | None = None):
        """`workload_ksa`: (namespace, name) of the pods' Kubernetes account, acting as `gsa_email`."""
        super().__init__("tpuserve:gke:GkeTpuCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        region, gateway = cfg.effective_region, cfg.gke_router == "inference-gateway"

        node_account = serviceaccount.Account(
            f"{name}-nodes", project=cfg.project, account_id=f"{name[:24].rstrip('-')}-node",
            display_name="tpu-serve GKE nodes", description="Runs the tpu-serve GKE nodes; logs and metrics only.",
            opts=child)
        node_member = node_account.email.apply(lambda email: f"serviceAccount:{email}")
        node_grants = [projects.IAMMember(f"{name}-nodes-{role.split('.')[-1]}", project=cfg.project, role=role,
                                          member=node_member, opts=child) for role in NODE_ROLES]
        node_identity = dict(service_account=node_account.email, oauth_scopes=[CLOUD_PLATFORM_SCOPE])
        gke_metadata = dict(mode="GKE_METADATA")  # pods see their Workload Identity, never the node's account
        pool_nodes = dict(**node_identity, resource_labels=dict(labels), workload_metadata_config=(
            container.NodePoolNodeConfigWorkloadMetadataConfigArgs(**gke_metadata)))

        if cfg.gke_cluster:
            location = cfg.gke_cluster_location or region
            found = container.get_cluster_output(name=cfg.gke_cluster, location=location,
                                                 project=cfg.project, opts=pulumi.InvokeOutputOptions(parent=self))
            endpoint = found.endpoint
            ca_certificate = found.master_auths.apply(lambda auths: auths[0].cluster_ca_certificate)
            self.cluster_name = found.apply(lambda c: check_existing_cluster(c, cfg.project, location,
                                                                              gateway))
            self.location = pulumi.Output.from_input(location)
            cluster_ready: list[pulumi.Resource] = []
        else:
            if cfg.makes_nat_in(region):  # private nodes reach Docker Hub and Hugging Face through Cloud NAT
                cloud_nat(name, cfg.project, region, cfg.network, child)
            cluster = container.Cluster(
                name, name=name, project=cfg.project, location=cfg.zone, network=cfg.network,
                subnetwork=cfg.subnetwork or None,
                # The default pool is removed at once; while it exists it runs as the nodes' own account too.
                remove_default_node_pool=True, initial_node_count=1,
                node_config=container.ClusterNodeConfigArgs(
                    **node_identity, workload_metadata_config=container.ClusterNodeConfigWorkloadMetadataConfigArgs(
                        **gke_metadata), resource_labels=dict(labels)),
                networking_mode="VPC_NATIVE", ip_allocation_policy=container.ClusterIpAllocationPolicyArgs(),
                private_cluster_config=container.ClusterPrivateClusterConfigArgs(
                    enable_private_nodes=True, enable_private_endpoint=False),
                workload_identity_config=container.ClusterWorkloadIdentityConfigArgs(
                    workload_pool=workload_pool(cfg.project)),
                release_channel=container.ClusterReleaseChannelArgs(channel=RELEASE_CHANNEL),
                min_master_version=GKE_MIN_VERSION,
                monitoring_config=container.ClusterMonitoringConfigArgs(
                    enable_components=["SYSTEM_COMPONENTS"],
                    managed_prometheus=container.ClusterMonitoringConfigManagedPrometheusArgs(enabled=True)),
                addons_config=container.ClusterAddonsConfigArgs(
                    gcs_fuse_csi_driver_config=container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(enabled=True)),
                gateway_api_config=container.ClusterGatewayApiConfigArgs(channel=GATEWAY_API_CHANNEL)
                if gateway else None,
                resource_labels=dict(labels), deletion_protection=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=node_grants,
                                            custom_timeouts=pulumi.CustomTimeouts(create=CLUSTER_TIMEOUT)))
            container.NodePool(
                f"{name}-system", name="system", project=cfg.project, cluster=cluster.name, location=cfg.zone,
                node_locations=[cfg.zone], node_count=1,
                node_config=container.NodePoolNodeConfigArgs(
                    machine_type=GATEWAY_SYSTEM_MACHINE_TYPE if gateway else SYSTEM_MACHINE_TYPE,
                    disk_size_gb=SYSTEM_DISK_GB, **pool_nodes),
                management=container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
                network_config=container.NodePoolNetworkConfigArgs(enable_private_nodes=True), opts=child)
            endpoint = cluster.endpoint
            ca_certificate = cluster.master_auth.apply(lambda auth: auth.cluster_ca_certificate)
            self.cluster_name, self.location = cluster.name, cluster.location
            cluster_ready = [cluster]

        pool_name = f"{name[:36].rstrip('-')}-tpu"  # GKE's names are 40 characters; unique per stack on a cluster
        self.node_pool = container.NodePool(
            f"{name}-tpu", name=pool_name, project=cfg.project, cluster=self.cluster_name,
            location=self.location, node_locations=list(cfg.gke_pool_zones), initial_node_count=0,
            # Total limits over all zones; ANY: a node wherever there is capacity (flex-start's only policy).
            autoscaling=container.NodePoolAutoscalingArgs(
                total_min_node_count=0, total_max_node_count=cfg.gke_pool_max_nodes, location_policy="ANY"),
            # Flex-start does not work with auto-repair; release channels keep auto-upgrade on.
            management=container.NodePoolManagementArgs(auto_repair=False, auto_upgrade=True),
            network_config=container.NodePoolNetworkConfigArgs(enable_private_nodes=True),
            node_config=container.NodePoolNodeConfigArgs(
                machine_type=cfg.machine_type, flex_start=True, max_run_duration=f"{cfg.max_run_seconds}s",
                reservation_affinity=container.NodePoolNodeConfigReservationAffinityArgs(
                    consume_reservation_type="NO_RESERVATION"),
                disk_size_gb=cfg.boot_disk_gb, disk_type=cfg.boot_disk_type, **pool_nodes,
                image_type=STREAMING_IMAGE_TYPE, gcfs_config=container.NodePoolNodeConfigGcfsConfigArgs(enabled=True)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster_ready + node_grants,
                                        custom_timeouts=pulumi.CustomTimeouts(create=NODE_POOL_TIMEOUT)))

        # The gateway's load balancer runs its proxies here; one per network and region (an existing one is used).
        self.proxy_subnet: list[pulumi.Resource] = []
        if gateway and cfg.gke_proxy_subnet_range:
            self.proxy_subnet.append(compute.Subnetwork(
                f"{name}-proxy-only", name=f"{name[:50]}-proxy-only", project=cfg.project, region=region,
                network=cfg.network, ip_cidr_range=cfg.gke_proxy_subnet_range, purpose=PROXY_SUBNET_PURPOSE,
                role="ACTIVE", opts=child))

        namespace, ksa = workload_ksa
        serviceaccount.IAMMember(
            f"{name}-workload-identity", role=WORKLOAD_IDENTITY_USER,
            service_account_id=pulumi.Output.concat("projects/", cfg.project, "/serviceAccounts/",
                                                    gsa_email),
            member=f"serviceAccount:{workload_pool(cfg.project)}[{namespace}/{ksa}]",
            # The identity pool exists once the cluster does.
            opts=pulumi.ResourceOptions(parent=self, depends_on=cluster_ready))

        # What the serving pods select: a flex-start v6e node of the right shape in this stack's own pool.
        self.node_labels = {"cloud.google.com/gke-tpu-accelerator": V6E_ACCELERATOR,
                            "cloud.google.com/gke-tpu-topology": V6E_TOPOLOGY[cfg.chips],
                            "cloud.google.com/gke-flex-start": "true",
                            POOL_LABEL: pool_name}
        self.kubeconfig = pulumi.Output.all(self.cluster_name, endpoint, ca_certificate).apply(
            lambda values: kubeconfig(*values))
        self.register_outputs({"clusterName": self.cluster_name, "location": self.location,
                               "nodePool": self.node_pool.name})
