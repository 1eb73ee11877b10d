"""`tpuserve inventory`: everything a stack owns in the project, what it bills, and whether anything that bills is
left that nobody asked for (in state, kept, orphan). Where it looks and why: docs/design/inventory.md."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import click
import requests

from tpuserve import cli, exits
from tpuserve.deploy.cache import CacheDisk, is_warm
from tpuserve.deploy.preflight import Endpoints, adc_or_fail, endpoint_option
from tpuserve.deploy.pulumi_cli import PulumiError, open_stack, require_project
from tpuserve.facts import (CACHE_LABEL, HYPERDISK_BALANCED_FREE_IOPS, HYPERDISK_BALANCED_FREE_MIBPS,
                            PRICE_PER_CHIP_HOUR, hyperdisk_balanced_monthly_usd)
from tpuserve.gce import ComputeApiError, ComputeClient, JsonApi, ZonalDisks, label_filter, ok_or_gone
from tpuserve.gcs import Buckets
from tpuserve.names import base_name, service_account_id, stack_slug
from tpuserve.serving import tpu_chips

HOURS_PER_MONTH = 730
IN_STATE, KEPT, ORPHAN = "in state", "kept", "orphan"
AUTONAME = "-[0-9a-f]{7}"  # Pulumi's autonaming suffix (pulumi-gcp SetAutonaming: name, "-", 7 random hex)
WARM_MARKER_PREFIX = "disks/"  # the VM's marker of a served cache disk: disks/<zone>/<disk> (vm/compile_cache.py)
DELETE_ORDER = ("instance", "nat", "router", "firewall", "disk", "bucket", "secret", "service-account")


@lru_cache(maxsize=1)
def prices() -> dict[str, Any]:
    return json.loads(resources.files("tpuserve").joinpath("data/prices.json").read_text())


@dataclass(frozen=True)
class Item:
    kind: str  # instance, disk, bucket, router, nat, firewall, service-account, secret
    name: str
    location: str  # a zone, a region or "global"
    status: str  # in state, kept, orphan
    why: str = ""
    hourly_usd: float = 0.0
    monthly_usd: float = 0.0  # storage and other monthly charges, not counting hourly ones
    remove: str = ""  # the command that deletes it (orphans and kept caches)
    detail: str = ""

    @property
    def bills(self) -> bool:
        return self.hourly_usd > 0 or self.monthly_usd > 0

    @property
    def per_month(self) -> float:
        return round(self.hourly_usd * HOURS_PER_MONTH + self.monthly_usd, 2)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bills": self.bills, "perMonthUsd": self.per_month}


@dataclass
class Inventory:
    project: str
    stacks: tuple[str, ...]
    items: list[Item] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what could not be listed (the inventory is then partial)

    @property
    def orphans(self) -> list[Item]:
        return [item for item in self.items if item.status == ORPHAN]

    @property
    def billing_orphans(self) -> list[Item]:
        return [item for item in self.orphans if item.bills]

    def total(self, status: str | None = None) -> float:
        return round(sum(item.per_month for item in self.items if status is None or item.status == status), 2)

    def as_dict(self) -> dict[str, Any]:
        return {"project": self.project, "stacks": list(self.stacks), "items": [i.as_dict() for i in self.items],
                "perMonthUsd": {"total": self.total(), "inState": self.total(IN_STATE), "kept": self.total(KEPT),
                                "orphan": self.total(ORPHAN)},
                "billingOrphans": len(self.billing_orphans), "errors": self.errors}


# --- what the state holds -------------------------------------------------------------------------------------

ID_PATTERNS = (
    ("instance", re.compile(r"projects/[^/]+/zones/(?P<loc>[^/]+)/instances/(?P<name>[^/]+)$")),
    ("disk", re.compile(r"projects/[^/]+/zones/(?P<loc>[^/]+)/disks/(?P<name>[^/]+)$")),
    ("firewall", re.compile(r"projects/[^/]+/global/firewalls/(?P<name>[^/]+)$")),
    ("router", re.compile(r"projects/[^/]+/regions/(?P<loc>[^/]+)/routers/(?P<name>[^/]+)$")),
    ("nat", re.compile(r"^(?:projects/)?[^/]+/(?P<loc>[^/]+)/[^/]+/(?P<name>[^/]+)$")),
    ("service-account", re.compile(r"projects/[^/]+/serviceAccounts/(?P<name>[^@/]+)@")),
    ("secret", re.compile(r"projects/[^/]+/secrets/(?P<name>[^/]+)$")),
)


def state_keys(state: Mapping[str, Any]) -> set[str]:
    """Every resource of a `pulumi stack export` as `kind:location:name` keys (the provider ids, normalised)."""
    keys = {key_of_id(str(resource.get("id") or ""), str(resource.get("type") or ""))
            for resource in state.get("deployment", {}).get("resources") or []}
    return keys - {""}


def key_of_id(id_: str, type_: str) -> str:
    if type_ == "pulumi-python:dynamic:Resource" and "/" not in id_ and id_:
        return f"bucket:global:{id_}"  # the cache bucket's id is its name
    for kind, pattern in ID_PATTERNS:
        if kind == "nat" and type_ != "gcp:compute/routerNat:RouterNat":
            continue
        match = pattern.search(id_)
        if match:
            return key(kind, match.groupdict().get("loc") or "global", match["name"])
    return ""


def key(item_kind: str, location: str, name: str) -> str:
    return f"{item_kind}:{location}:{name}"


# --- prices ----------------------------------------------------------------------------------------------------

def instance_hourly(instance: Mapping[str, Any], price_per_chip_hour: float) -> float:
    machine_type = str(instance.get("machineType", "")).rsplit("/", 1)[-1]
    if instance.get("status") in ("TERMINATED", "STOPPED", "SUSPENDED"):
        return 0.0  # a stopped VM bills its disks only (a PROVISIONING one is about to bill: it counts)
    chips = tpu_chips(machine_type)
    if chips:
        return round(chips * price_per_chip_hour, 4)
    return float(prices()["machineTypesPerHour"].get(machine_type, prices()["machineTypesPerHour"]["default"]))


def disk_monthly(disk: Mapping[str, Any]) -> float:
    """What a disk bills per month: its capacity, and Hyperdisk Balanced's performance above the free (facts.py)."""
    size = int(disk.get("sizeGb", 0))
    disk_type = str(disk.get("type", "")).rsplit("/", 1)[-1]
    if disk_type == "hyperdisk-balanced":
        return round(hyperdisk_balanced_monthly_usd(
            size, int(disk.get("provisionedIops") or HYPERDISK_BALANCED_FREE_IOPS),
            int(disk.get("provisionedThroughput") or HYPERDISK_BALANCED_FREE_MIBPS)), 2)
    table = prices()["diskPerGbMonth"]
    return round(size * float(table.get(disk_type, table["default"])), 2)


# --- the command's work ------------------------------------------------------------------------------------------

def labelled(labels: Mapping[str, str], stacks: Sequence[str]) -> bool:
    return labels.get("app") == "tpu-serve" and labels.get("stack") in {stack_slug(s) for s in stacks}


@dataclass
class Look:
    """Where the stacks' resources are looked for, each kind an Item generator (docs/design/inventory.md)."""

    session: requests.Session
    roots: Endpoints
    project: str
    stacks: tuple[str, ...]
    held: set[str] = field(default_factory=set)  # the state's keys (state_keys)
    keep_caches: bool = True
    price_per_chip_hour: float = PRICE_PER_CHIP_HOUR
    warm: set[str] | None = None
    errors: list[str] = field(default_factory=list)

    def pages(self, url: str) -> Iterator[dict[str, Any]]:
        return JsonApi(self.session).pages(url)

    @property
    def gcs(self) -> Buckets:
        return Buckets(self.session, self.roots.storage)

    def stack_buckets(self) -> list[dict[str, Any]]:
        return [b for b in self.gcs.list(self.project) if labelled(b.get("labels") or {}, self.stacks)]

    def warm_markers(self) -> set[str] | None:
        """`zone/disk` for every marker in the stacks' compile-cache buckets; None (and an error) when unreadable."""
        try:
            return {item["name"].removeprefix(WARM_MARKER_PREFIX) for bucket in self.stack_buckets()
                    for item in self.gcs.objects(bucket["name"], WARM_MARKER_PREFIX)}
        except (requests.RequestException, RuntimeError) as err:
            self.errors.append(f"compile-cache markers: {err}")
            return None

    def mark(self, kind: str, location: str, name: str) -> str:
        return IN_STATE if key(kind, location, name) in self.held else ORPHAN

    def instances(self) -> Iterator[Item]:
        compute = ComputeClient(self.session, self.roots.compute)
        for instance in compute.aggregated_instances(self.project, label_filter({"app": "tpu-serve"})):
            if labelled(instance.get("labels") or {}, self.stacks):
                zone, name = str(instance.get("zone", "")).rsplit("/", 1)[-1], instance["name"]
                status = self.mark("instance", zone, name)
                machine_type = str(instance.get("machineType", "")).rsplit("/", 1)[-1]
                yield Item("instance", name, zone, status, "" if status == IN_STATE else "not in the stack's state (a "
                           "create that timed out, or a successor that never served)",
                           hourly_usd=instance_hourly(instance, self.price_per_chip_hour),
                           remove=f"gcloud compute instances delete {name} --zone {zone} --project {self.project} "
                                  "--quiet", detail=f"{machine_type}, {instance.get('status', '')}")

    def disks(self) -> Iterator[Item]:
        disks = ZonalDisks(self.session, self.roots.compute)
        for disk in disks.aggregated(self.project, label_filter({"app": "tpu-serve"})):
            if labelled(disk.get("labels") or {}, self.stacks):
                yield self.disk_item(disk)

    def buckets(self) -> Iterator[Item]:
        price = float(prices()["storagePerGbMonth"]["STANDARD"])
        for bucket in self.stack_buckets():
            name = bucket["name"]
            size = sum(int(item.get("size", 0)) for item in self.gcs.objects(name))
            status = IN_STATE if key("bucket", "global", name) in self.held else KEPT if self.keep_caches else ORPHAN
            yield Item("bucket", name, str(bucket.get("location", "")).lower(), status,
                       "" if status == IN_STATE else "the compile-cache bucket, kept for the next deployment"
                       if status == KEPT else "not in the stack's state", monthly_usd=round(size / 2**30 * price, 2),
                       remove=f"gcloud storage rm --recursive gs://{name}", detail=f"{size / 2**20:.1f} MiB")

    def network(self) -> Iterator[Item]:
        """Firewalls, and routers with their NATs, by the names the program gives them."""
        bases = [base_name(stack) for stack in self.stacks]
        autonamed = re.compile(rf"^(?:{'|'.join(map(re.escape, bases))})(?:-[a-z0-9-]+)?{AUTONAME}$")
        compute = f"{self.roots.compute}/compute/v1/projects/{self.project}"
        for body in self.pages(f"{compute}/global/firewalls"):
            for rule in body.get("items") or []:
                name, status = rule["name"], self.mark("firewall", "global", rule["name"])
                if status == IN_STATE or autonamed.match(name) and set(rule.get("targetTags") or []) & set(bases):
                    yield Item("firewall", name, "global", status,
                               remove=f"gcloud compute firewall-rules delete {name} --project {self.project} --quiet",
                               detail=f"to {', '.join(rule.get('targetTags') or [])}")
        nat_price = float(prices()["cloudNat"]["perVmHour"])
        for body in self.pages(f"{compute}/aggregated/routers"):
            for scope, scoped in (body.get("items") or {}).items():
                region = scope.rsplit("/", 1)[-1]
                for router in scoped.get("routers", []):
                    name, status = router["name"], self.mark("router", region, router["name"])
                    if status == ORPHAN and not autonamed.match(name):
                        continue
                    where = f"--region {region} --project {self.project} --quiet"
                    yield Item("router", name, region, status, remove=f"gcloud compute routers delete {name} {where}")
                    for nat in router.get("nats") or []:
                        yield Item("nat", nat["name"], region, status, "per VM-hour of the VMs using it; data per GB",
                                   detail=f"{nat.get('sourceSubnetworkIpRangesToNat', '')} on {name}",
                                   hourly_usd=0.0 if status == IN_STATE else nat_price,
                                   remove=f"gcloud compute routers nats delete {nat['name']} --router {name} {where}")

    def service_accounts(self) -> Iterator[Item]:
        accounts = {service_account_id(base_name(stack)) for stack in self.stacks}
        for body in self.pages(f"{self.roots.iam}/v1/projects/{self.project}/serviceAccounts"):
            for account in body.get("accounts") or []:
                account_id = str(account.get("email", "")).split("@", 1)[0]
                if account_id in accounts:
                    yield Item("service-account", account_id, "global",
                               self.mark("service-account", "global", account_id),
                               remove=f"gcloud iam service-accounts delete {account['email']} --project {self.project} "
                                      "--quiet")

    def secrets(self) -> Iterator[Item]:
        for body in self.pages(f"{self.roots.secretmanager}/v1/projects/{self.project}/secrets"):
            for secret in body.get("secrets") or []:
                if labelled(secret.get("labels") or {}, self.stacks):
                    name = str(secret["name"]).rsplit("/", 1)[-1]
                    yield Item("secret", name, "global", self.mark("secret", "global", name),
                               monthly_usd=float(prices()["secretManager"]["perActiveVersionMonth"]),
                               remove=f"gcloud secrets delete {name} --project {self.project} --quiet")

    def disk_item(self, disk: Mapping[str, Any]) -> Item:
        zone = str(disk.get("zone", "")).rsplit("/", 1)[-1]
        name = str(disk["name"])
        users = [str(user).rsplit("/", 1)[-1] for user in disk.get("users") or []]
        remove = f"gcloud compute disks delete {name} --zone {zone} --project {self.project} --quiet"
        detail = f"{disk.get('sizeGb')} GB {str(disk.get('type', '')).rsplit('/', 1)[-1]}" + (
            f", attached to {', '.join(users)}" if users else "")
        monthly = disk_monthly(disk)
        if key("disk", zone, name) in self.held:
            return Item("disk", name, zone, IN_STATE, monthly_usd=monthly, detail=detail)
        if users:  # a boot disk, or a cache disk attached to a VM the inventory lists: it goes with that VM
            held = any(key("instance", zone, user) in self.held for user in users)
            return Item("disk", name, zone, IN_STATE if held else ORPHAN, "attached to a VM", monthly_usd=monthly, remove=remove, detail=detail)
        cache = CACHE_LABEL in (disk.get("labels") or {})
        if cache and is_warm(CacheDisk.from_api(disk), self.warm) and self.keep_caches:
            return Item("disk", name, zone, KEPT, f"a warm cache (last attached {disk.get('lastAttachTimestamp')}): "
                        "the next VM in this zone boots warm", monthly_usd=monthly, remove=remove, detail=detail)
        why = "a cache disk that never held a served cache (never attached, or no compile-cache marker)" if cache \
            else "not in the stack's state and attached to nothing"
        return Item("disk", name, zone, ORPHAN, why, monthly_usd=monthly, remove=remove, detail=detail)


def stock_of(pulumi: Any, session: requests.Session, roots: Endpoints, config: Mapping[str, Any]) -> Inventory:
    """The inventory of `pulumi`'s stack (a state that cannot be exported counts as holding nothing, and says so)."""
    try:
        held, errors = state_keys(pulumi.export()), []
    except Exception as err:  # noqa: BLE001 - PulumiError, or a state that is not JSON: the cloud still answers
        held, errors = set(), [f"the state of {pulumi.stack} ({err})"]
    look = Look(session, roots, str(config.get("project", "")), (pulumi.stack,), held,
                str(config.get("keepCaches", True)).lower() != "false",
                float(config.get("pricePerChipHour") or PRICE_PER_CHIP_HOUR))
    look.warm = look.warm_markers()
    inventory = Inventory(look.project, look.stacks)
    for what, items in (("instances", look.instances()), ("disks", look.disks()), ("buckets", look.buckets()),
                        ("firewalls and routers", look.network()), ("service accounts", look.service_accounts()),
                        ("secrets", look.secrets())):
        try:
            for item in items:  # what was listed before an error stays
                inventory.items.append(item)
        except (requests.RequestException, RuntimeError) as err:
            look.errors.append(f"{what}: {err}")
    inventory.items.sort(key=lambda item: ({IN_STATE: 0, KEPT: 1, ORPHAN: 2}[item.status], item.kind, item.name))
    inventory.errors = look.errors + errors
    return inventory


def delete_items(session: requests.Session, roots: Endpoints, project: str, items: Sequence[Item]) -> list[str]:
    """Delete orphans, VMs first (their disks free only then), each waited for; returns what failed, with why."""
    disks = ZonalDisks(session, roots.compute)
    compute = f"{roots.compute.rstrip('/')}/compute/v1/projects/{project}"
    waited = {"instance": "zones/{location}/instances/{name}", "router": "regions/{location}/routers/{name}",
              "firewall": "global/firewalls/{name}"}
    gone_is_done = {"secret": f"{roots.secretmanager}/v1/projects/{project}/secrets/{{name}}",
                    "service-account": f"{roots.iam}/v1/projects/{project}/serviceAccounts/"
                                       f"{{name}}@{project}.iam.gserviceaccount.com"}
    failed = []
    for item in sorted(items, key=lambda i: DELETE_ORDER.index(i.kind) if i.kind in DELETE_ORDER else 9):
        try:
            if item.kind in waited:
                disks.wait_operation(session.delete(
                    f"{compute}/{waited[item.kind].format(location=item.location, name=item.name)}", timeout=30))
            elif item.kind == "disk":
                disks.delete(project, item.location, item.name)
            elif item.kind == "bucket":
                Buckets(session, roots.storage).delete(item.name)
            elif item.kind in gone_is_done:
                ok_or_gone(session.delete(gone_is_done[item.kind].format(name=item.name), timeout=30))
            # a NAT goes with its router
        except (ComputeApiError, requests.RequestException) as err:
            failed.append(f"{item.kind} {item.name}: {err}")
    return failed


def close_run(pulumi: Any, config: Mapping[str, Any], session: requests.Session, roots: Endpoints,
              confirm: Callable[[Sequence[Any]], bool], say: Callable[[str], None], code: int,
              command: str) -> tuple[int, Inventory | None]:
    """The inventory ending `up`, `renew`, `destroy`, said; billing orphans deleted if `confirm`; one left: ORPHANS."""
    stock = said_stock(pulumi, session, roots, config, say)
    orphans = stock.billing_orphans if stock is not None else []
    if orphans and confirm(orphans):
        failed = delete_items(session, roots, stock.project, orphans)
        for line in failed:
            say(f"warning: could not delete {line}")
        say(f"deleted {len(orphans) - len(failed)} orphan(s): {', '.join(f'{i.kind} {i.name}' for i in orphans)}")
        stock = said_stock(pulumi, session, roots, config, say)
    if stock is not None and stock.billing_orphans and code == exits.OK:
        say(f"Error: {len(stock.billing_orphans)} orphan(s) that bill are left (above, each with the command that "
            f"removes it); run `{command}` again with --yes to delete them")
        code = exits.ORPHANS
    return code, stock


def said_stock(pulumi: Any, session: requests.Session, roots: Endpoints, config: Mapping[str, Any],
               say: Callable[[str], None]) -> Inventory | None:
    try:
        stock = stock_of(pulumi, session, roots, config)
    except (PulumiError, requests.RequestException, ComputeApiError) as err:
        say(f"warning: could not take the stack's inventory: {err}")
        return None
    for line in summary_lines(stock):
        say(line)
    return stock


# --- reporting ---------------------------------------------------------------------------------------------------

def summary_lines(inventory: Inventory) -> list[str]:
    """The totals, then every orphan and kept cache, each orphan that bills with the command that removes it."""
    lines = [f"inventory of {', '.join(inventory.stacks)} in {inventory.project}: {len(inventory.items)} resource(s), "
             f"${inventory.total(IN_STATE):.2f}/month in the state, ${inventory.total(KEPT):.2f}/month kept on "
             f"purpose, ${inventory.total(ORPHAN):.2f}/month orphaned"]
    for item in inventory.items:
        if item.status == IN_STATE:
            continue
        cost = f"${item.per_month:.2f}/month" if item.bills else "free"
        lines.append(f"  {item.status}: {item.kind} {item.name} ({item.location}, {cost})"
                     f"{': ' + item.why if item.why else ''}")
        if item.status == ORPHAN and item.bills:
            lines.append(f"    remove it: {item.remove}")
    return lines + [f"  warning: could not list {error}" for error in inventory.errors]


def print_table(console: Any, inventory: Inventory) -> None:
    from rich.table import Table

    table = Table(title=f"inventory: {', '.join(inventory.stacks)} ({inventory.project})", title_justify="left")
    for column, justify in (("kind", "left"), ("name", "left"), ("where", "left"), ("status", "left"),
                            ("$/month", "right")):
        table.add_column(column, justify=justify, no_wrap=column in ("status", "$/month"), overflow="fold")
    for item in inventory.items:
        table.add_row(item.kind, item.name, item.location, item.status,
                      f"{item.per_month:.2f}" if item.bills else "-")
    console.print(table)
    for line in summary_lines(inventory):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@click.command("inventory")
@click.option("--stack", required=True, help="The stack whose resources to list (its labels and names).")
@cli.cwd_option
@click.option("--json", "as_json", is_flag=True, help="Print the inventory as one JSON document.")
@endpoint_option
def inventory(stack: str, cwd: Path, as_json: bool, endpoints: tuple[str, ...]) -> None:
    """Everything a stack owns in the project, across zones and regions: in its state, kept on purpose, or
    orphaned, with prices. Exit 5 when an orphan that bills is left."""
    from rich.console import Console

    roots = Endpoints.parse(endpoints)
    pulumi, config = open_stack(stack, cwd)
    require_project(config, stack)
    with adc_or_fail() as session:
        found = stock_of(pulumi, session, roots, config)
    if as_json:
        cli.echo_json(found.as_dict())
    else:
        print_table(Console(), found)
    raise click.exceptions.Exit(exits.ORPHANS if found.billing_orphans else exits.OK)
