"""`tpuserve renew`: a stack's successor VM, serving, before flex-start deletes the VM that serves now
(docs/getting-a-tpu.md#renewals-tpuserve-renew, docs/design/capacity.md#renewals)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve import cli, durations, exits
from tpuserve.deploy import inventory
from tpuserve.flex_start import clock, deletion_at
from tpuserve.deploy.preflight import Endpoints, configured_zones, endpoint_option, target_from_config
from tpuserve.deploy.pulumi_cli import require_project
from tpuserve.ops import up as ups

DEFAULT_LEAD = "45m"  # a successor's cold boot (8.5-10.5 min), the 15-minute schedule, and room for a few tries


@click.command("renew", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", required=True, help="The gcp stack whose VM to renew.")
@click.option("--lead", "lead_text", default=DEFAULT_LEAD, show_default=True,
              help="Renew when flex-start deletes the VM in less than this; later, nothing is done.")
@click.option("--zones", help="Comma-separated zones for the successor [default: the VM's zone, then the stack's].")
@click.option("--yes", is_flag=True, help="Delete orphans that bill without asking.")
@cli.cwd_option
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line: what was done, the VMs, the inventory.")
@endpoint_option
@click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI UP FLAGS]")
@click.pass_context
def renew(ctx: click.Context, stack: str, lead_text: str, zones: str | None, yes: bool, cwd: Path, as_json: bool,
          endpoints: tuple[str, ...], pulumi_args: tuple[str, ...]) -> None:
    """Replace the stack's VM before flex-start deletes it: successor first (other slot, gated), then the old VM.

    Exit 0 renewed or nothing due, 1 an error, 3 no successor before the deletion (the old VM serves until then)."""
    from tpuserve.gce import ComputeApiError, ComputeClient, Instance

    lead_s, roots = ups.parse_deadline(lead_text, "--lead"), Endpoints.parse(endpoints)
    run = ups.Outcome(stack, as_json, {"action": None})
    say, finish, fail = run.say, run.finish, run.stop
    pulumi, config, outputs = run.open(cwd)
    target = config.get("target", "gcp")
    if target != "gcp":
        raise click.UsageError(f"--stack: {stack} is a {target} stack; `tpuserve renew` renews a gcp stack's VM"
                               + (" (`tpuserve gke renew` renews a gke stack's nodes)" if target == ups.GKE else ""))
    project = require_project(config, stack)
    name, zone = str(outputs.get("instanceName") or ""), str(outputs.get("zone") or config.get("zone") or "")
    if not name:
        say(f"nothing to renew: stack {stack} holds no VM (`tpuserve up --stack {stack}` deploys one)")
        finish(exits.OK, {"action": "none", "reason": "no VM"})
    session = run.session()
    compute = ComputeClient(session, roots.compute)
    try:
        instance = compute.instance(Instance(project, zone, name))
    except ComputeApiError as err:
        if err.status != 404:
            fail(str(err), f"could not read {name}: {err}")
        # Bounded by the lead: a scheduled renewal fits its job, and the next one (15 min on) tries again.
        say(f"{name} is gone (flex-start deleted it): deploying the stack as `tpuserve up --stack {stack} "
            f"--deadline {lead_text}` does")
        ctx.invoke(ups.up, stack=stack, zones=zones, deadline_text=lead_text, yes=yes, cwd=cwd, as_json=as_json,
                   endpoints=endpoints, pulumi_args=pulumi_args)
        return
    except requests.RequestException as err:
        fail(str(err), f"could not read {name}: {err}")
    deletion = deletion_at(instance)
    vm = {"name": name, "zone": zone, "deletionAt": deletion and deletion.astimezone(timezone.utc).isoformat()}
    if deletion is None:
        say(f"{name} has no run limit: nothing to renew")
        finish(exits.OK, {"action": "none", "vm": vm})
    left = seconds_until(deletion)
    vm["leftSeconds"] = round(left)
    if left > lead_s:
        say(f"{name} is deleted in {durations.human(left)} (at {clock(deletion)}): more than {lead_text} away, "
            "nothing to do")
        finish(exits.OK, {"action": "not-due", "vm": vm})

    slot = "b" if str(outputs.get("vmSlot") or config.get("vmSlot") or "a") == "a" else "a"
    candidates = configured_zones(config, outputs, zones)
    say(f"{name} is deleted in {durations.human(left)}: renewing it in slot {slot}, trying {', '.join(candidates)} "
        "(it serves until its successor does)")
    own = ups.own_nats(pulumi, say)
    settings = ups.nat_settings(session, roots, target_from_config(config, candidates, stack, own or frozenset()),
                                None, own is not None, say)
    confirm = ups.orphan_confirmation(yes)
    # Tried until the old VM's deletion; an attempt begun just before it may still boot its successor.
    deployer = ups.Deployer(pulumi, stack, project, pulumi_args, compute, confirm, say,
                            settings={**settings, "vmSlot": slot}, boot_floor_s=ups.BOOT_UPDATE_S)
    result = deployer.run(candidates, left, retry_until_up=True, clock=time.monotonic, sleep=time.sleep,
                          on_wait=lambda seconds, next_round: say(f"no successor yet; trying again in {seconds:.0f} s"))
    tried = list(dict.fromkeys(attempt.zone for attempt in result.attempts))
    deployer.settle(result, config, zone)
    summary: dict[str, Any] = {"vm": vm, "attempts": [attempt.as_dict() for attempt in result.attempts],
                               "orphans": deployer.orphans}
    if result.ok:
        successor = {"name": str(pulumi.outputs().get("instanceName") or ""), "zone": result.zone}
        code, summary["action"], summary["successor"] = exits.OK, "renewed", successor
        say(f"renewed: {successor['name']} serves in {result.zone}; {name} was deleted after it")
    elif result.stopped is not None:
        code, summary["action"] = exits.FAILED, "failed"
        say(f"Error: stopped: {result.stopped.kind}: {result.stopped.reason}")
        if result.stopped.hint:
            say(result.stopped.hint.replace("<stack>", stack))
    else:
        code, summary["action"] = exits.NO_CAPACITY, "kept"
        still = seconds_until(deletion)
        say(f"no capacity for a successor in {', '.join(tried) or ', '.join(candidates)}: {name} "
            + (f"keeps serving until flex-start deletes it at {clock(deletion)} (in {durations.human(still)})"
               if still > 0 else f"served until flex-start deleted it at {clock(deletion)}"))
    code, stock = inventory.close_run(pulumi, config, session, roots, confirm, say, code, "tpuserve renew")
    finish(code, {**summary, "inventory": None if stock is None else stock.as_dict()})


def seconds_until(moment: datetime) -> float:
    return (moment - datetime.fromtimestamp(time.time(), timezone.utc)).total_seconds()
