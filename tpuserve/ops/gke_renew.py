"""`tpuserve gke renew` and `gke status`: a gke stack's TPU nodes by hand, through `kubectl proxy` with the stack's
credentials; the renewal itself is tpuserve/gke_renewer.py, run by the stack's CronJob (docs/design/gke-renewal.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from tpuserve import cli, exits
from tpuserve.cli import DURATION
from tpuserve.durations import human
from tpuserve.gke_renewer import DEFAULT_LEAD, DEFAULT_TIMEOUT, RENEWAL_ANNOTATION, ApiCluster, ClusterError, Renewer


def renewer_for(outputs: Mapping[str, Any], cluster: ApiCluster, say: Callable[[str], None]) -> Renewer:
    missing = [key for key in ("namespace", "deployment", "nodePool", "nodePoolMaxNodes") if not outputs.get(key)]
    if outputs.get("target") != "gke" or missing:
        raise click.UsageError(f"--stack: not a gke stack deployed by this version (target {outputs.get('target')!r}"
                               + (f", no output {', '.join(missing)}" if missing else "") + "): run `pulumi up` on "
                               "it first")
    return Renewer(cluster, str(outputs["namespace"]), str(outputs["deployment"]), str(outputs["nodePool"]),
                   int(outputs["nodePoolMaxNodes"]), int(outputs.get("maxRunSeconds") or 0), say=say)


@contextmanager
def open_cluster(outputs: Mapping[str, Any]) -> Iterator[ApiCluster]:  # pragma: no cover - needs a cluster
    """The CronJob's ApiCluster, through `kubectl proxy` with the stack's credentials (which it authenticates)."""
    from tpuserve.deploy.stack import forwarding, free_local_port, gke_credentials

    port = free_local_port()
    with gke_credentials(outputs) as env, forwarding([env["KUBECTL"], "proxy", f"--port={port}"], port,
                                                     "kubectl proxy", env):
        yield ApiCluster(f"http://127.0.0.1:{port}", token_file="")


def run_command(stack: str, cwd: Path, as_json: bool, action: Callable[[Renewer], tuple[int, dict[str, Any]]]) -> None:
    from rich.console import Console

    from tpuserve.deploy.stack import stack_outputs

    console = Console(stderr=as_json)
    outputs = stack_outputs(stack, cwd)
    with open_cluster(outputs) as cluster:
        renewer = renewer_for(outputs, cluster, lambda line: console.print(line, markup=False, highlight=False))
        try:
            code, summary = action(renewer)
        except ClusterError as err:
            console.print(f"Error: {err}", markup=False, highlight=False)
            code, summary = exits.FAILED, {"reason": str(err)}
    cli.finish(code, stack, {**summary, "events": renewer.events}, as_json)


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """--stack, --cwd and --json, in that order in --help."""
    command = click.option("--json", "as_json", is_flag=True, help="End with one JSON line.")(command)
    command = cli.cwd_option(command)
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
