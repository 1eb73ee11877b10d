"""The gke target's `inference-gateway` router: GKE Inference Gateway in front of the vLLM pods, each request to the
replica llm-d's endpoint picker scores best. The objects llm-d's chart renders for GKE, written out (their templates:
docs/design/pulumi-program.md#the-inference-gateway)."""

from __future__ import annotations

from typing import Any

import yaml

from components.k8s_serving import (REQUEST_TIMEOUT_S, TERMINATION_GRACE_S, ServingManifestArgs, metadata,
                                   role_and_binding, selector)

# llm-d/llm-d-router's release (commit 71f4f0999f95b96c49a9d0c4afbd18dfdb943c26): its chart and picker image.
ROUTER_VERSION = "v0.10.0"
EPP_IMAGE = f"ghcr.io/llm-d/llm-d-router-endpoint-picker:{ROUTER_VERSION}"
POOL_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT = 9002, 9003, 9090
PLUGINS_FILE = "default-plugins.yaml"
# The chart's own sizing (routerlib values.yaml `epp.resources`); gke.GATEWAY_SYSTEM_MACHINE_TYPE fits it.
EPP_RESOURCES = {"requests": {"cpu": "8", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
MODE_LABEL = {"llm-d.ai/igw-mode": "llm-d-router-gateway"}  # _helpers.tpl modeLabels

# The chart's default EndpointPickerConfig (_config.yaml: vLLM over HTTP, no latency predictor, no parsers).
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


def epp_objects(args: ServingManifestArgs) -> list[dict[str, Any]]:
    name = epp_name(args)
    meta = metadata(args, name, app=name)
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
    pods = role_and_binding(metadata(args, f"{name}-sa", app=name), [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read}], name, args.namespace)
    pool = role_and_binding(metadata(args, f"{name}-non-sa", app=name), [
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives",
                                                                        "inferencemodelrewrites"], "verbs": read},
        {"apiGroups": ["llm-d.ai"], "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
        {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": read}], name, args.namespace)
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
            "spec": {"gatewayClassName": "gke-l7-rilb",  # GKE's regional internal Application Load Balancer
                     "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}}


def http_route(args: ServingManifestArgs) -> dict[str, Any]:
    return {"apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute", "metadata": metadata(args),
            "spec": {"parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": args.name}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool",
                                                 "name": args.name}]}]}}


def manifests(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The router's objects in apply order; kept while parked, so the load balancer and its address outlive a pause."""
    if args.router != "inference-gateway":
        return []
    return [inference_pool(args), *epp_objects(args), *gke_policies(args), gateway(args), http_route(args)]
