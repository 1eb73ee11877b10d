"""Renew each replica's flex-start GKE node before GKE deletes it, successor pod first (docs/design/gke-renewal.md).
The CronJob runs it from a ConfigMap (so: standard library, durations and exits only); `tpuserve gke renew` through
kubectl. Exit codes: 0 done, 1 an error, 3 a node kept."""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import tpuserve.exits as exits
from tpuserve.durations import human, parse, timestamp

TERMINATION_ANNOTATION = "node.gke.io/machine-termination-datetime"
POOL_LABEL = "cloud.google.com/gke-nodepool"
ZONE_LABEL = "topology.kubernetes.io/zone"
RENEWAL_ANNOTATION = "tpu-serve/renewal"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FIRST_TO_GO = "-1000"
DEFAULT_LEAD = "45m"  # a flex-start node's wait plus a warm start, with room
DEFAULT_TIMEOUT = "70m"  # components/k8s_serving.py CAPACITY_WAIT_S for flex-start capacity, plus a warm start
POLL_S = 15.0
DEFAULT_GRACE_S = 30  # Kubernetes' terminationGracePeriodSeconds when a pod sets none
GONE_MARGIN_S = 60.0  # past the old pod's grace period, before reporting it as still terminating


class ClusterError(RuntimeError):
    """A call to the cluster failed; the message says which and why."""


def node_expiry(node: Mapping[str, Any], max_run_s: int) -> datetime | None:
    meta = node.get("metadata", {})
    at = timestamp((meta.get("annotations") or {}).get(TERMINATION_ANNOTATION))
    if at is None and max_run_s:
        created = timestamp(meta.get("creationTimestamp"))
        at = created + timedelta(seconds=max_run_s) if created else None
    return at.astimezone(timezone.utc) if at else None


def is_ready(pod: Mapping[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def live(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]


def pod_name(pod: Mapping[str, Any]) -> str:
    return pod["metadata"]["name"]


def node_of(pod: Mapping[str, Any]) -> str | None:
    return pod.get("spec", {}).get("nodeName")


@dataclass
class NodeView:
    name: str
    zone: str
    expiry: datetime | None
    cordoned: bool
    pods: list[str]  # this deployment's live pods on it
    ready: list[str]

    def as_dict(self, now: datetime) -> dict[str, Any]:
        return {"node": self.name, "zone": self.zone, "expiry": self.expiry.isoformat() if self.expiry else None,
                "secondsToExpiry": int((self.expiry - now).total_seconds()) if self.expiry else None,
                "cordoned": self.cordoned, "pods": self.pods, "ready": self.ready}


@dataclass
class Renewer:
    """One stack's renewals; every outside effect goes through `cluster` and the clock (a fake of each in tests)."""

    cluster: ApiCluster
    namespace: str
    deployment: str
    pool: str
    pool_max: int
    max_run_s: int
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = lambda line: None
    poll_s: float = POLL_S
    events: list[dict[str, Any]] = field(default_factory=list)

    def event(self, what: str, node: str, detail: str = "") -> None:
        self.events.append({"event": what, "node": node, **({"detail": detail} if detail else {})})
        self.say(f"{node}: {what}{f' ({detail})' if detail else ''}")

    # --- what there is -----------------------------------------------------------------------------------------

    def pods(self, on: str | None = None) -> list[Mapping[str, Any]]:
        """The deployment's pods (on node `on`)."""
        selector = self.cluster.deployment(self.namespace, self.deployment)["spec"]["selector"]["matchLabels"]
        return [p for p in self.cluster.pods(self.namespace, selector) if on is None or node_of(p) == on]

    def look(self) -> list[NodeView]:
        pods = live(self.pods())
        views = []
        for node in self.cluster.nodes(self.pool):
            name = node["metadata"]["name"]
            here = [p for p in pods if node_of(p) == name]
            views.append(NodeView(name, (node["metadata"].get("labels") or {}).get(ZONE_LABEL, ""),
                                  node_expiry(node, self.max_run_s), bool(node.get("spec", {}).get("unschedulable")),
                                  [pod_name(p) for p in here], [pod_name(p) for p in here if is_ready(p)]))
        return sorted(views, key=lambda v: v.expiry or datetime.max.replace(tzinfo=timezone.utc))

    def due(self, lead: timedelta, only: str | None = None) -> list[NodeView]:
        now = self.now()
        return [v for v in self.look() if v.pods and (v.name == only if only else
                                                      v.expiry is not None and v.expiry - now < lead)]

    # --- the steps ---------------------------------------------------------------------------------------------

    def hpa(self) -> dict[str, Any] | None:
        return self.cluster.hpa(self.namespace, self.deployment)

    def replicas(self) -> int:
        return int(self.cluster.deployment(self.namespace, self.deployment)["spec"].get("replicas") or 0)

    def set_floor(self, state: Mapping[str, Any] | None, low: int, high: int) -> None:
        """The HPA's bounds, with the renewal's state (None: the renewal is over)."""
        self.cluster.patch("horizontalpodautoscaler", self.deployment, {
            "metadata": {"annotations": {RENEWAL_ANNOTATION: json.dumps(state, sort_keys=True) if state else None}},
            "spec": {"minReplicas": low, "maxReplicas": high}}, self.namespace)

    def cordon(self, node: str, on: bool) -> None:
        self.cluster.patch("node", node, {"spec": {"unschedulable": True if on else None}})

    def room(self, node: NodeView) -> str:
        """'' when the pool can take a successor's node, else why not (docs/design/core.md#the-gke-renewers-edges)."""
        staying = [v for v in self.look() if v.pods or not v.cordoned]
        if len(staying) < self.pool_max or [v for v in staying if not v.pods]:
            return ""
        return (f"the node pool is at its maximum ({self.pool_max} nodes, every one busy): a successor has no node "
                "to start on; keep gkeSurgeNode true, or run one replica fewer than gkeMaxNodes")

    def start(self, node: NodeView) -> dict[str, Any]:
        hpa = self.hpa()
        if hpa is None:
            raise ClusterError(f"deployment {self.deployment} has no HorizontalPodAutoscaler (parked, gkeMinReplicas "
                               "0?): nothing to renew it with")
        spec = hpa["spec"]
        low, high = int(spec.get("minReplicas") or 1), int(spec["maxReplicas"])
        target = self.replicas() + 1
        state = {"node": node.name, "minReplicas": low, "maxReplicas": high, "target": target,
                 "before": sorted(pod_name(p) for p in live(self.pods())),
                 "started": self.now().isoformat()}
        self.cordon(node.name, True)
        self.set_floor(state, target, max(high, target))
        self.event("cordoned", node.name, f"successor asked for: {target} replicas until it serves")
        return state

    def successor(self, state: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for pod in self.pods():
            if pod_name(pod) not in state["before"] and is_ready(pod) and node_of(pod) != state["node"]:
                return pod
        return None

    def finish(self, state: Mapping[str, Any], replaced: bool) -> None:
        """The HPA back to its bounds, replicas back unless the HPA moved them; `replaced`: old node's pods go first."""
        if replaced:
            for pod in live(self.pods(state["node"])):
                self.cluster.patch("pod", pod_name(pod), {"metadata": {"annotations": {DELETION_COST: FIRST_TO_GO}}},
                                   self.namespace)
        self.set_floor(None, int(state["minReplicas"]), int(state["maxReplicas"]))
        if self.replicas() == int(state["target"]):
            self.cluster.scale(self.namespace, self.deployment, int(state["target"]) - 1)

    def wait_gone(self, state: Mapping[str, Any]) -> bool:
        """Until the old node's pods are gone: each finishes its requests within its own grace period."""
        grace = max((DEFAULT_GRACE_S if (value := p.get("spec", {}).get("terminationGracePeriodSeconds")) is None
                     else int(value) for p in self.pods(state["node"])), default=0)
        deadline = self.now() + timedelta(seconds=grace + GONE_MARGIN_S)
        while self.now() < deadline:
            if not self.pods(state["node"]):
                return True
            self.sleep(self.poll_s)
        return False

    def replace(self, node: NodeView, timeout_s: float, state: dict[str, Any] | None = None) -> tuple[bool, str]:
        """Renew one node: (True, successor) or (False, why it was kept)."""
        if state is None:
            why = self.room(node)
            if why:
                return False, why
            state = self.start(node)
        deadline = (timestamp(state.get("started")) or self.now()) + timedelta(seconds=timeout_s)
        while (pod := self.successor(state)) is None:
            if self.now() >= deadline:
                self.finish(state, replaced=False)
                if node.name in {v.name for v in self.look()}:
                    self.cordon(node.name, False)
                why = f"no successor served within {human(timeout_s)} (no flex-start capacity?)"
                self.event("kept", node.name, why)
                return False, why
            self.sleep(self.poll_s)
        self.event("successor ready", node.name, f"{pod_name(pod)} on {node_of(pod)}")
        self.finish(state, replaced=True)
        gone = self.wait_gone(state)
        self.event("renewed" if gone else "renewed; old pod still terminating", node.name,
                   "cordoned and empty of replicas: the cluster autoscaler removes it")
        return True, pod_name(pod)

    def resume(self, timeout_s: float) -> list[dict[str, Any]]:
        """Carry on a renewal a previous run left midway (the HPA's annotation), or undo it if its node is gone."""
        hpa = self.hpa()
        raw = ((hpa or {}).get("metadata", {}).get("annotations") or {}).get(RENEWAL_ANNOTATION)
        if not raw:
            return []
        state = json.loads(raw)
        views = {v.name: v for v in self.look()}
        if state["node"] not in views:
            self.finish(state, replaced=False)
            self.event("renewal undone", state["node"], "the node is gone: it was deleted meanwhile")
            return []
        self.say(f"{state['node']}: resuming the renewal a previous run started at {state['started']}")
        ok, detail = self.replace(views[state["node"]], timeout_s, state)
        return [{"node": state["node"], "ok": ok, "detail": detail}]

    def renew(self, lead: timedelta, timeout_s: float, only: str | None = None) -> tuple[int, dict[str, Any]]:
        results = self.resume(timeout_s)
        if any(not r["ok"] for r in results):
            return exits.NO_CAPACITY, {"renewed": [], "kept": results}
        renewed, kept = [r for r in results if r["ok"]], []
        now = self.now()
        for idle in self.look():  # an empty node about to go must not take a successor
            if not idle.pods and not idle.cordoned and idle.expiry is not None and idle.expiry - now < lead:
                self.cordon(idle.name, True)
                self.event("cordoned", idle.name, "empty, and deleted within the lead: no successor goes there")
        due = self.due(lead, only)
        if only and not due:
            raise ClusterError(f"--node {only}: not a node of pool {self.pool} serving a replica of "
                               f"{self.deployment}")
        if not due and not renewed:
            soonest = next((v for v in self.look() if v.pods and v.expiry), None)
            self.say("nothing to renew" + (f": the next deletion is {soonest.name}'s at {soonest.expiry:%H:%M} UTC "
                                           f"(in {human((soonest.expiry - now).total_seconds())})" if soonest else ""))
        for node in due:
            if node.name in {r["node"] for r in renewed}:
                continue
            left = (f"deleted at {node.expiry:%H:%M} UTC, in {human((node.expiry - now).total_seconds())}"
                    if node.expiry else "")
            self.say(f"{node.name} ({node.zone}) is {left or 'asked for'}: renewing its replica")
            ok, detail = self.replace(node, timeout_s)
            (renewed if ok else kept).append({"node": node.name, "zone": node.zone, "ok": ok, "detail": detail,
                                              "expiry": node.expiry.isoformat() if node.expiry else None})
            if not ok:
                break  # the next node would wait for the same capacity
        return (exits.NO_CAPACITY if kept else exits.OK), {"renewed": renewed, "kept": kept}


# --- the Kubernetes API as a pod's service account: kubernetes.io/docs/tasks/run-application/access-api-from-pod/ ---

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MERGE_PATCH = "application/merge-patch+json"  # RFC 7386, what `kubectl patch --type merge` sends
HPA_PATH = "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}"
OBJECT_PATHS = {"node": "/api/v1/nodes/{name}", "pod": "/api/v1/namespaces/{namespace}/pods/{name}",
                "horizontalpodautoscaler": HPA_PATH}


def in_cluster_server(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ClusterError("KUBERNETES_SERVICE_HOST is not set: not in a pod; give --api-server")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class ApiCluster:
    """What a renewal reads and changes, through the API server's REST API as its JSON objects (merge patches); the
    token is read at every call (the kubelet rotates it)."""

    def __init__(self, server: str, token_file: str = f"{SERVICE_ACCOUNT_DIR}/token",
                 ca_file: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt", timeout_s: float = 30.0):
        self.server, self.token_file, self.timeout_s = server.rstrip("/"), token_file, timeout_s
        self.context = ssl.create_default_context(cafile=ca_file) if server.startswith("https:") else None

    def call(self, method: str, path: str, query: Mapping[str, str] | None = None,
             body: Mapping[str, Any] | None = None, missing_ok: bool = False) -> dict[str, Any] | None:
        url = self.server + urllib.parse.quote(path) + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if self.token_file:  # none through `kubectl proxy`, which authenticates itself
            try:
                with open(self.token_file, encoding="utf-8") as handle:
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
            except OSError as err:
                raise ClusterError(f"cannot read the service account token {self.token_file}: {err}") from err
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body, separators=(",", ":")).encode(), MERGE_PATCH
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:  # noqa: S310
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            if err.code == 404 and missing_ok:
                return None
            try:  # the API server's Status object ({"kind": "Status", "reason": ..., "message": ...}) in one line
                status = json.loads(err.read() or b"{}")
            except ValueError:
                status = {}
            words = " ".join(str(status.get(key) or "") for key in ("reason", "message")).strip()
            raise ClusterError(f"{method} {path}: HTTP {err.code} {' '.join((words or str(err.reason)).split())[:400]}"
                               ) from err
        except (OSError, ValueError) as err:
            raise ClusterError(f"{method} {path}: {getattr(err, 'reason', err)}") from err

    def get(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.call("GET", path, **kwargs) or {}

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/nodes", query={"labelSelector": f"{POOL_LABEL}={pool}"}).get("items") or []

    def pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        labels = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        return self.get(f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": labels}).get("items") or []

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")

    def hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.call("GET", HPA_PATH.format(namespace=namespace, name=name), missing_ok=True)

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None) -> None:
        if kind not in OBJECT_PATHS:
            raise ClusterError(f"no API path for a {kind}")
        self.call("PATCH", OBJECT_PATHS[kind].format(namespace=namespace, name=name), body=patch)

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        # The scale subresource, as `kubectl scale` uses it: the only field of the Deployment it may change.
        self.call("PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale",
                  body={"spec": {"replicas": replicas}})


def duration(text: str) -> int:
    try:
        return parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tpuserve.gke_renewer", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--pool", required=True, help="The TPU node pool.")
    parser.add_argument("--pool-max-nodes", type=int, required=True)
    parser.add_argument("--max-run-seconds", type=int, default=0, help="For nodes without GKE's annotation.")
    parser.add_argument("--lead", type=duration, default=DEFAULT_LEAD)
    parser.add_argument("--timeout", type=duration, default=DEFAULT_TIMEOUT)
    parser.add_argument("--node", help="Renew this node now, whatever its deletion time.")
    parser.add_argument("--poll-seconds", type=float, default=POLL_S)
    parser.add_argument("--api-server", help="Default: the pod's in-cluster API server.")
    parser.add_argument("--token-file", default=f"{SERVICE_ACCOUNT_DIR}/token")
    parser.add_argument("--ca-file", default=f"{SERVICE_ACCOUNT_DIR}/ca.crt")
    args = parser.parse_args(argv)
    renewer: Renewer | None = None
    try:
        cluster = ApiCluster(args.api_server or in_cluster_server(os.environ if env is None else env),
                             args.token_file, args.ca_file)
        renewer = Renewer(cluster, args.namespace, args.deployment, args.pool, args.pool_max_nodes,
                          args.max_run_seconds, say=lambda line: print(line, flush=True), poll_s=args.poll_seconds)
        code, summary = renewer.renew(timedelta(seconds=args.lead), args.timeout, args.node)
    except (ClusterError, ssl.SSLError, OSError) as err:
        print(f"Error: {err}", flush=True)
        code, summary = exits.FAILED, {"reason": str(err)}
    print(json.dumps({"ok": code == exits.OK, "exit": code, **summary,
                      "events": renewer.events if renewer else []}, separators=(",", ":")), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
