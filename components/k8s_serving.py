"""The gke target's Kubernetes side: vLLM on the flex-start TPU node pool, declared with pulumi-kubernetes.

The manifests are plain dicts made by the functions below (tests validate every one against the Kubernetes OpenAPI
schema and the PodMonitoring CRD), then handed to typed pulumi-kubernetes resources unchanged:
- Deployment: `vllm serve` with exactly `tpuserve.serving.vllm_serve_args` (the one argv builder), requesting all of
  the node's `google.com/tpu` chips, selecting the flex-start v6e pool by its labels and tolerating the TPU taint.
  The Hugging Face token never enters a Kubernetes object: an init container (vm/hf_token.py) reads the secret from
  Secret Manager as the pod's Workload Identity into an in-memory emptyDir, and huggingface_hub reads it from
  HF_TOKEN_PATH. Probes: startup on /health for the whole cold-start budget (image pull + XLA compile), readiness
  runs vm/readycheck.py (the readiness gate's rules: /health, the model listed, a real completion), liveness on
  /health. Pulumi's own await logic waits for the rollout, so `pulumi up` turns green only when a pod is ready.
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

from tpuserve.serving import ServingConfig, vllm_serve_args

VM_DIR = Path(__file__).resolve().parent.parent / "vm"
SCRIPTS = ("readycheck.py", "hf_token.py")  # shipped to the pod in a ConfigMap, run by the image's python3
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
# A replica costs a cold start (~10 min) and a node-hour: scale up at once, scale down slowly.
SCALE_DOWN_WINDOW_S = 15 * 60


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


def vllm_container(args: ServingManifestArgs) -> dict[str, Any]:
    cfg = args.serving
    readycheck = ["python3", f"{SCRIPTS_DIR}/readycheck.py", "--url", f"http://127.0.0.1:{cfg.port}",
                  "--model", cfg.model, "--timeout", str(READYCHECK_REQUEST_TIMEOUT_S)]
    chips = str(args.chips)
    return {
        "name": "vllm",
        "image": cfg.image,
        "command": ["vllm", "serve"],
        "args": vllm_serve_args(cfg),
        "ports": [{"name": "http", "containerPort": cfg.port, "protocol": "TCP"}],
        # Weights under /dev/shm (HF_HOME): a pod has no cache disk (the VM keeps them on one). The token is a file,
        # never an environment value.
        "env": [{"name": "HF_HOME", "value": "/dev/shm"}, {"name": "HF_TOKEN_PATH", "value": TOKEN_FILE}],
        "resources": {"requests": {TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "hf-token", "mountPath": TOKEN_DIR, "readOnly": True},
                         {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}],
        # Image pull happens before the probes start; this covers engine start, weights and the XLA compile.
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": STARTUP_PERIOD_S,
                         "timeoutSeconds": 5,
                         "failureThreshold": math.ceil(args.startup_budget_s / STARTUP_PERIOD_S)},
        "readinessProbe": {"exec": {"command": readycheck}, "periodSeconds": READINESS_PERIOD_S,
                           "timeoutSeconds": 3 * READYCHECK_REQUEST_TIMEOUT_S + 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": LIVENESS_PERIOD_S,
                          "timeoutSeconds": 5, "failureThreshold": 4},
    }


def token_init_container(args: ServingManifestArgs) -> dict[str, Any]:
    """Reads the token as the pod's Workload Identity (GKE metadata server) with the serving image's python3."""
    return {
        "name": "hf-token",
        "image": args.serving.image,
        "command": ["python3", f"{SCRIPTS_DIR}/hf_token.py", "--secret", args.secret_name, "--out", TOKEN_FILE],
        "volumeMounts": [{"name": "hf-token", "mountPath": TOKEN_DIR},
                         {"name": "scripts", "mountPath": SCRIPTS_DIR, "readOnly": True}],
    }


def deployment(args: ServingManifestArgs) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector(args)},
        # A new pod (on a new flex-start node) must be ready before an old one goes.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": metadata(args)["labels"],
                         "annotations": {"tpu-serve/config-hash": args.config_hash,
                                         "tpu-serve/scripts-hash": scripts_hash()}},
            "spec": {
                "serviceAccountName": SERVICE_ACCOUNT,
                "nodeSelector": dict(args.node_labels),
                "tolerations": [{"key": TPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 60,
                "initContainers": [token_init_container(args)],
                "containers": [vllm_container(args)],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
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
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(args),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(args)}}}


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
    """Every object the gke target declares in the cluster, in apply order. No HPA while parked (minReplicas 0)."""
    objects = [namespace(args), service_account(args), config_map(args), deployment(args), service(args),
               disruption_budget(args), pod_monitoring(args)]
    return objects + ([autoscaler(args)] if args.min_replicas > 0 else [])


@dataclass(frozen=True)
class GkeServingArgs:
    manifest: ServingManifestArgs
    kubeconfig: pulumi.Input[str]
    # The Deployment waits for these (the node pool, the Workload Identity binding) before it is applied.
    depends_on: tuple[pulumi.Resource, ...] = ()


class GkeServing(pulumi.ComponentResource):
    """Declares `manifests(...)` through a pulumi-kubernetes provider for the cluster. The Deployment is awaited:
    `pulumi up` fails unless a pod passes its readiness probe within the capacity wait plus the startup budget."""

    def __init__(self, name: str, args: GkeServingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpuserve:gke:GkeServing", name, None, opts)
        provider = k8s.Provider(f"{name}-k8s", kubeconfig=args.kubeconfig, enable_server_side_apply=True,
                                opts=pulumi.ResourceOptions(parent=self))
        timeout = f"{CAPACITY_WAIT_S + args.manifest.startup_budget_s}s"
        created: dict[str, pulumi.CustomResource] = {}
        for obj in manifests(args.manifest):
            kind, meta = obj["kind"], obj["metadata"]
            opts_ = pulumi.ResourceOptions(parent=self, provider=provider,
                                           depends_on=[created["Namespace"]] if "Namespace" in created else [])
            fields = {key: value for key, value in obj.items() if key not in ("apiVersion", "kind", "metadata")}
            resource_name = f"{name}-{kind.lower()}"
            if kind == "Namespace":
                resource = k8s.core.v1.Namespace(resource_name, metadata=meta, opts=opts_)
            elif kind == "ServiceAccount":
                resource = k8s.core.v1.ServiceAccount(resource_name, metadata=meta, opts=opts_)
            elif kind == "ConfigMap":
                resource = k8s.core.v1.ConfigMap(resource_name, metadata=meta, data=fields["data"], opts=opts_)
            elif kind == "Deployment":
                resource = k8s.apps.v1.Deployment(resource_name, metadata=meta, spec=fields["spec"], opts=opts_.merge(
                    pulumi.ResourceOptions(
                        depends_on=[created["ServiceAccount"], created["ConfigMap"], *args.depends_on],
                        custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout))))
            elif kind == "Service":
                resource = k8s.core.v1.Service(resource_name, metadata=meta, spec=fields["spec"], opts=opts_)
            elif kind == "PodDisruptionBudget":
                resource = k8s.policy.v1.PodDisruptionBudget(resource_name, metadata=meta, spec=fields["spec"],
                                                             opts=opts_)
            elif kind == "HorizontalPodAutoscaler":
                resource = k8s.autoscaling.v2.HorizontalPodAutoscaler(resource_name, metadata=meta,
                                                                      spec=fields["spec"], opts=opts_)
            else:  # PodMonitoring: a CRD that GKE Managed Prometheus installs
                resource = k8s.apiextensions.CustomResource(resource_name, api_version=obj["apiVersion"], kind=kind,
                                                            metadata=meta, spec=fields["spec"], opts=opts_)
            created[kind] = resource

        self.deployment = created["Deployment"]
        self.service_name = args.manifest.name
        self.register_outputs({"deployment": args.manifest.name, "namespace": args.manifest.namespace})
