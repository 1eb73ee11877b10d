"""`tpuserve up`: deploy a stack in the first zone with a TPU for it (else in Compute Engine's queue), leaving
nothing behind in the others. What it does: docs/getting-a-tpu.md; how the code is split: docs/design/capacity.md."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click
import requests

from tpuserve import cli, durations, exits
from tpuserve.deploy import inventory, nat
from tpuserve.deploy import preview as previews
from tpuserve.deploy import queue as queues
from tpuserve.deploy.cache import cache_disks, is_warm, zones_by_warm_cache
from tpuserve.deploy.capacity import classify
from tpuserve.deploy.orphans import blank_cache_disks, delete_orphans, find_orphans, managed_ids
from tpuserve.deploy.preflight import (Endpoints, Report, configured_zones, endpoint_option, preflight, print_report,
                                       target_from_config)
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError, echo_indented, require_project
from tpuserve.deploy.sweep import REGION, STOP, ZONE, Attempt, Failure, SweepResult, sweep
from tpuserve.facts import PRICE_PER_CHIP_HOUR
from tpuserve.flex_start import ADOPT_VM_ENV, WITHHOLD_VM_ENV, instance_id
from tpuserve.gce import ComputeApiError, ComputeClient, Instance, ZonalDisks
from tpuserve.names import stack_labels
from tpuserve.ops.alerts import create_pending_alerts
from tpuserve.serving import tpu_chips
from tpuserve.zones import region_of

PREVIEW_TIMEOUT_S = 600.0
DEFAULT_DEADLINE = "2h"
CLEANUP_TIMEOUT_S = 300.0  # the refresh between attempts, even past the deadline: nothing may stay half-created
BOOT_UPDATE_S = 40 * 60.0  # the update booting a VM found at the deadline may outlast it (docs/design/capacity.md)
LOCK_POLL_S = 60.0  # another update holds the stack (a deploy, a renewal): try again this often until the deadline
LOCAL = "local"  # the one "zone" of a local-target stack (a Docker host)
GKE = "gke"


def parse_deadline(text: str, option: str = "--deadline") -> float:
    """'2h' -> 7200, '1h30m' -> 5400, '600' -> 600 seconds."""
    try:
        return float(durations.parse(text))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=option) from None


def zone_of(resource_id: str) -> str | None:
    match = re.match(r"projects/[^/]+/zones/([^/]+)/instances/", resource_id)
    return match.group(1) if match else None


def stderr_console() -> tuple[Any, Callable[[str], None]]:
    """The console a deploy command prints on, and its `say`: one plain line."""
    from rich.console import Console

    console = Console(stderr=True)
    return console, lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


@dataclass
class Outcome:
    """How `up` and `renew` speak (lines on stderr) and end (their --json document; `early`: fields before a sweep)."""

    stack: str
    as_json: bool
    early: dict[str, Any]
    closing: ExitStack = field(default_factory=ExitStack)  # the API session lives until the command ends

    def __post_init__(self) -> None:
        self.console, self.say = stderr_console()

    def finish(self, code: int, summary: dict[str, Any]) -> NoReturn:
        self.closing.close()
        cli.finish(code, self.stack, summary, self.as_json)

    def stop(self, reason: str, said: str | None = None, **more: Any) -> NoReturn:
        self.say(f"Error: {said or reason}")
        self.finish(exits.FAILED, {**self.early, "reason": reason, **more})

    def open(self, cwd: Path) -> tuple[PulumiCli, dict[str, Any], dict[str, Any]]:
        """The stack's CLI, config and outputs."""
        try:
            pulumi = PulumiCli(self.stack, cwd, echo=echo_indented)
            return pulumi, pulumi.config(), pulumi.outputs()
        except PulumiError as err:
            self.stop(str(err))

    def session(self) -> Any:
        """An API session with the application-default credentials, closed when the command ends."""
        from tpuserve import gce

        try:
            return self.closing.enter_context(gce.adc_session())
        except gce.MissingCredentials as err:
            self.stop(str(err))


def orphan_confirmation(yes: bool) -> Callable[[Sequence[Any]], bool]:
    """Whether to delete what was found: --yes, else a person at a terminal who agrees."""
    def confirm(found: Sequence[Any]) -> bool:
        return yes or (sys.stdin.isatty() and click.confirm(f"Delete these {len(found)} orphaned resource(s)?",
                                                            default=True, err=True))
    return confirm


@dataclass
class Deployer:
    """One stack's attempts: the callable the sweep runs per zone, and the clean-up after a failed one."""

    pulumi: PulumiCli
    stack: str
    project: str
    extra: Sequence[str]
    compute: ComputeClient | None  # None for a local stack (no zones, nothing to sweep)
    confirm: Callable[[Sequence[Any]], bool]
    say: Callable[[str], None]
    orphans: list[dict[str, Any]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # orphans already reported (and deleted, or left) by this run
    settings: Mapping[str, str] = field(default_factory=dict)  # more stack config every attempt sets
    queued: list[dict[str, Any]] = field(default_factory=list)  # each wait in the queue, as queues.Queued.as_dict
    boot_floor_s: float = 0.0  # an attempt's update may outlast the deadline by this much (BOOT_UPDATE_S: renewals)
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # of the progress lines

    def attempt(self, zone: str, seconds_left: float) -> Failure | None:
        """`pulumi up` with the stack's `zone` set to `zone`, then the clean-up of a failure."""
        self.say(f"── {self.stack}: pulumi up in {zone} ({seconds_left / 60:.0f} min left)")
        failure = self.update(zone, max(seconds_left, self.boot_floor_s))
        if failure is not None and zone != LOCAL and failure.kind != "locked":
            self.clean_up([zone])
        return failure

    def update(self, zone: str, seconds_left: float, env: Mapping[str, str] | None = None) -> Failure | None:
        """One `pulumi up` in `zone`; while another update holds the stack, again every LOCK_POLL_S."""
        config = {**self.settings, **({} if zone == LOCAL else {"zone": zone})}
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
        """Wait for a TPU in `zone`: update without the VM, queue its insert, adopt it once it runs; None: it serves."""
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
        """Blank cache disks deleted, the state refreshed, orphans in `zones` deleted (inventory.md#two-sweeps)."""
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
        """The cache disks a failed create left in `zones`, never attached: deleted at once, they hold nothing."""
        if self.compute is None:
            return
        try:
            # Each delete is waited for, so a blank disk listed again was made again (by a queueing update).
            blank = blank_cache_disks(self.compute, self.project, zones, stack_labels(self.stack))
            disks = ZonalDisks(self.compute.session, self.compute.base_url)
            for disk in blank:
                disks.delete(self.project, disk.zone, disk.name)
                self.say(f"deleted cache disk {disk.name} in {disk.zone}: no VM ever attached it, so it held nothing")
                self.orphans.append({**disk.as_dict(), "deleted": True, "why": "a cache disk never attached"})
        except (ComputeApiError, requests.RequestException) as err:
            self.say(f"warning: could not delete the never-attached cache disks in {', '.join(zones)}: {err}")

    def progress(self, attempt: Attempt) -> None:
        self.say(progress_line(next(self.numbers), attempt))

    def run(self, candidates: Sequence[str], seconds: float, **options: Any) -> SweepResult:
        """The sweep over `candidates` (`options` go to `sweep`), a progress line per attempt."""
        return sweep(candidates, self.attempt, seconds, on_attempt=self.progress, **options)

    def settle(self, result: SweepResult, config: Mapping[str, Any], original_zone: str | None) -> None:
        """After a sweep: each zone tried swept again (a timed-out create may have ended); `zone`, `vmSlot` restored."""
        tried = list(dict.fromkeys(attempt.zone for attempt in result.attempts))
        if tried:
            self.clean_up(tried)
        if not result.ok:
            keep_zone_consistent(self.pulumi, original_zone)
        keep_slot_consistent(self.pulumi, config, self.settings)


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
@cli.cwd_option
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
    deadline_s, roots, started = parse_deadline(deadline_text), Endpoints.parse(endpoints), time.monotonic()
    run = Outcome(stack, as_json, {"zone": None, "attempts": [], "orphans": []})
    console, say, finish = run.console, run.say, run.finish
    pulumi, config, outputs = run.open(cwd)
    local = config.get("target") == LOCAL
    # A gke stack's node pool queues for capacity itself, and moving its zone would move the cluster: no sweep.
    single_zone = config.get("target") == GKE
    if not local:
        require_project(config, stack)
    if single_zone and zones:
        raise click.UsageError(f"--zones: stack {stack} is a gke stack, whose node pool waits for capacity in its "
                               f"zone; change the zone with pulumi config set zone <zone> --stack {stack}")
    candidates = [LOCAL] if local else configured_zones(config, outputs, zones)[:1 if single_zone else None]
    region = config.get("region")
    if region and any(not zone.startswith(f"{region}-") for zone in candidates):
        raise click.UsageError(f"region: the stack pins Cloud NAT to {region}, but the sweep may try "
                               f"{', '.join(z for z in candidates if not z.startswith(f'{region}-'))}; unset it "
                               f"(pulumi config rm region --stack {stack}: NAT then follows the zone) or limit --zones")

    compute, report, session = None, None, None
    settings = pin_image(config, roots.registry, say, run.stop)
    if not local:
        session = run.session()
        compute = ComputeClient(session, roots.compute)
        own = own_nats(pulumi, say)
        target = target_from_config(config, candidates, stack, own or frozenset())
        if not skip_preflight:
            report = preflight(session, target, roots)
            print_report(console, report)
            if report.failed:
                finish(exits.FAILED, {**run.early, "reason": "preflight failed", "preflight": report.as_dict()})
            candidates = report.usable_zones
        settings = {**nat_settings(session, roots, target, report, own is not None, say), **settings}
        if not single_zone and not zones:
            candidates = warm_cache_first(session, roots, str(config.get("project")), stack, candidates,
                                          outputs.get("zone"), say)

    confirm = orphan_confirmation(yes)
    deployer = Deployer(pulumi, stack, str(config.get("project", "")), pulumi_args, compute, confirm, say,
                        settings=settings)
    sweeps_zones = not (local or single_zone)
    if sweeps_zones and vm_gone(compute, config, outputs):
        say(f"the stack's VM {outputs['instanceName']} is gone (flex-start deletes it when its run ends): refreshing "
            "the state")
        if not pulumi.refresh(CLEANUP_TIMEOUT_S).ok:
            say("warning: pulumi refresh failed; the VM stays in the state and is not queued for")
        outputs = {key: value for key, value in outputs.items() if key != "instanceName"}
    holds_vm = sweeps_zones and has_vm(pulumi, outputs)
    queueing = queue and sweeps_zones and not holds_vm
    if holds_vm:
        try:
            look = look_before_leaping(pulumi, stack, config, outputs, compute, report, pulumi_args, say, settings)
        except PreviewFailed as err:
            run.stop(str(err))
        if look.refused is not None and not replace_vm and not (sys.stdin.isatty() and click.confirm(
                "Replace the VM?", default=False, err=True)):
            say(look.refused)
            finish(exits.NEEDS_CONSENT, {**run.early, "reason": look.refused, "replace": look.replace})
        deployer.settings = {**deployer.settings, **look.settings}
    say(f"trying {', '.join(candidates)} for stack {stack} (deadline {deadline_text})"
        + (", then the queue of the best zone" if queueing else ""))
    result = deployer.run(candidates, deadline_s - (time.monotonic() - started),
                          retry_until_up=retry_until_up and not (local or single_zone or queueing),
                          on_wait=lambda seconds, next_round: say(f"every zone failed; sweep {next_round} in "
                                                                  f"{seconds:.0f} s"))
    zone_to_queue = queue_zone(candidates, result) if queueing and not result.ok and result.stopped is None \
        and not result.deadline_hit else None
    if zone_to_queue is not None:
        began = time.monotonic()
        failure = deployer.queue(zone_to_queue, deadline_s - (time.monotonic() - started))
        result.attempts.append(done := Attempt(zone_to_queue, result.attempts[-1].round + 1 if result.attempts else 1,
                                               time.monotonic() - began, failure))
        deployer.progress(done)
        if failure is None:
            result.zone = zone_to_queue
        elif failure.block == STOP:
            result.stopped = failure
    if not local:
        deployer.settle(result, config, config.get("zone"))
    print_table(console, result)
    code, outcome, todo = verdict(result, stack, candidates, deployer.queued)
    say(outcome)
    if todo:
        say(todo)
    alerts, stock = None, None
    if result.ok and not local:
        if endpoint := pulumi.outputs().get("iapTunnelCommand"):
            say(f"reach it: {endpoint}")
        # serving: the alert policies whose metrics had not arrived yet
        alerts = create_pending_alerts(pulumi, stack, session, roots.monitoring, pulumi_args, say)
    if not local:
        code, stock = inventory.close_run(pulumi, config, session, roots, confirm, say, code, "tpuserve up")
    finish(code, {"zone": result.zone, "attempts": [attempt.as_dict() for attempt in result.attempts],
                  "reason": None if result.ok else outcome, "hint": todo or None, "orphans": deployer.orphans,
                  "queue": deployer.queued, "inventory": None if stock is None else stock.as_dict(), "alerts": alerts})


def own_nats(pulumi: PulumiCli, say: Callable[[str], None]) -> frozenset[tuple[str, str, str]] | None:
    """The Cloud NATs the stack's state holds; None when unreadable (then nothing about NAT is decided)."""
    try:
        return frozenset(nat.own_nats(pulumi.export()))
    except (PulumiError, ValueError) as err:
        say(f"warning: could not read the stack's state ({err}); its Cloud NAT stays as its config says")
        return None


def nat_settings(session: Any, roots: Endpoints, target: Any, report: Report | None, decide: bool,
                 say: Callable[[str], None]) -> dict[str, str]:
    """`cloudNatSkipRegions` for every update, from preflight or the routers (design/cloud-nat.md); {}: undecided."""
    if not decide or not target.makes_nat:
        return {}
    plan = report.nat if report is not None else None
    if report is None:
        try:
            plan = target.nat_plan(nat.list_nats(session, target.project, roots.compute))
        except (ComputeApiError, requests.RequestException) as err:
            say(f"warning: could not list the routers ({err}); Cloud NAT stays as the stack's config says")
            return {}
        for line in plan.lines():
            say(line)
    return plan.settings() if plan is not None else {}


def pin_image(config: Mapping[str, Any], registry_url: str, say: Callable[[str], None],
              stop: Callable[[str], None]) -> dict[str, str]:
    """A TPU stack's containerImage tag pinned to its digest now (saved in the stack config); a failure stops."""
    from tpuserve.registry import RegistryError, pin_for_deploy

    if config.get("target", "gcp") not in ("gcp", GKE):
        return {}
    configured = str(config.get("containerImage") or "")
    try:
        pinned = pin_for_deploy(configured, registry_url)
    except RegistryError as err:
        stop(f"containerImage: {err}")
        return {}
    if not pinned:
        return {}
    say(f"containerImage {configured} is a tag: deploying the digest it names now, {pinned.partition('@')[2]} "
        "(saved in the stack config; run `tpuserve up` again to move to a newer one)")
    return {"containerImage": pinned}


def warm_cache_first(session: Any, roots: Endpoints, project: str, stack: str, candidates: list[str],
                     current_zone: str | None, say: Any) -> list[str]:
    """The zone of the stack's VM, then those with a warm cache disk, then the rest (a failed listing: as is)."""
    try:
        caches = cache_disks(ZonalDisks(session, roots.compute), project, stack)
    except (ComputeApiError, requests.RequestException) as err:
        say(f"warning: could not list the stack's cache disks ({err}); trying zones in their configured order")
        return candidates
    markers = inventory.Look(session, roots, project, (stack,)).warm_markers()
    pinned = [current_zone] if current_zone in candidates else []
    ordered = pinned + zones_by_warm_cache([zone for zone in candidates if zone not in pinned], caches, markers)
    warm = [disk.zone for disk in caches if disk.zone in candidates and is_warm(disk, markers)]
    if warm:
        say(f"warm cache disk in {', '.join(sorted(set(warm)))}: tried first")
    return ordered


def queue_zone(candidates: Sequence[str], result: SweepResult) -> str | None:
    """Where to wait: the first candidate no lasting failure rules out (no quota in its region, no machine type)."""
    lasting = [(a.zone, a.failure) for a in result.attempts if a.failure and a.failure.lasting]
    zones = {zone for zone, failure in lasting if failure.block == ZONE}
    regions = {where for zone, failure in lasting if failure.block == REGION
               for where in (failure.region, region_of(zone))}
    return next((zone for zone in candidates if zone not in zones and region_of(zone) not in regions), None)


def vm_gone(compute: ComputeClient, config: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    """The outputs name a VM that the Compute API no longer has (a flex-start VM is deleted when its run ends)."""
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
    """What the preview found: settings the next `pulumi up` needs, and why to stop when the VM would be replaced."""

    settings: dict[str, str]
    refused: str | None = None
    replace: dict[str, Any] | None = None


class PreviewFailed(RuntimeError):
    """The preview itself failed: `pulumi up` would fail the same way."""


def look_before_leaping(pulumi: PulumiCli, stack: str, config: Mapping[str, Any], outputs: Mapping[str, Any],
                        compute: ComputeClient, report: Report | None, extra: Sequence[str],
                        say: Callable[[str], None], settings: Mapping[str, str] | None = None) -> Look:
    """Preview in the VM's zone; a replaced VM or cache disk is said with its cost, its order chosen (capacity.md)."""
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
    chips = tpu_chips(str(vm.new_inputs.get("machineType") or config.get("machineType") or "")) or 1
    delete_first, why = replacement_order(compute, str(config.get("project", "")), zone, chips, report)
    # the successor's max run: the Instance's new `scheduling.maxRunDuration.seconds`, else the stack's current
    scheduling = vm.new_inputs.get("scheduling") or {}
    seconds = (scheduling.get("maxRunDuration") or {}).get("seconds") if isinstance(scheduling, dict) else None
    max_run_s, price = int(float(seconds or outputs.get("maxRunSeconds") or 4 * 3600)), float(
        config.get("pricePerChipHour") or PRICE_PER_CHIP_HOUR)
    for line in previews.replacement_lines(vm, stack, chips, max_run_s, price, delete_first, why):
        say(line)
    settings: dict[str, str] = {}
    if delete_first:
        settings["replaceOrder"] = "delete-first"
    elif str(vm.old_inputs.get("zone", zone)) == str(vm.new_inputs.get("zone", zone)):
        # a name exists once per zone: the successor takes the stack's other name (and cache slot)
        settings["vmSlot"] = "b" if str(config.get("vmSlot") or "a") == "a" else "a"
    keys = list(dict.fromkeys(key for step in losing for key in step.settings()))
    refused = (f"stopped: this change replaces {vm.what} ({', '.join(keys) or 'see the preview'}); run again with "
               "--replace-vm to go ahead")
    return Look(settings, refused, {"what": [step.what for step in losing], "keys": keys,
                                    "changes": vm.changes(), "deleteFirst": delete_first})


def replacement_order(compute: ComputeClient, project: str, zone: str, chips: int,
                      report: Report | None) -> tuple[bool, str]:
    """(delete first?, why): create-before-delete needs room in the region's TPU quota beside the chips in use."""
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
    """After a failed sweep, the stack's `zone` is where its VM is, else what it was: the next update moves nothing."""
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
