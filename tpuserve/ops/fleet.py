"""`tpuserve fleet`: N replicas of the deployment in several zones behind one LiteLLM router, each replaced before
flex-start deletes it.

The fleet of stack `dev` is recorded in Pulumi state as one stack per replica, `dev-r1`, `dev-r2`, ... (each a gcp
stack made from `dev`'s settings with `pulumi stack init --copy-config-from dev`: the same components, the same
readiness gate), plus one router stack, `dev-router` (target router, components/router.py). One stack per replica
because a replica is placed, gated, renewed and destroyed on its own: its `pulumi up` sweeps zones with the same
loop as `tpuserve up` (deploy/sweep.py, the Deployer of ops/up.py, the classifier), so a replica that finds no
capacity fails and is cleaned up alone, and destroying one never plans a change to another (one stack with N VMs
would put every replica in each update, under one lock, and one failed create would fail the update for all).

- `fleet up --replicas N` adds replicas until N serve (spread: each new replica tries the zones holding the fewest
  replicas first), removes extras, and routes to every replica that serves. A replica joins the router only once its
  readiness gate passed (its own `pulumi up` runs the gate; the fleet checks `serving` again through the Compute
  API), and leaves it before it is destroyed.
- `fleet renew` replaces every replica whose flex-start deletion is less than `--lead` away: successor placed and
  gated, added to the router and seen answering a completion through it (deploy/router_probe.py; one that does not
  is removed again), the old one removed from the router and drained (until vLLM reports no request running or
  waiting, up to a bound), then destroyed. Without capacity for a successor the old replica keeps
  serving until its deletion, and the command says so and exits 3.
- `fleet status` shows each replica (zone, stage, in the router or not, time to deletion) and the router.

The router learns of a change through its own stack: the new replica set goes into its `routerReplicas`, its
`pulumi up` rewrites the VM's metadata in place, the agent on the VM reloads the proxy gracefully
(vm/router_agent.py) and the router's readiness gate waits for the new config hash, so `route()` returns once the
router serves the new set. The deletion time comes from the Compute API: `scheduling.terminationTime` when set,
else `lastStartTimestamp` (or `creationTimestamp`) plus `scheduling.maxRunDuration`.

Exit codes: 0 done; 1 stopped by an error; 2 bad usage; 3 some replica found no capacity before the deadline.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve.deploy.capacity import classify
from tpuserve.deploy.gce import ComputeApiError, ComputeClient, Instance
from tpuserve.deploy.orphans import Orphan
from tpuserve.deploy.preflight import Endpoints, configured_zones, endpoint_option, preflight, print_report, \
    target_from_config
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError
from tpuserve.deploy.router_probe import answered_through_router
from tpuserve.deploy.stack import TunnelError, endpoint_for
from tpuserve.deploy.sweep import SweepResult, region_of, sweep
from tpuserve import vllm_metrics
from tpuserve.facts import FAILED_STAGE, GUEST_ATTRIBUTE_NAMESPACE, V6E_ZONES
from tpuserve.observe.gate import SERVING, watch_instance
from tpuserve.observe.status import deletion_at
from tpuserve.ops.up import EXIT_FAILED, EXIT_NO_CAPACITY, EXIT_OK, Deployer, parse_deadline, progress_line
from tpuserve.serving import ConfigError

REPLICA = re.compile(r"^(?P<fleet>.+)-r(?P<number>[0-9]+)$")
DEFAULT_LEAD = "45m"  # more than a sweep plus a cold start (8.5-10.5 min) plus the router update and a drain
UP_DEADLINE = "2h"
RENEW_DEADLINE = "30m"  # per run; the schedule runs renew every 15 minutes
GATE_TIMEOUT_S = 300.0  # the replica's own `pulumi up` already waited for `serving`: this only confirms it
DRAIN_TIMEOUT_S = 600.0
DRAIN_POLL_S = 5.0
ROUTER_TIMEOUT_S = 40 * 60.0  # a first router boot pulls the image; later updates take a reload
DESTROY_TIMEOUT_S = 20 * 60.0
# vLLM's gauges of requests on the engine (vllm/v1/metrics/loggers.py): a drained replica shows 0 for both.
GONE = "gone"


class FleetError(RuntimeError):
    """A step of the fleet failed in a way the command reports and stops on."""


def replica_name(fleet: str, number: int) -> str:
    return f"{fleet}-r{number}"


def router_name(fleet: str) -> str:
    return f"{fleet}-router"


def replica_number(fleet: str, stack: str) -> int | None:
    match = REPLICA.match(stack)
    return int(match["number"]) if match and match["fleet"] == fleet else None


@dataclass(frozen=True)
class Load:
    """A replica's load as its /metrics tells it."""

    running: float
    waiting: float
    kv_cache: float | None  # a fraction: 1 is full

    def as_dict(self) -> dict[str, float | None]:
        return {"running": self.running, "waiting": self.waiting, "kvCacheUsage": self.kv_cache}

    def __str__(self) -> str:
        kv = f", KV {self.kv_cache:.0%}" if self.kv_cache is not None else ""
        return f"{self.running:.0f} running, {self.waiting:.0f} waiting{kv}"


def instance_expiry(instance: Mapping[str, Any]) -> datetime | None:
    """When Compute Engine deletes a flex-start VM, in UTC: tpuserve status's reading of the instance."""
    at = deletion_at(instance)
    return at.astimezone(timezone.utc) if at else None


def read_load(metrics_text: str) -> Load | None:
    """Requests running and waiting, and the KV cache's use, from vLLM's /metrics (the same parser `tpuserve
    status` uses); None when neither request gauge is there (not a vLLM, or not up): unknown is never taken for
    drained."""
    try:
        scrape = vllm_metrics.parse(metrics_text, 0.0)
    except vllm_metrics.MetricsError:
        return None
    running, waiting = scrape.total(vllm_metrics.RUNNING), scrape.total(vllm_metrics.WAITING)
    if running is None and waiting is None:
        return None
    return Load(running or 0.0, waiting or 0.0, scrape.total(vllm_metrics.KV_CACHE_USAGE))


def in_flight(metrics_text: str) -> float | None:
    load = read_load(metrics_text)
    return None if load is None else load.running + load.waiting


def human(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    sign, minutes = ("-", -minutes) if minutes < 0 else ("", minutes)
    return f"{sign}{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{sign}{minutes} min"


@dataclass
class Replica:
    """One replica as its stack and the Compute API see it now."""

    name: str
    outputs: dict[str, Any]
    stage: str  # serving, a boot stage, failed, gone (the VM was deleted), empty (nothing deployed), unknown
    expiry: datetime | None = None
    in_router: bool = False
    detail: str = ""
    load: Load | None = None  # filled by `fleet status` for a serving replica whose /metrics answered

    @property
    def zone(self) -> str:
        return str(self.outputs.get("zone", ""))

    def until_expiry(self, now: datetime) -> timedelta | None:
        return None if self.expiry is None else self.expiry - now

    def as_dict(self, now: datetime) -> dict[str, Any]:
        left = self.until_expiry(now)
        return {"replica": self.name, "zone": self.zone or None, "stage": self.stage, "inRouter": self.in_router,
                "instance": self.outputs.get("instanceName"), "endpoint": self.outputs.get("endpoint"),
                "expiry": self.expiry.isoformat() if self.expiry else None,
                "secondsToExpiry": None if left is None else int(left.total_seconds()),
                "load": self.load.as_dict() if self.load else None, "detail": self.detail or None}


@dataclass
class Fleet:
    """The fleet of one stack; every outside effect goes through `pulumi` (the CLI), `compute` (the Compute API),
    `reach` (an endpoint for a stack's outputs) and the clock, so tests drive it through fakes."""

    name: str
    pulumi: PulumiCli  # the fleet's own stack: its settings are every replica's and the router's
    compute: ComputeClient
    project: str
    extra: Sequence[str] = ()
    say: Callable[[str], None] = lambda line: None
    confirm: Callable[[list[Orphan]], bool] = lambda found: False
    reach: Callable[[Mapping[str, Any]], AbstractContextManager[str]] = endpoint_for
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
    sleep: Callable[[float], None] = time.sleep
    gate_timeout_s: float = GATE_TIMEOUT_S
    gate_interval_s: float = 3.0
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    drain_poll_s: float = DRAIN_POLL_S
    events: list[dict[str, str]] = field(default_factory=list)
    orphans: list[dict[str, Any]] = field(default_factory=list)

    def event(self, what: str, replica: str, detail: str = "") -> None:
        self.events.append({"event": what, "replica": replica, **({"detail": detail} if detail else {})})
        self.say(f"{replica}: {what}{f' ({detail})' if detail else ''}")

    def cli(self, stack: str) -> PulumiCli:
        return self.pulumi.for_stack(stack)

    # --- what there is --------------------------------------------------------------------------------------------

    def stacks(self) -> list[str]:
        return self.pulumi.stacks()

    def replica_names(self, stacks: Sequence[str] | None = None) -> list[str]:
        names = [s for s in (self.stacks() if stacks is None else stacks) if replica_number(self.name, s) is not None]
        return sorted(names, key=lambda s: replica_number(self.name, s) or 0)

    def next_name(self, taken: Sequence[str]) -> str:
        numbers = [replica_number(self.name, s) or 0 for s in taken]
        return replica_name(self.name, max(numbers, default=0) + 1)

    def router_outputs(self) -> dict[str, Any]:
        if router_name(self.name) not in self.stacks():
            return {}
        return self.cli(router_name(self.name)).outputs()

    def members(self) -> list[str]:
        """The replicas the router serves: its stack's `replicas` output, written by its last successful update."""
        return [str(name) for name in self.router_outputs().get("replicas") or []]

    def look(self, name: str, members: Sequence[str] = ()) -> Replica:
        outputs = self.cli(name).outputs()
        replica = Replica(name, outputs, "empty", in_router=name in members)
        if not outputs.get("instanceName"):
            replica.detail = "nothing deployed"
            return replica
        instance = Instance(str(outputs.get("project") or self.project), replica.zone, str(outputs["instanceName"]))
        try:
            resource = self.compute.instance(instance)
        except ComputeApiError as err:
            replica.stage = GONE if err.status == 404 else "unknown"
            replica.detail = "the VM was deleted (flex-start's max run ended, or by hand)" if err.status == 404 \
                else str(err)
            return replica
        except requests.RequestException as err:
            replica.stage, replica.detail = "unknown", f"Compute API unreachable ({type(err).__name__})"
            return replica
        replica.expiry = instance_expiry(resource)
        if resource.get("status") != "RUNNING":
            replica.stage = str(resource.get("status", "unknown")).lower()
            return replica
        try:
            attributes = self.compute.guest_attributes(instance, GUEST_ATTRIBUTE_NAMESPACE)
        except (ComputeApiError, requests.RequestException) as err:
            replica.stage, replica.detail = "unknown", str(err)
            return replica
        replica.stage = attributes.get("stage") or "booting"
        if replica.stage == SERVING and outputs.get("configHash") and \
                attributes.get("config-hash") != outputs.get("configHash"):
            replica.stage, replica.detail = "booting", f"serves config {attributes.get('config-hash')}"
        if replica.stage == FAILED_STAGE:
            replica.detail = attributes.get("reason", "")
        return replica

    def measure(self, replica: Replica) -> Load | None:
        """The replica's load from its /metrics, through the same way in as every other command; None when it
        cannot be read (no tunnel, not up)."""
        if replica.stage != SERVING:
            return None
        try:
            with self.reach(replica.outputs) as url:
                root = url.rstrip("/").removesuffix("/v1")
                return read_load(requests.get(f"{root}/metrics", timeout=10).text)
        except (ConfigError, TunnelError, requests.RequestException):
            return None

    def look_all(self) -> list[Replica]:
        stacks = self.stacks()
        members = self.members() if router_name(self.name) in stacks else []
        return [self.look(name, members) for name in self.replica_names(stacks)]

    # --- steps ----------------------------------------------------------------------------------------------------

    def candidates(self, zones: Sequence[str], replicas: Sequence[Replica]) -> list[str]:
        """`zones` in their order, the ones holding the fewest live replicas first: a new replica spreads out
        while the fleet's zone preference still breaks ties."""
        held = {zone: sum(r.zone == zone and r.stage not in (GONE, "empty") for r in replicas) for zone in zones}
        return sorted(zones, key=lambda zone: held[zone])

    def place(self, name: str, zones: Sequence[str], deadline_s: float, retry_until_up: bool = False) -> SweepResult:
        """Create replica stack `name` from the fleet's settings and sweep `zones` for it, as `tpuserve up` does."""
        cli = self.cli(name)
        if name not in self.stacks():
            cli.init(self.name)
        # The router stack owns Cloud NAT for every region the fleet uses: one all-subnetworks NAT per network and
        # region is all GCP allows, so replicas sharing a region cannot each make theirs.
        deployer = Deployer(cli, name, self.project, self.extra, self.compute, self.confirm, self.say,
                            settings={"createCloudNat": "false", "fleet": self.name})
        number = iter(range(1, 10_000))
        self.say(f"{name}: trying {', '.join(zones)}")
        result = sweep(zones, deployer.attempt, deadline_s, retry_until_up=retry_until_up,
                       on_attempt=lambda attempt: self.say(f"{name} {progress_line(next(number), attempt)}"),
                       on_wait=lambda seconds, next_round: self.say(f"{name}: every zone failed; sweep {next_round} "
                                                                    f"in {seconds:.0f} s"))
        tried = list(dict.fromkeys(attempt.zone for attempt in result.attempts))
        if result.ok and len(tried) > 1:
            deployer.clean_up([zone for zone in tried if zone != result.zone])
        self.orphans += deployer.orphans
        return result

    def gate(self, name: str) -> tuple[bool, str]:
        """The replica reports `serving` for its config (the Compute API, like `tpuserve gate --stack`)."""
        outputs = self.cli(name).outputs()
        instance = Instance(str(outputs.get("project") or self.project), str(outputs.get("zone")),
                            str(outputs.get("instanceName")))
        verdict = watch_instance(self.compute, instance, self.gate_timeout_s, self.gate_interval_s,
                                 outputs.get("configHash"))
        return verdict.ready, verdict.reason or ""

    def route(self, members: Sequence[str]) -> None:
        """Make the router serve exactly `members` (creating the router stack the first time); returns once its
        `pulumi up`, gate included, succeeded: the router then routes to these replicas and to no other."""
        router = router_name(self.name)
        cli = self.cli(router)
        entries = []
        for member in members:
            endpoint = self.cli(member).outputs().get("endpoint")
            if not endpoint:
                raise FleetError(f"{member} has no endpoint output; it cannot join the router")
            entries.append(f"{member}={endpoint}")
        if router not in self.stacks():
            cli.init(self.name)
        self.say(f"{router}: routing to {', '.join(members) or 'no replica'}")
        # `target` with every update: a router stack whose first update never started still has dev's target (gcp).
        run = cli.up(self.extra, ROUTER_TIMEOUT_S, {"target": "router", "routerReplicas": json.dumps(entries)})
        if not run.ok:
            config = cli.config()
            zone = str(config.get("routerZone") or config.get("zone") or "")
            failure = classify(run.output, zone)
            raise FleetError(f"updating the router ({router}) failed: {failure.kind}: {failure.reason}")

    def drain(self, replica: Replica) -> str:
        """Wait until the replica, already out of the router, runs and queues no request, up to the bound."""
        if replica.stage in (GONE, "empty"):
            return "no VM left to drain"
        started, last = time.monotonic(), None
        waited = 0.0
        try:
            with self.reach(replica.outputs) as url:
                root = url.rstrip("/").removesuffix("/v1")
                while True:
                    try:
                        last = in_flight(requests.get(f"{root}/metrics", timeout=10).text)
                    except requests.RequestException:
                        last = None
                    if last == 0:
                        return f"no request in flight after {waited:.0f} s"
                    if waited >= self.drain_timeout_s:
                        return (f"{last:.0f} request(s) still in flight after {waited:.0f} s: destroying anyway"
                                if last is not None else f"/metrics unreadable for {waited:.0f} s: destroying anyway")
                    self.sleep(self.drain_poll_s)
                    waited = max(waited + self.drain_poll_s, time.monotonic() - started)
        except (ConfigError, TunnelError) as err:
            return f"could not reach it to drain ({err}); destroying after removal from the router"

    def retire(self, name: str) -> bool:
        """`pulumi destroy` the replica's stack, then remove the stack; False (with a line) if the destroy failed."""
        cli = self.cli(name)
        run = cli.destroy(DESTROY_TIMEOUT_S)
        if not run.ok:
            self.say(f"warning: pulumi destroy -s {name} failed (exit {run.returncode}): run it again by hand")
            return False
        try:
            cli.remove()
        except PulumiError as err:
            self.say(f"warning: {err}")
        return True

    # --- what the commands do -------------------------------------------------------------------------------------

    def add(self, zones: Sequence[str], deadline_s: float, replicas: list[Replica],
            retry_until_up: bool = False) -> tuple[Replica | None, SweepResult, str]:
        """Place one new replica and gate it (not yet routed). On failure its stack is destroyed and removed, except
        for a VM that boots but never serves, which stays for `tpuserve diagnose`."""
        name = self.next_name([r.name for r in replicas])
        result = self.place(name, self.candidates(zones, replicas), deadline_s, retry_until_up)
        if not result.ok:
            if result.stopped is not None and result.stopped.kind == "not-ready":
                return None, result, f"{name} was created but never served: tpuserve diagnose --stack {name}"
            self.retire(name)
            return None, result, ""
        self.event("created", name, f"in {result.zone}")
        ready, reason = self.gate(name)
        if not ready:
            self.say(f"{name}: not serving ({reason}); destroying it")
            self.retire(name)
            return None, result, f"{name} did not pass its readiness gate: {reason}"
        self.event("gated", name)
        replica = self.look(name)
        replicas.append(replica)
        return replica, result, ""

    def remove(self, old: Replica, members: list[str]) -> None:
        """Take `old` out of the router, drain it, destroy its stack."""
        if old.name in members:
            members.remove(old.name)
            self.route(members)
        self.event("drained", old.name, self.drain(old))
        if self.retire(old.name):
            self.event("destroyed", old.name)


def no_capacity(result: SweepResult) -> bool:
    """The sweep ended for want of capacity (or time), not on an error or a replica that never served."""
    return not result.ok and result.stopped is None


def verdict_line(result: SweepResult) -> str:
    if result.stopped is not None:
        return f"stopped: {result.stopped.kind}: {result.stopped.reason}"
    if result.deadline_hit:
        return f"deadline reached after {len(result.attempts)} attempt(s)"
    return "no capacity in any zone tried"


# --- command line ---------------------------------------------------------------------------------------------------

@dataclass
class Session:
    """What every fleet command sets up: the fleet's stack and settings, the Compute API, output."""

    fleet: Fleet
    config: dict[str, Any]
    console: Any
    session: Any
    roots: Endpoints
    exits: ExitStack


def open_fleet(stack: str, cwd: Path, endpoints: tuple[str, ...], yes: bool, extra: Sequence[str]) -> Session:
    from rich.console import Console

    from tpuserve.deploy.gce import MissingCredentials, adc_session

    console = Console(stderr=True)

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    try:
        pulumi = PulumiCli(stack, cwd, echo=lambda line: click.echo(f"  │ {line}", err=True))
        config = pulumi.config()
    except PulumiError as err:
        raise click.ClickException(str(err)) from err
    if replica_number(stack, stack) is not None or stack.endswith("-router"):
        raise click.UsageError(f"--stack: name the fleet's own stack (e.g. dev), not one of its replicas or its "
                               f"router ({stack})")
    if config.get("target", "gcp") != "gcp":
        raise click.UsageError(f"--stack: a fleet is made of flex-start TPU VMs (target gcp); stack {stack} has "
                               f"target {config.get('target')}")
    if not config.get("project"):
        raise click.UsageError(f"project: not set in stack {stack}; pulumi config set project <gcp-project-id> "
                               f"--stack {stack}")
    roots = Endpoints.parse(endpoints)
    exits = ExitStack()
    try:
        session = exits.enter_context(adc_session())
    except MissingCredentials as err:
        raise click.ClickException(str(err)) from err
    interactive = sys.stdin.isatty()

    def confirm(found: list[Orphan]) -> bool:
        if yes:
            return True
        return interactive and click.confirm(f"Delete these {len(found)} orphaned resource(s)?", default=True,
                                             err=True)

    fleet = Fleet(stack, pulumi, ComputeClient(session, roots.compute), str(config["project"]), extra, say, confirm)
    return Session(fleet, config, console, session, roots, exits)


def check_zones(config: Mapping[str, Any], zones: str | None, stack: str) -> None:
    """--zones may only name zones of regions where the router stack makes Cloud NAT (components/router.py
    nat_regions: the router's zone, the stack's `zone` and `zones`): a replica elsewhere could not pull its image."""
    if str(config.get("createCloudNat", True)).lower() == "false":
        return  # the VPC's own NAT serves the regions
    covered = {region_of(str(zone)) for zone in (config.get("routerZone"), config.get("zone"),
                                                 *(config.get("zones") or V6E_ZONES)) if zone}
    outside = [zone for zone in configured_zones(config, {}, zones) if region_of(zone) not in covered]
    if outside:
        raise click.UsageError(f"--zones: {', '.join(outside)} {'is' if len(outside) == 1 else 'are'} outside the "
                               f"regions the fleet's router gives Cloud NAT ({', '.join(sorted(covered))}); add "
                               f"{'it' if len(outside) == 1 else 'them'} to the stack's zones first (pulumi config set "
                               f"--path 'zones[N]' ZONE --stack {stack})")


def usable_zones(s: Session, zones: str | None, skip_preflight: bool) -> list[str] | None:
    """The zones new replicas may try, after preflight; None when preflight failed (it printed why)."""
    candidates = configured_zones(s.config, {}, zones)
    if skip_preflight:
        return candidates
    report = preflight(s.session, target_from_config(s.config, candidates), s.roots)
    print_report(s.console, report)
    return None if report.failed else report.usable_zones


def finish(s: Session, as_json: bool, code: int, summary: dict[str, Any]) -> None:
    s.exits.close()
    if as_json:
        click.echo(json.dumps({"ok": code == EXIT_OK, "fleet": s.fleet.name, "exit": code, **summary}))
    raise SystemExit(code)


def check_router_settings(config: Mapping[str, Any], stack: str) -> None:
    if not config.get("routerMasterKeySecretId"):
        raise click.UsageError(f"routerMasterKeySecretId: not set in stack {stack}; the fleet's LiteLLM proxy needs a "
                               "master key: printf 'sk-%s' \"$(openssl rand -hex 32)\" | gcloud secrets create "
                               f"litellm-master-key --data-file=- && pulumi config set routerMasterKeySecretId "
                               f"litellm-master-key --stack {stack}")


def common_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for decorator in reversed((
            click.option("--stack", required=True, help="The fleet's stack (its settings make every replica)."),
            click.option("--cwd", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
                         show_default=True, help="The Pulumi project directory."),
            click.option("--json", "as_json", is_flag=True, help="End with one JSON line."),
            endpoint_option)):
        command = decorator(command)
    return command


def change_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for decorator in reversed((
            click.option("--zones", help="Comma-separated zones new replicas try [default: the stack's `zone`, then "
                         "its `zones`]."),
            click.option("--yes", is_flag=True, help="Delete orphaned VMs and disks the sweeps find without asking."),
            click.option("--skip-preflight", is_flag=True, help="Do not run `tpuserve preflight` first."),
            click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=0), default=DRAIN_TIMEOUT_S,
                         show_default=True, help="Seconds to wait for a replica's requests to finish after it left "
                         "the router, before destroying it."),
            click.argument("pulumi_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI UP FLAGS]"))):
        command = decorator(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def fleet() -> None:
    """Replicas across zones behind a LiteLLM router, renewed before flex-start deletes them: up, status, renew."""


@fleet.command("up")
@common_options
@click.option("--replicas", type=click.IntRange(min=1, max=16), required=True, help="How many replicas to serve.")
@click.option("--deadline", "deadline_text", default=UP_DEADLINE, show_default=True,
              help="Give up placing replicas after this long (90m, 2h).")
@click.option("--retry-until-up", is_flag=True, help="When every zone fails for a replica, sweep again (30 s, "
              "doubling) until the deadline.")
@change_options
def fleet_up(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...], replicas: int, deadline_text: str,
             retry_until_up: bool, zones: str | None, yes: bool, skip_preflight: bool, drain_timeout_s: float,
             pulumi_args: tuple[str, ...]) -> None:
    """Serve N replicas behind the router: place the missing ones zone by zone, gate them, route to them."""
    deadline_s, started = parse_deadline(deadline_text), time.monotonic()
    s = open_fleet(stack, cwd, endpoints, yes, pulumi_args)
    check_router_settings(s.config, stack)
    check_zones(s.config, zones, stack)
    fleet_, placed, failures = s.fleet, [], []
    fleet_.drain_timeout_s = drain_timeout_s
    code = EXIT_OK
    try:
        current = fleet_.look_all()
        members = [r.name for r in current if r.in_router]
        # Replicas flex-start deleted leave the router, then their stacks go (nothing left to drain).
        for replica in [r for r in current if r.stage in (GONE, "empty")]:
            fleet_.remove(replica, members)
            current.remove(replica)
        serving = [r for r in current if r.stage == SERVING]
        for extra in sorted(serving, key=lambda r: r.expiry or datetime.max.replace(tzinfo=timezone.utc))[
                :max(0, len(serving) - replicas)]:
            fleet_.say(f"{extra.name}: more replicas than asked for; retiring the one that expires first")
            fleet_.remove(extra, members)
            serving.remove(extra)
            current.remove(extra)
        unrouted = [r.name for r in serving if r.name not in members]
        if unrouted or router_name(stack) not in fleet_.stacks():
            members += unrouted  # the router first: a bad router setting shows before a TPU is paid for
            fleet_.route(members)
        missing = replicas - len(serving)
        zone_list = usable_zones(s, zones, skip_preflight) if missing > 0 else []
        if zone_list is None:
            finish(s, as_json, EXIT_FAILED, {"reason": "preflight failed", "events": fleet_.events})
        for _ in range(max(0, missing)):
            left = deadline_s - (time.monotonic() - started)
            if left <= 0:
                failures.append({"replica": None, "reason": "deadline reached"})
                code = EXIT_NO_CAPACITY
                break
            replica, result, note = fleet_.add(zone_list, left, current, retry_until_up)
            attempts = [attempt.as_dict() for attempt in result.attempts]
            if replica is None:
                line = note or verdict_line(result)
                failures.append({"reason": line, "attempts": attempts})
                if no_capacity(result):
                    fleet_.say(f"a replica found no place: {line}")
                    code = EXIT_NO_CAPACITY
                    continue
                fleet_.say(f"stopped: {line}")
                code = EXIT_FAILED
                break  # an error (or a VM that never serves) another replica would meet the same way
            members.append(replica.name)
            fleet_.route(members)
            replica.in_router = True
            fleet_.event("added", replica.name)
            placed.append({"replica": replica.name, "zone": replica.zone, "attempts": attempts})
    except FleetError as err:
        fleet_.say(f"error: {err}")
        code = EXIT_FAILED
    serving_now = [r for r in fleet_.look_all() if r.stage == SERVING and r.in_router]
    fleet_.say(f"{len(serving_now)} of {replicas} replica(s) serve behind {router_name(stack)}"
               + (f" ({', '.join(f'{r.name} in {r.zone}' for r in serving_now)})" if serving_now else ""))
    if code == EXIT_NO_CAPACITY:
        fleet_.say("the others found no capacity: run fleet up again later, add zones, or --retry-until-up")
    finish(s, as_json, code, {"serving": [r.name for r in serving_now], "placed": placed, "failures": failures,
                              "events": fleet_.events, "orphans": fleet_.orphans})


@fleet.command("renew")
@common_options
@click.option("--lead", "lead_text", default=DEFAULT_LEAD, show_default=True,
              help="Replace a replica whose flex-start deletion is less than this far away.")
@click.option("--deadline", "deadline_text", default=RENEW_DEADLINE, show_default=True,
              help="Give up looking for capacity for successors after this long.")
@change_options
def fleet_renew(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...], lead_text: str,
                deadline_text: str, zones: str | None, yes: bool, skip_preflight: bool, drain_timeout_s: float,
                pulumi_args: tuple[str, ...]) -> None:
    """Replace every replica whose flex-start deletion is near: successor placed, gated, added; old one drained,
    destroyed. Without capacity the old replica serves until its deletion (exit 3)."""
    lead = timedelta(seconds=parse_deadline(lead_text))
    deadline_s, started = parse_deadline(deadline_text), time.monotonic()
    s = open_fleet(stack, cwd, endpoints, yes, pulumi_args)
    check_zones(s.config, zones, stack)
    fleet_ = s.fleet
    fleet_.drain_timeout_s = drain_timeout_s
    code, renewed, kept = EXIT_OK, [], []
    try:
        current = fleet_.look_all()
        members = [r.name for r in current if r.in_router]
        now = fleet_.now()
        due = sorted([r for r in current if r.in_router and (r.stage == GONE or (
            r.expiry is not None and r.expiry - now < lead))],
                     key=lambda r: r.expiry or now)
        if not current:
            fleet_.say(f"stack {stack} has no fleet (no {replica_name(stack, 1)}...): nothing to renew")
        elif not due:
            soonest = min((r for r in current if r.expiry), key=lambda r: r.expiry, default=None)
            fleet_.say("nothing to renew" + (f": the next deletion is {soonest.name}'s at {soonest.expiry:%H:%M} UTC "
                                             f"(in {human(soonest.expiry - now)}; renewed from {lead_text} before)"
                                             if soonest and soonest.expiry else ""))
        zone_list = usable_zones(s, zones, skip_preflight) if due else []
        if zone_list is None:
            finish(s, as_json, EXIT_FAILED, {"reason": "preflight failed", "events": fleet_.events})
        for old in due:
            left_text = f"deleted at {old.expiry:%H:%M} UTC, in {human(old.expiry - now)}" if old.expiry \
                else "already deleted"
            fleet_.say(f"{old.name} ({old.zone}) is {left_text}: renewing it")
            left = deadline_s - (time.monotonic() - started)
            successor, result, note = (None, SweepResult(deadline_hit=True), "") if left <= 0 else \
                fleet_.add(zone_list, left, current)
            if successor is None:
                line = note or verdict_line(result)
                code = EXIT_NO_CAPACITY if no_capacity(result) else EXIT_FAILED
                if old.stage == GONE:
                    fleet_.say(f"{old.name} is gone and no successor could be placed ({line}); it leaves the router")
                    fleet_.remove(old, members)
                else:
                    fleet_.say(f"{old.name} keeps serving until its deletion ({left_text}): no successor ({line})")
                kept.append({"replica": old.name, "expiry": old.expiry.isoformat() if old.expiry else None,
                             "reason": line, "attempts": [a.as_dict() for a in result.attempts]})
                if code == EXIT_FAILED:
                    break  # an error the next successor would meet the same way
                continue
            members.append(successor.name)
            fleet_.route(members)
            fleet_.event("added", successor.name)
            # The router must reach the successor with a real completion before the old replica leaves it.
            answered, why = answered_through_router(fleet_.compute, fleet_.router_outputs(), successor.name,
                                                    fleet_.project)
            if not answered:
                fleet_.say(f"{successor.name} did not answer through the router ({why}); it is removed again and "
                           f"{old.name} keeps serving")
                fleet_.remove(successor, members)
                current.remove(successor)
                kept.append({"replica": old.name, "expiry": old.expiry.isoformat() if old.expiry else None,
                             "reason": f"{successor.name} did not answer through the router: {why}", "attempts": []})
                code = EXIT_FAILED
                continue
            fleet_.event("answered", successor.name, why)
            fleet_.remove(old, members)
            current.remove(old)
            renewed.append({"replica": old.name, "successor": successor.name, "zone": successor.zone})
    except FleetError as err:
        fleet_.say(f"error: {err}")
        code = EXIT_FAILED
    finish(s, as_json, code, {"renewed": renewed, "kept": kept, "events": fleet_.events,
                              "orphans": fleet_.orphans})


@fleet.command("status")
@common_options
def fleet_status(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...]) -> None:
    """Every replica (zone, stage, in the router, time to its deletion) and the router."""
    from rich.table import Table

    s = open_fleet(stack, cwd, endpoints, False, ())
    fleet_ = s.fleet
    now = fleet_.now()
    replicas = fleet_.look_all()
    for replica in replicas:
        replica.load = fleet_.measure(replica)
    router = fleet_.router_outputs()
    router_state = router_status(fleet_, router)
    if as_json:
        finish(s, True, EXIT_OK, {"replicas": [r.as_dict(now) for r in replicas], "router": router_state})
    table = Table(title=f"fleet {stack}", title_justify="left")
    for column in ("replica", "zone", "stage", "router", "deleted at (UTC)", "in", "load"):
        table.add_column(column)
    for replica in replicas:
        left = replica.until_expiry(now)
        table.add_row(replica.name, replica.zone or "-", replica.stage + (f": {replica.detail}" if replica.detail
                                                                          and replica.stage != SERVING else ""),
                      "in" if replica.in_router else "out",
                      f"{replica.expiry:%Y-%m-%d %H:%M}" if replica.expiry else "-",
                      human(left) if left is not None else "-",
                      str(replica.load) if replica.load else "-")
    s.console.print(table)
    s.console.print(f"router {router_name(stack)}: {router_state['stage']}"
                    + (f", {router_state['zone']}, {router_state['endpoint']} (reach it: "
                       f"{router.get('iapTunnelCommand')})" if router else "")
                    + (f", routing to {', '.join(router_state['replicas']) or 'no replica'}" if router else ""),
                    markup=False, highlight=False, soft_wrap=True)
    finish(s, False, EXIT_OK, {})


def router_status(fleet_: Fleet, router: Mapping[str, Any]) -> dict[str, Any]:
    if not router.get("instanceName"):
        return {"stack": router_name(fleet_.name), "stage": "not deployed", "zone": None, "endpoint": None,
                "replicas": [], "configHash": None}
    instance = Instance(str(router.get("project") or fleet_.project), str(router.get("zone")),
                        str(router["instanceName"]))
    try:
        attributes = fleet_.compute.guest_attributes(instance, GUEST_ATTRIBUTE_NAMESPACE)
        stage = attributes.get("stage") or "booting"
        if stage == SERVING and attributes.get("config-hash") != router.get("routerConfigHash"):
            stage = f"serving config {attributes.get('config-hash')}, not {router.get('routerConfigHash')}"
    except (ComputeApiError, requests.RequestException) as err:
        stage = f"unknown ({err})"
    return {"stack": router_name(fleet_.name), "stage": stage, "zone": router.get("zone"),
            "endpoint": router.get("endpoint"), "replicas": list(router.get("replicas") or []),
            "configHash": router.get("routerConfigHash")}

