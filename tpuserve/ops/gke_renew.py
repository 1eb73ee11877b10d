"""`tpuserve gke renew` and `gke status`: replace each replica's flex-start node before GKE deletes it, pod first.

A flex-start node is deleted at the end of its max run (maxRunDuration), and its replica with it. The Deployment
then recreates the pod, which waits for a new node and boots: minutes without that replica, and without the endpoint
when it is the only one. `gke renew` replaces it first, with the cluster's own parts: for each node that serves a replica and is deleted within `--lead`, closest deletion first, one at a time,

1. cordon the node (nothing new lands there; its pod keeps serving);
2. raise the HPA's minReplicas (and maxReplicas, at its maximum) by one, so the HPA scales the Deployment up and
   holds it there (scaling the Deployment alone, the HPA would scale it back and delete the unready newcomer first);
   the HPA's own values are kept in its `tpu-serve/renewal` annotation, so a run that dies midway is resumed, or
   undone, by the next;
3. wait until the new pod is Ready on another node: the cluster autoscaler adds one (the pool's surge node,
   gkeSurgeNode) and the pod boots from the bucket's caches;
4. mark the old pod as the one to go (`controller.kubernetes.io/pod-deletion-cost`, which the ReplicaSet controller
   weighs before a pod's age when it scales down: https://kubernetes.io/docs/reference/labels-annotations-taints/
   #pod-deletion-cost), put the HPA back and scale the Deployment back by one: the old pod is deleted, not evicted
   (with the surge node the PodDisruptionBudget allows no eviction of a serving pod), and leaves the Service's
   endpoints as its successor already serves;
5. leave the node cordoned and empty of replicas for the cluster autoscaler to remove (an unneeded node goes after
   10 minutes by default: https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-autoscaler).

Without a node for the successor before `--timeout` (flex-start capacity, or a pool at its maximum): the HPA is put
back, the unready successor removed, the node uncordoned, and the old replica serves until its deletion; exit 3.

The deletion time is the node's `node.gke.io/machine-termination-datetime` annotation (RFC 3339), which GKE sets
on nodes with a max run and its cluster autoscaler reads for its own recycling (GoogleCloudPlatform/cluster-autoscaler
pkg/cloudprovider/gke/labels/system_labels.go `InstanceTerminationAnnotationKey`, commit 7d25050); a node without it
is taken to end at its creation plus the stack's maxRunSeconds.

Why not GKE's node recycling (a ComputeClass with `flexStart.nodeRecycling.leadTimeSeconds`, in the ComputeClass
reference: https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass)? The cluster autoscaler's
recycling (pkg/defrag/plugins/recycling/recycling.go, same commit) does support TPU v6e (its integration test
recycles tpu-v6e-slice nodes), but it acts on nodes whose pool it created itself from the ComputeClass (node pool
auto-creation: only then does the pool carry the `cloud.google.com/gke-node-recycle-lead-time-seconds` label it
reads, pkg/autoprovisioning/injection.go), not on this stack's declared pool; and it replaces the node, then drains
the old one (the scale-down actuator), so the pod is recreated only after the eviction and the replica is gone for
a whole pod start: with one replica, the endpoint. Here the successor serves before the old pod goes.

Exit codes: 0 done (or nothing due); 1 an error; 3 a node kept, no successor found in time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import click

from tpuserve.cli import DURATION, echo_json
from tpuserve.durations import human
from tpuserve.ops.up import EXIT_FAILED, EXIT_NO_CAPACITY, EXIT_OK

TERMINATION_ANNOTATION = "node.gke.io/machine-termination-datetime"
POOL_LABEL = "cloud.google.com/gke-nodepool"
ZONE_LABEL = "topology.kubernetes.io/zone"
RENEWAL_ANNOTATION = "tpu-serve/renewal"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FIRST_TO_GO = "-1000"
DEFAULT_LEAD = "45m"  # a flex-start node's wait plus a warm start, with room
# A successor may wait for flex-start capacity: as long as `pulumi up` waits for one (components/k8s_serving.py
# CAPACITY_WAIT_S), plus a warm start.
DEFAULT_TIMEOUT = "70m"
POLL_S = 15.0
GONE_TIMEOUT_S = 300.0  # the old pod's termination: its grace period (60 s) with room


class ClusterError(RuntimeError):
    """A call to the cluster failed; the message says which and why."""


class Cluster(Protocol):
    """What a renewal reads and changes, as the Kubernetes API's JSON objects; merge patches."""

    def nodes(self, pool: str) -> list[dict[str, Any]]: ...
    def pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]: ...
    def deployment(self, namespace: str, name: str) -> dict[str, Any]: ...
    def hpa(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None) -> None: ...
    def scale(self, namespace: str, name: str, replicas: int) -> None: ...


def parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone(timezone.utc) if text else None
    except ValueError:
        return None


def node_expiry(node: Mapping[str, Any], max_run_s: int) -> datetime | None:
    meta = node.get("metadata", {})
    at = parse_time((meta.get("annotations") or {}).get(TERMINATION_ANNOTATION))
    if at is None and max_run_s:
        created = parse_time(meta.get("creationTimestamp"))
        at = created + timedelta(seconds=max_run_s) if created else None
    return at


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
    """One stack's renewals; every outside effect goes through `cluster` and the clock, so tests drive it with a
    fake cluster on a fake clock."""

    cluster: Cluster
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

    def selector(self) -> dict[str, str]:
        return dict(self.cluster.deployment(self.namespace, self.deployment)["spec"]["selector"]["matchLabels"])

    def look(self) -> list[NodeView]:
        pods = live(self.cluster.pods(self.namespace, self.selector()))
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
        """'' when the pool can take a successor's node, else why not. A cordoned node without replicas counts as
        leaving: the autoscaler removes it, and the successor's node takes its place (the successor waits)."""
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
                 "before": sorted(pod_name(p) for p in live(self.cluster.pods(self.namespace, self.selector()))),
                 "started": self.now().isoformat()}
        self.cordon(node.name, True)
        self.set_floor(state, target, max(high, target))
        self.event("cordoned", node.name, f"successor asked for: {target} replicas until it serves")
        return state

    def successor(self, state: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for pod in self.cluster.pods(self.namespace, self.selector()):
            if pod_name(pod) not in state["before"] and is_ready(pod) and node_of(pod) != state["node"]:
                return pod
        return None

    def finish(self, state: Mapping[str, Any], replaced: bool) -> None:
        """The HPA back to its own bounds and the Deployment back to the replicas it had. With `replaced` the old
        node's pods are marked to go first; without, the ReplicaSet removes the unready successor first anyway (it
        ranks a pod that is not ready below one that is). Left alone if something else changed the replicas
        meanwhile (the HPA itself, by load): the marked pods still go first."""
        if replaced:
            for pod in live(self.cluster.pods(self.namespace, self.selector())):
                if node_of(pod) == state["node"]:
                    self.cluster.patch("pod", pod_name(pod), {"metadata": {"annotations": {
                        DELETION_COST: FIRST_TO_GO}}}, self.namespace)
        self.set_floor(None, int(state["minReplicas"]), int(state["maxReplicas"]))
        if self.replicas() == int(state["target"]):
            self.cluster.scale(self.namespace, self.deployment, int(state["target"]) - 1)

    def wait_gone(self, state: Mapping[str, Any]) -> bool:
        deadline = self.now() + timedelta(seconds=GONE_TIMEOUT_S)
        while self.now() < deadline:
            if not [p for p in self.cluster.pods(self.namespace, self.selector()) if node_of(p) == state["node"]]:
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
        started = parse_time(state.get("started")) or self.now()
        deadline = started + timedelta(seconds=timeout_s)
        while True:
            pod = self.successor(state)
            if pod is not None:
                break
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
        """A renewal a previous run left midway (the HPA's annotation): carry it on, or undo it if its node is
        gone."""
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
            return EXIT_NO_CAPACITY, {"renewed": [], "kept": results}
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
        return (EXIT_NO_CAPACITY if kept else EXIT_OK), {"renewed": renewed, "kept": kept}


class KubectlCluster:
    """The Cluster through `kubectl` with a stack's credentials (tpuserve.deploy.stack.gke_credentials)."""

    def __init__(self, env: Mapping[str, str], kubectl: str | None = None, timeout_s: float = 120.0):
        self.env, self.timeout_s = dict(env), timeout_s
        self.kubectl = kubectl or self.env.get("KUBECTL") or shutil.which("kubectl") or "kubectl"

    def run(self, *args: str) -> str:
        done = subprocess.run([self.kubectl, *args], env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=self.timeout_s, check=False)
        if done.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} exited with {done.returncode}: "
                               f"{' '.join(done.stderr.split())[-400:]}")
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run("get", *args, "--output", "json"))

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        return self.get("nodes", "--selector", f"{POOL_LABEL}={pool}")["items"]

    def pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        labels = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        return self.get("pods", "--namespace", namespace, "--selector", labels)["items"]

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get("deployment", name, "--namespace", namespace)

    def hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.get("horizontalpodautoscaler", "--namespace", namespace, "--field-selector",
                         f"metadata.name={name}")["items"]
        return found[0] if found else None

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None) -> None:
        self.run("patch", kind, name, *(("--namespace", namespace) if namespace else ()), "--type", "merge",
                 "--patch", json.dumps(patch, separators=(",", ":")))

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.run("scale", f"deployment/{name}", "--namespace", namespace, f"--replicas={replicas}")


def renewer_for(outputs: Mapping[str, Any], cluster: Cluster, say: Callable[[str], None]) -> Renewer:
    missing = [key for key in ("namespace", "deployment", "nodePool", "nodePoolMaxNodes") if not outputs.get(key)]
    if outputs.get("target") != "gke" or missing:
        raise click.UsageError(f"--stack: not a gke stack deployed by this version (target {outputs.get('target')!r}"
                               + (f", no output {', '.join(missing)}" if missing else "") + "): run `pulumi up` on "
                               "it first")
    return Renewer(cluster, str(outputs["namespace"]), str(outputs["deployment"]), str(outputs["nodePool"]),
                   int(outputs["nodePoolMaxNodes"]), int(outputs.get("maxRunSeconds") or 0), say=say)


def open_cluster(outputs: Mapping[str, Any]):  # pragma: no cover - the credentials' context is tested in test_stack_gke
    from tpuserve.deploy.stack import gke_credentials

    return gke_credentials(outputs)


def run_command(stack: str, cwd: Path, as_json: bool, action: Callable[[Renewer], tuple[int, dict[str, Any]]]) -> None:
    from rich.console import Console

    from tpuserve.deploy.stack import stack_outputs

    console = Console(stderr=as_json)
    outputs = stack_outputs(stack, cwd)
    with open_cluster(outputs) as env:
        renewer = renewer_for(outputs, KubectlCluster(env), lambda line: console.print(line, markup=False,
                                                                                       highlight=False))
        try:
            code, summary = action(renewer)
        except ClusterError as err:
            console.print(f"Error: {err}", markup=False, highlight=False)
            code, summary = EXIT_FAILED, {"reason": str(err)}
    if as_json:
        echo_json({"ok": code == EXIT_OK, "stack": stack, "exit": code, **summary, "events": renewer.events})
    raise SystemExit(code)


STACK_OPTION = click.option("--stack", required=True, help="The gke stack.")
CWD_OPTION = click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
                          show_default=True, help="The Pulumi project directory.")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="End with one JSON line.")


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """--stack, --cwd and --json, in that order in --help."""
    return STACK_OPTION(CWD_OPTION(JSON_OPTION(command)))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def gke() -> None:
    """A gke stack's TPU nodes: renew each replica's node before flex-start deletes it; status."""


@gke.command("renew")
@common
@click.option("--node", "only", help="Renew this node now, whatever its deletion time (instead of `kubectl drain`, "
              "which the budget blocks while it serves).")
@click.option("--lead", "lead_s", type=DURATION, default=DEFAULT_LEAD, show_default=True,
              help="Renew a node whose flex-start deletion is less than this far away.")
@click.option("--timeout", "timeout_s", type=DURATION, default=DEFAULT_TIMEOUT, show_default=True,
              help="Give up waiting for a successor to serve after this long (it may wait for capacity).")
def gke_renew(stack: str, cwd: Path, as_json: bool, lead_s: int, timeout_s: int, only: str | None) -> None:
    """Replace each replica whose node flex-start deletes within --lead: successor first, then the old pod;
    without a successor in time the old one serves on (exit 3). Run it every 15 minutes."""
    run_command(stack, cwd, as_json, lambda renewer: renewer.renew(timedelta(seconds=lead_s), timeout_s, only))


@gke.command("status")
@common
def gke_status(stack: str, cwd: Path, as_json: bool) -> None:
    """The TPU nodes: zone, when flex-start deletes each, cordoned or not, the replicas on it."""

    def show(renewer: Renewer) -> tuple[int, dict[str, Any]]:
        now = renewer.now()
        views = renewer.look()
        hpa = renewer.hpa() or {}
        renewal = (hpa.get("metadata", {}).get("annotations") or {}).get(RENEWAL_ANNOTATION)
        for view in views:
            left = f"in {human((view.expiry - now).total_seconds())}" if view.expiry else "unknown"
            renewer.say(f"{view.name} {view.zone or '-'}: deleted {left}"
                        f"{', cordoned' if view.cordoned else ''}; replicas {', '.join(view.pods) or 'none'}"
                        f" ({len(view.ready)} ready)")
        if renewal:
            renewer.say(f"renewal in progress: {json.loads(renewal)['node']}")
        if not views:
            renewer.say(f"no node in pool {renewer.pool} (the pool scaled to zero)")
        return EXIT_OK, {"nodes": [v.as_dict(now) for v in views],
                         "renewal": json.loads(renewal) if renewal else None}

    run_command(stack, cwd, as_json, show)
