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
  serving until its deletion, and the command says so and exits 3. Several replicas due in one run are renewed at
  once (`--parallel` successors placed concurrently, each gated); the router stack takes one update at a time, so
  one thread updates it, with every change ready by then in one update (class Renewal).
- `fleet down` destroys the router, then every replica, and removes their stacks.
- `fleet status` shows each replica (zone, stage, in the router or not, time to deletion, max run), the router, how
  far apart the deletions are, and who holds the fleet's lease.

One command acts on a fleet at a time: `up`, `renew` and `down` hold the fleet's lease (tpuserve/deploy/lease.py, a
Cloud Storage object in the fleet's bucket) for their whole run, read the replicas and the router's members only once
they hold it, and stop at the next safe point if they lose it; a second command waits up to `--lease-wait` or exits
6 naming the holder. Replicas' max runs are staggered (staggered_run): a new replica's run is shortened so that its
deletion falls between the others', and N replicas are not deleted, nor renewed, together. Cloud NAT: the router
stack makes it in the fleet's regions only where no other stack's NAT serves (tpuserve/deploy/nat.py), re-read by
every command, so the router takes over a region whose NAT went away.

The router learns of a change through its own stack: the new replica set goes into its `routerReplicas`, its
`pulumi up` rewrites the VM's metadata in place, the agent on the VM reloads the proxy gracefully
(vm/router_agent.py) and the router's readiness gate waits for the new config hash, so `route()` returns once the
router serves the new set. The deletion time comes from the Compute API: `scheduling.terminationTime` when set,
else `lastStartTimestamp` (or `creationTimestamp`) plus `scheduling.maxRunDuration`.

Exit codes: 0 done; 1 stopped by an error; 2 bad usage (or `down` without --yes, not interactive); 3 some replica
found no capacity before the deadline; 6 another fleet command holds the lease.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve.cli import echo_json
from tpuserve.deploy import nat
from tpuserve.deploy.cache import BucketSpec, CacheDisk, bucket_name, cache_disks, ensure_bucket
from tpuserve.deploy.capacity import classify
from tpuserve.deploy.gce import ComputeApiError, ComputeClient, Instance, ZonalDisks
from tpuserve.deploy.gcs import Buckets
from tpuserve.deploy.lease import EXIT_LEASE_HELD, POLL_S, Lease, LeaseError, LeaseHeld, LeaseLost, LeaseStore
from tpuserve.deploy.orphans import Orphan, managed_ids, stack_labels
from tpuserve.deploy.preflight import Endpoints, Target, configured_zones, endpoint_option, nat_plan, preflight, \
    print_report, target_from_config
from tpuserve.deploy.pulumi_cli import PulumiCli, PulumiError
from tpuserve.deploy.router_probe import answered_through_router
from tpuserve.deploy.stack import TunnelError, endpoint_for
from tpuserve.deploy.sweep import SweepResult, region_of, sweep
from tpuserve import vllm_metrics
from tpuserve.names import base_name, bounded
from tpuserve.facts import CACHE_LABEL, FAILED_STAGE, GUEST_ATTRIBUTE_NAMESPACE, V6E_ZONES
from tpuserve.observe.gate import INSTANCE_INTERVAL_S, SERVING, watch_instance
from tpuserve.observe.status import deletion_at
from tpuserve.ops.up import EXIT_FAILED, EXIT_NO_CAPACITY, EXIT_OK, EXIT_ORPHANS, EXIT_USAGE, Deployer, \
    parse_deadline, progress_line
from tpuserve.serving import ConfigError

REPLICA = re.compile(r"^(?P<fleet>.+)-r(?P<number>[0-9]+)$")
DEFAULT_LEAD = "45m"  # more than a sweep plus a cold start (8.5-10.5 min) plus the router update and a drain
UP_DEADLINE = "2h"
RENEW_DEADLINE = "30m"  # per run; the schedule runs renew every 15 minutes
GATE_TIMEOUT_S = 300.0  # the replica's own `pulumi up` already waited for `serving`: this only confirms it
DRAIN_TIMEOUT_S = 600.0
DRAIN_POLL_S = 5.0
ROUTER_TIMEOUT_S = 40 * 60.0  # a first router boot pulls the image; later updates take a reload
PARALLEL = 3  # successors placed at once by one `fleet renew` (each its own stack and `pulumi up`)
# Flex-start's run limits (https://cloud.google.com/compute/docs/instances/flex-start-vms): 10 minutes to 7 days.
MIN_RUN_S, MAX_RUN_S = 10 * 60, 7 * 24 * 3600
RUN_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
RUN_PART = re.compile(r"(\d+)([dhms])")
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


# --- staggered max runs -------------------------------------------------------------------------------------------

def run_seconds(text: str) -> int | None:
    """A maxRunDuration setting ('4h', '1d12h', '90m') in seconds; None when it is not one."""
    text = str(text).strip()
    if not text or RUN_PART.sub("", text):
        return None
    return sum(int(n) * RUN_UNITS[unit] for n, unit in RUN_PART.findall(text)) or None


def run_text(seconds: int) -> str:
    """Seconds as a maxRunDuration setting: 9600 -> '2h40m', 14400 -> '4h'."""
    parts, left = [], int(seconds)
    for unit, size in RUN_UNITS.items():
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def cyclic_gap(a: datetime, b: datetime, period_s: float) -> float:
    """How far apart two deletions are on a schedule that repeats every `period_s` (a replica's successor is
    deleted one max run after it started, which is the renewal lead before its predecessor's deletion: every
    replica's deletion moves by the same amount each generation, so their spacing is what lasts)."""
    offset = abs((a - b).total_seconds()) % period_s
    return min(offset, period_s - offset)


def staggered_run(start: datetime, others: Sequence[datetime], max_run_s: int, replicas: int, lead_s: float,
                  step_s: int = 60) -> int:
    """The max run for a replica starting at `start` so that its deletion falls as far as possible from the other
    replicas' (`others`), shortened by at most max_run / replicas and never below twice the renewal lead (a shorter
    run would be renewed at once) nor flex-start's 10 minutes.

    Why: replicas placed together (a `fleet up`, or successors renewed in one run) would all be deleted together and
    renewed together, asking for N new TPU VMs at once; when capacity is short they would all end at once. Spread
    `max_run / replicas` apart, one renewal is under way at a time and a stockout costs one replica. Once spread,
    successors get the full max run again: the spacing keeps (see cyclic_gap)."""
    target = max_run_s / max(replicas, 1)
    floor = max(MIN_RUN_S, int(2 * lead_s))
    longest_cut = int(min(target, max_run_s - floor))
    if not others or longest_cut <= 0:
        return max_run_s
    best, best_score = max_run_s, -1.0
    for cut in range(0, longest_cut + 1, step_s):
        deletion = start + timedelta(seconds=max_run_s - cut)
        score = min(min(cyclic_gap(deletion, other, max_run_s) for other in others), target)
        if score > best_score + 1e-6:  # ties keep the longer run
            best, best_score = max_run_s - cut, score
    return best


def spacing(expiries: Sequence[datetime], max_run_s: int) -> float | None:
    """The smallest gap between any two deletions (cyclic, as staggered_run sees them); None for fewer than two."""
    if len(expiries) < 2:
        return None
    return min(cyclic_gap(a, b, max_run_s) for i, a in enumerate(expiries) for b in expiries[i + 1:])


@dataclass
class Replica:
    """One replica as its stack and the Compute API see it now."""

    name: str
    outputs: dict[str, Any]
    stage: str  # serving, a boot stage, failed, gone (the VM was deleted), empty (nothing deployed), unknown
    expiry: datetime | None = None
    max_run_s: int | None = None  # scheduling.maxRunDuration of its VM
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
                "maxRunSeconds": self.max_run_s,
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
    gate_interval_s: float = INSTANCE_INTERVAL_S  # the guest-attribute budget (facts.GATE_POLL_S)
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    drain_poll_s: float = DRAIN_POLL_S
    events: list[dict[str, str]] = field(default_factory=list)
    orphans: list[dict[str, Any]] = field(default_factory=list)
    # A safe point: raises (LeaseLost) when the command no longer holds the fleet's lease. Called before every
    # change (a replica's `pulumi up`, a router update, a destroy), so a command that lost the lease stops there.
    guard: Callable[[], None] = lambda: None
    router_settings: dict[str, str] = field(default_factory=dict)  # cloudNatSkipRegions, for every router update
    max_run_s: int = 4 * 3600  # the stack's maxRunDuration (open_fleet reads it)
    lead_s: float = 45 * 60.0  # how long before a deletion a replica is renewed
    cache_disk_gb: int = 1  # the stack's cacheDiskSizeGb: 0, replicas take no cache disk (open_fleet reads it)
    # The fleet's pool of cache disks: `zone/disk` -> the replica whose placement holds it (tried or attached), so
    # two placements at once never pick one disk; released when the placement ends.
    reserved: dict[str, str] = field(default_factory=dict)
    pool_lock: threading.Lock = field(default_factory=threading.Lock)
    diagnosed: list[str] = field(default_factory=list)  # the one unready successor kept for `tpuserve diagnose`

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
        limit = (resource.get("scheduling") or {}).get("maxRunDuration") or {}
        replica.max_run_s = int(limit["seconds"]) if limit.get("seconds") else None
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

    # --- the fleet's caches ---------------------------------------------------------------------------------------
    # One compile-cache bucket for the whole fleet (the lease's; every replica's cacheOwner is the fleet) and, in
    # each zone, a pool of cache disks named `<fleet base>-cache-<k>`: a replica takes a free one (the most recently
    # attached first: it is the warm one), a new name only when none is free. A successor in its predecessor's zone
    # cannot attach the disk the predecessor still holds read-write, so a zone holds its replicas' disks plus at most
    # one spare: what a retired replica leaves, kept warm for the next successor there, the others deleted
    # (prune_caches). Renewals therefore reuse disks instead of adding one per run.

    def pool_disk(self, number: int) -> str:
        return bounded(f"{base_name(self.name)}-cache-{number}", 63)

    def pool(self) -> list[CacheDisk]:
        return cache_disks(ZonalDisks(self.compute.session, self.compute.base_url), self.project, self.name)

    def cache_settings(self, replica: str, zone: str) -> dict[str, str]:
        """The fleet's cache for a replica's attempt in `zone`: its bucket and a disk of the pool, reserved for it."""
        if self.cache_disk_gb <= 0:
            return {"cacheOwner": self.name}
        try:
            disks = [disk for disk in self.pool() if disk.zone == zone]
        except (ComputeApiError, requests.RequestException) as err:
            raise FleetError(f"could not list the fleet's cache disks in {zone}: {err}") from err
        with self.pool_lock:
            for key, holder in list(self.reserved.items()):
                if holder == replica:
                    del self.reserved[key]
            free = sorted((d for d in disks if not d.users and f"{zone}/{d.name}" not in self.reserved),
                          key=lambda d: d.last_attached, reverse=True)
            if free:
                name = free[0].name
            else:
                taken = {d.name for d in disks} | {key.split("/", 1)[1] for key in self.reserved
                                                   if key.startswith(f"{zone}/")}
                name = next(self.pool_disk(k) for k in range(1, 1000) if self.pool_disk(k) not in taken)
            self.reserved[f"{zone}/{name}"] = replica
        return {"cacheOwner": self.name, "cacheDiskName": name}

    def release(self, replica: str) -> None:
        with self.pool_lock:
            for key, holder in list(self.reserved.items()):
                if holder == replica:
                    del self.reserved[key]

    def prune_caches(self) -> list[str]:
        """Per zone, keep the disks replicas hold and one spare (the most recently attached); delete the others.
        Returns what was deleted."""
        try:
            disks = self.pool()
        except (ComputeApiError, requests.RequestException) as err:
            self.say(f"warning: could not list the fleet's cache disks: {err}")
            return []
        deleted = []
        client = ZonalDisks(self.compute.session, self.compute.base_url)
        with self.pool_lock:
            held = set(self.reserved)
        for zone in sorted({d.zone for d in disks}):
            spare = sorted((d for d in disks if d.zone == zone and not d.users and f"{zone}/{d.name}" not in held),
                           key=lambda d: d.last_attached, reverse=True)
            for disk in spare[1:] + ([] if spare[:1] and spare[0].last_attached else spare[:1]):
                try:
                    client.delete(self.project, zone, disk.name)
                except (ComputeApiError, requests.RequestException) as err:
                    self.say(f"warning: could not delete the fleet's spare cache disk {zone}/{disk.name}: {err}")
                    continue
                deleted.append(f"{zone}/{disk.name}")
        if deleted:
            self.say(f"cache disks the fleet no longer needs, deleted: {', '.join(deleted)} (each zone keeps its "
                     "replicas' disks and one spare)")
        return deleted

    def prune_unready(self, replicas: list[Replica], members: Sequence[str]) -> None:
        """Replica stacks outside the router that never served (a successor whose gate failed, kept for diagnosis):
        the newest stays for `tpuserve diagnose`, the others are destroyed; `replicas` loses them."""
        unready = [r for r in replicas if r.name not in members and r.stage not in (SERVING, GONE, "planned")
                   and (r.stage != "empty" or self.holds_resources(r.name))]
        unready.sort(key=lambda r: replica_number(self.name, r.name) or 0)
        for replica in unready[:-1]:
            self.say(f"{replica.name} never served and a newer one is kept for diagnosis: destroying it")
            if self.retire(replica.name):
                self.event("destroyed", replica.name, "never served")
                replicas.remove(replica)
        self.diagnosed[:] = [r.name for r in unready[-1:]]

    def holds_resources(self, name: str) -> bool:
        """The replica's state holds resources, though it has no outputs (its first update failed at the gate)."""
        try:
            return bool(managed_ids(self.cli(name).export()))
        except PulumiError:
            return False

    def candidates(self, zones: Sequence[str], replicas: Sequence[Replica]) -> list[str]:
        """`zones` in their order, the ones holding the fewest live replicas first: a new replica spreads out
        while the fleet's zone preference still breaks ties."""
        held = {zone: sum(r.zone == zone and r.stage not in (GONE, "empty") for r in replicas) for zone in zones}
        return sorted(zones, key=lambda zone: held[zone])

    def place(self, name: str, zones: Sequence[str], deadline_s: float, retry_until_up: bool = False,
              settings: Mapping[str, str] | None = None) -> SweepResult:
        """Create replica stack `name` from the fleet's settings (and `settings`) and sweep `zones` for it, as
        `tpuserve up` does."""
        cli = self.cli(name)
        self.guard()
        if name not in self.stacks():
            cli.init(self.name)
        # The router stack gives Cloud NAT to every region the fleet uses where no other stack's NAT serves (one
        # all-subnetworks NAT per network and region is all GCP allows): replicas sharing a region make none.
        deployer = Deployer(cli, name, self.project, self.extra, self.compute, self.confirm, self.say,
                            settings={"createCloudNat": "false", "fleet": self.name, **(settings or {})})
        number = iter(range(1, 10_000))
        self.say(f"{name}: trying {', '.join(zones)}")
        base_settings = dict(deployer.settings)

        def attempt(zone: str, seconds_left: float) -> Any:
            self.guard()
            deployer.settings = {**base_settings, **self.cache_settings(name, zone)}
            return deployer.attempt(zone, seconds_left)

        result = sweep(zones, attempt, deadline_s, retry_until_up=retry_until_up,
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
        self.guard()
        if router not in self.stacks():
            cli.init(self.name)
        self.say(f"{router}: routing to {', '.join(members) or 'no replica'}")
        # `target` with every update: a router stack whose first update never started still has dev's target (gcp).
        run = cli.up(self.extra, ROUTER_TIMEOUT_S, {"target": "router", "routerReplicas": json.dumps(entries),
                                                    **self.router_settings})
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
        self.guard()
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
            retry_until_up: bool = False, settings: Mapping[str, str] | None = None,
            ) -> tuple[Replica | None, SweepResult, str]:
        """Place one new replica, spread over the zones holding the fewest, and gate it (not yet routed)."""
        replica, result, note = self.grow(self.next_name([r.name for r in replicas]), self.candidates(zones, replicas),
                                          deadline_s, settings, retry_until_up)
        if replica is not None:
            replicas.append(replica)
        return replica, result, note

    def run_for(self, others: Sequence[datetime], replicas: int) -> dict[str, str]:
        """A new replica's maxRunDuration, staggered against the other replicas' deletions (staggered_run); nothing
        when the stack's own is best."""
        seconds = staggered_run(self.now(), others, self.max_run_s, replicas, self.lead_s)
        return {} if seconds >= self.max_run_s else {"maxRunDuration": run_text(seconds)}

    def grow(self, name: str, zones: Sequence[str], deadline_s: float, settings: Mapping[str, str] | None = None,
             retry_until_up: bool = False) -> tuple[Replica | None, SweepResult, str]:
        """Place replica `name` in the first of `zones` with room and gate it (not yet routed). On failure its stack
        is destroyed and removed, except for a VM that boots but never serves, which stays for `tpuserve diagnose`."""
        if settings and settings.get("maxRunDuration"):
            self.say(f"{name}: max run {settings['maxRunDuration']} (not {run_text(self.max_run_s)}), so that its "
                     "deletion falls between the other replicas'")
        try:
            result = self.place(name, zones, deadline_s, retry_until_up, settings)
        finally:
            self.release(name)  # its disk is attached now, or free again
        if not result.ok:
            if result.stopped is not None and result.stopped.kind == "not-ready":
                return None, result, self.keep_for_diagnosis(name)
            self.retire(name)
            return None, result, ""
        self.event("created", name, f"in {result.zone}")
        ready, reason = self.gate(name)
        if not ready:
            self.say(f"{name}: not serving ({reason}); destroying it")
            self.retire(name)
            return None, result, f"{name} did not pass its readiness gate: {reason}"
        self.event("gated", name)
        return self.look(name), result, ""

    def keep_for_diagnosis(self, name: str) -> str:
        """A successor whose VM boots but never serves stays for `tpuserve diagnose`, one at a time: the one kept
        before it (from this run or an earlier one) is destroyed, so scheduled runs never pile up TPU VMs."""
        with self.pool_lock:
            older, self.diagnosed[:] = list(self.diagnosed), [name]
        for stack in older:
            if stack != name and self.retire(stack):
                self.event("destroyed", stack, "never served; a newer one is kept for diagnosis")
        return (f"{name} was created but never served: kept for diagnosis (tpuserve diagnose --stack {name}); the "
                "next run destroys it")

    def answered(self, name: str) -> tuple[bool, str]:
        """Whether replica `name`, in the router, answered a completion through it, and what was found."""
        return answered_through_router(self.compute, self.router_outputs(), name, self.project)

    def remove(self, old: Replica, members: list[str]) -> None:
        """Take `old` out of the router, drain it, destroy its stack."""
        if old.name in members:
            members.remove(old.name)
            self.route(members)
        self.event("drained", old.name, self.drain(old))
        if self.retire(old.name):
            self.event("destroyed", old.name)

# --- renewal ------------------------------------------------------------------------------------------------------

@dataclass
class Pair:
    """A replica being renewed and its successor."""

    old: Replica
    name: str  # the successor's stack
    zones: list[str]
    settings: dict[str, str]  # its maxRunDuration, when staggered
    successor: Replica | None = None
    result: SweepResult = field(default_factory=SweepResult)
    note: str = ""
    error: LeaseLost | None = None  # the lease was lost during its placement: the run stops

    def left_text(self, now: datetime) -> str:
        return f"deleted at {self.old.expiry:%H:%M} UTC, in {human(self.old.expiry - now)}" if self.old.expiry \
            else "already deleted"


@dataclass
class Renewal:
    """One `fleet renew` run over the replicas due. Successors are placed and gated concurrently, at most `parallel`
    at a time (each is its own stack: its sweep, `pulumi up` and gate hold no lock another needs). The router stack
    takes one update at a time, so this thread alone updates it, and every change ready by then goes into that one
    update: successors that passed their gate join, and the replicas whose successors joined in an earlier update
    leave (a successor always serves in the router before its predecessor leaves). Replicas flex-start already
    deleted leave in the first update. Old replicas are drained and destroyed concurrently once out of the router."""

    fleet: Fleet
    members: list[str]
    current: list[Replica]
    zones: list[str]
    deadline_s: float
    started: float
    parallel: int = PARALLEL
    renewed: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    code: int = EXIT_OK
    results: queue.Queue[Pair] = field(default_factory=queue.Queue)  # placements, as they end
    halted: threading.Event = field(default_factory=threading.Event)  # an error: no placement goes on
    lease_check: Callable[[], None] = lambda: None
    _local: threading.local = field(default_factory=threading.local)

    def plan(self, due: Sequence[Replica], adopted: Sequence[Replica]) -> list[Pair]:
        """A successor per due replica: its stack name, its zones (those holding the fewest replicas first, counting
        the successors planned before it in their first zone) and its max run (staggered against every deletion
        that will remain). Serving replicas the router does not hold (a successor a stopped run left) are adopted as
        successors of the earliest due ones instead of placing new ones."""
        pairs, taken, planned = [], [r.name for r in self.current], list(self.current)
        remaining = [r.expiry for r in self.current if r.expiry and r not in due and r not in adopted]
        ready = list(adopted)
        for old in due:
            if ready:
                successor = ready.pop(0)
                pairs.append(Pair(old, successor.name, [], {}, successor=successor))
                remaining += [successor.expiry] if successor.expiry else []
                continue
            name = self.fleet.next_name(taken)
            taken.append(name)
            zones = self.fleet.candidates(self.zones, planned)
            planned.append(Replica(name, {"zone": zones[0]} if zones else {}, "planned"))
            settings = self.fleet.run_for(remaining, len(self.members))
            remaining.append(self.fleet.now() + timedelta(seconds=run_seconds(settings.get("maxRunDuration", "")) or
                                                                 self.fleet.max_run_s))
            pairs.append(Pair(old, name, zones, settings))
        return pairs

    def place(self, pair: Pair) -> None:
        """In a worker thread: the successor's sweep and gate; the pair goes to `results` however it ends."""
        self._local.placing = True
        try:
            left = self.deadline_s - (time.monotonic() - self.started)
            if self.halted.is_set():
                pair.note = "not tried: the run stopped on an error"
            elif left <= 0:
                pair.result = SweepResult(deadline_hit=True)
            else:
                pair.successor, pair.result, pair.note = self.fleet.grow(pair.name, pair.zones, left, pair.settings)
        except LeaseLost as err:
            pair.error = err
        except (FleetError, PulumiError, ComputeApiError, requests.RequestException) as err:
            pair.note = f"error: {err}"
        finally:
            self.results.put(pair)

    def guard(self) -> None:
        """The fleet's safe point during the run: the lease's check, and in a placement of a run that stopped on an
        error, an end to its sweep before the next zone."""
        self.lease_check()
        if getattr(self._local, "placing", False) and self.halted.is_set():
            raise FleetError("the run stopped on an error")

    def retire(self, old: Replica) -> None:
        """In a worker thread: drain the replica (out of the router already), then destroy its stack."""
        self.fleet.event("drained", old.name, self.fleet.drain(old))
        if self.fleet.retire(old.name):
            self.fleet.event("destroyed", old.name)

    def failed(self, pair: Pair, now: datetime) -> None:
        """No successor: the old replica serves on (or, gone, has left the router); an error stops the run."""
        line = pair.note or verdict_line(pair.result)
        if not pair.note.startswith("not tried"):
            capacity = no_capacity(pair.result) and not pair.note
            self.code = EXIT_FAILED if self.code == EXIT_FAILED or not capacity else EXIT_NO_CAPACITY
            if not capacity:  # an error the other successors would meet the same way
                self.halted.set()
        if pair.old.stage == GONE:
            self.fleet.say(f"{pair.old.name} is gone and no successor could be placed ({line}); it leaves the router")
        else:
            self.fleet.say(f"{pair.old.name} keeps serving until its deletion ({pair.left_text(now)}): no successor "
                           f"({line})")
        self.kept.append({"replica": pair.old.name, "expiry": pair.old.expiry.isoformat() if pair.old.expiry else None,
                          "reason": line, "attempts": [a.as_dict() for a in pair.result.attempts]})

    def run(self, pairs: list[Pair]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        now = self.fleet.now()
        for pair in pairs:
            self.fleet.say(f"{pair.old.name} ({pair.old.zone}) is {pair.left_text(now)}: renewing it"
                           + (f" with {pair.name}, which serves outside the router" if pair.successor else ""))
        leaving = [p.old for p in pairs if p.old.stage == GONE]  # nothing to drain: out in the first update
        joining = [p for p in pairs if p.successor is not None]  # adopted: ready now
        routed: list[Pair] = []  # in the router since the last update: their predecessors leave in the next
        waiting = len(pairs) - len(joining)  # placements whose pair is not back in `results`
        self.lease_check, self.fleet.guard = self.fleet.guard, self.guard
        with ThreadPoolExecutor(max(1, self.parallel), thread_name_prefix="place") as placing, \
                ThreadPoolExecutor(max(1, self.parallel), thread_name_prefix="retire") as retiring:
            for pair in pairs:
                if pair.successor is None:
                    placing.submit(self.place, pair)
            retires = []
            try:
                while waiting or joining or routed or leaving:
                    # Wait for a placement only when no router change is ready; then take every one that ended.
                    ended = [self.results.get()] if waiting and not (joining or routed or leaving) else []
                    while not self.results.empty():
                        ended.append(self.results.get_nowait())
                    for pair in ended:
                        waiting -= 1
                        if pair.error is not None:
                            raise pair.error
                        if pair.successor is not None:
                            joining.append(pair)
                        else:
                            self.failed(pair, now)
                    if joining or routed or leaving:
                        retires += self.update(joining, routed, leaving, retiring)
                        # A successor the router could not reach leaves in the next update; its predecessor stays.
                        routed = [p for p in joining if self.answered(p, now)]
                        leaving = [p.successor for p in joining if p not in routed and p.successor is not None]
                        joining = []
            except BaseException:
                self.halted.set()  # running placements end before their next zone
                raise
            finally:
                self.fleet.guard = self.lease_check
            for future in retires:
                future.result()

    def answered(self, pair: Pair, now: datetime) -> bool:
        """The successor, in the router now, answered a real completion through it (deploy/router_probe.py): only
        then may its predecessor leave. One that did not is kept (and the run's exit is 1)."""
        answered, why = self.fleet.answered(pair.name)
        if answered:
            self.fleet.event("answered", pair.name, why)
            return True
        self.fleet.say(f"{pair.name} did not answer through the router ({why}); it is removed again and "
                       f"{pair.old.name} keeps serving")
        self.code = EXIT_FAILED
        self.kept.append({"replica": pair.old.name, "expiry": pair.old.expiry.isoformat() if pair.old.expiry else None,
                          "reason": f"{pair.name} did not answer through the router: {why}", "attempts": []})
        return False

    def update(self, joining: list[Pair], routed: list[Pair], leaving: list[Replica], retiring: Any) -> list[Any]:
        """One router update: `joining` successors in, the predecessors of `routed` ones and `leaving` out; then
        those start draining."""
        out = [p.old.name for p in routed] + [r.name for r in leaving]
        kept = [m for m in self.members if m not in out] + [p.name for p in joining if p.name not in self.members]
        self.members[:] = sorted(kept, key=lambda m: replica_number(self.fleet.name, m) or 0)  # a stable config
        self.fleet.route(self.members)
        for pair in joining:
            self.fleet.event("added", pair.name)
        for pair in routed:
            self.renewed.append({"replica": pair.old.name, "successor": pair.name,
                                 "zone": pair.successor.zone if pair.successor else None})
        return [retiring.submit(self.retire, old) for old in [p.old for p in routed] + leaving]


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
    lease: Lease | None = None
    nat: nat.NatPlan | None = None  # what serves Cloud NAT in the fleet's regions, read under the lease


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
    interactive, asking = sys.stdin.isatty(), threading.Lock()  # renewals place successors from several threads

    def confirm(found: list[Orphan]) -> bool:
        if yes:
            return True
        with asking:
            return interactive and click.confirm(f"Delete these {len(found)} orphaned resource(s)?", default=True,
                                                 err=True)

    fleet = Fleet(stack, pulumi, ComputeClient(session, roots.compute), str(config["project"]), extra, say, confirm)
    fleet.max_run_s = run_seconds(str(config.get("maxRunDuration") or "4h")) or fleet.max_run_s
    try:
        fleet.cache_disk_gb = int(str(config.get("cacheDiskSizeGb", 100)))
    except ValueError:
        pass  # a bad value: every replica's `pulumi up` refuses it, naming the key
    return Session(fleet, config, console, session, roots, exits)


# --- the lease ------------------------------------------------------------------------------------------------------

def fleet_inventory(s: Session, yes: bool, code: int) -> tuple[dict[str, Any] | None, int]:
    """The fleet's inventory (its stack, replicas and router) at the end of a run; billing orphans deleted with
    --yes (or a yes at a terminal), else the exit is 5 (EXIT_ORPHANS) where it would have been 0."""
    from tpuserve.deploy import inventory

    stacks = [s.fleet.name, *inventory.fleet_stacks(s.fleet.name, s.fleet.stacks())]
    clients = inventory.clients_for(s.session, s.roots)
    keep = inventory.keep_caches(s.config)
    try:
        stock = inventory.stock_of(s.fleet.pulumi, stacks, clients, s.fleet.project, keep)
        if stock.billing_orphans and (yes or (sys.stdin.isatty() and click.confirm(
                f"Delete these {len(stock.billing_orphans)} orphan(s) of the fleet?", default=True, err=True))):
            for line in inventory.delete_items(clients, s.fleet.project, stock.billing_orphans):
                s.fleet.say(f"warning: could not delete {line}")
            stock = inventory.stock_of(s.fleet.pulumi, stacks, clients, s.fleet.project, keep)
    except (PulumiError, ComputeApiError, requests.RequestException) as err:
        s.fleet.say(f"warning: could not take the fleet's inventory: {err}")
        return None, code
    for line in inventory.summary_lines(stock):
        s.fleet.say(line)
    if stock.billing_orphans and code == EXIT_OK:
        s.fleet.say(f"Error: {len(stock.billing_orphans)} orphan(s) of the fleet bill on (above, with the command "
                    "that removes each); run again with --yes to delete them")
        code = EXIT_ORPHANS
    return stock.as_dict(), code


def fleet_bucket(s: Session) -> str:
    """The fleet's bucket, made if missing: the name the fleet's template stack would give its compile-cache bucket
    (private, uniform access, in the stack's region, labelled like a stack's cache bucket). It holds the lease."""
    stack, config = s.fleet.name, s.config
    name = bucket_name(s.fleet.project, base_name(stack))
    labels = {**stack_labels(stack), **dict(config.get("labels") or {}), CACHE_LABEL: stack_labels(stack)["stack"]}
    region = str(config.get("region") or region_of(str(config.get("zone") or V6E_ZONES[0])))
    buckets = Buckets(s.session, s.roots.storage)
    try:
        ensure_bucket(buckets, BucketSpec(s.fleet.project, name, region, labels))
    except ComputeApiError as err:
        if buckets.get(name) is None:  # not a race with another command making it: a real refusal
            raise FleetError(f"could not make the fleet's bucket gs://{name}: {err}") from err
    return name


def lease_store(s: Session, bucket: str) -> LeaseStore:
    return LeaseStore(s.session, bucket, base_url=s.roots.storage)


def terminate(signum: int, frame: Any) -> None:
    """SIGTERM (a cancelled CI job) ends the command as Ctrl-C does: its exit stack releases the lease."""
    raise KeyboardInterrupt


def hold(s: Session, command: str, wait_s: float, poll_s: float, as_json: bool) -> None:
    """Take the fleet's lease for `command` before anything is read, or end the command saying who holds it (exit 6).
    Released when the command ends, whichever way (its exit stack; SIGTERM too)."""
    fleet_ = s.fleet
    try:
        store = lease_store(s, fleet_bucket(s))
        lease = Lease(store, fleet_.name, command, say=fleet_.say, now=fleet_.now, sleep=fleet_.sleep)
        lease.acquire(wait_s, poll_s)
    except LeaseHeld as held:
        fleet_.say(str(held))
        finish(s, as_json, EXIT_LEASE_HELD, {"reason": "lease held", "lease": held.holder.as_dict()})
    except (FleetError, LeaseError, requests.RequestException) as err:
        fleet_.say(f"Error: could not take the fleet's lease: {err}")
        finish(s, as_json, EXIT_FAILED, {"reason": f"lease: {err}"})
    s.exits.callback(lease.release)
    if threading.current_thread() is threading.main_thread():
        s.exits.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, terminate))
    s.lease, fleet_.guard = lease, lease.check


def lease_line(s: Session) -> dict[str, Any] | None:
    """Who holds the fleet's lease now (for `fleet status`), without making the bucket."""
    try:
        found = lease_store(s, bucket_name(s.fleet.project, base_name(s.fleet.name))).read()
    except (LeaseError, requests.RequestException):
        return None
    return None if found is None else {"line": found[0].line(s.fleet.name, s.fleet.now()), **found[0].as_dict()}


# --- Cloud NAT ------------------------------------------------------------------------------------------------------

def fleet_nat_regions(config: Mapping[str, Any]) -> list[str]:
    return nat.fleet_nat_regions(str(config.get("routerZone") or ""), str(config.get("zone") or V6E_ZONES[0]),
                                 [str(zone) for zone in config.get("zones") or V6E_ZONES])


def plan_nat(s: Session) -> bool:
    """Read which NAT serves each region of the fleet (under the lease) and set the router stack's
    cloudNatSkipRegions from it: the router makes NAT only where no other stack's serves. True when that differs
    from what the router stack has now (another stack's NAT went away, or came), so an update is due."""
    fleet_, config = s.fleet, s.config
    router = router_name(fleet_.name)
    if str(config.get("createCloudNat", True)).lower() == "false":
        return False  # the VPC's own NAT serves the regions
    try:
        deployed = router in fleet_.stacks()
        own = nat.own_nats(fleet_.cli(router).export()) if deployed else set()
        target = Target(fleet_.project, (), stack=router, network=str(config.get("network") or "default"),
                        subnetwork=str(config.get("subnetwork") or ""), nat_regions=tuple(fleet_nat_regions(config)),
                        own_nats=frozenset(own))
        s.nat = nat_plan(s.session, s.roots, target)
    except (PulumiError, ComputeApiError, requests.RequestException, ValueError) as err:
        fleet_.say(f"warning: could not tell which Cloud NAT serves the fleet's regions ({err}); the router stack's "
                   "NAT stays as it is")
        return False
    for line in s.nat.lines():
        fleet_.say(line)
    fleet_.router_settings = s.nat.settings()
    if not deployed:
        return False
    current = fleet_.cli(router).config().get(nat.SKIP_KEY) or []
    return sorted(current) != s.nat.skip_regions()


def read_fleet(s: Session) -> tuple[bool, list[Replica], list[str]]:
    """What a command reads once it holds the lease (never before: nobody else changes the fleet now): which NAT
    serves the fleet's regions (True when the router stack must follow a change), the replicas, the router's
    members."""
    nat_changed = plan_nat(s)
    current = s.fleet.look_all()
    return nat_changed, current, [r.name for r in current if r.in_router]


def check_zones(config: Mapping[str, Any], zones: str | None, stack: str) -> None:
    """--zones may only name zones of regions where the fleet has Cloud NAT (components/router.py nat_regions: the
    router's zone, the stack's `zone` and `zones`, from the router stack or another stack's NAT there): a replica
    elsewhere could not pull its image."""
    if str(config.get("createCloudNat", True)).lower() == "false":
        return  # the VPC's own NAT serves the regions
    covered = set(fleet_nat_regions(config))
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
    if report.failed:
        return None
    blocked = {r.region for r in s.nat.regions if r.blocked} if s.nat else set()
    for zone in [z for z in report.usable_zones if region_of(z) in blocked]:
        s.fleet.say(f"{zone} skipped: {s.nat.region(region_of(zone)).describe(router_name(s.fleet.name))}")
    return [zone for zone in report.usable_zones if region_of(zone) not in blocked]


def parse_duration(text: str, option: str) -> float:
    """parse_deadline for any option: its message names `option` (parse_deadline names --deadline, the option it
    was written for)."""
    try:
        return parse_deadline(text)
    except click.BadParameter as err:
        err.param_hint = option
        raise


def finish(s: Session, as_json: bool, code: int, summary: dict[str, Any]) -> None:
    s.exits.close()
    if as_json:
        echo_json({"ok": code == EXIT_OK, "fleet": s.fleet.name, "exit": code, **summary})
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


def parse_wait(text: str) -> float:
    """--lease-wait: 0 (do not wait) or a duration (30m, 1h)."""
    return 0.0 if text.strip() in ("0", "0s", "0m") else parse_duration(text, "--lease-wait")


def lease_options(default_wait: str, why: str) -> Callable[..., Any]:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed((
                click.option("--lease-wait", "lease_wait_text", default=default_wait, show_default=True,
                             help=f"How long to wait while another fleet command holds the fleet's lease (0: exit 6 "
                             f"at once, naming the holder). {why}"),
                click.option("--lease-poll", "lease_poll_s", type=click.FloatRange(min=0.01), default=POLL_S,
                             hidden=True, help="Seconds between looks at a held lease (tests)."))):
            command = decorator(command)
        return command
    return decorate


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
    """Replicas across zones behind a LiteLLM router, renewed before flex-start deletes them: up, status, renew,
    down."""


@fleet.command("up")
@common_options
@click.option("--replicas", type=click.IntRange(min=1, max=16), required=True, help="How many replicas to serve.")
@click.option("--deadline", "deadline_text", default=UP_DEADLINE, show_default=True,
              help="Give up placing replicas after this long (90m, 2h).")
@click.option("--retry-until-up", is_flag=True, help="When every zone fails for a replica, sweep again (30 s, "
              "doubling) until the deadline.")
@change_options
@lease_options("1h", "A renewal from the schedule takes up to its deadline plus a drain.")
def fleet_up(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...], replicas: int, deadline_text: str,
             retry_until_up: bool, zones: str | None, yes: bool, skip_preflight: bool, drain_timeout_s: float,
             pulumi_args: tuple[str, ...], lease_wait_text: str, lease_poll_s: float) -> None:
    """Serve N replicas behind the router: place the missing ones zone by zone, gate them, route to them."""
    deadline_s, started = parse_deadline(deadline_text), time.monotonic()
    wait_s = parse_wait(lease_wait_text)
    s = open_fleet(stack, cwd, endpoints, yes, pulumi_args)
    check_router_settings(s.config, stack)
    check_zones(s.config, zones, stack)
    fleet_, placed, failures = s.fleet, [], []
    fleet_.drain_timeout_s = drain_timeout_s
    code = EXIT_OK
    with s.exits:
        hold(s, "fleet up", wait_s, lease_poll_s, as_json)
        try:
            nat_changed, current, members = read_fleet(s)
            fleet_.prune_unready(current, members)
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
            if unrouted or nat_changed or router_name(stack) not in fleet_.stacks():
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
                settings = fleet_.run_for([r.expiry for r in current if r.expiry], replicas)
                replica, result, note = fleet_.add(zone_list, left, current, retry_until_up, settings)
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
        except (FleetError, LeaseLost, PulumiError) as err:
            fleet_.say(f"Error: {err}")
            code = EXIT_FAILED
        serving_now = [r for r in fleet_.look_all() if r.stage == SERVING and r.in_router]
        fleet_.say(f"{len(serving_now)} of {replicas} replica(s) serve behind {router_name(stack)}"
                   + (f" ({', '.join(f'{r.name} in {r.zone}' for r in serving_now)})" if serving_now else ""))
        if code == EXIT_NO_CAPACITY:
            fleet_.say("the others found no capacity: run fleet up again later, add zones, or --retry-until-up")
        fleet_.prune_caches()
        stock, code = fleet_inventory(s, yes, code)
        finish(s, as_json, code, {"serving": [r.name for r in serving_now], "placed": placed, "failures": failures,
                                  "events": fleet_.events, "orphans": fleet_.orphans, "inventory": stock})


@fleet.command("renew")
@common_options
@click.option("--lead", "lead_text", default=DEFAULT_LEAD, show_default=True,
              help="Replace a replica whose flex-start deletion is less than this far away.")
@click.option("--deadline", "deadline_text", default=RENEW_DEADLINE, show_default=True,
              help="Give up looking for capacity for successors after this long.")
@click.option("--parallel", type=click.IntRange(min=1, max=16), default=PARALLEL, show_default=True,
              help="Successors placed at once when several replicas are due.")
@change_options
@lease_options("0", "The schedule's renewal exits at once when a manual fleet command runs.")
def fleet_renew(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...], lead_text: str,
                deadline_text: str, parallel: int, zones: str | None, yes: bool, skip_preflight: bool,
                drain_timeout_s: float, pulumi_args: tuple[str, ...], lease_wait_text: str,
                lease_poll_s: float) -> None:
    """Replace every replica whose flex-start deletion is near: successors placed and gated (several at once),
    added; the old ones drained, destroyed. Without capacity an old replica serves until its deletion (exit 3)."""
    lead = timedelta(seconds=parse_duration(lead_text, "--lead"))
    deadline_s, started = parse_deadline(deadline_text), time.monotonic()
    wait_s = parse_wait(lease_wait_text)
    s = open_fleet(stack, cwd, endpoints, yes, pulumi_args)
    check_zones(s.config, zones, stack)
    fleet_ = s.fleet
    fleet_.drain_timeout_s, fleet_.lead_s = drain_timeout_s, lead.total_seconds()
    code, renewal = EXIT_OK, None
    with s.exits:
        hold(s, "fleet renew", wait_s, lease_poll_s, as_json)
        try:
            nat_changed, current, members = read_fleet(s)
            fleet_.prune_unready(current, members)
            now = fleet_.now()
            due = sorted([r for r in current if r.in_router and (r.stage == GONE or (
                r.expiry is not None and r.expiry - now < lead))], key=lambda r: r.expiry or now)
            adopted = [r for r in current if r.stage == SERVING and not r.in_router][:len(due)]
            if not current:
                fleet_.say(f"stack {stack} has no fleet (no {replica_name(stack, 1)}...): nothing to renew")
            elif not due:
                soonest = min((r for r in current if r.expiry), key=lambda r: r.expiry, default=None)
                fleet_.say("nothing to renew" + (f": the next deletion is {soonest.name}'s at {soonest.expiry:%H:%M} "
                                                 f"UTC (in {human(soonest.expiry - now)}; renewed from {lead_text} "
                                                 "before)" if soonest and soonest.expiry else ""))
            zone_list = usable_zones(s, zones, skip_preflight) if len(due) > len(adopted) else []
            if zone_list is None:
                finish(s, as_json, EXIT_FAILED, {"reason": "preflight failed", "events": fleet_.events})
            renewal = Renewal(fleet_, members, current, zone_list or [], deadline_s, started, parallel)
            renewal.run(renewal.plan(due, adopted))
            fleet_.prune_caches()
            if nat_changed and not fleet_.events and current:
                fleet_.say("Cloud NAT changed in the fleet's regions: the router stack follows")
                fleet_.route(members)
            code = renewal.code
        except (FleetError, LeaseLost, PulumiError) as err:
            fleet_.say(f"Error: {err}")
            code = EXIT_FAILED
        stock, code = fleet_inventory(s, yes, code)
        finish(s, as_json, code, {"renewed": renewal.renewed if renewal else [],
                                  "kept": renewal.kept if renewal else [], "events": fleet_.events,
                                  "orphans": fleet_.orphans, "inventory": stock})


@fleet.command("down")
@common_options
@click.option("--yes", is_flag=True, help="Do not ask before destroying the router and every replica.")
@lease_options("1h", "A renewal from the schedule takes up to its deadline plus a drain.")
def fleet_down(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...], yes: bool, lease_wait_text: str,
               lease_poll_s: float) -> None:
    """Tear the fleet down: the router first (no request reaches a replica through it after), then every replica,
    and their stacks. The fleet's caches and bucket are kept (tpuserve cache ls|rm)."""
    wait_s = parse_wait(lease_wait_text)
    s = open_fleet(stack, cwd, endpoints, yes, ())
    fleet_, code, destroyed, left = s.fleet, EXIT_OK, [], []
    with s.exits:
        hold(s, "fleet down", wait_s, lease_poll_s, as_json)
        try:
            stacks = fleet_.stacks()  # read under the lease
            router, names = router_name(stack), fleet_.replica_names(stacks)
            order = ([router] if router in stacks else []) + names
            if not order:
                fleet_.say(f"stack {stack} has no fleet (no {router}, no {replica_name(stack, 1)}...): nothing to do")
                finish(s, as_json, EXIT_OK, {"destroyed": [], "left": []})
            for line in nat_users(s, names):
                fleet_.say(f"warning: {line}")
            what = f"destroy {', '.join(order)} (the router first)"
            if not yes and not (sys.stdin.isatty() and click.confirm(f"{what.capitalize()}?", default=False,
                                                                      err=True)):
                fleet_.say(f"fleet down would {what}; nothing done: run it again with --yes")
                finish(s, as_json, EXIT_USAGE, {"destroyed": [], "left": order})
            for name in order:
                if fleet_.retire(name):
                    fleet_.event("destroyed", name)
                    destroyed.append(name)
                    continue
                code = EXIT_FAILED
                if name == router:  # the router may still route to them: keep the replicas
                    fleet_.say(f"the router could not be destroyed: {', '.join(names)} are kept")
                    break
            left = [n for n in order if n not in destroyed]
        except (FleetError, LeaseLost, PulumiError) as err:
            fleet_.say(f"Error: {err}")
            code, left = EXIT_FAILED, [n for n in fleet_.stacks() if n == router_name(stack)
                                       or replica_number(stack, n) is not None]
        fleet_.say(f"destroyed {', '.join(destroyed) or 'nothing'}" + (f"; left: {', '.join(left)}" if left else ""))
        finish(s, as_json, code, {"destroyed": destroyed, "left": left, "events": fleet_.events})


def nat_users(s: Session, replicas: Sequence[str]) -> list[str]:
    """The router stack's own Cloud NATs that VMs outside the fleet rely on: destroying the router takes their
    egress (tpuserve/deploy/nat.py). Nothing when the router or the VMs cannot be read."""
    fleet_, router = s.fleet, router_name(s.fleet.name)
    if router not in fleet_.stacks():
        return []
    try:
        found = nat.reliance_on(fleet_.cli(router).export(), s.session, fleet_.project,
                                [stack_labels(name)["stack"] for name in (router, *replicas)], s.roots.compute)
    except (PulumiError, ComputeApiError, requests.RequestException, ValueError) as err:
        fleet_.say(f"warning: could not tell which VMs use the router's Cloud NAT ({err})")
        return []
    return found.lines(router)


@fleet.command("status")
@common_options
def fleet_status(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...]) -> None:
    """Every replica (zone, stage, in the router, time to its deletion, max run) and the router; who holds the
    fleet's lease; how far apart the deletions are."""
    from rich.table import Table

    s = open_fleet(stack, cwd, endpoints, False, ())
    fleet_ = s.fleet
    now = fleet_.now()
    replicas = fleet_.look_all()
    for replica in replicas:
        replica.load = fleet_.measure(replica)
    router = fleet_.router_outputs()
    router_state = router_status(fleet_, router)
    lease, stagger = lease_line(s), stagger_status(fleet_, replicas)
    if as_json:
        finish(s, True, EXIT_OK, {"replicas": [r.as_dict(now) for r in replicas], "router": router_state,
                                  "lease": lease, "stagger": stagger})
    table = Table(title=f"fleet {stack}", title_justify="left")
    for column in ("replica", "zone", "stage", "router", "deleted at (UTC)", "in", "max run", "load"):
        table.add_column(column)
    for replica in replicas:
        left = replica.until_expiry(now)
        table.add_row(replica.name, replica.zone or "-", replica.stage + (f": {replica.detail}" if replica.detail
                                                                          and replica.stage != SERVING else ""),
                      "in" if replica.in_router else "out",
                      f"{replica.expiry:%Y-%m-%d %H:%M}" if replica.expiry else "-",
                      human(left) if left is not None else "-",
                      run_text(replica.max_run_s) if replica.max_run_s else "-",
                      str(replica.load) if replica.load else "-")
    s.console.print(table)
    s.console.print(f"router {router_name(stack)}: {router_state['stage']}"
                    + (f", {router_state['zone']}, {router_state['endpoint']} (reach it: "
                       f"{router.get('iapTunnelCommand')})" if router else "")
                    + (f", routing to {', '.join(router_state['replicas']) or 'no replica'}" if router else ""),
                    markup=False, highlight=False, soft_wrap=True)
    fleet_.say(stagger["line"])
    fleet_.say(f"lease: {lease['line']}" if lease else "lease: free (no fleet command runs)")
    finish(s, False, EXIT_OK, {})


def stagger_status(fleet_: Fleet, replicas: Sequence[Replica]) -> dict[str, Any]:
    """How far apart the replicas' deletions are, against the target: max run / replicas."""
    expiries = sorted(r.expiry for r in replicas if r.expiry)
    target = fleet_.max_run_s / max(len(replicas), 1)
    gap = spacing(expiries, fleet_.max_run_s)
    line = (f"deletions at least {human(timedelta(seconds=gap))} apart (target {human(timedelta(seconds=target))}: "
            f"maxRunDuration {run_text(fleet_.max_run_s)} / {len(replicas)} replicas; renewals shorten a "
            "successor's max run to get there)") if gap is not None else "deletions: fewer than two replicas"
    return {"line": line, "minGapSeconds": None if gap is None else int(gap), "targetGapSeconds": int(target)}


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

