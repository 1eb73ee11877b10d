"""`tpuserve gke renew` against a fake GKE on a virtual clock (tests/gke_fakes.py: nodes with the labels and the
termination annotation GKE sets, the HPA, ReplicaSet, scheduler, cluster autoscaler and flex-start expiry as
controllers): the replica is replaced before its node is deleted, the endpoint stays up across max runs, and a renewal without capacity leaves the cluster as it found it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.gke_fakes import T0, FakeGke
from tests.test_stack_resolution import write_executable
from tpuserve.ops import gke_renew
from tpuserve.ops.gke_renew import RENEWAL_ANNOTATION, KubectlCluster, Renewer, node_expiry

LEAD = timedelta(minutes=45)
TIMEOUT_S = 70 * 60.0
MAX_RUN_S = 4 * 3600
POOL = "tpu-serve-gke-tpu"


def renewer(gke: FakeGke, pool_max: int | None = None) -> tuple[Renewer, list[str]]:
    said: list[str] = []
    return Renewer(gke, "tpu-serve", "vllm", POOL, pool_max or gke.pool_max, MAX_RUN_S, now=gke.clock,
                   sleep=gke.sleep, say=said.append), said


def serving(gke: FakeGke) -> FakeGke:
    gke.settle(600)
    assert len(gke.ready()) == gke.deployment_obj["spec"]["replicas"] and gke.served
    return gke


def node_of_pod(gke: FakeGke, pod: str) -> str:
    return gke.pod_objs[pod]["spec"]["nodeName"]


def test_the_replica_is_replaced_before_its_node_is_deleted() -> None:
    gke = serving(FakeGke())
    (old_node,) = gke.node_objs
    (old_pod,) = [p["metadata"]["name"] for p in gke.ready()]
    gke.settle(3 * 3600 + 10 * 60 - 600)  # 50 min before the max run: not yet due
    run, said = renewer(gke)
    assert run.renew(LEAD, TIMEOUT_S) == (0, {"renewed": [], "kept": []})
    assert said == [f"nothing to renew: the next deletion is {old_node}'s at 12:00 UTC (in 50 min)"]
    gke.settle(10 * 60)
    code, summary = run.renew(LEAD, TIMEOUT_S)
    assert code == 0
    (successor,) = [p["metadata"]["name"] for p in gke.ready()]
    assert summary["renewed"] == [{"node": old_node, "zone": "us-east5-a", "ok": True, "detail": successor,
                                   "expiry": "2026-12-01T12:00:00+00:00"}]
    assert [e["event"] for e in run.events] == ["cordoned", "successor ready", "renewed"]
    assert node_of_pod(gke, successor) != old_node and old_pod not in gke.pod_objs
    assert gke.node_objs[old_node]["spec"]["unschedulable"] is True
    # the HPA and the Deployment as they were, nothing left of the renewal
    assert gke.hpa_obj["spec"]["minReplicas"] == gke.hpa_obj["spec"]["maxReplicas"] == 1
    assert RENEWAL_ANNOTATION not in gke.hpa_obj["metadata"]["annotations"]
    assert gke.deployment_obj["spec"]["replicas"] == 1
    gke.settle(3600)  # past the old node's max run
    assert (old_node, "unneeded") in gke.deleted_nodes  # the autoscaler removed it empty, before flex-start did
    assert gke.killed == [] and gke.down_s == 0


def every_15_minutes(gke: FakeGke, hours: float, renew: bool) -> list[tuple[int, dict]]:
    """What a schedule does: one renew every quarter hour."""
    run, _ = renewer(gke)
    codes = []
    end = gke.now + timedelta(hours=hours)
    while gke.now < end:
        if renew:
            codes.append(run.renew(LEAD, TIMEOUT_S))
        gke.settle(max(0.0, 15 * 60 - (gke.now - T0).total_seconds() % (15 * 60)))
    return codes


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_endpoint_stays_up_across_max_runs(replicas: int) -> None:
    gke = serving(FakeGke(replicas=replicas, hpa_max=replicas, pool_max=replicas + 1))
    runs = every_15_minutes(gke, 13, renew=True)
    assert {code for code, _ in runs} == {0}
    renewed = [r["node"] for _, summary in runs for r in summary["renewed"]]
    assert len(renewed) == len(set(renewed)) >= 3 * replicas  # every replica renewed three times, each node once
    assert gke.down_s == 0 and gke.killed == []  # no second without a ready replica, no pod went with its node
    assert len(gke.ready()) == replicas


def test_without_renewal_each_max_run_is_an_outage() -> None:
    """The control: the same cluster and clock, nobody renewing. If this passed with renew=False, the test above
    could not fail."""
    gke = serving(FakeGke())
    every_15_minutes(gke, 13, renew=False)
    assert len(gke.killed) == 3 and gke.down_s >= 3 * (gke.provision_s + gke.startup_s)


def test_without_capacity_the_old_replica_serves_on_and_nothing_is_left_changed() -> None:
    gke = serving(FakeGke(capacity={"us-east5-a": 0, "us-east5-b": 0}))
    (old_node,) = gke.node_objs
    (old_pod,) = [p["metadata"]["name"] for p in gke.ready()]
    gke.settle(3 * 3600 + 20 * 60 - 600)
    run, said = renewer(gke)
    code, summary = run.renew(LEAD, 30 * 60.0)
    assert code == 3
    assert summary["kept"][0]["detail"] == "no successor served within 30 min (no flex-start capacity?)"
    assert [e["event"] for e in run.events] == ["cordoned", "kept"]
    gke.settle(60)
    # the inventory: the same node, schedulable again, serving the same pod; the HPA's own bounds; one replica
    assert list(gke.node_objs) == [old_node] and "unschedulable" not in gke.node_objs[old_node]["spec"]
    assert [p["metadata"]["name"] for p in gke.live()] == [old_pod] and gke.ready()
    assert gke.hpa_obj["spec"]["minReplicas"] == gke.hpa_obj["spec"]["maxReplicas"] == 1
    assert RENEWAL_ANNOTATION not in gke.hpa_obj["metadata"]["annotations"]
    assert gke.deployment_obj["spec"]["replicas"] == 1 and gke.down_s == 0


def test_a_full_pool_without_the_surge_node_is_kept_untouched() -> None:
    gke = serving(FakeGke(pool_max=1))
    gke.settle(3 * 3600 + 20 * 60 - 600)
    run, _ = renewer(gke)
    code, summary = run.renew(LEAD, TIMEOUT_S)
    assert code == 3 and "keep gkeSurgeNode true, or run one replica fewer than gkeMaxNodes" in \
        summary["kept"][0]["detail"]
    assert not [call for call in gke.calls if call[0] in ("patch", "scale")]


def test_a_renewal_a_dead_run_left_midway_is_finished_by_the_next() -> None:
    gke = serving(FakeGke())
    gke.settle(3 * 3600 + 20 * 60 - 600)
    first, _ = renewer(gke)
    (due,) = first.due(LEAD)
    first.start(due)  # ...and the runner died: HPA raised, node cordoned, state on the HPA
    assert json.loads(gke.hpa_obj["metadata"]["annotations"][RENEWAL_ANNOTATION])["node"] == due.name
    gke.settle(120)
    second, said = renewer(gke)
    code, summary = second.renew(LEAD, TIMEOUT_S)
    assert code == 0 and summary["renewed"][0]["node"] == due.name
    assert said[0].startswith(f"{due.name}: resuming the renewal a previous run started at 2026-12-01T11:20")
    assert gke.hpa_obj["spec"]["maxReplicas"] == 1 and RENEWAL_ANNOTATION not in gke.hpa_obj["metadata"][
        "annotations"]
    gke.settle(3600)
    assert gke.killed == [] and gke.down_s == 0 and len(gke.ready()) == 1


def test_a_left_renewal_whose_node_is_gone_is_undone() -> None:
    gke = serving(FakeGke(capacity={"us-east5-a": 0, "us-east5-b": 0}))
    gke.settle(3 * 3600 + 20 * 60 - 600)
    first, _ = renewer(gke)
    (due,) = first.due(LEAD)
    first.start(due)
    gke.settle(41 * 60)  # the node reached its max run meanwhile
    assert due.name not in gke.node_objs
    second, _ = renewer(gke)
    second.renew(LEAD, TIMEOUT_S)
    assert [e["event"] for e in second.events] == ["renewal undone"]
    assert gke.hpa_obj["spec"] == {**gke.hpa_obj["spec"], "minReplicas": 1, "maxReplicas": 1}
    assert RENEWAL_ANNOTATION not in gke.hpa_obj["metadata"]["annotations"]


def test_the_node_closest_to_its_deletion_goes_first_and_an_expiring_empty_node_takes_no_successor() -> None:
    gke = serving(FakeGke(replicas=2, hpa_max=2, pool_max=4))
    first, second = sorted(gke.node_objs)
    # the second node's max run ends 20 min later
    gke.node_objs[second]["metadata"]["annotations"]["node.gke.io/machine-termination-datetime"] = \
        "2026-12-01T12:20:00Z"
    gke.settle(3 * 3600 + 25 * 60 - 600)
    spare = gke.add_node("us-east5-b", T0)  # 11:25: an empty node (a replica just scaled away), gone at noon
    gke.settle(5 * 60)  # 11:30: the first is due in 30 min, the second in 50 (beyond the lead)
    run, said = renewer(gke)
    code, summary = run.renew(LEAD, TIMEOUT_S)
    assert code == 0 and [r["node"] for r in summary["renewed"]] == [first]
    assert ("patch", "node", spare) in gke.calls  # cordoned: it would go at noon with the successor on it
    assert all(node_of_pod(gke, p["metadata"]["name"]) not in (first, spare) for p in gke.ready())
    assert gke.hpa_obj["spec"]["maxReplicas"] == 2  # raised to 3 for the renewal, and back


def test_a_node_asked_for_is_renewed_whatever_its_time() -> None:
    gke = serving(FakeGke())
    (node,) = gke.node_objs
    run, _ = renewer(gke)
    code, summary = run.renew(LEAD, TIMEOUT_S, only=node)
    assert code == 0 and summary["renewed"][0]["node"] == node
    with pytest.raises(gke_renew.ClusterError, match="--node nope: not a node of pool tpu-serve-gke-tpu serving"):
        run.renew(LEAD, TIMEOUT_S, only="nope")


def test_the_deletion_time_is_gkes_annotation_or_creation_plus_the_max_run() -> None:
    annotated = {"metadata": {"creationTimestamp": "2026-12-01T08:00:00Z",
                              "annotations": {"node.gke.io/machine-termination-datetime": "2026-12-16T01:00:00Z"}}}
    assert node_expiry(annotated, MAX_RUN_S).isoformat() == "2026-12-16T01:00:00+00:00"
    bare = {"metadata": {"creationTimestamp": "2026-12-01T08:00:00Z"}}
    assert node_expiry(bare, MAX_RUN_S).isoformat() == "2026-12-01T12:00:00+00:00"
    assert node_expiry(bare, 0) is None


# --- kubectl, and the command ---------------------------------------------------------------------------------

KUBECTL = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_KUBECTL_LOG"]
with open(log, "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args[0] == "get":
    kind = args[1]
    answers = json.load(open(os.environ["FAKE_KUBECTL_ANSWERS"]))
    print(json.dumps(answers[kind]))
elif args[0] == "patch" and "bad" in args:
    print('Error from server (NotFound): nodes "bad" not found', file=sys.stderr)
    sys.exit(1)
"""


def test_kubectl_speaks_merge_patches_and_reads_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubectl = tmp_path / "kubectl"
    write_executable(kubectl, KUBECTL)
    gke = serving(FakeGke())
    answers = {"nodes": {"kind": "List", "items": gke.nodes(POOL)},
               "pods": {"kind": "List", "items": gke.pods("tpu-serve", gke.selector)},
               "deployment": gke.deployment("tpu-serve", "vllm"),
               "horizontalpodautoscaler": {"kind": "List", "items": [gke.hpa("tpu-serve", "vllm")]}}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    env = {"PATH": "/usr/bin:/bin", "FAKE_KUBECTL_LOG": str(tmp_path / "log"),
           "FAKE_KUBECTL_ANSWERS": str(tmp_path / "answers.json"), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    cluster = KubectlCluster(env, str(kubectl))
    assert [n["metadata"]["name"] for n in cluster.nodes(POOL)] == list(gke.node_objs)
    assert cluster.hpa("tpu-serve", "vllm")["spec"]["maxReplicas"] == 1
    cluster.patch("node", "gke-n-1", {"spec": {"unschedulable": True}})
    cluster.scale("tpu-serve", "vllm", 2)
    argv = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    assert argv == [
        ["get", "nodes", "--selector", f"cloud.google.com/gke-nodepool={POOL}", "--output", "json"],
        ["get", "horizontalpodautoscaler", "--namespace", "tpu-serve", "--field-selector", "metadata.name=vllm",
         "--output", "json"],
        ["patch", "node", "gke-n-1", "--type", "merge", "--patch", '{"spec":{"unschedulable":true}}'],
        ["scale", "deployment/vllm", "--namespace", "tpu-serve", "--replicas=2"]]
    with pytest.raises(gke_renew.ClusterError, match=r'kubectl patch node bad exited with 1: .*nodes "bad" not found'):
        cluster.patch("node", "bad", {"spec": {"unschedulable": True}})


OUTPUTS = {"target": "gke", "project": "my-ml-sandbox", "cluster": "tpu-serve-gke", "clusterLocation": "us-east5",
           "namespace": "tpu-serve", "deployment": "vllm", "nodePool": POOL, "nodePoolMaxNodes": 2,
           "maxRunSeconds": MAX_RUN_S}


def command(monkeypatch: pytest.MonkeyPatch, gke: FakeGke, outputs: dict, *args: str):
    from contextlib import nullcontext

    from tpuserve.cli import main

    monkeypatch.setattr("tpuserve.deploy.stack.stack_outputs", lambda stack, cwd=None: outputs)
    monkeypatch.setattr(gke_renew, "open_cluster", lambda outputs: nullcontext({}))
    monkeypatch.setattr(gke_renew, "KubectlCluster", lambda env: gke)
    original = gke_renew.Renewer.__init__

    def on_the_fake_clock(self, *a, **kw):  # the command's renewer, on the fake's clock
        original(self, *a, **kw)
        self.now, self.sleep = gke.clock, gke.sleep
    monkeypatch.setattr(gke_renew.Renewer, "__init__", on_the_fake_clock)
    return CliRunner().invoke(main, ["gke", *args, "--stack", "gke"])


def test_the_command_renews_and_ends_with_one_json_line(monkeypatch: pytest.MonkeyPatch) -> None:
    gke = serving(FakeGke())
    gke.settle(3 * 3600 + 20 * 60 - 600)
    result = command(monkeypatch, gke, OUTPUTS, "renew", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["exit"] == 0 and len(summary["renewed"]) == 1
    assert [e["event"] for e in summary["events"]] == ["cordoned", "successor ready", "renewed"]


def test_status_shows_each_node_and_when_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    gke = serving(FakeGke())
    (node,) = gke.node_objs
    result = command(monkeypatch, gke, OUTPUTS, "status")
    assert result.exit_code == 0, result.output
    assert f"{node} us-east5-a: deleted in 3h 50m; replicas vllm-" in " ".join(result.output.split())


def test_a_stack_that_is_not_gke_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    result = command(monkeypatch, FakeGke(), {"target": "gcp"}, "renew")
    assert result.exit_code == 2 and "not a gke stack deployed by this version (target 'gcp'" in result.output


@pytest.mark.parametrize("args, message", [
    (["--lead", "0"], "Invalid value for --lead: '0' must be longer than zero"),
    (["--timeout", "soon"], "Invalid value for --timeout: 'soon' is not a duration like 4h, 90m or 1d12h"),
])
def test_a_bad_duration_names_its_own_option(args: list[str], message: str) -> None:
    """Issue #27, item 6: a duration's error names its own option."""
    result = CliRunner().invoke(gke_renew.gke, ["renew", "--stack", "gke", *args])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == f"Error: {message}"
