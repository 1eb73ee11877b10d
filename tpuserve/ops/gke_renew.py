"""`tpuserve gke renew` and `gke status`: a gke stack's TPU nodes by hand, through kubectl with the stack's
credentials; the renewal itself is tpuserve/gke_renewer.py, run by the stack's CronJob (docs/design/gke-renewal.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from tpuserve import cli, exits
from tpuserve.cli import DURATION
from tpuserve.durations import human
from tpuserve.gke_renewer import (DEFAULT_LEAD, DEFAULT_TIMEOUT, POOL_LABEL, RENEWAL_ANNOTATION, Cluster,
                                  ClusterError, Renewer)


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
            code, summary = exits.FAILED, {"reason": str(err)}
    cli.finish(code, stack, {**summary, "events": renewer.events}, as_json)


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """--stack, --cwd and --json, in that order in --help."""
    command = click.option("--json", "as_json", is_flag=True, help="End with one JSON line.")(command)
    command = click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
                           show_default=True, help="The Pulumi project directory.")(command)
    return click.option("--stack", required=True, help="The gke stack.")(command)


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
    without a successor in time the old one serves on (exit 3). The stack's CronJob already does this every 15
    minutes in the cluster; by hand it is for --node, or to watch a renewal."""
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
        return exits.OK, {"nodes": [v.as_dict(now) for v in views],
                         "renewal": json.loads(renewal) if renewal else None}

    run_command(stack, cwd, as_json, show)
