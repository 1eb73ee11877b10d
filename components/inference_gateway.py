"""The gke target's `inference-gateway` router: GKE Inference Gateway in front of the vLLM pods.

A ClusterIP Service spreads requests round robin; the Gateway API inference extension routes each request to the
replica its endpoint picker (EPP) scores best from the replicas' own metrics: queue length, KV-cache use and which
replica already holds the prompt's prefix in its cache. The objects are the ones the extension's chart renders for
GKE (kubernetes-sigs/gateway-api-inference-extension v1.5.0, commit df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849,
config/charts/inferencepool with `provider.name=gke`: the chart Google's guide installs,
https://cloud.google.com/kubernetes-engine/docs/how-to/deploy-gke-inference-gateway), declared here as plain objects
so `pulumi preview` shows them and tests validate them against the published CRDs (tests/data/crds):

- InferencePool `vllm` (inference.networking.k8s.io/v1): the Deployment's pods, target port 8000, its picker
  (templates/inferencepool.yaml; FailOpen: with the picker down the gateway still routes).
- The picker `vllm-epp` (epplib templates): ServiceAccount; Roles to read pods, InferencePools and
  InferenceObjectives; the EndpointPickerConfig of the chart's default profile (queue, KV-cache-utilization and
  prefix-cache scorers, weights 2, 2, 3, fed by the metrics data source); a one-replica Deployment (Recreate: the
  prefix scorer's state lives in one process) and its ext-proc Service on 9002. For vLLM it scrapes each pod's
  /metrics for vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc and
  vllm:cache_config_info (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go), all four in vLLM 0.32's
  scrape (tests/data/vllm-0.32.0-metrics.prom).
- GKE's HealthCheckPolicy (HTTP /health on the pool's port, every 2 s) and GCPBackendPolicy (request timeout,
  request logging) on the pool (templates/gke.yaml).
- Gateway `vllm` of class `gke-l7-rilb`, GKE's regional internal Application Load Balancer (clients in the VPC; it
  needs the region's proxy-only subnet, components/gke.py), with an HTTP listener on port 80, and the HTTPRoute that
  sends every path to the pool (templates/httproute.yaml). The extension's own GKE example
  (config/manifests/gateway/gke/gateway.yaml) uses the external `gke-l7-regional-external-managed`; internal is
  chosen for the reason the gcp target's VM has no external IP: nothing here authenticates a caller.

Left out of the chart: its PodMonitoring of the picker's own metrics (it needs a token Secret and cluster roles for
the Managed Prometheus collector) and the optional InferenceObjectives.
"""

from __future__ import annotations

from typing import Any

import yaml

from components.k8s_serving import ServingManifestArgs, metadata, selector

EXTENSION_VERSION = "v1.5.0"
EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{EXTENSION_VERSION}"
POOL_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_CLASS = "gke-l7-rilb"
LISTENER_PORT = 80
EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT = 9002, 9003, 9090
PLUGINS_FILE = "default-plugins.yaml"
# The chart asks for 4 CPUs and 8 GiB, sized for high-QPS scale tests; that is the whole system node
# (e2-standard-4) here, where a few dozen replicas' scoring is light. The memory limit keeps the chart's reason:
# a leak must not take the node.
EPP_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
# The chart's 300 s, doubled: a long completion (tens of thousands of tokens at ~200 tok/s per stream) must not be
# cut by the load balancer.
REQUEST_TIMEOUT_S = 600

# The chart's default EndpointPickerConfig (epplib templates/_config.yaml, vLLM over HTTP, no latency predictor).
PLUGINS_CONFIG = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
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
    return {"inferencepool": epp_name(args)}


def inference_pool(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": f"{POOL_GROUP}/v1", "kind": "InferencePool", "metadata": metadata(args),
            "spec": {"selector": {"matchLabels": selector(args)},
                     "targetPorts": [{"number": args.serving.port}],
                     "appProtocol": "http",
                     "endpointPickerRef": {"name": epp_name(args), "port": {"number": EXT_PROC_PORT},
                                           "failureMode": "FailOpen"}}}


def epp_objects(args: ServingManifestArgs) -> list[dict[str, Any]]:
    name = epp_name(args)
    meta = metadata(args, name)
    meta["labels"]["app.kubernetes.io/name"] = name  # not the vLLM pods' selector: nothing of theirs selects it
    rbac = "rbac.authorization.k8s.io"
    role = {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives",
                                                                        "inferencemodelrewrites"],
         "verbs": ["get", "watch", "list"]}]}
    binding = {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": meta,
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": args.namespace}],
               "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name}}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
              "data": {PLUGINS_FILE: yaml.safe_dump(PLUGINS_CONFIG, sort_keys=False)}}
    grpc_health = {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": "epp", "image": EPP_IMAGE, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", args.name, "--pool-namespace", args.namespace, "--pool-group", POOL_GROUP,
                 "--zap-encoder", "json", "--config-file", f"/config/{PLUGINS_FILE}", "--v", "1",
                 "--tracing=false"],
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
        "template": {"metadata": {"labels": {**epp_selector(args), "app.kubernetes.io/name": name,
                                             "app.kubernetes.io/part-of": "tpu-serve"}},
                     "spec": {"serviceAccountName": name, "terminationGracePeriodSeconds": 130,
                              "containers": [container],
                              "volumes": [{"name": "plugins-config-volume", "configMap": {"name": name}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
        "type": "ClusterIP", "selector": epp_selector(args),
        "ports": [{"name": "grpc-ext-proc", "protocol": "TCP", "port": EXT_PROC_PORT},
                  {"name": "http-metrics", "protocol": "TCP", "port": METRICS_PORT}]}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    return [account, role, binding, config, deployment, service]


def gke_policies(args: ServingManifestArgs) -> list[dict[str, Any]]:
    target = {"group": POOL_GROUP, "kind": "InferencePool", "name": args.name}
    return [
        {"apiVersion": "networking.gke.io/v1", "kind": "HealthCheckPolicy", "metadata": metadata(args),
         "spec": {"targetRef": target, "default": {
             "timeoutSec": 2, "checkIntervalSec": 2,
             "config": {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health", "port": args.serving.port}}}}},
        {"apiVersion": "networking.gke.io/v1", "kind": "GCPBackendPolicy", "metadata": metadata(args),
         "spec": {"targetRef": target, "default": {"timeoutSec": REQUEST_TIMEOUT_S, "logging": {"enabled": True}}}},
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
