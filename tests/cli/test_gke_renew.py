"""The renewer (tpuserve/gke_renewer.py) against a fake GKE on a virtual clock (tests/fakes/gke_fakes.py: nodes with the
labels and the termination annotation GKE sets, the HPA, ReplicaSet, scheduler, cluster autoscaler and flex-start
expiry as controllers): the replica is replaced before its node is deleted, the endpoint stays up across max runs, and
a renewal without capacity leaves the cluster as it found it. Then the same renewer as the CronJob runs it: through a
fake Kubernetes API server with the RBAC the stack declares, and from the ConfigMap's files on a bare Python; and as
`tpuserve gke renew` runs it, through `kubectl proxy`."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from components import k8s_renewal
from components.config import build_stack_config
from components.k8s_serving import TERMINATION_GRACE_S, ServingManifestArgs
from tests.fakes.gke_fakes import T0, FakeApiServer, FakeGke
from tests.fakes.pulumi_harness import stack_file_config
from tpuserve import gke_renewer
from tpuserve.gke_renewer import RENEWAL_ANNOTATION, ApiCluster, ClusterError, Renewer, node_expiry
from tpuserve.ops import gke_renew

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


# --- the command ---------------------------------------------------------------------------------

OUTPUTS = {"target": "gke", "project": "my-ml-sandbox", "cluster": "tpu-serve-gke", "clusterLocation": "us-east5",
           "namespace": "tpu-serve", "deployment": "vllm", "nodePool": POOL, "nodePoolMaxNodes": 2,
           "maxRunSeconds": MAX_RUN_S}


def command(monkeypatch: pytest.MonkeyPatch, gke: FakeGke, outputs: dict, *args: str):
    from contextlib import nullcontext

    from tpuserve.cli import main

    monkeypatch.setattr("tpuserve.deploy.stack.stack_outputs", lambda stack, cwd=None: outputs)
    monkeypatch.setattr(gke_renew, "open_cluster", lambda outputs: nullcontext(gke))
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


def test_the_old_pod_is_given_its_whole_grace_period_to_finish_its_requests() -> None:
    """A pod that goes waits for its last requests (the preStop), up to its grace period: the renewal waits as long
    as the pod's own terminationGracePeriodSeconds says before calling it still terminating."""
    gke = serving(FakeGke(grace_s=TERMINATION_GRACE_S, drain_s=400))
    (old_pod,) = [p["metadata"]["name"] for p in gke.ready()]
    gke.settle(3 * 3600 + 20 * 60 - 600)
    run, _ = renewer(gke)
    code, _ = run.renew(LEAD, TIMEOUT_S)
    assert code == 0 and [e["event"] for e in run.events] == ["cordoned", "successor ready", "renewed"]
    assert old_pod not in gke.pod_objs and gke.down_s == 0


# --- the CronJob's way: the Kubernetes API, as its own service account ------------------------------------------

TOKEN = "eyJhbGciOiJSUzI1NiJ9.renewer"


@functools.cache
def declared_renewal() -> dict[str, dict[str, Any]]:
    """The renewal's objects for Pulumi.gke.yaml's stack, by kind: what the stack declares (components/
    k8s_renewal.py; tests/components/inventories/gke.yaml pins the declared rules and CronJob)."""
    cfg = build_stack_config(stack_file_config("gke"))
    args = ServingManifestArgs(
        name="vllm", namespace=cfg.gke_namespace, serving=cfg.serving, secret_name="projects/p/secrets/s",
        gsa_email="pods@my-ml-sandbox.iam.gserviceaccount.com", chips=cfg.chips,
        node_labels={"cloud.google.com/gke-nodepool": POOL}, min_replicas=cfg.gke_min_replicas,
        max_replicas=cfg.gke_max_nodes, startup_budget_s=cfg.readiness_timeout_seconds, config_hash="0",
        pool_max_nodes=cfg.gke_pool_max_nodes, max_run_s=cfg.max_run_seconds)
    return {obj["kind"]: obj for obj in k8s_renewal.manifests(args)}


def grants() -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The declared roles, as bound to the renewer's service account."""
    objects = declared_renewal()
    account = objects["ServiceAccount"]["metadata"]
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        assert objects[binding]["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                                 "namespace": account["namespace"]}]
    assert objects["ClusterRoleBinding"]["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert objects["RoleBinding"]["roleRef"]["name"] == objects["Role"]["metadata"]["name"]
    return [(None, objects["ClusterRole"]["rules"]), (objects["Role"]["metadata"]["namespace"],
                                                      objects["Role"]["rules"])]


def granted(rules_by_scope: list[tuple[str | None, list[dict[str, Any]]]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for _, rules in rules_by_scope for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_cronjobs_renewer_renews_through_the_api_with_exactly_the_declared_access(tmp_path: Path) -> None:
    gke = serving(FakeGke(grace_s=TERMINATION_GRACE_S))
    (old_node,) = gke.node_objs
    gke.settle(3 * 3600 + 20 * 60 - 600)
    (tmp_path / "token").write_text(TOKEN + "\n")
    with FakeApiServer(gke, TOKEN, grants()) as api:
        run = Renewer(ApiCluster(api.url, str(tmp_path / "token")), "tpu-serve", "vllm", POOL, 3, MAX_RUN_S,
                      now=gke.clock, sleep=gke.sleep)
        code, summary = run.renew(LEAD, TIMEOUT_S)
    assert code == 0 and summary["renewed"][0]["node"] == old_node
    assert [e["event"] for e in run.events] == ["cordoned", "successor ready", "renewed"]
    # Least access: nothing was refused, and every grant was needed.
    assert api.denied == []
    assert {(c.group, c.resource, c.verb) for c in api.calls} == granted(grants())
    # The inventory: the old node cordoned and empty, one ready replica elsewhere, the HPA as it was.
    assert gke.node_objs[old_node]["spec"]["unschedulable"] is True
    assert [p["spec"]["nodeName"] for p in gke.ready()] != [old_node] and len(gke.ready()) == 1
    assert gke.hpa_obj["spec"]["minReplicas"] == gke.hpa_obj["spec"]["maxReplicas"] == 1
    assert RENEWAL_ANNOTATION not in gke.hpa_obj["metadata"]["annotations"]
    assert gke.killed == [] and gke.down_s == 0


def test_without_a_grant_the_renewal_stops_before_it_changes_anything(tmp_path: Path) -> None:
    gke = serving(FakeGke())
    (node,) = gke.node_objs
    gke.settle(3 * 3600 + 20 * 60 - 600)
    (tmp_path / "token").write_text(TOKEN)
    read_only = [(scope, [{**rule, "verbs": [v for v in rule["verbs"] if v != "patch"]} for rule in rules])
                 for scope, rules in grants()]
    with FakeApiServer(gke, TOKEN, read_only) as api:
        run = Renewer(ApiCluster(api.url, str(tmp_path / "token")), "tpu-serve", "vllm", POOL, 3, MAX_RUN_S,
                      now=gke.clock, sleep=gke.sleep)
        with pytest.raises(ClusterError) as err:
            run.renew(LEAD, TIMEOUT_S)
    assert str(err.value) == (
        f'PATCH /api/v1/nodes/{node}: HTTP 403 Forbidden nodes "{node}" is forbidden: User '
        '"system:serviceaccount:tpu-serve:vllm-renewer" cannot patch resource "nodes" in API group "" at the cluster '
        "scope")
    # what is left: the node schedulable, the HPA untouched, the replica serving
    assert "unschedulable" not in gke.node_objs[node]["spec"] and gke.hpa_obj["metadata"]["annotations"] == {}
    assert len(gke.ready()) == 1 and gke.deployment_obj["spec"]["replicas"] == 1


def test_the_api_client_reads_the_token_each_call_and_says_what_the_server_said(tmp_path: Path) -> None:
    gke = serving(FakeGke())
    token = tmp_path / "token"
    token.write_text("expired")
    with FakeApiServer(gke, TOKEN, grants()) as api:
        cluster = ApiCluster(api.url, str(token))
        with pytest.raises(ClusterError, match=r"^GET /api/v1/nodes: HTTP 401 Unauthorized Unauthorized$"):
            cluster.nodes(POOL)
        token.write_text(TOKEN)  # the kubelet rotated it: the next call reads the new one
        assert [n["metadata"]["name"] for n in cluster.nodes(POOL)] == list(gke.node_objs)
        assert cluster.hpa("tpu-serve", "vllm")["spec"]["maxReplicas"] == 1
        gke.hpa_obj = None
        assert cluster.hpa("tpu-serve", "vllm") is None  # a 404 is "no HPA", not an error
        with pytest.raises(ClusterError, match="no API path for a deployment"):
            cluster.patch("deployment", "vllm", {})


def test_the_in_cluster_api_server_comes_from_the_pods_environment() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.8.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert gke_renewer.in_cluster_server(env) == "https://10.8.0.1:443"
    assert gke_renewer.in_cluster_server({"KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    with pytest.raises(ClusterError, match="not in a pod; give --api-server"):
        gke_renewer.in_cluster_server({})


def test_the_configmap_carries_everything_the_renewer_imports_and_nothing_else_is_needed() -> None:
    """The renewer's imports, followed through the shipped files: the standard library and those files only."""
    files = declared_renewal()["ConfigMap"]["data"]
    seen, todo = set(), ["tpuserve.gke_renewer"]
    while todo:
        module = todo.pop()
        seen.add(module)
        for node in ast.walk(ast.parse(files[f"{module.split('.')[-1]}.py"])):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("tpuserve."):
                    assert f"{name.split('.')[-1]}.py" in files, name
                    todo += [] if name in seen else [name]
                else:
                    assert name.split(".")[0] in sys.stdlib_module_names or name == "__future__", name
    assert seen == {"tpuserve.gke_renewer", "tpuserve.durations", "tpuserve.exits"} and set(files) == {
        "__init__.py", "durations.py", "exits.py", "gke_renewer.py"}


def test_the_cronjobs_command_runs_from_the_configmap_on_a_bare_python(tmp_path: Path) -> None:
    """The CronJob's container, as close as this machine gets: the ConfigMap's files as the `tpuserve` package in
    its working directory, `python -S` (no site-packages: nothing installed), its declared arguments, and the fake
    API server; the cluster's clock moves on with each request."""
    objects = declared_renewal()
    (container,) = objects["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    package = tmp_path / "work" / "tpuserve"
    package.mkdir(parents=True)
    for name, text in objects["ConfigMap"]["data"].items():
        (package / name).write_text(text)
    (tmp_path / "token").write_text(TOKEN)
    gke = serving(FakeGke(grace_s=TERMINATION_GRACE_S))
    (node,) = gke.node_objs
    with FakeApiServer(gke, TOKEN, grants(), tick_s=5.0) as api:
        done = subprocess.run(
            [sys.executable, "-S", *container["command"][1:], *container["args"], "--node", node,
             "--poll-seconds", "0.01", "--api-server", api.url, "--token-file", str(tmp_path / "token")],
            cwd=package.parent, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True and summary["renewed"][0]["node"] == node
    assert [e["event"] for e in summary["events"]] == ["cordoned", "successor ready", "renewed"]
    assert api.denied == [] and gke.node_objs[node]["spec"]["unschedulable"] is True and gke.down_s == 0


def test_the_job_says_why_it_failed_in_one_line_and_its_summary(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = gke_renewer.main(["--namespace", "tpu-serve", "--deployment", "vllm", "--pool", POOL,
                             "--pool-max-nodes", "3", "--api-server", "http://127.0.0.1:9",
                             "--token-file", str(tmp_path / "missing")], env={})
    error, summary = capsys.readouterr().out.splitlines()
    assert code == 1 and error.startswith(f"Error: cannot read the service account token {tmp_path / 'missing'}")
    assert json.loads(summary) == {"ok": False, "exit": 1, "reason": error.removeprefix("Error: "), "events": []}
    assert gke_renewer.main(["--namespace", "tpu-serve", "--deployment", "vllm", "--pool", POOL,
                             "--pool-max-nodes", "3"], env={}) == 1  # not in a pod, no --api-server
    assert "KUBERNETES_SERVICE_HOST is not set" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--lead", "0"], "argument --lead: '0' must be longer than zero"),
    (["--timeout", "soon"], "argument --timeout: 'soon' is not a duration like 4h, 90m or 1d12h"),
])
def test_a_bad_duration_for_the_job_names_its_option(args: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gke_renewer.main(["--namespace", "n", "--deployment", "d", "--pool", "p", "--pool-max-nodes", "2", *args])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(message)
