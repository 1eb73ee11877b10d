"""A GKE cluster's TPU side for tests, on a virtual clock: the objects the renewer (tpuserve/gke_renewer.py) reads
and changes, and the controllers that change them between its calls, so a renewal can be tested as a life (the node
expires, the pool grows and shrinks, the endpoint is up or not) and a failure path ends with an inventory to assert;
and the same cluster behind a fake Kubernetes API server (`FakeApiServer`) for the CronJob's in-cluster client.

Shapes are the Kubernetes API's JSON (what `kubectl get -o json` prints): a node carries the labels GKE sets on a
flex-start TPU node (cloud.google.com/gke-nodepool, cloud.google.com/gke-flex-start, the TPU accelerator and topology,
topology.kubernetes.io/zone) and the annotation GKE sets on a node with a max run, node.gke.io/machine-termination-
datetime, RFC 3339 in UTC (GoogleCloudPlatform/cluster-autoscaler pkg/cloudprovider/gke/labels/system_labels.go at
7d25050, whose recycling plugin parses it with time.RFC3339; a real node shows e.g. "2026-12-16T01:00:00Z"). Node names
follow GKE's gke-<cluster>-<pool>-<hash>-<suffix>.

The controllers, each as small as the behaviour a renewal relies on:
- HPA (every 15 s): replicas = the load's replicas within [minReplicas, maxReplicas]; scale-down at most one pod per
  300 s (the stack's behavior policy).
- ReplicaSet: creates pods up to `replicas`; removes extras in kube-controller-manager's order
  (pkg/controller/controller_utils.go ActivePodsWithRanks): unscheduled, then pending, then not ready, then lower
  controller.kubernetes.io/pod-deletion-cost, then newer. A deleted pod is no endpoint, and goes once its last
  requests are done (`drain_s`, the preStop's wait) or its grace period (spec.terminationGracePeriodSeconds) ends.
- Scheduler: a pending pod goes to a schedulable node without one of ours (each takes every chip).
- Cluster autoscaler: a pod pending with no free node gets a node after `provision_s` in a zone with capacity, up to
  the pool's maximum (flex-start waits while no zone has any); a node without our pods for `unneeded_s` is removed.
- Flex-start: at its termination time a node is deleted with whatever runs on it.
- The pod becomes Ready `startup_s` after it is scheduled (a warm start).
API validation the fake enforces, as the API server words it: an HPA's maxReplicas below its minReplicas
(k8s.io/kubernetes pkg/apis/autoscaling/validation: "must be greater than or equal to `minReplicas`").
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qs

from tests.fakes.httpfake import FakeServer, Request, Response
from tpuserve.gke_renewer import DELETION_COST, POOL_LABEL, ClusterError

TICK_S = 5.0
HPA_PERIOD_S = 15.0
SCALE_DOWN_PERIOD_S = 300.0
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)


def stamp(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def shown(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API returns: copies, without the fake's own bookkeeping (keys starting with _)."""
    return [{k: copy.deepcopy(v) for k, v in obj.items() if not k.startswith("_")} for obj in objects]


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """A JSON merge patch (RFC 7386), as `kubectl patch --type merge` sends it: null removes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else copy.deepcopy(value)


class FakeGke:
    def __init__(self, *, pool: str = "tpu-serve-gke-tpu", pool_max: int = 2, max_run_s: int = 4 * 3600,
                 zones: tuple[str, ...] = ("us-east5-a", "us-east5-b"), replicas: int = 1, hpa_max: int = 1,
                 startup_s: float = 300, provision_s: float = 180, unneeded_s: float = 600,
                 capacity: dict[str, int] | None = None, namespace: str = "tpu-serve", name: str = "vllm",
                 grace_s: int = 30, drain_s: float = 30):
        self.pool, self.pool_max, self.max_run_s, self.zones = pool, pool_max, max_run_s, zones
        self.startup_s, self.provision_s, self.unneeded_s = startup_s, provision_s, unneeded_s
        self.capacity = capacity  # zone -> nodes it can still give; None: any
        self.grace_s, self.drain_s = grace_s, drain_s
        self.namespace, self.name = namespace, name
        self.selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
        self.now = T0
        self.load_replicas = replicas  # what the HPA's metric asks for
        self.node_objs: dict[str, dict[str, Any]] = {}
        self.pod_objs: dict[str, dict[str, Any]] = {}
        self.deployment_obj = {"metadata": {"name": name, "namespace": namespace},
                               "spec": {"replicas": replicas, "selector": {"matchLabels": dict(self.selector)}}}
        self.hpa_obj: dict[str, Any] | None = {
            "metadata": {"name": name, "namespace": namespace, "annotations": {}},
            "spec": {"minReplicas": replicas, "maxReplicas": hpa_max,
                     "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}}}
        self.requests: list[datetime] = []  # node requests in flight: when each arrives
        self.empty_since: dict[str, datetime] = {}
        self.killed: list[str] = []  # pods that went down with their node
        self.deleted_nodes: list[tuple[str, str]] = []  # (node, why)
        self.calls: list[tuple[str, ...]] = []
        self.down_s = 0.0  # seconds without a Ready pod, once one had served
        self.served = False
        self._ids = itertools.count(1)
        self._last_hpa = self._last_scale_down = T0 - timedelta(hours=1)
        for _ in range(replicas):  # a cluster already serving: nodes up, pods Ready
            self.add_node(self.zones[0], created=T0)
        self.settle(0)

    # --- the API (tpuserve.ops.gke_renew.Cluster) -------------------------------------------------------------

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        return shown([n for n in self.node_objs.values()
                      if n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == pool])

    def pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return shown([p for p in self.pod_objs.values() if p["metadata"]["namespace"] == namespace and
                      all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())])

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.deployment_obj)

    def hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.hpa_obj)

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None) -> None:
        self.calls.append(("patch", kind, name))
        if kind == "node":
            merge(self.node_objs[name], patch)
        elif kind == "pod":
            merge(self.pod_objs[name], patch)
        elif kind == "horizontalpodautoscaler":
            updated = copy.deepcopy(self.hpa_obj)
            merge(updated, patch)
            if updated["spec"]["maxReplicas"] < updated["spec"]["minReplicas"]:
                raise ClusterError(f'HorizontalPodAutoscaler.autoscaling "{name}" is invalid: spec.maxReplicas: '
                                   f'Invalid value: {updated["spec"]["maxReplicas"]}: must be greater than or '
                                   "equal to `minReplicas`")
            self.hpa_obj = updated
            self._last_hpa = self.now - timedelta(seconds=HPA_PERIOD_S)  # the HPA controller reacts to a change
        else:
            raise ClusterError(f"the fake has no {kind}")

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.calls.append(("scale", name, str(replicas)))
        self.deployment_obj["spec"]["replicas"] = replicas

    # --- the clock --------------------------------------------------------------------------------------------

    def clock(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.settle(seconds)

    def settle(self, seconds: float) -> None:
        end = self.now + timedelta(seconds=seconds)
        self.step()
        while self.now < end:
            self.now = min(end, self.now + timedelta(seconds=TICK_S))
            self.step()

    # --- the controllers --------------------------------------------------------------------------------------

    def add_node(self, zone: str, created: datetime) -> str:
        name = f"gke-tpu-serve-gke-{self.pool.removeprefix('tpu-serve-gke-')}-4c1a9e2b-{next(self._ids):04x}"
        self.node_objs[name] = {
            "metadata": {"name": name, "creationTimestamp": stamp(created),
                         "labels": {"cloud.google.com/gke-nodepool": self.pool,
                                    "cloud.google.com/gke-flex-start": "true",
                                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                    "cloud.google.com/gke-tpu-topology": "1x1", "topology.kubernetes.io/zone": zone},
                         "annotations": {"node.gke.io/machine-termination-datetime":
                                         stamp(created + timedelta(seconds=self.max_run_s))}},
            "spec": {"taints": [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]}}
        return name

    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.pod_objs.values() if "deletionTimestamp" not in p["metadata"]]

    def ready(self) -> list[dict[str, Any]]:
        return [p for p in self.live() if p["status"]["conditions"][0]["status"] == "True"]

    def step(self) -> None:
        now = self.now
        for name, node in list(self.node_objs.items()):  # flex-start deletes a node at its max run
            at = datetime.fromisoformat(node["metadata"]["annotations"]["node.gke.io/machine-termination-datetime"]
                                        .replace("Z", "+00:00"))
            if now >= at:
                self.remove_node(name, "max run")
        for name, pod in list(self.pod_objs.items()):  # terminations end; readiness comes
            if "deletionTimestamp" in pod["metadata"]:
                if now >= datetime.fromisoformat(pod["metadata"]["deletionTimestamp"].replace("Z", "+00:00")) + \
                        timedelta(seconds=min(self.drain_s, pod["spec"]["terminationGracePeriodSeconds"])):
                    del self.pod_objs[name]
            elif pod["spec"].get("nodeName") and now >= pod["_scheduled"] + timedelta(seconds=self.startup_s):
                pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        if (now - self._last_hpa).total_seconds() >= HPA_PERIOD_S and self.hpa_obj is not None:
            self._last_hpa = now
            spec = self.hpa_obj["spec"]
            want = min(max(self.load_replicas, spec["minReplicas"]), spec["maxReplicas"])
            have = self.deployment_obj["spec"]["replicas"]
            if want > have:
                self.deployment_obj["spec"]["replicas"] = want
            elif want < have and (now - self._last_scale_down).total_seconds() >= SCALE_DOWN_PERIOD_S:
                self.deployment_obj["spec"]["replicas"] = have - 1
                self._last_scale_down = now
        self.replica_set()
        self.schedule()
        self.autoscale()
        if self.ready():
            self.served = True
        elif self.served:
            self.down_s += TICK_S

    def rank(self, pod: dict[str, Any]) -> tuple:
        node = pod["spec"].get("nodeName")
        ready = pod["status"]["conditions"][0]["status"] == "True"
        cost = int(pod["metadata"].get("annotations", {}).get(DELETION_COST, "0"))
        return (node is not None, pod["status"]["phase"] == "Running", ready, cost,
                -pod["_created"].timestamp())

    def replica_set(self) -> None:
        live = self.live()
        want = self.deployment_obj["spec"]["replicas"]
        for _ in range(want - len(live)):
            name = f"{self.name}-7d9f8c6b5-{next(self._ids):05x}"
            self.pod_objs[name] = {"metadata": {"name": name, "namespace": self.namespace,
                                            "labels": dict(self.selector), "creationTimestamp": stamp(self.now),
                                            "annotations": {}},
                               "spec": {"terminationGracePeriodSeconds": self.grace_s},
                               "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
                               "_created": self.now}
        for pod in sorted(live, key=self.rank)[:max(0, len(live) - want)]:
            pod["metadata"]["deletionTimestamp"] = stamp(self.now)
            pod["status"]["conditions"][0]["status"] = "False"

    def busy(self) -> set[str]:
        return {p["spec"]["nodeName"] for p in self.live() if p["spec"].get("nodeName")}

    def schedule(self) -> None:
        for pod in self.live():
            if pod["spec"].get("nodeName"):
                continue
            free = [n for n, node in self.node_objs.items() if not node["spec"].get("unschedulable") and
                    n not in self.busy()]
            if free:
                pod["spec"]["nodeName"], pod["_scheduled"] = sorted(free)[0], self.now

    def autoscale(self) -> None:
        now = self.now
        for at in [at for at in self.requests if now >= at]:
            zone = next((z for z in self.zones if self.capacity is None or self.capacity.get(z, 0) > 0), None)
            if zone is None:
                continue  # flex-start queues for capacity
            if self.capacity is not None:
                self.capacity[zone] -= 1
            self.requests.remove(at)
            self.add_node(zone, now)
        pending = [p for p in self.live() if not p["spec"].get("nodeName")]
        if len(pending) > len(self.requests) and len(self.node_objs) + len(self.requests) < self.pool_max:
            self.requests.append(now + timedelta(seconds=self.provision_s))
        busy = self.busy()
        for name in list(self.node_objs):
            if name in busy:
                self.empty_since.pop(name, None)
            elif (now - self.empty_since.setdefault(name, now)).total_seconds() >= self.unneeded_s:
                self.remove_node(name, "unneeded")

    def remove_node(self, name: str, why: str) -> None:
        for pod_name, pod in list(self.pod_objs.items()):
            if pod["spec"].get("nodeName") == name:
                if "deletionTimestamp" not in pod["metadata"]:
                    self.killed.append(pod_name)
                del self.pod_objs[pod_name]
        del self.node_objs[name]
        self.empty_since.pop(name, None)
        self.deleted_nodes.append((name, why))



# --- the same cluster behind a Kubernetes API server on 127.0.0.1 ---------------------------------------------------

SERVICE_ACCOUNT = "system:serviceaccount:tpu-serve:vllm-renewer"
CORE, APPS, AUTOSCALING = "", "apps", "autoscaling"


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """The API server's error body: a metav1.Status (k8s.io/apimachinery pkg/apis/meta/v1/types.go, "Status")."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, **({"details": details} if details else {}), "code": code}


@dataclass(frozen=True)
class Call:
    """A request as the API server's authorizer sees it (k8s.io/apiserver pkg/endpoints/request/requestinfo.go):
    GET of a collection is `list`, of one object `get`; PATCH is `patch`."""

    verb: str
    group: str
    resource: str  # with its subresource: deployments/scale
    namespace: str
    name: str


def request_call(method: str, path: str) -> Call | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = CORE, parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "PUT": "update", "DELETE": "delete",
            "POST": "create"}[method]
    return Call(verb, group, f"{resource}/{sub}" if sub else resource, namespace, name)


def allows(rules: list[dict[str, Any]], call: Call) -> bool:
    """Whether one of `rules` (a Role's or ClusterRole's) grants the call (kubernetes RBAC, rbac/v1 PolicyRule)."""
    for rule in rules:
        if call.group in rule.get("apiGroups", []) and call.resource in rule.get("resources", []) and \
                call.verb in rule.get("verbs", []) and (not rule.get("resourceNames") or
                                                        call.name in rule["resourceNames"]):
            return True
    return False


def forbidden(call: Call) -> dict[str, Any]:
    """In the API server's words: apiserver pkg/endpoints/handlers/responsewriters/errors.go `forbiddenMessage`,
    wrapped by apimachinery pkg/api/errors `NewForbidden` ("<resource>[.<group>] [\\"name\\"] is forbidden: ...")."""
    scope = f"in the namespace {json.dumps(call.namespace)}" if call.namespace else "at the cluster scope"
    why = (f"User {json.dumps(SERVICE_ACCOUNT)} cannot {call.verb} resource {json.dumps(call.resource)} in API group "
           f"{json.dumps(call.group)} {scope}")
    qualified = call.resource.split("/")[0] + (f".{call.group}" if call.group else "")
    return status(403, "Forbidden", f"{qualified}{f' {json.dumps(call.name)}' if call.name else ''} is forbidden: "
                                    f"{why}", name=call.name, group=call.group, kind=call.resource.split("/")[0])


class FakeApiServer:
    """`FakeGke` through the Kubernetes REST API, in its paths and JSON shapes (https://kubernetes.io/docs/reference/
    using-api/api-concepts/: lists as {"kind": "<Kind>List", "metadata": {"resourceVersion"}, "items"}, JSON merge
    patches as application/merge-patch+json, errors as a Status): bearer-token auth, and RBAC from the rules of the
    Roles bound to the caller, `grants` as (namespace, rules), namespace None for a ClusterRole. Each request moves
    the cluster's clock `tick_s` on (a renewer run in another process lives on the machine's clock). `calls` keeps
    what was asked, as the authorizer saw it."""

    def __init__(self, gke: FakeGke, token: str, grants: list[tuple[str | None, list[dict[str, Any]]]],
                 tick_s: float = 0.0):
        self.gke, self.token, self.grants, self.tick_s = gke, token, grants, tick_s
        self.calls: list[Call] = []
        self.denied: list[Call] = []
        self._lock = threading.Lock()
        self.server = FakeServer(fallback=self.handle)

    def __enter__(self) -> FakeApiServer:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.server.url

    def handle(self, request: Request) -> Response:
        with self._lock:
            if self.tick_s:
                self.gke.settle(self.tick_s)
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return Response(401, status(401, "Unauthorized", "Unauthorized"))
            call = request_call(request.method, request.path)
            if call is None:
                return Response(404, status(404, "NotFound", "the server could not find the requested resource"))
            if not any((namespace is None or namespace == call.namespace) and allows(rules, call)
                       for namespace, rules in self.grants):
                self.denied.append(call)
                return Response(403, forbidden(call))
            self.calls.append(call)
            if call.verb == "patch" and request.headers.get("Content-Type") != "application/merge-patch+json":
                return Response(415, status(415, "UnsupportedMediaType", "the body of the request was in an "
                                            f"unknown format - accepted media types include: "
                                            "application/json-patch+json, application/merge-patch+json, "
                                            "application/apply-patch+yaml"))
            try:
                return Response(200, self.answer(call, parse_qs(request.query), request))
            except KeyError:
                qualified = call.resource.split("/")[0] + (f".{call.group}" if call.group else "")
                return Response(404, status(404, "NotFound", f'{qualified} "{call.name}" not found',
                                            name=call.name, group=call.group, kind=call.resource))
            except ClusterError as err:  # the fake's validation, in the API server's words
                return Response(422, status(422, "Invalid", str(err)))

    def answer(self, call: Call, query: dict[str, list[str]], request: Request) -> dict[str, Any]:
        gke = self.gke
        selector = dict(pair.split("=", 1) for pair in query.get("labelSelector", [""])[0].split(",") if pair)
        listed = {"kind": "", "apiVersion": "v1", "metadata": {"resourceVersion": str(len(self.calls))}}
        if (call.verb, call.group, call.resource) == ("list", CORE, "nodes"):
            return {**listed, "kind": "NodeList", "items": gke.nodes(selector.get(POOL_LABEL, ""))}
        if (call.verb, call.group, call.resource) == ("list", CORE, "pods"):
            return {**listed, "kind": "PodList", "items": gke.pods(call.namespace, selector)}
        if call.resource == "deployments" and call.verb == "get":
            if call.name != gke.name:
                raise KeyError(call.name)
            return {"kind": "Deployment", "apiVersion": "apps/v1", **gke.deployment(call.namespace, call.name)}
        if call.resource == "deployments/scale" and call.verb == "patch":
            gke.scale(call.namespace, call.name, int(request.json()["spec"]["replicas"]))
            replicas = gke.deployment_obj["spec"]["replicas"]
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {"name": call.name, "namespace": call.namespace},
                    "spec": {"replicas": replicas}, "status": {"replicas": len(gke.live()), "selector": ",".join(
                        f"{k}={v}" for k, v in sorted(gke.selector.items()))}}
        if call.resource == "horizontalpodautoscalers" and call.verb in ("get", "patch"):
            if gke.hpa_obj is None or call.name != gke.name:
                raise KeyError(call.name)
            if call.verb == "patch":
                gke.patch("horizontalpodautoscaler", call.name, request.json(), call.namespace)
            return {"kind": "HorizontalPodAutoscaler", "apiVersion": "autoscaling/v2", **gke.hpa(call.namespace,
                                                                                                  call.name)}
        if call.verb == "patch" and (call.group, call.resource) in ((CORE, "nodes"), (CORE, "pods")):
            kind = call.resource[:-1]
            objects = gke.node_objs if kind == "node" else gke.pod_objs
            if call.name not in objects:
                raise KeyError(call.name)
            gke.patch(kind, call.name, request.json(), call.namespace or None)
            return shown([objects[call.name]])[0]
        raise KeyError(call.name)
