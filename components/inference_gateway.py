"""The gke target's `inference-gateway` router: GKE Inference Gateway in front of the vLLM pods.

A ClusterIP Service spreads requests round robin; here each request goes to the replica the endpoint picker (EPP)
scores best from the replicas' own metrics: queue, KV-cache use and which replica already holds the prompt's prefix.
The objects are what GKE's guide, "Deploy GKE Inference Gateway powered by llm-d"
(https://cloud.google.com/kubernetes-engine/docs/how-to/deploy-gke-inference-gateway), installs: llm-d's router
chart `llm-d-router-gateway` with `provider.name=gke` (the picker moved there from gateway-api-inference-extension,
whose v1.6.0 README says so), rendered by hand from the release pinned below and declared as plain objects, so
`pulumi preview` shows them and tests validate them against the published CRDs (tests/data/crds). The chart's
templates, in config/charts/routerlib and llm-d-router-gateway/templates:

- InferencePool `vllm` (inference.networking.k8s.io/v1, _inferencepool.yaml): the Deployment's pods, port 8000, its
  picker; FailOpen (with the picker down the gateway still routes).
- The picker `vllm-epp`: ServiceAccount and Roles (rbac.yaml, _rbac.yaml), the EndpointPickerConfig of the chart's
  default profile (_config.yaml: queue, KV-cache-utilization and prefix-cache scorers, weights 2, 2, 3, fed by the
  metrics data source), a one-replica Deployment (_deployment.yaml; Recreate: the prefix scorer's state lives in one
  process) sized as the chart sizes it, and its ext-proc Service on 9002 (_service.yaml). For vLLM it reads
  vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc and vllm:cache_config_info
  (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go), all in vLLM 0.32's scrape.
- GKE's HealthCheckPolicy (HTTP /health on the pool's port, every 2 s) and GCPBackendPolicy on the pool (gke.yaml),
  the request timeout and connection draining both the route's longest request (k8s_serving.REQUEST_TIMEOUT_S).
- Gateway `vllm` of class `gke-l7-rilb`, GKE's regional internal Application Load Balancer (clients in the VPC; it
  needs the region's proxy-only subnet, components/gke.py), an HTTP listener on port 80, and the HTTPRoute that
  sends every path to the pool (httproute.yaml). Internal for the reason the gcp target's VM has no external IP:
  nothing here authenticates a caller.

Left out, as the chart leaves them out by default: the picker's own PodMonitoring and InferenceObjectives. The CRDs
(InferencePool, Gateway, HTTPRoute) are GKE's: 1.34.0-gke.1626000 and later install them (docs/gke.md).
"""

from __future__ import annotations

from typing import Any

import yaml

from components.k8s_serving import REQUEST_TIMEOUT_S, TERMINATION_GRACE_S, ServingManifestArgs, metadata, selector

# llm-d/llm-d-router v0.10.0 (commit 71f4f0999f95b96c49a9d0c4afbd18dfdb943c26, 2026-08-17), its latest release: the
# chart oci://ghcr.io/llm-d/charts/llm-d-router-gateway at that version and the picker image of the same tag
# (.github/ISSUE_TEMPLATE/new-release.md; hack/push-chart.sh sets the released chart's image to the release tag).
ROUTER_VERSION = "v0.10.0"
EPP_IMAGE = f"ghcr.io/llm-d/llm-d-router-endpoint-picker:{ROUTER_VERSION}"
POOL_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_CLASS = "gke-l7-rilb"
LISTENER_PORT = 80
EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT = 9002, 9003, 9090
PLUGINS_FILE = "default-plugins.yaml"
# The chart's own sizing (routerlib values.yaml `epp.resources`: "CPU limits unset for burst capacity, memory capped
# at 16Gi"); the system node is sized to fit it (components/gke.py GATEWAY_SYSTEM_MACHINE_TYPE).
EPP_RESOURCES = {"requests": {"cpu": "8", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
MODE_LABEL = {"llm-d.ai/igw-mode": "llm-d-router-gateway"}  # _helpers.tpl modeLabels

# The chart's default EndpointPickerConfig (_config.yaml, vLLM over HTTP, no latency predictor, no parsers).
PLUGINS_CONFIG = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"},
                {"type": "metrics-data-source",
                 "parameters": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True}},
                {"type": "core-metrics-extractor"}],
    "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "prefix-cache-scorer", "weight": 3}]}],
}


def epp_name(args: ServingManifestArgs) -> str:
    return f"{args.name}-epp"


def epp_selector(args: ServingManifestArgs) -> dict[str, str]:
    return {"llm-d-router-gateway": epp_name(args)}  # _helpers.tpl selectorLabels


def inference_pool(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool", "metadata": metadata(args),
            "spec": {"selector": {"matchLabels": selector(args)},
                     "targetPorts": [{"number": args.serving.port}],
                     "appProtocol": "http",
                     "endpointPickerRef": {"name": epp_name(args), "port": {"number": EXT_PROC_PORT},
                                           "failureMode": "FailOpen"}}}


def role(args: ServingManifestArgs, name: str, account: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io"
    meta = epp_metadata(args, name)
    return [{"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": rules},
            {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": meta,
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": args.namespace}],
             "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name}}]


def epp_metadata(args: ServingManifestArgs, name: str) -> dict[str, Any]:
    meta = metadata(args, name)
    meta["labels"]["app.kubernetes.io/name"] = epp_name(args)  # not the vLLM pods' selector: nothing of theirs
    return meta


def epp_objects(args: ServingManifestArgs) -> list[dict[str, Any]]:
    name = epp_name(args)
    meta = epp_metadata(args, name)
    read = ["get", "watch", "list"]
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
              "data": {PLUGINS_FILE: yaml.safe_dump(PLUGINS_CONFIG, sort_keys=False)}}
    grpc_health = {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": "epp", "image": EPP_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", args.name, "--pool-namespace", args.namespace, "--pool-group", POOL_GROUP,
                 "--zap-encoder", "json", "--config-file", f"/config/{PLUGINS_FILE}",
                 "--grpc-health-port", str(HEALTH_PORT), "--tracing=false"],
        "resources": EPP_RESOURCES,
        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT},
                  {"name": "grpc-health", "containerPort": HEALTH_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "livenessProbe": {**grpc_health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**grpc_health, "periodSeconds": 2},
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "volumeMounts": [{"name": "plugins-config-volume", "mountPath": "/config"}],
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
        "replicas": 1, "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": epp_selector(args)},
        "template": {"metadata": {"labels": {**epp_selector(args), **MODE_LABEL, "app.kubernetes.io/name": name,
                                             "app.kubernetes.io/part-of": "tpu-serve"}},
                     # The chart: "this timeout should mirror the longest grace period of the pods within the pool".
                     "spec": {"serviceAccountName": name, "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                              "containers": [container],
                              "volumes": [{"name": "plugins-config-volume", "configMap": {"name": name}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
        "type": "ClusterIP", "selector": epp_selector(args),
        "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT,
                   "appProtocol": "kubernetes.io/h2c"},
                  {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    pods = role(args, f"{name}-sa", name, [{"apiGroups": [""], "resources": ["pods"], "verbs": read}])
    pool = role(args, f"{name}-non-sa", name, [
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives",
                                                                        "inferencemodelrewrites"], "verbs": read},
        {"apiGroups": ["llm-d.ai"], "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read}])
    return [account, *pods, *pool, config, deployment, service]


def gke_policies(args: ServingManifestArgs) -> list[dict[str, Any]]:
    target = {"group": POOL_GROUP, "kind": "InferencePool", "name": args.name}
    return [
        {"apiVersion": "networking.gke.io/v1", "kind": "HealthCheckPolicy", "metadata": metadata(args),
         "spec": {"targetRef": target, "default": {
             "timeoutSec": 2, "checkIntervalSec": 2,
             "config": {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health", "port": args.serving.port}}}}},
        # The chart's 300 s request timeout, made the route's longest request; connection draining (default 0)
        # lets a removed endpoint's open requests run as long.
        {"apiVersion": "networking.gke.io/v1", "kind": "GCPBackendPolicy", "metadata": metadata(args),
         "spec": {"targetRef": target, "default": {
             "timeoutSec": REQUEST_TIMEOUT_S, "connectionDraining": {"drainingTimeoutSec": REQUEST_TIMEOUT_S},
             "logging": {"enabled": True}}}},
    ]


def gateway(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "Gateway", "metadata": metadata(args),
            "spec": {"gatewayClassName": GATEWAY_CLASS,
                     "listeners": [{"name": "http", "protocol": "HTTP", "port": LISTENER_PORT}]}}


def http_route(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute", "metadata": metadata(args),
            "spec": {"parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": args.name}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                                 "name": args.name}]}]}}


def manifests(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The router's objects in apply order: the pool and its picker, GKE's policies on the pool, the Gateway and
    the route. Kept while parked, so the load balancer and its address outlive a pause."""
    if args.router != "inference-gateway":
        return []
    return [inference_pool(args), *epp_objects(args), *gke_policies(args), gateway(args), http_route(args)]
