"""`tpuserve cache ls|rm`: a stack's cache disks (one per zone) and compile-cache bucket, found by their
`tpu-serve-cache=<stack>` label; their lifecycle: docs/boot-and-caches.md#caches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from tpuserve.cli import echo_json
from tpuserve.gce import COMPUTE_URL, ComputeApiError, ZonalDisks
from tpuserve.gcs import STORAGE_URL, Buckets
from tpuserve.facts import CACHE_LABEL, HYPERDISK_BALANCED_USD_PER_GB_MONTH
from tpuserve.names import stack_slug


@dataclass(frozen=True)
class CacheDisk:
    """One cache disk as `tpuserve cache ls` shows it."""

    zone: str
    name: str
    size_gb: int
    status: str
    users: tuple[str, ...]
    last_attached: str
    monthly_usd: float

    @classmethod
    def from_api(cls, disk: Mapping, price_per_gb_month: float = HYPERDISK_BALANCED_USD_PER_GB_MONTH) -> CacheDisk:
        size = int(disk.get("sizeGb", 0))
        return cls(zone=str(disk.get("zone", "")).rsplit("/", 1)[-1], name=str(disk.get("name", "")), size_gb=size,
                   status=str(disk.get("status", "")),
                   users=tuple(str(u).rsplit("/", 1)[-1] for u in disk.get("users", [])),
                   last_attached=str(disk.get("lastAttachTimestamp", "")),
                   monthly_usd=round(size * price_per_gb_month, 2))


def cache_disks(disks: ZonalDisks, project: str, stack: str) -> list[CacheDisk]:
    found = disks.aggregated(project, f"labels.{CACHE_LABEL}={stack_slug(stack)}")
    return sorted((CacheDisk.from_api(d) for d in found), key=lambda d: d.zone)


def is_warm(disk: CacheDisk, markers: set[str] | None) -> bool:
    """A VM attached it and served from it (its marker; markers None: the attach time decides; inventory.md)."""
    return disk.status == "READY" and bool(disk.last_attached) and (
        markers is None or f"{disk.zone}/{disk.name}" in markers)


def zones_by_warm_cache(candidates: Sequence[str], caches: Iterable[CacheDisk],
                        markers: set[str] | None = None) -> list[str]:
    """The candidates holding a warm cache disk first (most recently attached first), then the rest in order."""
    warm: dict[str, str] = {}
    for disk in caches:
        if is_warm(disk, markers) and disk.zone in candidates:
            warm[disk.zone] = max(warm.get(disk.zone, ""), disk.last_attached)
    first = sorted(warm, key=lambda zone: (warm[zone], -candidates.index(zone)), reverse=True)
    return first + [zone for zone in candidates if zone not in warm]


# --- `tpuserve cache` -----------------------------------------------------------------------------------------

def _clients(compute_url: str, storage_url: str) -> tuple[ZonalDisks, Buckets]:
    from tpuserve.deploy.preflight import adc_or_fail

    session = adc_or_fail()
    return ZonalDisks(session, compute_url), Buckets(session, storage_url)


def _project(project: str | None, stack: str, stack_outputs: Path | None) -> str:
    if project:
        return project
    from tpuserve.deploy.stack import read_outputs

    try:  # --stack names the caches; the outputs come from the file when one is given
        outputs = read_outputs(None if stack_outputs else stack, stack_outputs) or {}
    except click.ClickException as err:
        raise click.UsageError(f"{err.format_message()}; or give --project (a destroyed stack has no outputs)") from err
    if not outputs.get("project"):
        raise click.UsageError(f"stack {stack!r} names no project; give --project")
    return str(outputs["project"])


def cache_options(command):
    for option in reversed([
        click.option("--stack", required=True, help="The stack whose caches these are (their tpu-serve-cache label)."),
        click.option("--project", help="GCP project (default: the stack's `project` output)."),
        click.option("--stack-outputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="Read the stack's outputs from this `pulumi stack output --json` file."),
        click.option("--compute-url", default=COMPUTE_URL, show_default=True, help="Compute API root (tests)."),
        click.option("--storage-url", default=STORAGE_URL, show_default=True, help="Cloud Storage root (tests)."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]):
        command = option(command)
    return command


@click.group()
def cache() -> None:
    """List or remove a stack's cache disks (one per zone) and compile-cache bucket."""


@cache.command("ls")
@cache_options
def ls(stack: str, project: str | None, stack_outputs: Path | None, compute_url: str, storage_url: str,
       as_json: bool) -> None:
    """List the stack's cache disks in every zone and its compile-cache bucket, with their monthly cost."""
    project = _project(project, stack, stack_outputs)
    disks, buckets = _clients(compute_url, storage_url)
    try:
        found = cache_disks(disks, project, stack)
        bucket = _stack_bucket(buckets, project, stack)
    except ComputeApiError as err:
        raise click.ClickException(str(err)) from err
    entries = [] if bucket is None else buckets.objects(bucket["name"], "xla/")
    keys = sorted({item["name"].split("/")[1] for item in entries if item["name"].count("/") >= 2})
    if as_json:
        echo_json({"disks": [asdict(d) for d in found],
                   "bucket": None if bucket is None else {"name": bucket["name"], "objects": len(entries),
                                                          "keys": keys},
                   "monthly_usd": round(sum(d.monthly_usd for d in found), 2)})
        return
    if not found:
        click.echo(f"no cache disk of stack {stack} in {project}")
    for disk in found:
        users = f"attached to {', '.join(disk.users)}" if disk.users else "not attached"
        click.echo(f"{disk.zone:<18} {disk.name:<32} {disk.size_gb:>5} GB  {disk.status:<8} {users:<28} "
                   f"${disk.monthly_usd:.2f}/month")
    if bucket is not None:
        click.echo(f"bucket gs://{bucket['name']}: {len(entries)} compile-cache objects under {len(keys)} key(s)")
    click.echo(f"total ${sum(d.monthly_usd for d in found):.2f}/month for the disks (reference "
               f"${HYPERDISK_BALANCED_USD_PER_GB_MONTH}/GB-month)")


@cache.command("rm")
@cache_options
@click.option("--zone", "zones", multiple=True, help="Only the disk of this zone (repeatable; default: every zone).")
@click.option("--bucket/--no-bucket", "with_bucket", default=False, show_default=True,
              help="Also delete the compile-cache bucket and its objects.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def rm(stack: str, project: str | None, stack_outputs: Path | None, compute_url: str, storage_url: str,
       as_json: bool, zones: tuple[str, ...], with_bucket: bool, yes: bool) -> None:
    """Delete the stack's cache disks (never one a VM still uses) and, with --bucket, its bucket."""
    project = _project(project, stack, stack_outputs)
    disks, buckets = _clients(compute_url, storage_url)
    found = [d for d in cache_disks(disks, project, stack) if not zones or d.zone in zones]
    in_use = [d for d in found if d.users]
    if in_use:
        raise click.UsageError(f"{', '.join(f'{d.zone}/{d.name}' for d in in_use)} is attached to "
                               f"{', '.join(u for d in in_use for u in d.users)}; `pulumi destroy` the stack (or "
                               "wait for its VM to end), then run this again")
    bucket = _stack_bucket(buckets, project, stack) if with_bucket else None
    what = [f"disk {d.zone}/{d.name} ({d.size_gb} GB)" for d in found] + (
        [f"bucket gs://{bucket['name']}"] if bucket else [])
    if not what:
        echo_json({"deleted": []}) if as_json else click.echo("nothing to delete")
        return
    if not yes:
        click.confirm(f"Delete {', '.join(what)}? The next boot there is cold", abort=True, err=True)
    for disk in found:
        disks.delete(project, disk.zone, disk.name)
    if bucket:
        buckets.delete(bucket["name"])
    echo_json({"deleted": what}) if as_json else click.echo("deleted " + ", ".join(what))


def _stack_bucket(buckets: Buckets, project: str, stack: str) -> dict | None:
    return next((b for b in buckets.list(project) if (b.get("labels") or {}).get(CACHE_LABEL) == stack_slug(stack)),
                None)
