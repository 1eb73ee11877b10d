"""`tpuserve up`: deploy a stack in the first zone that has a TPU for it, and leave nothing behind in the others.

A flex-start create through Pulumi gets capacity now or fails (components/instance.py), so deploying first means
trying zones: preflight (tpuserve/deploy/preflight.py drops zones without the machine type or quota), then the
sweep (deploy/sweep.py): per zone, set the stack's `zone` and run the real `pulumi up` (deploy/pulumi_cli.py; state,
secrets, policy packs stay Pulumi's, and the readiness gate runs inside it); classify a failure from its text
(deploy/capacity.py); before the next zone, refresh the state and delete what the failed zone left behind (orphans,
found by the stack's labels, after the user agrees or with --yes). When no zone has one free and the stack holds no
VM, it waits in Compute Engine's queue in the best zone instead (Deployer.queue: everything but the VM, then the VM
inserted with a wait time, then adopted by `pulumi up`; docs/getting-a-tpu.md). The zone that worked stays in the
stack config, so later `pulumi up`/`destroy` and the toolkit use it. The readiness gate failing is not a capacity
problem: it stops the sweep and points to `tpuserve diagnose`. A stack another update holds is waited for.

Before the first zone, a stack that already has a VM is previewed (`pulumi preview --json`, deploy/preview.py): a
change that would replace or delete the VM (or its cache disk) is named, with what it costs, and runs only with
--replace-vm or an interactive yes; an in-place change says so and goes ahead. A replacement keeps the old VM serving
until the new one is ready (create-before-delete, under the other of the stack's two VM names when it stays in its
zone) unless the region's TPU quota has no room for both, when the old VM goes first, said plainly.

Exit codes: 0 deployed and ready; 1 stopped by an error no other zone fixes (or preflight); 2 bad usage;
3 no zone had capacity before the deadline, queue included (try later, add zones); 4 the change would replace the
VM and nobody agreed (--replace-vm); 5 deployed, but something that bills is left that the stack does not hold (an
orphan nobody agreed to delete: the inventory at the end names it and the command that removes it).
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve import cli, durations, exits
from tpuserve.deploy import nat
from tpuserve.deploy.cache import cache_disks, is_warm, zones_by_warm_cache
from tpuserve.deploy.capacity import classify
from tpuserve.deploy import preview as previews
from tpuserve.gce import ComputeApiError, ComputeClient, ZonalDisks, tpu_chips
from tpuserve.deploy.orphans import Orphan, blank_cache_disks, delete_orphans, find_orphans, managed_ids
from tpuserve.names import stack_labels
from tpuserve.deploy.preflight import (Endpoints, Report, configured_zones, endpoint_option, nat_plan, preflight,
                                       print_report, target_from_config)
from tpuserve.facts import PRICE_PER_CHIP_HOUR
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError
from tpuserve.deploy.sweep import REGION, STOP, ZONE, Attempt, Failure, SweepResult, sweep
from tpuserve.zones import region_of
from tpuserve.deploy import queue as queues
from tpuserve.flex_start import ADOPT_VM_ENV, WITHHOLD_VM_ENV, instance_id

PREVIEW_TIMEOUT_S = 600.0
DEFAULT_DEADLINE = "2h"
CLEANUP_TIMEOUT_S = 300.0  # the refresh between attempts, even past the deadline: nothing may stay half-created
# An update that boots a VM found at the last moment (granted from the queue, or a renewal's successor) runs its
# readiness gate (a cold boot, 8.5-10.5 min; the gate gives up after readinessTimeout, 25 min, plus the boot's
# allowances): the deadline bounds the search for capacity, not that boot.
BOOT_UPDATE_S = 40 * 60.0
LOCK_POLL_S = 60.0  # another update holds the stack (a deploy, a renewal): try again this often until the deadline
LOCAL = "local"  # the one "zone" of a local-target stack (a Docker host)
GKE = "gke"


def parse_deadline(text: str) -> float:
    """'2h' -> 7200, '1h30m' -> 5400, '600' -> 600 seconds."""
    try:
        return float(durations.parse(text))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--deadline") from None


def zone_of(resource_id: str) -> str | None:
    match = re.match(r"projects/[^/]+/zones/([^/]+)/instances/", resource_id)
    return match.group(1) if match else None


@dataclass
class Deployer:
    """One stack's attempts: the callable the sweep runs per zone, and the clean-up after a failed one."""

    pulumi: PulumiCli
    stack: str
    project: str
    extra: Sequence[str]
    compute: ComputeClient | None  # None for a local stack (no zones, nothing to sweep)
    confirm: Callable[[list[Orphan]], bool]
    say: Callable[[str], None]
    orphans: list[dict[str, Any]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # orphans already reported (and deleted, or left) by this run
    settings: Mapping[str, str] = field(default_factory=dict)  # more stack config every attempt sets
    nat: Mapping[str, str] = field(default_factory=dict)  # cloudNatSkipRegions, when nat_settings decided it
    queued: list[dict[str, Any]] = field(default_factory=list)  # each wait in the queue, as queues.Queued.as_dict
    boot_floor_s: float = 0.0  # an attempt's update may outlast the deadline by this much (BOOT_UPDATE_S: renewals)

    def attempt(self, zone: str, seconds_left: float) -> Failure | None:
        """`pulumi up` with the stack's `zone` set to `zone` by the same command (it stays set whatever the outcome;
        after a failed sweep keep_zone_consistent puts the stack's `zone` back)."""
        self.say(f"── {self.stack}: pulumi up in {zone} ({seconds_left / 60:.0f} min left)")
        failure = self.update(zone, max(seconds_left, self.boot_floor_s))
        if failure is not None and zone != LOCAL and failure.kind != "locked":
            self.clean_up([zone])
        return failure

    def update(self, zone: str, seconds_left: float, env: Mapping[str, str] | None = None) -> Failure | None:
        """One `pulumi up` in `zone`; while another update holds the stack, again every LOCK_POLL_S until the time
        is up (a renewal and a deploy of one stack run in separate groups: .github/workflows/pulumi.yml)."""
        config = {**self.nat, **self.settings, **({} if zone == LOCAL else {"zone": zone})}
        began = time.monotonic()
        while True:
            left = seconds_left - (time.monotonic() - began)
            run = self.pulumi.up(self.extra, left, config, env)
            if run.ok:
                return None
            if run.interrupted:
                return Failure("deadline", ZONE, f"interrupted at the deadline after {run.seconds:.0f} s")
            failure = classify(run.output, zone)
            if failure.kind != "locked" or left - run.seconds <= LOCK_POLL_S:
                return failure
            self.say(f"the stack is locked by another update ({failure.reason}); trying again in {LOCK_POLL_S:.0f} s")
            time.sleep(LOCK_POLL_S)

    def queue(self, zone: str, seconds_left: float) -> Failure | None:
        """No zone had a TPU free: wait for one in `zone`. `pulumi up` with the VM withheld makes all it needs and
        exports its insert body; that body goes in with a wait time (deploy/queue.py), then `pulumi up` adopts the
        VM once it runs (the readiness gate, the monitoring). None once it serves; else why not."""
        began = time.monotonic()

        def left() -> float:
            return seconds_left - (time.monotonic() - began)

        self.say(f"── {self.stack}: pulumi up in {zone} without the VM, to queue it ({left() / 60:.0f} min left)")
        failure = self.update(zone, left(), {WITHHOLD_VM_ENV: "1"})
        if failure is not None:
            return failure
        try:
            body = self.pulumi.output("vmInsertBody")
        except (PulumiError, ValueError) as err:
            return Failure("config", STOP, f"the program exported no VM insert body: {err}")
        assert self.compute is not None
        while True:
            wait = queues.wait_for(left())
            if not wait:
                return Failure("capacity", ZONE, f"less than {queues.QUEUE_MIN_S} s left to wait in {zone}'s queue")
            queued = queues.queue_vm(self.compute, self.project, zone, body, wait, self.say)
            self.queued.append(queued.as_dict())
            if queued.outcome == queues.RUNNING:
                break
            if queued.outcome == queues.FAILED:
                failure = classify(queued.reason, zone)
                return failure if failure.kind != "unknown" else Failure("queue", STOP, queued.reason)
            if not queues.wait_for(left()):
                return Failure("capacity", ZONE, f"no TPU granted in {zone} within {durations.human(queued.waited_s)} "
                                                 f"of waiting ({queued.reason})")
        self.say(f"── {self.stack}: pulumi up in {zone}, adopting {body['name']}")
        failure = self.update(zone, max(left(), BOOT_UPDATE_S),
                              {ADOPT_VM_ENV: instance_id(self.project, zone, str(body["name"]))})
        if failure is not None and failure.kind != "locked":
            self.clean_up([zone])  # a VM the update could not adopt is an orphan: found and deleted (or named) here
        return failure

    def clean_up(self, zones: Sequence[str]) -> None:
        """Delete the stack's never-attached cache disks in `zones` (a failed create's), refresh the state (dropping
        pending creates and what is gone), then find and delete what it does not hold in `zones`."""
        self.delete_blank_disks(zones)
        refresh = self.pulumi.refresh(CLEANUP_TIMEOUT_S)
        if not refresh.ok:
            self.say(f"warning: pulumi refresh failed (exit {refresh.returncode}); the orphan sweep goes on")
        if self.compute is None:
            return
        try:
            managed = managed_ids(self.pulumi.export())
            found = [orphan for orphan in find_orphans(self.compute, self.project, zones, stack_labels(self.stack),
                                                       managed) if orphan.resource_id(self.project) not in self.seen]
        except (PulumiError, ComputeApiError, requests.RequestException, ValueError) as err:
            self.say(f"warning: could not look for orphans in {', '.join(zones)}: {err}")
            return
        if not found:
            return
        self.seen.update(orphan.resource_id(self.project) for orphan in found)
        self.say(f"orphans of stack {self.stack} (labelled, not in its state):")
        for orphan in found:
            self.say(f"  {orphan.describe()}")
        delete = self.confirm(found)
        if delete:
            try:
                operations = delete_orphans(self.compute, self.project, found)
                self.say(f"deleting {len(found)}: {', '.join(op for op in operations if op) or 'already gone'}")
            except (ComputeApiError, requests.RequestException) as err:
                self.say(f"warning: could not delete them: {err}; delete them in the console")
                delete = False
        else:
            self.say("left in place: delete them in the console, or run `tpuserve up` again with --yes")
        self.orphans += [{**orphan.as_dict(), "deleted": delete} for orphan in found]


    def delete_blank_disks(self, zones: Sequence[str]) -> None:
        """A zone whose VM create failed keeps the cache disk made for it (the VM depends on it, so it exists first):
        blank, never attached, billing its capacity monthly. Deleted at once: it holds nothing to keep."""
        if self.compute is None:
            return
        try:
            # Each delete waits for its operation, so a blank disk listed again was made again (the update that
            # queues a VM makes it under the same name): deleted again.
            blank = blank_cache_disks(self.compute, self.project, zones, stack_labels(self.stack))
            disks = ZonalDisks(self.compute.session, self.compute.base_url)
            for disk in blank:
                disks.delete(self.project, disk.zone, disk.name)
                self.say(f"deleted cache disk {disk.name} in {disk.zone}: no VM ever attached it, so it held nothing")
                self.orphans.append({**disk.as_dict(), "deleted": True, "why": "a cache disk never attached"})
        except (ComputeApiError, requests.RequestException) as err:
            self.say(f"warning: could not delete the never-attached cache disks in {', '.join(zones)}: {err}")


def progress_line(index: int, attempt: Attempt) -> str:
    outcome = "ok" if attempt.ok else "failed"
    line = f"attempt {index}: {attempt.zone:<18} {outcome:<6} {attempt.kind:<12} {attempt.seconds:7.1f} s"
    if attempt.failure is not None:
        line += f"  {attempt.failure.reason}"
        if attempt.failure.suggested:
            line += f" [suggests {', '.join(attempt.failure.suggested)}]"
    return line


def print_table(console: Any, result: SweepResult) -> None:
    from rich.table import Table

    table = Table(title="attempts", title_justify="left")
    for column in ("#", "round", "zone", "outcome", "class", "seconds"):
        table.add_column(column, justify="right" if column in ("#", "round", "seconds") else "left")
    table.add_column("reason", overflow="fold")
    for index, attempt in enumerate(result.attempts, 1):
        table.add_row(str(index), str(attempt.round), attempt.zone, "ok" if attempt.ok else "failed", attempt.kind,
                      f"{attempt.seconds:.1f}", attempt.failure.reason if attempt.failure else "")
    console.print(table)


def verdict(result: SweepResult, stack: str, candidates: Sequence[str],
            queued: Sequence[Mapping[str, Any]] = ()) -> tuple[int, str, str]:
    """(exit code, one-line outcome, what to do)."""
    if result.ok:
        return exits.OK, f"up in {result.zone} (the stack's `zone` is now {result.zone})", ""
    if result.stopped is not None:
        failure = result.stopped
        return exits.FAILED, f"stopped: {failure.kind}: {failure.reason}", failure.hint.replace("<stack>", stack)
    if queued:
        waited = sum(float(entry.get("waitedSeconds") or 0) for entry in queued)
        return exits.NO_CAPACITY, (f"no capacity: none free in {', '.join(candidates)}, and none granted in "
                                  f"{queued[-1]['zone']}'s queue within {durations.human(waited)}"), \
            "run it again later (a longer --deadline waits longer, up to 2 h per request); the network and caches stay"
    if result.deadline_hit:
        return exits.NO_CAPACITY, f"deadline reached after {len(result.attempts)} attempt(s)", \
            "a longer --deadline, --retry-until-up, or more zones"
    return exits.NO_CAPACITY, f"no capacity in {', '.join(candidates)}", \
        "try again later, add zones (--zones or the stack's `zones`), or --retry-until-up"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--stack", required=True, help="Pulumi stack to deploy.")
@click.option("--zones", help="Comma-separated zones to try, in this order [default: where the stack's VM is, its "
              "`zone`, then its `zones`].")
@click.option("--deadline", "deadline_text", default=DEFAULT_DEADLINE, show_default=True,
              help="Give up after this long (90m, 2h, 1h30m); a `pulumi up` still running then is interrupted.")
@click.option("--queue/--no-queue", default=True, show_default=True,
              help="When no zone has a TPU free now and the stack holds no VM, wait for one in Compute Engine's "
              "queue in the best zone (a flex-start request with a wait time, at most 2 h each) until the deadline.")
@click.option("--retry-until-up", is_flag=True, help="When every zone fails and nothing is queued (a replacement, or "
              "--no-queue), wait (30 s, doubling, at most 10 min) and sweep again until the deadline.")
@click.option("--yes", is_flag=True, help="Delete orphaned VMs and disks the sweep finds without asking.")
@click.option("--skip-preflight", is_flag=True, help="Do not run `tpuserve preflight` first.")
@click.option("--replace-vm", is_flag=True, help="Go ahead when the change replaces the stack's TPU VM (a new "
              "flex-start request and a cold boot); without it such a change stops before anything happens.")
@click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
              show_default=True, help="The Pulumi project directory.")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line: outcome, zone, attempts, orphans.")
@endpoint_option
@click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI UP FLAGS]")
def up(stack: str, zones: str | None, deadline_text: str, queue: bool, retry_until_up: bool, yes: bool,
       skip_preflight: bool, replace_vm: bool, cwd: Path, as_json: bool, endpoints: tuple[str, ...],
       pulumi_args: tuple[str, ...]) -> None:
    """Deploy a stack: find a zone with TPU capacity (preflight, `pulumi up` zone by zone, then Compute Engine's
    queue), clean up.

    Flags after `--` go to every `pulumi up`, e.g. `-- --policy-pack policy`. Exit 0 deployed and ready, 1 stopped
    by an error another zone would not fix, 3 no capacity before the deadline."""
    from rich.console import Console

    from tpuserve.gce import MissingCredentials, adc_session

    deadline_s, roots, started = parse_deadline(deadline_text), Endpoints.parse(endpoints), time.monotonic()
    console = Console(stderr=True)
    closing = ExitStack()  # the API session lives until the command ends

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    def finish(code: int, summary: dict[str, Any]) -> None:
        closing.close()
        cli.finish(code, stack, summary, as_json)

    try:
        pulumi = PulumiCli(stack, cwd, echo=lambda line: click.echo(f"  │ {line}", err=True))
        config = pulumi.config()
        outputs = pulumi.outputs()
    except PulumiError as err:
        say(f"Error: {err}")
        finish(exits.FAILED, {"zone": None, "attempts": [], "reason": str(err), "orphans": []})
    local = config.get("target") == LOCAL
    # A gke stack's TPU node pool queues for flex-start capacity itself (GKE's flex-start provisioning), and moving
    # its zone would move the cluster: one `pulumi up` in the stack's zone, no sweep.
    single_zone = config.get("target") == GKE
    if not local and not config.get("project"):
        raise click.UsageError(f"project: not set in stack {stack}; pulumi config set project <gcp-project-id> "
                               f"--stack {stack}")
    if single_zone and zones:
        raise click.UsageError(f"--zones: stack {stack} is a gke stack, whose node pool waits for capacity in its "
                               f"zone; change the zone with pulumi config set zone <zone> --stack {stack}")
    candidates = [LOCAL] if local else configured_zones(config, outputs, zones)[:1 if single_zone else None]
    region = config.get("region")
    if region and any(not zone.startswith(f"{region}-") for zone in candidates):
        raise click.UsageError(f"region: the stack pins Cloud NAT to {region}, but the sweep may try "
                               f"{', '.join(z for z in candidates if not z.startswith(f'{region}-'))}; unset it "
                               f"(pulumi config rm region --stack {stack}: NAT then follows the zone) or limit --zones")

    compute, nat_config, report = None, {}, None
    settings = pin_image(config, roots.registry, say, lambda reason: finish(
        exits.FAILED, {"zone": None, "attempts": [], "reason": reason, "orphans": []}))
    if not local:
        try:
            session = closing.enter_context(adc_session())
        except MissingCredentials as err:
            say(f"Error: {err}")
            finish(exits.FAILED, {"zone": None, "attempts": [], "reason": str(err), "orphans": []})
        compute = ComputeClient(session, roots.compute)
        own = own_nats(pulumi, say)
        target = target_from_config(config, candidates, stack, own or frozenset())
        if not skip_preflight:
            report = preflight(session, target, roots)
            print_report(console, report)
            if report.failed:
                finish(exits.FAILED, {"zone": None, "attempts": [], "reason": "preflight failed", "orphans": [],
                                     "preflight": report.as_dict()})
            candidates = report.usable_zones
        nat_config = nat_settings(session, roots, target, report, own is not None, say)
        if not single_zone and not zones:
            candidates = warm_cache_first(session, roots, str(config.get("project")), stack, candidates,
                                          outputs.get("zone"), say)

    interactive = sys.stdin.isatty()

    def confirm(found: list[Orphan]) -> bool:
        if yes:
            return True
        if not interactive:
            return False
        return click.confirm(f"Delete these {len(found)} orphaned resource(s)?", default=True, err=True)

    deployer = Deployer(pulumi, stack, str(config.get("project", "")), pulumi_args, compute, confirm, say,
                        nat=nat_config, settings=settings)
    original_zone = config.get("zone")
    if compute is not None and not single_zone and vm_gone(compute, config, outputs):
        say(f"the stack's VM {outputs['instanceName']} is gone (flex-start deletes it when its run ends): refreshing "
            "the state")
        if not pulumi.refresh(CLEANUP_TIMEOUT_S).ok:
            say("warning: pulumi refresh failed; the VM stays in the state and is not queued for")
        outputs = {key: value for key, value in outputs.items() if key != "instanceName"}
    queueing = queue and compute is not None and not single_zone and not has_vm(pulumi, outputs)
    if compute is not None and not single_zone and has_vm(pulumi, outputs):
        try:
            look = look_before_leaping(pulumi, stack, config, outputs, compute, report, pulumi_args, say,
                                       {**nat_config, **settings})
        except PreviewFailed as err:
            say(f"Error: {err}")
            finish(exits.FAILED, {"zone": None, "attempts": [], "reason": str(err), "orphans": []})
        if look.refused is not None and not replace_vm and not (interactive and click.confirm(
                "Replace the VM?", default=False, err=True)):
            say(look.refused)
            finish(exits.NEEDS_CONSENT, {"zone": None, "attempts": [], "reason": look.refused, "orphans": [],
                                        "replace": look.replace})
        deployer.settings = {**deployer.settings, **look.settings}
    say(f"trying {', '.join(candidates)} for stack {stack} (deadline {deadline_text})"
        + (", then the queue of the best zone" if queueing else ""))
    numbers = itertools.count(1)
    result = sweep(candidates, deployer.attempt, deadline_s - (time.monotonic() - started),
                   retry_until_up=retry_until_up and not (local or single_zone or queueing),
                   on_attempt=lambda attempt: say(progress_line(next(numbers), attempt)),
                   on_wait=lambda seconds, next_round: say(f"every zone failed; sweep {next_round} in {seconds:.0f} s"))
    zone_to_queue = queue_zone(candidates, result) if queueing and not result.ok and result.stopped is None \
        and not result.deadline_hit else None
    if zone_to_queue is not None:
        began = time.monotonic()
        failure = deployer.queue(zone_to_queue, deadline_s - (time.monotonic() - started))
        result.attempts.append(done := Attempt(zone_to_queue, result.attempts[-1].round + 1 if result.attempts else 1,
                                               time.monotonic() - began, failure))
        say(progress_line(next(numbers), done))
        if failure is None:
            result.zone = zone_to_queue
        elif failure.block == STOP:
            result.stopped = failure
    if not local:
        tried = list(dict.fromkeys(attempt.zone for attempt in result.attempts))
        if tried:  # a create that timed out may have finished since its zone was swept; the state says what stays
            deployer.clean_up(tried)
        if not result.ok:
            keep_zone_consistent(pulumi, original_zone)
        keep_slot_consistent(pulumi, config, deployer.settings)
    print_table(console, result)
    code, outcome, todo = verdict(result, stack, candidates, deployer.queued)
    say(outcome)
    if todo:
        say(todo)
    if result.ok and not local:
        endpoint = pulumi.outputs().get("iapTunnelCommand")
        if endpoint:
            say(f"reach it: {endpoint}")
    alerts = None
    if result.ok and compute is not None:  # serving: the alert policies whose metrics had not arrived yet
        from tpuserve.ops.alerts import create_pending_alerts

        alerts = create_pending_alerts(pulumi, stack, session, roots.monitoring, pulumi_args, say)
    stock = None
    if compute is not None:
        stock = take_inventory(pulumi, stack, config, session, roots, say)
        if stock is not None and stock.billing_orphans:
            stock = remove_orphans(stock, pulumi, stack, config, session, roots, confirm, say)
        if stock is not None and stock.billing_orphans and code == exits.OK:
            say(f"Error: {len(stock.billing_orphans)} orphan(s) that bill are left (above, each with the command that "
                "removes it); run `tpuserve up` again with --yes to delete them")
            code = exits.ORPHANS
    finish(code, {"zone": result.zone, "attempts": [attempt.as_dict() for attempt in result.attempts],
                  "reason": None if result.ok else outcome, "hint": todo or None, "orphans": deployer.orphans,
                  "queue": deployer.queued, "inventory": None if stock is None else stock.as_dict(), "alerts": alerts})


def own_nats(pulumi: PulumiCli, say: Callable[[str], None]) -> frozenset[tuple[str, str, str]] | None:
    """The Cloud NATs the stack's state holds; None when the state cannot be read, and then nothing is decided about
    NAT (a NAT taken for another stack's would be dropped by the next update)."""
    try:
        return frozenset(nat.own_nats(pulumi.export()))
    except (PulumiError, ValueError) as err:
        say(f"warning: could not read the stack's state ({err}); its Cloud NAT stays as its config says")
        return None


def nat_settings(session: Any, roots: Endpoints, target: Any, report: Report | None, decide: bool,
                 say: Callable[[str], None]) -> dict[str, str]:
    """`cloudNatSkipRegions` for every update of the sweep: the candidate regions where another stack's Cloud NAT
    serves the network, so this stack never makes a second one (tpuserve/deploy/nat.py). Preflight's answer when it
    ran; else the routers are listed here. Nothing when the stack makes no NAT anyway or the routers (or its state)
    could not be read: its saved setting then stands."""
    if not decide or not target.makes_nat:
        return {}
    plan = report.nat if report is not None else None
    if report is None:
        try:
            plan = nat_plan(session, roots, target)
        except (ComputeApiError, requests.RequestException) as err:
            say(f"warning: could not list the routers ({err}); Cloud NAT stays as the stack's config says")
            return {}
        for line in plan.lines():
            say(line)
    return plan.settings() if plan is not None else {}


def pin_image(config: Mapping[str, Any], registry_url: str, say: Callable[[str], None],
              stop: Callable[[str], None]) -> dict[str, str]:
    """A TPU stack whose containerImage names a tag deploys the digest that tag names now (tpuserve/registry.py),
    saved in the stack config by the first `pulumi up`, so every boot of this deploy runs the same image while the
    tag moves on. Nothing to pin (the default is a pinned digest): no setting. A registry that cannot say: stop
    before anything is created."""
    from tpuserve.registry import RegistryError, pin_for_deploy

    if config.get("target", "gcp") not in ("gcp", GKE):
        return {}
    configured = str(config.get("containerImage") or "")
    try:
        pinned = pin_for_deploy(configured, registry_url)
    except RegistryError as err:
        say(f"Error: containerImage: {err}")
        stop(f"containerImage: {err}")
        return {}
    if not pinned:
        return {}
    say(f"containerImage {configured} is a tag: deploying the digest it names now, {pinned.partition('@')[2]} "
        "(saved in the stack config; run `tpuserve up` again to move to a newer one)")
    return {"containerImage": pinned}


def warm_cache_first(session: Any, roots: Endpoints, project: str, stack: str, candidates: list[str],
                     current_zone: str | None, say: Any) -> list[str]:
    """The zones holding one of the stack's warm cache disks first (`tpuserve cache ls`: image layers, weights and
    compile cache make the boot there minutes shorter), after the zone the stack's VM is in now (an update there
    keeps it). A failed listing only loses the ordering."""
    from tpuserve.deploy import inventory

    try:
        caches = cache_disks(ZonalDisks(session, roots.compute), project, stack)
    except (ComputeApiError, requests.RequestException) as err:
        say(f"warning: could not list the stack's cache disks ({err}); trying zones in their configured order")
        return candidates
    markers = inventory.warm_markers(inventory.clients_for(session, roots), project, [stack],
                                     inventory.Inventory(project, (stack,)))
    pinned = [current_zone] if current_zone in candidates else []
    ordered = pinned + zones_by_warm_cache([zone for zone in candidates if zone not in pinned], caches, markers)
    warm = [disk.zone for disk in caches if disk.zone in candidates and is_warm(disk, markers)]
    if warm:
        say(f"warm cache disk in {', '.join(sorted(set(warm)))}: tried first")
    return ordered


def take_inventory(pulumi: PulumiCli, stack: str, config: Mapping[str, Any], session: Any, roots: Endpoints,
                   say: Callable[[str], None]) -> Any:
    """Everything the stack owns now (tpuserve inventory), said in a few lines; None when it cannot be taken."""
    from tpuserve.deploy import inventory

    try:
        stock = inventory.stock_of(pulumi, inventory.clients_for(session, roots),
                                   str(config.get("project", "")), inventory.keep_caches(config),
                                   float(config.get("pricePerChipHour") or PRICE_PER_CHIP_HOUR))
    except (PulumiError, requests.RequestException, ComputeApiError) as err:
        say(f"warning: could not take the stack's inventory: {err}")
        return None
    for line in inventory.summary_lines(stock):
        say(line)
    return stock


def remove_orphans(stock: Any, pulumi: PulumiCli, stack: str, config: Mapping[str, Any], session: Any,
                   roots: Endpoints, confirm: Callable[[list[Orphan]], bool], say: Callable[[str], None]) -> Any:
    """Delete the billing orphans the inventory found, anywhere, once the user agrees (or --yes); the inventory
    again after."""
    from tpuserve.deploy import inventory

    orphans = stock.billing_orphans
    if not confirm([Orphan(f"{item.kind}s", item.location, item.name, "", "") for item in orphans]):
        return stock
    failed = inventory.delete_items(inventory.clients_for(session, roots), stock.project, orphans)
    for line in failed:
        say(f"warning: could not delete {line}")
    say(f"deleted {len(orphans) - len(failed)} orphan(s): {', '.join(f'{i.kind} {i.name}' for i in orphans)}")
    return take_inventory(pulumi, stack, config, session, roots, say)


def queue_zone(candidates: Sequence[str], result: SweepResult) -> str | None:
    """Where to wait: the first candidate (the current zone, then those with a warm cache disk: warm_cache_first) that
    no lasting failure rules out (no quota in its region, no such machine type there)."""
    lasting = [attempt.failure for attempt in result.attempts if attempt.failure and attempt.failure.lasting]
    zones = {attempt.zone for attempt in result.attempts if attempt.failure in lasting and attempt.failure.block == ZONE}
    regions = {failure.region or "" for failure in lasting if failure.block == REGION}
    regions |= {region_of(a.zone) for a in result.attempts if a.failure in lasting and a.failure.block == REGION}
    return next((zone for zone in candidates if zone not in zones and region_of(zone) not in regions), None)


def vm_gone(compute: ComputeClient, config: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    """The outputs name a VM that the Compute API no longer has (a flex-start VM is deleted when its run ends)."""
    from tpuserve.gce import Instance

    name, zone = outputs.get("instanceName"), outputs.get("zone") or config.get("zone")
    if not name or not zone:
        return False
    try:
        compute.instance(Instance(str(outputs.get("project") or config.get("project")), str(zone), str(name)))
    except ComputeApiError as err:
        return err.status == 404
    except requests.RequestException:
        return False
    return False


def has_vm(pulumi: PulumiCli, outputs: Mapping[str, Any]) -> bool:
    """The stack holds a TPU VM now (its outputs name one, or its state does)."""
    if outputs.get("instanceName"):
        return True
    try:
        return any(zone_of(resource_id) for resource_id in managed_ids(pulumi.export()))
    except PulumiError:
        return False


@dataclass(frozen=True)
class Look:
    """What the preview found: settings the next `pulumi up` needs, and the reason to stop when the VM would be
    replaced (None when nothing stateful is lost)."""

    settings: dict[str, str]
    refused: str | None = None
    replace: dict[str, Any] | None = None


def look_before_leaping(pulumi: PulumiCli, stack: str, config: Mapping[str, Any], outputs: Mapping[str, Any],
                        compute: ComputeClient, report: Report | None, extra: Sequence[str],
                        say: Callable[[str], None], settings: Mapping[str, str] | None = None) -> Look:
    """Preview the stack in the zone its VM is in; when the VM or its cache disk would be replaced or deleted, say so
    with what it costs and choose the order (deploy/preview.py)."""
    zone = str(outputs.get("zone") or config.get("zone") or "")
    run = pulumi.preview(extra, PREVIEW_TIMEOUT_S, {**(settings or {}), **({"zone": zone} if zone else {})})
    try:
        plan = previews.parse(run.output)
    except ValueError as err:
        raise PreviewFailed(f"pulumi preview failed (exit {run.returncode}): {err}") from None
    if not run.ok:
        errors = [d.get("message", "").strip() for d in json.loads(run.output).get("diagnostics", [])
                  if d.get("severity") == "error" and d.get("message", "").strip()]
        raise PreviewFailed(f"pulumi preview failed (exit {run.returncode}): "
                            f"{errors[-1] if errors else 'see its output above'}")
    for line in previews.summary_lines(plan):
        say(line)
    losing = plan.losing
    if not losing:
        if not plan.in_place:
            say("the TPU VM is not changed by this update")
        return Look({})
    vm = plan.vm_replacement() or losing[0]
    chips = tpu_chips(str(vm.new_inputs.get("machineType") or config.get("machineType") or "ct6e-standard-1t")) or 1
    delete_first, why = replacement_order(compute, str(config.get("project", "")), zone, chips, report)
    same_zone = str(vm.old_inputs.get("zone", zone)) == str(vm.new_inputs.get("zone", zone))
    cost = previews.Replacement(chips=chips, max_run_seconds=new_run_seconds(vm, outputs),
                                price_per_chip_hour=float(config.get("pricePerChipHour") or PRICE_PER_CHIP_HOUR),
                                delete_first=delete_first, same_zone=same_zone)
    lines = cost.lines(vm, stack)
    if why:
        lines.insert(-1, f"  {why}")
    for line in lines:
        say(line)
    settings: dict[str, str] = {}
    if delete_first:
        settings["replaceOrder"] = "delete-first"
    elif same_zone:  # a name can exist once per zone: the successor takes the stack's other name (and cache slot)
        settings["vmSlot"] = "b" if str(config.get("vmSlot") or "a") == "a" else "a"
    keys = previews.losing_keys(losing)
    refused = (f"stopped: this change replaces {vm.what} ({', '.join(keys) or 'see the preview'}); run again with "
               "--replace-vm to go ahead")
    return Look(settings, refused, {"what": [step.what for step in losing], "keys": keys,
                                    "changes": vm.changes(), "deleteFirst": delete_first})


class PreviewFailed(RuntimeError):
    """The preview itself failed: `pulumi up` would fail the same way."""


def new_run_seconds(step: previews.Step, outputs: Mapping[str, Any]) -> int:
    """The successor's max run: the Instance's new `scheduling.maxRunDuration.seconds`, else the stack's current."""
    scheduling = step.new_inputs.get("scheduling") or {}
    seconds = (scheduling.get("maxRunDuration") or {}).get("seconds") if isinstance(scheduling, dict) else None
    return int(float(seconds or outputs.get("maxRunSeconds") or 4 * 3600))


def replacement_order(compute: ComputeClient, project: str, zone: str, chips: int,
                      report: Report | None) -> tuple[bool, str]:
    """(delete first?, why): create-before-delete needs room in the region's TPU quota for the old VM and its
    successor at once; the quota's limit comes from preflight, the chips in use from the project's instances."""
    region = region_of(zone)
    limit = report.tpu_limits.get(region) if report is not None else None
    if limit is None or limit == -1:
        return False, "" if limit == -1 else "(the region's TPU quota was not read: assuming room for both VMs)"
    try:
        used = sum(tpu_chips(str(instance.get("machineType", ""))) for instance in compute.aggregated_instances(project)
                   if region_of(str(instance.get("zone", "")).rsplit("/", 1)[-1]) == region
                   and instance.get("status") not in ("TERMINATED", "STOPPED", "SUSPENDED"))
    except (ComputeApiError, requests.RequestException) as err:
        return False, f"(could not count the chips in use in {region}: {err}; assuming room for both VMs)"
    if limit - used >= chips:
        return False, ""
    return True, (f"{region}'s TPU v6e quota is {limit} chip(s) and {used} are in use: no room for a successor "
                  f"of {chips} beside the old VM")


def keep_slot_consistent(pulumi: PulumiCli, config: Mapping[str, Any], settings: Mapping[str, str]) -> None:
    """`vmSlot` names the VM the state holds, and a one-run `replaceOrder` goes back to what the stack said."""
    try:
        if "replaceOrder" in settings:
            previous = config.get("replaceOrder")
            if previous:
                pulumi.set_config("replaceOrder", str(previous))
            else:
                pulumi.remove_config("replaceOrder")
        if "vmSlot" in settings:
            slot = pulumi.outputs().get("vmSlot")  # the last deployment's: a failed update leaves them as they were
            if slot and slot != settings["vmSlot"]:
                pulumi.set_config("vmSlot", str(slot))
    except PulumiError as err:
        click.echo(f"warning: could not restore the stack's vmSlot/replaceOrder: {err}", err=True)


def keep_zone_consistent(pulumi: PulumiCli, original_zone: str | None) -> None:
    """After a failed sweep the stack's `zone` names where its VM is (a VM whose gate failed stays), else what it
    was before the sweep, so the next `pulumi up` does not move anything by surprise."""
    try:
        zones = [zone for resource_id in managed_ids(pulumi.export()) if (zone := zone_of(resource_id))]
        if zones:
            pulumi.set_config("zone", zones[0])
        elif original_zone:
            pulumi.set_config("zone", str(original_zone))
        else:
            pulumi.remove_config("zone")
    except PulumiError as err:
        click.echo(f"warning: could not restore the stack's zone: {err}", err=True)
