"""The gke target's Kubernetes side: vLLM on the flex-start TPU node pool, declared with pulumi-kubernetes.

The manifests are plain dicts made by the functions below (tests validate every one against the Kubernetes OpenAPI
schema and the published CRDs), then handed to typed pulumi-kubernetes resources unchanged:
- Deployment: `vllm serve` with `tpuserve.serving.vllm_serve_args` (the one argv builder) and vLLM's drain on
  SIGTERM (--shutdown-timeout), requesting all of the node's `google.com/tpu` chips, selecting the flex-start v6e
  pool by its labels and tolerating the TPU taint.
  The Hugging Face token never enters a Kubernetes object: an init container (vm/hf_token.py) reads the secret from
  Secret Manager as the pod's Workload Identity into an in-memory emptyDir, and huggingface_hub reads it from
  HF_TOKEN_PATH. Probes: startup runs vm/pod_boot.py (/health, for the whole cold-start budget, and the boot
  timeline: what was warm), readiness runs vm/readycheck.py (the readiness gate's rules: /health, the model listed,
  a real completion), liveness on /health. Pulumi's own await logic waits for the rollout, so `pulumi up` turns
  green only when a pod is ready.
- Warm pods: the caches of the VM, in the stack's bucket through the Cloud Storage FUSE CSI driver's sidecar, as
  Google's vLLM-on-TPU recipe mounts them (GoogleCloudPlatform/kubernetes-engine-samples
  ai-ml/vllm-tpu/vllm-llama3-70b.yaml: `gke-gcsfuse/volumes`, an ephemeral `gcsfuse.csi.storage.gke.io` volume with
  the file cache on the `gke-gcsfuse-cache` emptyDir, VLLM_XLA_CACHE_PATH and the download dir on the bucket). The
  Hugging Face cache (HF_HOME) is the bucket's `huggingface/`: the first pod downloads the weights into it, every
  later one reads them from the bucket through the file cache. The XLA compile cache is `xla/<key>/`, the VM's
  layout and key (vm/supervisor.py `cache_key`: image digest and machine type), so a pod compiles into and loads
  from exactly what a VM of the same image and machine type would. The environment is the VM container's
  (tpuserve.serving.TPU_CACHE_ENV).
- Rollouts that fit: with the surge node (gkeSurgeNode) a new pod starts before the one it replaces stops
  (maxSurge 1, maxUnavailable 0) and the PodDisruptionBudget lets nothing evict a serving pod (maxUnavailable 0:
  a rollout or a renewal replaces first, then removes); without it one pod stops first (maxSurge 0,
  maxUnavailable 1) and the budget allows the same one at a time. A pod that goes finishes its requests first: a
  preStop hook (vm/drain.py) and a grace period made from the route's longest request (REQUEST_TIMEOUT_S).
- Service (ClusterIP), PodDisruptionBudget, a Managed Prometheus PodMonitoring for /metrics, and an HPA on
  `vllm:num_requests_waiting` through the Custom Metrics Stackdriver Adapter, whose metric names are
  `prometheus.googleapis.com|<metric>|<kind>` (https://cloud.google.com/kubernetes-engine/docs/tutorials/
  serve-vllm-tpu: `prometheus.googleapis.com|vllm:num_requests_waiting|gauge`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from tpuserve.facts import CONTAINER_HF_HOME, CONTAINER_XLA_CACHE
from tpuserve.serving import TPU_CACHE_ENV, ServingConfig, backend_env, vllm_serve_args
from vm.compile_cache import xla_cache_key  # the VM's key: a pod compiles into what a VM would

VM_DIR = Path(__file__).resolve().parent.parent / "vm"
# Shipped to the pod in a ConfigMap, run by the image's python3 (pod_boot.py imports compile_cache.py, drain.py
# imports pod_boot.py).
SCRIPTS = ("readycheck.py", "hf_token.py", "pod_boot.py", "compile_cache.py", "drain.py")
SCRIPTS_DIR = "/opt/tpu-serve"
TOKEN_DIR = "/var/run/tpu-serve/hf"
TOKEN_FILE = f"{TOKEN_DIR}/token"
SERVICE_ACCOUNT = "vllm"
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT_KEY = "google.com/tpu"  # GKE taints TPU nodes google.com/tpu=present:NoSchedule
WAITING_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
WAITING_PER_REPLICA = 5  # add a replica when more than this many requests wait per replica on average
SCRAPE_INTERVAL = "30s"
STARTUP_PERIOD_S = 10
READINESS_PERIOD_S = 30
READYCHECK_REQUEST_TIMEOUT_S = 15  # per request; three requests per check
LIVENESS_PERIOD_S = 15
# A new replica needs a flex-start node first: Pulumi waits this long for capacity on top of the cold start.
CAPACITY_WAIT_S = 60 * 60
# The longest request the route lets run: the inference gateway's backend timeout (its GCPBackendPolicy), and what
# a pod that goes waits for before vLLM stops. Every stop budget below is made from it.
REQUEST_TIMEOUT_S = 600
# preStop: how long a deleted pod's endpoint takes to leave kube-proxy, the load balancer's NEG and the endpoint
# picker before new requests stop coming (KServe's 15 s: kserve/kserve#5496).
ENDPOINT_REMOVAL_S = 15
# vLLM's --shutdown-timeout: on SIGTERM it refuses new requests and lets running ones finish for this long
# (vllm/config/vllm.py `shutdown_timeout`, 0 = abort; in vLLM since 0.18, llm-d/llm-d#927): after the preStop saw
# no request in flight, only one that slipped in at that moment.
SHUTDOWN_TIMEOUT_S = 30
SHUTDOWN_MARGIN_S = 15  # vLLM's teardown after the drain
# The pod's whole stop: the preStop's two waits, vLLM's drain and its teardown (the kubelet counts the preStop
# against the grace period: https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/).
TERMINATION_GRACE_S = ENDPOINT_REMOVAL_S + REQUEST_TIMEOUT_S + SHUTDOWN_TIMEOUT_S + SHUTDOWN_MARGIN_S
DRAIN_POLL_S = 2
# A replica costs a cold start (~10 min) and a node-hour: scale up at once, scale down slowly.
SCALE_DOWN_WINDOW_S = 15 * 60
# Cloud Storage FUSE (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-setup):
# the annotation makes GKE inject the sidecar; "0" lifts its CPU, memory and disk limits, as Google's vLLM-on-TPU
# recipe sets them (a limited sidecar is OOM-killed under a 10 GB read, and the mount goes with it).
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATIONS = {"gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0",
                       "gke-gcsfuse/ephemeral-storage-limit": "0"}
# The sidecar keeps its file cache on the pod's volume of this name (an in-memory emptyDir, as in the recipe).
GCSFUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
# The recipe's mount options for the weights: the file cache, with parallel downloads of each file.
WEIGHTS_MOUNT_OPTIONS = ("implicit-dirs,file-cache:enable-parallel-downloads:true,"
                         "file-cache:parallel-downloads-per-file:100,file-cache:max-parallel-downloads:-1,"
                         "file-cache:download-chunk-size-mb:10,file-cache:max-size-mb:-1")
HF_BUCKET_DIR = "huggingface"  # the bucket's folder for HF_HOME; the compile cache is xla/<key>, as on the VM
# huggingface_hub's Xet chunk cache defaults to HF_HOME/xet: thousands of small files, which stay off the bucket.
XET_CACHE_DIR = "/tmp/hf-xet"
# The startup probe's timeline lives in the container's own filesystem: a restarted container starts a new one.
BOOT_STATE = "/tmp/tpu-serve-boot.json"


@dataclass(frozen=True)
class ServingManifestArgs:
    """What the manifests need. Values may be Pulumi inputs (an Output inside a dict resolves on apply)."""

    name: str
    namespace: str
    serving: ServingConfig
    secret_name: pulumi.Input[str]  # projects/P/secrets/S
    gsa_email: pulumi.Input[str]
    chips: int
    node_labels: Mapping[str, str]
    min_replicas: int
    max_replicas: int
    startup_budget_s: int
    config_hash: str
    machine_type: str = "ct6e-standard-1t"
    cache_bucket: pulumi.Input[str] = ""  # the stack's bucket: weights and compile cache
    surge: bool = True  # the pool has a node for the pod a rollout starts before it stops one
    router: str = "service"  # or inference-gateway (components/inference_gateway.py)
    pool_max_nodes: int = 0  # the TPU pool's maximum, and the nodes' max run: the renewal CronJob's
    max_run_s: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)


def selector(args: ServingManifestArgs) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": args.name}


def metadata(args: ServingManifestArgs, name: str | None = None, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name or args.name,
                            "labels": {**selector(args), "app.kubernetes.io/part-of": "tpu-serve",
                                       "app.kubernetes.io/managed-by": "pulumi", **dict(args.labels)}}
    if namespaced:
        meta["namespace"] = args.namespace
    return meta


def script_texts() -> dict[str, str]:
    return {script: (VM_DIR / script).read_text() for script in SCRIPTS}


def scripts_hash() -> str:
    digest = hashlib.sha256()
    for script, text in sorted(script_texts().items()):
        digest.update(f"{script}\0{text}\0".encode())
    return digest.hexdigest()[:16]


def namespace(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata(args, args.namespace, namespaced=False)}


def service_account(args: ServingManifestArgs) -> dict[str, Any]:
    meta = metadata(args, SERVICE_ACCOUNT)
    meta["annotations"] = {"iam.gke.io/gcp-service-account": args.gsa_email}  # Workload Identity: act as the GSA
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def config_map(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(args, f"{args.name}-scripts"),
            "data": script_texts()}


def pod_serve_args(cfg: ServingConfig) -> list[str]:
    """`vllm serve`'s arguments in the pod: the shared ones, then the drain on SIGTERM (last: it wins over extraArgs)."""
    return vllm_serve_args(cfg) + ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]


def vllm_container(args: ServingManifestArgs) -> dict[str, Any]:
    cfg = args.serving
    url = f"http://127.0.0.1:{cfg.port}"
    readycheck = ["python3", f"{SCRIPTS_DIR}/readycheck.py", "--url", url, "--model", cfg.model,
                  "--timeout", str(READYCHECK_REQUEST_TIMEOUT_S)]
    boot = ["python3", f"{SCRIPTS_DIR}/pod_boot.py", "--url", url, "--model", cfg.model, "--state", BOOT_STATE]
    chips = str(args.chips)
    return {
        "name": "vllm",
        "image": cfg.image,
        "command": ["vllm", "serve"],
        "args": pod_serve_args(cfg),
        "ports": [{"name": "http", "containerPort": cfg.port, "protocol": "TCP"}],
        # The caches' variables of the VM's container; the token is a file, never an environment value.
        "env": [{"name": key, "value": value} for key, value in TPU_CACHE_ENV.items()]
        + [{"name": "HF_TOKEN_PATH", "value": TOKEN_FILE}, {"name": "HF_XET_CACHE", "value": XET_CACHE_DIR}]
        + [{"name": name, "value": value} for name, value in backend_env(cfg).items()],
        "resources": {"requests": {TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "weights", "mountPath": CONTAINER_HF_HOME},
                         {"name": "compile-cache", "mountPath": CONTAINER_XLA_CACHE},
                         {"name": "hf-token", "mountPath": TOKEN_DIR, "readOnly": True},
                         {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}],
        # Image pull happens before the probes start; this covers engine start, weights and the XLA compile, and
        # leaves the boot timeline in the container's log. A probe run lists the compile cache on the bucket
        # twice at most, hence the long timeout.
        "startupProbe": {"exec": {"command": boot}, "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 30,
                         "failureThreshold": math.ceil(args.startup_budget_s / STARTUP_PERIOD_S)},
        "readinessProbe": {"exec": {"command": readycheck}, "periodSeconds": READINESS_PERIOD_S,
                           "timeoutSeconds": 3 * READYCHECK_REQUEST_TIMEOUT_S + 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": LIVENESS_PERIOD_S,
                          "timeoutSeconds": 5, "failureThreshold": 4},
        "lifecycle": {"preStop": {"exec": {"command": [
            "python3", f"{SCRIPTS_DIR}/drain.py", "--url", url, "--settle", str(ENDPOINT_REMOVAL_S),
            "--timeout", str(REQUEST_TIMEOUT_S), "--poll", str(DRAIN_POLL_S)]}}},
    }


def cache_volumes(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The bucket's two folders as ephemeral Cloud Storage FUSE volumes, and the sidecar's file cache; without a
    bucket (compileCacheBucket false) empty directories: every pod downloads and compiles cold."""
    if not args.cache_bucket:
        return [{"name": "weights", "emptyDir": {}}, {"name": "compile-cache", "emptyDir": {}}]

    def bucket(options: str) -> dict[str, Any]:
        return {"driver": GCSFUSE_DRIVER, "volumeAttributes": {"bucketName": args.cache_bucket,
                                                                "mountOptions": options}}
    key = xla_cache_key(args.serving.image, args.machine_type)
    return [{"name": "weights", "csi": bucket(f"{WEIGHTS_MOUNT_OPTIONS},only-dir={HF_BUCKET_DIR}")},
            {"name": "compile-cache", "csi": bucket(f"implicit-dirs,only-dir=xla/{key}")},
            {"name": GCSFUSE_CACHE_VOLUME, "emptyDir": {"medium": "Memory"}}]


def token_init_container(args: ServingManifestArgs) -> dict[str, Any]:
    """Reads the token as the pod's Workload Identity (GKE metadata server) with the serving image's python3."""
    return {
        "name": "hf-token",
        "image": args.serving.image,
        "command": ["python3", f"{SCRIPTS_DIR}/hf_token.py", "--secret", args.secret_name, "--out", TOKEN_FILE],
        "volumeMounts": [{"name": "hf-token", "mountPath": TOKEN_DIR},
                         {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}],
    }


def rolling_update(args: ServingManifestArgs) -> dict[str, int]:
    """With the surge node a new pod (on a new flex-start node) is ready before an old one goes; without it one
    old pod goes first, since a surge pod would wait for a node the pool may not add."""
    return {"maxSurge": 1, "maxUnavailable": 0} if args.surge else {"maxSurge": 0, "maxUnavailable": 1}


def deployment(args: ServingManifestArgs) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector(args)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(args)},
        "template": {
            "metadata": {"labels": metadata(args)["labels"],
                         "annotations": {"tpu-serve/config-hash": args.config_hash,
                                         "tpu-serve/scripts-hash": scripts_hash(),
                                         **(GCSFUSE_ANNOTATIONS if args.cache_bucket else {})}},
            "spec": {
                "serviceAccountName": SERVICE_ACCOUNT,
                "nodeSelector": dict(args.node_labels),
                "tolerations": [{"key": TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                "initContainers": [token_init_container(args)],
                "containers": [vllm_container(args)],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *cache_volumes(args),
                            {"name": "hf-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                            {"name": "scripts", "configMap": {"name": f"{args.name}-scripts"}}],
            },
        },
    }
    if args.min_replicas == 0:
        spec["replicas"] = 0  # parked: no pod, so the autoscaler takes the TPU node pool to zero
    # Otherwise the HPA owns `replicas`; declaring it here would reset the HPA's choice on every `pulumi up`.
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(args), "spec": spec}


def service(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(args),
            "spec": {"type": "ClusterIP", "selector": selector(args),
                     "ports": [{"name": "http", "port": args.serving.port, "targetPort": "http",
                                "protocol": "TCP"}]}}


def disruption_budget(args: ServingManifestArgs) -> dict[str, Any]:
    """The rollout's promise for evictions too (node drains, the cluster autoscaler): with the surge node no
    serving pod is evicted (replace first, as a rollout and `tpuserve gke renew` do), without it one at a time."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(args),
            "spec": {"maxUnavailable": rolling_update(args)["maxUnavailable"],
                     "selector": {"matchLabels": selector(args)}}}


def pod_monitoring(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": "monitoring.googleapis.com/v1", "kind": "PodMonitoring", "metadata": metadata(args),
            "spec": {"selector": {"matchLabels": selector(args)},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL}]}}


def autoscaler(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": metadata(args),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": args.name},
                "minReplicas": args.min_replicas, "maxReplicas": args.max_replicas,
                "metrics": [{"type": "Pods", "pods": {
                    "metric": {"name": WAITING_METRIC},
                    "target": {"type": "AverageValue", "averageValue": str(WAITING_PER_REPLICA)}}}],
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 0,
                                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
                    "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]}}}}


def manifests(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """Every serving object the gke target declares in the cluster, in apply order. No HPA while parked
    (minReplicas 0). The inference-gateway router's objects come from components/inference_gateway.py."""
    objects = [namespace(args), service_account(args), config_map(args), deployment(args), service(args),
               disruption_budget(args), pod_monitoring(args)]
    return objects + ([autoscaler(args)] if args.min_replicas > 0 else [])


# Kinds with a typed pulumi-kubernetes class; any other kind (the CRDs: PodMonitoring, InferencePool, Gateway,
# HTTPRoute, GKE's policies) is a CustomResource.
TYPED = {
    "Namespace": k8s.core.v1.Namespace, "ServiceAccount": k8s.core.v1.ServiceAccount,
    "ConfigMap": k8s.core.v1.ConfigMap, "Service": k8s.core.v1.Service, "Deployment": k8s.apps.v1.Deployment,
    "PodDisruptionBudget": k8s.policy.v1.PodDisruptionBudget,
    "HorizontalPodAutoscaler": k8s.autoscaling.v2.HorizontalPodAutoscaler,
    "Role": k8s.rbac.v1.Role, "RoleBinding": k8s.rbac.v1.RoleBinding,
    "ClusterRole": k8s.rbac.v1.ClusterRole, "ClusterRoleBinding": k8s.rbac.v1.ClusterRoleBinding,
    "CronJob": k8s.batch.v1.CronJob,
}
FIELD_ARGS = {"roleRef": "role_ref"}  # top-level fields whose Python argument is not their name


@dataclass(frozen=True)
class GkeServingArgs:
    manifest: ServingManifestArgs
    kubeconfig: pulumi.Input[str]
    # The Deployment waits for these (the node pool, the Workload Identity binding) before it is applied.
    depends_on: tuple[pulumi.Resource, ...] = ()
    # The inference gateway's objects (inference_gateway.manifests) and what its Gateway waits for (the
    # proxy-only subnet of the load balancer).
    gateway_objects: tuple[dict[str, Any], ...] = ()
    gateway_depends_on: tuple[pulumi.Resource, ...] = ()
    # The renewal CronJob and its access (components/k8s_renewal.py).
    renewal_objects: tuple[dict[str, Any], ...] = ()


class GkeServing(pulumi.ComponentResource):
    """Declares `manifests(...)` (and the inference gateway's objects) through a pulumi-kubernetes provider for the
    cluster. The vLLM Deployment is awaited: `pulumi up` fails unless a pod passes its readiness probe within the
    capacity wait plus the startup budget."""

    def __init__(self, name: str, args: GkeServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gke:GkeServing", name, None, opts)
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=args.kubeconfig, enable_server_side_apply=True,
                                opts=pulumi.ResourceOptions(parent=self))
        timeout = f"{CAPACITY_WAIT_S + args.manifest.startup_budget_s}s"
        declared: list[pulumi.CustomResource] = []

        def declare(obj: dict[str, Any], resource_name: str, depends_on: list[pulumi.Resource],
                    timeouts: pulumi.CustomTimeouts | None = None) -> pulumi.CustomResource:
            kind, meta = obj["kind"], obj["metadata"]
            fields = {FIELD_ARGS.get(key, key): value for key, value in obj.items()
                      if key not in ("apiVersion", "kind", "metadata")}
            # A Deployment waits for what was declared before it (its account, role, config; not another
            # Deployment's rollout); the rest for the namespace only.
            before = [r for r in declared if isinstance(r, k8s.core.v1.Namespace) or (
                kind == "Deployment" and not isinstance(r, k8s.apps.v1.Deployment))]
            opts_ = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=before + depends_on,
                                           custom_timeouts=timeouts)
            if kind in TYPED:
                resource = TYPED[kind](resource_name, metadata=meta, opts=opts_, **fields)
            else:
                resource = k8s.apiextensions.CustomResource(resource_name, api_version=obj["apiVersion"], kind=kind,
                                                            metadata=meta, opts=opts_, **fields)
            declared.append(resource)
            return resource

        for obj in manifests(args.manifest):
            is_vllm = obj["kind"] == "Deployment"
            resource = declare(obj, f"{name}-{obj['kind'].lower()}", list(args.depends_on) if is_vllm else [],
                               pulumi.CustomTimeouts(create=timeout, update=timeout) if is_vllm else None)
            if is_vllm:
                self.deployment = resource
        for obj in args.gateway_objects:
            declare(obj, f"{name}-{obj['metadata']['name']}-{obj['kind'].lower()}",
                    list(args.gateway_depends_on) if obj["kind"] == "Gateway" else [])
        for obj in args.renewal_objects:  # one of each kind; named apart from the namespace its ClusterRole names
            declare(obj, f"{name}-renewer-{obj['kind'].lower()}", [])

        self.service_name = args.manifest.name
        self.register_outputs({"deployment": args.manifest.name, "namespace": args.manifest.namespace})
