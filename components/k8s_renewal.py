"""The gke target's node renewal in the cluster: a CronJob that runs tpuserve/gke_renewer.py every 15 minutes as its
own service account, with only the access a renewal uses. Its files ride in a ConfigMap mounted as a `tpuserve`
package on a digest-pinned python image; none while parked. Why: docs/design/gke-renewal.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.k8s_serving import TERMINATION_GRACE_S, ServingManifestArgs, metadata, role_and_binding
from tpuserve import durations
from tpuserve.gke_renewer import DEFAULT_LEAD, DEFAULT_TIMEOUT, POOL_LABEL

SCHEDULE = "*/15 * * * *"
# python:3.12-slim's multi-arch digest (2026); `python -m tpuserve.registry python:3.12-slim` prints today's.
PYTHON_IMAGE = "python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tpuserve"
# The renewer and what it imports from tpuserve (tests/cli/test_gke_renew.py checks the closure).
PACKAGE_FILES = ("__init__.py", "durations.py", "exits.py", "gke_renewer.py")
WORKDIR = "/opt/tpu-serve-renewer"
NOBODY = 65534
# Past the longest run (a successor's wait, the old pod's stop) a Job is stuck, and would hold back every later run.
RUN_MARGIN_S = 10 * 60
# Nodes are cluster-scoped: only a ClusterRole reaches them. `list` takes no resourceNames.
NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}]


def renewer_name(args: ServingManifestArgs) -> str:
    return f"{args.name}-renewer"


def namespace_rules(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The Deployment, its scale and the HPA by name; the pods (generated names) by kind."""
    only = [args.name]
    return [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"], "resourceNames": only},
            {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"], "resourceNames": only},
            {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["get", "patch"],
             "resourceNames": only},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]


def manifests(args: ServingManifestArgs) -> list[dict[str, Any]]:
    """The renewer's objects in apply order; none while parked."""
    if args.min_replicas == 0:
        return []
    name = renewer_name(args)
    meta = metadata(args, name, app=name)
    container = {
        "name": "renewer", "image": PYTHON_IMAGE, "command": ["python3", "-m", "tpuserve.gke_renewer"],
        "args": ["--namespace", args.namespace, "--deployment", args.name, "--pool", args.node_labels[POOL_LABEL],
                 "--pool-max-nodes", str(args.pool_max_nodes), "--max-run-seconds", str(args.max_run_s),
                 "--lead", DEFAULT_LEAD, "--timeout", DEFAULT_TIMEOUT],
        "workingDir": WORKDIR,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "renewer", "mountPath": f"{WORKDIR}/tpuserve", "readOnly": True}],
    }
    job = {"backoffLimit": 0,  # the next run, 15 minutes on, retries (and resumes a renewal left midway)
           "activeDeadlineSeconds": durations.parse(DEFAULT_TIMEOUT) + TERMINATION_GRACE_S + RUN_MARGIN_S,
           "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": {
               "serviceAccountName": name, "restartPolicy": "Never",
               "securityContext": {"runAsNonRoot": True, "runAsUser": NOBODY, "runAsGroup": NOBODY,
                                   "seccompProfile": {"type": "RuntimeDefault"}},
               "containers": [container],
               "volumes": [{"name": "renewer", "configMap": {"name": name}}]}}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        *role_and_binding(metadata(args, f"{args.namespace}-{name}", namespaced=False, app=name), NODE_RULES, name,
                          args.namespace, kind="ClusterRole"),  # cluster-wide: named by the stack's namespace too
        *role_and_binding(meta, namespace_rules(args), name, args.namespace),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {file: (PACKAGE_DIR / file).read_text() for file in PACKAGE_FILES}},
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta, "spec": {
            "schedule": SCHEDULE, "timeZone": "Etc/UTC",
            # One renewal at a time: a run still waiting for a successor's capacity makes the next one skip.
            "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": 300,
            "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 3,
            "jobTemplate": {"metadata": {"labels": dict(meta["labels"])}, "spec": job}}},
    ]
