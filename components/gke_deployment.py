"""The `gke` target: the pods' identity, the cache bucket, the cluster with its flex-start TPU node pool, the serving
objects and, with gkeRouter inference-gateway, GKE Inference Gateway in front of them."""

from __future__ import annotations

from typing import Any

import pulumi

from components import inference_gateway, k8s_renewal
from components.cache import ServingCache, ServingCacheArgs
from components.config import GkeConfig
from components.gke import GkeTpuCluster
from components.identity import ServingIdentity, ServingIdentityArgs
from components.k8s_serving import SERVICE_ACCOUNT, GkeServing, GkeServingArgs, ServingManifestArgs, pod_serve_args
from tpuserve.caches import bucket_name, disk_name
from tpuserve.names import base_name, stack_labels
from tpuserve.serving import config_hash

DEPLOYMENT_NAME = "vllm"


class GkeTpuServe(pulumi.ComponentResource):
    """Everything a gke stack declares; `outputs` is what `__main__.py` exports (and the CLI port-forwards by)."""

    def __init__(self, name: str, cfg: GkeConfig, stack: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:index:GkeDeployment", name, None, opts)
        base = base_name(stack)
        labels = stack_labels(stack, dict(cfg.labels))
        child = pulumi.ResourceOptions(parent=self)
        serving_hash = config_hash(cfg.serving)

        identity = ServingIdentity(base, ServingIdentityArgs(
            project=cfg.project, existing_secret=cfg.hf_token_secret_id, hf_token=cfg.hf_token, labels=labels,
            project_roles=(),  # the nodes ship the pods' logs and metrics
            display_name="tpu-serve vLLM pods (GKE)",
            description="Workload Identity of tpu-serve's vLLM pods; reads only the HF token secret."), opts=child)
        # The weights and the XLA compile cache of every pod (compileCacheBucket false: every pod cold).
        cache = ServingCache(base, ServingCacheArgs(
            project=cfg.project, zone=cfg.zone, region=cfg.effective_region, disk_name=disk_name(base),
            bucket_name=bucket_name(cfg.project, base), disk_gb=0, bucket=cfg.compile_cache_bucket,
            keep=cfg.keep_caches, reader_email=identity.email, labels=labels), opts=child)
        gateway = cfg.gke_router == "inference-gateway"
        cluster = GkeTpuCluster(base, cfg, (cfg.gke_namespace, SERVICE_ACCOUNT), identity.email, labels, opts=child)
        manifest = ServingManifestArgs(
            name=DEPLOYMENT_NAME, namespace=cfg.gke_namespace, serving=cfg.serving,
            secret_name=identity.secret_name, gsa_email=identity.email, chips=cfg.chips,
            node_labels=cluster.node_labels, min_replicas=cfg.gke_min_replicas, max_replicas=cfg.gke_max_nodes,
            startup_budget_s=cfg.readiness_timeout_seconds, config_hash=serving_hash, machine_type=cfg.machine_type,
            cache_bucket=cache.bucket_name if cfg.compile_cache_bucket else "", surge=cfg.gke_surge_node,
            router=cfg.gke_router, pool_max_nodes=cfg.gke_pool_max_nodes, max_run_s=cfg.max_run_seconds,
            labels=labels)
        renewal = k8s_renewal.manifests(manifest)
        GkeServing(f"{base}-serving", GkeServingArgs(
            manifest=manifest, kubeconfig=cluster.kubeconfig, depends_on=(cluster, identity, cache),
            gateway_objects=tuple(inference_gateway.manifests(manifest)),
            gateway_depends_on=tuple(cluster.proxy_subnet), renewal_objects=tuple(renewal)), opts=child)

        port = cfg.serving.port
        self.outputs: dict[str, Any] = {
            "target": cfg.target, "project": cfg.project, "zone": cfg.zone,
            "cluster": cluster.cluster_name, "clusterLocation": cluster.location,
            "nodePool": cluster.node_pool.name, "nodePoolZones": list(cfg.gke_pool_zones),
            # Replicas at most (the HPA's maximum), and the pool's: one more with the surge node.
            "maxReplicas": cfg.gke_max_nodes, "nodePoolMaxNodes": cfg.gke_pool_max_nodes,
            "deployment": DEPLOYMENT_NAME, "service": DEPLOYMENT_NAME, "namespace": cfg.gke_namespace,
            "cacheBucket": cache.bucket_name, "router": cfg.gke_router, "port": port,
            "endpoint": f"http://{DEPLOYMENT_NAME}.{cfg.gke_namespace}.svc.cluster.local:{port}/v1",
            "getCredentialsCommand": pulumi.Output.all(cluster.cluster_name, cluster.location).apply(
                lambda values: f"gcloud container clusters get-credentials {values[0]} --location {values[1]} "
                               f"--project {cfg.project}"),
            "portForwardCommand": f"kubectl port-forward --namespace {cfg.gke_namespace} "
                                  f"service/{DEPLOYMENT_NAME} {port}:{port}",
            "model": cfg.serving.model, "vllmArgs": pod_serve_args(cfg.serving), "configHash": serving_hash,
            "maxRunSeconds": cfg.max_run_seconds,
            # Every replica's node busy, in steady state: the system node, the cluster fee and a surge node come on top.
            "maxTpuCostPerHourUsd": round(cfg.gke_max_nodes * cfg.chips * cfg.price_per_chip_hour, 2),
        }
        if renewal:  # `kubectl get jobs` / `kubectl logs job/<name>` in the namespace: what each run did
            self.outputs["renewalCronJob"] = k8s_renewal.renewer_name(manifest)
        if gateway:
            self.outputs["gateway"] = DEPLOYMENT_NAME
            self.outputs["gatewayAddressCommand"] = (
                f"kubectl get gateway {DEPLOYMENT_NAME} --namespace {cfg.gke_namespace} "
                "--output jsonpath='{.status.addresses[0].value}'")
        self.register_outputs(self.outputs)
