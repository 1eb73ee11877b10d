"""The gke target's Kubernetes side: vLLM on the flex-start TPU node pool, as plain manifest dicts handed to typed
pulumi-kubernetes resources. What each does: docs/gke.md; sources: docs/design/pulumi-program.md#the-serving-objects.
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
# Shipped in a ConfigMap, run by the image's python3 (with what they import from each other).
SCRIPTS = ("readycheck.py", "hf_token.py", "pod_boot.py", "compile_cache.py", "drain.py")
SCRIPTS_DIR = "/opt/tpu-serve"
TOKEN_DIR = "/var/run/tpu-serve/hf"
TOKEN_FILE = f"{TOKEN_DIR}/token"
SERVICE_ACCOUNT = "vllm"
TPU_RESOURCE = "google.com/tpu"  # also the key of the taint GKE puts on TPU nodes (present:NoSchedule)
WAITING_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
WAITING_PER_REPLICA = 5  # add a replica when more than this many requests wait per replica on average
STARTUP_PERIOD_S = 10
READYCHECK_REQUEST_TIMEOUT_S = 15  # per request; three requests per check
CAPACITY_WAIT_S = 60 * 60  # how long Pulumi waits for a flex-start node, on top of the cold start
# The longest request: every stop budget is made of it (docs/gke.md#a-pod-finishes-its-streams-before-it-goes).
REQUEST_TIMEOUT_S = 600
ENDPOINT_REMOVAL_S = 15  # preStop: the deleted pod's endpoint leaves every router (KServe's 15 s)
SHUTDOWN_TIMEOUT_S = 30  # vLLM's drain on SIGTERM, for a request that slipped in after the preStop
SHUTDOWN_MARGIN_S = 15  # vLLM's teardown after the drain
TERMINATION_GRACE_S = ENDPOINT_REMOVAL_S + REQUEST_TIMEOUT_S + SHUTDOWN_TIMEOUT_S + SHUTDOWN_MARGIN_S  # with preStop
SCALE_DOWN_WINDOW_S = 15 * 60  # a replica costs a cold start and a node-hour: up at once, down slowly
# Cloud Storage FUSE as Google's vLLM-on-TPU recipe sets it: an unlimited sidecar, its file cache in memory.
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATIONS = {"gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0",
                       "gke-gcsfuse/ephemeral-storage-limit": "0"}
GCSFUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
# The recipe's mount options for the weights: the file cache, with parallel downloads of each file.
WEIGHTS_MOUNT_OPTIONS = ("implicit-dirs,file-cache:enable-parallel-downloads:true,"
                         "file-cache:parallel-downloads-per-file:100,file-cache:max-parallel-downloads:-1,"
                         "file-cache:download-chunk-size-mb:10,file-cache:max-size-mb:-1")
HF_BUCKET_DIR = "huggingface"  # the bucket's folder for HF_HOME; the compile cache is xla/<key>, as on the VM
XET_CACHE_DIR = "/tmp/hf-xet"  # huggingface_hub's chunk cache (default HF_HOME/xet): thousands of files, off the bucket
BOOT_STATE = "/tmp/tpu-serve-boot.json"  # the startup probe's timeline: a restarted container starts a new one


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


def metadata(args: ServingManifestArgs, name: str | None = None, namespaced: bool = True,
             app: str = "vllm") -> dict[str, Any]:
    """`app`: another app's name (the picker, the renewer) keeps its objects out of the vLLM pods' selector."""
    return {"name": name or args.name,
            "labels": {**selector(args), "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "tpu-serve",
                       "app.kubernetes.io/managed-by": "pulumi", **dict(args.labels)},
            **({"namespace": args.namespace} if namespaced else {})}


def script_texts() -> dict[str, str]:
    return {script: (VM_DIR / script).read_text() for script in SCRIPTS}


def role_and_binding(meta: dict[str, Any], rules: list[dict[str, Any]], account: str, namespace: str,
                     kind: str = "Role") -> list[dict[str, Any]]:
    """A Role (or ClusterRole) named by `meta` and its binding to the service account `account`."""
    rbac = "rbac.authorization.k8s.io"
    return [{"apiVersion": f"{rbac}/v1", "kind": kind, "metadata": meta, "rules": rules},
            {"apiVersion": f"{rbac}/v1", "kind": f"{kind}Binding", "metadata": meta,
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
             "roleRef": {"apiGroup": rbac, "kind": kind, "name": meta["name"]}}]


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
    """The shared `vllm serve` arguments, then the drain on SIGTERM (last: it wins over extraArgs)."""
    return vllm_serve_args(cfg) + ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]


def vllm_container(args: ServingManifestArgs) -> dict[str, Any]:
    cfg = args.serving
    url = f"http://127.0.0.1:{cfg.port}"
    readycheck = ["python3", f"{SCRIPTS_DIR}/readycheck.py", "--url", url, "--model", cfg.model,
                  "--timeout", str(READYCHECK_REQUEST_TIMEOUT_S)]
    boot = ["python3", f"{SCRIPTS_DIR}/pod_boot.py", "--url", url, "--model", cfg.model, "--state", BOOT_STATE]
    chips = str(args.chips)
    return {
        "name": "vllm", "image": cfg.image, "command": ["vllm", "serve"], "args": pod_serve_args(cfg),
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
        # Engine start, weights and the compile, the timeline in the log; the bucket listing needs the long timeout.
        "startupProbe": {"exec": {"command": boot}, "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 30,
                         "failureThreshold": math.ceil(args.startup_budget_s / STARTUP_PERIOD_S)},
        "readinessProbe": {"exec": {"command": readycheck}, "periodSeconds": 30,
                           "timeoutSeconds": 3 * READYCHECK_REQUEST_TIMEOUT_S + 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 15,
                          "timeoutSeconds": 5, "failureThreshold": 4},
        "lifecycle": {"preStop": {"exec": {"command": [
            "python3", f"{SCRIPTS_DIR}/drain.py", "--url", url, "--settle", str(ENDPOINT_REMOVAL_S),
            "--timeout", str(REQUEST_TIMEOUT_S), "--poll", "2"]}}},
    }


def cache_volumes(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The bucket's two folders through Cloud Storage FUSE; without a bucket, empty directories (every pod cold)."""
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
    """Reads the token as the pod's Workload Identity with the serving image's python3."""
    return {
        "name": "hf-token",
        "image": args.serving.image,
        "command": ["python3", f"{SCRIPTS_DIR}/hf_token.py", "--secret", args.secret_name, "--out", TOKEN_FILE],
        "volumeMounts": [{"name": "hf-token", "mountPath": TOKEN_DIR},
                         {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}],
    }


def rolling_update(args: ServingManifestArgs) -> dict[str, int]:
    """With the surge node a new pod is ready before an old one goes; without it an old one goes first."""
    return {"maxSurge": 1, "maxUnavailable": 0} if args.surge else {"maxSurge": 0, "maxUnavailable": 1}


def deployment(args: ServingManifestArgs) -> dict[str, Any]:
    scripts = "".join(f"{script}\0{text}\0" for script, text in sorted(script_texts().items()))
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector(args)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(args)},
        "template": {
            "metadata": {"labels": metadata(args)["labels"],
                         "annotations": {"tpu-serve/config-hash": args.config_hash,
                                         "tpu-serve/scripts-hash": hashlib.sha256(scripts.encode()).hexdigest()[:16],
                                         **(GCSFUSE_ANNOTATIONS if args.cache_bucket else {})}},
            "spec": {
                "serviceAccountName": SERVICE_ACCOUNT,
                "nodeSelector": dict(args.node_labels),
                "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
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
    """The serving objects in apply order; no HPA while parked (minReplicas 0)."""
    objects = [namespace(args), service_account(args), config_map(args), deployment(args), service(args),
               # the rollout's promise for evictions too (node drains, the cluster autoscaler)
               {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(args),
                "spec": {"maxUnavailable": rolling_update(args)["maxUnavailable"],
                         "selector": {"matchLabels": selector(args)}}},
               {"apiVersion": "monitoring.googleapis.com/v1", "kind": "PodMonitoring", "metadata": metadata(args),
                "spec": {"selector": {"matchLabels": selector(args)},
                         "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}]}}]
    return objects + ([autoscaler(args)] if args.min_replicas > 0 else [])


# Kinds with a typed pulumi-kubernetes class; any other kind (the CRDs) is a CustomResource.
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
    depends_on: tuple[pulumi.Resource, ...] = ()  # what the vLLM Deployment waits for (node pool, identity)
    gateway_objects: tuple[dict[str, Any], ...] = ()  # inference_gateway.manifests
    gateway_depends_on: tuple[pulumi.Resource, ...] = ()  # the proxy-only subnet, for the Gateway
    renewal_objects: tuple[dict[str, Any], ...] = ()  # k8s_renewal.manifests


class GkeServing(pulumi.ComponentResource):
    """The manifests through a provider for the cluster; `pulumi up` awaits the vLLM Deployment's rollout."""

    def __init__(self, name: str, args: GkeServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gke:GkeServing", name, None, opts)
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=args.kubeconfig, enable_server_side_apply=True,
                                opts=pulumi.ResourceOptions(parent=self))
        timeout = f"{CAPACITY_WAIT_S + args.manifest.startup_budget_s}s"
        declared: list[pulumi.CustomResource] = []

        def declare(obj: dict[str, Any], resource_name: str, depends_on: list[pulumi.Resource],
                    timeouts: pulumi.CustomTimeouts | None = None) -> None:
            kind, meta = obj["kind"], obj["metadata"]
            fields = {FIELD_ARGS.get(key, key): value for key, value in obj.items()
                      if key not in ("apiVersion", "kind", "metadata")}
            # A Deployment waits for what was declared before it (not another Deployment); the rest for the namespace.
            before = [r for r in declared if isinstance(r, k8s.core.v1.Namespace) or (
                kind == "Deployment" and not isinstance(r, k8s.apps.v1.Deployment))]
            opts_ = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=before + depends_on,
                                           custom_timeouts=timeouts)
            if kind in TYPED:
                declared.append(TYPED[kind](resource_name, metadata=meta, opts=opts_, **fields))
            else:
                declared.append(k8s.apiextensions.CustomResource(
                    resource_name, api_version=obj["apiVersion"], kind=kind, metadata=meta, opts=opts_, **fields))

        for obj in manifests(args.manifest):
            vllm = obj["kind"] == "Deployment"
            declare(obj, f"{name}-{obj['kind'].lower()}", list(args.depends_on) if vllm else [],
                    pulumi.CustomTimeouts(create=timeout, update=timeout) if vllm else None)
        for obj in args.gateway_objects:
            declare(obj, f"{name}-{obj['metadata']['name']}-{obj['kind'].lower()}",
                    list(args.gateway_depends_on) if obj["kind"] == "Gateway" else [])
        for obj in args.renewal_objects:  # one of each kind; named apart from the namespace its ClusterRole names
            declare(obj, f"{name}-renewer-{obj['kind'].lower()}", [])

        self.register_outputs({"deployment": args.manifest.name, "namespace": args.manifest.namespace})
